"""A fault the kernel raises for an instruction (a null pointer, a truncated mmap, an integer division by zero,
an illegal instruction), armed and unarmed: the kernel delivers the signal that ends the process as it does
unarmed (its siginfo: code and address, what a core and the kernel log keep), and the verdict names the fault.
A crash signal another process sent is told as sent, with its sender. Each job really crashes; strace shows
the deliveries (the tests skip where strace is not installed or cannot trace)."""

from __future__ import annotations

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

from blackbox.recovery.pipeline import recover_rings
from blackbox.ring.writer import built_module

pytestmark = pytest.mark.skipif(built_module() is None, reason="needs the C extension (the signal handler)")

JOB = """\
import atexit, ctypes, mmap, os, sys, threading, time
where, case = sys.argv[1], sys.argv[2]

def null_read():
    ctypes.string_at(0)

if case == "exit":  # registered before arm: it runs after blackbox's clean end, as the process shuts down
    atexit.register(null_read)
if where != "unarmed":
    import blackbox
    blackbox.arm(where + "/", sample_interval=0.02)

def truncated_mmap():
    path = sys.argv[3]
    with open(path, "wb") as f:
        f.write(b"x" * 65536)
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 65536)
    os.truncate(path, 0)  # a dataset file rewritten while a reader has it mapped
    return m[40000]

def native(name):
    getattr(ctypes.CDLL(sys.argv[3]), name)(7, 0)

for step in range(3):
    if where != "unarmed":
        blackbox.step(step)
    print(step, flush=True)
if case == "null":
    null_read()
elif case == "bus":
    truncated_mmap()
elif case == "thread":
    t = threading.Thread(target=null_read, name="loader")
    t.start()
    t.join()
elif case == "exit":
    sys.exit(0)
elif case in ("divide", "trap"):
    native(case)
"""
LIB = """\
int divide(int a, int b) { return a / b; }
int trap(int a, int b) { (void)a; (void)b; __builtin_trap(); }
"""
ENV = dict(os.environ, PYTHONPATH=str(REPO))
ENV.pop("PYTHONFAULTHANDLER", None)
_DELIVERY = re.compile(r"^--- (SIG\w+) \{(.*)\} ---$")


def _strace() -> str:
    tool = shutil.which("strace")
    if tool is None:
        pytest.skip("strace is not installed (tools/ci_packages.sh installs it)")
    probe = subprocess.run([tool, "-qq", "-e", "trace=none", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.strip()[:200]}")
    return tool


def _traced(tmp_path: Path, where: str, case: str, extra: str, env: dict[str, str] | None = None
            ) -> tuple[int, str, list[tuple[str, str]]]:  # fmt: skip
    """(status, stdout, the signal deliveries strace saw: name and siginfo, addresses other than NULL as A)."""
    script = tmp_path / "train.py"
    script.write_text(JOB)
    trace = tmp_path / f"strace-{case}-{'armed' if where != 'unarmed' else 'unarmed'}.txt"
    proc = subprocess.run([_strace(), "-f", "-qq", "-e", "trace=none", "-e", "signal=!SIGCHLD", "-o", str(trace),
                           sys.executable, str(script), where, case, extra], capture_output=True, text=True,
                          env=env or ENV, timeout=120)  # fmt: skip
    deliveries = []
    for line in trace.read_text().splitlines():
        m = _DELIVERY.match(re.sub(r"^\d+\s+", "", line))  # (strace -o -f: each line begins with its pid)
        if m:
            info = re.sub(r"si_pid=\d+", "si_pid=N", re.sub(r"si_addr=0x[0-9a-f]+", "si_addr=A", m[2]))
            deliveries.append((m[1], info))
    return proc.returncode, proc.stdout, deliveries


@pytest.fixture(scope="module")
def faulty_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the library that divides by zero and traps")
    folder = tmp_path_factory.mktemp("lib")
    (folder / "faulty.c").write_text(LIB)
    subprocess.run([compiler, "-O0", "-shared", "-fPIC", "-o", str(folder / "libfaulty.so"), str(folder / "faulty.c")],
                   check=True)  # fmt: skip
    return str(folder / "libfaulty.so")


DUMPS = built_module() is not None and built_module().signals_late_text(-1)  # the interpreter's dump is there
# the signal, its si_code name, the headline's words for the fault (after "in native code ("): what faulted,
# where, and in which library (ctypes.string_at(0) reads address 0 in libc's strlen; Python's mmap module
# copies from the truncated mapping; libfaulty's own functions divide and trap)
CASES = {
    "null": ("SIGSEGV", "SEGV_MAPERR", r"a null pointer: address 0x0, in libc\.so\.6\), called from null_read \("),
    "thread": ("SIGSEGV", "SEGV_MAPERR", r"a null pointer: address 0x0, in libc\.so\.6\), called from null_read \("),
    "exit": ("SIGSEGV", "SEGV_MAPERR", r"a null pointer: address 0x0" + (r", in libc\.so\.6" if DUMPS else "")),
    "bus": ("SIGBUS", "BUS_ADRERR", r"address 0x[0-9a-f]+ lies past the end of a mapped file, in mmap\.cpython-[^)]+"
            r"\), called from truncated_mmap \("),
    "divide": ("SIGFPE", "FPE_INTDIV", r"an integer division by zero, at instruction address 0x[0-9a-f]+, in "
               r"libfaulty\.so\), called from native \("),
    "trap": ("SIGILL", "ILL_", r"an illegal instruction at address 0x[0-9a-f]+, in libfaulty\.so\), called from "
             r"native \("),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_kernel_fault_ends_the_job_by_the_kernels_own_delivery_and_is_named(tmp_path: Path, case: str,
                                                                               faulty_lib: str) -> None:  # fmt: skip
    name, code, words = CASES[case]
    extra = faulty_lib if case in ("divide", "trap") else str(tmp_path / "dataset.bin")
    # GIVEN a job that faults in native code, run unarmed and armed (blackbox's faulthandler writes the stacks)
    unarmed = _traced(tmp_path, "unarmed", case, extra)
    rings = tmp_path / "rings"
    armed = _traced(tmp_path, str(rings), case, extra)
    # THEN it ends as unarmed: the same status and output, and the signal that ends it is the kernel's fault
    # (its code and address), not a raise() (SI_TKILL: before, the core and the kernel log lost the fault)
    assert unarmed[:2] == armed[:2] == (-getattr(signal, name), "0\n1\n2\n"), (unarmed, armed)
    assert unarmed[2][-1] == armed[2][-1], (unarmed[2], armed[2])
    assert armed[2][-1][0] == name and f"si_code={code}" in armed[2][-1][1], armed[2]
    assert all("SI_TKILL" not in info for _, info in armed[2]), armed[2]
    # AND the ring recorded the fault: the kernel's code and the address, and the verdict names it
    meta = recover_rings([rings]).meta
    death = meta["death"]
    assert death["cause"] == "signal" and death["confidence"] == "certain", death
    assert re.search(rf"died of {name} in native code \({words}", death["headline"]), death["headline"]
    assert any("the kernel raised it for an instruction" in e for e in death["evidence"]), death["evidence"]
    # AND the native frame it names is the planted one: addr2line reads the function at the file offset given
    frame = (meta.get("native_crash") or {}).get("native_frame")
    if case in ("divide", "trap"):
        assert frame is not None and frame["file"] == faulty_lib, meta.get("native_crash")
        named = subprocess.run(["addr2line", "-f", "-e", frame["file"], frame["offset"]], capture_output=True,
                               text=True, check=True).stdout.split()  # fmt: skip
        assert named[0] == case, named
    if case == "exit":
        assert death.get("in_shutdown") is True, death


def test_the_fault_address_is_in_the_timeline(tmp_path: Path) -> None:
    # GIVEN a job armed that reads address 0, then recovered into a bundle
    script = tmp_path / "train.py"
    script.write_text(JOB)
    rings = tmp_path / "rings"
    proc = subprocess.run([sys.executable, str(script), str(rings), "null", "-"], capture_output=True, text=True,
                          env=ENV, timeout=120)  # fmt: skip
    assert proc.returncode == -signal.SIGSEGV
    out = tmp_path / "bundle"
    subprocess.run([sys.executable, "-m", "blackbox", "recover", str(rings), "-o", str(out)], check=True, env=ENV,
                   capture_output=True, timeout=300)  # fmt: skip
    import pyarrow.parquet as pq

    table = pq.read_table(out / "timeline.parquet", columns=["kind", "label", "signal_code", "address", "sender_pid"])
    rows = [r for r in table.to_pylist() if r["kind"] == "signal"]
    # THEN its signal record holds the kernel's code (SEGV_MAPERR, 1) and the address, and no sender
    assert rows == [{"kind": "signal", "label": "SIGSEGV", "signal_code": 1, "address": 0, "sender_pid": None}]


HUNG = """\
import sys, time
if sys.argv[1] != "unarmed":
    import blackbox
    blackbox.arm(sys.argv[1] + "/", sample_interval=0.02)
print("ready", flush=True)
def wait_for_batch():
    while True:
        time.sleep(0.01)
wait_for_batch()
"""


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGABRT"])
def test_a_crash_signal_another_process_sent_is_told_as_sent_with_its_sender(tmp_path: Path, name: str) -> None:
    # GIVEN a hung job that an operator sends SIGSEGV or SIGABRT (to have it dump its stacks and a core), from a
    # process named "operator"
    sender = tmp_path / "operator"
    shutil.copy(sys.executable, sender)
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    ends = []
    for where in ("unarmed", str(tmp_path / "rings")):
        job = subprocess.Popen([sys.executable, str(script), where], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=ENV)  # fmt: skip
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        time.sleep(0.2)
        send = f"import os, time; os.kill({job.pid}, {int(getattr(signal, name))}); time.sleep(1)"
        subprocess.run([str(sender), "-c", send], check=True, env={"PYTHONHOME": sys.base_prefix})
        out, _ = job.communicate(timeout=60)
        ends.append((job.returncode, out))
    # THEN the job ends as unarmed, by that signal
    assert ends[0] == ends[1] == (-getattr(signal, name), ""), ends
    # AND the verdict says it was sent, by whom, and where the job was; not a crash in native code
    meta = recover_rings([tmp_path / "rings"]).meta
    death = meta["death"]
    assert re.fullmatch(rf"The main process \(pid {meta['pid']}\) was ended by {name} from operator \(pid \d+\), "
                        r"sent to it \(not a crash\), in wait_for_batch \(hung\.py:8\)\.", death["headline"]), death
    assert death["killed_by"]["sender"] == "operator", json.dumps(death, default=str)
    assert not any("the kernel raised" in e for e in death["evidence"]), death["evidence"]


def test_under_the_jobs_own_faulthandler_the_crash_still_ends_as_unarmed(tmp_path: Path) -> None:
    # GIVEN the job's own faulthandler (a cluster's PYTHONFAULTHANDLER=1): unarmed, it dumps then raises the signal
    # again itself, which is what ends the process
    env = dict(ENV, PYTHONFAULTHANDLER="1")
    unarmed = _traced(tmp_path, "unarmed", "null", "-", env)
    armed = _traced(tmp_path, str(tmp_path / "rings"), "null", "-", env)
    # THEN armed it ends the same way: blackbox hands the fault to the job's handler and leaves its raise alone
    assert unarmed[:2] == armed[:2] == (-signal.SIGSEGV, "0\n1\n2\n")
    assert unarmed[2][-1] == armed[2][-1] and "SI_TKILL" in armed[2][-1][1], (unarmed[2], armed[2])
    assert recover_rings([tmp_path / "rings"]).meta["death"]["headline"].startswith("The main process")
