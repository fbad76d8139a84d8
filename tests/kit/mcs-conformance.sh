#!/usr/bin/env bash
# mcs-conformance.sh [nftables|iptables]: on ../shared/kit's clusters (not for CI), a new
# clusterset of two clusters made exactly as docs/multi-cluster.md "A clusterset from
# nothing" says — kx the home cluster (control plane, MCS controller, agents), ky the second
# (agents only, dialling kx's control plane) — then sig-multicluster's conformance suite
# (all 27 specs, through the kit's run-mcs.sh) and 20 endpoint changes in ky timed to a kx
# node's kernel. The suite's LABEL is printed last ($KIT/results/mcs/LABEL/summary.tsv).
#   KIT      the kit's folder (../shared/kit copied outside the repository), clusters built
#   KPX_SRC  the kpx checkout whose chart and CRDs are installed (default: this one); its
#            image must be in the nodes (KPX_REPO=… $KIT/kpx-image.sh)
#   LABEL    the results' label (default mcs-kpx-BACKEND)
#   FILTER   a ginkgo label filter (e.g. Required); default: every spec
#   LATENCY_ONLY=1  only the 20 timed changes, on the clusterset an earlier run made
#   KPX_BIN  the kit's kpx binaries, for --cleanup on the nodes (default: $KIT/kpx/bin)
# Each cluster is brought up with no kube-proxy (cluster-up.sh none) and kpx installed there
# afresh (an install left by an earlier run is uninstalled first).
set -euo pipefail
KIT=${KIT:?KIT names the kit folder (../shared/kit copied outside the repository)}
B=${1:-nftables}
KPX_SRC=${KPX_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
LABEL=${LABEL:-mcs-kpx-$B}
KPX_BIN=${KPX_BIN:-$KIT/kpx/bin}
HOME_CLUSTER=kx OTHER=ky
NODE_PORT=31800
CLUSTERSET_CIDR=10.112.0.0/16
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
log() { echo "[$(date +%H:%M:%S)] $*"; }

# on CLUSTER COMMAND...: the kit's helpers (kc, in_node, NODE_IP, …) of CLUSTER
on() { (KIT_CLUSTER=$1; shift; source "$KIT/cluster-lib.sh"; "$@"); }
kubectl_() { local c=$1; shift; on "$c" kc "$@"; }
helm_() {
  local c=$1; shift
  (KIT_CLUSTER=$c; source "$KIT/cluster-lib.sh"; in_ns "$SW" "$BIN/helm" --kubeconfig "$C/admin.kubeconfig" "$@")
}
api_of() { (KIT_CLUSTER=$1; source "$KIT/cluster-lib.sh"; echo "$API"); }
nodes_of() { (KIT_CLUSTER=$1; source "$KIT/cluster-lib.sh"; echo "${NODES[@]}"); }
node_ip() { (KIT_CLUSTER=$1; source "$KIT/cluster-lib.sh"; echo "${NODE_IP[$2]}"); }

install_clusterset() {
log "clusters $HOME_CLUSTER and $OTHER with no kube-proxy, their networks joined"
KIT_CLUSTER=$HOME_CLUSTER "$KIT/cluster-up.sh" none >"$WORK/up-$HOME_CLUSTER.log" 2>&1 || { cat "$WORK/up-$HOME_CLUSTER.log"; exit 1; }
KIT_CLUSTER=$OTHER "$KIT/cluster-up.sh" none >"$WORK/up-$OTHER.log" 2>&1 || { cat "$WORK/up-$OTHER.log"; exit 1; }
"$KIT/net-join.sh" $HOME_CLUSTER $OTHER
# An earlier install is removed as docs/install.md says: helm uninstall, then kpx's rules
# off every node (of either backend: the earlier run may have used the other).
for c in $HOME_CLUSTER $OTHER; do
  if helm_ $c status kpx -n kube-system >/dev/null 2>&1; then
    helm_ $c uninstall kpx -n kube-system --wait >/dev/null
    kubectl_ $c -n kube-system delete secret kpx-controlplane-tls kpx-cluster-$OTHER --ignore-not-found >/dev/null
    for n in $(nodes_of $c); do
      for backend in nftables iptables; do
        on $c in_node "$n" "$KPX_BIN/kpx-dataplane" --cleanup --backend $backend >/dev/null 2>&1 ||
          { echo "kpx-dataplane --cleanup --backend $backend failed on $n"; exit 1; }
      done
    done
  fi
done

# Step 1: the CRDs, in every cluster.
for c in $HOME_CLUSTER $OTHER; do
  kubectl_ $c apply -f - <"$KPX_SRC/deploy/kubernetes/overlays/mcs/crds.yaml" >/dev/null
done
log "step 1: CRDs in both clusters"

# Step 2: the control plane's certificate, with the home nodes' addresses the other
# cluster's agents dial; its CA (only) in the other cluster.
names=()
for n in $(nodes_of $HOME_CLUSTER); do names+=(--name "$(node_ip $HOME_CLUSTER "$n")"); done
"$KPX_SRC/deploy/tls/make-certs.sh" "$WORK/tls" "${names[@]}" >/dev/null
kubectl_ $HOME_CLUSTER -n kube-system create secret generic kpx-controlplane-tls \
  --from-file=tls.crt=/dev/stdin --from-file=tls.key="$WORK/tls/tls.key" --from-file=ca.crt="$WORK/tls/ca.crt" \
  <"$WORK/tls/tls.crt" >/dev/null
kubectl_ $OTHER -n kube-system create secret generic kpx-controlplane-tls --from-file=ca.crt=/dev/stdin \
  <"$WORK/tls/ca.crt" >/dev/null
log "step 2: certificate for ${names[*]}"

# Step 3: the other cluster, agents only, dialling the home control plane's node port.
first_home_node=$(node_ip $HOME_CLUSTER "$(nodes_of $HOME_CLUSTER | cut -d' ' -f1)")
helm_ $OTHER install kpx "$KPX_SRC/deploy/helm/kpx" -n kube-system --set backend="$B" \
  --set controlPlane.enabled=false --set controlPlane.url="https://$first_home_node:$NODE_PORT" >/dev/null
log "step 3: agents-only install in $OTHER"

# Step 4: the home control plane's kubeconfig for the other cluster, from the token
# Secret that install made.
for _ in $(seq 1 60); do
  token=$(kubectl_ $OTHER -n kube-system get secret kpx-controlplane-token -o jsonpath='{.data.token}' | base64 -d)
  [ -n "$token" ] && break; sleep 1
done
[ -n "$token" ] || { echo "no token in $OTHER's kpx-controlplane-token"; exit 1; }
kubectl_ $OTHER -n kube-system get secret kpx-controlplane-token -o jsonpath='{.data.ca\.crt}' | base64 -d >"$WORK/ca-$OTHER.crt"
K="$WORK/kubeconfig-$OTHER"
"$KIT/bin/kubectl" config --kubeconfig "$K" set-cluster $OTHER --server "$(api_of $OTHER)" \
  --certificate-authority "$WORK/ca-$OTHER.crt" --embed-certs >/dev/null
"$KIT/bin/kubectl" config --kubeconfig "$K" set-credentials kpx-controlplane --token "$token" >/dev/null
"$KIT/bin/kubectl" config --kubeconfig "$K" set-context $OTHER --cluster $OTHER --user kpx-controlplane >/dev/null
"$KIT/bin/kubectl" config --kubeconfig "$K" use-context $OTHER >/dev/null
kubectl_ $HOME_CLUSTER -n kube-system create secret generic kpx-cluster-$OTHER --from-file=kubeconfig=/dev/stdin <"$K" >/dev/null
log "step 4: Secret kpx-cluster-$OTHER in $HOME_CLUSTER"

# Step 5: the home cluster: control plane (reading both, the MCS controller), agents.
helm_ $HOME_CLUSTER install kpx "$KPX_SRC/deploy/helm/kpx" -n kube-system --set backend="$B" \
  --set controlPlane.clusterName=$HOME_CLUSTER --set controlPlane.nodePort=$NODE_PORT \
  --set "mcs.clustersetCIDRs={$CLUSTERSET_CIDR}" \
  --set "clusters[0].name=$OTHER" --set "clusters[0].secretName=kpx-cluster-$OTHER" >/dev/null
log "step 5: home install in $HOME_CLUSTER"
kubectl_ $HOME_CLUSTER -n kube-system rollout status deploy/kpx-controlplane --timeout=300s >/dev/null
for c in $HOME_CLUSTER $OTHER; do
  kubectl_ $c -n kube-system rollout status ds/kpx-dataplane --timeout=300s >/dev/null
done
log "control plane and every agent Ready"

}

if [ -z "${LATENCY_ONLY:-}" ]; then
  install_clusterset
  if [ -n "${FILTER:-}" ]; then
    "$KIT/run-mcs.sh" "$LABEL" $HOME_CLUSTER $OTHER -ginkgo.label-filter="$FILTER"
  else
    "$KIT/run-mcs.sh" "$LABEL" $HOME_CLUSTER $OTHER
  fi
fi

# 20 endpoint changes in the other cluster, each timed to a home node's kernel: an
# exported Service without a selector whose EndpointSlice is rewritten with a new address.
kubectl_ $OTHER create namespace mcs-latency --dry-run=client -o yaml | kubectl_ $OTHER apply -f - >/dev/null
kubectl_ $HOME_CLUSTER create namespace mcs-latency --dry-run=client -o yaml | kubectl_ $HOME_CLUSTER apply -f - >/dev/null
slice() {
  cat <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: probe-1, namespace: mcs-latency, labels: {kubernetes.io/service-name: probe, endpointslice.kubernetes.io/managed-by: mcs-latency}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints: [{addresses: ["$1"], conditions: {ready: true}}]
EOF
}
kubectl_ $OTHER apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: probe, namespace: mcs-latency}
spec: {ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]}
---
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata: {name: probe, namespace: mcs-latency}
EOF
slice 10.245.200.1 | kubectl_ $OTHER apply -f - >/dev/null
probe_node=$(nodes_of $HOME_CLUSTER | cut -d' ' -f2)
rules() {
  if [ "$B" = nftables ]; then on $HOME_CLUSTER in_node "$probe_node" nft list table inet kpx 2>/dev/null
  else on $HOME_CLUSTER in_node "$probe_node" sh -c 'iptables-nft-save; iptables-legacy-save' 2>/dev/null; fi
}
# in_kernel ADDRESS: the probe node's rules hold ADDRESS (read whole: grep -q would cut
# the listing short and pipefail count that as a failure)
in_kernel() { local r; r=$(rules); [[ $r == *"$1 "* || $r == *"$1,"* || $r == *"$1/"* || $r == *"$1:"* ]]; }
for _ in $(seq 1 120); do in_kernel 10.245.200.1 && break; sleep 1; done
in_kernel 10.245.200.1 || { echo "the import's first endpoint never reached $probe_node"; exit 1; }
: >"$WORK/latency"
for i in $(seq 2 21); do
  address=10.245.200.$i
  slice "$address" | kubectl_ $OTHER apply -f - >/dev/null
  t0=$(date +%s.%N)
  until in_kernel "$address"; do
    if python3 -c "import sys,time; sys.exit(time.time() - float(sys.argv[1]) < 30)" "$t0"; then
      echo "endpoint $address not in $probe_node's kernel after 30 s"; exit 1
    fi
    sleep 0.02
  done
  python3 -c "import sys,time; print(f'{time.time() - float(sys.argv[1]):.3f}')" "$t0" >>"$WORK/latency"
done
python3 - "$WORK/latency" "$B" "$probe_node" <<'PY'
import sys
t = sorted(float(x) for x in open(sys.argv[1]))
p = lambda q: t[min(len(t) - 1, int(round(q * (len(t) - 1))))]
print(f"endpoint change in ky -> {sys.argv[3]}'s kernel ({sys.argv[2]}), {len(t)} changes: "
      f"p50 {p(0.5):.3f} s, p99 {p(0.99):.3f} s, max {t[-1]:.3f} s "
      "(from kubectl apply returning; includes its exit and the poll of nft/iptables-save)")
PY
kubectl_ $OTHER delete namespace mcs-latency --wait=false >/dev/null
kubectl_ $HOME_CLUSTER delete namespace mcs-latency --wait=false >/dev/null
echo "$LABEL"
