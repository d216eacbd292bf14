#!/usr/bin/env bash
# The system packages some tests need, as .ci/run installs them on a fresh machine (root, Debian's apt):
# slurmctld, slurmd, slurm-client and munge for the Slurm lane (tests/test_slurm_*.py), chromium for
# blackbox report's browser tests (tests/test_report.py). Where they cannot be installed, those tests skip
# and say why. Nothing is done where they are installed already, or without root and apt-get.
set -uo pipefail
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    exit 0
fi
want=""
command -v slurmd >/dev/null || want="$want slurmctld slurmd slurm-client munge"
command -v chromium >/dev/null || want="$want chromium"
if [ -n "$want" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $want) >/dev/null 2>&1 \
        || echo "ci_packages: not installed:$want; the tests that need them will skip" >&2
fi
