#!/usr/bin/env bash
# README's main job: set up .venv, then arm a training job, SIGKILL it, recover it, print the diagnosis.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
.venv/bin/blackbox demo "$@"
