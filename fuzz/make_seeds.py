#!/usr/bin/env python3
"""Writes the committed seed corpora (fuzz/corpus/<target>/seed-*): valid frames for the fuzz
cluster's Services (see fuzz_targets/pipeline.rs), the kinds the parser handles, and small pcap /
pcapng files. Rerun after changing it: python3 fuzz/make_seeds.py"""
import ipaddress, os, struct, shutil

HERE = os.path.dirname(os.path.abspath(__file__))

def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff

def ip4(src, dst, proto, payload, ttl=64, frag=0):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, frag, ttl, proto, 0,
                    ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed)
    h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
    return h + payload

def ip6(src, dst, nh, payload, ext=b""):
    first_nh = 0 if ext else nh
    h = struct.pack("!IHBB16s16s", 6 << 28, len(ext) + len(payload), first_nh, 64,
                    ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed)
    return h + ext + payload

def pseudo(src, dst, proto, l4):
    a, b = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if a.version == 4:
        return a.packed + b.packed + struct.pack("!BBH", 0, proto, len(l4))
    return a.packed + b.packed + struct.pack("!IxxxB", len(l4), proto)

def l4(src, dst, proto, seg, off):
    c = csum(pseudo(src, dst, proto, seg) + seg)
    return seg[:off] + struct.pack("!H", c) + seg[off + 2:]

def tcp(src, sport, dst, dport, flags, seq=1000, ack=0, data=b""):
    seg = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 64240, 0, 0) + data
    return l4(src, dst, 6, seg, 16)

def udp(src, sport, dst, dport, data=b"q"):
    seg = struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data
    return l4(src, dst, 17, seg, 6)

def icmp_echo(ident=7, seq=1):
    m = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"ping"
    return m[:2] + struct.pack("!H", csum(m)) + m[4:]

def icmp_unreach(quoted):
    m = struct.pack("!BBHI", 3, 4, 0, 1400) + quoted[:28]
    return m[:2] + struct.pack("!H", csum(m)) + m[4:]

def sctp_init(sport, dport):
    chunk = struct.pack("!BBHIIHHI", 1, 0, 20, 0x1234, 65535, 1, 1, 1)
    return struct.pack("!HHII", sport, dport, 0, 0) + chunk  # CRC32c left 0 (the parser checks it)

def eth(payload, v6=False, vlan=None):
    h = b"\x02\0\0\0\0\x02" + b"\x02\0\0\0\0\x01"
    if vlan is not None:
        h += struct.pack("!HH", 0x8100, vlan)
    return h + struct.pack("!H", 0x86dd if v6 else 0x0800) + payload

def frames():
    pod, svc = "10.1.0.5", "172.30.0.1"
    syn = ip4(pod, svc, 6, tcp(pod, 40000, svc, 80, 0x02))
    f = {
        "tcp-syn": eth(syn),
        "tcp-synack-from-backend": eth(ip4("10.2.0.1", pod, 6, tcp("10.2.0.1", 8080, pod, 40000, 0x12, 5000, 1001))),
        "tcp-ack": eth(ip4(pod, svc, 6, tcp(pod, 40000, svc, 80, 0x10, 1001, 5001, b"GET /"))),
        "tcp-fin": eth(ip4(pod, svc, 6, tcp(pod, 40000, svc, 80, 0x11, 1006, 5001))),
        "tcp-rst": eth(ip4(pod, svc, 6, tcp(pod, 40000, svc, 80, 0x04, 1006, 0))),
        "udp-dns": eth(ip4(pod, "172.30.0.2", 17, udp(pod, 5000, "172.30.0.2", 53))),
        "udp-dns-reply": eth(ip4("10.2.0.5", pod, 17, udp("10.2.0.5", 5353, pod, 5000, b"a"))),
        "tcp-affinity": eth(ip4(pod, "172.30.0.3", 6, tcp(pod, 40001, "172.30.0.3", 80, 0x02))),
        "tcp-unknown-port": eth(ip4(pod, svc, 6, tcp(pod, 40002, svc, 81, 0x02))),
        "tcp-nodeport-external": eth(ip4("203.0.113.7", "192.168.0.2", 6, tcp("203.0.113.7", 50000, "192.168.0.2", 30080, 0x02))),
        "tcp-lb": eth(ip4("203.0.113.7", "203.0.113.10", 6, tcp("203.0.113.7", 50001, "203.0.113.10", 443, 0x02))),
        "tcp-unallocated-service-ip": eth(ip4(pod, "172.30.9.9", 6, tcp(pod, 40003, "172.30.9.9", 80, 0x02))),
        "icmp-echo": eth(ip4(pod, svc, 1, icmp_echo())),
        "icmp-frag-needed": eth(ip4("10.2.0.1", pod, 1, icmp_unreach(ip4(pod, "10.2.0.1", 6, tcp(pod, 40000, "10.2.0.1", 8080, 0x10))))),
        "ttl-1": eth(ip4(pod, svc, 6, tcp(pod, 40004, svc, 80, 0x02), ttl=1)),
        "fragment-first": eth(ip4(pod, "172.30.0.2", 17, udp(pod, 5001, "172.30.0.2", 53, b"x" * 32), frag=0x2000)),
        "fragment-later": eth(ip4(pod, "172.30.0.2", 17, b"y" * 16, frag=0x0005)),
        "sctp-init": eth(ip4(pod, "172.30.0.4", 132, sctp_init(3000, 9))),
        "vlan-tcp": eth(syn, vlan=10),
        "v6-tcp-syn": eth(ip6("fd00:10:1::5", "fd00:30::1", 6, tcp("fd00:10:1::5", 40000, "fd00:30::1", 80, 0x02)), v6=True),
        "v6-hopbyhop-udp": eth(ip6("fd00:10:1::5", "fd00:30::1", 17, udp("fd00:10:1::5", 5000, "fd00:30::1", 80),
                                   ext=struct.pack("!BB", 17, 0) + b"\x01\x04\0\0\0\0"), v6=True),
        "arp": b"\xff" * 6 + b"\x02\0\0\0\0\x01" + b"\x08\x06" + bytes(28),
    }
    return f

def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as fh:
        fh.write(data)

def record(control, frame):
    return bytes([control]) + struct.pack("!H", len(frame)) + frame

def pcap(frames, link=1):
    out = struct.pack("<IHHiIII", 0xa1b2c3d4, 2, 4, 0, 0, 65535, link)
    for i, f in enumerate(frames):
        out += struct.pack("<IIII", 1700000000 + i, 0, len(f), len(f)) + f
    return out

def pcapng(frames):
    def block(t, body):
        body += b"\0" * (-len(body) % 4)
        n = 12 + len(body)
        return struct.pack("<II", t, n) + body + struct.pack("<I", n)
    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    out += block(1, struct.pack("<HHI", 1, 0, 65535))
    for i, f in enumerate(frames):
        out += block(6, struct.pack("<IIIII", 0, 0, i, len(f), len(f)) + f)
    return out

def main():
    shutil.rmtree(os.path.join(HERE, "corpus"), ignore_errors=True)
    f = frames()
    for name, data in f.items():
        write("parse", name, data)
        if not name.startswith("arp"):
            write("parse", name + "-rawip", data[14:] if not name.startswith("vlan") else data[18:])
    # Pipeline: conversations, table switches (bit 2), clock jumps (bits 3-7), 1-3 workers.
    seq = ["tcp-syn", "tcp-synack-from-backend", "tcp-ack", "tcp-fin", "udp-dns", "udp-dns-reply",
           "tcp-affinity", "icmp-echo", "icmp-frag-needed", "sctp-init", "v6-tcp-syn"]
    write("pipeline", "conversation-1-worker", b"\0" + b"".join(record(0, f[n]) for n in seq))
    write("pipeline", "conversation-3-workers-switching",
          b"\x02" + b"".join(record((i % 3) | (4 if i % 4 == 3 else 0) | ((i % 2) << 3), f[n])
                             for i, n in enumerate(seq * 2)))
    everything = list(f.values())
    write("pipeline", "everything-2-workers", b"\x01" + b"".join(record(i & 1, x) for i, x in enumerate(everything)))
    write("pipeline", "flood-and-expiry", b"\x02" + b"".join(
        record((i % 3) | ((31 if i % 20 == 19 else 0) << 3),
               eth(ip4("10.1.%d.%d" % (i // 250, i % 250 + 1), "172.30.0.1", 6,
                       tcp("10.1.%d.%d" % (i // 250, i % 250 + 1), 40000, "172.30.0.1", 80, 0x02))))
        for i in range(64)))
    write("pcap", "example", open(os.path.join(HERE, "..", "pcaps", "example.pcap"), "rb").read())
    write("pcap", "small", pcap(everything[:4]))
    write("pcap", "rawip", pcap([x[14:] for x in everything[:3]], link=101))
    write("pcap", "pcapng", pcapng(everything[:4]))

main()
