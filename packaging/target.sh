#!/usr/bin/env bash
# Prints the target triple of the binaries the packages ship. The shipped build is plain
#   cargo build --release --target "$(bash packaging/target.sh)"
# with no other flag; build-packages.sh, install.sh, benches/bench.sh and .ci/run all build so.
#
# x86_64-unknown-linux-musl (on an x86_64 host; aarch64 likewise) when Rust's std for it is
# installed, or when `rustup target add` can install it (it needs the network once; set
# ACCEL_NO_RUSTUP=1 to never try): Rust's musl targets link statically by default, so the
# binaries need no dynamic loader and no particular glibc on the node (what ripgrep ships).
# musl's own malloc is kept: the shim allocates little, and benches/BENCHMARKS.md has the
# run that decided it. Otherwise the host's glibc triple (a dynamically linked build, whose
# packages then depend on the host's libc). ACCEL_TARGET=<triple> overrides the choice.
set -euo pipefail
case "${1:-}" in
    "") ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "target.sh: unknown argument '$1' (it takes none; --help)" >&2; exit 2 ;;
esac
if [ -n "${ACCEL_TARGET:-}" ]; then
    echo "$ACCEL_TARGET"
    exit 0
fi
host=$(rustc -vV | sed -n 's/^host: //p')
musl=${host%-gnu}-musl
has_std() {
    compgen -G "$(rustc --print target-libdir --target "$1" 2>/dev/null)/libstd-*.rlib" >/dev/null
}
if [ "$musl" != "$host-musl" ] && ! has_std "$musl" && [ -z "${ACCEL_NO_RUSTUP:-}" ] &&
    command -v rustup >/dev/null; then
    timeout 120 rustup target add "$musl" >&2 || true
fi
if [ "$musl" != "$host-musl" ] && has_std "$musl"; then
    echo "$musl"
else
    echo "packaging/target.sh: no Rust std for $musl: building for $host (glibc, static)" >&2
    echo "$host"
fi
