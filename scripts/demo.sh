#!/usr/bin/env bash
# Spillway end to end, on one machine: a local site (the manager over HTTPS with MUNGE,
# 2 storage servers, an agent for this machine), a persistent instance created with dwcli
# and mounted by the agent, a few hundred MB of real data copied in and verified byte for
# byte, stripes shown spread over the servers, dwstat, then the instance destroyed and
# the site torn down. Exits non-zero on any failure; always tears down.
#
#   scripts/demo.sh
#   SPILLWAY_DEMO_DIR=/tmp/spillway-demo   site directory (servers, manager, logs, mounts)
#   SPILLWAY_DEMO_KEEP=1                   leave the site running at the end
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/common.sh"

DEMO_DIR="${SPILLWAY_DEMO_DIR:-/tmp/spillway-demo}"
SRC_DIR="${DEMO_DIR}-src"
SERVERS=2
CAPACITY=4G
DATASETS=(/usr/share/doc /usr/include)
KEEP="${SPILLWAY_DEMO_KEEP:-0}"
TORN_DOWN=0

teardown() {
    local rc=$?
    set +e
    if [[ "$KEEP" == 1 && $rc -eq 0 ]]; then
        printf '\nSPILLWAY_DEMO_KEEP=1: the site is still up, the instance mounted at %s (stop it with: %s local down --dir %s)\n' \
            "${MNT:-?}" "$SPILLWAY_BIN" "$DEMO_DIR"
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
    rm -rf "$SRC_DIR"
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

step "2/7 Start a local site and get a $CAPACITY persistent instance mounted through the control plane"
if [[ -e "$DEMO_DIR" ]]; then
    info "removing the leftovers of an earlier run in $DEMO_DIR"
    site_down
    [[ -z "$(mounts_under "$DEMO_DIR")" ]] || die "could not unmount the old $DEMO_DIR"
    rm -rf "$DEMO_DIR"
fi
NODE="$(hostname)"
info "\$ spillway local up --dir $DEMO_DIR --servers $SERVERS --server-capacity $CAPACITY --node $NODE"
bounded 120 "$SPILLWAY_BIN" local up --dir "$DEMO_DIR" --servers "$SERVERS" \
    --server-capacity "$CAPACITY" --granularity 1GiB --node "$NODE" | sed 's/^/      /'
export SPILLWAY_CONFIG="$DEMO_DIR/spillway.conf"
DWCLI="$SPILLWAY_REPO/target/release/dwcli"
DWSTAT="$SPILLWAY_REPO/target/release/dwstat"
# dwcli_id ARGS...: run `dwcli --json ARGS` (echoing the command) and print the new object's id.
dwcli_id() {
    info "\$ dwcli $*" >&2
    "$DWCLI" --json "$@" | jq -er '.id'
}
SESSION=$(dwcli_id create session --token demo --owner 0 --creator CLI --hosts "$NODE")
INSTANCE=$(dwcli_id create instance --capacity "$CAPACITY" --session "$SESSION" --pool wlm_pool --label demo)
CONF=$(dwcli_id create configuration --type scratch --access-mode stripe --root-permissions 0755 --instance "$INSTANCE")
t0=$EPOCHREALTIME
ACTIVATION=$(dwcli_id create activation --session "$SESSION" --configuration "$CONF")
MNT=$("$DWCLI" --json ls activations | jq -er ".activations[] | select(.id == $ACTIVATION) | .mount")
for _ in $(seq 1 300); do
    findmnt -rn --mountpoint "$MNT" >/dev/null && break
    sleep 0.1
done
findmnt -rn --mountpoint "$MNT" >/dev/null || die "the agent did not mount activation $ACTIVATION at $MNT (see $DEMO_DIR/logs/agent.log)"
info "the agent mounted it at $MNT, $(fmt "$(calc "($EPOCHREALTIME - $t0) * 1000")" 0) ms after the activation was asked for"
info "servers' storage roots: $(echo "$DEMO_DIR"/servers/s*)"
info "\$ dwstat instances"
"$DWSTAT" instances | sed 's/^/      /'
df -h "$MNT" | sed 's/^/    /'

step "3/7 Copy a real data set in: ${DATASETS[*]} and 256 MiB of random data"
mkdir -p "$SRC_DIR"
head -c 256M /dev/urandom >"$SRC_DIR/random-256MiB.bin"
SOURCES=("${DATASETS[@]}" "$SRC_DIR/random-256MiB.bin")
total_bytes=0
for s in "${SOURCES[@]}"; do
    total_bytes=$((total_bytes + $(du -sb --apparent-size "$s" | cut -f1)))
done
files=$(find "${SOURCES[@]}" -type f | wc -l)
links=$(find "${SOURCES[@]}" -type l | wc -l)
info "$files files, $links symlinks, $((total_bytes / 1048576)) MiB"
t0=$EPOCHREALTIME
for s in "${SOURCES[@]}"; do
    ts=$EPOCHREALTIME
    cp -a "$s" "$MNT/"
    info "\$ cp -a $s $MNT/    ($(fmt "$(calc "$EPOCHREALTIME - $ts")" 1) s)"
done
sync -f "$MNT"
t1=$EPOCHREALTIME
info "copied in $(fmt "$(calc "$t1 - $t0")" 1) s ($(fmt "$(calc "$total_bytes / 1048576 / ($t1 - $t0)")" 0) MiB/s, including sync)"

step "4/7 Read everything back from the servers and compare (sha256 of every file, symlink targets, modes)"
info "dropping the page cache, so that reads go to the servers"
drop_caches
# manifest DIR: one line per entry below DIR: type, mode, size and sha256 (files) or target (links)
manifest() {
    (
        cd "$1"
        find . -mindepth 1 \( -type d -printf 'dir  %M %p\n' \) -o \
            \( -type l -printf 'link %p -> %l\n' \) -o \
            \( -type f -printf 'file %M %s %p\n' \) -o -printf 'other %y %p\n'
        find . -type f -print0 | xargs -0 -r sha256sum
    ) | LC_ALL=C sort
}
for s in "${SOURCES[@]}"; do
    name="$(basename "$s")"
    if [[ -d "$s" ]]; then
        manifest "$s" >"$SRC_DIR/$name.want"
        manifest "$MNT/$name" >"$SRC_DIR/$name.got"
    else
        (cd "$(dirname "$s")" && sha256sum "$name") >"$SRC_DIR/$name.want"
        (cd "$MNT" && sha256sum "$name") >"$SRC_DIR/$name.got"
    fi
    if ! diff -u "$SRC_DIR/$name.want" "$SRC_DIR/$name.got" >"$SRC_DIR/$name.diff"; then
        printf '\nMISMATCH between %s and %s (first differences):\n' "$s" "$MNT/$name" >&2
        head -n 40 "$SRC_DIR/$name.diff" >&2
        die "data read back from Spillway differs from what was written ($name)"
    fi
    if [[ -d "$s" ]]; then
        info "$name/: $(grep -c '^file ' "$SRC_DIR/$name.want" || true) files, $(grep -c '^link ' "$SRC_DIR/$name.want" || true) symlinks, $(grep -c '^dir ' "$SRC_DIR/$name.want" || true) directories: identical"
    else
        info "$name: sha256 $(cut -c1-16 "$SRC_DIR/$name.want")...: identical"
    fi
done

step "5/7 How the 256 MiB file is striped over the servers"
info "\$ spillway stripes $MNT/random-256MiB.bin"
spillway stripes "$MNT/random-256MiB.bin" >"$SRC_DIR/stripes.txt"
head -n 4 "$SRC_DIR/stripes.txt" | sed 's/^/      /'
info "  ... ($(wc -l <"$SRC_DIR/stripes.txt") stripes)"
awk '$1 == "stripe" { n[$4 " " $5]++; b[$4 " " $5] += $7 }
     END { for (s in n) printf "    server %s: %d stripes, %.1f MiB\n", s, n[s], b[s] / 1048576 }' \
    "$SRC_DIR/stripes.txt" | sort
servers_used=$(awk '$1 == "stripe" { print $4 }' "$SRC_DIR/stripes.txt" | sort -u | wc -l)
((servers_used == SERVERS)) || die "the 256 MiB file's stripes are on $servers_used server(s), expected all $SERVERS"
info "bytes on each server's storage root (all data, all metadata):"
for s in "$DEMO_DIR"/servers/s*; do
    printf '      %-40s %8.1f MiB\n' "$s" "$(calc "$(du -sb "$s" | cut -f1) / 1048576")"
done
info "\$ dwstat most; dwstat nodes; dwstat fragments"
"$DWSTAT" most | sed 's/^/      /'
"$DWSTAT" nodes fragments | sed 's/^/      /'

if [[ "$KEEP" == 1 ]]; then
    step "6/7 Leaving the site up (SPILLWAY_DEMO_KEEP=1)"
    rm -rf "$SRC_DIR"
    exit 0
fi

step "6/7 Destroy the instance, then tear the site down"
info "\$ dwcli rm session --id $SESSION"
"$DWCLI" rm session --id "$SESSION" | sed 's/^/      /'
for _ in $(seq 1 300); do
    [[ "$("$DWCLI" --json ls sessions | jq '.sessions | length')" == 0 ]] && break
    sleep 0.1
done
[[ "$("$DWCLI" --json ls sessions | jq '.sessions | length')" == 0 ]] || die "the session was not destroyed"
! findmnt -rn --mountpoint "$MNT" >/dev/null || die "$MNT is still mounted after the destroy"
for s in "$DEMO_DIR"/servers/s*; do
    [[ -z "$(ls -A "$s/fragments")" ]] || die "$s still holds fragments after the destroy"
done
info "unmounted, fragments gone from every server, session gone"
info "\$ spillway local down --dir $DEMO_DIR"
TORN_DOWN=1
bounded 120 "$SPILLWAY_BIN" local down --dir "$DEMO_DIR" --keep-data || die "spillway local down failed"

step "7/7 Check that nothing is left behind"
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

printf '\nDemo passed: %d MiB (%d files) went through Spillway and came back identical.\n' \
    "$((total_bytes / 1048576))" "$files"
