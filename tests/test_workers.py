"""Helper processes (spawn and forkserver DataLoader workers): a bounded footprint, grouped in the summary,
and a worker that exits normally is never a death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_py

from blackbox.recovery.pipeline import recover_rings

pytest.importorskip("torch")

JOB = """
import sys
from pathlib import Path
if sys.argv[3] == "arm":
    import blackbox
    blackbox.arm(sys.argv[4] + "/")  # at the top of the script: spawn/forkserver workers run this again
import torch
from torch.utils.data import DataLoader, Dataset

class Squares(Dataset):
    def __len__(self): return 32
    def __getitem__(self, i): return torch.tensor([float(i * i)])

if __name__ == "__main__":
    loader = DataLoader(Squares(), batch_size=8, num_workers=2, multiprocessing_context=sys.argv[1])
    print("total", sum(float(b.sum()) for _ in range(int(sys.argv[2])) for b in loader), flush=True)
"""


@pytest.mark.slow
def test_spawn_workers_under_run_are_small_folded_and_grouped(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    unarmed = subprocess.run([sys.executable, str(script), "spawn", "3", "no"], capture_output=True, text=True,
                             timeout=300, env=env)  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "d"), "--", sys.executable, str(script),
         "spawn", "3", "no"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == unarmed.returncode == 0 and proc.stdout == unarmed.stdout, proc.stderr
    (run,) = (tmp_path / "d").glob("run-*")
    rings = sorted((run / "rings").glob("*.ring"))
    assert len(rings) == 1  # the job's own; six workers (3 epochs x 2) folded away at their clean end
    lines = (run / "rings" / "folded.jsonl").read_text().splitlines()
    workers = [json.loads(line) for line in lines if json.loads(line)["argv"][-1:] == ["--multiprocessing-fork"]]
    assert len(workers) == 6 and {w["role"] for w in workers} == {"worker"}
    assert sum(p.stat().st_size for p in (run / "rings").iterdir()) < 40 << 20  # the main ring and a few lines
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    assert meta["death"]["cause"] == "clean_exit" and meta["first_death"] is None
    (group,) = [g for g in meta["helpers"] if g["argv"][-1:] == ["--multiprocessing-fork"]]
    assert group["count"] == 6 and group["ppid"] == meta["pid"] and group["role"] == "worker"
    assert (group["name"], group["start_method"]) == ("DataLoader worker", "spawn"), group
    summary = (run / "bundle" / "summary.md").read_text()
    assert f"6 DataLoader workers (started by spawn) of pid {meta['pid']}" in summary


@pytest.mark.slow
@pytest.mark.parametrize("context", ["forkserver", "spawn"])
def test_arm_at_the_top_of_a_script_workers_that_exit_normally_are_not_deaths(tmp_path: Path, context: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = run_py(f"import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path({str(script)!r}, run_name='__main__')",
                 str(script), context, "2", "arm", str(tmp_path / "rings"), timeout=300)  # fmt: skip
    assert out.stdout.startswith("total")
    recovered = recover_rings([tmp_path / "rings"])
    rings = recovered.meta.get("rings") or [recovered.meta]
    assert len(rings) >= 2  # the job and at least one helper armed too
    assert {m["death"]["cause"] for m in rings} == {"clean_exit"}, [
        (m["role"] if "role" in m else m["pid"], m["death"]) for m in rings
    ]
    assert recovered.meta["first_death"] is None
    helpers = [m for m in rings if m["pid"] != rings[0]["pid"]]
    assert all(read["capacity"] <= 8192 for read in [{"capacity": m["recovery"]["slots"]} for m in helpers])


POOL_JOB = """
import multiprocessing as mp, sys
def square(i):
    return i * i
if __name__ == "__main__":
    pool = mp.get_context(sys.argv[1]).Pool(2)
    print(sum(pool.map(square, range(8))), flush=True)
    pool.close()
    pool.join()
"""


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_pool_helpers_that_end_cleanly_are_folded_under_their_own_name(tmp_path: Path, context: str) -> None:
    # GIVEN a multiprocessing Pool whose helpers end cleanly (close, join) under `blackbox run`
    script = tmp_path / "job.py"
    script.write_text(POOL_JOB)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "d"), "--",
                           sys.executable, str(script), context], capture_output=True, text=True, timeout=300,
                          env=env)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "140\n", proc.stderr[-2000:]
    # THEN they are folded and told as Pool workers started by their start method, not DataLoader workers
    (run,) = (tmp_path / "d").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    (group,) = [g for g in meta["helpers"] if g["role"] == "worker"]
    assert (group["count"], group["name"], group["start_method"]) == (2, "multiprocessing Pool worker", context)
    summary = (run / "bundle" / "summary.md").read_text()
    parent = meta["pid"] if context == "fork" else group["ppid"]  # a forkserver's helpers are the forkserver's
    assert f"2 multiprocessing Pool workers (started by {context}) of pid {parent}" in summary, summary
    assert "DataLoader" not in summary


SIGTERMED = """
import os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self): return 100000
    def __getitem__(self, i):
        if i == 40:
            open(sys.argv[1], "w").write(str(os.getpid()))  # the planted truth: this worker gets the SIGTERM
        time.sleep(0.002)
        return torch.randn(4)

for step, x in enumerate(DataLoader(Slow(), batch_size=8, num_workers=2)):
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_a_dataloader_worker_sent_sigterm_died_of_it_not_of_sigkill(tmp_path: Path) -> None:
    # GIVEN a DataLoader worker (fork) sent SIGTERM under `blackbox run`: PyTorch's own native handler in the
    # worker takes it and raises it again with its default action; the main process then fails
    (tmp_path / "job.py").write_text(SIGTERMED)
    marked = tmp_path / "worker"
    proc = subprocess.Popen([sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--",
                             sys.executable, str(tmp_path / "job.py"), str(marked)],
                            env=dict(os.environ, PYTHONPATH=str(REPO)), stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not marked.exists() or not marked.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)
    worker = int(marked.read_text())
    os.kill(worker, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    # (the main's error varies with timing, armed or not: PyTorch's "is killed by signal: Terminated", a
    # ConnectionResetError from the dead worker's socket while a batch was handed over, or, refused as the
    # batch's shared memory was fetched from it, "exited unexpectedly")
    told = (f"DataLoader worker (pid {worker}) is killed by signal: Terminated", "ConnectionResetError",
            f"DataLoader worker (pid(s) {worker}) exited unexpectedly")  # fmt: skip
    assert proc.returncode == 1 and any(t in err for t in told), err[-2000:]
    # THEN the first death is that worker, ended by SIGTERM from its sender (it read "killed with SIGKILL after
    # SIGTERM ...; no handler ran")
    (bundle,) = (tmp_path / "run").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    first = meta["first_death"]
    assert first["pid"] == worker and first["cause"] == "signal", first
    assert "SIGKILL" not in first["headline"] and "SIGTERM from " in first["headline"], first["headline"]


SHUT_DOWN = """
import time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self): return 100
    def __getitem__(self, i):
        if i == 2:
            time.sleep(15)  # still at it when the loop stops: its parent's shutdown SIGTERMs it
        return torch.zeros(4)
it = iter(DataLoader(Slow(), batch_size=2, num_workers=1, prefetch_factor=2))
next(it)
worker = it._workers[0]
it._shutdown_workers()
print("worker exit code", worker.exitcode, flush=True)
"""


@pytest.mark.slow
def test_a_worker_its_parent_shut_down_is_no_death(tmp_path: Path) -> None:
    # GIVEN a DataLoader shut down while its worker is busy: the parent SIGTERMs it, and PyTorch's native
    # handler exits 0 on its parent's SIGTERM; the job exits 0
    (tmp_path / "job.py").write_text(SHUT_DOWN)
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--",
                           sys.executable, str(tmp_path / "job.py")], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and "worker exit code 0" in proc.stdout, proc.stderr[-2000:]
    # THEN the bundle tells no death (the worker read "ended by a signal (SIGTERM from python)", the first death)
    (bundle,) = (tmp_path / "run").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    assert meta["cause"] == "clean_exit" and meta["first_death"] is None, meta["first_death"]
