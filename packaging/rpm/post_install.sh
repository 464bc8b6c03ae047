# accel-container-runtime .rpm %post ($1: 1 install, 2 upgrade): register the runtime with
# the engines on this node (idempotent) and give docker's --gpus its hook name when free.
. /usr/share/accel-container-runtime/engines.sh
accel_link_hook /usr/bin
accel_configure_engines /usr/bin
# /dev/char links for the accelerator nodes present now, and at every boot (the unit says
# why). --no-reload: a daemon-reload is what takes devices from containers whose nodes had
# no link when they started; the unit is read at the next boot or reload anyway.
/usr/bin/accel-ctk system create-dev-char-symlinks >/dev/null 2>&1 || true
if [ -d /run/systemd/system ]; then
    systemctl --no-reload enable accel-ctk-dev-char-symlinks.service >/dev/null 2>&1 || true
fi
exit 0
