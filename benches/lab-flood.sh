#!/usr/bin/env bash
# SYN flood on the lab: the kernel's nf_conntrack (nftables DNAT) against kxdp
# (conntrack.maxEntries), same flood, same table sizes, same clients. For each table size
# (KXDP_FLOOD_TABLES) and flood rate asked (KXDP_FLOOD_RATES, SYN/s, paced by `kxdp pcap send`):
# established connections intact, legitimate new connections' success, the flood's SYNs that
# reached the backends, and the drop reasons (nf_conntrack statistics; kxdp's drop reasons and
# the veth's XDP drops; the machine's softnet backlog drops). A fresh lab (and an empty table)
# per point.
#
# Equal rates: each point runs both forwarders at the rate asked and reports the rate the sender
# reached. When one forwarder's run reached a rate more than 10% below the other's (the sender
# shares the 2 vCPUs with the forwarding), the faster one runs again, paced to the slower one's
# reached rate ("matched"), so every comparison has a pair at the same offered rate.
#
# nf_conntrack_max and nf_conntrack_buckets are one value each for the whole machine (read-only
# in any other namespace, 6.18 included): both are set to the table size for the kernel's points
# and restored afterwards (by the test, and again here on any exit).
# Needs root. Results: target/lab-flood.jsonl and target/lab-flood.md.
#
#   benches/lab-flood.sh
#   KXDP_FLOOD_TABLES="1000" KXDP_FLOOD_RATES="10000" benches/lab-flood.sh
#   KXDP_FLOOD_APPEND=1 ...   # add to target/lab-flood.jsonl instead of starting it afresh
#   KXDP_FLOOD_MODES="kxdp kxdp-tap" ...   # kxdp-tap: every interface through the tap, no XDP
#                                          # kxdp-tap-pods: the pods through it, the uplink on XDP
#
# The numbers are in docs/hardening.md ("SYN flood at a full conntrack table").
set -Eeuo pipefail
cd "$(dirname "$0")/.."
TABLES=${KXDP_FLOOD_TABLES:-1000 100000 1000000}
RATES=${KXDP_FLOOD_RATES:-10000 100000 1000000}
MODES=${KXDP_FLOOD_MODES:-kernel kxdp}
[ "$(id -u)" = 0 ] || { echo "benches/lab-flood.sh: needs root" >&2; exit 1; }
command -v nft >/dev/null && command -v ethtool >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables ethtool >/dev/null
modprobe nf_conntrack 2>/dev/null || true
saved_max=$(cat /proc/sys/net/netfilter/nf_conntrack_max 2>/dev/null || true)
saved_buckets=$(cat /proc/sys/net/netfilter/nf_conntrack_buckets 2>/dev/null || true)
restore() {
  [ -n "$saved_buckets" ] && echo "$saved_buckets" > /proc/sys/net/netfilter/nf_conntrack_buckets || true
  [ -n "$saved_max" ] && echo "$saved_max" > /proc/sys/net/netfilter/nf_conntrack_max || true
}
trap restore EXIT

cargo test --release --locked --test lab_bench --no-run
out=target/lab-flood.jsonl
[ -n "${KXDP_FLOOD_APPEND:-}" ] || : > "$out"
# point MODE TABLE RATE LABEL: one run, its JSON line appended to $out (with "asked" and "label").
point() {
  local log
  log=$(KXDP_FLOOD_MODE=$1 KXDP_FLOOD_TABLE=$2 KXDP_FLOOD_RATE=$3 \
          cargo test --release --locked --test lab_bench -- --ignored --nocapture bench_lab_syn_flood 2>&1) \
    || { echo "$log" | tail -30 >&2; echo "$1 $2 $3: failed" >&2; exit 1; }
  echo "$log" | sed -n 's/^BENCH //p' | tail -1 \
    | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["asked"]=int(sys.argv[1]); r["label"]=sys.argv[2]; print(json.dumps(r))' "$4" "$5" \
    | tee -a "$out"
}
reached() { tail -1 "$out" | python3 -c 'import json,sys; print(int(json.loads(sys.stdin.read())["flood_pps"]))'; }
for table in $TABLES; do
  for rate in $RATES; do
    declare -A got=()
    for mode in $MODES; do
      point "$mode" "$table" "$rate" "$rate" asked
      got[$mode]=$(reached)
    done
    if [ -n "${got[kernel]:-}" ] && [ -n "${got[kxdp]:-}" ]; then
      k=${got[kernel]} x=${got[kxdp]}
      if [ "$k" -lt $((x * 9 / 10)) ]; then
        point kxdp "$table" "$k" "$rate" matched
      elif [ "$x" -lt $((k * 9 / 10)) ]; then
        point kernel "$table" "$x" "$rate" matched
      fi
    fi
    unset got
  done
done
python3 - "$out" <<'PY' | tee target/lab-flood.md
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def k(n):
    return f"{n/1e6:g}M" if n >= 1e6 else f"{n/1e3:g}k"
print()
print("| table | flood asked | forwarder | flood reached (SYN/s) | flood SYNs at the backends | established intact | legitimate connections completed | client retransmissions | drop reasons (during the flood) | load |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in runs:
    fwd = {"kernel": "nf_conntrack + nftables", "kxdp-tap": "kxdp, through the tap",
           "kxdp-tap-pods": "kxdp, pods through the tap"}.get(r["mode"], "kxdp")
    if r["label"] == "matched":
        fwd += f" (paced to {k(int(r['rate']))})"
    drops = ", ".join(f"{n} {v}" for n, v in sorted(r["drops"].items(), key=lambda x: -x[1])) or "none"
    print(f"| {k(r['table'])} | {k(r['asked'])} | {fwd} | {r['flood_pps']/1e3:.1f}k "
          f"| {100*r['flood_at_backends']/max(1, r['flood_sent']):.1f}% | {r['established_intact']}/{r['established']} "
          f"| {100*r['legit_success']:.1f}% ({r['legit_ok']}/{r['legit']}) | {r['client_retransmits']} | {drops} | {r['load']} |")
PY
