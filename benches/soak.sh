#!/usr/bin/env bash
# The soak benchmark: kxdp on both nodes of the two-node CNI lab (tests/cni/mod.rs) for 30 minutes
# under continuous HTTP (nginx in pods, through a ClusterIP and a NodePort), TCP and UDP traffic,
# with pods created and deleted every few seconds, a NetworkPolicy and a Service changing, every
# watch of the API source cut every 15 s (and once answered 410 Gone), one takeover of node-b's
# kxdp and one SIGKILL of node-a's in the middle. Reports every request's outcome (failures
# outside the SIGKILL gap fail the run), RSS, open descriptors, conntrack entries, UMEM frames in
# use and BPF map entries over time with their slopes, and every warning and error kxdp logged
# (one it should not have fails the run). Needs root. Driver: tests/lab_soak.rs.
#
#   sudo benches/soak.sh                      # 30 minutes
#   sudo benches/soak.sh --quick              # 75 s: checks that it works (CI runs it)
#   KXDP_SOAK_SECS=600 sudo -E benches/soak.sh   # another length
#   KXDP_BIN=/path/kxdp sudo -E benches/soak.sh  # another kxdp binary (no release build)
#   KXDP_SOAK_CONFIG="podInterception: {mode: tap}" sudo -E benches/soak.sh  # appended to both nodes' config
#
# Results (KXDP_SOAK_OUT, target/soak): soak.md (the report; without KXDP_SOAK_OUT also copied to
# target/soak.md), samples.csv
# (every sample), requests.csv (every failed request), kxdp-node-*.log.
# Method and figures: docs/benchmarks.md, "Soak".
set -Eeuo pipefail
cd "$(dirname "$0")/.."

quick=""
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    *) echo "benches/soak.sh: unknown argument $a (--quick)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "benches/soak.sh: needs root (network namespaces, XDP)" >&2; exit 1; }

# Debian packages: nginx for the HTTP servers, bpftool to count the XDP program's map entries,
# the CNI plugins the lab is made with, ss to see servers listen.
. benches/lab-common.sh
install_missing nginx:nginx-light bpftool:bpftool ss:iproute2 iptables-save:iptables
release_binary
out=${KXDP_SOAK_OUT:-$PWD/target/soak}
if [ -n "$quick" ]; then
  export KXDP_SOAK_SECS=75
else
  export KXDP_SOAK_SECS=${KXDP_SOAK_SECS:-1800}
fi
mkdir -p "$out"

echo "== soak, $KXDP_SOAK_SECS s ($(uptime | sed 's/.*load/load/'))"
cargo test --locked --test lab_soak -- --ignored --nocapture --exact soak
echo "report: $out/soak.md"
