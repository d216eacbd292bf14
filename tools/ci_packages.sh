#!/usr/bin/env bash
# The system packages some tests need, as .ci/run installs them on a fresh machine (root, Debian's apt):
# slurmctld, slurmd, slurm-client and munge for the Slurm lane (tests/test_slurm_*.py), chromium for
# blackbox report's browser tests (tests/test_report.py), libjemalloc2 and libtcmalloc-minimal4 for the
# allocator cases of tests/test_alloc_safety.py, strace for tests/test_kernel_faults.py, tini for
# tests/test_signal_senders.py. Where they cannot be
# installed, those tests skip and say why. Nothing is done where they are installed already, or without root and apt-get.
set -uo pipefail
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    exit 0
fi
want=""
command -v slurmd >/dev/null || want="$want slurmctld slurmd slurm-client munge"
command -v chromium >/dev/null || want="$want chromium"
# jemalloc and tcmalloc: allocation sampling must keep working under a job that LD_PRELOADs either
# (tests/test_alloc_safety.py skips those cases without them)
[ -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ] || want="$want libjemalloc2"
[ -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 ] || want="$want libtcmalloc-minimal4"
# strace: which signal delivery ends a crashing job, armed and unarmed (tests/test_kernel_faults.py)
command -v strace >/dev/null || want="$want strace"
# tini: a signal a container's init passes on names it as such (tests/test_signal_senders.py)
command -v tini >/dev/null || want="$want tini"
if [ -n "$want" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $want) >/dev/null 2>&1 \
        || echo "ci_packages: not installed:$want; the tests that need them will skip" >&2
fi
