#!/usr/bin/env bash
# Builds the Debian package of the previous release, from this repository's own history
# (never fetched code), and prints its path: the node the upgrade scenario starts from
# (tests/systemd/upgrade.sh). Cached under /var/tmp/cnikit-upgrade: the package itself by
# commit (a second run costs nothing), and the source tree and its cargo target dir
# (CARGO_TARGET_DIR), which stay at fixed paths so that cargo can reuse what it built when
# the commit changes.
# Usage: tests/systemd/old-package.sh [COMMIT]   (default: $CNIKIT_PREVIOUS, else the one below)
set -euo pipefail
cd "$(dirname "$0")/../.."
# 0.1.0-1: the last commit before the package versions and the plugin↔daemon request
# protocol had versions (issue 24).
PREVIOUS=0a9f14342d6f71df032d85ec3bcc6e4a6f50447c
commit=${1:-${CNIKIT_PREVIOUS:-$PREVIOUS}}
if ! commit=$(git rev-parse --verify --quiet "$commit^{commit}"); then
  echo "old-package: commit ${1:-${CNIKIT_PREVIOUS:-$PREVIOUS}} is not in this repository (a shallow clone? fetch its history)" >&2
  exit 1
fi
CACHE=/var/tmp/cnikit-upgrade
DEB=$CACHE/cnikit-${commit:0:12}.deb
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9
if [ -f "$DEB" ]; then
  echo "$DEB"
  exit 0
fi
SRC=$CACHE/src
if [ "$(cat "$SRC/.commit" 2>/dev/null)" != "$commit" ]; then
  rm -rf "$SRC"
  mkdir -p "$SRC"
  git archive "$commit" | tar -x -C "$SRC"
  echo "$commit" > "$SRC/.commit"
fi
# The old tree's scripts expect target/ in the tree (contrib/static-build names its binary
# there): a link to the cached target dir.
mkdir -p "$CACHE/target"
ln -sfn "$CACHE/target" "$SRC/target"
t0=$SECONDS
echo "old-package: building the package of ${commit:0:12} in $SRC (log: $CACHE/build.log)" >&2
if ! (cd "$SRC" && CARGO_TARGET_DIR=$CACHE/target contrib/debian/build) >"$CACHE/build.log" 2>&1; then
  tail -30 "$CACHE/build.log" >&2
  echo "old-package: the build of ${commit:0:12} failed" >&2
  exit 1
fi
built=$(ls -t "$CACHE"/target/debian/cnikit_*_amd64.deb | head -1)
cp "$built" "$DEB.tmp"
mv "$DEB.tmp" "$DEB"
echo "old-package: built in $((SECONDS - t0)) s" >&2
echo "$DEB"
