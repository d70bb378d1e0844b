# shellcheck shell=bash disable=SC2154 # t, teq, within, metric: common.sh
# Cluster pools with the packaged unit (sourced by guest.sh): the drop-in of
# docs/cluster-pools.md ("Under systemd") against Debian's etcd on the node, started at boot
# (add-wants), its hardening letting it reach etcd and keep the routes of --route-blocks.
# Afterwards the unit is as the package left it.

ETCD=http://127.0.0.1:2379
DROPIN=/etc/systemd/system/ipamd.service.d/cluster.conf

etcd_healthy() { curl -sf $ETCD/health | grep -q '"health":"true"'; }
# etcd_put KEY JSON: a key as another node's daemon writes it (etcd's JSON gateway).
etcd_put() {
  local k v
  k=$(printf %s "$1" | base64 -w0)
  v=$(printf %s "$2" | base64 -w0)
  curl -sf -X POST $ETCD/v3/kv/put -d "{\"key\":\"$k\",\"value\":\"$v\"}" >/dev/null
}
etcd_del() { curl -sf -X POST $ETCD/v3/kv/deleterange -d "{\"key\":\"$(printf %s "$1" | base64 -w0)\"}" >/dev/null; }
proto_route() { ip route show proto 203 | grep -q "^$1 via $2 "; }
no_proto_route() { ! ip route show proto 203 | grep -q "^$1 "; }

cluster_mode() {
  # A node's look: eth0 with an address and the default route (the address --route-blocks
  # publishes when none is given).
  t "the node's eth0 and default route" bash -c 'ip link add eth0 type veth peer name eth0-peer &&
    ip addr add 192.0.2.10/24 dev eth0 && ip link set eth0 up && ip link set eth0-peer up &&
    ip route add default via 192.0.2.1'
  t "Debian's etcd runs on the node" systemctl start etcd.service
  t "... and is healthy" within 20 etcd_healthy
  mkdir -p "${DROPIN%/*}"
  cat >"$DROPIN" <<EOF
[Service]
ExecStart=
ExecStart=/opt/cni/bin/cnikit ipamd daemon --etcd-endpoints $ETCD --node node-a --route-blocks --etcd-session-ttl 5
EOF
  t "drop-in, daemon-reload" systemctl daemon-reload
  t "started at boot: add-wants multi-user.target" systemctl add-wants multi-user.target ipamd.service
  local since
  since=$(date +%s)
  t "restart with the cluster flags" bash -c 'systemctl restart ipamd.service ||
    { journalctl -u ipamd.service -n 15 --no-pager -o cat; exit 1; }'
  t "pool create" cnikit ipamd pool create pods4 --cidr 10.244.0.0/16 --etcd-endpoints $ETCD
  t "the hardened daemon holds its etcd session" within 10 bash -c "curl -s --unix-socket /run/cnikit/ipamd.sock http://x/metrics | grep -q '^ipamd_cluster_session_up 1'"
  cat >/etc/cni/net.d/20-cluster.conflist <<'EOF'
{"cniVersion": "1.0.0", "name": "cluster", "plugins": [
  {"type": "bridge", "bridge": "cni1", "isGateway": true, "ipMasq": true, "ipMasqExclude": ["10.244.0.0/16"],
   "ipam": {"type": "ipamd", "pool": "pods4", "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
  t "ADD from the cluster pool" bash -c 'ip netns add cpod && cnikit net add cluster cpod --container-id cpod'
  t "its address is from the pool" bash -c 'cnikit ipamd leases --network cluster --json | grep -q "10\.244\."'
  etcd_put /cnikit/nodes/node-b '{"node":"node-b","pid":1,"since":0,"addresses":["192.0.2.20"]}'
  etcd_put /cnikit/pools/pods4/blocks/10.244.200.0/26 '{"node":"node-b","network":"cluster","inUse":1}'
  t "a route to another node's block (the hardening allows it)" within 2 proto_route 10.244.200.0/26 192.0.2.20
  etcd_del /cnikit/pools/pods4/blocks/10.244.200.0/26
  t "... gone with the block" within 2 no_proto_route 10.244.200.0/26
  t "DEL" bash -c 'cnikit net del cluster cpod --container-id cpod && ip netns del cpod'
  t "no error in the daemon's journal" bash -c "! journalctl -u ipamd.service -p err --since @$since --no-pager -q | grep ."
  rm -f "$DROPIN" /etc/systemd/system/multi-user.target.wants/ipamd.service /etc/cni/net.d/20-cluster.conflist
  t "back to the package's unit" bash -c 'systemctl daemon-reload && systemctl restart ipamd.service'
}
