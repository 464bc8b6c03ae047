#!/usr/bin/env bash
# Prints the target triple of the binaries the packages ship; build-packages.sh, install.sh and
# benches/bench.sh build for it:
#   triple=$(bash packaging/target.sh)
#   RUSTFLAGS="$(bash packaging/rustflags.sh "$triple")" cargo build --release --target "$triple"
#
# musl (x86_64-unknown-linux-musl on an x86_64 host) when Rust's std for it is installed, or
# when `rustup target add` can install it (it needs the network once; set ACCEL_NO_RUSTUP=1 to
# never try). Otherwise the host's glibc triple, still static (packaging/rustflags.sh).
# Why musl: a static glibc program asks the CPU for its cache sizes at every start (CPUID
# over and over, each one a VM exit in a virtual machine) and reads /proc/self/exe; musl does
# neither. On the benchmark VM that was ~0.1 ms of every container start
# (benches/BENCHMARKS.md). ACCEL_TARGET=<triple> overrides the choice.
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
