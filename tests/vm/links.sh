# Sourced by the VM's /init after tests/vm/guest.sh (its helpers: cni, chk, del, t, tn, teq,
# nsreset, ping_ok, ping_no, ipj_addrs, res_addrs, shape_ok, lease_held): the vlan interface
# plugin and the vrf meta plugin on Debian's kernel (8021q, vrf), which the CI machine's kernel
# lacks. Kernel state is compared with the reference plugins (/ref/vlan, /ref/vrf, Debian's
# containernetworking-plugins) on the same configuration where the CNI versions allow; and
# ptp with real traffic between two pods, its pod routes compared with /ref/ptp.

# refcni CMD ID NETNS IFNAME CONF: `cni` with the reference plugins (and their IPAM) from /ref
refcni() { CNI_BIN=/ref cni "$@"; }
# vlan_line NETNS DEV: the "vlan protocol 802.1Q id N <FLAGS>" line of `ip -d link`
vlan_line() { ip -n "$1" -d link show "$2" | grep -o 'vlan protocol [^ ]* id [0-9]* <[^>]*>'; }
# master_of NETNS DEV: the name of DEV's master (ip -j)
master_of() { ip -n "$1" -j link show "$2" | tr -d ' \n' | grep -o '"master":"[^"]*"' | cut -d'"' -f4; }
# vrf_table NETNS VRF: the table of VRF device VRF
vrf_table() { ip -n "$1" -d link show "$2" | grep -o 'vrf table [0-9]*' | cut -d' ' -f3; }
# vrf_routes NETNS VRF: `ip route show vrf` of both families, without kernel-made lines
vrf_routes() { { ip -n "$1" -4 route show vrf "$2"; ip -n "$1" -6 route show vrf "$2"; } | grep -v 'proto kernel' | sort | tr '\n' ';'; }
vrf_kernel_routes() { { ip -n "$1" -4 route show vrf "$2"; ip -n "$1" -6 route show vrf "$2"; } | grep 'proto kernel' | sort | tr '\n' ';'; }
# chained CMD ID NETNS IFNAME CONF RESULT: a chained call with RESULT as prevResult
chained() { with_prev "$5" "$6" > /tmp/chained.json && cni "$1" "$2" "$3" "$4" /tmp/chained.json; }
refchained() { with_prev "$5" "$6" > /tmp/chained.json && refcni "$1" "$2" "$3" "$4" /tmp/chained.json; }

# ------------------------------------------------------------------ vlan
# Two masters joined by a veth pair, as two switch ports on one trunk: a VLAN child of vm1
# and one of vm2 with the same id share a segment; another id is another segment.
ip link add vm1 type veth peer name vm2 && ip link set vm1 up && ip link set vm2 up
vlconf() { # FILE VERSION MASTER ID [EXTRA]
  cat > "$1" << EOF
{"cniVersion":"$2","name":"vl","type":"vlan","master":"$3","vlanId":$4${5:-},"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.88.0.0/24"}],[{"subnet":"fd88::/64"}]]}}
EOF
}
V="vlan + ipamd 1.0.0"
vlconf /tmp/vla.json 1.0.0 vm1 100
vlconf /tmp/vlb.json 1.0.0 vm2 100
vlconf /tmp/vlc.json 1.0.0 vm2 200
sed 's/"1.0.0"/"1.1.0"/' /tmp/vla.json > /tmp/vls.json
nsreset vla vlb vlc
t "$V: STATUS 1.1.0 (the kernel has 802.1Q)" cni STATUS "" "" "" /tmp/vls.json
t "$V: ADD pod a (vm1, id 100)" cni ADD vla /run/netns/vla eth0 /tmp/vla.json
t "$V: ADD pod b (vm2, id 100)" cni ADD vlb /run/netns/vlb eth0 /tmp/vlb.json
t "$V: ADD pod c (vm2, id 200)" cni ADD vlc /run/netns/vlc eth0 /tmp/vlc.json
t "$V: result shape" shape_ok /tmp/res-vla-eth0.json 1.0.0
t "$V: kernel: eth0 is an 802.1Q link of id 100, up" sh -c "/sbin/ip -n vla -d link show eth0 | grep -q 'vlan protocol 802.1Q id 100 ' && /sbin/ip -n vla link show eth0 | grep -qE '[<,]UP[,>]'"
teq "$V: ip -j: eth0 has exactly the result's addresses" "$(res_addrs /tmp/res-vla-eth0.json)" "$(ipj_addrs vla eth0)"
B=$(addr_of /tmp/res-vlb-eth0.json); C=$(addr_of /tmp/res-vlc-eth0.json)
t "$V: pod a reaches pod b on the same VLAN id" ping_ok vla "${B%/*}"
t "$V: pod a does not reach pod c on another VLAN id" ping_no vla "${C%/*}"
t "$V: CHECK" chk vla /run/netns/vla eth0 /tmp/vla.json
vlconf /tmp/vla-other.json 1.0.0 vm1 101
tn "$V: CHECK with another vlanId fails" chk vla /run/netns/vla eth0 /tmp/vla-other.json
A=$(addr_of /tmp/res-vla-eth0.json)
t "$V: DEL" del vla /run/netns/vla eth0 /tmp/vla.json
t "$V: ... eth0 gone, lease released" sh -c "! /sbin/ip -n vla link show eth0 > /dev/null 2>&1 && ! /cni/cnikit ipamd leases --data-dir $IPAM_DIR --json | grep -q '\"${A%/*}\"'"
t "$V: DEL again" del vla /run/netns/vla eth0 /tmp/vla.json
del vlb /run/netns/vlb eth0 /tmp/vlb.json > /dev/null; del vlc /run/netns/vlc eth0 /tmp/vlc.json > /dev/null

V="vlan + ipamd 0.4.0"
vlconf /tmp/vl4.json 0.4.0 vm1 300
t "$V: ADD" cni ADD vl4 /run/netns/vla eth0 /tmp/vl4.json
t "$V: result shape" shape_ok /tmp/res-vl4-eth0.json 0.4.0
t "$V: kernel: id 300" sh -c "/sbin/ip -n vla -d link show eth0 | grep -q 'vlan protocol 802.1Q id 300 '"
t "$V: CHECK" chk vl4 /run/netns/vla eth0 /tmp/vl4.json
t "$V: DEL" del vl4 /run/netns/vla eth0 /tmp/vl4.json

V="vlan linkInContainer"
ip link add lic0 type veth peer name ens5 netns vla && ip link set lic0 up && ip -n vla link set ens5 up
vlconf /tmp/vli.json 1.0.0 ens5 42 ',"linkInContainer":true'
t "$V: ADD on the pod's own ens5" cni ADD vli /run/netns/vla eth0 /tmp/vli.json
t "$V: eth0 is vlan 42 on ens5" sh -c "/sbin/ip -n vla -d link show eth0 | grep -q 'eth0@ens5' && /sbin/ip -n vla -d link show eth0 | grep -q 'id 42 '"
t "$V: CHECK" chk vli /run/netns/vla eth0 /tmp/vli.json
t "$V: DEL" del vli /run/netns/vla eth0 /tmp/vli.json
t "$V: ... ens5 stays" ip -n vla link show ens5
ip link del lic0

V="vlan DEL after the master is gone"
ip link add vmx type dummy && ip link set vmx up
vlconf /tmp/vlx.json 1.0.0 vmx 7
t "$V: ADD" cni ADD vlx /run/netns/vlb eth0 /tmp/vlx.json
X=$(addr_of /tmp/res-vlx-eth0.json)
ip link del vmx
t "$V: DEL succeeds" del vlx /run/netns/vlb eth0 /tmp/vlx.json
t "$V: ... and releases the lease" no_lease "${X%/*}"
ip netns del vla; ip netns del vlb; ip netns del vlc

# The reference (Debian's vlan 1.1.1, CNI ≤ 1.0.0) on the same configuration, with static
# IPAM (the same address, on separate masters): the same kernel link.
V="vlan vs reference"
ip link add vr1 type dummy && ip link set vr1 up
ip link add vr2 type dummy && ip link set vr2 up
vsconf() { # FILE MASTER
  cat > "$1" << EOF
{"cniVersion":"1.0.0","name":"vlr","type":"vlan","master":"$2","vlanId":55,"mtu":1400,"ipam":{"type":"static","addresses":[{"address":"10.91.0.5/24","gateway":"10.91.0.1"},{"address":"fd91::5/64"}],"routes":[{"dst":"0.0.0.0/0"}]}}
EOF
}
vsconf /tmp/vso.json vr1; vsconf /tmp/vsr.json vr2
nsreset vso vsr
t "$V: ADD (cnikit)" cni ADD vso /run/netns/vso eth0 /tmp/vso.json
if [ -x /ref/vlan ] && [ -x /ref/static ]; then
  t "$V: ADD (reference)" refcni ADD vsr /run/netns/vsr eth0 /tmp/vsr.json
  teq "$V: the same 802.1Q line" "$(vlan_line vsr eth0)" "$(vlan_line vso eth0)"
  teq "$V: the same MTU" "$(ip -n vsr -j link show eth0 | grep -o '"mtu":[0-9]*')" "$(ip -n vso -j link show eth0 | grep -o '"mtu":[0-9]*')"
  teq "$V: the same addresses" "$(ipj_addrs vsr eth0)" "$(ipj_addrs vso eth0)"
  teq "$V: the same IPv4 routes" "$(ip -n vsr -4 route | sort)" "$(ip -n vso -4 route | sort)"
else
  bad "$V: no reference vlan/static in /ref"
fi

# ------------------------------------------------------------------ vrf
# vrf chained after vlan (static IPAM) in both pods: ours in vso, the reference's in vsr.
V="vrf after vlan"
cat > /tmp/vrf.json << 'EOF'
{"cniVersion":"1.0.0","name":"vlr","type":"vrf","vrfname":"blue"}
EOF
t "$V: ADD (cnikit)" chained ADD vso /run/netns/vso eth0 /tmp/vrf.json /tmp/res-vso-eth0.json
t "$V: the result is prevResult" sh -c "tr -d ' \n' < /tmp/out.json | grep -q '\"10.91.0.5/24\"'"
teq "$V: ip -j: eth0's master is blue" blue "$(master_of vso eth0)"
teq "$V: blue has the first free table, 1" 1 "$(vrf_table vso blue)"
teq "$V: eth0 kept its IPv4 and IPv6 addresses" "10.91.0.5/24 fd91::5/64" "$(ipj_addrs vso eth0)"
t "$V: the default route is in blue's table" sh -c "/sbin/ip -n vso route show vrf blue | grep -q 'default via 10.91.0.1 dev eth0'"
t "$V: ... and no longer in the main table" sh -c "! /sbin/ip -n vso route show table main | grep -q default"
with_prev /tmp/vrf.json /tmp/res-vso-eth0.json > /tmp/vrfprev.json
t "$V: CHECK" cni CHECK vso /run/netns/vso eth0 /tmp/vrfprev.json
if [ -x /ref/vrf ]; then
  t "$V: ADD (reference)" refchained ADD vsr /run/netns/vsr eth0 /tmp/vrf.json /tmp/res-vsr-eth0.json
  teq "$V: the same master" "$(master_of vsr eth0)" "$(master_of vso eth0)"
  teq "$V: the same table" "$(vrf_table vsr blue)" "$(vrf_table vso blue)"
  teq "$V: the same addresses" "$(ipj_addrs vsr eth0)" "$(ipj_addrs vso eth0)"
  # Debian's vrf 1.1.1 predates moving the interface's routes into the VRF's table (v1.9.1
  # does, and so does cnikit): its default route is simply gone. The kernel-made ones agree.
  teq "$V: the same kernel-made routes in the vrf" "$(vrf_kernel_routes vsr blue)" "$(vrf_kernel_routes vso blue)"
  echo "    reference 1.1.1's other routes in the vrf: '$(vrf_routes vsr blue)'; cnikit's: '$(vrf_routes vso blue)'"
  teq "$V: the same main table" "$(ip -n vsr route show table main | sort)" "$(ip -n vso route show table main | sort)"
else
  bad "$V: no reference vrf in /ref"
fi
t "$V: DEL" cni DEL vso /run/netns/vso eth0 /tmp/vrfprev.json
t "$V: ... eth0 out of blue, blue gone" sh -c "[ -z \"\$(/sbin/ip -n vso -j link show eth0 | grep -o '\"master\"')\" ] && ! /sbin/ip -n vso link show blue > /dev/null 2>&1"
t "$V: DEL again" cni DEL vso /run/netns/vso eth0 /tmp/vrfprev.json
[ -x /ref/vrf ] && refcni DEL vsr /run/netns/vsr eth0 /tmp/chained.json > /dev/null
del vso /run/netns/vso eth0 /tmp/vso.json > /dev/null
ip netns del vso; ip netns del vsr; ip link del vr1; ip link del vr2

# vrf after bridge, two interfaces of one pod in one VRF, traffic in the VRF, a table given.
V="vrf after bridge"
brv() { # FILE NAME BRIDGE N
  cat > "$1" << EOF
{"cniVersion":"1.0.0","name":"$2","type":"bridge","bridge":"$3","isGateway":true,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.9$4.0.0/24"}],[{"subnet":"fd9$4::/64"}]],"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]}}
EOF
}
brv /tmp/brv1.json vbr1 brv1 2; brv /tmp/brv2.json vbr2 brv2 3
cat > /tmp/vrfg.json << 'EOF'
{"cniVersion":"1.0.0","name":"vbr1","type":"vrf","vrfname":"green","table":1234}
EOF
sed 's/"vbr1"/"vbr2"/' /tmp/vrfg.json > /tmp/vrfg2.json
nsreset vv
# (net1's bridge ADD comes after eth0's vrf ADD: two IPv6 default routes in the main table
# would be one multipath route, which the reference, and cnikit, leave out of the move.)
t "$V: ADD bridge eth0" cni ADD vv /run/netns/vv eth0 /tmp/brv1.json
t "$V: ADD vrf for eth0" chained ADD vv /run/netns/vv eth0 /tmp/vrfg.json /tmp/res-vv-eth0.json
t "$V: IPv4 and IPv6 default routes via eth0 in table 1234" sh -c "/sbin/ip -n vv route show table 1234 | grep -q 'default via 10.92.0.1 dev eth0' && /sbin/ip -n vv -6 route show table 1234 | grep -q 'default via fd92::1 dev eth0' || { /sbin/ip -n vv route show table all; exit 1; }"
t "$V: ADD bridge net1" cni ADD vv /run/netns/vv net1 /tmp/brv2.json
t "$V: ADD vrf for net1" chained ADD vv /run/netns/vv net1 /tmp/vrfg2.json /tmp/res-vv-net1.json
teq "$V: green has table 1234" 1234 "$(vrf_table vv green)"
teq "$V: eth0 in green" green "$(master_of vv eth0)"
teq "$V: net1 in green" green "$(master_of vv net1)"
teq "$V: eth0 kept its addresses" "$(res_addrs /tmp/res-vv-eth0.json)" "$(ipj_addrs vv eth0)"
teq "$V: net1 kept its addresses" "$(res_addrs /tmp/res-vv-net1.json)" "$(ipj_addrs vv net1)"
# As the reference's (a route replace): net1's default route takes the place of eth0's.
t "$V: ... then net1's default route replaces it" sh -c "/sbin/ip -n vv route show table 1234 | grep -q 'default via 10.93.0.1 dev net1' && ! /sbin/ip -n vv route show table 1234 | grep -q 'default via 10.92.0.1'"
t "$V: the pod reaches the gateway through the VRF" ip netns exec vv ping -c 1 -W 3 -I green 10.92.0.1
t "$V: ... and net1's gateway" ip netns exec vv ping -c 1 -W 3 -I green 10.93.0.1
with_prev /tmp/vrfg.json /tmp/res-vv-eth0.json > /tmp/vrfgp.json
with_prev /tmp/vrfg2.json /tmp/res-vv-net1.json > /tmp/vrfgp2.json
t "$V: CHECK" cni CHECK vv /run/netns/vv eth0 /tmp/vrfgp.json
sed 's/"green"/"red"/' /tmp/vrfgp.json > /tmp/vrfr.json
tn "$V: CHECK for another VRF fails" cni CHECK vv /run/netns/vv eth0 /tmp/vrfr.json
t "$V: DEL vrf for eth0" cni DEL vv /run/netns/vv eth0 /tmp/vrfgp.json
t "$V: ... eth0 out, green stays for net1" sh -c "[ -z \"\$(/sbin/ip -n vv -j link show eth0 | grep -o '\"master\"')\" ] && /sbin/ip -n vv link show green > /dev/null"
t "$V: DEL vrf for net1" cni DEL vv /run/netns/vv net1 /tmp/vrfgp2.json
t "$V: ... green gone with its last interface" sh -c "! /sbin/ip -n vv link show green > /dev/null 2>&1"
t "$V: DEL again" cni DEL vv /run/netns/vv net1 /tmp/vrfgp2.json
del vv /run/netns/vv eth0 /tmp/brv1.json > /dev/null; del vv /run/netns/vv net1 /tmp/brv2.json > /dev/null
ip netns del vv
t "$V: DEL with the netns gone" cni DEL vv /run/netns/vv eth0 /tmp/vrfgp.json
ip link del brv1 2> /dev/null; ip link del brv2 2> /dev/null
ip link del vm1 2> /dev/null

# ------------------------------------------------------------------ ptp
# ptp on Debian's kernel: two pods routed through their host ends reach each other and the
# node; the pod's routes are the reference's (/ref/ptp) on the same shape.
pconf() { # FILE TYPE(ipamd|host-local) SUBNET4 SUBNET6
  cat > "$1" << EOF
{"cniVersion":"1.0.0","name":"pp","type":"ptp","ipMasq":false,"mtu":1400,"ipam":{"type":"$2","dataDir":"$IPAM_DIR/ptp-$2","routes":[{"dst":"0.0.0.0/0"}],"ranges":[[{"subnet":"$3"}],[{"subnet":"$4"}]]}}
EOF
}
# pod_routes NETNS: the pod's routes of both families (subnets made alike), without
# link-local and multicast lines
pod_routes() { { ip -n "$1" -4 route show; ip -n "$1" -6 route show; } | grep -v '^fe80\|^ff00\|^multicast' | sed 's/10\.9[01]\./10.9X./g; s/fd9[01]:/fd9X:/g; s/ expires [0-9]*sec//' | sort | tr '\n' ';'; }
V="ptp + ipamd 1.0.0"
pconf /tmp/pp.json ipamd 10.90.0.0/24 fd90::/64
pconf /tmp/ppref.json host-local 10.91.0.0/24 fd91::/64
nsreset ppa ppb ppr
t "$V: ADD pod a" cni ADD ppa /run/netns/ppa eth0 /tmp/pp.json
t "$V: ADD pod b" cni ADD ppb /run/netns/ppb eth0 /tmp/pp.json
PA=$(ip -n ppa -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
PB=$(ip -n ppb -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
t "$V: a reaches b ($PB) through the host" ping_ok ppa "$PB"
t "$V: b reaches a ($PA)" ping_ok ppb "$PA"
t "$V: a reaches its gateway on the host end (10.90.0.1)" ping_ok ppa 10.90.0.1
t "$V: CHECK" chk ppa /run/netns/ppa eth0 /tmp/pp.json
if [ -x /ref/ptp ]; then
  t "$V: the reference's ptp ADD on the same shape" refcni ADD ppr /run/netns/ppr eth0 /tmp/ppref.json
  teq "$V: the pod's routes are the reference's" "$(pod_routes ppr)" "$(pod_routes ppa)"
  refcni DEL ppr /run/netns/ppr eth0 /tmp/ppref.json > /dev/null
fi
t "$V: DEL a" del ppa /run/netns/ppa eth0 /tmp/pp.json
ip netns del ppb
t "$V: DEL b with its netns gone" del ppb /run/netns/ppb eth0 /tmp/pp.json
t "$V: no host end left (by its owner alias)" sh -c "! /sbin/ip -o link show | grep -q 'alias cnikit ptp pp/'"
ip netns del ppa; ip netns del ppr
V="ptp IPv4 only"
cat > /tmp/pp4.json << EOF
{"cniVersion":"1.0.0","name":"pp4","type":"ptp","ipMasq":false,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR/ptp4","ranges":[[{"subnet":"10.92.0.0/24"}]]}}
EOF
nsreset pp4
t "$V: ADD" cni ADD pp4 /run/netns/pp4 eth0 /tmp/pp4.json
# the host end is the result's first interface
PH=$(tr -d ' \n' < /tmp/res-pp4-eth0.json | grep -o '"name":"[^"]*"' | sed -n 1p | cut -d'"' -f4)
t "$V: no IPv6 address on the pod's eth0 or its host end" no_ipv6 pp4 "$PH"
t "$V: DEL" del pp4 /run/netns/pp4 eth0 /tmp/pp4.json
ip netns del pp4
