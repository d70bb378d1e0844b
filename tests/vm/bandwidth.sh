# Sourced by the VM's /init after tests/vm/guest.sh (its helpers: cni, chk, del, t, tn, teq,
# nsreset, has): bandwidth on interfaces without a host end, shaped inside the pod's netns, on
# the kinds this kernel has and the CI machine's lacks: ipvlan (l2, l3; l3s refuses an ingress
# limit, which its receive path would bypass), dummy and vlan. For each: the layout read back
# with `tc -j` in the pod (a root tbf on eth0 at the egress rate, an ingress qdisc whose filter
# redirects to an ifb in the pod, whose root tbf has the ingress rate), CHECK, DEL (twice, and
# with the netns gone). Then iperf3 (copied in by run.sh) from an ipvlan l2 pod to a server
# namespace behind its master, both ways, at two rates: within ±10 % of the configured rate.

tc() { /sbin/tc "$@"; }
# bw_conf FILE NET IN-BIT/S OUT-BIT/S: bandwidth's config, bursts 20 ms at the rate
bw_conf() {
  echo '{"cniVersion":"1.0.0","name":"'$2'","type":"bandwidth","ingressRate":'$3',"ingressBurst":'$(($3 / 50))',"egressRate":'$4',"egressBurst":'$(($4 / 50))'}' > "$1"
}
# bw_chain CMD ID NETNS CONF PREV: a chained call with prevResult
bw_chain() { with_prev "$4" "$5" > /tmp/bwc.json && cni "$1" "$2" "$3" eth0 /tmp/bwc.json; }
# pod_ifb RESULT: the ifb the result reports in the pod (its last interface)
pod_ifb() { tr -d ' \n' < "$1" | grep -o '"name":"bwi[0-9a-f]*"' | tail -1 | cut -d'"' -f4; }
# tbf_rate NETNS DEV: the rate (bytes/s) of DEV's root tbf in NETNS
tbf_rate() { tc -n "$1" -j qdisc show dev "$2" | tr -d ' \n' | grep -o '"kind":"tbf"[^}]*"rate":[0-9]*' | grep -o '[0-9]*$'; }
# redirects NETNS IFB: eth0's ingress filter redirects to IFB (mirred, stolen)
redirects() {
  _f=$(tc -n "$1" -j filter show dev eth0 ingress | tr -d ' \n')
  echo "$_f" | grep -q "\"to_dev\":\"$2\"" && echo "$_f" | grep -q '"type":"stolen"'
}
# unshaped NETNS IFB: no tbf or ingress qdisc on eth0, no IFB
unshaped() {
  ! tc -n "$1" -j qdisc show dev eth0 | grep -qE '"kind":"(tbf|ingress)"' && ! ip -n "$1" link show "$2" 2> /dev/null
}

# in_pod KIND NET CONF: the pod of CONF in netns bwp, shaped (8 Mbit/s in, 4 out), checked, DELed
in_pod() {
  V="bandwidth in the pod: $1"
  nsreset bwp
  t "$V: ADD the pod" cni ADD bwp1 /run/netns/bwp eth0 "$3"
  bw_conf /tmp/bwk.json "$2" 8000000 4000000
  t "$V: ADD bandwidth" bw_chain ADD bwp1 /run/netns/bwp /tmp/bwk.json /tmp/res-bwp1-eth0.json
  cp /tmp/out.json /tmp/bwk-res.json
  _ifb=$(pod_ifb /tmp/bwk-res.json)
  t "$V: the result reports the ifb in the pod" has /tmp/bwk-res.json "\"name\":\"$_ifb\",\"mac\":\"[0-9a-f:]*\",\"sandbox\":\"/run/netns/bwp\""
  teq "$V: eth0's root tbf has the egress rate (bytes/s)" 500000 "$(tbf_rate bwp eth0)"
  teq "$V: the ifb's root tbf has the ingress rate (bytes/s)" 1000000 "$(tbf_rate bwp "$_ifb")"
  t "$V: eth0's ingress is redirected to the ifb" redirects bwp "$_ifb"
  teq "$V: no ifb on the host" "" "$(ip -o link show type ifb)"
  t "$V: CHECK" bw_chain CHECK bwp1 /run/netns/bwp /tmp/bwk.json /tmp/bwk-res.json
  tc -n bwp qdisc change dev eth0 root handle 1: tbf rate 1mbit burst 10000 latency 25ms
  tn "$V: CHECK fails once the rate changed" bw_chain CHECK bwp1 /run/netns/bwp /tmp/bwk.json /tmp/bwk-res.json
  t "$V: DEL" bw_chain DEL bwp1 /run/netns/bwp /tmp/bwk.json /tmp/bwk-res.json
  t "$V: ... the pod is unshaped" unshaped bwp "$_ifb"
  t "$V: DEL again" bw_chain DEL bwp1 /run/netns/bwp /tmp/bwk.json /tmp/bwk-res.json
  t "$V: ADD again" bw_chain ADD bwp1 /run/netns/bwp /tmp/bwk.json /tmp/res-bwp1-eth0.json
  ip netns del bwp
  t "$V: DEL with the netns gone" bw_chain DEL bwp1 /run/netns/bwp /tmp/bwk.json /tmp/bwk-res.json
  t "$V: DEL with the netns gone, again" bw_chain DEL bwp1 /run/netns/bwp /tmp/bwk.json /tmp/bwk-res.json
  t "$V: DEL the pod" del bwp1 /run/netns/bwp eth0 "$3"
  rm -f /tmp/res-bwp1-eth0.json
}

BW_IPAM='"ipam":{"type":"static","addresses":[{"address":"10.60.0.5/24"}]}'
ip link add bwm type dummy && ip link set bwm up
for mode in l2 l3; do
  echo '{"cniVersion":"1.0.0","name":"bw-ipv","type":"ipvlan","master":"bwm","mode":"'$mode'",'"$BW_IPAM"'}' > /tmp/bwpod.json
  in_pod "ipvlan $mode" bw-ipv /tmp/bwpod.json
done
V="bandwidth in the pod: ipvlan l3s"
echo '{"cniVersion":"1.0.0","name":"bw-ipv","type":"ipvlan","master":"bwm","mode":"l3s",'"$BW_IPAM"'}' > /tmp/bwpod.json
nsreset bwp
t "$V: ADD the pod" cni ADD bwp1 /run/netns/bwp eth0 /tmp/bwpod.json
bw_conf /tmp/bwk.json bw-ipv 8000000 4000000
tn "$V: an ingress limit is refused" bw_chain ADD bwp1 /run/netns/bwp /tmp/bwk.json /tmp/res-bwp1-eth0.json
t "$V: ... with code 7 naming l3s" sh -c 'grep -q "\"code\":7" /tmp/out.json && grep -q l3s /tmp/out.json'
t "$V: ... and leaves the pod unshaped" unshaped bwp none
bw_conf /tmp/bwk.json bw-ipv 0 4000000
t "$V: an egress limit alone is shaped" bw_chain ADD bwp1 /run/netns/bwp /tmp/bwk.json /tmp/res-bwp1-eth0.json
teq "$V: ... eth0's root tbf has the egress rate" 500000 "$(tbf_rate bwp eth0)"
t "$V: DEL" bw_chain DEL bwp1 /run/netns/bwp /tmp/bwk.json /tmp/res-bwp1-eth0.json
t "$V: DEL the pod" del bwp1 /run/netns/bwp eth0 /tmp/bwpod.json
ip netns del bwp
rm -f /tmp/res-bwp1-eth0.json
echo '{"cniVersion":"1.0.0","name":"bw-dm","type":"dummy",'"$BW_IPAM"'}' > /tmp/bwpod.json
in_pod dummy bw-dm /tmp/bwpod.json
echo '{"cniVersion":"1.0.0","name":"bw-vl","type":"vlan","master":"bwm","vlanId":42,'"$BW_IPAM"'}' > /tmp/bwpod.json
in_pod vlan bw-vl /tmp/bwpod.json
ip link del bwm

# ------------------------------------------------------------------ ipvlan rates, iperf3
# The master is a veth end whose peer is a server's srv0 (10.60.0.2) in netns bws (made here
# and moved: this kernel looks a new link's name up here too, where eth0 is taken).
nsreset bws bwp
ip link del bwm 2> /dev/null
ip link add bwm type veth peer name srv0 && ip link set srv0 netns bws
ip link set bwm up
ip -n bws addr add 10.60.0.2/24 dev srv0 && ip -n bws link set srv0 up && ip -n bws link set lo up
echo '{"cniVersion":"1.0.0","name":"bw-rate","type":"ipvlan","master":"bwm","mode":"l2",'"$BW_IPAM"'}' > /tmp/bwpod.json
V="bandwidth ipvlan l2 rates"
t "$V: ADD the pod" cni ADD bwr /run/netns/bwp eth0 /tmp/bwpod.json
# iperf_bps [-R]: bit/s the receiver saw in a 2 s iperf3 run (1 s left out) from the pod;
# a run that reports nothing (its one-off server not up yet, or gone) is run again, twice
# at most, with a new server.
iperf_bps() {
  local bps=
  for _ in 1 2 3; do
    bps=$(iperf_once "$@")
    [ -n "$bps" ] && break
  done
  echo "$bps"
}
iperf_once() {
  ip netns exec bws iperf3 -s -1 -p 5201 > /dev/null 2>&1 &
  _s=$!
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    timeout 20 /sbin/ip netns exec bwp iperf3 -c 10.60.0.2 -p 5201 -t 2 -O 1 -J "$@" > /tmp/iperf.json 2> /tmp/iperf.err && break
    sleep 0.3
  done
  kill $_s 2> /dev/null; wait $_s 2> /dev/null
  # end.sum_received.bits_per_second (iperf3 indents its JSON with tabs); busybox timeout
  # would run its own ip applet, hence /sbin/ip
  tr -d ' \n\t' < /tmp/iperf.json | grep -o '"sum_received":{[^}]*}' | grep -o '"bits_per_second":[0-9.e+]*' | cut -d: -f2 | cut -d. -f1
}
# within RATE BPS: BPS is within ±10 % of RATE
within() { [ -n "$2" ] && [ "$2" -ge $(($1 * 9 / 10)) ] && [ "$2" -le $(($1 * 11 / 10)) ]; }
if ! command -v iperf3 > /dev/null; then
  bad "$V: no iperf3 in the initramfs (run.sh copies /usr/bin/iperf3: apt install iperf3)"
else
  echo "    unshaped: $(iperf_bps) bit/s"
  for rate in 20000000 80000000; do
    bw_conf /tmp/bwk.json bw-rate $rate $rate
    t "$V $rate: ADD bandwidth" bw_chain ADD bwr /run/netns/bwp /tmp/bwk.json /tmp/res-bwr-eth0.json
    cp /tmp/out.json /tmp/bwk-res.json
    _ifb=$(pod_ifb /tmp/bwk-res.json)
    teq "$V $rate: tc reads eth0's rate back" $((rate / 8)) "$(tbf_rate bwp eth0)"
    teq "$V $rate: tc reads the ifb's rate back" $((rate / 8)) "$(tbf_rate bwp "$_ifb")"
    _out=$(iperf_bps); _in=$(iperf_bps -R)
    [ -n "$_out$_in" ] || { ip netns exec bwp ping -c 1 -W 2 10.60.0.2; head -c 400 /tmp/iperf.json; cat /tmp/iperf.err; } 2>&1 | sed 's/^/    iperf3: /' | head -12
    echo "    ipvlan l2: configured $rate bit/s, achieved egress $_out, ingress $_in bit/s"
    t "$V $rate: egress (iperf3 from the pod) within 10 %: $_out" within $rate "$_out"
    t "$V $rate: ingress (iperf3 -R, to the pod) within 10 %: $_in" within $rate "$_in"
    t "$V $rate: DEL bandwidth" bw_chain DEL bwr /run/netns/bwp /tmp/bwk.json /tmp/bwk-res.json
  done
fi
t "$V: DEL the pod" del bwr /run/netns/bwp eth0 /tmp/bwpod.json
ip netns del bwp; ip netns del bws; ip link del bwm 2> /dev/null
