#!/usr/bin/env bash
# Control-plane latencies: create-to-mounted and destroy (median of BENCH_CP_REPS=20),
# and `dwstat sessions` with BENCH_CP_SESSIONS=1000 sessions, on a local site (manager,
# 2 servers, agent), each against its data-plane or database floor measured in the same
# run. Targets: create-to-mounted < 1 s, dwstat < 100 ms. Uses the system munged.
#
# Exit status: 0 targets met; 1 the benchmark failed to run; 2 a target was missed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/common.sh
source "$HERE/../scripts/lib/common.sh"
require_root
step "control plane: create-to-mounted, destroy, dwstat sessions"
exec "$PY" "$HERE/control_plane.py"
