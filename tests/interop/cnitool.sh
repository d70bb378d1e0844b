#!/usr/bin/env bash
# Interop suite: drive cnikit with the reference runtime library (libcni, through `cnitool`
# built from Debian's golang-github-appc-cni 1.1.2) and compare it with the reference plugins
# (Debian's containernetworking-plugins in /usr/lib/cni) on the same conflists.
#
# Every phase runs in its own `unshare --net --mount --propagation private` with tmpfs on
# /run/netns, /var/lib/cni and /run/cnikit: the machine's network and state are never touched,
# and the only traffic targets are loopback and addresses inside namespaces made here.
#
#   bridge + ipamd + portmap   cniVersion 0.3.1 0.4.0 1.0.0: cnitool add, traffic through the
#                              port mappings (CAP_ARGS) to 127.0.0.1:hostPort, gateway:hostPort
#                              and from a second container (hairpin), check, del, del again;
#                              nothing left (links, leases, nft entries, cache)
#   macvlan + ipamd            same versions; master: a veth inside the isolated namespace
#   reference plugins          the same conflist shapes with bridge/macvlan + host-local (+
#                              portmap): result JSON shape and kernel state compared with ours
#   cniVersion 1.1.0           libcni 1.1.2 knows results up to 1.0.0 and has no GC/STATUS, so
#                              1.1.0 runs through `cnikit net` (add/check/del, status, gc: a lease
#                              whose attachment is not in the cache is freed)
#   cnikit net                 (if the binary has it) the same conflists, results and kernel state
#                              compared with cnitool's, and each runtime reading the other's cache
#
# Env: PORTMAP=1 (0: leave portmap out of the conflists and skip the traffic checks through it)
#      CNIKIT=target/release/cnikit (built if missing)  RC=/var/cache/cnikit-interop (cnitool build)
#      KEEP=1 keep the work dir
# Prints "N passed, M failed, K skipped"; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

# =====================================================================================
# helpers shared by the outer script and the phases
# =====================================================================================
# shellcheck source=tests/interop/harness.sh
. "$ROOT/tests/interop/harness.sh"

if [ "${1:-}" != --phase ]; then
  # ===================================================================================
  # outer script: tools, builds, phases, comparisons, summary
  # ===================================================================================
  export PORTMAP=${PORTMAP:-1}
  # ---- packages, cnitool, `cnikit net` (tests/interop/harness.sh)
  start_run "namespaces, links, nftables" golang-go golang-github-appc-cni-dev dpkg-dev containernetworking-plugins nftables iptables jq iproute2 busybox-static util-linux
  echo "cnitool: $CNITOOL; cnikit: $("$WORK/bin/cnikit" version 2> /dev/null || echo '?'); cnikit net: $HAVE_NET; portmap: $PORTMAP; work: $WORK"

  for v in 0.3.1 0.4.0 1.0.0; do
    phase attach cnitool ours bridge $v
    phase attach cnitool ref bridge $v
    phase attach cnitool ours macvlan $v
    phase attach cnitool ref macvlan $v
    if [ "$HAVE_NET" = 1 ]; then
      phase attach net ours bridge $v
      phase attach net ours macvlan $v
    fi
  done
  phase v110 cnitool
  if [ "$HAVE_NET" = 1 ]; then
    phase attach net ours bridge 1.1.0
    phase attach net ours macvlan 1.1.0
    phase gc
    phase crosscache
  else
    skip "cnikit net is not in this binary: 1.1.0, GC/STATUS and runtime comparisons not run"
  fi

  # ---- comparisons (files written by the phases)
  echo "== comparisons"
  shape() { # the key structure of a result: what a runtime consumes
    jq -S -c '{top: keys, cniVersion, interfaces: [.interfaces[]? | keys],
               ips: [.ips[]? | keys], routes: [.routes[]? | keys], dns: (.dns | if type == "object" then keys else . end)}' "$1"
  }
  for kind in bridge macvlan; do
    for v in 0.3.1 0.4.0 1.0.0; do
      o=$WORK/cnitool-ours-$kind-$v; r=$WORK/cnitool-ref-$kind-$v
      if [ -s "$o.result.json" ] && [ -s "$r.result.json" ]; then
        teq "$kind $v: result shape, ours vs reference (via cnitool)" "$(shape "$r.result.json")" "$(shape "$o.result.json")"
        while IFS= read -r line; do
          key=${line%%=*}
          theirs=$(grep "^$key=" "$r.state" || true)
          case $key in
            info.*) # timing-dependent (DAD), reported, not compared
              [ "$theirs" = "$line" ] || note "$kind $v: $key differs: ours '${line#*=}', reference '${theirs#*=}'" ;;
            *) teq "$kind $v: kernel state '$key', ours vs reference" "$theirs" "$line" ;;
          esac
        done < "$o.state"
      else
        bad "$kind $v: no results to compare (an ADD failed above)"
      fi
      if [ "$HAVE_NET" = 1 ]; then
        n=$WORK/net-ours-$kind-$v
        if [ -s "$n.result.json" ] && [ -s "$o.result.json" ]; then
          norm='del(.interfaces[]?.mac) | (.interfaces[]? | select(.name | test("^veth")) | .name) |= "veth"'
          teq "$kind $v: result via cnikit net = result via cnitool (MACs, veth name aside)" \
            "$(jq -S -c "$norm" "$o.result.json")" "$(jq -S -c "$norm" "$n.result.json")"
          teq "$kind $v: kernel state via cnikit net = via cnitool" "$(cat "$o.state")" "$(cat "$n.state")"
        else
          bad "$kind $v: no cnikit net result to compare"
        fi
      fi
    done
  done

  finish_run interop
fi

# =====================================================================================
# a phase, inside its own network + mount namespace
# =====================================================================================
shift
isolate_phase
BB=/bin/busybox
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done' EXIT

SUBNET=10.88.0
SUBNET6=fd88::      # the bridge conflists are dual stack (v4 range set first)
HP=18080              # host port
conflist() { # IMPL KIND VERSION NAME [no-portmap] > conflist
  local impl=$1 kind=$2 v=$3 name=$4 ipam=host-local pm=0
  [ "$impl" = ours ] && ipam=ipamd
  [ "$kind" = bridge ] && [ "$PORTMAP" = 1 ] && [ "${5:-}" != no-portmap ] && pm=1
  jq -n -c --arg v "$v" --arg name "$name" --arg kind "$kind" --arg ipam "$ipam" --argjson pm $pm \
    --arg s4 "$SUBNET.0/24" --arg s6 "$SUBNET6/64" '
    if $kind == "bridge" then
      {type: "bridge", bridge: "ckbr0", isGateway: true, ipMasq: true,
       ipam: {type: $ipam, ranges: [[{subnet: $s4}], [{subnet: $s6}]], routes: [{dst: "0.0.0.0/0"}, {dst: "::/0"}]}}
    else
      {type: "macvlan", master: "ckm0", mode: "bridge",
       ipam: {type: $ipam, ranges: [[{subnet: $s4}]], routes: [{dst: "0.0.0.0/0"}]}}
    end
    | {cniVersion: $v, name: $name,
       plugins: ([.] + (if $pm == 1 then [{type: "portmap", capabilities: {portMappings: true}, snat: true}] else [] end))}'
}
cnitool_id() { printf '%s' "$1" | sha512sum | cut -c1-20 | sed 's/^/cnitool-/'; }
# rt RUNTIME VERB NET NETNS: run a runtime command the way a user does
rt() {
  local runtime=$1 verb=$2 net=$3 ns=$4
  if [ "$runtime" = cnitool ]; then
    "$CNITOOL" "$verb" "$net" "$ns"
  else
    "$OURS/cnikit" net "$verb" "$net" "$ns"
  fi
}
rt_to() { local out=$1; shift; rt "$@" > "$out"; }      # rt_to FILE RUNTIME VERB NET NETNS
rt_nocap() { CAP_ARGS='' rt "$@"; }                         # an attachment without capability args
rt_nocap_to() { local out=$1; shift; CAP_ARGS='' rt "$@" > "$out"; }
# nft_mentions VALUE...: does the ruleset hold one of these addresses (alone or as a prefix) or ports?
nft_mentions() {
  nft -j list ruleset | jq -e --args '[.. | scalars | tostring] as $s | any($ARGS.positional[]; . as $v | any($s[]; . == $v or startswith($v + "/")))' "$@" > /dev/null
}
no_link() { ! ip -n "$1" link show "$2" > /dev/null 2>&1; }
leases() { "$OURS/cnikit" ipamd leases --json 2> /dev/null || echo '[]'; }
lease_of() { # IMPL NET IP: is the address leased?
  if [ "$1" = ours ]; then leases | jq -e --arg n "$2" --arg a "$3" 'any(.[]; .network == $n and .address == $a)' > /dev/null
  else [ -e "/var/lib/cni/networks/$2/$3" ]; fi
}
wait_port() { # NETNS PORT: until something listens on the TCP port in the netns
  local hex
  hex=$(printf '%04X' "$2")
  for _ in $(seq 50); do
    ip netns exec "$1" cat /proc/net/tcp /proc/net/tcp6 2> /dev/null | grep -qE ":$hex [0:]+:0000 0A" && return 0
    sleep 0.1
  done
  return 1
}
# http_get HOST PORT: the body of GET / (bash's /dev/tcp: no client to install); fails on no answer
http_get() {
  local body
  body=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "GET / HTTP/1.0\r\nHost: x\r\n\r\n" >&3 && cat <&3' "$1" "$2" |
    tr -d '\r' | sed '1,/^$/d') || return 1
  [ -n "$body" ] && echo "$body"
}
fetch() { # [NETNS] HOST PORT
  if [ $# = 3 ]; then ip netns exec "$1" bash -c "set -o pipefail; $(declare -f http_get); http_get $2 $3"; else http_get "$1" "$2"; fi
}
state() { # KIND NETNS: the kernel state an attachment made, normalised (no names, MACs, indexes)
  local kind=$1 ns=$2
  echo "cont.link=$(ip -j -n "$ns" -d link show eth0 | jq -c '.[0] | {kind: .linkinfo.info_kind, mode: .linkinfo.info_data.mode, mtu, operstate, flags: (.flags | sort)}')"
  echo "cont.addr4=$(ip -j -n "$ns" -4 addr show eth0 | jq -c '[.[0].addr_info[] | {local, prefixlen, scope, broadcast}]')"
  echo "cont.routes4=$(ip -j -n "$ns" -4 route show | jq -c 'map({dst, gateway, dev, protocol, scope, prefsrc, flags}) | sort_by(.dst)')"
  echo "cont.lo=$(ip -j -n "$ns" link show lo | jq -c '.[0].operstate')"
  if [ "$kind" = bridge ]; then
    echo "host.bridge=$(ip -j -d link show ckbr0 | jq -c '.[0] | {kind: .linkinfo.info_kind, mtu, operstate, vlan_filtering: .linkinfo.info_data.vlan_filtering, stp: .linkinfo.info_data.stp_state}')"
    echo "host.bridge.addr4=$(ip -j -4 addr show ckbr0 | jq -c '[.[0].addr_info[] | {local, prefixlen, broadcast}]')"
    echo "host.ports=$(ip -j -d link show master ckbr0 | jq -c 'map({kind: .linkinfo.info_kind, mtu, operstate, hairpin: .linkinfo.info_slave_data.hairpin, isolated: .linkinfo.info_slave_data.isolated, learning: .linkinfo.info_slave_data.learning})')"
    echo "host.ip_forward=$(cat /proc/sys/net/ipv4/ip_forward)"
    echo "host.ip6_forward=$(cat /proc/sys/net/ipv6/conf/all/forwarding)"
    echo "host.bridge.addr6=$(ip -j -6 addr show ckbr0 | jq -c '[.[0].addr_info[] | select(.scope == "global") | {local, prefixlen}]')"
    echo "cont.addr6=$(ip -j -n "$ns" -6 addr show eth0 | jq -c '[.[0].addr_info[] | select(.scope == "global") | {local, prefixlen}]')"
    echo "cont.routes6=$(ip -j -n "$ns" -6 route show | jq -c 'map(select(.dst != "fe80::/64") | {dst, gateway, dev, protocol, metric, pref}) | sort_by(.dst)')"
    echo "info.dad=cont:$(ip -n "$ns" -6 addr show eth0 scope global | grep -oE 'tentative|nodad|dadfailed' | tr '\n' ' ')bridge:$(ip -6 addr show ckbr0 scope global | grep -oE 'tentative|nodad|dadfailed' | tr '\n' ' ')"
  fi
}

case $1 in
# -------------------------------------------------------------------------------------
attach) # RUNTIME IMPL KIND VERSION: add / traffic / check / del / del again
  runtime=$2 impl=$3 kind=$4 v=$5
  P="$runtime $impl $kind $v:"
  base=$WORK/$runtime-$impl-$kind-$v
  net=ck-$kind-$(echo "$v" | tr -d .)
  mkdir -p "$base.d"
  conflist "$impl" "$kind" "$v" "$net" > "$base.d/$net.conflist"
  export NETCONFPATH=$base.d
  if [ "$impl" = ours ]; then export CNI_PATH=$OURS; else export CNI_PATH=$REF; fi
  if [ "$kind" = macvlan ]; then
    ip link add ckm0 type veth peer name ckm1 && ip link set ckm0 up && ip link set ckm1 up
  fi
  ip netns add a; ip netns add b
  if [ "$kind" = bridge ] && [ "$PORTMAP" = 1 ]; then
    export CAP_ARGS='{"portMappings":[{"hostPort":'$HP',"containerPort":80,"protocol":"tcp"},{"hostPort":'$((HP + 1))',"containerPort":80,"protocol":"udp"}]}'
  else
    unset CAP_ARGS
  fi
  t "$P add a" rt_to "$base.result.json" $runtime add $net /run/netns/a
  R=$base.result.json
  [ -s "$R" ] || echo '{}' > "$R"
  teq "$P result cniVersion" "$v" "$(jq -r .cniVersion "$R")"
  if [ $kind = bridge ]; then
    teq "$P result interfaces: bridge, host veth, container eth0 (sandbox)" "ckbr0 veth eth0:/run/netns/a" \
      "$(jq -r '[.interfaces[0].name, (.interfaces[1].name | sub("[0-9a-f]+$"; "")), "\(.interfaces[2].name):\(.interfaces[2].sandbox)"] | join(" ")' "$R")"
    cidx=2
  else
    teq "$P result interfaces: container eth0 (sandbox)" "eth0:/run/netns/a" "$(jq -r '.interfaces | map("\(.name):\(.sandbox)") | join(" ")' "$R")"
    cidx=0
  fi
  A=$(jq -r '.ips[0].address // empty' "$R")
  teq "$P result ip: v4 address in $SUBNET.0/24 on interface $cidx, gateway $SUBNET.1" "$SUBNET $cidx $SUBNET.1" \
    "$(jq -r '"\(.ips[0].address | sub("\\.[0-9]+/24$"; "")) \(.ips[0].interface) \(.ips[0].gateway)"' "$R")"
  if [ $kind = bridge ]; then
    teq "$P result ip: v6 address in $SUBNET6/64 on interface $cidx, gateway ${SUBNET6}1" "2 $SUBNET6 $cidx ${SUBNET6}1" \
      "$(jq -r '"\(.ips | length) \(.ips[1].address | sub("[0-9a-f]+/64$"; "")) \(.ips[1].interface) \(.ips[1].gateway)"' "$R")"
    routes='[{"dst":"0.0.0.0/0"},{"dst":"::/0"}]'
  else
    teq "$P result ip: one address" 1 "$(jq -r '.ips | length' "$R")"
    routes='[{"dst":"0.0.0.0/0"}]'
  fi
  case $v in 0.*) teq "$P result ips carry their version (0.x layout)" "$(jq -r '.ips | length' "$R" | sed 's/2/4 6/; s/1/4/')" "$(jq -r '[.ips[].version] | join(" ")' "$R")" ;;
    *) teq "$P result ips have no version key (1.x layout)" false "$(jq -r 'any(.ips[]; has("version"))' "$R")" ;; esac
  teq "$P result routes" "$routes" "$(jq -c .routes "$R")"
  AIP=${A%/*}
  t "$P kernel: eth0 in the netns has $A and is up" sh -c "ip -n a -4 addr show eth0 | grep -q 'inet $A ' && ip -n a link show eth0 | grep -q 'state UP'"
  t "$P kernel: default route via $SUBNET.1" sh -c "ip -n a route show default | grep -q 'via $SUBNET.1 dev eth0'"
  if [ $kind = bridge ]; then
    A6=$(jq -r '.ips[1].address // empty' "$R")
    t "$P kernel: eth0 has $A6, v6 default route via ${SUBNET6}1" sh -c "ip -n a -6 addr show eth0 | grep -q 'inet6 $A6 ' && ip -n a -6 route show default | grep -q 'via ${SUBNET6}1 dev eth0'"
  fi
  t "$P lease held for $AIP" lease_of "$impl" "$net" "$AIP"
  cid=$(ls /var/lib/cni/results/ | sed -n "s/^$net-\(.*\)-eth0\$/\1/p" | head -1)
  t "$P result cached by the runtime ($cid)" test -s "/var/lib/cni/results/$net-$cid-eth0"
  if [ "$runtime" = cnitool ]; then teq "$P cnitool's container ID" "$(cnitool_id /run/netns/a)" "$cid"; fi

  # second container
  t "$P add b (no capability args)" rt_nocap_to "$base.b.json" $runtime add $net /run/netns/b
  B=$(jq -r '.ips[0].address // empty' "$base.b.json" 2> /dev/null || true)
  BIP=${B%/*}

  # traffic
  mkdir -p "$base.www"; echo "hello-$impl-$v" > "$base.www/index.html"
  ip netns exec a $BB httpd -f -p 80 -h "$base.www" &
  PIDS+=($!)
  if wait_port a 80; then pass "$P httpd listening in a"; else bad "$P httpd did not start in a"; fi
  if [ -n "$BIP" ]; then
    teq "$P b reaches a directly ($AIP:80)" "hello-$impl-$v" "$(fetch b $AIP 80 2>&1)"
  fi
  if [ "$kind" = bridge ]; then
    teq "$P host reaches a directly ($AIP:80)" "hello-$impl-$v" "$(fetch $AIP 80 2>&1)"
    teq "$P b reaches a directly over IPv6 ([${A6%/*}]:80)" "hello-$impl-$v" "$(fetch b "${A6%/*}" 80 2>&1)"
    if [ "$PORTMAP" = 1 ]; then
      teq "$P portmap: host → 127.0.0.1:$HP" "hello-$impl-$v" "$(fetch 127.0.0.1 $HP 2>&1)"
      teq "$P portmap: host → gateway $SUBNET.1:$HP" "hello-$impl-$v" "$(fetch $SUBNET.1 $HP 2>&1)"
      if [ -n "$BIP" ]; then teq "$P portmap: container b → gateway $SUBNET.1:$HP (hairpin)" "hello-$impl-$v" "$(fetch b $SUBNET.1 $HP 2>&1)"; fi
      tn "$P portmap: nothing on an unmapped host port ($((HP + 2)))" fetch 127.0.0.1 $((HP + 2))
      if [ "$impl" = ours ]; then
        t "$P nft: the ruleset holds $AIP and port $HP" eval "nft_mentions $AIP && nft_mentions $HP"
      fi
    else
      skip "$P portmap traffic (PORTMAP=0)"
    fi
  fi

  # check
  if [ "$v" = 0.3.1 ]; then
    tn "$P check refused below 0.4.0 (as libcni does)" rt $runtime check $net /run/netns/a
  elif [ "$impl" = ref ] && [ "$kind" = bridge ] && [ "$PORTMAP" = 1 ]; then
    if rt $runtime check $net /run/netns/a > "$WORK/t.out" 2>&1; then note "$P reference check passed"; else
      note "$P reference check failed ($(head -c 200 "$WORK/t.out"); portmap 1.1.1 CHECK bug, containernetworking/plugins#819)"; fi
  else
    t "$P check a" rt $runtime check $net /run/netns/a
    if [ "$impl" = ours ] && [ "$v" != 0.3.1 ]; then
      ip -n a route del default
      tn "$P check a fails once the default route is gone" rt $runtime check $net /run/netns/a
      ip -n a route add default via $SUBNET.1 dev eth0
    fi
  fi
  state $kind a > "$base.state"
  hostveth=$(jq -r '.interfaces[1].name // empty' "$R")

  # del
  t "$P del a" rt $runtime del $net /run/netns/a
  t "$P del b" rt_nocap $runtime del $net /run/netns/b
  t "$P after del: eth0 gone from a and b" eval 'no_link a eth0 && no_link b eth0'
  if [ $kind = bridge ]; then
    t "$P after del: no ports left on ckbr0, $hostveth gone" sh -c "[ \"\$(ip -j link show master ckbr0 | jq length)\" = 0 ] && ! ip link show $hostveth 2>/dev/null"
  else
    t "$P after del: only ckm0/ckm1 left" sh -c "[ \"\$(ip -j link show type macvlan | jq length)\" = 0 ]"
  fi
  t "$P after del: leases of $AIP, $BIP released" eval "! lease_of $impl $net $AIP && ! lease_of $impl $net ${BIP:-none}"
  t "$P after del: cache entries gone" sh -c "! ls /var/lib/cni/results/ 2>/dev/null | grep -q '^$net-'"
  if [ "$impl" = ours ]; then
    t "$P after del: no nft entry mentions $AIP, $BIP or port $HP" eval "! nft_mentions $AIP ${BIP:-none} $HP"
    nft list ruleset > "$base.nft-after-del"
  fi
  if [ "$kind" = bridge ] && [ "$PORTMAP" = 1 ]; then
    tn "$P after del: 127.0.0.1:$HP no longer answers" fetch 127.0.0.1 $HP
  fi
  t "$P del a again (idempotent)" rt $runtime del $net /run/netns/a
  ;;

# -------------------------------------------------------------------------------------
v110) # what libcni 1.1.2 does with a 1.1.0 conflist
  mkdir -p "$WORK/v110.d"
  conflist ours bridge 1.1.0 ck-v110 no-portmap > "$WORK/v110.d/ck-v110.conflist"
  ip netns add a
  if NETCONFPATH=$WORK/v110.d CNI_PATH=$OURS "$CNITOOL" add ck-v110 /run/netns/a > "$WORK/t.out" 2>&1; then
    pass "cnitool 1.1.0: add"
  else
    skip "cnitool (libcni 1.1.2) cannot run cniVersion 1.1.0: $(tail -1 "$WORK/t.out") — 1.1.0, GC and STATUS run through cnikit net"
  fi
  ;;

# -------------------------------------------------------------------------------------
gc) # cniVersion 1.1.0 STATUS and GC through cnikit net
  P="cnikit net 1.1.0 gc/status:"
  net=ck-gc
  mkdir -p "$WORK/gc.d"
  conflist ours bridge 1.1.0 $net no-portmap > "$WORK/gc.d/$net.conflist"
  export NETCONFPATH=$WORK/gc.d CNI_PATH=$OURS
  ip netns add a; ip netns add s
  t "$P status before any add" "$OURS/cnikit" net status $net
  t "$P add a" "$OURS/cnikit" net add $net /run/netns/a
  # a lease whose attachment no runtime knows: the IPAM plugin called directly, as a crashed
  # runtime would have left it (the runtime cache has no entry for it)
  jq -c '.plugins[0] + {cniVersion, name}' "$WORK/gc.d/$net.conflist" > "$WORK/gc-plugin.json"
  t "$P stray lease via ipamd ADD (not in the cache)" sh -c "CNI_COMMAND=ADD CNI_CONTAINERID=stray-1 CNI_NETNS=/run/netns/s CNI_IFNAME=eth0 CNI_PATH=$OURS $OURS/ipamd < $WORK/gc-plugin.json > $WORK/stray.json"
  SIP=$(jq -r '.ips[0].address' "$WORK/stray.json"); SIP=${SIP%/*}
  AIP=$(leases | jq -r '.[] | select(.containerId != "stray-1") | .address' | head -1)
  t "$P both attachments hold leases" eval "leases | jq -e 'any(.[]; .containerId == \"stray-1\") and any(.[]; .containerId != \"stray-1\")' > /dev/null"
  t "$P gc" "$OURS/cnikit" net gc $net
  t "$P gc freed the stray lease $SIP" sh -c "! $OURS/cnikit ipamd leases --json | jq -e 'any(.[]; .address == \"$SIP\")' >/dev/null"
  t "$P gc kept the cached attachment's lease $AIP" sh -c "$OURS/cnikit ipamd leases --json | jq -e 'any(.[]; .address == \"$AIP\")' >/dev/null"
  t "$P gc kept a's interface" ip -n a link show eth0
  t "$P check a after gc" "$OURS/cnikit" net check $net /run/netns/a
  t "$P status" "$OURS/cnikit" net status $net
  t "$P gc --gone (the runtime says a's container is gone)" "$OURS/cnikit" net gc $net --gone "$(ls /var/lib/cni/results | sed -n "s/^$net-\(.*\)-eth0\$/\1/p")"
  t "$P ... a's interface and lease are gone" sh -c "! ip -n a link show eth0 2>/dev/null && [ \"\$($OURS/cnikit ipamd leases --json | jq length)\" = 0 ]"
  # STATUS reports an exhausted pool (code 50)
  jq -c '.plugins[0].ipam.ranges = [[{"subnet":"10.89.0.0/30"}]]' "$WORK/gc.d/$net.conflist" > "$WORK/gc.d/$net.conflist.tmp" && mv "$WORK/gc.d/$net.conflist.tmp" "$WORK/gc.d/$net.conflist"
  t "$P add a into a /30 (one usable address besides the gateway)" "$OURS/cnikit" net add $net /run/netns/a
  if "$OURS/cnikit" net status $net > "$WORK/t.out" 2>&1; then bad "$P status with the pool exhausted (unexpectedly succeeded)"; else
    teq "$P status with the pool exhausted reports code 50" 50 "$(grep -o '"code": *[0-9]*' "$WORK/t.out" | grep -o '[0-9]*$' || cat "$WORK/t.out")"
  fi
  t "$P del a" "$OURS/cnikit" net del $net /run/netns/a
  ;;

# -------------------------------------------------------------------------------------
crosscache) # each runtime finishes what the other started, from the other's cache
  P="cross-runtime 1.0.0:"
  net=ck-x
  mkdir -p "$WORK/x.d"
  conflist ours bridge 1.0.0 $net > "$WORK/x.d/$net.conflist"
  export NETCONFPATH=$WORK/x.d CNI_PATH=$OURS
  if [ "$PORTMAP" = 1 ]; then export CAP_ARGS='{"portMappings":[{"hostPort":'$HP',"containerPort":80,"protocol":"tcp"}]}'; fi
  ip netns add a; ip netns add b
  CA=$(cnitool_id /run/netns/a); CB=$(cnitool_id /run/netns/b)
  t "$P cnitool add a" "$CNITOOL" add $net /run/netns/a
  t "$P cnikit net check a (libcni's cache entry)" "$OURS/cnikit" net check $net /run/netns/a --container-id "$CA"
  t "$P cnikit net del a (capability args from libcni's cache)" env -u CAP_ARGS "$OURS/cnikit" net del $net /run/netns/a --container-id "$CA"
  t "$P ... a's interface, lease and cache entry are gone" sh -c "! ip -n a link show eth0 2>/dev/null && [ \"\$($OURS/cnikit ipamd leases --json | jq length)\" = 0 ] && [ ! -e /var/lib/cni/results/$net-$CA-eth0 ]"
  if [ "$PORTMAP" = 1 ]; then
    t "$P ... and its port mapping" eval "! nft_mentions $HP"
  fi
  t "$P cnitool del a afterwards (nothing cached: still fine)" "$CNITOOL" del $net /run/netns/a
  # libcni 1.1.2's cache has no netns: DEL by container ID alone cannot reach the container's
  # link (it goes with the netns), but must free the lease, the port mapping and the cache entry
  t "$P cnitool add a again" "$CNITOOL" add $net /run/netns/a
  t "$P cnikit net del a by container ID only" env -u CAP_ARGS "$OURS/cnikit" net del $net --container-id "$CA"
  t "$P ... lease and cache entry are gone" sh -c "[ \"\$($OURS/cnikit ipamd leases --json | jq length)\" = 0 ] && [ ! -e /var/lib/cni/results/$net-$CA-eth0 ]"
  if [ "$PORTMAP" = 1 ]; then
    t "$P ... and its port mapping" eval "! nft_mentions $HP"
  fi
  ip netns del a; ip netns add a
  t "$P cnikit net add b with cnitool's container ID" "$OURS/cnikit" net add $net /run/netns/b --container-id "$CB"
  t "$P cnitool check b (cnikit's cache entry)" "$CNITOOL" check $net /run/netns/b
  # libcni 1.1.2 does not take capability args from its cache: DEL gets them from the caller, as ADD
  # did (without them portmap has nothing to unmap, in the reference plugin as in ours)
  t "$P cnitool del b" "$CNITOOL" del $net /run/netns/b
  t "$P ... b's interface, lease and cache entry are gone" sh -c "! ip -n b link show eth0 2>/dev/null && [ \"\$($OURS/cnikit ipamd leases --json | jq length)\" = 0 ] && [ ! -e /var/lib/cni/results/$net-$CB-eth0 ]"
  t "$P ... no nft entry mentions port $HP" eval "! nft_mentions $HP"
  ;;
*)
  echo "unknown phase $1" >&2
  exit 2
  ;;
esac
