#!/usr/bin/env bash
# Runs every test of kpx: unit tests and the end-to-end tests, which start the
# real binaries inside network namespaces (so: as root, with nft and ip).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "tests/run.sh: the end-to-end tests create network namespaces: run as root" >&2
  exit 2
fi
for tool in ip nft; do
  command -v "$tool" >/dev/null || { echo "tests/run.sh: $tool is missing (apt-get install iproute2 nftables)" >&2; exit 2; }
done
# One build serves every test: the e2e tests run the binaries from target/debug.
cargo build --workspace --bins --tests
cargo test --workspace "$@"
