#!/usr/bin/env bash
# SYN flood on the lab (issue 12): the kernel's nf_conntrack (nftables DNAT) against kxdp
# (conntrack.maxEntries), same flood, same table sizes, same clients. For each forwarder, table
# size (KXDP_FLOOD_TABLES) and flood rate (KXDP_FLOOD_RATES, SYN/s or `max`: as fast as
# `kxdp pcap send` goes): established connections intact, client retransmissions, legitimate
# new connections' success. A fresh lab (and an empty table) per point.
#
# nf_conntrack_max is one value for the whole machine: it is set to the table size for the
# kernel's points and restored afterwards (by the test, and again here on any exit).
# Needs root. Results: target/lab-flood.jsonl and target/lab-flood.md.
#
#   benches/lab-flood.sh
#   KXDP_FLOOD_TABLES="1000" KXDP_FLOOD_RATES="10000 max" benches/lab-flood.sh
#
# The numbers are in docs/hardening.md ("SYN flood at a full conntrack table").
set -Eeuo pipefail
cd "$(dirname "$0")/.."
TABLES=${KXDP_FLOOD_TABLES:-1000 100000}
RATES=${KXDP_FLOOD_RATES:-10000 100000 max}
MODES=${KXDP_FLOOD_MODES:-kernel kxdp}
[ "$(id -u)" = 0 ] || { echo "benches/lab-flood.sh: needs root" >&2; exit 1; }
command -v nft >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/dev/null
modprobe nf_conntrack 2>/dev/null || true
saved=$(cat /proc/sys/net/netfilter/nf_conntrack_max 2>/dev/null || true)
restore() { [ -n "$saved" ] && echo "$saved" > /proc/sys/net/netfilter/nf_conntrack_max || true; }
trap restore EXIT

cargo test --release --locked --test lab_bench --no-run
out=target/lab-flood.jsonl
: > "$out"
for table in $TABLES; do
  for rate in $RATES; do
    for mode in $MODES; do
      log=$(KXDP_FLOOD_MODE=$mode KXDP_FLOOD_TABLE=$table KXDP_FLOOD_RATE=$rate \
              cargo test --release --locked --test lab_bench -- --ignored --nocapture bench_lab_syn_flood 2>&1) \
        || { echo "$log" | tail -30 >&2; echo "$mode $table $rate: failed" >&2; exit 1; }
      echo "$log" | sed -n 's/^BENCH //p' | tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY' | tee target/lab-flood.md
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print()
print("| flood (offered SYN/s) | table | forwarder | established intact | client retransmissions | legitimate connections completed |")
print("| --- | --- | --- | --- | --- | --- |")
for r in runs:
    print(f"| {r['rate']} ({r['flood_pps']/1e3:.0f} k) | {r['table']} | {'nf_conntrack + nftables' if r['mode'] == 'kernel' else 'kxdp'} "
          f"| {r['established_intact']}/{r['established']} | {r['client_retransmits']} | {100*r['legit_success']:.1f}% ({r['legit_ok']}/{r['legit']}) |")
PY
