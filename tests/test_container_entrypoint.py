"""A job that is a container's first process (PID 1 of its PID namespace: `CMD ["python", "train.py"]`), armed by
`arm()` in its own code or started by `blackbox run`: the kernel spares that process any signal it has no handler
for, so a pod's SIGTERM leaves it running until the grace period's SIGKILL. Armed, it runs on as unarmed, and the
bundle says so: the SIGTERM dropped, the SIGKILL after it the grace period running out, and the lever.

Each job runs in a PID namespace of its own (`unshare -fp --mount-proc`), its SIGTERM and SIGKILL sent from outside
it, as a container's runtime sends them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-fp", "--mount-proc", "true"], capture_output=True, timeout=30).returncode,
        reason="no PID namespace can be made here (unshare -fp --mount-proc)",
    ),
]

ENV = dict(os.environ, PYTHONPATH=str(REPO))
BLACKBOX = [sys.executable, "-m", "blackbox", "run", "--quiet"]
JOB = """\
import ctypes, os, signal, sys, time
up, rings, how = sys.argv[1:4]
if "arm" in how:
    import blackbox
    blackbox.arm(rings + "/")
if "handler" in how:
    signal.signal(signal.SIGTERM, lambda *_: print("took it, and went on", flush=True))
if "native fork" in how:  # a child forked past Python's at-fork hooks (a C library's fork)
    pid = ctypes.CDLL(None).fork()
    if pid == 0:
        open(up + ".child", "w").write(str(os.getpid()))
        time.sleep(10)
        print("child ran on", flush=True)
        os._exit(0)
    while not os.path.exists(up + ".child"):
        time.sleep(0.01)
    print("child ended:", os.waitpid(pid, 0)[1], flush=True)
open(up, "w").close()
if "later" in how:  # a handler installed later (the first SIGTERM came with none)
    time.sleep(1.5)
    signal.signal(signal.SIGTERM, lambda *_: print("took it, and went on", flush=True))
time.sleep(float(sys.argv[4]))
print("ran on", flush=True)
"""


def _first_process(tmp_path: Path, name: str, how: str, seconds: float, *, run: bool = False,
                   namespace: bool = True) -> tuple[subprocess.Popen[str], int, Path]:  # fmt: skip
    """The job started as its PID namespace's first process (`blackbox run` in its place where ``run``), or as a
    plain process; its Popen, the pid outside the namespace that the runtime signals, and its rings' folder."""
    (tmp_path / "job.py").write_text(JOB)
    rings, up = tmp_path / f"rings-{name}", tmp_path / f"up-{name}"
    rings.mkdir()
    job = [sys.executable, str(tmp_path / "job.py"), str(up), str(rings), how, str(seconds)]
    cmd = [*BLACKBOX, "--dir", str(rings), "--", *job] if run else job
    proc = subprocess.Popen(["unshare", "-fp", "--mount-proc", *cmd] if namespace else cmd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (up.exists() or Path(f"{up}.child").exists()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert up.exists() or Path(f"{up}.child").exists(), proc.communicate(timeout=10)
    time.sleep(0.5)  # a few records written after it was up
    if not namespace:
        return proc, proc.pid, rings
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return proc, int(children[0]), rings


def _death(rings: Path, out: Path) -> dict:
    found = [str(p) for p in rings.rglob("*.ring")]
    assert len(found) == 1, found
    subprocess.run([sys.executable, "-m", "blackbox", "recover", found[0], "-o", str(out)], env=ENV,
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    return json.loads((out / "metadata.json").read_text())["death"]


def test_a_sigterm_to_an_armed_entrypoint_with_no_handler_is_dropped_as_unarmed(tmp_path: Path) -> None:
    # GIVEN a Python job that is a container's first process, with no SIGTERM handler: armed by arm() in its own
    # code, and unarmed
    ended = {}
    for how in ("none", "arm"):
        proc, init, rings = _first_process(tmp_path, how, how, 2.0)
        # WHEN the container's runtime sends it SIGTERM
        try:
            os.kill(init, signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            with contextlib.suppress(OSError):
                os.kill(init, signal.SIGKILL)
        ended[how] = (proc.returncode, out, rings)
    # THEN both run on (the kernel drops it for PID 1) and exit by themselves, as the job's last line says
    assert ended["none"][:2] == ended["arm"][:2] == (0, "ran on\n"), ended
    # AND the armed job's bundle says the SIGTERM was dropped and the job ran on: no death by it, no handler's
    death = _death(ended["arm"][2], tmp_path / "bundle")
    assert death["cause"] == "clean_exit", death
    assert any(re.search(r"^SIGTERM at \S+ was dropped \(no handler; the kernel spares its PID namespace's first "
                         r"process: this one, .*\): the job ran on$", e) for e in death["evidence"]), death  # fmt: skip


@pytest.mark.parametrize("entry", ["arm() in the job", "blackbox run"])
def test_a_sigkill_after_a_dropped_sigterm_is_told_as_the_grace_period_running_out(tmp_path: Path, entry: str) -> None:
    # GIVEN a job with no SIGTERM handler as a container's first process (armed in its code, or blackbox run in its
    # place), whose pod is deleted: SIGTERM, then, a planted 1.5 s of grace later, SIGKILL
    grace = 1.5
    proc, init, rings = _first_process(tmp_path, "pod", "arm" if entry.startswith("arm") else "none", 60,
                                       run=entry == "blackbox run")  # fmt: skip
    try:
        os.kill(init, signal.SIGTERM)
        time.sleep(grace)
        assert proc.poll() is None, "the job ended at the SIGTERM"  # it ran on, as unarmed
        os.kill(init, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(OSError):
            os.kill(init, signal.SIGKILL)
    # WHEN its rings are recovered
    death = _death(rings, tmp_path / "bundle")
    # THEN the verdict is the SIGKILL after a SIGTERM the job had no handler for, which it never got
    assert death["cause"] == "killed", death
    assert death["killed_by"]["signal"] == "SIGTERM" and death["killed_by"]["dropped"] is True, death
    assert death["headline"].endswith("SIGKILL after SIGTERM, which it had no handler for: as a container's first "
                                      "process it is spared such a signal, and it ran on until the SIGKILL."), death
    # AND the evidence gives the time it ran on, within its records' 0.1 s of the planted grace
    told = [float(m[1]) for e in death["evidence"] if (m := re.search(r"the job ran on for ([\d.]+) s, to the SIGKILL$",
                                                                        e))]  # fmt: skip
    assert len(told) == 1 and abs(told[0] - grace) <= 0.35, death["evidence"]
    # AND the first lever is a SIGTERM handler (or an init that passes it on)
    assert death["levers"][0].startswith("give the job a SIGTERM handler that saves what it needs and exits within "
                                         "the grace period"), death["levers"]  # fmt: skip


def test_a_sigkill_after_a_sigterm_a_handler_took_is_no_dropped_signal(tmp_path: Path) -> None:
    # GIVEN an armed job, no container's first process, whose own SIGTERM handler takes the signal and goes on
    proc, pid, rings = _first_process(tmp_path, "plain", "arm,handler", 60, namespace=False)
    try:
        os.kill(pid, signal.SIGTERM)
        time.sleep(1.0)
        # WHEN it is SIGKILLed after it
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert "took it, and went on" in out
    death = _death(rings, tmp_path / "bundle")
    # THEN nothing says a signal was dropped, nor gives the entrypoint's lever
    assert "dropped" not in (death.get("killed_by") or {}), death
    assert not any("dropped" in e for e in death["evidence"]), death["evidence"]
    assert not any("as a container's first process" in x for x in death.get("levers") or []), death


def _sent(proc: subprocess.Popen[str], init: int, *steps: tuple[int, float]) -> tuple[int, str]:
    """Each signal sent to ``init`` from outside its namespace, then the wait that follows it; the status and
    output."""
    try:
        for sig, wait in steps:
            os.kill(init, sig)
            time.sleep(wait)
        out, _ = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(OSError):
            os.kill(init, signal.SIGKILL)
    return proc.returncode, out


def test_a_child_that_an_armed_entrypoint_forked_natively_dies_of_sigterm_as_unarmed(tmp_path: Path) -> None:
    # GIVEN a container's first process that forks a child through libc (no Python at-fork hook runs), armed and not
    ended = {}
    for how in ("native fork", "arm, native fork"):
        proc, _, _ = _first_process(tmp_path, how.replace(", ", "-").replace(" ", "-"), how, 0)
        child = int(Path(f"{tmp_path}/up-{how.replace(', ', '-').replace(' ', '-')}.child").read_text())
        # WHEN that child, no namespace's first process, is sent SIGTERM from outside (by its pid there)
        host = _host_pid(proc.pid, child)
        ended[how] = _sent(proc, host, (signal.SIGTERM, 0))
    # THEN it dies of it, armed as unarmed: the recorder drops signals only in the first process itself
    assert ended["native fork"] == ended["arm, native fork"] == (0, "child ended: 15\nran on\n"), ended


def _host_pid(unshare: int, nspid: int) -> int:
    """The pid outside the namespace of the process whose pid inside is ``nspid`` (below ``unshare``)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            text = status.read_text()
            ns = next((line.split()[1:] for line in text.splitlines() if line.startswith("NSpid:")), [])
            if len(ns) == 2 and int(ns[1]) == nspid and _below(int(ns[0]), unshare):
                return int(ns[0])
    raise AssertionError(f"no process {nspid} in the namespace below {unshare}")


def _below(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def test_a_sigabrt_sent_to_an_armed_entrypoint_is_dropped_not_told_as_a_crash(tmp_path: Path) -> None:
    # GIVEN a container's first process with no handler of its own for SIGABRT (blackbox's faulthandler has one)
    ended = {}
    for how in ("none", "arm"):
        proc, init, rings = _first_process(tmp_path, how, how, 2.0)
        # WHEN SIGABRT is sent to it from outside (a sent one, no fault of its own)
        ended[how] = (*_sent(proc, init, (signal.SIGABRT, 0)), rings)
    # THEN both run on (the kernel drops it for PID 1), and the bundle says it was dropped: no crash, no handler
    assert ended["none"][:2] == ended["arm"][:2] == (0, "ran on\n"), ended
    death = _death(ended["arm"][2], tmp_path / "bundle")
    assert death["cause"] == "clean_exit" and death["headline"] == "The job exited cleanly.", death
    assert any(e.startswith("SIGABRT at ") and "was dropped (no handler;" in e for e in death["evidence"]), death


def test_sigterms_dropped_one_after_another_then_sigkill_time_the_run_from_the_first(tmp_path: Path) -> None:
    # GIVEN an armed container's first process with no SIGTERM handler, sent SIGTERM, then again 1.5 s later, then
    # SIGKILL 1 s after that: 2.5 s after the first
    proc, init, rings = _first_process(tmp_path, "twice", "arm", 60)
    _sent(proc, init, (signal.SIGTERM, 1.5), (signal.SIGTERM, 1.0), (signal.SIGKILL, 0))
    death = _death(rings, tmp_path / "bundle")
    # THEN the evidence names the first, says one more came, and times the run on from the first
    told = [e for e in death["evidence"] if "the job ran on" in e]  # (each dropped SIGTERM told once)
    assert len(told) == 1 and "and 1 more after it, the last SIGTERM at " in told[0], death["evidence"]
    ran_on = float(re.search(r"ran on for ([\d.]+) s", told[0])[1])  # type: ignore[index]
    assert abs(ran_on - 2.5) <= 0.35, told


def test_a_sigkill_after_a_sigterm_taken_by_a_handler_installed_after_one_dropped_names_it(tmp_path: Path) -> None:
    # GIVEN an armed container's first process sent SIGTERM with no handler (dropped), which then installs one;
    # a second SIGTERM is taken by it, and a SIGKILL follows
    proc, init, rings = _first_process(tmp_path, "later", "arm, later", 60)
    status, out = _sent(proc, init, (signal.SIGTERM, 2.0), (signal.SIGTERM, 1.0), (signal.SIGKILL, 0))
    assert out == "took it, and went on\n", (status, out)
    death = _death(rings, tmp_path / "bundle")
    # THEN the verdict is the SIGKILL after that SIGTERM (from outside: no sender), not "no handler ran"
    assert death["cause"] == "killed" and "dropped" not in death["killed_by"], death
    assert death["headline"].endswith("was killed with SIGKILL (no handler runs for it), after SIGTERM."), death
    # AND the first SIGTERM, dropped, is said: the job ran on past it
    assert sum(bool(re.search(r"^SIGTERM at \S+ was dropped \(no handler;.*: the job ran on$", e))
               for e in death["evidence"]) == 1, death["evidence"]  # fmt: skip
    # AND the first SIGTERM's drop is no grace period's: no lever for it
    assert not any("as a container's first process" in x for x in death.get("levers") or []), death
