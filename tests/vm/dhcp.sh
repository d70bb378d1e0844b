# Sourced by the VM's /init after tests/vm/multihome.sh (helpers of guest.sh: cni, chk, del, t,
# tn, teq, nsreset, addr_of, ipj_addrs, ping_ok; of links.sh: refcni): the dhcp IPAM plugin and
# its lease daemon (`dhcp daemon`, started here) on Debian's kernel. The LAN is netns dhl, whose
# dnsmasq (run.sh copies it in; busybox udhcpd keys its leases by MAC only, so two ipvlan pods
# would share one) serves 10.70.0.50-99/24 on dhs; the other end of that veth, dhm, is every
# pod's master. An nft netdev chain on dhm counts the DHCP replies arriving there, unicast and
# broadcast. ipvlan l2: two pods share dhm's MAC, the server tells them apart by their client
# identifier (option 61, CONTAINERID/NETWORK/IFNAME); the server unicasts to a client that does
# not ask for broadcast, and ipvlan hands a unicast for an address no slave has yet to the master,
# so cnikit asks for broadcast answers on ipvlan links by itself (the reference only with the
# daemon's -broadcast, shown below). macvlan + dhcp against the reference (/ref/macvlan and
# /ref/dhcp's daemon on its own socket). ipvlan l3/l3s: broadcasts do not leave; a clear
# error at once, not a hang.

DH_SOCK=/run/cni/dhcp.sock
DH_REF_SOCK=/run/cni/ref-dhcp.sock
DH_LEASES=/tmp/dh-dnsmasq.leases
DH_LOG=/tmp/dh-dnsmasq.log
# dh_daemon [FLAGS]: (re)start cnikit's daemon and wait for its socket
dh_daemon() {
  [ -n "${DH_PID:-}" ] && { kill "$DH_PID"; wait "$DH_PID" 2> /dev/null; }
  rm -f $DH_SOCK
  /cni/dhcp daemon -socketpath $DH_SOCK -datadir /tmp/dhcpd-data -resendtimeout 10s "$@" 2>> /tmp/dhcpd.log &
  DH_PID=$!
  dh_wait_sock $DH_SOCK
}
# dh_ref_daemon [FLAGS]: the same for the reference's (it does not remove a stale socket)
dh_ref_daemon() {
  [ -n "${DH_REF_PID:-}" ] && { kill "$DH_REF_PID"; wait "$DH_REF_PID" 2> /dev/null; }
  rm -f $DH_REF_SOCK
  /ref/dhcp daemon -socketpath $DH_REF_SOCK -timeout 2s -resendmax 4s "$@" >> /tmp/ref-dhcpd.log 2>&1 &
  DH_REF_PID=$!
  dh_wait_sock $DH_REF_SOCK
}
dh_wait_sock() { _i=0; while [ ! -S "$1" ] && [ $_i -lt 100 ]; do sleep 0.1; _i=$((_i + 1)); done; }
# dh_zero: (re)count from 0 the DHCP replies reaching the master dhm, by Ethernet destination
dh_zero() {
  nft flush chain netdev dhc in
  nft add rule netdev dhc in udp dport 68 ether daddr ff:ff:ff:ff:ff:ff counter
  nft add rule netdev dhc in udp dport 68 ether daddr != ff:ff:ff:ff:ff:ff counter
}
# dh_count uni|bc: how many were unicast / broadcast
dh_count() {
  _p='daddr ff'; [ "$1" = uni ] && _p='daddr !='
  nft list chain netdev dhc in | grep "$_p" | grep -o 'packets [0-9]*' | cut -d' ' -f2
}
# dh_clid ID NET IF: option 61 as dnsmasq's lease file shows it (type 0, then the text)
dh_clid() { printf '%s' "$1/$2/$3" | od -An -v -tx1 | tr -s ' \n' '  ' | sed 's/^ *//; s/ *$//; s/ /:/g; s/^/00:/'; }
# dh_leased IP CLID: dnsmasq holds IP for that client identifier
dh_leased() { grep -q " $1 .* $2\$" $DH_LEASES; }
# dh_rels IP: DHCPRELEASEs of IP the server logged; dh_gone IP N: more than N, and IP unleased
dh_rels() { grep -c "DHCPRELEASE(dhs) $1 " $DH_LOG; }
dh_gone() { [ "$(dh_rels "$1")" -gt "$2" ] && ! grep -q " $1 " $DH_LEASES; }
dh_mac() { ip netns exec "$1" cat "/sys/class/net/$2/address"; }
dh_ip() { echo "${1%/*}"; }
dh_in_range() { case $1 in 10.70.0.[5-9][0-9]/24) return 0 ;; esac; echo "$1 is not from 10.70.0.50-99/24"; return 1; }
dh_records() { ls /tmp/dhcpd-data/.dhcp-leases 2> /dev/null | grep -v '^\.' | wc -l; }
# dh_conf FILE NAME TYPE MODE [SOCKET]: TYPE (ipvlan|macvlan) on dhm in MODE, ipam dhcp
dh_conf() {
  _s=
  [ -n "${5:-}" ] && _s=",\"daemonSocketPath\":\"$5\""
  echo "{\"cniVersion\":\"1.0.0\",\"name\":\"$2\",\"type\":\"$3\",\"master\":\"dhm\",\"mode\":\"$4\",\"ipam\":{\"type\":\"dhcp\"$_s}}" > "$1"
}
# dh_routes RESULT: its "routes" array
dh_routes() { tr -d ' \n' < "$1" | grep -o '"routes":\[[^]]*\]'; }
# dh_pod_state NETNS: eth0's IPv4 address (as X, its brd left out) and routes
dh_pod_state() {
  _a=$(ipj_addrs "$1" eth0); _a=${_a%/*}
  { ip -n "$1" -4 -o addr show dev eth0 | sed 's/^[0-9]*: //; s/ *valid_lft.*//; s/ brd [0-9.]*//'; ip -n "$1" -4 route; } \
    | sed "s/$_a/X/g" | tr -s ' ' | tr '\n' ';'
}
uptime_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }

echo "== dhcp"
V="dhcp"
[ -e /etc/passwd ] || echo 'root:x:0:0:root:/:/bin/sh' > /etc/passwd   # dnsmasq --user=root
[ -e /etc/group ] || echo 'root:x:0:' > /etc/group
mkdir -p /run/cni
nsreset dhl
ip link add dhm type veth peer name dhs netns dhl && ip link set dhm up
ip -n dhl addr add 10.70.0.1/24 dev dhs && ip -n dhl link set dhs up && ip -n dhl link set lo up
nft add table netdev dhc && nft add chain netdev dhc in '{ type filter hook ingress device dhm priority 0; }'
dh_zero
teq "$V: nft counts the DHCP replies reaching dhm" "0 0" "$(dh_count uni) $(dh_count bc)"
: > $DH_LEASES
ip netns exec dhl /sbin/dnsmasq --no-daemon --conf-file=/dev/null --port=0 --no-ping --user=root \
  --pid-file --log-dhcp --dhcp-authoritative --dhcp-range=10.70.0.50,10.70.0.99,255.255.255.0,1h \
  --dhcp-option=3,10.70.0.1 --dhcp-leasefile=$DH_LEASES --log-facility=$DH_LOG --interface=dhs \
  < /dev/null > /tmp/dh-dnsmasq.out 2>&1 &
DH_SRV=$!
_i=0; while ! grep -q 'DHCP, IP range' $DH_LOG 2> /dev/null && [ $_i -lt 100 ]; do sleep 0.1; _i=$((_i + 1)); done
t "$V: dnsmasq serves 10.70.0.50-99 in the LAN netns" grep -q 'DHCP, IP range 10.70.0.50 -- 10.70.0.99' $DH_LOG
dh_daemon
t "$V: cnikit's daemon listens on $DH_SOCK" test -S $DH_SOCK
dh_ref_daemon
t "$V: the reference's daemon listens on $DH_REF_SOCK" test -S $DH_REF_SOCK

# ------------------------------------------------------------------ ipvlan l2 + dhcp
# pods dha, dhb; `dh_ipvl2 TAG` runs their life once (daemon flags as started)
dh_conf /tmp/dh-ipv.json dh-ipv ipvlan l2
dh_ipvl2() {
  V="ipvlan l2 + dhcp$1"
  nsreset dha dhb
  dh_zero
  t "$V: ADD a" cni ADD dha /run/netns/dha eth0 /tmp/dh-ipv.json
  t "$V: ADD b" cni ADD dhb /run/netns/dhb eth0 /tmp/dh-ipv.json
  A=$(addr_of /tmp/res-dha-eth0.json); B=$(addr_of /tmp/res-dhb-eth0.json)
  t "$V: a's address is from the server's range" dh_in_range "$A"
  t "$V: b's address is from the server's range" dh_in_range "$B"
  t "$V: the two addresses differ ($A, $B)" test "$A" != "$B"
  t "$V: result: gateway and default route from the server" sh -c "tr -d ' \n' < /tmp/res-dha-eth0.json | grep -q '\"gateway\":\"10.70.0.1\",\"interface\":0}\],\"routes\":\[{\"dst\":\"0.0.0.0/0\",\"gw\":\"10.70.0.1\"}\]'"
  teq "$V: a's eth0 holds its address" "${A:-none}" "$(ipj_addrs dha eth0)"
  teq "$V: b's eth0 holds its address" "${B:-none}" "$(ipj_addrs dhb eth0)"
  t "$V: default route via 10.70.0.1 in a" sh -c "/sbin/ip -n dha route show default | grep -q 'via 10.70.0.1 dev eth0'"
  teq "$V: both pods have the master's MAC (the server cannot tell them apart by it)" "$(cat /sys/class/net/dhm/address) $(cat /sys/class/net/dhm/address)" "$(dh_mac dha eth0) $(dh_mac dhb eth0)"
  t "$V: the server leased a's address to client id dha/dh-ipv/eth0" dh_leased "$(dh_ip "$A")" "$(dh_clid dha dh-ipv eth0)"
  t "$V: ... and b's to dhb/dh-ipv/eth0" dh_leased "$(dh_ip "$B")" "$(dh_clid dhb dh-ipv eth0)"
  teq "$V: no DHCP reply was unicast to the shared MAC" 0 "$(dh_count uni)"
  t "$V: the replies were broadcast" test "$(dh_count bc)" -ge 4
  t "$V: a reaches the server" ping_ok dha 10.70.0.1
  t "$V: b reaches the server" ping_ok dhb 10.70.0.1
  t "$V: a reaches b" ping_ok dha "$(dh_ip "$B")"
  t "$V: b reaches a" ping_ok dhb "$(dh_ip "$A")"
  t "$V: CHECK a" chk dha /run/netns/dha eth0 /tmp/dh-ipv.json
  t "$V: CHECK b" chk dhb /run/netns/dhb eth0 /tmp/dh-ipv.json
  n=$(dh_rels "$(dh_ip "$A")")
  t "$V: DEL a" del dha /run/netns/dha eth0 /tmp/dh-ipv.json
  t "$V: ... a's lease released at the server (DHCPRELEASE, gone from its lease file)" dh_gone "$(dh_ip "$A")" "$n"
  t "$V: ... b's lease stays and b still reaches the server" sh -c "grep -q ' $(dh_ip "$B") ' $DH_LEASES && /sbin/ip netns exec dhb ping -c 1 -W 3 10.70.0.1"
  t "$V: DEL a again" del dha /run/netns/dha eth0 /tmp/dh-ipv.json
  n=$(dh_rels "$(dh_ip "$B")")
  t "$V: DEL b" del dhb /run/netns/dhb eth0 /tmp/dh-ipv.json
  t "$V: ... b's lease released" dh_gone "$(dh_ip "$B")" "$n"
  t "$V: DEL b again" del dhb /run/netns/dhb eth0 /tmp/dh-ipv.json
  teq "$V: the daemon keeps no lease record" 0 "$(dh_records)"
  t "$V: both eth0 gone" sh -c "! /sbin/ip -n dha link show eth0 > /dev/null 2>&1 && ! /sbin/ip -n dhb link show eth0 > /dev/null 2>&1"
}
dh_ipvl2 ""
dh_daemon -broadcast
dh_ipvl2 " (daemon -broadcast)"
dh_daemon

# The reference (Debian's 1.1.1) on the same shape: without -broadcast its DISCOVERs are answered
# by unicast OFFERs to the shared MAC, which ipvlan gives the master (no slave has the address).
V="ipvlan l2 + dhcp: reference"
dh_conf /tmp/dh-ipv-ref.json dh-ipv ipvlan l2 $DH_REF_SOCK
nsreset dhe dhf
dh_zero
s=$(uptime_ms)
tn "$V: without -broadcast, ADD fails" refcni ADD dhe /run/netns/dhe eth0 /tmp/dh-ipv-ref.json
echo "    (after $(( $(uptime_ms) - s )) ms: $(tr -d '\n' < /tmp/out.json))"
t "$V: ... the server answered, by unicast to the shared MAC" test "$(dh_count uni)" -ge 1
teq "$V: ... no broadcast reply" 0 "$(dh_count bc)"
refcni DEL dhe /run/netns/dhe eth0 /tmp/dh-ipv-ref.json > /dev/null 2>&1
dh_ref_daemon -broadcast
dh_zero
t "$V: with -broadcast, ADD a" refcni ADD dhe /run/netns/dhe eth0 /tmp/dh-ipv-ref.json
t "$V: with -broadcast, ADD b" refcni ADD dhf /run/netns/dhf eth0 /tmp/dh-ipv-ref.json
A=$(addr_of /tmp/res-dhe-eth0.json); B=$(addr_of /tmp/res-dhf-eth0.json)
t "$V: ... a's address from the server's range" dh_in_range "$A"
t "$V: ... b's too, another one ($A, $B)" sh -c "case '$B' in 10.70.0.*/24) [ '$A' != '$B' ] ;; *) exit 1 ;; esac"
t "$V: ... the same client ids as cnikit's" sh -c "grep -q ' $(dh_ip "$A") .* $(dh_clid dhe dh-ipv eth0)\$' $DH_LEASES && grep -q ' $(dh_ip "$B") .* $(dh_clid dhf dh-ipv eth0)\$' $DH_LEASES"
t "$V: ... a reaches b" ping_ok dhe "$(dh_ip "$B")"
t "$V: DEL a" refcni DEL dhe /run/netns/dhe eth0 /tmp/dh-ipv-ref.json
t "$V: DEL b" refcni DEL dhf /run/netns/dhf eth0 /tmp/dh-ipv-ref.json
t "$V: ... both released at the server" sh -c "! grep -q ' 10.70.0.' $DH_LEASES"
dh_ref_daemon
ip netns del dhe; ip netns del dhf; ip netns del dha; ip netns del dhb

# ------------------------------------------------------------------ macvlan + dhcp, vs the reference
V="macvlan + dhcp"
dh_conf /tmp/dh-mv.json dh-mv macvlan bridge
dh_conf /tmp/dh-mv-ref.json dh-mv macvlan bridge $DH_REF_SOCK
nsreset dhc dhr
dh_zero
t "$V: ADD" cni ADD dhc /run/netns/dhc eth0 /tmp/dh-mv.json
M=$(addr_of /tmp/res-dhc-eth0.json)
t "$V: the address is from the server's range" dh_in_range "$M"
teq "$V: eth0 holds it" "${M:-none}" "$(ipj_addrs dhc eth0)"
t "$V: the server leased it to client id dhc/dh-mv/eth0" dh_leased "$(dh_ip "$M")" "$(dh_clid dhc dh-mv eth0)"
t "$V: ... whose MAC is eth0's" grep -q " $(dh_mac dhc eth0) $(dh_ip "$M") " $DH_LEASES
t "$V: the server unicast its replies (no -broadcast, a MAC of its own)" test "$(dh_count uni)" -ge 2
t "$V: reaches the server" ping_ok dhc 10.70.0.1
t "$V: CHECK" chk dhc /run/netns/dhc eth0 /tmp/dh-mv.json
ip -n dhc addr del "$M" dev eth0
tn "$V: CHECK fails once the address is gone" chk dhc /run/netns/dhc eth0 /tmp/dh-mv.json
ip -n dhc addr add "$M" dev eth0 && ip -n dhc route add default via 10.70.0.1
t "$V: reference: ADD" refcni ADD dhr /run/netns/dhr eth0 /tmp/dh-mv-ref.json
R=$(addr_of /tmp/res-dhr-eth0.json)
t "$V: reference: an address from the server's range" dh_in_range "$R"
t "$V: reference: not cnikit's pod's ($R, $M)" test "$R" != "$M"
teq "$V: the reference's gateway" "$(tr -d ' \n' < /tmp/res-dhr-eth0.json | grep -o '"gateway":"[^"]*"')" "$(tr -d ' \n' < /tmp/res-dhc-eth0.json | grep -o '"gateway":"[^"]*"')"
teq "$V: the reference's routes" "$(dh_routes /tmp/res-dhr-eth0.json)" "$(dh_routes /tmp/res-dhc-eth0.json)"
teq "$V: the reference's address, routes in the pod (address as X)" "$(dh_pod_state dhr)" "$(dh_pod_state dhc)"
t "$V: reference: the same client id shape" dh_leased "$(dh_ip "$R")" "$(dh_clid dhr dh-mv eth0)"
n=$(dh_rels "$(dh_ip "$M")")
t "$V: DEL" del dhc /run/netns/dhc eth0 /tmp/dh-mv.json
t "$V: ... released at the server" dh_gone "$(dh_ip "$M")" "$n"
t "$V: DEL again" del dhc /run/netns/dhc eth0 /tmp/dh-mv.json
n=$(dh_rels "$(dh_ip "$R")")
t "$V: reference: DEL" refcni DEL dhr /run/netns/dhr eth0 /tmp/dh-mv-ref.json
t "$V: reference: released at the server" dh_gone "$(dh_ip "$R")" "$n"
ip netns del dhc; ip netns del dhr

# ------------------------------------------------------------------ ipvlan l3, l3s + dhcp
# An l3/l3s slave's broadcasts are dropped on the way out (the packet socket's send fails with
# ENOBUFS): no DISCOVER can reach a server. The daemon refuses such a link at once (code 7).
for mode in l3 l3s; do
  V="ipvlan $mode + dhcp"
  dh_conf /tmp/dh-ipv3.json dh-ipv3 ipvlan $mode
  nsreset dhd
  d0=$(grep -c DHCPDISCOVER $DH_LOG)
  s=$(uptime_ms)
  tn "$V: ADD fails" cni ADD dhd /run/netns/dhd eth0 /tmp/dh-ipv3.json
  el=$(($(uptime_ms) - s))
  echo "    (after $el ms: $(tr -d '\n' < /tmp/out.json))"
  t "$V: ... within the resend timeout (10 s, +5 s slack), not a hang" test "$el" -le 15000
  t "$V: ... code 7, naming the interface and the mode" sh -c "tr -d '\n' < /tmp/out.json | grep -q '\"code\":7,.*eth0 in /run/netns/dhd is ipvlan in mode $mode, which passes no broadcasts: DHCP needs mode l2'"
  teq "$V: ... no DISCOVER reached the server" "$d0" "$(grep -c DHCPDISCOVER $DH_LOG)"
  t "$V: ... no eth0 left in the pod" sh -c "! /sbin/ip -n dhd link show eth0 > /dev/null 2>&1"
  teq "$V: ... no lease record" 0 "$(dh_records)"
  t "$V: DEL" cni DEL dhd /run/netns/dhd eth0 /tmp/dh-ipv3.json
done
ip netns del dhd

# ------------------------------------------------------------------ teardown
kill "$DH_PID" "$DH_REF_PID" "$DH_SRV"; wait "$DH_PID" "$DH_REF_PID" "$DH_SRV" 2> /dev/null
nft delete table netdev dhc
ip link del dhm; ip netns del dhl
t "dhcp: teardown: dhm gone with its peer" sh -c "! /sbin/ip link show dhm > /dev/null 2>&1"
