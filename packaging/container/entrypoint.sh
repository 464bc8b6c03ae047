#!/bin/sh
# Entrypoint of the installer image (packaging/build-images.sh), run by the DaemonSet's privileged
# init container on every selected node:
#   install    copy the binaries to the node (HOST_ROOT + INSTALL_DIR), add the config and the
#              file profiles where the node has none, register the runtime in the node's
#              containerd config, and restart containerd if that file changed;
#   uninstall  the reverse (unconfigure, restart if changed, remove the binaries).
# Environment (defaults in brackets):
#   HOST_ROOT [/host]  where the node's directories are mounted (hostPath volumes)
#   INSTALL_DIR [/usr/local/accel-container-runtime]  node path of the binaries
#   CONTAINERD_CONFIG [/etc/containerd/config.toml]  node path of containerd's config
#   RUNTIME_NAME [accel]  the RuntimeClass handler name
#   SET_AS_DEFAULT [false]  also make it containerd's default runtime
#   RESTART_CONTAINERD [true]  `systemctl restart containerd` on the node (needs hostPID)
#   ACCEL_IMAGE_DIR [/opt/accel-container-runtime]  the image's bin/ and etc/ (tests set it)
#   DEVICE_LISTS_FROM_PLUGIN_ONLY [true]  a config.toml written here takes device lists only
#              from the device plugin's mounts (accept-container-devices-as-mounts = true) and
#              ignores the variable of unprivileged containers (accept-envvar-unprivileged =
#              false): CUDA images set NVIDIA_VISIBLE_DEVICES=all, so a pod that asked kubelet
#              for no GPU must not get every GPU through it. An existing file is never changed.
set -eu

HOST_ROOT="${HOST_ROOT:-/host}"
INSTALL_DIR="${INSTALL_DIR:-/usr/local/accel-container-runtime}"
CONTAINERD_CONFIG="${CONTAINERD_CONFIG:-/etc/containerd/config.toml}"
RUNTIME_NAME="${RUNTIME_NAME:-accel}"
SET_AS_DEFAULT="${SET_AS_DEFAULT:-false}"
RESTART_CONTAINERD="${RESTART_CONTAINERD:-true}"

image_bin="${ACCEL_IMAGE_DIR:-/opt/accel-container-runtime}/bin"
image_etc="${ACCEL_IMAGE_DIR:-/opt/accel-container-runtime}/etc"
ctk="$image_bin/accel-ctk"
node_config="$HOST_ROOT$CONTAINERD_CONFIG"

say() { echo "accel-entrypoint: $*" >&2; }

# sha256sum, not cksum: the image's shell and tools are busybox's, which has no cksum (and a
# failed command substitution in an assignment ends the script under set -e).
checksum() { if [ -e "$1" ]; then sha256sum <"$1"; else echo none; fi; }

restart_containerd() {
    if [ "$RESTART_CONTAINERD" != true ]; then
        say "containerd config changed; restart containerd on the node to apply (systemctl restart containerd)"
        return 0
    fi
    # Running containers survive: their runc.v2 shims outlive the daemon.
    say "restarting containerd on the node"
    nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart containerd
}

install_runtime() {
    dest="$HOST_ROOT$INSTALL_DIR"
    mkdir -p "$dest"
    for b in accel-container-runtime accel-ctk; do
        # Copy then rename: a binary the node is executing right now cannot be rewritten in
        # place (ETXTBSY), but it can be replaced.
        cp "$image_bin/$b" "$dest/.$b.new"
        chmod 0755 "$dest/.$b.new"
        mv -f "$dest/.$b.new" "$dest/$b"
    done
    say "binaries in $INSTALL_DIR on the node"

    etc="$HOST_ROOT/etc/accel-container-runtime"
    mkdir -p "$etc/profiles.d"
    if [ ! -e "$etc/config.toml" ]; then
        if [ "${DEVICE_LISTS_FROM_PLUGIN_ONLY:-true}" = true ]; then
            sed -e 's/^accept-envvar-unprivileged = true$/accept-envvar-unprivileged = false/' \
                -e 's/^accept-container-devices-as-mounts = false$/accept-container-devices-as-mounts = true/' \
                "$image_etc/config.toml" > "$etc/.config.toml.new"
            grep -qx 'accept-envvar-unprivileged = false' "$etc/.config.toml.new"
            grep -qx 'accept-container-devices-as-mounts = true' "$etc/.config.toml.new"
            mv -f "$etc/.config.toml.new" "$etc/config.toml"
        else
            cp "$image_etc/config.toml" "$etc/config.toml"
        fi
    fi
    for p in "$image_etc"/profiles/*.toml; do
        case "$(basename "$p")" in
            nvidia.toml|enflame.toml) ;; # compiled in
            *) [ -e "$etc/profiles.d/$(basename "$p")" ] || cp "$p" "$etc/profiles.d/" ;;
        esac
    done

    before="$(checksum "$node_config")"
    # containerd's standard path: /etc/containerd may not exist on a node running its defaults.
    set -- runtime configure --runtime containerd --config "$node_config" --create-parents \
        --runtime-name "$RUNTIME_NAME" --runtime-path "$INSTALL_DIR/accel-container-runtime"
    if [ "$SET_AS_DEFAULT" = true ]; then
        set -- "$@" --set-as-default
    fi
    "$ctk" "$@"
    if [ "$(checksum "$node_config")" != "$before" ]; then
        restart_containerd
    fi
}

uninstall_runtime() {
    before="$(checksum "$node_config")"
    "$ctk" runtime unconfigure --runtime containerd --config "$node_config" \
        --runtime-name "$RUNTIME_NAME"
    if [ "$(checksum "$node_config")" != "$before" ]; then
        restart_containerd
    fi
    rm -f "$HOST_ROOT$INSTALL_DIR/accel-container-runtime" "$HOST_ROOT$INSTALL_DIR/accel-ctk"
    rmdir "$HOST_ROOT$INSTALL_DIR" 2>/dev/null || true
    say "removed; /etc/accel-container-runtime on the node is kept"
}

case "${1:-install}" in
    install) install_runtime ;;
    uninstall) uninstall_runtime ;;
    *) say "usage: accel-entrypoint [install|uninstall]"; exit 2 ;;
esac
