#!/usr/bin/env bash
# Builds (or finds in the cache) a systemd + cgroup v2 guest that tests/vm/run.sh boots: a
# Debian root of one flavour made by mmdebstrap from Debian's own packages, written into a raw ext4
# image with `mke2fs -d` (no loop mount, no privileges beyond writing the cache), plus the
# kernel (uncompressed when possible: qemu then boots it directly through its PVH entry, which
# under TCG saves the kernel's own decompression) and a small initramfs.
#
# Flavours:
#   bookworm  Debian 12: containerd 1.6, runc 1.1, docker (the cgroup v2 daemon-reload table
#             on the versions most nodes still ran in 2024).
#   sid       Debian unstable: the node of 2026 (issue 24): containerd 2.x with its CRI plugin,
#             runc >= 1.2, crun, podman 5, systemd >= 257, cgroup v2 only. sid moves: the
#             image is fixed once cached, and guest-test.sh checks every version against the
#             range the tier claims before testing anything.
#
# Usage: build-guest.sh [FLAVOUR [CACHE_DIR]]   (FLAVOUR default bookworm; CACHE_DIR default
# $ACCEL_VM_CACHE, else /var/cache/accel-vm)
# Prints the directory holding disk.img, kernel and initrd.img. The directory's name is the
# flavour and a hash of the recipe, so any change to the package list or the recipe builds a
# new image; the flavour's older ones are removed.
set -euo pipefail
# stdout is the one line tests/vm/run.sh reads as the image directory: every tool below
# writes to stderr (fd 1 points there), the result alone to the saved stdout. mke2fs -d
# prints "Creating regular file ..." on stdout even with -q, and an empty cache is the only
# run that reaches it.
exec 3>&1 1>&2

flavour=${1:-bookworm}
cache=${2:-${ACCEL_VM_CACHE:-/var/cache/accel-vm}}
mirror=http://deb.debian.org/debian
# What every guest must run: systemd as PID 1 (cgroup v2 is the default of both suites), udev
# (so /dev/char holds what a real node's holds), the engines under test, and busybox for the
# containers' root filesystems; gcc for the end-to-end suite run inside the guest (it compiles
# its fake driver libraries and a probe at test time).
packages=systemd-sysv,udev,dbus,kmod,linux-image-amd64,initramfs-tools,runc,busybox-static,containerd,gcc,libc6-dev
case $flavour in
  bookworm)
    suite=bookworm
    packages=$packages,docker.io
    size=3G
    aptopts=()
    ;;
  sid)
    # crun as the second low-level runtime; podman without its recommends (no networking:
    # every container runs with --network none), conmon and containers-common are its depends.
    # The CNI plugins for the CRI pods that cannot use the host's network (user namespaces):
    # only loopback is configured.
    # sid's Release file is valid for a week; a mirror that lags (or a snapshot) would
    # fail apt-get update. What was installed is printed and checked by the test instead.
    suite=sid
    packages=$packages,crun,podman,containernetworking-plugins
    size=4G
    aptopts=(--aptopt='Acquire::Check-Valid-Until "false"')
    ;;
  *)
    echo "build-guest.sh: unknown flavour '$flavour' (bookworm or sid)" >&2
    exit 1
    ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
key=$( (echo "$flavour"; cat "$here/build-guest.sh" "$here/customize-guest.sh") | sha256sum | cut -c1-16)
out=$cache/guest-$flavour-$key
if [ -s "$out/disk.img" ] && [ -s "$out/kernel" ] && [ -s "$out/initrd.img" ]; then
  echo "$out" >&3
  exit 0
fi

mkdir -p "$cache"
# Older recipes' images are dead weight (about 1.5 GB each, sparse): this flavour's, and
# those named before there were flavours (guest-<hash>).
find "$cache" -maxdepth 1 \( -name "guest-$flavour-*" -o -name 'guest-????????????????' \) \
  ! -name "guest-$flavour-$key" -exec rm -rf {} +
work=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

log() { echo "build-guest: $* ($(date -u +%H:%M:%S))"; }
log "mmdebstrap $suite ($flavour): $packages"
# initramfs: only what mounting an ext4 virtio disk needs (MODULES=most would take most of
# the boot time unpacking it under TCG). The unit that runs the test, the 9p mount and the
# services the test starts itself are set up by the customize hook.
mmdebstrap --mode=root --variant=minbase --include="$packages" \
  --aptopt='APT::Install-Recommends "false"' "${aptopts[@]}" \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --setup-hook='mkdir -p "$1/etc/initramfs-tools/conf.d"' \
  --setup-hook='printf "MODULES=list\nCOMPRESS=gzip\n" > "$1/etc/initramfs-tools/conf.d/accel-vm.conf"' \
  --setup-hook='printf "virtio_pci\nvirtio_blk\next4\n" > "$1/etc/initramfs-tools/modules"' \
  --customize-hook="\"$here/customize-guest.sh\" \"\$1\"" \
  "$suite" "$root" "$mirror"

log "kernel"
vmlinuz=$(ls "$root"/boot/vmlinuz-* | head -1)
cp "$(ls "$root"/boot/initrd.img-* | head -1)" "$work/initrd.img"
# Debian compresses the kernel with xz (bookworm) or zstd (sid): find the stream inside the
# bzImage and unpack it (what the kernel's scripts/extract-vmlinux does). If that fails, qemu
# boots the bzImage.
is_elf() { [ -s "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
for magic in xz:$'\xfd7zXZ\x00' zstd:$'\x28\xb5\x2f\xfd'; do
  tool=${magic%%:*}
  off=$(LC_ALL=C grep -abo "${magic#*:}" "$vmlinuz" | head -1 | cut -d: -f1 || true)
  [ -n "$off" ] || continue
  case $tool in
    xz) tail -c +"$((off + 1))" "$vmlinuz" | xz -dc --single-stream 2>/dev/null > "$work/kernel" || true ;;
    # zstd stops at the frame's end but complains about the bytes after it.
    zstd) tail -c +"$((off + 1))" "$vmlinuz" | zstd -dc 2>/dev/null > "$work/kernel" || true ;;
  esac
  if is_elf "$work/kernel"; then
    log "uncompressed vmlinux ($tool) at offset $off"
    break
  fi
  rm -f "$work/kernel"
done
if [ ! -s "$work/kernel" ]; then
  log "no xz or zstd stream found: booting the bzImage"
  cp "$vmlinuz" "$work/kernel"
fi
rm -rf "$root/boot"/*

log "ext4 image"
mke2fs -q -t ext4 -L accel-guest -d "$root" -E root_owner=0:0 "$work/disk.img" "$size"
rm -rf "$root"
mkdir -p "$out"
mv "$work/disk.img" "$work/kernel" "$work/initrd.img" "$out/"
log "done: $out"
echo "$out" >&3
