#!/bin/bash
# Builds the kpx container image as an OCI image layout, without a container daemon:
# a Debian (bookworm, minbase) root filesystem made by mmdebstrap holding the tools
# the node agent's backends call, and kpx's binaries in /usr/local/bin, packed with
# umoci into two layers (the Debian root, then the binaries).
#
#   deploy/image/build.sh [--binaries DIR] [--out DIR] [--tag TAG] [--no-strip]
#
#   --binaries DIR  where kpx-controlplane and kpx-dataplane (and kpxctl, if there)
#                   are; default target/release when both are there, else target/debug
#   --out DIR       where the image layout goes (DIR/kpx, tag TAG); default target/image
#   --tag TAG       default: the workspace version in Cargo.toml
#   --no-strip      copy the binaries as they are (by default their debug info is
#                   stripped; symbols stay, so backtraces still name functions)
#
# Run as root. Installs what it lacks with apt-get (mmdebstrap, umoci, jq, binutils).
# The root filesystem is cached under target/image-cache, keyed on the package list
# and the recipe: a second build only repacks. Delete that folder to pick up new
# Debian (security) updates. The Debian mirror is the one this machine's apt uses.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CALLER=$PWD

SUITE=bookworm
VARIANT=minbase
# What the backends call (dataplane/src/exec): nft and libnftables.so.1 (nftables,
# libnftables1); iptables-{nft,legacy}[-save|-restore] and the ip6tables ones
# (iptables); ipset; conntrack; ip (iproute2); modprobe, which iptables-legacy and
# ipset run to load kernel modules, and which IPVS needs (kmod). Plus CA certificates.
PACKAGES=(ca-certificates conntrack iproute2 ipset iptables kmod libnftables1 nftables)
# Bump when the recipe below (excludes, cleanup) changes: it is part of the cache key.
RECIPE=3
DPKG_EXCLUDES=(
    'path-exclude=/usr/share/doc/*'
    'path-include=/usr/share/doc/*/copyright'
    'path-exclude=/usr/share/man/*'
    'path-exclude=/usr/share/info/*'
    'path-exclude=/usr/share/locale/*'
    'path-exclude=/usr/share/lintian/*'
    'path-exclude=/usr/share/linda/*'
)
IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "build.sh: $*" >&2; }
die() { echo "build.sh: error: $*" >&2; exit 1; }
usage() { sed -n '7,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

BINARIES=
OUT=
TAG=
STRIP=1
while [ $# -gt 0 ]; do
    case $1 in
        --binaries) [ $# -ge 2 ] || usage; BINARIES=$2; shift 2 ;;
        --binaries=*) BINARIES=${1#*=}; shift ;;
        --out) [ $# -ge 2 ] || usage; OUT=$2; shift 2 ;;
        --out=*) OUT=${1#*=}; shift ;;
        --tag) [ $# -ge 2 ] || usage; TAG=$2; shift 2 ;;
        --tag=*) TAG=${1#*=}; shift ;;
        --no-strip) STRIP=0; shift ;;
        -h|--help) usage ;;
        *) echo "build.sh: unknown argument: $1" >&2; usage ;;
    esac
done
# Paths given are taken from where the script was called; the defaults from the repo.
case ${BINARIES} in ""|/*) ;; *) BINARIES=$CALLER/$BINARIES ;; esac
case ${OUT} in ""|/*) ;; *) OUT=$CALLER/$OUT ;; esac
[ -n "$OUT" ] || OUT=target/image
cd "$ROOT"

[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap and umoci keep the root filesystem's owners)"
START=$SECONDS

if [ -z "$TAG" ]; then
    TAG=$(sed -n '/^\[workspace\.package\]/,/^\[/ s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
    [ -n "$TAG" ] || die "no version in [workspace.package] of Cargo.toml; pass --tag"
fi
if [ -z "$BINARIES" ]; then
    if [ -x target/release/kpx-controlplane ] && [ -x target/release/kpx-dataplane ]; then
        BINARIES=target/release
        if [ target/debug/kpx-dataplane -nt target/release/kpx-dataplane ]; then
            log "note: target/debug/kpx-dataplane is newer than the release one used"
        fi
    else
        BINARIES=target/debug
    fi
fi
for bin in kpx-controlplane kpx-dataplane; do
    [ -x "$BINARIES/$bin" ] || die "$BINARIES/$bin is missing (cargo build [--release] first)"
done

# --- tools -------------------------------------------------------------------------
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
command -v jq >/dev/null || missing+=(jq)
command -v objcopy >/dev/null || missing+=(binutils)
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- the Debian mirror this machine's apt uses ----------------------------------------
# The first URI of a "deb" entry for SUITE, from the deb822 files and sources.list.
apt_uri() {
    local suite=$1 files=() uri
    shopt -s nullglob
    files=(/etc/apt/sources.list.d/*.sources)
    shopt -u nullglob
    if [ ${#files[@]} -gt 0 ]; then
        uri=$(awk -v want="$suite" '
            function flush() {
                if (uris != "" && (" " types " ") ~ / deb / && (" " suites " ") ~ (" " want " ")) {
                    split(uris, u, " "); print u[1]; done = 1; exit
                }
                uris = ""; suites = ""; types = ""
            }
            FNR == 1 { flush() }
            /^[[:space:]]*$/ { flush(); next }
            /^URIs:/ { sub(/^URIs:[[:space:]]*/, ""); uris = $0 }
            /^Suites:/ { sub(/^Suites:[[:space:]]*/, ""); suites = $0 }
            /^Types:/ { sub(/^Types:[[:space:]]*/, ""); types = $0 }
            END { if (!done) flush() }' "${files[@]}")
        [ -n "$uri" ] && { echo "$uri"; return; }
    fi
    local lists=()
    [ -f /etc/apt/sources.list ] && lists+=(/etc/apt/sources.list)
    shopt -s nullglob
    lists+=(/etc/apt/sources.list.d/*.list)
    shopt -u nullglob
    [ ${#lists[@]} -gt 0 ] || return 0
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "${lists[@]}" |
        awk -v want="$suite" '$1 == "deb" && $3 == want { print $2; exit }'
}

# --- the root filesystem, cached ------------------------------------------------------
CACHE=target/image-cache
mkdir -p "$CACHE" "$OUT"
ARCH=$(dpkg --print-architecture)
KEY=$(printf '%s\n' "$SUITE" "$VARIANT" "$ARCH" "recipe=$RECIPE" "${DPKG_EXCLUDES[@]}" \
    "$(printf '%s\n' "${PACKAGES[@]}" | sort -u)" | sha256sum | cut -c1-16)
ROOTFS_TAR=$CACHE/rootfs-$SUITE-$ARCH-$KEY.tar

WORK=$(mktemp -d "$ROOT/target/image-build.XXXXXX")
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

if [ -f "$ROOTFS_TAR" ]; then
    log "root filesystem: cached $ROOTFS_TAR"
else
    mirror=$(apt_uri "$SUITE")
    [ -n "$mirror" ] || die "no 'deb' source for $SUITE in /etc/apt/sources.list{,.d}: cannot tell which Debian mirror to use"
    sources=("deb $mirror $SUITE main")
    for suite in "$SUITE-updates" "$SUITE-security"; do
        uri=$(apt_uri "$suite")
        if [ -n "$uri" ]; then
            sources+=("deb $uri $suite main")
        else
            log "note: no $suite source in /etc/apt; the image goes without it"
        fi
    done
    # merged-/usr made the debootstrap way (usr-is-merged): else apt picks usrmerge to
    # satisfy init-system-helpers, and it brings perl (47 MB).
    log "root filesystem: mmdebstrap $SUITE ($VARIANT) + ${PACKAGES[*]}"
    dpkgopts=()
    for opt in "${DPKG_EXCLUDES[@]}"; do dpkgopts+=("--dpkgopt=$opt"); done
    # Nothing of the build machine stays (resolv.conf, hostname: the runtime provides
    # them), nor logs, docs, man pages, locales. mmdebstrap's own cleanup (after this
    # hook) removes apt's lists and caches, /tmp, /run, and empties /etc/machine-id.
    # Never touch "$1"/tmp here: mmdebstrap keeps its apt config there (TMPDIR), and
    # without it that cleanup's "apt-get update" and "apt-get clean" act on the build
    # machine's own apt (emptying its /var/lib/apt/lists).
    # shellcheck disable=SC2016 # expanded by mmdebstrap's hook shell, not here
    hook='set -e; r="$1"
        rm -rf "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old \
            "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/* \
            "$r"/usr/share/lintian/* "$r"/usr/share/linda/* "$r"/var/tmp/*
        find "$r"/usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
        find "$r"/usr/share/doc -mindepth 1 -type d -empty -delete
        find "$r"/var/log -type f -delete
        rm -f "$r"/etc/resolv.conf "$r"/etc/hostname'
    if ! mmdebstrap --mode=root --variant="$VARIANT" --format=tar \
            --include="$(IFS=,; echo "${PACKAGES[*]}")" \
            --aptopt='APT::Install-Recommends "false"' \
            --aptopt='Acquire::Languages "none"' \
            --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
            "${dpkgopts[@]}" \
            --customize-hook="$hook" \
            "$SUITE" "$WORK/rootfs.tar" "${sources[@]}" >"$WORK/mmdebstrap.log" 2>&1; then
        tail -n 30 "$WORK/mmdebstrap.log" >&2
        die "mmdebstrap failed"
    fi
    # Older cached root filesystems (another package list) go.
    rm -f "$CACHE"/rootfs-*.tar
    mv "$WORK/rootfs.tar" "$ROOTFS_TAR"
    log "root filesystem built in $((SECONDS - START)) s: $ROOTFS_TAR"
fi

# --- the image ------------------------------------------------------------------------
LAYOUT=$OUT/kpx
IMAGE=$LAYOUT:$TAG
BUNDLE=$WORK/bundle
if [ ! -f "$LAYOUT/index.json" ]; then
    rm -rf "$LAYOUT"
    umoci init --layout "$LAYOUT"
elif umoci ls --layout "$LAYOUT" | grep -qxF "$TAG"; then
    umoci rm --image "$IMAGE"
fi
umoci new --image "$IMAGE"
umoci unpack --image "$IMAGE" "$BUNDLE" >/dev/null

# Layer 1: Debian. Device nodes stay out (the runtime mounts /dev).
tar -xpf "$ROOTFS_TAR" -C "$BUNDLE/rootfs" --numeric-owner --xattrs --xattrs-include='*' \
    --exclude='./dev/*'
umoci repack --refresh-bundle --image "$IMAGE" \
    --history.created_by "deploy/image/build.sh: debian $SUITE $VARIANT + ${PACKAGES[*]}" "$BUNDLE"

# Layer 2: kpx.
bins=(kpx-controlplane kpx-dataplane)
[ -x "$BINARIES/kpxctl" ] && bins+=(kpxctl)
for bin in "${bins[@]}"; do
    dest=$BUNDLE/rootfs/usr/local/bin/$bin
    if [ "$STRIP" = 1 ]; then
        objcopy --strip-debug "$BINARIES/$bin" "$dest"
    else
        cp "$BINARIES/$bin" "$dest"
    fi
    chown 0:0 "$dest"
    chmod 0755 "$dest"
done
# The binaries link against glibc (and libgcc_s) of the build machine: the image's must
# do for them.
for bin in "${bins[@]}"; do
    needs=$(chroot "$BUNDLE/rootfs" /usr/bin/ldd "/usr/local/bin/$bin" 2>&1) ||
        die "ldd /usr/local/bin/$bin in the image failed: $needs"
    if grep -E 'not found|No such file' <<<"$needs" >&2; then
        die "/usr/local/bin/$bin needs libraries (or versions) the image lacks (above)"
    fi
done
umoci repack --image "$IMAGE" \
    --history.created_by "deploy/image/build.sh: ${bins[*]} from $BINARIES" "$BUNDLE"

# Config: no entrypoint; the manifests choose the command.
umoci config --image "$IMAGE" --no-history \
    --clear=config.entrypoint --clear=config.cmd \
    --config.env "PATH=$IMAGE_PATH" \
    --config.workingdir / \
    --config.label org.opencontainers.image.title=kpx \
    --config.label "org.opencontainers.image.version=$TAG" \
    --config.label org.opencontainers.image.licenses=Apache-2.0
umoci gc --layout "$LAYOUT"

# --- report ---------------------------------------------------------------------------
blob() { echo "$LAYOUT/blobs/${1%%:*}/${1#*:}"; }
manifest=$(jq -r --arg tag "$TAG" \
    '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $tag) | .digest' \
    "$LAYOUT/index.json")
[ -n "$manifest" ] || die "tag $TAG is not in $LAYOUT/index.json"
compressed=$(jq '[.config.size] + [.layers[].size] | add' "$(blob "$manifest")")
layers=$(jq -r '[.layers[].size / 1048576 * 10 | round / 10 | tostring + " MiB"] | join(" + ")' "$(blob "$manifest")")
unpacked=$(du -sm "$BUNDLE/rootfs" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "built $IMAGE (OCI layout $LAYOUT, tag $TAG, manifest $manifest)"
echo "  binaries: ${bins[*]} from $BINARIES$([ "$STRIP" = 1 ] && echo ' (debug info stripped)')"
echo "  compressed: $(mib "$compressed") (layers: $layers), unpacked: $unpacked MiB"
echo "  took $((SECONDS - START)) s"
