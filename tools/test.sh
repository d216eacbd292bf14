#!/usr/bin/env bash
# README's test command: set up .venv, then lint, type-check and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
.venv/bin/ruff check blackbox tools tests
.venv/bin/mypy blackbox
.venv/bin/python -m pytest -q
