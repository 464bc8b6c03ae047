#!/usr/bin/env bash
# Build the images the Kubernetes overlays run (packaging/kubernetes/) from the static release
# binaries, without docker and without a base image: each is one layer on an empty root
# (`FROM scratch`), written as an OCI image archive (`skopeo copy oci-archive:` reads it;
# docker's manifest.json is beside the OCI index for `docker load`).
#
#   packaging/build-images.sh [OPTIONS] [IMAGE...]
#
# IMAGE (default: all four):
#   accel-container-runtime  the installer: the runtime and accel-ctk in
#                            /opt/accel-container-runtime/bin, the config and the profiles in
#                            /opt/accel-container-runtime/etc, the entrypoint
#                            (packaging/container/entrypoint.sh) and a shell: Debian's
#                            busybox-static (/bin/busybox, itself a static binary, and its applet
#                            links in /bin), for the entrypoint and the checkpoint installer
#   accel-device-plugin      /usr/bin/accel-device-plugin and /usr/bin/accel-nri-plugin (the
#                            NRI plugin's DaemonSet runs the second), nothing else
#   accel-dra-driver         /usr/bin/accel-dra-driver and nothing else
#   accel-exporter           /usr/bin/accel-exporter and nothing else (vendor CLIs run
#                            chrooted in the host's tree, with the host's libraries)
# Each is REGISTRY/IMAGE:VERSION, VERSION the crate's (Cargo.toml), in OUT/IMAGE.tar.
#
# Options:
#   --no-build         package the binaries already in target/<triple>/release
#   --bin-dir DIR      package the binaries in DIR (implies --no-build)
#   --out DIR          where the archives go (default: target/images)
#   --registry REG     (default: ghcr.io/accel-container-runtime)
#   --push             push each image (skopeo copy, else docker load and docker push), then
#                      --set-images
#   --set-images       only name REG/IMAGE:VERSION in packaging/kubernetes/base/kustomization.yaml,
#                      the one list of images the overlays use (as `kustomize edit set image`
#                      would; `git diff` shows it); builds nothing
#   --allow-dynamic    package dynamically linked binaries too: tests/manifests.rs, whose test
#                      build is dynamic, adds their libraries to the unpacked image (an image of
#                      a dynamic build does not start on a node)
#
# The binaries are built as packaging/build-packages.sh builds them (packaging/target.sh: glibc
# linked statically, so they run on nodes of any glibc), checked to have no program
# interpreter, and stripped in the image. The archive is reproducible: entries sorted, owned by
# root, dated SOURCE_DATE_EPOCH (default: the last commit's time). Needs GNU tar, gzip,
# sha256sum, readelf and strip (binutils); ACCEL_BUSYBOX names the busybox to copy (default
# /bin/busybox, from Debian's busybox-static; GPL-2.0, its source is Debian's busybox package).
set -euo pipefail
cd "$(dirname "$0")/.."
# The images' directories are made here: 0755 whoever runs this.
umask 022

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}
bad_usage() {
    echo "build-images.sh: $*" >&2
    exit 2
}
fail() {
    echo "build-images.sh: $*" >&2
    exit 1
}

all_images="accel-container-runtime accel-device-plugin accel-dra-driver accel-exporter"
build=1
bin_dir=
out=target/images
registry=ghcr.io/accel-container-runtime
push=0
set_only=0
allow_dynamic=0
images=
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --no-build) build=0; shift ;;
        --bin-dir|--out|--registry)
            [ $# -ge 2 ] || bad_usage "'$1' needs a value"
            case "$1" in
                --bin-dir) bin_dir="$2"; build=0 ;;
                --out) out="$2" ;;
                --registry) registry="$2" ;;
            esac
            shift 2 ;;
        --push) push=1; shift ;;
        --set-images) set_only=1; shift ;;
        --allow-dynamic) allow_dynamic=1; shift ;;
        -*) bad_usage "unknown option '$1' (--help lists them)" ;;
        *)
            case " $all_images " in
                *" $1 "*) images="$images $1" ;;
                *) bad_usage "unknown image '$1' (one of: $all_images)" ;;
            esac
            shift ;;
    esac
done
images="${images:-$all_images}"
# A registry host (with an optional port) and path, lower case, as image references allow.
if ! grep -Eqx '[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*' <<<"$registry"; then
    bad_usage "'$registry' is not a registry and path (e.g. registry.example.com/accel)"
fi
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
[ -n "$version" ] || fail "no version in Cargo.toml"
kustomization=packaging/kubernetes/base/kustomization.yaml

# Names REG/IMAGE:VERSION for each of $images in the images list of $kustomization, in the
# form kustomize writes it (`- name: IMAGE`, then `  newName:` and `  newTag:`).
set_images() {
    awk -v reg="$registry" -v tag="$version" -v names=" $images " '
        /^- name: / { cur = (index(names, " " $3 " ") ? $3 : ""); print; next }
        /^[^ ]/ { cur = "" }
        cur != "" && /^  newName: / { print "  newName: " reg "/" cur; next }
        cur != "" && /^  newTag: / { print "  newTag: " tag; next }
        { print }' "$kustomization" >"$kustomization.new"
    for image in $images; do
        if ! grep -A2 -x -- "- name: $image" "$kustomization.new" | grep -qx "  newName: $registry/$image" ||
            ! grep -A2 -x -- "- name: $image" "$kustomization.new" | grep -qx "  newTag: $version"; then
            rm -f "$kustomization.new"
            fail "$kustomization has no entry '- name: $image' with newName and newTag under images:"
        fi
    done
    mv -f "$kustomization.new" "$kustomization"
    echo "build-images.sh: $kustomization names $registry/IMAGE:$version for:$images" >&2
}
if [ "$set_only" = 1 ]; then
    set_images
    exit 0
fi

for tool in tar gzip sha256sum readelf strip; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool not found (see --help)"
done
tar --version 2>/dev/null | grep -q 'GNU tar' || fail "tar is not GNU tar (--sort and --mtime are needed)"

triple="$(bash packaging/target.sh)"
case "${triple%%-*}" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) fail "no OCI architecture for the target $triple" ;;
esac
needs() {
    case " $images " in *" $1 "*) return 0 ;; esac
    return 1
}
# The commands packaging/build-packages.sh runs for the packages (tests/packaging.rs keeps them
# the same), for the images asked for.
if [ "$build" = 1 ]; then
    rustflags="$(bash packaging/target.sh --rustflags)"
    if needs accel-container-runtime; then
        RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --bin accel-container-runtime
    fi
    # accel-ctk (in the runtime's image) is built with the device plugin and the NRI plugin,
    # as for the packages.
    if needs accel-container-runtime || needs accel-device-plugin; then
        RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --features plugin --bin accel-device-plugin --bin accel-nri-plugin --bin accel-ctk
    fi
    if needs accel-dra-driver; then
        RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --features dra --bin accel-dra-driver
    fi
    if needs accel-exporter; then
        RUSTFLAGS="$rustflags" cargo build --release --locked --target "$triple" --features exporter --bin accel-exporter
    fi
fi
bin_dir="${bin_dir:-target/$triple/release}"

epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
busybox="${ACCEL_BUSYBOX:-/bin/busybox}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

interpreter() {
    LC_ALL=C readelf -l "$1" 2>/dev/null | grep -q 'Requesting program interpreter'
}
# Copies the executable $1 to $2 in the image root, mode 0755, stripped.
put_binary() {
    [ -f "$1" ] && [ -x "$1" ] || fail "$1: not built (build it, or drop --no-build and --bin-dir)"
    LC_ALL=C readelf -h "$1" >/dev/null 2>&1 || fail "$1: not an ELF executable"
    if interpreter "$1" && [ "$allow_dynamic" = 0 ]; then
        fail "$1 is dynamically linked: an image has no libc (build it as packaging/target.sh says)"
    fi
    mkdir -p "$(dirname "$2")"
    cp "$1" "$2"
    strip "$2"
    chmod 0755 "$2"
}
put_file() {
    mkdir -p "$(dirname "$2")"
    cp "$1" "$2"
    chmod "$3" "$2"
}

# A JSON array of strings (the arguments are this script's own: no quoting needed).
json_array() {
    local sep="" out="["
    for a in "$@"; do
        out="$out$sep\"$a\""
        sep=","
    done
    echo "$out]"
}

# Writes $1 (a file) under blobs/ of the layout $2, named by its SHA256; prints the digest.
add_blob() {
    local sum
    sum="$(sha256sum "$1" | cut -d' ' -f1)"
    mv "$1" "$2/blobs/sha256/$sum"
    echo "sha256:$sum"
}
size_of() {
    stat -c %s "$1"
}

# The image $1 from the root $2, entrypoint $3 (a JSON array), cmd $4 (a JSON array or null).
write_image() {
    local image="$1" root="$2" entrypoint="$3" cmd="$4" history="$5"
    local ref="$registry/$image:$version" layout="$work/$image.layout"
    mkdir -p "$layout/blobs/sha256"
    chmod 0755 "$root"
    # Reproducible: sorted names, root-owned, one date; GNU format (no PAX times).
    tar --create --file="$work/layer.tar" --directory="$root" --format=gnu --sort=name \
        --owner=0 --group=0 --numeric-owner --mtime="@$epoch" .
    local diff_id layer layer_size config config_size manifest manifest_size
    diff_id="sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
    gzip -n -6 <"$work/layer.tar" >"$work/layer.tar.gz"
    rm -f "$work/layer.tar"
    layer_size="$(size_of "$work/layer.tar.gz")"
    layer="$(add_blob "$work/layer.tar.gz" "$layout")"

    printf '{"created":"%s","architecture":"%s","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Entrypoint":%s,"Cmd":%s,"Labels":{"org.opencontainers.image.title":"%s","org.opencontainers.image.version":"%s"}},"rootfs":{"type":"layers","diff_ids":["%s"]},"history":[{"created":"%s","created_by":"%s"}]}' \
        "$created" "$arch" "$entrypoint" "$cmd" "$image" "$version" "$diff_id" "$created" "$history" \
        >"$work/config.json"
    config_size="$(size_of "$work/config.json")"
    config="$(add_blob "$work/config.json" "$layout")"

    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"%s","size":%s}]}' \
        "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
    manifest_size="$(size_of "$work/manifest.json")"
    manifest="$(add_blob "$work/manifest.json" "$layout")"

    # The OCI layout (index.json names the image as containerd's export does: the full
    # reference for containerd, the tag for skopeo) and docker's own manifest.json beside it,
    # which docker load reads where it does not read the OCI index.
    printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$manifest" "$manifest_size" "$ref" "$version" >"$layout/index.json"
    printf '[{"Config":"blobs/sha256/%s","RepoTags":["%s"],"Layers":["blobs/sha256/%s"]}]' \
        "${config#sha256:}" "$ref" "${layer#sha256:}" >"$layout/manifest.json"
    tar --create --file="$out/$image.tar.new" --directory="$layout" --format=gnu --sort=name \
        --owner=0 --group=0 --numeric-owner --mtime="@$epoch" oci-layout index.json manifest.json blobs
    mv -f "$out/$image.tar.new" "$out/$image.tar"
    echo "build-images.sh: $out/$image.tar: $ref ($manifest)" >&2
}

for image in $images; do
    root="$work/$image.root"
    mkdir -p "$root"
    case "$image" in
        accel-container-runtime)
            for b in accel-container-runtime accel-ctk; do
                put_binary "$bin_dir/$b" "$root/opt/accel-container-runtime/bin/$b"
            done
            put_file config/config.toml "$root/opt/accel-container-runtime/etc/config.toml" 0644
            for p in config/profiles/*.toml; do
                put_file "$p" "$root/opt/accel-container-runtime/etc/profiles/$(basename "$p")" 0644
            done
            put_file packaging/container/entrypoint.sh "$root/usr/local/bin/accel-entrypoint" 0755
            [ -x "$busybox" ] || fail "$busybox not found (Debian's busybox-static package has it; or set ACCEL_BUSYBOX)"
            ! interpreter "$busybox" || fail "$busybox is dynamically linked (Debian's busybox-static is not)"
            put_file "$busybox" "$root/bin/busybox" 0755
            # Read whole (no early exit into a SIGPIPE); `[` and `[[` are applets, not globs.
            while read -r applet; do
                [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
            done < <("$busybox" --list)
            busybox_says="$("$busybox" --help 2>&1 | awk 'NR == 1' | tr -d '"\\')"
            write_image "$image" "$root" "$(json_array /usr/local/bin/accel-entrypoint)" \
                "$(json_array install)" "packaging/build-images.sh: /bin/busybox is $busybox_says"
            ;;
        accel-device-plugin|accel-dra-driver|accel-exporter)
            put_binary "$bin_dir/$image" "$root/usr/bin/$image"
            # The NRI plugin rides in the device plugin's image: the same feature's build, and
            # one image fewer to publish and pull.
            if [ "$image" = accel-device-plugin ]; then
                put_binary "$bin_dir/accel-nri-plugin" "$root/usr/bin/accel-nri-plugin"
            fi
            write_image "$image" "$root" "$(json_array "/usr/bin/$image")" null \
                "packaging/build-images.sh"
            ;;
    esac
done

if [ "$push" = 1 ]; then
    for image in $images; do
        ref="$registry/$image:$version"
        if command -v skopeo >/dev/null 2>&1; then
            skopeo copy "oci-archive:$out/$image.tar" "docker://$ref"
        elif command -v docker >/dev/null 2>&1; then
            docker load -i "$out/$image.tar"
            docker push "$ref"
        else
            fail "--push needs skopeo or docker"
        fi
    done
    set_images
fi
