#!/usr/bin/env bash
# Makes the TLS material of an install with openssl: a CA, the control plane's server
# certificate (for its Service's names and any --name given) and an admin client
# certificate for kpxctl (Subject CN kpx-admin, the --admin-identity of the manifests).
# Nodes need no certificate: they prove who they are with their pod-bound ServiceAccount
# tokens. Then, with kubectl:
#   kubectl -n kube-system create secret generic kpx-controlplane-tls \
#     --from-file=DIR/tls.crt --from-file=DIR/tls.key --from-file=DIR/ca.crt
# Usage: deploy/tls/make-certs.sh DIR [--namespace NS] [--name DNS-OR-IP]... [--days N]
set -euo pipefail

usage() { echo "usage: $0 DIR [--namespace NS] [--name DNS-OR-IP]... [--days N]" >&2; exit 2; }
[ $# -ge 1 ] || usage
dir=$1
shift
namespace=kube-system
days=365
names=()
while [ $# -gt 0 ]; do
  case $1 in
    --namespace) [ $# -ge 2 ] || usage; namespace=$2; shift 2 ;;
    --name) [ $# -ge 2 ] || usage; names+=("$2"); shift 2 ;;
    --days) [ $# -ge 2 ] || usage; days=$2; shift 2 ;;
    *) usage ;;
  esac
done
command -v openssl >/dev/null || { echo "$0: openssl is missing (apt-get install openssl)" >&2; exit 1; }
if [ -e "$dir/ca.key" ]; then
  echo "$0: $dir/ca.key exists; not overwriting a CA" >&2
  exit 1
fi
mkdir -p "$dir"
umask 077

san="DNS:kpx-controlplane,DNS:kpx-controlplane.$namespace,DNS:kpx-controlplane.$namespace.svc"
san="$san,DNS:kpx-controlplane.$namespace.svc.cluster.local"
for name in "${names[@]}"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san="$san,IP:$name"; else san="$san,DNS:$name"; fi
done

openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -days "$days" \
  -subj "/CN=kpx CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# issue NAME CN EXTENSIONS: NAME.crt and NAME.key signed by the CA.
issue() {
  local name=$1 cn=$2 ext=$3
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -subj "/CN=$cn" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -out "$dir/$name.crt" -extfile <(printf '%s\n' "$ext") 2>/dev/null
  rm -f "$dir/$name.csr"
}
issue tls kpx-controlplane "subjectAltName=$san
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth"
issue admin kpx-admin "keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
rm -f "$dir/ca.srl"
echo "made in $dir: ca.crt ca.key (keep it safe), tls.crt tls.key ($san), admin.crt admin.key (CN kpx-admin)"
