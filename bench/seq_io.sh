#!/usr/bin/env bash
# Sequential bandwidth: fio, 1 MiB blocks, one job, 2 GiB file.
#   write: buffered, end_fsync=1 (the data is on the servers' storage when fio stops the clock)
#   read:  cold: caches dropped first (page cache of the mount and of the servers' disk)
# Raw = the same fio in a directory of the file system that holds the servers' storage roots.
# 1 client, 2 servers; after each mount a warm-up write is run and discarded.
# Targets: write >= 0.5x raw, read >= 0.5x raw.
#
#   bench/seq_io.sh            (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK: see bench/lib.sh)
#   BENCH_SEQ_SIZE=2G          file size
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

fio_seq() { # RW FILE SIZE OUT
    fio --name="seq$1" --filename="$2" --rw="$1" --bs=1M --size="$3" --numjobs=1 \
        --ioengine=psync --end_fsync=1 --output-format=json --output="$4" >/dev/null
}

# measure LABEL DIR: warm-up, then BENCH_REPS x (write, drop caches, read); sets W_MED R_MED
measure() {
    local label=$1 dir=$2 w=() r=() rep bw
    info "$label: warm-up write of $WARMUP_SIZE (discarded)"
    fio_seq write "$dir/warmup.dat" "$WARMUP_SIZE" "$JSON/warmup.json"
    rm -f "$dir/warmup.dat"
    for ((rep = 1; rep <= BENCH_REPS; rep++)); do
        rm -f "$dir/seq.dat"
        sync
        fio_seq write "$dir/seq.dat" "$SIZE" "$JSON/w.json"
        bw="$(fio_json "$JSON/w.json" 'j["write"]["bw_bytes"] / 2**20')"
        w+=("$bw")
        drop_caches
        fio_seq read "$dir/seq.dat" "$SIZE" "$JSON/r.json"
        r+=("$(fio_json "$JSON/r.json" 'j["read"]["bw_bytes"] / 2**20')")
        info "$label run $rep/$BENCH_REPS: write $(fmt "${w[-1]}" 0) MiB/s, cold read $(fmt "${r[-1]}" 0) MiB/s"
    done
    rm -f "$dir/seq.dat"
    W_MED="$(fmt "$(median "${w[@]}")" 0)"
    R_MED="$(fmt "$(median "${r[@]}")" 0)"
    info "$label median: write $W_MED MiB/s, cold read $R_MED MiB/s"
}

step "seq_io: fio sequential 1 MiB, $SIZE, 1 job; raw on $(findmnt -rn -o SOURCE,FSTYPE -T "$BENCH_WORK" | head -n1)"
rm -rf "$RAW_DIR"
mkdir -p "$RAW_DIR"
measure raw "$RAW_DIR"
RAW_W=$W_MED RAW_R=$R_MED
rm -rf "$RAW_DIR"

SW_W=- SW_R=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    step "seq_io: Spillway, 1 client, $BENCH_SERVERS servers (storage roots under $CLUSTER_DIR/servers)"
    bench_cluster_up "$CLUSTER_DIR" 8G
    measure spillway "$CLUSTER_MNT"
    SW_W=$W_MED SW_R=$R_MED
    bench_cluster_down "$CLUSTER_DIR"
fi

report "seq write 1MiB (fsync)" MiB/s "$RAW_W" "$SW_W" 0.5
report "seq read 1MiB (cold)" MiB/s "$RAW_R" "$SW_R" 0.5
