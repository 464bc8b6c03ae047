# accel-container-runtime .rpm %preun ($1: 0 erase, 1 upgrade): on erase only, take the
# runtime out of the engines' configuration and drop our hook link.
if [ "$1" = 0 ]; then
    . /usr/share/accel-container-runtime/engines.sh
    accel_unconfigure_engines /usr/bin
    accel_unlink_hook /usr/bin
    systemctl --no-reload disable accel-ctk-dev-char-symlinks.service >/dev/null 2>&1 || true
fi
exit 0
