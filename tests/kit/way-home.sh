#!/usr/bin/env bash
# way-home.sh [nftables|iptables]: on the real cluster of ../shared/kit (not for CI), with no
# kube-proxy and kpx installed from its chart as docs/install.md's "A cluster without kube-proxy"
# says, the three ways agents used to lose their control plane for good, each timed:
#   1. the control plane scaled to 0 (20 s away) and back to 2;
#   2. helm uninstall, docs/install.md's cleanup on every node, helm install again;
#   3. one node's /var/lib/kpx wiped, kpx's rules removed there (kpx-dataplane --cleanup) and
#      its agent pod deleted: a new node.
# After each it prints the seconds from the control plane being Ready again to every agent's
# stream (`stream open` in its log) and to a Service created then being in every node's
# kernel. KIT names the kit's folder; KPX_SRC the kpx checkout whose chart is installed
# (default: this one); KPX_BIN the kit's kpx binaries (default: $KIT/kpx/bin).
set -euo pipefail
KIT=${KIT:?KIT names the kit folder (../shared/kit copied outside the repository)}
B=${1:-nftables}
KPX_SRC=${KPX_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
# shellcheck source=/dev/null
source "$KIT/cluster-lib.sh"
KPX_BIN=${KPX_BIN:-$KIT/kpx/bin}
helm_() { in_ns "$SW" "$BIN/helm" --kubeconfig "$C/admin.kubeconfig" "$@"; }
now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }

install() {
  helm_ upgrade --install kpx "$KPX_SRC/deploy/helm/kpx" -n kube-system --set backend="$B" >/dev/null
}
cp_ready() { kc -n kube-system rollout status deploy/kpx-controlplane --timeout=300s >/dev/null; now; }

# in_kernel NODE IP: the node's kpx rules hold IP
in_kernel() {
  if [ "$B" = nftables ]; then in_node "$1" nft list table inet kpx 2>/dev/null | grep -q "$2"
  # every table of both flavours: a Service without endpoints is a REJECT in filter
  else in_node "$1" sh -c 'iptables-nft-save; iptables-legacy-save' 2>/dev/null | grep -q -- "-d $2/32"; fi
}

# report LABEL T_CHANGE T_READY NODE...: for each NODE, when its agent's stream opened
# (the first `stream open` after T_CHANGE, the moment of the change), counted from T_READY
# (the control plane Ready again); then a Service created now, and when it is in every
# node's kernel.
report() {
  local label=$1 t_change=$2 t_ready=$3 n p opened svc ip t_svc t_created line
  shift 3
  for n in "$@"; do
    opened=""
    for _ in $(seq 1 120); do
      # the node's agent pod that is not being deleted (a deleted one's log stays readable)
      p=$(kc -n kube-system get pod -l app.kubernetes.io/component=dataplane --field-selector spec.nodeName=$n \
          -o go-template --template='{{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}}{{end}}{{end}}')
      opened=$(kc -n kube-system logs "$p" 2>/dev/null | python3 -c '
import json, sys, datetime
t_change, t_ready = float(sys.argv[1]), float(sys.argv[2])
for line in sys.stdin:
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if not e.get("message", "").startswith("stream open"):
        continue
    t = datetime.datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
    if t >= t_change:
        via = e.get("address") or "the URL"
        print(f"{t - t_ready:+.1f} s from Ready, via {via}")
        break
' "$t_change" "$t_ready" || true)
      [ -n "$opened" ] && break; sleep 1
    done
    echo "$label: $n ($p) stream open ${opened:-NEVER (within 120 s)}"
  done
  svc=way-home-$(date +%s)
  t_created=$(now)
  kc -n default create service clusterip "$svc" --tcp=80:8080 >/dev/null
  ip=$(kc -n default get svc "$svc" -o jsonpath='{.spec.clusterIP}')
  for n in "${NODES[@]}"; do
    t_svc=""
    for _ in $(seq 1 600); do in_kernel "$n" "$ip" && { t_svc=$(now); break; }; sleep 0.1; done
    line="$label: $n has Service $svc ($ip), created $(secs "$t_ready" "$t_created") s after Ready, in its kernel"
    if [ -n "$t_svc" ]; then echo "$line $(secs "$t_created" "$t_svc") s after its creation"
    else echo "$line: NEVER (within 60 s)"; fi
  done
  kc -n default delete service "$svc" >/dev/null
}

kc get daemonset -n kube-system kube-proxy >/dev/null 2>&1 && die "kube-proxy runs: this is for a cluster without it"
install
kc -n kube-system rollout status ds/kpx-dataplane --timeout=300s >/dev/null
echo "== kpx-$B installed; $(kc -n kube-system get pods -l app.kubernetes.io/name=kpx --no-headers | wc -l) pods"

echo "== 1. control plane scaled to 0 and back to 2"
kc -n kube-system scale deploy/kpx-controlplane --replicas=0 >/dev/null
kc -n kube-system wait --for=delete pod -l app.kubernetes.io/component=controlplane --timeout=120s >/dev/null 2>&1 || true
sleep 20
t_change=$(now)
kc -n kube-system scale deploy/kpx-controlplane --replicas=2 >/dev/null
report "1 scale" "$t_change" "$(cp_ready)" "${NODES[@]}"

echo "== 2. helm uninstall, cleanup on every node, helm install"
helm_ uninstall kpx -n kube-system --wait >/dev/null
kc -n kube-system wait --for=delete pod -l app.kubernetes.io/name=kpx --timeout=120s >/dev/null 2>&1 || true
for n in "${NODES[@]}"; do in_node "$n" "$KPX_BIN/kpx-dataplane" --cleanup --backend "$B" 2>&1 | tail -1; done
t_change=$(now)
install
report "2 reinstall" "$t_change" "$(cp_ready)" "${NODES[@]}"

echo "== 3. a new node: kx-n3's state and rules gone, its agent pod deleted"
p=$(kc -n kube-system get pod -l app.kubernetes.io/component=dataplane --field-selector spec.nodeName=kx-n3 \
    -o jsonpath='{.items[0].metadata.name}')
# The agent is stopped first (SIGSTOP), so that it cannot program its rules again from its
# canary, or its state again, before its pod is gone.
netns=$(readlink /proc/"$(cat "$C/nodes/kx-n3/node.pid")"/ns/net)
for pid in $(pgrep -x kpx-dataplane); do
  [ "$(readlink /proc/"$pid"/ns/net)" = "$netns" ] && kill -STOP "$pid" && echo "stopped kx-n3's agent (pid $pid)"
done
in_node kx-n3 sh -c 'rm -rf /var/lib/kpx/*'
in_node kx-n3 "$KPX_BIN/kpx-dataplane" --cleanup --backend "$B" 2>&1 | tail -1
t_change=$(now)
kc -n kube-system delete pod "$p" --grace-period=1 --wait=false >/dev/null
report "3 new node" "$t_change" "$t_change" kx-n3
