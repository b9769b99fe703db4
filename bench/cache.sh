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
#              file shows every block written (`fio --verify_only` with the same seed:
#              the crc32c fio put in each block, read through the PFS's page cache), and
#              until, besides, none of the file's pages is dirty or under writeback
#              (cachestat(2)): the blocks are on the PFS's device. The servers write
#              behind with pwrite and then fdatasync, so the first comes long before the
#              second. For the PFS-direct run both are 0 (its fsync put them there);
#              they are checked once to show the checks work.
#   CPU        seconds of the cluster's processes (servers and mount, all threads) per GiB
#              of the second read, and per randwrite run including its write-behind.
# Target (issue 18): randwrite >= 5x the PFS directly. The read ratio has no target.
#
#   bench/cache.sh                  (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK, BENCH_TUNABLES:
#                                    see bench/lib.sh; BENCH_TUNABLES is added to the
#                                    cluster's tunables file)
#   CACHE_BENCH_SIZE=4G             the file read (CACHE_BENCH_SIZE=1G for a quick run)
#   CACHE_BENCH_RW_FILE=1G          the file written at random
#   CACHE_BENCH_RW_IO=64M           bytes of 4 KiB random writes into it per run
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
RW_TARGET=5

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


# elapsed T0: seconds since EPOCHREALTIME T0.
elapsed() { fmt "$(calc "$EPOCHREALTIME - $1")" 2; }

# fio_read FILE OUT: one sequential read of FILE, 1 MiB blocks.
fio_read() {
    fio --name=read --filename="$1" --rw=read --bs=1M --ioengine=psync \
        --output-format=json --output="$2" >/dev/null
}

# The random writes: every 4 KiB block written once (fio's random map), in an order given
# by the seed; verify=crc32c puts a checksummed header in each block, so that `fio
# --verify_only` with the same seed can later check the blocks wherever the file is.
# RW_RUN_IO: bytes written by the next runs (a warm-up writes a quarter).
RW_RUN_IO=$RW_IO_BYTES
RW_OPTS=(--name=randwrite --rw=randwrite --bs=4k --size="$RW_FILE_BYTES" --ioengine=psync
    --fallocate=none --verify=crc32c --verify_state_save=0)

# fio_randwrite FILE SEED OUT: the writes, then one fsync.
fio_randwrite() {
    (cd "$JSON" && fio --filename="$1" "${RW_OPTS[@]}" --io_size="$RW_RUN_IO" --randseed="$2" --end_fsync=1 --do_verify=0 \
        --output-format=json --output="$3" >/dev/null)
}

# holds FILE SEED: true when FILE holds every block fio_randwrite SEED wrote (read through
# the page cache: invalidate=0).
holds() {
    (cd "$JSON" && fio --filename="$1" "${RW_OPTS[@]}" --io_size="$RW_RUN_IO" --randseed="$2" --verify_only=1 \
        --verify_fatal=1 --invalidate=0 --output="$JSON/verify.txt" >/dev/null 2>&1)
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

# randwrite_run LABEL DIR PFS_FILE SEED: one run into a fresh sparse DIR/rw.dat; sets
# IOPS, FIO_S (fio's seconds, writes + fsync), SEEN_S (from fio's exit until PFS_FILE
# shows every block written, in its page cache), TOPFS_S (until it shows them and none
# of its pages is dirty or under writeback: they are on the PFS's device) and CPU_S (the
# cluster's CPU seconds over all of it; "-" for the PFS directly, where both are 0).
randwrite_run() {
    local label=$1 dir=$2 pfs_file=$3 seed=$4 c0=- c1=- t0 polls=0
    rm -f "$dir/rw.dat"
    truncate -s "$RW_FILE_BYTES" "$dir/rw.dat"
    sync
    [[ "$label" == pfs ]] || c0="$(cpu_ticks)"
    fio_randwrite "$dir/rw.dat" "$seed" "$JSON/rw.json"
    t0=$EPOCHREALTIME
    SEEN_S=""
    while :; do
        if [[ -z "$SEEN_S" ]] && holds "$pfs_file" "$seed"; then
            SEEN_S="$(elapsed "$t0")"
        fi
        if [[ -n "$SEEN_S" ]] && pfs_clean "$pfs_file"; then
            break
        fi
        polls=$((polls + 1))
        if [[ "$label" == pfs ]]; then
            die "$pfs_file does not hold the blocks fio wrote and fsynced, or has dirty pages ($(grep -m1 -i 'verify' "$JSON/verify.txt" || true))"
        fi
        if (($(fmt "$(calc "$EPOCHREALTIME - $t0")" 0) > PFS_WAIT)); then
            die "$label: the PFS did not hold the writes $PFS_WAIT s after fio's exit (shown: ${SEEN_S:-no, $(grep -m1 -i 'verify' "$JSON/verify.txt" || true)}; logs: $CLUSTER_DIR/logs/)"
        fi
        sleep 0.2
    done
    TOPFS_S="$(elapsed "$t0")"
    [[ "$label" == pfs ]] || c1="$(cpu_ticks)"
    CPU_S="$(cpu_seconds "$c0" "$c1")"
    IOPS="$(fio_json "$JSON/rw.json" 'j["write"]["iops"]')"
    FIO_S="$(fio_json "$JSON/rw.json" 'j["job_runtime"] / 1000')"
    if [[ $polls -eq 0 ]]; then SEEN_S=0 TOPFS_S=0; fi
    rm -f "$dir/rw.dat"
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
img_gib=$(((SIZE_BYTES + 2 * RW_FILE_BYTES) / 1073741824 + 2))
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
    info "median: pfs directly $PFS_R MiB/s, cache $CACHE_R MiB/s (CPU $(fmt "$(median "${cache_r_cpu[@]}")" 2) s/GiB)"
fi

# ------------------------------------------------------------------ random writes

step "cache: $RW_WRITES x 4 KiB random writes ($RW_IO) into a $RW_FILE sparse file, fsync at the end"
pfs_w=() pfs_ws=() cache_w=() cache_ws=() cache_seen=() cache_topfs=() cache_cpu=()
info "warm-up runs of a quarter of the writes (discarded)"
RW_RUN_IO=$((RW_IO_BYTES / 4 / 4096 * 4096))
randwrite_run pfs "$PFS_DIRECT" "$PFS_DIRECT/rw.dat" 999
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    randwrite_run cache "$CLUSTER_MNT" "$PFS_CACHED/rw.dat" 999
    info "cache warm-up: $(fmt "$IOPS" 0) IOPS; on the PFS's device $TOPFS_S s after fio's exit"
fi
RW_RUN_IO=$RW_IO_BYTES
for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    seed=$((1000 + rep))
    randwrite_run pfs "$PFS_DIRECT" "$PFS_DIRECT/rw.dat" "$seed"
    pfs_w+=("$IOPS") pfs_ws+=("$FIO_S")
    line="pfs directly $(fmt "$IOPS" 0) IOPS (${FIO_S} s)"
    if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
        randwrite_run cache "$CLUSTER_MNT" "$PFS_CACHED/rw.dat" "$seed"
        cache_w+=("$IOPS") cache_ws+=("$FIO_S") cache_seen+=("$SEEN_S") cache_topfs+=("$TOPFS_S") cache_cpu+=("$CPU_S")
        line+=", cache $(fmt "$IOPS" 0) IOPS (${FIO_S} s); after fio's exit the PFS shows them at $SEEN_S s, has them on its device at $TOPFS_S s; CPU $CPU_S s"
    fi
    info "run $rep/$BENCH_REPS: $line"
done
PFS_W="$(fmt "$(median "${pfs_w[@]}")" 0)"
PFS_WS="$(fmt "$(median "${pfs_ws[@]}")" 2)"
CACHE_W=- CACHE_ALL=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    CACHE_W="$(fmt "$(median "${cache_w[@]}")" 0)"
    CACHE_WS="$(fmt "$(median "${cache_ws[@]}")" 2)"
    CACHE_SEEN="$(fmt "$(median "${cache_seen[@]}")" 2)"
    CACHE_TOPFS="$(fmt "$(median "${cache_topfs[@]}")" 2)"
    CACHE_ALL="$(fmt "$(calc "$CACHE_WS + $CACHE_TOPFS")" 2)"
    info "median: pfs directly $PFS_W IOPS ($PFS_WS s), cache $CACHE_W IOPS ($CACHE_WS s; the PFS shows them $CACHE_SEEN s after fio's exit, has them on its device at $CACHE_TOPFS s; CPU $(fmt "$(median "${cache_cpu[@]}")" 2) s per run)"
    bench_cluster_down "$CLUSTER_DIR"
fi

# ------------------------------------------------------------------ figures

report_plain "cache second read ($SIZE)" MiB/s "$PFS_R" "$CACHE_R" "no target; cold, against the PFS directly"
report "cache 4KiB randwrite+fsync" IOPS "$PFS_W" "$CACHE_W" "$RW_TARGET"
rc=0
if [[ "$CACHE_W" != - ]]; then
    if "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) / float(sys.argv[2]) >= float(sys.argv[3]) else 1)' \
        "$CACHE_W" "$PFS_W" "$RW_TARGET"; then
        printf 'target %sx: pass\n' "$RW_TARGET"
    else
        printf 'target %sx: fail\n' "$RW_TARGET"
        rc=2
    fi
    printf '%-28s pfs directly %s s (fio; its fsync put them there) | cache %s s (fio) + %s s (write-behind; shown by the PFS at %s s) = %s s\n' \
        "randwrite on the PFS's disk" "$PFS_WS" "$CACHE_WS" "$CACHE_TOPFS" "$CACHE_SEEN" "$CACHE_ALL"
fi
# 2: a target was missed (bench/all.sh reads the FAIL row too).
if ((rc != 0)); then exit "$rc"; fi
