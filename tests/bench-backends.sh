#!/bin/sh
# Full sync and one-endpoint-change times of the nftables and iptables backends,
# side by side, in a scratch network namespace. Usage: sudo tests/bench-backends.sh [SERVICES…]
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root (it creates a network namespace)" >&2; exit 2; }
cargo build --release -q -p kpx-e2e --bin bench_backends
echo "command: sudo tests/bench-backends.sh $*"
exec ./target/release/bench_backends "$@"
