#!/usr/bin/env bash
# The two-node CNI lab of tests/cni (tests/cni/mod.rs builds the same thing for the tests), by
# hand. Pods are made by the CNI reference plugins exactly as a container runtime makes them
# (apt-get install containernetworking-plugins iptables python3). Needs root.
#
#   scripts/cni-lab.sh up     build the nodes, the external host and the pods (stays up)
#   scripts/cni-lab.sh start  start kxdp on both nodes (in the background) on the lab that is up
#   scripts/cni-lab.sh down   stop kxdp and the servers, CNI DEL every pod, delete everything
#   scripts/cni-lab.sh demo   up, start kxdp on both nodes, one line per behaviour (ok/FAIL), down
#
#                     nodes' network: br0 in kxdp-cni-sw, 192.168.77.0/24, fd77::/64
#        node-a eth0 .1 / ::1          node-b eth0 .2 / ::2           ext eth0 .100 / ::100
#        CNI ptp: 10.77.1.0/24,        CNI bridge (cni0): 10.77.2.0/24,
#                 fd00:77:1::/64                        fd00:77:2::/64
#        pods web-a1 client-a front-a  pods web-b1 web-b2 db-b
#
# Services: web 172.30.0.10 / fd00:30::a port 80 (NodePort 30080) -> web-b1, web-b2;
# web-local 172.30.0.11 (NodePort 30081, externalTrafficPolicy Local) -> web-b1, web-b2;
# NetworkPolicy: db-b admits only role=frontend (front-a).
# kxdp owns eth0 and every pod's veth by pattern (`veth*`): pods created later are attached.
# Every pod serves TCP 8080: it writes "POD CLIENT-ADDRESS" and closes.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
P=kxdp-cni
RUN=/run/kxdp-cni
KXDP=${KXDP:-target/release/kxdp}
CNI=/usr/lib/cni

[ "$(id -u)" = 0 ] || { echo "scripts/cni-lab.sh: needs root (network namespaces, XDP)" >&2; exit 1; }
# What a fresh machine lacks: the CNI reference plugins, iptables for their masquerade rules,
# python3 for the lab's servers and clients.
if [ ! -x "$CNI/ptp" ] || ! command -v iptables >/dev/null || ! command -v python3 >/dev/null; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q containernetworking-plugins iptables python3
fi

SERVER='
import socket, sys, threading
name = sys.argv[1]
s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", 8080)); s.listen(64)
def serve(c, a):
    try:
        h = a[0][7:] if a[0].startswith("::ffff:") else a[0]
        c.sendall(("%s %s\n" % (name, h)).encode())
    finally:
        c.close()
while True:
    c, a = s.accept()
    threading.Thread(target=serve, args=(c, a), daemon=True).start()
'
# Prints "POD CLIENT-ADDRESS" as the server saw it, or "timeout" / "refused" / the error.
CLIENT='
import socket, sys
host, port, t = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    c = socket.create_connection((host, port), timeout=t)
    c.settimeout(t)
    print(c.recv(200).decode().strip())
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", e)
'

ns() { echo "$P-$1"; }
node_ns() { case $1 in a) ns node-a ;; b) ns node-b ;; esac; }

netconf() { # netconf a|b
  local n=$1 dir=$RUN/ipam-$1
  if [ "$n" = a ]; then
    echo '{"cniVersion":"1.0.0","name":"kxdp-lab","type":"ptp","ipMasq":true,"mtu":1500,"ipam":{"type":"host-local","dataDir":"'$dir'","ranges":[[{"subnet":"10.77.1.0/24"}],[{"subnet":"fd00:77:1::/64"}]],"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]}}'
  else
    echo '{"cniVersion":"1.0.0","name":"kxdp-lab","type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"mtu":1500,"ipam":{"type":"host-local","dataDir":"'$dir'","ranges":[[{"subnet":"10.77.2.0/24"}],[{"subnet":"fd00:77:2::/64"}]],"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]}}'
  fi
}

plugin() { [ "$1" = a ] && echo ptp || echo bridge; }

cni() { # cni ADD|DEL node pod
  local cmd=$2 n=$1 pod=$3
  netconf "$n" | ip netns exec "$(node_ns "$n")" env CNI_COMMAND="$cmd" CNI_CONTAINERID="$P-$pod" \
    CNI_NETNS="/var/run/netns/$(ns "p-$pod")" CNI_IFNAME=eth0 CNI_PATH=$CNI "$CNI/$(plugin "$n")"
}

add_pod() { # add_pod a|b NAME LABELS
  local n=$1 pod=$2 labels=$3 pns; pns=$(ns "p-$pod")
  ip netns add "$pns"; ip -n "$pns" link set lo up
  ip netns exec "$pns" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
  cni "$n" ADD "$pod" > "$RUN/pod-$pod.json"
  echo "$pod" >> "$RUN/pods"
  python3 - "$RUN/pod-$pod.json" "$n" "$pod" "$labels" > "$RUN/pod-$pod.env" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
ips = [a["address"].split("/")[0] for a in r["ips"]]
v4 = [i for i in ips if ":" not in i][0]; v6 = [i for i in ips if ":" in i][0]
host = [i["name"] for i in r["interfaces"] if "sandbox" not in i and i["name"].startswith("veth")][0]
print(f"NODE={sys.argv[2]} POD={sys.argv[3]} IP4={v4} IP6={v6} HOSTIF={host} LABELS='{sys.argv[4]}'")
EOF
  (ip netns exec "$pns" python3 -c "$SERVER" "$pod" > /dev/null 2>&1 < /dev/null &)
}

pod_var() { # pod_var POD VAR
  (source "$RUN/pod-$1.env"; eval echo "\$$2")
}

up() {
  down >/dev/null 2>&1 || true
  mkdir -p "$RUN"
  ip netns add "$(ns sw)"
  ip -n "$(ns sw)" link add br0 type bridge; ip -n "$(ns sw)" link set br0 up
  local i=1
  for n in a b; do
    local nns; nns=$(node_ns $n)
    ip netns add "$nns"; ip -n "$nns" link set lo up
    ip netns exec "$nns" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
      net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
    ip -n "$(ns sw)" link add ${n}0 type veth peer name eth0 netns "$nns"
    ip -n "$(ns sw)" link set ${n}0 master br0 up
    ip -n "$nns" link set eth0 up
    ip -n "$nns" addr add 192.168.77.$i/24 dev eth0
    ip -n "$nns" addr add fd77::$i/64 dev eth0 nodad
    # What ip-masq-agent does on a real node: no masquerade inside the cluster.
    ip netns exec "$nns" iptables -t nat -I POSTROUTING -s 10.77.0.0/16 -d 10.77.0.0/16 -j RETURN
    ip netns exec "$nns" ip6tables -t nat -I POSTROUTING -s fd00:77::/32 -d fd00:77::/32 -j RETURN
    i=$((i + 1))
  done
  ip -n "$(ns node-a)" route add 10.77.2.0/24 via 192.168.77.2
  ip -n "$(ns node-a)" -6 route add fd00:77:2::/64 via fd77::2
  ip -n "$(ns node-b)" route add 10.77.1.0/24 via 192.168.77.1
  ip -n "$(ns node-b)" -6 route add fd00:77:1::/64 via fd77::1
  ip netns add "$(ns ext)"; ip -n "$(ns ext)" link set lo up
  ip netns exec "$(ns ext)" sysctl -qw net.ipv6.conf.default.accept_dad=0
  ip -n "$(ns sw)" link add x0 type veth peer name eth0 netns "$(ns ext)"
  ip -n "$(ns sw)" link set x0 master br0 up
  ip -n "$(ns ext)" link set eth0 up
  ip -n "$(ns ext)" addr add 192.168.77.100/24 dev eth0
  ip -n "$(ns ext)" addr add fd77::100/64 dev eth0 nodad
  (ip netns exec "$(ns ext)" python3 -c "$SERVER" ext > /dev/null 2>&1 < /dev/null &)
  add_pod a web-a1 "app: web-a"
  add_pod a client-a "app: client"
  add_pod a front-a "app: client, role: frontend"
  add_pod b web-b1 "app: web"
  add_pod b web-b2 "app: web"
  add_pod b db-b "app: db"
  sleep 0.5
  warm
  echo "lab up: namespaces $(ip netns list | grep -c "^$P-"), pods $(ls $RUN/pod-*.env | wc -l)"
}

# One request from each node to its pods and between nodes: neighbours resolved before kxdp.
WARM='
import socket, sys
for h in sys.argv[1:]:
    f = socket.AF_INET6 if ":" in h else socket.AF_INET
    socket.socket(f, socket.SOCK_DGRAM).sendto(b"w", (h, 9))
'
warm() {
  for f in "$RUN"/pod-*.env; do
    (source "$f"
     ip netns exec "$(node_ns "$NODE")" python3 -c "$WARM" "$IP4" "$IP6" 2>/dev/null || true
     gw=$([ "$NODE" = a ] && echo 10.77.1.1 || echo 10.77.2.1)
     ip netns exec "$(ns "p-$POD")" python3 -c "$WARM" "$gw" 2>/dev/null || true)
  done
  for n in a b; do
    ip netns exec "$(node_ns $n)" python3 -c "$WARM" 192.168.77.1 192.168.77.2 192.168.77.100 \
      fd77::1 fd77::2 fd77::100 2>/dev/null || true
  done
  ip netns exec "$(ns ext)" python3 -c "$WARM" 192.168.77.1 192.168.77.2 fd77::1 fd77::2 2>/dev/null || true
  sleep 0.2
}

state() { # the cluster as Kubernetes objects
  for n in a b; do
    local i=1; [ $n = b ] && i=2
    cat <<EOF
apiVersion: v1
kind: Node
metadata: {name: node-$n, labels: {kubernetes.io/hostname: node-$n}}
spec: {podCIDRs: [10.77.$i.0/24, "fd00:77:$i::/64"]}
status:
  addresses:
  - {type: InternalIP, address: 192.168.77.$i}
  - {type: InternalIP, address: "fd77::$i"}
---
EOF
  done
  printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: lab}\n---\n'
  for f in "$RUN"/pod-*.env; do
    (source "$f"; cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $POD, namespace: lab, labels: {$LABELS}}
spec: {nodeName: node-$NODE, containers: [{name: c, image: lab/server}]}
status:
  phase: Running
  hostIP: 192.168.77.$([ "$NODE" = a ] && echo 1 || echo 2)
  podIP: $IP4
  podIPs: [{ip: $IP4}, {ip: "$IP6"}]
  conditions: [{type: Ready, status: "True"}]
---
EOF
)
  done
  local web4="" web6=""
  for p in web-b1 web-b2; do
    web4+="- {addresses: [$(pod_var $p IP4)], conditions: {ready: true}, nodeName: node-b}"$'\n'
    web6+="- {addresses: [\"$(pod_var $p IP6)\"], conditions: {ready: true}, nodeName: node-b}"$'\n'
  done
  for svc in "web 10 30080 Cluster" "web-local 11 30081 Local"; do
    set -- $svc
    cat <<EOF
apiVersion: v1
kind: Service
metadata: {name: $1, namespace: lab}
spec:
  type: NodePort
  externalTrafficPolicy: $4
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 172.30.0.$2
  clusterIPs: [172.30.0.$2, "fd00:30::$(printf %x "$2")"]
  selector: {app: web}
  ports:
  - {name: tcp, port: 80, targetPort: 8080, protocol: TCP, nodePort: $3}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: $1-ipv4, namespace: lab, labels: {kubernetes.io/service-name: $1}}
addressType: IPv4
ports: [{name: tcp, port: 8080, protocol: TCP}]
endpoints:
$web4---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: $1-ipv6, namespace: lab, labels: {kubernetes.io/service-name: $1}}
addressType: IPv6
ports: [{name: tcp, port: 8080, protocol: TCP}]
endpoints:
$web6---
EOF
  done
  cat <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-from-frontend, namespace: lab}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: frontend}}
EOF
}

config() { # config a|b: the uplink and every pod's host-side veth, by pattern (pods come and go)
  local n=$1 i=1; [ "$n" = b ] && i=2
  cat <<EOF
apiVersion: kxdp.dev/v1alpha1
kind: DataplaneConfiguration
nodeName: node-$n
nodeIPs: [192.168.77.$i, "fd77::$i"]
clusterCIDRs: [10.77.0.0/16, "fd00:77::/32"]
serviceCIDRs: [172.30.0.0/16, "fd00:30::/108"]
healthzBindAddress: ""
metricsBindAddress: ""
interfaces: [eth0, "veth*"]
workers: {count: 1, cpus: []}
# Two nodes on one host: the default state file (/run/kxdp/ct/conntrack) would be shared.
conntrack: {stateFile: ""}
EOF
}

start_kxdp() {
  [ -x "$KXDP" ] || cargo build --release --locked --bin kxdp
  mkdir -p "$RUN/state"
  state > "$RUN/state/cluster.yaml"
  for n in a b; do
    config $n > "$RUN/config-$n.yaml"
    # In a subshell: kxdp is no job of this shell (no job notice when it ends); its pid is kept
    # for stop_kxdp (`ip netns exec` execs kxdp, so $! is kxdp's).
    (ip netns exec "$(node_ns $n)" "$KXDP" run --config "$RUN/config-$n.yaml" --state "$RUN/state" \
      --admin "$RUN/admin-$n.sock" > "$RUN/kxdp-$n.log" 2>&1 < /dev/null &
     echo $! > "$RUN/kxdp-$n.pid")
  done
  for n in a b; do
    for _ in $(seq 100); do grep -q "forwarding on" "$RUN/kxdp-$n.log" && break; sleep 0.1; done
    grep -q "forwarding on" "$RUN/kxdp-$n.log" || { cat "$RUN/kxdp-$n.log"; echo "kxdp on node-$n did not start" >&2; exit 1; }
  done
  sleep 1.5
  warm
}

# Stops kxdp as `kubectl delete pod` does: SIGTERM (kxdp detaches its programs, removes the host
# path and exits), a bounded wait, SIGKILL only if it is still there, said so.
stop_kxdp() {
  local f pid n
  for f in "$RUN"/kxdp-*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f") n=$(basename "$f" .pid)
    kill -TERM "$pid" 2>/dev/null || { rm -f "$f"; continue; }
    local t=0
    while kill -0 "$pid" 2>/dev/null && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$n (pid $pid) still running 10 s after SIGTERM: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    else
      echo "$n stopped by SIGTERM (within $(( (t + 1) * 100 )) ms)"
    fi
    rm -f "$f"
  done
}

down() {
  stop_kxdp
  for f in "$RUN"/pod-*.env; do
    [ -e "$f" ] || continue
    (source "$f"; cni "$NODE" DEL "$POD" >/dev/null 2>&1 || true)
  done
  local nss; nss=$(ip netns list | awk '{print $1}' | grep "^$P-" || true)
  for n in $nss; do for pid in $(ip netns pids "$n" 2>/dev/null); do kill "$pid" 2>/dev/null || true; done; done
  [ -z "$nss" ] || sleep 0.5
  for n in $nss; do
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
  rm -rf "$RUN"
}

ask() { # ask NAMESPACE HOST PORT [TIMEOUT]
  ip netns exec "$1" python3 -c "$CLIENT" "$2" "$3" "${4:-2}" 2>&1
}

FAILS=0
check() { # check "behaviour" "got" "want (regex)"
  if [[ "$2" =~ ^$3$ ]]; then echo "ok    $1 ($2)"; else echo "FAIL  $1 (got: $2; want: $3)"; FAILS=$((FAILS + 1)); fi
}

demo() {
  up
  trap down EXIT
  start_kxdp
  local ca fa a4 b4; ca=$(ns p-client-a) fa=$(ns p-front-a)
  a4=192.168.77.1 b4=192.168.77.2
  local ip_ca ip_fa; ip_ca=$(pod_var client-a IP4) ip_fa=$(pod_var front-a IP4)
  check "pod to pod on a ptp node" "$(ask "$ca" "$(pod_var web-a1 IP4)" 8080)" "web-a1 $ip_ca"
  check "pod to pod on a bridge node" "$(ask "$(ns p-web-b1)" "$(pod_var web-b2 IP4)" 8080)" "web-b2 $(pod_var web-b1 IP4)"
  check "pod to pod across nodes, untouched" "$(ask "$ca" "$(pod_var web-b2 IP4)" 8080)" "web-b2 $ip_ca"
  check "ClusterIP, endpoints on the other node, client address kept" "$(ask "$ca" 172.30.0.10 80)" "web-b[12] $ip_ca"
  check "NodePort on node-a served by node-b, masqueraded" "$(ask "$(ns ext)" $a4 30080)" "web-b[12] $a4"
  check "externalTrafficPolicy Local, no local endpoint: dropped" "$(ask "$(ns ext)" $a4 30081)" "timeout"
  check "externalTrafficPolicy Local, local endpoint: client address kept" "$(ask "$(ns ext)" $b4 30081)" "web-b[12] 192.168.77.100"
  check "NetworkPolicy on the destination node admits a remote frontend" "$(ask "$fa" "$(pod_var db-b IP4)" 8080)" "db-b $ip_fa"
  check "NetworkPolicy on the destination node drops a remote non-frontend" "$(ask "$ca" "$(pod_var db-b IP4)" 8080)" "timeout"
  check "IPv6 ClusterIP, endpoints on the other node" "$(ask "$ca" fd00:30::a 80)" "web-b[12] $(pod_var client-a IP6)"
  check "node's own process to a ClusterIP" "$(ask "$(ns node-a)" 172.30.0.10 80)" "web-b[12] .*"
  check "node's own process to a NodePort on its own address" "$(ask "$(ns node-a)" $a4 30080)" "web-b[12] .*"
  check "pod to outside the cluster, seen as the node" "$(ask "$ca" 192.168.77.100 8080)" "ext $a4"
  # A pod created after kxdp started (CNI ADD now), as a client of the ClusterIP.
  add_pod a late-a "app: client"
  state > "$RUN/state/cluster.yaml.tmp" && mv "$RUN/state/cluster.yaml.tmp" "$RUN/state/cluster.yaml"
  sleep 1.5
  check "pod created after kxdp started reaches a ClusterIP" "$(ask "$(ns p-late-a)" 172.30.0.10 80)" "web-b[12] $(pod_var late-a IP4)"
  # The operator's view of node-a while the lab is up (admin socket: kxdp conntrack/services/stats).
  echo "node-a conntrack (kxdp conntrack count): $("$KXDP" conntrack count --admin "$RUN/admin-a.sock" 2>&1)"
  echo "$FAILS behaviour(s) failing"
}

case "${1:-}" in
  up) up ;;
  start) start_kxdp; echo "kxdp running on both nodes (logs: $RUN/kxdp-a.log, $RUN/kxdp-b.log; CLI: $KXDP conntrack list --admin $RUN/admin-a.sock)" ;;
  down) down ;;
  demo) demo ;;
  *) echo "usage: $0 up|start|down|demo" >&2; exit 2 ;;
esac
