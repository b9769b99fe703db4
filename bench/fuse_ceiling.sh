#!/usr/bin/env bash
# What any FUSE file system reaches for streaming writes on this machine (issue 17), beside
# raw and Spillway in the same run: libfuse's own passthrough_ll example (built from the
# examples Debian ships with libfuse3-dev), a local daemon that writes each FUSE request to a
# file of the bench directory's file system, no network, no servers. It is the ceiling
# against which Spillway's ratios to raw are read: a FUSE file system whose every byte
# crosses /dev/fuse, on the machine's 2 vCPUs.
#
#   raw              a plain directory on the file system of BENCH_WORK
#   passthrough      passthrough_ll -o cache=auto (writes through the FUSE page cache)
#   passthrough-dio  passthrough_ll -o cache=never (direct_io: around the page cache)
#   spillway         bench_cluster_up (1 client, 2 servers)
#
# Workloads: fio write, 1 MiB blocks, 1 job x SIZE and 4 jobs x SIZE/4, end_fsync=1; the
# figure is durable MiB/s = SIZE / (fio + a `sync` right after). Systems interleaved within
# each repetition. Before every run a buffered write of SIZE to the raw directory, deleted at
# once, leaves the kernel's free pages recently used: on this VM (free-page reporting) pages
# the host took back cost a fault each, and buffered raw swings 5x with how many it must get
# back (docs/data-plane.md, "The machine's noise"); this keeps every system on equal terms.
#
#   bench/fuse_ceiling.sh      (BENCH_REPS, BENCH_WORK: see bench/lib.sh)
#   BENCH_SEQ_SIZE=2G          file size (4 writers write a quarter each)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SIZE="${BENCH_SEQ_SIZE:-2G}"
EXAMPLES=/usr/share/doc/libfuse3-dev/examples
CEIL="$BENCH_WORK/ceiling"

bench_init
BENCH_REMOVE+=("$CEIL")
SIZE_MIB="$("$PY" -c 'import sys; s=sys.argv[1]; u={"K":2**-10,"M":1,"G":2**10}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s)>>20)' "$SIZE")"

[[ -f "$EXAMPLES/passthrough_ll.c" ]] || die "$EXAMPLES/passthrough_ll.c not found (package libfuse3-dev)"
rm -rf "$CEIL"
mkdir -p "$CEIL/bin" "$CEIL/raw" "$CEIL/src" "$CEIL/mnt" "$CEIL/warm"
BENCH_LOOPS+=("$CEIL/mnt") # unmounted at exit if a run stops while it is up
cp "$EXAMPLES"/passthrough_ll.c "$EXAMPLES"/passthrough_helpers.h "$CEIL/bin/"
# shellcheck disable=SC2046 # pkg-config prints several words on purpose
cc -O2 -Wall -o "$CEIL/bin/passthrough_ll" "$CEIL/bin/passthrough_ll.c" $(pkg-config fuse3 --cflags --libs) -lpthread \
    || die "cannot build passthrough_ll"

# pt_up CACHE: mount passthrough_ll over $CEIL/src at $CEIL/mnt, then a discarded warm-up.
pt_up() {
    "$CEIL/bin/passthrough_ll" -o "source=$CEIL/src,cache=$1" "$CEIL/mnt" \
        || die "passthrough_ll did not mount"
    fio --name=warm --directory="$CEIL/mnt" --rw=write --bs=1M --size="$SIZE" --end_fsync=1 >/dev/null
    rm -f "$CEIL/mnt"/warm.*
}

pt_down() {
    umount "$CEIL/mnt" 2>/dev/null || umount -l "$CEIL/mnt"
}

# warm_memory: a buffered write of SIZE, deleted: the next run finds recently used pages.
warm_memory() {
    fio --name=hot --directory="$CEIL/warm" --rw=write --bs=1M --size="$SIZE" >/dev/null
    rm -f "$CEIL/warm"/hot.*
}

# durable DIR JOBS: one write run; prints durable MiB/s.
durable() {
    local dir=$1 jobs=$2 t0 t1
    rm -f "$dir"/seq.*
    sync
    warm_memory
    t0=$EPOCHREALTIME
    fio --name=seq --directory="$dir" --rw=write --bs=1M --size="$((SIZE_MIB / jobs))M" \
        --numjobs="$jobs" --ioengine=psync --end_fsync=1 --group_reporting >/dev/null
    sync
    t1=$EPOCHREALTIME
    rm -f "$dir"/seq.*
    calc "$SIZE_MIB / ($t1 - $t0)"
}

spread() { "$PY" -c 'import sys, statistics as s; v=[float(x) for x in sys.argv[1:]]; print(f"{(max(v)-min(v))/s.median(v)*100:.0f}")' "$@"; }

step "fuse_ceiling: fio write 1 MiB, $SIZE (1 job; 4 jobs), durable, on $(findmnt -rn -o SOURCE,FSTYPE -T "$BENCH_WORK" | head -n1)"
SYSTEMS=(raw passthrough passthrough-dio)
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    bench_cluster_up "$CEIL/spillway" 8G
    fio --name=warm --directory="$CLUSTER_MNT" --rw=write --bs=1M --size="$SIZE" --end_fsync=1 >/dev/null
    rm -f "$CLUSTER_MNT"/warm.*
    SYSTEMS+=(spillway)
fi
declare -A RES
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    for sys in "${SYSTEMS[@]}"; do
        case $sys in
        raw) dir="$CEIL/raw" ;;
        passthrough) pt_up auto; dir="$CEIL/mnt" ;;
        passthrough-dio) pt_up never; dir="$CEIL/mnt" ;;
        spillway) dir="$CLUSTER_MNT" ;;
        esac
        one="$(durable "$dir" 1)"
        four="$(durable "$dir" 4)"
        RES[$sys,1]+=" $one" RES[$sys,4]+=" $four"
        [[ $sys == passthrough* ]] && pt_down
        info "run $rep/$BENCH_REPS $sys: 1 writer $(fmt "$one" 0) MiB/s, 4 writers $(fmt "$four" 0) MiB/s"
    done
done

printf '\n%-16s %14s %8s %8s %14s %8s %8s\n' system "1 writer" "/ raw" spread "4 writers" "/ raw" spread
# shellcheck disable=SC2086 # the lists are words on purpose
raw1="$(median ${RES[raw,1]})" raw4="$(median ${RES[raw,4]})"
for sys in "${SYSTEMS[@]}"; do
    # shellcheck disable=SC2086
    m1="$(median ${RES[$sys,1]})" m4="$(median ${RES[$sys,4]})" s1="$(spread ${RES[$sys,1]})" s4="$(spread ${RES[$sys,4]})"
    printf '%-16s %9s MiB/s %7sx %7s%% %9s MiB/s %7sx %7s%%\n' "$sys" "$(fmt "$m1" 0)" \
        "$(fmt "$(calc "$m1 / $raw1")" 2)" "$s1" "$(fmt "$m4" 0)" "$(fmt "$(calc "$m4 / $raw4")" 2)" "$s4"
done
