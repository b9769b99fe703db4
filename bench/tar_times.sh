#!/usr/bin/env bash
# `tar -x` into a cache mount, a scratch mount and a local directory, in the same run
# (issue 30, item 14: a cache keeps the times tar sets; docs/cache.md, "File times").
#
# The archive: TAR_BENCH_SRC (default /usr/share/doc) packed once (posix format, into
# BENCH_WORK). Each repetition extracts it with `tar -xf` into: a fresh directory on
# BENCH_WORK's file system (local), a fresh directory of a 2-server scratch cluster's
# mount, and a fresh directory of a 2-server cache instance over a loop-mounted XFS (the
# PFS, unthrottled; `cluster up --cache-pfs`). Times are wall seconds until tar exits
# (the cache's write-behind may still be running then: its bytes are in the servers'
# stripes and logs, as a scratch mount's are). After the last cache run the script waits
# for write-behind and checks that every mtime on the PFS is the archive's.
#
#   bench/tar_times.sh            (BENCH_REPS, BENCH_WORK: see bench/lib.sh)
#   TAR_BENCH_SRC=/usr/share/doc  the tree archived
#
# Prints the median seconds of each and the ratios against local (higher = slower).
# Exit status: 0 done; 1 the benchmark failed to run or the PFS lost a time.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SRC="${TAR_BENCH_SRC:-/usr/share/doc}"
[[ -d "$SRC" ]] || die "no directory $SRC (TAR_BENCH_SRC)"
bench_init

ARCHIVE="$BENCH_WORK/tar-times.tar"
LOCAL="$BENCH_WORK/tar-local"
SCRATCH_DIR="$BENCH_WORK/tar-scratch"
CACHE_DIR="$BENCH_WORK/tar-cache"
IMAGE="$BENCH_WORK/tar-pfs.img"
PFS="$BENCH_WORK/tar-pfs"
BENCH_REMOVE+=("$ARCHIVE" "$LOCAL" "$SCRATCH_DIR" "$CACHE_DIR" "$PFS")

step "tar -x of $SRC: local, scratch mount, cache mount"
tar -C "$SRC" --format=posix -cf "$ARCHIVE" .
files="$(tar -tf "$ARCHIVE" | wc -l)"
info "archive: $files entries, $(du -h "$ARCHIVE" | cut -f1)"

loop_umount "$PFS"
rm -f "$IMAGE"
mkdir -p "$PFS"
truncate -s 4G "$IMAGE"
mkfs.xfs -q -f "$IMAGE"
BENCH_LOOPS+=("$PFS")
BENCH_REMOVE+=("$IMAGE")
mount -o loop "$IMAGE" "$PFS"
mkdir -p "$PFS/cached"
TUNABLES="$BENCH_WORK/tar-tunables"
BENCH_REMOVE+=("$TUNABLES")
echo "pfs_roots = $PFS" >"$TUNABLES"

bench_cluster_up "$SCRATCH_DIR" 4G
SCRATCH_MNT="$CLUSTER_MNT"
BENCH_CLUSTERS+=("$CACHE_DIR")
cluster_up "$CACHE_DIR" "$BENCH_SERVERS" 4G --cache-pfs "$PFS/cached" --tunables "$TUNABLES"
CACHE_MNT="$CLUSTER_MNT"
info "scratch at $SCRATCH_MNT, cache of $PFS/cached at $CACHE_MNT"

# extract DIR: seconds `tar -xf` takes into the fresh directory DIR.
extract() {
    local dir=$1 t0 t1
    mkdir "$dir"
    sync
    t0="$(now)"
    tar -C "$dir" -xf "$ARCHIVE"
    t1="$(now)"
    calc "$t1 - $t0"
}

l=() s=() c=()
for ((r = 1; r <= BENCH_REPS; r++)); do
    rm -rf "$LOCAL"
    mkdir -p "$LOCAL"
    l+=("$(extract "$LOCAL/x$r")")
    s+=("$(extract "$SCRATCH_MNT/x$r")")
    c+=("$(extract "$CACHE_MNT/x$r")")
    info "run $r: local ${l[-1]} s, scratch ${s[-1]} s, cache ${c[-1]} s"
done
ml="$(median "${l[@]}")"
ms="$(median "${s[@]}")"
mc="$(median "${c[@]}")"

# Every mtime of the last cache run on the PFS, once written behind.
last="x$BENCH_REPS"
wrong="$("$PY" - "$LOCAL/$last" "$PFS/cached/$last" "$CACHE_MNT/$last" <<'PY'
import os, stat, sys
a, b, m = sys.argv[1], sys.argv[2], sys.argv[3]
# Written behind now (what dw_wait_sync_complete sets), then compared.
for d, _, names in os.walk(m):
    for n in names:
        f = os.path.join(d, n)
        if stat.S_ISREG(os.lstat(f).st_mode):
            os.setxattr(f, "user.spillway.sync", b"1")
bad = 0
for d, _, names in os.walk(a):
    for n in names:
        p = os.path.join(d, n)
        q = os.path.join(b, os.path.relpath(p, a))
        if os.lstat(p).st_mtime_ns != os.lstat(q).st_mtime_ns:
            bad += 1
print(bad)
PY
)"

printf '\n%-24s %10s %10s\n' "tar -x of $files entries" "seconds" "x local"
printf '%-24s %10s %10s\n' local "$(fmt "$ml" 2)" 1.00
printf '%-24s %10s %10s\n' scratch "$(fmt "$ms" 2)" "$(fmt "$(calc "$ms / $ml")" 2)"
printf '%-24s %10s %10s\n' cache "$(fmt "$mc" 2)" "$(fmt "$(calc "$mc / $ml")" 2)"
printf 'cache: %s regular files of the last run with another mtime on the PFS than local\n' "$wrong"
[[ "$wrong" == 0 ]] || exit 1
