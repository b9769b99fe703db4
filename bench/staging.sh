#!/usr/bin/env bash
# Staging throughput: one 4 GiB file and 5,000 files of 64 KiB, staged in (PFS ->
# instance) and out (instance -> PFS) through the manager on a local site with 2
# servers, each against `cp -a` of the same data on this machine in the same run.
# Targets: >= 1.0x cp for the large file, >= 1.5x for the small files.
#
# Exit status: 0 targets met; 1 the benchmark failed to run; 2 a target was missed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/common.sh
source "$HERE/../scripts/lib/common.sh"
require_root
step "staging: 4 GiB file and 5,000 x 64 KiB, in and out, against cp -a"
exec "$PY" "$HERE/staging.py"
