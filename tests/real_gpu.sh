#!/usr/bin/env bash
# End-to-end proof of the shim on a node with a REAL NVIDIA driver (not run by CI: CI has no
# GPU). Everything runs through real runc and every assertion is made from inside a container.
#
#   ACCEL_BIN_DIR=target/release RUNC=runc BUSYBOX=/bin/busybox bash tests/real_gpu.sh
#
# Needs root, python3, gcc, ldd, a driver whose /proc/driver/nvidia/gpus is populated, and
# the driver's libraries and tools either in the ld.so.cache or under a library-search-dir of
# the built-in profile (e.g. GKE's /usr/local/nvidia/{lib64,bin}). nvcc is optional: with it a
# kernel compiled to PTX is JIT-compiled and launched in the container.
# Optional: HYPERFINE=path (adds a whole-process timing on this node, and an strace of one
# create when strace is on PATH), BASELINE=path of another accel-container-runtime build to
# time in the same run, REPORT_DIR (logs), CUDATEST, NOOP and EXEC_FLOOR (prebuilt programs
# from the sources below, for a node without gcc).
#
# What it checks (each line of the summary is PASS or FAIL; the exit status is the count of
# FAILs):
#   all       NVIDIA_VISIBLE_DEVICES=all: nvidia-smi lists every GPU, a CUDA driver-API program
#             (dlopen("libcuda.so.1") in an image whose own ld.so.cache does not know the
#             driver) allocates, writes and reads back device memory and launches a kernel
#   uuid      the first GPU by UUID: same, one GPU
#   utility   NVIDIA_DRIVER_CAPABILITIES=utility: nvidia-smi works, libcuda is absent
#   none      no variable: no /dev/nvidia*, no driver file, config.json byte-identical
#   bad       an index past the last GPU: one-line error, non-zero exit, no container,
#             config.json byte-identical
#   update    `runc update --cpuset-cpus 0` on a running GPU container: the cpuset changes and
#             CUDA still works after it (the devices are in the spec, so the device cgroup
#             that runc rebuilds keeps them)
#   cdi       `accel-ctk cdi generate`'s spec, the first GPU named by a cdi.k8s.io annotation
# With K8S_TESTS=<the real_gpu test binary> (`cargo test --features dra --test real_gpu
# --no-run`), also:
#   k8s-discovery  tests/real_gpu.rs: the device plugin (stand-in kubelet) lists, and the DRA
#             driver (stand-in API server) publishes, exactly the GPUs nvidia-smi lists
#   plugin-envvar, plugin-mounts, plugin-cdi  a container given only one strategy's part of
#             the plugin's Allocate answer for the first GPU, as the engine applies it
#   dra       a container given only the CDI IDs of the claim the DRA driver prepared
# Each of cdi, plugin-* and dra passes when nvidia-smi and the CUDA program see exactly the
# first GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

BIN=${ACCEL_BIN_DIR:-$repo/target/release}
RUNC=$(command -v "${RUNC:-runc}") || { echo "real_gpu.sh: runc not found" >&2; exit 2; }
BUSYBOX=$(command -v "${BUSYBOX:-busybox}") || { echo "real_gpu.sh: busybox not found" >&2; exit 2; }
REPORT_DIR=${REPORT_DIR:-$repo/target/real-gpu}
SHIM=$BIN/accel-container-runtime
CTK=$BIN/accel-ctk
mkdir -p "$REPORT_DIR"
work=$(mktemp -d /tmp/accel-real-gpu.XXXXXX)
state=$work/state
fails=0
summary=()
pass() { summary+=("PASS $1"); echo "== PASS $1"; }
fail() { summary+=("FAIL $1"); echo "== FAIL $1"; fails=$((fails + 1)); }

echo "== node"
uname -r
echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup 2>&1)"
ls -l /dev/nvidia* 2>&1
ls /proc/driver/nvidia/gpus/ 2>&1
cat /proc/driver/nvidia/version 2>&1
"$RUNC" --version
file "$SHIM" 2>/dev/null || true

# A kernel with cgroup v2 but nothing mounted (a bare VM): runc needs the hierarchy.
if [ ! -e /sys/fs/cgroup/cgroup.controllers ] && [ ! -d /sys/fs/cgroup/devices ]; then
  mkdir -p /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && echo "mounted cgroup2"
fi
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  # Let runc's child cgroups get the cpuset controller that `runc update --cpuset-cpus` uses.
  for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
    echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  done
  echo "cgroup v2 controllers: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
fi

cat >"$work/config.toml" <<EOF
low-level-runtime = "$RUNC"
log-file = "$work/shim.log"
log-level = "debug"
profiles-dir = "$work/no-profiles.d"
EOF
export ACCEL_CONTAINER_RUNTIME_CONFIG=$work/config.toml

echo "== accel-ctk list"
"$CTK" list
"$CTK" list --json >"$REPORT_DIR/list.json"
echo "== accel-ctk doctor"
"$CTK" doctor
echo "doctor exit: $?"
echo "== accel-ctk cdi generate (first lines)"
"$CTK" cdi generate --vendor nvidia --format json >"$REPORT_DIR/nvidia-cdi.json" 2>"$REPORT_DIR/cdi-generate.err"
cat "$REPORT_DIR/cdi-generate.err"
head -c 1500 "$REPORT_DIR/nvidia-cdi.json"; echo

# The test programs. cudatest uses the CUDA driver API through dlopen, as every CUDA runtime
# does, declared here so no CUDA header is needed.
cat >"$work/cudatest.c" <<'EOF'
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int (*init_t)(unsigned);
typedef int (*count_t)(int *);
typedef int (*get_t)(int *, int);
typedef int (*name_t)(char *, int, int);
typedef int (*mem_t)(size_t *, int);
typedef int (*ctx_t)(void **, unsigned, int);
typedef int (*alloc_t)(unsigned long long *, size_t);
typedef int (*set_t)(unsigned long long, unsigned, size_t);
typedef int (*dtoh_t)(void *, unsigned long long, size_t);
typedef int (*free_t)(unsigned long long);
typedef int (*modload_t)(void **, const void *);
typedef int (*getfn_t)(void **, void *, const char *);
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
typedef int (*sync_t)(void);
#define SYM(t, v, n) t v = (t)dlsym(h, n); if (!v) { printf("missing %s\n", n); return 3; }
#define CK(call) do { int r_ = (call); if (r_) { printf("%s -> CUDA error %d\n", #call, r_); return 4; } } while (0)
int main(int argc, char **argv) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) { printf("dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
  SYM(init_t, cuInit, "cuInit"); SYM(count_t, cuDeviceGetCount, "cuDeviceGetCount");
  SYM(get_t, cuDeviceGet, "cuDeviceGet"); SYM(name_t, cuDeviceGetName, "cuDeviceGetName");
  SYM(mem_t, cuDeviceTotalMem, "cuDeviceTotalMem_v2"); SYM(ctx_t, cuCtxCreate, "cuCtxCreate_v2");
  SYM(alloc_t, cuMemAlloc, "cuMemAlloc_v2"); SYM(set_t, cuMemsetD32, "cuMemsetD32_v2");
  SYM(dtoh_t, cuMemcpyDtoH, "cuMemcpyDtoH_v2"); SYM(free_t, cuMemFree, "cuMemFree_v2");
  SYM(modload_t, cuModuleLoadData, "cuModuleLoadData");
  SYM(getfn_t, cuModuleGetFunction, "cuModuleGetFunction");
  SYM(launch_t, cuLaunchKernel, "cuLaunchKernel"); SYM(sync_t, cuCtxSynchronize, "cuCtxSynchronize");
  CK(cuInit(0));
  int n = 0; CK(cuDeviceGetCount(&n));
  printf("devices: %d\n", n);
  for (int i = 0; i < n; i++) {
    int dev; char name[128]; size_t mem;
    CK(cuDeviceGet(&dev, i)); CK(cuDeviceGetName(name, sizeof name, dev));
    CK(cuDeviceTotalMem(&mem, dev));
    printf("device %d: %s, %zu MiB\n", i, name, mem >> 20);
  }
  if (n < 1) return 5;
  int dev; void *ctx; CK(cuDeviceGet(&dev, 0)); CK(cuCtxCreate(&ctx, 0, dev));
  size_t count = 64u << 20; /* 256 MiB of u32 */
  unsigned long long d; CK(cuMemAlloc(&d, count * 4));
  CK(cuMemsetD32(d, 0xC0FFEEu, count));
  unsigned *host = malloc(count * 4);
  CK(cuMemcpyDtoH(host, d, count * 4));
  for (size_t i = 0; i < count; i += 4099)
    if (host[i] != 0xC0FFEEu) { printf("memset mismatch at %zu\n", i); return 6; }
  printf("memset+copy of 256 MiB: ok\n");
  if (argc > 1) {
    FILE *f = fopen(argv[1], "rb");
    if (!f) { printf("no ptx %s\n", argv[1]); return 7; }
    static char ptx[1 << 20]; size_t len = fread(ptx, 1, sizeof ptx - 1, f); ptx[len] = 0; fclose(f);
    void *mod, *fn; CK(cuModuleLoadData(&mod, ptx)); CK(cuModuleGetFunction(&fn, mod, "fill"));
    unsigned nn = (unsigned)count; void *args[] = {&d, &nn};
    CK(cuLaunchKernel(fn, (nn + 255) / 256, 1, 1, 256, 1, 1, 0, 0, args, 0));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(host, d, count * 4));
    for (size_t i = 0; i < count; i += 4099)
      if (host[i] != (unsigned)i * 3u + 7u) { printf("kernel mismatch at %zu: %u\n", i, host[i]); return 8; }
    printf("PTX JIT + kernel launch over %u elements: ok\n", nn);
  }
  CK(cuMemFree(d));
  printf("CUDA OK\n");
  return 0;
}
EOF
if command -v gcc >/dev/null; then
  gcc -O2 -o "$work/cudatest" "$work/cudatest.c" -ldl || { echo "gcc failed" >&2; exit 2; }
elif [ -n "${CUDATEST:-}" ]; then
  cp "$CUDATEST" "$work/cudatest"   # built elsewhere from the source above
else
  echo "real_gpu.sh: no gcc and no CUDATEST" >&2; exit 2
fi
have_ptx=0
if command -v nvcc >/dev/null; then
  cat >"$work/fill.cu" <<'EOF'
extern "C" __global__ void fill(unsigned *a, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = i * 3u + 7u;
}
EOF
  nvcc -ptx -o "$work/fill.ptx" "$work/fill.cu" && have_ptx=1
fi

# The image: busybox plus the glibc that nvidia-smi and cudatest need, copied from this node.
# No driver file is in it, and it has its own ld.so.cache that knows nothing of the driver.
rootfs=$work/rootfs
mkdir -p "$rootfs"/{bin,etc,proc,sys,dev,tmp,usr/bin,usr/lib/x86_64-linux-gnu,usr/lib64}
ln -s usr/lib "$rootfs/lib"
ln -s usr/lib64 "$rootfs/lib64"
cp "$BUSYBOX" "$rootfs/bin/busybox"
for app in sh ls cat grep wc sleep head echo id stat test tr; do ln -s busybox "$rootfs/bin/$app"; done
smi=$(command -v nvidia-smi || echo /usr/local/nvidia/bin/nvidia-smi)
for lib in $(ldd "$work/cudatest" "$smi" 2>/dev/null | grep -o '/[^ ]*\.so[^ ]*' | sort -u); do
  case $(basename "$lib") in libnvidia*|libcuda*) continue ;; esac
  real=$(readlink -f "$lib")
  case $(basename "$lib") in
    ld-linux*) cp "$real" "$rootfs/usr/lib64/$(basename "$lib")" ;;
    *) cp "$real" "$rootfs/usr/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
  esac
done
cp "$work/cudatest" "$rootfs/bin/cudatest"
[ "$have_ptx" = 1 ] && cp "$work/fill.ptx" "$rootfs/fill.ptx"
echo /usr/lib/x86_64-linux-gnu >"$rootfs/etc/ld.so.conf"
ldconfig -r "$rootfs"
echo "== image: $(find "$rootfs" -type f | wc -l) files; driver files in it: $(find "$rootfs" -name 'libcuda*' -o -name 'libnvidia*' -o -name nvidia-smi | wc -l)"

bundle() { # name env-json args-json
  local b=$work/$1
  mkdir -p "$b"
  # A copy per container: runc creates the bind-mount targets inside the rootfs.
  cp -a "$rootfs" "$b/rootfs"
  python3 - "$b/config.json" "$2" "$3" <<'EOF'
import json, sys
path, env, args = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
spec = {
  "ociVersion": "1.0.2-dev",
  "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": args,
              "env": ["PATH=/usr/bin:/bin"] + env, "cwd": "/",
              "capabilities": {k: ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
                               for k in ("bounding", "effective", "permitted")},
              "noNewPrivileges": True},
  "root": {"path": "rootfs", "readonly": False},
  "hostname": "gpu",
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc"},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
  ],
  "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"]},
}
json.dump(spec, open(path, "w"), indent=1)
EOF
  sha256sum "$b/config.json" | cut -d' ' -f1 >"$b/sha.before"
  cp "$b/config.json" "$b/config.json.orig"
}
run_ctr() { # name -> stdout in $work/name.out, stderr in .err, exit in .rc
  "$SHIM" --root "$state" run --bundle "$work/$1" "$1" >"$work/$1.out" 2>"$work/$1.err" </dev/null
  echo $? >"$work/$1.rc"
  echo "--- $1: exit $(cat "$work/$1.rc")"; cat "$work/$1.out"; sed 's/^/stderr: /' "$work/$1.err"
}
ptx_arg=""
[ "$have_ptx" = 1 ] && ptx_arg=" /fill.ptx"
probe='echo DEVS $(ls /dev | grep nvidia | tr "\n" " "); nvidia-smi -L; echo SMI=$?; /bin/cudatest'"$ptx_arg"'; echo CUDA=$?; echo LIBS $(ls /usr/lib/x86_64-linux-gnu | grep -E "libcuda|libnvidia" | tr "\n" " ")'

ngpu=$(ls /proc/driver/nvidia/gpus | wc -l)
uuid=$(grep -h 'GPU UUID' /proc/driver/nvidia/gpus/*/information | head -1 | awk '{print $NF}')
echo "== $ngpu GPU(s); first UUID $uuid"

bundle all '["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]' "[\"sh\", \"-c\", $(python3 -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$probe")]"
run_ctr all
if grep -q "^CUDA=0" "$work/all.out" && grep -q "^SMI=0" "$work/all.out" &&
  [ "$(grep -c '^GPU [0-9]' "$work/all.out")" = "$ngpu" ] && grep -q "devices: $ngpu" "$work/all.out"; then
  pass "all: nvidia-smi lists $ngpu GPU(s), CUDA alloc/memset/copy$([ $have_ptx = 1 ] && echo ' + PTX kernel') in the container"
else fail "all"; fi
cp "$work/all/config.json" "$REPORT_DIR/all-config.json"

bundle uuid "[\"NVIDIA_VISIBLE_DEVICES=$uuid\"]" "[\"sh\", \"-c\", $(python3 -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$probe")]"
run_ctr uuid
if grep -q "^CUDA=0" "$work/uuid.out" && grep -q "devices: 1" "$work/uuid.out" && grep -q "$uuid" "$work/uuid.out"; then
  pass "uuid: $uuid gives exactly that GPU"
else fail "uuid"; fi

bundle utility '["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"]' "[\"sh\", \"-c\", $(python3 -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$probe")]"
run_ctr utility
if grep -q "^SMI=0" "$work/utility.out" && grep -q "dlopen libcuda.so.1" "$work/utility.out" && ! grep -q "^CUDA=0" "$work/utility.out"; then
  pass "utility: nvidia-smi works and libcuda is not there"
else fail "utility"; fi

bundle none '[]' "[\"sh\", \"-c\", $(python3 -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$probe")]"
run_ctr none
if [ "$(sha256sum "$work/none/config.json" | cut -d' ' -f1)" = "$(cat "$work/none/sha.before")" ] &&
  grep -q "^DEVS *$" "$work/none.out" && ! grep -q "^SMI=0" "$work/none.out" && ! grep -q "^CUDA=0" "$work/none.out"; then
  pass "none: no node, no driver file, config.json byte-identical"
else fail "none"; fi

bundle bad "[\"NVIDIA_VISIBLE_DEVICES=$ngpu\"]" '["true"]'
run_ctr bad
if [ "$(cat "$work/bad.rc")" != 0 ] && [ "$(wc -l <"$work/bad.err")" = 1 ] &&
  [ "$(sha256sum "$work/bad/config.json" | cut -d' ' -f1)" = "$(cat "$work/bad/sha.before")" ] &&
  ! "$RUNC" --root "$state" state bad >/dev/null 2>&1; then
  pass "bad: index $ngpu refused in one line: $(cat "$work/bad.err")"
else fail "bad"; fi

bundle update '["NVIDIA_VISIBLE_DEVICES=all"]' '["sleep", "300"]'
"$SHIM" --root "$state" create --bundle "$work/update" update </dev/null >/dev/null 2>"$work/update.err"
"$SHIM" --root "$state" start update
"$SHIM" --root "$state" update --cpuset-cpus 0 update && echo "runc update: ok"
cg=$(python3 -c 'import json,sys; print(json.load(sys.stdin).get("cgroupsPath",""))' <"$work/update/config.json" 2>/dev/null)
"$RUNC" --root "$state" exec update /bin/cudatest >"$work/update.out" 2>&1
rc=$?
cat "$work/update.out"
cpus=$("$RUNC" --root "$state" exec update grep Cpus_allowed_list /proc/self/status 2>/dev/null | awk '{print $2}')
echo "cpuset in container after update: ${cpus:-?}"
"$RUNC" --root "$state" kill update KILL; sleep 0.5; "$RUNC" --root "$state" delete -f update
if [ $rc = 0 ] && grep -q "CUDA OK" "$work/update.out" && [ "$cpus" = 0 ]; then
  pass "update: CUDA works after runc update --cpuset-cpus 0"
else fail "update"; fi

# --- CDI and Kubernetes' answers --------------------------------------------------------------
# Each container below gets its GPU only through what the check names (no variable), and
# must run nvidia-smi and the CUDA program on exactly the first GPU.
k8s=$work/k8s
mkdir -p "$work/cdi" "$k8s/plugin/cdi" "$k8s/dra/cdi"
kind=""
if [ -n "${K8S_TESTS:-}" ]; then
  echo "== tests/real_gpu.rs: the device plugin and the DRA driver on this driver"
  gpus_csv=$(nvidia-smi --query-gpu=index,uuid,pci.bus_id,driver_version,name --format=csv,noheader)
  echo "$gpus_csv"
  # The tests allocate the first GPU nvidia-smi lists.
  k8s_uuid=$(echo "$gpus_csv" | head -1 | cut -d, -f2 | tr -d ' ')
  ACCEL_REAL_GPUS="$gpus_csv" ACCEL_REAL_OUT="$k8s" "$K8S_TESTS" --ignored --test-threads 1 \
    >"$REPORT_DIR/real_gpu-rs.log" 2>&1
  rc=$?
  cp -r "$k8s" "$REPORT_DIR/k8s"
  grep -E '^test |^test result|panicked|ListAndWatch:' "$REPORT_DIR/real_gpu-rs.log"
  if [ $rc = 0 ] && grep -q '^test result: ok. 2 passed' "$REPORT_DIR/real_gpu-rs.log"; then
    pass "k8s-discovery: the device plugin lists and the DRA driver publishes exactly nvidia-smi's GPUs (UUID, bus, driver version, model, NUMA)"
  else fail "k8s-discovery (see real_gpu-rs.log)"; fi
  [ -s "$k8s/dra/claim.json" ] && kind=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["kind"])' "$k8s/dra/claim.json")
fi
cp "$REPORT_DIR/nvidia-cdi.json" "$work/cdi/nvidia.json"
cat >>"$work/config.toml" <<EOF
accept-container-devices-as-mounts = true
cdi-spec-dirs = ["$work/cdi", "$k8s/plugin/cdi", "$k8s/dra/cdi"]
EOF
[ -z "$kind" ] || printf '[profiles.nvidia]\ncdi-extra-kinds = ["%s"]\n' "$kind" >>"$work/config.toml"

# Edits a bundle as the engine would from one part of an answer: `env`, `annotations`, `mounts`
# plus `devices` (containerd turns a device spec into a node and a cgroup rule), or `annotate`
# KEY VALUE.
edit_bundle() { # name part [key value]
  python3 - "$work/$1/config.json" "$k8s/plugin/answer.json" "$2" "${3:-}" "${4:-}" <<'EOF'
import json, os, sys
path, answer_path, part, key, value = sys.argv[1:6]
spec = json.load(open(path))
a = json.load(open(answer_path)) if part != "annotate" else {}
if part == "env":
    spec["process"]["env"] += [f"{k}={v}" for k, v in a["envs"].items()]
elif part == "annotations":
    spec.setdefault("annotations", {}).update(a["annotations"])
elif part == "annotate":
    spec.setdefault("annotations", {})[key] = value
elif part == "mounts":
    for m in a["mounts"]:
        spec["mounts"].append({"destination": m["container_path"], "type": "bind", "source": m["host_path"],
                               "options": ["rbind", "rprivate"] + (["ro"] if m["read_only"] else [])})
    for d in a["devices"]:
        st = os.stat(d["host_path"])
        spec["linux"].setdefault("devices", []).append({"path": d["container_path"], "type": "c",
            "major": os.major(st.st_rdev), "minor": os.minor(st.st_rdev), "fileMode": 0o666, "uid": 0, "gid": 0})
        spec["linux"]["resources"]["devices"].append({"allow": True, "type": "c", "major": os.major(st.st_rdev),
            "minor": os.minor(st.st_rdev), "access": d["permissions"] + "m"})
json.dump(spec, open(path, "w"), indent=1)
EOF
  sha256sum "$work/$1/config.json" | cut -d' ' -f1 >"$work/$1/sha.before"
}
probe_args="[\"sh\", \"-c\", $(python3 -c 'import json,sys;print(json.dumps(sys.argv[1]))' "$probe")]"
one_gpu() { # name what uuid
  if [ "$(cat "$work/$1.rc")" = 0 ] && grep -q "^CUDA=0" "$work/$1.out" && grep -q "^SMI=0" "$work/$1.out" &&
    grep -q "devices: 1" "$work/$1.out" && grep -q "$3" "$work/$1.out"; then
    pass "$1: $2"
  else fail "$1"; fi
}

cdi_name=$(python3 -c '
import json, sys
names = [d["name"] for d in json.load(open(sys.argv[1]))["devices"]]
print(sys.argv[2] if sys.argv[2] in names else "0")' "$work/cdi/nvidia.json" "$uuid")
bundle cdi '[]' "$probe_args"
edit_bundle cdi annotate cdi.k8s.io/real-gpu "nvidia.com/gpu=$cdi_name"
run_ctr cdi
one_gpu cdi "accel-ctk cdi generate's spec, named by a cdi.k8s.io annotation (nvidia.com/gpu=$cdi_name)" "$uuid"

if [ -s "$k8s/plugin/answer.json" ]; then
  bundle plugin-envvar '[]' "$probe_args"
  edit_bundle plugin-envvar env
  run_ctr plugin-envvar
  one_gpu plugin-envvar "the device plugin's envvar answer" "$k8s_uuid"
  bundle plugin-mounts '[]' "$probe_args"
  edit_bundle plugin-mounts mounts
  run_ctr plugin-mounts
  one_gpu plugin-mounts "the device plugin's default answer (volume-mounts + device-specs)" "$k8s_uuid"
  bundle plugin-cdi '[]' "$probe_args"
  edit_bundle plugin-cdi annotations
  run_ctr plugin-cdi
  one_gpu plugin-cdi "the device plugin's cdi-annotations answer and its spec" "$k8s_uuid"
fi
if [ -n "$kind" ]; then
  ids=$(python3 -c 'import json,sys; print(",".join(json.load(open(sys.argv[1]))["ids"]))' "$k8s/dra/claim.json")
  bundle dra '[]' "$probe_args"
  edit_bundle dra annotate cdi.k8s.io/dra-claim "$ids"
  run_ctr dra
  one_gpu dra "the DRA driver's prepared claim spec ($ids)" "$k8s_uuid"
fi

if [ -n "${HYPERFINE:-}" ]; then
  echo "== timing on this node: the shim with a no-op low-level runtime vs that no-op"
  printf 'int main(void){return 0;}\n' >"$work/noop.c"
  if [ -n "${NOOP:-}" ]; then cp "$NOOP" "$work/noop"
  else gcc -O2 -static -o "$work/noop" "$work/noop.c"; fi
  # The exec floor (benches/bench.sh's "exec-only C"): a static program that only exec's the
  # low-level runtime; the create guard is measured against it.
  printf '#include <unistd.h>\nint main(int c, char **v) { (void)c; execv(v[1], v + 1); return 127; }\n' >"$work/exec-c.c"
  if [ -n "${EXEC_FLOOR:-}" ]; then cp "$EXEC_FLOOR" "$work/exec-c"
  else gcc -O2 -static -o "$work/exec-c" "$work/exec-c.c"; fi
  # Engines keep bundles on tmpfs (/run/containerd/...): so does the timing.
  tb=$work/tmpfs
  mkdir -p "$tb" && mount -t tmpfs -o size=64m accel-real-gpu "$tb"
  for b in all none; do mkdir "$tb/$b" && cp "$work/$b/config.json.orig" "$tb/$b/config.json.orig"; done
  cp "$tb/none/config.json.orig" "$tb/none/config.json"
  cat >"$work/config-noop.toml" <<EOF
low-level-runtime = "$work/noop"
log-file = "$work/shim-noop.log"
profiles-dir = "$work/no-profiles.d"
EOF
  restore="cp $tb/all/config.json.orig $tb/all/config.json"
  cmds=(
    -n noop --prepare true "$work/noop create --bundle $tb/all x"
    -n "exec floor" --prepare true "$work/exec-c $work/noop create --bundle $tb/all x"
    -n "shim create, none" --prepare true "$SHIM create --bundle $tb/none x"
    -n "shim create, all ($ngpu real GPU)" --prepare "$restore" "$SHIM create --bundle $tb/all x"
    -n "shim state" --prepare true "$SHIM state x"
  )
  [ -z "${BASELINE:-}" ] || cmds+=(
    -n "baseline create, none" --prepare true "$BASELINE create --bundle $tb/none x"
    -n "baseline create, all ($ngpu real GPU)" --prepare "$restore" "$BASELINE create --bundle $tb/all x"
    -n "baseline state" --prepare true "$BASELINE state x"
  )
  ACCEL_CONTAINER_RUNTIME_CONFIG=$work/config-noop.toml "$HYPERFINE" -N --warmup 50 --runs 1000 \
    --export-json "$REPORT_DIR/hyperfine.json" "${cmds[@]}" 2>&1 | grep -v '^ *$'
  if command -v strace >/dev/null; then
    cp "$tb/all/config.json.orig" "$tb/all/config.json"
    ACCEL_CONTAINER_RUNTIME_CONFIG=$work/config-noop.toml strace -f -tt -T -o "$REPORT_DIR/strace-create-all.txt" \
      "$SHIM" create --bundle "$tb/all" x
    cp "$tb/all/config.json.orig" "$tb/all/config.json"
    ACCEL_CONTAINER_RUNTIME_CONFIG=$work/config-noop.toml strace -c -f -o "$REPORT_DIR/strace-c-create-all.txt" \
      "$SHIM" create --bundle "$tb/all" x
  fi
  umount "$tb"
fi

cp "$work/shim.log" "$REPORT_DIR/shim.log" 2>/dev/null
echo
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$REPORT_DIR/summary.txt"
exit "$fails"
