#!/usr/bin/env bash
# README's test command: set up .venv, then lint, type-check and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
# The largest test writes about 3 GiB of rings at once (a thousand ranks); where the disk is short, arming
# fails for want of space and tests fail far from the cause, so say it first.
free_kib=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 {print $4}')
if [ "${free_kib:-0}" -lt $((6 * 1024 * 1024)) ]; then
    echo "test.sh: warning: only $((free_kib / 1024)) MiB free under ${TMPDIR:-/tmp}; the suite needs about 6 GiB" >&2
fi
.venv/bin/ruff check blackbox tools tests
.venv/bin/mypy blackbox
.venv/bin/python -m pytest -q
