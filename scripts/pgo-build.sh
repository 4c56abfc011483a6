#!/usr/bin/env bash
# The profile-guided release build of kxdp: what deploy/Dockerfile ships and benches/replay.sh
# measures (docs/benchmarks.md, "The workers' frames and the profile-guided build").
#
# 1. builds kxdp instrumented (`-Cprofile-generate`);
# 2. trains it: `kxdp replay` of captures from `kxdp pcap gen` (established, mixed and new
#    connections, IPv4 and IPv6, 100 to 30k Services, 64-byte to 1500-byte frames; seeds other
#    than the benchmark's) and of the shipped example capture through the example cluster
#    (policies, ICMP, UDP, fragments). The replay runs the workers' own instance of the pipeline
#    (`UmemBatch`), so the profile is of the code `kxdp run` runs per packet;
# 3. merges the profile (`llvm-profdata` of rustc's LLVM version);
# 4. builds kxdp again with it (`-Cprofile-use`). Code the training does not reach (the AF_XDP
#    sockets' ring handling, the control plane) keeps the ordinary optimisation: `-pgso=false`
#    stops LLVM from optimising it for size as cold.
#
# Usage: scripts/pgo-build.sh [--target TRIPLE] [--out PATH]
#   --target  the target triple (default: the host's), e.g. x86_64-unknown-linux-musl
#   --out     where the binary goes (default: target/pgo/TRIPLE/kxdp)
# Environment: LLVM_PROFDATA (an llvm-profdata of rustc's LLVM major version; otherwise found in
# rustup's llvm-tools component or Debian's llvm-N package, N that version); RUSTFLAGS (kept,
# the profile flags added to it); CC_<triple> as for any cross build.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

TARGET=$(rustc -vV | sed -n 's/^host: //p')
OUT=
while [[ $# -gt 0 ]]; do
    case $1 in
        --target) TARGET=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "pgo-build.sh: unknown argument $1 (usage: scripts/pgo-build.sh [--target TRIPLE] [--out PATH])" >&2; exit 2 ;;
    esac
done
WORK=$ROOT/target/pgo/$TARGET
OUT=${OUT:-$WORK/kxdp}

# The profile's format follows LLVM's version: the merge tool must be rustc's LLVM's.
LLVM_MAJOR=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
find_profdata() {
    local sysroot host c
    sysroot=$(rustc --print sysroot)
    host=$(rustc -vV | sed -n 's/^host: //p')
    for c in "${LLVM_PROFDATA:-}" "$sysroot/lib/rustlib/$host/bin/llvm-profdata" \
        "/usr/lib/llvm-$LLVM_MAJOR/bin/llvm-profdata" "$(command -v "llvm-profdata-$LLVM_MAJOR" || true)"; do
        if [[ -n $c && -x $c ]] && "$c" --version 2>/dev/null | grep -q "LLVM version $LLVM_MAJOR\."; then
            echo "$c"
            return
        fi
    done
    return 1
}
if ! PROFDATA=$(find_profdata); then
    echo "pgo-build.sh: needs llvm-profdata of LLVM $LLVM_MAJOR (rustc's): 'rustup component add llvm-tools'," \
        "or Debian's package llvm-$LLVM_MAJOR, or LLVM_PROFDATA=<path>" >&2
    exit 1
fi

rm -rf "$WORK/raw" "$WORK/train"
mkdir -p "$WORK/raw" "$WORK/train" "$(dirname "$OUT")"

echo "pgo-build.sh: 1/4 instrumented build ($TARGET)" >&2
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$WORK/raw" CARGO_TARGET_DIR=$ROOT/target/pgo/gen \
    cargo build --release --locked --quiet --target "$TARGET" --bin kxdp
GEN=$ROOT/target/pgo/gen/$TARGET/release/kxdp

echo "pgo-build.sh: 2/4 training" >&2
# Only the training runs write the profile: the build scripts the instrumented build ran wrote
# theirs into the same directory.
rm -rf "$WORK/raw" && mkdir -p "$WORK/raw"
train() { # name, then `pcap gen` arguments
    local name=$1 dir=$WORK/train/$1
    shift
    "$GEN" pcap gen --out-dir "$dir" --seed 7 "$@" >/dev/null
    "$GEN" replay --config "$dir/config.yaml" --state "$dir/state.yaml" --pcap "$dir/capture.pcap" \
        --workers 1 --json >/dev/null
}
train est --mode established --flows 10000 --packets 400000
train est-big-frames --mode established --flows 20000 --packets 200000 --payload 1500 --services 100
train est-v6 --mode established --flows 10000 --packets 200000 --ipv6
train mixed --mode mixed --flows 10000 --packets 300000
train new --mode new --packets 100000 --services 30000
train new-big --mode new --packets 50000 --services 1 --endpoints 5000
# Two workers share the table: its concurrent paths.
"$GEN" replay --config "$WORK/train/est/config.yaml" --state "$WORK/train/est/state.yaml" \
    --pcap "$WORK/train/est/capture.pcap" --workers 2 --json >/dev/null
# The example cluster: policies, ICMP, UDP, fragments, rejects.
for _ in 1 2 3; do
    "$GEN" replay --config examples/config.yaml --state examples/cluster --pcap pcaps/example.pcap \
        --json >/dev/null
done

echo "pgo-build.sh: 3/4 merging the profile" >&2
"$PROFDATA" merge -o "$WORK/kxdp.profdata" "$WORK/raw"

echo "pgo-build.sh: 4/4 optimised build" >&2
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$WORK/kxdp.profdata -Cllvm-args=-pgso=false" \
    CARGO_TARGET_DIR=$ROOT/target/pgo/use \
    cargo build --release --locked --quiet --target "$TARGET" --bin kxdp
install -m 0755 "$ROOT/target/pgo/use/$TARGET/release/kxdp" "$OUT"
echo "$OUT"
