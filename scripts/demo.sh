#!/usr/bin/env bash
# Spillway end to end, on one machine, the way HPC users use a burst buffer: a job script
# with #DW lines (examples/job.sh.in) run by `spillway run` on a local site (the manager
# over HTTPS with MUNGE, 2 storage servers, an agent for this machine, a directory as the
# PFS). The job stages a data set in, computes on it in its instance, and stages the
# results out; the demo checks the results against the data on the PFS, shows dwstat
# before, during (from inside the job) and after, and that nothing is left. Exits
# non-zero on any failure; always tears down.
#
#   scripts/demo.sh            the job with `spillway run`
#   scripts/demo.sh --slurm    the same job through real Slurm: Debian's slurmctld and
#                              slurmd with burst_buffer/datawarp and the installed
#                              dw_wlm_cli (scripts/lib/slurm_demo.py), submitted with sbatch
#   SPILLWAY_DEMO_DIR=/tmp/spillway-demo   site directory (servers, manager, logs, mounts);
#                                          the PFS is $SPILLWAY_DEMO_DIR-pfs
#   SPILLWAY_DEMO_KEEP=1                   leave the site running at the end
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/common.sh"

DEMO_DIR="${SPILLWAY_DEMO_DIR:-/tmp/spillway-demo}"
PFS="${DEMO_DIR}-pfs"
SERVERS=2
CAPACITY=4G
DEMO_USER=spwdemo
DATASETS=(/usr/share/doc /usr/share/common-licenses)
KEEP="${SPILLWAY_DEMO_KEEP:-0}"
TORN_DOWN=0
SLURM=0
case "${1:-}" in
"") ;;
--slurm) SLURM=1 ;;
*)
    printf 'usage: %s [--slurm]\n' "$0" >&2
    exit 2
    ;;
esac

teardown() {
    local rc=$?
    set +e
    if [[ "$KEEP" == 1 && $rc -eq 0 ]]; then
        printf '\nSPILLWAY_DEMO_KEEP=1: the site is still up (stop it with: %s local down --dir %s)\n' \
            "$SPILLWAY_BIN" "$DEMO_DIR"
    elif [[ $TORN_DOWN == 0 ]]; then
        if [[ $rc -ne 0 ]]; then
            printf '\nThe demo failed (exit %d); tearing down.\n' "$rc" >&2
            if [[ -d "$DEMO_DIR/logs" ]]; then
                rm -rf "${DEMO_DIR}-logs"
                cp -a "$DEMO_DIR/logs" "${DEMO_DIR}-logs" &&
                    printf 'Server and client logs kept in %s\n' "${DEMO_DIR}-logs" >&2
            fi
        fi
        site_down
        kill_run_processes
        [[ -n "$(mounts_under "$DEMO_DIR")" ]] || rm -rf "$DEMO_DIR"
    fi
    [[ "$KEEP" == 1 && $rc -eq 0 ]] || rm -rf "$PFS" "${DEMO_DIR}-slurm"
    exit "$rc"
}
# site_down: stop the local site (if any) and whatever it left mounted.
site_down() {
    if [[ -f "$DEMO_DIR/local.json" ]]; then
        bounded 120 "$SPILLWAY_BIN" local down --dir "$DEMO_DIR" --keep-data || true
    fi
    local m
    for m in $(mounts_under "$DEMO_DIR"); do
        umount -l "$m" 2>/dev/null || true
    done
}
trap teardown EXIT
trap 'exit 130' INT TERM

require_root

step "1/7 Setup: packages, toolchain and release build (scripts/setup.sh)"
"$SPILLWAY_REPO/scripts/setup.sh"
require_spillway

step "2/7 Start a local site with a PFS directory"
if [[ -e "$DEMO_DIR" || -e "$PFS" ]]; then
    info "removing the leftovers of an earlier run in $DEMO_DIR"
    site_down
    [[ -z "$(mounts_under "$DEMO_DIR")" ]] || die "could not unmount the old $DEMO_DIR"
    rm -rf "$DEMO_DIR" "$PFS"
fi
install -d -m 0755 "$PFS"
NODE="$(hostname)"
info "\$ spillway local up --dir $DEMO_DIR --servers $SERVERS --server-capacity $CAPACITY --node $NODE --pfs-root $PFS"
# Slurm runs dw_wlm_cli as its SlurmUser, which must be a Spillway admin.
ADMIN=()
((SLURM == 0)) || ADMIN=(--admin-group "$(id -gn slurm)")
bounded 120 "$SPILLWAY_BIN" local up --dir "$DEMO_DIR" --servers "$SERVERS" \
    --server-capacity "$CAPACITY" --granularity 1GiB --node "$NODE" --pfs-root "$PFS" \
    "${ADMIN[@]}" | sed 's/^/      /'
export SPILLWAY_CONFIG="$DEMO_DIR/spillway.conf"
DWSTAT="$SPILLWAY_REPO/target/release/dwstat"
info "\$ dwstat pools"
"$DWSTAT" pools | sed 's/^/      /'

step "3/7 A user, and a data set on the PFS: ${DATASETS[*]} and 256 MiB of random data"
# Burst-buffer jobs run as an unprivileged user (Slurm refuses them to root).
if ! id "$DEMO_USER" >/dev/null 2>&1; then
    useradd -M -U -c "spillway demo" -s /bin/bash -d /nonexistent "$DEMO_USER"
    info "created the user $DEMO_USER"
fi
mkdir -p "$PFS/dataset"
for s in "${DATASETS[@]}"; do
    cp -a "$s" "$PFS/dataset/"
done
head -c 256M /dev/urandom >"$PFS/dataset/random-256MiB.bin"
chown -R "$DEMO_USER:" "$PFS"
files=$(find "$PFS/dataset" -type f | wc -l)
total_bytes=$(du -sb --apparent-size "$PFS/dataset" | cut -f1)
info "$PFS/dataset: $files files, $((total_bytes / 1048576)) MiB, owned by $DEMO_USER"

step "4/7 The job script"
sed "s|@PFS@|$PFS|g" "$SPILLWAY_REPO/examples/job.sh.in" >"$PFS/job.sh"
chown "$DEMO_USER:" "$PFS/job.sh"
sed 's/^/      /' "$PFS/job.sh"

t0=$EPOCHREALTIME
if ((SLURM)); then
    step "5/7 Submit it to Slurm: \$ sbatch $PFS/job.sh (as $DEMO_USER)"
    rm -rf "${DEMO_DIR}-slurm"
    bounded 900 "$PY" "$SPILLWAY_REPO/scripts/lib/slurm_demo.py" "${DEMO_DIR}-slurm" \
        "$SPILLWAY_CONFIG" "$DEMO_USER" "$PFS/job.sh"
    rm -rf "${DEMO_DIR}-slurm"
else
    step "5/7 Run it: \$ spillway run --user $DEMO_USER $PFS/job.sh"
    bounded 600 "$SPILLWAY_BIN" run --user "$DEMO_USER" --chdir "$PFS" "$PFS/job.sh" | sed 's/^/    /'
fi
info "the whole job took $(fmt "$(calc "$EPOCHREALTIME - $t0")" 1) s"

step "6/7 The results on the PFS, checked against the data set"
find "$PFS/results" -printf '      %M %u %8s %p\n'
(cd "$PFS/dataset" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) >"$PFS/want.sha256sums"
if ! diff -u "$PFS/want.sha256sums" "$PFS/results/sha256sums" >"$PFS/diff"; then
    head -n 40 "$PFS/diff" >&2
    die "the checksums computed in the instance differ from the data set on the PFS"
fi
owner="$(stat -c %U "$PFS/results/sha256sums")"
[[ "$owner" == "$DEMO_USER" ]] || die "the results belong to $owner, not $DEMO_USER"
info "all $files checksums computed inside the instance match the PFS copy; results owned by $DEMO_USER"
info "largest files (computed in the instance):"
sed 's/^/      /' "$PFS/results/largest"
info "\$ dwstat sessions instances   (after the job: its instance is gone)"
"$DWSTAT" sessions instances | sed 's/^/      /'
[[ "$("$DWSTAT" --json sessions | jq '.sessions | length')" == 0 ]] || die "a session is left after the job"

if [[ "$KEEP" == 1 ]]; then
    step "7/7 Leaving the site up (SPILLWAY_DEMO_KEEP=1)"
    exit 0
fi

step "7/7 Tear the site down and check that nothing is left behind"
info "\$ spillway local down --dir $DEMO_DIR"
TORN_DOWN=1
bounded 120 "$SPILLWAY_BIN" local down --dir "$DEMO_DIR" --keep-data || die "spillway local down failed"
left_mounts="$(mounts_under "$DEMO_DIR")"
left_procs="$("${SWEEP[@]}" procs "$DEMO_DIR" || true)"
left_tagged="$("${SWEEP[@]}" tagged "$SPILLWAY_RUN_TAG" || true)"
if [[ -n "$left_mounts" || -n "$left_procs" || -n "$left_tagged" ]]; then
    [[ -z "$left_mounts" ]] || printf 'still mounted:\n%s\n' "$left_mounts" >&2
    [[ -z "$left_procs$left_tagged" ]] || printf 'still running:\n%s\n%s\n' "$left_procs" "$left_tagged" >&2
    TORN_DOWN=0 # let the exit trap clean up
    die "spillway local down left things behind"
fi
info "no mount under $DEMO_DIR, no process of this site"
rm -rf "$DEMO_DIR"

printf '\nDemo passed: a job staged %d MiB (%d files) in, computed on it in its burst buffer, and staged its results out.\n' \
    "$((total_bytes / 1048576))" "$files"
