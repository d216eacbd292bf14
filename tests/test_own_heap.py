"""Under an address-space limit (`ulimit -v`, RLIMIT_AS) arming takes a few MiB of it, not a glibc arena of 64.

The sampler thread allocates from a small heap of its own (collect/_own_heap.h), never from glibc, whose first
malloc or free in a thread reserves an arena of 64 MiB of address space. Each job here is run unarmed and
armed under the same limit; the arenas are counted by glibc's own malloc_info.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blackbox.collect.allocs import sample_module

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sample_module() is None, reason="the own heap is part of the C extension")

# Counts glibc's arenas (one <heap nr=...> each in malloc_info's XML), reads VmSize, and, armed, the own heap's
# counters. THREADS job threads allocate (each has an arena, armed or not) and drop cycles for the GC, through
# FUNCTIONS distinct allocation sites (so the sampler makes stack texts, its tables grow past 64 KiB: the own
# heap's larger blocks), for SECONDS; a fork pool's workers free what they inherited.
JOB = r"""
import ctypes, gc, json, multiprocessing, os, resource, sys, threading, time
{limit}
import numpy
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p

def arenas():
    path = os.path.join(sys.argv[2], "malloc_info.xml").encode()
    f = libc.fopen(path, b"w")
    libc.malloc_info(0, ctypes.c_void_p(f))
    libc.fclose(ctypes.c_void_p(f))
    return open(path).read().count("<heap nr=")

def vm_kib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:"))

before = (arenas(), vm_kib())
if sys.argv[1] == "armed":
    import blackbox
    blackbox.arm(sys.argv[2] + "/")
ns = {{}}
for i in range({functions}):
    exec(f"def site{{i}}(n):\n    return len(bytearray(n))\n", ns)
made = [0] * {threads}

def work(k):
    end = time.monotonic() + {seconds}
    while time.monotonic() < end:
        for i in range(k, {functions}, {threads}):
            made[k] += ns[f"site{{i}}"](1 << 20)
            junk = [{{"x": [i] * 40}} for _ in range(30)]
            junk.append(junk)
            del junk
            if i % 90 == k:
                time.sleep(0.002)

threads = [threading.Thread(target=work, args=(k,)) for k in range({threads})]
[t.start() for t in threads]
[t.join() for t in threads]
with multiprocessing.get_context("fork").Pool(2) as pool:
    pooled = sum(pool.map(len, [b"x" * 1000] * 50))
gc.collect()
time.sleep(0.3)
out = {{"arenas": [before[0], arenas()], "vm_kib": [before[1], vm_kib()], "pooled": pooled, "own": None}}
if sys.argv[1] == "armed":
    from blackbox.collect import _csample
    out["own"] = {{k: v for k, v in _csample.stats().items() if k.startswith("own_")}}
print(json.dumps(out))
"""


def run_job(tmp_path: Path, mode: str, limit_kib: int | None, **shape: float) -> dict:  # type: ignore[type-arg]
    script = tmp_path / "job.py"
    limit = f"resource.setrlimit(resource.RLIMIT_AS, ({limit_kib} << 10, {limit_kib} << 10))" if limit_kib else ""
    script.write_text(JOB.format(limit=limit, **shape))
    proc = subprocess.run([sys.executable, str(script), mode, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict = json.loads(proc.stdout.splitlines()[-1])  # type: ignore[type-arg]
    return result


SMALL = {"functions": 30, "threads": 1, "seconds": 0.3}


def test_under_ulimit_v_arming_makes_no_malloc_arena_and_takes_a_few_mib(tmp_path: Path) -> None:
    # GIVEN a job that imports numpy under `ulimit -v` 2 GB and allocates in one thread of its own
    unarmed = run_job(tmp_path, "unarmed", 2_000_000, **SMALL)
    armed = run_job(tmp_path, "armed", 2_000_000, **SMALL)
    # THEN armed, glibc has as many arenas as unarmed: the sampler thread made none (it made one of 64 MiB)
    assert armed["arenas"] == unarmed["arenas"], (unarmed, armed)
    # AND arming took under 16 MiB of the address space the job may use (74 MiB with the arena)
    grew = (armed["vm_kib"][1] - unarmed["vm_kib"][1]) / 1024
    assert grew < 16, (grew, unarmed, armed)
    # AND the sampler thread did allocate, from its own heap, and never needed glibc for it
    own = armed["own"]
    assert own["own_bytes"] == 2 << 20 and own["own_cut"] > 0 and own["own_fallbacks"] == 0, own


def test_without_an_address_space_limit_the_sampler_allocates_from_glibc_as_before(tmp_path: Path) -> None:
    # GIVEN the same job with no address-space limit (the reservation costs nothing then)
    armed = run_job(tmp_path, "armed", None, **SMALL)
    # THEN there is no own heap: the hooks forward every allocation as before
    assert armed["own"]["own_bytes"] == 0 and armed["own"]["own_cut"] == 0, armed


def test_the_own_heap_holds_under_threads_gc_fork_and_thousands_of_stacks(tmp_path: Path) -> None:
    # GIVEN three threads allocating through 3,000 distinct sites for 6 s, dropping cycles for the GC, then a fork
    # pool, under `ulimit -v` 3 GB
    shape = {"functions": 3000, "threads": 3, "seconds": 6}
    unarmed = run_job(tmp_path, "unarmed", 3_000_000, **shape)
    armed = run_job(tmp_path, "armed", 3_000_000, **shape)
    # THEN the job ran as unarmed, with the same arenas (one per thread of its own), the pool's answer the same
    assert armed["pooled"] == unarmed["pooled"] == 50_000
    assert armed["arenas"] == unarmed["arenas"], (unarmed, armed)
    # AND the sampler's tables grew past the small blocks (larger blocks were mapped), and nothing fell to glibc
    own = armed["own"]
    assert own["own_bigs_made"] > 0 and own["own_fallbacks"] == 0, own
    assert own["own_high"] < own["own_bytes"] + (4 << 20), own


# A C library's common idiom: a line buffer from malloc, grown by libc's getline (a realloc inside libc, which
# no hook sees). Called from finalizers of cycles collected by the sampler thread: the first object made after
# the threshold is set to 1 is the sampler tick's, while the main thread sleeps.
GETLINE_LIB = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
int first_line_len(const char *path) {
    size_t n = 16;
    char *line = malloc(n);
    FILE *f = fopen(path, "r");
    int r = -1;
    if (f) {
        for (int i = 0; i < 3; i++)
            r = (int)getline(&line, &n, f);
        fclose(f);
    }
    free(line);
    return r;
}
"""

FINALIZERS = r"""
import ctypes, gc, resource, sys, threading, time
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
lib = ctypes.CDLL(sys.argv[2])
if sys.argv[1] == "armed":
    import blackbox
    blackbox.arm(sys.argv[3] + "/")
ran = []

class Node:
    def __init__(self):
        self.me = self

    def __del__(self):
        ran.append(threading.current_thread().name)
        lib.first_line_len(b"/proc/self/status")

for n in range(40):  # (until the sampler has run finalizers twice; unarmed, 4 rounds)
    if ran.count("blackbox-sampler") >= 300 or (sys.argv[1] == "unarmed" and n == 4):
        break
    gc.disable()
    for _ in range(150):
        Node()
    gc.set_threshold(1)  # the next object made, in any thread, starts a collection: made by the sampler's tick
    gc.enable()
    time.sleep(0.3)  # (the main thread idles, allocating nothing)
    gc.set_threshold(100000)
gc.collect()
print(sorted(set(ran)), len(ran))
"""


def test_a_library_block_from_the_sampler_thread_that_libc_grows_stays_glibcs(tmp_path: Path) -> None:
    # GIVEN finalizers that call a C library's malloc then libc's getline (which reallocs inside libc, unhooked),
    # run on whichever thread collects the job's cycles, under `ulimit -v`
    (tmp_path / "getline.c").write_text(GETLINE_LIB)
    lib = tmp_path / "libgetline.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(tmp_path / "getline.c")], check=True)
    (tmp_path / "job.py").write_text(FINALIZERS)
    runs = {}
    for mode in ("unarmed", "armed"):
        args = [sys.executable, str(tmp_path / "job.py"), mode, str(lib), str(tmp_path)]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        runs[mode] = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    # THEN armed the job ends as unarmed: the library's block came from glibc (only libpython's, numpy's and the
    # ring writer's slots serve the sampler from its own heap), so glibc's realloc inside getline is given its own
    # block (with the own heap serving every slot, glibc aborted: "mremap_chunk(): invalid pointer", SIGABRT)
    for mode, proc in runs.items():
        assert proc.returncode == 0, (mode, proc.returncode, proc.stderr[-2000:])
    # AND the sampler thread did run finalizers (else this job tested nothing)
    assert "blackbox-sampler" in runs["armed"].stdout, runs["armed"].stdout
