#!/bin/sh
# Where kpx stands at scale: fan-out to simulated nodes, node programming per backend,
# data-path connect latency, one endpoint change through the Kubernetes API, an MCS export across
# three clusters. Prints a table; --json PATH writes the figures.
# Usage: sudo tests/bench-scale.sh [--services N] [--endpoints N] [--nodes N] [--slow-percent P]
#        [--changes N] [--node-scales SxE,…] [--node-changes N] [--node-idle S] [--mcs-endpoints N] [--json PATH]
#        [--skip fanout|floor|node|iptables|api|ipvs|mcs] [--tls]
#        [--baseline COMMIT=AGENT_BINARY]   (nftables' full rewrite also timed with another build's agent)
# The documentation's tables: tests/bench-table.py PATH.json --into docs/performance.md --into README.md
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root (it creates network namespaces)" >&2; exit 2; }
# The node agents need the kernel tools (a fresh machine has none: their agents would exit
# and the benchmark wait for them); tests/setup.sh installs them and does nothing when all is there.
for tool in nft iptables-legacy conntrack ip; do
  command -v "$tool" >/dev/null || { echo "tests/bench-scale.sh: $tool is missing: run tests/setup.sh first" >&2; exit 2; }
done
cargo build --release -q --bins
cargo build --release -q -p kpx-e2e --bins
echo "command: sudo tests/bench-scale.sh $*"
exec ./target/release/bench_scale "$@"
