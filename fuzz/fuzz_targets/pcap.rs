//! The pcap / pcapng reader on arbitrary bytes: an error or a capture, never a panic, and never an
//! allocation the input does not pay for (libFuzzer's -rss_limit_mb catches that).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(cap) = kxdp_packet::pcap::read(data) {
        let total: usize = cap.packets.iter().map(|p| p.data.len()).sum();
        assert!(total <= data.len(), "packets hold more bytes than the file");
    }
});
