"""One run of one cell: the job started in its own session and memory cgroup, watched, dealt its death;
then what the kernel and the process table say about it (status, victims, orphans, files, steps)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .deaths import LEAK_AFTER, LEAK_HEADROOM, Death
from .jobs import Env, Job

CG_ROOT = Path("/sys/fs/cgroup/memory")
POLL_S = 0.02
GRACE_S = 2.0  # after the top process ended, what is still in the cgroup then is an orphan
MAX_S = 300.0
GRACE_OF = {"slurm": 2.0, "pod": 10.0}  # after the SIGTERM, when every process left gets SIGKILL (KillWait, a pod's)
OOM_LINE = re.compile(r"oom-kill:.*task_memcg=(?P<cg>[^,]+),task=(?P<name>[^,]+),pid=(?P<pid>\d+)")


@dataclass
class Proc:
    pid: int
    ppid: int
    argv: list[str]
    rank: str | None
    nspid: int  # its pid in its own PID namespace (a container's: `container`'s deaths), else pid


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _proc(pid: int) -> Proc | None:
    argv = _read(Path(f"/proc/{pid}/cmdline")).split("\0")[:-1]
    stat = _read(Path(f"/proc/{pid}/stat"))
    if not argv or not stat:
        return None
    environ = _read(Path(f"/proc/{pid}/environ")).split("\0")
    rank = next((e[5:] for e in environ if e.startswith("RANK=")), None)
    nspid = next((line.split()[-1] for line in _read(Path(f"/proc/{pid}/status")).splitlines()
                  if line.startswith("NSpid:")), str(pid))  # fmt: skip
    return Proc(pid, int(stat.rsplit(")", 1)[1].split()[1]), argv, rank, int(nspid))


def role(p: Proc, procs: dict[int, Proc]) -> str:
    """What the process is to the job: main, rankN, worker, forkserver, torchrun, blackbox run, ..."""
    head, text = " ".join(p.argv[:4]), " ".join(p.argv)
    if os.path.basename(p.argv[0]) == "timeout":
        return "timeout"
    if p.argv[1:4] == ["-m", "blackbox", "run"]:
        return "blackbox run"
    if "fieldrun.py" in head:
        return f"rank{p.rank}" if p.rank is not None else "main"
    if "torchrun" in head or {"accelerate", "launch"} <= {os.path.basename(a) for a in p.argv[:3]}:
        return "torchrun"  # (accelerate launch of several processes runs torchrun's agent in its own)
    if "forkserver import main" in text:
        parent = procs.get(p.ppid)
        return "worker" if parent is not None and "forkserver import main" in " ".join(parent.argv) else "forkserver"
    if "resource_tracker" in text:
        return "resource tracker"
    if "multiprocessing" in text:
        return "worker"
    return "child"


def steps_of(steps_dir: Path, pid: int) -> int | None:
    try:
        return int(struct.unpack("<q", (steps_dir / f"steps-{pid}").read_bytes()[:8])[0])
    except (OSError, struct.error):
        return None


class Cgroup:
    def __init__(self, name: str) -> None:
        self.path = CG_ROOT / name
        self.path.mkdir()
        with contextlib.suppress(OSError):
            (self.path / "memory.swappiness").write_text("0")

    def pids(self) -> list[int]:
        return [int(x) for x in _read(self.path / "cgroup.procs").split()]

    def oom_kills(self) -> int:
        m = re.search(r"oom_kill (\d+)", _read(self.path / "memory.oom_control"))
        return int(m.group(1)) if m else 0

    def usage(self) -> int:
        return int(_read(self.path / "memory.usage_in_bytes") or 0)

    def limit(self, value: int) -> None:
        (self.path / "memory.limit_in_bytes").write_text(str(value))

    def remove(self) -> None:
        for _ in range(100):
            for pid in self.pids():  # only processes this run started (the cgroup is the run's own)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def kernel_kills(cgroup: str) -> list[dict[str, Any]]:
    """The kernel's OOM kill lines for this cgroup (dmesg)."""
    out = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
    return [
        {"pid": int(m["pid"]), "name": m["name"]}
        for m in OOM_LINE.finditer(out)
        if m["cg"].rstrip("/").endswith("/" + cgroup)
    ]


def run_once(
    job: Job, death: Death, mode: str, env: Env, pkg: Path, run: Path, deal: bool, part: str
) -> dict[str, Any]:
    """Run the cell's job once in ``run`` (mode: unarmed | arm | run) and return what was observed."""
    steps_dir = run / "steps"
    steps_dir.mkdir(parents=True, exist_ok=True)
    cmd = job.command(env, run, mode == "arm", death.long)
    if job.worker_args and death.job_args:
        cmd += [*death.job_args, "--worker-leak", str(job.worker_leak_mib if death.leak == "worker" and deal else 0)]
    if mode == "run":
        cmd = [str(job.python(env)), "-m", "blackbox", "run", "--dir", str(run / "bb"), "--", *cmd]
    if death.timeout and deal:
        cmd = ["timeout", str(job.timeout_s), *cmd]
    if death.namespace:  # a container's first process: PID 1 of a PID namespace of its own
        cmd = ["unshare", "-fp", "--mount-proc", *cmd]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("BLACKBOX_", "PYTHONPATH", "FIELD_"))}
    child_env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", FIELD_STEPS=str(steps_dir))
    if deal:
        child_env.update(death.env)
        if death.leak == "main":
            child_env["FIELD_LEAK"] = f"{job.leak_mib}@{job.leak_rank}"
    if mode != "unarmed":
        child_env["PYTHONPATH"] = str(pkg)
    if mode == "arm":
        child_env["BLACKBOX_DIR"] = str(run / "rings")
        (run / "rings").mkdir(exist_ok=True)
    cg = Cgroup(f"field-{run.parent.parent.name}-{run.parent.name}-{mode}-{part}-{os.getpid()}")
    procs: dict[int, Proc] = {}
    dealt: list[dict[str, Any]] = []
    limit = None
    kill_at = None
    started = time.monotonic()
    try:
        with open(run / f"stdout-{part}.txt", "wb") as out, open(run / f"stderr-{part}.txt", "wb") as err:
            top = subprocess.Popen(cmd, cwd=job.cwd(env, run), env=child_env, stdout=out, stderr=err,
                                   start_new_session=True, preexec_fn=lambda: (cg.path / "cgroup.procs").write_text(
                                       str(os.getpid())))  # fmt: skip
            target: int | None = None
            while top.poll() is None or (kill_at and time.monotonic() < kill_at):
                for pid in cg.pids():  # read again each time: a fork shows its parent's argv until it execs
                    if (p := _proc(pid)) is not None:
                        old = procs.get(pid)  # an exiting process reads as empty: keep what was seen
                        procs[pid] = p if old is None or p.rank is not None or old.rank is None else old
                if target is None:
                    target = _target(job, procs, steps_dir)
                done = steps_of(steps_dir, procs[target].nspid) if target else None
                if deal and death.leak and limit is None and (done or 0) >= LEAK_AFTER:
                    limit = cg.usage() + LEAK_HEADROOM[death.leak]
                    cg.limit(limit)
                if deal and death.action and not dealt and target and (done or 0) >= death.at_step:
                    first = _first_process(top.pid) if death.namespace else top.pid
                    dealt.append(_deal(death.action, first, target, done))
                    if death.action in GRACE_OF:
                        kill_at = time.monotonic() + GRACE_OF[death.action]
                if kill_at and time.monotonic() >= kill_at:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(top.pid, signal.SIGKILL)
                    dealt.append({"signal": "SIGKILL", "to": "group", "pid": top.pid})
                    kill_at = None
                if time.monotonic() - started > MAX_S:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(top.pid, signal.SIGKILL)
                    dealt.append({"signal": "SIGKILL", "to": "group", "why": f"hung past {MAX_S:.0f} s"})
                time.sleep(POLL_S)
            status = top.wait()
        wall = time.monotonic() - started
        time.sleep(GRACE_S)
        orphans = [{"pid": pid, "role": role(procs[pid], procs) if pid in procs else "?",
                    "argv": " ".join((procs[pid].argv if pid in procs else [])[:4])} for pid in cg.pids()]  # fmt: skip
        oom_kills = cg.oom_kills()
    finally:
        cg.remove()
    kills = kernel_kills(cg.path.name)
    for k in kills:
        k["role"] = role(procs[k["pid"]], procs) if k["pid"] in procs else "?"
    return {
        "command": cmd, "status": status if status >= 0 else 128 - status, "wall_s": round(wall, 1),
        "top_pid": top.pid, "field_pid": os.getpid(), "target": target, "dealt": dealt, "limit": limit,
        "oom_kills": oom_kills, "kernel_kills": kills, "orphans": orphans,
        "procs": {pid: {"role": role(p, procs), "ppid": p.ppid, "rank": p.rank, "steps": steps_of(steps_dir, p.nspid),
                       "nspid": p.nspid}
                  for pid, p in procs.items()},
    }  # fmt: skip


def _target(job: Job, procs: dict[int, Proc], steps_dir: Path) -> int | None:
    """The job's main process (under torchrun: the rank that counts as main): the one fieldrun runs in,
    known by the step file it opens at start (a fork of it that has not exec'd yet opens none)."""
    for p in procs.values():
        if (steps_dir / f"steps-{p.nspid}").exists() and (job.ranks == 1 or p.rank == str(job.kill_rank)):
            return p.pid
    return None


def _first_process(unshare: int) -> int:
    """The PID namespace's first process that `unshare -fp` started (its child), as a runtime signals it."""
    children = _read(Path(f"/proc/{unshare}/task/{unshare}/children")).split()
    return int(children[0]) if children else unshare


def _deal(action: str, top: int, target: int, done: int | None) -> dict[str, Any]:
    if action == "sigkill":
        os.kill(target, signal.SIGKILL)
        return {"signal": "SIGKILL", "to": target, "after_steps": done}
    if action == "pod":
        os.kill(top, signal.SIGTERM)
        return {"signal": "SIGTERM", "to": top, "after_steps": done}
    sig = signal.SIGINT if action == "sigint-group" else signal.SIGTERM
    os.killpg(top, sig)
    return {"signal": sig.name, "to": "group", "pid": top, "after_steps": done}
