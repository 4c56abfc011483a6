#!/usr/bin/env python3
"""Raw-socket helpers of tests/cni_spoof.rs (no scapy).

send SRC DST DPORT SPORT tcp|udp  -- one TCP SYN or UDP datagram ("kxdp-spoof") with any source
sniff IFACE SECONDS PORT...       -- prints "SRC SPORT DPORT" for each IPv4/IPv6 TCP SYN or UDP
                                     datagram to one of PORTs seen on IFACE, for SECONDS
"""
import ipaddress
import socket
import struct
import sys
import time


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def l4(src, dst, sport, dport, proto):
    if proto == "tcp":
        # SYN, window 64240, no options.
        seg = struct.pack("!HHIIBBHHH", sport, dport, 0x1000, 0, 5 << 4, 0x02, 64240, 0, 0)
        num = 6
    else:
        payload = b"kxdp-spoof"
        seg = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
        num = 17
    pseudo = src.packed + dst.packed
    if src.version == 4:
        pseudo += struct.pack("!BBH", 0, num, len(seg))
    else:
        pseudo += struct.pack("!IxxxB", len(seg), num)
    c = csum(pseudo + seg)
    if num == 17 and c == 0:
        c = 0xFFFF
    off = 16 if num == 6 else 6
    return seg[:off] + struct.pack("!H", c) + seg[off + 2:], num


def send(src, dst, dport, sport, proto):
    src, dst = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    seg, num = l4(src, dst, int(sport), int(dport), proto)
    if src.version == 4:
        hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(seg), 0x1234, 0, 64, num, 0,
                          src.packed, dst.packed)
        hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        s.sendto(hdr + seg, (str(dst), 0))
    else:
        hdr = struct.pack("!IHBB16s16s", 6 << 28, len(seg), num, 64, src.packed, dst.packed)
        # IPPROTO_RAW on AF_INET6: the caller writes the IPv6 header (IPV6_HDRINCL).
        s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
        s.sendto(hdr + seg, (str(dst), 0))


def sniff(iface, seconds, ports):
    ports = {int(p) for p in ports}
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.bind((iface, 0))
    s.settimeout(0.1)
    print("ready", flush=True)
    end = time.time() + float(seconds)
    while time.time() < end:
        try:
            f = s.recv(65535)
        except socket.timeout:
            continue
        et = struct.unpack("!H", f[12:14])[0]
        if et == 0x0800 and len(f) >= 34:
            ihl = (f[14] & 15) * 4
            proto, src = f[23], ipaddress.ip_address(f[26:30])
            l4off = 14 + ihl
        elif et == 0x86DD and len(f) >= 54:
            proto, src = f[20], ipaddress.ip_address(f[22:38])
            l4off = 54
        else:
            continue
        if proto not in (6, 17) or len(f) < l4off + 14:
            continue
        sport, dport = struct.unpack("!HH", f[l4off:l4off + 4])
        if dport not in ports:
            continue
        if proto == 6 and f[l4off + 13] & 0x12 != 0x02:
            continue
        print(src, sport, dport, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(*sys.argv[2:7])
    else:
        sniff(sys.argv[2], sys.argv[3], sys.argv[4:])
