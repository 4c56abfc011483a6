#!/usr/bin/env bash
# The network-namespace lab of tests/lab (tests/lab/mod.rs builds the same thing for the tests),
# by hand. Needs root.
#
#   scripts/lab.sh demo   build the lab, run kxdp on it, send real traffic, tear everything down
#   scripts/lab.sh up     build the lab and start HTTP servers in the web pods (stays up)
#   scripts/lab.sh run    run `kxdp run` in the node namespace, in the foreground (Ctrl-C stops it)
#   scripts/lab.sh down   tear the lab down (namespaces, veths, XDP programs, servers)
#
#  ext (192.168.0.100) ── eth0 ═ up0 ── node-a (192.168.0.2; 169.254.1.1 on every vpod)
#                                        ├─ vpod1 ═ eth0  web-1    10.1.0.11  (HTTP :8080)
#                                        ├─ vpod2 ═ eth0  web-2    10.1.0.12  (HTTP :8080)
#                                        └─ vpod3 ═ eth0  client-1 10.1.0.13
#
# Services (tests/lab/cluster.yaml): web 172.30.0.10:80 (NodePort 30080, masqueraded),
# web-local 172.30.0.11:80 (NodePort 30081, externalTrafficPolicy Local), empty 172.30.0.20:80.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
P=kxdp-lab
NODE=$P-node EXT=$P-ext
PODS=("web-1 vpod1 10.1.0.11" "web-2 vpod2 10.1.0.12" "client-1 vpod3 10.1.0.13")
RUN=/run/kxdp-lab
KXDP=${KXDP:-target/release/kxdp}

SERVER='
import socket, sys, threading
name, addr = sys.argv[1], sys.argv[2]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, 8080)); s.listen(64)
def serve(c, a):
    try:
        c.recv(4096)
        body = ("hello from %s: you are %s:%d\n" % (name, a[0], a[1])).encode()
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        print("%s %s:%d" % (name, a[0], a[1]), flush=True)
    finally:
        c.close()
while True:
    c, a = s.accept()
    threading.Thread(target=serve, args=(c, a), daemon=True).start()
'

[ "$(id -u)" = 0 ] || { echo "scripts/lab.sh: needs root (network namespaces, XDP)" >&2; exit 1; }

# Stops kxdp as `kubectl delete pod` does: SIGTERM (kxdp detaches its programs and exits), a
# bounded wait, SIGKILL only if it is still there, said so.
stop_kxdp() {
  [ -e "$RUN/kxdp.pid" ] || return 0
  local pid; pid=$(cat "$RUN/kxdp.pid")
  if kill -TERM "$pid" 2>/dev/null; then
    local t=0
    while kill -0 "$pid" 2>/dev/null && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
      echo "kxdp (pid $pid) still running 10 s after SIGTERM: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    else
      echo "kxdp stopped by SIGTERM (within $(( (t + 1) * 100 )) ms)"
    fi
  fi
  rm -f "$RUN/kxdp.pid"
}

down() {
  stop_kxdp
  local nss; nss=$(ip netns list | awk '{print $1}' | grep "^$P-" || true)
  # SIGTERM first (kxdp detaches its programs and exits cleanly), then whatever is left.
  for ns in $nss; do for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done; done
  [ -z "$nss" ] || sleep 0.5
  for ns in $nss; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$RUN"
}

up() {
  down
  mkdir -p "$RUN"
  ip netns add $NODE; ip netns add $EXT
  ip -n $NODE link set lo up; ip -n $EXT link set lo up
  ip -n $NODE link add up0 type veth peer name eth0 netns $EXT
  ip -n $NODE addr add 192.168.0.2/24 dev up0; ip -n $NODE link set up0 up
  ip -n $EXT addr add 192.168.0.100/24 dev eth0; ip -n $EXT link set eth0 up
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
  # A minimal HTTP server per web pod that answers with the client address it sees.
  # (Not python's http.server: it looks its own name up in DNS before listening.)
  for p in "${PODS[@]:0:2}"; do
    set -- $p
    (setsid ip netns exec $P-$1 /usr/bin/python3 -c "$SERVER" "$1" "$3" >"$RUN/$1.log" 2>&1 < /dev/null &)
  done
  for p in "${PODS[@]:0:2}"; do
    set -- $p
    for _ in $(seq 50); do ip netns exec $P-$1 ss -ltn | grep -q ":8080" && break; sleep 0.1; done
  done
  echo "lab up: namespaces $(ip netns list | awk '{print $1}' | grep "^$P-" | tr '\n' ' ')"
}

run() {
  [ -x "$KXDP" ] || cargo build --release --locked --bin kxdp
  exec ip netns exec $NODE "$KXDP" run --config tests/lab/config.yaml --state tests/lab/cluster.yaml --no-admin
}

demo() {
  trap down EXIT
  [ -x "$KXDP" ] || cargo build --release --locked --bin kxdp
  up
  # In a subshell: kxdp is no job of this shell (no job notice when it ends); its pid is kept
  # for stop_kxdp (`ip netns exec` execs kxdp, so $! is kxdp's).
  (setsid ip netns exec $NODE "$KXDP" run --config tests/lab/config.yaml --state tests/lab/cluster.yaml \
    --no-admin 2>"$RUN/kxdp.log" </dev/null &
   echo $! > "$RUN/kxdp.pid")
  for _ in $(seq 100); do grep -q "forwarding on" "$RUN/kxdp.log" 2>/dev/null && break; sleep 0.1; done
  cat "$RUN/kxdp.log"; sleep 1.5
  say() { echo; echo "\$ $*"; }
  say "client-1 -> ClusterIP 172.30.0.10:80 (DNAT to a web pod, reply reverse-NATed)"
  for _ in 1 2 3 4; do ip netns exec $P-client-1 curl -sS --max-time 5 http://172.30.0.10/ || true; done
  say "ext 192.168.0.100 -> NodePort 192.168.0.2:30080 (masqueraded: the pod sees 192.168.0.2)"
  ip netns exec $EXT curl -sS --max-time 5 http://192.168.0.2:30080/ || true
  say "ext 192.168.0.100 -> NodePort 192.168.0.2:30081 (externalTrafficPolicy Local: the pod sees 192.168.0.100)"
  ip netns exec $EXT curl -sS --max-time 5 http://192.168.0.2:30081/ || true
  say "client-1 -> 172.30.0.20:80 (no endpoints: refused at once)"
  ip netns exec $P-client-1 curl -sS --max-time 5 http://172.30.0.20/ || true
  echo; echo "tearing down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  run) run ;;
  demo) demo ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
