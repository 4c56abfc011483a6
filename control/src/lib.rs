//! kxdp-control (being written)
