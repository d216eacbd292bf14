"""Allocation sampling never changes the job: armed and unarmed runs alike, whatever the allocator.

The job allocates in threads that hold no GIL (torch and numpy release it), in a
Python signal handler, in forked children (os.fork, a C-level fork, and
multiprocessing's fork, spawn and forkserver pools), frees after disarm blocks
allocated before it, and runs under PYTHONMALLOC=malloc and with jemalloc or
tcmalloc LD_PRELOADed: exit status and output must be those of the unarmed run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_py

import blackbox
from blackbox.collect.allocs import sample_module

pytest.importorskip("torch", reason="the job allocates torch CPU tensors (tools/setup.sh installs torch)")
if sample_module() is None:
    pytest.skip("the C extension blackbox.collect._csample is not built", allow_module_level=True)

JOB = """
import ctypes, multiprocessing as mp, os, signal, sys, threading, tracemalloc
import numpy as np
import blackbox
import torch

torch.set_num_threads(1)
kept = []


def churn(n):
    total = 0
    for i in range(n):
        a = torch.ones(20000) * i  # torch releases the GIL: allocations without it
        b = np.dot(np.ones((64, 64)), np.ones((64, 64)))
        total += int(a[1]) + int(b[0, 0])
        if i % 10 == 0:
            kept.append(np.ones(50000))
    return total


def child_work(x):
    return churn(20) + x


def handler(signum, frame):
    kept.append(bytearray(1 << 16))


if __name__ == "__main__":
    armed = sys.argv[2] == "armed"
    if armed:
        rec = blackbox.arm(sys.argv[1], sample_interval=0.02)  # the default: allocations sampled
        assert rec._allocs is not None, rec.notes
    signal.signal(signal.SIGUSR1, handler)
    # ~18 MB each: dozens of samples at R = 1 MiB
    threads = [threading.Thread(target=churn, args=(60,)) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(20):
        os.kill(os.getpid(), signal.SIGUSR1)
    print("main", churn(40), flush=True)
    for t in threads:
        t.join()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if churn(30) > 0 else 3)
    print("forked", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    for method in ("fork", "spawn", "forkserver"):
        with mp.get_context(method).Pool(2) as pool:
            print(method, sum(pool.map(child_work, range(4))), flush=True)
    tracemalloc.start()  # another allocator wrapper installed over ours, removed after our disarm
    arrays = [np.ones(1 << 17) for _ in range(64)]  # allocated armed, freed after disarm
    if armed:
        blackbox.disarm()
    del arrays[:]
    print("after disarm", churn(30), flush=True)
    tracemalloc.stop()
    print("after tracemalloc", churn(10), flush=True)
"""
LIBS = Path("/usr/lib/x86_64-linux-gnu")
PRELOADS = {"glibc": None, "jemalloc": LIBS / "libjemalloc.so.2", "tcmalloc": LIBS / "libtcmalloc_minimal.so.4"}


def run_job(tmp_path: Path, armed: bool, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    full = dict(os.environ, PYTHONPATH=str(REPO), **env)
    args = [sys.executable, str(job), f"{tmp_path / 'rings'}/", "armed" if armed else "unarmed"]
    return subprocess.run(args, capture_output=True, text=True, env=full, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(("preload", "pymalloc"), [("glibc", ""), ("glibc", "malloc"), ("jemalloc", ""),
                                                   ("tcmalloc", "malloc")])  # fmt: skip
def test_armed_job_runs_as_unarmed_whatever_the_allocator(tmp_path: Path, preload: str, pymalloc: str) -> None:
    lib = PRELOADS[preload]
    if lib is not None and not lib.exists():
        pytest.skip(f"{lib} is not installed (apt-get install libjemalloc2 libtcmalloc-minimal4)")
    env = {"PYTHONMALLOC": pymalloc} if pymalloc else {}
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    unarmed = run_job(tmp_path / "unarmed", False, env)
    armed = run_job(tmp_path / "armed", True, env)
    assert unarmed.returncode == 0, unarmed.stderr[-3000:]
    assert (armed.returncode, armed.stdout) == (unarmed.returncode, unarmed.stdout), armed.stderr[-3000:]
    blackbox.recover(tmp_path / "armed" / "rings", tmp_path / "bundle")
    meta = json.loads((tmp_path / "bundle" / "metadata.json").read_text())
    sites = meta["allocations"]["sites"]
    assert any(s["site"].startswith("churn (") and "native" in s["domains"] for s in sites), sites[:5]
    assert meta["allocations"]["torn_slots"] == 0


C_FORK_JOB = """
import ctypes, os, signal, sys
import numpy as np
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.05, allocations=True)
kept = [np.ones(1 << 17) for _ in range(100)]  # 100 MiB, sampled
blackbox.active().sample_now()  # their stack's text into the table
libc = ctypes.PyDLL(None)  # the GIL kept across the call: the child holds it
pid = libc.fork()  # a fork from C: no Python after-fork hook runs in the child
if pid == 0:
    del kept[:]  # the child frees its copies: never the parent's heap table
    more = [np.ones(1 << 17) for _ in range(50)]
    os._exit(0)
os.waitpid(pid, 0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_child_forked_in_c_never_touches_the_parents_heap_table(tmp_path: Path) -> None:
    proc = run_py(C_FORK_JOB, f"{tmp_path / 'rings'}/", check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    blackbox.recover(tmp_path / "rings", tmp_path / "bundle")
    top = json.loads((tmp_path / "bundle" / "metadata.json").read_text())["allocations"]["sites"][0]
    assert top["site"].endswith("(<string>:7)"), top  # the list of arrays, line 7
    assert 75 << 20 <= top["live_bytes"] <= 125 << 20, top  # the parent's 100 MiB, all still live


DISARM_JOB = """
import sys
import numpy as np
import blackbox
from blackbox.collect import _csample

blackbox.arm(sys.argv[1], allocations=True)
print(_csample.stats()["slots_patched"] > 0)
blackbox.disarm()
after = _csample.stats()
junk = [np.ones(1 << 17) for _ in range(100)]
print(after["slots_patched"], _csample.stats()["samples"] == after["samples"])
"""


def test_disarm_puts_every_patched_slot_back_and_samples_nothing_more(tmp_path: Path) -> None:
    out = run_py(DISARM_JOB, f"{tmp_path / 'rings'}/").stdout.split()
    assert out == ["True", "0", "True"]


LOADER_WALK_JOB = """
import ctypes, sys, time
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.02)  # the defaults (allocation sampling on), a tick every 20 ms
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
seen = []


def each(info, size, data):  # Python inside the loader's walk, as threadpoolctl lists the BLAS libraries
    seen.append(size)
    time.sleep(0.1)  # the GIL let go, the loader's lock held: the sampler's ticks come meanwhile
    return 0 if len(seen) < 5 else 1


ctypes.CDLL(None).dl_iterate_phdr(CALLBACK(each), None)
print(len(seen))
"""


def test_a_python_callback_inside_the_loaders_walk_never_deadlocks_with_the_tick(tmp_path: Path) -> None:
    # the tick's look for newly loaded libraries waits for the loader's lock without the GIL: a thread in the
    # loader's walk that waits for the GIL (a ctypes callback) then goes on
    assert run_py(LOADER_WALK_JOB, f"{tmp_path / 'rings'}/", timeout=60).stdout.split() == ["5"]
