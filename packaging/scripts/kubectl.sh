#!/usr/bin/env bash
# Prints the path of a kubectl 1.36 taken from Debian sid's `kubectl` package, fetching it once
# into a cache: what .ci/run and tests/manifests.rs render the Kustomize overlays of
# packaging/kubernetes/ with (`kubectl kustomize`). Never a kubectl found on PATH: which
# kustomize renders the overlays is part of what is tested.
#
#   bash packaging/scripts/kubectl.sh        (stdout: the kubectl's path, nothing else)
#
# The chain of trust is apt's: sid's InRelease checked with gpgv against the machine's
# debian-archive-keyring, the Packages index fetched by its SHA256 from there (by-hash, so a
# mirror half way through an update cannot mix two), the .deb checked against the index's
# SHA256, unpacked with `dpkg-deb -x` (no maintainer script runs, nothing lands in /usr) and the
# binary asked its version. InRelease's Valid-Until is not enforced: a mirror that stopped
# updating still serves the package its signature names.
#
# Environment: ACCEL_KUBECTL_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/accel-kubectl),
# ACCEL_DEBIAN_MIRROR (default http://deb.debian.org/debian). Needs curl, gpgv, xz, dpkg-deb
# and the debian-archive-keyring package. A cached kubectl of the right minor version is used
# without asking the network; sid moving past 1.36 fails here, saying so, until the minor
# below is changed.
set -euo pipefail

minor=36
case "${1:-}" in
    "") ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "kubectl.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
esac

cache="${ACCEL_KUBECTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/accel-kubectl}"
mirror="${ACCEL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

fail() {
    echo "kubectl.sh: $*" >&2
    exit 1
}

# "1 36" for a kubectl 1.36.x, from its own JSON (clientVersion's fields come first).
client_minor() {
    "$1" version --client -o json 2>/dev/null |
        awk -F'"' '$2 == "major" && !m { m = $4 } $2 == "minor" && !n { n = $4 } END { print m, n }'
}

for k in "$cache"/*/usr/bin/kubectl; do
    if [ -x "$k" ] && [ "$(client_minor "$k")" = "1 $minor" ]; then
        echo "$k"
        exit 0
    fi
done

for tool in curl gpgv xz dpkg-deb dpkg sha256sum; do
    command -v "$tool" >/dev/null || fail "$tool not found (see --help)"
done
[ -r "$keyring" ] || fail "$keyring not found (Debian's debian-archive-keyring package)"
arch="$(dpkg --print-architecture)"

mkdir -p "$cache"
work="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
get() {
    curl -fsSL --retry 3 -o "$2" "$mirror/$1" || fail "cannot download $mirror/$1"
}
# The hex SHA256 of $2 in $1 (a verified file), or nothing.
sha_of() {
    awk -v want="$2" '/^SHA256:/ { s = 1; next } /^[^ ]/ { s = 0 } s && $3 == want { print $1; exit }' "$1"
}

get dists/sid/InRelease "$work/InRelease"
gpgv --keyring "$keyring" --output "$work/Release" "$work/InRelease" 2>"$work/gpgv.log" ||
    fail "sid's InRelease does not verify against $keyring: $(tail -1 "$work/gpgv.log")"
index="main/binary-$arch/Packages.xz"
index_sha="$(sha_of "$work/Release" "$index")"
[ -n "$index_sha" ] || fail "sid's Release lists no $index"
get "dists/sid/main/binary-$arch/by-hash/SHA256/$index_sha" "$work/Packages.xz"
echo "$index_sha  $work/Packages.xz" | sha256sum -c --quiet - >/dev/null 2>&1 ||
    fail "$index does not match the SHA256 in sid's Release"

# The kubectl stanza: Version, Filename, SHA256.
# awk reads to the end: leaving early would kill xz with SIGPIPE, and pipefail would end the script.
stanza="$(xz -dc "$work/Packages.xz" | awk 'BEGIN { RS = "" } !found && /(^|\n)Package: kubectl\n/ { print; found = 1 }')"
field() { awk -v k="$1: " 'index($0, k) == 1 { print substr($0, length(k) + 1); exit }' <<<"$stanza"; }
version="$(field Version)"
filename="$(field Filename)"
deb_sha="$(field SHA256)"
[ -n "$version" ] && [ -n "$filename" ] && [ -n "$deb_sha" ] ||
    fail "sid's $index has no kubectl package"
case "$version" in
    "1.$minor".*) ;;
    *) fail "sid's kubectl is $version, not 1.$minor (change minor= in $0 to move on)" ;;
esac
case "$filename" in
    pool/*.deb) ;;
    *) fail "unexpected Filename for kubectl: $filename" ;;
esac
get "$filename" "$work/kubectl.deb"
echo "$deb_sha  $work/kubectl.deb" | sha256sum -c --quiet - >/dev/null 2>&1 ||
    fail "$filename does not match the SHA256 in sid's Packages"
dpkg-deb -x "$work/kubectl.deb" "$work/root"
[ "$(client_minor "$work/root/usr/bin/kubectl")" = "1 $minor" ] ||
    fail "the kubectl in $filename does not say it is 1.$minor"

# Renamed into place whole: a run cut short leaves only the .fetch directory, removed above.
dest="$cache/$version"
rm -rf "$dest"
mv "$work/root" "$dest"
echo "$dest/usr/bin/kubectl"
