# shellcheck shell=bash disable=SC2154 # t, teq, prop, fail: guest.sh
# The dhcp IPAM plugin's lease daemon under systemd (sourced by guest.sh, which defines
# t, teq, prop): cnikit-dhcp.socket enabled and listening at the reference's path, the
# daemon started by the first dhcp ADD (macvlan on a LAN served by dnsmasq in a netns),
# its hardening letting it enter pods' netns and open packet sockets there, a SIGKILL'd
# daemon restarted and resuming the lease it recorded, DEL releasing at the server, and
# Debian's cni-dhcp units left alone.

DHCP_SOCK=/run/cni/dhcp.sock
DHCP_RECORDS=/var/lib/cni/dhcp/.dhcp-leases
LAN_LEASES=/tmp/lan.leases
LAN_LOG=/tmp/lan.log
# Debian's containernetworking-plugins ships cni-dhcp.socket/.service, not enabled.
debian_dhcp_units=
systemctl cat cni-dhcp.socket >/dev/null 2>&1 && debian_dhcp_units=yes

debian_dhcp_left_alone() { # WHEN
  [ -n "$debian_dhcp_units" ] || return 0
  teq "Debian's cni-dhcp.socket stays disabled ($1)" disabled "$(systemctl is-enabled cni-dhcp.socket)"
  teq "... and inactive: ours holds $DHCP_SOCK ($1)" inactive "$(systemctl is-active cni-dhcp.socket)"
}

# ------------------------------------------------------------------ after dpkg -i
dhcp_installed() {
  teq "cnikit-dhcp.socket enabled" enabled "$(systemctl is-enabled cnikit-dhcp.socket)"
  teq "cnikit-dhcp.socket listening" active "$(systemctl is-active cnikit-dhcp.socket)"
  teq "... at the reference's path" "$DHCP_SOCK (Stream)" "$(prop cnikit-dhcp.socket Listen)"
  t "the dhcp socket file is 0600 root" test "$(stat -c %a:%U $DHCP_SOCK)" = 600:root
  teq "the dhcp daemon is not started before it is used" inactive "$(systemctl is-active cnikit-dhcp.service)"
  debian_dhcp_left_alone "after install"
}

# ------------------------------------------------------------------ in use
# The LAN: dnsmasq in netns "lan" at the far end of a veth whose near end (lan0, in the
# node's namespace) is the pods' macvlan parent.
lan_up() {
  ip netns add lan &&
    ip link add lan0 type veth peer name srv0 netns lan &&
    ip link set lan0 up &&
    ip -n lan addr add 198.51.100.1/24 dev srv0 &&
    ip -n lan link set srv0 up &&
    ip -n lan link set lo up || return 1
  ip netns exec lan /usr/sbin/dnsmasq --no-daemon --conf-file=/dev/null --port=0 --no-ping \
    --user=root --pid-file --log-dhcp --dhcp-authoritative \
    --dhcp-range=198.51.100.100,198.51.100.150,255.255.255.0,1h \
    --dhcp-leasefile=$LAN_LEASES --log-facility=$LAN_LOG --interface=srv0 \
    </dev/null >/dev/null 2>&1 &
  LAN_DNSMASQ=$!
  within 10 grep -q "DHCP, IP range" $LAN_LOG
}
within() { # SECONDS CMD...: CMD succeeds within SECONDS
  local n=$(($1 * 5)); shift
  for _ in $(seq "$n"); do "$@" && return 0; sleep 0.2; done
  "$@"
}
dadd() { ip netns add "$1" && cnikit net add lan "$1" --container-id "$1" >"/tmp/$1.json"; }
ddel() { cnikit net del lan "$1" --container-id "$1" && ip netns del "$1"; }
addr_of() { grep -o '198\.51\.100\.[0-9]*' "/tmp/$1.json" | head -1; }
another() { in_range "$1" && [ "$1" != "$2" ]; }
in_range() { case "$1" in 198.51.100.1[0-4][0-9]|198.51.100.150) return 0 ;; esac; echo "not in the range: '$1'"; return 1; }
pod_has() { ip -n "$1" -4 -o addr show eth0 | tee /dev/stderr | grep -q " $2/24 "; }
server_lists() { grep -q " $1 " $LAN_LEASES; }
server_forgot() { ! grep " $1 " $LAN_LEASES; }
records() { find $DHCP_RECORDS -type f -name '*.json' 2>/dev/null | wc -l; }
restarted() { [ "$(prop cnikit-dhcp.service NRestarts)" -ge 1 ]; }
is_active() { [ "$(systemctl is-active "$1")" = active ]; }
new_pid() { local p; p=$(prop cnikit-dhcp.service MainPID); [ "$p" != 0 ] && [ "$p" != "$1" ]; }
resumed_one() { journalctl -u cnikit-dhcp.service --no-pager -q | grep -q 'resumed 1 lease'; }

dhcp_used() {
  t "the LAN: dnsmasq in a netns behind lan0" lan_up
  cat >/etc/cni/net.d/20-lan.conflist <<'EOF'
{"cniVersion": "1.1.0", "name": "lan", "plugins": [
  {"type": "macvlan", "master": "lan0", "ipam": {"type": "dhcp"}}]}
EOF
  t "dhcp ADD (macvlan on lan0 + dhcp)" dadd dpod1
  teq "socket activation: the dhcp ADD started the daemon" active "$(systemctl is-active cnikit-dhcp.service)"
  teq "Type=notify: the dhcp daemon said READY" running "$(prop cnikit-dhcp.service SubState)"
  local a1 a2 pid
  a1=$(addr_of dpod1)
  t "the result's address is from dnsmasq's range ($a1)" in_range "$a1"
  t "the pod's eth0 has it" pod_has dpod1 "$a1"
  t "dnsmasq's lease file lists it" within 5 server_lists "$a1"
  teq "the daemon recorded the lease" 1 "$(records)"
  # The hardening is in force, and the lease above was taken under it: the daemon entered
  # the pod's netns (CAP_SYS_ADMIN) and opened a packet socket there (AF_PACKET, CAP_NET_RAW).
  pid=$(prop cnikit-dhcp.service MainPID)
  teq "ProtectSystem=strict" strict "$(prop cnikit-dhcp.service ProtectSystem)"
  t "RestrictAddressFamilies has AF_PACKET" bash -c "systemctl show -p RestrictAddressFamilies --value cnikit-dhcp.service | grep -qw AF_PACKET"
  # CHOWN DAC_OVERRIDE FOWNER NET_ADMIN NET_RAW SYS_PTRACE SYS_ADMIN: bits 0 1 3 12 13 19 21.
  teq "the daemon's bounding set is the unit's" 000000000028300b "$(awk '/^CapBnd/ {print $2}' /proc/$pid/status)"
  teq "StateDirectory=cni/dhcp, mode 0700" 700:root "$(stat -c %a:%U /var/lib/cni/dhcp)"
  t "STATUS: the daemon answers" cnikit net status lan
  # A netns made while the daemon runs reaches it through its mount namespace's propagation.
  t "dhcp ADD of a pod whose netns was made after the daemon started" dadd dpod2
  a2=$(addr_of dpod2)
  t "it got another address ($a2)" another "$a2" "$a1"
  t "dnsmasq lists it" within 5 server_lists "$a2"
  t "DEL of the second pod" ddel dpod2
  t "... released at the server" within 10 server_forgot "$a2"
  teq "... and forgotten by the daemon" 1 "$(records)"

  # ---------------------------------------------------------------- crash
  t "SIGKILL the dhcp daemon" systemctl kill -s KILL cnikit-dhcp.service
  t "systemd restarts it (Restart=on-failure)" within 10 restarted
  t "... and it is active again" within 10 is_active cnikit-dhcp.service
  t "... a new process ($pid was killed)" new_pid "$pid"
  t "the restarted daemon resumed the recorded lease (journal: resumed 1 lease)" within 5 resumed_one
  t "CHECK after the restart (the new daemon holds the lease)" cnikit net check lan dpod1 --container-id dpod1
  t "the server still holds the lease" server_lists "$a1"
  t "DEL after the restart" ddel dpod1
  t "... released at the server (dnsmasq's lease file drops it)" within 10 server_forgot "$a1"
  teq "no lease record left" 0 "$(records)"
  # The daemon's own lines (systemd's about the SIGKILL above are not its).
  t "no warning or error in the dhcp daemon's journal" \
    bash -c '! journalctl _SYSTEMD_UNIT=cnikit-dhcp.service -p warning --no-pager -q | grep .'
  debian_dhcp_left_alone "after use"
  if [ "$fail" != 0 ]; then
    echo "---- cnikit-dhcp.service journal"; journalctl -u cnikit-dhcp.service --no-pager -q | tail -40
    echo "---- dnsmasq"; tail -30 $LAN_LOG
  fi
  kill "$LAN_DNSMASQ" 2>/dev/null
  rm -f /etc/cni/net.d/20-lan.conflist
  ip netns del lan
}

# ------------------------------------------------------------------ after dpkg -r
debian_takes_path() {
  systemctl start cni-dhcp.socket && test -S $DHCP_SOCK &&
    [ "$(prop cni-dhcp.socket Listen)" = "$DHCP_SOCK (Stream)" ]
}
dhcp_removed() {
  t "the dhcp unit files are gone" bash -c '! test -e /usr/lib/systemd/system/cnikit-dhcp.socket && ! test -e /usr/lib/systemd/system/cnikit-dhcp.service'
  t "the dhcp socket was stopped (its file is gone)" test ! -e $DHCP_SOCK
  t "/usr/lib/cni/dhcp is Debian's again" \
    bash -c 'test -f /usr/lib/cni/dhcp && ! test -L /usr/lib/cni/dhcp && dpkg -S /usr/lib/cni/dhcp | grep -q "^containernetworking-plugins:"'
  [ -n "$debian_dhcp_units" ] || return 0
  t "Debian's cni-dhcp.socket can take the path back" debian_takes_path
  systemctl stop cni-dhcp.socket
}
