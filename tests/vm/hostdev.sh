# Sourced by the VM's /init after tests/vm/guest.sh (its helpers: cni, chk, del, t, tn, teq,
# nsreset, has, lease_held, no_lease): the host-device plugin with a real PCI NIC, the
# virtio-net device run.sh gives the guest at 0000:00:05.0 (MAC 52:54:00:12:34:56). Its
# driver is loaded only here, after guest.sh made the node's own eth0, so it gets the next
# free ethN. By `pciBusID`, `runtimeConfig.deviceID`, `kernelpath`; DEL after the pod's
# netns is gone (the kernel returns the NIC to this, the initial, netns under its pod name,
# and DEL renames it back); DEL when its name was taken meanwhile; the reference
# (/ref/host-device) on the same configuration.

HD_PCI=0000:00:05.0
HD_MAC=52:54:00:12:34:56
while read -r ko; do insmod "$ko" 2> /dev/null || echo "insmod $ko FAILED"; done < /modules.hostdev
hd_name() { ls "/sys/bus/pci/devices/$HD_PCI"/virtio*/net/ 2> /dev/null | head -1; }
# hd_at NETNS NAME: the link NAME in NETNS ("" = here) has the NIC's MAC
hd_at() { ip ${1:+-n "$1"} link show "$2" 2> /dev/null | grep -q "link/ether $HD_MAC"; }
hd_alias() { ip ${1:+-n "$1"} -d link show "$2" | sed -n 's/^ *alias //p'; }
# hd_is NETNS NAME ALIAS: NAME in NETNS ("" = here) is the NIC, with alias ALIAS ("" = none)
hd_is() { hd_at "$1" "$2" && [ "$(hd_alias "$1" "$2")" = "$3" ]; }
# hd_wait NAME: the NIC shows up here as NAME within 5 s (netns teardown is asynchronous)
hd_wait() { for _ in 1 2 3 4 5 6 7 8 9 10; do hd_at "" "$1" && return 0; sleep 0.5; done; return 1; }
hd_ref() { CNI_BIN=/ref cni "$@"; }
HD=$(hd_name)
if [ -z "$HD" ]; then
  bad "host-device: no virtio-net device at $HD_PCI (run.sh's -device virtio-net-pci)"
else
  hdconf() { # FILE KEY-JSON [IPAM: 1]
    _i=
    [ -n "${3:-}" ] && _i=',"ipam":{"type":"ipamd","dataDir":"'$IPAM_DIR'","ranges":[[{"subnet":"10.77.0.0/24"}]]}'
    echo '{"cniVersion":"1.0.0","name":"hd","type":"host-device",'"$2$_i"'}' > "$1"
  }
  # round FILE WHAT: ADD as net1 in netns hd, CHECK, DEL twice; the NIC in the pod, then back
  round() {
    nsreset hd
    t "host-device $2: ADD" cni ADD hd1 /run/netns/hd net1 "$1"
    t "host-device $2: the NIC is net1 in the pod, alias $HD" hd_is hd net1 "$HD"
    t "host-device $2: CHECK" chk hd1 /run/netns/hd net1 "$1"
    t "host-device $2: DEL" del hd1 /run/netns/hd net1 "$1"
    t "host-device $2: DEL again" del hd1 /run/netns/hd net1 "$1"
    t "host-device $2: back as $HD, no alias" hd_is "" "$HD" ""
    rm -f /tmp/res-hd1-net1.json
  }
  hdconf /tmp/hd-pci.json '"pciBusID":"'$HD_PCI'"' 1
  round /tmp/hd-pci.json "pciBusID + ipamd"
  hdconf /tmp/hd-devid.json '"device":"","runtimeConfig":{"deviceID":"'$HD_PCI'"}'
  round /tmp/hd-devid.json "runtimeConfig.deviceID"
  KP=$(readlink -f "/sys/bus/pci/devices/$HD_PCI"/virtio*)
  hdconf /tmp/hd-kp.json '"kernelpath":"'"$KP"'"'
  round /tmp/hd-kp.json "kernelpath $KP"

  # The pod's netns deleted: the kernel moves the NIC here as net1 (alias kept); DEL renames it.
  nsreset hd
  t "host-device netns gone: ADD" cni ADD hd2 /run/netns/hd net1 /tmp/hd-pci.json
  A=$(addr_of /tmp/res-hd2-net1.json)
  ip netns del hd
  t "host-device netns gone: the kernel returned the NIC as net1" hd_wait net1
  t "host-device netns gone: DEL" cni DEL hd2 /run/netns/hd net1 /tmp/hd-pci.json
  t "host-device netns gone: renamed back to $HD, no alias" hd_is "" "$HD" ""
  t "host-device netns gone: lease $A released" no_lease "${A%/*}"

  # The name taken on the host meanwhile: DEL succeeds, the NIC comes back as ${HD}_0.
  nsreset hd
  t "host-device name taken: ADD" cni ADD hd3 /run/netns/hd net1 /tmp/hd-pci.json
  ip link add "$HD" type veth peer name hdtaken
  t "host-device name taken: DEL succeeds" cni DEL hd3 /run/netns/hd net1 /tmp/hd-pci.json
  t "host-device name taken: back as ${HD}_0, alias $HD" hd_is "" "${HD}_0" "$HD"
  ip link del "$HD"
  ip link set "${HD}_0" name "$HD" && ip link set "$HD" alias ""

  # The reference on the same configuration (without IPAM: its host-local is elsewhere).
  if [ -x /ref/host-device ]; then
    hdconf /tmp/hd-ref.json '"pciBusID":"'$HD_PCI'"'
    for run in hd_ref cni; do
      nsreset hd
      t "host-device ($run): ADD by pciBusID" $run ADD hd4 /run/netns/hd net1 /tmp/hd-ref.json
      tr -d ' \n' < /tmp/out.json | sed 's/"cniVersion":"[^"]*",//' > "/tmp/hd-out-$run.json"
      t "host-device ($run): the NIC in the pod as net1" hd_at hd net1
      t "host-device ($run): DEL" $run DEL hd4 /run/netns/hd net1 /tmp/hd-ref.json
      t "host-device ($run): back as $HD" hd_at "" "$HD"
      ip link set "$HD" alias ""
    done
    teq "host-device: the same ADD result as the reference" "$(cat /tmp/hd-out-hd_ref.json)" "$(cat /tmp/hd-out-cni.json)"
  fi
  ip netns del hd 2> /dev/null
fi
