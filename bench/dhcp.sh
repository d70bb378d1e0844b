#!/usr/bin/env bash
# DHCP acquisition latency: macvlan + dhcp ADD (and DEL), cnikit's plugin and lease daemon
# against the reference's (Debian's containernetworking-plugins 1.1.1: /usr/lib/cni/macvlan
# and its `dhcp daemon`), on the same dnsmasq server, one pod at a time and 32 at once.
#
# Each pod: a new netns, then the timed ADD (the plugin exec, the daemon's DISCOVER → OFFER →
# REQUEST → ACK in the pod's netns, the macvlan link), then the timed DEL (DHCPRELEASE).
# Implementations take turns round by round (ABAB…), so drift hits both alike. Everything
# runs in a throwaway network + mount namespace; traffic stays between namespaces made here.
#
# Usage: bench/dhcp.sh [--dual] [ROUNDS]   (as root; CNIKIT=path to the binary, default
#        target/release/cnikit; ROUNDS default 5: each round is 20 single pods and one
#        batch of 32 parallel pods per implementation)
# --dual: cnikit only (the reference has no DHCPv6), IPv4-only pods against dual-stack
#        pods ("ipv6": true: a DHCPv4 lease and a DHCPv6 address from the same dnsmasq,
#        which also sends router advertisements, on a LAN host that routes; LAN_FORWARDING=0
#        for one that does not), interleaved the same way.
# Prints p50/p99/max of ADD and DEL per implementation and mode.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --dual ]; then export DUAL=1; shift; fi
DUAL=${DUAL:-0}
ROUNDS=${1:-5}
if [ "${INSIDE:-}" != 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "bench/dhcp.sh: run as root" >&2; exit 1; }
  CNIKIT=${CNIKIT:-$PWD/target/release/cnikit}
  [ -x "$CNIKIT" ] || cargo build --release
  command -v dnsmasq > /dev/null || apt-get install -y --no-install-recommends dnsmasq-base > /dev/null
  export CNIKIT INSIDE=1
  exec unshare --net --mount --propagation private -- "$0" "$@"
fi

W=$(mktemp -d /tmp/cnikit-dhcp-bench.XXXXXX)
for d in /run/netns /run/cni /var/lib/cni; do mkdir -p "$d"; mount -t tmpfs tmpfs "$d"; done
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"' EXIT
ip link set lo up

# The reference plugins: Debian's, wherever a cnikit package may have diverted them.
REF=$W/ref
mkdir -p "$REF"
for p in macvlan dhcp; do
  src=/usr/lib/cni/$p
  [ -e "$src.containernetworking-plugins" ] && src=$src.containernetworking-plugins
  cp "$src" "$REF/$p"
done
OURS=$W/ours
mkdir -p "$OURS"
cp "$CNIKIT" "$OURS/cnikit"
"$OURS/cnikit" install --dir "$OURS" > /dev/null

# The LAN: dnsmasq behind a veth; the near end is every pod's macvlan master.
ip netns add lan
ip link add lan0 type veth peer name srv0 netns lan
ip link set lan0 up
ip -n lan addr add 10.99.0.1/16 dev srv0
ip -n lan addr add fd00:99::1/64 dev srv0 nodad
ip -n lan link set srv0 up
V6=()
if [ "$DUAL" = 1 ]; then
  V6=(--dhcp-range=fd00:99::1:0,fd00:99::ff:ffff,64,2m --enable-ra)
  # A router, as a LAN's host sending router advertisements is: its kernel learns a pod's
  # MAC from the pod's router solicitation. dnsmasq looks a DHCPv6 client's MAC up in the
  # neighbour table and, when it is not there, sleeps 100 ms (its whole event loop, up to
  # five times) waiting for it: without forwarding every dual-stack ADD pays that, and 32
  # at once queue behind each other (docs/plugins/dhcp.md).
  ip netns exec lan sysctl -qw net.ipv6.conf.all.forwarding="${LAN_FORWARDING:-1}"
  # The server's own link-local address out of DAD before the first pod asks.
  for _ in $(seq 50); do
    [ -z "$(ip -n lan -6 addr show dev srv0 tentative)" ] && break
    sleep 0.1
  done
fi
ip netns exec lan dnsmasq --no-daemon --conf-file=/dev/null --port=0 --no-ping --dhcp-authoritative \
  --dhcp-range=10.99.1.1,10.99.200.254,255.255.0.0,2m --dhcp-leasefile="$W/leases" "${V6[@]}" \
  --dhcp-lease-max=100000 --interface=srv0 2> "$W/dnsmasq.log" &
PIDS+=($!)

"$OURS/dhcp" daemon -socketpath "$W/ours.sock" -datadir "$W/ours-data" -loglevel warn 2> "$W/ours.log" &
PIDS+=($!)
"$REF/dhcp" daemon -socketpath "$W/ref.sock" > "$W/ref.log" 2>&1 &
PIDS+=($!)
for s in ours ref; do
  for _ in $(seq 50); do [ -S "$W/$s.sock" ] && break; sleep 0.1; done
done

conf() { # IMPL (ours6: cnikit, dual-stack)
  local sock=$1 v6=false
  [ "$1" = ours6 ] && { sock=ours; v6=true; }
  printf '{"cniVersion":"1.0.0","name":"lan","type":"macvlan","master":"lan0","mode":"bridge","ipam":{"type":"dhcp","daemonSocketPath":"%s","ipv6":%s}}' "$W/$sock.sock" "$v6"
}
now_us() { echo $(($(date +%s%N) / 1000)); }
# pod IMPL ID: one pod's ADD and DEL, their latencies (µs) appended to $W/IMPL.MODE.{add,del}
pod() {
  local impl=$1 id=$2 mode=$3 bin t0 t1 t2
  if [ "$impl" = ref ]; then bin=$REF; else bin=$OURS; fi
  ip netns add "p$id"
  t0=$(now_us)
  if ! conf "$impl" | CNI_COMMAND=ADD CNI_CONTAINERID="$impl-$id" CNI_NETNS="/run/netns/p$id" \
      CNI_IFNAME=eth0 CNI_PATH="$bin" "$bin/macvlan" > "$W/res.$impl.$id" 2>&1; then
    echo "ADD failed ($impl pod $id): $(cat "$W/res.$impl.$id")" >&2
  fi
  t1=$(now_us)
  conf "$impl" | CNI_COMMAND=DEL CNI_CONTAINERID="$impl-$id" CNI_NETNS="/run/netns/p$id" \
    CNI_IFNAME=eth0 CNI_PATH="$bin" "$bin/macvlan" > /dev/null 2>&1 || echo "DEL failed ($impl pod $id)" >&2
  t2=$(now_us)
  ip netns del "p$id"
  echo $((t1 - t0)) >> "$W/$impl.$mode.add"
  echo $((t2 - t1)) >> "$W/$impl.$mode.del"
}

IMPLS=(ours ref)
[ "$DUAL" = 1 ] && IMPLS=(ours ours6)
n=0
for r in $(seq "$ROUNDS"); do
  for impl in "${IMPLS[@]}"; do
    for _ in $(seq 20); do n=$((n + 1)); pod "$impl" "$n" single; done
    batch=()
    for _ in $(seq 32); do n=$((n + 1)); pod "$impl" "$n" par32 & batch+=($!); done
    wait "${batch[@]}"  # not the servers, which are jobs too
  done
  echo "round $r done" >&2
done

pct() { # FILE P: the P-th percentile in ms
  sort -n "$1" | awk -v p="$2" '{ v[NR] = $1 } END { i = int((NR - 1) * p / 100) + 1; printf "%.2f", v[i] / 1000 }'
}
name() { case $1 in ours) echo cnikit ;; ours6) echo cnikit-dual ;; *) echo reference ;; esac; }
printf '%-12s %-7s %8s %8s %8s %8s %8s %6s\n' impl mode "ADD p50" "ADD p99" "ADD max" "DEL p50" "DEL p99" pods
for impl in "${IMPLS[@]}"; do
  for mode in single par32; do
    f=$W/$impl.$mode
    printf '%-12s %-7s %8s %8s %8s %8s %8s %6s\n' "$(name "$impl")" "$mode" \
      "$(pct "$f.add" 50)" "$(pct "$f.add" 99)" "$(pct "$f.add" 100)" "$(pct "$f.del" 50)" \
      "$(pct "$f.del" 99)" "$(wc -l < "$f.add")"
  done
done
echo "(ms; one ADD = plugin exec + DHCP exchange in the pod's netns + macvlan link; $ROUNDS rounds)"
left=$(grep -v '^duid ' "$W/leases" | grep -c . || true)
echo "leases left at dnsmasq after every DEL: $left"
