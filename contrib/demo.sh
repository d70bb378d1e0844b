#!/usr/bin/env bash
# End-to-end demonstration on a fresh machine (run as root): build cnikit,
# install its plugin links into a scratch CNI bin dir, and, inside a throwaway
# host network namespace:
#  1. attach two containers to a bridge with ipamd IPAM by calling the plugin as
#     a runtime does, ping between them and the gateway (IPv4 and IPv6), CHECK,
#     then DEL everything (also after the netns is gone) and show nothing is left;
#  2. start the ipamd daemon and run a network list (bridge with ipMasq + ipamd +
#     portmap) with `cnikit net`, serve HTTP in the pod, fetch it through the host
#     port on 127.0.0.1, DEL, and show the nftables sets are empty again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--inside" ]; then
  [ "$(id -u)" = 0 ] || { echo "demo.sh: run as root" >&2; exit 1; }
  # What the build needs besides a Rust toolchain (etcd-client's build script runs protoc,
  # which needs the well-known .proto files of libprotobuf-dev) and what the demo runs;
  # tests/bare/run.sh checks on a fresh machine that nothing is missing. Only the
  # missing ones are installed, in one go.
  missing=()
  for p in gcc libc6-dev protobuf-compiler libprotobuf-dev iproute2 iputils-ping python3 curl nftables; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "demo.sh: installing ${missing[*]}"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
  cargo build --release
  exec unshare --net --mount --propagation private -- "$0" --inside
fi

for d in /run/netns /var/lib/cni /run/cnikit; do mkdir -p "$d"; mount -t tmpfs tmpfs "$d"; done
ip link set lo up
BIN=$(mktemp -d)
DATA=$(mktemp -d)
target/release/cnikit install --dir "$BIN"

CONF=$(cat <<JSON
{"cniVersion": "1.1.0", "name": "demo", "type": "bridge", "bridge": "cnidemo0",
 "isDefaultGateway": true, "hairpinMode": true,
 "ipam": {"type": "ipamd", "dataDir": "$DATA",
          "ranges": [[{"subnet": "10.77.0.0/24"}], [{"subnet": "fd77::/64"}]]}}
JSON
)
cni() { # cni COMMAND NETNS [extra stdin]
  CNI_COMMAND=$1 CNI_CONTAINERID=demo-$2 CNI_NETNS=/run/netns/$2 CNI_IFNAME=eth0 \
    CNI_PATH=$BIN "$BIN/bridge" <<<"${3:-$CONF}"
}

step() { printf '\n== %s\n' "$*"; }
for c in pod-a pod-b; do
  ip netns add $c
  step "ADD $c"
  cni ADD $c | tee /tmp/demo-$c.json
done
A4=$(ip -n pod-a -j -4 addr show eth0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["addr_info"][0]["local"])')
B6=$(ip -n pod-b -j -6 addr show eth0 scope global | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["addr_info"][0]["local"])')
step "pod-b → pod-a ($A4), pod-a → pod-b ($B6), both → gateways"
ip netns exec pod-b ping -c 2 -W 2 "$A4"
ip netns exec pod-a ping -6 -c 2 -W 2 "$B6"
ip netns exec pod-a ping -c 1 -W 2 10.77.0.1
ip netns exec pod-a ping -6 -c 1 -W 2 fd77::1

step "CHECK pod-a (with prevResult)"
PREV=$(python3 -c 'import json,sys; c=json.loads(sys.argv[1]); c["prevResult"]=json.load(open("/tmp/demo-pod-a.json")); print(json.dumps(c))' "$CONF")
cni CHECK pod-a "$PREV" && echo "CHECK ok"

step "leases"
target/release/cnikit ipamd leases --data-dir "$DATA"

step "DEL both (twice, and once after the netns is gone)"
for c in pod-a pod-b; do cni DEL $c; cni DEL $c; ip netns del $c; cni DEL $c; done
echo "veths left on the host: $(ip -j link show type veth | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')"
target/release/cnikit ipamd leases --data-dir "$DATA"

step "ipamd daemon + cnikit net: bridge(ipMasq) + ipamd + portmap"
target/release/cnikit ipamd daemon --data-dir "$DATA" --log-level warn &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null' EXIT
for _ in $(seq 50); do [ -S /run/cnikit/ipamd.sock ] && break; sleep 0.1; done
NETD=$(mktemp -d)
cat > "$NETD/web.conflist" <<JSON
{"cniVersion": "1.1.0", "name": "web", "plugins": [
  {"type": "bridge", "bridge": "cniweb0", "isDefaultGateway": true, "ipMasq": true,
   "hairpinMode": true,
   "ipam": {"type": "ipamd", "dataDir": "$DATA", "ranges": [[{"subnet": "10.78.0.0/24"}]]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
ip netns add pod-c
net() { target/release/cnikit net --conf-dir "$NETD" --cni-path "$BIN" "$@"; }
MAP='{"portMappings": [{"hostPort": 18080, "containerPort": 8080, "protocol": "tcp"}]}'
net add web /run/netns/pod-c --cap-args "$MAP"
mkdir -p /tmp/demo-www && echo "hello from pod-c" > /tmp/demo-www/index.html
# Not `python3 -m http.server`: its server looks up the host name before it listens,
# which can stall past the wait below where that name is not in /etc/hosts (the
# lookup goes to DNS, from inside the pod). A plain TCPServer binds and serves
# without a lookup.
ip netns exec pod-c python3 -c '
import functools, http.server, socketserver
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/tmp/demo-www")
socketserver.TCPServer(("0.0.0.0", 8080), handler).serve_forever()
' >/dev/null 2>&1 &
WEB=$!
for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:18080/ && break; sleep 0.1; done
GOT=$(curl -s -m 5 http://127.0.0.1:18080/ || true)
echo "curl http://127.0.0.1:18080/ → $GOT"
[ "$GOT" = "hello from pod-c" ] || { echo "demo.sh: no answer from pod-c through the host port" >&2; exit 1; }
echo "firewall changes applied by the daemon (its /metrics):"
curl -s --unix-socket /run/cnikit/ipamd.sock http://ipamd/metrics | grep '^ipamd_ext_requests_total'
nft list map inet cnikit pm4-any
kill $WEB
net check web /run/netns/pod-c --cap-args "$MAP" && echo "CHECK ok"
net del web /run/netns/pod-c --cap-args "$MAP"
echo "after DEL:"
nft list map inet cnikit pm4-any
echo "curl after DEL: $(curl -s -m 2 http://127.0.0.1:18080/ || echo 'connection fails, as it should')"
ip netns del pod-c
echo "demo ok"
