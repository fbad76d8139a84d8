#!/usr/bin/env bash
# migrate-under-load.sh [nftables|iptables]: on the real cluster of ../shared/kit (not for CI),
# docs/install.md's migration from a running kube-proxy (nftables) to kpx and back, under load:
# a client pod sends requests without pause to a ClusterIP and to a NodePort of a Service of
# three agnhost pods while `switch-proxy.sh kpx-B` and then `switch-proxy.sh
# kube-proxy-nftables` run; at the end it prints how many requests were answered and how
# many failed, per target and per phase. KIT names the kit's folder (its scripts find
# themselves); KPX_SRC the kpx checkout whose chart is installed (default: this one).
set -euo pipefail
KIT=${KIT:?KIT names the kit folder (../shared/kit copied outside the repository)}
B=${1:-nftables}
export KPX_SRC=${KPX_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
kc() { "$KIT/kubectl.sh" "$@"; }
NS=kpx-migration
kc delete namespace $NS --ignore-not-found --wait=true --timeout=180s >/dev/null   # an earlier run's
kc create namespace $NS --dry-run=client -o yaml | kc apply -f - >/dev/null
kc apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: $NS}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: registry.k8s.io/e2e-test-images/agnhost:2.55
        args: [netexec, --http-port=8080]
        readinessProbe: {httpGet: {path: /hostname, port: 8080}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: $NS}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080, nodePort: 30880}]
YAML
kc -n $NS rollout status deploy/web --timeout=180s
VIP=$(kc -n $NS get svc web -o jsonpath='{.spec.clusterIP}')
NODE=$(kc get node -o jsonpath='{.items[1].status.addresses[?(@.type=="InternalIP")].address}')
kc -n $NS delete pod client --ignore-not-found --wait=true >/dev/null
# One request after the other to each target, 2 s timeout each; a line per request (a
# failure with curl's exit status: 7 refused, 28 timed out, 56 reset).
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: $NS}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: registry.k8s.io/e2e-test-images/agnhost:2.55
    command: [sh, -c, 'while true; do for u in http://$VIP/hostname http://$NODE:30880/hostname; do curl -sf -m 2 -o /dev/null \$u; rc=\$?; if [ \$rc = 0 ]; then echo "ok \$u"; else echo "FAIL \$u curl-exit=\$rc \$(date +%T.%N)"; fi; done; done']
YAML
kc -n $NS wait --for=condition=Ready pod/client --timeout=120s >/dev/null
mark() { kc -n $NS exec client -- sh -c "echo phase $1 > /proc/1/fd/1"; echo "== $1 ($(date +%T))"; }
sleep 10
mark "kpx-$B"
"$KIT/switch-proxy.sh" "kpx-$B"
kc -n kube-system rollout status ds/kpx-dataplane --timeout=120s
sleep 20
mark kube-proxy-nftables
"$KIT/switch-proxy.sh" kube-proxy-nftables
sleep 20
mark end
kc -n $NS logs client | awk '
  /^phase/ {phase=$2; next}
  {n[phase" "$1" "$2]++}
  END {for (k in n) print k, n[k]}' | sort
echo "failures:"; kc -n $NS logs client | grep FAIL | head -20 || true
kc delete namespace $NS --wait=false >/dev/null
