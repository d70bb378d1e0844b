#!/bin/bash
# Runs inside the booted Debian node (tests/systemd/run.sh): install the package and prove
# the units under systemd. Prints "ok - …" / "FAIL - …" and ends with
# "SYSTEMD-RESULT N passed, M failed"; exits non-zero on a failure.
set -uo pipefail
# shellcheck source=tests/systemd/common.sh
. /root/common.sh
# shellcheck source=tests/systemd/dhcp.sh
. /root/dhcp.sh
# shellcheck source=tests/systemd/cluster.sh
. /root/cluster.sh

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

# ------------------------------------------------------------------ firewall (re)loads
# Debian's nftables.service loads /etc/nftables.conf, which begins with `flush ruleset`, on
# every start, restart and reload: cnikit-firewall-restore.service puts the pods' state back
# after it when the daemon does not run; while it runs, the daemon does, and the unit's run
# after it finds nothing (or the unit is first and the daemon finds nothing: either order).
unit=cnikit-firewall-restore.service
hostport() { # POD: its TCP host port answers via 127.0.0.1 within 3 s
  local port=$((8080 + ${1#pod})) got= _
  for _ in $(seq 15); do
    got=$(ask - 127.0.0.1 $port)
    [ "$got" = "$1" ] && return 0
    sleep 0.2
  done
  echo "127.0.0.1:$port answered '$got', want '$1'"
  journalctl -u $unit -u ipamd.service -o cat --no-pager -q | tail -8
  nft list table inet cnikit 2>&1 | head -40
  return 1
}
pods_answer() { hostport pod1 && hostport pod2; }
runs() { journalctl -u $unit -o cat --no-pager -q | grep -c '^firewall: '; }
last_run() { journalctl -u $unit -o cat --no-pager -q | grep '^firewall: ' | tail -1; }
ran_again() { # N: the unit ran again since it had run N times, and put something back
  local n
  for _ in $(seq 15); do n=$(runs); [ "$n" -gt "$1" ] && break; sleep 0.2; done
  [ "$n" -gt "$1" ] || { echo "the unit did not run again ($n runs)"; return 1; }
  last_run | grep -q '^firewall: put back' || { echo "its last run: $(last_run)"; return 1; }
}
teq "$unit enabled" enabled "$(systemctl is-enabled $unit)"
t "$unit wanted by nftables.service and firewalld.service" test -L /etc/systemd/system/nftables.service.wants/$unit -a -L /etc/systemd/system/firewalld.service.wants/$unit
t "the package started it: a restore that found nothing to do" grep -q '^firewall: nothing to put back (0 attachments' <(journalctl -u $unit -o cat --no-pager -q)
teq "it stopped again: no firewall service runs (StopWhenUnneeded)" inactive "$(systemctl is-active $unit)"
serve_at pod1 0.0.0.0:80 pod1; servers=$!
serve_at pod2 0.0.0.0:80 pod2; servers="$servers $!"
t "the pods' host ports answer via 127.0.0.1" pods_answer
t "the daemon stopped (systemctl stop ipamd.socket ipamd.service)" systemctl stop ipamd.socket ipamd.service
n=$(runs)
t "systemctl enable --now nftables (its first start flushes the ruleset)" systemctl enable --now nftables.service
t "the unit ran after it and put the pods' state back" ran_again "$n"
t "the pods' host ports answer again" pods_answer
teq "the unit stays active while nftables is (so a reload reaches it)" active "$(systemctl is-active $unit)"
n=$(runs)
t "systemctl restart nftables (daemon stopped)" systemctl restart nftables.service
t "the unit ran again and put it back" ran_again "$n"
t "the pods' host ports answer after the restart" pods_answer
n=$(runs)
t "systemctl reload nftables (daemon stopped)" systemctl reload nftables.service
t "the unit ran again (ExecReload=) and put it back" ran_again "$n"
t "the pods' host ports answer after the reload" pods_answer
t "the daemon started (systemctl start ipamd.socket ipamd.service)" systemctl start ipamd.socket ipamd.service
teq "the daemon runs" active "$(systemctl is-active ipamd.service)"
for verb in restart reload; do
  n=$(runs)
  t "systemctl $verb nftables (daemon running)" systemctl $verb nftables.service
  t "the pods' host ports answer after the $verb" pods_answer
  for _ in $(seq 15); do [ "$(runs)" -gt "$n" ] && break; sleep 0.2; done
  echo "# after the $verb the unit said: $(last_run)"
done
# Which of the two was first above is a race; a flush by hand involves no unit.
daemon_puts() { journalctl -u ipamd.service -o cat --no-pager -q | grep -c 'firewall: after a change by process .*, put back'; }
n=$(daemon_puts)
t "nft flush ruleset by hand (daemon running)" nft flush ruleset
t "the daemon put it back by itself" pods_answer
daemon_put_more() { [ "$(daemon_puts)" -gt "$1" ]; }
t "its journal says so" within 3 daemon_put_more "$n"
t "systemctl status $unit: active, ran successfully" systemctl status --no-pager $unit
teq "its result" success "$(prop $unit Result)"
teq "its last exit status" 0 "$(prop $unit ExecMainStatus)"
t "no error in its journal (the hardening lets it work)" bash -c "! journalctl -u $unit -p warning --no-pager -q | grep ."
# shellcheck disable=SC2086 # one pid a word
kill $servers 2>/dev/null

# ------------------------------------------------------------------ cluster pools
cluster_mode

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
t "nftables.service restarts after the removal (its Wants= of the gone unit is ignored)" systemctl restart nftables.service
dhcp_removed

report
