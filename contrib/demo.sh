#!/usr/bin/env bash
# End-to-end demonstration on a fresh machine (run as root): build cnikit,
# install its plugin links into a scratch CNI bin dir, and, inside a throwaway
# host network namespace, attach two containers to a bridge with ipamd IPAM,
# ping between them and the gateway (IPv4 and IPv6), CHECK, then DEL
# everything and show nothing is left.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--inside" ]; then
  [ "$(id -u)" = 0 ] || { echo "demo.sh: run as root" >&2; exit 1; }
  for p in iproute2 iputils-ping python3; do
    dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q 'ok installed' && continue
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      iproute2 iputils-ping python3
    break
  done
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
echo "demo ok"
