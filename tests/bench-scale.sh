#!/bin/sh
# Where kpx stands at scale: fan-out to simulated nodes, node programming per backend,
# data-path connect latency, one endpoint change through the Kubernetes API. Prints a table; --json PATH writes the figures.
# Usage: sudo tests/bench-scale.sh [--services N] [--endpoints N] [--nodes N] [--slow-percent P]
#        [--changes N] [--node-scales SxE,…] [--node-changes N] [--node-idle S] [--json PATH] [--skip fanout|node|iptables|api] [--tls]
# The README's scale table: tests/bench-table.py PATH.json --readme README.md
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root (it creates network namespaces)" >&2; exit 2; }
cargo build --release -q --bins
echo "command: sudo tests/bench-scale.sh $*"
exec ./target/release/bench_scale "$@"
