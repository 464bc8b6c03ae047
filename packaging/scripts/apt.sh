# Sourced by .ci/run and packaging/demo.sh: apt-get that waits for another apt or dpkg
# (unattended-upgrades, a second CI job) instead of failing at once.
#
#   . packaging/scripts/apt.sh; accel_apt_get update -q; accel_apt_get install -y -q PKG...
#
# apt's own `-o DPkg::Lock::Timeout=` makes install wait for dpkg's lock. `apt-get update`
# takes the lock of /var/lib/apt/lists instead, which that option does not cover in Debian
# 12's apt 2.6 (tried: it fails at once with "Could not get lock /var/lib/apt/lists/lock"),
# so an update that fails on a lock is tried again for as long. Any other failure fails.
# ACCEL_APT_LOCK_WAIT: seconds to wait (default 600); ACCEL_APT_RETRY_SECONDS: between tries (10).

accel_apt_get() {
    _wait="${ACCEL_APT_LOCK_WAIT:-600}"
    _start=$(date +%s)
    while :; do
        _err=$(mktemp)
        _rc=0
        apt-get -o DPkg::Lock::Timeout="$_wait" "$@" 2>"$_err" || _rc=$?
        cat "$_err" >&2
        if [ "$_rc" = 0 ]; then
            rm -f "$_err"
            return 0
        fi
        if grep -q "Could not get lock" "$_err" && [ $(($(date +%s) - _start)) -lt "$_wait" ]; then
            rm -f "$_err"
            echo "apt-get $1: another apt holds the lock; trying again in ${ACCEL_APT_RETRY_SECONDS:-10} s" >&2
            sleep "${ACCEL_APT_RETRY_SECONDS:-10}"
            continue
        fi
        rm -f "$_err"
        return "$_rc"
    done
}
