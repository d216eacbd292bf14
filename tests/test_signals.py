"""Signals behave exactly as without blackbox, and the ring records them: each case runs the same job
unarmed and armed, in real processes, with real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, spawn_py

from blackbox.recovery.kinds import of_kind
from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import find_rings, read_ring
from blackbox.ring.writer import c_writer_module

needs_c = pytest.mark.skipif(c_writer_module() is None, reason="signals are recorded by the C extension, not built")

# ARM is replaced by nothing (unarmed) or by an arm() call (armed); the job prints READY when set up.
ARMED = "import blackbox; blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05)\n"


def job(body: str, armed: bool) -> str:
    return "import os, signal, sys, time\n" + (ARMED if armed else "") + body


def run_until_ready(code: str, ring_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = spawn_py(code, str(ring_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", (line, proc.stderr.read() if proc.stderr else "")
    return proc


def signal_rows(ring_dir: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for ring in sorted(ring_dir.glob("*.ring")):
        rows += of_kind(ring_table(read_ring(ring)), "signal").drop_columns(["time"]).to_pylist()
    return rows


BLOCKED_IN_C = """
import ctypes
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # a zeroed pthread_mutex_t is an unlocked default mutex
libc.pthread_mutex_lock(mutex)
print("READY", flush=True)
libc.pthread_mutex_lock(mutex)  # relocking a default mutex: blocks in the kernel for ever, the GIL released
"""


@needs_c
@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_default_action_kills_at_once_while_the_main_thread_is_blocked_in_c(tmp_path: Path, armed: bool) -> None:
    # GIVEN a job whose main thread waits in C and never returns to Python (as a gloo rank waiting for a peer)
    proc = run_until_ready(job(BLOCKED_IN_C, armed), tmp_path)
    time.sleep(0.2)
    # WHEN SIGTERM arrives
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=10)
    # THEN it dies of it at once, as unarmed, and the ring says so
    assert rc == -signal.SIGTERM and time.monotonic() - t0 < 2.0
    if armed:
        (row,) = signal_rows(tmp_path)
        assert (row["label"], row["detail"], row["sender_pid"]) == ("SIGTERM", "default action", os.getpid())
        assert row["sender"] == Path(f"/proc/{os.getpid()}/comm").read_text().strip()


GLOO_PEER_NEVER_COMES = """
import datetime, socket, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
print("READY", flush=True)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
"""


@pytest.mark.slow
@needs_c
@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_gloo_rank_waiting_for_a_peer_dies_of_sigterm_at_once(tmp_path: Path, armed: bool) -> None:
    pytest.importorskip("torch.distributed")
    proc = run_until_ready(job(GLOO_PEER_NEVER_COMES, armed), tmp_path)
    time.sleep(1.5)  # inside the rendezvous wait
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=20)
    assert rc == -signal.SIGTERM and time.monotonic() - t0 < 2.0
    if armed:
        assert [r["label"] for r in signal_rows(tmp_path)] == ["SIGTERM"]


GRACEFUL_AFTER_ARM = """
# A framework (Lightning's pattern): installed after arm, it chains "the previous handler only if callable".
stop = []
previous = signal.getsignal(signal.SIGTERM)
def graceful(signum, frame):
    stop.append(signum)
    if callable(previous):
        previous(signum, frame)
signal.signal(signal.SIGTERM, graceful)
requeue = signal.getsignal(signal.SIGUSR1) in (None, signal.SIG_DFL)  # Lightning: only if none is there yet
if requeue:
    signal.signal(signal.SIGUSR1, lambda s, f: open(sys.argv[1] + "/checkpoint", "w").write("saved"))
time.sleep(0.3)  # the recorder's sampler wraps the new handlers within one sample interval
print("READY", flush=True)
while not stop:
    time.sleep(0.01)  # a training step
print("finished the step, exiting cleanly", flush=True)
sys.exit(0)
"""


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_framework_handler_installed_after_arm_sees_what_it_would_unarmed(tmp_path: Path, armed: bool) -> None:
    proc = run_until_ready(job(GRACEFUL_AFTER_ARM, armed), tmp_path)
    proc.send_signal(signal.SIGUSR1)  # Slurm's requeue warning: checkpoint and keep going
    time.sleep(0.3)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)  # then the scheduler's SIGTERM: finish the step, exit 0
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0 and "exiting cleanly" in out, err
    assert (tmp_path / "checkpoint").read_text() == "saved"
    if armed and c_writer_module() is not None:
        rows = [(r["label"], r["detail"]) for r in signal_rows(tmp_path)]
        assert rows == [("SIGUSR1", "handled by the job's handler"), ("SIGTERM", "handled by the job's handler")]


FAULTHANDLER_CHAIN_AFTER_ARM = """
import faulthandler
faulthandler.register(signal.SIGTERM, chain=True, all_threads=False)  # dump the stack, then the previous handler
time.sleep(0.3)  # the recorder's sampler looks at the handlers more than once meanwhile
print("READY", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_faulthandler_chained_over_ours_after_arm_ends_as_unarmed(tmp_path: Path, armed: bool) -> None:
    # GIVEN a job that registers faulthandler's SIGTERM dump with chain=True after arm (its previous: ours)
    proc = run_until_ready(job(FAULTHANDLER_CHAIN_AFTER_ARM, armed), tmp_path)
    # WHEN it gets SIGTERM
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    # THEN it dumps its stack once and dies of SIGTERM, as unarmed (wrapping faulthandler's handler again made a
    # loop of the two: dump after dump, then SIGSEGV when the stack ran out)
    assert proc.returncode == -signal.SIGTERM, err[-2000:]
    assert err.count("(most recent call first)") == 1 and " in <module>" in err, err[-2000:]
    if armed and c_writer_module() is not None:
        assert [r["label"] for r in signal_rows(tmp_path)] == ["SIGTERM"]


NOHUP_CHILD = """
import subprocess
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
print("READY", child.pid, flush=True)
child.wait()
print("child ended", child.returncode, flush=True)
"""


SIGWAIT = """\
import threading
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # after arm: the recorder's threads started before
waiter = threading.Thread(target=lambda: print("waited for", int(signal.sigwait({signal.SIGTERM})), flush=True))
waiter.start()
print("READY", flush=True)
waiter.join()
"""


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_a_signal_every_thread_of_the_job_blocks_waits_for_its_sigwait(tmp_path: Path, armed: bool) -> None:
    # GIVEN a job that blocks SIGTERM in each of its threads and waits for it in one (sigwait); one BLAS thread
    # (numpy's, which arm loads before the block, takes it armed, as it does unarmed where the job loaded numpy
    # before it blocked it: _sigmask.py)
    proc = run_until_ready(job(SIGWAIT, armed), tmp_path, env={"OPENBLAS_NUM_THREADS": "1"})
    # WHEN SIGTERM is sent to it
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    # THEN its sigwait returns it, armed as unarmed (the recorder's threads, made while arming held the recorded
    # signals, keep them blocked: a guard)
    assert (proc.returncode, out) == (0, "waited for 15\n"), err[-2000:]


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_an_ignored_signal_stays_ignored_also_for_the_jobs_children(tmp_path: Path, armed: bool) -> None:
    # GIVEN a job started under nohup (SIGHUP ignored), which starts a subprocess
    code = job(NOHUP_CHILD, armed)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    assert proc.stdout is not None
    ready, pid = proc.stdout.readline().split()
    # WHEN the hang-up reaches the job and its child
    os.kill(pid_int := int(pid), signal.SIGHUP)
    proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    # THEN both survive it
    assert proc.poll() is None and Path(f"/proc/{pid_int}").exists()
    os.kill(pid_int, signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert f"child ended {-signal.SIGTERM}" in out and proc.returncode == 0
    assert [r["label"] for r in signal_rows(tmp_path)] == []  # nothing was put over the ignored SIGHUP


def test_the_jobs_own_faulthandler_is_left_as_it_was_at_disarm(tmp_path: Path) -> None:
    code = job(
        "import faulthandler\n"
        "log = open(sys.argv[1] + '/job-faults.log', 'w')\n"
        "faulthandler.enable(file=log)  # the job's own, after arm\n"
        "blackbox.disarm()\n"
        "print('READY', faulthandler.is_enabled(), flush=True)\n"
        "faulthandler._sigsegv()\n",
        armed=True,
    )
    proc = spawn_py(code, str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, _ = proc.communicate(timeout=30)
    assert out.strip() == "READY True" and proc.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in (tmp_path / "job-faults.log").read_text()
    (ring,) = find_rings([tmp_path])
    assert read_ring(ring).crash is None  # it went where the job sent it, not into the ring


def test_a_native_crash_is_kept_in_the_ring_and_no_sidecar_is_left(tmp_path: Path) -> None:
    code = job(
        "print('READY', flush=True)\ndef deep():\n    import faulthandler; faulthandler._sigsegv()\ndeep()\n", True
    )
    proc = spawn_py(code, str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGSEGV
    assert sorted(p.name for p in tmp_path.iterdir())[0].endswith(".ring") and len(list(tmp_path.iterdir())) == 1
    (ring,) = find_rings([tmp_path])
    crash = read_ring(ring).crash
    assert crash is not None and crash.startswith("Fatal Python error: Segmentation fault") and "in deep" in crash


def test_sigkill_leaves_only_the_ring(tmp_path: Path) -> None:
    proc = run_until_ready(job("print('READY', flush=True)\ntime.sleep(30)\n", True), tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    assert [p.suffix for p in tmp_path.iterdir()] == [".ring"]  # no empty .crash, no temporary file


@pytest.mark.slow
def test_signal_storms_never_hang_and_end_as_unarmed(tmp_path: Path) -> None:
    # The quick version of tools/signal_storm.py: 2 or 3 of SIGTERM, SIGINT, SIGUSR1, 0 to 1 ms apart,
    # at a job marking (and interning new labels) in a loop; every configuration, armed and unarmed.
    sys.path.insert(0, str(REPO / "tools"))
    import signal_storm

    results = signal_storm.storm(trials=160, seed=1616, jobs=2, folder=tmp_path)
    failures = [(r.config, [signal.Signals(s).name for s in r.sent], r.why) for r in results if not r.ok]
    assert failures == []
    assert {r.config for r in results} == {
        f"{a}, {b}, {h}" for a in ("armed", "unarmed") for b in ("c", "python") for h in ("handler", "default")
    }
    assert all(r.status is not None for r in results)  # nothing hung


MID_ARM = """
import os, signal, sys
import blackbox._recorder as r
put_in = r.install_collectors
def sigterm_first(*args, **kwargs):  # a SIGTERM lands after the ring is made, before its handler is in
    print(len(os.listdir("/proc/self/task")), flush=True)  # threads: one, as in a helper just forked
    os.kill(os.getpid(), signal.SIGTERM)
    return put_in(*args, **kwargs)
r.install_collectors = sigterm_first
import blackbox
blackbox.arm(sys.argv[1])
print("never", flush=True)
"""


@needs_c
def test_a_sigterm_that_lands_while_arming_is_recorded_not_a_silent_kill(tmp_path: Path) -> None:
    # GIVEN a SIGTERM that lands while arm() makes the ring (a Pool's teardown SIGTERMs a fork helper as it
    # arms), in a process of one thread, as a helper just forked is (arming holds the signal on its own
    # thread: another thread that does not block it would take it, and die of it as it would unarmed)
    one_thread = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
    proc = spawn_py(MID_ARM, str(tmp_path), env=one_thread, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    # THEN the process dies of it, as it would unarmed, once the handler is in: the ring records the signal
    # (the ring held only its `arm` record, read as "killed with SIGKILL; no handler ran")
    assert proc.returncode == -signal.SIGTERM and out == "1\n", (out, err)
    from blackbox.recovery.pipeline import recover_rings

    death = recover_rings([tmp_path]).meta["death"]
    assert death["cause"] == "signal" and "SIGTERM" in death["headline"], death
