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
import signal, sys, time
up, rings, how = sys.argv[1:4]
if "arm" in how:
    import blackbox
    blackbox.arm(rings + "/")
if "handler" in how:
    signal.signal(signal.SIGTERM, lambda *_: print("took it, and went on", flush=True))
open(up, "w").close()
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
    while not up.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert up.exists(), proc.communicate(timeout=10)
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
