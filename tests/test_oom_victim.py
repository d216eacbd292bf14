"""Arming does not change which process the kernel's OOM killer picks.

A DataLoader job whose worker 0 leaks runs in a child memory cgroup, unarmed, armed with ``arm()`` at the
top of the script, and under ``blackbox run``. Worker 0 grows until it is LEAD_MIB bigger than the main
process's own memory (its RSS less the ring's mapped pages, read from /proc/PID/smaps), then fills an unmapped
memfd (cgroup memory that is no process's RSS) until the kernel kills someone. The kernel must kill
worker 0 in all three runs, as it does unarmed: worker 0 its first victim (read from the kernel's log where
it can be; else the cgroup's count of one kill), torch's own error naming worker 0, exit 1, and nothing
left running in the cgroup. When the ring's 32 MiB counted in the main process's RSS (mapped and
pre-faulted, as before the write window), the main process outweighed the worker and was killed instead
(exit 137), leaving the forkserver and its workers running as orphans.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
from cgroup_util import CgroupRefused, child_memory_cgroup, join  # noqa: E402

pytest.importorskip("torch", reason="the DataLoader job needs torch (tools/setup.sh installs it)")

LIMIT = 1280 << 20  # the main process, a forkserver, two workers (~230 MiB each with torch) and headroom
LEAD_MIB = 16  # worker 0 outgrows the main process's own memory by this much; the old ring added 35 MiB

JOB = """
import os, sys
ctx, out, mode, lead_mib = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if mode == "arm":  # at the top of the script: spawn and forkserver workers run this again
    import blackbox
    blackbox.arm(out + "/rings/")
import torch
from torch.utils.data import DataLoader, Dataset

def vm_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

def ring_rss(pid):
    total, in_ring = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                in_ring = out in line  # a ring (mapped under its temporary name: "... (deleted)")
            elif in_ring and head[0] == "Rss:":
                total += int(head[1])
    return total

class Leaky(Dataset):
    def __init__(self, main_pid):
        self.main_pid = main_pid
    def __len__(self):
        return 64
    def __getitem__(self, i):
        worker = torch.utils.data.get_worker_info()
        with open(f"{out}/worker{worker.id}.pid", "w") as f:
            f.write(str(os.getpid()))
        if worker.id == 0 and i == 0:
            target = vm_rss(self.main_pid) - ring_rss(self.main_pid) + (lead_mib << 10)
            kept = []
            while vm_rss(os.getpid()) < target:
                kept.append(b"\\x01" * (4 << 20))
            with open(f"{out}/balloon", "w") as f:
                f.write(f"main {vm_rss(self.main_pid)} KiB (ring {ring_rss(self.main_pid)} KiB), "
                        f"worker 0 {vm_rss(os.getpid())} KiB")
            balloon, chunk = os.memfd_create("balloon"), b"\\x02" * (1 << 20)
            while True:
                os.write(balloon, chunk)
        return torch.tensor([float(i)])

if __name__ == "__main__":
    with open(f"{out}/main.pid", "w") as f:
        f.write(str(os.getpid()))
    loader = DataLoader(Leaky(os.getpid()), batch_size=1, num_workers=2, multiprocessing_context=ctx)
    print("total", sum(float(b.sum()) for b in loader), flush=True)
"""


def _oom_kills(cg: Path, version: int) -> int:
    text = (cg / ("memory.events" if version == 2 else "memory.oom_control")).read_text()
    return int(re.search(r"^oom_kill (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]


def _kmsg_from_now() -> int | None:
    """/dev/kmsg (root), at its end: the kernel's log from now on; None where it cannot be read."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    os.lseek(fd, 0, os.SEEK_END)
    return fd


def _killed(fd: int | None, pids: set[int]) -> tuple[list[int] | None, list[str]]:
    """Which of ``pids`` the kernel's OOM killer killed since _kmsg_from_now, in order (its "Killed process"
    line is never rate-limited; the memcg line before it is), and the rows of the kernel's task tables that
    name them (rss, page tables, oom_score_adj: why it chose as it did); None and [] without the log."""
    if fd is None:
        return None, []
    killed, rows = [], []
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten before we read them: the rest still comes
                continue
            m = re.search(r"Killed process (\d+) ", record)
            if m and int(m.group(1)) in pids:
                killed.append(int(m.group(1)))
            row = re.search(r";(\[ *(\d+)\].*)", record)
            if row and int(row.group(2)) in pids:
                rows.append(row.group(1).strip())
    finally:
        os.close(fd)
    return killed, rows


def _procs(cg: Path) -> list[int]:
    return [int(p) for p in (cg / "cgroup.procs").read_text().split()]


def _run(tmp_path: Path, context: str, how: str, attempt: int = 0) -> dict[str, object]:
    out = tmp_path / (f"{how}-{attempt}" if attempt else how)
    out.mkdir()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    cmd = [sys.executable, str(script), context, str(out), "arm" if how == "arm" else "no", str(LEAD_MIB)]
    if how == "run":
        cmd = [sys.executable, "-m", "blackbox", "run", "--dir", str(out / "run"), "--", *cmd]
    env = dict(os.environ, PYTHONPATH=str(REPO), BLACKBOX_DIR=str(out / "default"))
    try:
        with child_memory_cgroup(LIMIT, f"rss-victim-{context}-{how}") as (cg, version):
            if version == 1 and (cg / "memory.swappiness").exists():
                (cg / "memory.swappiness").write_text("0")
            elif version == 2 and (cg / "memory.swap.max").exists():
                (cg / "memory.swap.max").write_text("0")
            kills, log = _oom_kills(cg, version), _kmsg_from_now()
            try:
                with open(out / "stderr", "w") as err:  # a file, not a pipe: orphans may hold it open
                    proc = subprocess.run(cmd, env=env, cwd=out, stdout=subprocess.DEVNULL, stderr=err,
                                          timeout=240, preexec_fn=lambda: join(cg))  # fmt: skip
                deadline = time.monotonic() + 15
                while _procs(cg) and time.monotonic() < deadline:  # the job's own helpers end after it
                    time.sleep(0.1)
                left = _procs(cg)
                kills = _oom_kills(cg, version) - kills
            finally:
                for pid in _procs(cg):  # never leave a process behind, whatever happened
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
    except CgroupRefused as exc:
        pytest.skip(str(exc))
    stderr = (out / "stderr").read_text()
    error = next((e for e in reversed(stderr.splitlines()) if e.startswith("RuntimeError: DataLoader worker")), "")
    names = [n for n in ("main", "worker0", "worker1") if (out / f"{n}.pid").exists()]
    pids = {n: int((out / f"{n}.pid").read_text()) for n in names}
    worker0 = str(pids.get("worker0", "?"))
    balloon = (out / "balloon").read_text() if (out / "balloon").exists() else ""
    killed, rows = _killed(log, set(pids.values()))
    victims = None if killed is None else [next(n for n, p in pids.items() if p == pid) for pid in killed]
    tables = "\n".join(f"  {row}" for row in rows)  # the kernel's view of each kill, in pages
    return {"rc": proc.returncode, "kills": kills, "victims": victims, "left": left, "error": error,
            "worker0": worker0, "worker1": str(pids.get("worker1", "?")),
            "balloon": f"{balloon}; pids {pids}\n{tables}" if balloon else "",
            "stderr": stderr[-3000:]}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver", "fork"])
def test_kernel_oom_kills_the_same_leaking_worker_armed_or_not(tmp_path: Path, context: str) -> None:
    errors = {}
    for how in ("unarmed", "arm", "run"):
        for attempt in range(3):  # a second kill that takes the main process, not worker 1 (the kernel's race below,
            r = _run(tmp_path, context, how, attempt)  # seen unarmed in CI: their RSS alike) ends the job before it
            if "main" not in (r["victims"] or [])[1:]:  # can tell its worker's death: that run again, twice at most
                break
        what = f"{context}, {how}: {r['balloon'] or 'worker 0 never reached its size'}"
        assert r["balloon"], f"{what}\n{r['stderr']}"
        if r["victims"] is None:  # no kernel log to read here: the cgroup's count alone
            assert r["kills"] == 1, f"{what}: one OOM kill, got {r['kills']}"
        else:
            # worker 0 is the kernel's first victim, and each kill is one of the job's own processes. A second
            # kill may follow within milliseconds (seen twice in CI runs under load, both armed, 7 ms apart): most
            # likely the kernel marks the victim done once its memory is unmapped (exit_mmap), while the memfd
            # balloon goes only when its files are released after that, and a charge in between kills again.
            victims = r["victims"]
            assert victims[:1] == ["worker0"] and len(victims) == r["kills"], (
                f"{what}: the kernel killed {victims} of the job's processes, {r['kills']} in the cgroup"
            )
            assert victims in (["worker0"], ["worker0", "worker1"]), f"{what}: victims {victims}"
        assert r["rc"] == 1, f"{what}: the job exits 1 after its worker's death, got {r['rc']}\n{r['stderr']}"
        killed = [r["worker0"], r["worker1"]] if r["victims"] == ["worker0", "worker1"] else [r["worker0"]]
        assert any(f"pid {pid})" in r["error"] or f"pid(s) {pid})" in r["error"] for pid in killed), (
            f"{what}: torch names a worker the kernel killed ({killed}) as the one that died: {r['error']!r}"
        )  # (after a second kill, whichever of the two its main process noticed first: seen once in CI, spawn)
        assert r["left"] == [], f"{what}: processes left running in the cgroup: {r['left']}"
        errors[how] = re.sub(r"\d+", "N", str(r["error"]))
    assert errors["arm"] == errors["run"] == errors["unarmed"], errors
