#!/bin/sh
# Install accel-container-runtime from a source checkout and register it with the container
# engines on this node; `--uninstall` reverses it. Idempotent: run it again after a `git pull`.
#
#   packaging/install.sh [--prefix /usr] [--destdir DIR] [--no-build --bin-dir DIR]
#                        [--engines "docker containerd crio" | --engines none]
#                        [--set-as-default] [--uninstall]
#
# What it does:
#   - builds both binaries (static, as the packages ship them) unless --no-build; --bin-dir
#     names where built binaries are (default: cargo's target/<triple>/release, the triple
#     packaging/target.sh prints: static glibc);
#   - installs accel-container-runtime and accel-ctk to PREFIX/bin (default /usr/bin);
#   - installs config/config.toml as /etc/accel-container-runtime/config.toml, and the
#     profiles that are not compiled in (all of config/profiles/ but nvidia and enflame) into
#     /etc/accel-container-runtime/profiles.d/; a file the operator changed is never
#     overwritten (the shipped one is put beside it as <name>.new);
#   - creates the directory of the configured log-file;
#   - links PREFIX/bin/nvidia-container-runtime-hook -> accel-container-runtime when no
#     binary of that name exists (docker's `--gpus` needs the name; NVIDIA's is never replaced);
#   - runs `accel-ctk runtime configure` for each engine found (dockerd, containerd, crio on
#     PATH; or --engines), which backs up and edits /etc/docker/daemon.json,
#     /etc/containerd/config.toml, /etc/crio/crio.conf.d/99-accel.conf. Engines are not
#     restarted: accel-ctk prints the command.
# --destdir DIR puts every file under DIR (engine configuration files included) while the
# paths written into them stay the final ones: for staging and for tests.
# --uninstall takes the runtime out of the engines, removes the binaries and the hook link
# this script made, and the configuration files the operator did not change.
set -eu

here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/.." && pwd)"

prefix=/usr
destdir=
build=1
bin_dir=
uninstall=0
configure_flags=

usage() {
    sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="$2"; shift 2 ;;
        --prefix=*) prefix="${1#*=}"; shift ;;
        --destdir) destdir="$2"; shift 2 ;;
        --destdir=*) destdir="${1#*=}"; shift ;;
        --no-build) build=0; shift ;;
        --bin-dir) bin_dir="$2"; shift 2 ;;
        --bin-dir=*) bin_dir="${1#*=}"; shift ;;
        --engines) ACCEL_ENGINES="$2"; export ACCEL_ENGINES; shift 2 ;;
        --engines=*) ACCEL_ENGINES="${1#*=}"; export ACCEL_ENGINES; shift ;;
        --set-as-default) configure_flags=--set-as-default; shift ;;
        --uninstall) uninstall=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    esac
done

case "$prefix" in
    /*) ;;
    *) echo "install.sh: --prefix must be absolute, not '$prefix'" >&2; exit 2 ;;
esac
if [ -n "$destdir" ]; then
    mkdir -p "$destdir"
    destdir="$(cd "$destdir" && pwd)"
fi
ACCEL_ROOT="$destdir"
export ACCEL_ROOT
# shellcheck source=packaging/scripts/engines.sh
. "$here/scripts/engines.sh"

bin="$prefix/bin"
etc="$destdir/etc/accel-container-runtime"
builtin_profiles="nvidia enflame"

say() { echo "install.sh: $*" >&2; }

# install_config SRC DEST: a new or unchanged file is (re)installed; one the operator
# changed stays, and the shipped version goes beside it as DEST.new.
install_config() {
    if [ ! -e "$2" ]; then
        install -D -m 0644 "$1" "$2"
        say "installed $2"
    elif cmp -s "$1" "$2"; then
        rm -f "$2.new"
    else
        install -m 0644 "$1" "$2.new"
        say "kept $2 (changed here); the shipped version is $2.new"
    fi
}

# remove_config SRC DEST: removes DEST only if it is still the shipped file.
remove_config() {
    rm -f "$2.new"
    if [ -e "$2" ]; then
        if cmp -s "$1" "$2"; then
            rm -f "$2"
        else
            say "kept $2 (changed here)"
        fi
    fi
}

non_builtin_profiles() {
    for p in "$src"/config/profiles/*.toml; do
        name="$(basename "$p" .toml)"
        case " $builtin_profiles " in
            *" $name "*) ;;
            *) echo "$p" ;;
        esac
    done
}

if [ "$uninstall" = 1 ]; then
    if [ -x "$destdir$bin/accel-ctk" ]; then
        accel_unconfigure_engines "$bin"
    else
        say "no $destdir$bin/accel-ctk: engine configurations left as they are"
    fi
    accel_unlink_hook "$bin"
    rm -f "$destdir$bin/accel-container-runtime" "$destdir$bin/accel-ctk"
    remove_config "$src/config/config.toml" "$etc/config.toml"
    remove_config "$src/packaging/logrotate/accel-container-runtime" "$destdir/etc/logrotate.d/accel-container-runtime"
    for p in $(non_builtin_profiles); do
        remove_config "$p" "$etc/profiles.d/$(basename "$p")"
    done
    rmdir "$etc/profiles.d" "$etc" 2>/dev/null || true
    say "uninstalled from $destdir$bin"
    exit 0
fi

if [ "$build" = 1 ]; then
    command -v cargo >/dev/null 2>&1 || {
        echo "install.sh: cargo not found: install Rust (https://rustup.rs) or pass --no-build --bin-dir" >&2
        exit 1
    }
    # The packages' build (build-packages.sh, packaging/target.sh): cargo build for the
    # shipped target with its one flag (glibc, static).
    triple="$(bash "$src/packaging/target.sh")"
    rustflags="$(bash "$src/packaging/target.sh" --rustflags)"
    # accel-ctk with kubelet's protocols (feature `plugin`, for `accel-ctk pods`), as the
    # packages build it; the runtime without.
    (cd "$src" && RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --bin accel-container-runtime)
    (cd "$src" && RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --features plugin --bin accel-ctk)
    : "${bin_dir:=${CARGO_TARGET_DIR:-$src/target}/$triple/release}"
fi
: "${bin_dir:=$src/target/release}"
for b in accel-container-runtime accel-ctk; do
    [ -x "$bin_dir/$b" ] || {
        echo "install.sh: $bin_dir/$b: not found (build first, or give --bin-dir)" >&2
        exit 1
    }
done

install -d -m 0755 "$destdir$bin"
for b in accel-container-runtime accel-ctk; do
    # install(1) unlinks the old file first: a runtime being exec'd right now is unharmed.
    install -m 0755 "$bin_dir/$b" "$destdir$bin/$b"
done
say "installed accel-container-runtime and accel-ctk in $destdir$bin"

install_config "$src/config/config.toml" "$etc/config.toml"
install_config "$src/packaging/logrotate/accel-container-runtime" "$destdir/etc/logrotate.d/accel-container-runtime"
install -d -m 0755 "$etc/profiles.d"
for p in $(non_builtin_profiles); do
    install_config "$p" "$etc/profiles.d/$(basename "$p")"
done

log_file="$(sed -n 's/^log-file *= *"\(.*\)".*/\1/p' "$etc/config.toml" | tail -n 1)"
install -d -m 0755 "$destdir$(dirname "${log_file:-/var/log/accel-container-runtime.log}")"

accel_link_hook "$bin"
# shellcheck disable=SC2086 # empty or one flag
accel_configure_engines "$bin" $configure_flags
say "done"
