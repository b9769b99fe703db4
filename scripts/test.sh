#!/usr/bin/env bash
# Runs the whole Spillway test suite: setup (packages + release build), then every check,
# even when an earlier one failed, and a summary of which parts failed.
#
#   1. scripts/setup.sh                                       (a failure here stops the run)
#   2. shellcheck of scripts/, bench/ and .ci/run
#   3. cargo fmt --all -- --check
#   4. cargo clippy --workspace --all-targets -- -D warnings
#   5. cargo test --workspace --release
#   6. /usr/bin/python3 -m pytest tests -q -p no:cacheprovider
#
# Exit status 0 only if every part passed. Whole run bounded by SPILLWAY_TEST_BUDGET
# seconds (default 3600); each part gets at most what is left of it.
# At exit, processes started by this run and mounts they left behind are cleaned up.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/common.sh"
cd "$SPILLWAY_REPO" || exit 1

BUDGET="${SPILLWAY_TEST_BUDGET:-3600}"
SECONDS=0
RESULTS=()
FAILED=()

cleanup() {
    local rc=$?
    # Processes this run started (all inherit SPILLWAY_RUN_TAG) ...
    kill_run_processes
    if [[ "${CI:-}" == true ]]; then
        # ... and on CI also anything still running a binary of this checkout (a process
        # started with an environment of its own does not carry the tag).
        "${SWEEP[@]}" kill-exe-under "$SPILLWAY_REPO/target" || true
    fi
    # Then FUSE mounts whose daemon is gone; another run's live mounts stay.
    "${SWEEP[@]}" unmount --stale-only '/tmp/spillway-tests-*' || true
    local left
    left="$("${SWEEP[@]}" mounts '/tmp/spillway-tests-*' || true)"
    [[ -z "$left" ]] || warn "still mounted under /tmp/spillway-tests-*: $(tr '\n' ' ' <<<"$left")"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# part NAME MAX_SECONDS CMD...: run one part within the budget and record its result.
part() {
    local name=$1 max=$2 left rc t0
    shift 2
    left=$((BUDGET - SECONDS))
    ((max < left)) || max=$left
    step "$name"
    if ((max <= 0)); then
        RESULTS+=("SKIP  $name (time budget of ${BUDGET}s used up)")
        FAILED+=("$name")
        return
    fi
    t0=$SECONDS
    timeout --kill-after=30 "$max" "$@" </dev/null
    rc=$?
    if ((rc == 0)); then
        RESULTS+=("PASS  $name ($((SECONDS - t0)) s)")
    elif ((rc == 124 || rc == 137)); then
        RESULTS+=("FAIL  $name (timed out after ${max}s)")
        FAILED+=("$name")
    else
        RESULTS+=("FAIL  $name (exit $rc, $((SECONDS - t0)) s)")
        FAILED+=("$name")
    fi
}

step "setup (scripts/setup.sh)"
if ! scripts/setup.sh </dev/null; then
    printf '\nFAILED: setup (scripts/setup.sh); no test was run\n' >&2
    exit 1
fi

shell_files=(scripts/*.sh scripts/lib/*.sh bench/*.sh .ci/run)
part "shellcheck (scripts, bench, .ci/run)" 120 shellcheck -x "${shell_files[@]}"
part "cargo fmt --all -- --check" 120 cargo fmt --all -- --check
part "cargo clippy --workspace --all-targets -- -D warnings" 1200 \
    cargo clippy --workspace --all-targets -- -D warnings
part "cargo test --workspace --release" 1200 cargo test --workspace --release

run_pytest() {
    if ! compgen -G "tests/test_*.py" >/dev/null && ! compgen -G "tests/**/test_*.py" >/dev/null; then
        echo "no pytest files under tests/: nothing to run"
        return 0
    fi
    local rc=0
    /usr/bin/python3 -m pytest tests -q -p no:cacheprovider || rc=$?
    if ((rc == 5)); then
        echo "pytest collected no tests"
        return 0
    fi
    return "$rc"
}
export -f run_pytest
part "pytest tests (/usr/bin/python3)" 2700 bash -c run_pytest

printf '\n==> Summary (%d s)\n' "$SECONDS"
printf '    %s\n' "${RESULTS[@]}"
if ((${#FAILED[@]})); then
    printf '\nFAILED: %s\n' "$(IFS=';'; echo "${FAILED[*]}")"
    exit 1
fi
printf '\nall parts passed\n'
