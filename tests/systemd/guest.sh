#!/bin/bash
# Runs inside the booted Debian node (tests/systemd/run.sh): install the package and prove
# the units under systemd. Prints "ok - …" / "FAIL - …" and ends with
# "SYSTEMD-RESULT N passed, M failed"; exits non-zero on a failure.
set -uo pipefail
# shellcheck source=tests/systemd/common.sh
. /root/common.sh
# shellcheck source=tests/systemd/dhcp.sh
. /root/dhcp.sh

# ------------------------------------------------------------------ install
t "dpkg -i next to containernetworking-plugins and podman" dpkg -i /root/cnikit.deb
t "links in /opt/cni/bin" test "$(readlink /opt/cni/bin/bridge)" = cnikit
t "links in /usr/lib/cni (Debian's runtimes look there)" test "$(readlink -f /usr/lib/cni/portmap)" = /opt/cni/bin/cnikit
diverted() { # NAME…: Debian's plugin is aside, the name is cnikit's
  [ $# -gt 0 ] || { echo "no plugin named"; return 1; }
  for p; do
    test -x "/usr/lib/cni/$p.containernetworking-plugins" &&
      test "$(readlink -f "/usr/lib/cni/$p")" = /opt/cni/bin/cnikit || { echo "$p is not diverted"; return 1; }
  done
}
t "Debian's plugins cnikit has are diverted aside (ptp, host-device, vrf, dhcp)" diverted ptp host-device vrf dhcp
# Every plugin Debian's package installs: none is left that cnikit lacks.
# shellcheck disable=SC2046 # one name a word
t "every Debian plugin is diverted (none that cnikit lacks)" \
  diverted $(dpkg -L containernetworking-plugins | sed -n 's|^/usr/lib/cni/\([^/]*\)$|\1|p')
teq "ipamd.socket enabled" enabled "$(systemctl is-enabled ipamd.socket)"
teq "ipamd.socket listening" active "$(systemctl is-active ipamd.socket)"
teq "the daemon is not started before it is used" inactive "$(systemctl is-active ipamd.service)"
t "the socket file is 0600 root" test "$(stat -c %a:%U /run/cnikit/ipamd.sock)" = 600:root
dhcp_installed

# ------------------------------------------------------------------ first use
mkdir -p /etc/cni/net.d
cat >/etc/cni/net.d/10-pods.conflist <<'EOF'
{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "macspoofchk": true,
   "ipam": {"type": "ipamd", "ranges": [[{"subnet": "10.88.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
# pod<N> maps tcp 8080+N and udp 5350+N.
maps() {
  local n=${1#pod}
  echo "{\"portMappings\":[{\"hostPort\":$((8080 + n)),\"containerPort\":80,\"protocol\":\"tcp\"},{\"hostPort\":$((5350 + n)),\"containerPort\":53,\"protocol\":\"udp\"}]}"
}
add() { ip netns add "$1" && cnikit net add pods "$1" --container-id "$1" --cap-args "$(maps "$1")"; }
del() { cnikit net del pods "$1" --container-id "$1" && ip netns del "$1"; }
t "first ADD (bridge ipMasq+macspoofchk, ipamd, portmap tcp+udp)" add pod1
teq "socket activation: the first call started the daemon" active "$(systemctl is-active ipamd.service)"
teq "Type=notify: the daemon said READY" running "$(prop ipamd.service SubState)"
t "the daemon holds the lease" grep -q '"pod1"' <(leases)
t "the daemon applied the firewall changes (the hardening allows nftables)" test "$(firewall_ok)" -ge 3
teq "every firewall request to the daemon was served" 0 "$(firewall_not_ok)"
t "masquerade and port mappings are in nftables" bash -c 'nft -j list ruleset | grep -q pod1'
t "no error in the daemon's journal" bash -c '! journalctl -u ipamd.service -p err --no-pager -q | grep .'

# ------------------------------------------------------------------ crash
addr1=$(leases | grep -o '10\.88\.0\.[0-9]*' | head -1)
t "SIGKILL the daemon" systemctl kill -s KILL ipamd.service
for _ in $(seq 50); do [ "$(prop ipamd.service NRestarts)" -ge 1 ] 2>/dev/null && break; sleep 0.2; done
t "systemd restarts it (Restart=on-failure)" test "$(prop ipamd.service NRestarts)" -ge 1
t "second ADD after the crash" add pod2
teq "the daemon serves again" active "$(systemctl is-active ipamd.service)"
t "the acknowledged lease survived ($addr1)" grep -q "$addr1" <(leases)
addr2=$(leases | grep -o '10\.88\.0\.[0-9]*' | sort -u | grep -v "^$addr1\$" | head -1)
t "the new pod got another address ($addr2)" test -n "$addr2"

# ------------------------------------------------------------------ stopped
t "systemctl stop ipamd.socket ipamd.service" systemctl stop ipamd.socket ipamd.service
t "the socket file is gone" test ! -e /run/cnikit/ipamd.sock
t "ADD in-process with the daemon stopped" add pod3
t "DEL in-process with the daemon stopped" del pod3
t "systemctl start ipamd.socket" systemctl start ipamd.socket
t "DEL through the daemon again" del pod1
t "DEL of the pod added before the crash" del pod2
teq "no lease left" 0 "$(leases | grep -c '"address"')"
t "no nft element of the pods left" bash -c '! nft -j list ruleset | grep -q "pod[123]"'

# ------------------------------------------------------------------ dhcp
dhcp_used

# ------------------------------------------------------------------ remove
t "dpkg -r cnikit" dpkg -r cnikit
t "our links are gone" test ! -e /opt/cni/bin/bridge
t "the unit files are gone" bash -c '! test -e /usr/lib/systemd/system/ipamd.socket && ! test -e /usr/lib/systemd/system/ipamd.service'
t "Debian's plugins are back in /usr/lib/cni (diversions removed)" \
  bash -c 'for p in bridge ptp host-device vrf dhcp; do test -f /usr/lib/cni/$p && ! test -L /usr/lib/cni/$p || exit 1; done && ! dpkg-divert --list | grep -q cnikit'
dhcp_removed

report
