#!/usr/bin/env bash
# OCI runtime conformance (issue 5): runs opencontainers/runtime-tools' validation programs
# once with RUNTIME=runc and once with RUNTIME=<the shim> (configured with that same runc as
# its low-level runtime), then compares, program by program, the TAP verdicts, the error lines
# of the YAML diagnostics, stderr and the exit code (ids and numbers normalized). They must match:
# the shim has to be invisible to the conformance suite.
#
# Usage (as root):
#   tests/conformance.sh /path/to/runtime-tools-checkout [OUT_DIR]
# Environment:
#   RUNTIME_TOOLS  the checkout, instead of the first argument
#   SHIM           the shim binary (default: target/debug/accel-container-runtime, built with
#                  `cargo build` when missing)
#   LOW_RUNTIME    the low-level runtime for both runs (default: runc from PATH)
#   GO             a Go >= 1.21 toolchain (default: `go` in PATH, else /usr/lib/go-1.2*/bin/go;
#                  Debian 12: `apt-get install -t bookworm-backports golang-1.22-go`)
#   TESTS          space-separated names under validation/ (default: all)
#   TEST_TIMEOUT   seconds per validation program (default 120)
#
# Skips (exit 0, one line saying why) when the checkout or a new enough Go is missing: this
# is not part of `cargo test`/CI, which has neither. Exit 1 when the results differ.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
rt="${RUNTIME_TOOLS:-${1:-}}"
out="${2:-$(mktemp -d /tmp/accel-conformance.XXXXXX)}"
timeout_s="${TEST_TIMEOUT:-120}"

skip() { echo "conformance: SKIPPED: $*" >&2; exit 0; }

[ "$(id -u)" = 0 ] || { echo "conformance: needs root (runc creates containers)" >&2; exit 2; }
[ -n "$rt" ] || skip "no runtime-tools checkout given (argument 1 or RUNTIME_TOOLS)"
[ -f "$rt/validation/util/test.go" ] && [ -d "$rt/vendor" ] ||
    skip "$rt is not a runtime-tools source checkout with vendor/"
rt="$(cd "$rt" && pwd)"

go="${GO:-}"
if [ -z "$go" ]; then
    for g in "$(command -v go || true)" $(ls -d /usr/lib/go-1.2*/bin/go 2>/dev/null | sort -V -r); do
        [ -n "$g" ] || continue
        minor="$("$g" env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p')"
        if [ -n "$minor" ] && [ "$minor" -ge 21 ]; then go="$g"; break; fi
    done
fi
[ -n "$go" ] || skip "no Go >= 1.21 (runtime-tools' go.mod and its vendored moby/sys/capability need it; Debian 12's golang-go is 1.19: install golang-1.22-go from bookworm-backports)"

low="${LOW_RUNTIME:-$(command -v runc || true)}"
[ -x "$low" ] || { echo "conformance: no runc (apt-get install runc)" >&2; exit 2; }

shim="${SHIM:-$repo/target/debug/accel-container-runtime}"
if [ ! -x "$shim" ]; then
    (cd "$repo" && cargo build --quiet --bin accel-container-runtime)
fi

# Build the validation programs and runtimetest from the vendored sources (no module proxy).
echo "conformance: building runtime-tools validation programs with $("$go" version)" >&2
(
    cd "$rt"
    export PATH="$(dirname "$go"):$PATH" GOFLAGS=-mod=vendor GOTOOLCHAIN=local
    make -s runtimetest validation-executables >/dev/null
)

mkdir -p "$out/runc" "$out/shim"
cat >"$out/shim.toml" <<EOF
low-level-runtime = "$low"
log-file = "$out/shim.log"
log-level = "debug"
profiles-dir = "$out/profiles.d"
EOF
mkdir -p "$out/profiles.d"

if [ -n "${TESTS:-}" ]; then
    tests=""
    for t in $TESTS; do tests="$tests validation/$t/$t.t"; done
else
    tests="$(cd "$rt" && ls validation/*/*.t | sort)"
fi

run_one() { # name runtime program file-stem
    local rc=0
    (cd "$rt" && RUNTIME="$2" ACCEL_CONTAINER_RUNTIME_CONFIG="$out/shim.toml" \
        timeout "$timeout_s" "./$3") >"$out/$1/$4.tap" 2>"$out/$1/$4.err" || rc=$?
    echo "$rc" >"$out/$1/$4.rc"
}

run_all() { # name runtime
    local t
    for t in $tests; do run_one "$1" "$2" "$t" "$(basename "$t" .t)"; done
}

# The verdict of every TAP line, "ok"/"not ok" and the description with any SKIP/TODO
# directive, as a sorted list, plus the plan line. Test numbers are dropped and the list
# sorted because runtimetest walks Go maps (default devices, symlinks, mounts), whose order
# Go randomizes on every run; YAML diagnostics (container ids, temp paths, times) are dropped.
verdicts() {
    { grep -E '^(not )?ok ' "$1" || true; } | sed -E 's/^((not )?ok) [0-9]+/\1/; s/[[:space:]]+$//' | LC_ALL=C sort
    grep -E '^1\.\.[0-9]+' "$1" || true
}

# Ids, times, pids and temp names become placeholders; the rest of a message must match.
normalize() {
    sed -E 's/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/UUID/g; s/[0-9]+/N/g'
}

# What must be the same for a program with both runtimes: its verdicts, the "error" lines of
# its YAML diagnostics (some programs report a failure only there, with no test line), and its
# stderr (runc's messages pass through the shim unchanged).
evidence() { # name stem
    verdicts "$out/$1/$2.tap"
    echo "--- diagnostics"
    { grep '"error"' "$out/$1/$2.tap" || true; } | normalize | LC_ALL=C sort
    echo "--- stderr"
    normalize <"$out/$1/$2.err"
    echo "--- exit $(cat "$out/$1/$2.rc")"
}

# Totals over the verdicts in the table (the last run of each program).
declare -A ok_n=([runc]=0 [shim]=0) notok_n=([runc]=0 [shim]=0) skip_n=([runc]=0 [shim]=0)
tally() { # name verdicts
    ok_n[$1]=$((ok_n[$1] + $(count "$2" ok)))
    notok_n[$1]=$((notok_n[$1] + $(count "$2" 'not ok')))
    skip_n[$1]=$((skip_n[$1] + $(printf '%s\n' "$2" | grep -ciE '^(not )?ok .*# skip' || true)))
}
summary() { echo "${ok_n[$1]} ok, ${notok_n[$1]} not ok (${skip_n[$1]} of the ok SKIP)"; }

# Some validation programs run a container without a mount namespace, so runc's mounts under
# the program's temp bundle (/tmp/ocitest*) stay on the host. Count them per runtime (one
# more thing that must match) and detach them, so the second run starts from the same host.
suite_mounts() { grep -c ' /tmp/ocitest' /proc/self/mountinfo || true; }
detach_suite_mounts() {
    local m
    for m in $(awk '$5 ~ "^/tmp/ocitest" {print $5}' /proc/self/mountinfo | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
}
detach_suite_mounts

start=$(date +%s)
run_all runc "$low"
mid=$(date +%s)
left_runc=$(suite_mounts)
detach_suite_mounts
mid2=$(date +%s)
run_all shim "$shim"
end=$(date +%s)
left_shim=$(suite_mounts)
detach_suite_mounts

diffs=0
table="$out/results.md"
{
    echo "| program | runc | shim | same |"
    echo "|---|---|---|---|"
} >"$table"
count() { printf '%s\n' "$1" | grep -cE "^$2 " || true; }
cell() { echo "$(count "$1" ok) ok / $(count "$1" 'not ok') not ok, exit $2"; }
retries="${RETRIES:-3}"
flaky=0
for t in $tests; do
    base="$(basename "$t" .t)"
    stem="$base"
    a="$(evidence runc "$base")"
    b="$(evidence shim "$base")"
    ra="$(cat "$out/runc/$base.rc")"
    rb="$(cat "$out/shim/$base.rc")"
    first_a="$a" first_ra="$ra" first_b="$b" first_rb="$rb"
    same=yes
    # A few validation programs race the container (e.g. pidfile kills a `true` that may
    # already have exited), so their verdict depends on timing with runc alone. A program
    # that differs is run again with both runtimes, back to back; the table says so.
    n=0
    while { [ "$a" != "$b" ] || [ "$ra" != "$rb" ]; } && [ "$n" -lt "$retries" ]; do
        n=$((n + 1))
        stem="$base.retry$n"
        run_one runc "$low" "$t" "$stem"
        run_one shim "$shim" "$t" "$stem"
        a="$(evidence runc "$stem")"
        b="$(evidence shim "$stem")"
        ra="$(cat "$out/runc/$stem.rc")"
        rb="$(cat "$out/shim/$stem.rc")"
    done
    if [ "$n" -gt 0 ]; then
        diff <(echo "$first_a") <(echo "$first_b") >"$out/$base.first-run.diff" || true
        if [ "$a" = "$b" ] && [ "$ra" = "$rb" ]; then
            same="yes on retry $n (first run: runc $(cell "$first_a" "$first_ra"), shim $(cell "$first_b" "$first_rb"))"
            flaky=$((flaky + 1))
        else
            same=NO
            diffs=$((diffs + 1))
            diff <(echo "$a") <(echo "$b") >"$out/$base.diff" || true
        fi
    fi
    tally runc "$a"
    tally shim "$b"
    echo "| $base | $(cell "$a" "$ra") | $(cell "$b" "$rb") | $same |" >>"$table"
done

echo "conformance: runtime-tools $(cd "$rt" && cat VERSION 2>/dev/null), $(echo "$tests" | wc -w) programs"
echo "conformance: runc ($low, $("$low" --version | head -1)): $(summary runc), $((mid - start)) s, $left_runc mounts left on the host"
echo "conformance: shim ($shim -> runc): $(summary shim), $((end - mid2)) s, $left_shim mounts left on the host"
echo "conformance: per-program table: $table; TAP output: $out/{runc,shim}/"
if [ "$left_runc" != "$left_shim" ]; then
    echo "conformance: FAIL: the suite left $left_runc mounts with runc, $left_shim with the shim"
    exit 1
fi
if [ "$diffs" -ne 0 ]; then
    echo "conformance: FAIL: $diffs programs differ (see $out/*.diff)"
    exit 1
fi
echo "conformance: identical verdicts for every program ($flaky equal only on a retry, see the table)"
