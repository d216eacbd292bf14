"""Never touch what is not ours: a job that closes every descriptor and reuses the numbers keeps its files
intact through disarm and through a native crash, armed as unarmed."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from conftest import run_py, spawn_py

from blackbox.ring.reader import find_rings, read_ring

# The job: arm (or not), close every descriptor but stdio, then put its own files on the numbers blackbox
# held (the worst case: daemonising code, then a checkpoint opened on exactly those numbers), write them,
# let the sampler run, and end (cleanly, or by a segfault).
JOB = """
import os, sys, time
folder, armed, ending = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
ours = []
if armed:
    import blackbox
    before = set(os.listdir("/proc/self/fd"))
    blackbox.arm(folder + "/rings/", capacity=1024, sample_interval=0.02)
    ours = sorted(int(fd) for fd in set(os.listdir("/proc/self/fd")) - before)
os.closerange(3, 1 << 16)
files = []
for k in range(12):
    fd = os.open(f"{folder}/out{k}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    files.append(fd)
for k, number in enumerate(ours):  # the job's checkpoint, on each number blackbox had
    fd = os.open(f"{folder}/ckpt{k}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, number)
    os.close(fd)
    files.append(number)
for fd in files:
    os.write(fd, f"job data in fd {fd}\\n".encode())
time.sleep(0.2)  # sampler ticks: they must notice and leave these numbers alone
if ending == "segfault":
    import faulthandler
    faulthandler._sigsegv()
if armed:
    blackbox.disarm()
for fd in files:
    os.write(fd, b"written after disarm\\n")  # every descriptor still open and still the job's
print("ok", len(ours))
"""


def _outputs(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.txt")) + sorted(folder.glob("*.bin"))}


def test_job_files_on_reused_numbers_survive_disarm(tmp_path: Path) -> None:
    runs = {}
    for armed in ("0", "1"):
        d = tmp_path / f"armed{armed}"
        d.mkdir()
        out = run_py(JOB, str(d), armed, "clean")
        runs[armed] = (out.stdout.split()[0], _outputs(d))
    assert runs["0"][0] == runs["1"][0] == "ok"
    texts = runs["1"][1]
    assert len(texts) > 12  # the checkpoint files that took blackbox's numbers exist too
    assert all(t.endswith("written after disarm\n") and t.startswith("job data in fd") for t in texts.values())
    assert all(t.count("\n") == 2 for t in texts.values()), texts  # nothing of ours was written into them
    (ring,) = find_rings([tmp_path / "armed1" / "rings"])
    assert read_ring(ring).clean  # the ring still ended cleanly: the sampler reopened what it needed


def test_a_segfault_after_the_job_took_our_numbers_writes_only_into_the_ring(tmp_path: Path) -> None:
    proc = spawn_py(JOB, str(tmp_path), "1", "segfault", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGSEGV
    texts = _outputs(tmp_path)
    assert texts and all("Fatal Python error" not in t for t in texts.values()), texts
    (ring,) = find_rings([tmp_path / "rings"])
    crash = read_ring(ring).crash
    assert crash is not None and "Segmentation fault" in crash


RACE = """
import sys, threading, time, blackbox
class Tensorish:  # its __index__ runs Python code, so the GIL can pass to the disarming thread mid-call
    def __init__(self, v): self.v = v
    def __index__(self):
        time.sleep(0)
        return self.v
errors = []
for round_ in range(int(sys.argv[2])):
    blackbox.arm(sys.argv[1] + f"/r{round_}.ring", capacity=256, sample_interval=0.005)
    stop = threading.Event()
    def work(k):
        i = 0
        while not stop.is_set():
            try:
                blackbox.mark(f"label{k}-{i % 7}", Tensorish(i))  # new labels too: interning from C
                blackbox.active().phase("p").__enter__()
            except BaseException as exc:
                errors.append(repr(exc))
            i += 1
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads: t.start()
    time.sleep(0.002 * (round_ % 5))
    try:
        blackbox.disarm()
    except BaseException as exc:
        errors.append("disarm: " + repr(exc))
    stop.set()
    for t in threads: t.join()
print("errors", errors)
"""


@pytest.mark.slow
def test_marking_threads_and_disarm_never_crash_or_raise(tmp_path: Path, writer_backend: str) -> None:
    out = run_py(RACE, str(tmp_path), "60", env={"BLACKBOX_WRITER": writer_backend}, timeout=300)
    assert out.stdout.strip() == "errors []", out.stderr[-2000:]
    assert not [line for line in out.stderr.splitlines() if "BlackboxWarning" in line and "dropped" in line]
    assert len(find_rings([tmp_path])) == 60 and all(read_ring(r).clean for r in find_rings([tmp_path]))


OWN_FAULTHANDLER = """
import os, sys, blackbox
blackbox.arm(sys.argv[1] + "/", capacity=1024, sample_interval=0.05)
ring = os.path.realpath(blackbox.active().path)
blackbox.disarm()
print(sum(os.path.realpath(f"/proc/self/fd/{fd}") == ring for fd in os.listdir("/proc/self/fd")))
"""


@pytest.mark.parametrize("faulthandler", ["", "1"], ids=["ours", "the job's (PYTHONFAULTHANDLER=1)"])
def test_disarm_leaves_no_descriptor_on_the_ring(tmp_path: Path, faulthandler: str) -> None:
    # GIVEN an armed process, its faulthandler blackbox's or the job's own (then the crash region's descriptor
    # is the signal recorder's alone), disarmed: THEN no descriptor of it is left open on the ring
    out = run_py(OWN_FAULTHANDLER, str(tmp_path), env={"PYTHONFAULTHANDLER": faulthandler})
    assert out.stdout.strip() == "0", out.stdout
