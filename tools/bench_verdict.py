"""How soon after a job's death `blackbox run` has its verdict on disk, and its whole bundle.

The job is a training loop armed by `blackbox run` with the default ring (32 MiB, 262,144 slots) that
has written more than a full lap; it is ended as a scheduler ends a job: SIGTERM to every process of
it (`blackbox run` and the job's own group) at once. Times are from the job's death (its pidfd turns
readable) to metadata.json first at `bundle/` (the verdict) and to metadata.json saying the bundle is
whole. With ``--kill-after S`` every process also gets SIGKILL S seconds after the SIGTERM, as Slurm
does (2 s on a loaded node), and the run reports what it left.

``--compare PATH`` runs another checkout's blackbox (PYTHONPATH=PATH) in turns with this one, side by
side; a bundle without ``complete`` in its metadata.json is whole when it appears.

    python tools/bench_verdict.py --runs 5 [--compare /work/main] [--kill-after 2]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOB = """
import os, sys, time
import blackbox
kept = []
for i in range(300_000):  # more than the ring's 262,144 slots
    if i % 100 == 0:
        blackbox.step(i // 100)
    else:
        blackbox.mark("batch", i)
    if i % 10_000 == 0:
        kept.append(bytearray(1 << 20))
print(os.getpid(), flush=True)
time.sleep(600)
"""


def one_run(repo: Path, work: Path, kill_after: float | None) -> dict[str, float | str | None]:
    job = work / "job.py"
    job.write_text(JOB)
    env = dict(os.environ, PYTHONPATH=str(repo), MPLBACKEND="Agg")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(work / "d"), "--", sys.executable, str(job)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True,
        cwd=work,  # `-m` puts the working folder first on the path: the repo named must be the one imported
    )  # fmt: skip
    assert launcher.stdout is not None
    job_pid = int(launcher.stdout.readline())
    (run,) = (work / "d").glob("run-*")
    meta_path = run / "bundle" / "metadata.json"
    pidfd = os.pidfd_open(job_pid)
    # every process of the job, as slurmstepd does: the job's group is blackbox run's own (since f3c15ea;
    # before, a group of its own)
    groups = sorted({os.getpgid(launcher.pid), os.getpgid(job_pid)})
    signalled = time.monotonic()
    for group in groups:
        os.killpg(group, signal.SIGTERM)
    select.select([pidfd], [], [], 60)
    died = time.monotonic()
    os.close(pidfd)
    verdict = whole = None
    seen = None
    killed = False
    while True:
        done = launcher.poll() is not None  # then one last look at what it left
        now = time.monotonic()
        if kill_after is not None and not killed and now - signalled >= kill_after:
            for group in groups:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed = True
        try:
            ino = os.stat(meta_path).st_ino
        except FileNotFoundError:
            ino = None
        if ino is not None and ino != seen:
            seen = ino
            complete = json.loads(meta_path.read_bytes()).get("complete", True)
            verdict = verdict if verdict is not None else now - died
            if complete:
                whole = now - died
        if done:
            break
        time.sleep(0.001)
    launcher.wait()
    left = sorted(p.name for p in run.iterdir() if p.name.startswith(".bundle."))
    return {"verdict": verdict, "whole": whole, "left": ", ".join(left) or "-",
            "killed": "yes" if launcher.returncode == -signal.SIGKILL else "no"}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compare", type=Path, help="another checkout, run in turns with this one")
    parser.add_argument("--kill-after", type=float, help="SIGKILL every process this many s after the SIGTERM")
    args = parser.parse_args()
    repos = {"this": REPO, **({"compare": args.compare} if args.compare else {})}
    results: dict[str, list[dict[str, float | str | None]]] = {k: [] for k in repos}
    for i in range(args.runs):
        for name, repo in repos.items():
            with tempfile.TemporaryDirectory(prefix="bench-verdict-") as tmp:
                r = one_run(repo, Path(tmp), args.kill_after)
            results[name].append(r)
            print(f"run {i + 1} {name}: verdict {_s(r['verdict'])}, whole {_s(r['whole'])} after the job's death; "
                  f"SIGKILLed: {r['killed']}; left beside the bundle: {r['left']}", flush=True)  # fmt: skip
    for name, rs in results.items():
        print(f"{name} ({repos[name]}): median verdict {_median([r['verdict'] for r in rs])}, "
              f"median whole {_median([r['whole'] for r in rs])}; "
              f"{sum(r['verdict'] is None for r in rs)} of {len(rs)} runs left no verdict")  # fmt: skip


def _s(v: float | str | None) -> str:
    return "none" if v is None else f"{float(v):.2f} s"


def _median(values: list[float | str | None]) -> str:
    got = [float(v) for v in values if v is not None]
    return f"{statistics.median(got):.2f} s (of {len(got)})" if got else "none"


if __name__ == "__main__":
    main()
