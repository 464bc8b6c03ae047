#!/usr/bin/env bash
# The systemd + cgroup v2 tier (issues 13 and 24): boots a Debian guest of one flavour under
# qemu (TCG: this machine's /dev/kvm cannot run a stock kernel) with systemd as PID 1, and
# runs tests/vm/guest-test.sh in it against the runtime and accel-ctk as built here: the
# guest's component versions, checked against what the flavour claims to test; the
# `systemctl daemon-reload` table (runc --systemd-cgroup, docker and containerd with the
# systemd cgroup driver; the control without a /dev/char link loses its device); then
# tests/e2e_runc.rs on cgroup v2, once per low-level runtime of the flavour.
#
# Usage: run.sh [FLAVOUR]   bookworm (default: containerd 1.6, runc 1.1, docker) or sid
# (containerd 2, runc >= 1.2, crun, podman 5, cgroup v2 only: the suite runs with runc and
# again with crun; podman with the generated CDI spec and with the runtime as --runtime).
#
# Needs root, qemu-system-x86_64, mmdebstrap, mke2fs, and network to deb.debian.org the first
# time (the guest image is cached under $ACCEL_VM_CACHE, default /var/cache/accel-vm, keyed
# by its flavour and recipe). With CI=true a missing prerequisite fails the run; elsewhere it
# skips with one line saying why. ACCEL_VM_TIMEOUT (seconds, default 1800) bounds the guest's
# run.
set -euo pipefail
cd "$(dirname "$0")/../.."
flavour=${1:-bookworm}
case $flavour in
  bookworm) runtimes=runc ;;
  sid) runtimes="runc crun" ;;
  *) echo "tests/vm/run.sh: unknown flavour '$flavour' (bookworm or sid)" >&2; exit 1 ;;
esac

skip() {
  if [ "${CI:-}" = true ]; then
    echo "tests/vm/run.sh: cannot run ($*), and CI=true: failing" >&2
    exit 1
  fi
  echo "tests/vm/run.sh: skipped: $*"
  exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (mmdebstrap, the guest image cache)"
for tool in qemu-system-x86_64 mmdebstrap mke2fs; do
  command -v "$tool" >/dev/null || skip "no $tool (apt-get install -t bookworm-backports qemu-system-x86; apt-get install mmdebstrap e2fsprogs)"
done

t_start=$(date +%s)
log() { echo "tests/vm/run.sh [$flavour]: $* (+$(($(date +%s) - t_start))s)"; }

# The binaries under test, and the end-to-end suite's test binary (run in the guest).
cargo build --bins -q
e2e=$(cargo test --test e2e_runc --no-run --message-format=json -q 2>/dev/null |
  grep -o '"executable":"[^"]*/deps/e2e_runc-[^"]*"' | tail -1 | cut -d'"' -f4)
[ -x "$e2e" ] || { echo "tests/vm/run.sh: no e2e_runc test binary" >&2; exit 1; }
# The CRI test (sid only) drives containerd 2 with the device plugin's and the DRA driver's
# code: the dra feature (which has the plugin's), with exporter too, as .ci/run's daemon tests
# build the library, so that this is one more test binary rather than one more library build.
e2e_cri=""
if [ "$flavour" = sid ]; then
  e2e_cri=$(cargo test --features "dra exporter" --test e2e_cri --no-run --message-format=json -q 2>/dev/null |
    grep -o '"executable":"[^"]*/deps/e2e_cri-[^"]*"' | tail -1 | cut -d'"' -f4)
  [ -x "$e2e_cri" ] || { echo "tests/vm/run.sh: no e2e_cri test binary" >&2; exit 1; }
  # The same build's accel-nri-plugin: the check hook of the guest's base spec.
  [ -x target/debug/accel-nri-plugin ] || { echo "tests/vm/run.sh: no accel-nri-plugin" >&2; exit 1; }
fi
log "built"

# build-guest.sh's stdout is the image directory and nothing else; a tool that writes there
# (mke2fs did, only when the cache was empty) would otherwise turn into a qemu failure
# minutes later.
guest=$(bash tests/vm/build-guest.sh "$flavour")
lines=$(printf '%s\n' "$guest" | wc -l)
if [ "$lines" != 1 ] || [ ! -d "$guest" ]; then
  echo "tests/vm/run.sh: build-guest.sh printed $lines line(s), not one naming the image directory: $(printf '%s' "$guest" | head -c 300 | tr '\n' '|')" >&2
  exit 1
fi
log "guest image: $guest"

share=$(mktemp -d /tmp/accel-vm-share.XXXXXX)
trap 'rm -rf "$share"' EXIT
mkdir -p "$share/bin"
cp target/debug/accel-container-runtime target/debug/accel-ctk "$share/bin/"
cp tests/vm/guest-test.sh "$share/"
# ACCEL_VM_E2E=0 leaves the end-to-end suite out (about 6 minutes under TCG per runtime): for iterating
# on the daemon-reload cases only; CI runs everything.
if [ "${ACCEL_VM_E2E:-1}" != 0 ] || [ "${CI:-}" = true ]; then echo "$e2e" > "$share/e2e"; fi
pwd > "$share/repo-path"
echo "$flavour" > "$share/flavour"
echo "$runtimes" > "$share/runtimes"
[ -z "$e2e_cri" ] || echo "$e2e_cri" > "$share/e2e-cri"
[ -z "$e2e_cri" ] || cp target/debug/accel-nri-plugin "$share/bin/"

# q35 with an uncompressed kernel boots through the PVH entry; snapshot=on keeps the cached
# image pristine. apparmor=0: the minbase guest has no apparmor_parser, and docker refuses to
# start containers on a kernel with AppArmor enabled but no docker-default profile loaded. The repository is shared at its own path so the e2e binary finds its
# fixtures and the binaries it was built against.
log "booting (TCG)"
set +e
timeout "${ACCEL_VM_TIMEOUT:-1800}" qemu-system-x86_64 \
  -machine q35,accel=tcg -cpu max -smp 2 -m 3072 -nographic -no-reboot -nic none \
  -kernel "$guest/kernel" -initrd "$guest/initrd.img" \
  -append "root=/dev/vda rw console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off apparmor=0" \
  -drive "file=$guest/disk.img,if=virtio,format=raw,snapshot=on" \
  -virtfs "local,path=$share,mount_tag=accel,security_model=none,id=accel" \
  -virtfs "local,path=$PWD,mount_tag=repo,security_model=none,id=repo" \
  > "$share/console.log" 2>&1
qemu_status=$?
set -e
log "guest stopped (qemu status $qemu_status)"

if [ ! -f "$share/exit-status" ]; then
  echo "tests/vm/run.sh: the guest test did not finish; console:" >&2
  tail -50 "$share/console.log" >&2
  [ -f "$share/output.log" ] && cat "$share/output.log" >&2
  exit 1
fi
cat "$share/output.log"
status=$(cat "$share/exit-status")
log "guest test status $status"
[ "$status" = 0 ]
