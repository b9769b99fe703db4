#!/usr/bin/env bash
# Cache instances (issue 18, docs/cache.md): what a cache instance buys in front of a slow
# PFS, each figure against the same I/O done on the PFS directly, in the same run.
#
# The PFS stand-in: a fresh XFS on a sparse image, loop-mounted (direct I/O to its image, as
# bench/lib.sh's loop mounts), its loop device throttled with cgroup v1 blkio to
# CACHE_BENCH_PFS_MIBS MiB/s and CACHE_BENCH_PFS_IOPS IOPS, each way. The limits are
# written to the *root* blkio cgroup's blkio.throttle.{read,write}_{bps,iops}_device for
# that device's MAJ:MIN, so every process's I/O to it is throttled alike: fio's direct
# runs, the cache servers' fetches and write-behind, and the kernel's writeback threads
# (v1 blkio charges buffered writeback to the root cgroup, so a child cgroup would let it
# through). The loop device is nobody else's, so nothing else is slowed. The limits are
# checked with fio O_DIRECT runs before the figures, and removed at exit.
#
# The cache: `spillway cluster up --servers 2 --capacity CACHE_BENCH_CAPACITY --cache-pfs
# PFS/cached` (pfs_roots = PFS in its tunables), default policies (write-behind after 5 s
# or 64 MiB dirty per file; fsync syncs the servers' storage, not the PFS).
#
# Figures (medians of BENCH_REPS; PFS-direct and cache alternate in each repetition):
#   read       a CACHE_BENCH_SIZE file of the PFS read sequentially (fio, 1 MiB blocks),
#              caches dropped before each read: directly on the PFS, and a second read
#              through the cache (the first, untimed in the ratio, fills it; printed).
#              The PFS bytes read during each cached read are printed (should be 0).
#   randwrite  CACHE_BENCH_RW_IO of 4 KiB random writes (fio psync, each block once,
#              fsync at the end: end_fsync=1) into a fresh sparse CACHE_BENCH_RW_FILE
#              file, on the PFS directly and through the cache; IOPS = writes / (writes +
#              fsync). The writes cover a sixteenth of the file by default: covering all of
#              it would let the PFS's page cache turn them into one sequential writeback.
#              Then the time until the PFS holds them, from fio's exit: until the PFS
#              file has its size, none of its pages is dirty or under writeback
#              (cachestat(2)) and, checked once that holds, it shows every block written
#              (`fio --verify_only` with the same seed: the crc32c fio put in each block,
#              read through the PFS's page cache) and is still clean: the blocks are on
#              the PFS's device. For the PFS-direct run it is 0 (its fsync put them
#              there); it is checked once to show the checks work.
#              Counted to the PFS: writes / (fio's seconds + the seconds until they
#              are on the PFS's device), against the PFS directly (its fio run).
#   seqwrite   CACHE_BENCH_SEQ written sequentially in 1 MiB writes (fio psync, fsync at
#              the end) into a fresh file, on the PFS directly and through the cache: at
#              the application (fio's MiB/s) and counted to the PFS (bytes / (fio's
#              seconds + the seconds until the PFS holds them on its device), checked
#              as for randwrite).
#   mixed      one seqwrite stream and one randwrite writer at once (two fio processes,
#              each into its own file): bytes of both / seconds until both are on the
#              PFS's device, directly and through the cache.
#   CPU        seconds of the cluster's processes (servers and mount, all threads) per GiB
#              of the second read, and per write run including its write-behind.
# Targets (issues 18, 30): randwrite >= 5x the PFS directly at the application and >=
# 1.0x counted to the PFS; seqwrite >= 0.95x counted to the PFS. The read ratio, seqwrite
# at the application and the mixed run have no target.
#
#   bench/cache.sh                  (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK, BENCH_TUNABLES:
#                                    see bench/lib.sh; BENCH_TUNABLES is added to the
#                                    cluster's tunables file)
#   CACHE_BENCH_SIZE=4G             the file read (CACHE_BENCH_SIZE=1G for a quick run)
#   CACHE_BENCH_RW_FILE=1G          the file written at random
#   CACHE_BENCH_RW_IO=64M           bytes of 4 KiB random writes into it per run
#   CACHE_BENCH_SEQ=2G              bytes of the sequential stream per run
#   CACHE_BENCH_PARTS="read rand seq mixed"   the parts run (figures of the others: -)
#   CACHE_BENCH_PFS_MIBS=200        the PFS's throttle, MiB/s each way
#   CACHE_BENCH_PFS_IOPS=2000       the PFS's throttle, IOPS each way
#   CACHE_BENCH_CAPACITY=8G         the cache instance's capacity
#   CACHE_BENCH_PFS_WAIT=600        seconds to wait for write-behind before giving up
#
# Exit status: 0 targets met; 1 the benchmark failed to run; 2 a target was missed.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SIZE="${CACHE_BENCH_SIZE:-4G}"
RW_FILE="${CACHE_BENCH_RW_FILE:-1G}"
RW_IO="${CACHE_BENCH_RW_IO:-64M}"
PFS_MIBS="${CACHE_BENCH_PFS_MIBS:-200}"
PFS_IOPS="${CACHE_BENCH_PFS_IOPS:-2000}"
CAPACITY="${CACHE_BENCH_CAPACITY:-8G}"
PFS_WAIT="${CACHE_BENCH_PFS_WAIT:-600}"
SEQ="${CACHE_BENCH_SEQ:-2G}"
PARTS=" ${CACHE_BENCH_PARTS:-read rand seq mixed} "
# part NAME: true when NAME is one of the parts to run.
part() { [[ "$PARTS" == *" $1 "* ]]; }
RW_TARGET=5
RW_PFS_TARGET=1.0
SEQ_PFS_TARGET=0.95

IMAGE="$BENCH_WORK/cache-pfs.img"
PFS="$BENCH_WORK/cache-pfs"
PFS_CACHED="$PFS/cached" # the cache instance's PFS directory
PFS_DIRECT="$PFS/direct" # the PFS-direct random writes
CLUSTER_DIR="$BENCH_WORK/cache-cluster"
BLKIO=/sys/fs/cgroup/blkio
THROTTLE_FILES=(read_bps write_bps read_iops write_iops)

# bytes SIZE: "4G", "64M", "512K" or a byte count, in bytes (G = GiB).
bytes() { "$PY" -c 'import sys; s=sys.argv[1]; u={"K":2**10,"M":2**20,"G":2**30}; print(int(float(s[:-1])*u[s[-1]]) if s[-1] in u else int(s))' "$1"; }

SIZE_BYTES="$(bytes "$SIZE")"
RW_FILE_BYTES="$(bytes "$RW_FILE")"
RW_IO_BYTES="$(bytes "$RW_IO")"
RW_WRITES=$((RW_IO_BYTES / 4096))
SEQ_BYTES="$(bytes "$SEQ")"
[[ $RW_IO_BYTES -le $RW_FILE_BYTES ]] || die "CACHE_BENCH_RW_IO ($RW_IO) exceeds CACHE_BENCH_RW_FILE ($RW_FILE)"

bench_init
LOOP_DEV=""
THROTTLED="" # MAJ:MIN whose limits this run set

# throttle_clear: remove this run's limits (0 = none); they would outlive the loop device.
throttle_clear() {
    [[ -n "$THROTTLED" ]] || return 0
    local f
    for f in "${THROTTLE_FILES[@]}"; do
        echo "$THROTTLED 0" >"$BLKIO/blkio.throttle.${f}_device" ||
            warn "could not clear $BLKIO/blkio.throttle.${f}_device for $THROTTLED"
    done
    THROTTLED=""
}

# cache_cleanup: exit trap: the throttle, then bench/lib.sh's cleanup (cluster, tagged
# processes, the PFS's mount, scratch paths), then the loop device if it is still there.
cache_cleanup() {
    local rc=$?
    set +e
    trap - EXIT
    throttle_clear
    (exit "$rc")
    bench_cleanup
    if [[ -n "$LOOP_DEV" ]] && losetup -nO BACK-FILE "$LOOP_DEV" 2>/dev/null | grep -qF "$IMAGE"; then
        losetup -d "$LOOP_DEV" || warn "could not detach $LOOP_DEV"
    fi
    exit "$rc"
}
trap cache_cleanup EXIT

BENCH_REMOVE+=("$CLUSTER_DIR" "$PFS")
JSON="$(mktemp -d)"
BENCH_REMOVE+=("$JSON")

# throttle_set MAJ:MIN: the PFS's limits, in the root blkio cgroup (applies to everyone).
throttle_set() {
    local mm=$1 f
    [[ -w "$BLKIO/blkio.throttle.read_bps_device" ]] ||
        die "no cgroup v1 blkio throttle at $BLKIO (blkio.throttle.read_bps_device)"
    THROTTLED="$mm"
    for f in read_bps write_bps; do
        echo "$mm $((PFS_MIBS * 1048576))" >"$BLKIO/blkio.throttle.${f}_device"
    done
    for f in read_iops write_iops; do
        echo "$mm $PFS_IOPS" >"$BLKIO/blkio.throttle.${f}_device"
    done
    for f in "${THROTTLE_FILES[@]}"; do
        grep -q "^$mm " "$BLKIO/blkio.throttle.${f}_device" ||
            die "the limit in $BLKIO/blkio.throttle.${f}_device did not take"
    done
}

# pfs_read_mib: MiB read from the PFS's device so far (its /sys/block stat, all readers).
pfs_read_mib() {
    local s
    read -r -a s <"/sys/block/$(basename "$LOOP_DEV")/stat"
    echo $((s[2] * 512 / 1048576))
}


# cpu_median SECONDS...: their median, or - when one of them is unknown (-: the
# cluster's processes were not found, e.g. a SPILLWAY_BIN not named spillway).
cpu_median() {
    local v
    for v in "$@"; do
        if [[ $v == - ]]; then
            echo -
            return
        fi
    done
    fmt "$(median "$@")" 2
}

# elapsed T0: seconds since EPOCHREALTIME T0.
elapsed() { fmt "$(calc "$EPOCHREALTIME - $1")" 2; }

# fio_read FILE OUT: one sequential read of FILE, 1 MiB blocks.
fio_read() {
    fio --name=read --filename="$1" --rw=read --bs=1M --ioengine=psync \
        --output-format=json --output="$2" >/dev/null
}

# The writes: every block written once (fio's random map, or in order), in an order
# given by the seed; verify=crc32c puts a checksummed header in each block, so that `fio
# --verify_only` with the same seed can later check the blocks wherever the file is.
# KIND rand: RW_RUN_IO bytes of 4 KiB random writes into a sparse RW_FILE file (a
# warm-up writes a quarter); KIND seq: SEQ_BYTES in 1 MiB writes, in order.
RW_RUN_IO=$RW_IO_BYTES
wopts() {
    case $1 in
    rand) echo "--name=randwrite --rw=randwrite --bs=4k --size=$RW_FILE_BYTES --io_size=$RW_RUN_IO" ;;
    seq) echo "--name=seqwrite --rw=write --bs=1M --size=$SEQ_BYTES --io_size=$SEQ_BYTES" ;;
    esac
}
COMMON_OPTS=(--ioengine=psync --fallocate=none --verify=crc32c --verify_state_save=0)

# fio_write KIND FILE SEED OUT: the writes, then one fsync.
fio_write() {
    local -a o
    read -r -a o <<<"$(wopts "$1")"
    (cd "$JSON" && fio --filename="$2" "${o[@]}" "${COMMON_OPTS[@]}" --randseed="$3" --end_fsync=1 --do_verify=0 \
        --output-format=json --output="$4" >/dev/null)
}

# holds KIND FILE SEED: true when FILE holds every block fio_write KIND SEED wrote (read
# through the page cache: invalidate=0). Never on a file shorter than the run's: fio
# would lay it out, writing into the PFS file it is checking.
holds() {
    local -a o
    local size want=$SEQ_BYTES
    [[ $1 == seq ]] || want=$RW_FILE_BYTES
    size="$(stat -c %s "$2" 2>/dev/null || echo 0)"
    ((size >= want)) || return 1
    read -r -a o <<<"$(wopts "$1")"
    (cd "$JSON" && fio --filename="$2" "${o[@]}" "${COMMON_OPTS[@]}" --randseed="$3" --verify_only=1 \
        --verify_fatal=1 --invalidate=0 --output="$JSON/verify-$1.txt" >/dev/null 2>&1)
}

# pfs_clean FILE: true when none of FILE's pages in the page cache is dirty or under
# writeback (cachestat(2)): what its page cache shows has reached the PFS's device.
pfs_clean() {
    local rc=0
    "$PY" - "$1" <<'PYEOF' || rc=$?
import ctypes, os, sys
class Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]  # len 0: to the end
class Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recent")]
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_RDONLY)
r, s = Range(0, 0), Stat()
# 451: cachestat on every Linux architecture (6.5 and later).
if libc.syscall(ctypes.c_long(451), ctypes.c_int(fd), ctypes.byref(r), ctypes.byref(s), ctypes.c_uint(0)):
    print(f"cachestat {sys.argv[1]}: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
    sys.exit(3)
sys.exit(0 if s.dirty == 0 and s.writeback == 0 else 1)
PYEOF
    [[ $rc -le 1 ]] || die "cachestat(2) failed (kernel 6.5 or later is needed)"
    return "$rc"
}

# wait_on_pfs LABEL T0 KIND:FILE:SEED...: poll until every FILE holds its blocks and none
# of its pages is dirty or under writeback (TOPFS_S, seconds since EPOCHREALTIME T0): the
# cheap checks first (its size reached, no dirty page: cachestat(2)), then fio's verify
# of every block (which reads the whole file: only once the cheap checks pass, so its
# own time is counted once, not at every poll). POLLS: the polls that failed (0: it was
# all there at once).
wait_on_pfs() {
    local label=$1 t0=$2 spec kind file seed ok size want
    shift 2
    POLLS=0
    while :; do
        ok=1
        for spec in "$@"; do
            IFS=: read -r kind file seed <<<"$spec"
            want=$SEQ_BYTES
            [[ $kind == seq ]] || want=$RW_FILE_BYTES
            size="$(stat -c %s "$file" 2>/dev/null || echo 0)"
            if ((size < want)) || ! pfs_clean "$file"; then
                ok=0
                break
            fi
        done
        if ((ok)); then
            for spec in "$@"; do
                IFS=: read -r kind file seed <<<"$spec"
                holds "$kind" "$file" "$seed" || { ok=0; break; }
            done
            # Clean still: the verify's reads saw what is on the device.
            if ((ok)); then
                for spec in "$@"; do
                    IFS=: read -r kind file seed <<<"$spec"
                    pfs_clean "$file" || { ok=0; break; }
                done
            fi
            ((ok)) && break
        fi
        POLLS=$((POLLS + 1))
        if [[ "$label" == pfs ]]; then
            die "the PFS does not hold the blocks fio wrote and fsynced, or has dirty pages ($(cat "$JSON"/verify-*.txt 2>/dev/null | grep -m1 -i 'verify' || true))"
        fi
        if (($(fmt "$(calc "$EPOCHREALTIME - $t0")" 0) > PFS_WAIT)); then
            die "$label: the PFS did not hold the writes $PFS_WAIT s after fio's exit (logs: $CLUSTER_DIR/logs/)"
        fi
        sleep 0.1
    done
    TOPFS_S="$(elapsed "$t0")"
    if [[ $POLLS -eq 0 ]]; then TOPFS_S=0; fi
}

# fresh_file KIND FILE: FILE made anew (a sparse RW_FILE for rand, empty for seq), synced.
fresh_file() {
    rm -f "$2"
    if [[ $1 == rand ]]; then truncate -s "$RW_FILE_BYTES" "$2"; else : >"$2"; fi
    sync
}

# write_run KIND LABEL DIR PFS_DIR SEED: one run into a fresh DIR/KIND.dat; sets IOPS and
# MIBS (fio's), FIO_S (fio's seconds, writes + fsync), TOPFS_S (from fio's exit until
# PFS_DIR/KIND.dat holds every block written and none of its pages is dirty or under
# writeback: they are on the PFS's device) and CPU_S (the cluster's CPU seconds over all of it; "-" for the PFS directly, where
# both are 0).
write_run() {
    local kind=$1 label=$2 dir=$3 pfs_dir=$4 seed=$5 c0=- c1=- t0
    fresh_file "$kind" "$dir/$kind.dat"
    [[ "$label" == pfs ]] || c0="$(cpu_ticks)"
    fio_write "$kind" "$dir/$kind.dat" "$seed" "$JSON/$kind.json"
    t0=$EPOCHREALTIME
    wait_on_pfs "$label" "$t0" "$kind:$pfs_dir/$kind.dat:$seed"
    [[ "$label" == pfs ]] || c1="$(cpu_ticks)"
    CPU_S="$(cpu_seconds "$c0" "$c1")"
    IOPS="$(fio_json "$JSON/$kind.json" 'j["write"]["iops"]')"
    MIBS="$(fio_json "$JSON/$kind.json" 'j["write"]["bw_bytes"] / 2**20')"
    FIO_S="$(fio_json "$JSON/$kind.json" 'j["job_runtime"] / 1000')"
    rm -f "$dir/$kind.dat"
}

# mixed_run LABEL DIR PFS_DIR SEED: the stream and the random writer at once, each into
# its fresh file; sets APP_S (until both fio processes exit) and ALL_S (until, besides,
# both files are on the PFS's device).
mixed_run() {
    local label=$1 dir=$2 pfs_dir=$3 seed=$4 t0 pa pb
    fresh_file rand "$dir/rand.dat"
    fresh_file seq "$dir/seq.dat"
    t0=$EPOCHREALTIME
    fio_write seq "$dir/seq.dat" "$seed" "$JSON/mseq.json" &
    pa=$!
    fio_write rand "$dir/rand.dat" "$seed" "$JSON/mrand.json" &
    pb=$!
    wait "$pa" || die "$label: the mixed run's stream failed"
    wait "$pb" || die "$label: the mixed run's random writer failed"
    APP_S="$(elapsed "$t0")"
    # For the PFS directly both were fsynced: on the device already (checked).
    wait_on_pfs "$label" "$EPOCHREALTIME" "seq:$pfs_dir/seq.dat:$seed" "rand:$pfs_dir/rand.dat:$seed"
    ALL_S="$(elapsed "$t0")"
    rm -f "$dir/rand.dat" "$dir/seq.dat"
}

# report_plain FIGURE UNIT RAW SPILLWAY NOTE: a row without a target, as report prints.
report_plain() {
    local figure=$1 unit=$2 raw=$3 sw=$4 note=$5 ratio=-
    [[ "$sw" == - ]] || ratio="$(fmt "$(calc "$sw / $raw")" 3)"
    printf '\n%-28s raw %s %s | spillway %s %s | ratio %s (%s)\n' "$figure" "$raw" "$unit" "$sw" "$unit" "$ratio" "$note"
    if [[ -n "${BENCH_RESULTS:-}" ]]; then
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$figure" "$unit" "$raw" "$sw" "$ratio" - - >>"$BENCH_RESULTS"
    fi
}

# ------------------------------------------------------------------ the PFS

step "cache: a cache instance over a slow PFS (XFS on a loop device, $PFS_MIBS MiB/s and $PFS_IOPS IOPS each way)"
img_gib=$(((SIZE_BYTES + 4 * RW_FILE_BYTES + 4 * SEQ_BYTES) / 1073741824 + 2))
((img_gib >= 6)) || img_gib=6
loop_umount "$PFS"
rm -f "$IMAGE"
mkdir -p "$PFS"
truncate -s "${img_gib}G" "$IMAGE"
mkfs.xfs -q -f "$IMAGE"
BENCH_LOOPS+=("$PFS")
BENCH_REMOVE+=("$IMAGE")
mount -o loop "$IMAGE" "$PFS"
LOOP_DEV="$(findmnt -rn -o SOURCE --mountpoint "$PFS")"
[[ "$LOOP_DEV" == /dev/loop* ]] || die "$PFS: mounted from $LOOP_DEV, not a loop device"
losetup --direct-io=on "$LOOP_DEV" || warn "$LOOP_DEV: no direct I/O to its image (figures will be noisier)"
MAJMIN="$(lsblk -dno MAJ:MIN "$LOOP_DEV" | tr -d ' ')"
mkdir -p "$PFS_CACHED" "$PFS_DIRECT"
info "fresh XFS (${img_gib}G sparse image, $LOOP_DEV, $MAJMIN) mounted at $PFS"

# The file to read is written before the throttle: only the figures wait for the PFS.
info "writing the $SIZE file to read (unthrottled, O_DIRECT)"
fio --name=big --filename="$PFS_CACHED/big.dat" --rw=write --bs=1M --size="$SIZE_BYTES" \
    --ioengine=psync --direct=1 --output-format=json --output="$JSON/big.json" >/dev/null

throttle_set "$MAJMIN"
info "throttle: $MAJMIN in $BLKIO (the root cgroup: every process): $((PFS_MIBS * 1048576)) B/s and $PFS_IOPS IOPS, read and write"
# Check it: O_DIRECT runs see the device's pace.
fio --name=chk --filename="$PFS_DIRECT/check.dat" --rw=write --bs=1M --size=256M --ioengine=psync \
    --direct=1 --output-format=json --output="$JSON/chk_w.json" >/dev/null
fio --name=chk --filename="$PFS_DIRECT/check.dat" --rw=read --bs=1M --size=256M --ioengine=psync \
    --direct=1 --output-format=json --output="$JSON/chk_r.json" >/dev/null
fio --name=chk --filename="$PFS_DIRECT/check.dat" --rw=randwrite --bs=4k --size=256M --ioengine=libaio \
    --iodepth=16 --direct=1 --runtime=3 --time_based --output-format=json --output="$JSON/chk_i.json" >/dev/null
rm -f "$PFS_DIRECT/check.dat"
chk_w="$(fmt "$(fio_json "$JSON/chk_w.json" 'j["write"]["bw_bytes"] / 2**20')" 0)"
chk_r="$(fmt "$(fio_json "$JSON/chk_r.json" 'j["read"]["bw_bytes"] / 2**20')" 0)"
chk_i="$(fmt "$(fio_json "$JSON/chk_i.json" 'j["write"]["iops"]')" 0)"
info "throttle check (fio O_DIRECT on the PFS): write $chk_w MiB/s, read $chk_r MiB/s (set $PFS_MIBS); 4 KiB random write, 16 deep: $chk_i IOPS (set $PFS_IOPS)"
for v in "$chk_w" "$chk_r"; do
    "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= 1.25 * float(sys.argv[2]) else 1)' "$v" "$PFS_MIBS" ||
        die "the throttle does not hold: $v MiB/s against $PFS_MIBS MiB/s set"
done
"$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= 1.25 * float(sys.argv[2]) else 1)' "$chk_i" "$PFS_IOPS" ||
    die "the IOPS throttle does not hold: $chk_i IOPS against $PFS_IOPS set"

# ------------------------------------------------------------------ the cache

if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    TUNABLES="$JSON/tunables"
    {
        echo "pfs_roots = $PFS"
        if [[ -n "${BENCH_TUNABLES:-}" ]]; then cat "$BENCH_TUNABLES"; fi
    } >"$TUNABLES"
    cluster_down "$CLUSTER_DIR"
    rm -rf "$CLUSTER_DIR"
    BENCH_CLUSTERS+=("$CLUSTER_DIR")
    cluster_up "$CLUSTER_DIR" "$BENCH_SERVERS" "$CAPACITY" --cache-pfs "$PFS_CACHED" --tunables "$TUNABLES"
    info "cache instance: $BENCH_SERVERS servers (storage under $CLUSTER_DIR/servers), $CAPACITY, a cache of $PFS_CACHED, mounted at $CLUSTER_MNT"
    [[ -f "$CLUSTER_MNT/big.dat" ]] || die "the mount does not show the PFS directory's big.dat"
fi

# ------------------------------------------------------------------ read

# The figures of the parts not run stay "-".
PFS_R=- CACHE_R=- PFS_W=- CACHE_W=- PFS_WP=- CACHE_WP=- PFS_S=- CACHE_S=- CACHE_SP=-
PFS_M=- CACHE_M=- CACHE_MA=-

if part read; then
step "cache: sequential read of a $SIZE PFS file (fio, 1 MiB blocks, caches dropped first)"
pfs_r=() cache_r=() cache_r_cpu=() cache_r_pfs=()
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    drop_caches
    m0="$(pfs_read_mib)" c0="$(cpu_ticks)"
    fio_read "$CLUSTER_MNT/big.dat" "$JSON/fill.json"
    c1="$(cpu_ticks)" m1="$(pfs_read_mib)"
    info "cache: first read (fills the cache) $(fmt "$(fio_json "$JSON/fill.json" 'j["read"]["bw_bytes"] / 2**20')" 0) MiB/s; $((m1 - m0)) MiB read from the PFS; CPU $(cpu_seconds "$c0" "$c1" "$SIZE_BYTES / 2**30") s/GiB"
fi
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    drop_caches
    fio_read "$PFS_CACHED/big.dat" "$JSON/r.json"
    pfs_r+=("$(fio_json "$JSON/r.json" 'j["read"]["bw_bytes"] / 2**20')")
    line="pfs directly $(fmt "${pfs_r[-1]}" 0) MiB/s"
    if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
        drop_caches
        m0="$(pfs_read_mib)" c0="$(cpu_ticks)"
        fio_read "$CLUSTER_MNT/big.dat" "$JSON/r.json"
        c1="$(cpu_ticks)" m1="$(pfs_read_mib)"
        cache_r+=("$(fio_json "$JSON/r.json" 'j["read"]["bw_bytes"] / 2**20')")
        cache_r_cpu+=("$(cpu_seconds "$c0" "$c1" "$SIZE_BYTES / 2**30")")
        cache_r_pfs+=("$((m1 - m0))")
        line+=", cache (second read) $(fmt "${cache_r[-1]}" 0) MiB/s, ${cache_r_pfs[-1]} MiB from the PFS, CPU ${cache_r_cpu[-1]} s/GiB"
    fi
    info "run $rep/$BENCH_REPS: $line"
done
PFS_R="$(fmt "$(median "${pfs_r[@]}")" 0)"
CACHE_R=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    CACHE_R="$(fmt "$(median "${cache_r[@]}")" 0)"
    info "median: pfs directly $PFS_R MiB/s, cache $CACHE_R MiB/s (CPU $(cpu_median "${cache_r_cpu[@]}") s/GiB)"
fi
fi

# ------------------------------------------------------------------ random writes

# to_pfs UNITS FIO_S TOPFS_S: UNITS (writes or MiB) per second counted until on the PFS.
to_pfs() { fmt "$(calc "$1 / ($2 + $3)")" 1; }

if part rand; then
step "cache: $RW_WRITES x 4 KiB random writes ($RW_IO) into a $RW_FILE sparse file, fsync at the end"
pfs_w=() pfs_wp=() cache_w=() cache_wp=() cache_cpu=()
info "warm-up runs of a quarter of the writes (discarded)"
RW_RUN_IO=$((RW_IO_BYTES / 4 / 4096 * 4096))
write_run rand pfs "$PFS_DIRECT" "$PFS_DIRECT" 999
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    write_run rand cache "$CLUSTER_MNT" "$PFS_CACHED" 999
    info "cache warm-up: $(fmt "$IOPS" 0) IOPS; on the PFS's device $TOPFS_S s after fio's exit"
fi
RW_RUN_IO=$RW_IO_BYTES
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    seed=$((1000 + rep))
    write_run rand pfs "$PFS_DIRECT" "$PFS_DIRECT" "$seed"
    pfs_w+=("$IOPS") pfs_wp+=("$(to_pfs "$RW_WRITES" "$FIO_S" "$TOPFS_S")")
    line="pfs directly $(fmt "$IOPS" 0) IOPS (${FIO_S} s)"
    if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
        write_run rand cache "$CLUSTER_MNT" "$PFS_CACHED" "$seed"
        cache_w+=("$IOPS") cache_wp+=("$(to_pfs "$RW_WRITES" "$FIO_S" "$TOPFS_S")") cache_cpu+=("$CPU_S")
        line+=", cache $(fmt "$IOPS" 0) IOPS (${FIO_S} s); after fio's exit the PFS has them on its device at $TOPFS_S s (${cache_wp[-1]} IOPS counted to the PFS); CPU $CPU_S s"
    fi
    info "run $rep/$BENCH_REPS: $line"
done
PFS_W="$(fmt "$(median "${pfs_w[@]}")" 0)"
PFS_WP="$(fmt "$(median "${pfs_wp[@]}")" 0)"
CACHE_W=- CACHE_WP=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    CACHE_W="$(fmt "$(median "${cache_w[@]}")" 0)"
    CACHE_WP="$(fmt "$(median "${cache_wp[@]}")" 0)"
    info "median: pfs directly $PFS_W IOPS, cache $CACHE_W IOPS at the application, $CACHE_WP counted to the PFS (CPU $(cpu_median "${cache_cpu[@]}") s per run)"
fi
fi

# ------------------------------------------------------------------ sequential writes

if part seq; then
step "cache: $SEQ written sequentially in 1 MiB writes into a fresh file, fsync at the end"
pfs_s=() cache_s=() cache_sp=() cache_scpu=()
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    seed=$((2000 + rep))
    write_run seq pfs "$PFS_DIRECT" "$PFS_DIRECT" "$seed"
    pfs_s+=("$(to_pfs "$(calc "$SEQ_BYTES / 2**20")" "$FIO_S" "$TOPFS_S")")
    line="pfs directly ${pfs_s[-1]} MiB/s (${FIO_S} s)"
    if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
        write_run seq cache "$CLUSTER_MNT" "$PFS_CACHED" "$seed"
        cache_s+=("$MIBS") cache_sp+=("$(to_pfs "$(calc "$SEQ_BYTES / 2**20")" "$FIO_S" "$TOPFS_S")") cache_scpu+=("$CPU_S")
        line+=", cache $(fmt "$MIBS" 0) MiB/s (${FIO_S} s); on the PFS's device $TOPFS_S s after fio's exit (${cache_sp[-1]} MiB/s counted to the PFS); CPU $CPU_S s"
    fi
    info "run $rep/$BENCH_REPS: $line"
done
PFS_S="$(fmt "$(median "${pfs_s[@]}")" 0)"
CACHE_S=- CACHE_SP=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    CACHE_S="$(fmt "$(median "${cache_s[@]}")" 0)"
    CACHE_SP="$(fmt "$(median "${cache_sp[@]}")" 0)"
    info "median: pfs directly $PFS_S MiB/s, cache $CACHE_S MiB/s at the application, $CACHE_SP counted to the PFS"
fi
fi

# ------------------------------------------------------------------ mixed

MIXED_MIB="$(calc "($SEQ_BYTES + $RW_IO_BYTES) / 2**20")"
if part mixed; then
step "cache: mixed, the $SEQ stream and the $RW_IO random writer at once"
pfs_m=() cache_m=() cache_ma=()
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    seed=$((3000 + rep))
    mixed_run pfs "$PFS_DIRECT" "$PFS_DIRECT" "$seed"
    pfs_m+=("$(fmt "$(calc "$MIXED_MIB / $ALL_S")" 1)")
    line="pfs directly ${pfs_m[-1]} MiB/s (${ALL_S} s)"
    if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
        mixed_run cache "$CLUSTER_MNT" "$PFS_CACHED" "$seed"
        cache_m+=("$(fmt "$(calc "$MIXED_MIB / $ALL_S")" 1)") cache_ma+=("$(fmt "$(calc "$MIXED_MIB / $APP_S")" 1)")
        line+=", cache ${cache_ma[-1]} MiB/s at the application (${APP_S} s), ${cache_m[-1]} MiB/s counted to the PFS (${ALL_S} s)"
    fi
    info "run $rep/$BENCH_REPS: $line"
done
PFS_M="$(fmt "$(median "${pfs_m[@]}")" 0)"
CACHE_M=- CACHE_MA=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    CACHE_M="$(fmt "$(median "${cache_m[@]}")" 0)"
    CACHE_MA="$(fmt "$(median "${cache_ma[@]}")" 0)"
fi
fi

# ------------------------------------------------------------------ figures

[[ "$PFS_R" == - ]] || report_plain "cache second read ($SIZE)" MiB/s "$PFS_R" "$CACHE_R" "no target; cold, against the PFS directly"
if [[ "$PFS_W" != - ]]; then
    report "cache 4KiB randwrite+fsync" IOPS "$PFS_W" "$CACHE_W" "$RW_TARGET"
    report "cache randwrite to the PFS" IOPS "$PFS_WP" "$CACHE_WP" "$RW_PFS_TARGET"
fi
if [[ "$PFS_S" != - ]]; then
    report_plain "cache 1MiB seqwrite" MiB/s "$PFS_S" "$CACHE_S" "no target; at the application"
    report "cache seqwrite to the PFS" MiB/s "$PFS_S" "$CACHE_SP" "$SEQ_PFS_TARGET"
fi
if [[ "$PFS_M" != - ]]; then
    report_plain "cache mixed at the app" MiB/s "$PFS_M" "$CACHE_MA" "no target; stream + random writer, until both fio exit"
    report_plain "cache mixed to the PFS" MiB/s "$PFS_M" "$CACHE_M" "no target; until both are on the PFS's device"
fi
rc=0
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    bench_cluster_down "$CLUSTER_DIR"
    for t in "$CACHE_W $PFS_W $RW_TARGET randwrite" "$CACHE_WP $PFS_WP $RW_PFS_TARGET randwrite-to-PFS" \
        "$CACHE_SP $PFS_S $SEQ_PFS_TARGET seqwrite-to-PFS"; do
        read -r sw raw target name <<<"$t"
        [[ "$sw" != - && "$raw" != - ]] || continue
        if "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) / float(sys.argv[2]) >= float(sys.argv[3]) else 1)' \
            "$sw" "$raw" "$target"; then
            printf 'target %s %sx: pass\n' "$name" "$target"
        else
            printf 'target %s %sx: fail\n' "$name" "$target"
            rc=2
        fi
    done
fi
# 2: a target was missed (bench/all.sh reads the FAIL row too).
if ((rc != 0)); then exit "$rc"; fi
