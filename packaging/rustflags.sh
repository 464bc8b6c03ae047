#!/usr/bin/env bash
# Prints the RUSTFLAGS of the binaries the packages ship for a target triple (the host's when
# none is given; packaging/target.sh chooses it); build-packages.sh, install.sh and
# benches/bench.sh all build with them:
#   RUSTFLAGS="$(bash packaging/rustflags.sh "$triple")" cargo build --release --target "$triple"
#
# - Static (+crt-static): no dynamic loader on every container start, 0.3-0.5 ms per call on
#   the benchmark machine (benches/BENCHMARKS.md). The shim makes no NSS lookups, so glibc's
#   static-linking caveats do not apply.
# - Not position-independent (relocation-model=static): a static-pie binary relocates ~2,600
#   pointers at every start, each a write that dirties a page.
# - The functions a `create`, a `state` and a create without a request run, laid out together
#   (packaging/symbol-order.txt, written by `ORDER_OUT=... benches/bench.sh`): they are spread
#   over 1.7 MB of code otherwise, and every 64 KB window touched is a page fault and its
#   teardown at the exec of runc. Worth ~0.1 ms of a create on the benchmark VM. Only when the
#   linker takes the option (LLD: rustc's default for x86_64-unknown-linux-gnu since 1.90; for
#   musl, the rust-lld that rustup ships, through its gcc-ld wrapper): checked by linking an
#   empty program. Names that no longer exist (another rustc, changed code) are skipped: the
#   file only orders, it never changes what is linked.
set -euo pipefail
case "${1:-}" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "rustflags.sh: unknown option '$1' (it takes a target triple; --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "rustflags.sh: one target triple only (--help)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
host=$(rustc -vV | sed -n 's/^host: //p')
target=${1:-$host}
flags="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static"
order="$here/symbol-order.txt"
# (RUSTFLAGS is split at spaces: a checkout whose path has one builds without the layout.)
if [ -s "$order" ] && [ -z "${ACCEL_NO_SYMBOL_ORDER:-}" ] && [ "$order" = "${order// /}" ]; then
    ordering="-C link-arg=-Wl,--symbol-ordering-file=$order -C link-arg=-Wl,--no-warn-symbol-ordering"
    gcc_ld="$(rustc --print sysroot)/lib/rustlib/$host/bin/gcc-ld"
    case "$target" in
    *-musl) [ ! -x "$gcc_ld/ld.lld" ] || ordering="-C link-arg=-fuse-ld=lld -C link-arg=-B$gcc_ld $ordering" ;;
    esac
    probe=$(mktemp -d)
    # shellcheck disable=SC2086 # the flags are separate words
    if echo 'fn main() {}' | rustc --target "$target" $flags $ordering -o "$probe/probe" - 2>/dev/null; then
        flags="$flags $ordering"
    fi
    rm -rf "$probe"
fi
echo "$flags" | sed 's/^ *//'
