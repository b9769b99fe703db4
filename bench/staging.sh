#!/usr/bin/env bash
# Staging throughput: one 4 GiB file and 5,000 files of 64 KiB, staged in (PFS ->
# instance) and out (instance -> PFS) through the manager on a local site with 2
# servers, each against `cp -a` of the same data on this machine in the same run.
# Targets: >= 1.0x cp for the large file, >= 1.5x for the small files.
#
# Everything (the "PFS", cp's copies, the servers' storage) lies on one freshly made
# ext4 file system on a loop device: on the machine's own ext4, creates right after
# many deletes are 5-15x slower and bimodal (spec/machine-facts.md), which would
# measure the disk's history rather than either copy. The loop device does direct I/O
# to its image (bench/lib.sh): a buffered one doubled the kernel's copying work and
# made the large-file figures measure the loop device.
#
#   bench/staging.sh           (BENCH_REPS, BENCH_WORK: see bench/lib.sh)
#   BENCH_STAGE_BIG_MIB=4096 BENCH_STAGE_FILES=5000
#
# Exit status: 0 targets met; 1 the benchmark failed to run; 2 a target was missed.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

IMAGE="$BENCH_WORK/staging-ext4.img"
MNT="$BENCH_WORK/staging-mnt"
bench_init
BENCH_REMOVE+=("$MNT")
step "staging: 4 GiB file and 5,000 x 64 KiB, in and out, against cp -a"
# Room for the source, cp's copy, one staged-out copy and BENCH_REPS copies in the
# instance of the large file, the small sets, and the 16 GiB instance the servers
# must see free (a sparse image: only what is written takes disk space).
big_mib="${BENCH_STAGE_BIG_MIB:-4096}"
size_gib=$(( (big_mib * (BENCH_REPS + 3)) / 1024 + 24 ))
loop_mount_fresh "$IMAGE" "$MNT" "${size_gib}G"
rc=0
BENCH_WORK="$MNT" "$PY" "$(dirname "${BASH_SOURCE[0]}")/staging.py" || rc=$?
exit "$rc"
