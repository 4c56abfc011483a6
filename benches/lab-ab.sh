#!/usr/bin/env bash
# Before/after on the AF_XDP lab, interleaved in one run: two kxdp binaries forward the same
# paced UDP load in turn (`kxdp pcap send` to the ClusterIP, `kxdp pcap sink` in the web pods,
# both from $PCAP so the load is the same for both), and each point records where its frames
# went: kxdp's forwarded count, its sockets' kernel drops (rx_dropped = fill ring empty,
# rx_ring_full), its drops by reason, the veths' drop counters, the sinks' drops, and the
# worker thread's ms on its CPU and waiting for it (schedstat). Mechanisms, not rates: on a
# shared machine compare the two binaries' counters point by point (docs/benchmarks.md,
# "AF_XDP lab", "Where the time goes, and where the loss happens"). Needs root; its namespaces are lab-e-* (removed at the
# end).
#
#   BEFORE=/path/kxdp-before AFTER=target/release/kxdp benches/lab-ab.sh [ROUNDS=2]
#   knobs: RATES="20000 50000 100000 250000" SECS=3 SINKCPU=0 (empty: unpinned)
#          RT=1: the worker thread SCHED_FIFO (isolates kxdp's own mechanisms from the wait
#          for a CPU; an experiment, not a deployment setting)
# Results: one JSON line per point in target/lab-ab.jsonl, the table on stdout.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "benches/lab-ab.sh: needs root" >&2; exit 1; }
P=lab-e
NODE=$P-node
PODS=("web-1 vpod1 10.1.0.11" "web-2 vpod2 10.1.0.12" "client-1 vpod3 10.1.0.13")
export RUN=$PWD/target/lab-ab
BEFORE=${BEFORE:?BEFORE=path of the kxdp binary to compare against}
AFTER=${AFTER:-target/release/kxdp}
PCAP=${PCAP:-$BEFORE}
RES=$PWD/target/lab-ab.jsonl
export RES SINKCPU=${SINKCPU-0}
down() {
  for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done
  done
  sleep 0.5
  for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
up() {
  down; mkdir -p $RUN
  ip netns add $NODE; ip -n $NODE link set lo up
  ip netns add $P-ext; ip -n $P-ext link set lo up
  ip -n $NODE link add up0 type veth peer name eth0 netns $P-ext
  ip -n $NODE addr add 192.168.0.2/24 dev up0; ip -n $NODE link set up0 up
  ip -n $P-ext addr add 192.168.0.100/24 dev eth0; ip -n $P-ext link set eth0 up
  for p in "${PODS[@]}"; do
    set -- $p; ns=$P-$1
    ip netns add "$ns"; ip -n "$ns" link set lo up
    ip -n $NODE link add "$2" type veth peer name eth0 netns "$ns"
    ip -n $NODE link set "$2" up
    ip -n $NODE addr add 169.254.1.1/32 dev "$2"
    ip -n $NODE route add "$3/32" dev "$2"
    ip -n "$ns" addr add "$3/32" dev eth0; ip -n "$ns" link set eth0 up
    ip -n "$ns" route add 169.254.1.1/32 dev eth0 scope link
    ip -n "$ns" route add default via 169.254.1.1 dev eth0
  done
}
kx() {
  local bin=$1 extra=${2:-}
  sed 's/workers: {count: 1, cpus: \[\]}/workers: {count: 1, cpus: [1]}/' tests/lab/config.yaml > $RUN/config.yaml
  [ -z "$extra" ] || echo "$extra" >> $RUN/config.yaml
  setsid ip netns exec $NODE "$bin" run --config $RUN/config.yaml --state tests/lab/cluster.yaml --no-admin \
     >$RUN/kxdp.out 2>$RUN/kxdp.log </dev/null &
  for _ in $(seq 300); do grep -q "forwarding on" $RUN/kxdp.log 2>/dev/null && break; sleep 0.1; done
  sleep 1
  grep -q "forwarding on" $RUN/kxdp.log || { cat $RUN/kxdp.log; exit 1; }
  if [ -n "${RT:-}" ]; then
  pid=$(ip netns pids $NODE | head -1)
    for t in /proc/$pid/task/*; do if grep -q kxdp-worker $t/comm; then chrt -f -p 10 ${t##*/}; fi; done
  fi
}
stop() {
  for pid in $(ip netns pids $NODE); do kill $pid 2>/dev/null || true; done; sleep 1
}
snap() { # metrics + worker sched
  local pid tid
  ip netns exec $NODE curl -s --max-time 3 http://127.0.0.1:10249/metrics | grep -E '^kxdp_(xsk_(rx|tx)_[a-z_]*_total|drops_total)' | tr -d '{}"' | sed 's/interface=//; s/,queue=0//; s/reason=//'
    echo "fwd $(ip netns exec $NODE curl -s --max-time 3 http://127.0.0.1:10249/metrics | awk '/^kxdp_packets_total.*forward/ {s+=$2} END {print s+0}')"
  for d in vpod1 vpod2 vpod3; do echo "tx_dropped_$d $(ip netns exec $NODE cat /sys/class/net/$d/statistics/tx_dropped)"; ip netns exec $NODE ethtool -S $d | awk -v d=$d "/drop/ {gsub(\":\",\"\"); print \"eth_\" d \"_\" \$1, \$2}"; done
  for w in web-1 web-2; do echo "rx_dropped_$w $(ip netns exec $P-$w cat /sys/class/net/eth0/statistics/rx_dropped)"; done
  echo "tx_dropped_client $(ip netns exec $P-client-1 cat /sys/class/net/eth0/statistics/tx_dropped)"
  pid=$(ip netns pids $NODE | head -1)
  for t in /proc/$pid/task/*; do
    if grep -q kxdp-worker $t/comm 2>/dev/null; then
      read run wait slices < $t/schedstat
      echo "w_run $run"; echo "w_wait $wait"; echo "w_slices $slices"
      awk '/voluntary_ctxt/ {print "w_"$1" "$2}' $t/status | tr -d ':'
    fi
  done
}
point() {
  local rate=$1 secs=$2 mac
  mac=$(ip -n $NODE -br link show dev vpod3 | awk '{print $3}')
  local sinks=()
  for w in web-1 web-2; do
    ip netns exec $P-$w $PCAP pcap sink --iface eth0 --duration $(echo "$secs+6"|bc) --idle-exit 400 ${SINKCPU:+--cpu $SINKCPU} >$RUN/sink-$w.json 2>$RUN/sink-$w.log &
    sinks+=($!)
  done
  for _ in $(seq 100); do [ "$(grep -c 'sink ready' $RUN/sink-web-*.log 2>/dev/null | awk -F: '{s+=$2} END{print s}')" = 2 ] && break; sleep 0.1; done
  snap > $RUN/before
  ip netns exec $P-client-1 $PCAP pcap send --iface eth0 --rate $rate --duration $secs --dst-mac $mac \
     --src 10.1.0.13 --dst 172.30.0.10:53 --flows 64 --cpu 0 > $RUN/send.json
  wait "${sinks[@]}"
  sleep 1.3
  snap > $RUN/after
  python3 - "$rate" <<'PY'
import json,os,sys
rate=sys.argv[1]
s=json.load(open(os.environ['RUN']+'/send.json'))
sj=[json.loads(open(os.environ['RUN']+f'/sink-{w}.json').read().strip().splitlines()[-1]) for w in ['web-1','web-2']]
r=sum(j['received'] for j in sj)
sinkd=sum(j.get('kernel_rx_dropped',0) for j in sj)
def rd(f):
    d={}
    for l in open(f):
        k,v=l.rsplit(None,1); d[k]=float(v)
    return d
a,b=rd(os.environ['RUN']+'/before'),rd(os.environ['RUN']+'/after')
mv={k:b[k]-a.get(k,0) for k in b if b[k]-a.get(k,0)}
sent=s['sent']; sec=s['seconds']
print(f"rate={rate} sent={sent} offered={sent/sec:.0f} recv={r} loss={1-r/max(sent,1):.2%} sink_dropped={sinkd}")
print("  "+", ".join(f"{k}={v:.0f}" for k,v in sorted(mv.items()) if not k.startswith('w_')))
import os
if os.environ.get('RES'):
    with open(os.environ['RES'],'a') as f:
        f.write(json.dumps(dict(tag=os.environ.get('TAG',''),rate=rate,sent=sent,offered=sent/sec,recv=r,
          rx_dropped=mv.get('kxdp_xsk_rx_dropped_totalvpod3',0),rx_ring_full=mv.get('kxdp_xsk_rx_ring_full_totalvpod3',0),
          drops={k:v for k,v in mv.items() if k.startswith('kxdp_drops_total')},
          fwd=mv.get('fwd',0), sink_dropped=sinkd, other={k:v for k,v in mv.items() if k.startswith(('tx_dropped','rx_dropped_'))},
          wrun=mv.get('w_run',0)/1e6,wwait=mv.get('w_wait',0)/1e6))+"\n")
if 'w_run' in mv or 'w_run' in b:
    print(f"  worker: on-cpu {mv.get('w_run',0)/1e6:.0f} ms, runqueue wait {mv.get('w_wait',0)/1e6:.0f} ms, slices {mv.get('w_slices',0):.0f}, vol {mv.get('w_voluntary_ctxt_switches',0):.0f}, invol {mv.get('w_nonvoluntary_ctxt_switches',0):.0f}")
PY
}
trap down EXIT
up
: > "$RES"
mkdir -p "$RUN"
cp "$BEFORE" "$RUN/kxdp-before"; cp "$AFTER" "$RUN/kxdp-after"
for round in $(seq "${1:-2}"); do
  for TAG in before after; do
    export TAG
    kx "$RUN/kxdp-$TAG"
    echo "== round $round, $TAG ($(uptime | sed 's/.*load/load/'))"
    for rate in ${RATES:-20000 50000 100000 250000}; do point "$rate" "${SECS:-3}"; done
    stop
  done
done
python3 - "$RES" <<'PY'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
agg = collections.OrderedDict()
for r in rows:
    a = agg.setdefault((r["tag"], r["rate"]), collections.Counter())
    a["n"] += 1; a["sent"] += r["sent"]; a["lost"] += max(r["sent"] - r["recv"], 0)
    a["fwd"] += r["fwd"]; a["rxd"] += r["rx_dropped"]; a["rf"] += r["rx_ring_full"]
    a["kx"] += sum(r["drops"].values()); a["other"] += sum(r["other"].values()) + r["sink_dropped"]
    a["run"] += r["wrun"]; a["wait"] += r["wwait"]
print()
print("| binary | rate (pps) | points | offered frames | lost | loss | rx_dropped (fill ring empty) | rx_ring_full | kxdp's drops | after kxdp (veths, sinks) | worker ms on CPU / waiting for it |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for (t, rate), a in sorted(agg.items(), key=lambda x: (int(x[0][1]), x[0][0] != "before")):
    print(f"| {t} | {rate} | {a['n']} | {a['sent']} | {a['lost']} | {100 * a['lost'] / max(a['sent'], 1):.2f}% | "
          f"{a['rxd']:.0f} | {a['rf']:.0f} | {a['kx']:.0f} | {a['other']:.0f} | {a['run']:.0f} / {a['wait']:.0f} |")
PY
