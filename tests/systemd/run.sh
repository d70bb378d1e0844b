#!/usr/bin/env bash
# The Debian package under a real systemd: boots a Debian 12 userland (mmdebstrap,
# cached) with systemd as PID 1 in systemd-nspawn, in a network namespace of its own
# (--private-network: nothing touches the machine's network), installs the package there
# next to Debian's containernetworking-plugins and podman, and checks:
#  - dpkg -i succeeds; the links are in /opt/cni/bin and /usr/lib/cni; ipamd.socket is
#    enabled and listening, the daemon not yet started;
#  - socket activation: the first plugin call starts the daemon (Type=notify: active only
#    once it said READY), which serves the lease;
#  - SIGKILL of the daemon: systemd restarts it and no acknowledged lease is lost;
#  - the unit's hardening lets every firewall feature work in the daemon (bridge ipMasq,
#    macspoofchk, portmap with a UDP mapping and its conntrack flush);
#  - `systemctl stop` of socket and service: the plugins fall back to in-process cleanly;
#  - dhcp (tests/systemd/dhcp.sh): cnikit-dhcp.socket enabled at /run/cni/dhcp.sock, the
#    lease daemon socket-activated by a macvlan+dhcp ADD against dnsmasq in a netns, its
#    hardening letting it work in the pod's netns, a SIGKILL'd daemon restarted and
#    resuming the recorded lease, DEL releasing it; Debian's cni-dhcp units left alone;
#  - dpkg -r removes the links and units and gives Debian's plugins (dhcp too) back.
# Usage: tests/systemd/run.sh [path/to/cnikit.deb]   (default: built by contrib/debian/build)
#        tests/systemd/run.sh --prepare   only build the cached userland (CI starts this early,
#                                         in the background: it is mostly download time)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "tests/systemd/run.sh: run as root" >&2; exit 1; }

CACHE=/var/cache/cnikit-systemd
INCLUDE=systemd,systemd-sysv,dbus,iproute2,nftables,curl,containernetworking-plugins,podman,dnsmasq-base
# Named by what it holds, so a changed package list builds a new one.
ROOTFS_TAR=$CACHE/bookworm-$(echo "$INCLUDE" | sha256sum | cut -c1-12).tar
mkdir -p "$CACHE"
prepare() {
  # One builder at a time: a --prepare started earlier may still be running.
  exec 9>"$CACHE/lock"
  flock 9
  if [ ! -f "$ROOTFS_TAR" ]; then
    echo "systemd: building the Debian 12 userland once ($ROOTFS_TAR)"
    mmdebstrap --variant=minbase \
      --include="$INCLUDE" \
      --format=tar bookworm "$ROOTFS_TAR.tmp" http://deb.debian.org/debian >/dev/null
    mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  fi
  exec 9>&-
}
if [ "${1:-}" = --prepare ]; then
  prepare
  exit
fi
DEB=${1:-}
if [ -z "$DEB" ]; then
  contrib/debian/build >/dev/null
  DEB=$(ls -t target/debian/cnikit_*_amd64.deb | head -1)
fi
prepare

ROOT=$(mktemp -d /var/tmp/cnikit-systemd.XXXXXX)
NSPAWN_PID=
cleanup() {
  [ -n "$NSPAWN_PID" ] && kill "$NSPAWN_PID" 2>/dev/null && wait "$NSPAWN_PID" 2>/dev/null
  rm -rf "$ROOT"
}
trap cleanup EXIT
tar -C "$ROOT" -xf "$ROOTFS_TAR"
echo cnikit-node > "$ROOT/etc/hostname"
cp "$DEB" "$ROOT/root/cnikit.deb"
cp tests/systemd/guest.sh tests/systemd/dhcp.sh "$ROOT/root/"

# --register/--keep-unit: the machine running the tests need not run systemd itself.
systemd-nspawn -q -D "$ROOT" --boot --private-network --register=no --keep-unit \
  >"$CACHE/console.log" 2>&1 &
NSPAWN_PID=$!

# The container's init: the child of systemd-nspawn that has exec'd systemd. nspawn's
# children are briefly other processes of its own (an outer child that sets up the mount
# namespace and exits), so a child found before the exec may be gone a moment later.
INIT=
for _ in $(seq 300); do
  INIT=$(pgrep -P "$NSPAWN_PID" -x systemd | head -1 || true)
  [ -n "$INIT" ] && break
  sleep 0.1
done
[ -n "$INIT" ] || { cat "$CACHE/console.log"; echo "systemd: the container's systemd did not start" >&2; exit 1; }
in_node() { nsenter -t "$INIT" -a -- "$@"; }
state=
for _ in $(seq 600); do
  state=$(in_node systemctl is-system-running 2>/dev/null || true)
  case "$state" in running|degraded) break ;; esac
  sleep 0.1
done
echo "systemd: booted ($state)"
case "$state" in
  running|degraded) ;;
  *) cat "$CACHE/console.log"; echo "systemd: the node did not finish booting in 60 s" >&2; exit 1 ;;
esac
in_node /bin/bash /root/guest.sh
