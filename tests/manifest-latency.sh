#!/usr/bin/env bash
# Prints how long a manifest change takes to reach the kernel: from the moment
# an EndpointSlice file is rewritten to the node agent's "delta applied" (the
# nft transaction committed and sled flushed), over N changes. Root; uses a
# throwaway network namespace. Usage: tests/manifest-latency.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
cargo build --release --quiet --bins
ns="kpxlat$$"; work=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; ip netns del "$ns" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ip netns add "$ns"; ip -n "$ns" link set lo up
mkdir "$work/m"
slice() { # $1: number of endpoints
  printf 'kind: Service\nmetadata: {name: web, namespace: bench}\nspec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}\n---\n'
  printf 'kind: EndpointSlice\nmetadata: {name: web-1, namespace: bench, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n'
  for i in $(seq 1 "$1"); do printf -- '- {addresses: [10.244.0.%d]}\n' "$i"; done
}
slice 3 > "$work/m/web.yaml"
ip netns exec "$ns" target/release/kpx-controlplane --source "file:$work/m" --listen 127.0.0.1:18000 --log-format json 2>"$work/cp.log" &
pids+=($!)
ip netns exec "$ns" target/release/kpx-dataplane --node-name n1 --control-plane http://127.0.0.1:18000 --state-dir "$work/state" --log-format json 2>"$work/dp.log" &
pids+=($!)
applied() { grep -c '"delta applied".*ServiceView' "$work/dp.log" || true; }
until [ "$(applied)" -ge 1 ]; do sleep 0.05; done
results=()
for i in $(seq 1 "$n"); do
  before=$(applied)
  slice $(( 3 + i % 2 )) > "$work/m/tmp"; t0=$(date +%s.%N); mv "$work/m/tmp" "$work/m/web.yaml"
  until [ "$(applied)" -gt "$before" ]; do sleep 0.01; done
  t1=$(grep '"delta applied".*ServiceView' "$work/dp.log" | tail -1 | sed -E 's/.*"timestamp":"([^"]+)".*/\1/')
  results+=("$(python3 -c "import datetime,sys;t1=datetime.datetime.fromisoformat(sys.argv[1].replace('Z','+00:00')).timestamp();print(round((t1-float(sys.argv[2]))*1000,1))" "$t1" "$t0")")
  sleep 0.3
done
apply_us=$(grep '"delta applied".*ServiceView' "$work/dp.log" | tail -n "$n" | sed -E 's/.*"elapsed_us":([0-9]+).*/\1/' | sort -n | tr '\n' ' ')
printf '%s\n' "${results[@]}" | sort -n | python3 -c "
import sys; v=[float(x) for x in sys.stdin]; n=len(v)
print(f'manifest change -> kernel committed, {n} changes: min {v[0]} ms, p50 {v[n//2]} ms, max {v[-1]} ms')"
echo "node agent apply (validate + nft transaction + sled flush), us, sorted: $apply_us"
