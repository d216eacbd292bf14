"""Without the C extension (an install without a C compiler; BLACKBOX_NO_C_EXTENSION=1 acts the same): the
job behaves as unarmed, a signal that ends it is still named (faulthandler's stack in its slot), and what is
not recorded is said at arm (one warning), in metadata.json and summary.md, by `info` and by `--version`.
Each case runs the same job unarmed and armed, in real processes, with real signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import REPO, spawn_py

import blackbox
from blackbox._postmortem import write_postmortem
from blackbox.ring.reader import find_rings, read_ring
from blackbox.ring.writer import NO_C_ENV, NO_C_EXTENSION

NO_C = {NO_C_ENV: "1"}
ARMED = "import blackbox; blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05)\n"
BLOCKED_IN_C = """
import ctypes
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t is an unlocked default mutex
libc.pthread_mutex_lock(mutex)
def waiting_in_c():
    libc.pthread_mutex_lock(mutex)  # relocking a default mutex: blocks in the kernel for ever, the GIL released
print("READY", flush=True)
waiting_in_c()
"""


def job(body: str, armed: bool) -> str:
    return "import os, signal, sys, time\n" + (ARMED if armed else "") + body


def start(code: str, folder: Path) -> subprocess.Popen[str]:
    proc = spawn_py(code, str(folder), env=NO_C, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", (line, proc.stderr.read() if proc.stderr else "")
    return proc


def death(folder: Path) -> dict[str, object]:
    meta = write_postmortem([folder], folder / "bundle", plot=False)
    return dict(meta["death"])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1], ids=lambda s: s.name)
@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_a_signal_ends_a_job_blocked_in_c_at_once_and_is_named(
    tmp_path: Path, armed: bool, sig: signal.Signals
) -> None:
    # GIVEN a job whose main thread waits in C, armed without the C extension
    proc = start(job(BLOCKED_IN_C, armed), tmp_path)
    time.sleep(0.2)
    # WHEN the signal arrives
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=10)
    finally:  # a job that outlived its signal is no child of the suite's for later tests' recorders to sample
        proc.kill()
        proc.wait()
    # THEN it dies of it at once, as unarmed
    assert rc == -sig and time.monotonic() - t0 < 2.0
    if armed:  # AND the verdict names that signal (the truth sent), where the job was, and what is not known
        d = death(tmp_path)
        assert (d["cause"], d["confidence"]) == ("signal", "certain"), d
        evidence = d["evidence"]
        assert isinstance(evidence, list)
        assert any(e.startswith(f"{sig.name} with its default action, in waiting_in_c (") for e in evidence), evidence
        assert any(e.startswith("not known: this process ran without blackbox's C extension") for e in evidence)


def test_sigkill_is_told_from_a_signal_and_what_is_not_known_is_said(tmp_path: Path) -> None:
    proc = start(job(BLOCKED_IN_C, True), tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    d = death(tmp_path)
    assert d["cause"] == "killed" and str(d["headline"]).endswith("was killed with SIGKILL; no handler ran.")
    assert any(str(e).startswith("not known: this process ran without blackbox's C extension") for e in d["evidence"])
    assert [p.suffix for p in tmp_path.iterdir() if p.is_file()] == [".ring"]  # nothing left beside it


DISPOSITIONS = """
names = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
def table():
    return [str(signal.getsignal(getattr(signal, n))) for n in names]
import faulthandler
print("READY", flush=True)
print(table(), faulthandler.unregister(signal.SIGTERM), flush=True)
# a framework installs its handlers after arm (Lightning's pattern), and Slurm's requeue warning comes
seen = []
signal.signal(signal.SIGTERM, lambda s, f: seen.append("term"))
signal.signal(signal.SIGUSR1, lambda s, f: seen.append("usr1"))
log = open(sys.argv[1] + "/job-usr2.log", "w")
faulthandler.register(signal.SIGUSR2, file=log)  # the job's own stack dump on SIGUSR2, which it survives
for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2):
    os.kill(os.getpid(), s)
    time.sleep(0.2)
print(table(), seen, flush=True)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # and puts the default action back
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
"""


def test_the_jobs_handlers_and_its_own_faulthandler_behave_as_unarmed(tmp_path: Path) -> None:
    outcomes = []
    for armed in (False, True):
        folder = tmp_path / ("armed" if armed else "unarmed")
        folder.mkdir()
        proc = spawn_py(job(DISPOSITIONS, armed), str(folder), env=NO_C, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, _ = proc.communicate(timeout=30)
        log = (folder / "job-usr2.log").read_text()
        dumped = "Current thread" in log and re.search(r"line \d+ in <module>", log) is not None
        outcomes.append((re.sub(r" at 0x[0-9a-f]+", "", out), proc.returncode, dumped))
        if armed:
            d = death(folder)
            assert d["cause"] == "signal" and any(str(e).startswith("SIGTERM with") for e in d["evidence"]), d
    # THEN what getsignal answers, faulthandler.unregister's answer, the handlers run, the job's own dump and
    # the exit status are the same armed and unarmed
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1] == -signal.SIGTERM and outcomes[0][2] and "['usr1', 'term']" in outcomes[0][0]


def test_an_ignored_signal_stays_ignored(tmp_path: Path) -> None:
    code = job("print('READY', flush=True)\ntime.sleep(30)\n", True)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO), **NO_C),
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    assert proc.poll() is None  # nohup's SIGHUP still ignored
    proc.kill()
    proc.wait()


FORKED_CHILD = """
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
print("READY", pid, flush=True)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_forked_childs_signal_is_not_taken_for_the_parents(tmp_path: Path) -> None:
    proc = spawn_py(job(FORKED_CHILD, True), str(tmp_path), env=NO_C, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    _, child = proc.stdout.readline().split()
    time.sleep(0.3)
    os.kill(int(child), signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == f"child {-signal.SIGTERM}" and proc.returncode == 0
    (ring,) = find_rings([tmp_path])
    assert read_ring(ring).signal_stacks == {}
    assert death(tmp_path)["cause"] == "clean_exit"


def test_what_is_not_recorded_is_said_once_at_arm_in_the_bundle_by_info_and_by_version(tmp_path: Path) -> None:
    proc = start(job("print('READY', flush=True)\ntime.sleep(30)\n", True), tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert err.count("BlackboxWarning") == 1 and NO_C_EXTENSION in err  # one warning at arm
    meta = write_postmortem([tmp_path], tmp_path / "bundle", plot=False)
    assert meta["notes"][0] == NO_C_EXTENSION
    summary = (tmp_path / "bundle" / "summary.md").read_text()
    assert f"## What the recorder could not do\n\n- {NO_C_EXTENSION}" in summary
    env = dict(os.environ, PYTHONPATH=str(REPO), **NO_C)
    (ring,) = find_rings([tmp_path])
    info = subprocess.run([sys.executable, "-m", "blackbox", "info", str(ring)], capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert (
        f"recorder:   {NO_C_EXTENSION}" in info.stdout and "signal:     SIGTERM with its default action" in info.stdout
    )
    facts = json.loads(subprocess.run([sys.executable, "-m", "blackbox", "info", str(ring), "--json"],
                                      capture_output=True, text=True, env=env, timeout=60).stdout)  # fmt: skip
    assert facts["c_extension"] is False and facts["signals_that_ended_it"] == ["SIGTERM"]
    version = subprocess.run([sys.executable, "-m", "blackbox", "--version"], capture_output=True, text=True,
                             env=env, timeout=60)  # fmt: skip
    assert (
        version.stdout == f"blackbox {__import__('blackbox').__version__} (C extension: NOT built)\n{NO_C_EXTENSION}\n"
    )


EXIT_IN_AN_EXIT_HANDLER = """
import atexit
atexit.register(lambda: sys.exit(3))  # Python reports the SystemExit and keeps the status it had: 0
print("main ends", flush=True)
"""


def test_a_sys_exit_once_python_is_ending_is_no_exit_status(tmp_path: Path) -> None:
    # GIVEN a job whose exit handler calls sys.exit(3) after its main module ended, armed without the C extension
    # (where the sys.exit wrapper's record is the only one of the status) and unarmed
    outcomes = []
    for armed in (False, True):
        folder = tmp_path / ("armed" if armed else "unarmed")
        folder.mkdir()
        proc = spawn_py(job(EXIT_IN_AN_EXIT_HANDLER, armed), str(folder), env=NO_C, stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=30)
        outcomes.append((out, proc.returncode))
    # THEN the job exits 0 both ways, and the verdict is its clean exit, not "exited with status 3"
    assert outcomes[0] == outcomes[1] == ("main ends\n", 0)
    d = death(tmp_path / "armed")
    assert d["cause"] == "clean_exit" and d.get("exit_status") in (0, None), d


def test_a_one_shot_handler_installed_after_arm_is_the_jobs(tmp_path: Path) -> None:
    # GIVEN a handler installed after arm (without the C extension: no handler of blackbox's is in the signal
    # table) that puts the default back, then raises, its signal landing inside blackbox's mark()
    from test_disarm_under_job_signals import ONE_SHOT

    proc = spawn_py(ONE_SHOT, str(tmp_path / "j.ring"), "after", env=NO_C, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)  # fmt: skip
    out, err = proc.communicate(timeout=60)
    # THEN its exception reaches the job, never taken for blackbox's failure (the one warning is arm's)
    assert out == "the job caught: worker died\n", out + err
    assert err.count("BlackboxWarning") == 1 and NO_C_EXTENSION in err, err


def test_allocations_asked_for_are_not_sampled_and_the_recorder_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN no C extension (neither is built without a C compiler)
    monkeypatch.setenv(NO_C_ENV, "1")
    # WHEN a job asks for allocation sampling
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = blackbox.Recorder.arm(tmp_path / "job.ring", capacity=1024, sample_interval=3600, allocations=True)
    try:
        # THEN it records, samples no allocation, and its notes say so, as NO_C_EXTENSION does at arm
        assert rec.armed and rec._allocs is None
        assert any(n.startswith("allocations not sampled") and "not built" in n for n in rec.notes), rec.notes
        assert "allocations are not sampled" in NO_C_EXTENSION
    finally:
        rec.disarm()
