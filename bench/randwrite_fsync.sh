#!/usr/bin/env bash
# Small synchronous writes: fio 4 KiB random writes, fsync after every write, one job,
# 256 MiB file, at most 20 s per run. Figure: write IOPS (fsync p50 latency shown too).
# Raw = the same fio in a directory of the file system that holds the servers' storage roots.
# 1 client, 2 servers; after each mount a short warm-up run is discarded.
# Target: >= 0.3x raw IOPS.
#
#   bench/randwrite_fsync.sh   (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK: see bench/lib.sh)
#   BENCH_RW_RUNTIME=20        seconds per measured run
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SIZE=256M
RUNTIME="${BENCH_RW_RUNTIME:-20}"
RAW_DIR="$BENCH_WORK/randwrite-raw"
CLUSTER_DIR="$BENCH_WORK/randwrite-cluster"

bench_init
BENCH_REMOVE+=("$RAW_DIR" "$CLUSTER_DIR")
JSON="$(mktemp -d)"
BENCH_REMOVE+=("$JSON")

fio_randwrite() { # FILE RUNTIME OUT
    fio --name=randwrite-fsync --filename="$1" --rw=randwrite --bs=4k --size="$SIZE" \
        --numjobs=1 --ioengine=psync --fsync=1 --runtime="$2" --randrepeat=0 \
        --output-format=json --output="$3" >/dev/null
}

# measure LABEL DIR: warm-up, then BENCH_REPS runs; sets IOPS_MED P50_MED
measure() {
    local label=$1 dir=$2 iops=() p50=() rep
    info "$label: laying out the $SIZE file and a 5 s warm-up run (discarded)"
    fio_randwrite "$dir/rw.dat" 5 "$JSON/warmup.json"
    for ((rep = 1; rep <= BENCH_REPS; rep++)); do
        fio_randwrite "$dir/rw.dat" "$RUNTIME" "$JSON/rw.json"
        iops+=("$(fio_json "$JSON/rw.json" 'j["write"]["iops"]')")
        p50+=("$(fio_json "$JSON/rw.json" 'j["sync"]["lat_ns"]["percentile"]["50.000000"] / 1000')")
        info "$label run $rep/$BENCH_REPS: $(fmt "${iops[-1]}" 0) IOPS, fsync p50 $(fmt "${p50[-1]}" 0) us"
    done
    rm -f "$dir/rw.dat"
    IOPS_MED="$(fmt "$(median "${iops[@]}")" 0)"
    P50_MED="$(fmt "$(median "${p50[@]}")" 0)"
    info "$label median: $IOPS_MED IOPS, fsync p50 $P50_MED us"
}

step "randwrite_fsync: fio 4 KiB random write + fsync, $SIZE, ${RUNTIME}s; raw on $(findmnt -rn -o SOURCE,FSTYPE -T "$BENCH_WORK" | head -n1)"
rm -rf "$RAW_DIR"
mkdir -p "$RAW_DIR"
measure raw "$RAW_DIR"
RAW_IOPS=$IOPS_MED
rm -rf "$RAW_DIR"

SW_IOPS=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    step "randwrite_fsync: Spillway, 1 client, $BENCH_SERVERS servers (storage roots under $CLUSTER_DIR/servers)"
    bench_cluster_up "$CLUSTER_DIR" 2G
    measure spillway "$CLUSTER_MNT"
    SW_IOPS=$IOPS_MED
    bench_cluster_down "$CLUSTER_DIR"
fi

report "4KiB randwrite+fsync" IOPS "$RAW_IOPS" "$SW_IOPS" 0.3
