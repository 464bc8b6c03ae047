#!/bin/sh
# Runs inside the systemd + cgroup v2 guest (tests/vm/run.sh boots it). The share holds the
# runtime and accel-ctk as built, this script, the guest's flavour and the low-level runtimes
# to run the end-to-end suite with; the simulated accelerator root is made here, with the
# vendors' real majors (NVIDIA 195; Enflame's major is dynamic: one this kernel has not
# registered), so an allowed open gives ENXIO (no driver) and a denied one EPERM (the device
# cgroup's eBPF program).
#
# First prints every component's version and fails unless each is in the range the flavour
# claims to test (bookworm: containerd 1.6, runc 1.1, docker; sid: containerd 2, runc >= 1.2,
# crun, podman 5, cgroup v2 only), so a moving suite never silently tests something else.
# Proves (issues 13, 24): with the systemd cgroup driver, a device the runtime injected still
# opens after `systemctl daemon-reload`, `runc update`, `docker update`; the control (the
# same spec, the same runc, only the /dev/char link missing) loses it after the reload; on
# sid the same with crun as the low-level runtime, and podman with the CDI spec accel-ctk
# generates and with the runtime as podman's --runtime.
# Then runs the end-to-end suite (tests/e2e_runc.rs) here, on cgroup v2, when the share
# names its binary, once per low-level runtime. Prints one table row per probe; exit status 0
# only if every row is as expected.
set -u
share=/mnt/share
fail=0
say() { echo "guest: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
t0=$(cut -d' ' -f1 /proc/uptime)
flavour=$(cat "$share/flavour")
say "up ${t0}s; flavour $flavour; $(uname -r); cgroup fs: $(stat -fc %T /sys/fs/cgroup); $(systemctl --version | head -1); $(runc --version | head -1)"
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || bad "not cgroup v2"

# --- 0. what this guest runs, against what the flavour claims to test ----------------------
# ver CMD...: the first dotted number CMD prints ("" when CMD is missing).
ver() { "$@" 2>/dev/null | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1; }
# claim NAME VERSION MIN BELOW: MIN <= VERSION < BELOW (BELOW "-" for no upper bound).
claim() {
  if [ -z "$2" ]; then
    bad "$1: not installed, and the $flavour tier claims $1 >= $3"
    return
  fi
  [ "$(printf '%s\n%s\n' "$3" "$2" | sort -V | head -1)" = "$3" ] ||
    bad "$1 $2 is older than $3, the oldest the $flavour tier claims to test"
  if [ "$4" != - ] && [ "$(printf '%s\n%s\n' "$4" "$2" | sort -V | head -1)" = "$4" ]; then
    bad "$1 $2 is not below $4: the $flavour tier claims to test $1 < $4"
  fi
  versions="$versions$1 $2; "
}
versions=""
claim kernel "$(uname -r | grep -oE '^[0-9]+\.[0-9]+(\.[0-9]+)?')" 6.1 -
case $flavour in
  bookworm)
    claim systemd "$(ver systemctl --version)" 252 -
    claim runc "$(ver runc --version)" 1.1 1.2
    claim containerd "$(ver containerd --version)" 1.6 1.7
    claim docker "$(ver dockerd --version)" 20.10 -
    ;;
  sid)
    claim systemd "$(ver systemctl --version)" 257 -
    claim runc "$(ver runc --version)" 1.2 -
    claim crun "$(ver crun --version)" 1.14 -
    claim containerd "$(ver containerd --version)" 2.0 3.0
    claim podman "$(ver podman --version)" 5.0 6.0
    claim conmon "$(ver conmon --version)" 2.1 -
    # cgroup v2 only: no v1 hierarchy mounted anywhere (systemd >= 258 cannot mount one).
    grep -q ' cgroup ' /proc/self/mounts && bad "a cgroup v1 hierarchy is mounted: $(grep ' cgroup ' /proc/self/mounts | head -1)"
    ;;
  *) bad "unknown flavour '$flavour'" ;;
esac
echo "guest versions ($flavour): $versions"
if [ "$fail" != 0 ]; then
  echo "FAIL: this guest is not what the $flavour tier claims to test: nothing was tested"
  exit 1
fi

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
# Four GCUs: the CRI test's two DRA claims (GCU 3 and 1; GCU 2) leave one unclaimed.
for n in 0 1 2 3; do mknod -m 666 "$sim/dev/gcu$n" c "$gcu_major" "$n"; done
mknod -m 666 "$sim/dev/gcuctl" c "$gcu_major" 255
echo 1.2.3 > "$sim/sys/module/enflame/version"
lib=$sim/usr/lib/x86_64-linux-gnu
echo 'int accel_sim_marker(void) { return 42; }' > /tmp/marker.c
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so.550.54.14" /tmp/marker.c
gcc -shared -fPIC -Wl,-soname,libefml.so.1 -o "$lib/libefml.so.1.2.3" /tmp/marker.c
echo /usr/lib/x86_64-linux-gnu > "$sim/etc/ld.so.conf"
ldconfig -r "$sim"
say "simulated root: 2 GPUs (c 195:0, 195:1, nvidiactl 195:255), 4 GCUs (c $gcu_major:0-3)"

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
# runc 1.1 (bookworm) with the systemd driver loses a device that has no /dev/char link at
# the reload (the bug the links fix); runc 1.3.6 with systemd 262 (sid) was measured keeping
# it: there the control shows the links are no longer needed by runc itself.
case $flavour in
  bookworm) control_after=EPERM ;;
  *) control_after=ENXIO ;;
esac
row "runc control: after daemon-reload" /dev/nvidia0 "$control_after" "$(runc_probe control /dev/nvidia0)"
"$shim" --systemd-cgroup delete -f control

# --- 2. ours: runc (and crun on sid) --systemd-cgroup through the runtime ------------------
ours_rows() { # ours_rows LOW: the runtime with low-level-runtime = LOW
  low=$1
  say "== $low --systemd-cgroup through the runtime"
  sed "s|^log-level.*|&\nlow-level-runtime = \"$low\"|" /etc/accel-container-runtime/config.toml > "/run/$low.toml"
  export ACCEL_CONTAINER_RUNTIME_CONFIG="/run/$low.toml"
  rm -rf "/run/b-ours-$low"
  bundle "/run/b-ours-$low" NVIDIA_VISIBLE_DEVICES=0 ENFLAME_VISIBLE_DEVICES=0
  "$shim" --systemd-cgroup create --bundle "/run/b-ours-$low" ours </dev/null >/run/ours.out 2>&1 || bad "ours ($low) create: $(cat /run/ours.out)"
  "$shim" --systemd-cgroup start ours
  say "links: $(ls -l /dev/char/195:0 /dev/char/195:255 "/dev/char/$gcu_major:0" 2>&1 | awk '{print $(NF-2), $(NF-1), $NF}' | tr '\n' ';')"
  for d in /dev/nvidia0 /dev/nvidiactl /dev/gcu0; do
    row "$low ours: before daemon-reload" "$d" ENXIO "$(runc_probe ours "$d")"
  done
  systemctl daemon-reload
  for d in /dev/nvidia0 /dev/nvidiactl /dev/gcu0; do
    row "$low ours: after daemon-reload" "$d" ENXIO "$(runc_probe ours "$d")"
  done
  "$shim" --systemd-cgroup update --cpuset-cpus 0 ours || bad "$low update --cpuset-cpus 0"
  for d in /dev/nvidia0 /dev/gcu0; do
    row "$low ours: after $low update --cpuset-cpus" "$d" ENXIO "$(runc_probe ours "$d")"
  done
  systemctl daemon-reload
  row "$low ours: after update + daemon-reload" /dev/nvidia0 ENXIO "$(runc_probe ours /dev/nvidia0)"
  "$shim" --systemd-cgroup delete -f ours
  unset ACCEL_CONTAINER_RUNTIME_CONFIG
}
ours_rows runc
[ "$flavour" = sid ] && ours_rows crun

# --- 3. docker, systemd cgroup driver, --runtime accel (bookworm: sid's guest has none) ---
if [ "$flavour" = bookworm ]; then
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
fi

# --- 4. containerd, SystemdCgroup, the runtime as the runc binary --------------------------
say "== containerd (ctr run --runc-binary, --runc-systemd-cgroup)"
say "$(containerd --version)"
if [ "$flavour" = bookworm ]; then
  docker save accel-busybox | ctr -n accel images import - >/dev/null || bad "ctr images import"
else
  # No docker here: podman makes the image from the same rootfs, and saves it as an OCI archive.
  systemctl start containerd || { bad "containerd did not start"; journalctl -u containerd --no-pager | tail -20; }
  tar -C "$rootfs" -c . | podman import - accel-busybox >/dev/null || bad "podman import"
  podman save --format oci-archive -o /run/accel-busybox.tar accel-busybox >/dev/null || bad "podman save"
  ctr -n accel images import /run/accel-busybox.tar >/dev/null || bad "ctr images import"
fi
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

# --- 6. podman (sid): the CDI spec accel-ctk generates, and the runtime as --runtime --------
if [ "$flavour" = sid ]; then
  say "== podman $(ver podman --version) (runtime $(podman info --format '{{.Host.OCIRuntime.Name}}' 2>&1), cgroup manager $(podman info --format '{{.Host.CgroupManager}}' 2>&1))"
  mkdir -p /etc/cdi
  accel-ctk cdi generate --output /etc/cdi >/run/cdi.out 2>&1 || bad "accel-ctk cdi generate: $(cat /run/cdi.out)"
  say "CDI specs: $(ls /etc/cdi | tr '\n' ' '); devices: $(grep -h '^ *- name:\|^  name:' /etc/cdi/* | tr -s ' \n' ' ')"
  podman_probe() { probe podman exec "$1" sh -c "$(dd_cmd "$2")"; }
  # dev_has CONTAINER WANT UNWANTED: /dev in the container lists WANT and not UNWANTED.
  dev_has() {
    devs=$(podman exec "$1" ls /dev 2>&1 | tr '\n' ' ')
    case " $devs " in *" $2 "*) ;; *) bad "podman $1: /dev lacks $2: $devs" ;; esac
    case " $devs " in *" $3 "*) bad "podman $1: /dev has $3, never asked for: $devs" ;; esac
  }
  podman run -d --name p-cdi --network none --device nvidia.com/gpu=0 --device enflame.com/gcu=1 \
    accel-busybox sleep 100000 >/run/p-cdi.out 2>&1 || bad "podman run --device nvidia.com/gpu=0: $(cat /run/p-cdi.out)"
  podman run -d --name p-rt --network none --runtime "$shim" -e NVIDIA_VISIBLE_DEVICES=1 -e ENFLAME_VISIBLE_DEVICES=0 \
    accel-busybox sleep 100000 >/run/p-rt.out 2>&1 || bad "podman run --runtime $shim: $(cat /run/p-rt.out)"
  dev_has p-cdi nvidia0 nvidia1
  dev_has p-cdi gcu1 gcu0
  dev_has p-rt nvidia1 nvidia0
  dev_has p-rt gcu0 gcu1
  podman_rows() {
    row "podman --device nvidia.com/gpu=0: $1" /dev/nvidia0 ENXIO "$(podman_probe p-cdi /dev/nvidia0)"
    row "podman --device enflame.com/gcu=1: $1" /dev/gcu1 ENXIO "$(podman_probe p-cdi /dev/gcu1)"
    row "podman --runtime accel NVIDIA=1: $1" /dev/nvidia1 ENXIO "$(podman_probe p-rt /dev/nvidia1)"
    row "podman --runtime accel ENFLAME=0: $1" /dev/gcu0 ENXIO "$(podman_probe p-rt /dev/gcu0)"
  }
  podman_rows "before reload"
  systemctl daemon-reload
  podman_rows "after reload"
  podman update --cpuset-cpus 0 p-rt >/run/p-update.out 2>&1 || bad "podman update --cpuset-cpus 0 p-rt: $(cat /run/p-update.out)"
  # Measured with crun 1.28 (podman's default here): `crun update` refuses the device list
  # podman sends for a container with devices ("updating device access list not supported
  # when using BPFProgram"); runc (p-rt, through the runtime) takes it. A row, so a crun that
  # starts taking it shows up here.
  if podman update --cpuset-cpus 0 p-cdi >/run/p-update.out 2>&1; then got=updated
  elif grep -q 'device access list not supported' /run/p-update.out; then got=refused
  else got="OTHER($(tr '\n' ' ' < /run/p-update.out | cut -c1-60))"; fi
  row "podman update, CDI container on crun" update refused "$got"
  systemctl daemon-reload
  podman_rows "after update + reload"
  podman rm -f -t 0 p-cdi p-rt >/dev/null 2>&1
fi

# --- 7. sid: containerd 2's CRI driven as kubelet drives it (tests/e2e_cri.rs) ---------------
if [ "$flavour" = sid ]; then
  say "== containerd CRI (config version 3: CDI on, NRI on, runtime handler accel, SystemdCgroup; the NRI plugin)"
  rm -f /etc/cdi/*.yaml
  # A host-network pod gets a copy of the node's /etc/hosts; minbase has none.
  [ -e /etc/hosts ] || printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' > /etc/hosts
  systemctl stop containerd
  mkdir -p /etc/containerd /var/run/cdi
  # Failing closed without NRI's validator (containerd 2.0/2.1): the runc and crun handlers
  # start every container from ctr's default spec with accel-nri-plugin's check hook added
  # (accel-ctk nri base-spec), which refuses a container the plugin did not adjust.
  install -m 755 "$share/bin/accel-nri-plugin" /usr/local/bin/ || bad "no accel-nri-plugin in the share"
  ctr oci spec > /run/ctr-oci-spec.json || bad "ctr oci spec"
  accel-ctk nri base-spec --plugin /usr/local/bin/accel-nri-plugin --from /run/ctr-oci-spec.json \
    > /etc/containerd/accel-base-spec.json 2>/run/base-spec.err || bad "accel-ctk nri base-spec: $(cat /run/base-spec.err)"
  grep -q '"accel-nri-plugin"' /etc/containerd/accel-base-spec.json || bad "the base spec has no check hook"
  cat > /etc/containerd/config.toml <<EOF
version = 3
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = 'localhost/accel-cri:latest'
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['/usr/lib/cni']
  conf_dir = '/etc/cni/net.d'
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
  base_runtime_spec = '/etc/containerd/accel-base-spec.json'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crun]
  runtime_type = 'io.containerd.runc.v2'
  base_runtime_spec = '/etc/containerd/accel-base-spec.json'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.crun.options]
  BinaryName = '$(command -v crun)'
  SystemdCgroup = true
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.accel]
  runtime_type = 'io.containerd.runc.v2'
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.accel.options]
  BinaryName = '$shim'
  SystemdCgroup = true
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  # Under TCG a debug build's answer to a create took more than NRI's default 2 s: containerd
  # then dropped the plugin and started the container without its devices (fail-open, seen
  # here). The test proves what the plugin does, not its latency here (benches/ measure that).
  plugin_request_timeout = '60s'
EOF
  # NRI's default validator (containerd >= 2.2; an older one has no such table): the NRI
  # plugin's test then expects a pod that requires the plugin to be refused while it is down.
  case "$(containerd --version | awk '{print $3}')" in
    v2.0.*|v2.1.*|2.0.*|2.1.*) say "containerd before 2.2: no NRI default validator (fails closed through the check hook)" ;;
    *) printf '%s\n' "[plugins.'io.containerd.nri.v1.nri'.default_validator]" '  enable = true' >> /etc/containerd/config.toml ;;
  esac
  # Pods in a user namespace cannot share the host's network (kubelet refuses it too): theirs
  # is a network namespace of their own, on a bridge nothing else is on (no masquerade).
  mkdir -p /etc/cni/net.d
  printf '%s\n' '{"cniVersion": "1.0.0", "name": "accel", "plugins": [{"type": "bridge", "bridge": "accel0",' \
    '"isGateway": false, "ipMasq": false, "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.77.0/24"}]]}}]}' \
    > /etc/cni/net.d/10-accel.conflist
  # In a user namespace runc cannot mknod: it bind-mounts each device from the host at the
  # node's container path (/dev/gcu1), not from where the simulated root has it. A real node
  # has its nodes there; so does this one from here on.
  for n in gcu0 gcu1 gcuctl; do [ -e "/dev/$n" ] || cp -a "$sim/dev/$n" /dev/; done
  # The volume-mounts strategy's answer is a /dev/null bind the runtime reads as a request.
  sed -i 's|^log-level.*|&\naccept-container-devices-as-mounts = true|' /etc/accel-container-runtime/config.toml
  systemctl start containerd || { bad "containerd did not start"; journalctl -u containerd --no-pager | tail -20; }
  say "containerd plugins: $(ctr plugins ls 2>&1 | awk '$2 == "cri" || $2 == "nri" || $1 ~ /cri.v1$/ {print $1, $2, $NF}' | tr '\n' ';')"
  ctr plugins ls 2>/dev/null | awk '$1 == "io.containerd.nri.v1" && $NF == "ok"' | grep -q . || bad "containerd's NRI plugin is not ok"
  containerd config dump 2>/dev/null | grep -q 'enable_cdi = true' || bad "containerd config dump: CDI not enabled"
  # doctor on the real engine: its version, NRI on, the socket there, and whether it can fail
  # closed (2.1: through the check hook of each handler's base spec; 2.2 with the validator
  # above: on).
  nri_line=$(accel-ctk doctor 2>/dev/null | grep '^\[.*\] containerd NRI: ')
  say "doctor: $nri_line"
  case "$nri_line" in
    *"containerd 2."[01]", "*"NRI on (set)"*'socket "/var/run/nri/nri.sock" present; no NRI default validator before 2.2, each CRI handler: "accel": the runtime itself; "crun": fails closed through accel-nri-plugin check (base_runtime_spec "/etc/containerd/accel-base-spec.json"); "runc": fails closed through accel-nri-plugin check'*) ;;
    *"containerd 2."*"NRI on (set)"*'socket "/var/run/nri/nri.sock" present; the NRI default validator is on'*) ;;
    *) bad "accel-ctk doctor's containerd NRI line: $nri_line" ;;
  esac
  # The pod sandbox image and the containers' image: the busybox rootfs, sleeping.
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/sleep", "1000000000"]' - accel-cri >/dev/null || bad "podman import accel-cri"
  podman save --format oci-archive -o /run/accel-cri.tar accel-cri >/dev/null || bad "podman save accel-cri"
  ctr -n k8s.io images import /run/accel-cri.tar >/run/cri-import.out 2>&1 || bad "ctr -n k8s.io images import: $(cat /run/cri-import.out)"
  src=$(ctr -n k8s.io images ls -q | grep accel-cri | head -1)
  say "CRI image: $src"
  [ "$src" = localhost/accel-cri:latest ] || ctr -n k8s.io images tag --force "$src" localhost/accel-cri:latest >/dev/null
  if [ -s "$share/e2e-cri" ]; then
    bin=$(cat "$share/e2e-cri")
    repo=$(cat "$share/repo-path")
    mkdir -p "$repo"
    mountpoint -q "$repo" || mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 repo "$repo" || bad "cannot mount the repository"
    ACCEL_E2E_CRI_SOCKET=/run/containerd/containerd.sock ACCEL_E2E_CRI_IMAGE=localhost/accel-cri:latest \
      ACCEL_E2E_CRI_HANDLER=accel ACCEL_E2E_CRI_CDI_DIR=/var/run/cdi ACCEL_E2E_NRI_SOCKET=/var/run/nri/nri.sock \
      ACCEL_E2E_NRI_HANDLERS="runc crun" \
      "$bin" --ignored --test-threads=1 --nocapture > /run/e2e-cri.log 2>&1
    st=$?
    cat /run/e2e-cri.log
    [ "$st" = 0 ] || { journalctl -u containerd --no-pager | tail -30; bad "e2e_cri: status $st"; }
    # --ignored runs only the ignored tests: none run would also be status 0. Four: the
    # device plugin's answers, the DRA driver's claims through containerd's own CDI, the NRI
    # plugin with plain runc and crun (and with it stopped: refused by the check hook), and
    # shared and partitioned claims.
    ran=$(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed.*/\1/p' /run/e2e-cri.log)
    [ "${ran:-0}" -ge 4 ] || bad "e2e_cri: ${ran:-no} test(s) passed, 4 expected (device plugin, DRA, NRI plugin, DRA sharing)"
  else
    bad "the share names no e2e_cri binary"
  fi
fi

echo
echo "daemon-reload table (systemd $(systemctl --version | head -1 | cut -d' ' -f2), $(runc --version | head -1), cgroup v2):"
printf '| %-44s | %-14s | %-6s | %-6s |\n' case device expect got
printf '%s' "$rows"

# --- 8. the end-to-end suite on cgroup v2, once per low-level runtime --------------------------------------------------
if [ -s "$share/e2e" ]; then
  # The suite's binaries and fixtures are at the paths they were built with (the repository,
  # shared read-write at the same absolute path: its target/tmp caches the compiled libraries).
  repo=$(cat "$share/repo-path")
  mkdir -p "$repo"
  # The CRI test (sid) mounted it already.
  mountpoint -q "$repo" || mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 repo "$repo" || bad "cannot mount the repository"
  for low in $(cat "$share/runtimes"); do
    while read -r bin; do
      name=$(basename "$bin")
      say "== $name with $low ($(ver "$low" --version)) on cgroup v2 (cgroupfs driver, systemd as PID 1)"
      ACCEL_E2E_LOW_LEVEL_RUNTIME=$low "$bin" --test-threads=2 > "/run/$name-$low.log" 2>&1
      st=$?
      grep -E '^test |^test result' "/run/$name-$low.log"
      [ "$st" = 0 ] || { tail -60 "/run/$name-$low.log"; bad "$name with $low: status $st"; }
    done < "$share/e2e"
  done
fi

say "done in $(awk -v t0="$t0" '{printf "%d", $1 - t0}' /proc/uptime)s; status $fail"
exit $fail
