#!/usr/bin/env bash
# Podman (Debian's 4.3, CNI backend) end to end with only cnikit's links in
# cni_plugin_dirs: Podman's default network and networks it creates itself
# (`podman network create` writes bridge + host-local + portmap + firewall + tuning
# conflists), `podman run -p` with traffic through the host port, `--ip`, and
# `podman rm`, after which nothing is left (links, leases, nft elements, iptables rules);
# and a macvlan network Podman creates without a subnet (ipam dhcp: cnikit's dhcp plugin
# and lease daemon against dnsmasq on a LAN), whose lease is released at `podman rm`;
# the same network with "ipv6": true added to its ipam (dual-stack: DHCPv4 and DHCPv6
# from dnsmasq, router advertisements for the on-link prefix), both leases released.
# Runs in a throwaway "host" namespace that looks like a node (its own eth0 with a
# default route, other nftables and iptables rules), never touching the machine's network.
# Usage: tests/podman/run.sh   (as root; CNIKIT=path, default target/release/cnikit, built
# if missing)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" != --inside ]; then
  [ "$(id -u)" = 0 ] || { echo "tests/podman/run.sh: run as root" >&2; exit 1; }
  # Only the default is built: a CNIKIT given and missing is an error, not a cue to build
  # some other binary.
  if [ -z "${CNIKIT:-}" ]; then
    CNIKIT=$PWD/target/release/cnikit
    [ -x "$CNIKIT" ] || cargo build --release
  fi
  [ -x "$CNIKIT" ] || { echo "tests/podman/run.sh: no binary at $CNIKIT" >&2; exit 1; }
  export CNIKIT
  exec unshare --net --mount --propagation private -- "$0" --inside
fi

for d in /run/netns /run/cni /var/lib/cni /run/cnikit /run/containers /var/lib/containers; do
  mkdir -p "$d"
  mount -t tmpfs tmpfs "$d"
done
ip link set lo up
W=$(mktemp -d /var/tmp/cnikit-podman.XXXXXX)
DHCPD_PID=
DNSMASQ_PID=
HTTPD_PID=
cleanup() {
  podman_ rm -af -t 0 >/dev/null 2>&1 || true
  for p in $DHCPD_PID $DNSMASQ_PID $HTTPD_PID; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT

# ---- a node: eth0 with an address and a default route, other firewall rules
ip netns add upstream
ip link add eth0 type veth peer name up0 netns upstream
ip addr add 192.0.2.10/24 dev eth0
ip link set eth0 up
ip -n upstream addr add 192.0.2.1/24 dev up0
ip -n upstream link set up0 up
ip -n upstream link set lo up
ip route add default via 192.0.2.1
nft add table inet node-filter
nft add chain inet node-filter input '{ type filter hook input priority 0; }'
nft add rule inet node-filter input tcp dport 2222 drop
iptables -A INPUT -p tcp --dport 2223 -j DROP

# ---- only cnikit's links as CNI plugins
mkdir -p "$W/bin" "$W/net.d" "$W/root" "$W/runroot"
"$CNIKIT" install --dir "$W/bin" >/dev/null
cat > "$W/containers.conf" <<EOF
[network]
network_backend = "cni"
cni_plugin_dirs = ["$W/bin"]
network_config_dir = "$W/net.d"
[containers]
# Podman's defaults (nofile 1048576, nproc unlimited) may exceed what this
# machine allows even root.
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$W/events.log"
runtime = "runc"
EOF
export CONTAINERS_CONF=$W/containers.conf
podman_() { podman --root "$W/root" --runroot "$W/runroot" --storage-driver vfs "$@"; }

# ---- an image from Debian's static busybox
mkdir -p "$W/img/bin" "$W/img/www"
cp /bin/busybox "$W/img/bin/busybox"
for a in sh httpd nc ip cat sleep printf; do ln -s busybox "$W/img/bin/$a"; done
echo "hello from a podman pod" > "$W/img/www/index.html"
tar -C "$W/img" -cf "$W/img.tar" .
podman_ import -q "$W/img.tar" localhost/cnikit-busybox >/dev/null

ok=0
fail=0
t() {
  local what=$1; shift
  if "$@" >"$W/t.out" 2>&1; then ok=$((ok + 1)); echo "ok - $what"
  else fail=$((fail + 1)); echo "FAIL - $what"; sed 's/^/    /' "$W/t.out" | head -30; fi
}
serve() { # NAME NETWORK HOSTPORT [podman run options]
  local name=$1 net=$2 port=$3; shift 3
  podman_ run -d --name "$name" --network "$net" -p "$port:80" "$@" localhost/cnikit-busybox \
    httpd -f -p 80 -h /www
}
fetch() { curl -sf --max-time 5 "http://$1/" | grep -q "hello from a podman pod"; }
ip_of() { podman_ inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"; }

# ---- Podman's default network (Podman 4.3 keeps its conflist in memory; it is
# made like the ones it writes: bridge, host-local, portmap, firewall, tuning)
t "podman run -p on the default network" serve web0 podman 18080
t "the pod answers through 127.0.0.1:hostPort" fetch 127.0.0.1:18080
t "... and through the node's address" fetch 192.0.2.10:18080
uses_plugins() { # CONFLIST: it names bridge, host-local, portmap, firewall and tuning
  for p in bridge host-local portmap firewall tuning; do
    grep -q "\"type\": \"$p\"" "$W/net.d/$1" || { ls -l "$W/net.d"; cat "$W/net.d/$1"; return 1; }
  done
}

# ---- a network Podman creates, with --ip
t "podman network create" podman_ network create --subnet 10.89.7.0/24 pnet1
t "its conflist is in the conf dir, with Podman's plugins" uses_plugins pnet1.conflist
t "podman run -p on it" serve web1 pnet1 18081
t "... with --ip" serve web2 pnet1 18082 --ip 10.89.7.50
t "the --ip pod got 10.89.7.50 (runtimeConfig.ips reached host-local)" \
  test "$(ip_of web2)" = 10.89.7.50
t "traffic through the first pod's host port" fetch 127.0.0.1:18081
t "traffic through the --ip pod's host port" fetch 127.0.0.1:18082
t "the node reaches a pod at its address" fetch "$(ip_of web1)"
# (nc, not busybox's wget: Debian's static busybox wget crashes resolving names.)
pod_to_pod() {
  podman_ run --rm --network pnet1 localhost/cnikit-busybox \
    sh -c 'printf "GET / HTTP/1.0\r\n\r\n" | nc -w 5 10.89.7.50 80' | grep -q "hello from a podman pod"
}
t "pod to pod on the network" pod_to_pod
t "the node's other rules still work (nft table, iptables rule)" \
  bash -c "nft list table inet node-filter | grep -q 2222 && iptables -S INPUT | grep -q 2223"

# ---- rm leaves nothing
t "podman rm -f of every pod" podman_ rm -f -t 0 web0 web1 web2
t "podman network rm" podman_ network rm pnet1
t "no veth left on the node" bash -c '! ip -o link show type veth | grep -v "eth0@"'
t "no lease left (host-local files)" bash -c '! find /var/lib/cni/networks -type f -name "10.*" | grep .'
t "no container entry left in cnikit's nft sets" bash -c '! nft -j list ruleset | grep -q "10\.8[89]\."'
t "no network's masquerade set or chain left in cnikit's table" \
  bash -c '! nft list table inet cnikit | grep -E "(masq[46]?|pm[46]?-hairpin)-[0-9a-f]{16}"'
t "no per-pod iptables rule left" bash -c '! iptables-save | grep -E "10\.8[89]\.[0-9]+\.[0-9]+/32"'
t "no netns left but the node's" bash -c '[ "$(ip netns list | grep -vc upstream)" = 0 ]'

# ---- a macvlan network without a subnet: Podman writes ipam dhcp. The LAN is a namespace
# at the far end of a veth whose near end (lan0, on the node) is the macvlan parent;
# dnsmasq serves it, and the node's lease daemon (cnikit's dhcp, at the default socket:
# /run/cni is this suite's tmpfs) keeps the pod's lease.
ip netns add lan
ip link add lan0 type veth peer name srv0 netns lan
ip link set lan0 up
ip -n lan addr add 198.51.100.1/24 dev srv0
ip -n lan addr add 2001:db8:51::1/64 dev srv0 nodad
ip -n lan link set srv0 up
ip -n lan link set lo up
LEASES=$W/dnsmasq.leases
ip netns exec lan /usr/sbin/dnsmasq --no-daemon --conf-file=/dev/null --port=0 --no-ping \
  --user=root --pid-file --log-dhcp --dhcp-authoritative \
  --dhcp-range=198.51.100.100,198.51.100.150,255.255.255.0,1h --dhcp-leasefile="$LEASES" \
  --dhcp-range=2001:db8:51::100,2001:db8:51::150,64,1h --enable-ra \
  --log-facility="$W/dnsmasq.log" --interface=srv0 </dev/null 2>/dev/null &
DNSMASQ_PID=$!
ip netns exec lan /bin/busybox httpd -f -p 80 -h "$W/img/www" </dev/null &
HTTPD_PID=$!
"$W/bin/dhcp" daemon >"$W/dhcpd.log" 2>&1 </dev/null &
DHCPD_PID=$!
within() { # SECONDS CMD...: CMD succeeds within SECONDS
  local n=$(($1 * 5)); shift
  for _ in $(seq "$n"); do "$@" && return 0; sleep 0.2; done
  "$@"
}
t "dnsmasq serves the LAN" within 10 grep -q "DHCP, IP range" "$W/dnsmasq.log"
t "the lease daemon listens at /run/cni/dhcp.sock" within 10 test -S /run/cni/dhcp.sock
t "podman network create -d macvlan -o parent=lan0 lan" \
  podman_ network create -d macvlan -o parent=lan0 lan
t "its conflist: macvlan on lan0 with ipam dhcp" bash -c "
  grep -q '\"type\": \"macvlan\"' '$W/net.d/lan.conflist' &&
  grep -q '\"master\": \"lan0\"' '$W/net.d/lan.conflist' &&
  grep -Pzq '\"ipam\": \\{\\s*\"type\": \"dhcp\"' '$W/net.d/lan.conflist' || { cat '$W/net.d/lan.conflist'; exit 1; }"
t "podman run --network lan" \
  podman_ run -d --name dh1 --network lan localhost/cnikit-busybox sleep 600
dh_addr=$(ip_of dh1 2>/dev/null || true)
in_range() { case "$1" in 198.51.100.1[0-4][0-9]|198.51.100.150) return 0 ;; esac; echo "not in the range: '$1'"; return 1; }
t "Podman reports an address from dnsmasq's range ($dh_addr)" in_range "$dh_addr"
has_addr() { podman_ exec dh1 ip -4 -o addr show eth0 | tee /dev/stderr | grep -q " $1/24 "; }
t "the pod's eth0 has it (/24, from the subnet mask option)" has_addr "$dh_addr"
t "dnsmasq's lease file lists it" within 5 grep -q " $dh_addr " "$LEASES"
t "the daemon recorded the lease" bash -c '[ "$(find /var/lib/cni/dhcp/.dhcp-leases -type f -name "*.json" | wc -l)" = 1 ]'
lan_fetch() {
  podman_ exec dh1 sh -c 'printf "GET / HTTP/1.0\r\n\r\n" | nc -w 5 198.51.100.1 80' | grep -q "hello from a podman pod"
}
t "traffic from the pod to the LAN's server" lan_fetch
t "podman rm the dhcp pod" podman_ rm -f -t 0 dh1
t "the lease is released (dnsmasq's lease file drops it)" within 10 bash -c "! grep -q ' $dh_addr ' '$LEASES'"
t "the daemon keeps no record" bash -c '! find /var/lib/cni/dhcp/.dhcp-leases -type f -name "*.json" | grep .'
t "the daemon is still running" kill -0 "$DHCPD_PID"
t "podman network rm lan" podman_ network rm lan

# ---- the same network, dual-stack: "ipv6": true in the ipam Podman wrote
t "podman network create -d macvlan -o parent=lan0 lan6" \
  podman_ network create -d macvlan -o parent=lan0 lan6
t "add \"ipv6\": true to its ipam" bash -c "
  sed -i 's/\"type\": \"dhcp\"/\"type\": \"dhcp\", \"ipv6\": true/' '$W/net.d/lan6.conflist' &&
  grep -q '\"ipv6\": true' '$W/net.d/lan6.conflist' || { cat '$W/net.d/lan6.conflist'; exit 1; }"
t "podman run --network lan6" \
  podman_ run -d --name dh6 --network lan6 localhost/cnikit-busybox sleep 600
d4=$(ip_of dh6 2>/dev/null || true)
d6=$(podman_ inspect -f '{{range .NetworkSettings.Networks}}{{.GlobalIPv6Address}}{{end}}' dh6 2>/dev/null || true)
in_range6() { case "$1" in 2001:db8:51::1[0-4][0-9a-f]|2001:db8:51::150) return 0 ;; esac; echo "not in the range: '$1'"; return 1; }
t "Podman reports an IPv4 address from dnsmasq's range ($d4)" in_range "$d4"
t "Podman reports an IPv6 address from dnsmasq's DHCPv6 range ($d6)" in_range6 "$d6"
has_addr6() { podman_ exec dh6 ip -6 -o addr show eth0 | tee /dev/stderr | grep -q " $1/128 "; }
t "the pod's eth0 has it as a /128 (IA_NA has no prefix length)" has_addr6 "$d6"
t "dnsmasq's lease file lists both" within 5 bash -c "grep -q ' $d4 ' '$LEASES' && grep -q ' $d6 ' '$LEASES'"
t "the daemon recorded both leases" bash -c '[ "$(find /var/lib/cni/dhcp/.dhcp-leases -type f -name "*.json*" | wc -l)" = 2 ]'
ra_route() { podman_ exec dh6 ip -6 route show | grep -q "^2001:db8:51::/64 dev eth0"; }
t "a router advertisement gives the pod the on-link prefix" within 10 ra_route
lan_fetch6() {
  podman_ exec dh6 sh -c 'printf "GET / HTTP/1.0\r\n\r\n" | nc -w 5 2001:db8:51::1 80' | grep -q "hello from a podman pod"
}
t "traffic from the pod to the LAN's server over IPv6" lan_fetch6
t "podman rm the dual-stack pod" podman_ rm -f -t 0 dh6
t "both leases are released (dnsmasq's lease file drops them)" \
  within 10 bash -c "! grep -qE ' ($d4|$d6) ' '$LEASES'"
t "the daemon keeps no record" bash -c '! find /var/lib/cni/dhcp/.dhcp-leases -type f -name "*.json*" | grep .'
t "podman network rm lan6" podman_ network rm lan6
t "no netns left but the node's and the LAN's" \
  bash -c '[ "$(ip netns list | grep -Evc "^(upstream|lan)( |$)")" = 0 ]'
t "no error in the daemon's log" bash -c "! grep -Ei 'error|panic' '$W/dhcpd.log'"
if [ "$fail" != 0 ]; then
  echo "---- dhcp daemon log"; cat "$W/dhcpd.log"; echo "---- dnsmasq log"; tail -30 "$W/dnsmasq.log"
fi

echo "PODMAN-RESULT $ok passed, $fail failed"
[ "$fail" = 0 ]
