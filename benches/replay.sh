#!/usr/bin/env bash
# Replay throughput of kxdp's pipeline (`kxdp replay`, the code the AF_XDP workers run) on
# synthetic captures from `kxdp pcap gen`, with a baseline measured in the same run.
#
# Why a same-run baseline: the benchmark machines are shared and noisy, so absolute Mpps move from
# run to run; the ratio of a case to the baseline, measured minutes apart on the same machine,
# moves much less. The baseline replays the 10k-flow established capture against a cluster with
# no Services, so every packet takes the cheapest full path (copy into the frame slot, parse,
# conntrack miss on an empty table, frontend miss, `direct`): what is left above it is the cost of
# NAT and connection tracking.
#
# Cases (IPv4, 1k Services × 10 endpoints, 64-byte frames):
#   est-10k   established flows, 10k flows,  PACKETS packets per pass,    REPEAT passes
#   est-1m    established flows, 1M flows,   PACKETS_1M packets per pass, REPEAT_1M passes
#   new-1m    new connections: NEW_PACKETS SYNs of distinct flows, one pass (a second pass
#             would find them all in conntrack); the table grows from 0 to NEW_PACKETS flows
#   mixed-10k 10k established flows, then 1 packet in 10 a new connection, one pass
#   baseline  the est-10k capture, no Services (see above)
# Flow layouts (the figures must hold for any layout), one worker, same sizes:
#   est-10k-s100 / est-10k-s30k   10k flows over 100 Services (100 flows each) / 30k Services
#   est-10k-c100 / est-10k-c1     10k flows from 100 client addresses (100 source ports each) /
#                                 from one (a node's own processes, an ingress or a NAT gateway)
#   new-s100 / new-s30k           new connections to 100 / 30k Services (10 endpoints each)
#   new-big                       new connections to one Service of 5,000 endpoints
#   mixed-s30k                    the mixed capture over 30k Services
#   est-1m-r10m                   est-1m's flows and packets on a 10-Mpps capture clock (`pcap gen
#                                 --rate`): conntrack's expiry scan reads every used entry once per
#                                 capture second, so est-1m (1 Mpps timestamps) replayed at ~8 Mpps
#                                 pays it ~8 times as often per packet as live traffic at that
#                                 rate would; this case pays it as 10 Mpps of live traffic would
# Clients: every capture spreads its flows over up to 65,534 client addresses (`kxdp pcap gen`'s
# address plan), so 10k flows have 10k clients and 1M flows about 15 ports per client.
# Established captures start with every flow's SYN; the "steady" columns exclude that first-pass
# cost by difference: (time of REPEAT passes - time of 1 pass) / ((REPEAT - 1) × packets).
#
# After the table, a summary against the replay goals: one worker's Mpps per case and the worst
# over the flow layouts (established: est-10k*, new: new-*, mixed: mixed-*), two workers' total
# against one worker's, and a new connection's cost at 30k Services and to one Service of 5,000
# endpoints against 100 Services. Those ratios are paired: the two runs of a ratio go back to
# back, in an order flipped every other round, PAIRS times, and the median ratio is reported (the
# table runs every one-worker case before any two-worker one, minutes apart, and the host's load
# drifts over minutes).
#
# Usage: benches/replay.sh [--quick]      (any working directory)
# Environment: WORKERS ("1 2"), RUNS (3; the median is reported), OUT (target/replay-bench),
# PACKETS (2000000), PACKETS_1M (4000000), NEW_PACKETS (1000000), REPEAT (5), REPEAT_1M (3),
# PAIRS (5; rounds of each paired ratio),
# KXDP (a kxdp binary to measure instead of building this tree's, e.g. a kxdp-before),
# BUILD (pgo: this tree's profile-guided build, scripts/pgo-build.sh, which the image ships; plain:
# `cargo build --release`).
# --quick: small captures, one run (checks the script, measures nothing worth keeping).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

WORKERS=${WORKERS:-"1 2"}
RUNS=${RUNS:-3}
PAIRS=${PAIRS:-5}
OUT=${OUT:-$ROOT/target/replay-bench}
PACKETS=${PACKETS:-2000000}
PACKETS_1M=${PACKETS_1M:-4000000}
FLOWS_1M=${FLOWS_1M:-1000000}
NEW_PACKETS=${NEW_PACKETS:-1000000}
REPEAT=${REPEAT:-5}
REPEAT_1M=${REPEAT_1M:-3}
SERVICES=1000
ENDPOINTS=10
if [[ ${1:-} == --quick ]]; then
    RUNS=1 PAIRS=1 PACKETS=200000 PACKETS_1M=400000 FLOWS_1M=100000 NEW_PACKETS=100000 REPEAT=3 REPEAT_1M=2
    OUT=$OUT-quick
fi

command -v jq >/dev/null || { echo "replay.sh: needs jq" >&2; exit 1; }

BUILD_LABEL="given by KXDP"
if [[ -z ${KXDP:-} ]]; then
    BUILD_LABEL=${BUILD:-pgo}
    case ${BUILD:-pgo} in
        pgo)
            echo "building the profile-guided release (scripts/pgo-build.sh) ..." >&2
            KXDP=$(scripts/pgo-build.sh)
            ;;
        plain)
            echo "building release ..." >&2
            cargo build --release --quiet --bin kxdp
            KXDP=$ROOT/target/release/kxdp
            ;;
        *) echo "replay.sh: BUILD is pgo or plain, not ${BUILD}" >&2; exit 2 ;;
    esac
fi
if ! "$KXDP" pcap gen --help >/dev/null 2>&1; then
    echo "replay.sh: this kxdp has no 'pcap gen' subcommand yet" >&2
    exit 1
fi
mkdir -p "$OUT"

# gen NAME MODE FLOWS PACKETS [SERVICES [ENDPOINTS [RATE [CLIENTS]]]]: a capture in $OUT/NAME,
# regenerated only when the arguments change.
gen() {
    local dir=$OUT/$1
    local args="--services ${5:-$SERVICES} --endpoints ${6:-$ENDPOINTS} --flows $3 --packets $4 --mode $2 --seed 1"
    [[ -n ${7:-} ]] && args+=" --rate $7"
    [[ -n ${8:-} ]] && args+=" --clients $8"
    if [[ -f $dir/capture.pcap && "$(cat "$dir/args" 2>/dev/null)" == "$args" ]]; then
        return
    fi
    echo "generating $1 ($args) ..." >&2
    rm -rf "$dir"
    # shellcheck disable=SC2086 # word splitting of $args is intended
    "$KXDP" pcap gen --out-dir "$dir" $args >/dev/null
    echo "$args" >"$dir/args"
}

# median of the numbers on stdin
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# run_json NAME CONFIG STATE REPEAT WORKERS [REPLAY FLAGS...]: one replay of NAME's capture (the
# part of NAME before any "+"); prints its JSON summary.
run_json() {
    "$KXDP" replay --config "$2" --state "$3" --pcap "$OUT/${1%%+*}/capture.pcap" \
        --workers "$5" --repeat "$4" --json "${@:6}"
}

# replay NAME CONFIG STATE REPEAT WORKERS: median seconds over $RUNS runs; prints "SECONDS PACKETS".
# The first run's summary is kept in $OUT/NAME.w$WORKERS.r$REPEAT.json (reasons, for checking that
# the traffic did what the case says).
replay() {
    local name=$1 repeat=$4 workers=$5 secs=() packets=0 i
    for ((i = 0; i < RUNS; i++)); do
        local json
        json=$(run_json "$@")
        [[ $i == 0 ]] && echo "$json" >"$OUT/$name.w$workers.r$repeat.json"
        secs+=("$(jq -r .seconds <<<"$json")")
        packets=$(jq -r .packets <<<"$json")
    done
    echo "$(printf '%s\n' "${secs[@]}" | median) $packets"
}

gen est-10k established 10000 "$PACKETS"
gen est-1m established "$FLOWS_1M" "$PACKETS_1M"
gen new-1m new 1 "$NEW_PACKETS"
gen mixed-10k mixed 10000 "$PACKETS"
gen est-10k-s100 established 10000 "$PACKETS" 100
gen est-10k-s30k established 10000 "$PACKETS" 30000
gen est-10k-c100 established 10000 "$PACKETS" "$SERVICES" "$ENDPOINTS" "" 100
gen est-10k-c1 established 10000 "$PACKETS" "$SERVICES" "$ENDPOINTS" "" 1
gen new-s100 new 1 "$NEW_PACKETS" 100
gen new-s30k new 1 "$NEW_PACKETS" 30000
gen new-big new 1 "$NEW_PACKETS" 1 5000
gen mixed-s30k mixed 10000 "$PACKETS" 30000
gen est-1m-r10m established "$FLOWS_1M" "$PACKETS_1M" "$SERVICES" "$ENDPOINTS" 10000000

# The baseline cluster: the same node, no Services, and service CIDRs the capture does not touch.
mkdir -p "$OUT/baseline"
sed 's|^serviceCIDRs:.*|serviceCIDRs: [192.0.2.0/24]|' "$OUT/est-10k/config.yaml" >"$OUT/baseline/config.yaml"
awk 'NR > 1 && /^---/ { exit } { print }' "$OUT/est-10k/state.yaml" >"$OUT/baseline/state.yaml"

# Total Mpps of each case and worker count ("NAME.WORKERS"), and steady Mpps per worker, for the
# summary.
declare -A MPPS STEADY
# row NAME WORKERS SECONDS PACKETS BASE_NS [STEADY_NS]
row() {
    MPPS[$1.$2]=$(awk -v s="$3" -v p="$4" 'BEGIN { printf "%.3f", p / s / 1e6 }')
    # A disturbed run can make the difference negative ("nan"): no steady figure then.
    if [[ -n ${6:-} && $6 != nan ]]; then
        STEADY[$1.$2]=$(awk -v d="$6" 'BEGIN { printf "%.3f", 1e3 / d }')
    fi
    awk -v name="$1" -v w="$2" -v s="$3" -v p="$4" -v base="$5" -v steady="${6:-}" 'BEGIN {
        ns = s * 1e9 / p * w            # per worker: each worker spends this long on a packet
        line = sprintf("| %-12s | %7d | %10.2f | %13.2f | %8.1f | %6.2f |", name, w, p / s / 1e6, p / s / 1e6 / w, ns, ns / base)
        if (steady != "") line = line sprintf(" %12.2f | %10.1f | %6.2f |", 1e3 / steady, steady, steady / base)
        else line = line "              |            |        |"
        print line
    }'
}

# The table goes to stdout and to $OUT/replay.md, which benches/chart.py turns into the SVG chart
# docs/benchmarks.md embeds.
exec > >(tee "$OUT/replay.md")
echo
echo "kxdp replay, $(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), Linux $(uname -r)"
echo "binary: $KXDP (build: $BUILD_LABEL)"
echo "median of $RUNS runs; per-worker figures = total / workers; ratio = ns per packet / baseline's"
echo
echo "| case         | workers | Mpps total | Mpps / worker | ns / pkt | ratio  | steady Mpps/w | steady ns  | ratio  |"
echo "| ------------ | ------- | ---------- | ------------- | -------- | ------ | ------------- | ---------- | ------ |"
for w in $WORKERS; do
    read -r bs bp < <(replay est-10k+baseline "$OUT/baseline/config.yaml" "$OUT/baseline/state.yaml" "$REPEAT" "$w")
    base_ns=$(awk -v s="$bs" -v p="$bp" -v w="$w" 'BEGIN { print s * 1e9 / p * w }')
    row baseline "$w" "$bs" "$bp" "$base_ns"
    for spec in "est-10k $REPEAT" "est-1m $REPEAT_1M"; do
        read -r name repeat <<<"$spec"
        read -r s1 p1 < <(replay "$name" "$OUT/$name/config.yaml" "$OUT/$name/state.yaml" 1 "$w")
        read -r sk pk < <(replay "$name" "$OUT/$name/config.yaml" "$OUT/$name/state.yaml" "$repeat" "$w")
        steady=$(awk -v s1="$s1" -v p1="$p1" -v sk="$sk" -v pk="$pk" -v w="$w" \
            'BEGIN { d = (sk - s1) * 1e9 / (pk - p1) * w; print (d > 0 ? d : "nan") }')
        row "$name" "$w" "$sk" "$pk" "$base_ns" "$steady"
    done
    for name in new-1m mixed-10k; do
        read -r s p < <(replay "$name" "$OUT/$name/config.yaml" "$OUT/$name/state.yaml" 1 "$w")
        row "$name" "$w" "$s" "$p" "$base_ns"
    done
    [[ $w == 1 ]] && base1_ns=$base_ns
done
# The layouts, one worker, against the one-worker baseline. A new connection's cost at 30k
# Services (and to one Service of 5,000 endpoints) against 100 Services is the ratio of the
# new-s30k (new-big) row's ns per packet to new-s100's.
if [[ -n ${base1_ns:-} ]]; then
    for name in est-10k-s100 est-10k-s30k est-10k-c100 est-10k-c1; do
        read -r s p < <(replay "$name" "$OUT/$name/config.yaml" "$OUT/$name/state.yaml" "$REPEAT" 1)
        row "$name" 1 "$s" "$p" "$base1_ns"
    done
    for name in new-s100 new-s30k new-big mixed-s30k; do
        read -r s p < <(replay "$name" "$OUT/$name/config.yaml" "$OUT/$name/state.yaml" 1 1)
        row "$name" 1 "$s" "$p" "$base1_ns"
    done
    name=est-1m-r10m
    read -r s1 p1 < <(replay "$name" "$OUT/$name/config.yaml" "$OUT/$name/state.yaml" 1 1)
    read -r sk pk < <(replay "$name" "$OUT/$name/config.yaml" "$OUT/$name/state.yaml" "$REPEAT_1M" 1)
    steady=$(awk -v s1="$s1" -v p1="$p1" -v sk="$sk" -v pk="$pk" \
        'BEGIN { d = (sk - s1) * 1e9 / (pk - p1); print (d > 0 ? d : "nan") }')
    row "$name" 1 "$sk" "$pk" "$base1_ns" "$steady"
fi
# The flows sweep of the Mpps-against-flows chart (one worker): 1k and 100k flows beside est-10k
# and est-1m, same Services and packets as est-10k.
if [[ -n ${base1_ns:-} ]]; then
    for spec in "est-1k 1000" "est-100k 100000"; do
        read -r name flows <<<"$spec"
        gen "$name" established "$flows" "$PACKETS"
        read -r s p < <(replay "$name" "$OUT/$name/config.yaml" "$OUT/$name/state.yaml" "$REPEAT" 1)
        row "$name" 1 "$s" "$p" "$base1_ns"
    done
fi

# Paired ratios (goals 2 and 3): each ratio's two runs back to back, PAIRS rounds.
# mpps NAME WORKERS REPEAT [DIR]: one run's total Mpps; with DIR, the conntrack table in a state
# file there (`--conntrack-file`), as `kxdp run` keeps it with conntrack.stateFile.
mpps() {
    local file=()
    [[ -n ${4:-} ]] && file=(--conntrack-file "$4/kxdp-bench-conntrack.$$")
    run_json "$1" "$OUT/$1/config.yaml" "$OUT/$1/state.yaml" "$3" "$2" "${file[@]}" | jq -r .mpps
}
declare -A PAIRED
# pair KEY LABEL "A: NAME WORKERS REPEAT" "B: NAME WORKERS REPEAT": Mpps(B) / Mpps(A) per round
# (A first in odd rounds, B first in even ones); the median goes to PAIRED[KEY].
pair() {
    local key=$1 label=$2 a b r ratios=() ma mb
    read -r -a a <<<"$3"
    read -r -a b <<<"$4"
    for ((r = 1; r <= PAIRS; r++)); do
        if ((r % 2)); then
            ma=$(mpps "${a[@]}"); mb=$(mpps "${b[@]}")
        else
            mb=$(mpps "${b[@]}"); ma=$(mpps "${a[@]}")
        fi
        ratios+=("$(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.3f", b / a }')")
    done
    PAIRED[$key]=$(printf '%s\n' "${ratios[@]}" | median | awk '{ printf "%.2f", $1 }')
    printf '| %-44s | %-36s | %6s |\n' "$label" "${ratios[*]}" "${PAIRED[$key]}"
}
echo
echo "Paired ratios, $PAIRS rounds each (the two runs back to back, order flipped every other round):"
echo
echo "| ratio                                        | per round                            | median |"
echo "| -------------------------------------------- | ------------------------------------ | ------ |"
if [[ " $WORKERS " == *" 2 "* ]]; then
    pair est-10k "est-10k: 2 workers / 1 (total Mpps)" "est-10k 1 $REPEAT" "est-10k 2 $REPEAT"
    pair est-1m "est-1m: 2 workers / 1 (total Mpps)" "est-1m 1 $REPEAT_1M" "est-1m 2 $REPEAT_1M"
    pair new-1m "new-1m: 2 workers / 1 (total Mpps)" "new-1m 1 1" "new-1m 2 1"
fi
# Cost per connection = 1 / Mpps, so the cost ratio is Mpps(new-s100) / Mpps(case).
pair new-s30k "new connection cost: new-s30k / new-s100" "new-s30k 1 1" "new-s100 1 1"
pair new-big "new connection cost: new-big / new-s100" "new-big 1 1" "new-s100 1 1"
# The state file's pages (docs/benchmarks.md, "The state file in huge pages"): est-1m with its
# table in a file on a plain tmpfs (4 KiB pages, as on the host's /run) and on a tmpfs mounted
# with huge=within_size (what `kxdp prepare` mounts), against process memory. Root only (mount).
if [[ $(id -u) == 0 && -d /dev/shm ]]; then
    HUGE_DIR=$OUT/ct-huge
    mkdir -p "$HUGE_DIR"
    mountpoint -q "$HUGE_DIR" || mount -t tmpfs -o huge=within_size,mode=0700 tmpfs "$HUGE_DIR"
    trap 'umount -l "$HUGE_DIR" 2>/dev/null || true' EXIT
    pair file-small "est-1m: state file, 4 KiB pages / huge pages" \
        "est-1m 1 $REPEAT_1M $HUGE_DIR" "est-1m 1 $REPEAT_1M /dev/shm"
    pair file-huge "est-1m: state file in huge pages / memory" \
        "est-1m 1 $REPEAT_1M" "est-1m 1 $REPEAT_1M $HUGE_DIR"
fi

# summary: the replay goals against this run's figures.
# val KEY [STEADY]: the case's figure ("-" when not measured)
val() {
    if [[ ${2:-} == steady ]]; then echo "${STEADY[$1]:--}"; else echo "${MPPS[$1]:--}"; fi
}
# worst NAME...: the lowest one-worker Mpps of the cases given (and which)
worst() {
    local n v out=""
    for n in "$@"; do
        v=${MPPS[$n.1]:-}
        [[ -n $v ]] && out+="$v $n"$'\n'
    done
    printf '%s' "$out" | sort -g | head -1
}
goal_row() { # NAME MEASURED GOAL KIND(min|max)
    awk -v name="$1" -v m="$2" -v g="$3" -v kind="$4" 'BEGIN {
        ok = (m == "-" || m == "") ? "not measured" : ((kind == "min" ? m + 0 >= g + 0 : m + 0 <= g + 0) ? "met" : "not met")
        printf "| %-52s | %9s | %s %-5s | %-12s |\n", name, m, (kind == "min" ? ">=" : "<="), g, ok
    }'
}
echo
echo "| goal (one worker unless said)                         | measured  | goal     | status       |"
echo "| ---------------------------------------------------- | --------- | -------- | ------------ |"
goal_row "est-10k, Mpps (whole run)" "$(val est-10k.1)" 25 min
goal_row "est-1m, Mpps (steady)" "$(val est-1m.1 steady)" 10 min
goal_row "est-1m on a 10-Mpps capture clock, Mpps (steady)" "$(val est-1m-r10m.1 steady)" 10 min
goal_row "new-1m, Mpps" "$(val new-1m.1)" 5 min
goal_row "mixed-10k, Mpps" "$(val mixed-10k.1)" 15 min
read -r wv wn < <(worst est-10k est-10k-s100 est-10k-s30k est-10k-c100 est-10k-c1) || true
goal_row "established, worst layout ($wn), Mpps" "$wv" 25 min
read -r wv wn < <(worst new-1m new-s100 new-s30k new-big) || true
goal_row "new connections, worst layout ($wn), Mpps" "$wv" 5 min
read -r wv wn < <(worst mixed-10k mixed-s30k) || true
goal_row "mixed, worst layout ($wn), Mpps" "$wv" 15 min
for name in est-10k est-1m new-1m; do
    goal_row "$name, 2 workers / 1 worker (total Mpps; paired)" "${PAIRED[$name]:--}" 1.85 min
done
for name in new-s30k new-big; do
    goal_row "new connection cost, $name / new-s100 (paired)" "${PAIRED[$name]:--}" 1.1 max
done
echo
echo "verdict reasons of the first run of each case: $OUT/*.json" >&2
python3 benches/chart.py "$OUT/replay.md" --label case,workers --value "ns / pkt" --unit ns \
    --title "kxdp replay: ns per packet per worker (lower is better; baseline = cheapest complete path)" \
    >"$OUT/replay-ns-per-packet.svg"
# Mpps against flows (established, one worker: est-1k .. est-1m; two workers where measured),
# against workers (total), and against Services (one worker; est-10k, new-1m, mixed-10k have 1000).
python3 benches/chart.py "$OUT/replay.md" --xy --label case,workers --value "Mpps / worker" --logx \
    --points "est-1k=1000:established,est-10k=10000:established,est-100k=100000:established,est-1m=1000000:established" \
    --xtitle flows --title "kxdp replay: established TCP, Mpps per worker against flows" \
    >"$OUT/replay-mpps-flows.svg"
python3 benches/chart.py "$OUT/replay.md" --xy --label case --x workers --value "Mpps total" \
    --cases baseline,est-10k,est-1m,new-1m,mixed-10k \
    --title "kxdp replay: Mpps (all workers) against workers" >"$OUT/replay-mpps-workers.svg"
python3 benches/chart.py "$OUT/replay.md" --xy --label case --where workers=1 --value "Mpps / worker" --logx \
    --points "est-10k-s100=100:established,est-10k=1000:established,est-10k-s30k=30000:established,new-s100=100:new connections,new-1m=1000:new connections,new-s30k=30000:new connections,mixed-10k=1000:mixed,mixed-s30k=30000:mixed" \
    --xtitle Services --title "kxdp replay: one worker, Mpps against Services" >"$OUT/replay-mpps-services.svg"
# Against client addresses (established, 10k flows, one worker): 1, 100 and 10k clients.
python3 benches/chart.py "$OUT/replay.md" --xy --label case --where workers=1 --value "Mpps / worker" --logx \
    --points "est-10k-c1=1:established,est-10k-c100=100:established,est-10k=10000:established" \
    --xtitle "client addresses" --title "kxdp replay: 10k established flows, one worker, Mpps against clients" \
    >"$OUT/replay-mpps-clients.svg"
echo "charts: $OUT/replay-ns-per-packet.svg, replay-mpps-{flows,workers,services,clients}.svg (copy them to docs/img/ with the table into docs/benchmarks.md)" >&2
