#!/usr/bin/env bash
# Sequential bandwidth (issue 17): fio, 1 MiB blocks, psync.
#   write     1 job, SIZE, buffered, end_fsync=1 (on the servers' storage when fio stops)
#   writers4  4 jobs x SIZE/4, end_fsync=1, group_reporting (N ranks checkpointing)
#   read      cold: caches dropped first (page cache of the mount and of the servers' disk)
# Raw = the same fio in a directory of the file system that holds the servers' storage roots.
# Raw with O_DIRECT (1 writer, then 4) is printed too, as the device's own pace: buffered raw
# depends on how the kernel writes back dirty pages that day, and Spillway's servers write
# streams with O_DIRECT (docs/data-plane.md, "Streaming writes").
# Beside each Spillway write: CPU seconds per GiB (utime + stime of the cluster's servers and
# mount, all threads). Each figure's spread = (max - min) / median over the repetitions.
# 1 client, 2 servers. Raw and Spillway alternate per repetition; a warm-up write is run
# and discarded on each side first.
# Targets (issue 17): write >= 0.6x raw, 4 writers >= 0.85x raw, cold read >= 0.7x raw,
# spread within 15% (printed; not a pass/fail row).
#
#   bench/seq_io.sh            (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK: see bench/lib.sh)
#   BENCH_SEQ_SIZE=2G          file size (4 writers write a quarter each)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SIZE="${BENCH_SEQ_SIZE:-2G}"
WARMUP_SIZE="$SIZE"
RAW_DIR="$BENCH_WORK/seq-raw"
CLUSTER_DIR="$BENCH_WORK/seq-cluster"

bench_init
BENCH_REMOVE+=("$RAW_DIR" "$CLUSTER_DIR")
JSON="$(mktemp -d)"
BENCH_REMOVE+=("$JSON")
SIZE_BYTES="$("$PY" -c 'import sys; s=sys.argv[1]; u={"K":2**10,"M":2**20,"G":2**30}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s))' "$SIZE")"
QUARTER="$((SIZE_BYTES / 4 / 1048576))M"

# fio_seq RW DIR SIZE JOBS OUT [EXTRA...]: one sequential run into DIR (files seq.N.0).
fio_seq() {
    local rw=$1 dir=$2 size=$3 jobs=$4 out=$5
    shift 5
    fio --name=seq --directory="$dir" --rw="$rw" --bs=1M --size="$size" --numjobs="$jobs" \
        --ioengine=psync --end_fsync=1 --group_reporting --output-format=json --output="$out" \
        "$@" >/dev/null
}


# cpu_per_gib TICKS0 TICKS1: CPU seconds per GiB of SIZE written ("-" without daemons).
cpu_per_gib() {
    cpu_seconds "$1" "$2" "$SIZE_BYTES / 2**30"
}

# timed_write DIR SIZE JOBS [raw]: one write run after a sync; sets BW (MiB/s) and CPU
# (s/GiB of Spillway's processes; "-" for raw, written while the cluster idles).
timed_write() {
    local c0=- c1=-
    sync
    [[ "${4:-}" == raw ]] || c0="$(cpu_ticks)"
    fio_seq write "$1" "$2" "$3" "$JSON/w.json"
    [[ "${4:-}" == raw ]] || c1="$(cpu_ticks)"
    BW="$(fio_json "$JSON/w.json" 'j["write"]["bw_bytes"] / 2**20')"
    CPU="$(cpu_per_gib "$c0" "$c1")"
}

# spread N...: (max - min) / median, in percent.
spread() { "$PY" -c 'import sys, statistics as s; v=[float(x) for x in sys.argv[1:]]; print(f"{(max(v)-min(v))/s.median(v)*100:.0f}")' "$@"; }

# measure_rep LABEL DIR: one repetition on one side (write, drop caches, cold read, 4
# writers); appends to that side's arrays LABEL_w LABEL_r LABEL_w4 LABEL_cw LABEL_cw4.
measure_rep() {
    local label=$1 dir=$2 rep=$3
    local -n w="${label}_w" r="${label}_r" w4="${label}_w4" cw="${label}_cw" cw4="${label}_cw4"
    timed_write "$dir" "$SIZE" 1 "$label"
    w+=("$BW") cw+=("$CPU")
    drop_caches
    fio_seq read "$dir" "$SIZE" 1 "$JSON/r.json"
    r+=("$(fio_json "$JSON/r.json" 'j["read"]["bw_bytes"] / 2**20')")
    rm -f "$dir"/seq.*
    timed_write "$dir" "$QUARTER" 4 "$label"
    w4+=("$BW") cw4+=("$CPU")
    rm -f "$dir"/seq.*
    info "$label run $rep/$BENCH_REPS: write $(fmt "${w[-1]}" 0) MiB/s (CPU ${cw[-1]} s/GiB), cold read $(fmt "${r[-1]}" 0) MiB/s, 4 writers $(fmt "${w4[-1]}" 0) MiB/s (CPU ${cw4[-1]} s/GiB)"
}

# summarize LABEL: sets W_MED R_MED W4_MED of that side and prints spreads and CPU.
summarize() {
    local label=$1
    # shellcheck disable=SC2178 # namerefs to arrays, not strings
    local -n w="${label}_w" r="${label}_r" w4="${label}_w4" cw="${label}_cw" cw4="${label}_cw4"
    W_MED="$(fmt "$(median "${w[@]}")" 0)"
    R_MED="$(fmt "$(median "${r[@]}")" 0)"
    W4_MED="$(fmt "$(median "${w4[@]}")" 0)"
    info "$label median: write $W_MED MiB/s (spread $(spread "${w[@]}")%), cold read $R_MED MiB/s (spread $(spread "${r[@]}")%), 4 writers $W4_MED MiB/s (spread $(spread "${w4[@]}")%)"
    if [[ "${cw[0]}" != - ]]; then
        info "$label CPU s/GiB: write $(fmt "$(median "${cw[@]}")" 2), 4 writers $(fmt "$(median "${cw4[@]}")" 2)"
    fi
}

# shellcheck disable=SC2034 # filled through namerefs in measure_rep
raw_w=() raw_r=() raw_w4=() raw_cw=() raw_cw4=()
# shellcheck disable=SC2034
spillway_w=() spillway_r=() spillway_w4=() spillway_cw=() spillway_cw4=()

step "seq_io: fio sequential 1 MiB, $SIZE (1 job; 4 jobs x $QUARTER); raw on $(findmnt -rn -o SOURCE,FSTYPE -T "$BENCH_WORK" | head -n1)"
rm -rf "$RAW_DIR"
mkdir -p "$RAW_DIR"
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    info "Spillway: 1 client, $BENCH_SERVERS servers (storage roots under $CLUSTER_DIR/servers)"
    bench_cluster_up "$CLUSTER_DIR" 8G
    # Spillway's writes touch no page cache; the warm-up is for the cluster's own state
    # (connections, grants, the arena).
    info "spillway: warm-up write of $WARMUP_SIZE (discarded)"
    fio_seq write "$CLUSTER_MNT" "$WARMUP_SIZE" 1 "$JSON/warmup.json"
    rm -f "$CLUSTER_MNT"/seq.*
fi
info "raw: warm-up write of $WARMUP_SIZE (discarded)"
fio_seq write "$RAW_DIR" "$WARMUP_SIZE" 1 "$JSON/warmup.json"
rm -f "$RAW_DIR"/seq.*
# Raw and Spillway alternate, repetition by repetition: this VM's pace drifts over
# minutes (docs/data-plane.md, "The machine's noise"), and a ratio is only meaningful
# between figures taken in the same stretch.
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    measure_rep raw "$RAW_DIR" "$rep"
    if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
        measure_rep spillway "$CLUSTER_MNT" "$rep"
    fi
done
summarize raw
RAW_W=$W_MED RAW_R=$R_MED RAW_W4=$W4_MED
# The device's own pace, for reference (one run each).
fio_seq write "$RAW_DIR" "$SIZE" 1 "$JSON/d.json" --direct=1
RAW_DW="$(fmt "$(fio_json "$JSON/d.json" 'j["write"]["bw_bytes"] / 2**20')" 0)"
rm -f "$RAW_DIR"/seq.*
fio_seq write "$RAW_DIR" "$QUARTER" 4 "$JSON/d4.json" --direct=1
RAW_DW4="$(fmt "$(fio_json "$JSON/d4.json" 'j["write"]["bw_bytes"] / 2**20')" 0)"
info "raw O_DIRECT: write $RAW_DW MiB/s, 4 writers $RAW_DW4 MiB/s (reference, not a target)"
rm -rf "$RAW_DIR"

SW_W=- SW_R=- SW_W4=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    summarize spillway
    SW_W=$W_MED SW_R=$R_MED SW_W4=$W4_MED
    bench_cluster_down "$CLUSTER_DIR"
    info "against raw O_DIRECT: write $(fmt "$(calc "$SW_W / $RAW_DW")" 2)x, 4 writers $(fmt "$(calc "$SW_W4 / $RAW_DW4")" 2)x"
fi

report "seq write 1MiB (fsync)" MiB/s "$RAW_W" "$SW_W" 0.6
report "seq write 4 writers" MiB/s "$RAW_W4" "$SW_W4" 0.85
report "seq read 1MiB (cold)" MiB/s "$RAW_R" "$SW_R" 0.7
