#!/usr/bin/env bash
# Builds (or finds in the cache) the systemd + cgroup v2 guest that tests/vm_systemd.rs boots:
# a Debian 12 root made by mmdebstrap from Debian's own packages, written into a raw ext4
# image with `mke2fs -d` (no loop mount, no privileges beyond writing the cache), plus the
# kernel (uncompressed when possible: qemu then boots it directly through its PVH entry, which
# under TCG saves the kernel's own decompression) and a small initramfs.
#
# Usage: build-guest.sh [CACHE_DIR]   (default $ACCEL_VM_CACHE, else /var/cache/accel-vm)
# Prints the directory holding disk.img, kernel and initrd.img. The directory's name is a hash
# of this file, so any change to the package list or the recipe builds a new image; older
# ones are removed.
set -euo pipefail
# stdout is the one line tests/vm/run.sh reads as the image directory: every tool below
# writes to stderr (fd 1 points there), the result alone to the saved stdout. mke2fs -d
# prints "Creating regular file ..." on stdout even with -q, and an empty cache is the only
# run that reaches it.
exec 3>&1 1>&2

cache=${1:-${ACCEL_VM_CACHE:-/var/cache/accel-vm}}
suite=bookworm
mirror=http://deb.debian.org/debian
# What the guest must run: systemd as PID 1 (cgroup v2 is bookworm's default), udev (so
# /dev/char holds what a real node's holds), the engines under test, and busybox for the
# containers' root filesystems; gcc for the end-to-end suite run inside the guest (it compiles
# its fake driver libraries and a probe at test time).
packages=systemd-sysv,udev,dbus,kmod,linux-image-amd64,initramfs-tools,runc,busybox-static,docker.io,containerd,gcc,libc6-dev

here=$(cd "$(dirname "$0")" && pwd)
key=$(cat "$here/build-guest.sh" "$here/customize-guest.sh" | sha256sum | cut -c1-16)
out=$cache/guest-$key
if [ -s "$out/disk.img" ] && [ -s "$out/kernel" ] && [ -s "$out/initrd.img" ]; then
  echo "$out" >&3
  exit 0
fi

mkdir -p "$cache"
# Older recipes' images are dead weight (about 1.5 GB each, sparse).
find "$cache" -maxdepth 1 -name 'guest-*' ! -name "guest-$key" -exec rm -rf {} +
work=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

log() { echo "build-guest: $* ($(date -u +%H:%M:%S))"; }
log "mmdebstrap $suite: $packages"
# initramfs: only what mounting an ext4 virtio disk needs (MODULES=most would take most of
# the boot time unpacking it under TCG). The unit that runs the test, the 9p mount and the
# services the test starts itself are set up by the customize hook.
mmdebstrap --mode=root --variant=minbase --include="$packages" \
  --aptopt='APT::Install-Recommends "false"' \
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
# Debian compresses the kernel with xz: find the stream inside the bzImage and unpack it
# (what the kernel's scripts/extract-vmlinux does). If that fails, qemu boots the bzImage.
off=$(grep -abo $'\xfd7zXZ\x00' "$vmlinuz" | head -1 | cut -d: -f1 || true)
if [ -n "$off" ] && tail -c +"$((off + 1))" "$vmlinuz" | xz -dc --single-stream 2>/dev/null > "$work/kernel" \
  ; [ -s "$work/kernel" ] && [ "$(head -c 4 "$work/kernel" | od -An -c | tr -d ' ')" = '177ELF' ]; then
  log "uncompressed vmlinux at offset $off"
else
  log "no xz stream found: booting the bzImage"
  cp "$vmlinuz" "$work/kernel"
fi
rm -rf "$root/boot"/*

log "ext4 image"
mke2fs -q -t ext4 -L accel-guest -d "$root" -E root_owner=0:0 "$work/disk.img" 3G
rm -rf "$root"
mkdir -p "$out"
mv "$work/disk.img" "$work/kernel" "$work/initrd.img" "$out/"
log "done: $out"
echo "$out" >&3
