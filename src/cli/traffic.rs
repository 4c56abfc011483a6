//! `kxdp pcap send` and `kxdp pcap sink`: a load generator and a counting sink over AF_XDP, for
//! the lab benchmark (`benches/lab.sh`) and for checking a path end to end.
//!
//! The sender builds its frames once, in its UMEM (a capture's frames, or generated UDP flows),
//! and re-sends the same frames as the kernel completes them: per batch it only writes an
//! 8-byte send timestamp into generated frames, places up to `BATCH` descriptors on the TX ring
//! and kicks the kernel once. A socket sender pays a syscall, an skb allocation and the UDP
//! stack per packet; this one pays a ring write per packet and a syscall per batch, so a
//! forwarder under test sees more than it can take. The rate is paced against the clock
//! (`--rate`, batches of at most `BATCH`, sleeping when ahead) or unpaced (`--rate max`).
//!
//! The sink attaches kxdp's own XDP program to its interface (every unicast IPv4/IPv6 frame goes
//! to its AF_XDP sockets, one per queue), counts frames, and reads the timestamp of generated
//! frames: latency is the sink's CLOCK_MONOTONIC minus the sender's, the same clock across
//! namespaces. It exits after `--duration`, or once traffic has stopped for `--idle-exit`.
//!
//! Generated frames: Ethernet, IPv4 (no options), UDP with checksum 0 (allowed for IPv4: the
//! timestamp can change without a checksum update; NAT keeps a zero checksum zero), payload
//! `MAGIC` (4 bytes) + send time (8 bytes, little endian) + zero padding. Flow `i` uses source
//! port `--sport + i`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use kxdp_kernel::afxdp::{Desc, Umem, XskConfig, XskSocket};
use kxdp_kernel::sys::monotonic_ns;

use super::{bad_input, failure, CliError};

/// Descriptors per TX batch (one kick each); also the RX batch of the sink.
pub const BATCH: usize = 64;

/// The first 4 bytes of a generated frame's UDP payload.
pub const MAGIC: [u8; 4] = *b"KXG1";

const ETH: usize = 14;
const IP: usize = 20;
const UDP: usize = 8;
/// Offset of the payload (magic, then timestamp) in a generated frame.
const PAYLOAD: usize = ETH + IP + UDP;
/// The smallest generated frame: headers, magic, timestamp.
pub const MIN_FRAME: usize = PAYLOAD + 12;

#[derive(Args, Debug)]
pub struct SendArgs {
    /// The interface to send on (its queue 0).
    #[arg(long, value_name = "IFACE")]
    iface: String,
    /// Packets per second, or `max` (as fast as the ring and the kernel take them).
    #[arg(long, value_name = "PPS|max", default_value = "max", value_parser = parse_rate)]
    rate: u64,
    /// Seconds to send for.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    duration: f64,
    /// Stop after this many packets (or at --duration, whichever comes first).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Send this capture's frames (Ethernet; in a loop, at most `--frames` of them) instead of
    /// generated UDP flows. Its frames carry no timestamp: the sink reports no latency.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["src", "dst"])]
    capture: Option<PathBuf>,
    /// Generated flows: destination MAC (the next hop's, e.g. the gateway's).
    #[arg(long, value_name = "MAC", required_unless_present = "capture")]
    dst_mac: Option<String>,
    /// Generated flows: source MAC (default: the interface's).
    #[arg(long, value_name = "MAC")]
    src_mac: Option<String>,
    /// Generated flows: source IPv4 address.
    #[arg(long, value_name = "IP", required_unless_present = "capture")]
    src: Option<std::net::Ipv4Addr>,
    /// Generated flows: destination IPv4 address and UDP port.
    #[arg(long, value_name = "IP:PORT", required_unless_present = "capture")]
    dst: Option<std::net::SocketAddrV4>,
    /// Generated flows: how many (source ports `--sport` .. `--sport + N - 1`).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    flows: u16,
    /// Generated flows: the first source port.
    #[arg(long, value_name = "PORT", default_value_t = 10000)]
    sport: u16,
    /// Generated flows: frame size in bytes (without the FCS), 54 to 1514.
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    size: usize,
    /// Generated flows: TCP SYNs (checksummed, no timestamp) instead of UDP: a SYN flood.
    #[arg(long)]
    syn: bool,
    /// Give consecutive packets N different IPv4 source addresses (`--src` + 0 .. N-1, the
    /// checksums updated incrementally): N distinct connections per source port, as a flood
    /// of spoofed sources is. Generated flows and IPv4 captures.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    vary_src: Option<u32>,
    /// Frames in the UMEM (and the TX ring's size; a power of two): how many packets can be in
    /// flight.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    frames: u32,
    /// Pin the sender to this CPU.
    #[arg(long, value_name = "CPU")]
    cpu: Option<usize>,
}

#[derive(Args, Debug)]
pub struct SinkArgs {
    /// The interface to count on (all its queues). kxdp's XDP program is attached while the sink
    /// runs: the interface's IP traffic does not reach the kernel meanwhile.
    #[arg(long, value_name = "IFACE")]
    iface: String,
    /// Longest run in seconds.
    #[arg(long, value_name = "S", default_value_t = 60.0)]
    duration: f64,
    /// Exit when no frame arrived for this long after the first one (0: run for --duration).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    idle_exit: u64,
    /// Exit after this many frames.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Pin the sink to this CPU.
    #[arg(long, value_name = "CPU")]
    cpu: Option<usize>,
}

fn parse_rate(s: &str) -> Result<u64, String> {
    if s == "max" {
        return Ok(0);
    }
    match s.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{s:?}: a positive number of packets per second, or max"
        )),
    }
}

fn parse_mac(s: &str) -> Result<[u8; 6], CliError> {
    let parts: Vec<&str> = s.trim().split(':').collect();
    let mut m = [0u8; 6];
    if parts.len() != 6 {
        return Err(bad_input(format!(
            "{s:?}: not a MAC address (aa:bb:cc:dd:ee:ff)"
        )));
    }
    for (o, p) in m.iter_mut().zip(parts) {
        *o = u8::from_str_radix(p, 16)
            .map_err(|_| bad_input(format!("{s:?}: not a MAC address (aa:bb:cc:dd:ee:ff)")))?;
    }
    Ok(m)
}

/// The interface's MAC address as this namespace's sysfs shows it.
fn iface_mac(iface: &str) -> Result<[u8; 6], CliError> {
    let path = format!("/sys/class/net/{iface}/address");
    let s = std::fs::read_to_string(&path).map_err(|e| failure(format!("{path}: {e}")))?;
    parse_mac(&s)
}

/// A counter of the interface (`/sys/class/net/IFACE/statistics/NAME`), 0 if unreadable.
fn iface_counter(iface: &str, name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/statistics/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Writes generated flow `flow`'s frame into `buf` (which is at least `size` bytes).
pub fn build_udp_frame(
    buf: &mut [u8],
    size: usize,
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: std::net::Ipv4Addr,
    dst: std::net::SocketAddrV4,
    sport: u16,
) {
    let f = &mut buf[..size];
    f.fill(0);
    f[0..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (size - ETH) as u16;
    {
        let mut ip = kxdp_packet::ipv4::Packet::new_unchecked(&mut f[ETH..]);
        ip.set_version_and_header_len(IP);
        ip.set_total_len(ip_len);
        ip.set_frag(true, false, 0);
        ip.set_ttl(64);
        ip.set_protocol(kxdp_packet::IpProto::UDP.0);
        ip.set_src_addr(src.octets());
        ip.set_dst_addr(dst.ip().octets());
        ip.fill_checksum();
    }
    let u = ETH + IP;
    f[u..u + 2].copy_from_slice(&sport.to_be_bytes());
    f[u + 2..u + 4].copy_from_slice(&dst.port().to_be_bytes());
    f[u + 4..u + 6].copy_from_slice(&(ip_len - IP as u16).to_be_bytes());
    // Checksum 0: none (IPv4), so the timestamp can change per send.
    f[PAYLOAD..PAYLOAD + 4].copy_from_slice(&MAGIC);
}

/// Writes a TCP SYN from `src`:`sport` to `dst` into `buf[..size]`: Ethernet, IPv4, TCP
/// (no options, sequence number `sport`), checksums filled, zero payload up to `size`.
pub fn build_syn_frame(
    buf: &mut [u8],
    size: usize,
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: std::net::Ipv4Addr,
    dst: std::net::SocketAddrV4,
    sport: u16,
) {
    build_udp_frame(buf, size, dst_mac, src_mac, src, dst, sport);
    let f = &mut buf[..size];
    f[ETH + 9] = 6;
    kxdp_packet::ipv4::Packet::new_unchecked(&mut f[ETH..]).fill_checksum();
    let l4 = &mut f[ETH + IP..];
    l4.fill(0);
    let mut t = kxdp_packet::tcp::Segment::new_unchecked(&mut l4[..]);
    t.set_src_port(sport);
    t.set_dst_port(dst.port());
    t.set_seq_number(sport as u32);
    t.set_header_len(20);
    t.set_flags(0x02);
    t.set_window(64240);
    let (s4, d4) = (
        kxdp_packet::Addr::from_v4(src.octets()),
        kxdp_packet::Addr::from_v4(dst.ip().octets()),
    );
    t.fill_checksum(&s4, &d4, kxdp_packet::Family::V4);
}

/// Adds `delta` to an IPv4 frame's source address, updating the IP and TCP/UDP checksums
/// (RFC 1624). Frames that are not IPv4 (or are later fragments) get no L4 update.
fn shift_source(f: &mut [u8], base: u32, delta: u32) {
    use kxdp_packet::checksum::update32;
    if f.len() < ETH + IP || f[12..14] != [0x08, 0x00] {
        return;
    }
    let old = u32::from_be_bytes(f[ETH + 12..ETH + 16].try_into().unwrap());
    let new = base.wrapping_add(delta);
    f[ETH + 12..ETH + 16].copy_from_slice(&new.to_be_bytes());
    let ipc = u16::from_be_bytes([f[ETH + 10], f[ETH + 11]]);
    f[ETH + 10..ETH + 12].copy_from_slice(&update32(ipc, old, new).to_be_bytes());
    let l4 = ETH + ((f[ETH] & 0x0f) as usize) * 4;
    let first_fragment = f[ETH + 6] & 0x1f == 0 && f[ETH + 7] == 0;
    let at = match kxdp_packet::IpProto(f[ETH + 9]) {
        kxdp_packet::IpProto::TCP => l4 + 16,
        kxdp_packet::IpProto::UDP => l4 + 6,
        _ => return,
    };
    if !first_fragment || f.len() < at + 2 {
        return;
    }
    let c = u16::from_be_bytes([f[at], f[at + 1]]);
    if f[ETH + 9] == 17 && c == 0 {
        return; // no UDP checksum
    }
    let mut n = update32(c, old, new);
    if f[ETH + 9] == 17 && n == 0 {
        n = 0xffff;
    }
    f[at..at + 2].copy_from_slice(&n.to_be_bytes());
}

/// The send timestamp of a generated frame (None for any other frame).
pub fn frame_timestamp(f: &[u8]) -> Option<u64> {
    if f.len() < MIN_FRAME || f[12..14] != [0x08, 0x00] || f[ETH + 9] != 17 {
        return None;
    }
    let p = ETH + ((f[ETH] & 0x0f) as usize) * 4 + UDP;
    let t = f.get(p..p + 12)?;
    (t[..4] == MAGIC).then(|| u64::from_le_bytes(t[4..12].try_into().unwrap()))
}

fn stamp(f: &mut [u8], ts: u64) {
    f[PAYLOAD + 4..PAYLOAD + 12].copy_from_slice(&ts.to_le_bytes());
}

/// Kicks the kernel until it has taken every frame off the TX ring (bounded). A copy-mode kick
/// sends at most 32 frames unless the kernel lets the socket raise that
/// (`XskSocket::tx_budget`, Linux 6.17+), so one kick per 64-frame batch left half of it on the
/// ring until the next batch was due: at half load that is a pacing sleep of ~350 µs added to
/// half the frames' latency, which the forwarder under test did not cause.
fn kick_until_sent(sock: &mut XskSocket) {
    for _ in 0..BATCH / 16 {
        if sock.tx_pending() == 0 {
            return;
        }
        sock.flush_tx();
    }
}

pub fn send(args: &SendArgs) -> Result<(), CliError> {
    if !args.frames.is_power_of_two() || !(64..=65536).contains(&args.frames) {
        return Err(bad_input("--frames: a power of two from 64 to 65536"));
    }
    if !(args.duration > 0.0 && args.duration <= 86_400.0) {
        return Err(bad_input("--duration: seconds, above 0 and at most 86400"));
    }
    if !(MIN_FRAME..=1514).contains(&args.size) {
        return Err(bad_input(format!("--size: {MIN_FRAME} to 1514 bytes")));
    }
    // Frames from a capture, or one per generated flow.
    let templates: Vec<Vec<u8>> = match &args.capture {
        Some(path) => {
            let cap = kxdp_packet::pcap::read_file(path).map_err(bad_input)?;
            if cap.link != kxdp_packet::LinkType::Ethernet {
                return Err(bad_input(format!(
                    "{}: link type {:?}; sending needs Ethernet frames",
                    path.display(),
                    cap.link
                )));
            }
            let frames: Vec<Vec<u8>> = cap
                .packets
                .into_iter()
                .map(|p| p.data)
                .filter(|d| (ETH..=2048).contains(&d.len()))
                .take(args.frames as usize)
                .collect();
            if frames.is_empty() {
                return Err(bad_input(format!(
                    "{}: no Ethernet frame of 14 to 2048 bytes",
                    path.display()
                )));
            }
            frames
        }
        None => {
            let dst_mac = parse_mac(args.dst_mac.as_deref().unwrap_or_default())?;
            let src_mac = match &args.src_mac {
                Some(m) => parse_mac(m)?,
                None => iface_mac(&args.iface)?,
            };
            let (src, dst) = (args.src.expect("required"), args.dst.expect("required"));
            let build = if args.syn {
                build_syn_frame
            } else {
                build_udp_frame
            };
            (0..args.flows)
                .map(|i| {
                    let mut f = vec![0u8; args.size];
                    let sport = args.sport.wrapping_add(i);
                    build(&mut f, args.size, dst_mac, src_mac, src, dst, sport);
                    f
                })
                .collect()
        }
    };
    let stamped = args.capture.is_none() && !args.syn;
    // Per frame: the source address it was built with (for --vary-src).
    let vary = args.vary_src.unwrap_or(1);
    let mut src_base = vec![0u32; args.frames as usize];
    let mut src_next = 0u32;
    let ifindex = kxdp_kernel::sys::ifindex(&args.iface).map_err(bad_input)?;
    if let Some(cpu) = args.cpu {
        kxdp_kernel::sys::pin_current_thread(cpu);
    }
    let cfg = XskConfig {
        frames: args.frames,
        frame_size: 2048,
        zero_copy: true,
        fill_target: Some(0),
        ..XskConfig::default()
    }
    .with_ring_size(args.frames);
    let mut umem = Umem::new(&cfg).map_err(|e| failure(format!("UMEM: {e}")))?;
    let mut sock = XskSocket::open(&mut umem, None, ifindex, 0, &cfg)
        .map_err(|e| failure(format!("{}: {e}", args.iface)))?;
    // Build every frame once: frame k carries template k % templates.
    let mut len = vec![0usize; args.frames as usize];
    let mut taken = Vec::with_capacity(args.frames as usize);
    while let Some(addr) = umem.take_free() {
        taken.push(addr);
    }
    for (k, &addr) in taken.iter().enumerate() {
        let t = &templates[k % templates.len()];
        umem.frame_mut(addr)[..t.len()].copy_from_slice(t);
        len[(addr / 2048) as usize] = t.len();
        if t.len() >= ETH + IP {
            src_base[(addr / 2048) as usize] =
                u32::from_be_bytes(t[ETH + 12..ETH + 16].try_into().unwrap());
        }
    }
    for addr in taken {
        umem.recycle(addr);
    }

    let rate = args.rate;
    let start = Instant::now();
    let duration = Duration::from_secs_f64(args.duration);
    let tx_dropped0 = iface_counter(&args.iface, "tx_dropped");
    let mut descs = [Desc::default(); BATCH];
    let mut sent = 0u64;
    let limit = args.count.unwrap_or(u64::MAX);
    loop {
        let elapsed = start.elapsed();
        if elapsed >= duration || sent >= limit {
            break;
        }
        sock.complete(&mut umem);
        let want = if rate == 0 {
            BATCH as u64
        } else {
            let due = (rate as f64 * elapsed.as_secs_f64()) as u64;
            if due <= sent {
                // Ahead of the schedule: sleep until the next batch is due (short waits spin).
                let next = (sent + (BATCH as u64).min(rate / 1000).max(1)) as f64 / rate as f64;
                let wait = next - elapsed.as_secs_f64();
                if wait > 100e-6 {
                    std::thread::sleep(Duration::from_secs_f64(wait - 50e-6));
                }
                sock.flush_tx();
                continue;
            }
            (due - sent).min(BATCH as u64)
        }
        .min(limit - sent);
        let ts = if stamped { monotonic_ns() } else { 0 };
        let mut n = 0;
        while n < want as usize {
            let Some(addr) = umem.take_free() else { break };
            if stamped {
                stamp(umem.frame_mut(addr), ts);
            }
            if vary > 1 {
                let i = (addr / 2048) as usize;
                shift_source(umem.frame_mut(addr), src_base[i], src_next);
                src_next = (src_next + 1) % vary;
            }
            descs[n] = Desc {
                addr,
                len: len[(addr / 2048) as usize],
            };
            n += 1;
        }
        if n > 0 {
            // The ring holds every frame of the UMEM: nothing is refused.
            sent += sock.send(&mut umem, &descs[..n]) as u64;
        }
        kick_until_sent(&mut sock);
    }
    let seconds = start.elapsed().as_secs_f64();
    // Let the kernel finish what is on the ring (bounded).
    let end = Instant::now() + Duration::from_millis(500);
    while sock.tx_outstanding() > 0 && Instant::now() < end {
        sock.flush_tx();
        sock.complete(&mut umem);
        std::thread::sleep(Duration::from_micros(100));
    }
    let left = sock.tx_outstanding() as u64;
    let tx_dropped = iface_counter(&args.iface, "tx_dropped").saturating_sub(tx_dropped0);
    println!(
        "{}",
        serde_json::json!({
            "iface": args.iface,
            "rate": if rate == 0 { serde_json::json!("max") } else { serde_json::json!(rate) },
            "seconds": (seconds * 1000.0).round() / 1000.0,
            "sent": sent - left,
            "offered_pps": ((sent - left) as f64 / seconds).round(),
            "not_completed": left,
            "tx_kicks": sock.stats.tx_kicks,
            "tx_budget": sock.tx_budget(),
            "iface_tx_dropped": tx_dropped,
            "frames": templates.len(),
        })
    );
    Ok(())
}

/// A log-linear latency histogram: 16 buckets per power of two (about 6% resolution).
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; 64 * 16],
            count: 0,
            max: 0,
        }
    }
}

impl Histogram {
    fn index(v: u64) -> usize {
        if v < 16 {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros() as usize;
        (msb - 3) * 16 + ((v >> (msb - 4)) & 15) as usize
    }

    /// The smallest value of bucket `i`.
    fn lower(i: usize) -> u64 {
        if i < 16 {
            return i as u64;
        }
        let msb = i / 16 + 3;
        (16 + (i % 16) as u64) << (msb - 4)
    }

    pub fn record(&mut self, v: u64) {
        self.buckets[Self::index(v)] += 1;
        self.count += 1;
        self.max = self.max.max(v);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The value at quantile `q` (0..=1): the middle of its bucket.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        if rank == self.count {
            return self.max;
        }
        let mut seen = 0;
        for (i, &b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= rank {
                return ((Self::lower(i) + Self::lower(i + 1)) / 2).min(self.max);
            }
        }
        self.max
    }
}

pub fn sink(args: &SinkArgs) -> Result<(), CliError> {
    use kxdp_kernel::xdp::{ModeChoice, XdpProgram};
    if !(args.duration > 0.0 && args.duration <= 86_400.0) {
        return Err(bad_input("--duration: seconds, above 0 and at most 86400"));
    }
    let ifindex = kxdp_kernel::sys::ifindex(&args.iface).map_err(bad_input)?;
    if let Some(cpu) = args.cpu {
        kxdp_kernel::sys::pin_current_thread(cpu);
    }
    let queues = kxdp_kernel::sys::rx_queues_of(&args.iface).max(1);
    // Deep rings: a sink that loses the CPU for a few milliseconds (a busy machine) must not
    // drop what it is there to count. 8192 frames on each fill ring cover 16 ms at 500 kpps.
    let cfg = XskConfig {
        frames: 16384 * queues.min(8),
        frame_size: 2048,
        zero_copy: true,
        fill_target: Some(8192),
        ..XskConfig::default()
    }
    .with_ring_size(8192);
    let mut umem = Umem::new(&cfg).map_err(|e| failure(format!("UMEM: {e}")))?;
    let prog = XdpProgram::load(queues).map_err(|e| failure(e.to_string()))?;
    let mut socks: Vec<XskSocket> = Vec::new();
    for q in 0..queues.min(8) {
        let s = XskSocket::open(&mut umem, socks.first(), ifindex, q, &cfg)
            .map_err(|e| failure(format!("{}: {e}", args.iface)))?;
        prog.set_socket(q, s.fd())
            .map_err(|e| failure(format!("XSKMAP: {e}")))?;
        socks.push(s);
    }
    let mut poller = kxdp_kernel::sys::Poller::new().map_err(|e| failure(e.to_string()))?;
    for s in &socks {
        poller.add(s.fd()).map_err(|e| failure(e.to_string()))?;
    }
    let _attached = prog
        .attach(ifindex, ModeChoice::Auto)
        .map_err(|e| failure(format!("{}: {e}", args.iface)))?;
    eprintln!("sink ready on {} ({queues} queue(s))", args.iface);

    let start = Instant::now();
    let duration = Duration::from_secs_f64(args.duration);
    let idle = Duration::from_millis(args.idle_exit);
    let mut descs = [Desc::default(); BATCH];
    let mut hist = Histogram::default();
    let (mut received, mut bytes) = (0u64, 0u64);
    let (mut first, mut last) = (None::<Instant>, start);
    let mut empty_polls = 0u32;
    // Benchmarks only (docs/benchmarks.md, "AF_XDP lab", "Where the time goes, and where the loss happens"): while
    // frames keep coming (one in the last 10 ms), an idle sink naps this long instead of
    // waiting on its sockets, so it is on no wait queue and the forwarder's CPU does not wake
    // it for every flush into its ring. 0 (the default): it waits on the sockets.
    let nap = std::env::var("KXDP_BENCH_SINK_NAP_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_micros)
        .unwrap_or_default();
    while start.elapsed() < duration {
        let mut got = 0;
        for s in &mut socks {
            let n = s.receive(&mut umem, &mut descs);
            if n == 0 {
                continue;
            }
            got += n;
            let now = monotonic_ns();
            for d in &descs[..n] {
                let f = &umem.frame(d.addr)[..d.len];
                bytes += d.len as u64;
                if let Some(ts) = frame_timestamp(f) {
                    hist.record(now.saturating_sub(ts));
                }
                umem.recycle(d.addr);
            }
            let held = s.fill_outstanding();
            s.refill(&mut umem, cfg.fill_ring_size - held);
        }
        if got > 0 {
            received += got as u64;
            last = Instant::now();
            first.get_or_insert(last);
            empty_polls = 0;
            if args.count.is_some_and(|c| received >= c) {
                break;
            }
            continue;
        }
        if first.is_some() && args.idle_exit > 0 && last.elapsed() >= idle {
            break;
        }
        empty_polls += 1;
        if empty_polls > 64 {
            if !nap.is_zero() && first.is_some() && last.elapsed() < Duration::from_millis(10) {
                std::thread::sleep(nap);
                continue;
            }
            poller.wait(10);
        } else {
            std::hint::spin_loop();
        }
    }
    let (mut k_dropped, mut k_fill_empty) = (0, 0);
    for s in &mut socks {
        if let Ok(st) = s.kernel_stats() {
            // Ring full or no fill frame: every frame lost on the way into the socket.
            k_dropped += st.rx_lost();
            k_fill_empty += st.rx_fill_ring_empty_descs;
        }
    }
    let span = first.map(|f| (last - f).as_secs_f64()).unwrap_or(0.0);
    println!(
        "{}",
        serde_json::json!({
            "iface": args.iface,
            "received": received,
            "bytes": bytes,
            "first_to_last_s": (span * 1000.0).round() / 1000.0,
            "pps": if span > 0.0 { (received as f64 / span).round() } else { 0.0 },
            "timestamped": hist.count(),
            "latency_ns": {
                "p50": hist.quantile(0.5),
                "p90": hist.quantile(0.9),
                "p99": hist.quantile(0.99),
                "max": hist.max,
            },
            "kernel_rx_dropped": k_dropped,
            "kernel_rx_fill_empty": k_fill_empty,
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_frame_is_valid_udp_with_a_timestamp() {
        let mut f = vec![0u8; 64];
        let (src, dst) = (
            "10.1.0.13".parse().unwrap(),
            "172.30.0.10:53".parse().unwrap(),
        );
        build_udp_frame(&mut f, 64, [2; 6], [4; 6], src, dst, 10007);
        stamp(&mut f, 123_456_789);
        assert_eq!(frame_timestamp(&f), Some(123_456_789));
        let ip = kxdp_packet::ipv4::Packet::new_checked(&f[14..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.total_len(), 50);
        assert_eq!(ip.dst_addr(), [172, 30, 0, 10]);
        assert_eq!(&f[34..36], &10007u16.to_be_bytes());
        assert_eq!(&f[36..38], &53u16.to_be_bytes());
        assert_eq!(&f[38..40], &30u16.to_be_bytes());
        assert_eq!(&f[40..42], &[0, 0]);
        f[42] = b'X';
        assert_eq!(frame_timestamp(&f), None);
    }

    #[test]
    fn syn_frames_keep_valid_checksums_when_the_source_moves() {
        let mut f = vec![0u8; 54];
        let (src, dst) = (
            "10.200.0.0".parse().unwrap(),
            "172.30.0.10:80".parse().unwrap(),
        );
        build_syn_frame(&mut f, 54, [2; 6], [4; 6], src, dst, 4000);
        let base = u32::from_be_bytes([10, 200, 0, 0]);
        for delta in [0u32, 1, 255, 65_535, 99_999] {
            shift_source(&mut f, base, delta);
            let ip = kxdp_packet::ipv4::Packet::new_checked(&f[14..]).unwrap();
            assert!(ip.verify_checksum());
            assert_eq!(u32::from_be_bytes(ip.src_addr()), base + delta);
            let t = kxdp_packet::tcp::Segment::new_checked(&f[34..]).unwrap();
            assert!(t.syn() && !t.ack());
            let (s4, d4) = (
                kxdp_packet::Addr::from_v4(ip.src_addr()),
                kxdp_packet::Addr::from_v4(ip.dst_addr()),
            );
            assert!(t.verify_checksum(&s4, &d4, kxdp_packet::Family::V4));
        }
        assert_eq!(frame_timestamp(&f), None);
    }

    #[test]
    fn histogram_quantiles_within_a_bucket() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.07, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.07, "{p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
        for i in 0..200 {
            assert!(Histogram::lower(i) <= Histogram::lower(i + 1));
            assert_eq!(Histogram::index(Histogram::lower(i)), i);
        }
    }

    #[test]
    fn rates_and_macs_parse() {
        assert_eq!(parse_rate("max"), Ok(0));
        assert_eq!(parse_rate("250000"), Ok(250_000));
        assert!(parse_rate("0").is_err() && parse_rate("fast").is_err());
        assert_eq!(
            parse_mac("02:00:0a:FF:00:01").unwrap(),
            [2, 0, 10, 255, 0, 1]
        );
        assert!(parse_mac("02:00:0a").is_err());
    }
}
