#!/bin/sh
# Build the .deb (cargo-deb) and .rpm (cargo-generate-rpm) from Cargo.toml's metadata and check
# what is in them; fails if a file, a conffile / %config(noreplace) mark or a maintainer
# script is missing.
#
#   packaging/build-packages.sh [--no-build] [--help] [OUT_DIR]   (OUT_DIR default: target/packages)
#
# Needs: cargo install --locked cargo-deb cargo-generate-rpm; dpkg-deb (dpkg); rpm (apt-get
# install rpm; rpm2cpio and cpio) to read the .rpm back; readelf (binutils); file. --no-build packages the static
# binaries already in target/<triple>/release (the triple packaging/target.sh prints).
set -eu
cd "$(dirname "$0")/.."

usage() {
    sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'
}
build=1
out=
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "build-packages.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
        *)
            [ -z "$out" ] || { echo "build-packages.sh: one OUT_DIR only ('$out', then '$1')" >&2; exit 2; }
            out="$1"; shift ;;
    esac
done
out="${out:-target/packages}"
mkdir -p "$out"

for tool in cargo-deb cargo-generate-rpm dpkg-deb rpm rpm2cpio cpio readelf file; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "build-packages.sh: $tool not found (see the header of this script)" >&2
        exit 1
    }
done

# The shipped binaries: `cargo build --release --target <triple>` with one flag, glibc linked
# statically (packaging/target.sh says why). Both packagers map Cargo.toml's target/release/
# assets to target/<triple>/release/. install.sh and benches/bench.sh build the same way.
triple="$(bash packaging/target.sh)"
if [ "$build" = 1 ]; then
    rustflags="$(bash packaging/target.sh --rustflags)"
    RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --bin accel-container-runtime
    # The gRPC stack (feature `plugin`) for the device plugin, the NRI plugin and accel-ctk
    # (`accel-ctk pods` asks kubelet's PodResources), never for the runtime above: a feature is
    # the library's, so each binary gets it by being built in this command and not in that one.
    RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --features plugin --bin accel-device-plugin --bin accel-nri-plugin --bin accel-ctk
    # The DRA driver (feature `dra`: the API client too), for the packages and its image
    # (packaging/build-images.sh builds the images of these same commands).
    RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --features dra --bin accel-dra-driver
    # The exporter (feature `exporter`), for the packages.
    RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --features exporter --bin accel-exporter
fi
for b in accel-container-runtime accel-ctk accel-device-plugin accel-nri-plugin accel-dra-driver accel-exporter; do
    bin="target/$triple/release/$b"
    [ -x "$bin" ] || { echo "build-packages.sh: $bin not built" >&2; exit 1; }
    # The shipped build is static: it has no program interpreter (PT_INTERP).
    if LC_ALL=C readelf -l "$bin" | grep -q 'Requesting program interpreter'; then
        echo "build-packages.sh: $bin is dynamically linked" >&2
        exit 1
    fi
    # file(1) as a second reader: these are what nodes with a glibc older than the build
    # machine's run (and what the image recipes copy onto nodes, issue 22).
    kind="$(LC_ALL=C file -b "$bin")"
    case "$kind" in
        *"dynamically linked"*|*interpreter*) echo "build-packages.sh: $bin: $kind" >&2; exit 1 ;;
        *"static-pie linked"*|*"statically linked"*) ;;
        *) echo "build-packages.sh: $bin: file(1) says neither static nor dynamic: $kind" >&2; exit 1 ;;
    esac
done
# Every accel-ctk subcommand the README and docs/ name is in the packaged accel-ctk (one
# built without a feature lacks the subcommands behind it): each command as the docs write it,
# in backquotes or at the start of a line of a code block, not a sentence's "accel-ctk with".
for sub in $(grep -ohE '(`|^ *(sudo )?)accel-ctk [a-z][a-z-]+' README.md docs/*.md | awk '{print $NF}' | sort -u); do
    "target/$triple/release/accel-ctk" "$sub" --help >/dev/null 2>&1 ||
        { echo "build-packages.sh: the docs name \`accel-ctk $sub\`, which the packaged accel-ctk lacks" >&2; exit 1; }
done
rm -f "$out"/*.deb "$out"/*.rpm
cargo deb --no-build --target "$triple" --output "$out/"
cargo generate-rpm --target "$triple" --output "$out/"
deb="$(ls "$out"/*.deb)"
rpm="$(ls "$out"/*.rpm)"

fail=0
bad() {
    echo "build-packages.sh: $*" >&2
    fail=1
}

# Files both packages must ship (the config and the profiles: see Cargo.toml's metadata).
expected="/usr/bin/accel-container-runtime
/usr/bin/accel-ctk
/usr/bin/accel-device-plugin
/usr/bin/accel-dra-driver
/usr/bin/accel-exporter
/usr/bin/accel-nri-plugin
/lib/systemd/system/accel-device-plugin.service
/lib/systemd/system/accel-dra-driver.service
/lib/systemd/system/accel-exporter.service
/lib/systemd/system/accel-nri-plugin.service
/lib/systemd/system/accel-ctk-checkpoint.service
/etc/accel-container-runtime/config.toml
/usr/share/accel-container-runtime/engines.sh
/etc/logrotate.d/accel-container-runtime
/usr/share/doc/accel-container-runtime/README.md
/usr/share/doc/accel-container-runtime/examples/daemon.json
/usr/share/doc/accel-container-runtime/examples/containerd-config-v2.toml
/usr/share/doc/accel-container-runtime/examples/containerd-config-v3.toml
/usr/share/doc/accel-container-runtime/examples/crio-99-accel.conf"
for p in config/profiles/*.toml; do
    case "$(basename "$p")" in
        nvidia.toml|enflame.toml) ;;
        *) expected="$expected
/etc/accel-container-runtime/profiles.d/$(basename "$p")" ;;
    esac
done

deb_files="$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|')"
deb_info="$(dpkg-deb -I "$deb")"
rpm_files="$(rpm -qlp "$rpm" 2>/dev/null)"
rpm_config="$(rpm -qp --qf '[%{FILENAMES} %{FILEFLAGS:fflags}\n]' "$rpm" 2>/dev/null)"
rpm_scripts="$(rpm -qp --scripts "$rpm" 2>/dev/null)"

echo "$expected" | while read -r f; do
    echo "$deb_files" | grep -qx "$f" || echo "missing in .deb: $f"
    echo "$rpm_files" | grep -qx "$f" || echo "missing in .rpm: $f"
done >"$out/missing.txt"
if [ -s "$out/missing.txt" ]; then
    bad "$(cat "$out/missing.txt")"
fi
rm -f "$out/missing.txt"

# The binaries inside both packages are the static ones (a packager that fell back to
# target/release would ship a dynamic build without saying so).
unpacked="$out/unpacked"
rm -rf "$unpacked" && mkdir -p "$unpacked/deb" "$unpacked/rpm"
dpkg-deb -x "$deb" "$unpacked/deb"
rpm_abs="$(cd "$(dirname "$rpm")" && pwd)/$(basename "$rpm")"
(cd "$unpacked/rpm" && rpm2cpio "$rpm_abs" | cpio -idm --quiet)
for f in "$unpacked"/deb/usr/bin/accel-* "$unpacked"/rpm/usr/bin/accel-*; do
    if LC_ALL=C readelf -l "$f" | grep -q 'Requesting program interpreter'; then
        bad "${f#"$unpacked"/}: dynamically linked"
    fi
done
rm -rf "$unpacked"

# Operator-editable files survive upgrades: dpkg conffiles, rpm %config(noreplace) ("cn").
conffiles="$(dpkg-deb -f "$deb" Package >/dev/null && dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles 2>/dev/null || true)"
for f in $(echo "$expected" | grep '^/etc/'); do
    echo "$conffiles" | grep -qx "$f" || bad ".deb: $f is not a conffile"
    echo "$rpm_config" | grep -qx "$f cn" || bad ".rpm: $f is not %config(noreplace)"
done
# The binaries are static, so cargo-deb's $auto finds no library to depend on: the runtime's
# one dependency, a low-level runtime, is named in Cargo.toml.
depends="$(dpkg-deb -f "$deb" Depends)"
echo "$depends" | grep -q runc || bad ".deb: Depends: '$depends' does not name runc"
for s in postinst prerm postrm; do
    echo "$deb_info" | grep -q " $s$\| $s " || bad ".deb: no $s maintainer script"
done
echo "$rpm_scripts" | grep -q "^postinstall scriptlet" || bad ".rpm: no %post"
echo "$rpm_scripts" | grep -q "^preuninstall scriptlet" || bad ".rpm: no %preun"
echo "$rpm_scripts" | grep -q "accel_configure_engines" || bad ".rpm: %post does not configure engines"

if [ "$fail" = 0 ]; then
    echo "build-packages.sh: ok: $deb $rpm" >&2
fi
exit "$fail"
