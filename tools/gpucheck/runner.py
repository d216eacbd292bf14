"""What every check shares: its context, the jobs it starts (each under a timeout, killed with its process
group when it runs over), and the recovery of the rings a job left (blackbox's own ``recover``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MiB, GiB = 1 << 20, 1 << 30

# What each job is given: on a GPU, sized for an 80-141 GiB device; on the fake one (8 GiB), a quarter.
SIZES: dict[bool, dict[str, Any]] = {
    False: {"chunk": GiB, "segment": 2 * GiB, "piece": 256 * MiB, "leak": 64 * MiB, "scratch": 16 * MiB,
            "leak_steps": 30, "history_steps": 300, "batch": 8, "cost_rounds": 12, "cost_steps": 12,
            "warmup": 10, "settle_steps": 5, "settle_s": 0.5, "target_ms": [25, 50], "kill_after": [1.0, 2.0],
            "leak_settle_s": 2.5},
    True: {"chunk": 256 * MiB, "segment": 512 * MiB, "piece": 64 * MiB, "leak": 16 * MiB, "scratch": 4 * MiB,
           "leak_steps": 30, "history_steps": 120, "batch": 8, "cost_rounds": 3, "cost_steps": 8,
           "warmup": 2, "settle_steps": 2, "settle_s": 0.15, "target_ms": [0, 1e9], "kill_after": [0.3, 0.6],
           "leak_settle_s": 1.4},
}  # fmt: skip


@dataclass
class Job:
    """A finished job: its exit status (negative: the signal), output, and time."""

    name: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    def tail(self, n: int = 600) -> str:
        return self.stderr[-n:]


@dataclass
class Ctx:
    fake: bool
    scratch: Path  # this check's own folder: rings, bundles, the jobs' truths
    out: Path  # the report's folder: a few small files only
    deadline: float  # time.monotonic() by which the check must be done
    python: str = sys.executable
    raw: bool = True  # the raw rings kept in bundles (needs zstandard)
    sizes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sizes = SIZES[self.fake]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def folder(self, name: str) -> Path:
        d = self.scratch / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def cfg(self, name: str, **kw: Any) -> dict[str, Any]:
        """A job's config: where its ring goes, where it writes its truth, and the rest."""
        d = self.folder(name)
        (d / "ring").mkdir(exist_ok=True)
        return {"fake": self.fake, "ring": str(d / "ring"), "truth": str(d / "truth.json"),
                "ready": str(d / "ready"), **kw}  # fmt: skip

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra or {}))
        env.pop("BLACKBOX_DIR", None)
        if self.fake:  # the fake step is numpy on the CPU: one thread, as the sampler's neighbour on a GPU host
            env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        return env


def start_job(ctx: Ctx, name: str, cfg: dict[str, Any], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A job started in a session of its own (so a timeout kills all it started); output to files."""
    d = Path(cfg["truth"]).parent
    out = open(d / f"{name}.out", "w")  # noqa: SIM115 (closed by the child's end: the files outlive this call)
    err = open(d / f"{name}.err", "w")  # noqa: SIM115
    return subprocess.Popen([ctx.python, str(HERE / "job.py"), name, json.dumps(cfg)], stdout=out, stderr=err,
                            text=True, env=ctx.env(env), start_new_session=True)  # fmt: skip


def finish_job(ctx: Ctx, proc: subprocess.Popen[str], name: str, cfg: dict[str, Any], timeout: float,
               t0: float) -> Job:  # fmt: skip
    timed_out = False
    try:
        proc.wait(timeout=max(1.0, min(timeout, ctx.left())))
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
    d = Path(cfg["truth"]).parent
    return Job(name, proc.returncode, (d / f"{name}.out").read_text(), (d / f"{name}.err").read_text(),
               time.monotonic() - t0, timed_out)  # fmt: skip


def kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def run_job(ctx: Ctx, name: str, cfg: dict[str, Any], *, timeout: float, env: dict[str, str] | None = None) -> Job:
    t0 = time.monotonic()
    return finish_job(ctx, start_job(ctx, name, cfg, env), name, cfg, timeout, t0)


def kill_when_ready(ctx: Ctx, name: str, cfg: dict[str, Any], *, timeout: float, after: float = 0.0,
                    env: dict[str, str] | None = None) -> tuple[Job, float | None]:  # fmt: skip
    """Start a job, wait for its ``ready`` file, wait ``after`` seconds more, SIGKILL it; returns the job and
    the wall time of the kill (None where it never got ready)."""
    t0 = time.monotonic()
    proc = start_job(ctx, name, cfg, env)
    ready = Path(cfg["ready"])
    limit = t0 + min(timeout, ctx.left())
    while not ready.exists() and proc.poll() is None and time.monotonic() < limit:
        time.sleep(0.05)
    killed_at = None
    if ready.exists() and proc.poll() is None:
        time.sleep(after)
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
    return finish_job(ctx, proc, name, cfg, max(1.0, limit - time.monotonic()), t0), killed_at


def truth(cfg: dict[str, Any]) -> dict[str, Any]:
    path = Path(cfg["truth"])
    if not path.exists():
        raise CheckError(f"the job wrote no truth ({path.name})")
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def recover(ctx: Ctx, cfg: dict[str, Any], tag: str = "bundle") -> tuple[dict[str, Any], Any, Path]:
    """blackbox's recovery of the job's ring folder: (metadata.json, timeline.parquet as a table, the bundle)."""
    import pyarrow.parquet as pq

    import blackbox

    bundle = Path(cfg["truth"]).parent / tag
    blackbox.recover(cfg["ring"], bundle, raw=ctx.raw)
    meta = json.loads((bundle / "metadata.json").read_text())
    return meta, pq.read_table(bundle / "timeline.parquet"), bundle


def rows(table: Any, *kinds: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The timeline's rows of these kinds, as dicts (the small kinds only: OOMs, samples, signals)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    picked = table.filter(pc.is_in(table["kind"].cast(pa.string()), value_set=pa.array(list(kinds))))
    if columns:
        picked = picked.select(columns)
    out: list[dict[str, Any]] = picked.to_pylist()
    return out


def time_s(row: dict[str, Any]) -> float:
    """A timeline row's time as seconds since the epoch."""
    return float(row["time"].timestamp())


def blackbox_warnings(stderr: str) -> list[str]:
    """Lines of a job's stderr that are blackbox's own warnings or errors."""
    return [ln for ln in stderr.splitlines() if "BlackboxWarning" in ln or ln.startswith("blackbox:")]


class CheckError(Exception):
    """A check could not reach its verdict (a job failed to start, wrote no truth, left no ring)."""


def near(a: float | None, b: float | None, rel: float, absolute: float = 0.0) -> bool:
    return a is not None and b is not None and abs(a - b) <= max(rel * abs(b), absolute)


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MiB:,.1f} MiB"
