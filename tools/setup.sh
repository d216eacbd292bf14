#!/usr/bin/env bash
# Create .venv with blackbox and its dev tools. torch 2.13.0 (CPU) goes in first, pinned,
# so pip never resolves a newer CUDA build; if it cannot be installed, blackbox still works.
# Each step says what it is doing on stderr: a first run downloads about 200 MB and takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $("$PY" --version 2>&1)"
    "$PY" -m venv .venv
fi
say "upgrading pip"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || say "pip not upgraded; going on with $(.venv/bin/python -m pip --version)"
if .venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
    say "torch 2.13.0 already installed"
else
    say "installing torch 2.13.0 (CPU build, about 200 MB; the demo's job trains with it)"
    .venv/bin/python -m pip install -q torch==2.13.0 || say "torch 2.13.0 not installed; continuing without it"
fi
if .venv/bin/python -c 'import torch' 2>/dev/null && ! .venv/bin/python -c 'import accelerate' 2>/dev/null; then
    say "installing accelerate 1.15.0 (a launch pattern the tests run: accelerate launch), torch kept at 2.13.0"
    .venv/bin/python -m pip install -q accelerate==1.15.0 torch==2.13.0 || say "accelerate not installed; its tests skip"
fi
# The distribution was called blackbox-recorder before: an old .venv's editable install of it goes first.
.venv/bin/python -m pip uninstall -q -y blackbox-recorder >/dev/null 2>&1 || true
say "installing blackbox and its dev tools (numpy, pyarrow, zstandard, pytest, ruff, mypy; builds the C extension)"
.venv/bin/python -m pip install -q -e '.[dev]' >.venv/setup.log 2>&1 || { cat .venv/setup.log >&2; exit 1; }
say "ready: .venv/bin/blackbox $(.venv/bin/python -c 'import blackbox; print(blackbox.__version__)' 2>/dev/null || echo '(version unknown)')"
