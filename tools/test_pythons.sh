#!/usr/bin/env bash
# The fast tests (pytest -m "not slow") on the oldest and the newest supported Python, so that neither breaks
# silently: 3.10 and 3.13 (tools/test.sh runs the whole suite on the default one, 3.11), on two workers. Each gets its own
# virtual environment, .venv-<version>, with blackbox and its dev tools but not torch (the tests that
# need torch skip, saying so; recover and the analysis never need it). A Python that is not installed
# (neither python<version> on PATH nor a pyenv version) is skipped with the reason. Exit status: 1 if
# any lane failed. BLACKBOX_PYTHONS="3.10 3.12 3.13" picks the lanes.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=""
for version in ${BLACKBOX_PYTHONS:-3.10 3.13}; do
  python=""
  if command -v "python$version" >/dev/null && "python$version" -c "" 2>/dev/null; then
    python=$(command -v "python$version")
  elif command -v pyenv >/dev/null && prefix=$(pyenv prefix "$version" 2>/dev/null) \
      && [ -x "$prefix/bin/python$version" ]; then
    python="$prefix/bin/python$version"
  fi
  if [ -z "$python" ]; then
    echo "test_pythons: Python $version skipped: neither python$version on PATH nor pyenv's $version is installed"
    continue
  fi
  venv=".venv-$version"
  echo "test_pythons: Python $version ($python): the fast tests"
  if ! { { [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"; } \
      && "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null \
      && "$venv/bin/python" -m pip install -q -e '.[dev]'; }; then
    echo "test_pythons: Python $version: could not install blackbox and its dev tools" >&2
    failed="$failed $version"
    continue
  fi
  ./tools/pytest_twice.sh "$venv/bin/python" ".pytest_cache-$version" -q -m "not slow" \
      -n "${BLACKBOX_TEST_WORKERS:-2}" --dist loadgroup --durations=10 || failed="$failed $version"
done
if [ -n "$failed" ]; then
  echo "test_pythons: failed on Python$failed" >&2
  exit 1
fi
