#!/usr/bin/env bash
# Metadata: fs_mark creating 20,000 files of 4 KiB in one directory, one thread.
#   fs_mark -d DIR -n 20000 -s 4096 -t 1 -S 0 -L 1 -k
#     -n 20000 -s 4096  20,000 files of 4 KiB each (create + write + close per file)
#     -t 1              one thread: 1 client process, all files in one shared directory
#                       (fs_mark uses no subdirectories unless -D is given)
#     -S 0              no sync: measures create/write/close, i.e. metadata; synchronous
#                       writes are measured by bench/randwrite_fsync.sh and bench/sqlite.sh
#     -L 1              one iteration; -k keeps the files (no delete phase after the count)
# Figure: files/s. Both sides run on a freshly made ext4 (4 GiB image, loop-mounted, made
# anew for every run: ext4 creates after mass deletes are 5-15x slower and bimodal); the
# Spillway cluster's --dir (hence the servers' storage roots) lies inside that file system.
# After each mount a warm-up of 2,000 files in another directory is run and discarded.
# Target: >= 0.05x raw.
#
#   bench/fsmark.sh            (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK: see bench/lib.sh)
#   BENCH_FSMARK_FILES=20000
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

FILES="${BENCH_FSMARK_FILES:-20000}"
IMAGE="$BENCH_WORK/fsmark-ext4.img"
MNT="$BENCH_WORK/fsmark-mnt"

bench_init
BENCH_REMOVE+=("$MNT")
LOGS="$(mktemp -d)"
BENCH_REMOVE+=("$LOGS")

# fsmark DIR N: run fs_mark, print files/s. (fs_mark wants a -d path shorter than 40
# bytes: run it from the parent directory with a relative path.)
fsmark() {
    mkdir -p "$1"
    (cd "$(dirname "$1")" && fs_mark -d "$(basename "$1")" -n "$2" -s 4096 -t 1 -S 0 -L 1 -k \
        -l "$LOGS/fs_log.txt") >"$LOGS/out.txt" 2>&1 ||
        die "fs_mark failed in $1: $(cat "$LOGS/out.txt")"
    awk '/^FSUse%/ { getline; print $4; exit }' "$LOGS/out.txt"
}

# one_run LABEL: fresh ext4, (cluster), warm-up, measured run; sets RATE
one_run() {
    local label=$1 dir
    loop_mount_fresh "$IMAGE" "$MNT" 4G
    if [[ "$label" == raw ]]; then
        dir="$MNT"
    else
        bench_cluster_up "$MNT/cluster" 2G
        dir="$CLUSTER_MNT"
    fi
    fsmark "$dir/warmup" 2000 >/dev/null
    RATE="$(fsmark "$dir/bench" "$FILES")"
    if [[ "$label" != raw ]]; then
        bench_cluster_down "$MNT/cluster"
    fi
    loop_umount "$MNT"
    rm -f "$IMAGE"
}

# measure LABEL: BENCH_REPS runs; sets RATE_MED
measure() {
    local label=$1 rates=() rep
    for ((rep = 1; rep <= BENCH_REPS; rep++)); do
        one_run "$label"
        rates+=("$RATE")
        info "$label run $rep/$BENCH_REPS: $(fmt "$RATE" 0) files/s"
    done
    RATE_MED="$(fmt "$(median "${rates[@]}")" 0)"
    info "$label median: $RATE_MED files/s"
}

step "fsmark: $FILES files of 4 KiB in one directory, 1 thread, fresh ext4 per run"
measure raw
RAW_RATE=$RATE_MED

SW_RATE=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    step "fsmark: Spillway, 1 client, $BENCH_SERVERS servers (storage roots on the fresh ext4)"
    measure spillway
    SW_RATE=$RATE_MED
fi

report "fs_mark 4KiB creates" files/s "$RAW_RATE" "$SW_RATE" 0.05
