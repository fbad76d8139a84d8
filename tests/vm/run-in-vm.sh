#!/bin/bash
# Runs one command inside a throwaway VM whose kernel has IPVS (a stock Debian
# linux-image-amd64, where ip_vs and its schedulers, dummy, veth, 9p and overlay
# are modules) and prints its output; exits with the command's exit code.
#
#   tests/vm/run-in-vm.sh COMMAND [ARG...]
#
# The guest sees the host's root read-only over 9p with a tmpfs overlay (it can
# write anywhere; nothing reaches the host), in the caller's working directory and
# environment. It has no network card: nothing leaves it. qemu runs with TCG (KVM is
# not usable on these machines). First use installs qemu, busybox-static and kmod and
# unpacks the kernel into $VM_CACHE (about 35 s); each run then boots in 5-10 s.
#
# Settings: VM_CACHE (default /var/cache/kpx-vm), VM_MEM (MiB, 2048), VM_CPUS (2),
# VM_TIMEOUT (s, 1800). Exit codes: the command's own; 124 when the VM timed out;
# 125 when the VM failed (the end of its console is printed).
set -euo pipefail

CACHE=${VM_CACHE:-/var/cache/kpx-vm}
MEM=${VM_MEM:-2048}
CPUS=${VM_CPUS:-2}
TIMEOUT=${VM_TIMEOUT:-1800}
MODULES="virtio_pci 9pnet_virtio 9p overlay virtio_rng"

[ "$(id -u)" = 0 ] || { echo "run-in-vm: run as root" >&2; exit 2; }
[ $# -gt 0 ] || { echo "usage: run-in-vm.sh COMMAND [ARG...]" >&2; exit 2; }

log() { echo "run-in-vm: $*" >&2; }

install_packages() {
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    [ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q static || missing+=(busybox-static)
    command -v depmod >/dev/null || missing+=(kmod)
    command -v xz >/dev/null || missing+=(xz-utils)
    command -v cpio >/dev/null || missing+=(cpio)
    command -v file >/dev/null || missing+=(file)
    [ ${#missing[@]} -eq 0 ] && return
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    local policy target=()
    policy=$(apt-cache policy qemu-utils 2>/dev/null || true)
    if printf '%s' "$policy" | grep -q 'Installed: .*bpo'; then
        # qemu-utils comes from backports on these machines: qemu-system-x86 must too,
        # or apt removes it. Add the backports suite of the configured Debian mirror.
        if ! grep -rqs 'backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
            local codename uris
            codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
            uris=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
            if [ -n "$uris" ]; then
                printf 'Types: deb\nURIs: %s\nSuites: %s-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                    "$uris" "$codename" > /etc/apt/sources.list.d/kpx-vm-backports.sources
            fi
        fi
        apt-get update -qq
        target=(-t "$(. /etc/os-release && echo "$VERSION_CODENAME")-backports")
    else
        apt-get update -qq
    fi
    apt-get install -y -qq --no-install-recommends "${target[@]}" "${missing[@]}" >/dev/null
}

# The kernel: downloaded (not installed), unpacked, modules indexed, payload decompressed.
prepare_kernel() {
    [ -f "$CACHE/ready" ] && return
    mkdir -p "$CACHE"
    local pkg
    local depends
    depends=$(apt-cache depends linux-image-amd64)
    pkg=$(printf '%s\n' "$depends" | awk '/Depends: linux-image-[0-9]/ {print $2}' | sed -n 1p)
    [ -n "$pkg" ] || { log "cannot resolve linux-image-amd64"; exit 125; }
    log "fetching $pkg"
    rm -rf "$CACHE/kernel" "$CACHE"/*.deb
    (cd "$CACHE" && apt-get download -qq "$pkg" 2>&1 | grep -v 'unsandboxed' >&2 || true)
    ls "$CACHE"/"$pkg"_*.deb >/dev/null
    dpkg-deb -x "$CACHE"/"$pkg"_*.deb "$CACHE/kernel"
    local kver
    kver=$(ls "$CACHE/kernel/lib/modules")
    depmod -b "$CACHE/kernel" "$kver"
    # The bzImage's xz payload as an ELF vmlinux: qemu boots it directly (PVH), which
    # saves the in-guest decompression (seconds under TCG).
    local image="$CACHE/kernel/boot/vmlinuz-$kver" offset
    # (No `grep | head` under pipefail: grep dies of SIGPIPE at random.)
    { LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$image" || true; } | tr -d '\000' > "$CACHE/xz-offsets"
    offset=$(LC_ALL=C sed -n '1s/:.*//p' "$CACHE/xz-offsets")
    [ -n "$offset" ] || { log "no xz payload in $image"; exit 125; }
    tail -c +"$((offset + 1))" "$image" | xz -dc > "$CACHE/vmlinux" 2>/dev/null || true
    head -c 4 "$CACHE/vmlinux" | grep -q 'ELF' || { log "no ELF payload in $image"; exit 125; }
    echo "$kver" > "$CACHE/kver"
    build_initramfs "$kver"
    touch "$CACHE/ready"
}

build_initramfs() {
    local kver=$1 root="$CACHE/initramfs"
    rm -rf "$root"
    mkdir -p "$root/bin" "$root/modules"
    cp /bin/busybox "$root/bin/busybox"
    : > "$root/modules/order"
    local module path
    for module in $MODULES; do
        local closure
        closure=$(modprobe -S "$kver" -d "$CACHE/kernel" --show-depends "$module")
        printf '%s\n' "$closure" | awk '$1 == "insmod" {print $2}' |
            while read -r path; do
                local name
                name=$(basename "$path")
                if ! grep -qx "$name" "$root/modules/order"; then
                    cp "$CACHE/kernel/${path#/}" "$root/modules/$name" 2>/dev/null || cp "$path" "$root/modules/$name"
                    echo "$name" >> "$root/modules/order"
                fi
            done
    done
    cat > "$root/init" <<'INIT'
#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev /host /upper /newroot
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for m in $($B cat /modules/order); do $B insmod /modules/$m; done
arg() { $B sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
JOB=$(arg vmjob); KVER=$(arg vmkver); CACHE=$(arg vmcache)
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /host
$B mount -t tmpfs tmpfs /upper
$B mkdir -p /upper/u /upper/w
$B mount -t overlay overlay -o lowerdir=/host,upperdir=/upper/u,workdir=/upper/w /newroot
$B mkdir -p "/newroot$JOB" "/newroot/lib/modules/$KVER"
$B mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=262144 job "/newroot$JOB"
$B mount --bind "/newroot$CACHE/kernel/lib/modules/$KVER" "/newroot/lib/modules/$KVER"
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mount --move /dev /newroot/dev
exec $B switch_root /newroot /bin/bash "$JOB/stage2"
INIT
    chmod +x "$root/init"
    (cd "$root" && find . | cpio -o -H newc --quiet) > "$CACHE/initrd.cpio"
}

install_packages
prepare_kernel
KVER=$(cat "$CACHE/kver")

JOB=$(mktemp -d /tmp/kpx-vm-job.XXXXXX)
trap 'rm -rf "$JOB"' EXIT
export -p > "$JOB/env"
printf '%q ' "$@" > "$JOB/command"
cat > "$JOB/stage2" <<STAGE2
#!/bin/bash
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
mount -t tmpfs tmpfs /run
mkdir -p /run/netns /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 none /sys/fs/cgroup 2>/dev/null
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
echo /sbin/modprobe > /proc/sys/kernel/modprobe
ip link set lo up
set -a; . "$JOB/env" 2>/dev/null; set +a
export PATH=\$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd "$PWD"
bash -c "\$(cat $JOB/command)" > "$JOB/stdout" 2> "$JOB/stderr"
echo \$? > "$JOB/rc.tmp" && mv "$JOB/rc.tmp" "$JOB/rc"
sync
echo o > /proc/sysrq-trigger
sleep 60
STAGE2
: > "$JOB/stdout"
: > "$JOB/stderr"

BIOS=""
[ -f /usr/share/qemu/qboot.rom ] && BIOS="-bios /usr/share/qemu/qboot.rom"
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -M pc -m "$MEM" -smp "$CPUS" \
    -nodefaults -no-user-config -display none -no-reboot \
    $BIOS -kernel "$CACHE/vmlinux" -initrd "$CACHE/initrd.cpio" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off nokaslr audit=0 lsm= vmjob=$JOB vmkver=$KVER vmcache=$CACHE" \
    -serial "file:$JOB/console.log" -device virtio-rng-pci \
    -fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap" \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev "local,id=job,path=$JOB,security_model=none,multidevs=remap" \
    -device virtio-9p-pci,fsdev=job,mount_tag=job &
QEMU=$!
tail -q --pid=$QEMU -n +1 -f "$JOB/stdout" &
TAIL_OUT=$!
tail -q --pid=$QEMU -n +1 -f "$JOB/stderr" >&2 &
TAIL_ERR=$!
status=0
wait $QEMU || status=$?
wait $TAIL_OUT $TAIL_ERR 2>/dev/null || true
if [ -f "$JOB/rc" ]; then
    exit "$(cat "$JOB/rc")"
fi
if [ "$status" = 124 ]; then
    log "timed out after ${TIMEOUT}s"
    exit 124
fi
log "the VM failed (qemu exit $status); end of its console:"
tail -n 30 "$JOB/console.log" >&2 || true
exit 125
