#!/usr/bin/env bash
# containerd CRI suite: Debian's containerd (1.6) + runc, driven through the CRI v1 API the way
# kubelet drives it (tests/cri/src, a tonic client), calling cnikit from a bin dir that holds
# only cnikit's links.
#
#   tests/cri/run.sh                 the scenarios, once with the plugins in-process and once
#                                    with `cnikit ipamd daemon` running; prints one line per
#                                    check and "N passed, M failed"
#   tests/cri/run.sh --measure [N]   N sequential RunPodSandbox + StopPodSandbox/RemovePodSandbox
#                                    (one TCP hostPort each) with cnikit (without and with the
#                                    daemon), with Debian's reference plugins and with no CNI
#                                    (hostNetwork pods); prints p50/p99 of each call (default 50),
#                                    then where the time of each call goes (breakdown.rs): the
#                                    kernel's process events place every plugin exec on the
#                                    call's timeline, p50 of each part side by side
#                                    (docs/performance.md, "Where RunPodSandbox's time goes");
#                                    the environment reaches containerd: GOMAXPROCS=8 in front
#                                    shows what its Go scheduler costs the plugins
#
# Everything runs in `unshare --net --mount --pid --kill-child --propagation private` with tmpfs
# on /run, /var/lib/cni and containerd's root: the machine's network and state are never
# touched; traffic goes only to loopback and to pods inside that namespace. The namespace is
# made to look like a node: an `eth0` (a veth whose peer stays inside, unaddressed) with an
# address and the default route. Images are built from busybox-static (plus the suite's
# std-only `cri-echo` server) and imported with `ctr`.
#
# Last, mode node-agent: the DaemonSet's pod (contrib/kubernetes/cnikit.yaml) as kubelet runs
# it, from the image contrib/kubernetes/build-image makes in the setup (offline, ≈ 1 s), with
# the manifest's capabilities and hostPID, over an older cnikit in the bin dir; pods networked
# through what it installed, then with it gone (docs/kubernetes.md, "How it is tested").
#
# Env: CNIKIT=PATH use this binary (default: contrib/static-build's, built/updated first;
#        the DaemonSet's image needs a static one)
#      AGENT_IMAGE=PATH the DaemonSet's image archive (default: built from $CNIKIT)
#      AGENT_CAPS=A,B AGENT_HOST_PID=true|false the agent's capabilities and hostPID instead
#        of the manifest's     AGENT_ONLY=1 run only mode node-agent (both: to find out
#        which settings the agent needs)
#      KEEP=1 keep the work dir   CRI_LOG=1 print containerd's log at the end
#      TIMEOUT=900 seconds for everything inside the namespace
#      CRI_TRACE=1 log every bridge/portmap/loopback call (CNI_* env, stdin, result) through a
#        wrapper script in the bin dir, and print the first call of each kind at the end
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SELF=$ROOT/tests/cri/run.sh
TAG=cnikit.local/busybox:1

if [ "${1:-}" != --inner ]; then
  # =================================================================================
  # outer: packages, builds, image, then the isolated namespace
  # =================================================================================
  [ "$(id -u)" = 0 ] || { echo "tests/cri/run.sh: run as root (namespaces, containerd)" >&2; exit 1; }
  T_START=$SECONDS
  need=()
  for p in containerd runc busybox-static protobuf-compiler containernetworking-plugins nftables \
           iptables iproute2 iputils-ping util-linux jq; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q 'install ok installed' || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" > /dev/null
  fi
  if [ -z "${CNIKIT:-}" ]; then
    # static, as tests/run's: the DaemonSet's image (below) holds nothing but this binary
    CNIKIT=$(contrib/static-build)
  fi
  cargo build -q -p cnikit-cri-suite
  SUITE=${CARGO_TARGET_DIR:-$ROOT/target}/debug/cnikit-cri-suite
  ECHO=${CARGO_TARGET_DIR:-$ROOT/target}/debug/cri-echo

  WORK=$(mktemp -d /tmp/cnikit-cri.XXXXXX)
  export WORK SUITE ROOT
  # ---- bin dirs: cnikit's links only; Debian's reference plugins for --measure
  mkdir -p "$WORK/bin" "$WORK/ref"
  cp "$CNIKIT" "$WORK/bin/cnikit"
  "$WORK/bin/cnikit" install --dir "$WORK/bin" > /dev/null
  for p in bridge host-local portmap loopback; do ln -s "/usr/lib/cni/$p" "$WORK/ref/$p"; done
  echo "bin dir: $(cd "$WORK/bin" && echo *)"
  if [ "${CRI_TRACE:-0}" = 1 ]; then
    # debugging: log what containerd passes (CNI_* env, stdin, result) in front of each link
    # but ipamd (delegated in-process); the bin dir then no longer holds only cnikit's links
    mkdir -p "$WORK/bin/.real"
    for p in bridge portmap loopback; do
      mv "$WORK/bin/$p" "$WORK/bin/.real/$p"
      cat > "$WORK/bin/$p" << 'EOF'
#!/bin/bash
in=$(cat)
t0=$(date +%s%N)
out=$("$(dirname "$0")/.real/${0##*/}" <<< "$in"); rc=$?
t1=$(date +%s%N)
log=$(printf '== %s %s %d us\n' "${0##*/}" "$CNI_COMMAND" $(((t1 - t0) / 1000)); env | grep '^CNI_' | sort
  printf 'stdin: %s\nexit %s, stdout: %s' "$in" "$rc" "$out")
echo "$log" >> "$(dirname "$0")/../trace.log" # one write: calls run in parallel
printf '%s\n' "$out"
exit $rc
EOF
      chmod +x "$WORK/bin/$p"
    done
  fi

  # ---- image: busybox-static + cri-echo (and the shared libraries it needs), one layer,
  #      docker-archive layout, Cmd = sleep (the sandbox image is the same image)
  r=$WORK/img/rootfs
  mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/root"
  cp /bin/busybox "$r/bin/busybox"
  for a in $(/bin/busybox --list); do [ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"; done
  cp "$ECHO" "$r/bin/cri-echo"
  strip "$r/bin/cri-echo" 2> /dev/null || true
  for lib in $(ldd "$ECHO" | grep -o '/[^ ]*'); do
    mkdir -p "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
  done
  echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"
  echo 'root:x:0:' > "$r/etc/group"
  tar --owner=0 --group=0 --numeric-owner -C "$r" -cf "$WORK/img/layer.tar" .
  diff=$(sha256sum "$WORK/img/layer.tar" | cut -d' ' -f1)
  jq -n -c --arg d "sha256:$diff" '{architecture: "amd64", os: "linux",
      config: {Cmd: ["sleep", "2147483647"], Env: ["PATH=/bin"]},
      rootfs: {type: "layers", diff_ids: [$d]}}' > "$WORK/img/config.json"
  cfg=$(sha256sum "$WORK/img/config.json" | cut -d' ' -f1)
  mv "$WORK/img/config.json" "$WORK/img/$cfg.json"
  jq -n -c --arg c "$cfg.json" --arg t "$TAG" '[{Config: $c, RepoTags: [$t], Layers: ["layer.tar"]}]' \
    > "$WORK/img/manifest.json"
  tar -C "$WORK/img" -cf "$WORK/image.tar" manifest.json "$cfg.json" layer.tar
  rm -rf "$WORK/img"
  # ---- the DaemonSet's image (contrib/kubernetes/build-image: offline, ≈ 1 s), unless given
  if [ -z "${AGENT_IMAGE:-}" ] && [ "${1:-}" != --measure ]; then
    AGENT_IMAGE=$WORK/cnikit-image.tar
    CNIKIT=$CNIKIT OUT=$AGENT_IMAGE contrib/kubernetes/build-image > /dev/null ||
      AGENT_IMAGE= # the node-agent scenario then fails: no image
  fi
  export AGENT_IMAGE

  rc=0
  TRACE_PID=
  if [ "${1:-}" = --measure ]; then
    # the process events connector takes listeners in the initial namespaces only: here,
    # outside the unshare below (proctrace.rs)
    "$SUITE" proc-trace --out "$WORK/events.txt" &
    TRACE_PID=$!
    # the listener loops until killed: also when this script is
    trap '[ -z "$TRACE_PID" ] || kill "$TRACE_PID" 2> /dev/null || true' EXIT
    for _ in $(seq 50); do [ -e "$WORK/events.txt" ] && break; sleep 0.1; done
  fi
  # a pid namespace: when its first process ends, containerd, shims and pods end with it
  timeout -k 10 "${TIMEOUT:-900}" unshare --net --mount --pid --kill-child --mount-proc --propagation private \
    -- bash "$SELF" --inner "$@" || rc=$?
  # runc made the pods' cgroups under this run's parent; remove what is left (empty dirs)
  for d in /sys/fs/cgroup/*/"cnikit-cri-${WORK##*.}"; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2> /dev/null || true
  done
  if [ -n "$TRACE_PID" ]; then
    kill "$TRACE_PID" && wait "$TRACE_PID" 2> /dev/null || true
    TRACE_PID=
    # without the connector (no CONFIG_PROC_EVENTS, not in the initial namespaces) the
    # latencies above still stand; only the breakdown is missing
    if [ $rc = 0 ] && [ -e "$WORK/events.txt" ]; then
      "$SUITE" breakdown --events "$WORK/events.txt" --calls "$WORK/calls.txt" || rc=$?
    elif [ $rc = 0 ]; then
      echo "no breakdown: the process events listener did not start"
    fi
  fi
  if [ "${1:-}" != --measure ]; then
    R=$WORK/results.txt
    touch "$R"
    if [ $rc = 124 ]; then
      echo "FAIL - the suite did not finish in ${TIMEOUT:-900} s" | tee -a "$R"
    elif [ $rc != 0 ]; then
      echo "FAIL - the suite stopped early (exit $rc)" | tee -a "$R"
    fi
    ok=$(grep -c '^ok - ' "$R" || true)
    failed=$(grep -c '^FAIL - ' "$R" || true)
    echo "== summary"
    grep '^FAIL' "$R" || true
  fi
  if [ -s "$WORK/trace.log" ]; then
    echo "== CRI_TRACE: the first call of each plugin and command (all in $WORK/trace.log)"
    awk '/^== /{show = !seen[$2 " " $3]++} show' "$WORK/trace.log"
  fi
  [ "${KEEP:-0}" = 1 ] && echo "work dir kept: $WORK" || rm -rf "$WORK"
  echo "cri suite: $((SECONDS - T_START)) s"
  if [ "${1:-}" != --measure ]; then
    echo "$ok passed, $failed failed"
    [ "$failed" = 0 ] && [ "$ok" -gt 0 ]
    exit
  fi
  exit $rc
fi

# =====================================================================================
# inner: the isolated node
# =====================================================================================
shift
mount -t tmpfs tmpfs /run
mkdir -p /run/netns /run/containerd /run/cnikit
for d in /var/lib/cni "$WORK/ctd"; do mkdir -p "$d"; mount -t tmpfs tmpfs "$d"; done
ip link set lo up
# a node: eth0 with an address and the default route; its veth peer stays in this namespace
# with no address, so nothing leaves through it (the kernel here has no dummy links)
ip link add eth0 type veth peer name uplink0
ip addr add 192.0.2.10/24 dev eth0
ip link set uplink0 up
ip link set eth0 up
ip route add default via 192.0.2.1 dev eth0
export NODE_IP=192.0.2.10
export CGROUP_PARENT=/cnikit-cri-${WORK##*.}
SOCK=$WORK/ctd/containerd.sock
export SOCK
CTD_PID=
DAEMON_PID=
cleanup() {
  [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2> /dev/null
  [ -n "$CTD_PID" ] && kill "$CTD_PID" 2> /dev/null
  if [ "${CRI_LOG:-0}" = 1 ]; then cat "$WORK"/containerd*.log; fi
  return 0
}
trap cleanup EXIT

start_containerd() { # BIN_DIR CONF_DIR
  local n=${3:-1}
  cat > "$WORK/ctd/config.toml" << EOF
version = 2
root = "$WORK/ctd/root"
state = "/run/containerd"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$WORK/ctd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$TAG"
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$1"
    conf_dir = "$2"
    max_conf_num = 1
EOF
  containerd --config "$WORK/ctd/config.toml" >> "$WORK/containerd-$n.log" 2>&1 &
  CTD_PID=$!
  for _ in $(seq 100); do
    [ -S "$SOCK" ] && ctr -a "$SOCK" version > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "containerd did not come up:" >&2
  tail -30 "$WORK/containerd-$n.log" >&2
  return 1
}
stop_containerd() {
  kill "$CTD_PID" && wait "$CTD_PID" || true
  CTD_PID=
}
start_daemon() {
  "$WORK/bin/cnikit" ipamd daemon --socket /run/cnikit/ipamd.sock --data-dir /var/lib/cni/ipamd \
    >> "$WORK/ipamd.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 100); do [ -S /run/cnikit/ipamd.sock ] && return 0; sleep 0.05; done
  echo "ipamd daemon did not come up" >&2
  return 1
}
stop_daemon() {
  kill "$DAEMON_PID" && wait "$DAEMON_PID" || true
  DAEMON_PID=
}
# conf_dir holds one conflist; containerd reloads it on a write, rename or remove event in
# conf_dir (it ignores create events, so a file renamed in from elsewhere goes unnoticed):
# written under a name the loader skips, then renamed within the dir
use_conflist() { # SRC NAME
  rm -f "$WORK/net.d"/*
  cp "$1" "$WORK/net.d/.tmp"
  mv "$WORK/net.d/.tmp" "$WORK/net.d/10-$2.conflist"
  "$SUITE" wait-network --socket "$SOCK" --name "$2"
}

# the suite's own conflist: bridge (isGateway, ipMasq, hairpinMode) + ipamd + portmap
mkdir -p "$WORK/net.d" "$WORK/confs"
cat > "$WORK/confs/cri.conflist" << 'EOF'
{
  "cniVersion": "1.0.0",
  "name": "cri",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cri0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "ipamd",
        "ranges": [[{"subnet": "10.77.0.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
# the reference plugins' twin (host-local instead of ipamd), for --measure
jq '.plugins[0].ipam.type = "host-local"' "$WORK/confs/cri.conflist" > "$WORK/confs/ref.conflist"
# the dual-stack example itself; containerd 1.6's libcni reads results up to 1.0.0 only
jq 'if .cniVersion == "1.1.0" then .cniVersion = "1.0.0" else . end' \
  "$ROOT/contrib/examples/10-pods.conflist" > "$WORK/confs/pods.conflist"
POD_NAME=$(jq -r .name "$WORK/confs/pods.conflist")
# kind's own list, as kindnetd writes it on every kind node (its pod CIDR and eth0's MTU
# filled in): ptp + host-local + portmap (tests/it/ptp/kind.rs runs it too)
cp "$ROOT/tests/data/kindnet.conflist" "$WORK/confs/kind.conflist"

COMMON=(--socket "$SOCK" --image "$TAG" --cgroup-parent "$CGROUP_PARENT" --node-ip "$NODE_IP"
        --log-dir "$WORK/ctd/logs" --cnikit "$WORK/bin/cnikit")
MEASURE=(--calls "$WORK/calls.txt") # each call's start and end, for the breakdown

if [ "${1:-}" = --measure ]; then
  n=${2:-50}
  printf '%-14s %5s | %-17s | %-17s | %-17s |\n' "" "" "RunPodSandbox" "StopPodSandbox" "RemovePodSandbox"
  printf '%-14s %5s | %8s %8s | %8s %8s | %8s %8s | wall\n' plugins pods p50 p99 p50 p99 p50 p99
  start_containerd "$WORK/bin" "$WORK/net.d" 1
  ctr -a "$SOCK" -n k8s.io images import --snapshotter native "$WORK/image.tar" > /dev/null
  use_conflist "$WORK/confs/cri.conflist" cri
  "$SUITE" measure "${COMMON[@]}" "${MEASURE[@]}" --count "$n" --label "cnikit" | tee "$WORK/measure.txt"
  start_daemon
  "$SUITE" measure "${COMMON[@]}" "${MEASURE[@]}" --count "$n" --label "cnikit+daemon" | tee -a "$WORK/measure.txt"
  stop_daemon
  stop_containerd
  rm -rf /var/lib/cni/* /run/cnikit/*
  start_containerd "$WORK/ref" "$WORK/net.d" 2
  use_conflist "$WORK/confs/ref.conflist" cri
  "$SUITE" measure "${COMMON[@]}" "${MEASURE[@]}" --count "$n" --label "reference" | tee -a "$WORK/measure.txt"
  "$SUITE" measure "${COMMON[@]}" "${MEASURE[@]}" --count "$n" --label "no CNI" --host-network true | tee -a "$WORK/measure.txt"
  stop_containerd
  echo "ms; one TCP hostPort per pod; no CNI = hostNetwork pods (containerd + runc alone)"
  exit 0
fi

start_containerd "$WORK/bin" "$WORK/net.d" 1
ctr -a "$SOCK" -n k8s.io images import --snapshotter native "$WORK/image.tar" > /dev/null
: > "$WORK/results.txt"
modes=(inproc daemon)
[ "${AGENT_ONLY:-0}" = 1 ] && modes=()
for mode in "${modes[@]}"; do
  echo "== mode $mode"
  # each mode starts from a bare node: its first pods create the bridges and the nft table
  ip link del cri0 2> /dev/null || true
  ip link del cni0 2> /dev/null || true
  nft delete table inet cnikit 2> /dev/null || true
  [ $mode = daemon ] && start_daemon
  use_conflist "$WORK/confs/cri.conflist" cri
  "$SUITE" suite "${COMMON[@]}" --mode "$mode" --network cri | tee -a "$WORK/results.txt" || true
  # the dual-stack example conflist itself (with cniVersion 1.0.0 if it says 1.1.0)
  use_conflist "$WORK/confs/pods.conflist" "$POD_NAME"
  "$SUITE" dualstack "${COMMON[@]}" --mode "$mode" --network "$POD_NAME" | tee -a "$WORK/results.txt" || true
  use_conflist "$WORK/confs/kind.conflist" kindnet
  "$SUITE" kind "${COMMON[@]}" --mode "$mode" --network kindnet | tee -a "$WORK/results.txt" || true
  [ $mode = daemon ] && stop_daemon
done
stop_containerd

# ---- the DaemonSet's pod (contrib/kubernetes/cnikit.yaml) as kubelet runs it, on a node
#      whose CNI dirs hold only an older cnikit (a copy of other bytes, hard links of it)
echo "== mode node-agent"
YAML=$ROOT/contrib/kubernetes/cnikit.yaml
H=$WORK/node
mkdir -p "$H/bin" "$H/net.d"
cp "$WORK/bin/cnikit" "$H/bin/cnikit"
printf 'an older build' >> "$H/bin/cnikit"
for p in bridge portmap loopback; do ln "$H/bin/cnikit" "$H/bin/$p"; done
ip link del cri0 2> /dev/null || true
nft delete table inet cnikit 2> /dev/null || true
# what the pod spec says: image, capabilities, hostPID, the ConfigMap's list (AGENT_CAPS and
# AGENT_HOST_PID override the manifest's, to find out which are needed)
IMG=$(sed -n 's/^ *image: \(cnikit:[^ ]*\)$/\1/p' "$YAML")
CAPS=${AGENT_CAPS-$(grep -o 'add: \[[^]]*\]' "$YAML" | head -1 | sed 's/add: \[\(.*\)\]/\1/; s/ //g')}
HOST_PID=${AGENT_HOST_PID:-$(grep -q '^ *hostPID: true' "$YAML" && echo true || echo false)}
LIST=$(sed -n 's/^  \([^ #][^:]*\.conflist\): |$/\1/p' "$YAML" | head -1)
# the ConfigMap's volume as kubelet lays it out: the key a link into ..data, a link to a
# timestamped directory holding the data
CM=$H/configmap
mkdir -p "$CM/..2025_01_01_00_00_00.000000001"
awk -v key="  $LIST: |" '$0 == key { on = 1; next }
  on && /^    / { print substr($0, 5); next } on && /^$/ { print; next } on { exit }' "$YAML" \
  > "$CM/..2025_01_01_00_00_00.000000001/$LIST"
ln -s ..2025_01_01_00_00_00.000000001 "$CM/..data"
ln -s "..data/$LIST" "$CM/$LIST"
NET=$(jq -r .name "$CM/$LIST")
start_containerd "$H/bin" "$H/net.d" 3
if [ -n "${AGENT_IMAGE:-}" ] &&
  ctr -a "$SOCK" -n k8s.io images import --snapshotter native "$AGENT_IMAGE" > /dev/null; then
  echo "ctr import names it: $(ctr -a "$SOCK" -n k8s.io images ls -q | grep cnikit | tr '\n' ' ')"
  echo "the manifest's image: $IMG; capabilities $CAPS; hostPID $HOST_PID; $LIST: network $NET"
  "$SUITE" node-agent "${COMMON[@]}" --mode node-agent --network "$NET" --agent-image "$IMG" \
    --caps "$CAPS" --host-pid "$HOST_PID" --host-bin "$H/bin" --host-conf "$H/net.d" \
    --net-conf "$CM" --list "$LIST" | tee -a "$WORK/results.txt" || true
  echo "the agent's log (CRI format):"
  sed 's/^/  /' "$WORK/ctd/logs/cnikit-agent/cnikit.log" 2> /dev/null | tail -40 || true
else
  echo "FAIL - [node-agent] the image (contrib/kubernetes/build-image) builds and imports" |
    tee -a "$WORK/results.txt"
fi
stop_containerd
# the outer script counts the ok/FAIL lines in results.txt
