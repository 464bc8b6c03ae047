#!/bin/sh
# Runs inside the systemd + cgroup v2 guest (tests/vm/run.sh boots it). The share holds the
# runtime and accel-ctk as built, and this script; the simulated accelerator root is made
# here, with the vendors' real majors (NVIDIA 195; Enflame's major is dynamic: one this
# kernel has not registered), so an allowed open gives ENXIO (no driver) and a denied one
# EPERM (the device cgroup's eBPF program).
#
# Proves (issue 13): with the systemd cgroup driver, a device the runtime injected still
# opens after `systemctl daemon-reload`, `runc update`, `docker update`; the control (the
# same spec, the same runc, only the /dev/char link missing) loses it after the reload.
# Then runs the end-to-end suite (tests/e2e_runc.rs) here, on cgroup v2, when the share
# names its binary. Prints one table row per probe; exit status 0 only if every row is as
# expected.
set -u
share=/mnt/share
fail=0
say() { echo "guest: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
t0=$(cut -d' ' -f1 /proc/uptime)
say "up ${t0}s; $(uname -r); cgroup fs: $(stat -fc %T /sys/fs/cgroup); $(systemctl --version | head -1); $(runc --version | head -1)"
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || bad "not cgroup v2"

install -m 755 "$share/bin/accel-container-runtime" "$share/bin/accel-ctk" /usr/local/bin/
shim=/usr/local/bin/accel-container-runtime

# --- the simulated driver root -------------------------------------------------------------
sim=/run/accel-sim
free_major() {
  for m in 240 241 242 243 244 245 246 247 248 249 250 251 252 253 254 234 235 236 237 238 239; do
    awk '/^Block/{exit} {print $1}' /proc/devices | grep -qx "$m" || { echo "$m"; return; }
  done
}
gcu_major=$(free_major)
grep -qw '^ *195' /proc/devices && bad "major 195 is registered in this kernel: ENXIO would not mean 'allowed'"
mkdir -p "$sim/dev" "$sim/etc" "$sim/usr/bin" "$sim/usr/lib/x86_64-linux-gnu" "$sim/proc/driver/nvidia/gpus" \
  "$sim/sys/module/enflame" "$sim/var/cache/ldconfig"
i=0
for bus in 0000:3b:00.0 0000:af:00.0; do
  mkdir -p "$sim/proc/driver/nvidia/gpus/$bus"
  printf 'Model: \t\t Simulated GPU\nGPU UUID: \t\t GPU-0000000%d-0d7a-4f52-9c1e-000000000000\nBus Location: \t\t %s\nDevice Minor: \t\t %d\n' \
    "$i" "$bus" "$i" > "$sim/proc/driver/nvidia/gpus/$bus/information"
  mknod -m 666 "$sim/dev/nvidia$i" c 195 "$i"
  i=$((i + 1))
done
echo 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  (simulated)' > "$sim/proc/driver/nvidia/version"
mknod -m 666 "$sim/dev/nvidiactl" c 195 255
mknod -m 666 "$sim/dev/gcu0" c "$gcu_major" 0
mknod -m 666 "$sim/dev/gcu1" c "$gcu_major" 1
mknod -m 666 "$sim/dev/gcuctl" c "$gcu_major" 255
echo 1.2.3 > "$sim/sys/module/enflame/version"
lib=$sim/usr/lib/x86_64-linux-gnu
echo 'int accel_sim_marker(void) { return 42; }' > /tmp/marker.c
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so.550.54.14" /tmp/marker.c
gcc -shared -fPIC -Wl,-soname,libefml.so.1 -o "$lib/libefml.so.1.2.3" /tmp/marker.c
echo /usr/lib/x86_64-linux-gnu > "$sim/etc/ld.so.conf"
ldconfig -r "$sim"
say "simulated root: 2 GPUs (c 195:0, 195:1, nvidiactl 195:255), 2 GCUs (c $gcu_major:0-1)"

mkdir -p /etc/accel-container-runtime
cat > /etc/accel-container-runtime/config.toml <<EOF
log-level = "debug"
[profiles.nvidia]
driver-root = "$sim"
[profiles.enflame]
driver-root = "$sim"
EOF
# The control's config: the same edits, only the links go to a scratch dir (none on the host).
sed 's|^log-level.*|&\nhost-dev-dir = "/run/accel-nolinks"|' /etc/accel-container-runtime/config.toml > /run/control.toml

# --- a busybox bundle and image ------------------------------------------------------------
rootfs=/var/lib/accel-rootfs
mkdir -p "$rootfs/bin" "$rootfs/dev" "$rootfs/proc" "$rootfs/sys" "$rootfs/tmp" "$rootfs/etc"
cp /bin/busybox "$rootfs/bin/busybox"
for a in sh sleep dd cat ls true; do ln -sf busybox "$rootfs/bin/$a"; done
bundle() { # bundle DIR ENV...: a runc spec running `sleep 100000`, with the given env
  d=$1; shift
  mkdir -p "$d"
  # runc refuses a rootfs that is a symlink: each bundle gets a copy (one static busybox).
  cp -a "$rootfs" "$d/rootfs"
  (cd "$d" && rm -f config.json && runc spec)
  env_json=$(for e in PATH=/bin "$@"; do printf '"%s",' "$e"; done)
  sed -i "s|\"sh\"|\"sleep\", \"100000\"|; s|\"terminal\": true|\"terminal\": false|; s|\"PATH=[^\"]*\"|${env_json%,}|" "$d/config.json"
}

# --- probes ----------------------------------------------------------------------------------
# open DEV inside the container with EXEC (a command prefix that runs `sh -c` there):
# ENXIO = allowed (no driver behind the simulated node), EPERM = the device cgroup denies it.
probe() {
  out=$("$@" 2>&1)
  case "$out" in
    *"No such device or address"*) echo ENXIO ;;
    *"Operation not permitted"*) echo EPERM ;;
    *) echo "OTHER($(echo "$out" | tr '\n' ' ' | cut -c1-80))" ;;
  esac
}
rows=""
row() { # row NAME DEVICE EXPECTED ACTUAL
  printf '| %-44s | %-14s | %-6s | %-6s |\n' "$1" "$2" "$3" "$4"
  rows="$rows$(printf '| %-44s | %-14s | %-6s | %-6s |' "$1" "$2" "$3" "$4")
"
  [ "$3" = "$4" ] || bad "$1 $2: expected $3, got $4"
}
dd_cmd() { echo "dd if=$1 of=/dev/null count=0"; }
runc_probe() { probe "$shim" --systemd-cgroup exec "$1" sh -c "$(dd_cmd "$2")"; }
docker_probe() { probe docker exec "$1" sh -c "$(dd_cmd "$2")"; }
ctr_probe() { probe ctr -n accel task exec --exec-id "p$(date +%s%N)" "$1" sh -c "$(dd_cmd "$2")"; }

# --- 1. the control: runc --systemd-cgroup, the runtime's edits, no /dev/char link ---------
say "== control (no /dev/char link)"
[ -e /dev/char/195:0 ] && bad "/dev/char/195:0 exists before any container"
bundle /run/b-control NVIDIA_VISIBLE_DEVICES=0
ACCEL_CONTAINER_RUNTIME_CONFIG=/run/control.toml "$shim" --systemd-cgroup create --bundle /run/b-control control \
  </dev/null >/run/control.out 2>&1 || { bad "control create: $(cat /run/control.out)"; }
"$shim" --systemd-cgroup start control
grep -q '"/dev/nvidia0"' /run/b-control/config.json || bad "control spec lacks /dev/nvidia0"
[ -e /dev/char/195:0 ] && bad "the control made /dev/char/195:0"
row "runc control: before daemon-reload" /dev/nvidia0 ENXIO "$(runc_probe control /dev/nvidia0)"
systemctl daemon-reload
row "runc control: after daemon-reload" /dev/nvidia0 EPERM "$(runc_probe control /dev/nvidia0)"
"$shim" --systemd-cgroup delete -f control

# --- 2. ours: runc --systemd-cgroup through the runtime ------------------------------------
say "== runc --systemd-cgroup through the runtime"
bundle /run/b-ours NVIDIA_VISIBLE_DEVICES=0 ENFLAME_VISIBLE_DEVICES=0
"$shim" --systemd-cgroup create --bundle /run/b-ours ours </dev/null >/run/ours.out 2>&1 || bad "ours create: $(cat /run/ours.out)"
"$shim" --systemd-cgroup start ours
say "links: $(ls -l /dev/char/195:0 /dev/char/195:255 "/dev/char/$gcu_major:0" 2>&1 | awk '{print $(NF-2), $(NF-1), $NF}' | tr '\n' ';')"
for d in /dev/nvidia0 /dev/nvidiactl /dev/gcu0; do
  row "runc ours: before daemon-reload" "$d" ENXIO "$(runc_probe ours "$d")"
done
systemctl daemon-reload
for d in /dev/nvidia0 /dev/nvidiactl /dev/gcu0; do
  row "runc ours: after daemon-reload" "$d" ENXIO "$(runc_probe ours "$d")"
done
"$shim" --systemd-cgroup update --cpuset-cpus 0 ours
for d in /dev/nvidia0 /dev/gcu0; do
  row "runc ours: after runc update --cpuset-cpus" "$d" ENXIO "$(runc_probe ours "$d")"
done
systemctl daemon-reload
row "runc ours: after update + daemon-reload" /dev/nvidia0 ENXIO "$(runc_probe ours /dev/nvidia0)"
"$shim" --systemd-cgroup delete -f ours

# --- 3. docker, systemd cgroup driver, --runtime accel -------------------------------------
say "== docker (native.cgroupdriver=systemd)"
mkdir -p /etc/docker
cat > /etc/docker/daemon.json <<EOF
{"exec-opts": ["native.cgroupdriver=systemd"], "iptables": false, "ip6tables": false, "bridge": "none",
 "storage-driver": "vfs", "runtimes": {"accel": {"path": "$shim"}}}
EOF
# docker registers its --gpus driver only when this name is on its PATH at start.
ln -sf "$shim" /usr/local/bin/nvidia-container-runtime-hook
systemctl start containerd docker || { bad "docker did not start"; journalctl -u docker --no-pager | tail -20; }
say "$(docker info --format 'docker {{.ServerVersion}}, cgroup {{.CgroupVersion}} driver {{.CgroupDriver}}')"
tar -C "$rootfs" -c . | docker import - accel-busybox >/dev/null
docker run -d --name d-nv --runtime accel -e NVIDIA_VISIBLE_DEVICES=1 accel-busybox sleep 100000 >/dev/null || bad "docker run d-nv"
docker run -d --name d-ef --runtime accel -e ENFLAME_VISIBLE_DEVICES=1 accel-busybox sleep 100000 >/dev/null || bad "docker run d-ef"
docker run -d --name d-gpus --runtime accel --gpus device=0 accel-busybox sleep 100000 >/dev/null || bad "docker run d-gpus"
docker_rows() {
  row "docker NVIDIA_VISIBLE_DEVICES=1: $1" /dev/nvidia1 ENXIO "$(docker_probe d-nv /dev/nvidia1)"
  row "docker ENFLAME_VISIBLE_DEVICES=1: $1" /dev/gcu1 ENXIO "$(docker_probe d-ef /dev/gcu1)"
  row "docker --gpus device=0: $1" /dev/nvidia0 ENXIO "$(docker_probe d-gpus /dev/nvidia0)"
}
docker_rows "before reload"
systemctl daemon-reload
docker_rows "after reload"
docker update --cpuset-cpus 0 d-nv d-ef d-gpus >/dev/null
docker_rows "after docker update"
systemctl daemon-reload
docker_rows "after update + reload"
docker rm -f d-nv d-ef d-gpus >/dev/null

# --- 4. containerd, SystemdCgroup, the runtime as the runc binary --------------------------
say "== containerd (ctr run --runc-binary, --runc-systemd-cgroup)"
say "$(containerd --version)"
docker save accel-busybox | ctr -n accel images import - >/dev/null || bad "ctr images import"
img=$(ctr -n accel images ls -q | grep busybox | head -1)
ctr -n accel run -d --runc-binary "$shim" --runc-systemd-cgroup --cgroup system.slice:accel:c-nv \
  --env NVIDIA_VISIBLE_DEVICES=1 --env ENFLAME_VISIBLE_DEVICES=0 "$img" c-nv sleep 100000 >/dev/null 2>/run/ctr.err \
  || bad "ctr run: $(cat /run/ctr.err)"
ctr_rows() {
  row "containerd NVIDIA_VISIBLE_DEVICES=1: $1" /dev/nvidia1 ENXIO "$(ctr_probe c-nv /dev/nvidia1)"
  row "containerd ENFLAME_VISIBLE_DEVICES=0: $1" /dev/gcu0 ENXIO "$(ctr_probe c-nv /dev/gcu0)"
}
ctr_rows "before reload"
systemctl daemon-reload
ctr_rows "after reload"
ctr -n accel task kill -s KILL c-nv >/dev/null 2>&1; sleep 1
ctr -n accel task rm -f c-nv >/dev/null 2>&1; ctr -n accel containers rm c-nv >/dev/null 2>&1

# --- 5. accel-ctk system create-dev-char-symlinks ------------------------------------------
say "== accel-ctk system create-dev-char-symlinks"
rm -f /dev/char/195:1
accel-ctk system create-dev-char-symlinks || bad "create-dev-char-symlinks failed"
[ "$(readlink /dev/char/195:1)" = "$sim/dev/nvidia1" ] || bad "195:1 not relinked"

echo
echo "daemon-reload table (systemd $(systemctl --version | head -1 | cut -d' ' -f2), $(runc --version | head -1), cgroup v2):"
printf '| %-44s | %-14s | %-6s | %-6s |\n' case device expect got
printf '%s' "$rows"

# --- 6. the end-to-end suite on cgroup v2 --------------------------------------------------
if [ -s "$share/e2e" ]; then
  # The suite's binaries and fixtures are at the paths they were built with (the repository,
  # shared read-write at the same absolute path: its target/tmp caches the compiled libraries).
  repo=$(cat "$share/repo-path")
  mkdir -p "$repo"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 repo "$repo" || bad "cannot mount the repository"
  while read -r bin; do
    name=$(basename "$bin")
    say "== $name on cgroup v2 (runc's cgroupfs driver, systemd as PID 1)"
    "$bin" --test-threads=2 > "/run/$name.log" 2>&1
    st=$?
    grep -E '^test |^test result' "/run/$name.log"
    [ "$st" = 0 ] || { tail -60 "/run/$name.log"; bad "$name: status $st"; }
  done < "$share/e2e"
fi

say "done in $(awk -v t0="$t0" '{printf "%d", $1 - t0}' /proc/uptime)s; status $fail"
exit $fail
