# Sourced by tests/vm/guest.sh: the plugins that program the kernel's packet path — nftables
# (bridge ipMasq, portmap, macspoofchk, the firewall plugin) and tc (bandwidth) — on Debian's
# kernel, which is older than the CI machine's and differs in what nftables accepts and answers
# (concatenated interval sets, element lookups, bridge-family tables). Proven by real traffic
# and by reading the kernel back with nft and tc.
#
# The node: its eth0 (dummy, 192.0.2.10) as in guest.sh, plus an uplink `up0` (198.51.100.1) to
# a netns `out` (198.51.100.2) that has no route to any pod subnet, so a pod's packet comes back
# from `out` only if it left masqueraded, and `out` reaches a pod only through a host port.

nft() { /sbin/nft "$@"; }
tc() { /sbin/tc "$@"; }
# A module loaded with its defaults may have made devices of its own (ifb0, ifb1): not ours.
for d in ifb0 ifb1; do ip link del "$d" 2> /dev/null; done
nsreset out
ip link add up0 type veth peer name eth0 netns out
ip addr add 198.51.100.1/24 dev up0 && ip link set up0 up
ip -n out addr add 198.51.100.2/24 dev eth0 && ip -n out link set eth0 up && ip -n out link set lo up

# chain CMD ID NETNS CONF PREV-RESULT: a chained plugin's call, with prevResult as a runtime sends it
chain() {
  with_prev "$4" "$5" > /tmp/chain.json && cni "$1" "$2" "$3" eth0 /tmp/chain.json
}
# the elements of our FAMILY table's set or map NAME, one line (nft -j, squeezed)
elems() {
  case $2 in pm[46]-any | pm[46]-ip) _k=map ;; *) _k=set ;; esac
  nft -j list "$_k" "$1" cnikit "$2" 2> /dev/null | tr -d ' \n'
}
# set_has FAMILY SET WORD: an element of the set names WORD
set_has() { elems "$1" "$2" | grep -q "\"elem\":.*$3"; }
# none_holds TEXT FAMILY SET...: no element of the sets mentions TEXT
none_holds() {
  _t=$1 _f=$2; shift 2
  for _s in "$@"; do ! elems "$_f" "$_s" | grep -q "\"elem\":.*$_t" || { echo "$_f $_s: $(elems "$_f" "$_s")"; return 1; }; done
}
# set_empty FAMILY SET...: none of the sets holds an element
set_empty() { none_holds "" "$@"; }
# sets_like PREFIX: the names of our inet table's sets that start with PREFIX (a network's
# own sets are named at run time: masq4-<id>, pm4-hairpin-<id>, pm4-masq-all)
sets_like() { nft -j list sets inet 2> /dev/null | tr -d ' \n' | grep -oE "\"name\":\"$1[^\"]*\"" | cut -d'"' -f4; }
# in_set_like PREFIX WORD: an element of one of those sets names WORD
in_set_like() { for _s in $(sets_like "$1"); do set_has inet "$_s" "$2" && return 0; done; return 1; }
SERVERS=
# a TCP server in netns NS on port PORT that answers each connection with WORD
serve() { ip netns exec "$1" nc -ll -p "$2" -e /bin/echo "$3" & SERVERS="$SERVERS $!"; }
# what a TCP client in netns NS (- for the host) reads from ADDR PORT
fetch() {
  if [ "$1" = - ]; then echo | timeout 5 nc -w 3 "$2" "$3"; else echo | ip netns exec "$1" timeout 5 nc -w 3 "$2" "$3"; fi
}
# chain_has CHAIN WORD: a rule of iptables' `ip filter` CHAIN names WORD
chain_has() { nft -j list chain ip filter "$1" 2> /dev/null | tr -d ' \n' | grep -q "\"rule\":.*$2"; }
# qdisc_on DEV KIND: DEV has a qdisc of KIND
qdisc_on() { [ -n "$1" ] && tc -j qdisc show dev "$1" | grep -q "\"kind\":\"$2\""; }
# no_elements FAMILY: our table of that family holds no set element (or does not exist)
no_elements() { ! nft -j list table "$1" cnikit 2> /dev/null | tr -d ' \n' | grep -q '"elem"'; }
# answers NS ADDR PORT WORD: a client in NS (- for the host) reads WORD from ADDR:PORT
answers() { [ "$(fetch "$1" "$2" "$3")" = "$4" ]; }

# ------------------------------------------------------------------ bridge ipMasq
V="nft ipMasq"
fwconf() { # NAME BRIDGE SUBNET-PREFIX EXTRA-KEYS
  cat << EOF
{"cniVersion":"1.0.0","name":"$1","type":"bridge","bridge":"$2","isGateway":true$4,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"$3.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}
EOF
}
fwconf masq brm 10.80.0 ',"ipMasq":true' > /tmp/masq.json
fwconf plain brp 10.81.0 '' > /tmp/plain.json
nsreset fa fb fp
t "$V: ADD fa (ipMasq)" cni ADD fa /run/netns/fa eth0 /tmp/masq.json
t "$V: ADD fb (ipMasq, same network)" cni ADD fb /run/netns/fb eth0 /tmp/masq.json
t "$V: ADD fp (no ipMasq)" cni ADD fp /run/netns/fp eth0 /tmp/plain.json
FA=$(addr_of /tmp/res-fa-eth0.json); FB=$(addr_of /tmp/res-fb-eth0.json)
t "$V: fa's address is in its network's masq4- set" in_set_like masq4- "\"${FA%/*}\""
t "$V: fa reaches the outside (its packets leave masqueraded)" ping_ok fa 198.51.100.2
t "$V: fp, not masqueraded, gets no answer from the outside" ping_no fp 198.51.100.2
t "$V: fa reaches fb directly (same subnet: not masqueraded)" ping_ok fa "${FB%/*}"

# ------------------------------------------------------------------ portmap, chained after bridge
V="nft portmap"
cat > /tmp/pm.json << 'EOF'
{"cniVersion":"1.0.0","name":"masq","type":"portmap","capabilities":{"portMappings":true},"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"},{"hostPort":8081,"containerPort":81,"protocol":"tcp","hostIP":"198.51.100.1"},{"hostPort":8053,"containerPort":53,"protocol":"udp"}]}}
EOF
serve fa 80 port80
serve fa 81 port81
# A UDP flow to host port 8053 from before the mapping: conntrack would keep delivering it to the
# host, not DNATed, until the entry times out; ADD deletes such entries.
ip netns exec out timeout 2 tftp -g -r x 198.51.100.1 8053 > /dev/null 2>&1
t "$V: a conntrack entry of udp 8053 exists before ADD" grep -q "dport=8053 " /proc/net/nf_conntrack
t "$V: ADD fa's mappings (tcp 8080, tcp 8081 on one host address, udp 8053)" chain ADD fa /run/netns/fa /tmp/pm.json /tmp/res-fa-eth0.json
tn "$V: ADD deleted it (udp mappings flush conntrack)" grep -q "dport=8053 " /proc/net/nf_conntrack
t "$V: the result is prevResult's" grep -q "\"${FA%/*}/" /tmp/out.json
t "$V: CHECK" chain CHECK fa /run/netns/fa /tmp/pm.json /tmp/res-fa-eth0.json
t "$V: the any-address map holds tcp 8080" set_has inet pm4-any 8080
t "$V: ... and udp 8053" set_has inet pm4-any 8053
t "$V: the one-address map holds 198.51.100.1 tcp 8081" set_has inet pm4-ip '"198.51.100.1".*8081' 
teq "$V: the host reaches fa through its own address 192.0.2.10:8080" port80 "$(fetch - 192.0.2.10 8080)"
teq "$V: the outside reaches fa through 198.51.100.1:8080" port80 "$(fetch out 198.51.100.1 8080)"
teq "$V: the outside reaches fa through 198.51.100.1:8081 (hostIP)" port81 "$(fetch out 198.51.100.1 8081)"
teq "$V: 8081 is not mapped on another host address" "" "$(fetch - 192.0.2.10 8081)"
teq "$V: hairpin: fb reaches fa through the host port" port80 "$(fetch fb 192.0.2.10 8080)"
# Repairs on this kernel: what `nft flush ruleset` took (fa's host ports, hairpin and
# masquerade) comes back by `cnikit firewall restore`, and by the daemon's watch of nftables
# events (its events socket and NEWGEN's committer pid are what an older kernel could lack).
nft flush ruleset
teq "$V: after nft flush ruleset 8080 no longer answers" "" "$(fetch out 198.51.100.1 8080)"
t "$V: cnikit firewall restore puts it back" /cni/cnikit firewall restore
teq "$V: ... the outside reaches fa through 198.51.100.1:8080 again" port80 "$(fetch out 198.51.100.1 8080)"
teq "$V: ... hairpin again" port80 "$(fetch fb 192.0.2.10 8080)"
t "$V: ... fa's packets leave masqueraded again" ping_ok fa 198.51.100.2
teq "$V: ... a second restore finds nothing to put back" 1 "$(/cni/cnikit firewall restore | grep -c 'nothing to put back')"
mkdir -p /tmp/fw-ipamd
/cni/cnikit ipamd daemon --socket /tmp/fw-ipamd/s.sock --data-dir /tmp/fw-ipamd > /tmp/fw-ipamd.log 2>&1 &
FW_DAEMON=$!
for _ in $(seq 50); do [ -S /tmp/fw-ipamd/s.sock ] && break; sleep 0.1; done
nft flush ruleset
# answers_soon: fa's page through 198.51.100.1:8080 within 1 s
answers_soon() { for _ in $(seq 20); do answers out 198.51.100.1 8080 port80 && return 0; sleep 0.05; done; return 1; }
t "$V: with the daemon up, a flushed ruleset's host port answers again within 1 s" answers_soon
kill $FW_DAEMON; wait $FW_DAEMON 2> /dev/null
tn "$V: a second container cannot take host port 8080" chain ADD fb /run/netns/fb /tmp/pm.json /tmp/res-fb-eth0.json
t "$V: ... and fa's mapping still answers" answers - 192.0.2.10 8080 port80
t "$V: ... and the refused ADD left nothing of fb in the maps" none_holds "\"${FB%/*}\"" inet pm4-any pm4-ip $(sets_like pm4-)
t "$V: DEL" chain DEL fa /run/netns/fa /tmp/pm.json /tmp/res-fa-eth0.json
t "$V: DEL again" chain DEL fa /run/netns/fa /tmp/pm.json /tmp/res-fa-eth0.json
t "$V: the maps are empty after DEL" set_empty inet pm4-any pm4-ip $(sets_like pm4-)
teq "$V: 8080 no longer answers" "" "$(fetch out 198.51.100.1 8080)"
# DEL without prevResult (a runtime that lost its cache) finds the entries by their tag
t "$V: ADD again" chain ADD fa /run/netns/fa /tmp/pm.json /tmp/res-fa-eth0.json
t "$V: DEL without prevResult" cni DEL fa /run/netns/fa eth0 /tmp/pm.json
t "$V: ... the maps are empty" set_empty inet pm4-any pm4-ip $(sets_like pm4-)
# GC: entries of attachments the runtime no longer knows go
t "$V: ADD again for GC" chain ADD fa /run/netns/fa /tmp/pm.json /tmp/res-fa-eth0.json
# (GC is a CNI 1.1.0 command)
sed -e 's/"1.0.0"/"1.1.0"/' -e 's/}$/,"cni.dev\/valid-attachments":[]}/' /tmp/pm.json > /tmp/pmgc.json
t "$V: GC with no valid attachments" cni GC "" "" "" /tmp/pmgc.json
t "$V: ... the maps are empty" set_empty inet pm4-any pm4-ip $(sets_like pm4-)

# ------------------------------------------------------------------ firewall plugin (own table)
V="nft firewall"
cat > /tmp/fw.json << 'EOF'
{"cniVersion":"1.0.0","name":"masq","type":"firewall"}
EOF
t "$V: ADD fa" chain ADD fa /run/netns/fa /tmp/fw.json /tmp/res-fa-eth0.json
t "$V: fa's address is in fw4-pods" set_has inet fw4-pods "\"${FA%/*}\""
t "$V: CHECK" chain CHECK fa /run/netns/fa /tmp/fw.json /tmp/res-fa-eth0.json
t "$V: fa still reaches the outside" ping_ok fa 198.51.100.2
t "$V: DEL" chain DEL fa /run/netns/fa /tmp/fw.json /tmp/res-fa-eth0.json
t "$V: ... fw4-pods is empty" set_empty inet fw4-pods

# ------------------------------------------------------------------ firewall plugin (iptables-nft)
# A node whose iptables (nft flavour) has a FORWARD chain that drops: the plugin's rules go
# there, in the reference's layout, as xt matches (comment, conntrack) that iptables can read.
V="nft firewall (iptables FORWARD)"
nft add table ip filter
nft add chain ip filter FORWARD '{ type filter hook forward priority 0; policy drop; }'
t "$V: the FORWARD policy drops fa's traffic" ping_no fa 198.51.100.2
t "$V: ADD fa" chain ADD fa /run/netns/fa /tmp/fw.json /tmp/res-fa-eth0.json
t "$V: FORWARD jumps to CNI-FORWARD" chain_has FORWARD CNI-FORWARD
t "$V: CNI-FORWARD accepts fa's address" chain_has CNI-FORWARD "\"${FA%/*}\""
t "$V: fa reaches the outside through the drop policy" ping_ok fa 198.51.100.2
t "$V: CHECK" chain CHECK fa /run/netns/fa /tmp/fw.json /tmp/res-fa-eth0.json
t "$V: DEL" chain DEL fa /run/netns/fa /tmp/fw.json /tmp/res-fa-eth0.json
tn "$V: ... CNI-FORWARD no longer names fa" chain_has CNI-FORWARD "\"${FA%/*}\""
t "$V: ... and fa's traffic is dropped again" ping_no fa 198.51.100.2
nft delete table ip filter

# ------------------------------------------------------------------ bandwidth (tc, ifb)
V="tc bandwidth"
cat > /tmp/bw.json << 'EOF'
{"cniVersion":"1.0.0","name":"masq","type":"bandwidth","ingressRate":8000000,"ingressBurst":80000,"egressRate":4000000,"egressBurst":40000}
EOF
FAV=$(host_veth /tmp/res-fa-eth0.json)
t "$V: ADD fa" chain ADD fa /run/netns/fa /tmp/bw.json /tmp/res-fa-eth0.json
t "$V: a tbf root qdisc on fa's host veth (ingress shaping)" qdisc_on "$FAV" tbf
t "$V: an ingress qdisc on it (egress redirected to an ifb)" qdisc_on "$FAV" ingress
IFB=$(ip -o link show type ifb | cut -d: -f2 | tr -d ' ' | head -1)
t "$V: an ifb device with a tbf root qdisc (egress shaping)" qdisc_on "$IFB" tbf
t "$V: traffic passes the shaper" ping_ok fa "${FB%/*}"
t "$V: CHECK" chain CHECK fa /run/netns/fa /tmp/bw.json /tmp/res-fa-eth0.json
t "$V: DEL" chain DEL fa /run/netns/fa /tmp/bw.json /tmp/res-fa-eth0.json
teq "$V: ... no ifb left" "" "$(ip -o link show type ifb)"
tn "$V: ... no tbf on the veth" qdisc_on "$FAV" tbf
t "$V: DEL again" chain DEL fa /run/netns/fa /tmp/bw.json /tmp/res-fa-eth0.json

# ------------------------------------------------------------------ bridge macspoofchk
V="nft macspoofchk"
fwconf spoof brs 10.82.0 ',"macspoofchk":true' > /tmp/spoof.json
nsreset fs
t "$V: ADD" cni ADD fs /run/netns/fs eth0 /tmp/spoof.json
t "$V: the bridge table guards the port" set_has bridge macspoof-ports "\"$(host_veth /tmp/res-fs-eth0.json)\"" 
t "$V: the pod reaches its gateway with its own MAC" ping_ok fs 10.82.0.1
ip -n fs link set eth0 address 02:00:00:00:00:99
ip neigh flush dev brs 2> /dev/null
t "$V: with another MAC its frames are dropped" ping_no fs 10.82.0.1
t "$V: DEL" del fs /run/netns/fs eth0 /tmp/spoof.json
t "$V: ... the port's entries are gone" set_empty bridge macspoof-ports macspoof-allow
ip netns del fs
ip link del brs 2> /dev/null

# ------------------------------------------------------------------ IPv6: ipMasq and portmap
V="nft IPv6"
ip addr add fd51::1/64 dev up0 nodad
ip -n out addr add fd51::2/64 dev eth0 nodad
cat > /tmp/dual.json << EOF
{"cniVersion":"1.0.0","name":"dual","type":"bridge","bridge":"brd","isGateway":true,"ipMasq":true,"ipam":{"type":"ipamd","dataDir":"$IPAM_DIR","ranges":[[{"subnet":"10.83.0.0/24"}],[{"subnet":"fd83::/64"}]],"routes":[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]}}
EOF
cat > /tmp/pm6.json << 'EOF'
{"cniVersion":"1.0.0","name":"dual","type":"portmap","capabilities":{"portMappings":true},"runtimeConfig":{"portMappings":[{"hostPort":8090,"containerPort":90,"protocol":"tcp"}]}}
EOF
nsreset f6
t "$V: ADD f6 (dual stack, ipMasq)" cni ADD f6 /run/netns/f6 eth0 /tmp/dual.json
F6=$(tr -d ' \n' < /tmp/res-f6-eth0.json | grep -o '"address":"fd83[^"]*"' | cut -d'"' -f4)
t "$V: f6's v6 address is in its network's masq6- set" in_set_like masq6- "\"${F6%/*}\""
t "$V: f6 reaches the outside over IPv6 (its packets leave masqueraded)" ping_ok f6 fd51::2
serve f6 90 port90
t "$V: ADD f6's mapping (tcp 8090, both families)" chain ADD f6 /run/netns/f6 /tmp/pm6.json /tmp/res-f6-eth0.json
t "$V: the v6 any-address map holds tcp 8090" set_has inet pm6-any 8090
teq "$V: the outside reaches f6 through [fd51::1]:8090" port90 "$(fetch out fd51::1 8090)"
teq "$V: ... and through 198.51.100.1:8090" port90 "$(fetch out 198.51.100.1 8090)"
t "$V: DEL portmap" chain DEL f6 /run/netns/f6 /tmp/pm6.json /tmp/res-f6-eth0.json
teq "$V: [fd51::1]:8090 no longer answers" "" "$(fetch out fd51::1 8090)"
t "$V: DEL bridge" del f6 /run/netns/f6 eth0 /tmp/dual.json
t "$V: the v6 sets and maps are empty" set_empty inet pm6-any pm6-ip $(sets_like pm6-) $(sets_like masq6-)
ip netns del f6
ip link del brd 2> /dev/null

# ------------------------------------------------------------------ the end
V="nft ipMasq"
for c in fa fb; do t "$V: DEL $c" del $c /run/netns/$c eth0 /tmp/masq.json; done
t "$V: DEL fp" del fp /run/netns/fp eth0 /tmp/plain.json
t "$V: DEL fa again" del fa /run/netns/fa eth0 /tmp/masq.json
t "$V: the masq sets are empty" set_empty inet $(sets_like masq4-)
t "no element left in our inet table" no_elements inet
t "no element left in our bridge table" no_elements bridge
kill $SERVERS 2> /dev/null
for c in fa fb fp out; do ip netns del $c; done
ip link del brm 2> /dev/null
ip link del brp 2> /dev/null
