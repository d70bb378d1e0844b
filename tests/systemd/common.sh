# shellcheck shell=bash
# What the node's test scripts share (sourced by guest.sh and upgrade.sh): the ok/FAIL
# report, the reads of the units, the daemon's metrics and the leases, and TCP traffic.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
ok=0
fail=0
pass() { ok=$((ok + 1)); echo "ok - $*"; }
bad() { fail=$((fail + 1)); echo "FAIL - $*"; }
# t WHAT CMD...: passes if CMD succeeds; shows its output when it does not
t() {
  local what=$1; shift
  if "$@" >/tmp/t.out 2>&1; then pass "$what"; else bad "$what"; sed 's/^/    /' /tmp/t.out | head -30; fi
}
teq() { if [ "$2" = "$3" ]; then pass "$1"; else bad "$1"; echo "    expected '$2', got '$3'"; fi; }
within() { # SECONDS CMD...: CMD succeeds within SECONDS
  local n=$(($1 * 5)); shift
  for _ in $(seq "$n"); do "$@" && return 0; sleep 0.2; done
  "$@"
}
prop() { systemctl show -p "$2" --value "$1"; }
metric() { curl -s --unix-socket /run/cnikit/ipamd.sock http://x/metrics | grep -E "^$1" || true; }
leases() { cnikit ipamd leases --network pods --json; }
# ipamd_ext_requests_total{op="firewall.<op>",outcome="ok"} N for each firewall op served.
firewall_ok() { metric 'ipamd_ext_requests_total\{op="firewall\.[a-z-]+",outcome="ok"\}' | awk '{s+=$2} END {print s+0}'; }
firewall_not_ok() { metric 'ipamd_ext_requests_total\{op="firewall\.' | grep -v 'outcome="ok"' | awk '{s+=$2} END {print s+0}'; }
# A TCP server in netns $1 on $2 that answers each connection with $3.
serve_at() { ip netns exec "$1" systemd-socket-activate -l "$2" --inetd -a /bin/echo "$3" >/dev/null 2>&1 & }
# ask NETNS ADDR PORT: the first line a TCP connection from NETNS (- : the node's own
# namespace) to ADDR:PORT gets.
ask() {
  local in=(ip netns exec "$1")
  [ "$1" = - ] && in=()
  "${in[@]}" timeout 1 bash -c "exec 3<>/dev/tcp/$2/$3 && head -1 <&3" 2>/dev/null
}
answers() { # WANT NETNS ADDR PORT: a few tries (a server just started may not listen yet)
  local got _
  for _ in 1 2 3 4 5; do
    got=$(ask "$2" "$3" "$4")
    [ "$got" = "$1" ] && return 0
    sleep 0.2
  done
  echo "got '$got' from $3:$4 in netns $2, want '$1'"
  return 1
}
# The end of a script: the counts, and its exit status.
report() {
  echo "SYSTEMD-RESULT $ok passed, $fail failed"
  [ "$fail" = 0 ]
}
