# shellcheck shell=bash
# Shared by bench/*.sh. Source it after `set -euo pipefail`.
#
# Environment (all optional):
#   BENCH_REPS=3          measured runs per side; the median is reported
#   BENCH_RAW_ONLY=1      measure the raw backing storage only (no Spillway cluster)
#   BENCH_WORK=DIR        scratch directory (default /var/tmp/spillway-bench); it must lie
#                         on the file system you want as "raw": the servers' storage roots
#                         are created under it, so raw and Spillway share the same disk
#   BENCH_RESULTS=FILE    append one result line per figure (bench/all.sh uses it)
#   BENCH_TUNABLES=FILE   a tunables file for the clusters' servers and mounts
#                         (`spillway cluster up --tunables`), to compare settings
#   BENCH_SERVERS=N       servers of the benchmarks' clusters (default 2)

# shellcheck source-path=SCRIPTDIR source=../scripts/lib/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../scripts/lib/common.sh"

BENCH_REPS="${BENCH_REPS:-3}"
BENCH_RAW_ONLY="${BENCH_RAW_ONLY:-0}"
BENCH_WORK="${BENCH_WORK:-/var/tmp/spillway-bench}"
BENCH_SERVERS="${BENCH_SERVERS:-2}"

# Directories the exit trap cleans: clusters to stop, loop mounts to unmount, paths to remove.
BENCH_CLUSTERS=()
BENCH_LOOPS=()
BENCH_REMOVE=()

bench_cleanup() {
    local rc=$?
    set +e
    local d
    for d in "${BENCH_CLUSTERS[@]}"; do cluster_down "$d"; done
    kill_run_processes
    for d in "${BENCH_LOOPS[@]}"; do loop_umount "$d"; done
    for d in "${BENCH_REMOVE[@]}"; do
        if [[ -n "$(mounts_under "$d")" ]]; then
            warn "not removing $d: something is still mounted under it"
        else
            rm -rf "$d"
        fi
    done
    rmdir "$BENCH_WORK" 2>/dev/null
    return "$rc"
}

bench_init() {
    require_root
    if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
        require_spillway
    fi
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
    mkdir -p "$BENCH_WORK"
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
}

# bench_cluster_up DIR CAPACITY: clean DIR, start 2 servers + mount, set CLUSTER_MNT.
bench_cluster_up() {
    local dir=$1 capacity=$2
    cluster_down "$dir"
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    BENCH_CLUSTERS+=("$dir")
    cluster_up "$dir" "$BENCH_SERVERS" "$capacity" ${BENCH_TUNABLES:+--tunables "$BENCH_TUNABLES"}
    info "cluster up: $BENCH_SERVERS servers under $dir/servers, mounted at $CLUSTER_MNT"
}

bench_cluster_down() {
    cluster_down "$1"
    rm -rf "$1"
}

# loop_mount_fresh IMAGE MNT SIZE: make a fresh ext4 file system in IMAGE and mount it.
# The loop device does direct I/O to its image, as a disk would: a buffered loop device
# caches every byte twice (its own file system's page cache and the image's) and
# copies it again in a kernel thread, which makes bandwidth figures measure the loop
# device (its kernel threads took twice the CPU of the copy being measured).
loop_mount_fresh() {
    local image=$1 mnt=$2 size=$3
    loop_umount "$mnt"
    rm -f "$image"
    mkdir -p "$(dirname "$image")" "$mnt"
    truncate -s "$size" "$image"
    mkfs.ext4 -F -q "$image"
    BENCH_LOOPS+=("$mnt")
    BENCH_REMOVE+=("$image")
    mount -o loop "$image" "$mnt"
    local dev
    dev=$(findmnt -rn -o SOURCE --mountpoint "$mnt")
    losetup --direct-io=on "$dev" || warn "$dev: no direct I/O to its image (figures will be noisier)"
    info "fresh ext4 ($size, $(findmnt -rn -o SOURCE --mountpoint "$mnt")) mounted at $mnt"
}

loop_umount() {
    local mnt=$1
    if is_mounted "$mnt" && umount "$mnt" 2>/dev/null; then
        return 0
    fi
    if [[ -n "$(mounts_under "$mnt")" ]]; then
        "${SWEEP[@]}" unmount "$mnt" || warn "could not unmount $mnt"
    fi
}

# fio_json FILE EXPR: evaluate a python expression over the fio JSON; `j` is jobs[0].
fio_json() {
    "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
j = d["jobs"][0]
print(eval(sys.argv[2]))' "$1" "$2"
}

# report FIGURE UNIT RAW SPILLWAY TARGET: print the comparison and record the result.
# RAW and SPILLWAY are "higher is better" figures; ratio = SPILLWAY / RAW.
report() {
    local figure=$1 unit=$2 raw=$3 sw=$4 target=$5 ratio verdict
    if [[ "$sw" == "-" ]]; then
        ratio="-"
        verdict="RAW-ONLY"
    else
        ratio="$(fmt "$(calc "$sw / $raw")" 3)"
        if "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$ratio" "$target"; then
            verdict=PASS
        else
            verdict=FAIL
        fi
    fi
    printf '\n%-28s raw %s %s | spillway %s %s | ratio %s (target >= %s) %s\n' \
        "$figure" "$raw" "$unit" "$sw" "$unit" "$ratio" "$target" "$verdict"
    if [[ -n "${BENCH_RESULTS:-}" ]]; then
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$figure" "$unit" "$raw" "$sw" "$ratio" "$target" "$verdict" \
            >>"$BENCH_RESULTS"
    fi
}

# sqlite_inserts_sql N FILE: N single-insert transactions ("BEGIN; INSERT; COMMIT;"),
# ~100-byte rows, into table t(id, name, value) (bench/sqlite.sh, bench/peers.sh).
sqlite_inserts_sql() {
    "$PY" - "$1" "$2" <<'PYEOF'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for i in range(n):
        f.write(f"BEGIN;\nINSERT INTO t(id, name, value) VALUES({i}, 'row-{i:08d}', '{'x' * 80}');\nCOMMIT;\n")
PYEOF
}

# The Python helper for process lists and CPU ticks (peers_table.py).
PEERS_HELPER="$SPILLWAY_REPO/bench/peers_table.py"

# cpu_ticks: utime + stime (all threads) of this run's Spillway processes ("-": none).
cpu_ticks() {
    local p
    read -r -a p <<<"$("$PY" "$PEERS_HELPER" pids tag "$SPILLWAY_RUN_TAG" spillway)"
    if [[ ${#p[@]} -eq 0 ]]; then
        echo -
    else
        "$PY" "$PEERS_HELPER" ticks "${p[@]}"
    fi
}

# cpu_seconds TICKS0 TICKS1 [PER]: CPU seconds between two cpu_ticks, divided by PER.
cpu_seconds() {
    if [[ "$1" == - || "$2" == - ]]; then
        echo -
    else
        fmt "$(calc "($2 - $1) / $(getconf CLK_TCK) / (${3:-1})")" 2
    fi
}
