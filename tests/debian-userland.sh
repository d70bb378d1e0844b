# Sourced by tests/bare/run.sh and tests/systemd/run.sh: the Debian 12 minbase userland
# (mmdebstrap) that each suite starts its machine from, built once and cached.
#
#   debian_userland LABEL CACHE_DIR PACKAGES   sets CACHE and ROOTFS_TAR (the tarball is
#                                              named by PACKAGES, comma-separated, so a
#                                              changed list builds a new one)
#   prepare_userland                           builds it unless it is there

debian_userland() {
  USERLAND_LABEL=$1
  CACHE=$2
  USERLAND_PACKAGES=$3
  ROOTFS_TAR=$CACHE/bookworm-$(echo "$USERLAND_PACKAGES" | sha256sum | cut -c1-12).tar
  mkdir -p "$CACHE"
}

prepare_userland() {
  # One builder at a time: a --prepare started earlier may still be running.
  exec 9>"$CACHE/lock"
  flock 9
  if [ ! -f "$ROOTFS_TAR" ]; then
    echo "$USERLAND_LABEL: building the Debian 12 userland once ($ROOTFS_TAR)"
    mmdebstrap --variant=minbase \
      --include="$USERLAND_PACKAGES" \
      --format=tar bookworm "$ROOTFS_TAR.tmp" http://deb.debian.org/debian >/dev/null
    mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  fi
  exec 9>&-
}
