#!/usr/bin/env bash
# pytest on two workers, then the tests that failed there again, alone: tools/test.sh and
# tools/test_pythons.sh run the suite through it. Usage: tools/pytest_twice.sh PYTHON CACHE_DIR PYTEST_ARGS...
#
# The suite's crash tests kill, OOM-kill and time real processes on a 2-core machine, two workers at once; a
# test that fails beside the other worker's load and passes alone is a flake, to fix at its cause (issue 46),
# not a broken promise. So where the first run had failures (exit status 1), each failed test runs again on
# one worker, nothing beside it; the exit status is that run's: a test that fails again fails CI. Every
# failure of the first run is printed in full there, and named again here as FLAKY when it then passed.
set -uo pipefail
python=$1 cache=$2
shift 2
"$python" -m pytest -o cache_dir="$cache" "$@"
status=$?
[ "$status" -eq 1 ] || exit "$status"
failed=$("$python" -c 'import json, sys; print("\n".join(sorted(json.load(open(sys.argv[1])))))' \
    "$cache/v/cache/lastfailed" 2>/dev/null)
echo "pytest_twice: $(printf '%s\n' "$failed" | grep -c .) failed on two workers; each again, alone:" >&2
"$python" -m pytest -o cache_dir="$cache" -q -p no:xdist --lf --lfnf=none -rfE
again=$?
if [ "$again" -eq 0 ]; then
  printf 'pytest_twice: FLAKY (failed under load, passed alone; to fix at its cause): %s\n' $failed >&2
fi
exit "$again"
