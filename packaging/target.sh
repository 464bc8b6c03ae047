#!/usr/bin/env bash
# Prints how the binaries the packages ship are built. The shipped build is
#   RUSTFLAGS="$(bash packaging/target.sh --rustflags)" \
#     cargo build --release --target "$(bash packaging/target.sh)"
# with no other flag; build-packages.sh, install.sh, benches/bench.sh and .ci/run all build so.
#
# The target is the host's glibc triple (x86_64-unknown-linux-gnu, aarch64 likewise) and the
# one flag is `-C target-feature=+crt-static`: glibc linked statically, so the binaries need
# no dynamic loader and no particular glibc on the node, and the packages depend on no libc.
# Static glibc rather than musl (what ripgrep ships) because of glibc's malloc: musl's is
# slower per call and hands freed memory back to the kernel only to map it again, and a
# device create allocates a parsed config.json and the profiles (benches/BENCHMARKS.md has
# the measurements that decided it, on the same code). The flag also suits a musl
# triple (static there by default), so ACCEL_TARGET=<triple> may override the choice.
set -euo pipefail
case "${1:-}" in
    "") ;;
    --rustflags) echo "-C target-feature=+crt-static"; exit 0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "target.sh: unknown argument '$1' (--rustflags; --help)" >&2; exit 2 ;;
esac
if [ -n "${ACCEL_TARGET:-}" ]; then
    echo "$ACCEL_TARGET"
    exit 0
fi
rustc -vV | sed -n 's/^host: //p'
