"""The right cause for every real death, naming the process that died: real kernel OOM kills in memory
cgroups, real DataLoader workers, real signals from named senders, real exits, zombies and pid namespaces."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, MemoryCgroup, run_py, spawn_py

from blackbox.collect.exceptions import exit_status_unrecorded
from blackbox.recovery import pipeline
from blackbox.recovery.evidence import KernelKill, _kills
from blackbox.recovery.pipeline import recover_rings
from blackbox.ring import format as fmt
from blackbox.ring.reader import find_rings, read_ring
from blackbox.ring.writer import built_module

ENV = dict(os.environ, PYTHONPATH=str(REPO))
LEAKY_WORKERS = """
import sys, time, blackbox, torch
from torch.utils.data import DataLoader, Dataset

class Leaky(Dataset):
    def __init__(self): self.kept = []
    def __len__(self): return 100000
    def __getitem__(self, i):
        self.kept.append(bytearray(4 << 20))   # the bug: each worker keeps 4 MiB per item
        return torch.tensor([float(i)])

if __name__ == "__main__":
    blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
    loader = DataLoader(Leaky(), batch_size=4, num_workers=2, multiprocessing_context=sys.argv[2])
    for step, batch in enumerate(loader):
        blackbox.step(step)
        time.sleep(0.02)
"""


def run_job_in(cg: MemoryCgroup, tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as the script job.py (DataLoader workers import it again) in the memory cgroup ``cg``."""
    script = tmp_path / "job.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300,
                          env=ENV, preexec_fn=cg.join)  # fmt: skip


def death_of(folder: Path) -> dict:  # type: ignore[type-arg]
    meta = recover_rings([folder]).meta
    return meta["death"] if "death" in meta else meta  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_worker_killed_by_the_oom_killer_is_named(tmp_path: Path, memory_cgroup, context: str) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    # GIVEN a job whose DataLoader workers leak, in a memory cgroup of 900 MB
    cg = memory_cgroup(900_000_000)
    proc = run_job_in(cg, tmp_path, LEAKY_WORKERS, str(tmp_path / "rings"), context)
    assert proc.returncode == 1  # PyTorch's "DataLoader worker ... exited unexpectedly", or a broken pipe to it
    assert cg.oom_kills() >= 1
    # WHEN its ring is recovered
    out = subprocess.run([sys.executable, "-m", "blackbox", "recover", str(tmp_path / "rings"), "-o",
                          str(tmp_path / "bundle"), "--summary"], capture_output=True, text=True, env=ENV)  # fmt: skip
    meta = json.loads((tmp_path / "bundle" / "metadata.json").read_text())
    main = next(m for m in meta.get("rings", [meta]) if m["argv"][:1] == [str(tmp_path / "job.py")])
    death = main["death"]
    # THEN the cause is the kernel's OOM kill of the worker, named, with its memory and the worker levers
    assert death["cause"] == "host_oom_kill" and death["confidence"] == "certain", (
        death["headline"], proc.stderr[-3000:])
    victim = death["victim"]
    assert victim["role"] == "DataLoader worker" and victim["pid"] != main["pid"]
    assert victim.get("rss", victim.get("anon_rss", 0)) > 100 << 20
    assert f"The DataLoader worker (pid {victim['pid']}) was killed by the kernel OOM killer." in out.stdout
    # the levers follow the evidence: the worker grew with the batches it served, so the Dataset's leak comes
    # first, and nothing advises persistent workers (which would keep it growing)
    assert death["worker_memory"]["pattern"] == "grew_inside" and death["worker_memory"]["pid"] == victim["pid"]
    assert "the Dataset keeps what __getitem__ makes" in death["levers"][0]
    assert not any("persistent_workers=True" in lever for lever in death["levers"]), death["levers"]
    # the main process's lever only with its own evidence (its growth per step beyond the noise: under load the
    # main process's RSS can rise with the batches it receives), after the worker's; never the generic one
    main_levers = [i for i, lever in enumerate(death["levers"]) if "`losses.append(loss)`" in lever]
    assert all(i > 0 and death["levers"][i].startswith("the job's own process grew too") for i in main_levers)
    assert death["host_growth"]["grew"] == "children"
    assert death["kernel_report"]["tasks"] and any(t["pid"] == victim["pid"] for t in death["kernel_report"]["tasks"])
    assert death["kernel_report"]["file"] == "oom-report.txt"
    assert (tmp_path / "bundle" / death["kernel_report"]["file"]).read_text().count("Killed process") == 1
    assert "the last sample before the death" in " ".join(death["evidence"])  # memory at the kill, not after
    # and per-process memory at each sample: the workers' RSS climbing
    ring = read_ring(find_rings([tmp_path / "rings"])[0])
    kids = ring.records[ring.records["kind"] == fmt.KIND_CODES["child_sample"]]
    assert len({int(p) for p in kids["p0"]}) >= 2 and int(kids["p1"].max()) > 100 << 20


LEAKY_WORKER_0 = """
import os, sys, time, blackbox, torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

# batches by shared-memory file name (in the workers too, which import this again): the main process never reads
# from a dying worker's socket, so it notices the death by PyTorch's own check ("exited unexpectedly"), not by a
# ConnectionResetError that names no worker
torch.multiprocessing.set_sharing_strategy("file_system")

class Leaky(Dataset):
    def __init__(self): self.kept = []
    def __len__(self): return 100000
    def __getitem__(self, i):
        if get_worker_info().id == 0:  # the bug, in worker 0 alone: it keeps 8 MiB per item
            if not self.kept:
                with open(sys.argv[1] + "/worker0.pid", "w") as f:
                    f.write(str(os.getpid()))
            self.kept.append(bytearray(8 << 20))
        return torch.tensor([float(i)])

if __name__ == "__main__":
    blackbox.arm(sys.argv[1] + "/rings/", sample_interval=0.05)  # as the job's first line: its workers are not armed
    loader = DataLoader(Leaky(), batch_size=4, num_workers=2, multiprocessing_context="forkserver")
    for step, batch in enumerate(loader):
        blackbox.step(step)
        time.sleep(0.02)
"""


@pytest.mark.slow
def test_a_forkserver_worker_killed_by_the_oom_killer_is_named(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    # GIVEN a job whose forkserver DataLoader worker 0 leaks until the kernel kills it (a forkserver's child is
    # no child of the job's: the ring never samples it; PyTorch says only that it "exited unexpectedly")
    cg = memory_cgroup(900 << 20)
    proc = run_job_in(cg, tmp_path, LEAKY_WORKER_0, str(tmp_path))
    worker0 = int((tmp_path / "worker0.pid").read_text())  # the planted truth: the leaking worker
    assert proc.returncode == 1 and cg.oom_kills() == 1, proc.stderr[-2000:]
    # PyTorch's error names the worker ("exited unexpectedly"), or, as its own error path races, names none
    # (a ConnectionResetError from the worker's pipe): the kill is then the job's by its memory cgroup alone
    named = f"DataLoader worker (pid(s) {worker0}) exited unexpectedly" in proc.stderr
    assert named or "ConnectionResetError" in proc.stderr, proc.stderr[-2000:]
    if not any(k.pid == worker0 for k in pipeline.kernel_oom_kills()):
        pytest.skip("the kernel log cannot be read here: its logged kill is what this test is about")
    death = death_of(tmp_path / "rings")
    # THEN the kernel's logged kill of that worker is the cause (certain where the job named it), the victim
    assert (death["cause"], death["confidence"]) == ("host_oom_kill", "certain" if named else "strong"), death
    assert (death["victim"]["pid"], death["victim"]["role"]) == (worker0, "DataLoader worker"), death["victim"]
    assert death["victim"]["anon_rss"] > 100 << 20
    assert death["headline"] == f"The DataLoader worker (pid {worker0}) was killed by the kernel OOM killer."


RESET_AFTER_A_KILL = """
import subprocess, sys, time, blackbox
blackbox.arm(sys.argv[1] + "/rings/", sample_interval=0.05)
if sys.argv[2] == "own worker":  # a DataLoader worker of its own, a child the sampler sees by its name
    named = "import time; open('/proc/self/comm', 'w').write('pt_data_worker'); print(1, flush=True); time.sleep(2)"
    worker = subprocess.Popen([sys.executable, "-c", named], stdout=subprocess.PIPE)
    worker.stdout.readline()  # named before the steps (a loaded machine started it after them: CI saw python3)
for step in range(20):
    blackbox.step(step)
    time.sleep(0.01)
with open(sys.argv[1] + "/killed_at", "w") as f:
    f.write(str(time.monotonic_ns()))  # the planted kill's stamp: the kernel log's clock is this one
time.sleep(0.05)
raise ConnectionResetError(104, "Connection reset by peer")  # a forkserver's job, as its worker died
"""


def planted_kill(at_ns: int, pid: int, name: str, memcg: str) -> list[KernelKill]:
    """The kernel log of one memory cgroup OOM kill, as /dev/kmsg gives its lines."""
    return _kills([
        (at_ns - 2000, "python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"),
        (at_ns - 1000, "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                       f"oom_memcg={memcg},task_memcg={memcg},task={name},pid={pid},uid=0"),
        (at_ns, f"Memory cgroup out of memory: Killed process {pid} ({name}) total-vm:1644768kB, "
                "anon-rss:1030568kB, file-rss:85992kB, shmem-rss:128kB, UID:0 pgtables:2504kB oom_score_adj:0"),
    ])  # fmt: skip


@pytest.mark.slow
def test_a_worker_no_process_sampled_is_named_by_the_job_s_memory_cgroup(  # type: ignore[no-untyped-def]
    tmp_path: Path, memory_cgroup, monkeypatch
) -> None:
    # GIVEN a job in a memory cgroup that ends with an uncaught ConnectionResetError naming no worker (a
    # forkserver's DataLoader worker, the job's grandchild, OOM-killed: a race of PyTorch's error path)
    cg = memory_cgroup(900 << 20)
    proc = run_job_in(cg, tmp_path, RESET_AFTER_A_KILL, str(tmp_path), "no worker")
    assert proc.returncode == 1 and "ConnectionResetError" in proc.stderr, proc.stderr[-2000:]
    at = int((tmp_path / "killed_at").read_text())
    mount = next(p for p in cg.directory.parents if os.path.ismount(p))
    memcg = "/" + str(cg.directory.relative_to(mount))
    worker = 4_000_000 + os.getpid() % 100_000  # a pid no process of the job had
    cases = {
        "its cgroup, a worker": (planted_kill(at, worker, "pt_data_worker", memcg), ("host_oom_kill", "strong")),
        "another cgroup": (planted_kill(at, worker, "pt_data_worker", memcg + "-other"), ("exception", "certain")),
        "the root cgroup": (planted_kill(at, worker, "pt_data_worker", "/"), ("exception", "certain")),
        "its cgroup, no worker": (planted_kill(at, worker, "python3", memcg), ("exception", "certain")),
        "its cgroup, before the job": (planted_kill(at - 3600 * 10**9, worker, "pt_data_worker", memcg),
                                       ("exception", "certain")),  # fmt: skip
    }
    for case, (kills, want) in cases.items():
        # WHEN it is recovered with the kernel log holding that kill
        monkeypatch.setattr(pipeline, "kernel_oom_kills", lambda kills=kills: kills)
        death = death_of(tmp_path / "rings")
        # THEN only a DataLoader worker's kill in the job's own (non-root) cgroup, in its life, is the cause,
        # strong (matched by the cgroup, not by a sampled child or a name in the job's error), its victim
        assert (death["cause"], death["confidence"]) == want, (case, death)
        if death["cause"] == "host_oom_kill":
            assert (death["victim"]["pid"], death["victim"]["role"]) == (worker, "DataLoader worker"), death
            assert death["headline"] == f"The DataLoader worker (pid {worker}) was killed by the kernel OOM killer."
            assert any("memory cgroup" in e for e in death["evidence"]), death["evidence"]
            assert any("ConnectionResetError" in e for e in death["evidence"]), death["evidence"]
    # AND a job that sampled DataLoader workers of its own does not take another process's worker in its cgroup
    # (a DDP rank beside it) for one of them
    own = tmp_path / "own"
    own.mkdir()
    proc = run_job_in(cg, own, RESET_AFTER_A_KILL, str(own), "own worker")
    assert proc.returncode == 1 and "ConnectionResetError" in proc.stderr, proc.stderr[-2000:]
    kills = planted_kill(int((own / "killed_at").read_text()), worker, "pt_data_worker", memcg)
    monkeypatch.setattr(pipeline, "kernel_oom_kills", lambda: kills)
    ring = read_ring(find_rings([own / "rings"])[0])
    assert ring.meta["cgroup"]["path"] == str(cg.directory)
    children = ring.field("kind") == fmt.KIND_CODES["child_sample"]
    named = {ring.strings.get(int(i)) for i in ring.field("label")[children]}
    assert "pt_data_worker" in named, named  # the planted truth: it did sample a worker of its own
    death = death_of(own / "rings")
    assert (death["cause"], death["confidence"]) == ("exception", "certain"), death


FAST_STEPS = """
import sys, time, blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.2)  # many steps between two memory samples
kept = []
for step in range(1, 100000):
    blackbox.step(step)
    print(step, flush=True)
    kept.append(bytearray(1 << 20))  # the leak: 1 MiB a step, touched
    time.sleep(0.004)
"""


@pytest.mark.slow
def test_an_oom_kill_s_step_is_the_step_the_job_was_in(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    # GIVEN a job under `blackbox run`, as a torchrun worker, that steps every few ms, OOM-killed by the kernel
    cg = memory_cgroup(160 << 20)
    script = tmp_path / "train.py"
    script.write_text(FAST_STEPS)
    error_file = tmp_path / "error.json"
    join = f'echo $$ > {cg.directory}/cgroup.procs && exec "$0" "$@"'  # the job alone in the cgroup
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path), "--quiet", "--", "sh",
                           "-c", join, sys.executable, str(script), str(tmp_path / "rings")],
                          capture_output=True, text=True, timeout=300,
                          env=dict(ENV, TORCHELASTIC_ERROR_FILE=str(error_file)))  # fmt: skip
    assert proc.returncode == -signal.SIGKILL and cg.oom_kills() == 1, proc.stderr
    printed = int(proc.stdout.split()[-1])  # the planted truth: the last step the job announced
    (run,) = tmp_path.glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    death = meta["death"]
    if death["confidence"] != "certain":
        pytest.skip("the kernel log cannot be read here: the kill's own stamp is what this test is about")
    # THEN its step is the one the job was in when the kernel killed it (step n is recorded before n prints),
    # not the last memory sample's, in the bundle and in torchrun's Root Cause line
    assert death["cause"] == "host_oom_kill" and death["step"] == meta["last_step"], (death["step"], meta["last_step"])
    assert printed <= death["step"] <= printed + 1, (printed, death["step"])
    sampled = meta["last_sample"]["step"]
    message = json.loads(error_file.read_text())["message"]["message"]
    assert message.startswith(f"blackbox: host_oom_kill at step {death['step']}:"), (message, sampled)


WORKER_COPIES = """
import os, sys, time, blackbox, torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

def worker_init(_):  # the kernel's OOM killer takes every worker before the main process (see the test)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("500")

class Copies(Dataset):
    def __init__(self): self.data = None
    def __len__(self): return 100000
    def __getitem__(self, i):
        if self.data is None:  # each worker loads its own copy of the data on its first item, then only reads it
            time.sleep(1.0 * get_worker_info().id)  # one after another
            self.data = bytearray(120 << 20)
            with open(sys.argv[1] + ".loaded", "a") as f:  # the planted truth: which workers' copies are whole
                f.write(f"{os.getpid()} ")
        return torch.tensor([float(self.data[i % len(self.data)] + i)])

if __name__ == "__main__":
    blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
    loader = DataLoader(Copies(), batch_size=4, num_workers=4, in_order=False, multiprocessing_context="fork",
                        worker_init_fn=worker_init)
    for step, batch in enumerate(loader):
        blackbox.step(step)
        time.sleep(0.01)
"""


@pytest.mark.slow
def test_workers_that_each_hold_a_copy_get_fewer_workers_first_not_a_leak_hunt(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    # GIVEN DataLoader workers that each load their own 120 MB copy, one after another, until the third's does
    # not fit in the memory cgroup (500 MB). This kernel kills in a cascade, faster than a killed worker's memory
    # is given back (dmesg: three kills in 8 ms, the third a worker of 160 MB), and where giving back is slower
    # the cascade went on to the main process (CI: exit -9). The question here is the diagnosis of the workers'
    # copies, not the kernel's choice (test_oom_victim.py), so the workers raise their oom_score_adj (as any
    # process may; lowering the main process's needs CAP_SYS_RESOURCE) and the cascade takes them all first.
    cg = memory_cgroup(500 << 20)
    proc = run_job_in(cg, tmp_path, WORKER_COPIES, str(tmp_path / "rings"))
    assert proc.returncode == 1 and cg.oom_kills() >= 1, proc.stderr[-2000:]
    meta = recover_rings([tmp_path / "rings"]).meta
    death = meta["death"]
    assert death["cause"] == "host_oom_kill" and death["victim"]["role"] == "DataLoader worker", death
    # THEN the worker is seen to have held its size while it served batches, and the levers say so first:
    # fewer workers, data shared rather than copied; no hunt for a growing cache, no persistent workers
    behaved = death["worker_memory"]
    assert behaved["pattern"] == "held_copies" and behaved["steps_served"] >= 3 and behaved["workers"] == 4, behaved
    # the copy it loaded (120 MB), where the victim's load was whole: near the cgroup's limit the kernel reclaims
    # some of the worker's other pages meanwhile (seen: 98.9 MiB more at its peak than at its first sample), so
    # half of it is asked. The cascade may take a worker killed midway through its load (the one PyTorch names
    # first): its figure is the part it loaded, no more than the copy (seen: 44 MiB, 1 run in 10)
    loaded = {int(pid) for pid in (tmp_path / "rings.loaded").read_text().split()}
    grew = behaved["peak_rss"] - behaved["first_rss"]
    assert (grew >= 60 << 20) if behaved["pid"] in loaded else (0 <= grew <= 130 << 20), (behaved, loaded)
    assert "each of the 4 workers holds its own copy" in death["levers"][0] and "num_workers" in death["levers"][0]
    assert not any("__getitem__" in lever or "persistent_workers" in lever for lever in death["levers"])


EXIT_JOBS = {
    "sys.exit(2)": ("import sys, blackbox; blackbox.arm(sys.argv[1] + '/'); sys.exit(2)", "nonzero_exit", 2),
    "KeyboardInterrupt": (
        "import sys, blackbox; blackbox.arm(sys.argv[1] + '/'); raise KeyboardInterrupt",
        "interrupted",
        None,
    ),  # fmt: skip
    "exit 0": ("import sys, blackbox; blackbox.arm(sys.argv[1] + '/')", "clean_exit", 0),
    # exits that never call sys.exit, or whose SystemExit is caught: the status is the one the process exited with
    "raise SystemExit(2)": ("import sys, blackbox; blackbox.arm(sys.argv[1] + '/'); raise SystemExit(2)",
                            "nonzero_exit", 2),
    "caught sys.exit(4)": ("import sys, blackbox; blackbox.arm(sys.argv[1] + '/')\ntry: sys.exit(4)\n"
                           "except SystemExit: pass", "clean_exit", 0),
    "os._exit(7)": ("import os, sys, blackbox; blackbox.arm(sys.argv[1] + '/'); os._exit(7)", "nonzero_exit", 7),
    "os._exit(0) in a thread": ("import os, sys, threading, blackbox; blackbox.arm(sys.argv[1] + '/')\n"
                                "threading.Thread(target=os._exit, args=(0,)).start()\nthreading.Event().wait()",
                                "clean_exit", 0),
}  # fmt: skip


@pytest.mark.parametrize("name", list(EXIT_JOBS))
def test_exits_and_interrupts_are_told_from_a_clean_exit(tmp_path: Path, name: str) -> None:
    # GIVEN a job that ends one way, its rings recovered later (as a Slurm epilogue does), not by `blackbox run`
    code, cause, status = EXIT_JOBS[name]
    proc = run_py(code, str(tmp_path), check=False)
    assert proc.returncode == (status if status is not None else -signal.SIGINT)  # the planted truth
    # THEN the verdict is the one the status says
    death = death_of(tmp_path)
    assert death["cause"] == cause and death["exit_status"] == status, death


@pytest.mark.parametrize("code", ["import os; os._exit(7)", "import ctypes; ctypes.CDLL(None)._exit(7)"],
                         ids=["os._exit", "libc _exit, the ring silent"])  # fmt: skip
def test_a_deliberate_exit_without_exit_handlers_is_no_sigkill_in_run_or_torchrun(tmp_path: Path, code: str) -> None:
    # GIVEN a job under `blackbox run`, as a torchrun worker, that exits 7 without running its exit handlers
    error_file = tmp_path / "error.json"
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path), "--quiet", "--",
                           sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(ENV, TORCHELASTIC_ERROR_FILE=str(error_file)))  # fmt: skip
    assert proc.returncode == 7
    # THEN the verdict, in the bundle, on stderr and in torchrun's error file, is that exit and its status
    (run,) = tmp_path.glob("run-*")
    death = json.loads((run / "bundle" / "metadata.json").read_text())["death"]
    assert (death["cause"], death["confidence"], death["exit_status"]) == ("nonzero_exit", "certain", 7), death
    assert "cause: nonzero_exit; The job exited with status 7." in proc.stderr and "SIGKILL" not in proc.stderr
    message = json.loads(error_file.read_text())["message"]["message"]
    assert "status 7" in message and "SIGKILL" not in message
    # AND the job took no step: the line says so (it said "at step None")
    assert message.startswith("blackbox: nonzero_exit (no step recorded): ") and "None" not in message, message


def test_torchruns_error_file_never_says_step_none(tmp_path: Path) -> None:
    # GIVEN a job under `blackbox run`, as a torchrun worker, whose config is bad: it raises before any step
    error_file = tmp_path / "error.json"
    code = "import numpy\nraise ValueError('bad config: lr=-1')"  # armed at numpy's import
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path), "--quiet", "--",
                           sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(ENV, TORCHELASTIC_ERROR_FILE=str(error_file)))  # fmt: skip
    assert proc.returncode == 1 and "ValueError: bad config" in proc.stderr
    # THEN torchrun's Root Cause line says that no step was recorded, and the exception, never "step None"
    report = json.loads(error_file.read_text())["message"]
    assert report["message"].startswith("blackbox: exception (no step recorded): "), report
    callstack = report["extraInfo"]["py_callstack"]
    assert "uncaught exception before any step: ValueError: bad config: lr=-1" in callstack and "None" not in callstack


def test_without_the_c_extension_a_note_says_which_exits_go_unrecorded(tmp_path: Path) -> None:
    # GIVEN a job whose C extension cannot be imported, ending by a top-level SystemExit(2)
    code = ("import sys; sys.modules['blackbox.ring._cwriter'] = None\n"
            "import blackbox; blackbox.arm(sys.argv[1] + '/'); raise SystemExit(2)")  # fmt: skip
    assert run_py(code, str(tmp_path), check=False).returncode == 2
    meta = recover_rings([tmp_path]).meta
    # THEN the status is unknown, the verdict is not certain, and a note says which exits go unseen and why
    assert meta["death"]["exit_status"] is None and meta["death"]["confidence"] != "certain"
    assert any("raise SystemExit(n)" in n and "not built" in n for n in meta["notes"]), meta["notes"]


def test_a_bundle_of_several_rings_keeps_the_exit_status_run_saw(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, numpy\n"  # a Python process of the job arms at numpy's import
        "child = subprocess.run([sys.executable, '-c', 'import os, numpy; os.kill(os.getpid(), 9)'])\n"  # armed too
        "sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path), "--quiet", "--",
                           sys.executable, "-c", code], capture_output=True, text=True, env=ENV)  # fmt: skip
    assert proc.returncode == 3
    (run,) = tmp_path.glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    assert meta["exit_status"] == 3 and len(meta["rings"]) == 2
    (job,) = [m for m in meta["rings"] if m["death"]["exit_status"] == 3]
    assert job["death"]["cause"] == "nonzero_exit"
    assert f"cause: {meta['cause']}" in proc.stderr and "cause: n/a" not in proc.stderr


def test_an_all_clean_run_prints_its_cause(tmp_path: Path) -> None:
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import blackbox'])"
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path), "--quiet", "--",
                           sys.executable, "-c", code], capture_output=True, text=True, env=ENV)  # fmt: skip
    assert proc.returncode == 0 and "cause: clean_exit" in proc.stderr, proc.stderr


def _oom_kill_a_process(memory_cgroup) -> int:  # type: ignore[no-untyped-def]
    """The pid of a process the kernel OOM-killed in a cgroup of its own (the kernel log's newest line may be
    another's: tests on the other worker OOM-kill theirs meanwhile)."""
    cg = memory_cgroup(64 << 20)
    proc = subprocess.Popen([sys.executable, "-c", "x = [bytearray(1 << 20) for _ in range(1000)]"],
                            preexec_fn=cg.join, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    assert proc.wait(timeout=60) == -signal.SIGKILL and cg.oom_kills() >= 1
    return proc.pid


@pytest.mark.slow
def test_a_reused_pid_never_borrows_an_earlier_oom_kill_from_the_kernel_log(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    victim = _oom_kill_a_process(memory_cgroup)
    old = pipeline.kernel_oom_kills()
    if not old:
        pytest.skip("the kernel log cannot be read here (dmesg_restrict or not root)")
    assert victim in {k.pid for k in old}
    # GIVEN a later job that was SIGKILLed (no OOM) and whose pid is that victim's (as a reused pid would be)
    proc = spawn_py("import sys, time, blackbox; blackbox.arm(sys.argv[1] + '/'); print('up', flush=True); "
                    "time.sleep(60)", str(tmp_path), stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    proc.kill()
    proc.wait()
    (path,) = find_rings([tmp_path])
    ring = read_ring(path)
    meta = dict(ring.meta, identity=dict(ring.meta["identity"], pid=victim))
    meta.pop("record_dtype")
    header = fmt.encode_header(ring.header.capacity, ring.header.strings_size, meta,
                               stacks_size=ring.header.stacks_size, crash_size=ring.header.crash_size,
                               heap_size=ring.header.heap_size)  # fmt: skip
    assert len(header) == ring.header.header_size
    with open(path, "r+b") as f:
        f.write(header)
    assert read_ring(path).count > 0, "the header rewritten, its records still read"
    # THEN the old kernel line (written before this ring started) is not its cause
    death = death_of(tmp_path)
    assert death["cause"] == "killed" and not any("kernel log" in e for e in death["evidence"]), death
    # AND the same with not one record left to read (its window then starts at its arm, never at the boot)
    with open(path, "r+b") as f:
        f.seek(ring.header.records_offset)
        f.write(bytes(ring.header.capacity * fmt.RECORD_SIZE))
    assert read_ring(path).count == 0
    death = death_of(tmp_path)
    assert death["cause"] != "host_oom_kill" and not any("kernel log" in e for e in death["evidence"]), death


def test_a_killed_process_not_yet_reaped_is_dead(tmp_path: Path) -> None:
    proc = spawn_py("import sys, time, blackbox; blackbox.arm(sys.argv[1] + '/'); print('up', flush=True); "
                    "time.sleep(60)", str(tmp_path), stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    os.kill(proc.pid, signal.SIGKILL)
    time.sleep(0.3)
    assert Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] == "Z"  # a zombie: not reaped
    try:
        meta = recover_rings([tmp_path]).meta
        assert meta["writer_state"] == "ended without a clean end" and meta["death"]["cause"] == "killed"
    finally:
        proc.wait()


@pytest.mark.slow
def test_liveness_holds_across_pid_namespaces(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    job = "import sys, time, blackbox; blackbox.arm(sys.argv[1] + '/'); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", job, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "up":
        pytest.skip(f"the kernel refused a pid namespace: {proc.stderr.read() if proc.stderr else ''}")
    try:
        meta = recover_rings([tmp_path]).meta
        assert meta["pid"] in (1, 2)  # its pid inside the container; on the host that pid is someone else
        assert meta["writer_state"] == "running" and meta["death"]["cause"] == "unknown"
    finally:
        inner = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for pid in inner:  # the job, pid 1 of its namespace, child of unshare
            os.kill(int(pid), signal.SIGKILL)
        proc.wait()
    meta = recover_rings([tmp_path]).meta
    assert meta["writer_state"] == "ended without a clean end" and meta["death"]["cause"] == "killed"


@pytest.mark.slow
def test_an_oom_kill_without_kernel_log_or_cgroup_is_probable(tmp_path: Path, memory_cgroup, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cg = memory_cgroup(300 << 20)
    proc = subprocess.run([sys.executable, "-c", "import sys, time, blackbox; blackbox.arm(sys.argv[1] + '/', "
                           "sample_interval=0.02)\nkept = []\nwhile True:\n    kept.append(bytearray(4 << 20))\n"
                           "    time.sleep(0.01)", str(tmp_path)], env=ENV, preexec_fn=cg.join)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL
    cg.directory.rmdir()  # the cgroup is gone, as after a container's end
    monkeypatch.setattr(pipeline, "kernel_oom_kills", lambda: [])  # as for a user who cannot read the log
    death = death_of(tmp_path)
    assert death["cause"] == "host_oom_kill" and death["confidence"] == "probable", death


SENDER = "import os, signal, sys, time; os.kill({pid}, signal.SIGTERM); time.sleep(0.5); os.kill({pid}, signal.SIGKILL)"
STUBBORN = ("import signal, sys, time, blackbox; blackbox.arm(sys.argv[1] + '/', sample_interval=0.02)\n"
            "signal.signal(signal.SIGTERM, lambda s, f: None)\nprint('up', flush=True)\ntime.sleep(60)")  # fmt: skip


@pytest.mark.parametrize("sender,cause", [("earlyoom", "userspace_oom_kill"), ("slurmstepd", "killed")])
def test_who_sent_the_sigterm_before_the_sigkill_is_told(tmp_path: Path, sender: str, cause: str) -> None:
    job = spawn_py(STUBBORN, str(tmp_path / "rings"), stdout=subprocess.PIPE)
    assert job.stdout is not None and job.stdout.readline().strip() == "up"
    time.sleep(0.3)  # the sampler re-wrapped the job's SIGTERM handler
    fake = tmp_path / sender
    shutil.copy(sys.executable, fake)
    subprocess.run([str(fake), "-c", SENDER.format(pid=job.pid)], check=True, env={"PYTHONHOME": sys.base_prefix})
    job.wait(timeout=30)
    death = death_of(tmp_path / "rings")
    assert death["cause"] == cause and death["killed_by"]["sender"] == sender, death
    assert death["killed_by"]["signal"] == "SIGTERM"


GRACEFUL = ("import signal, sys, time, blackbox; blackbox.arm(sys.argv[1] + '/', sample_interval=0.02)\n"
            "stop = []\nsignal.signal(signal.SIGTERM, lambda s, f: stop.append(s))\nprint('up', flush=True)\n"
            "while not stop: time.sleep(0.01)\n"
            "print('checkpoint saved', flush=True)\nsys.exit(int(sys.argv[2]))")  # fmt: skip


@pytest.mark.parametrize("status", [0, 3])
def test_a_graceful_shutdown_on_sigterm_is_told_not_hidden_by_the_exit(tmp_path: Path, status: int) -> None:
    # GIVEN a job whose own SIGTERM handler checkpoints and exits (Lightning, a requeue), sent SIGTERM by slurmstepd
    job = spawn_py(GRACEFUL, str(tmp_path / "rings"), str(status), stdout=subprocess.PIPE)
    assert job.stdout is not None and job.stdout.readline().strip() == "up"
    time.sleep(0.3)
    fake = tmp_path / "slurmstepd"
    shutil.copy(sys.executable, fake)
    # a daemon like slurmstepd outlives its signal: the recorder names the sender from /proc a moment later
    kill = f"import os, signal, time; os.kill({job.pid}, signal.SIGTERM); time.sleep(1)"
    subprocess.run([str(fake), "-c", kill], check=True, env={"PYTHONHOME": sys.base_prefix})
    assert job.stdout.readline().strip() == "checkpoint saved" and job.wait(timeout=30) == status
    # THEN the death says the job ended by itself after the scheduler's SIGTERM, which its handler took
    death = death_of(tmp_path / "rings")
    assert death["cause"] == ("clean_exit" if status == 0 else "nonzero_exit"), death
    told = "after SIGTERM from slurmstepd, which its own handler took (a graceful shutdown)."
    assert death["headline"].endswith(told)
    assert any(e.startswith("SIGTERM from slurmstepd (pid ") and "(a scheduler: time limit or preemption)" in e
               and "handled by the job's handler" in e for e in death["evidence"]), death["evidence"]  # fmt: skip


STEPS_AFTER = """\
import os, signal, sys, time, blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.02)
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))  # a handler that only logs (a checkpoint's request)
for step in range(10**6):
    blackbox.step(step)
    if step == 10:
        os.kill(os.getpid(), signal.SIGUSR1)
    if got and step >= 10 + int(sys.argv[2]):  # N steps after it, the job ends by itself
        sys.exit(2)
    time.sleep(0.01)
"""


@pytest.mark.parametrize("after", [1, 20], ids=["at-the-next-step", "20-steps-on"])
def test_a_handled_signal_is_told_as_the_end_only_where_the_job_did_not_go_on_after_it(
    tmp_path: Path, after: int
) -> None:
    # GIVEN a job whose handler takes SIGUSR1 at step 10, and which exits with status 2 at the next step, or 20 on
    proc = subprocess.run([sys.executable, "-c", STEPS_AFTER, str(tmp_path), str(after)], env=ENV, timeout=60)
    assert proc.returncode == 2
    death = death_of(tmp_path)
    # THEN at the next step it is the end's signal, a graceful shutdown; 20 steps on the job went on: the signal is
    # told, no shutdown claimed (it read "exited with status 2 after SIGUSR1 ..., which its own handler took (a
    # graceful shutdown)")
    assert death["cause"] == "nonzero_exit", death
    said = " ".join(death["evidence"])
    if after == 1:
        assert death["headline"].endswith("which its own handler took (a graceful shutdown).") and "handled_by" in death
    else:
        assert death["headline"].endswith(", 20 steps after SIGUSR1 from python, which its own handler took."), death
        assert "graceful" not in death["headline"] and "handled_by" not in death, death
        assert "and the job went on (20 steps after it) before it ended" in said, said


CAUGHT_CTRL_C = ("import signal, sys, time, blackbox; blackbox.arm(sys.argv[1] + '/', sample_interval=0.02)\n"
                 "print('up', flush=True)\nstep = 0\n"
                 "def train(n):\n    global step\n"
                 "    for _ in range(n): blackbox.step(step); step += 1; time.sleep(0.01)\n"
                 "try:\n    train(10**9)\n"
                 "except KeyboardInterrupt:\n    print('Detected KeyboardInterrupt', flush=True)\n"
                 "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                 "    train(int(sys.argv[2]))\n    sys.exit(1)\n")  # fmt: skip


@pytest.mark.parametrize("steps_after,cause", [(0, "interrupted"), (20, "nonzero_exit")],
                         ids=["stops at once (Lightning)", "goes on training"])  # fmt: skip
def test_an_interrupt_the_job_catches_and_turns_into_exit_1_is_named(tmp_path: Path, steps_after: int,
                                                                       cause: str) -> None:  # fmt: skip
    # GIVEN a job that catches KeyboardInterrupt, as Lightning's Trainer does, and then exits 1 (at once, or
    # after training on: then the interrupt did not end it), sent SIGINT by this process
    job = spawn_py(CAUGHT_CTRL_C, str(tmp_path / "rings"), str(steps_after), stdout=subprocess.PIPE)
    assert job.stdout is not None and job.stdout.readline().strip() == "up"
    time.sleep(0.3)
    os.kill(job.pid, signal.SIGINT)
    assert job.stdout.readline().strip() == "Detected KeyboardInterrupt" and job.wait(timeout=30) == 1
    death = death_of(tmp_path / "rings")
    assert (death["cause"], death["exit_status"]) == (cause, 1), death
    if cause == "interrupted":
        # THEN the interrupt, its sender and the job's own handling of it are what the verdict says
        assert death["confidence"] == "certain"
        assert (death["killed_by"]["signal"], death["killed_by"]["sender_pid"]) == ("SIGINT", os.getpid())
        assert death["headline"].startswith("The job was interrupted by SIGINT from ")
        assert death["headline"].endswith("; it caught the KeyboardInterrupt and exited with status 1.")
        assert any("raised KeyboardInterrupt, which the job caught" in e for e in death["evidence"]), death
    else:
        assert death["headline"] == "The job exited with status 1." and death["killed_by"] is None


SLOW_SHUTDOWN = ("import atexit, os, signal, sys, time\n"
                 "atexit.register(lambda: (print('shutting down', flush=True), time.sleep(float(sys.argv[2]))))\n"
                 "import blackbox; blackbox.arm(sys.argv[1] + '/', sample_interval=0.02)\n"  # its end runs first
                 "stop = []\nsignal.signal(signal.SIGTERM, lambda s, f: stop.append(s))\nprint('up', flush=True)\n"
                 "while not stop: time.sleep(0.01)\n")  # fmt: skip


@pytest.mark.skipif(not exit_status_unrecorded(built_module()) == "", reason="needs the C extension's exit record")
@pytest.mark.parametrize("killed", [True, False], ids=["SIGKILL while it shuts down", "it shuts down"])
def test_a_process_killed_during_its_graceful_shutdown_is_killed_not_a_clean_exit(tmp_path: Path,
                                                                                   killed: bool) -> None:  # fmt: skip
    # GIVEN a job whose SIGTERM handler ends its loop, whose shutdown then takes long (an exit handler that runs
    # after blackbox's clean end), sent SIGTERM by slurmstepd, and SIGKILL while it shuts down (or not)
    job = spawn_py(SLOW_SHUTDOWN, str(tmp_path / "rings"), "60" if killed else "0.2", stdout=subprocess.PIPE)
    assert job.stdout is not None and job.stdout.readline().strip() == "up"
    time.sleep(0.3)
    fake = tmp_path / "slurmstepd"
    shutil.copy(sys.executable, fake)
    # a daemon like slurmstepd outlives its signal: the recorder names the sender from /proc a moment later
    kill = f"import os, signal, time; os.kill({job.pid}, signal.SIGTERM); time.sleep(1)"
    subprocess.run([str(fake), "-c", kill], check=True, env={"PYTHONHOME": sys.base_prefix})
    assert job.stdout.readline().strip() == "shutting down"  # the clean end is recorded by now
    if killed:
        job.kill()
    assert job.wait(timeout=30) == (-signal.SIGKILL if killed else 0)
    rings = tmp_path / "rings"
    assert read_ring(next(iter(find_rings([rings])))).clean
    death = death_of(rings)
    if not killed:
        assert (death["cause"], death["confidence"], death["exit_status"]) == ("clean_exit", "certain", 0), death
        return
    # THEN it was killed while it shut down, after the scheduler's SIGTERM: not a clean exit
    assert (death["cause"], death["confidence"], death["exit_status"]) == ("killed", "strong", None), death
    assert death["killed_by"]["signal"] == "SIGTERM" and death["killed_by"]["sender"] == "slurmstepd"
    assert death["headline"] == (f"The main process (pid {job.pid}) was killed with SIGKILL while it shut down, "
                                 "after SIGTERM from slurmstepd, before it could exit.")  # fmt: skip
    assert any("never reached exit()" in e for e in death["evidence"]), death["evidence"]
    assert death["in_shutdown"] is True  # (another process's own death comes before it: attempts.deaths)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["shmem", "anon"])
def test_memory_at_the_end_tells_shared_memory_from_a_leak(tmp_path: Path, memory_cgroup, kind: str) -> None:  # type: ignore[no-untyped-def]
    cg = memory_cgroup(300 << 20)
    shm = Path(f"/dev/shm/blackbox-test-{os.getpid()}")
    fill = f"f = open({str(shm)!r}, 'wb')\nwhile True:\n    f.write(bytes(4 << 20)); f.flush(); time.sleep(0.01)"
    leak = "kept = []\nwhile True:\n    kept.append(bytearray(4 << 20)); time.sleep(0.01)"
    grow = fill if kind == "shmem" else leak
    try:
        subprocess.run([sys.executable, "-c", "import sys, time, blackbox; blackbox.arm(sys.argv[1] + '/', "
                        f"sample_interval=0.02)\n{grow}", str(tmp_path)], env=ENV, preexec_fn=cg.join)  # fmt: skip
    finally:
        shm.unlink(missing_ok=True)
    death = death_of(tmp_path)
    assert death["cause"] == "host_oom_kill", death
    memory = death["memory_at_end"]
    shmem_lever = any("/dev/shm" in lever for lever in death["levers"])
    if kind == "shmem":
        assert memory["shmem_share"] > 0.5 and shmem_lever
    else:
        assert memory["anon_share"] > 0.8 and not shmem_lever


TORCHRUN_RANK = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
kept = []
for step in range(100000):
    x = torch.ones(1)
    dist.all_reduce(x)
    if dist.get_rank() == 1:
        kept.append(bytearray(8 << 20))  # rank 1 leaks
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_torchrun_names_the_real_cause_from_blackbox_s_verdict(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch.distributed")
    cg = memory_cgroup(800_000_000)
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_RANK)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--no-python", "--nproc-per-node=2", "--max-restarts=0",
           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-backend=c10d", sys.executable, "-m", "blackbox", "run",
           "--dir", str(tmp_path / "runs"), "--quiet", "--", sys.executable, str(script)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(ENV, OMP_NUM_THREADS="1"),
                          preexec_fn=cg.join)  # fmt: skip
    assert proc.returncode != 0
    root = proc.stderr[proc.stderr.index("Root Cause") :]
    assert "blackbox: host_oom_kill" in root and "was killed by the kernel OOM killer" in root, proc.stderr[-3000:]
