#!/usr/bin/env bash
# The bare-machine guard: runs the README's first command, `contrib/demo.sh`,
# as a newcomer would, on a fresh Debian 12 machine that has only what a new machine of
# this kind has besides Debian's minimal base (a rustup Rust toolchain, gcc, git, python3,
# ca-certificates): no package installed by hand, and an empty cargo target dir. A build
# or demo step that needs something the project's own files do not install (a Debian
# package, a cargo-installed tool) fails here, however complete the machine running the
# tests is. (The machine CI runs on keeps what earlier sessions installed by hand, so a
# green CI elsewhere can hide a missing install step.)
#
# The machine is a Debian 12 minbase userland (mmdebstrap, cached) run with
# systemd-nspawn, not booted: its command is `contrib/demo.sh` in a clean copy of the
# work tree (tracked and untracked-not-ignored files, so work in progress is what is
# tested; no target/). It shares the host's network, so apt and cargo reach their
# registries with the host's mirrors and CA certificates; the demo makes its own
# throwaway network namespace, so the machine's network is never touched. The host's
# Rust toolchain is bind-mounted read-only (only the active one, and none of the tools
# `cargo install` put in the host's ~/.cargo/bin); crates are downloaded afresh.
#
# Usage: tests/bare/run.sh             (as root) prints "bare: contrib/demo.sh passed in N s"
#                                      and "1 passed, 0 failed", or the tail of the log and
#                                      "0 passed, 1 failed" and exits non-zero
#        tests/bare/run.sh --prepare   only build the cached userland (CI starts this early,
#                                      in the background: it is mostly download time)
#        tests/bare/run.sh CMD ARGS... another command, run the same way in the work tree's
#                                      copy (e.g. bash -c 'apt-get ... && contrib/debian/build')
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "tests/bare/run.sh: run as root" >&2; exit 1; }
t_start=$SECONDS

# The guard's own tools (CI's package list has them; installed here if missing).
missing=()
for p in mmdebstrap systemd-container; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bare: installing ${missing[*]}"
  apt-get update >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi

. tests/debian-userland.sh
# A new machine of this kind besides Debian's minbase (its Rust toolchain comes from the host).
debian_userland bare /var/cache/cnikit-bare ca-certificates,git,gcc,libc6-dev,python3
if [ "${1:-}" = --prepare ]; then
  prepare_userland
  exit
fi
CMD=("$@")
[ ${#CMD[@]} -gt 0 ] || CMD=(contrib/demo.sh)

# The host's Rust toolchain: the one this work tree builds with, installed by rustup.
SYSROOT=$(rustc --print sysroot)
TOOLCHAIN=$(basename "$SYSROOT")
HOST_CARGO_HOME=${CARGO_HOME:-${HOME:-/root}/.cargo}
if [ ! -x "$HOST_CARGO_HOME/bin/rustup" ] || [ ! -f "$SYSROOT/bin/cargo" ]; then
  echo "tests/bare/run.sh: needs a rustup toolchain (no $HOST_CARGO_HOME/bin/rustup or $SYSROOT/bin/cargo)" >&2
  exit 1
fi

prepare_userland
t_ready=$SECONDS

ROOT=$(mktemp -d /var/tmp/cnikit-bare.XXXXXX)
LOG=$CACHE/demo.log
# The bind mounts are in systemd-nspawn's own mount namespace: the host sees empty
# directories where they are, and this removes only the guest's files.
trap 'rm -rf "$ROOT"' EXIT
tar -C "$ROOT" -xf "$ROOTFS_TAR"
# The names every installed machine has (no package ships /etc/hosts; an installer writes
# it). Without its own name there, a lookup of it goes to DNS, which a pod cannot reach.
echo cnikit-bare > "$ROOT/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tcnikit-bare\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' \
  > "$ROOT/etc/hosts"

# apt: the host's mirrors.
if [ -f /etc/apt/sources.list.d/debian.sources ] || [ -f /etc/apt/sources.list ]; then
  rm -f "$ROOT/etc/apt/sources.list" "$ROOT"/etc/apt/sources.list.d/*
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/debian.sources; do
    if [ -f "$f" ]; then cp "$f" "$ROOT$f"; fi
  done
fi
# TLS: the host's local CA certificates (a proxy's, for one), as a machine of this kind has them.
shopt -s nullglob
cas=(/usr/local/share/ca-certificates/*)
shopt -u nullglob
if [ ${#cas[@]} -gt 0 ]; then
  cp -r "${cas[@]}" "$ROOT/usr/local/share/ca-certificates/"
  # (Its stderr is a harmless rehash warning about the bundle; its exit status tells.)
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$ROOT" update-ca-certificates >/dev/null 2>&1 ||
    { echo "tests/bare/run.sh: update-ca-certificates failed in the guest" >&2; exit 1; }
fi

# Rust: rustup and its proxies (not the tools `cargo install` put beside them), and a
# rustup home whose one toolchain is the host's, read-only.
mkdir -p "$ROOT/root/.cargo/bin" "$ROOT/root/.rustup/toolchains/$TOOLCHAIN"
cp "$HOST_CARGO_HOME/bin/rustup" "$ROOT/root/.cargo/bin/"
for f in "$HOST_CARGO_HOME"/bin/*; do
  name=$(basename "$f")
  if [ "$name" != rustup ] && [ "$f" -ef "$HOST_CARGO_HOME/bin/rustup" ]; then
    ln -s rustup "$ROOT/root/.cargo/bin/$name"
  fi
done
if [ -f "$HOST_CARGO_HOME/env" ]; then cp "$HOST_CARGO_HOME/env" "$ROOT/root/.cargo/"; fi
cat > "$ROOT/root/.rustup/settings.toml" <<EOF
version = "12"
default_toolchain = "$TOOLCHAIN"
profile = "minimal"
auto_self_update = "disable"

[overrides]
EOF

# The work tree as a fresh clone would have it, with its uncommitted changes: tracked
# files that exist and untracked ones that are not ignored (so no target/).
mkdir -p "$ROOT/root/cnikit"
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
  { [ -e "$f" ] || [ -L "$f" ]; } && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -C "$ROOT/root/cnikit" -xf -

echo "bare: running ${CMD[*]} on a fresh Debian 12 machine (log: $LOG)"
t_demo=$SECONDS
rc=0
# Not booted: the demo is the container's command. --capability=all and writable /proc/sys
# and /sys: the demo makes network namespaces and sets sysctls in them. No
# --private-network: apt and cargo need the registries. --register/--keep-unit: the
# machine running the tests need not run systemd itself.
SYSTEMD_NSPAWN_API_VFS_WRITABLE=yes timeout --kill-after=30 1800 \
  systemd-nspawn -q -D "$ROOT" --hostname=cnikit-bare --register=no --keep-unit --console=pipe \
  --capability=all --private-users=no \
  --bind-ro="$SYSROOT:/root/.rustup/toolchains/$TOOLCHAIN" \
  --setenv=HOME=/root \
  --setenv=PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --setenv=RUSTUP_AUTO_INSTALL=0 \
  --chdir=/root/cnikit \
  -- "${CMD[@]}" </dev/null >"$LOG" 2>&1 || rc=$?
t_end=$SECONDS

# The demo's last word is "demo ok"; any other command has only its exit status.
if [ $rc = 0 ] && { [ "${CMD[*]}" != contrib/demo.sh ] || grep -qx 'demo ok' "$LOG"; }; then
  echo "bare: ${CMD[*]} passed in $((t_end - t_demo)) s" \
    "(userland ready in $((t_ready - t_start)) s; total $((t_end - t_start)) s)"
  echo "1 passed, 0 failed"
  exit 0
fi
echo "bare: the last 40 lines of $LOG:"
# (Without nspawn's notice at exit about the directory it propagates mounts through.)
grep -v 'Attempted to remove disk file system under' "$LOG" | tail -n 40 | sed 's/^/  | /'
echo "bare: FAILED: ${CMD[*]} on a fresh Debian 12 machine exited with $rc after" \
  "$((t_end - t_demo)) s (total $((t_end - t_start)) s): a build or demo step needs something" \
  "the project's own files do not install (full log: $LOG)"
echo "0 passed, 1 failed"
exit 1
