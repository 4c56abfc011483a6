#!/bin/bash
# usage: (in a `kxdp pcap gen` output dir) benches/run-startup.sh KXDP — seconds from exec to the first "published" log line of `kxdp run --state`.
BIN=$1; LOG=$(mktemp)
start=$(date +%s.%N)
$BIN run --config config.yaml --state state.yaml --log-level kxdp_control=debug > "$LOG" 2>&1 &
PID=$!
for i in $(seq 1 4000); do
  if grep -q published "$LOG"; then end=$(date +%s.%N); break; fi
  sleep 0.01
done
kill $PID; wait $PID 2>/dev/null
[ -n "$end" ] || { echo "no publication within 40 s" >&2; rm -f "$LOG"; exit 1; }
echo "$end $start" | awk '{printf "%.3f s\n", $1-$2}'
rm -f "$LOG"
