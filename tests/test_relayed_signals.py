"""A signal `blackbox run` relays to its job is recorded as sent by whoever sent it to `blackbox run`
(`timeout`, the shell that ran `kill`, the kernel for a terminal's hang-up), never by blackbox itself."""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import REPO

from blackbox.recovery.pipeline import recover_rings
from blackbox.recovery.relays import attribute
from blackbox.ring.relayed import RELAYED, Relay, read_relayed, relay_line

ENV = dict(os.environ, PYTHONPATH=str(REPO))
SCRIPT = Path(sys.executable).parent / "blackbox"  # the console script, as users run it
BLACKBOX = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "blackbox"]
JOB = """\
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)
"""


def _wait_ready(ready: Path) -> int:
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    return int(ready.read_text())


def _bundle(work: Path) -> Path:
    (run,) = work.glob("run-*")
    return run / "bundle"


def _signal_rows(bundle: Path) -> list[dict[str, Any]]:
    table = pq.read_table(bundle / "timeline.parquet")
    rows: list[dict[str, Any]] = table.filter(pc.equal(table["kind"], "signal")).select(
        ["label", "sender", "sender_pid", "signal_code"]).to_pylist()  # fmt: skip
    return rows


def _launcher_pid(bundle: Path) -> int:
    (relay,) = read_relayed(bundle.parent / "rings")
    return relay.via


@pytest.mark.skipif(shutil.which("timeout") is None, reason="coreutils timeout is not installed")
def test_timeout_is_named_as_the_sender_of_its_sigterm(tmp_path: Path) -> None:
    # GIVEN `timeout 10 blackbox run -- python job.py`, as the field ran it (timeout is our child: its pid is
    # known), with time for the job to arm on a loaded machine
    (tmp_path / "job.py").write_text(JOB)
    proc = subprocess.Popen(["timeout", "10", *BLACKBOX, "run", "--dir", str(tmp_path / "run"), "--", sys.executable,
                             str(tmp_path / "job.py"), str(tmp_path / "ready")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    # WHEN timeout's SIGTERM ends it
    _, err = proc.communicate(timeout=120)
    # THEN it ended as the job did, and every record names timeout, with its pid, as the sender
    assert proc.returncode == 124, err
    assert (tmp_path / "ready").exists(), "the job was not up within timeout's 10 s: the machine is too slow"
    bundle = _bundle(tmp_path / "run")
    killed_by = json.loads((bundle / "metadata.json").read_text())["death"]["killed_by"]
    assert (killed_by["sender"], killed_by["sender_pid"]) == ("timeout", proc.pid), killed_by
    rows = _signal_rows(bundle)
    assert rows and all((r["sender"], r["sender_pid"]) == ("timeout", proc.pid) for r in rows), rows
    assert f"SIGTERM from timeout (pid {proc.pid})" in err and "from blackbox" not in err


def test_kill_of_the_process_group_from_a_shell_names_the_shell(tmp_path: Path) -> None:
    # GIVEN blackbox run leading its own process group, its job ready
    (tmp_path / "job.py").write_text(JOB)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([*BLACKBOX, "run", "--dir", str(tmp_path / "run"), "--quiet", "--", sys.executable,
                             str(tmp_path / "job.py"), str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV, start_new_session=True)  # fmt: skip
    _wait_ready(ready)
    # WHEN a shell runs `kill -TERM -PGID` (and lives on, as a user's shell does)
    shell = subprocess.run(["sh", "-c", f"echo $$; kill -TERM -{proc.pid}; sleep 3"], capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    shell_pid = int(shell.stdout.split()[0])
    _, err = proc.communicate(timeout=120)
    # THEN blackbox run died of it, as the job did, and the record names the shell and its pid
    assert proc.returncode == -signal.SIGTERM, err
    bundle = _bundle(tmp_path / "run")
    killed_by = json.loads((bundle / "metadata.json").read_text())["death"]["killed_by"]
    assert (killed_by["sender"], killed_by["sender_pid"]) == ("sh", shell_pid), killed_by
    summary = (bundle / "summary.md").read_text()
    assert f"SIGTERM from sh (pid {shell_pid})" in summary and "from blackbox" not in summary


def test_a_terminal_hang_up_stays_the_kernels(tmp_path: Path) -> None:
    # GIVEN blackbox run leading a session whose terminal is a pty, its job in the foreground
    (tmp_path / "job.py").write_text(JOB)
    ready = tmp_path / "ready"
    argv = [*BLACKBOX, "run", "--dir", str(tmp_path / "run"), "--quiet", "--", sys.executable,
            str(tmp_path / "job.py"), str(ready)]  # fmt: skip
    pid, master = pty.fork()
    if pid == 0:
        os.execve(argv[0], argv, ENV)
    _wait_ready(ready)
    # WHEN the terminal hangs up (the kernel sends SIGHUP, to blackbox run as the session's leader)
    os.close(master)
    _, status = os.waitpid(pid, 0)
    # THEN it ends as the job did (SIGHUP) and the SIGHUP has no sender: the kernel's, never the launcher's
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGHUP, status
    bundle = _bundle(tmp_path / "run")
    assert _launcher_pid(bundle) == pid  # blackbox run got it from the kernel and relayed it
    rows = _signal_rows(bundle)
    assert rows and all(r["label"] == "SIGHUP" for r in rows), rows
    assert all(r["sender_pid"] is None and r["sender"] is None and r["signal_code"] == 128 for r in rows), rows


def test_a_hostile_relayed_file_renames_only_rows_that_name_the_launcher(tmp_path: Path) -> None:
    # GIVEN a ring that recorded a SIGUSR1 from `kill` (standing in for the launcher) and a SIGUSR2 from this test
    rings = tmp_path / "rings"
    code = (
        "import os, signal, sys, time, blackbox\nblackbox.arm(sys.argv[1] + '/')\n"
        "for s in (signal.SIGUSR1, signal.SIGUSR2): signal.signal(s, lambda *a: None)\n"
        "open(sys.argv[2], 'w').write(str(os.getpid()))\ntime.sleep(2)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", code, str(rings), str(tmp_path / "ready")], env=ENV)
    job_pid = _wait_ready(tmp_path / "ready")
    subprocess.run(["kill", "-USR1", str(job_pid)], check=True, timeout=30)
    time.sleep(0.2)
    os.kill(job_pid, signal.SIGUSR2)
    job.wait(timeout=60)
    table = recover_rings([rings]).table
    kill_pid = next(r["sender_pid"] for r in table.filter(pc.equal(table["kind"], "signal")).to_pylist()
                    if r["label"] == "SIGUSR1")  # fmt: skip
    # AND a relayed.jsonl of junk (bad JSON, wrong types, a bool pid, signal 0, no launcher, a huge line)
    # around one true line: `kill`'s SIGUSR1 relayed from torchrun, pid 4242
    junk = [
        b"{",
        b"[]",
        b'{"signal": "x"}',
        b"x" * 100_000,
        b'{"signal":10,"code":0,"sender_pid":true,"sender_uid":0,"sender":"a","via":1,"time_ns":0}',
        b'{"signal":0,"code":0,"sender_pid":1,"sender_uid":0,"sender":"a","via":1,"time_ns":0}',
        b'{"signal":10,"code":0,"sender_pid":1,"sender_uid":0,"sender":"a","via":0,"time_ns":0}',
        b'{"signal":10,"code":0,"sender_pid":1,"sender_uid":0,"sender":"' + b"a" * 65 + b'","via":1,"time_ns":0}',
    ]
    true_line = relay_line(
        Relay(signal.SIGUSR1, 0, 4242, 0, "torchrun", "python torchrun", kill_pid, time.time_ns() - 10**9)
    )
    (rings / RELAYED).write_bytes(b"\n".join(junk) + b"\n" + true_line)
    assert [(r.sender, r.via) for r in read_relayed(rings)] == [("torchrun", kill_pid)]
    # WHEN recovered: THEN the SIGUSR1 names the relay's sender; the SIGUSR2 stays as the ring recorded it
    table = recover_rings([rings]).table
    after = {r["label"]: r for r in table.filter(pc.equal(table["kind"], "signal")).to_pylist()}
    assert (after["SIGUSR1"]["sender"], after["SIGUSR1"]["sender_pid"]) == ("torchrun", 4242)
    assert after["SIGUSR2"]["sender_pid"] == os.getpid()


def test_no_relays_leave_the_timeline_as_it_is(tmp_path: Path) -> None:
    code = "import sys, blackbox\nblackbox.arm(sys.argv[1] + '/')\nblackbox.mark('x', 1)\n"
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=ENV, check=True, timeout=60)
    table = recover_rings([tmp_path]).table
    assert attribute(table, []) is table
