# shellcheck shell=bash
# Helpers shared by scripts/*.sh and bench/*.sh. Source it; do not run it.
#
# Every process a script starts inherits SPILLWAY_RUN_TAG (unique per top-level run); the
# cleanup kills only processes carrying this run's tag, and unmounts only what lies under
# the run's own directories, so that it never touches another run on the same machine.

SPILLWAY_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SPILLWAY_BIN="${SPILLWAY_BIN:-$SPILLWAY_REPO/target/release/spillway}"
PY=/usr/bin/python3
SWEEP=("$PY" "$SPILLWAY_REPO/scripts/lib/sweep.py")
export SPILLWAY_REPO

if ! command -v cargo >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

if [[ -z "${SPILLWAY_RUN_TAG:-}" ]]; then
    SPILLWAY_RUN_TAG="$(basename "$0" .sh)-$$-$(date +%s)"
fi
export SPILLWAY_RUN_TAG

step() { printf '\n==> %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
warn() { printf '    WARNING: %s\n' "$*" >&2; }
die() {
    printf '\nERROR: %s\n' "$*" >&2
    exit 1
}

require_root() {
    [[ $EUID -eq 0 ]] || die "$(basename "$0") must run as root (FUSE mounts, loop devices, drop_caches)"
}

require_spillway() {
    [[ -x "$SPILLWAY_BIN" ]] ||
        die "no spillway binary at $SPILLWAY_BIN: run scripts/setup.sh (cargo build --release -p spillway-cli)"
}

spillway() { "$SPILLWAY_BIN" "$@"; }

# Run a command with a time limit; a hung FUSE call must not hang the script forever.
bounded() {
    local secs=$1
    shift
    timeout --kill-after=10 "$secs" "$@"
}

# is_mounted DIR: true when something is mounted exactly at DIR.
is_mounted() { findmnt -rn --mountpoint "$1" >/dev/null 2>&1; }

# mounts_under DIR: print mounts under DIR (nothing, status 0, when there are none).
mounts_under() { "${SWEEP[@]}" mounts "$1" || true; }

# cluster_up DIR SERVERS CAPACITY [extra args]: start a cluster, set CLUSTER_MNT.
CLUSTER_MNT=""
cluster_up() {
    local dir=$1 servers=$2 capacity=$3
    shift 3
    local out
    out="$(bounded 180 "$SPILLWAY_BIN" cluster up --dir "$dir" --servers "$servers" \
        --capacity "$capacity" "$@")" || die "spillway cluster up --dir $dir failed (logs: $dir/logs/)"
    CLUSTER_MNT="$(printf '%s\n' "$out" | awk 'NF { line = $0 } END { print line }')"
    [[ -n "$CLUSTER_MNT" && -d "$CLUSTER_MNT" ]] || CLUSTER_MNT="$dir/mnt"
    findmnt -rn --mountpoint "$CLUSTER_MNT" -o FSTYPE 2>/dev/null | grep -q '^fuse' ||
        die "spillway cluster up exited 0 but no FUSE file system is mounted at $CLUSTER_MNT"
}

# cluster_down DIR: stop the cluster; then make sure nothing of it is left mounted.
cluster_down() {
    local dir=$1
    [[ -n "$dir" && -d "$dir" ]] || return 0
    if [[ -x "$SPILLWAY_BIN" ]] && { [[ -e "$dir/instance.json" ]] || [[ -n "$(mounts_under "$dir")" ]]; }; then
        bounded 120 "$SPILLWAY_BIN" cluster down --dir "$dir" ||
            warn "spillway cluster down --dir $dir failed"
    fi
    if [[ -n "$(mounts_under "$dir")" ]]; then
        warn "mounts left under $dir after cluster down: $(mounts_under "$dir" | tr '\n' ' ')"
        "${SWEEP[@]}" unmount "$dir" || true
    fi
}

# kill_run_processes: stop every process this run started that is still alive.
kill_run_processes() { "${SWEEP[@]}" kill-tagged "$SPILLWAY_RUN_TAG" || true; }

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# median N...: median of numbers.
median() { "$PY" -c 'import sys, statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

# calc EXPR: evaluate an arithmetic expression with python (floats).
calc() { "$PY" -c "import sys; print(eval(sys.argv[1], {'__builtins__': {}}, {}))" "$1"; }

# fmt NUMBER DIGITS
fmt() { "$PY" -c 'import sys; print(f"{float(sys.argv[1]):.{int(sys.argv[2])}f}")' "$1" "$2"; }

# now: monotonic seconds as a float.
now() { "$PY" -c 'import time; print(time.monotonic())'; }
