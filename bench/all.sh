#!/usr/bin/env bash
# Runs every Spillway benchmark (1 client, 2 servers, each figure as a ratio against the raw
# backing storage measured in the same run) and prints a summary table.
#
#   bench/all.sh               (BENCH_REPS, BENCH_RAW_ONLY, BENCH_WORK: see bench/lib.sh)
#
# Exit status: 0 all targets met; 1 a benchmark failed to run; 2 all ran, a target was missed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/common.sh
source "$HERE/../scripts/lib/common.sh"

require_root
BENCHES=(seq_io randwrite_fsync fsmark sqlite control_plane staging jobs)
BENCH_RESULTS="$(mktemp)"
export BENCH_RESULTS
trap 'rm -f "$BENCH_RESULTS"' EXIT

started="$(date -u '+%Y-%m-%d %H:%M UTC')"
SECONDS=0
errors=()
for b in "${BENCHES[@]}"; do
    rc=0
    "$HERE/$b.sh" || rc=$?
    # 2: it ran and reported its rows, a target among them missed (staging.py says so).
    if [[ $rc -ne 0 && $rc -ne 2 ]]; then
        errors+=("$b")
        printf '%s\t-\t-\t-\t-\t-\tERROR\n' "$b.sh" >>"$BENCH_RESULTS"
    fi
done

printf '\n==> Summary (%s, %d s, commit %s, %s reps each, median)\n\n' "$started" "$SECONDS" \
    "$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo unknown)" "${BENCH_REPS:-3}"
"$PY" - "$BENCH_RESULTS" <<'PYEOF'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
head = ["figure", "raw", "spillway", "ratio", "target", "result"]
table = [head] + [
    [f, f"{raw} {unit}" if raw != "-" else "-", f"{sw} {unit}" if sw != "-" else "-",
     f"{ratio}x" if ratio != "-" else "-",
     target if target.startswith("<") or target == "-" else f">= {target}x", verdict]
    for f, unit, raw, sw, ratio, target, verdict in rows
]
widths = [max(len(r[i]) for r in table) for i in range(len(head))]
for n, r in enumerate(table):
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if n == 0:
        print("  ".join("-" * w for w in widths))
PYEOF

if ((${#errors[@]})); then
    printf '\nbenchmarks that failed to run: %s\n' "${errors[*]}"
    exit 1
fi
if grep -q $'\tFAIL$' "$BENCH_RESULTS"; then
    printf '\nsome targets were missed\n'
    exit 2
fi
