#!/usr/bin/env bash
# Whole-process benchmark of accel-container-runtime: what the shim adds on top of the
# low-level runtime, measured in ONE hyperfine run so every ratio comes from the same
# conditions. Needs root (mknod of the simulated GPUs), gcc, python3, hyperfine, cargo.
#
#   bash benches/bench.sh                  # default: 1200 runs per command in 12 rounds
#   RUNS=300 ROUNDS=1 BENCH_STATIC=0 bash benches/bench.sh
#   BASELINE=/path/to/older/accel-container-runtime bash benches/bench.sh   # before/after
#
# What is compared, every command given the argv `state ctr` / `create --bundle B ctr`:
#   noop               a static C program that exits 0: the "low-level runtime" here
#   exec-only C        static C wrapper that only execv's its argument (the floor for C)
#   exec-only Rust     `rustc -O` wrapper that only exec's its argument (the floor for Rust)
#   shim state         pass-through: config's low-level-runtime read, then exec
#   shim create, none  create, config.json without any device variable (never rewritten)
#   shim create, all   NVIDIA_VISIBLE_DEVICES=all on a simulated 8-GPU driver root with
#                      capability libraries; config.json restored before every run
#                      (hyperfine --prepare), so each run does the full edit + atomic rewrite
#   shim create, again the same bundle already edited: discovery and planning run, nothing
#                      is added, config.json is not rewritten
#   ... bundle on disk the rewrite with the bundle on the disk instead of tmpfs (fsync cost)
# each shim line twice when BENCH_STATIC=1 (default): the release build as cargo makes it
# (dynamically linked) and the one the packages ship (packaging/target.sh: musl where Rust has
# it; packaging/rustflags.sh: static, not PIE, hot functions laid out together).
#
# ORDER_OUT=packaging/symbol-order.txt bash benches/bench.sh writes that layout instead of
# measuring: the functions a create of 8 GPUs, a create without a request and a `state` run
# (callgrind, on the shipped static build), first-run order. Rerun it
# when the create path changes much, or after a rustc upgrade (symbol names change).
# Peak RSS comes from wait4(2) (ru_maxrss: the larger of the shim and the no-op it execs).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

RUNS=${RUNS:-1200}
ROUNDS=${ROUNDS:-12}
WARMUP=${WARMUP:-20}
BENCH_STATIC=${BENCH_STATIC:-1}
OUT=${OUT:-$repo/target/bench}

if [ "$(id -u)" != 0 ]; then
  echo "benches/bench.sh: must run as root (mknod of the simulated GPU nodes)" >&2
  exit 1
fi
for tool in hyperfine gcc python3 cargo rustc ldconfig readelf; do
  command -v "$tool" >/dev/null || { echo "benches/bench.sh: $tool not found" >&2; exit 1; }
done

mkdir -p "$OUT"
rm -f "$OUT"/hyperfine-*.json "$OUT"/hyperfine-*.txt
# Engines keep bundles on tmpfs (/run/containerd/..., /run/containers/...): so does this, on
# its own tmpfs mount; one extra bundle on the disk shows what fsync costs there.
work=$(mktemp -d -p /run accel-bench.XXXXXX)
disk=$(mktemp -d -p "${BENCH_DISK_DIR:-/var/tmp}" accel-bench-disk.XXXXXX)
mount -t tmpfs -o size=256m,mode=0755 accel-bench "$work"
trap 'umount "$work"; rm -rf "$work" "$disk"' EXIT

echo "== building (release)" >&2
cargo build --release --quiet --bin accel-container-runtime
shim_dyn=$repo/target/release/accel-container-runtime
shim_static=
if [ "$BENCH_STATIC" = 1 ]; then
  triple=$(bash packaging/target.sh)
  # --target keeps RUSTFLAGS off build scripts and proc macros (which cannot be static).
  flags=$(bash packaging/rustflags.sh "$triple")
  RUSTFLAGS="$flags" cargo build --release --quiet \
    --bin accel-container-runtime --target "$triple" --target-dir "$repo/target/bench-static"
  shim_static=$repo/target/bench-static/$triple/release/accel-container-runtime
  echo "== shipped build: $triple, $flags" >&2
  if readelf -d "$shim_static" | grep -q NEEDED; then
    echo "benches/bench.sh: $shim_static is not static" >&2
    exit 1
  fi
fi

cat >"$work/noop.c" <<'EOF'
int main(void) { return 0; }
EOF
cat >"$work/exec.c" <<'EOF'
#include <unistd.h>
int main(int argc, char **argv) {
  if (argc < 2) return 2;
  execv(argv[1], argv + 1);
  return 127;
}
EOF
cat >"$work/exec.rs" <<'EOF'
use std::os::unix::process::CommandExt;
fn main() {
    let mut args = std::env::args_os().skip(1);
    let prog = args.next().expect("usage: exec PROGRAM [ARG...]");
    let err = std::process::Command::new(prog).args(args).exec();
    eprintln!("exec: {err}");
    std::process::exit(127);
}
EOF
gcc -O2 -static -o "$work/noop" "$work/noop.c"
gcc -O2 -static -o "$work/exec-c" "$work/exec.c"
rustc -O -o "$work/exec-rust" "$work/exec.rs"

echo "== simulated driver root: 8 GPUs, control nodes, libraries, binaries" >&2
root=$work/driver
multiarch=$(gcc -print-multiarch)
libdir=$root/usr/lib/$multiarch
mkdir -p "$root/dev" "$root/etc" "$libdir" "$root/usr/bin" "$root/proc/driver/nvidia"
for i in $(seq 0 7); do
  bus=$(printf '0000:%02x:00.0' $((0x18 + i)))
  mkdir -p "$root/proc/driver/nvidia/gpus/$bus"
  printf 'Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t\t GPU-%08d-1111-2222-3333-444455556666\nBus Location: \t\t %s\nDevice Minor: \t\t %d\n' \
    "$i" "$bus" "$i" >"$root/proc/driver/nvidia/gpus/$bus/information"
  mknod -m 666 "$root/dev/nvidia$i" c 195 "$i"
done
mknod -m 666 "$root/dev/nvidiactl" c 195 255
mknod -m 666 "$root/dev/nvidia-uvm" c 510 0
mknod -m 666 "$root/dev/nvidia-uvm-tools" c 510 1
echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024" \
  >"$root/proc/driver/nvidia/version"
echo 'int accel_bench_symbol(void) { return 0; }' >"$work/lib.c"
# utility + compute (the default capabilities): the libraries a CUDA container gets.
for lib in libcuda:1 libcudadebugger:1 libnvidia-ml:1 libnvidia-cfg:1 libnvidia-opencl:1 \
  libnvidia-ptxjitcompiler:1 libnvidia-allocator:1 libnvidia-nvvm:4 libnvidia-gpucomp:550.54.14; do
  name=${lib%%:*} major=${lib##*:}
  gcc -shared -fPIC -Wl,-soname,"$name.so.$major" -o "$libdir/$name.so.550.54.14" "$work/lib.c"
  [ "$major" = 550.54.14 ] || ln -s "$name.so.550.54.14" "$libdir/$name.so.$major"
done
echo "/usr/lib/$multiarch" >"$root/etc/ld.so.conf"
ldconfig -r "$root"
for bin in nvidia-smi nvidia-debugdump nvidia-persistenced nvidia-cuda-mps-control nvidia-cuda-mps-server; do
  cp "$work/noop" "$root/usr/bin/$bin"
done

cat >"$work/config.toml" <<EOF
low-level-runtime = "$work/noop"
log-file = "$work/shim.log"
profiles-dir = "$work/no-profiles.d"
[profiles.nvidia]
driver-root = "$root"
EOF
export ACCEL_CONTAINER_RUNTIME_CONFIG=$work/config.toml

# Bundles from the docker 20.10 config.json captured in the fixtures (9 KB).
python3 - "$repo/tests/fixtures/specs/docker-20.10-run.json" "$work" <<'EOF'
import json, os, sys
src, work = sys.argv[1], sys.argv[2]
spec = json.load(open(src))
env = [e for e in spec["process"]["env"] if not e.startswith("NVIDIA_")]
for name, extra in (("b-none", []), ("b-all", ["NVIDIA_VISIBLE_DEVICES=all"]), ("b-again", ["NVIDIA_VISIBLE_DEVICES=all"])):
    os.makedirs(f"{work}/{name}")
    spec["process"]["env"] = env + extra
    with open(f"{work}/{name}/config.json", "w") as f:
        json.dump(spec, f, separators=(",", ":"))
EOF
cp "$work/b-all/config.json" "$work/b-all/config.json.orig"
cp -a "$work/b-all" "$disk/b-all"
cp "$work/b-none/config.json" "$work/b-none/config.json.orig"

echo "== checking that each measured command does what it says" >&2
for shim in "$shim_dyn" $shim_static; do
  "$shim" create --bundle "$work/b-all" ctr
  python3 - "$work/b-all/config.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
gpus = [d for d in s["linux"]["devices"] if d["path"].startswith("/dev/nvidia") and d["path"][11:].isdigit()]
libs = [m for m in s["mounts"] if ".so." in m["destination"]]
assert len(gpus) == 8, gpus
assert len(libs) >= 9, libs
print(f"   create all: {len(s['linux']['devices'])} devices, {len(libs)} libraries, {len(s['mounts'])} mounts", file=sys.stderr)
EOF
  cp "$work/b-all/config.json.orig" "$work/b-all/config.json"
  "$shim" create --bundle "$work/b-none" ctr
  cmp "$work/b-none/config.json" "$work/b-none/config.json.orig"
  "$shim" state ctr
done
"$shim_dyn" create --bundle "$work/b-again" ctr
cp "$work/b-again/config.json" "$work/b-again/config.json.edited"
"$shim_dyn" create --bundle "$work/b-again" ctr
cmp "$work/b-again/config.json" "$work/b-again/config.json.edited"
echo "   create none: config.json unchanged; create again: unchanged; state: exit 0" >&2

if [ -n "${ORDER_OUT:-}" ]; then
  command -v valgrind >/dev/null || { echo "benches/bench.sh: ORDER_OUT needs valgrind" >&2; exit 1; }
  cp "$work/b-all/config.json.orig" "$work/b-all/config.json"
  # The low-level runtime is missing, so each run ends where the shim would exec.
  sed 's|^low-level-runtime = .*|low-level-runtime = "/nonexistent/noop"|' "$work/config.toml" >"$work/order.toml"
  for args in "state ctr" "create --bundle $work/b-none ctr" "create --bundle $work/b-all ctr"; do
    # shellcheck disable=SC2086 # the arguments are separate words
    ACCEL_CONTAINER_RUNTIME_CONFIG=$work/order.toml valgrind --tool=callgrind --demangle=no \
      --callgrind-out-file="$work/order.%p" "$shim_static" $args >/dev/null 2>&1 || true
  done
  cat "$work"/order.* | sed -n 's/^c\{0,1\}fn=([0-9]*) //p' | grep -v '^0x' | awk '!seen[$0]++' >"$ORDER_OUT"
  echo "benches/bench.sh: $(wc -l <"$ORDER_OUT") functions written to $ORDER_OUT" >&2
  exit 0
fi

cmds=(
  noop "true" "$work/noop state ctr"
  "exec-only C (static)" "true" "$work/exec-c $work/noop state ctr"
  "exec-only Rust (rustc -O)" "true" "$work/exec-rust $work/noop state ctr"
)
add_shim() { # label binary
  cmds+=(
    "$1 state" "true" "$2 state ctr"
    "$1 create, no variable" "true" "$2 create --bundle $work/b-none ctr"
    "$1 create, all 8 GPUs (rewrite)" "cp $work/b-all/config.json.orig $work/b-all/config.json" "$2 create --bundle $work/b-all ctr"
    "$1 create, all 8 GPUs (again, no rewrite)" "true" "$2 create --bundle $work/b-again ctr"
  )
  [ "$1" != shim ] || cmds+=(
    "$1 create, all 8 GPUs (rewrite, bundle on disk)" "cp $disk/b-all/config.json.orig $disk/b-all/config.json" "$2 create --bundle $disk/b-all ctr"
  )
}
[ -z "${BASELINE:-}" ] || add_shim "baseline" "$BASELINE"
add_shim "shim" "$shim_dyn"
[ -z "$shim_static" ] || add_shim "shim static" "$shim_static"

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" >&2
echo "== kernel $(uname -r); bundles on $(stat -f -c %T "$work"), disk bundle on $(stat -f -c %T "$disk")" >&2
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# The machine may be shared and its speed drifts: in ROUNDS rounds, each running every command
# RUNS/ROUNDS times in a new random order, a slow spell hits all commands alike; medians are
# taken over the pooled runs. (In a fixed order, the commands run last in a round were
# measured up to 0.3 ms slower than the same binary run first.)
for ((i = 0; i < ${#cmds[@]}; i += 3)); do echo "${cmds[i]}"; done >"$OUT/commands.txt"
for r in $(seq 1 "$ROUNDS"); do
  args=()
  for i in $(seq 0 3 $((${#cmds[@]} - 3)) | shuf); do
    args+=(-n "${cmds[i]}" --prepare "${cmds[i + 1]}" "${cmds[i + 2]}")
  done
  hyperfine -N --warmup "$WARMUP" --runs $((RUNS / ROUNDS)) --style basic \
    --export-json "$OUT/hyperfine-$r.json" "${args[@]}" >"$OUT/hyperfine-$r.txt" 2>&1
  echo "   round $r done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# ru_maxrss survives exec, so the launcher must be tiny (a forked python would report its own
# RSS): fork, exec, wait4.
cat >"$work/rss.c" <<'EOF'
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
  struct rusage ru;
  int status;
  pid_t pid = fork();
  if (pid == 0) { execv(argv[1], argv + 1); _exit(127); }
  if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) return 1;
  printf("%ld\n", ru.ru_maxrss);
  return 0;
}
EOF
gcc -O2 -static -o "$work/rss" "$work/rss.c"
rss() { # label prepare command...
  local label=$1 prep=$2
  shift 2
  $prep
  printf '%-50s %6s KiB\n' "$label" "$("$work/rss" "$@")"
}
{
  echo "Peak RSS (ru_maxrss of the process, over the shim and the no-op it execs):"
  rss "noop" true "$work/noop" state ctr
  rss "exec-only Rust" true "$work/exec-rust" "$work/noop" state ctr
  for shim in "$shim_dyn" $shim_static; do
    label=shim; [ "$shim" = "$shim_dyn" ] || label="shim static"
    rss "$label state" true "$shim" state ctr
    rss "$label create, no variable" true "$shim" create --bundle "$work/b-none" ctr
    rss "$label create, all 8 GPUs (rewrite)" "cp $work/b-all/config.json.orig $work/b-all/config.json" \
      "$shim" create --bundle "$work/b-all" ctr
  done
} >"$OUT/rss.txt"

python3 - "$OUT/commands.txt" "$OUT"/hyperfine-*.json >"$OUT/summary.txt" <<'EOF'
import json, statistics, sys
# In the order the commands are listed (each round ran them in a random order).
times = {name: [] for name in open(sys.argv[1]).read().splitlines()}
for path in sys.argv[2:]:
    for r in json.load(open(path))["results"]:
        times[r["command"]].extend(r["times"])
med = {name: statistics.median(t) for name, t in times.items()}
ms = lambda s: s * 1000
noop = med["noop"]
floor_rs = med["exec-only Rust (rustc -O)"]
n = min(len(t) for t in times.values())
print(f"medians over {n} runs per command")
print(f"{'command':50} {'median':>9} {'added vs noop':>14} {'vs Rust floor':>14}")
for name, m in med.items():
    print(f"{name:50} {ms(m):7.3f}ms {ms(m - noop):+12.3f}ms {ms(m - floor_rs):+12.3f}ms")
EOF
cat "$OUT/summary.txt" "$OUT/rss.txt"
echo "(hyperfine output per round: $OUT/hyperfine-N.txt, $OUT/hyperfine-N.json)" >&2
