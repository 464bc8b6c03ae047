#!/usr/bin/env bash
# Whole-process benchmark of accel-container-runtime: what the shim adds on top of the
# low-level runtime, measured in ONE hyperfine run so every ratio comes from the same
# conditions. Needs root (mknod of the simulated GPUs), gcc, python3, hyperfine, cargo.
#
#   bash benches/bench.sh                  # default: 1200 runs per command in 12 rounds
#   RUNS=300 ROUNDS=3 bash benches/bench.sh
#   BASELINE_REV=720a9c4 bash benches/bench.sh       # another commit as the baseline
#   BASELINE=/path/to/older/accel-container-runtime bash benches/bench.sh   # a binary instead
#   BASELINE_REV=none bash benches/bench.sh          # this build alone
#   NVIDIA_RUNTIME=/path/to/nvidia-container-runtime bash benches/bench.sh   # and NVIDIA's, CDI mode
#
# Every run measures this build against the previous release in the same run, so that a
# regression shows the day it lands: BASELINE_REV (default: the last release, below) is
# built from its commit (`git archive` into $OUT/baseline/<commit>, with its own target
# dir, kept between runs) exactly as this build is, and measured beside it. Raise the
# default when a release is cut.
#
# What ships is what is measured: the build the packages ship (packaging/target.sh: `cargo
# build --release --target <triple>` with its one flag, static glibc), installed on the disk
# and read back from it as after a boot (every binary compared is treated alike), with the
# shipped config.toml and every profile file the packages install in profiles-dir,
# bundles on a tmpfs as engines keep them.
# What is compared, every command given the argv `state ctr` / `create --bundle B ctr`:
#   noop               a static C program that exits 0: the "low-level runtime" here
#   exec-only C        static C wrapper that only execv's its argument (the floor for C)
#   exec-only Rust     `rustc -O` wrapper that only exec's its argument (the floor for Rust)
#   shim state         pass-through: config's low-level-runtime read, then exec
#   shim create, none  create, config.json without any device variable (never rewritten)
#   shim create, all   NVIDIA_VISIBLE_DEVICES=all on a simulated 8-GPU driver root with
#                      capability libraries; config.json restored before every run
#                      (hyperfine --prepare), so each run does the full edit + atomic rewrite
#   shim create, 2 GPUs NVIDIA_VISIBLE_DEVICES=0,1 on the same root: a pod's usual ask of an
#                      8-GPU node, restored before every run as the 8-GPU rewrite is
#   shim create, again the same bundle already edited: discovery and planning run, nothing
#                      is added, config.json is not rewritten
#   ... bundle on disk the rewrite with the bundle on the disk instead of tmpfs (fsync cost)
# The baseline (BASELINE_REV's build, or BASELINE) gets the same lines, same run; the summary
# ends with each command's cost over the no-op against the baseline's, as a difference and
# a ratio.
# NVIDIA_RUNTIME (a built nvidia-container-runtime; nothing of NVIDIA's is fetched or built
# here) adds NVIDIA's runtime to the same rounds, set up as an operator sets up CDI mode: its
# config.toml (NVIDIA_CTK_CONFIG_FILE_PATH) with mode = "cdi", the no-op as its only runtime,
# its spec dir holding the CDI spec `accel-ctk cdi generate` writes for the simulated root, so
# both runtimes inject the same GPUs; the guard (issues 33, 42) is NVIDIA's cost over the
# no-op at least 3 times this build's, for the create of 2 GPUs and of all 8. Its lines,
# beside this build's:
#   nvidia state, create, no variable, create 2 GPUs (rewrite), create all 8 GPUs (rewrite), and
#   create, 8 GPUs by CDI name (rewrite): NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,...,7, which
#                      this build also gets (its cdi-spec-dirs point at the same spec dir)
# NVIDIA's runtime always rewrites config.json, so each of its lines restores it first.
# Peak RSS comes from wait4(2) (ru_maxrss: the larger of the shim and the no-op it execs).
# Instruction counts (valgrind's callgrind, where installed; CALLGRIND=0 skips them) of each
# binary up to its exec of the low-level runtime: the one figure a loaded machine does not
# move, for telling which build does more work and where (callgrind_annotate on the files it
# leaves). valgrind 3.19 does not know openat2 (ENOSYS): under it, inroot's own walk runs
# where the kernel's would, and kernel time is never counted; the timings are the whole.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

RUNS=${RUNS:-1200}
ROUNDS=${ROUNDS:-12}
WARMUP=${WARMUP:-20}
OUT=${OUT:-$repo/target/bench}
# The last release: main at the last closing note (issue 27, stop 30).
BASELINE_REV=${BASELINE_REV-73afeb9}
CALLGRIND=${CALLGRIND:-1}

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

triple=$(bash packaging/target.sh)
rustflags=$(bash packaging/target.sh --rustflags)
echo "== building the shipped build: RUSTFLAGS='$rustflags' cargo build --release --target $triple" >&2
RUSTFLAGS="$rustflags" cargo build --release --quiet --locked --bin accel-container-runtime --target "$triple"
# Every measured binary is installed on the disk, as a package installs it, and is later
# dropped from the page cache (below).
bins=$disk/bin
mkdir -p "$bins"
install -m 0755 "$repo/target/$triple/release/accel-container-runtime" "$bins/accel-container-runtime"
shim=$bins/accel-container-runtime
baseline_label=baseline
if [ -z "${BASELINE:-}" ] && [ -n "$BASELINE_REV" ] && [ "$BASELINE_REV" != none ]; then
  rev=$(git -C "$repo" rev-parse --verify --quiet "$BASELINE_REV^{commit}") || {
    echo "benches/bench.sh: BASELINE_REV=$BASELINE_REV is not a commit of this clone (fetch it, or BASELINE_REV=none)" >&2
    exit 1
  }
  base=$OUT/baseline/$rev
  if [ ! -x "$base/accel-container-runtime" ]; then
    echo "== building the baseline, $BASELINE_REV ($rev), the same way, in $base" >&2
    rm -rf "$base/src"
    mkdir -p "$base/src"
    git -C "$repo" archive "$rev" | tar -x -C "$base/src"
    (cd "$base/src" && RUSTFLAGS="$rustflags" CARGO_TARGET_DIR="$base/target" \
      cargo build --release --quiet --locked --bin accel-container-runtime --target "$triple")
    cp "$base/target/$triple/release/accel-container-runtime" "$base/accel-container-runtime"
  fi
  BASELINE=$base/accel-container-runtime
  baseline_label="baseline $BASELINE_REV"
fi
if [ -n "${BASELINE:-}" ]; then
  install -m 0755 "$BASELINE" "$bins/baseline"
  BASELINE=$bins/baseline
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
gcc -O2 -static -o "$bins/noop" "$work/noop.c"
gcc -O2 -static -o "$bins/exec-c" "$work/exec.c"
rustc -O -o "$bins/exec-rust" "$work/exec.rs"

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
  cp "$bins/noop" "$root/usr/bin/$bin"
done

# The shipped config.toml and the profile files the packages install (Cargo.toml's assets),
# pointed at the no-op runtime, a private log and the simulated driver root.
mkdir -p "$work/profiles.d"
# Every profile file the .deb installs in profiles.d (Cargo.toml's assets), as shipped.
shipped_profiles=$(grep -o '"config/profiles/[a-z0-9-]*\.toml", "etc/accel-container-runtime/profiles.d/' Cargo.toml |
  cut -d'"' -f2 | sort -u)
[ -n "$shipped_profiles" ] || { echo "benches/bench.sh: no profile file in Cargo.toml's deb assets" >&2; exit 1; }
for p in $shipped_profiles; do cp "$p" "$work/profiles.d/"; done
sed -e "s|^low-level-runtime = .*|low-level-runtime = \"$bins/noop\"|" \
  -e "s|^log-file = .*|log-file = \"$work/shim.log\"|" \
  -e "s|^profiles-dir = .*|profiles-dir = \"$work/profiles.d\"|" \
  -e "s|^cdi-spec-dirs = .*|cdi-spec-dirs = [\"$work/cdi\"]|" config/config.toml >"$work/config.toml"
printf '\n[profiles.nvidia]\ndriver-root = "%s"\n' "$root" >>"$work/config.toml"
if ! grep -q "^profiles-dir = \"$work/profiles.d\"" "$work/config.toml" ||
  ! grep -q "^cdi-spec-dirs = \[\"$work/cdi\"\]" "$work/config.toml"; then
  echo "benches/bench.sh: the shipped config.toml changed shape" >&2; exit 1
fi
export ACCEL_CONTAINER_RUNTIME_CONFIG=$work/config.toml

# Bundles from the docker 20.10 config.json captured in the fixtures (9 KB).
python3 - "$repo/tests/fixtures/specs/docker-20.10-run.json" "$work" <<'EOF'
import json, os, sys
src, work = sys.argv[1], sys.argv[2]
spec = json.load(open(src))
env = [e for e in spec["process"]["env"] if not e.startswith("NVIDIA_")]
for name, extra in (("b-none", []), ("b-all", ["NVIDIA_VISIBLE_DEVICES=all"]), ("b-again", ["NVIDIA_VISIBLE_DEVICES=all"]),
                    ("b-two", ["NVIDIA_VISIBLE_DEVICES=0,1"])):
    os.makedirs(f"{work}/{name}")
    spec["process"]["env"] = env + extra
    with open(f"{work}/{name}/config.json", "w") as f:
        json.dump(spec, f, separators=(",", ":"))
EOF
cp "$work/b-all/config.json" "$work/b-all/config.json.orig"
cp "$work/b-two/config.json" "$work/b-two/config.json.orig"
cp -a "$work/b-all" "$disk/b-all"
cp "$work/b-none/config.json" "$work/b-none/config.json.orig"

echo "== checking that each measured command does what it says" >&2
for bin in "$shim" ${BASELINE:-}; do
  "$bin" create --bundle "$work/b-all" ctr
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
  "$bin" create --bundle "$work/b-two" ctr
  python3 - "$work/b-two/config.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
gpus = sorted(d["path"] for d in s["linux"]["devices"] if d["path"].startswith("/dev/nvidia") and d["path"][11:].isdigit())
assert gpus == ["/dev/nvidia0", "/dev/nvidia1"], gpus
print(f"   create 0,1: {len(s['linux']['devices'])} devices, {len(s['mounts'])} mounts", file=sys.stderr)
EOF
  cp "$work/b-two/config.json.orig" "$work/b-two/config.json"
  "$bin" create --bundle "$work/b-none" ctr
  cmp "$work/b-none/config.json" "$work/b-none/config.json.orig"
  "$bin" state ctr
done
"$shim" create --bundle "$work/b-again" ctr
cp "$work/b-again/config.json" "$work/b-again/config.json.edited"
"$shim" create --bundle "$work/b-again" ctr
cmp "$work/b-again/config.json" "$work/b-again/config.json.edited"
if [ -n "${BASELINE:-}" ]; then
  "$BASELINE" create --bundle "$work/b-again" ctr
  cmp -s "$work/b-again/config.json" "$work/b-again/config.json.edited" ||
    echo "   note: the baseline edits b-again otherwise than this build: its 'again' lines rewrite" >&2
  cp "$work/b-again/config.json.edited" "$work/b-again/config.json"
fi
echo "   create none: config.json unchanged; create again: unchanged; state: exit 0" >&2

nvidia=
if [ -n "${NVIDIA_RUNTIME:-}" ]; then
  [ -x "$NVIDIA_RUNTIME" ] || { echo "benches/bench.sh: NVIDIA_RUNTIME=$NVIDIA_RUNTIME is not executable" >&2; exit 1; }
  install -m 0755 "$NVIDIA_RUNTIME" "$bins/nvidia-container-runtime"
  nvidia=$bins/nvidia-container-runtime
  echo "== NVIDIA's runtime: $("$nvidia" --version 2>/dev/null | head -2 | tr '\n' ' ')" >&2
  # The spec both runtimes read: the one this project's tool writes for the simulated root,
  # with the same config, so NVIDIA's runtime injects what this build's profile injects.
  echo "== building accel-ctk the same way, for the CDI spec" >&2
  RUSTFLAGS="$rustflags" cargo build --release --quiet --locked --bin accel-ctk --target "$triple"
  mkdir -p "$work/cdi"
  "$repo/target/$triple/release/accel-ctk" cdi generate --vendor nvidia --output "$work/cdi/nvidia.com-gpu.json"
  python3 - "$work/cdi/nvidia.com-gpu.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
names = {d["name"] for d in s["devices"]}
assert s["kind"] == "nvidia.com/gpu", s["kind"]
assert {"all", *map(str, range(8))} <= names, sorted(names)
print(f"   CDI spec {s['kind']}: devices {', '.join(sorted(names))}", file=sys.stderr)
EOF
  # As an operator enables CDI mode (/etc/nvidia-container-runtime/config.toml, here through
  # the variable NVIDIA's runtime reads for that path); logging left at its default (debug
  # file /dev/null), which favours NVIDIA's runtime where this build logs to a file.
  mkdir -p "$work/nvidia-container-runtime"
  cat >"$work/nvidia-container-runtime/config.toml" <<EOF
[nvidia-container-cli]
root = "$root"

[nvidia-container-runtime]
log-level = "info"
mode = "cdi"
runtimes = ["$bins/noop"]

[nvidia-container-runtime.modes.cdi]
default-kind = "nvidia.com/gpu"
spec-dirs = ["$work/cdi"]
annotation-prefixes = ["cdi.k8s.io/"]
EOF
  export NVIDIA_CTK_CONFIG_FILE_PATH=$work/nvidia-container-runtime/config.toml
  # NVIDIA's runtime rewrites config.json on every create: its own bundles, restored per run.
  python3 - "$work" <<'EOF'
import json, os, sys
work = sys.argv[1]
spec = json.load(open(f"{work}/b-none/config.json"))
env = spec["process"]["env"]
cdi = ",".join(f"nvidia.com/gpu={i}" for i in range(8))
for name, extra in (("b-nv-none", []), ("b-nv-all", ["NVIDIA_VISIBLE_DEVICES=all"]),
                    ("b-nv-two", ["NVIDIA_VISIBLE_DEVICES=0,1"]),
                    ("b-nv-cdi", [f"NVIDIA_VISIBLE_DEVICES={cdi}"]), ("b-cdi", [f"NVIDIA_VISIBLE_DEVICES={cdi}"])):
    os.makedirs(f"{work}/{name}")
    spec["process"]["env"] = env + extra
    for f in ("config.json", "config.json.orig"):
        with open(f"{work}/{name}/{f}", "w") as out:
            json.dump(spec, out, separators=(",", ":"))
EOF
  # That each runtime execs the no-op with the engine's argv, and injects the 8 GPUs and the
  # libraries: the no-op's path briefly holds a script that records its argv.
  cp "$bins/noop" "$work/noop.real"
  printf '#!/bin/sh\necho "$*" >>%s\n' "$work/exec.log" >"$bins/noop"
  for run in "$shim b-all" "$nvidia b-nv-all" "$nvidia b-nv-cdi" "$shim b-cdi" "$shim b-two" "$nvidia b-nv-two"; do
    bin=${run% *} b=${run#* }
    : >"$work/exec.log"
    "$bin" create --bundle "$work/$b" ctr
    [ "$(cat "$work/exec.log")" = "create --bundle $work/$b ctr" ] || {
      echo "benches/bench.sh: $bin did not exec the no-op with the engine's argv: '$(cat "$work/exec.log")'" >&2
      exit 1
    }
    python3 - "$work/$b/config.json" "$bin ($b)" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
gpus = [d for d in s["linux"].get("devices", []) if d["path"].startswith("/dev/nvidia") and d["path"][11:].isdigit()]
libs = [m for m in s.get("mounts", []) if ".so." in m["destination"]]
assert len(gpus) == (2 if "two" in sys.argv[2] else 8), (sys.argv[2], gpus)
assert len(libs) >= 9, (sys.argv[2], libs)
print(f"   {sys.argv[2]}: {len(s['linux']['devices'])} devices, {len(libs)} libraries, {len(s['mounts'])} mounts, "
      f"{sum(len(v) for v in s.get('hooks', {}).values())} hooks", file=sys.stderr)
EOF
    cp "$work/$b/config.json" "$work/$b/config.json.done"
    cp "$work/$b/config.json.orig" "$work/$b/config.json"
  done
  # The ratio means something only if both do the same work: the same nodes, mounts and hooks.
  python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
def edits(b):
    s = json.load(open(f"{work}/{b}/config.json.done"))
    # NVIDIA's CDI library writes the node's uid and gid, which this build leaves to runc.
    return (sorted((d["path"], d["type"], d["major"], d["minor"]) for d in s["linux"].get("devices", [])),
            # The directory is the image's (container-library-dir = "auto") for this build's
            # variable path and the CDI spec's fixed one otherwise: the same mounts elsewhere.
            sorted((m["source"], m["type"], m["destination"].rsplit("/", 1)[1], tuple(m.get("options", [])))
                   for m in s.get("mounts", [])),
            sorted(json.dumps(h, sort_keys=True) for v in s.get("hooks", {}).values() for h in v))
for ref, others in (("b-all", ("b-nv-all", "b-nv-cdi", "b-cdi")), ("b-two", ("b-nv-two",))):
    for b in others:
        for what, mine, theirs in zip(("devices", "mounts", "hooks"), edits(ref), edits(b)):
            assert mine == theirs, (b, what, sorted(set(mine) ^ set(theirs)))
print("   the same devices, mounts and hooks as this build's creates of 2 and of all 8 GPUs", file=sys.stderr)
EOF
  : >"$work/exec.log"
  "$nvidia" state ctr
  [ "$(cat "$work/exec.log")" = "state ctr" ] || { echo "benches/bench.sh: $nvidia state did not exec the no-op" >&2; exit 1; }
  install -m 0755 "$work/noop.real" "$bins/noop"
fi

cmds=(
  noop "true" "$bins/noop state ctr"
  "exec-only C (static)" "true" "$bins/exec-c $bins/noop state ctr"
  "exec-only Rust (rustc -O)" "true" "$bins/exec-rust $bins/noop state ctr"
)
add_shim() { # label binary
  cmds+=(
    "$1 state" "true" "$2 state ctr"
    "$1 create, no variable" "true" "$2 create --bundle $work/b-none ctr"
    "$1 create, 2 GPUs (rewrite)" "cp $work/b-two/config.json.orig $work/b-two/config.json" "$2 create --bundle $work/b-two ctr"
    "$1 create, all 8 GPUs (rewrite)" "cp $work/b-all/config.json.orig $work/b-all/config.json" "$2 create --bundle $work/b-all ctr"
    "$1 create, all 8 GPUs (again, no rewrite)" "true" "$2 create --bundle $work/b-again ctr"
  )
  [ "$1" != shim ] || cmds+=(
    "$1 create, all 8 GPUs (rewrite, bundle on disk)" "cp $disk/b-all/config.json.orig $disk/b-all/config.json" "$2 create --bundle $disk/b-all ctr"
  )
}
[ -z "${BASELINE:-}" ] || add_shim "$baseline_label" "$BASELINE"
add_shim "shim" "$shim"
if [ -n "$nvidia" ]; then
  cmds+=(
    "shim create, 8 GPUs by CDI name (rewrite)" "cp $work/b-cdi/config.json.orig $work/b-cdi/config.json" "$shim create --bundle $work/b-cdi ctr"
    "nvidia state" "true" "$nvidia state ctr"
  )
  for b in "no variable:none" "2 GPUs (rewrite):two" "all 8 GPUs (rewrite):all" "8 GPUs by CDI name (rewrite):cdi"; do
    cmds+=("nvidia create, ${b%:*}" "cp $work/b-nv-${b##*:}/config.json.orig $work/b-nv-${b##*:}/config.json"
      "$nvidia create --bundle $work/b-nv-${b##*:} ctr")
  done
fi

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" >&2
echo "== kernel $(uname -r); bundles on $(stat -f -c %T "$work"), disk bundle on $(stat -f -c %T "$disk")" >&2
# Each binary as a node runs it after a boot: read from the disk into the page cache by
# readahead. How a file came into the page cache changes what exec costs (the same binary
# just written by cp runs faster than when read back from the disk: BENCHMARKS.md, fifth
# pass), so every binary is put in the same state: synced, then dropped from the cache.
sync
python3 - "$bins"/* <<'EOF'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
EOF
echo "== binaries on $(stat -f -c %T "$bins"), dropped from the page cache before the first round" >&2
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
  printf '%-58s %6s KiB\n' "$label" "$("$work/rss" "$@")"
}
{
  echo "Peak RSS (ru_maxrss of the process, over the shim and the no-op it execs):"
  rss "noop" true "$bins/noop" state ctr
  rss "exec-only Rust" true "$bins/exec-rust" "$bins/noop" state ctr
  for label in shim ${BASELINE:+"$baseline_label"}; do
    bin=$shim; [ "$label" = shim ] || bin=$BASELINE
    rss "$label state" true "$bin" state ctr
    rss "$label create, no variable" true "$bin" create --bundle "$work/b-none" ctr
    rss "$label create, all 8 GPUs (rewrite)" "cp $work/b-all/config.json.orig $work/b-all/config.json" \
      "$bin" create --bundle "$work/b-all" ctr
  done
  if [ -n "$nvidia" ]; then
    rss "nvidia state" true "$nvidia" state ctr
    rss "nvidia create, no variable" "cp $work/b-nv-none/config.json.orig $work/b-nv-none/config.json" \
      "$nvidia" create --bundle "$work/b-nv-none" ctr
    rss "nvidia create, all 8 GPUs (rewrite)" "cp $work/b-nv-all/config.json.orig $work/b-nv-all/config.json" \
      "$nvidia" create --bundle "$work/b-nv-all" ctr
  fi
} >"$OUT/rss.txt"

# Instructions of each binary up to its exec of the low-level runtime (see the header).
: >"$OUT/instructions.txt"
if [ "$CALLGRIND" != 0 ] && command -v valgrind >/dev/null; then
  rm -rf "$OUT/callgrind"
  mkdir -p "$OUT/callgrind"
  ir() { # label command...
    local label=$1 file
    shift
    file=$OUT/callgrind/$(printf '%s' "$label" | tr -c 'A-Za-z0-9' '-')
    valgrind --tool=callgrind --dump-before=execve --callgrind-out-file="$file" "$@" 2>/dev/null
    printf '%-58s %10s\n' "$label" "$(sed -n 's/^summary: //p' "$file".1)"
  }
  {
    echo "Instructions up to the exec of the low-level runtime (callgrind; files in $OUT/callgrind):"
    for label in ${BASELINE:+"$baseline_label"} shim; do
      bin=$shim; [ "$label" = shim ] || bin=$BASELINE
      ir "$label state" "$bin" state ctr
      ir "$label create, no variable" "$bin" create --bundle "$work/b-none" ctr
      cp "$work/b-two/config.json.orig" "$work/b-two/config.json"
      ir "$label create, 2 GPUs (rewrite)" "$bin" create --bundle "$work/b-two" ctr
      cp "$work/b-all/config.json.orig" "$work/b-all/config.json"
      ir "$label create, all 8 GPUs (rewrite)" "$bin" create --bundle "$work/b-all" ctr
      ir "$label create, all 8 GPUs (again, no rewrite)" "$bin" create --bundle "$work/b-again" ctr
    done
  } >"$OUT/instructions.txt"
  cmp "$work/b-again/config.json" "$work/b-again/config.json.edited"
fi

python3 - "$OUT/commands.txt" "$baseline_label" "$OUT"/hyperfine-*.json >"$OUT/summary.txt" <<'EOF'
import json, statistics, sys
# In the order the commands are listed (each round ran them in a random order).
times = {name: [] for name in open(sys.argv[1]).read().splitlines()}
baseline = sys.argv[2]
for path in sys.argv[3:]:
    for r in json.load(open(path))["results"]:
        times[r["command"]].extend(r["times"])
med = {name: statistics.median(t) for name, t in times.items()}
ms = lambda s: s * 1000
noop = med["noop"]
floor_rs = med["exec-only Rust (rustc -O)"]
floor_c = med["exec-only C (static)"]
n = min(len(t) for t in times.values())
print(f"medians over {n} runs per command")
print(f"{'command':58} {'median':>9} {'added vs noop':>14} {'vs C floor':>11}")
for name, m in med.items():
    print(f"{name:58} {ms(m):7.3f}ms {ms(m - noop):+12.3f}ms {ms(m - floor_c):+9.3f}ms")
# This build against the baseline, command by command, from the same run: what each adds
# over the no-op, the difference, and this build's cost as a fraction of the baseline's.
pairs = [(s, baseline + s[len("shim"):]) for s in med if s.startswith("shim ")]
pairs = [(s, b) for s, b in pairs if b in med]
if pairs:
    print()
    print(f"this build against {baseline}, over the no-op (same run):")
    print(f"{'command':42} {'shim':>10} {'baseline':>10} {'difference':>11} {'ratio':>6}")
    for s, b in pairs:
        a, c = med[s] - noop, med[b] - noop
        print(f"{s[len('shim '):]:42} {ms(a):+8.3f}ms {ms(c):+8.3f}ms {ms(a - c):+9.3f}ms {a / c:6.2f}")
# NVIDIA's runtime against this build (and the baseline, where it has the line): the guard
# (issue 33) is NVIDIA's cost over the no-op at least 3 times this build's, for 8 GPUs.
pairs = [(s, "nvidia" + s[len("shim"):]) for s in med if s.startswith("shim ")]
pairs = [(s, v) for s, v in pairs if v in med]
if pairs:
    print()
    print("NVIDIA's nvidia-container-runtime (CDI mode) against this build, over the no-op (same run):")
    print(f"{'command':42} {'shim':>10} {'nvidia':>10} {'nvidia/shim':>11} {'nvidia/baseline':>15}")
    for s, v in pairs:
        a, n = med[s] - noop, med[v] - noop
        b = baseline + s[len("shim"):]
        vs_base = f"{n / (med[b] - noop):15.2f}" if b in med else f"{'-':>15}"
        print(f"{s[len('shim '):]:42} {ms(a):+8.3f}ms {ms(n):+8.3f}ms {n / a:11.2f} {vs_base}")
    for guard in ("create, 2 GPUs (rewrite)", "create, all 8 GPUs (rewrite)"):
        if f"shim {guard}" in med and f"nvidia {guard}" in med:
            r = (med[f"nvidia {guard}"] - noop) / (med[f"shim {guard}"] - noop)
            print(f"guard (NVIDIA's {guard[len('create, '):]} at least 3x this build's, over the no-op): "
                  f"{r:.2f}x, {'holds' if r >= 3 else 'DOES NOT HOLD'}")
EOF
cat "$OUT/summary.txt" "$OUT/rss.txt" "$OUT/instructions.txt"
echo "(hyperfine output per round: $OUT/hyperfine-N.txt, $OUT/hyperfine-N.json)" >&2
