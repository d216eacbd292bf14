#!/usr/bin/env bash
# Prepare the environment for tools/field.py: a venv with torch 2.13.0 (CPU) installed first and
# pinned, then transformers, accelerate, lightning and blackbox's own dependencies; VENV-tv for mnist
# (torch 2.14.1 + torchvision 0.29.1); and the third-party sources
# (nanoGPT, pytorch/examples) unpacked from their git snapshots. The blackbox tree under test is NOT
# installed here: field.py copies it and puts it on PYTHONPATH (--tree), so one venv serves every tree.
#   tools/field_setup.sh VENV_DIR SRC_DIR [NANOGPT_GIT_DIR] [EXAMPLES_GIT_DIR]
set -euo pipefail
VENV=${1:?usage: field_setup.sh VENV_DIR SRC_DIR [NANOGPT_GIT_DIR] [EXAMPLES_GIT_DIR]}
SRC=${2:?usage: field_setup.sh VENV_DIR SRC_DIR [NANOGPT_GIT_DIR] [EXAMPLES_GIT_DIR]}
NANOGPT_GIT=${3:-/work/.mirror/karpathy+nanoGPT/repo}
EXAMPLES_GIT=${4:-/work/.mirror/pytorch+examples/repo}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIN="$VENV/torch-pin.txt"
echo "torch==2.13.0" >"$PIN"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q torch==2.13.0
# -c keeps every later resolution on the torch already there (never a newer, CUDA-laden build)
"$VENV/bin/python" -m pip install -q -c "$PIN" "numpy>=1.24" "pyarrow>=14" "zstandard>=0.21" \
    transformers accelerate lightning setuptools
"$VENV/bin/python" -c "import torch, transformers, lightning; print('field venv:', torch.__version__, transformers.__version__, lightning.__version__)"
# pytorch/examples mnist needs torchvision, which PyPI builds only beside a newer torch than 2.13.0:
# a second venv, VENV-tv, with the torch 2.14.1 + torchvision 0.29.1 pair (taken from the local disk)
TV="$VENV-tv"
[ -x "$TV/bin/python" ] || "$PY" -m venv "$TV"
"$TV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$TV/bin/python" -m pip install -q torch==2.14.1 torchvision==0.29.1
echo "torch==2.14.1" >"$TV/torch-pin.txt"
"$TV/bin/python" -m pip install -q -c "$TV/torch-pin.txt" "numpy>=1.24" "pyarrow>=14" "zstandard>=0.21" setuptools
"$TV/bin/python" -c "import torch, torchvision; print('field venv-tv:', torch.__version__, torchvision.__version__)"
# only the files the jobs run (a snapshot may lack the blobs of large data files)
unpack() {  # NAME GIT_DIR PATH...
    local name=$1 git_dir=$2; shift 2
    [ -d "$SRC/$name" ] && return 0
    mkdir -p "$SRC/$name.part"
    git --git-dir="$git_dir" archive HEAD "$@" | tar -x -C "$SRC/$name.part"
    mv "$SRC/$name.part" "$SRC/$name"
}
unpack nanoGPT "$NANOGPT_GIT" train.py model.py configurator.py
unpack examples "$EXAMPLES_GIT" mnist
echo "field sources: $SRC/nanoGPT ($(git --git-dir="$NANOGPT_GIT" rev-parse --short HEAD)), $SRC/examples ($(git --git-dir="$EXAMPLES_GIT" rev-parse --short HEAD))"
