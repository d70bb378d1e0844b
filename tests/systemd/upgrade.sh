#!/bin/bash
# The upgrade scenario (issue 24), inside a fresh node booted by tests/systemd/run.sh: pods
# attached by the previous release (/root/cnikit-old.deb, built from this repository's
# history by old-package.sh), the package upgraded in place (`dpkg -i /root/cnikit.deb`),
# and then:
#  - the maintainer scripts stopped the daemon before unpacking, and the first call after
#    the upgrade starts the new binary;
#  - every old pod keeps its port mappings (TCP from a host outside the node) and its
#    masquerade (a connection to that host, which has no route back to the pods) working;
#  - the lease journal and the leases carry over (an old pod's lease is still held; a new
#    pod gets another address);
#  - old plugins against the new daemon and new plugins against the old one both work
#    (the request protocol's versions, src/firewall/backend.rs);
#  - a new ADD leaves the new nftables layout (masq-pods, pm-masquerade) and none of the
#    old postrouting chains (masq-postrouting, pm-postrouting);
#  - CHECK, DEL and GC of every old pod work and leave no element tagged with its
#    attachment anywhere in the ruleset;
#  - a downgrade to the previous release with a pod running (dpkg goes ahead: see
#    docs/operations.md "Upgrades"), a pod attached and one deleted by the old release,
#    and an upgrade again whose GC removes what that DEL left.
# Prints "ok - …" / "FAIL - …" and ends with "SYSTEMD-RESULT N passed, M failed".
set -uo pipefail
# shellcheck source=tests/systemd/common.sh
. /root/common.sh

OLD_DEB=/root/cnikit-old.deb
NEW_DEB=/root/cnikit.deb
OLD_V=$(dpkg-deb -f $OLD_DEB Version)
NEW_V=$(dpkg-deb -f $NEW_DEB Version)
installed() { dpkg-query -W -f='${Version}' cnikit 2>/dev/null; }
JOURNAL=/var/lib/cni/ipamd/pods/journal
EXT=192.0.2.2

# ------------------------------------------------------------------ helpers
# Pod <name><N> maps tcp 8080+N and udp 5350+N; its server on :80 answers its name.
maps() {
  local n=${1##*[a-z]}
  echo "{\"portMappings\":[{\"hostPort\":$((8080 + n)),\"containerPort\":80,\"protocol\":\"tcp\"},{\"hostPort\":$((5350 + n)),\"containerPort\":53,\"protocol\":\"udp\"}]}"
}
# add NAME [BIN_DIR]: ADD with the plugins of BIN_DIR (default: the installed ones).
add() {
  local bin=${2:-/opt/cni/bin}
  ip netns add "$1" &&
    "$bin/cnikit" net add pods "$1" --container-id "$1" --cni-path "$bin" --cap-args "$(maps "$1")" >/dev/null &&
    serve "$1"
}
# del NAME [BIN_DIR], check NAME [BIN_DIR]: likewise
del() {
  local bin=${2:-/opt/cni/bin}
  "$bin/cnikit" net del pods "$1" --container-id "$1" --cni-path "$bin" && ip netns del "$1"
}
check() { local bin=${2:-/opt/cni/bin}; "$bin/cnikit" net check pods "$1" --container-id "$1" --cni-path "$bin"; }
serve() { serve_at "$1" 0.0.0.0:80 "$1"; }
# The port mapping: from the host outside, to the node's address and the pod's host port.
mapped() { answers "$1" ext 192.0.2.1 $((8080 + ${1##*[a-z]})); }
# Masquerade: the outside host has no route to the pods; only a masqueraded connection is answered.
masqueraded() { answers ext "$1" $EXT 7000; }
traffic() { # POD...: port mapping and masquerade of each
  local p
  for p; do mapped "$p" && masqueraded "$p" || return 1; done
}
# The address container $1 holds, from the table `cnikit ipamd leases` prints.
addr_of() { cnikit ipamd leases --network pods | awk -v c="$1" '$3 == c { print $2; exit }'; }
tag() { echo "pods/$1/eth0"; }
# How many nftables objects (elements, rules) of the whole ruleset carry attachment $1's tag.
tagged() { nft -j list ruleset | grep -oE "\"comment\": *\"pods\\\\?/$1\\\\?/eth0\"" | wc -l; }
untagged() { # POD...: nothing in the ruleset carries their tags
  local p n
  for p; do
    n=$(tagged "$p")
    [ "$n" = 0 ] || { echo "$n objects still tagged $(tag "$p")"; nft list ruleset | grep -F "$(tag "$p")"; return 1; }
  done
}
chain_exists() { nft list chain inet cnikit "$1" >/dev/null 2>&1; }
no_chain() { ! chain_exists "$1" || { echo "chain $1 is still there"; return 1; }; }
holds() { # POD...: each holds a lease
  local p
  for p; do [ -n "$(addr_of "$p")" ] || { echo "no lease of $p"; cnikit ipamd leases --network pods; return 1; }; done
}
freed() { [ -z "$(addr_of "$1")" ] || { echo "$1 still holds a lease"; return 1; }; }
# $1 is an address and none of the old pods' ($OLD_ADDRS) is
another_address() { [ -n "$1" ] && ! echo "$OLD_ADDRS" | grep -qxF "$1"; }
daemon_exe() { readlink "/proc/$(prop ipamd.service MainPID)/exe"; }
dump() {
  echo "---- ipamd.service journal"; journalctl -u ipamd.service --no-pager -q | tail -40
  echo "---- nft list table inet cnikit"; nft list table inet cnikit 2>&1 | head -80
}

# ------------------------------------------------------------------ the previous release
t "dpkg -i of the previous release ($OLD_V)" dpkg -i $OLD_DEB
teq "installed: $OLD_V" "$OLD_V" "$(installed)"
t "the new package is newer than the installed one ($NEW_V > $OLD_V)" dpkg --compare-versions "$NEW_V" gt "$OLD_V"
mkdir -p /etc/cni/net.d
cat >/etc/cni/net.d/10-pods.conflist <<'EOF'
{"cniVersion": "1.1.0", "name": "pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "macspoofchk": true,
   "ipam": {"type": "ipamd", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
# The host outside the node: 192.0.2.2 behind ext0 (the node's 192.0.2.1), with no route
# to the pods' subnet, serving on :7000.
ext_up() {
  ip netns add ext &&
    ip link add ext0 type veth peer name eth0 netns ext &&
    ip addr add 192.0.2.1/24 dev ext0 && ip link set ext0 up &&
    ip -n ext addr add $EXT/24 dev eth0 && ip -n ext link set eth0 up && ip -n ext link set lo up &&
    serve_at ext $EXT:7000 ext
}
t "the outside host (netns ext, no route to the pods)" ext_up
OLD_PODS=(old1 old2 old3)
for p in "${OLD_PODS[@]}"; do t "ADD $p by $OLD_V (bridge ipMasq+macspoofchk, ipamd, portmap)" add "$p"; done
teq "the previous release's daemon served them" active "$(systemctl is-active ipamd.service)"
t "port mappings and masquerade of the old pods carry traffic" traffic "${OLD_PODS[@]}"
# A plugin of the new release against the daemon of the old one: what the upgrade's
# window would be without preinst stopping the daemon. The old daemon ignores the request's
# protocol field; an operation it does not know (400) the plugin does itself.
mkdir -p /root/new && dpkg-deb -x $NEW_DEB /root/new
ok_before=$(firewall_ok); not_ok_before=$(firewall_not_ok)
t "ADD mix4 with $NEW_V's plugins against $OLD_V's daemon" add mix4 /root/new/opt/cni/bin
echo "# $OLD_V's daemon served $(($(firewall_ok) - ok_before)) of mix4's firewall requests; $(($(firewall_not_ok) - not_ok_before)) it did not (done in-process)"
t "mix4 carries traffic" traffic mix4
OLD_ADDRS=$(for p in "${OLD_PODS[@]}" mix4; do addr_of "$p"; done | sort -u)
teq "four leases, four addresses" 4 "$(echo "$OLD_ADDRS" | grep -c .)"
cp $JOURNAL /root/journal.before
journal_ino=$(stat -c %i $JOURNAL)
teq "every firewall request to the old daemon was served" 0 "$(firewall_not_ok)"
old_pid=$(prop ipamd.service MainPID)

# ------------------------------------------------------------------ the upgrade
t "dpkg -i $NEW_V over $OLD_V (pods running)" bash -c "dpkg -i $NEW_DEB >/tmp/upgrade.out 2>&1"
grep -E "^cnikit:|warning" /tmp/upgrade.out | sed 's/^/    | /'
teq "installed: $NEW_V" "$NEW_V" "$(installed)"
t "preinst said it upgrades and stopped ipamd" grep -q "cnikit: upgrading from $OLD_V to $NEW_V" /tmp/upgrade.out
t "the old daemon ($old_pid) is gone" test ! -d "/proc/$old_pid"
teq "ipamd.socket enabled" enabled "$(systemctl is-enabled ipamd.socket)"
teq "ipamd.socket listening again" active "$(systemctl is-active ipamd.socket)"
teq "the daemon waits for the next call" inactive "$(systemctl is-active ipamd.service)"
teq "cnikit-dhcp.socket still listening" active "$(systemctl is-active cnikit-dhcp.socket)"
teq "the installed binary is $NEW_V's" "cnikit ${NEW_V%-*}" "$(/opt/cni/bin/cnikit --version)"
# Before any firewall change of the new release: the kernel still has the old layout.
t "the old pods' port mappings and masquerade still carry traffic" traffic "${OLD_PODS[@]}" mix4
t "the leases carry over: every old pod's lease is held" holds "${OLD_PODS[@]}" mix4
teq "socket activation started the new daemon" active "$(systemctl is-active ipamd.service)"
teq "... from the new binary" /opt/cni/bin/cnikit "$(daemon_exe)"
teq "the lease journal is the same file" "$journal_ino" "$(stat -c %i $JOURNAL)"
t "... with every record the old release wrote" cmp -n "$(stat -c %s /root/journal.before)" /root/journal.before $JOURNAL
t "the store passes fsck" cnikit ipamd fsck

# A plugin of the old release against the new daemon: requests without a protocol field.
old_plugins() { mkdir -p /root/old && dpkg-deb -x $OLD_DEB /root/old; }
t "the old release's plugins, unpacked aside" old_plugins
ok_before=$(firewall_ok)
t "ADD oldp6 with $OLD_V's plugins against $NEW_V's daemon" add oldp6 /root/old/opt/cni/bin
t "CHECK oldp6 with $OLD_V's plugins" check oldp6 /root/old/opt/cni/bin
t "the new daemon served the old plugins' firewall requests" test "$(firewall_ok)" -gt "$ok_before"
teq "... every one of them" 0 "$(firewall_not_ok)"

t "ADD new5 by $NEW_V" add new5
new_addr=$(addr_of new5)
t "new5 got an address no old pod has ($new_addr)" another_address "$new_addr"
t "the new layout: chain masq-pods" chain_exists masq-pods
t "the new layout: chain pm-masquerade" chain_exists pm-masquerade
t "the old chain masq-postrouting is gone" no_chain masq-postrouting
t "the old chain pm-postrouting is gone" no_chain pm-postrouting
t "every pod carries traffic after the new ADD" traffic "${OLD_PODS[@]}" mix4 oldp6 new5

# ------------------------------------------------------------------ CHECK, DEL, GC of the old pods
for p in "${OLD_PODS[@]}" mix4 oldp6; do t "CHECK $p by $NEW_V" check "$p"; done
t "DEL old1" del old1
t "... nothing tagged $(tag old1) is left" untagged old1
t "... its lease is freed" freed old1
# GC: the runtime no longer knows old2 (its cache entry gone); the plugins' GC collects it.
forget() { find /var/lib/cni/results -name "pods-$1-eth0*" -print -delete | grep -q .; }
t "the runtime forgets old2 (its result cache entry)" forget old2
t "GC (old2 not among the valid attachments)" cnikit net gc pods
t "... nothing tagged $(tag old2) is left" untagged old2
t "... its lease is freed" freed old2
ip netns del old2
t "GC left the others: CHECK old3" check old3
t "... and it carries traffic" traffic old3
for p in old3 mix4; do t "DEL $p" del "$p"; done
t "DEL oldp6 with $OLD_V's plugins (the new daemon serves them)" del oldp6 /root/old/opt/cni/bin
t "... nothing tagged by any old pod is left" untagged old1 old2 old3 mix4 oldp6
teq "every firewall request was served by the daemon" 0 "$(firewall_not_ok)"
t "no error in the daemon's journal since the upgrade" \
  bash -c "! journalctl -u ipamd.service -p err --no-pager -q --since '@$(stat -c %Y /root/journal.before)' | grep ."
t "new5 still carries traffic" traffic new5

t "dpkg -i $NEW_V again (a reinstall)" bash -c "dpkg -i $NEW_DEB >/tmp/reinstall.out 2>&1"
t "... preinst knows it for one" grep -q "cnikit: reinstalling $NEW_V" /tmp/reinstall.out
t "... and new5 carries traffic" traffic new5

# ------------------------------------------------------------------ downgrade
# dpkg goes ahead (see docs/operations.md): the new prerm says what it leaves, stops the
# daemon, and the old release's scripts take over. new5 (attached by $NEW_V) keeps running.
t "dpkg -i $OLD_V over $NEW_V (a downgrade, new5 running)" bash -c "dpkg -i $OLD_DEB >/tmp/downgrade.out 2>&1"
grep -E "^cnikit:|warning" /tmp/downgrade.out | sed 's/^/    | /'
teq "installed: $OLD_V" "$OLD_V" "$(installed)"
t "the new prerm warned about the downgrade" grep -q "cnikit: downgrading from $NEW_V to $OLD_V" /tmp/downgrade.out
t "new5 still carries traffic" traffic new5
t "the downgraded daemon reads the journal: new5's lease is held" holds new5
teq "... and runs the old binary" /opt/cni/bin/cnikit "$(daemon_exe)"
t "ADD down7 by $OLD_V after the downgrade" add down7
t "down7 carries traffic" traffic down7
# What the prerm warns of: the old release's DEL of a pod attached by the new one.
t "DEL new5 (attached by $NEW_V) by $OLD_V" del new5
echo "# $OLD_V's DEL left $(tagged new5) object(s) tagged $(tag new5) (in sets it does not know)"
t "dpkg -i $NEW_V again" dpkg -i $NEW_DEB
teq "installed: $NEW_V" "$NEW_V" "$(installed)"
t "CHECK down7 (attached by $OLD_V after the downgrade)" check down7
t "... and it carries traffic" traffic down7
t "GC" cnikit net gc pods
t "... removed what $OLD_V's DEL of new5 left" untagged new5
t "DEL down7" del down7
t "nothing tagged by any pod is left" untagged old1 old2 old3 mix4 oldp6 new5 down7
teq "no lease left" 0 "$(leases | grep -c '"address"')"
teq "every firewall request was served by the daemon" 0 "$(firewall_not_ok)"

[ "$fail" = 0 ] || dump
report
