//! SCTP chunk iteration and the conntrack summary, over packets built byte by byte.

use kxdp_packet::sctp::{
    chunk, summarize, summarize_prefix, ChunkIter, ChunkSummary, Packet, Repr, HEADER_LEN,
    MAX_CHUNKS,
};
use kxdp_packet::ParseError;

/// Appends one chunk (header, value, zero padding to 4) to `out`.
fn push_chunk(out: &mut Vec<u8>, ty: u8, flags: u8, value: &[u8]) {
    let len = 4 + value.len();
    out.push(ty);
    out.push(flags);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(value);
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

/// A whole SCTP packet: common header (ports 5000 -> 38412, `vtag`, valid CRC32c) then `chunks`.
fn packet(vtag: u32, chunks: &[(u8, u8, &[u8])]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_LEN];
    for &(ty, flags, value) in chunks {
        push_chunk(&mut b, ty, flags, value);
    }
    Repr {
        src_port: 5000,
        dst_port: 38412,
        verification_tag: vtag,
    }
    .emit(&mut b)
    .unwrap();
    b
}

/// INIT / INIT ACK value: Initiate Tag, a_rwnd, streams, initial TSN, then `params`.
fn init_value(tag: u32, params: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&tag.to_be_bytes());
    v.extend_from_slice(&65536u32.to_be_bytes());
    v.extend_from_slice(&10u16.to_be_bytes());
    v.extend_from_slice(&10u16.to_be_bytes());
    v.extend_from_slice(&0x1234_5678u32.to_be_bytes());
    v.extend_from_slice(params);
    v
}

/// DATA value: TSN, stream, SSN, PPID, then `user` bytes.
fn data_value(tsn: u32, user: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&tsn.to_be_bytes());
    v.extend_from_slice(&[0, 1, 0, 0]);
    v.extend_from_slice(&46u32.to_be_bytes());
    v.extend_from_slice(user);
    v
}

/// SACK value: cumulative TSN ack, a_rwnd, no gap blocks, no duplicates.
fn sack_value(cum: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&cum.to_be_bytes());
    v.extend_from_slice(&65536u32.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0, 0]);
    v
}

/// (type, flags, length, offset, value length) of one chunk.
type Seen = (u8, u8, u16, usize, usize);

fn collect(chunks: &[u8]) -> Vec<Result<Seen, ParseError>> {
    ChunkIter::new(chunks)
        .map(|r| r.map(|c| (c.chunk_type, c.flags, c.length, c.offset, c.value.len())))
        .collect()
}

#[test]
fn data_sack_bundle_with_padding() {
    // DATA with 5 user bytes (length 21, 3 padding bytes), SACK, DATA with 8 bytes (no padding).
    let d1 = data_value(1, b"hello");
    let sack = sack_value(99);
    let d2 = data_value(2, b"12345678");
    let pkt = packet(
        0xdead_beef,
        &[
            (chunk::DATA, 0x03, &d1),
            (chunk::SACK, 0, &sack),
            (chunk::DATA, 0x03, &d2),
        ],
    );
    let p = Packet::new_checked(&pkt[..]).unwrap();
    assert!(p.verify_checksum());
    let got: Vec<_> = p.chunk_iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(
        (
            got[0].chunk_type,
            got[0].flags,
            got[0].length,
            got[0].offset
        ),
        (chunk::DATA, 3, 21, 0)
    );
    assert_eq!(&got[0].value[12..], b"hello");
    assert_eq!(
        (got[1].chunk_type, got[1].length, got[1].offset),
        (chunk::SACK, 16, 24)
    );
    assert_eq!(got[1].value, &sack[..]);
    assert_eq!(
        (got[2].chunk_type, got[2].length, got[2].offset),
        (chunk::DATA, 24, 40)
    );
    assert_eq!(&got[2].value[12..], b"12345678");

    let s = summarize(&pkt).unwrap();
    assert_eq!(s.vtag, 0xdead_beef);
    assert_eq!(
        s.chunks,
        ChunkSummary::bit(chunk::DATA) | ChunkSummary::bit(chunk::SACK)
    );
    assert!(s.has(chunk::DATA) && s.has(chunk::SACK) && !s.has(chunk::ABORT));
    assert_eq!(s.init_tag, None);
}

#[test]
fn last_chunk_without_padding_is_accepted() {
    let d = data_value(1, b"x");
    let mut pkt = packet(7, &[(chunk::SACK, 0, &sack_value(1)), (chunk::DATA, 3, &d)]);
    pkt.truncate(pkt.len() - 3); // DATA length 17: its 3 padding bytes dropped
    let r = collect(&pkt[HEADER_LEN..]);
    assert_eq!(
        r,
        vec![
            Ok((chunk::SACK, 0, 16, 0, 12)),
            Ok((chunk::DATA, 3, 17, 16, 13))
        ]
    );
    assert!(summarize(&pkt).is_ok());
    // Only part of the padding present: also fine.
    pkt.push(0);
    assert_eq!(collect(&pkt[HEADER_LEN..]).len(), 2);
    assert!(summarize(&pkt).is_ok());
}

#[test]
fn chunk_running_past_the_end() {
    let mut pkt = packet(
        7,
        &[
            (chunk::SACK, 0, &sack_value(1)),
            (chunk::DATA, 3, &data_value(1, b"abcd")),
        ],
    );
    // Second chunk claims 40 bytes, 20 are there.
    pkt[HEADER_LEN + 16 + 2..HEADER_LEN + 16 + 4].copy_from_slice(&40u16.to_be_bytes());
    let r = collect(&pkt[HEADER_LEN..]);
    assert_eq!(
        r,
        vec![Ok((chunk::SACK, 0, 16, 0, 12)), Err(ParseError::BadLength)]
    );
    assert_eq!(summarize(&pkt), Err(ParseError::BadLength));
    // The packet cut inside the second chunk's header.
    let cut = &pkt[..HEADER_LEN + 16 + 3];
    assert_eq!(
        collect(&cut[HEADER_LEN..]),
        vec![Ok((chunk::SACK, 0, 16, 0, 12)), Err(ParseError::Truncated)]
    );
    assert_eq!(summarize(cut), Err(ParseError::Truncated));
}

#[test]
fn zero_and_short_chunk_lengths() {
    for bad in [0u16, 1, 2, 3] {
        let mut pkt = packet(
            7,
            &[
                (chunk::DATA, 3, &data_value(1, b"abcd")),
                (chunk::SACK, 0, &sack_value(1)),
            ],
        );
        pkt[HEADER_LEN + 20 + 2..HEADER_LEN + 20 + 4].copy_from_slice(&bad.to_be_bytes());
        let r = collect(&pkt[HEADER_LEN..]);
        assert_eq!(r.len(), 2, "length {bad}");
        assert!(r[0].is_ok());
        assert_eq!(r[1], Err(ParseError::BadLength), "length {bad}");
        assert_eq!(summarize(&pkt), Err(ParseError::BadLength));
    }
    // A zero-length first chunk: the iterator stops at once rather than looping.
    let mut pkt = packet(7, &[(chunk::SACK, 0, &sack_value(1))]);
    pkt[HEADER_LEN + 2..HEADER_LEN + 4].fill(0);
    let mut it = ChunkIter::new(&pkt[HEADER_LEN..]);
    assert_eq!(it.next(), Some(Err(ParseError::BadLength)));
    assert_eq!(it.next(), None);
    assert_eq!(it.next(), None);
}

#[test]
fn no_chunks_and_trailing_bytes() {
    let hdr = packet(7, &[]);
    assert_eq!(hdr.len(), HEADER_LEN);
    assert_eq!(collect(&hdr[HEADER_LEN..]), vec![]);
    assert_eq!(summarize(&hdr), Err(ParseError::Truncated));
    assert_eq!(summarize(&hdr[..11]), Err(ParseError::Truncated));
    assert_eq!(summarize(&[]), Err(ParseError::Truncated));
    // 1..3 stray bytes after a padded chunk are no chunk header.
    for extra in 1..4 {
        let mut pkt = packet(7, &[(chunk::SACK, 0, &sack_value(1))]);
        pkt.extend(std::iter::repeat_n(0, extra));
        assert_eq!(
            collect(&pkt[HEADER_LEN..]),
            vec![Ok((chunk::SACK, 0, 16, 0, 12)), Err(ParseError::Truncated)]
        );
        assert_eq!(summarize(&pkt), Err(ParseError::Truncated));
    }
}

#[test]
fn chunk_count_is_bounded() {
    let hb: &[u8] = &[0, 1, 0, 4]; // HEARTBEAT with an empty info parameter
    let mut many = Vec::new();
    for _ in 0..MAX_CHUNKS {
        many.push((chunk::HEARTBEAT_ACK, 0, hb));
    }
    let pkt = packet(9, &many);
    assert_eq!(collect(&pkt[HEADER_LEN..]).len(), MAX_CHUNKS);
    assert!(collect(&pkt[HEADER_LEN..]).iter().all(|r| r.is_ok()));
    assert!(summarize(&pkt).is_ok());

    many.push((chunk::HEARTBEAT_ACK, 0, hb));
    let pkt = packet(9, &many);
    let r = collect(&pkt[HEADER_LEN..]);
    assert_eq!(r.len(), MAX_CHUNKS + 1);
    assert_eq!(r[MAX_CHUNKS], Err(ParseError::BadLength));
    assert_eq!(summarize(&pkt), Err(ParseError::BadLength));

    // 300 four-byte chunks: the iterator stops after MAX_CHUNKS + 1 items.
    let mut b = vec![0u8; HEADER_LEN];
    for _ in 0..300 {
        push_chunk(&mut b, chunk::COOKIE_ACK, 0, &[]);
    }
    assert_eq!(ChunkIter::new(&b[HEADER_LEN..]).count(), MAX_CHUNKS + 1);
}

#[test]
fn summarize_init() {
    // INIT with a Supported Address Types parameter (length 6, padded to 8).
    let v = init_value(0x0102_0304, &[0, 12, 0, 6, 0, 5, 0, 0]);
    let pkt = packet(0, &[(chunk::INIT, 0, &v)]);
    let s = summarize(&pkt).unwrap();
    assert_eq!(
        s,
        ChunkSummary {
            vtag: 0,
            chunks: 1 << chunk::INIT,
            init_tag: Some(0x0102_0304),
            abort_t_bit: false,
            shutdown_complete_t_bit: false,
        }
    );
    // INIT must carry verification tag 0.
    assert_eq!(
        summarize(&packet(5, &[(chunk::INIT, 0, &v)])),
        Err(ParseError::BadLength)
    );
    // Initiate Tag 0 is invalid.
    assert_eq!(
        summarize(&packet(0, &[(chunk::INIT, 0, &init_value(0, &[]))])),
        Err(ParseError::BadLength)
    );
    // The fixed part cut short (chunk length 19).
    assert_eq!(
        summarize(&packet(0, &[(chunk::INIT, 0, &v[..15])])),
        Err(ParseError::BadLength)
    );
    // INIT bundled with anything, before or after.
    let d = data_value(1, b"x");
    assert_eq!(
        summarize(&packet(0, &[(chunk::INIT, 0, &v), (chunk::DATA, 3, &d)])),
        Err(ParseError::BadLength)
    );
    assert_eq!(
        summarize(&packet(0, &[(chunk::DATA, 3, &d), (chunk::INIT, 0, &v)])),
        Err(ParseError::BadLength)
    );
    assert_eq!(
        summarize(&packet(0, &[(chunk::INIT, 0, &v), (chunk::INIT, 0, &v)])),
        Err(ParseError::BadLength)
    );
}

#[test]
fn summarize_init_ack() {
    // INIT ACK with a State Cookie parameter (type 7, 4 + 13 bytes, padded).
    let mut cookie = vec![0, 7, 0, 17];
    cookie.extend_from_slice(b"cookie-bytes!");
    cookie.extend_from_slice(&[0, 0, 0]);
    let v = init_value(0xaabb_ccdd, &cookie);
    let pkt = packet(0x0102_0304, &[(chunk::INIT_ACK, 0, &v)]);
    let s = summarize(&pkt).unwrap();
    assert_eq!(s.vtag, 0x0102_0304);
    assert_eq!(s.chunks, ChunkSummary::bit(chunk::INIT_ACK));
    assert_eq!(s.init_tag, Some(0xaabb_ccdd));
    assert_eq!(
        summarize(&packet(
            0x0102_0304,
            &[(chunk::INIT_ACK, 0, &init_value(0, &cookie))]
        )),
        Err(ParseError::BadLength)
    );
    assert_eq!(
        summarize(&packet(
            0x0102_0304,
            &[(chunk::SACK, 0, &sack_value(1)), (chunk::INIT_ACK, 0, &v)]
        )),
        Err(ParseError::BadLength)
    );
}

#[test]
fn summarize_cookie_echo_data_bundle() {
    let cookie = b"the state cookie, 31 bytes long";
    let d1 = data_value(0x1234_5678, b"first message");
    let d2 = data_value(0x1234_5679, b"second");
    let pkt = packet(
        0xaabb_ccdd,
        &[
            (chunk::COOKIE_ECHO, 0, cookie),
            (chunk::DATA, 0x03, &d1),
            (chunk::DATA, 0x03, &d2),
        ],
    );
    let s = summarize(&pkt).unwrap();
    assert_eq!(s.vtag, 0xaabb_ccdd);
    assert_eq!(
        s.chunks,
        ChunkSummary::bit(chunk::COOKIE_ECHO) | ChunkSummary::bit(chunk::DATA)
    );
    assert_eq!(s.init_tag, None);
    // COOKIE ECHO must come first.
    assert_eq!(
        summarize(&packet(
            0xaabb_ccdd,
            &[(chunk::DATA, 3, &d1), (chunk::COOKIE_ECHO, 0, cookie)]
        )),
        Err(ParseError::BadLength)
    );
    // COOKIE ACK + SACK is fine, SACK + COOKIE ACK is not.
    let sack = sack_value(0x1234_5679);
    assert!(summarize(&packet(
        1,
        &[(chunk::COOKIE_ACK, 0, &[]), (chunk::SACK, 0, &sack)]
    ))
    .is_ok());
    assert_eq!(
        summarize(&packet(
            1,
            &[(chunk::SACK, 0, &sack), (chunk::COOKIE_ACK, 0, &[])]
        )),
        Err(ParseError::BadLength)
    );
}

#[test]
fn summarize_t_bits_and_other_types() {
    let abort_t = packet(3, &[(chunk::ABORT, chunk::FLAG_T, &[])]);
    let s = summarize(&abort_t).unwrap();
    assert!(s.has(chunk::ABORT) && s.abort_t_bit && !s.shutdown_complete_t_bit);
    let abort = packet(
        3,
        &[
            (chunk::DATA, 3, &data_value(1, b"bye")),
            (chunk::ABORT, 0, &[]),
        ],
    );
    let s = summarize(&abort).unwrap();
    assert!(s.has(chunk::ABORT) && s.has(chunk::DATA) && !s.abort_t_bit);
    // Two ABORT chunks disagreeing on T.
    assert_eq!(
        summarize(&packet(
            3,
            &[(chunk::ABORT, 0, &[]), (chunk::ABORT, chunk::FLAG_T, &[])]
        )),
        Err(ParseError::BadLength)
    );

    let sc = packet(3, &[(chunk::SHUTDOWN_COMPLETE, chunk::FLAG_T, &[])]);
    let s = summarize(&sc).unwrap();
    assert!(s.has(chunk::SHUTDOWN_COMPLETE) && s.shutdown_complete_t_bit && !s.abort_t_bit);
    let sc = packet(3, &[(chunk::SHUTDOWN_COMPLETE, 0, &[])]);
    assert!(!summarize(&sc).unwrap().shutdown_complete_t_bit);
    assert_eq!(
        summarize(&packet(
            3,
            &[
                (chunk::SHUTDOWN_COMPLETE, 0, &[]),
                (chunk::SACK, 0, &sack_value(1))
            ]
        )),
        Err(ParseError::BadLength)
    );

    // I-DATA (64), FORWARD TSN (192) and an unassigned type 31 share the "other" bit.
    let pkt = packet(
        3,
        &[(64, 0, &[0u8; 17]), (192, 0, &[0, 0, 0, 1]), (31, 0, &[])],
    );
    let s = summarize(&pkt).unwrap();
    assert_eq!(s.chunks, ChunkSummary::OTHER);
    assert!(s.has(64) && s.has(200) && !s.has(chunk::DATA));
    // Every type below 31 has its own bit.
    for t in 0u8..31 {
        assert_eq!(ChunkSummary::bit(t), 1 << t);
    }
}

#[test]
fn iteration_never_panics_on_garbage() {
    // Every length value in a two-chunk area, every cut point.
    let base = packet(
        7,
        &[
            (chunk::DATA, 3, &data_value(1, b"abcdefg")),
            (chunk::SACK, 0, &sack_value(1)),
        ],
    );
    for len in 0u16..=64 {
        let mut pkt = base.clone();
        pkt[HEADER_LEN + 2..HEADER_LEN + 4].copy_from_slice(&len.to_be_bytes());
        for cut in 0..=pkt.len() {
            let b = &pkt[..cut];
            let _ = summarize(b);
            if cut >= HEADER_LEN {
                let n = ChunkIter::new(&b[HEADER_LEN..]).count();
                assert!(n <= MAX_CHUNKS + 1);
            }
        }
    }
}

#[test]
fn first_fragment_prefix() {
    let cookie = [7u8; 40];
    let d = data_value(5, &[1u8; 200]);
    let pkt = packet(
        0xaabb_ccdd,
        &[(chunk::COOKIE_ECHO, 0, &cookie), (chunk::DATA, 3, &d)],
    );
    let whole = summarize(&pkt).unwrap();
    assert_eq!(summarize_prefix(&pkt), Ok(whole));
    // Cut inside the DATA chunk's value, inside its header, and inside the COOKIE ECHO.
    for (cut, want) in [
        (HEADER_LEN + 44 + 100, whole.chunks),
        (HEADER_LEN + 44 + 2, ChunkSummary::bit(chunk::COOKIE_ECHO)),
        (HEADER_LEN + 10, ChunkSummary::bit(chunk::COOKIE_ECHO)),
    ] {
        let b = &pkt[..cut];
        assert!(summarize(b).is_err(), "cut {cut}");
        let s = summarize_prefix(b).unwrap();
        assert_eq!((s.vtag, s.chunks), (0xaabb_ccdd, want), "cut {cut}");
    }
    let it: Vec<_> = ChunkIter::new_prefix(&pkt[HEADER_LEN..HEADER_LEN + 44 + 100])
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(it.len(), 2);
    assert_eq!((it[1].length, it[1].value.len()), (216, 96));
    // Nothing but the header cut short: no chunk.
    assert_eq!(
        summarize_prefix(&pkt[..HEADER_LEN + 3]),
        Err(ParseError::Truncated)
    );
    // Zero lengths are still errors.
    let mut bad = pkt.clone();
    bad[HEADER_LEN + 44 + 2..HEADER_LEN + 44 + 4].fill(0);
    assert_eq!(
        summarize_prefix(&bad[..HEADER_LEN + 44 + 100]),
        Err(ParseError::BadLength)
    );
    // An INIT whose fixed part is cut off.
    let init = packet(0, &[(chunk::INIT, 0, &init_value(9, &[0u8; 64]))]);
    assert_eq!(
        summarize_prefix(&init[..HEADER_LEN + 30]).unwrap().init_tag,
        Some(9)
    );
    assert_eq!(
        summarize_prefix(&init[..HEADER_LEN + 12]),
        Err(ParseError::BadLength)
    );
}
