"""The job's own signal handlers: an exception one raises while blackbox's code runs in the job's thread
is the job's, and reaches the job exactly as unarmed.

CPython runs a Python handler at the next bytecode boundary after the signal, in whatever code the main
thread runs then: also blackbox's optimizer and module hooks, its excepthook and its writer. torch's
SIGCHLD handler raises ``RuntimeError: DataLoader worker (pid N) is killed by signal`` that way; a hook
that swallowed it lost it for good (CPython clears the signal's flag before it calls the handler), and
the job went on as if its worker were alive (the field's HF Trainer ``workers-spawn`` cell).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.ring.writer import c_writer_module

pytest.importorskip("torch")

# A real training loop under a timer signal whose handler raises (inside a marked window, all of it in
# the loop's `try`). The handler notes each raise that interrupted blackbox's code (a blackbox frame on
# the interrupted stack); the loop notes each raise that reached it (caught there, or in the context
# chain of what was caught: a Tick raised in torch's own `finally` replaces the one in flight). A raise
# from inside blackbox's code that never reached the job was swallowed by blackbox. (torch loses a few
# by itself, armed or not: those are not counted.)
JOB = textwrap.dedent(
    """
    import json, signal, sys, time
    import torch

    class Tick(Exception):
        pass

    counts = {"raised": 0, "caught": 0, "ticks": 0}
    accounted = set()
    in_blackbox = {}
    BLACKBOX = sys.argv[4]
    inside = False

    def on_alarm(signum, frame):
        counts["ticks"] += 1
        if inside:
            ours = False
            f = frame
            while f is not None:
                if f.f_code.co_filename.startswith(BLACKBOX):
                    ours = True
                    break
                f = f.f_back
            tick = Tick()
            # from here to the raise no call, so no nested handler can come between the count and the raise
            counts["raised"] += 1
            tick.args = (counts["raised"],)
            if ours:
                in_blackbox[counts["raised"]] = True
            raise tick

    if sys.argv[1] == "arm":
        import blackbox
        blackbox.arm(sys.argv[2])
    from torch.optim.optimizer import _global_optimizer_pre_hooks
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(12)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)
    if sys.argv[1] == "arm":  # blackbox attaches its hooks from its sampler once torch is loaded
        limit = time.monotonic() + 30
        while not _global_optimizer_pre_hooks and time.monotonic() < limit:
            time.sleep(0.01)
        assert _global_optimizer_pre_hooks, "blackbox's hooks never attached"
    for _ in range(20):  # torch's lazy imports on the first steps swallow what is raised in them: before the timer
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    end = time.monotonic() + float(sys.argv[3])
    steps = 0
    try:
        while True:
            try:
                torch.set_grad_enabled(True)  # a Tick inside step()'s own `finally` can leave grad mode off
                inside = True
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                inside = False
                steps += 1
                if time.monotonic() > end:
                    break
            except Tick as exc:
                inside = False
                counts["caught"] += 1
                seen = exc
                while seen is not None:
                    if isinstance(seen, Tick):
                        accounted.add(seen.args[0])
                    seen = seen.__context__
    finally:
        inside = False  # whatever else escapes the loop: no Tick after it
        signal.setitimer(signal.ITIMER_REAL, 0)
    counts["steps"] = steps
    counts["accounted"] = len(accounted)
    counts["in_blackbox"] = len(in_blackbox)
    counts["lost_in_blackbox"] = len(set(in_blackbox) - accounted)
    print(json.dumps(counts))
    """
)


def _run(mode: str, rings: Path, seconds: float, backend: str) -> dict[str, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO), BLACKBOX_WRITER=backend)
    package = str(REPO / "blackbox") + os.sep
    rings.mkdir()
    proc = subprocess.run([sys.executable, "-c", JOB, mode, f"{rings}/", str(seconds), package], capture_output=True,
                          text=True, env=env, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    counts: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return counts


@pytest.mark.parametrize(("mode", "backend"), [("unarmed", "c"), ("arm", "c"), ("arm", "python")])
def test_an_exception_from_the_jobs_signal_handler_always_reaches_the_job(
    tmp_path: Path, mode: str, backend: str
) -> None:
    if mode == "arm" and backend == "c" and c_writer_module() is None:
        pytest.skip("the C write path blackbox.ring._cwriter is not built (no C compiler at install)")
    counts = _run(mode, tmp_path / "rings", 4.0, backend)
    # the timer really interrupted the training loop, inside the window, many times
    assert counts["raised"] >= 100, counts
    assert counts["steps"] > 0, counts
    # no exception of the job's handler raised while blackbox's code ran was lost on its way to the job
    print(mode, counts)
    assert counts["lost_in_blackbox"] == 0, counts
    if mode == "arm":
        assert any((tmp_path / "rings").glob("*.ring")), "the job was not armed"
        assert counts["in_blackbox"] > 0, f"the handler never ran inside blackbox's hooks: {counts}"
    else:
        assert counts["in_blackbox"] == 0, counts


def test_raised_by_signal_handler_names_only_the_jobs_handler(tmp_path: Path) -> None:
    from blackbox._jobsignal import raised_by_signal_handler

    class Planted(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Planted("from the handler")

    previous = signal.signal(signal.SIGUSR2, handler)
    try:
        try:
            signal.raise_signal(signal.SIGUSR2)
            for _ in range(10):  # the handler runs at the next bytecode boundary
                pass
        except Planted as exc:
            from_handler: BaseException = exc
        try:
            raise Planted("not from a handler")
        except Planted as exc:
            ours: BaseException = exc
        assert raised_by_signal_handler(from_handler)
        assert not raised_by_signal_handler(ours)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    # once the handler is no longer installed, its old exceptions are no longer recognised as the job's
    assert not raised_by_signal_handler(from_handler)
