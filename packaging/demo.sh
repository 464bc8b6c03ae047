#!/usr/bin/env bash
# Starts a real container through accel-container-runtime and real runc, and shows from inside
# it what the shim gave. Without an accelerator on this machine, the devices are simulated: a
# driver root in a temp dir with char nodes of NVIDIA's real major (195), NVIDIA's procfs
# `information` files for 2 GPUs and 4 Enflame GCU nodes, and small shared libraries compiled
# here. With a real NVIDIA driver loaded, the real one is used.
#
#   sudo bash packaging/demo.sh            # installs runc, busybox-static, gcc when missing
#   sudo bash packaging/demo.sh --help     # this text
#
# On a cold machine the release build takes several minutes and prints cargo's progress; the
# README says how long each step took here.
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "demo.sh: unknown argument '$1' (it takes none; --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (runc needs it)" >&2; exit 1; }
need=()
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v python3 >/dev/null || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  # Waits for another apt (unattended-upgrades) instead of failing on its lock.
  . packaging/scripts/apt.sh
  accel_apt_get update -q && accel_apt_get install -y -q "${need[@]}"
fi
command -v cargo >/dev/null || { echo "demo.sh: cargo not found; install Rust >= 1.88 (rustup)" >&2; exit 1; }
# cargo's own progress, not -q: a cold release build is minutes of work.
cargo build --release
shim=$PWD/target/release/accel-container-runtime

work=$(mktemp -d /tmp/accel-demo.XXXXXX)
cleanup() { runc --root "$work/state" delete -f accel-demo >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

if [ -d /proc/driver/nvidia/gpus ] && ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  echo "== real NVIDIA driver found: using it"
  driver_root=/
  [ -d /usr/local/nvidia/lib64 ] && echo "   (driver libraries under /usr/local/nvidia, GKE layout)"
  vendor_env=NVIDIA_VISIBLE_DEVICES=all
else
  echo "== no accelerator here: simulating 2 NVIDIA GPUs and 4 Enflame GCUs under $work/root"
  r=$work/root
  driver_root=$r
  # The simulated nodes' /dev/char links stay in the scratch dir, out of the host's /dev.
  host_dev_dir=$work/dev
  mkdir -p "$r/dev" "$r/etc" "$r/usr/bin" "$r/usr/lib/x86_64-linux-gnu" "$r/sys/module/enflame" "$r/proc/driver/nvidia/gpus"
  i=0
  for gpu in "0000:3b:00.0 3 GPU-8f6b1c2e-0d7a-4f52-9c1e-3b0000000003" "0000:af:00.0 1 GPU-1d2e3f40-5a6b-4c7d-8e9f-af0000000001"; do
    set -- $gpu
    mkdir -p "$r/proc/driver/nvidia/gpus/$1"
    printf 'Model: \t\t Simulated GPU\nIRQ:   \t\t 0\nGPU UUID: \t\t %s\nBus Type: \t\t PCIe\nBus Location: \t\t %s\nDevice Minor: \t\t %s\n' "$3" "$1" "$2" \
      > "$r/proc/driver/nvidia/gpus/$1/information"
    mknod -m 666 "$r/dev/nvidia$2" c 195 "$2"
  done
  echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  (simulated)" > "$r/proc/driver/nvidia/version"
  mknod -m 666 "$r/dev/nvidiactl" c 195 255
  # Enflame's major is dynamic; take one no driver on this host registered.
  emaj=$(awk 'BEGIN{for(m=240;m<=254;m++)free[m]=1} /^Block/{exit} $1~/^[0-9]+$/{delete free[$1]} END{for(m=240;m<=254;m++) if(m in free){print m; exit}}' /proc/devices)
  for n in 0 1 2 3; do mknod -m 666 "$r/dev/gcu$n" c "$emaj" "$n"; done
  mknod -m 666 "$r/dev/gcuctl" c "$emaj" 255
  echo "1.2.3.4" > "$r/sys/module/enflame/version"
  echo 'int demo_marker(void) { return 42; }' > "$work/lib.c"
  for lib in libcuda.so.1:libcuda.so.550.54.14 libnvidia-ml.so.1:libnvidia-ml.so.550.54.14 libefml.so.1:libefml.so.1.2.3; do
    so=${lib%%:*} file=${lib##*:}
    gcc -shared -fPIC -Wl,-soname,"$so" -o "$r/usr/lib/x86_64-linux-gnu/$file" "$work/lib.c"
    [ "$so" = "$file" ] || ln -s "$file" "$r/usr/lib/x86_64-linux-gnu/$so"
  done
  echo /usr/lib/x86_64-linux-gnu > "$r/etc/ld.so.conf"
  ldconfig -r "$r"
  printf '#!/bin/sh\necho "nvidia-smi (simulated): 2 GPUs"\n' > "$r/usr/bin/nvidia-smi"
  printf '#!/bin/sh\necho "efsmi (simulated): 4 GCUs"\n' > "$r/usr/bin/efsmi"
  chmod 755 "$r/usr/bin/nvidia-smi" "$r/usr/bin/efsmi"
  vendor_env=NVIDIA_VISIBLE_DEVICES=1
fi

# Built outside the here-document: bash drops the quotes of a `${var:+"word"}` inside one.
host_dev_line=
[ -z "${host_dev_dir:-}" ] || host_dev_line="host-dev-dir = \"$host_dev_dir\""
cat > "$work/config.toml" <<TOML
low-level-runtime = "runc"
log-file = "$work/shim.log"
$host_dev_line
[profiles.nvidia]
driver-root = "$driver_root"
[profiles.enflame]
driver-root = "$driver_root"
TOML

b=$work/bundle
mkdir -p "$b/rootfs/bin"
cp /bin/busybox "$b/rootfs/bin/busybox"
for a in sh ls cat echo; do ln -s busybox "$b/rootfs/bin/$a"; done
(cd "$b" && runc spec)
python3 - "$b/config.json" "$vendor_env" <<'PY'
import json, sys
path, env = sys.argv[1], sys.argv[2]
c = json.load(open(path))
c["process"]["terminal"] = False
c["process"]["env"] += [env, "ENFLAME_VISIBLE_DEVICES=1,3"]
c["process"]["args"] = ["sh", "-c", "echo devices:; ls /dev; echo libraries:; ls /usr/lib64 /usr/lib/x86_64-linux-gnu 2>/dev/null; nvidia-smi; efsmi; echo 'open /dev/nvidia1 (allowed by the cgroup; a simulated node has no driver, so ENXIO):'; cat /dev/nvidia1 2>&1 | head -1"]
json.dump(c, open(path, "w"), indent="\t")
PY

echo "== docker/containerd would call: accel-container-runtime run --bundle $b accel-demo"
echo "   with $vendor_env ENFLAME_VISIBLE_DEVICES=1,3 in the container's environment"
echo "== inside the container:"
ACCEL_CONTAINER_RUNTIME_CONFIG=$work/config.toml "$shim" --root "$work/state" run --bundle "$b" accel-demo
echo "== shim log:"
cat "$work/shim.log"
