# Sourced by the VM's /init (busybox sh, Debian's stock kernel, modules loaded, lo up).
# Runs the CNI plugins exactly as a runtime does (CNI_* env + config on stdin) from /cni,
# where /cni/cnikit is the release binary; reads results with grep/sed (no python here).
# Sets $ok and $fail; /init prints "VM-RESULT $ok passed, $fail failed".
# Output: "ok - what" / "FAIL - what" followed by indented details.

# busybox sh runs its own applets before $PATH: force iproute2 (also in `sh -c` strings below)
ip() { /sbin/ip "$@"; }
bridge() { /sbin/bridge "$@"; }
ok=0
fail=0
IPAM_DIR=/run/ipam            # tmpfs
pass() { ok=$((ok + 1)); echo "ok - $*"; }
bad() { fail=$((fail + 1)); echo "FAIL - $*"; }
# t WHAT CMD...: passes if CMD succeeds; shows CMD's output when it does not
t() {
  _d=$1; shift
  if "$@" > /tmp/t.out 2>&1; then pass "$_d"; else bad "$_d"; sed 's/^/    /' /tmp/t.out | head -30; fi
}
# tn WHAT CMD...: passes if CMD fails
tn() {
  _d=$1; shift
  if "$@" > /tmp/t.out 2>&1; then bad "$_d (unexpectedly succeeded)"; sed 's/^/    /' /tmp/t.out | head -30; else pass "$_d"; fi
}
# teq WHAT EXPECTED ACTUAL
teq() {
  if [ "$2" = "$3" ]; then pass "$1"; else bad "$1"; echo "    expected: '$2'"; echo "    actual:   '$3'"; fi
}

# cni CMD CONTAINERID NETNS IFNAME CONF [CNI_ARGS]: run the plugin named by CONF's "type" from
# /cni like a runtime does; its stdout lands in /tmp/out.json (and in /tmp/res-ID-IFNAME.json
# after a successful ADD).
CNI_BIN=/cni
cni() {
  # the plugin's own "type" comes before the ipam section's
  _type=$(tr -d ' \n' < "$5" | grep -o '"type":"[^"]*"' | head -1 | cut -d'"' -f4)
  env -i PATH=/sbin:/bin CNI_COMMAND="$1" CNI_CONTAINERID="$2" CNI_NETNS="$3" CNI_IFNAME="$4" \
    CNI_PATH=$CNI_BIN CNI_ARGS="${6:-}" "$CNI_BIN/$_type" < "$5" > /tmp/out.json 2> /tmp/err.txt
  _rc=$?
  if [ $_rc != 0 ]; then
    echo "$1 $_type ($2) exit $_rc: $(cat /tmp/out.json) $(cat /tmp/err.txt)"
    return $_rc
  fi
  [ "$1" = ADD ] && tr -d '\n' < /tmp/out.json > "/tmp/res-$2-$4.json"
  [ "$1" = ADD ] && cat /tmp/out.json
  return 0
}
# with_prev CONF RESULT > CONF': the config with "prevResult" as a runtime sends it for CHECK/DEL
with_prev() {
  _c=$(cat "$1")
  _r=$(tr -d '\n' < "$2")
  printf '%s,"prevResult":%s}' "${_c%\}}" "$_r"
}
# chk / del ID NETNS IFNAME CONF: CHECK or DEL with the cached ADD result as prevResult
chk() { with_prev "$4" "/tmp/res-$1-$3.json" > /tmp/prev.json && cni CHECK "$1" "$2" "$3" /tmp/prev.json; }
del() {
  if [ -f "/tmp/res-$1-$3.json" ]; then with_prev "$4" "/tmp/res-$1-$3.json" > /tmp/prev.json; else cp "$4" /tmp/prev.json; fi
  cni DEL "$1" "$2" "$3" /tmp/prev.json
}
# first address (with prefix) of a result file
addr_of() { tr -d ' \n' < "$1" | grep -o '"address":"[^"]*"' | head -1 | cut -d'"' -f4; }
has() { tr -d ' \n' < "$1" | grep -q -- "$2"; }
lease_held() { /cni/cnikit ipamd leases --data-dir "$IPAM_DIR" --json | tr -d ' \n' | grep -q "\"address\":\"$1\""; }
no_lease() { ! lease_held "$1"; }
ping_ok() { ip netns exec "$1" ping -c 1 -W 3 "$2"; }
ping_no() { ! ip netns exec "$1" ping -c 1 -W 1 "$2"; }
nsreset() { for n in "$@"; do ip netns del "$n" 2> /dev/null; ip netns add "$n"; done; }
# result shape: cniVersion echoed; 0.4.0 IPs carry "version", 1.x IPs do not
shape_ok() { # RESULT VERSION
  has "$1" "\"cniVersion\":\"$2\"" || { echo "cniVersion is not $2"; return 1; }
  case $2 in
    0.*) has "$1" '"ips":\[{"version":"4"' || { echo "0.x IP without version"; return 1; } ;;
    *) ! has "$1" '"version":' || { echo "1.x result has a version key"; return 1; } ;;
  esac
  has "$1" '"interfaces":\[{"name":"' || { echo "no interfaces"; return 1; }
}
# VLANs of a bridge port as "VID[P][U] ...", P = PVID, U = egress untagged, ranges expanded
vlans_of() {
  bridge -j vlan show dev "$1" | tr -d ' \n' | grep -o '{"vlan":[^}]*}' | while read -r e; do
    s=$(echo "$e" | sed 's/^{"vlan":\([0-9]*\).*/\1/')
    en=$(echo "$e" | grep -o '"vlanEnd":[0-9]*' | cut -d: -f2)
    [ -n "$en" ] || en=$s
    f=
    case $e in *PVID*) f=P ;; esac
    case $e in *EgressUntagged*) f=${f}U ;; esac
    i=$s
    while [ "$i" -le "$en" ]; do echo "$i$f"; i=$((i + 1)); done
  done | tr '\n' ' ' | sed 's/ $//'
}
host_eth0_ok() {
  /sbin/ip -d link show eth0 | grep -q dummy && /sbin/ip -4 addr show eth0 | grep -q 'inet 192.0.2.10/24' \
    && [ "$(cat /sys/class/net/eth0/ifindex)" = "$HOST_ETH0" ] && /sbin/ip route show default | grep -q 'dev eth0'
}
host_veth() { tr -d ' \n' < "$1" | grep -o '"name":"[^"]*"' | sed -n 2p | cut -d'"' -f4; }
# no_ipv6 NETNS HOST-DEV: an IPv4-only pod's eth0 and its host end have no IPv6 address, not
# even a link-local one from the kernel (the plugins turn its generation off over netlink)
no_ipv6() {
  _p=$(/sbin/ip -n "$1" -6 -o addr show dev eth0); _h=$(/sbin/ip -6 -o addr show dev "$2")
  echo "pod: $_p"; echo "host end $2: $_h"
  [ -z "$_p$_h" ]
}

echo "== setup"
t "cnikit install --dir /cni creates the plugin links" /cni/cnikit install --dir /cni
t "links are symlinks to cnikit" sh -c 'for p in bridge macvlan ipvlan portmap ipamd; do [ -L /cni/$p ] || exit 1; done'
t "VERSION via a link lists 1.1.0" sh -c 'CNI_COMMAND=VERSION /cni/ipvlan < /dev/null | grep -q "1.1.0"'
t "no ipamd daemon runs in the guest" sh -c '[ ! -e /run/cnikit/ipamd.sock ]'
# The host holds its own eth0 (address, default route) as every real node does, and the pods
# below get CNI_IFNAME=eth0 too: on kernels that look up a new link's name in the sender's netns
# (even when IFLA_NET_NS_FD creates it elsewhere) a plugin creating the pod's eth0 straight from
# the host would fail with EEXIST here, and nowhere on a kernel without that quirk.
ip link add eth0 type dummy && ip addr add 192.0.2.10/24 dev eth0 && ip link set eth0 up
ip route add default via 192.0.2.1 dev eth0
HOST_ETH0=$(cat /sys/class/net/eth0/ifindex)
t "the host has its own eth0 with the default route" sh -c '/sbin/ip route show default | grep -q "via 192.0.2.1 dev eth0"'
# for the record (not a test): does `ip` itself hit the quirk on this kernel?
ip netns add kprobe
if ip link add eth0 netns kprobe link eth0 type macvlan 2> /dev/null; then
  echo "    kernel: a link created into another netns is named there only"
else
  echo "    kernel: a link created into another netns is also looked up by name in the sender's (EEXIST for eth0)"
fi
ip netns del kprobe

# ------------------------------------------------------------------ ipvlan
k=0
for v in 1.0.0 0.4.0; do
  for mode in l2 l3 l3s; do
    k=$((k + 1))
    V="ipvlan $mode $v"
    net=ipv-$mode-$(echo $v | tr -d .)
    ip link add ipvm type dummy && ip link set ipvm up
    cat > /tmp/ipv.json << EOF
{"cniVersion":"$v","name":"$net","type":"ipvlan","master":"ipvm","mode":"$mode","ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.50.$k.0/24"}]],"routes":[{"dst":"0.0.0.0/0"},{"dst":"192.168.$k.0/24","gw":"10.50.$k.254"}]}}
EOF
    # a second network on another subnet, same master: l3 routes between them, l2 does not
    sed -e "s/\"name\":\"$net\"/\"name\":\"$net-o\"/" -e "s/10\.50\.$k\./10.51.$k./g" /tmp/ipv.json > /tmp/ipv-o.json
    nsreset ipa ipb ipc
    t "$V: ADD a" cni ADD ipa-$k /run/netns/ipa eth0 /tmp/ipv.json
    t "$V: ADD b" cni ADD ipb-$k /run/netns/ipb eth0 /tmp/ipv.json
    t "$V: ADD c (other subnet)" cni ADD ipc-$k /run/netns/ipc eth0 /tmp/ipv-o.json
    RA=/tmp/res-ipa-$k-eth0.json
    A=$(addr_of $RA); B=$(addr_of /tmp/res-ipb-$k-eth0.json); C=$(addr_of /tmp/res-ipc-$k-eth0.json)
    t "$V: result shape" shape_ok $RA $v
    t "$V: result interface eth0 in the sandbox" has $RA "\"interfaces\":\[{\"name\":\"eth0\",\"mac\":\"[0-9a-f:]*\",\"sandbox\":\"/run/netns/ipa\"}"
    t "$V: result address and gateway from ipamd" has $RA "\"address\":\"10.50.$k.[0-9]*/24\",\"gateway\":\"10.50.$k.1\""
    t "$V: kernel: eth0 is ipvlan mode $mode" sh -c "/sbin/ip -n ipa -d link show eth0 | grep -qE 'ipvlan +mode $mode( |\$)'"
    t "$V: kernel: eth0 is up with $A" sh -c "/sbin/ip -n ipa link show eth0 | grep -qE '[<,]UP[,>]' && /sbin/ip -n ipa -4 addr show eth0 | grep -q 'inet $A '"
    t "$V: routes: default via 10.50.$k.1" sh -c "/sbin/ip -n ipa route show default | grep -q 'via 10.50.$k.1 dev eth0'"
    t "$V: routes: 192.168.$k.0/24 via 10.50.$k.254" sh -c "/sbin/ip -n ipa route show 192.168.$k.0/24 | grep -q 'via 10.50.$k.254 dev eth0'"
    t "$V: routes: the subnet is on-link" sh -c "/sbin/ip -n ipa route show 10.50.$k.0/24 | grep -q 'dev eth0 proto kernel'"
    t "$V: ipamd lease held for $A (in-process, no daemon)" lease_held "${A%/*}"
    t "$V: a reaches b on the same master" ping_ok ipa "${B%/*}"
    case $mode in
      l2) t "$V: a does not reach c on another subnet (no L3 forwarding in l2)" ping_no ipa "${C%/*}" ;;
      *) t "$V: a reaches c on another subnet through its default route (L3 mode)" ping_ok ipa "${C%/*}" ;;
    esac
    t "$V: CHECK a" chk ipa-$k /run/netns/ipa eth0 /tmp/ipv.json
    ip -n ipa route del 192.168.$k.0/24 2> /dev/null
    tn "$V: CHECK a fails once a result route is gone" chk ipa-$k /run/netns/ipa eth0 /tmp/ipv.json
    t "$V: DEL a" del ipa-$k /run/netns/ipa eth0 /tmp/ipv.json
    t "$V: DEL b" del ipb-$k /run/netns/ipb eth0 /tmp/ipv.json
    t "$V: DEL c" del ipc-$k /run/netns/ipc eth0 /tmp/ipv-o.json
    t "$V: links gone after DEL" sh -c 'for n in ipa ipb ipc; do ! /sbin/ip -n $n link show eth0 >/dev/null 2>&1 || exit 1; done'
    t "$V: leases released after DEL" sh -c "! /cni/cnikit ipamd leases --data-dir $IPAM_DIR --json | grep -q '10.5[01].$k.'"
    t "$V: DEL a again (idempotent)" del ipa-$k /run/netns/ipa eth0 /tmp/ipv.json
    ip netns del ipa; ip netns del ipb; ip netns del ipc; ip link del ipvm
  done
done

# ipvlan and macvlan with linkInContainer: the master is inside the container's netns
for type in ipvlan macvlan; do
  V="$type linkInContainer"
  nsreset lic
  ip -n lic link add m0 type dummy && ip -n lic link set m0 up
  cat > /tmp/lic.json << EOF
{"cniVersion":"1.0.0","name":"lic-$type","type":"$type","master":"m0","linkInContainer":true,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.52.0.0/24"}]]}}
EOF
  sed 's/"linkInContainer":true/"linkInContainer":false/' /tmp/lic.json > /tmp/lic-no.json
  tn "$V: without linkInContainer the master is looked up on the host (and missing)" cni ADD lic-no /run/netns/lic eth0 /tmp/lic-no.json
  t "$V: ADD eth0" cni ADD lic-1 /run/netns/lic eth0 /tmp/lic.json
  t "$V: eth0 is a $type on m0 inside the container" sh -c "/sbin/ip -n lic -d link show eth0 | grep -q '@m0' && /sbin/ip -n lic -d link show eth0 | grep -q '$type'"
  t "$V: eth0 has its address" sh -c "/sbin/ip -n lic -4 addr show eth0 | grep -q 'inet $(addr_of /tmp/res-lic-1-eth0.json) '"
  t "$V: CHECK" chk lic-1 /run/netns/lic eth0 /tmp/lic.json
  t "$V: DEL" del lic-1 /run/netns/lic eth0 /tmp/lic.json
  t "$V: eth0 gone, m0 kept" sh -c "! /sbin/ip -n lic link show eth0 >/dev/null 2>&1 && /sbin/ip -n lic link show m0 >/dev/null"
  ip netns del lic
done

# DEL when the master is gone (the kernel removed the child with it), or the netns is gone
for type in ipvlan macvlan; do
  V="$type DEL"
  nsreset g1 g2
  ip link add gm0 type dummy && ip link set gm0 up
  cat > /tmp/g.json << EOF
{"cniVersion":"1.0.0","name":"gone-$type","type":"$type","master":"gm0","ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.53.0.0/24"}]]}}
EOF
  t "$V: ADD g1" cni ADD g1 /run/netns/g1 eth0 /tmp/g.json
  t "$V: ADD g2" cni ADD g2 /run/netns/g2 eth0 /tmp/g.json
  G1=$(addr_of /tmp/res-g1-eth0.json); G2=$(addr_of /tmp/res-g2-eth0.json)
  ip link del gm0
  t "$V: the master is gone" sh -c '! /sbin/ip link show gm0 >/dev/null 2>&1'
  t "$V: DEL with the master gone succeeds" del g1 /run/netns/g1 eth0 /tmp/g.json
  t "$V: ... and released the lease" no_lease "${G1%/*}"
  ip netns del g2
  t "$V: DEL with the netns gone succeeds" del g2 /run/netns/g2 eth0 /tmp/g.json
  t "$V: ... and released the lease" no_lease "${G2%/*}"
  t "$V: DEL with an empty CNI_NETNS succeeds" del g2 "" eth0 /tmp/g.json
  ip netns del g1
done

# No master: the host's default-route link, its eth0, becomes the master of the pod's eth0. An
# eth0 already in the pod is code 102 before anything is created or leased.
for type in ipvlan macvlan; do
  V="$type on the host's eth0"
  nsreset d1 d2
  cat > /tmp/d.json << EOF
{"cniVersion":"1.0.0","name":"dflt-$type","type":"$type","ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.55.0.0/24"}]]}}
EOF
  t "$V: ADD without master" cni ADD d1 /run/netns/d1 eth0 /tmp/d.json
  t "$V: the pod's eth0 is a $type whose master is the host's eth0" sh -c "/sbin/ip -n d1 -d link show eth0 | grep -q '^[0-9]*: eth0@if$HOST_ETH0:' && /sbin/ip -n d1 -d link show eth0 | grep -qE '$type +mode'"
  t "$V: CHECK" chk d1 /run/netns/d1 eth0 /tmp/d.json
  ip -n d2 link add eth0 type dummy
  tn "$V: ADD where the pod already has an eth0 fails" cni ADD d2 /run/netns/d2 eth0 /tmp/d.json
  t "$V: ... with code 102" has /tmp/out.json '"code":102'
  t "$V: ... leaving the pod's eth0 alone and creating nothing" sh -c "/sbin/ip -n d2 -d link show eth0 | grep -q dummy && [ \$(/sbin/ip -n d2 -o link | wc -l) = 2 ]"
  t "$V: ... and leasing nothing" sh -c "[ \$(/cni/cnikit ipamd leases --data-dir $IPAM_DIR --network dflt-$type --json | grep -c '\"address\"') = 1 ]"
  t "$V: DEL" del d1 /run/netns/d1 eth0 /tmp/d.json
  t "$V: the host's eth0 is untouched" host_eth0_ok
  ip netns del d1; ip netns del d2
done

# ------------------------------------------------------------------ macvlan modes on a dummy master
for v in 1.0.0 0.4.0; do
  for mode in bridge private vepa passthru; do
    k=$((k + 1))
    V="macvlan $mode $v"
    ip link add mvm type dummy && ip link set mvm up
    cat > /tmp/mv.json << EOF
{"cniVersion":"$v","name":"mv-$mode-$k","type":"macvlan","master":"mvm","mode":"$mode","ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.54.$k.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}
EOF
    nsreset ma mb
    t "$V: ADD a" cni ADD ma-$k /run/netns/ma eth0 /tmp/mv.json
    RA=/tmp/res-ma-$k-eth0.json
    A=$(addr_of $RA)
    t "$V: result shape" shape_ok $RA $v
    t "$V: kernel: eth0 is macvlan mode $mode" sh -c "/sbin/ip -n ma -d link show eth0 | grep -qE 'macvlan +mode $mode( |\$)'"
    t "$V: kernel: eth0 up with $A, default route" sh -c "/sbin/ip -n ma link show eth0 | grep -qE '[<,]UP[,>]' && /sbin/ip -n ma -4 addr show eth0 | grep -q 'inet $A ' && /sbin/ip -n ma route show default | grep -q 'via 10.54.$k.1 dev eth0'"
    t "$V: result MAC is the kernel's" sh -c "/sbin/ip -n ma link show eth0 | grep -q \"link/ether \$(tr -d ' \n' < $RA | grep -o '\"mac\":\"[^\"]*\"' | head -1 | cut -d'\"' -f4) \""
    if [ $mode = passthru ]; then
      tn "$V: a second passthru child on the same master is refused" cni ADD mb-$k /run/netns/mb eth0 /tmp/mv.json
      t "$V: ... and its lease was rolled back" sh -c "[ \$(/cni/cnikit ipamd leases --data-dir $IPAM_DIR --network mv-$mode-$k --json | grep -c '\"address\"') = 1 ]"
    else
      t "$V: ADD b" cni ADD mb-$k /run/netns/mb eth0 /tmp/mv.json
      B=$(addr_of /tmp/res-mb-$k-eth0.json)
      case $mode in
        bridge) t "$V: a reaches b (bridge mode switches between children)" ping_ok ma "${B%/*}" ;;
        private) t "$V: a does not reach b (private)" ping_no ma "${B%/*}" ;;
        vepa) t "$V: a does not reach b (vepa: hairpin needs an external switch; dummy drops)" ping_no ma "${B%/*}" ;;
      esac
      t "$V: DEL b" del mb-$k /run/netns/mb eth0 /tmp/mv.json
    fi
    t "$V: CHECK a" chk ma-$k /run/netns/ma eth0 /tmp/mv.json
    t "$V: DEL a" del ma-$k /run/netns/ma eth0 /tmp/mv.json
    t "$V: links gone, leases released" sh -c "! /sbin/ip -n ma link show eth0 >/dev/null 2>&1 && ! /cni/cnikit ipamd leases --data-dir $IPAM_DIR --json | grep -q '10.54.$k.'"
    ip netns del ma; ip netns del mb; ip link del mvm
  done
done
# macvlan without IPAM: L2 only
nsreset ml
ip link add mvm type dummy && ip link set mvm up
echo '{"cniVersion":"1.0.0","name":"mv-l2","type":"macvlan","master":"mvm"}' > /tmp/mvl2.json
t "macvlan no IPAM: ADD" cni ADD ml /run/netns/ml eth0 /tmp/mvl2.json
t "macvlan no IPAM: no IPs in the result, link up without IPv4" sh -c "! grep -q '\"address\"' /tmp/res-ml-eth0.json && /sbin/ip -n ml link show eth0 | grep -qE '[<,]UP[,>]' && ! /sbin/ip -n ml -4 addr show eth0 | grep -q inet"
t "macvlan no IPAM: CHECK" chk ml /run/netns/ml eth0 /tmp/mvl2.json
t "macvlan no IPAM: DEL" del ml /run/netns/ml eth0 /tmp/mvl2.json
ip netns del ml; ip link del mvm

. /bridge_vlans.sh

# enabledad: the pod's IPv6 addresses go through DAD (its end of the veth comes up dormant, and
# the kernel's link-watch work makes it ready for DAD after the plugin's request)
V="bridge enabledad"
cat > /tmp/vd.json << EOF
{"cniVersion":"1.0.0","name":"vdad","type":"bridge","bridge":"brd","isGateway":true,"enabledad":true,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"fd62::/64"}]]}}
EOF
nsreset vd
t "$V: ADD" cni ADD vd /run/netns/vd eth0 /tmp/vd.json
t "$V: the pod's addresses are tentative, without nodad" sh -c "/sbin/ip -n vd -6 -o addr show dev eth0 | tee /dev/stderr | grep -q tentative && ! /sbin/ip -n vd -6 -o addr show dev eth0 | grep -q nodad"
dad_done() { for _i in $(seq 50); do [ -z "$(/sbin/ip -n vd -6 -o addr show dev eth0 tentative)" ] && return 0; sleep 0.1; done; /sbin/ip -n vd -6 addr; return 1; }
t "$V: DAD is done within 5 s" dad_done
t "$V: the pod reaches its gateway fd62::1" ping_ok vd fd62::1
t "$V: DEL" del vd /run/netns/vd eth0 /tmp/vd.json
ip netns del vd
ip link del brd 2> /dev/null

# ------------------------------------------------------------------ ipamd, in-process (no daemon)
V="ipamd in-process"
cat > /tmp/ipam.json << EOF
{"cniVersion":"1.1.0","name":"ipamonly","type":"ipamd","ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","socket":"/run/cnikit/none.sock","ranges":[[{"subnet":"10.70.0.0/24"}],[{"subnet":"fd70::/64"}]],"routes":[{"dst":"0.0.0.0/0"}]}}
EOF
t "$V: ADD (dual stack) with the socket missing" cni ADD i1 /run/netns/none eth0 /tmp/ipam.json
t "$V: result has a v4 and a v6 address" sh -c "grep -q '10.70.0.' /tmp/res-i1-eth0.json && grep -q 'fd70::' /tmp/res-i1-eth0.json"
I1=$(addr_of /tmp/res-i1-eth0.json)
cp /tmp/res-i1-eth0.json /tmp/first.json
t "$V: ADD again" cni ADD i1 /run/netns/none eth0 /tmp/ipam.json
teq "$V: ... returns the same result" "$(cat /tmp/first.json)" "$(cat /tmp/res-i1-eth0.json)"
t "$V: CNI_ARGS IP= requests an address" cni ADD i2 /run/netns/none eth0 /tmp/ipam.json "IP=10.70.0.77"
t "$V: ... and gets it" grep -q '10.70.0.77/24' /tmp/res-i2-eth0.json
tn "$V: the same address for another container is refused" cni ADD i3 /run/netns/none eth0 /tmp/ipam.json "IP=10.70.0.77"
t "$V: lease held" lease_held "${I1%/*}"
t "$V: store files under dataDir on tmpfs" sh -c "ls -R $IPAM_DIR/ipamonly | grep -q . && grep -q ' /run tmpfs' /proc/mounts"
t "$V: CHECK" chk i1 /run/netns/none eth0 /tmp/ipam.json
t "$V: DEL i1" del i1 /run/netns/none eth0 /tmp/ipam.json
t "$V: ... lease released" no_lease "${I1%/*}"
sed 's/}$/,"cni.dev\/valid-attachments":[]}/' /tmp/ipam.json > /tmp/gc.json
t "$V: GC with no valid attachments" cni GC "" "" "" /tmp/gc.json
t "$V: ... frees i2's lease" no_lease 10.70.0.77
t "$V: STATUS" cni STATUS "" "" "" /tmp/ipam.json

# ------------------------------------------------------------------ dummy, with ipamd and with static
# The pod's eth0 is a dummy link (next to the host's own eth0, a dummy as well); addresses are
# read back with `ip -j`. This kernel has dummy links (the CI machine's has not: ADD is 101 there).
# ipj_addrs NETNS DEV: "addr/prefix" of DEV's global addresses, sorted, space separated
ipj_addrs() {
  ip -n "$1" -j addr show dev "$2" | tr -d ' \n' | grep -o '"local":"[^"]*","prefixlen":[0-9]*' \
    | sed 's/"local":"\([^"]*\)","prefixlen":\([0-9]*\)/\1\/\2/' | grep -v '^fe80' | sort | tr '\n' ' ' | sed 's/ $//'
}
# res_addrs RESULT: the same for a result file
res_addrs() { tr -d ' \n' < "$1" | grep -o '"address":"[^"]*"' | cut -d'"' -f4 | sort | tr '\n' ' ' | sed 's/ $//'; }
dn=0  # not $n: nsreset uses that
for v in 1.1.0 0.4.0; do
  dn=$((dn + 1))
  V="dummy + ipamd $v"
  cat > /tmp/dm.json << EOF
{"cniVersion":"$v","name":"dm-$dn","type":"dummy","ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.85.$dn.0/24"}],[{"subnet":"fd85:$dn::/64"}]],"routes":[{"dst":"0.0.0.0/0"}]}}
EOF
  nsreset dm dm2
  RD=/tmp/res-dm-$dn-eth0.json
  [ $v = 1.1.0 ] && t "$V: STATUS (the kernel has dummy links)" cni STATUS "" "" "" /tmp/dm.json
  t "$V: ADD" cni ADD dm-$dn /run/netns/dm eth0 /tmp/dm.json
  t "$V: result shape" shape_ok $RD $v
  t "$V: result interface eth0 in the sandbox" has $RD "\"interfaces\":\[{\"name\":\"eth0\",\"mac\":\"[0-9a-f:]*\",\"sandbox\":\"/run/netns/dm\"}"
  t "$V: kernel: eth0 is a dummy, up" sh -c "/sbin/ip -n dm -d link show eth0 | grep -qw dummy && /sbin/ip -n dm link show eth0 | grep -qE '[<,]UP[,>]'"
  teq "$V: ip -j: eth0 has exactly the result's addresses" "$(res_addrs $RD)" "$(ipj_addrs dm eth0)"
  t "$V: result MAC is the kernel's" sh -c "/sbin/ip -n dm link show eth0 | grep -q \"link/ether \$(tr -d ' \n' < $RD | grep -o '\"mac\":\"[^\"]*\"' | head -1 | cut -d'\"' -f4) \""
  t "$V: default route via 10.85.$dn.1" sh -c "/sbin/ip -n dm route show default | grep -q 'via 10.85.$dn.1 dev eth0'"
  A=$(addr_of $RD)
  t "$V: lease held for $A" lease_held "${A%/*}"
  t "$V: CHECK" chk dm-$dn /run/netns/dm eth0 /tmp/dm.json
  ip -n dm addr del "$A" dev eth0
  tn "$V: CHECK fails once an address is gone" chk dm-$dn /run/netns/dm eth0 /tmp/dm.json
  t "$V: DEL" del dm-$dn /run/netns/dm eth0 /tmp/dm.json
  t "$V: eth0 gone, leases released" sh -c "! /sbin/ip -n dm link show eth0 > /dev/null 2>&1 && ! /cni/cnikit ipamd leases --data-dir $IPAM_DIR --json | grep -q '10.85.$dn.'"
  t "$V: DEL again" del dm-$dn /run/netns/dm eth0 /tmp/dm.json
  t "$V: ADD in a second pod" cni ADD dm2-$dn /run/netns/dm2 eth0 /tmp/dm.json
  ip netns del dm2
  t "$V: DEL with the netns gone" del dm2-$dn /run/netns/dm2 eth0 /tmp/dm.json
  t "$V: ... released the leases" sh -c "! /cni/cnikit ipamd leases --data-dir $IPAM_DIR --json | grep -q '10.85.$dn.'"
  ip netns del dm
done
V="dummy + static"
cat > /tmp/dms.json << 'EOF'
{"cniVersion":"1.1.0","name":"dms","type":"dummy","ipam":{"type":"static","addresses":[{"address":"10.86.0.5/24","gateway":"10.86.0.1"},{"address":"fd86::5/64"}],"routes":[{"dst":"0.0.0.0/0"},{"dst":"192.168.86.0/24","gw":"10.86.0.2"}]}}
EOF
nsreset dms
ip -n dms link set lo up
t "$V: ADD" cni ADD dms /run/netns/dms eth0 /tmp/dms.json
teq "$V: ip -j: eth0 has exactly the static addresses" "10.86.0.5/24 fd86::5/64" "$(ipj_addrs dms eth0)"
t "$V: the static routes" sh -c "/sbin/ip -n dms route show default | grep -q 'via 10.86.0.1 dev eth0' && /sbin/ip -n dms route show 192.168.86.0/24 | grep -q 'via 10.86.0.2 dev eth0'"
t "$V: the pod reaches its own address" ping_ok dms 10.86.0.5
t "$V: CHECK" chk dms /run/netns/dms eth0 /tmp/dms.json
t "$V: DEL" del dms /run/netns/dms eth0 /tmp/dms.json
t "$V: eth0 gone" sh -c '! /sbin/ip -n dms link show eth0 > /dev/null 2>&1'
t "$V: DEL again" del dms /run/netns/dms eth0 /tmp/dms.json
cat > /tmp/dmsa.json << 'EOF'
{"cniVersion":"1.1.0","name":"dmsa","type":"dummy","ipam":{"type":"static","routes":[{"dst":"0.0.0.0/0"}]}}
EOF
t "$V: addresses from CNI_ARGS IP and GATEWAY (dummy hands them on)" cni ADD dmsa /run/netns/dms eth0 /tmp/dmsa.json "IP=10.87.0.9/24;GATEWAY=10.87.0.1"
teq "$V: ... the pod has just 10.87.0.9/24" "10.87.0.9/24" "$(ipj_addrs dms eth0)"
t "$V: ... and its default route via 10.87.0.1" sh -c "/sbin/ip -n dms route show default | grep -q 'via 10.87.0.1 dev eth0'"
t "$V: ... DEL" cni DEL dmsa /run/netns/dms eth0 /tmp/dmsa.json
ip netns del dms

# ------------------------------------------------------------------ tuning, chained after bridge
# Link flags as the kernel reports them (promisc, allmulti) and sysctls in the pod's netns.
V="tuning"
cat > /tmp/tubr.json << EOF
{"cniVersion":"1.0.0","name":"tun","type":"bridge","bridge":"brt","ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.84.0.0/24"}]]}}
EOF
cat > /tmp/tu.json << 'EOF'
{"cniVersion":"1.0.0","name":"tun","type":"tuning","dataDir":"/run/tuning","sysctl":{"net.ipv4.conf.IFNAME.arp_notify":"1","net.core.somaxconn":"1000"},"mac":"0a:58:0a:54:00:99","mtu":1400,"promisc":true,"allmulti":true,"txQLen":2000}
EOF
nsreset tu
t "$V: ADD bridge" cni ADD tu /run/netns/tu eth0 /tmp/tubr.json
MAC0=$(ip -n tu -j link show eth0 | tr -d ' \n' | grep -o '"address":"[^"]*"' | head -1 | cut -d'"' -f4)
cp /tmp/res-tu-eth0.json /tmp/tubr-res.json
with_prev /tmp/tu.json /tmp/tubr-res.json > /tmp/tuprev.json
t "$V: ADD" cni ADD tu /run/netns/tu eth0 /tmp/tuprev.json
t "$V: the result carries the new MAC" grep -q '0a:58:0a:54:00:99' /tmp/out.json
t "$V: mtu 1400, the MAC, txqlen 2000" sh -c "/sbin/ip -n tu -j link show eth0 | tr -d ' \n' | grep '\"mtu\":1400' | grep '\"address\":\"0a:58:0a:54:00:99\"' | grep -q '\"txqlen\":2000'"
t "$V: PROMISC and ALLMULTI set" sh -c "/sbin/ip -n tu link show eth0 | grep -q 'PROMISC' && /sbin/ip -n tu link show eth0 | grep -q 'ALLMULTI'"
teq "$V: arp_notify of the pod's eth0" 1 "$(ip netns exec tu cat /proc/sys/net/ipv4/conf/eth0/arp_notify)"
teq "$V: net.core.somaxconn in the pod" 1000 "$(ip netns exec tu cat /proc/sys/net/core/somaxconn)"
t "$V: CHECK" cni CHECK tu /run/netns/tu eth0 /tmp/tuprev.json
ip -n tu link set eth0 mtu 1300
tn "$V: CHECK fails once the MTU is changed by hand" cni CHECK tu /run/netns/tu eth0 /tmp/tuprev.json
ip -n tu link set eth0 mtu 1400
t "$V: DEL" cni DEL tu /run/netns/tu eth0 /tmp/tuprev.json
t "$V: ... restores mtu 1500 and the MAC" sh -c "/sbin/ip -n tu -j link show eth0 | tr -d ' \n' | grep '\"mtu\":1500' | grep -q '\"address\":\"$MAC0\"'"
tn "$V: ... and promisc and allmulti are off" sh -c "/sbin/ip -n tu link show eth0 | grep -E -q 'PROMISC|ALLMULTI'"
t "$V: DEL again" cni DEL tu /run/netns/tu eth0 /tmp/tuprev.json
t "$V: DEL bridge" del tu /run/netns/tu eth0 /tmp/tubr.json
ip netns del tu
ip link del brt 2> /dev/null

# ------------------------------------------------------------------ nftables and tc
. /netfilter.sh

# ------------------------------------------------------------------ the host afterwards
t "the host's eth0 kept its index, address and default route through every case" host_eth0_ok
