# Sourced by the VM's /init from tests/vm/guest.sh (its helpers: cni, chk, del, t, tn, teq,
# nsreset, ping_ok, ping_no, vlans_of, host_veth, addr_of): the bridge plugin's VLANs
# (`vlan`, `vlanTrunk`, `preserveDefaultVlan`) on Debian's kernel, which has VLAN filtering
# where the CI machine's lacks it; port membership compared with the reference plugin.
# ------------------------------------------------------------------ bridge VLAN filtering
# One bridge, one subnet; networks differ in VLAN (and in their ipamd range).
brconf() { # NAME RANGE-START RANGE-END EXTRA-KEYS
  cat << EOF
{"cniVersion":"1.0.0","name":"$1","type":"bridge","bridge":"brv"$4,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.60.0.0/24","rangeStart":"10.60.0.$2","rangeEnd":"10.60.0.$3"}]]}}
EOF
}
brconf v100 10 49 ',"vlan":100' > /tmp/v100.json
brconf v200 50 99 ',"vlan":200,"preserveDefaultVlan":true' > /tmp/v200.json
brconf v100np 100 119 ',"vlan":100,"preserveDefaultVlan":false' > /tmp/v100np.json
brconf trunk 120 139 ',"vlanTrunk":[{"id":100},{"minID":300,"maxID":302}],"preserveDefaultVlan":false' > /tmp/trunk.json
brconf trunkp 140 159 ',"vlan":200,"vlanTrunk":[{"id":100}]' > /tmp/trunkp.json
nsreset va vb vc vn vt vp
V="bridge vlan"
t "$V: ADD va (vlan 100)" cni ADD va /run/netns/va eth0 /tmp/v100.json
t "$V: ADD vb (vlan 100)" cni ADD vb /run/netns/vb eth0 /tmp/v100.json
t "$V: ADD vc (vlan 200, preserveDefaultVlan true)" cni ADD vc /run/netns/vc eth0 /tmp/v200.json
t "$V: ADD vn (vlan 100, preserveDefaultVlan false)" cni ADD vn /run/netns/vn eth0 /tmp/v100np.json
t "$V: ADD vt (vlanTrunk 100, 300-302; preserveDefaultVlan false)" cni ADD vt /run/netns/vt eth0 /tmp/trunk.json
t "$V: ADD vp (vlan 200 + vlanTrunk 100)" cni ADD vp /run/netns/vp eth0 /tmp/trunkp.json
t "$V: the bridge has VLAN filtering on" sh -c "/sbin/ip -d link show brv | grep -q 'vlan_filtering 1'"
teq "$V: port of va: VLAN 100 PVID untagged only (VLAN 1 not preserved by default, as in v1.8.0+)" "100PU" "$(vlans_of "$(host_veth /tmp/res-va-eth0.json)")"
teq "$V: port of vc: VLAN 200 PVID untagged, VLAN 1 kept (preserveDefaultVlan true)" "1U 200PU" "$(vlans_of "$(host_veth /tmp/res-vc-eth0.json)")"
teq "$V: port of vn: VLAN 100 only" "100PU" "$(vlans_of "$(host_veth /tmp/res-vn-eth0.json)")"
teq "$V: port of vt: tagged 100, 300-302, VLAN 1 its untagged native VLAN" "1PU 100 300 301 302" "$(vlans_of "$(host_veth /tmp/res-vt-eth0.json)")"
teq "$V: port of vp: tagged 100, 200 PVID untagged, no VLAN 1" "100 200PU" "$(vlans_of "$(host_veth /tmp/res-vp-eth0.json)")"
A=$(addr_of /tmp/res-va-eth0.json); B=$(addr_of /tmp/res-vb-eth0.json); C=$(addr_of /tmp/res-vc-eth0.json)
N=$(addr_of /tmp/res-vn-eth0.json); P=$(addr_of /tmp/res-vp-eth0.json)
t "$V: va reaches vb (same VLAN)" ping_ok va "${B%/*}"
t "$V: va reaches vn (same VLAN)" ping_ok va "${N%/*}"
t "$V: va does not reach vc (VLAN 100 vs 200)" ping_no va "${C%/*}"
t "$V: vc reaches vp (VLAN 200 untagged)" ping_ok vc "${P%/*}"
t "$V: va does not reach vp untagged (vp's VLAN 100 is tagged)" ping_no va "${P%/*}"
# the trunk port talks VLAN 100 tagged: a vlan subinterface in vt reaches the VLAN-100 containers
# (host routes, so that they win over the subnet route of the untagged eth0)
ip -n vt link add link eth0 name eth0.100 type vlan id 100 && ip -n vt link set eth0.100 up
ip -n vt addr add 10.60.0.250/32 dev eth0.100 && ip -n vt addr add 10.61.0.1/24 dev eth0.100
ip -n vt route add "${A%/*}/32" dev eth0.100 src 10.60.0.250 && ip -n vt route add "${C%/*}/32" dev eth0.100 src 10.60.0.250
ip -n vt link add link eth0 name eth0.300 type vlan id 300 && ip -n vt addr add 10.65.0.1/24 dev eth0.300 && ip -n vt link set eth0.300 up
ip -n vp link add link eth0 name eth0.100 type vlan id 100 && ip -n vp addr add 10.61.0.2/24 dev eth0.100 && ip -n vp link set eth0.100 up
ip -n vp link add link eth0 name eth0.300 type vlan id 300 && ip -n vp addr add 10.65.0.2/24 dev eth0.300 && ip -n vp link set eth0.300 up
t "$V: trunk vt (tagged 100) reaches va (VLAN 100 untagged)" ping_ok vt "${A%/*}"
t "$V: trunk vt (tagged 100) does not reach vc (VLAN 200)" ping_no vt "${C%/*}"
t "$V: trunk vt (tagged 100) reaches trunk vp (tagged 100)" ping_ok vt 10.61.0.2
t "$V: VLAN 300 is on vt's port only: vt.300 does not reach vp.300" ping_no vt 10.65.0.2
for l in vt:eth0.100 vt:eth0.300 vp:eth0.100 vp:eth0.300; do ip -n ${l%%:*} link del ${l#*:} 2> /dev/null; done
for c in va vb vc vn vt vp; do
  case $c in va | vb) f=v100 ;; vc) f=v200 ;; vn) f=v100np ;; vt) f=trunk ;; vp) f=trunkp ;; esac
  t "$V: CHECK $c" chk $c /run/netns/$c eth0 /tmp/$f.json
done
VA=$(host_veth /tmp/res-va-eth0.json)
for c in va vb vc vn vt vp; do
  case $c in va | vb) f=v100 ;; vc) f=v200 ;; vn) f=v100np ;; vt) f=trunk ;; vp) f=trunkp ;; esac
  t "$V: DEL $c" del $c /run/netns/$c eth0 /tmp/$f.json
done
t "$V: host veth gone, no leases left" sh -c "! /sbin/ip link show $VA >/dev/null 2>&1 && ! /cni/cnikit ipamd leases --data-dir $IPAM_DIR --json | grep -q '10.60.0.'"
for c in va vb vc vn vt vp; do ip netns del $c; done
ip link del brv

# isGateway with a VLAN: the container on VLAN 100 must reach its gateway on the bridge
V="bridge vlan+isGateway"
cat > /tmp/vg.json << EOF
{"cniVersion":"1.0.0","name":"vgw","type":"bridge","bridge":"brg","isGateway":true,"vlan":100,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.62.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}
EOF
nsreset vg
t "$V: ADD" cni ADD vg /run/netns/vg eth0 /tmp/vg.json
t "$V: container reaches its gateway 10.62.0.1" ping_ok vg 10.62.0.1
t "$V: no IPv6 address on the pod's eth0 or its port" no_ipv6 vg "$(host_veth /tmp/res-vg-eth0.json)"
t "$V: CHECK" chk vg /run/netns/vg eth0 /tmp/vg.json
t "$V: DEL" del vg /run/netns/vg eth0 /tmp/vg.json
ip netns del vg
ip link del brg 2> /dev/null

# A bridge whose operator changed the VLAN new ports get (vlan_default_pvid 5): without
# preserveDefaultVlan that VLAN goes from the pod's port (the reference removes every VLAN a
# new port has), not VLAN 1; with it, it stays beside the pod's VLAN.
V="bridge vlan, default PVID 5"
ip link add brp type bridge vlan_filtering 1 vlan_default_pvid 5 && ip link set brp up
pvconf() { # N PRESERVE
  cat << EOF
{"cniVersion":"1.0.0","name":"pv$1","type":"bridge","bridge":"brp","vlan":100,"preserveDefaultVlan":$2,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.66.$1.0/24"}]]}}
EOF
}
pvconf 1 false > /tmp/pv1.json
pvconf 2 true > /tmp/pv2.json
nsreset pa pb
t "$V: ADD (preserveDefaultVlan false)" cni ADD pa /run/netns/pa eth0 /tmp/pv1.json
t "$V: ADD (preserveDefaultVlan true)" cni ADD pb /run/netns/pb eth0 /tmp/pv2.json
teq "$V: VLAN 5 removed: VLAN 100 PVID untagged only" "100PU" "$(vlans_of "$(host_veth /tmp/res-pa-eth0.json)")"
teq "$V: VLAN 5 kept (preserveDefaultVlan true)" "5U 100PU" "$(vlans_of "$(host_veth /tmp/res-pb-eth0.json)")"
t "$V: DEL" del pa /run/netns/pa eth0 /tmp/pv1.json
t "$V: DEL (preserved)" del pb /run/netns/pb eth0 /tmp/pv2.json
ip netns del pa; ip netns del pb; ip link del brp

# the reference bridge plugin (containernetworking-plugins 1.1.1: knows `vlan` only, and keeps
# VLAN 1 on the port, as v1.8.0+ does only with preserveDefaultVlan true) on the same VLAN
# shape: port membership must be the same as ours
if [ -x /ref/bridge ]; then
  V="bridge vlan vs reference"
  nsreset ra rb
  for p in 1 2; do
    cat > /tmp/rv$p.json << EOF
{"cniVersion":"1.0.0","name":"rv$p","type":"bridge","bridge":"brr$p","vlan":100,"isGateway":true,"ipam":{"type":"TYPE","dataDir":"$IPAM_DIR/ref","ranges":[[{"subnet":"10.63.$p.0/24"}]]}}
EOF
  done
  sed -i 's/TYPE/ipamd/; s/"vlan":100,/"vlan":100,"preserveDefaultVlan":true,/' /tmp/rv1.json
  sed -i 's/TYPE/host-local/' /tmp/rv2.json
  t "$V: ADD ours" cni ADD ra /run/netns/ra eth0 /tmp/rv1.json
  CNI_BIN=/ref
  t "$V: ADD reference" cni ADD rb /run/netns/rb eth0 /tmp/rv2.json
  CNI_BIN=/cni
  teq "$V: same port VLANs" "$(vlans_of "$(host_veth /tmp/res-rb-eth0.json)")" "$(vlans_of "$(host_veth /tmp/res-ra-eth0.json)")"
  t "$V: reference: container reaches its gateway" ping_ok rb 10.63.2.1
  t "$V: ours: container reaches its gateway" ping_ok ra 10.63.1.1
  # how each one reaches its gateway (printed for the record; not a test)
  ip -br -4 addr show | grep brr | sed 's/^/    addr: /'
  ip -br link show | grep brr | sed 's/^/    link: /'
  bridge vlan show | sed 's/^/    vlan: /'
  t "$V: DEL ours" del ra /run/netns/ra eth0 /tmp/rv1.json
  CNI_BIN=/ref
  t "$V: DEL reference" del rb /run/netns/rb eth0 /tmp/rv2.json
  CNI_BIN=/cni
  ip netns del ra; ip netns del rb
fi
