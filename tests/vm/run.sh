#!/usr/bin/env bash
# Real-kernel suite: boot Debian's stock kernel (it has ipvlan, dummy, 802.1q and bridge
# VLAN filtering as modules, which the CI machine's kernel lacks) under qemu with a busybox
# initramfs, put the release `cnikit` binary into the guest, and run tests/vm/guest.sh there:
# ipvlan l2/l3/l3s, (bridge_vlans.sh) bridge VLANs, macvlan modes, ipamd in-process fallback, dummy (with ipamd and
# static), tuning, (links.sh) vlan and vrf, and (netfilter.sh) nftables (ipMasq, portmap,
# macspoofchk, firewall) and tc (bandwidth), and (hostdev.sh) host-device with a virtio-net PCI
# NIC, and (multihome.sh) sbr after ptp + macvlan, tap, and vlan + static through cnitool and
# `cnikit net`, and (dhcp.sh) the dhcp IPAM plugin and its daemon with ipvlan l2/l3 and macvlan
# against dnsmasq; like a real node the guest host has its own eth0 (address, default route) and
# the pods get eth0 too; (bandwidth.sh) bandwidth shaped inside the pods' netns on ipvlan,
# dummy and vlan, with iperf3 measuring an ipvlan pod's rates both ways. The guest reports `N passed, M failed` on the serial console; this
# script exits non-zero on any failure or if the guest never reports (timeout).
#
# Nothing is installed into /boot or /lib/modules: the kernel .deb is only unpacked, under $W.
# Env: W=/var/cache/cnikit-vm (kernel cache + work dir)  MEM=768  ACCEL=tcg|kvm  TIMEOUT=600
#      CNIKIT=path (default: target/release/cnikit, brought up to date by `cargo build --release`)
#      KFORMAT=pvh|bzimage  VERBOSE=1
# Usage: tests/vm/run.sh            (as root; the console log is kept in $W/console.log)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
W=${W:-/var/cache/cnikit-vm}
MEM=${MEM:-768}
ACCEL=${ACCEL:-tcg}   # /dev/kvm on these machines is nested PVM and cannot run a stock kernel
TIMEOUT=${TIMEOUT:-600}
CNIKIT_GIVEN=${CNIKIT:+1}
CNIKIT=${CNIKIT:-$ROOT/target/release/cnikit}
if [ "$ACCEL" = kvm ]; then ACCEL_ARGS="-enable-kvm -cpu host"; else ACCEL_ARGS="-accel tcg -cpu max"; fi
[ "$(id -u)" = 0 ] || { echo "tests/vm/run.sh: run as root (apt, depmod)" >&2; exit 1; }
T_START=$SECONDS

# ---- 0. tools (CI installs them; install here only what is missing)
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list | grep -qx ping || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
command -v bridge >/dev/null && command -v tc >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
command -v dnsmasq >/dev/null || need+=(dnsmasq-base)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v xz >/dev/null || need+=(xz-utils)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
fi

# ---- 1. the binary under test (a stale release binary would test old code)
[ -n "$CNIKIT_GIVEN" ] || cargo build --release
[ -x "$CNIKIT" ] || { echo "tests/vm/run.sh: no binary at $CNIKIT" >&2; exit 1; }

# ---- 2. Debian's kernel, downloaded once into $W/deb and unpacked (not installed)
PKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$PKG" ] || { echo "cannot resolve linux-image-amd64 (apt-get update?)" >&2; exit 1; }
KV=${PKG#linux-image-}
mkdir -p "$W/deb"
DEB=$(ls "$W"/deb/"${PKG}"_*.deb 2>/dev/null | head -1 || true)
if [ -z "$DEB" ]; then
  (cd "$W/deb" && apt-get download "$PKG" 2>&1 | grep -v 'unsandboxed' || true)
  DEB=$(ls "$W"/deb/"${PKG}"_*.deb | head -1)
fi
if [ ! -f "$W/kroot/boot/vmlinuz-$KV" ] || [ ! -f "$W/kroot/lib/modules/$KV/modules.dep" ]; then
  rm -rf "$W/kroot"
  dpkg-deb -x "$DEB" "$W/kroot"
  depmod -b "$W/kroot" "$KV"
fi
KERNEL=$W/kroot/boot/vmlinuz-$KV
# KFORMAT=pvh (default): boot the uncompressed ELF vmlinux via its PVH note; under TCG this
# saves the guest ~3.5 s of xz decompression. Extracted with xz (no python needed).
if [ "${KFORMAT:-pvh}" = pvh ]; then
  if [ ! -s "$W/vmlinux-$KV" ]; then
    off=$({ LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$KERNEL" || true; } | head -1 | cut -d: -f1)
    if [ -n "$off" ] && { tail -c +$((off + 1)) "$KERNEL" || true; } | xz -dc --single-stream > "$W/vmlinux-$KV.tmp" 2>/dev/null \
       && head -c 4 "$W/vmlinux-$KV.tmp" | grep -q ELF; then
      mv "$W/vmlinux-$KV.tmp" "$W/vmlinux-$KV"
    else
      rm -f "$W/vmlinux-$KV.tmp"
    fi
  fi
  [ -s "$W/vmlinux-$KV" ] && KERNEL=$W/vmlinux-$KV
fi
grep -q '^CONFIG_IPVLAN=[my]' "$W/kroot/boot/config-$KV" || { echo "kernel $KV has no ipvlan" >&2; exit 1; }
echo "kernel: $PKG ($(basename "$KERNEL"))"

# ---- 3. initramfs: busybox, iproute2's ip and bridge, cnikit (+ their libraries), modules
I=$W/initramfs
rm -rf "$I"
mkdir -p "$I"/{bin,sbin,etc,proc,sys,dev,run,tmp,var,cni,lib/modules}
cp /bin/busybox "$I/bin/busybox"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || [ -e "$I/bin/$a" ] || ln -s busybox "$I/bin/$a"; done
copy_with_libs() { # $1 source, $2 destination inside the initramfs
  install -D -m755 "$1" "$I$2"
  # A static binary (tests/run's) has no libraries: ldd and grep fail, and that is fine.
  { ldd "$1" 2>/dev/null || true; } | { grep -oE '/[^ ]+\.so[^ ]*' || true; } | while read -r l; do
    [ -e "$I$l" ] || install -D -m755 "$l" "$I$l"
  done
}
copy_with_libs /usr/sbin/ip /sbin/ip           # real iproute2 (netns, -d, -j); shadows busybox ip
copy_with_libs /usr/sbin/bridge /sbin/bridge   # `bridge -j vlan show`
copy_with_libs /usr/sbin/tc /sbin/tc           # `tc -j qdisc show`; shadows busybox tc
copy_with_libs /usr/sbin/nft /sbin/nft         # `nft -j list set`
copy_with_libs /usr/sbin/dnsmasq /sbin/dnsmasq # dhcp.sh's DHCP server (udhcpd keys leases by MAC only)
copy_with_libs /usr/bin/iperf3 /bin/iperf3     # bandwidth.sh's rates (libiperf, libcrypto, libsctp)
rm -f "$I/bin/ip" "$I/bin/bridge" "$I/bin/tc"
copy_with_libs "$CNIKIT" /cni/cnikit           # symlinks are made in the guest by `cnikit install`
# The reference plugins (Debian containernetworking-plugins), for comparisons: bridge VLANs,
# vlan and vrf (links.sh), sbr (multihome.sh), macvlan, ipvlan and the dhcp daemon (dhcp.sh).
for p in bridge host-local static vlan vrf host-device ptp sbr macvlan ipvlan dhcp; do
  [ -x /usr/lib/cni/$p ] && copy_with_libs /usr/lib/cni/$p /ref/$p
done
install -m755 "$ROOT/tests/vm/guest.sh" "$I/guest.sh"
install -m755 "$ROOT/tests/vm/bridge_vlans.sh" "$I/bridge_vlans.sh"
install -m755 "$ROOT/tests/vm/netfilter.sh" "$I/netfilter.sh"
install -m755 "$ROOT/tests/vm/links.sh" "$I/links.sh"
install -m755 "$ROOT/tests/vm/hostdev.sh" "$I/hostdev.sh"
install -m755 "$ROOT/tests/vm/multihome.sh" "$I/multihome.sh"
install -m755 "$ROOT/tests/vm/dhcp.sh" "$I/dhcp.sh"
install -m755 "$ROOT/tests/vm/bandwidth.sh" "$I/bandwidth.sh"
# libcni's cnitool (static Go), when tests/interop/cnitool.sh built it: multihome.sh runs
# vlan + static through it (and skips that part without it)
CNITOOL=/var/cache/cnikit-interop/bin/cnitool
[ -x "$CNITOOL" ] && copy_with_libs "$CNITOOL" /bin/cnitool
# kernel modules in dependency order, resolved on the host
: > "$I/modules.order"
# (nftables with the expressions cnikit's tables use, the xt matches of the firewall plugin's
# iptables rules, conntrack's netlink for portmap's UDP flush, and tc's tbf, ingress, u32,
# mirred and ifb for bandwidth)
# copy_modules LIST MODULE...: each module and what it depends on into the initramfs (once),
# its path appended to LIST in load order.
copy_modules() {
  local list=$1 m ko rel
  shift
  for m in "$@"; do
    modprobe -d "$W/kroot" -S "$KV" --show-depends "$m" | awk '$1=="insmod"{print $2}' | while read -r ko; do
      rel=${ko#"$W/kroot"}
      [ -e "$I$rel" ] && continue
      install -D -m644 "$ko" "$I$rel"
      echo "$rel" >> "$list"
    done
  done
}
copy_modules "$I/modules.order" dummy veth macvlan ipvlan bridge 8021q vrf tun \
  nf_tables nft_chain_nat nft_nat nft_masq nft_ct nft_fib_inet nft_meta_bridge nf_conntrack_netlink \
  nft_compat xt_comment xt_conntrack \
  sch_tbf sch_ingress cls_u32 act_mirred ifb
# virtio-net for hostdev.sh's PCI NIC, loaded there (after guest.sh made the node's eth0)
: > "$I/modules.hostdev"
copy_modules "$I/modules.hostdev" virtio_pci virtio_net
cat > "$I/init" <<'EOF'
#!/bin/sh
export PATH=/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp; ln -s /run /var/run
echo "VM-BOOTED uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r)"
while read -r ko; do insmod "$ko" || echo "insmod $ko FAILED"; done < /modules.order
ip link set lo up
. /guest.sh
. /links.sh
. /bandwidth.sh
. /multihome.sh
. /dhcp.sh
. /hostdev.sh
echo "VM-RESULT $ok passed, $fail failed"
echo "VM-DONE uptime=$(cut -d' ' -f1 /proc/uptime)"
poweroff -f
EOF
chmod +x "$I/init"
(cd "$I" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) > "$W/initramfs.cpio.gz"
echo "initramfs: $(du -h "$W/initramfs.cpio.gz" | cut -f1), modules: $(wc -l < "$I/modules.order")"

# ---- 4. boot; serial console only; the guest powers itself off
LOG=$W/console.log
T0=$SECONDS
set +e
timeout "$TIMEOUT" qemu-system-x86_64 $ACCEL_ARGS -m "$MEM" -smp 1 \
  -kernel "$KERNEL" -initrd "$W/initramfs.cpio.gz" \
  -append "console=ttyS0 quiet panic=-1 rdinit=/init" \
  -nographic -no-reboot -monitor none -serial stdio -display none -nic none \
  -netdev user,id=hd,restrict=on -device virtio-net-pci,netdev=hd,addr=0x5,mac=52:54:00:12:34:56 \
  </dev/null 2>&1 | tr -d '\r' > "$LOG"
QRC=${PIPESTATUS[0]}
set -e
if [ "${VERBOSE:-0}" = 1 ]; then cat "$LOG"; else grep -E '^(FAIL|  |VM-|insmod)' "$LOG" || true; fi
echo "qemu exit=$QRC, boot->poweroff $((SECONDS - T0)) s, total $((SECONDS - T_START)) s (log: $LOG)"
line=$(grep -m1 -E '^VM-RESULT [0-9]+ passed, [0-9]+ failed' "$LOG" || true)
if [ -z "$line" ]; then
  echo "tests/vm/run.sh: the guest never reported a result (timeout ${TIMEOUT}s or crash); last lines:" >&2
  tail -20 "$LOG" >&2
  exit 1
fi
echo "vm: ${line#VM-RESULT }"
case "$line" in *" 0 failed") exit 0 ;; *) exit 1 ;; esac
