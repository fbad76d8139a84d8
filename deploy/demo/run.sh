#!/usr/bin/env bash
# The embedded default, end to end, in a sandbox: a node network namespace with
# three backend "pods" and a client, kpx-controlplane reading the manifest
# folder deploy/demo/manifests, kpx-dataplane programming nftables in the node
# namespace, and requests to the ClusterIP 10.96.0.10:80 showing the balance.
# Everything it creates is removed when it exits.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "deploy/demo/run.sh: run as root (it creates network namespaces)" >&2; exit 2; }
# What the agent runs (nft, ip, conntrack: stale UDP flows are deleted with it) and the pods.
if ! command -v nft >/dev/null || ! command -v ip >/dev/null || ! command -v conntrack >/dev/null \
  || [ ! -x /usr/bin/python3 ] || ! command -v make >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iproute2 conntrack python3 make >/dev/null
fi
cargo build --quiet --bins

tag="kpxdemo$$"
node="$tag-node" client="$tag-client"
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "$node" "$client" "$tag-pod1" "$tag-pod2" "$tag-pod3"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$node"; ip netns add "$client"
ip -n "$node" link set lo up
ip netns exec "$node" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0
ip -n "$node" link add to-client type veth peer name eth0 netns "$client"
ip -n "$node" addr add 10.0.0.1/24 dev to-client; ip -n "$node" link set to-client up
ip -n "$client" addr add 10.0.0.2/24 dev eth0; ip -n "$client" link set eth0 up; ip -n "$client" link set lo up
ip -n "$client" route add default via 10.0.0.1
for i in 1 2 3; do
  pod="$tag-pod$i"
  ip netns add "$pod"; ip -n "$pod" link set lo up
  ip -n "$node" link add "to-pod$i" type veth peer name eth0 netns "$pod"
  ip -n "$node" addr add "10.244.$i.1/24" dev "to-pod$i"; ip -n "$node" link set "to-pod$i" up
  ip -n "$pod" addr add "10.244.$i.2/24" dev eth0; ip -n "$pod" link set eth0 up
  ip -n "$pod" route add default via "10.244.$i.1"
  # A tiny HTTP server in each pod that says who it is.
  mkdir -p "$work/pod$i"; echo "hello from pod$i (10.244.$i.2)" > "$work/pod$i/index.html"
  ip netns exec "$pod" /usr/bin/python3 -m http.server 8080 --bind 0.0.0.0 --directory "$work/pod$i" >/dev/null 2>&1 &
  pids+=($!)
done

ip netns exec "$node" target/debug/kpx-controlplane --source file:deploy/demo/manifests --listen 127.0.0.1:18000 \
  2> "$work/controlplane.log" &
pids+=($!)
ip netns exec "$node" target/debug/kpx-dataplane --node-name demo-node --control-plane http://127.0.0.1:18000 \
  --backend nftables --state-dir "$work/state" 2> "$work/dataplane.log" &
pids+=($!)

echo "waiting for kpx to program 10.96.0.10:80 ..."
for _ in $(seq 1 200); do
  ip netns exec "$node" nft list table inet kpx 2>/dev/null | grep -q "10.96.0.10 . tcp . 80 :" && break
  sleep 0.1
done
echo
echo "== kpx's rules in the node namespace (nft list table inet kpx), abridged"
ip netns exec "$node" nft list table inet kpx | grep -A4 -E "map (service-ips|endpoints)-v4 \{"
ip netns exec "$node" nft list table inet kpx | grep -A2 -E "chain pick-v4-3 \{"
echo
echo "== 30 requests from the client to http://10.96.0.10/"
for _ in $(seq 1 30); do
  ip netns exec "$client" /usr/bin/python3 -c \
    'import urllib.request;print(urllib.request.urlopen("http://10.96.0.10/",timeout=3).read().decode().strip())' || echo "request failed"
done | sort | uniq -c
echo
echo "== kpxctl services (the control plane's admin API)"
ip netns exec "$node" target/debug/kpxctl services
echo
echo "== kpxctl trace 10.96.0.10:80 --source 10.0.0.2 (the node agent's admin API)"
ip netns exec "$node" target/debug/kpxctl trace 10.96.0.10:80 --source 10.0.0.2
echo
echo "== control plane log";  tail -n 5 "$work/controlplane.log"
echo "== node agent log";     tail -n 4 "$work/dataplane.log"
ip netns exec "$node" target/debug/kpx-dataplane --cleanup --state-dir "$work/state" 2>/dev/null
echo
echo "demo done: processes stopped, namespaces and rules removed"
