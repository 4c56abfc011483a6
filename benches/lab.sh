#!/usr/bin/env bash
# The lab benchmark: 64-byte UDP from a pod through a ClusterIP to two pods, forwarded by kxdp
# (AF_XDP, one pinned worker) and by the node's kernel with kube-proxy-style iptables and
# nftables DNAT rules, on the same network-namespace topology, in the same run, interleaved.
# Needs root. Results: one JSON line per run in target/lab-bench.jsonl and a summary table.
#
#   benches/lab.sh [ROUNDS=3] [SECONDS=5]
#   KXDP_BENCH_SERVICES=1000 KXDP_BENCH_FLOWS=64 benches/lab.sh
#
# The method and the numbers are in docs/benchmarks.md ("AF_XDP lab").
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
export KXDP_BENCH_SECONDS=${2:-5}
export KXDP_BENCH_SERVICES=${KXDP_BENCH_SERVICES:-1000}
export KXDP_BENCH_FLOWS=${KXDP_BENCH_FLOWS:-64}

[ "$(id -u)" = 0 ] || { echo "benches/lab.sh: needs root (network namespaces, XDP)" >&2; exit 1; }
if ! command -v iptables-restore >/dev/null || ! command -v nft >/dev/null; then
  echo "== installing iptables and nftables"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables nftables >/dev/null
fi

echo "== build (release; the test build also builds the kxdp binary it runs)"
cargo test --release --locked --test lab_bench --no-run

out=target/lab-bench.jsonl
: > "$out"
echo "== $ROUNDS round(s) x {kxdp, iptables, nftables}, ${KXDP_BENCH_SECONDS}s each, $KXDP_BENCH_SERVICES other Services, $KXDP_BENCH_FLOWS flows"
for r in $(seq "$ROUNDS"); do
  for mode in kxdp iptables nftables; do
    line=$(KXDP_BENCH_MODE=$mode cargo test --release --locked --test lab_bench -- --ignored --nocapture \
             bench_lab_udp_clusterip 2>&1 | sed -n 's/^BENCH //p')
    [ -n "$line" ] || { echo "round $r $mode: no result" >&2; exit 1; }
    echo "$line" | tee -a "$out"
  done
done

python3 - "$out" <<'PY' | tee target/lab-bench.md
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print()
print("| forwarder | received pps (median) | min - max | sender pps (median) | machine busy ns / received packet (median) |")
print("| --- | --- | --- | --- | --- |")
for mode in ["kxdp", "iptables", "nftables"]:
    rs = [r for r in runs if r["mode"] == mode]
    if not rs:
        continue
    rx = [r["received_pps"] for r in rs]
    print(f"| {mode} | {statistics.median(rx)/1e3:.0f} k | {min(rx)/1e3:.0f}-{max(rx)/1e3:.0f} k "
          f"| {statistics.median([r['sent_pps'] for r in rs])/1e3:.0f} k "
          f"| {statistics.median([r['busy_ns_per_received_packet'] for r in rs]):.0f} |")
PY
python3 benches/chart.py target/lab-bench.md --label forwarder --value "received pps (median)" --unit "k pps" \
  --title "UDP to a ClusterIP through the lab: packets received per second (higher is better)" \
  > target/lab-received-pps.svg
echo "chart: target/lab-received-pps.svg (copy it to docs/img/ with the table into docs/benchmarks.md)" >&2
