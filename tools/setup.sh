#!/usr/bin/env bash
# Create .venv with blackbox and its dev tools. torch 2.13.0 (CPU) goes in first, pinned,
# so pip never resolves a newer CUDA build; if it cannot be installed, blackbox still works.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q torch==2.13.0 || echo "setup: torch 2.13.0 not installed; continuing without it" >&2
.venv/bin/python -m pip install -q -e '.[dev]'
