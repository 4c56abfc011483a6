//! The TCP state machine, after the kernel's nf_conntrack_proto_tcp (without sequence-window
//! tracking): enough to apply the right timeout and to know when a connection is over.

pub const STATE_COUNT: usize = 9;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TcpState {
    None = 0,
    SynSent = 1,
    SynRecv = 2,
    Established = 3,
    FinWait = 4,
    CloseWait = 5,
    LastAck = 6,
    TimeWait = 7,
    Close = 8,
}

/// The TCP flag bits conntrack reads, as the packet crate defines them.
pub use kxdp_packet::tcp::flags::{ACK, FIN, RST, SYN};

/// Direction flags kept beside the state: a FIN was seen from the original / reply side.
const FIN_ORIG: u8 = 1;
const FIN_REPLY: u8 = 2;
/// The direction flags once both sides sent a FIN.
pub const BOTH_FINS: u8 = FIN_ORIG | FIN_REPLY;

impl TcpState {
    pub const ALL: [TcpState; STATE_COUNT] = [
        TcpState::None,
        TcpState::SynSent,
        TcpState::SynRecv,
        TcpState::Established,
        TcpState::FinWait,
        TcpState::CloseWait,
        TcpState::LastAck,
        TcpState::TimeWait,
        TcpState::Close,
    ];

    #[inline]
    pub fn from_u8(v: u8) -> TcpState {
        *TcpState::ALL.get(v as usize).unwrap_or(&TcpState::None)
    }

    /// conntrack-tools' names.
    pub fn name(self) -> &'static str {
        match self {
            TcpState::None => "NONE",
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::Established => "ESTABLISHED",
            TcpState::FinWait => "FIN_WAIT",
            TcpState::CloseWait => "CLOSE_WAIT",
            TcpState::LastAck => "LAST_ACK",
            TcpState::TimeWait => "TIME_WAIT",
            TcpState::Close => "CLOSE",
        }
    }

    /// States in which an original-direction SYN starts a new connection on the same tuple.
    pub fn allows_reopen(self) -> bool {
        matches!(self, TcpState::TimeWait | TcpState::Close)
    }
}

/// The state after a packet with `flags` travelling in `dir` (0 original, 1 reply), and the updated
/// FIN-seen flags.
// Always inlined: the established fast lane runs it per packet to see that nothing changes
// (with a plain `#[inline]` it stayed a call, 20 instructions per packet).
#[inline(always)]
pub fn next(state: TcpState, fins: u8, dir: u8, flags: u8) -> (TcpState, u8) {
    use TcpState::*;
    if flags & RST != 0 {
        return (Close, fins);
    }
    let syn = flags & SYN != 0;
    let ack = flags & ACK != 0;
    let fin = flags & FIN != 0;
    let orig = dir == 0;
    let mut fins = fins;
    if fin {
        fins |= if orig { FIN_ORIG } else { FIN_REPLY };
    }
    let both_fins = fins == FIN_ORIG | FIN_REPLY;
    let next = match state {
        None | SynSent if orig && syn && !ack => SynSent,
        // A connection picked up mid-stream (a Maglev Service, whose endpoint the 5-tuple
        // names whichever node first saw the SYN): already established, as Linux's loose
        // pickup has it.
        None if orig && ack && !syn => {
            if fin {
                FinWait
            } else {
                Established
            }
        }
        None => SynSent,
        SynSent if !orig && syn && ack => SynRecv,
        SynSent => SynSent,
        SynRecv if orig && ack && !syn => {
            if fin {
                FinWait
            } else {
                Established
            }
        }
        SynRecv => SynRecv,
        Established | FinWait | CloseWait | LastAck if both_fins => {
            if fin {
                LastAck
            } else if ack && state == LastAck {
                TimeWait
            } else {
                LastAck
            }
        }
        Established if fin => {
            if orig {
                FinWait
            } else {
                CloseWait
            }
        }
        s @ (Established | FinWait | CloseWait) => s,
        LastAck => LastAck,
        TimeWait => TimeWait,
        Close => Close,
    };
    (next, fins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mid_stream_pickup_is_established() {
        assert_eq!(run(&[(0, ACK)]), TcpState::Established);
        assert_eq!(run(&[(0, ACK), (1, ACK)]), TcpState::Established);
        assert_eq!(run(&[(0, ACK | FIN)]), TcpState::FinWait);
        assert_eq!(run(&[(0, SYN | ACK)]), TcpState::SynSent);
    }

    fn run(steps: &[(u8, u8)]) -> TcpState {
        let (mut s, mut f) = (TcpState::None, 0);
        for &(dir, flags) in steps {
            (s, f) = next(s, f, dir, flags);
        }
        s
    }

    #[test]
    fn handshake_and_close() {
        assert_eq!(run(&[(0, SYN)]), TcpState::SynSent);
        assert_eq!(run(&[(0, SYN), (1, SYN | ACK)]), TcpState::SynRecv);
        let est = [(0, SYN), (1, SYN | ACK), (0, ACK)];
        assert_eq!(run(&est), TcpState::Established);
        let mut v = est.to_vec();
        v.push((0, FIN | ACK));
        assert_eq!(run(&v), TcpState::FinWait);
        v.push((1, FIN | ACK));
        assert_eq!(run(&v), TcpState::LastAck);
        v.push((0, ACK));
        assert_eq!(run(&v), TcpState::TimeWait);
        let mut w = est.to_vec();
        w.push((1, FIN | ACK));
        assert_eq!(run(&w), TcpState::CloseWait);
        w.push((0, RST));
        assert_eq!(run(&w), TcpState::Close);
    }
}
