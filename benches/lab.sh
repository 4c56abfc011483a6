#!/usr/bin/env bash
# The lab benchmark: 64-byte UDP from a pod through a ClusterIP to two pods, forwarded by kxdp
# (AF_XDP, one pinned worker: the full pipeline, and the I/O floor without it) and by the
# node's kernel (plain routing, kube-proxy-style iptables DNAT, nftables DNAT), on the same
# network-namespace topology, in one run. The load comes from `kxdp pcap send` (AF_XDP TX) and
# is counted by `kxdp pcap sink` (AF_XDP RX) in the pods: for every forwarder a loss curve
# (offered vs delivered at rising rates up to the generator's maximum), CPU per packet, and
# latency p50/p99 at half of its highest delivered rate.
# Needs root. Results: one JSON line per point in target/lab-bench.jsonl, a summary in
# target/lab-bench.md, the curves in target/lab-loss-curve.svg.
#
#   benches/lab.sh [ROUNDS=1] [SECONDS=3]
#   KXDP_BENCH_RATES=100000,500000,max KXDP_BENCH_MODES="kxdp iptables" benches/lab.sh
#   KXDP_BENCH_SERVICES=1000 KXDP_BENCH_FLOWS=64 benches/lab.sh
#   KXDP_BENCH_MODES="kxdp kxdp-deep" benches/lab.sh      # default rings against deeper ones
#   KXDP_BENCH_REF=/work/kxdp-s8 KXDP_BENCH_MODES="kxdp kxdp-ref iptables" benches/lab.sh
#                                  # mode kxdp-ref: the same as kxdp with the binary
#                                  # KXDP_BENCH_REF put in place of target/release/kxdp (for
#                                  # that mode only, generator and sinks included; put back
#                                  # after it): two builds compared in one run
#   KXDP_BENCH_PEER_THREADED=1     # the web pods' eth0 (the veth end receiving the forwarded
#                                  # frames) polled by a NAPI thread, in every mode
#   KXDP_BENCH_AFXDP="{frames: 65536, rxRingSize: 8192, fillRingSize: 8192}"  # kxdp-deep's config afxdp
#   KXDP_BENCH_SINK_CPU=0|1|none   # the sinks' CPU (default: 0, beside the generator; every
#                                  # forwarder forwards on CPU 1: kxdp's worker is pinned there,
#                                  # the kernel's paths are steered there by RPS)
#   KXDP_BENCH_KERNEL_RPS=off      # the kernel's paths forward inside the generator's sendto()
#                                  # on CPU 0 instead (sinks then on CPU 1)
#   KXDP_BENCH_WORKER_RT=1         # kxdp's worker SCHED_FIFO: a dedicated CPU on this shared
#                                  # machine (the kernel's paths run in softirq, which no
#                                  # process delays either)
#   KXDP_BENCH_SINK_NAP_US=50      # the sinks nap 50 µs when idle while traffic flows instead
#                                  # of waiting on their sockets: the forwarding CPU stops
#                                  # waking them for every flush (every mode; off by default)
#   KXDP_BENCH_KERNEL_RT=1         # for the kernel's modes, ksoftirqd/1 SCHED_FIFO while they
#                                  # run (put back after each): softirq work the kernel defers
#                                  # to that thread under load is then not delayed by other
#                                  # processes either. With KXDP_BENCH_WORKER_RT=1: the
#                                  # forwarding on CPU 1 goes ahead of other processes in every
#                                  # mode (a machine shared with builds; docs/benchmarks.md,
#                                  # "AF_XDP lab", "Where the time goes, and where the loss happens")
#
# Per point, target/lab-bench.md explains the loss: the counters that moved (the veths' drops,
# kxdp's sockets' kernel counters rx_dropped = fill ring empty and rx_ring_full, kxdp's own
# drops by reason) and kxdp's worker thread's ms on its CPU and ms waiting for it (schedstat);
# then the AF_XDP path's goals (kxdp >= 2x iptables, >= 0.8x the I/O floor, no loss below
# saturation) with met / not met.
#
# The method and the numbers are in docs/benchmarks.md ("AF_XDP lab").
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
export KXDP_BENCH_SECONDS=${2:-3}
export KXDP_BENCH_SERVICES=${KXDP_BENCH_SERVICES:-1000}
export KXDP_BENCH_FLOWS=${KXDP_BENCH_FLOWS:-64}
MODES=${KXDP_BENCH_MODES:-kxdp kxdp-floor routing iptables nftables}

[ "$(id -u)" = 0 ] || { echo "benches/lab.sh: needs root (network namespaces, XDP)" >&2; exit 1; }
if ! command -v iptables-restore >/dev/null || ! command -v nft >/dev/null || ! command -v ethtool >/dev/null; then
  echo "== installing iptables, nftables and ethtool (the per-point drop counters)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables nftables ethtool >/dev/null
fi

echo "== build (release; the test build also builds the kxdp binary it runs)"
# The I/O floor (mode kxdp-floor) is a feature of its own, never in a product build; with it the
# product loop is unchanged (the worker picks the floor's loop once, when it starts).
cargo test --release --locked --features bench-io-floor --test lab_bench --no-run
# The test binary is run directly (not through cargo, which would rebuild the kxdp binary that
# mode kxdp-ref swaps); its working directory is the crate's root, as under cargo.
testbin=$(cargo test --release --locked --features bench-io-floor --test lab_bench --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "lab_bench" and m.get("executable"):
        print(m["executable"])')
[ -x "$testbin" ] || { echo "benches/lab.sh: no lab_bench test binary" >&2; exit 1; }
bin=target/release/kxdp
swapped=""
put_back() { [ -z "$swapped" ] || mv -f "$bin.lab-own" "$bin"; swapped=""; }

out=target/lab-bench.jsonl
: > "$out"
echo "== $ROUNDS round(s) x {$MODES}, ${KXDP_BENCH_SECONDS}s per rate, $KXDP_BENCH_SERVICES other Services, $KXDP_BENCH_FLOWS flows"
ksoft=""
restore_ksoft() { [ -z "$ksoft" ] || chrt -o -p 0 "$ksoft" >/dev/null; ksoft=""; }
trap 'restore_ksoft; put_back' EXIT
for r in $(seq "$ROUNDS"); do
  for mode in $MODES; do
    if [ "${KXDP_BENCH_KERNEL_RT:-}" = 1 ] && [[ $mode != kxdp* ]]; then
      ksoft=$(pgrep -x ksoftirqd/1); chrt -f -p 10 "$ksoft"
    fi
    if [ "$mode" = kxdp-ref ]; then
      ref=${KXDP_BENCH_REF:?mode kxdp-ref needs KXDP_BENCH_REF=path of the reference kxdp}
      # New inodes only: cargo hard-links $bin to its artifact under deps/, and writing into
      # it (cp onto $bin) would change that artifact too, which the next cargo run puts back.
      ln -f "$bin" "$bin.lab-own"; swapped=1; cp -f "$ref" "$bin.lab-ref"; mv -f "$bin.lab-ref" "$bin"
    fi
    echo "== round $r $mode ($(uptime | sed 's/.*load/load/'))" >&2
    log=$(KXDP_BENCH_MODE=$mode "$testbin" --ignored --nocapture bench_lab_udp_clusterip 2>&1) ||
      { echo "$log" | tail -30 >&2; echo "round $r $mode: failed" >&2; exit 1; }
    restore_ksoft
    put_back
    lines=$(echo "$log" | sed -n 's/^BENCH //p')
    [ -n "$lines" ] || { echo "round $r $mode: no result" >&2; exit 1; }
    echo "$lines" | tee -a "$out"
  done
done

python3 benches/lab-summary.py "$out" | tee target/lab-bench.md
python3 benches/chart.py target/lab-bench.md --curves --label forwarder --x "offered (pps)" \
  --value "delivered (pps)" --unit "k pps" --scale 1e-3 \
  --title "64 B UDP to a ClusterIP through the lab: delivered vs offered (one worker / one core)" \
  > target/lab-loss-curve.svg
echo "chart: target/lab-loss-curve.svg (copy it to docs/img/ with the tables into docs/benchmarks.md)" >&2
