#!/usr/bin/env bash
# Checks an image made by deploy/image/build.sh: it unpacks with umoci, and under chroot
# its root filesystem runs both binaries (`--version` names the tag) and every tool the
# node agent's backends call (dataplane/src/exec): nft and libnftables, iptables and
# ip6tables in both flavours (-save, -restore), ipset, conntrack, ip, modprobe.
#
#   deploy/image/check.sh [--out DIR] [--tag TAG] [--netns NAME]   (defaults as build.sh's)
#
# With --netns (a network namespace of the caller's, which it may change), the image's
# own kpx-dataplane, through the image's nft library and iptables, also removes kpx's
# rules placed there by the machine's tools: the image's tools program a real kernel.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=target/image
TAG=
NETNS=
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --netns) NETNS=$2; shift 2 ;;
    *) echo "check.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "check.sh: run as root (chroot)" >&2; exit 2; }
[ -n "$TAG" ] || TAG=$(sed -n '/^\[workspace\.package\]/,/^\[/ s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
BUNDLE=$(mktemp -d "$ROOT/target/image-check.XXXXXX")
trap 'rm -rf "$BUNDLE"' EXIT
umoci unpack --image "$OUT/kpx:$TAG" "$BUNDLE/unpacked" >/dev/null
rootfs=$BUNDLE/unpacked/rootfs
failed=0
# in_image WHAT COMMAND...: runs COMMAND in the image's root; prints PASS or FAIL.
in_image() {
  local what=$1 out
  shift
  if out=$(chroot "$rootfs" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" 2>&1); then
    echo "PASS $what: $(head -n1 <<<"$out")"
  else
    echo "FAIL $what: $out" >&2
    failed=1
  fi
}
for bin in kpx-dataplane kpx-controlplane; do
  out=$(chroot "$rootfs" "/usr/local/bin/$bin" --version 2>&1) || { echo "FAIL $bin --version: $out" >&2; failed=1; continue; }
  if [[ $out == *"$TAG"* ]]; then echo "PASS $bin --version: $out"; else echo "FAIL $bin --version says $out, not $TAG" >&2; failed=1; fi
done
in_image nft nft --version
in_image libnftables sh -c 'ls /usr/lib/*/libnftables.so.1'
for family in iptables ip6tables; do
  for flavour in nft legacy; do
    for verb in "" -save -restore; do
      in_image "$family-$flavour$verb" "$family-$flavour$verb" --version
    done
  done
done
in_image ipset ipset --version
in_image conntrack conntrack --version
in_image ip ip -V
in_image modprobe modprobe --version
if [ -n "$NETNS" ]; then
  # The image's agent removing what the machine's tools put there.
  ip netns exec "$NETNS" nft add table inet kpx
  ip netns exec "$NETNS" iptables-nft -t nat -N KPX-SERVICES
  for backend in nftables "iptables --iptables-mode nft"; do
    # shellcheck disable=SC2086 # the backend's words are flags
    # As a container runtime would: /dev, /proc and /sys mounted in the root (in a mount
    # namespace of its own, so nothing stays mounted).
    if out=$(ip netns exec "$NETNS" unshare --mount --propagation private sh -c \
        'mount --rbind /dev "$0/dev" && mount -t proc kpx-proc "$0/proc" && mount -t sysfs kpx-sys "$0/sys" && exec chroot "$0" "$@"' \
        "$rootfs" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        kpx-dataplane --cleanup --backend $backend 2>&1); then
      echo "PASS kpx-dataplane --cleanup --backend $backend in $NETNS"
    else
      echo "FAIL kpx-dataplane --cleanup --backend $backend in $NETNS: $out" >&2
      failed=1
    fi
  done
  if ip netns exec "$NETNS" nft list table inet kpx >/dev/null 2>&1; then
    echo "FAIL the image's kpx-dataplane left table inet kpx" >&2; failed=1
  fi
  if ip netns exec "$NETNS" iptables-nft -t nat -S KPX-SERVICES >/dev/null 2>&1; then
    echo "FAIL the image's kpx-dataplane left the chain KPX-SERVICES" >&2; failed=1
  fi
fi
if [ "$failed" != 0 ]; then
  echo "check.sh: $OUT/kpx:$TAG lacks what is named above" >&2
  exit 1
fi
echo "check.sh: $OUT/kpx:$TAG holds both binaries and every tool the backends call"
