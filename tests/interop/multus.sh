#!/usr/bin/env bash
# Interop suite for Multus-style secondary networks: the configurations a Multus
# NetworkAttachmentDefinition holds, attached as `net1` to pods of a node, run through the
# reference runtime library (libcni, through `cnitool` built as tests/interop/cnitool.sh builds
# it) and through cnikit's own runtime (`cnikit net`), with cnikit's plugins and with the
# reference plugins (Debian's containernetworking-plugins 1.1.1 in /usr/lib/cni).
#
# Every phase runs in its own `unshare --net --mount --propagation private` with tmpfs on
# /run/netns, /var/lib/cni and /run/cnikit: the machine's network and state are never touched.
# That namespace plays the node: an uplink `eth0` (10.77.0.2/24, default route via 10.77.0.1),
# a veth whose peer is in the namespace `lan` (gateway 10.77.0.1, a server 10.77.0.100, and
# 198.51.100.1 beyond the gateway). Traffic goes only to addresses in namespaces made here.
# The runtime arguments are Multus's: CNI_IFNAME net1, CNI_ARGS `IgnoreUnknown=true;K8S_POD_*`.
#
#   macvlan + static   master eth0, mode bridge; pod a: the configured address; pod b:
#                      runtimeConfig `ips` and `mac` (CAP_ARGS); pod c: CNI_ARGS IP/GATEWAY.
#                      The pods reach each other, the LAN server (ping, HTTP) and beyond the
#                      gateway; the uplink stays as it was
#   host-device        a spare veth end `hd0` moved into the pod with a static address and a
#                      route; traffic to its peer and through the route; back as `hd0` after DEL
#   ptp + sbr          host-local IPAM; the pod also has a primary eth0 with the default route;
#                      the rule `from <pod address> lookup 100` and table 100's routes; the pod
#                      reaches the host end from its net1 address
#   vlan + static      only if the kernel has 802.1q (the VM suite covers vlan otherwise)
#
# For each, at cniVersion 0.4.0 and 1.0.0 and with each runtime and each plugin set: ADD,
# the result, kernel state and traffic, CHECK (ours: CHECK fails once a route or rule is
# gone), DEL (host and pods exactly as before ADD, no cache entry, no lease), DEL again.
# Then ours is compared with the reference (results; links, addresses, routes, rules, with
# MACs, indexes and veth names aside) and `cnikit net` with cnitool, and each runtime
# finishes (CHECK, DEL) what the other started, reading the other's cache.
#
# Env: CNIKIT=target/release/cnikit (built if missing)  RC=/var/cache/cnikit-interop (cnitool)
#      KEEP=1 keep the work dir
# Prints "interop multus: N passed, M failed, K skipped"; exits non-zero on any failure.
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
  # outer script: tools, cnitool, phases, comparisons, summary
  # ===================================================================================
  # ---- packages, cnitool in the cache tests/interop/cnitool.sh uses, `cnikit net`
  # (tests/interop/harness.sh)
  start_run "namespaces, links" golang-go golang-github-appc-cni-dev dpkg-dev containernetworking-plugins jq iproute2 busybox-static util-linux
  echo "cnitool: $CNITOOL; cnikit: $("$WORK/bin/cnikit" version 2> /dev/null || echo '?'); cnikit net: $HAVE_NET; work: $WORK"

  SCENS=(macvlan hostdev sbr)
  # 802.1q, tried in a throwaway namespace
  if unshare --net -- sh -c 'ip link add ck0 type veth peer name ck1 && ip link add link ck0 name ck0.5 type vlan id 5' > "$WORK/vlan.out" 2>&1; then
    SCENS+=(vlan)
  else
    skip "vlan + static: this kernel has no 802.1q ('ip link add … type vlan': $(tr '\n' ' ' < "$WORK/vlan.out" | head -c 100)); the VM suite covers vlan"
  fi
  RUNTIMES=(cnitool)
  if [ "$HAVE_NET" = 1 ]; then RUNTIMES+=(net); else skip "cnikit net is not in this binary: only cnitool runs"; fi
  VERSIONS=(0.4.0 1.0.0)

  for scen in "${SCENS[@]}"; do
    for v in "${VERSIONS[@]}"; do
      for runtime in "${RUNTIMES[@]}"; do
        phase attach "$runtime" ours "$scen" "$v"
        phase attach "$runtime" ref "$scen" "$v"
      done
    done
    if [ "$HAVE_NET" = 1 ]; then
      phase cross ours "$scen"
      phase cross ref "$scen"
    fi
  done

  # ---- comparisons (files written by the phases)
  echo "== comparisons"
  # a result without what differs by design: MACs, veth names, and dns (the reference's
  # macvlan/host-device/vlan replace IPAM's DNS with their own empty `dns`; cnikit keeps it,
  # docs/reference-compatibility.md)
  norm='del(.interfaces[]?.mac, .dns) | (.interfaces[]? | select(.name | test("^veth")) | .name) |= "veth"'
  cmp_states() { # WHAT EXPECTED-FILE ACTUAL-FILE
    while IFS= read -r line; do
      key=${line%%=*}
      teq "$1 '$key'" "$(grep "^$key=" "$2" || true)" "$line"
    done < "$3"
  }
  for scen in "${SCENS[@]}"; do
    for v in "${VERSIONS[@]}"; do
      for runtime in "${RUNTIMES[@]}"; do
        o=$WORK/$runtime-ours-$scen-$v; r=$WORK/$runtime-ref-$scen-$v
        if [ ! -s "$o.state" ] || [ ! -s "$r.state" ]; then bad "$scen $v $runtime: no states to compare (see above)"; continue; fi
        for res in "$o".*.json; do
          p=${res#"$o".}; p=${p%.json}
          teq "$scen $v $runtime: result of $p, ours = reference (MACs, veth names, dns aside)" \
            "$(jq -S -c "$norm" "$r.$p.json")" "$(jq -S -c "$norm" "$res")"
          [ "$runtime$p" != cnitoola ] || [ "$(jq -c .dns "$r.$p.json")" = "$(jq -c .dns "$res")" ] ||
            note "$scen $v $runtime: $p's dns differs (by design): ours $(jq -c .dns "$res"), reference $(jq -c .dns "$r.$p.json")"
        done
        cmp_states "$scen $v $runtime: kernel state ours = reference:" "$r.state" "$o.state"
      done
      if [ "$HAVE_NET" = 1 ]; then
        for impl in ours ref; do
          c=$WORK/cnitool-$impl-$scen-$v; n=$WORK/net-$impl-$scen-$v
          if [ ! -s "$c.state" ] || [ ! -s "$n.state" ]; then bad "$scen $v $impl: no cnikit net state to compare"; continue; fi
          for res in "$c".*.json; do
            p=${res#"$c".}; p=${p%.json}
            teq "$scen $v $impl: result of $p via cnikit net = via cnitool (MACs, veth names aside)" \
              "$(jq -S -c "$norm" "$res")" "$(jq -S -c "$norm" "$n.$p.json")"
          done
          cmp_states "$scen $v $impl: kernel state via cnikit net = via cnitool:" "$c.state" "$n.state"
        done
      fi
    done
  done

  finish_run "interop multus"
fi

# =====================================================================================
# a phase, inside its own network + mount namespace: the node
# =====================================================================================
shift
isolate_phase
BB=/bin/busybox
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done' EXIT
declare -A NETOF CAPOF XOF

hd0_mac() { ip -j link show hd0 | jq -r '.[0].address'; }   # (/sys shows the machine's netns)
cnitool_id() { printf '%s' "$1" | sha512sum | cut -c1-20 | sed 's/^/cnitool-/'; }
# kargs POD: the CNI_ARGS Multus passes
kargs() { echo "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=$1;K8S_POD_INFRA_CONTAINER_ID=$(cnitool_id "/run/netns/$1")"; }
# rt RUNTIME VERB NET NETNS [cnikit net options]: a runtime command, CNI_IFNAME net1
rt() {
  local runtime=$1 verb=$2 net=$3 ns=$4; shift 4
  if [ "$runtime" = cnitool ]; then CNI_IFNAME=net1 "$CNITOOL" "$verb" "$net" "$ns"
  else "$OURS/cnikit" net "$verb" "$net" "$ns" --ifname net1 "$@"; fi
}
# podrt RUNTIME VERB POD [OUT [cnikit net options]]: with the pod's network, CAP_ARGS (unset
# with NOCAP=1) and CNI_ARGS
podrt() {
  local runtime=$1 verb=$2 pod=$3 out=${4:-/dev/null}; shift 3; shift $(($# > 0 ? 1 : 0))
  local args; args="$(kargs "$pod")${XOF[$pod]:-}"
  if [ -n "${CAPOF[$pod]:-}" ] && [ "${NOCAP:-0}" != 1 ]; then
    CAP_ARGS=${CAPOF[$pod]} CNI_ARGS=$args rt "$runtime" "$verb" "${NETOF[$pod]}" "/run/netns/$pod" "$@" > "$out"
  else
    CNI_ARGS=$args rt "$runtime" "$verb" "${NETOF[$pod]}" "/run/netns/$pod" "$@" > "$out"
  fi
}
# chk WHAT RUNTIME POD [OUT [cnikit net options]]: CHECK. ptp + sbr fails it with cnikit's
# plugins as with the reference's (1.1.1 and v1.9.1 alike): ptp's CHECK looks for its routes in
# the main table, which sbr emptied. Reported, not failed; returns 1 then.
chk() {
  local d=$1; shift
  if [ "$scen" = sbr ] && ! podrt "$@" > "$WORK/t.out" 2>&1; then
    note "$d fails, as with any ptp + sbr: $(tail -1 "$WORK/t.out" | head -c 160)"
    return 1
  fi
  t "$d" podrt "$@"
}
# del_again WHAT CMD...: a repeated DEL must succeed; the 1.1.1 reference's host-device and
# sbr fail it (the interface is gone), which is reported, not failed
del_again() {
  local d=$1; shift
  if [ "$impl" = ours ] || "$@" > "$WORK/t.out" 2>&1; then t "$d" "$@"; else
    note "$d fails with the 1.1.1 reference plugins: $(tail -1 "$WORK/t.out" | head -c 160)"
  fi
}
# http_get NETNS HOST: the body of GET http://HOST/ from inside NETNS (bash's /dev/tcp: the static
# busybox's wget crashes)
http_get() {
  ip netns exec "$1" timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/80" && printf "GET / HTTP/1.0\r\n\r\n" >&3 && cat <&3' "$2" |
    tr -d '\r' | sed '1,/^$/d'
}
png() { ip netns exec "$1" "$BB" ping -c 1 -W 2 "${@:2}"; }   # png NETNS [-I SRC] DST
wait_port() { # NETNS PORT: until something listens on the TCP port in the netns
  local hex; hex=$(printf '%04X' "$2")
  for _ in $(seq 50); do
    ip netns exec "$1" cat /proc/net/tcp 2> /dev/null | grep -qE ":$hex [0:]+:0000 0A" && return 0
    sleep 0.1
  done
  return 1
}
# state PODS...: kernel state of the node and the pods (not the LAN), MACs, indexes and the
# host veth's name aside (and its alias: cnikit's names its attachment), and the host links'
# operstate (the kernel's linkwatch sets it late; the flags say UP, LOWER_UP, NO-CARRIER)
state() {
  local hv='^veth[0-9a-f]+$' p
  echo "host.links=$(ip -j -d link show | jq -c --arg hv "$hv" 'map(. as $l | {name: (if .ifname | test($hv) then "veth" else .ifname end),
    kind: .linkinfo.info_kind, mtu, flags: (.flags | sort), alias: (if $l.ifname | test($hv) then null else .ifalias end)}) | sort_by(.name)')"
  echo "host.addr4=$(ip -j -4 addr show | jq -c --arg hv "$hv" 'map({dev: (.ifname | sub($hv; "veth")), a: [.addr_info[] | {local, prefixlen, scope, broadcast}]}) | sort_by(.dev)')"
  echo "host.routes4=$(ip -j -4 route show table all | jq -c --arg hv "$hv" 'map(select(.table != "local") | {dst, gateway, dev: (.dev | sub($hv; "veth")), protocol, scope, prefsrc, flags, table}) | sort_by(.table, .dst, .dev)')"
  for p in "$@"; do
    echo "$p.links=$(ip -j -d -n "$p" link show | jq -c 'map({name: .ifname, kind: .linkinfo.info_kind, mode: .linkinfo.info_data.mode, vlan: .linkinfo.info_data.id, mtu, operstate, flags: (.flags | sort), alias: .ifalias}) | sort_by(.name)')"
    echo "$p.addr4=$(ip -j -n "$p" -4 addr show | jq -c 'map({dev: .ifname, a: [.addr_info[] | {local, prefixlen, scope, broadcast}]}) | sort_by(.dev)')"
    echo "$p.routes4=$(ip -j -n "$p" -4 route show table all | jq -c 'map(select(.table != "local") | {dst, gateway, dev, protocol, scope, prefsrc, flags, table}) | sort_by(.table, .dst, .dev)')"
    echo "$p.rules4=$(ip -j -n "$p" -4 rule show | jq -c 'map({priority, src, srclen, table})')"
  done
}

# setup IMPL SCEN VERSION DIR: the node's LAN, the pods, the scenario's devices, its conflists
setup() {
  local impl=$1 scen=$2 v=$3 dir=$4 p
  mkdir -p "$dir"
  export NETCONFPATH=$dir
  if [ "$impl" = ours ]; then export CNI_PATH=$OURS; else export CNI_PATH=$REF; fi
  ip netns add lan
  ip link add eth0 type veth peer name lan0 netns lan
  ip -n lan link set lo up; ip -n lan link set lan0 up
  ip -n lan addr add 10.77.0.1/24 dev lan0; ip -n lan addr add 10.77.0.100/24 dev lan0
  ip -n lan addr add 198.51.100.1/32 dev lo
  ip link set eth0 up; ip addr add 10.77.0.2/24 dev eth0; ip route add default via 10.77.0.1
  mk() { # NAME PLUGIN... (jq expressions)
    local name=$1; shift
    jq -n -c --arg v "$v" --arg n "$name" "{cniVersion: \$v, name: \$n, plugins: [$(IFS=,; echo "$*")]}" > "$dir/$name.conflist"
  }
  case $scen in
  macvlan)
    PODS=(a b c); CROSS_POD=b
    NETOF=([a]=ms-macvlan [b]=ms-macvlan-ips [c]=ms-macvlan-ips)
    CAPOF[b]='{"ips":["10.77.0.11/24"],"mac":"0a:58:0a:4d:00:0b"}'
    XOF[c]=';IP=10.77.0.12/24;GATEWAY=10.77.0.1'
    mk ms-macvlan '{type: "macvlan", master: "eth0", mode: "bridge", ipam: {type: "static",
      addresses: [{address: "10.77.0.10/24", gateway: "10.77.0.1"}], routes: [{dst: "0.0.0.0/0"}], dns: {nameservers: ["10.77.0.53"]}}}'
    # the per-pod addresses of Multus's documentation: `ips` (and `mac`) from the pod's annotation
    mk ms-macvlan-ips '{type: "macvlan", capabilities: {ips: true, mac: true}, master: "eth0", mode: "bridge",
      ipam: {type: "static", routes: [{dst: "0.0.0.0/0", gw: "10.77.0.1"}], dns: {nameservers: ["10.77.0.53"]}}}'
    ;;
  hostdev)
    PODS=(a); CROSS_POD=a; NETOF=([a]=ms-hostdev)
    ip link add hd0 type veth peer name hd0p
    ip link set hd0p up; ip addr add 10.78.0.1/24 dev hd0p; ip addr add 10.79.0.1/32 dev lo
    HDMAC=$(hd0_mac)
    mk ms-hostdev '{type: "host-device", device: "hd0", ipam: {type: "static",
      addresses: [{address: "10.78.0.10/24"}], routes: [{dst: "10.79.0.0/16", gw: "10.78.0.1"}]}}'
    ;;
  sbr)
    PODS=(a); CROSS_POD=a; NETOF=([a]=ms-sbr)
    ip addr add 10.67.0.1/32 dev lo
    mk ms-sbr '{type: "ptp", ipam: {type: "host-local", ranges: [[{subnet: "10.66.0.0/24"}]], routes: [{dst: "10.67.0.0/16"}]}}' \
      '{type: "sbr"}'
    ;;
  vlan)
    PODS=(a); CROSS_POD=a; NETOF=([a]=ms-vlan)
    ip -n lan link add link lan0 name lan0.5 type vlan id 5
    ip -n lan link set lan0.5 up; ip -n lan addr add 10.75.0.1/24 dev lan0.5
    mk ms-vlan '{type: "vlan", master: "eth0", vlanId: 5, ipam: {type: "static",
      addresses: [{address: "10.75.0.10/24", gateway: "10.75.0.1"}], routes: [{dst: "0.0.0.0/0"}]}}'
    ;;
  esac
  for p in "${PODS[@]}"; do ip netns add "$p"; ip -n "$p" link set lo up; done
  if [ "$scen" = sbr ]; then # the pod's primary network (eth0, the default route)
    ip link add pe0 type veth peer name eth0 netns a
    ip link set pe0 up; ip addr add 10.99.0.1/24 dev pe0
    ip -n a link set eth0 up; ip -n a addr add 10.99.0.2/24 dev eth0; ip -n a route add default via 10.99.0.1
  fi
}
# expect POD: the result, as res_sum prints it
expect() {
  local ipv=- dns=10.77.0.53; case $v in 0.*) ipv=4 ;; esac
  [ "$impl" = ref ] && dns=   # the reference macvlan replaces IPAM's dns with its own (unset)
  case $scen:$1 in
  macvlan:a) echo "$v | net1@/run/netns/a | 10.77.0.10/24 gw 10.77.0.1 if 0 | 0.0.0.0/0 via - | $dns | $ipv" ;;
  macvlan:b) echo "$v | net1@/run/netns/b | 10.77.0.11/24 gw - if 0 | 0.0.0.0/0 via 10.77.0.1 | $dns | $ipv" ;;
  macvlan:c) echo "$v | net1@/run/netns/c | 10.77.0.12/24 gw 10.77.0.1 if 0 | 0.0.0.0/0 via 10.77.0.1 | $dns | $ipv" ;;
  hostdev:a) echo "$v | net1@/run/netns/a | 10.78.0.10/24 gw - if 0 | 10.79.0.0/16 via 10.78.0.1 |  | $ipv" ;;
  sbr:a) echo "$v | veth@-,net1@/run/netns/a | 10.66.0.2/24 gw 10.66.0.1 if 1 | 10.67.0.0/16 via - |  | $ipv" ;;
  vlan:a) echo "$v | net1@/run/netns/a | 10.75.0.10/24 gw 10.75.0.1 if 0 | 0.0.0.0/0 via - |  | $ipv" ;;
  esac
}
res_sum() {
  jq -r '[.cniVersion, (.interfaces // [] | map("\(.name | sub("^veth[0-9a-f]+$"; "veth"))@\(.sandbox // "-")") | join(",")),
    (.ips // [] | map("\(.address) gw \(.gateway // "-") if \(.interface // "-")") | join(",")),
    (.routes // [] | map("\(.dst) via \(.gw // "-")") | join(",")), (.dns.nameservers // [] | join(",")),
    (.ips // [] | map(.version // "-") | join(","))] | join(" | ")' "$1"
}
# after_del WHAT BASELINE: the node and the pods as they were before ADD, no cache entry, no lease
after_del() {
  local d=$1 want=$2 now
  now=$(state "${PODS[@]}")
  if [ "$impl" = ref ] && [ "$scen" = hostdev ] && [ "$now" != "$want" ] &&
     [ "${now//\"alias\":\"hd0\"/\"alias\":null}" = "$want" ]; then
    note "$d: the 1.1.1 reference leaves hd0's alias set (v1.9.1 and cnikit clear it)"
    now=${now//\"alias\":\"hd0\"/\"alias\":null}
  fi
  t "$d: node and pods exactly as before ADD" diff <(echo "$want") <(echo "$now")
  t "$d: no cache entry, no lease" sh -c '! ls /var/lib/cni/results/ 2> /dev/null | grep . && ! ls /var/lib/cni/networks/*/ 2> /dev/null | grep "^10\."'
}

case $1 in
# -------------------------------------------------------------------------------------
attach) # RUNTIME IMPL SCEN VERSION: add / result / kernel / traffic / check / del / del again
  runtime=$2 impl=$3 scen=$4 v=$5
  P="$runtime $impl $scen $v:"
  base=$WORK/$runtime-$impl-$scen-$v
  setup "$impl" "$scen" "$v" "$base.d"
  baseline=$(state "${PODS[@]}")
  for p in "${PODS[@]}"; do
    t "$P add $p (${NETOF[$p]})" podrt "$runtime" add "$p" "$base.$p.json"
    [ -s "$base.$p.json" ] || echo '{}' > "$base.$p.json"
    teq "$P result of $p" "$(expect "$p")" "$(res_sum "$base.$p.json")"
  done
  t "$P uplink eth0 unchanged" sh -c "[ \"\$(ip -j -4 addr show eth0 | jq -c '.[0].addr_info | map(.local)')\" = '[\"10.77.0.2\"]' ] && ip route show default | grep -q 'via 10.77.0.1 dev eth0'"
  case $scen in
  macvlan)
    t "$P a: net1 is a bridge-mode macvlan of eth0 with 10.77.0.10/24, up" sh -c "ip -d -n a link show net1 | grep -q 'macvlan mode bridge' && ip -n a link show net1 | grep -q 'state UP' && ip -n a -4 addr show net1 | grep -q 'inet 10.77.0.10/24'"
    teq "$P b: MAC from runtimeConfig.mac (kernel, result)" "0a:58:0a:4d:00:0b 0a:58:0a:4d:00:0b" \
      "$(ip -j -n b link show net1 | jq -r '.[0].address') $(jq -r '.interfaces[0].mac' "$base.b.json")"
    t "$P b, c: addresses from runtimeConfig.ips and CNI_ARGS" sh -c "ip -n b -4 addr show net1 | grep -q 'inet 10.77.0.11/24' && ip -n c -4 addr show net1 | grep -q 'inet 10.77.0.12/24'"
    for p in a b c; do
      t "$P $p: default route via 10.77.0.1 dev net1" sh -c "ip -n $p route show default | grep -q 'via 10.77.0.1 dev net1'"
    done
    t "$P a → b, a → c, c → b (macvlan bridge mode)" eval "png a 10.77.0.11 && png a 10.77.0.12 && png c 10.77.0.11"
    t "$P a → the LAN server 10.77.0.100 through the master" png a 10.77.0.100
    t "$P b → 198.51.100.1 beyond the gateway (default route)" png b 198.51.100.1
    mkdir -p "$base.www"; echo "hello-$impl-$v" > "$base.www/index.html"
    ip netns exec lan "$BB" httpd -f -p 10.77.0.100:80 -h "$base.www" &
    PIDS+=($!)
    wait_port lan 80 || true
    teq "$P c fetches http://10.77.0.100/ from the LAN" "hello-$impl-$v" "$(http_get c 10.77.0.100 2>&1)"
    ;;
  hostdev)
    t "$P hd0 left the host" sh -c '! ip link show hd0'
    t "$P a: net1 is hd0 (its MAC, alias hd0), 10.78.0.10/24, up, route 10.79.0.0/16 via 10.78.0.1" sh -c "
      ip -j -n a link show net1 | jq -e '.[0] | .address == \"$HDMAC\" and .ifalias == \"hd0\" and .operstate == \"UP\"' &&
      ip -n a -4 addr show net1 | grep -q 'inet 10.78.0.10/24' && ip -n a route show 10.79.0.0/16 | grep -q 'via 10.78.0.1 dev net1'"
    teq "$P result: the device's MAC" "$HDMAC" "$(jq -r '.interfaces[0].mac' "$base.a.json")"
    t "$P a → its peer 10.78.0.1, → 10.79.0.1 through the route; host → a" eval "png a 10.78.0.1 && png a 10.79.0.1 && ping -c 1 -W 2 10.78.0.10"
    ;;
  sbr)
    t "$P a: rule from 10.66.0.2 lookup 100" sh -c "ip -n a rule show | grep -qE '^[0-9]+:\s+from 10.66.0.2 lookup 100'"
    t "$P a: table 100 has the default route via 10.66.0.1 and 10.67.0.0/16, main none of net1's" sh -c "
      ip -n a route show table 100 | grep -q '^default via 10.66.0.1 dev net1' && ip -n a route show table 100 | grep -q '^10.67.0.0/16 via 10.66.0.1 dev net1' &&
      ! ip -n a route show table main | grep net1 && ip -n a route show table main default | grep -q 'via 10.99.0.1 dev eth0'"
    t "$P a → the host end 10.66.0.1 and 10.67.0.1 from 10.66.0.2 (table 100)" eval "png a -I 10.66.0.2 10.66.0.1 && png a -I 10.66.0.2 10.67.0.1"
    ;;
  vlan)
    t "$P a: net1 is vlan 5 of eth0 with 10.75.0.10/24" sh -c "ip -d -n a link show net1 | grep -q 'vlan protocol 802.1Q id 5' && ip -n a -4 addr show net1 | grep -q 'inet 10.75.0.10/24'"
    t "$P a → 10.75.0.1 on VLAN 5 of the LAN" png a 10.75.0.1
    ;;
  esac

  # check
  checked=1
  for p in "${PODS[@]}"; do chk "$P check $p" "$runtime" check "$p" || checked=0; done
  if [ "$impl" = ours ] && [ "$checked" = 1 ]; then
    case $scen in
    macvlan | vlan) what="a's default route"; gw=$(ip -j -n a route show default | jq -r '.[0].gateway')
      undo=(ip -n a route del default); redo=(ip -n a route add default via "$gw" dev net1) ;;
    hostdev) what="the route 10.79.0.0/16"; undo=(ip -n a route del 10.79.0.0/16); redo=(ip -n a route add 10.79.0.0/16 via 10.78.0.1 dev net1) ;;
    sbr) what="the rule"; prio=$(ip -j -n a rule show | jq -r '.[] | select(.src == "10.66.0.2") | .priority')
      undo=(ip -n a rule del from 10.66.0.2 lookup 100); redo=(ip -n a rule add from 10.66.0.2 lookup 100 pref "$prio") ;;
    esac
    "${undo[@]}"
    tn "$P check a fails once $what is gone" podrt "$runtime" check a
    "${redo[@]}"
  fi
  state "${PODS[@]}" > "$base.state"

  # del
  for p in "${PODS[@]}"; do t "$P del $p" podrt "$runtime" del "$p"; done
  [ "$scen" != hostdev ] || teq "$P hd0 back on the host as hd0 with its MAC" "$HDMAC" "$(hd0_mac 2>&1)"
  after_del "$P after del" "$baseline"
  for p in "${PODS[@]}"; do del_again "$P del $p again" podrt "$runtime" del "$p"; done
  after_del "$P after del again" "$baseline"
  ;;

# -------------------------------------------------------------------------------------
cross) # IMPL SCEN: each runtime finishes what the other started, from the other's cache
  impl=$2 scen=$3 v=1.0.0
  P="cross-runtime $impl $scen $v:"
  setup "$impl" "$scen" "$v" "$WORK/cross-$impl-$scen.d"
  baseline=$(state "${PODS[@]}")
  p=$CROSS_POD; CID=$(cnitool_id "/run/netns/$p")
  t "$P cnitool add $p" podrt cnitool add "$p"
  # capability args (pod b's ips and mac) left out: they come from libcni's cache entry
  NOCAP=1 chk "$P cnikit net check $p (libcni's cache entry)" net check "$p" /dev/null --container-id "$CID" || true
  NOCAP=1 t "$P cnikit net del $p" podrt net del "$p" /dev/null --container-id "$CID"
  [ "$scen" != hostdev ] || teq "$P hd0 back on the host as hd0 with its MAC" "$HDMAC" "$(hd0_mac 2>&1)"
  after_del "$P after cnikit net del" "$baseline"
  del_again "$P cnitool del $p afterwards (nothing cached)" podrt cnitool del "$p"
  t "$P cnikit net add $p with cnitool's container ID" podrt net add "$p" /dev/null --container-id "$CID"
  chk "$P cnitool check $p (cnikit's cache entry)" cnitool check "$p" || true
  t "$P cnitool del $p" podrt cnitool del "$p"
  after_del "$P after cnitool del" "$baseline"
  ;;
*)
  echo "unknown phase $1" >&2
  exit 2
  ;;
esac
