# shellcheck shell=sh
# Shared by packaging/install.sh, the .deb/.rpm maintainer scripts (installed as
# /usr/share/accel-container-runtime/engines.sh) and the container image's entrypoint: find the
# container engines on this node, register the runtime with each (`accel-ctk runtime
# configure`), take it out again, and manage docker's `nvidia-container-runtime-hook` name.
#
# POSIX sh (dpkg and rpm run maintainer scripts with /bin/sh). Every function takes the
# directory holding the installed binaries as the engines will see it, and honours:
#   ACCEL_ROOT     prefix for every file touched (install.sh --destdir, a host mount); default ""
#   ACCEL_ENGINES  engines to handle ("docker containerd crio", or "none"); default: detected
#   ACCEL_CTK      the accel-ctk to run; default: <bin dir>/accel-ctk under ACCEL_ROOT
# A failing engine is reported and skipped: a node's broken daemon.json must not fail a
# package install, and accel-ctk leaves such a file untouched.

ACCEL_RUNTIME_NAME="${ACCEL_RUNTIME_NAME:-accel}"

# The engines found on this node, one per line.
accel_engines() {
    if [ -n "${ACCEL_ENGINES:-}" ]; then
        [ "$ACCEL_ENGINES" = none ] || printf '%s\n' $ACCEL_ENGINES
        return 0
    fi
    if command -v dockerd >/dev/null 2>&1; then echo docker; fi
    if command -v containerd >/dev/null 2>&1; then echo containerd; fi
    if command -v crio >/dev/null 2>&1; then echo crio; fi
}

# The configuration file accel-ctk edits for engine $1, under ACCEL_ROOT.
accel_engine_config() {
    case "$1" in
        docker) echo "${ACCEL_ROOT:-}/etc/docker/daemon.json" ;;
        containerd) echo "${ACCEL_ROOT:-}/etc/containerd/config.toml" ;;
        crio) echo "${ACCEL_ROOT:-}/etc/crio/crio.conf.d/99-${ACCEL_RUNTIME_NAME}.conf" ;;
        *) return 1 ;;
    esac
}

# accel_configure_engines BIN_DIR [extra accel-ctk flags, e.g. --set-as-default]
accel_configure_engines() {
    _bin="$1"
    shift
    _ctk="${ACCEL_CTK:-${ACCEL_ROOT:-}$_bin/accel-ctk}"
    for _e in $(accel_engines); do
        _cfg="$(accel_engine_config "$_e")" || {
            echo "accel-container-runtime: unknown engine '$_e' (docker, containerd, crio)" >&2
            continue
        }
        # The engine's own standard path: its directory may not exist yet (crio.conf.d).
        "$_ctk" runtime configure --runtime "$_e" --config "$_cfg" --create-parents \
            --runtime-name "$ACCEL_RUNTIME_NAME" \
            --runtime-path "$_bin/accel-container-runtime" "$@" ||
            echo "accel-container-runtime: could not register with $_e ($_cfg); see above" >&2
    done
}

# accel_unconfigure_engines BIN_DIR: take the runtime out of every engine configuration that
# has it (a no-op for the others).
accel_unconfigure_engines() {
    _ctk="${ACCEL_CTK:-${ACCEL_ROOT:-}$1/accel-ctk}"
    for _e in $(accel_engines); do
        _cfg="$(accel_engine_config "$_e")" || continue
        [ -e "$_cfg" ] || continue
        "$_ctk" runtime unconfigure --runtime "$_e" --config "$_cfg" \
            --runtime-name "$ACCEL_RUNTIME_NAME" ||
            echo "accel-container-runtime: could not unregister from $_e ($_cfg); see above" >&2
    done
}

# accel_link_hook BIN_DIR: docker registers its `--gpus` driver only when a binary named
# nvidia-container-runtime-hook is on its PATH; the runtime answers to that name. Made only
# when the name is free: NVIDIA's own hook is never replaced or shadowed.
accel_link_hook() {
    _link="${ACCEL_ROOT:-}$1/nvidia-container-runtime-hook"
    if [ -e "$_link" ] || [ -L "$_link" ]; then
        return 0
    fi
    if [ -z "${ACCEL_ROOT:-}" ] && command -v nvidia-container-runtime-hook >/dev/null 2>&1; then
        return 0
    fi
    ln -s accel-container-runtime "$_link"
}

# accel_unlink_hook BIN_DIR: removes the hook name only if it is our link.
accel_unlink_hook() {
    _link="${ACCEL_ROOT:-}$1/nvidia-container-runtime-hook"
    if [ -L "$_link" ] && [ "$(readlink "$_link")" = accel-container-runtime ]; then
        rm -f "$_link"
    fi
}
