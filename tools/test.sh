#!/usr/bin/env bash
# README's test command: set up .venv, then lint, type-check and run the whole test suite as CI does, on two
# workers (pytest-xdist: each test file is one unit on one worker; BLACKBOX_TEST_WORKERS=N changes the count,
# 0 runs in this process alone), printing the 30 slowest tests; a test that fails there runs again alone, and
# only a second failure fails (tools/pytest_twice.sh names the flakes). CI (.ci/run) also runs tools/ci_packages.sh
# first and tools/test_pythons.sh after: this script says what of theirs is missing here.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
# The largest test writes about 3 GiB of rings at once (a thousand ranks); where the disk is short, arming
# fails for want of space and tests fail far from the cause, so say it first.
free_kib=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 {print $4}')
if [ "${free_kib:-0}" -lt $((6 * 1024 * 1024)) ]; then
    echo "test.sh: warning: only $((free_kib / 1024)) MiB free under ${TMPDIR:-/tmp}; the suite needs about 6 GiB" >&2
fi
command -v slurmd >/dev/null || echo "test.sh: slurmd is not installed: the Slurm tests skip (CI installs it: tools/ci_packages.sh, as root)" >&2
command -v chromium >/dev/null || echo "test.sh: chromium is not installed: the report's browser tests skip (CI installs it: tools/ci_packages.sh, as root)" >&2
echo "test.sh: not run here: the fast tests on Python 3.10 and 3.13 (CI runs them after: tools/test_pythons.sh)" >&2
.venv/bin/ruff check blackbox tools tests
.venv/bin/mypy blackbox tools
workers=${BLACKBOX_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
    .venv/bin/python -m pytest -q --durations=30
else  # the tests that fail on two workers run again alone (tools/pytest_twice.sh says which, and why)
    ./tools/pytest_twice.sh .venv/bin/python .pytest_cache -q -n "$workers" --dist loadgroup --durations=30
fi
