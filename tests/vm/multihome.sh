# Sourced by the VM's /init after tests/vm/links.sh (helpers of guest.sh: cni, chk, del, t, tn,
# teq, nsreset, with_prev, ipj_addrs, res_addrs, shape_ok; of links.sh: refcni, chained,
# refchained, master_of): multi-homed pods on Debian's kernel. sbr chained after macvlan on a
# pod whose eth0 is ptp's (rules, tables, replies leaving through net1; `table`), and after ptp
# (/ref/sbr on the same shapes); tap (MAC, MTU, multi_queue, a bridge in the pod; the device
# `ip tuntap`, which the reference v1.9.1 runs, makes); vlan + static, the Multus shape,
# directly, through cnitool (libcni 1.1.2, when run.sh found it) and through `cnikit net`.

# mh_j NETNS ARGS...: `ip -j ARGS` in NETNS without whitespace (one line of JSON)
mh_j() { _n=$1; shift; ip -n "$_n" -j "$@" | tr -d ' \n'; }
# ping_from NETNS SRC DST / ping_from_no: a ping sourced from SRC (answered / not answered)
ping_from() { ip netns exec "$1" ping -c 1 -W 3 -I "$2" "$3"; }
ping_from_no() { ! ip netns exec "$1" ping -c 1 -W 1 -I "$2" "$3"; }
# tun_line NETNS DEV: the "tun type tap pi .. vnet_hdr .. [multi_queue ..] persist on" part of
# `ip -d link`, and its queue count
tun_line() {
  _l=$(ip -n "$1" -d link show "$2")
  echo "$(echo "$_l" | grep -o 'tun type .* persist o[nf]*') $(echo "$_l" | grep -o 'numtxqueues [0-9]*')"
}
mh_link() { mh_j "$1" link show "$2" | grep -o "\"$3\":[^,]*" | head -1; }

# ------------------------------------------------------------------ sbr
# Pod sba: eth0 from ptp (ipamd, the default route via the node), net1 a macvlan on sbv1 (a veth
# of the node whose peer sbv2 is the far side, netns sbf: the gateway 10.67.0.1 and, behind it,
# 198.51.100.1, which only net1's segment reaches), sbr chained on net1. Pod sbb is the same on
# sbw1/sbg, with /ref/sbr (Debian's 1.1.1, whose default path is v1.9.1's; it has no `table`):
# cnikit's ptp and macvlan make both pods' links, so what differs is sbr's doing only.
V="sbr after macvlan"
nsreset sba sbb sbf sbg
# POD:M:F: net1's master M1 on the node, its peer M2 in the far side's netns F
for x in sba:sbv:sbf sbb:sbw:sbg; do
  pod=${x%%:*}; f=${x##*:}; m=${x#*:}; m=${m%:*}
  ip link add "${m}1" type veth peer name "${m}2" && ip link set "${m}2" netns "$f" && ip link set "${m}1" up
  ip -n "$f" addr add 10.67.0.1/24 dev "${m}2" && ip -n "$f" link set "${m}2" up && ip -n "$f" link set lo up
  ip -n "$f" addr add 198.51.100.1/32 dev lo
  cat > "/tmp/mh-mv-$pod.json" << EOF
{"cniVersion":"1.0.0","name":"mh-net1","type":"macvlan","master":"${m}1","mode":"bridge","ipam":{"type":"static","addresses":[{"address":"10.67.0.2/24","gateway":"10.67.0.1"}]}}
EOF
done
cat > /tmp/mh-ptp.json << EOF
{"cniVersion":"1.0.0","name":"mh-eth0","type":"ptp","ipMasq":false,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.68.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}
EOF
echo '{"cniVersion":"1.0.0","name":"mh-net1","type":"sbr"}' > /tmp/mh-sbr.json
for ns in sba sbb; do
  ip -n $ns link set lo up
  t "$V: $ns: ADD ptp eth0" cni ADD $ns /run/netns/$ns eth0 /tmp/mh-ptp.json
  t "$V: $ns: ADD macvlan net1" cni ADD $ns /run/netns/$ns net1 /tmp/mh-mv-$ns.json
  cp /tmp/res-$ns-net1.json /tmp/mh-$ns-mv.json
done
t "$V: without sbr, a ping from net1's address to 198.51.100.1 leaves by eth0 (no answer)" ping_from_no sba 10.67.0.2 198.51.100.1
t "$V: ... nor is a ping from there to net1's address answered (the reply takes eth0)" ping_from_no sbf 198.51.100.1 10.67.0.2
t "$V: ADD sbr (cnikit)" chained ADD sba /run/netns/sba net1 /tmp/mh-sbr.json /tmp/mh-sba-mv.json
teq "$V: the result is prevResult" "$(tr -d ' \n' < /tmp/mh-sba-mv.json)" "$(tr -d ' \n' < /tmp/out.json)"
t "$V: rule from 10.67.0.2 lookup 100" sh -c "/sbin/ip -n sba rule show | grep -q 'from 10.67.0.2 lookup 100'"
t "$V: table 100: default via 10.67.0.1 dev net1 and the subnet route" sh -c "/sbin/ip -n sba route show table 100 | grep -q 'default via 10.67.0.1 dev net1' && /sbin/ip -n sba route show table 100 | grep -q '^10.67.0.0/24 dev net1 .*src 10.67.0.2'"
teq "$V: net1's routes left the main table" "[]" "$(mh_j sba route show table main dev net1)"
t "$V: the main table's default is still via eth0" sh -c "/sbin/ip -n sba route show default | grep -q 'via 10.68.0.1 dev eth0'"
t "$V: a ping from net1's address to 198.51.100.1 leaves by net1 (answered)" ping_from sba 10.67.0.2 198.51.100.1
t "$V: the reply to a ping from 198.51.100.1 to net1's address leaves by net1" ping_from sbf 198.51.100.1 10.67.0.2
t "$V: an unsourced ping to 198.51.100.1 still takes eth0 (no answer)" ping_no sba 198.51.100.1
if [ -x /ref/sbr ]; then
  t "$V: ADD sbr (reference)" refchained ADD sbb /run/netns/sbb net1 /tmp/mh-sbr.json /tmp/mh-sbb-mv.json
  teq "$V: ip -j rule: the reference's" "$(mh_j sbb rule show)" "$(mh_j sba rule show)"
  teq "$V: ip -6 -j rule: the reference's" "$(mh_j sbb -6 rule show)" "$(mh_j sba -6 rule show)"
  teq "$V: ip -j route show table 100: the reference's" "$(mh_j sbb route show table 100)" "$(mh_j sba route show table 100)"
  teq "$V: net1's main routes: the reference's" "$(mh_j sbb route show table main dev net1)" "$(mh_j sba route show table main dev net1)"
  t "$V: reference: the reply leaves by net1 too" ping_from sbg 198.51.100.1 10.67.0.2
else
  bad "$V: no reference sbr in /ref"
fi
t "$V: CHECK" chained CHECK sba /run/netns/sba net1 /tmp/mh-sbr.json /tmp/mh-sba-mv.json
ip -n sba rule del from 10.67.0.2 lookup 100
tn "$V: CHECK fails once the rule is gone (the reference's CHECK checks nothing)" chained CHECK sba /run/netns/sba net1 /tmp/mh-sbr.json /tmp/mh-sba-mv.json
ip -n sba rule add from 10.67.0.2 lookup 100 pref 32765
t "$V: DEL sbr" chained DEL sba /run/netns/sba net1 /tmp/mh-sbr.json /tmp/mh-sba-mv.json
t "$V: ... the rule is gone" sh -c "! /sbin/ip -n sba rule show | grep -q 10.67.0.2"
t "$V: ... replies from net1's address take eth0 again" ping_from_no sbf 198.51.100.1 10.67.0.2
t "$V: DEL sbr again" chained DEL sba /run/netns/sba net1 /tmp/mh-sbr.json /tmp/mh-sba-mv.json
if [ -x /ref/sbr ]; then
  # the reference's DEL too removes only the rules: table 100 empties when net1 goes
  refchained DEL sbb /run/netns/sbb net1 /tmp/mh-sbr.json /tmp/mh-sbb-mv.json > /dev/null
  teq "$V: after DEL: rules as the reference's" "$(mh_j sbb rule show)" "$(mh_j sba rule show)"
  teq "$V: after DEL: table 100 as the reference's" "$(mh_j sbb route show table 100)" "$(mh_j sba route show table 100)"
fi
t "$V: DEL macvlan net1" del sba /run/netns/sba net1 /tmp/mh-mv-sba.json
teq "$V: ... table 100 went with net1" "" "$(ip -n sba route show table 100)"

# `table` (v1.9.1's doRoutesWithTable): only the rules, to that table; its routes are the
# configuration's (an IPAM route with "table"); nothing leaves main. Debian's 1.1.1 ignores the
# key (no comparison here).
V="sbr table 200"
sed 's/"gateway":"10.67.0.1"}\]/&,"routes":[{"dst":"0.0.0.0\/0","gw":"10.67.0.1","table":200}]/' /tmp/mh-mv-sba.json > /tmp/mh-mvt.json
echo '{"cniVersion":"1.0.0","name":"mh-net1","type":"sbr","table":200}' > /tmp/mh-sbrt.json
t "$V: ADD macvlan net1 (an IPAM default route in table 200)" cni ADD sba /run/netns/sba net1 /tmp/mh-mvt.json
cp /tmp/res-sba-net1.json /tmp/mh-sba-mvt.json
t "$V: ADD sbr" chained ADD sba /run/netns/sba net1 /tmp/mh-sbrt.json /tmp/mh-sba-mvt.json
t "$V: rule from 10.67.0.2 lookup 200" sh -c "/sbin/ip -n sba rule show | grep -q 'from 10.67.0.2 lookup 200'"
teq "$V: no table 100" "" "$(ip -n sba route show table 100)"
t "$V: the subnet route stays in main" sh -c "/sbin/ip -n sba route show table main | grep -q '^10.67.0.0/24 dev net1'"
t "$V: table 200 has the IPAM route" sh -c "/sbin/ip -n sba route show table 200 | grep -q 'default via 10.67.0.1 dev net1'"
# The far side still maps 10.67.0.2 to the first net1's MAC: cnikit's macvlan leaves arp_notify
# at 0, where the reference's (1.1.1 and v1.9.1) sets 1 and so announces the address when net1
# comes up, which updates that entry. Without one, replies wait for the entry to time out.
echo "    record: net1's arp_notify after cnikit's macvlan ADD: $(ip netns exec sba cat /proc/sys/net/ipv4/conf/net1/arp_notify) (the reference sets 1); net1 is $(mh_link sba net1 address), far side: $(ip -n sbf neigh show 10.67.0.2)"
ip -n sbf neigh flush dev sbv2
t "$V: the reply to a ping from 198.51.100.1 to net1's address leaves by net1" ping_from sbf 198.51.100.1 10.67.0.2
t "$V: CHECK" chained CHECK sba /run/netns/sba net1 /tmp/mh-sbrt.json /tmp/mh-sba-mvt.json
t "$V: DEL" chained DEL sba /run/netns/sba net1 /tmp/mh-sbrt.json /tmp/mh-sba-mvt.json
t "$V: ... the rule is gone" sh -c "! /sbin/ip -n sba rule show | grep -q 10.67.0.2"
t "$V: DEL again" chained DEL sba /run/netns/sba net1 /tmp/mh-sbrt.json /tmp/mh-sba-mvt.json
t "$V: DEL macvlan net1" del sba /run/netns/sba net1 /tmp/mh-mvt.json
del sbb /run/netns/sbb net1 /tmp/mh-mv-sbb.json > /dev/null
for ns in sba sbb; do del $ns /run/netns/$ns eth0 /tmp/mh-ptp.json > /dev/null; done
t "$V: no ptp host end, no macvlan left" sh -c "! /sbin/ip -o link show | grep -q 'alias cnikit ptp mh-eth0/' && [ -z \"\$(/sbin/ip -n sba -o link show type macvlan)\" ]"
ip netns del sba; ip netns del sbb; ip netns del sbf; ip netns del sbg; ip link del sbv1 2> /dev/null; ip link del sbw1 2> /dev/null

# sbr chained after ptp on eth0, the pod's only interface: all of eth0's routes leave main for
# table 100, the default route too (only traffic from eth0's address is routed then); /ref/sbr
# in pod sbd on the same shape, each pod's own address written as A.
V="sbr after ptp"
nsreset sbc sbd
for ns in sbc sbd; do
  t "$V: $ns: ADD ptp eth0" cni ADD $ns /run/netns/$ns eth0 /tmp/mh-ptp.json
  cp /tmp/res-$ns-eth0.json /tmp/mh-$ns-ptp.json
done
C=$(addr_of /tmp/mh-sbc-ptp.json); C=${C%/*}; D=$(addr_of /tmp/mh-sbd-ptp.json); D=${D%/*}
mh_alike() { _a=$2; _n=$1; shift 2; mh_j "$_n" "$@" | sed "s/\"$_a\"/\"A\"/g"; }
t "$V: ADD sbr (cnikit)" chained ADD sbc /run/netns/sbc eth0 /tmp/mh-sbr.json /tmp/mh-sbc-ptp.json
t "$V: rule from $C lookup 100" sh -c "/sbin/ip -n sbc rule show | grep -q 'from $C lookup 100'"
t "$V: table 100: default via 10.68.0.1 dev eth0" sh -c "/sbin/ip -n sbc route show table 100 | grep -q 'default via 10.68.0.1 dev eth0'"
teq "$V: eth0's routes left main" "[]" "$(mh_j sbc route show table main)"
t "$V: the pod reaches its gateway from eth0's address" ping_from sbc "$C" 10.68.0.1
if [ -x /ref/sbr ]; then
  t "$V: ADD sbr (reference)" refchained ADD sbd /run/netns/sbd eth0 /tmp/mh-sbr.json /tmp/mh-sbd-ptp.json
  teq "$V: ip -j rule: the reference's" "$(mh_alike sbd "$D" rule show)" "$(mh_alike sbc "$C" rule show)"
  teq "$V: ip -j route show table 100: the reference's" "$(mh_alike sbd "$D" route show table 100)" "$(mh_alike sbc "$C" route show table 100)"
  teq "$V: the main table: the reference's" "$(mh_alike sbd "$D" route show table main)" "$(mh_alike sbc "$C" route show table main)"
  refchained DEL sbd /run/netns/sbd eth0 /tmp/mh-sbr.json /tmp/mh-sbd-ptp.json > /dev/null
fi
t "$V: CHECK" chained CHECK sbc /run/netns/sbc eth0 /tmp/mh-sbr.json /tmp/mh-sbc-ptp.json
t "$V: DEL" chained DEL sbc /run/netns/sbc eth0 /tmp/mh-sbr.json /tmp/mh-sbc-ptp.json
t "$V: ... the rule is gone" sh -c "! /sbin/ip -n sbc rule show | grep -q 'from $C '"
t "$V: DEL again" chained DEL sbc /run/netns/sbc eth0 /tmp/mh-sbr.json /tmp/mh-sbc-ptp.json
for ns in sbc sbd; do del $ns /run/netns/$ns eth0 /tmp/mh-ptp.json > /dev/null; done
teq "$V: ... table 100 went with eth0" "" "$(ip -n sbc route show table 100)"
ip netns del sbc; ip netns del sbd

# ------------------------------------------------------------------ tap
# The reference (v1.9.1 plugins/main/tap/tap.go) without both owner and group makes the tap by
# exec'ing `ip tuntap add mode tap name <random> [multi_queue] [user U] [group G]` and
# `ip link set <random> mtu M address MAC` in the pod, renames it to CNI_IFNAME, enslaves it to
# `bridge` (looked up inside the pod), sets it up, and with IPAM sets arp_notify and configures
# the addresses (result: the tap as interface 0). `selinuxContext` makes it exec `ip` under that
# label (it fails without SELinux; cnikit accepts a label there is none to give). DEL: IPAM DEL,
# then the link by name (gone is fine). Debian's 1.1.1 has no tap: the reference's device is
# made here with the same `ip tuntap` commands, in pod tpr, and compared.
V="tap + static"
nsreset tpa tpr
cat > /tmp/mh-tap.json << 'EOF'
{"cniVersion":"1.0.0","name":"mh-tap","type":"tap","mac":"0a:58:0a:45:00:05","mtu":1400,"multiQueue":true,"selinuxcontext":"system_u:system_r:container_t:s0","ipam":{"type":"static","addresses":[{"address":"10.69.0.5/24"}]}}
EOF
t "$V: ADD (multiQueue, mac, mtu; selinuxcontext without SELinux)" cni ADD tp /run/netns/tpa net1 /tmp/mh-tap.json
t "$V: result shape" shape_ok /tmp/res-tp-net1.json 1.0.0
t "$V: result: net1 with the MAC, in the sandbox" has /tmp/res-tp-net1.json '"interfaces":\[{"name":"net1","mac":"0a:58:0a:45:00:05","sandbox":"/run/netns/tpa"}\]'
t "$V: result: the address, on interface 0" sh -c "tr -d ' \\n' < /tmp/res-tp-net1.json | grep -o '\"ips\":\[{[^}]*}' | grep '\"interface\":0' | grep -q '\"address\":\"10.69.0.5/24\"'"
t "$V: ip -d link: tun type tap ... multi_queue" sh -c "/sbin/ip -n tpa -d link show net1 | grep -q 'tun type tap .*multi_queue'"
teq "$V: the MAC" '"address":"0a:58:0a:45:00:05"' "$(mh_link tpa net1 address)"
teq "$V: the MTU" '"mtu":1400' "$(mh_link tpa net1 mtu)"
teq "$V: the static address" "10.69.0.5/24" "$(ipj_addrs tpa net1)"
teq "$V: arp_notify on, as the reference" 1 "$(ip netns exec tpa cat /proc/sys/net/ipv4/conf/net1/arp_notify)"
ip -n tpr tuntap add mode tap name net1 multi_queue && ip -n tpr link set net1 mtu 1400 address 0a:58:0a:45:00:05 && ip -n tpr link set net1 up
teq "$V: the same device as the reference's ip tuntap ... multi_queue" "$(tun_line tpr net1)" "$(tun_line tpa net1)"
# (linkwatch sets the operstate, NO-CARRIER in `ip`'s flags, up to a second after `up`)
for _ in 1 2 3 4 5 6 7 8 9 10; do ip -n tpr link show net1 | grep -q NO-CARRIER && break; sleep 0.5; done
teq "$V: ... the same flags and state" "$(mh_j tpr link show net1 | grep -oE '"flags":[^]]*]|"operstate":"[A-Z]*"')" "$(mh_j tpa link show net1 | grep -oE '"flags":[^]]*]|"operstate":"[A-Z]*"')"
t "$V: CHECK" chk tp /run/netns/tpa net1 /tmp/mh-tap.json
ip -n tpa link set net1 mtu 1300
tn "$V: CHECK fails once the MTU is changed" chk tp /run/netns/tpa net1 /tmp/mh-tap.json
ip -n tpa link set net1 mtu 1400
sed 's/"multiQueue":true/"multiQueue":false/' /tmp/mh-tap.json > /tmp/mh-tap1.json
tn "$V: CHECK with multiQueue false fails" chk tp /run/netns/tpa net1 /tmp/mh-tap1.json
t "$V: DEL" del tp /run/netns/tpa net1 /tmp/mh-tap.json
t "$V: ... net1 gone" sh -c '! /sbin/ip -n tpa link show net1 > /dev/null 2>&1'
t "$V: DEL again" del tp /run/netns/tpa net1 /tmp/mh-tap.json
ip -n tpr link del net1

# The KubeVirt shape: L2 only, a port of a bridge inside the pod; one queue.
V="tap in a pod bridge"
for ns in tpa tpr; do ip -n $ns link add k6t-net0 type bridge && ip -n $ns link set k6t-net0 up; done
echo '{"cniVersion":"1.0.0","name":"mh-tapb","type":"tap","bridge":"k6t-net0"}' > /tmp/mh-tapb.json
t "$V: ADD" cni ADD tpb /run/netns/tpa tap0 /tmp/mh-tapb.json
t "$V: result: the tap only, no IPs" sh -c "tr -d ' \n' < /tmp/res-tpb-tap0.json | grep -q '\"interfaces\":\[{\"name\":\"tap0\",\"mac\":\"[0-9a-f:]*\",\"sandbox\":\"/run/netns/tpa\"}\]' && ! grep -q '\"ips\"' /tmp/res-tpb-tap0.json"
teq "$V: tap0's master is k6t-net0 (in the pod)" k6t-net0 "$(master_of tpa tap0)"
t "$V: tap0 is up" sh -c "/sbin/ip -n tpa link show tap0 | grep -qE '[<,]UP[,>]'"
tn "$V: no multi_queue" sh -c "/sbin/ip -n tpa -d link show tap0 | grep -q multi_queue"
ip -n tpr tuntap add mode tap name tap0 && ip -n tpr link set tap0 master k6t-net0 && ip -n tpr link set tap0 up
teq "$V: the same device as the reference's ip tuntap" "$(tun_line tpr tap0)" "$(tun_line tpa tap0)"
t "$V: CHECK" chk tpb /run/netns/tpa tap0 /tmp/mh-tapb.json
ip -n tpa link set tap0 nomaster
tn "$V: CHECK fails once tap0 left the bridge" chk tpb /run/netns/tpa tap0 /tmp/mh-tapb.json
t "$V: DEL" del tpb /run/netns/tpa tap0 /tmp/mh-tapb.json
t "$V: ... tap0 gone, the bridge stays" sh -c "! /sbin/ip -n tpa link show tap0 > /dev/null 2>&1 && /sbin/ip -n tpa link show k6t-net0 > /dev/null"
t "$V: DEL again" del tpb /run/netns/tpa tap0 /tmp/mh-tapb.json
# (the reference leaves its tap behind here: the error comes after the create, before its undo)
sed 's/k6t-net0/k6t-none/' /tmp/mh-tapb.json > /tmp/mh-tapn.json
tn "$V: ADD with a bridge missing in the pod fails" cni ADD tpn /run/netns/tpa tap0 /tmp/mh-tapn.json
t "$V: ... leaving no tap" sh -c "[ -z \"\$(/sbin/ip -n tpa -o link show type tun)\" ]"
ip netns del tpa; ip netns del tpr

# ------------------------------------------------------------------ vlan + static (Multus)
# The shape Multus users write: vlan on a node NIC with a static address, as net1. Two pods on
# the two ends of a veth trunk (mt1, mt2) share VLAN 300. Then the same networks through a
# runtime: cnitool (libcni 1.1.2: NETCONFPATH, CNI_PATH, CNI_IFNAME, CAP_ARGS; pod b's address
# from CAP_ARGS' "ips" capability, as Multus passes it) and `cnikit net`.
V="vlan + static (Multus)"
ip link add mt1 type veth peer name mt2 && ip link set mt1 up && ip link set mt2 up
nsreset mva mvb
mvconf() { # FILE MASTER ADDRESS
  echo '{"cniVersion":"1.0.0","name":"mh-vlan","type":"vlan","master":"'"$2"'","vlanId":300,"ipam":{"type":"static","addresses":[{"address":"'"$3"'"}]}}' > "$1"
}
mvconf /tmp/mh-vla.json mt1 10.66.0.2/24
mvconf /tmp/mh-vlb.json mt2 10.66.0.3/24
t "$V: ADD pod a (mt1, 10.66.0.2)" cni ADD mva /run/netns/mva net1 /tmp/mh-vla.json
t "$V: ADD pod b (mt2, 10.66.0.3)" cni ADD mvb /run/netns/mvb net1 /tmp/mh-vlb.json
t "$V: net1 is 802.1Q id 300 on mt1" sh -c "/sbin/ip -n mva -d link show net1 | grep -q 'vlan protocol 802.1Q id 300 '"
teq "$V: pod a has exactly its static address" 10.66.0.2/24 "$(ipj_addrs mva net1)"
t "$V: a reaches b over the trunk" ping_ok mva 10.66.0.3
t "$V: b reaches a" ping_ok mvb 10.66.0.2
t "$V: CHECK a" chk mva /run/netns/mva net1 /tmp/mh-vla.json
t "$V: CHECK b" chk mvb /run/netns/mvb net1 /tmp/mh-vlb.json
t "$V: DEL a" del mva /run/netns/mva net1 /tmp/mh-vla.json
t "$V: DEL b" del mvb /run/netns/mvb net1 /tmp/mh-vlb.json
t "$V: ... both net1 gone, the trunk ends stay" sh -c "! /sbin/ip -n mva link show net1 >/dev/null 2>&1 && ! /sbin/ip -n mvb link show net1 >/dev/null 2>&1 && /sbin/ip link show mt1 >/dev/null && /sbin/ip link show mt2 >/dev/null"
t "$V: DEL a again" del mva /run/netns/mva net1 /tmp/mh-vla.json

# the networks as a runtime finds them: one conflist each in NETCONFPATH
mkdir -p /tmp/mh-net.d
echo '{"cniVersion":"1.0.0","name":"mh-vlan-a","plugins":[{"type":"vlan","master":"mt1","vlanId":300,"ipam":{"type":"static","addresses":[{"address":"10.66.0.2/24"}]}}]}' > /tmp/mh-net.d/a.conflist
echo '{"cniVersion":"1.0.0","name":"mh-vlan-b","plugins":[{"type":"vlan","master":"mt2","vlanId":300,"capabilities":{"ips":true},"ipam":{"type":"static"}}]}' > /tmp/mh-net.d/b.conflist
MH_CAP='{"ips":["10.66.0.3/24"]}'
# rt RUNTIME VERB NET NETNS: cnitool or `cnikit net`, with the runtime's environment
rt() {
  _cap=
  [ "$3" = mh-vlan-b ] && _cap=$MH_CAP
  case $1 in
    cnitool) env NETCONFPATH=/tmp/mh-net.d CNI_PATH=/cni CNI_IFNAME=net1 CAP_ARGS="$_cap" /bin/cnitool "$2" "$3" "$4" ;;
    cnikit) env NETCONFPATH=/tmp/mh-net.d CNI_PATH=/cni CAP_ARGS="$_cap" /cni/cnikit net "$2" "$3" "$4" --ifname net1 ;;
  esac
}
for r in cnitool cnikit; do
  V="vlan + static via $r"
  if [ $r = cnitool ] && [ ! -x /bin/cnitool ]; then
    echo "    skip - $V: no cnitool in the guest (run.sh copies /var/cache/cnikit-interop/bin/cnitool, built by tests/interop/cnitool.sh)"
    continue
  fi
  t "$V: add a" rt $r add mh-vlan-a /run/netns/mva
  t "$V: add b (its address from CAP_ARGS ips)" rt $r add mh-vlan-b /run/netns/mvb
  teq "$V: b got the CAP_ARGS address" 10.66.0.3/24 "$(ipj_addrs mvb net1)"
  t "$V: the runtime cached both results" sh -c "ls /var/lib/cni/results/ | grep -q '^mh-vlan-a-' && ls /var/lib/cni/results/ | grep -q '^mh-vlan-b-'"
  t "$V: a reaches b" ping_ok mva 10.66.0.3
  t "$V: b reaches a" ping_ok mvb 10.66.0.2
  t "$V: check a" rt $r check mh-vlan-a /run/netns/mva
  t "$V: check b" rt $r check mh-vlan-b /run/netns/mvb
  ip -n mvb addr del 10.66.0.3/24 dev net1
  tn "$V: check b fails once its address is gone" rt $r check mh-vlan-b /run/netns/mvb
  t "$V: del a" rt $r del mh-vlan-a /run/netns/mva
  t "$V: del b" rt $r del mh-vlan-b /run/netns/mvb
  t "$V: ... both net1 gone, no cache entry left" sh -c "! /sbin/ip -n mva link show net1 >/dev/null 2>&1 && ! /sbin/ip -n mvb link show net1 >/dev/null 2>&1 && ! ls /var/lib/cni/results/ 2>/dev/null | grep -q '^mh-vlan-'"
  t "$V: del a again" rt $r del mh-vlan-a /run/netns/mva
done
ip netns del mva; ip netns del mvb; ip link del mt1
