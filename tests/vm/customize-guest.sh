#!/usr/bin/env bash
# mmdebstrap customize hook for tests/vm/build-guest.sh: $1 is the guest's root directory.
# Makes the guest boot straight into one unit that mounts the 9p share `accel`, runs the
# share's guest-test.sh, stores its output and exit status in the share, and powers off.
set -euo pipefail
root=$1

echo accel-guest > "$root/etc/hostname"
printf '/dev/vda / ext4 rw,noatime 0 1\n' > "$root/etc/fstab"
# No password on the console: a person debugging a hung run can log in on the serial line.
chroot "$root" passwd -d root >/dev/null

cat > "$root/usr/local/sbin/accel-vm-run" <<'SCRIPT'
#!/bin/sh
# Runs the test the host put in the 9p share, then powers the guest off.
mkdir -p /mnt/share
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 accel /mnt/share; then
  sh /mnt/share/guest-test.sh > /mnt/share/output.log 2>&1
  echo $? > /mnt/share/exit-status
  sync
else
  echo "accel-vm-run: cannot mount the 9p share" > /dev/console
fi
systemctl --no-block poweroff
SCRIPT
chmod 755 "$root/usr/local/sbin/accel-vm-run"

cat > "$root/etc/systemd/system/accel-vm-test.service" <<'UNIT'
[Unit]
Description=accel-container-runtime guest test
After=multi-user.target
Wants=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/accel-vm-run
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=default.target
UNIT
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/accel-vm-test.service \
  "$root/etc/systemd/system/multi-user.target.wants/accel-vm-test.service"

# The test starts docker and containerd itself, after writing their configuration (systemd
# cgroup driver, the runtime under test); nothing else is needed at boot.
# Each flavour has its own set of these (sid's guest has no docker).
for unit in docker.service docker.socket containerd.service podman.socket podman-restart.service; do
  if [ -e "$root/usr/lib/systemd/system/$unit" ] || [ -e "$root/lib/systemd/system/$unit" ]; then
    chroot "$root" systemctl disable "$unit" 2>/dev/null
  fi
done
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
  fstrim.timer systemd-timesyncd.service getty@tty1.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
# Docker's overlay2 needs the overlay module; 9p for the share.
printf 'overlay\n9p\n9pnet_virtio\n' > "$root/etc/modules-load.d/accel-vm.conf"
