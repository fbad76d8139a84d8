#!/bin/bash
# Checks the image deploy/image/build.sh made: unpacks it (umoci) into a temporary
# folder under target/ and, chrooted there, runs kpx's binaries and every tool the
# node agent's backends call. Prints a PASS line per check; any failure is named and
# the script exits 1 once all checks have run.
#
#   deploy/image/check.sh [--out DIR] [--tag TAG] [--netns NAME]
#
#   --out DIR     where the image layout is (DIR/kpx); default target/image
#   --tag TAG     default: the workspace version in Cargo.toml
#   --netns NAME  also: in that network namespace of the caller's (which it may
#                 change), the image's own kpx-dataplane, through the image's nft
#                 library and iptables, removes kpx's rules placed there by the
#                 machine's tools: the image's tools program a real kernel (root only)
#
# Commands run with the image's environment only (env -i PATH=<the image's PATH>).
# As root it unpacks with owners kept and uses chroot; otherwise it unpacks with
# --rootless and chroots inside new user and network namespaces (unshare -r -n:
# "ipset --version" asks the kernel, which needs CAP_NET_ADMIN over the namespace).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CALLER=$PWD

die() { echo "check.sh: error: $*" >&2; exit 1; }
usage() { sed -n '7,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

OUT=
TAG=
NETNS=
while [ $# -gt 0 ]; do
    case $1 in
        --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
        --out=*) OUT=${1#*=}; shift ;;
        --tag) [ $# -ge 2 ] || usage; TAG=$2; shift 2 ;;
        --tag=*) TAG=${1#*=}; shift ;;
        --netns) [ $# -ge 2 ] || usage; NETNS=$2; shift 2 ;;
        --netns=*) NETNS=${1#*=}; shift ;;
        -h|--help) usage ;;
        *) echo "check.sh: unknown argument: $1" >&2; usage ;;
    esac
done
# Paths given are taken from where the script was called; the defaults from the repo.
case ${OUT} in ""|/*) ;; *) OUT=$CALLER/$OUT ;; esac
[ -n "$OUT" ] || OUT=target/image
cd "$ROOT"
START=$SECONDS
if [ -z "$TAG" ]; then
    TAG=$(sed -n '/^\[workspace\.package\]/,/^\[/ s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
    [ -n "$TAG" ] || die "no version in [workspace.package] of Cargo.toml; pass --tag"
fi
LAYOUT=$OUT/kpx
IMAGE=$LAYOUT:$TAG
[ -f "$LAYOUT/index.json" ] || die "no OCI layout at $LAYOUT (run deploy/image/build.sh)"
[ -z "$NETNS" ] || [ "$(id -u)" = 0 ] || die "--netns needs root"
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

missing=()
command -v umoci >/dev/null || missing+=(umoci)
command -v jq >/dev/null || missing+=(jq)
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "needs ${missing[*]} (apt-get install ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p target
WORK=$(mktemp -d "$ROOT/target/image-check.XXXXXX")
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT
BUNDLE=$WORK/bundle
ROOTFS=$BUNDLE/rootfs

if [ "$(id -u)" = 0 ]; then
    umoci unpack --image "$IMAGE" "$BUNDLE" >/dev/null || die "umoci unpack --image $IMAGE failed"
    ROOTLESS=0
    in_image() { chroot "$ROOTFS" /usr/bin/env -i PATH="$IMAGE_PATH" "$@"; }
else
    umoci unpack --rootless --image "$IMAGE" "$BUNDLE" >/dev/null ||
        die "umoci unpack --rootless --image $IMAGE failed"
    ROOTLESS=1
    in_image() { unshare --map-root-user --net chroot "$ROOTFS" /usr/bin/env -i PATH="$IMAGE_PATH" "$@"; }
fi

FAILED=()
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*" >&2; FAILED+=("${1%%:*}"); }

# check NAME EXPECT COMMAND...: COMMAND runs in the image, exits 0 and prints EXPECT.
check() {
    local name=$1 expect=$2 out rc=0
    shift 2
    out=$(in_image "$@" 2>&1) || rc=$?
    local first
    first=$(grep -v '^Couldn.t find runtime libbpf' <<<"$out" | sed -n 1p)
    # env exits 127 when it cannot find the command, 126 when it cannot run it.
    if [ "$rc" = 127 ] || [ "$rc" = 126 ]; then
        fail "$name: missing from the image ($*: exit $rc: $first)"
    elif [ "$rc" != 0 ]; then
        fail "$name: '$*' exits $rc: $first"
    elif ! grep -qF -- "$expect" <<<"$out"; then
        fail "$name: '$*' does not print '$expect': $first"
    else
        pass "$name: $first"
    fi
}

# --- kpx -----------------------------------------------------------------------------
check "kpx-dataplane --version" "kpx-dataplane $TAG" kpx-dataplane --version
check "kpx-controlplane --version" "kpx-controlplane $TAG" kpx-controlplane --version
if [ -e "$ROOTFS/usr/local/bin/kpxctl" ]; then
    check "kpxctl --version" "kpxctl $TAG" kpxctl --version
fi
# The control plane's Deployment runs it as 65532:65532.
if [ "$ROOTLESS" = 1 ]; then
    echo "SKIP kpx-controlplane as 65532:65532: rootless, only one uid is mapped"
elif out=$(chroot --userspec=65532:65532 "$ROOTFS" /usr/bin/env -i PATH="$IMAGE_PATH" \
        kpx-controlplane --version 2>&1); then
    pass "kpx-controlplane runs as 65532:65532: $out"
else
    fail "kpx-controlplane as 65532:65532: $out"
fi

# --- the tools the backends call (dataplane/src/exec) -----------------------------------
# nftables backend: nft, and libnftables.so.1 which kpx dlopens (through ld.so.cache).
TOOLS=(nft)
check nft "nftables v" nft --version
cache=$(in_image /sbin/ldconfig -p 2>&1 || true)
if grep -q 'libnftables\.so\.1 ' <<<"$cache"; then
    pass "libnftables.so.1: in ld.so.cache (dlopen finds it)"
else
    fail "libnftables.so.1: not in the image's ld.so.cache (the nftables backend dlopens it)"
fi
# iptables and ipvs backends: both flavours, both families, the commands and their
# -save / -restore.
for family in iptables ip6tables; do
    for flavour in nft legacy; do
        label=$flavour
        [ "$flavour" = nft ] && label=nf_tables
        for verb in "" -save -restore; do
            TOOLS+=("$family-$flavour$verb")
            check "$family-$flavour$verb" "($label)" "$family-$flavour$verb" --version
        done
    done
done
TOOLS+=(ipset conntrack ip modprobe)
check ipset "ipset v" ipset --version
check conntrack "conntrack v" conntrack --version
check ip "iproute2" ip -V
# modprobe: iptables-legacy and ipset load their kernel modules with it; IPVS's too.
check modprobe "kmod version" modprobe --version

# Every tool dataplane/src/exec names must be among the ones checked above: its TOOL
# constants, the tools process::run / process::output are given, and the iptables
# programs it spells out (the flavoured ones are built with format!: "iptables-restore"
# stands for iptables-nft-restore and iptables-legacy-restore).
if [ -d dataplane/src/exec ]; then
    named=$(grep -hoE 'const TOOL: &str = "[^"]+"|process::(run|output)\("[^"]+"|"ip6?tables[-a-z]*"' \
        dataplane/src/exec/*.rs | grep -oE '"[^"]+"' | tr -d '"' | sort -u)
    for tool in $named; do
        case $tool in
            ip6tables|iptables|ip6tables-save|iptables-save|ip6tables-restore|iptables-restore)
                base=${tool%%-*} verb=
                [ "$tool" = "$base" ] || verb=-${tool#*-}
                flavoured="$base-nft$verb $base-legacy$verb" ;;
            *) flavoured=$tool ;;
        esac
        for program in $flavoured; do
            case " ${TOOLS[*]} libnftables " in
                *" $program "*) ;;
                *) fail "$program: dataplane/src/exec runs it, but check.sh does not check it" ;;
            esac
        done
    done
    pass "every tool dataplane/src/exec names is checked: $(echo "$named" | tr '\n' ' ')"
fi

# --- the rest of the image -------------------------------------------------------------
if [ -s "$ROOTFS/etc/ssl/certs/ca-certificates.crt" ]; then
    pass "ca-certificates: /etc/ssl/certs/ca-certificates.crt"
else
    fail "ca-certificates: /etc/ssl/certs/ca-certificates.crt missing or empty"
fi

blob() { echo "$LAYOUT/blobs/${1%%:*}/${1#*:}"; }
manifest=$(jq -r --arg tag "$TAG" \
    '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $tag) | .digest' \
    "$LAYOUT/index.json")
config=$(jq -r .config.digest "$(blob "$manifest")")
cfg=$(blob "$config")
expect_config() {
    local name=$1 filter=$2 want=$3 got
    got=$(jq -r "$filter" "$cfg")
    if [ "$got" = "$want" ]; then pass "config $name: $got"; else fail "config $name: '$got', not '$want'"; fi
}
expect_config entrypoint '.config.Entrypoint // [] | length' 0
expect_config env.PATH '.config.Env // [] | map(select(startswith("PATH="))) | .[0] // ""' "PATH=$IMAGE_PATH"
expect_config label.title '.config.Labels["org.opencontainers.image.title"] // ""' kpx
expect_config label.version '.config.Labels["org.opencontainers.image.version"] // ""' "$TAG"
expect_config label.licenses '.config.Labels["org.opencontainers.image.licenses"] // ""' Apache-2.0
expect_config os/arch '.os + "/" + .architecture' "linux/$(dpkg --print-architecture 2>/dev/null || echo amd64)"

# --- the image's agent against a real kernel (--netns) ---------------------------------
if [ -n "$NETNS" ]; then
    # The image's agent removing what the machine's tools put there.
    ip netns exec "$NETNS" nft add table inet kpx
    ip netns exec "$NETNS" iptables-nft -t nat -N KPX-SERVICES
    for backend in nftables "iptables --iptables-mode nft"; do
        # As a container runtime would: /dev, /proc and /sys mounted in the root (in a
        # mount namespace of its own, so nothing stays mounted).
        # shellcheck disable=SC2086,SC2016 # the backend's words are flags; $0, $@ are sh -c's
        if out=$(ip netns exec "$NETNS" unshare --mount --propagation private sh -c \
                'mount --rbind /dev "$0/dev" && mount -t proc kpx-proc "$0/proc" && mount -t sysfs kpx-sys "$0/sys" && exec chroot "$0" "$@"' \
                "$ROOTFS" /usr/bin/env -i PATH="$IMAGE_PATH" \
                kpx-dataplane --cleanup --backend $backend 2>&1); then
            pass "kpx-dataplane --cleanup --backend $backend in $NETNS"
        else
            fail "kpx-dataplane --cleanup --backend $backend in $NETNS: $out"
        fi
    done
    if ip netns exec "$NETNS" nft list table inet kpx >/dev/null 2>&1; then
        fail "cleanup: the image's kpx-dataplane left table inet kpx in $NETNS"
    else
        pass "cleanup: no table inet kpx left in $NETNS"
    fi
    if ip netns exec "$NETNS" iptables-nft -t nat -S KPX-SERVICES >/dev/null 2>&1; then
        fail "cleanup: the image's kpx-dataplane left the chain KPX-SERVICES in $NETNS"
    else
        pass "cleanup: no chain KPX-SERVICES left in $NETNS"
    fi
fi

if [ ${#FAILED[@]} -gt 0 ]; then
    echo "check.sh: $IMAGE FAILED ${#FAILED[@]} check(s): ${FAILED[*]}" >&2
    exit 1
fi
echo "check.sh: $IMAGE passes ($((SECONDS - START)) s)"
