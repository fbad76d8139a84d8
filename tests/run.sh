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
# A gRPC reflection client of another implementation (Python grpcio-reflection), for the
# reflection tests; kept in target/ and made once.
if [ ! -x target/pyenv/bin/python ] || ! target/pyenv/bin/python -c 'import grpc_reflection' 2>/dev/null; then
  python3 -m venv target/pyenv
  target/pyenv/bin/pip install -q grpcio grpcio-reflection
fi
# One build serves every test: the e2e tests run the binaries from target/debug.
cargo build --workspace --bins --tests
cargo test --workspace "$@"
