"""Helpers of a `blackbox run` job named by what they are, with their step, and the main's own cause kept.

Real jobs, each run unarmed and armed side by side (exit status, the job's own error, which process the
kernel kills), with the verdict checked against the planted truth: which helper died, of what, at which
step of its parent, and what the main process itself died of afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

ENV = dict(os.environ, PYTHONPATH=str(REPO))
MAYBE_BLACKBOX = """\
try:
    import blackbox
    step = blackbox.step
except ImportError:  # unarmed: the same job, its steps told to no one
    step = lambda n: None
"""
POOL_JOB = MAYBE_BLACKBOX + """\
import multiprocessing as mp, os, sys, time
def task(i):
    if i == 1:  # one helper leaks until the kernel's OOM killer takes it
        open(sys.argv[1], "w").write(str(os.getpid()))
        kept = []
        while True:
            kept.append(bytearray(8 << 20))
            time.sleep(0.005)
    time.sleep(0.1)
    return i
if __name__ == "__main__":
    with mp.get_context("fork").Pool(2) as pool:
        for n in range(3):
            step(n)
            time.sleep(0.05)
        print(pool.map_async(task, range(4)).get(timeout=3))
"""


def _run(tmp_path: Path, armed: bool, script: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    run = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--"] if armed else []
    env = ENV if armed else {**ENV, "PYTHONPATH": ""}
    return subprocess.run([*run, sys.executable, script, *args], capture_output=True, text=True, timeout=180,
                          env=env, cwd=tmp_path, **kw)  # fmt: skip


def _bundle(tmp_path: Path) -> dict[str, Any]:
    (run,) = (tmp_path / "run").glob("run-*")
    meta: dict[str, Any] = json.loads((run / "bundle" / "metadata.json").read_text())
    return meta


def test_a_pool_helper_oom_killed_is_named_and_the_main_keeps_its_timeout(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    # GIVEN a job whose multiprocessing Pool helper (fork) leaks at the main's step 2 in a 300 MiB cgroup; the
    # kernel OOM-kills it, and the main, waiting on map_async(...).get(timeout=3), raises TimeoutError
    (tmp_path / "job.py").write_text(POOL_JOB)
    ends = {}
    for armed in (False, True):
        cg = memory_cgroup(300 << 20)
        leaker = tmp_path / f"leaker-{armed}"
        proc = _run(tmp_path, armed, "job.py", str(leaker), preexec_fn=cg.join)
        # THEN armed as unarmed: exit 1 of the TimeoutError, and the kernel killed the leaking helper, once
        assert proc.returncode == 1 and "multiprocessing.context.TimeoutError" in proc.stderr, proc.stderr[-2000:]
        assert cg.oom_kills() == 1 and not Path(f"/proc/{leaker.read_text()}").exists()
        ends[armed] = int(leaker.read_text())
    meta = _bundle(tmp_path)
    helper = ends[True]
    # AND the first death is the helper's: a Pool helper (not a DataLoader worker), started by fork, at step 2
    first = meta["first_death"]
    assert (first["pid"], first["cause"], first["step"]) == (helper, "host_oom_kill", 2), first
    assert first["victim"]["role"] == "multiprocessing Pool worker" and first["victim"]["start_method"] == "fork"
    assert first["headline"] == (f"The multiprocessing Pool worker (pid {helper}, started by fork) was killed by the "
                                 "kernel OOM killer.")  # fmt: skip
    # AND the limit it hit is named: its memory cgroup's, at its planted size
    told = next(r for r in meta["rings"] if r["pid"] == helper)["death"]
    assert (told["limit"]["name"], told["limit"]["bytes"]) == ("cgroup", 300 << 20), told.get("limit")
    # AND the main keeps its own cause, later: its TimeoutError at its own step, the helper's death named before it
    main = next(r for r in meta["rings"] if r["role"] == "main")
    death = main["death"]
    assert (death["cause"], death["step"], death["victim"]["pid"]) == ("exception", 2, main["pid"]), death
    assert any("TimeoutError" in e for e in death["evidence"]) and death["after"]["pid"] == helper, death
    assert death["time"] > first["time"]
    assert meta["attempts"][-1]["deaths"] - sum(r["death"]["cause"] == "host_oom_kill" for r in meta["rings"]) == 1
    # AND the other helpers are told: those the Pool's terminate() reached are said to be stopped by the main,
    # not by a launcher; one that read the task handler's end-of-work sentinel first ended cleanly (folded).
    # Which of the two is CPython's race (Pool._terminate_pool drains the queue once, then the sentinels come),
    # decided the other way under load (a CI run: no helper stopped, both folded)
    (run,) = (tmp_path / "run").glob("run-*")
    summary = (run / "bundle" / "summary.md").read_text()
    stopped = [r["pid"] for r in meta["rings"] if (r["death"].get("collateral_of") or {}).get("pid") == helper]
    folded = sum(g["count"] for g in meta.get("helpers") or [] if g["ppid"] == main["pid"])
    others = [r for r in meta["rings"] if r["pid"] not in (helper, main["pid"])]
    assert stopped or folded or others, (meta["rings"], meta.get("helpers"))
    # (a helper that ended cleanly may keep its ring: told as a clean end, never as a death)
    assert all(r["pid"] in stopped or r["death"]["cause"] == "clean_exit" for r in others), \
        [(r["pid"], r["role"], r["death"]["cause"]) for r in meta["rings"]]  # fmt: skip
    if stopped:
        assert f"stopped by the parent process after pid {helper} died" in summary
    assert "the launcher" not in summary


# PyTorch's words for a worker that died, as the main learns it (killed, or gone while the main waited)
_WORKER_DIED = r"DataLoader worker \(pids?(\(s\))? {}\) (is killed by signal: Killed|exited unexpectedly)"
DATALOADER_JOB = MAYBE_BLACKBOX + """\
import os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
class Items(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 12:  # the worker serving item 12 is SIGKILLed there, once the batches it sent are taken
            open(sys.argv[1], "w").write(str(os.getpid()))
            time.sleep(0.5)
            os.kill(os.getpid(), 9)
        return torch.zeros(4)
if __name__ == "__main__":
    loader = DataLoader(Items(), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    for n, batch in enumerate(loader):
        step(n)
        time.sleep(0.02)
"""


def test_a_spawn_dataloader_worker_has_its_name_its_step_and_the_main_its_error(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # GIVEN a DataLoader whose spawn worker is SIGKILLed as it serves item 12 (batch 3: the main is at step 2 or
    # 3, as far as prefetching got); PyTorch then raises "DataLoader worker (pid N) is killed by signal" (or,
    # as the main's wait goes, "exited unexpectedly")
    (tmp_path / "job.py").write_text(DATALOADER_JOB)
    for armed in (False, True):
        proc = _run(tmp_path, armed, "job.py", str(tmp_path / f"killed-{armed}"))
        dead = int((tmp_path / f"killed-{armed}").read_text())
        assert proc.returncode == 1 and re.search(_WORKER_DIED.format(dead), proc.stderr), proc.stderr[-2000:]
    worker = int((tmp_path / "killed-True").read_text())
    meta = _bundle(tmp_path)
    # THEN the first death is the worker's, from its own ring: a DataLoader worker started by spawn, with the
    # main's step then (the worker's ring records none)
    first = meta["first_death"]
    assert (first["pid"], first["cause"]) == (worker, "killed"), first
    assert first["victim"]["role"] == "DataLoader worker" and first["victim"]["start_method"] == "spawn", first
    assert first["step"] in (0, 1, 2, 3), first
    # AND the main's own end is its RuntimeError, after the worker's death
    main = next(r for r in meta["rings"] if r["role"] == "main")
    assert main["death"]["cause"] == "exception" and main["death"]["after"]["pid"] == worker, main["death"]
    assert any(re.search(_WORKER_DIED.format(worker), e) for e in main["death"]["evidence"]), main["death"]


RAISING_POOL = MAYBE_BLACKBOX + """\
import multiprocessing as mp, time
def task(i):
    time.sleep(0.05)
    if i == 12:
        raise KeyError(f"missing field 'label' in record {i}")
    return i
if __name__ == "__main__":
    step(0)
    with mp.get_context("fork").Pool(2) as pool:  # its __exit__ terminates the helpers as the error unwinds
        print(len(pool.map(task, range(400), chunksize=1)))
"""


def test_a_pool_task_that_raised_is_the_first_death_not_the_helpers_terminate(tmp_path: Path) -> None:
    # GIVEN a task that raises in a Pool helper: the main process re-raises it, and Pool.__exit__ SIGTERMs the
    # helpers while it unwinds, before the excepthook records it
    (tmp_path / "job.py").write_text(RAISING_POOL)
    unarmed, armed = (_run(tmp_path, a, str(tmp_path / "job.py")) for a in (False, True))
    assert unarmed.returncode == armed.returncode == 1
    for proc in (unarmed, armed):
        assert "KeyError: \"missing field 'label' in record 12\"" in proc.stderr.splitlines(), proc.stderr[-500:]
    # THEN the first death is the main process's KeyError (it was a helper "ended by a signal (SIGTERM from
    # python)"); the helpers its Pool terminated are no deaths (the Pool's teardown), or collateral of it
    meta = _bundle(tmp_path)
    first = meta["first_death"]
    assert (first["cause"], first["victim"]["role"]) == ("exception", "main process"), first
    helpers = [r["death"] for r in meta["rings"] if r["pid"] != first["pid"]]
    assert len(helpers) == 2 and all(d["cause"] == "clean_exit" or d["collateral_of"]["pid"] == first["pid"]
                                     for d in helpers), helpers  # fmt: skip


CLEAN_POOL = MAYBE_BLACKBOX + """\
import multiprocessing as mp, sys
def task(i):
    return i * i
if __name__ == "__main__":
    step(0)
    with mp.get_context(sys.argv[1]).Pool(2) as pool:  # its __exit__ terminates the helpers: SIGTERM to each
        print(sum(pool.map(task, range(200))))
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_pool_that_ends_its_with_block_is_no_death(tmp_path: Path, method: str) -> None:
    # GIVEN a job that runs a Pool in a `with` block and ends cleanly (Pool.__exit__ SIGTERMs its helpers)
    (tmp_path / "job.py").write_text(CLEAN_POOL)
    unarmed, armed = (_run(tmp_path, a, str(tmp_path / "job.py"), method) for a in (False, True))
    assert unarmed.returncode == armed.returncode == 0 and unarmed.stdout == armed.stdout == "2646700\n"
    # THEN no process of it died: the helpers' SIGTERM from the process whose Pool they served (a forkserver's
    # helper: not its parent) is the Pool's teardown (it was "a process of it died before: signal")
    meta = _bundle(tmp_path)
    helpers = [r for r in meta["rings"] if r["role"] == "worker"]  # (a spawn helper terminated before it armed: none)
    assert 1 <= len(helpers) <= 2 and meta["first_death"] is None and meta["cause"] == "clean_exit", meta["first_death"]
    # (a helper SIGTERMed as it armed was "killed; no handler ran": arming now holds the signal until its
    # handler is in; a helper that took its end-of-work sentinel before the SIGTERM ends with a clean end)
    ended = ("Pool's workers", "a clean end was recorded")
    assert all(r["death"]["cause"] == "clean_exit" and any(e in " ".join(r["death"]["evidence"]) for e in ended)
               for r in helpers), [r["death"] for r in helpers]  # fmt: skip


SEGFAULTING_DATASET = MAYBE_BLACKBOX + """\
import ctypes, sys
import torch
from torch.utils.data import DataLoader, Dataset
class Items(Dataset):
    def __len__(self):
        return 100
    def __getitem__(self, i):
        if i == 37:
            ctypes.string_at(0)  # planted: SIGSEGV in the worker serving item 37
        return torch.zeros(4)
if __name__ == "__main__":
    for n, batch in enumerate(DataLoader(Items(), batch_size=4, num_workers=2, multiprocessing_context=sys.argv[1])):
        step(n)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_dataloader_worker_that_segfaults_is_named_with_its_signal(tmp_path: Path, method: str) -> None:
    pytest.importorskip("torch")
    # GIVEN a DataLoader worker that segfaults in __getitem__: PyTorch's own worker handlers (installed over
    # faulthandler's as the worker starts) print a line and die by the signal; the main raises
    (tmp_path / "job.py").write_text(SEGFAULTING_DATASET)
    unarmed, armed = (_run(tmp_path, a, str(tmp_path / "job.py"), method) for a in (False, True))
    for proc in (unarmed, armed):  # (the main's error varies with timing, armed or not: "is killed by signal:
        # Segmentation fault", or a ConnectionResetError from the dead worker's pipe)
        assert proc.returncode == 1 and "Unexpected segmentation fault encountered in worker" in proc.stderr
    # THEN the first death is that worker, by SIGSEGV, named as a DataLoader worker (it was "killed with SIGKILL;
    # no handler ran": the crash reached no handler of ours)
    first = _bundle(tmp_path)["first_death"]
    assert (first["cause"], first["victim"]["role"]) == ("signal", "DataLoader worker"), first
    assert f"The DataLoader worker (pid {first['pid']}, started by {method}) died of SIGSEGV" in first["headline"]
