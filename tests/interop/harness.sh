#!/usr/bin/env bash
# Sourced by the interop suites (cnitool.sh, multus.sh): the result helpers every phase
# uses, cnitool built from Debian's libcni into a cache both suites share, and the steps
# both suites' outer scripts and phases take alike (start_run, phase, finish_run,
# isolate_phase).
# Sourced with ROOT the work tree, from tests/interop/<suite>.sh: SELF is that suite.
SELF=$ROOT/tests/interop/$(basename "$0")
RES=${RES:-}          # results file (one line per test), set by the outer script

pass() { echo "ok - $*" | tee -a "$RES"; }
bad() { echo "FAIL - $*" | tee -a "$RES"; }
skip() { echo "skip - $*" | tee -a "$RES"; }
note() { echo "  note: $*" | tee -a "$RES"; }
# t WHAT CMD...: passes if CMD succeeds; shows CMD's output when it does not
t() {
  local d=$1; shift
  if "$@" > "$WORK/t.out" 2>&1; then pass "$d"; else bad "$d"; sed 's/^/    /' "$WORK/t.out" | head -30 | tee -a "$RES"; fi
}
# tn WHAT CMD...: passes if CMD fails
tn() {
  local d=$1; shift
  if "$@" > "$WORK/t.out" 2>&1; then bad "$d (unexpectedly succeeded)"; sed 's/^/    /' "$WORK/t.out" | head -30 | tee -a "$RES"; else pass "$d"; fi
}
# teq WHAT EXPECTED ACTUAL
teq() {
  if [ "$2" = "$3" ]; then pass "$1"; else
    bad "$1"; { echo "    expected: $2"; echo "    actual:   $3"; } | tee -a "$RES"
  fi
}

# prepare_run PKG...: installs the packages missing of PKG..., builds $CNIKIT if it is
# missing, and makes the work dir: exports WORK, RES (the results file) and OURS (a bin dir
# of cnikit's links), REF (Debian's plugins).
prepare_run() {
  local need=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q 'install ok installed' || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" > /dev/null
  fi
  if [ ! -x "$CNIKIT" ]; then
    echo "building $CNIKIT"
    cargo build --release
  fi
  WORK=$(mktemp -d /tmp/cnikit-interop.XXXXXX)
  export WORK RES=$WORK/results.txt OURS=$WORK/bin REF=/usr/lib/cni
  : > "$RES"
  mkdir -p "$OURS"
  cp "$CNIKIT" "$OURS/cnikit"
  "$OURS/cnikit" install --dir "$OURS" > /dev/null
}

# build_cnitool RC: cnitool at $RC/bin/cnitool, built once: libcni 1.1.2 from Debian;
# cnitool.go itself is only in the source package (debian/rules excludes it), fetched with
# a private deb-src twin of the machine's list. Exports CNITOOL.
build_cnitool() {
  local RC=$1
  if [ ! -x "$RC/bin/cnitool" ]; then
    T0=$SECONDS
    mkdir -p "$RC"/apt/parts "$RC"/apt/lists/partial "$RC"/apt/cache "$RC"/src "$RC"/bin "$RC"/gocache
    src_list=$(ls /etc/apt/sources.list.d/*.sources 2> /dev/null | head -1 || true)
    if [ -n "$src_list" ]; then
      sed -e 's/^Types: deb$/Types: deb-src/' "$src_list" > "$RC/apt/parts/src.sources"
    else
      grep -h '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' > "$RC/apt/parts/src.list"
    fi
    APTO=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$RC/apt/parts"
          -o Dir::State::Lists="$RC/apt/lists" -o Dir::Cache="$RC/apt/cache")
    apt-get "${APTO[@]}" update > /dev/null
    CNIVER=$(dpkg-query -W -f='${Version}' golang-github-appc-cni-dev)
    (cd "$RC/src" && apt-get "${APTO[@]}" source --download-only "golang-github-appc-cni=$CNIVER" > /dev/null 2>&1)
    orig=$(ls "$RC"/src/golang-github-appc-cni_*.orig.tar.* | head -1)
    tar -C "$RC/src" -xf "$orig" --wildcards '*/cnitool/cnitool.go'
    srcdir=$(dirname "$(dirname "$(ls "$RC"/src/*/cnitool/cnitool.go | head -1)")")
    (cd "$srcdir" && GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOFLAGS='' GOCACHE="$RC/gocache" \
      CGO_ENABLED=0 go build -trimpath -o "$RC/bin/cnitool" ./cnitool/cnitool.go)
    echo "built cnitool (libcni $CNIVER) in $((SECONDS - T0)) s"
  fi
  export CNITOOL=$RC/bin/cnitool
}

# start_run WHY PKG...: the outer script's start, as root (WHY: what needs it): the
# defaults of RC and CNIKIT, the packages and work dir (prepare_run), cnitool
# (build_cnitool), and whether the binary has `cnikit net` (exports HAVE_NET, 1 or 0).
start_run() {
  local why=$1; shift
  [ "$(id -u)" = 0 ] || { echo "${SELF#"$ROOT/"}: run as root ($why)" >&2; exit 1; }
  T_START=$SECONDS
  RC=${RC:-/var/cache/cnikit-interop}
  CNIKIT=${CNIKIT:-$ROOT/target/release/cnikit}
  export DEBIAN_FRONTEND=noninteractive
  prepare_run "$@"
  build_cnitool "$RC"
  if "$WORK/bin/cnikit" net --help > /dev/null 2>&1; then export HAVE_NET=1; else export HAVE_NET=0; fi
}

# phase NAME ARGS...: the suite ($SELF) run again as `--phase NAME ARGS...` in a network
# and mount namespace of its own; a phase that exits non-zero is a failure.
phase() {
  echo "== $*"
  unshare --net --mount --propagation private -- bash "$SELF" --phase "$@" || bad "phase $* exited $?"
}

# isolate_phase: in a phase's namespace, tmpfs on the state dirs, so that nothing of the
# machine's is read or left; loopback up.
isolate_phase() {
  local d
  for d in /run/netns /var/lib/cni /run/cnikit; do mkdir -p "$d"; mount -t tmpfs tmpfs "$d"; done
  ip link set lo up
}

# finish_run LABEL: the summary of the results file (failures, skips and notes, each
# once with its count), the work dir removed unless KEEP=1, "LABEL: N passed, M failed,
# K skipped"; exits non-zero on any failure.
finish_run() {
  local ok failed skipped
  ok=$(grep -c '^ok - ' "$RES" || true)
  failed=$(grep -c '^FAIL - ' "$RES" || true)
  skipped=$(grep -c '^skip - ' "$RES" || true)
  echo "== summary ($((SECONDS - T_START)) s)"
  grep -E '^(FAIL|skip|  note)' "$RES" | sort | uniq -c | sed 's/^ *1 //' || true
  [ "${KEEP:-0}" = 1 ] && echo "work dir kept: $WORK" || rm -rf "$WORK"
  echo "$1: $ok passed, $failed failed, $skipped skipped"
  [ "$failed" = 0 ] && exit 0
  exit 1
}
