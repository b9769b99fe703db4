#!/usr/bin/env bash
# N-to-1 shared-file writes through MPI-IO (issue 31): 4 ranks of MPICH's ROMIO write
# one file in IOR's segmented layout (bench/mpi_write.c), 1 MiB transfers, then
# MPI_File_sync and close; independent (MPI_File_write_at) and collective
# (MPI_File_write_at_all). Figure: MiB/s, counted from the barrier before the first
# write to the slowest rank's close. Raw = the 4 ranks in a directory of the file system
# that holds the servers' storage roots. Spillway: 2 servers, the instance mounted twice
# (as on two compute nodes), 2 ranks on each mount (an MPMD launch). No target: the
# figure shows what shared-file checkpoints cost next to file-per-process streaming.
#
#   bench/shared.sh              (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK: see bench/lib.sh)
#   BENCH_SHARED_SIZE=2G         bytes written per run (all ranks together)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SIZE="${BENCH_SHARED_SIZE:-2G}"
RANKS=4
XFER=$((1 << 20))
RAW_DIR="$BENCH_WORK/shared-raw"
CLUSTER_DIR="$BENCH_WORK/shared-cluster"

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    die "needs MPICH: apt-get install mpich libmpich-dev"
fi
size_bytes="$("$PY" -c 'import sys; s=sys.argv[1]; u={"K":2**10,"M":2**20,"G":2**30}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s))' "$SIZE")"
SEGMENTS=$((size_bytes / XFER / RANKS))
((SEGMENTS > 0)) || die "BENCH_SHARED_SIZE=$SIZE is less than $RANKS transfers of $XFER bytes"

bench_init
BENCH_REMOVE+=("$RAW_DIR" "$CLUSTER_DIR")
BIN="$(mktemp -d)"
BENCH_REMOVE+=("$BIN")
mpicc -O2 -Wall -o "$BIN/mpi_write" "$(dirname "${BASH_SOURCE[0]}")/mpi_write.c"

# run MODE DIR1 [DIR2]: one run, 4 ranks (2 per directory when two are given): MiB/s.
run() {
    local mode=$1 d1=$2 d2=${3:-} out
    rm -f "$d1/shared.dat"
    if [[ -n "$d2" ]]; then
        out="$(bounded 600 mpirun -launcher fork -n 2 "$BIN/mpi_write" "$d1/shared.dat" "$mode" "$XFER" "$SEGMENTS" \
            : -n 2 "$BIN/mpi_write" "$d2/shared.dat" "$mode" "$XFER" "$SEGMENTS")"
    else
        out="$(bounded 600 mpirun -launcher fork -n "$RANKS" "$BIN/mpi_write" "$d1/shared.dat" "$mode" "$XFER" "$SEGMENTS")"
    fi
    rm -f "$d1/shared.dat"
    calc "$(awk '{ print $1 }' <<<"$out") / 1048576 / $(awk '{ print $2 }' <<<"$out")"
}

# measure LABEL MODE DIR1 [DIR2]: BENCH_REPS runs, MED = their median MiB/s
measure() {
    local label=$1 mode=$2 got=() rep
    shift 2
    for ((rep = 1; rep <= BENCH_REPS; rep++)); do
        got+=("$(run "$mode" "$@")")
        info "$label $mode run $rep/$BENCH_REPS: $(fmt "${got[-1]}" 0) MiB/s"
    done
    MED="$(fmt "$(median "${got[@]}")" 0)"
}

step "shared: $RANKS MPI ranks write one $SIZE file in ${XFER}-byte transfers (IOR segmented layout)"
rm -rf "$RAW_DIR"
mkdir -p "$RAW_DIR"
declare -A RAW SW
for mode in indep coll; do
    measure raw "$mode" "$RAW_DIR"
    RAW[$mode]=$MED
    SW[$mode]=-
done
rm -rf "$RAW_DIR"

if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    step "shared: Spillway, $BENCH_SERVERS servers, mounted twice, 2 ranks on each mount"
    bench_cluster_up "$CLUSTER_DIR" 8G
    MNT2="$CLUSTER_DIR/mnt2"
    mkdir -p "$MNT2"
    bounded 120 "$SPILLWAY_BIN" mount --instance "$CLUSTER_DIR/instance.json" "$MNT2" >/dev/null
    for mode in indep coll; do
        measure spillway "$mode" "$CLUSTER_MNT" "$MNT2"
        SW[$mode]=$MED
    done
    bounded 120 "$SPILLWAY_BIN" umount "$MNT2" >/dev/null || true
    bench_cluster_down "$CLUSTER_DIR"
fi

for mode in indep coll; do
    sw=${SW[$mode]} ratio=-
    [[ "$sw" == - ]] || ratio="$(fmt "$(calc "$sw / ${RAW[$mode]}")" 3)"
    printf '\n%-28s raw %s MiB/s | spillway %s MiB/s | ratio %s (no target)\n' \
        "shared-file write ($mode)" "${RAW[$mode]}" "$sw" "$ratio"
    if [[ -n "${BENCH_RESULTS:-}" ]]; then
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "shared-file write ($mode)" MiB/s "${RAW[$mode]}" "$sw" "$ratio" - - \
            >>"$BENCH_RESULTS"
    fi
done
