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
#  - firewall (re)loads: with Debian's nftables.service (its /etc/nftables.conf flushes the
#    ruleset) enabled and started, restarted and reloaded, the pods' host ports answer again
#    via 127.0.0.1: put back by cnikit-firewall-restore.service while the daemon is stopped,
#    by the daemon (or the unit, whichever is first) while it runs, and by the daemon alone
#    after an `nft flush ruleset` by hand;
#  - cluster pools (tests/systemd/cluster.sh): the drop-in of docs/cluster-pools.md against
#    Debian's etcd on the node, started at boot, reaches etcd and keeps --route-blocks routes;
#  - `systemctl stop` of socket and service: the plugins fall back to in-process cleanly;
#  - dhcp (tests/systemd/dhcp.sh): cnikit-dhcp.socket enabled at /run/cni/dhcp.sock, the
#    lease daemon socket-activated by a macvlan+dhcp ADD against dnsmasq in a netns, its
#    hardening letting it work in the pod's netns, a SIGKILL'd daemon restarted and
#    resuming the recorded lease, DEL releasing it; Debian's cni-dhcp units left alone;
#  - dpkg -r removes the links and units and gives Debian's plugins (dhcp too) back.
# Then, on a second fresh node, the upgrade (tests/systemd/upgrade.sh): pods attached by the
# previous release's package (tests/systemd/old-package.sh builds it from this repository's
# history, cached), `dpkg -i` of this one over it, and what must hold after that (running
# pods' traffic, their CHECK/DEL/GC, leases and journal, the new layout, a downgrade).
# Usage: tests/systemd/run.sh [--only install|upgrade] [path/to/cnikit.deb]
#                                         (default: both parts, the package built by
#                                         contrib/debian/build; the previous release's
#                                         package: $CNIKIT_OLD_DEB, else old-package.sh)
#        tests/systemd/run.sh --prepare   only build the cached userland (CI starts this early,
#                                         in the background: it is mostly download time)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "tests/systemd/run.sh: run as root" >&2; exit 1; }

. tests/debian-userland.sh
debian_userland systemd /var/cache/cnikit-systemd systemd,systemd-sysv,dbus,iproute2,nftables,curl,containernetworking-plugins,podman,dnsmasq-base,etcd-server
if [ "${1:-}" = --prepare ]; then
  prepare_userland
  exit
fi
PARTS="install upgrade"
if [ "${1:-}" = --only ]; then
  PARTS=${2:?--only install|upgrade}
  shift 2
fi
DEB=${1:-}
if [ -z "$DEB" ]; then
  contrib/debian/build >/dev/null
  DEB=$(ls -t target/debian/cnikit_*_amd64.deb | head -1)
fi
prepare_userland

ROOT=
NSPAWN_PID=
# Stop the node booted last and remove its tree.
halt_node() {
  [ -n "$NSPAWN_PID" ] && kill "$NSPAWN_PID" 2>/dev/null && wait "$NSPAWN_PID" 2>/dev/null
  NSPAWN_PID=
  [ -n "$ROOT" ] && rm -rf "$ROOT"
  ROOT=
}
trap halt_node EXIT

# boot_node NAME FILE...: a fresh node from the cached userland with FILEs in /root
# (cnikit.deb always), booted; sets ROOT, NSPAWN_PID and INIT. Its console: $CACHE/console-NAME.log.
boot_node() {
  local name=$1 console=$CACHE/console-$1.log
  shift
  ROOT=$(mktemp -d /var/tmp/cnikit-systemd.XXXXXX)
  tar -C "$ROOT" -xf "$ROOTFS_TAR"
  echo cnikit-node > "$ROOT/etc/hostname"
  cp "$DEB" "$ROOT/root/cnikit.deb"
  cp "$@" "$ROOT/root/"
  # --register/--keep-unit: the machine running the tests need not run systemd itself.
  systemd-nspawn -q -D "$ROOT" --boot --private-network --register=no --keep-unit \
    >"$console" 2>&1 &
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
  [ -n "$INIT" ] || { cat "$console"; echo "systemd: the container's systemd did not start" >&2; return 1; }
  local state=
  for _ in $(seq 600); do
    state=$(in_node systemctl is-system-running 2>/dev/null || true)
    case "$state" in running|degraded) break ;; esac
    sleep 0.1
  done
  echo "systemd: node $name booted ($state)"
  case "$state" in
    running|degraded) ;;
    *) cat "$console"; echo "systemd: the node did not finish booting in 60 s" >&2; return 1 ;;
  esac
}
in_node() { nsenter -t "$INIT" -a -- "$@"; }

rc=0
for part in $PARTS; do
  t0=$SECONDS
  case "$part" in
    install)
      boot_node install tests/systemd/common.sh tests/systemd/guest.sh tests/systemd/dhcp.sh \
        tests/systemd/cluster.sh &&
        in_node /bin/bash /root/guest.sh || rc=1
      ;;
    upgrade)
      if ! OLD_DEB=${CNIKIT_OLD_DEB:-$(tests/systemd/old-package.sh)}; then
        echo "systemd: no package of the previous release: the upgrade part did not run" >&2
        rc=1
        continue
      fi
      boot_node upgrade tests/systemd/common.sh tests/systemd/upgrade.sh &&
        cp "$OLD_DEB" "$ROOT/root/cnikit-old.deb" &&
        in_node /bin/bash /root/upgrade.sh || rc=1
      ;;
    *) echo "systemd: no part $part (install, upgrade)" >&2; exit 2 ;;
  esac
  halt_node
  echo "systemd: $part part: $((SECONDS - t0)) s"
done
exit $rc
