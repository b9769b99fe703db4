#!/usr/bin/env bash
# Per-job overhead of the burst-buffer phases through real Slurm (bench/jobs.py): setup
# to pre-run done, and post-run to teardown done, for a 1 GiB instance with no staging,
# median of BENCH_JOBS=10 jobs, against a job without a burst buffer in the same run.
# Target: < 2 s each. Uses the system munged and Debian's Slurm (scripts/setup.sh).
#
# Exit status: 0 targets met; 1 the benchmark failed to run; 2 a target was missed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/common.sh
source "$HERE/../scripts/lib/common.sh"
require_root
require_spillway
step "jobs: burst-buffer phase overhead per job through Slurm"
exec "$PY" "$HERE/jobs.py"
