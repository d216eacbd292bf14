"""A native crash (SIGSEGV in C code, SIGABRT), armed and unarmed: the job ends as it would, and the verdict
names the signal, the crashing thread's Python stack and the file that holds every thread's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

JOB = """\
import ctypes, os, sys, time
import blackbox

def die(kind):
    if kind == "segv":
        ctypes.string_at(0)  # a read at address 0, inside libc
    os.abort()

def train_step(step, kind):
    if step == 7:
        die(kind)
    time.sleep(0.01)

def main():
    kind = sys.argv[1]
    if len(sys.argv) > 2:
        blackbox.arm(sys.argv[2] + "/", sample_interval=0.05)
    for step in range(100):
        blackbox.step(step)  # unarmed, a no-op
        print(step, flush=True)
        train_step(step, kind)

main()
"""
ENV = dict(os.environ, PYTHONPATH=str(REPO))
SIGNALS = {"segv": ("SIGSEGV", "Segmentation fault", "ctypes.string_at(0)"), "abort": ("SIGABRT", "Aborted",
           "os.abort()")}  # the signal, faulthandler's name for it, the line that raises it  # fmt: skip
# the fault the kernel raised (abort() raises): its kind, address and library, where a crash text holds that
FAULT = {"segv": " (a null pointer: address 0x0, in libc.so.6)", "abort": ""}
FAULT_NO_TEXT = {"segv": " (a null pointer: address 0x0)", "abort": ""}  # (3.10, 3.13 under the job's faulthandler)


def _job(tmp_path: Path, *args: str, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(JOB)
    return subprocess.run([*launcher, sys.executable, str(script), *args], capture_output=True, text=True,
                          env=ENV, timeout=120)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SIGNALS))
def test_a_native_crash_names_its_signal_and_the_crashing_stack(tmp_path: Path, kind: str) -> None:
    name, text, code = SIGNALS[kind]
    line = next(i for i, ln in enumerate(JOB.splitlines(), 1) if code in ln)  # the planted truth
    signum = getattr(signal, name)
    # GIVEN a job that crashes in native code at step 7, run unarmed, armed by arm(), and under `blackbox run`
    unarmed = _job(tmp_path, kind)
    armed = _job(tmp_path, kind, str(tmp_path / "rings"))
    run = _job(tmp_path, kind, launcher=(sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "runs"),
                                         "--quiet", "--"))  # fmt: skip
    # THEN it ends as it would unarmed: the same signal, the same output, nothing more on stderr
    assert unarmed.returncode == armed.returncode == run.returncode == -signum, (unarmed, armed, run.stderr)
    assert unarmed.stdout == armed.stdout == run.stdout == "".join(f"{i}\n" for i in range(8))
    assert unarmed.stderr == armed.stderr == ""
    # AND the verdict names the signal in native code and the job's own frame that called it
    (bundle,) = (tmp_path / "runs").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    death, crash = meta["death"], meta["native_crash"]
    assert (death["cause"], death["confidence"], death["step"]) == ("signal", "certain", 7), death
    assert death["headline"] == (f"The main process (pid {meta['pid']}) died of {name} in native code{FAULT[kind]}, "
                                 f"called from die (train.py:{line}).")  # fmt: skip
    assert f"cause: signal; {death['headline']}" in run.stderr
    # AND the crashing thread's Python stack is in the metadata and the summary, the crash file named and kept
    own = [f.split(" (")[0] for f in crash["stack"].split(";") if "train.py:" in f]  # outermost first
    assert own == ["<module>", "main", "train_step", "die"], crash["stack"]
    assert (crash["signal"], crash["first_line"]) == (name, f"Fatal Python error: {text}")
    assert crash["file"] == f"crash-{meta['pid']}.txt" and "in die" in (bundle / crash["file"]).read_text()
    summary = (bundle / "summary.md").read_text()
    section = summary.split("## The crash\n", 1)[1].split("\n## ", 1)[0]
    assert f"[`{crash['file']}`][{crash['file']}]" in section and f"({name})" in section
    assert f"\n[{crash['file']}]: {crash['file']}\n" in section  # a reference link (text from the job links nowhere)
    listed = [ln.split("`")[1].split(" (")[0] for ln in section.splitlines() if "train.py:" in ln]
    assert listed == ["die", "train_step", "main", "<module>"], section
    # AND a ring recovered later, outside `blackbox run`, says the same
    from blackbox.recovery.pipeline import recover_rings

    later = recover_rings([tmp_path / "rings"]).meta
    assert later["death"]["headline"].endswith(f"died of {name} in native code{FAULT[kind]}, called from die "
                                               f"(train.py:{line}).")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SIGNALS))
@pytest.mark.parametrize("how", ["PYTHONFAULTHANDLER=1", "faulthandler.enable() after arm"])
def test_a_native_crash_under_the_jobs_own_faulthandler_is_that_signal_not_sigkill(tmp_path: Path, kind: str,
                                                                                   how: str) -> None:  # fmt: skip
    # GIVEN the same crash in a job that enabled faulthandler itself (clusters set PYTHONFAULTHANDLER=1; some
    # scripts call faulthandler.enable()): its tracebacks go to its stderr, and blackbox's crash region is not used
    name, text, _ = SIGNALS[kind]
    signum = getattr(signal, name)
    env = dict(ENV, PYTHONFAULTHANDLER="1") if how.startswith("PYTHON") else ENV
    job = JOB if how.startswith("PYTHON") else JOB.replace(
        "        blackbox.arm(sys.argv[2] + \"/\", sample_interval=0.05)\n",
        "        blackbox.arm(sys.argv[2] + \"/\", sample_interval=0.05)\n"
        "        __import__('faulthandler').enable()\n        time.sleep(0.2)  # a sampler tick\n")  # fmt: skip
    assert job != JOB or how.startswith("PYTHON")
    script = tmp_path / "train.py"
    script.write_text(job)
    if not how.startswith("PYTHON"):  # unarmed, the job enables it itself (blackbox is not there to)
        script.write_text(job.replace("    if len(sys.argv) > 2:\n", "    __import__('faulthandler').enable()\n"
                                      "    if len(sys.argv) > 2:\n"))  # fmt: skip
    runs = [subprocess.run([sys.executable, str(script), kind, *extra], capture_output=True, text=True, env=env,
                           timeout=120) for extra in ((), (str(tmp_path / "rings"),))]  # fmt: skip
    unarmed, armed = runs
    # THEN it ends as it would unarmed: the same signal and output, and the job's faulthandler prints its
    # traceback to its stderr (the crashing frame in it), armed as unarmed
    assert unarmed.returncode == armed.returncode == -signum, (unarmed.stderr, armed.stderr)
    assert unarmed.stdout == armed.stdout == "".join(f"{i}\n" for i in range(8))
    for proc in runs:
        assert f"Fatal Python error: {text}" in proc.stderr and "in die" in proc.stderr, proc.stderr
    # AND the verdict names the signal in native code (it read "killed with SIGKILL; no handler ran"), at step 7,
    # and, where the interpreter exports the dump faulthandler uses (3.11, 3.12, 3.14+), the crashing frame:
    # the signal recorder wrote the tracebacks into the ring too (before, the line was named nowhere)
    from blackbox.recovery.pipeline import recover_rings
    from blackbox.ring import _cwriter  # type: ignore[attr-defined]

    meta = recover_rings([tmp_path / "rings"]).meta
    death = meta["death"]
    assert (death["cause"], death["step"]) == ("signal", 7), death
    assert "SIGKILL" not in death["headline"]
    if _cwriter.signals_crash_fd(-1):
        line = next(i for i, ln in enumerate(job.splitlines(), 1) if SIGNALS[kind][2] in ln)
        assert death["headline"].endswith(f"died of {name} in native code{FAULT[kind]}, called from die "
                                          f"(train.py:{line})."), death  # fmt: skip
        own = [f.split(" (")[0] for f in meta["native_crash"]["stack"].split(";") if "train.py:" in f]
        assert own == ["<module>", "main", "train_step", "die"], meta["native_crash"]
    else:
        assert death["headline"].endswith(f"died of {name} in native code{FAULT_NO_TEXT[kind]}."), death["headline"]
        assert any("the job's own faulthandler" in e for e in death["evidence"]), death["evidence"]


REENABLED = """\
import ctypes, faulthandler, sys, time
if len(sys.argv) > 1:
    import blackbox
    blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
faulthandler.disable()  # the job turns blackbox's faulthandler off (for an evaluation, a pytest run), a tick
time.sleep(0.3)
faulthandler.enable()  # and its own on again: it remembers the signal recorder's handler as the one before it
time.sleep(0.3)  # another tick wraps the recorder's over it
ctypes.string_at(0)
"""


@pytest.mark.slow
def test_a_crash_under_a_faulthandler_enabled_again_after_arm_ends_the_job_once(tmp_path: Path) -> None:
    # GIVEN faulthandler disabled and enabled again by the job after arm, then a SIGSEGV
    script = tmp_path / "job.py"
    script.write_text(REENABLED)
    runs = [subprocess.run([sys.executable, str(script), *extra], capture_output=True, text=True, env=ENV,
                           timeout=60) for extra in ((), (str(tmp_path / "rings"),))]  # fmt: skip
    # THEN it dies of SIGSEGV with one traceback, armed as unarmed (it came back forever: the recorder and the
    # faulthandler each handing the signal to the other, 81,501 tracebacks in 20 s)
    for proc in runs:
        assert proc.returncode == -signal.SIGSEGV, proc.stderr[-1000:]
        assert proc.stderr.count("Fatal Python error: Segmentation fault") == 1, proc.stderr[-1000:]


AT_ONCE = """\
import ctypes, faulthandler, sys
if len(sys.argv) > 2:
    import blackbox
    blackbox.arm(sys.argv[2] + "/", sample_interval=0.05)
if sys.argv[1] == "enable":
    faulthandler.enable()  # the job's own (to stderr), no tick after it
else:
    faulthandler.disable()  # blackbox's turned off (unarmed: it was never on)
ctypes.string_at(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("call", ["enable", "disable"])
def test_a_crash_right_after_the_job_changes_faulthandler_is_that_crash(tmp_path: Path, call: str) -> None:
    # GIVEN a job that enables its own faulthandler (or disables blackbox's) after arm and crashes at once
    script = tmp_path / "job.py"
    script.write_text(AT_ONCE)
    runs = [subprocess.run([sys.executable, str(script), call, *extra], capture_output=True, text=True, env=ENV,
                           timeout=60) for extra in ((), (str(tmp_path / "rings"),))]  # fmt: skip
    # THEN it ends as unarmed (the same signal, the job's traceback on stderr where it enabled one)
    for proc in runs:
        assert proc.returncode == -signal.SIGSEGV, proc.stderr[-1000:]
        assert ("Fatal Python error: Segmentation fault" in proc.stderr) == (call == "enable"), proc.stderr[-1000:]
    # AND the verdict is that SIGSEGV, with its line where the interpreter exports the dump (it read "killed with
    # SIGKILL; no handler ran": the crash came before the tick that would have seen faulthandler change)
    from blackbox.recovery.pipeline import recover_rings
    from blackbox.ring import _cwriter  # type: ignore[attr-defined]

    death = recover_rings([tmp_path / "rings"]).meta["death"]
    assert death["cause"] == "signal" and "SIGSEGV in native code" in death["headline"], death
    if _cwriter.signals_crash_fd(-1):
        assert death["headline"].endswith("called from <module> (job.py:9)."), death["headline"]
