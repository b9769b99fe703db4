#!/usr/bin/env bash
# SQLite inserts, one transaction each (the NERSC burst-buffer SQLite case): the sqlite3
# shell runs a script of 2,500 x "BEGIN; INSERT ...; COMMIT;" against a new database, with
# SQLite's defaults (journal_mode=DELETE, synchronous=FULL): every commit creates, writes,
# fsyncs and deletes a rollback journal and fsyncs the database.
# Figure: inserts/s (2,500 / wall time of the sqlite3 run). Raw = the same in a directory of
# the file system that holds the servers' storage roots. 1 client, 2 servers; after each
# mount a warm-up of 250 inserts into another database is discarded.
#
#   bench/sqlite.sh            (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK: see bench/lib.sh)
#   BENCH_SQLITE_INSERTS=2500
#   BENCH_SQLITE_TARGET=0.3    ratio counted as a pass (a proposed bar: fsync- and create-bound)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

INSERTS="${BENCH_SQLITE_INSERTS:-2500}"
TARGET="${BENCH_SQLITE_TARGET:-0.3}"
RAW_DIR="$BENCH_WORK/sqlite-raw"
CLUSTER_DIR="$BENCH_WORK/sqlite-cluster"

bench_init
BENCH_REMOVE+=("$RAW_DIR" "$CLUSTER_DIR")
SQL="$(mktemp -d)"
BENCH_REMOVE+=("$SQL")

sqlite_inserts_sql "$INSERTS" "$SQL/inserts.sql"
sqlite_inserts_sql 250 "$SQL/warmup.sql"
SCHEMA='CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT NOT NULL, value TEXT NOT NULL);'

# run_inserts DB SCRIPT: create the table, then time the inserts; print inserts/s
run_inserts() {
    local db=$1 script=$2 n t0 t1
    n="$(grep -c '^INSERT' "$script")"
    rm -f "$db" "$db-journal"
    sqlite3 "$db" "$SCHEMA"
    t0=$EPOCHREALTIME
    sqlite3 -bail "$db" <"$script" >/dev/null
    t1=$EPOCHREALTIME
    [[ "$(sqlite3 "$db" 'SELECT count(*) FROM t;')" == "$n" ]] || die "row count mismatch in $db"
    calc "$n / ($t1 - $t0)"
}

# measure LABEL DIR: warm-up, then BENCH_REPS runs on a new database each; sets RATE_MED
measure() {
    local label=$1 dir=$2 rates=() rep
    info "$label: warm-up of 250 inserts (discarded)"
    run_inserts "$dir/warmup.db" "$SQL/warmup.sql" >/dev/null
    rm -f "$dir/warmup.db"
    for ((rep = 1; rep <= BENCH_REPS; rep++)); do
        rates+=("$(run_inserts "$dir/bench.db" "$SQL/inserts.sql")")
        info "$label run $rep/$BENCH_REPS: $(fmt "${rates[-1]}" 0) inserts/s"
    done
    rm -f "$dir/bench.db"
    RATE_MED="$(fmt "$(median "${rates[@]}")" 0)"
    info "$label median: $RATE_MED inserts/s"
}

step "sqlite: $INSERTS inserts, one transaction each, default journal mode and synchronous; raw on $(findmnt -rn -o SOURCE,FSTYPE -T "$BENCH_WORK" | head -n1)"
rm -rf "$RAW_DIR"
mkdir -p "$RAW_DIR"
measure raw "$RAW_DIR"
RAW_RATE=$RATE_MED
rm -rf "$RAW_DIR"

SW_RATE=-
if [[ "$BENCH_RAW_ONLY" != 1 ]]; then
    step "sqlite: Spillway, 1 client, $BENCH_SERVERS servers (storage roots under $CLUSTER_DIR/servers)"
    bench_cluster_up "$CLUSTER_DIR" 1G
    measure spillway "$CLUSTER_MNT"
    SW_RATE=$RATE_MED
    bench_cluster_down "$CLUSTER_DIR"
fi

report "sqlite 1-insert txns" inserts/s "$RAW_RATE" "$SW_RATE" "$TARGET"
