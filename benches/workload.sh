#!/usr/bin/env bash
# The workload benchmark: real servers and clients in the pods of the two-node CNI lab
# (tests/cni/mod.rs: Debian's CNI reference plugins, ptp on node A, bridge on node B, pod ranges
# routed between the nodes) through ClusterIPs whose endpoint is on the other node ("remote")
# and on the client's node ("local"). The Service dataplane alternates within each round: kxdp
# on both nodes, then kube-proxy's iptables rules for the same Services, then its nftables
# rules. Tests: iperf3 1 and 4 streams, wrk keep-alive and `Connection: close` against nginx,
# sockperf UDP ping-pong, dnsperf against dnsmasq. Medians of the rounds, ratios kxdp / each
# kernel mode, and the whole machine's CPU per unit of work (/proc/stat over each test).
# Needs root.
#
#   sudo benches/workload.sh                  # 3 rounds, 5 s per test (about 8 minutes)
#   sudo benches/workload.sh --quick          # 1 round, 1 s per test: checks that it works
#   ROUNDS=5 SECONDS_PER_TEST=10 MODES="kxdp iptables" sudo -E benches/workload.sh
#   MODES="kxdp kxdp-tap iptables" sudo -E benches/workload.sh   # XDP everywhere, the default
#   (kxdp: podInterception mode xdp; kxdp-tap: the default, the pods' veths and the lab's veth
#   uplink through the tap; kxdp-tap-pods: the uplink on XDP, as a NIC keeps it;
#   kxdp-tap-no-offload: the tap without the in-kernel fast path for established flows;
#   kxdp-tap-uplink: the uplink named in podInterception.interfaces;
#   kxdp-pinned: each node's worker on a CPU of its own (any kxdp mode with -pinned, e.g.
#   kxdp-tap-uplink-pinned); kxdp-base: the build at KXDP_BASE_BIN,
#   for a same-run comparison of two builds; any kxdp mode with "@base", e.g. kxdp-tap@base,
#   runs that build too)
#   TESTS="remote wrk close,local iperf3 x1" sudo -E benches/workload.sh   # some tests only
#   KXDP_BIN=/path/kxdp sudo -E benches/workload.sh   # another kxdp binary (no release build)
#
# Results: target/workload/results.jsonl (one JSON line per measurement),
# target/workload/summary.md (the tables), target/workload/workload-throughput.svg and
# workload-cpu.svg (relative to iptables, per mode; benches/chart.py).
# Method and figures: docs/benchmarks.md, "Workloads".
set -Eeuo pipefail
cd "$(dirname "$0")/.."

quick=""
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    *) echo "benches/workload.sh: unknown argument $a (--quick)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "benches/workload.sh: needs root (network namespaces, XDP)" >&2; exit 1; }

# Debian packages: the tools, the CNI plugins the lab is made with, the kernel modes' rule
# loaders. dnsmasq-base: the binary without the host service the `dnsmasq` package starts.
. benches/lab-common.sh
install_missing iperf3:iperf3 wrk:wrk nginx:nginx-light sockperf:sockperf dnsperf:dnsperf \
  dnsmasq:dnsmasq-base nft:nftables iptables-restore:iptables ss:iproute2 conntrack:conntrack
release_binary
out=${KXDP_WORKLOAD_OUT:-$PWD/target/workload}
export KXDP_WORKLOAD_OUT=$out
if [ -n "$quick" ]; then
  export KXDP_WORKLOAD_QUICK=1
else
  export KXDP_WORKLOAD_ROUNDS=${ROUNDS:-3} KXDP_WORKLOAD_SECONDS=${SECONDS_PER_TEST:-5}
fi
[ -z "${MODES:-}" ] || export KXDP_WORKLOAD_MODES=$MODES
[ -z "${TESTS:-}" ] || export KXDP_WORKLOAD_TESTS=$TESTS
mkdir -p "$out"

echo "== workload benchmark ($(uptime | sed 's/.*load/load/'))"
cargo test --locked --test lab_workload -- --ignored --nocapture --exact workload

if grep -q "^## Relative to iptables" "$out/summary.md"; then
  python3 benches/chart.py "$out/summary.md" --after "Relative to iptables" --label mode,test \
    --value "throughput / iptables" --title "Workloads: throughput relative to iptables (higher is better)" \
    > "$out/workload-throughput.svg"
  python3 benches/chart.py "$out/summary.md" --after "Relative to iptables" --label mode,test \
    --value "CPU per unit / iptables" --title "Workloads: CPU per unit of work relative to iptables (lower is better)" \
    > "$out/workload-cpu.svg"
  echo "charts: $out/workload-throughput.svg, $out/workload-cpu.svg"
fi
cat "$out/summary.md"
