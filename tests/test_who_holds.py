"""Who holds the memory, on by default, told right: real jobs with a planted line and known bytes.

Every job here is armed with the defaults (``blackbox.arm(path)`` or plain ``blackbox run``: allocation
sampling on), SIGKILLed or killed by the kernel's OOM killer in a child memory cgroup, and recovered.
What each one plants, and what the bundle must say:

- a cache that grows every step, beside imports and a model made before the first step: the cache's
  line is who grew (its growth per step within its error of the truth), the imports never head who
  holds, the model is resident since start-up, not growth;
- a job with no leak: no site grows;
- a spike (one 1.5 GiB temporary in one step, killed in a 1 GiB cgroup): the levers say spike, name
  the line and the step, and say the block was requested, not all touched; no leak lever;
- PyTorch's CPU allocator's out-of-memory (a request in its message, as a CUDA one has): the host line
  that grew heads the levers, and no GPU is told of;
- a malloc reached through ``dlsym`` (ctypes' ``libc.malloc``): looked up after arming it is named;
  looked up before, the growth it makes is stated as unseen, with figures;
- a stack first seen just before the kill, in a thread started just before: its text and the thread's
  name are in the ring;
- DataLoader fork workers that end by themselves after the main process was killed: their rings are
  kept and their sites named; workers that end cleanly while the job runs are folded with their sites.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, MemoryCgroup

import blackbox
from blackbox.collect.allocs import sample_module

if sample_module() is None:
    pytest.skip("the C extension blackbox.collect._csample is not built", allow_module_level=True)

MiB = 1 << 20


def line_of(job: str, mark: str) -> int:
    """The line of ``job`` that carries ``# PLANT: <mark>``."""
    return next(i for i, text in enumerate(job.splitlines(), 1) if f"# PLANT: {mark}" in text)


Ran = tuple[subprocess.CompletedProcess[str], dict[str, Any], Path]


def run(tmp_path: Path, job: str, *args: str, cgroup: MemoryCgroup | None = None,
        env: dict[str, str] | None = None) -> Ran:  # fmt: skip
    """Run ``job`` (its first argument: the ring folder), recover its rings; (the run, metadata, the job file)."""
    path = tmp_path / "train.py"
    path.write_text(job)
    full = {k: v for k, v in os.environ.items() if k != "BLACKBOX_ALLOCATIONS"} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(path), f"{tmp_path / 'rings'}/", *args], capture_output=True,
                          text=True, env=full | (env or {}), timeout=300,
                          preexec_fn=cgroup.join if cgroup is not None else None)  # fmt: skip
    blackbox.recover(tmp_path / "rings", tmp_path / "bundle")
    return proc, json.loads((tmp_path / "bundle" / "metadata.json").read_text()), path


CACHE_JOB = """
import functools, os, signal, sys, time
import numpy as np
import torch
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.05)  # the defaults: allocation sampling on
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024))  # PLANT: model
opt = torch.optim.SGD(model.parameters(), lr=1e-3)


@functools.lru_cache(maxsize=None)
def features(step):
    return np.ones(1 << 19)  # PLANT: cache


for step in range(30):
    blackbox.step(step)
    x = torch.randn(32, 1024)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    features(step)
    time.sleep(0.01)
time.sleep(0.2)  # a tick: the thread names and the source lines
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_cache_is_who_grew_the_model_is_resident_and_imports_never_head_the_table(tmp_path: Path) -> None:
    proc, meta, job = run(tmp_path, CACHE_JOB)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    report = meta["allocations"]
    assert report["recorded"] is True and report["mean_bytes"] == MiB, "sampled by default, one per MiB"
    # who grew: the cache, 4 MiB a step, within its error; nothing the imports or the model made
    top = report["grew"][0]
    assert top["site"] == f"features ({job}:{line_of(CACHE_JOB, 'cache')})", report["grew"]
    assert top["growth_by"] == "step" and abs(top["growth_per_step"] - 4 * MiB) < 0.25 * 4 * MiB, top
    assert abs(top["grown_bytes"] - 29 * 4 * MiB) <= 2 * top["grown_error_bytes"] + 4 * MiB, top
    assert not any(g["imports"] for g in report["grew"]) and all(g["site"] == top["site"] for g in report["grew"])
    # who holds: never an import first; the model's 32 MiB resident since start-up, not growth
    assert not report["sites"][0]["imports"] and any(s["imports"] for s in report["sites"]), report["sites"][:4]
    (model,) = [s for s in report["sites"] if s["site"].endswith(f"({job}:{line_of(CACHE_JOB, 'model')})")]
    assert model["resident_bytes"] == model["live_bytes"] and not model["grows"], model
    assert abs(model["live_bytes"] - 32 * MiB) <= 2 * model["error_bytes"] + 2 * MiB, model
    assert report["resident_bytes"] >= model["live_bytes"]
    summary = (tmp_path / "bundle" / "summary.md").read_text()
    section = summary.split("## Who holds the memory", 1)[1].split("\n## ", 1)[0]
    grew_rows = section.split("Who grew", 1)[1]
    assert f"train.py:{line_of(CACHE_JOB, 'cache')})`" in next(r for r in grew_rows.splitlines() if r.startswith("| `"))
    shown = section.split("Allocating stack of the largest: ", 1)[1].split("\n", 1)[0]
    assert "importlib" not in shown and "<frozen" not in shown.split(" ← ")[0], shown


# a job whose list keeps 16 MiB a step ({ones}: torch's or numpy's), then runs out of memory: {end}
KEEPS_THEN_ENDS = """
import sys, time
import {module}
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.05)
kept = []
for step in range(10):
    blackbox.step(step)
    kept.append({ones})  # PLANT: kept
    time.sleep(0.03)
time.sleep(0.2)  # a tick: the source lines
{end}
"""
CPU_OOM_JOB = KEEPS_THEN_ENDS.format(module="torch", ones="torch.ones(1 << 22)", end=(
    "torch.empty(1 << 50)  # PyTorch's CPU allocator refuses 4 PiB: \"DefaultCPUAllocator: can't allocate memory\""))


def test_a_cpu_allocator_out_of_memory_names_its_host_site_not_a_gpu(tmp_path: Path) -> None:
    # GIVEN PyTorch's CPU allocator's out-of-memory (host memory; its message gives a request, as a CUDA
    # one does), in a job whose list keeps 16 MiB a step
    pytest.importorskip("torch")  # (the 3.10 and 3.13 lanes have only the declared dependencies)
    proc, meta, job = run(tmp_path, CPU_OOM_JOB)
    assert proc.returncode == 1 and "DefaultCPUAllocator" in proc.stderr, proc.stderr[-2000:]
    death = meta["death"]
    # THEN no GPU is told of, and the host line that grew heads the levers
    assert death["cause"] == "oom_exception" and "gpu_oom" not in death, death
    assert death["memory_pattern"] == "growth", death
    assert f"`{job}:{line_of(CPU_OOM_JOB, 'kept')}`" in death["levers"][0], death["levers"]
    assert not any("shard more" in lever or "expandable_segments" in lever for lever in death["levers"])


DEVICE_OOM_JOB = KEEPS_THEN_ENDS.format(module="numpy as np", ones="np.ones(1 << 21)", end=(
    "# what torch raises where a CUDA call outside its cache fails (C10_CUDA_CHECK: cublasCreate, a launch)\n"
    "raise RuntimeError('CUDA error: out of memory\\nCUDA kernel errors might be asynchronously reported')"))


def test_a_device_out_of_memory_without_figures_is_the_devices_and_no_host_line_heads_it(tmp_path: Path) -> None:
    # GIVEN "CUDA error: out of memory" (the CUDA runtime's status: no request, no figure), in a job whose list
    # keeps 16 MiB of host memory a step
    proc, meta, job = run(tmp_path, DEVICE_OOM_JOB)
    assert proc.returncode == 1 and "CUDA error: out of memory" in proc.stderr, proc.stderr[-2000:]
    death = meta["death"]
    # THEN it is a device's out-of-memory outside PyTorch's cache, with that reading's levers first
    assert death["cause"] == "oom_exception" and death["gpu_oom"]["kind"] == "outside_cache", death
    assert death["levers"][0].startswith("leave room outside PyTorch's cache"), death["levers"]
    # AND the host line that grew, whose memory did not run out, heads nothing; no host limit is named
    assert "limit" not in death, death["limit"]
    assert not any(f"{job}:{line_of(DEVICE_OOM_JOB, 'kept')}" in lever for lever in death["levers"]), death
    summary = (tmp_path / "bundle" / "summary.md").read_text()
    assert "GPU OOM: **outside_cache**: a CUDA call outside PyTorch's caching allocator" in summary


STEADY_JOB = """
import os, signal, sys, time
import numpy as np
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.05)
for step in range(40):
    blackbox.step(step)
    scratch = [np.ones(1 << 17) for _ in range(8)]  # 8 MiB a step, freed the next
    total = sum(float(a[0]) for a in scratch)
    time.sleep(0.02)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_job_with_no_leak_shows_no_site_growing(tmp_path: Path) -> None:
    proc, meta, _ = run(tmp_path, STEADY_JOB)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    report = meta["allocations"]
    assert report["grew"] == [] and not any(s["grows"] for s in report["sites"]), report["sites"][:3]
    assert "Who grew: no site grew" in (tmp_path / "bundle" / "summary.md").read_text()


TINY_JOB = """
import numpy as np
import blackbox

kept = [np.ones(1 << 17) for _ in range(8)]  # PLANT: kept (8 MiB)
for step in range(3):
    blackbox.step(step)
raise SystemExit(3)
"""


@pytest.mark.slow
def test_blackbox_runs_own_start_up_is_no_site_of_the_job(tmp_path: Path) -> None:
    # GIVEN a small job under `blackbox run`, sampled finely enough that blackbox's own start-up is sampled too
    job = tmp_path / "train.py"
    job.write_text(TINY_JOB)
    env = {**os.environ, "PYTHONPATH": str(REPO), "BLACKBOX_ALLOCATIONS": "8192"}
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "runs"), "--quiet", "--",
                           sys.executable, str(job)], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-2000:]
    (bundle,) = (tmp_path / "runs").glob("run-*/bundle")
    sites = json.loads((bundle / "metadata.json").read_text())["allocations"]["sites"]
    # THEN the job's line heads who holds, and the sitecustomize `blackbox run` wrote is no site and lends no
    # site its source line (it was the site of its own allocations, with the line `early.boot()`)
    assert sites[0]["site"] in (f"{fn} ({job}:{line_of(TINY_JOB, 'kept')})" for fn in ("<listcomp>", "<module>"))
    assert not [s for s in sites if "sitecustomize" in s["site"] or s["line"] == "early.boot()"], sites
    assert all(s["line"] == "" or f" ({job}:" in s["site"] for s in sites), sites  # a line is its site's


SPIKE_JOB = """
import os, sys, time
import numpy as np
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.05)
for step in range(8):
    blackbox.step(step)
    scratch = np.ones(1 << 20)
    time.sleep(1.0)  # (a step of 1 s: filling the spike on a loaded machine, 4 s, stays within 5 of them)
    if step == 6:
        print("spike", flush=True)
        if sys.argv[2] == "one":
            batch = np.ones(3 << 25)  # PLANT: spike (768 MiB, filled: the kernel kills it at the 512 MiB limit)
        else:
            batch = [np.ones(3 << 21) for _ in range(16)]  # PLANT: pieces (16 blocks of 48 MiB, filled)
"""


@pytest.mark.slow
@pytest.mark.parametrize("blocks", ["one", "many"])
def test_a_spike_is_told_from_a_leak_with_its_line_step_and_requested_bytes(
    tmp_path: Path, memory_cgroup: Any, blocks: str
) -> None:
    # GIVEN a job with no growth across its steps that makes 768 MiB in step 6, in one block or in 16 of 48 MiB,
    # and is OOM-killed in a 512 MiB cgroup
    cg = memory_cgroup(512 * MiB)
    kills = cg.oom_kills()
    proc, meta, job = run(tmp_path, SPIKE_JOB, blocks, cgroup=cg)
    assert proc.returncode == -signal.SIGKILL and cg.oom_kills() == kills + 1, proc.stderr[-2000:]
    death = meta["death"]
    assert death["cause"] == "host_oom_kill" and death["memory_pattern"] == "spike", (
        death["memory_pattern"], meta["allocations"].get("last_step_ran_s"), meta["allocations"].get("step_s"))
    lever = death["levers"][0]
    assert "in step 6, the step it died in" in lever and "chunk it" in lever and "raise the limit" in lever, lever
    if blocks == "many":  # THEN pieces are told as what that line allocated, its largest block named: never "one
        # allocation of 432 MiB" (the blocks it made before the kill, each 48 MiB)
        where = f"`{job}:{line_of(SPIKE_JOB, 'pieces')}`"
        said = re.search(r"^([\d.]+) (MiB|GiB) allocated \(its largest block 48.0 MiB\) at " + re.escape(where), lever)
        assert said is not None and "one allocation" not in lever, lever
        return
    assert f"one allocation of 768.0 MiB at `{job}:{line_of(SPIKE_JOB, 'spike')}`" in lever, lever
    assert "was requested, not all touched" in lever, lever
    assert not any("find what holds on to it" in lv or "kept across steps" in lv or "once the growth is explained"
                   in lv for lv in death["levers"]), death["levers"]  # fmt: skip


def test_a_spike_filled_on_a_loaded_machine_is_no_growth_per_step(tmp_path: Path) -> None:
    # GIVEN the ring of SPIKE_JOB's "many" run on a loaded machine (the whole suite beside it): its RSS rose 8 MiB
    # once at step 3, and the 16 pieces filled over 22 samples of step 6 before the kernel's OOM kill
    import zstandard

    from blackbox.recovery.alloc_levers import with_site_lever

    recorded = Path(__file__).parent / "data" / "spike-filled-on-a-loaded-machine.ring.zst"
    (tmp_path / "rings").mkdir()
    with recorded.open("rb") as src, (tmp_path / "rings" / "job.ring").open("wb") as out:
        zstandard.ZstdDecompressor().copy_stream(src, out)
    # WHEN it is recovered
    proc = subprocess.run([sys.executable, "-m", "blackbox", "recover", str(tmp_path / "rings"), "-o",
                           str(tmp_path / "bundle")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "bundle" / "metadata.json").read_text())
    # THEN the steps before the one it died in show no growth (it read 5.1 MiB ± 5.3 MiB a step, "beyond the noise":
    # the dying step's samples fitted as growth per step)
    growth = meta["death"]["host_growth"]
    assert not growth["rss_per_step_beyond_noise"] and abs(growth["rss_per_step"]) <= growth["rss_per_step_error"]
    # AND, the kernel's OOM kill said (its log line, read where the ring was written, is this host's no longer), the
    # spike is told with its line, not "the process grew 5.1 MiB per step but no sampled allocation site grew"
    death = with_site_lever({**meta["death"], "cause": "host_oom_kill", "levers": []}, meta["allocations"], "main")
    assert death["memory_pattern"] == "spike", death["memory_pattern"]
    assert re.match(r"480.0 MiB allocated \(its largest block 48.0 MiB\) at `\S+train.py:16`", death["levers"][0])


AFTER_STEPS_JOB = """
import os, sys, time
import numpy as np
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.05)
for step in range(20):  # training: no growth
    blackbox.step(step)
    scratch = np.ones(1 << 18)
    time.sleep(0.02)
time.sleep(0.5)
keep = []
t0 = time.monotonic()
while True:  # after training (an evaluation, a notebook's next cell): no step() any more
    if sys.argv[2] == "leak":
        keep.append(np.ones(1 << 20))  # PLANT: leak (8 MiB every 50 ms, kept)
        print(f"kept {len(keep) << 23} at {time.monotonic() - t0:.3f}", flush=True)
        time.sleep(0.05)
    else:
        time.sleep(2.5)
        print("spike", flush=True)
        batch = np.ones(3 << 26)  # PLANT: spike (1.5 GiB, filled: the kernel kills it at the limit)
"""


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["leak", "spike"])
def test_what_grew_after_the_last_step_is_a_leak_by_the_second_and_one_block_there_a_spike(
    tmp_path: Path, memory_cgroup: Any, planted: str
) -> None:
    # GIVEN a job that trained 20 steps and then, with no step any more, leaked 8 MiB every 50 ms (or made one
    # 1.5 GiB block), OOM-killed in a 600 MiB cgroup (the leak was told "one allocation of 392 MiB ... in step 20,
    # a spike, not a leak", "no site grew": every block after the loop counted as the last step's, in flight)
    cg = memory_cgroup(600 * MiB)
    kills = cg.oom_kills()
    proc, meta, job = run(tmp_path, AFTER_STEPS_JOB, planted, cgroup=cg)
    assert proc.returncode == -signal.SIGKILL and cg.oom_kills() == kills + 1, proc.stderr[-2000:]
    death, report = meta["death"], meta["allocations"]
    assert death["cause"] == "host_oom_kill", death
    assert report["last_step_ran_s"] > 2.0 and 0.01 < report["step_s"] < 0.2, report
    where = f"{job}:{line_of(AFTER_STEPS_JOB, planted)}"
    if planted == "spike":  # THEN one block after the loop is still a spike, said after the last step began
        assert death["memory_pattern"] == "spike", death
        assert f"one allocation of 1.5 GiB at `{where}`" in death["levers"][0], death["levers"]
        assert "after step 19 began (no step for " in death["levers"][0], death["levers"]
        return
    # THEN the leak's line grew, per second, within its error of the truth; and the levers say growth
    kept = [(int(m.group(1)), float(m.group(2))) for m in re.finditer(r"kept (\d+) at ([\d.]+)", proc.stdout)]
    truth = (kept[-1][0] - kept[0][0]) / (kept[-1][1] - kept[0][1])
    (grower, *_) = report["grew"]
    assert grower["site"].endswith(f"({where})") and grower["growth_by"] == "second", grower
    assert abs(grower["growth_per_s"] - truth) < max(0.3 * truth, 2 * grower["grown_error_bytes"]), (grower, truth)
    assert grower["after_last_step"] is True, grower
    # (not "a list appended in the loop keeps every step's objects": a step that ran long because it was the
    # heavy one, a larger batch's activations, looks the same to the samples; a red team planted it)
    assert death["memory_pattern"] == "after_last_step", death
    lever = death["levers"][0]
    assert f"`{where}`" in lever and " per second" in lever and "after the last step began" in lever, lever
    assert "where the loop had ended there" in lever and "lower the batch size" in lever, lever
    assert not any("a spike, not a leak" in lv or "kept across steps" in lv for lv in death["levers"]), death


DLSYM_JOB = """
import ctypes, os, signal, sys, time
import blackbox

libc = ctypes.CDLL(None)
if sys.argv[2] == "before":
    malloc = libc.malloc  # looked up before arm: calls go straight to glibc, never sampled
blackbox.arm(sys.argv[1], sample_interval=0.05)
malloc = libc.malloc
malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
kept = []


def c_buffer():
    p = malloc(8 << 20)  # PLANT: dlsym
    libc.memset(p, 1, 8 << 20)
    kept.append(p)


for step in range(1000):
    blackbox.step(step)
    c_buffer()
    print("kept", len(kept) * (8 << 20), flush=True)
    if sys.argv[3] == "sigkill" and step == 29:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_a_malloc_looked_up_through_dlsym_after_arming_is_named(tmp_path: Path) -> None:
    proc, meta, job = run(tmp_path, DLSYM_JOB, "after", "sigkill")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    top = meta["allocations"]["grew"][0]
    assert top["site"] == f"c_buffer ({job}:{line_of(DLSYM_JOB, 'dlsym')})", top
    assert abs(top["growth_per_step"] - 8 * MiB) < 0.1 * 8 * MiB, top


@pytest.mark.slow
def test_a_malloc_looked_up_before_arming_is_stated_as_unseen_growth_with_figures(
    tmp_path: Path, memory_cgroup: Any
) -> None:
    cg = memory_cgroup(512 * MiB)
    proc, meta, _ = run(tmp_path, DLSYM_JOB, "before", "oom", cgroup=cg)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    kept = max(int(n) for n in re.findall(r"kept (\d+)", proc.stdout))
    cov = meta["allocations"]["coverage"]
    assert cov["unseen_growth_bytes"] >= 0.75 * kept and cov["sampled_bytes"] < 0.25 * kept, (cov, kept)
    death = meta["death"]
    assert death["memory_pattern"] == "unseen_growth", death
    assert "no sampled allocation site grew" in death["levers"][0] and "dlsym" in death["levers"][0], death["levers"]
    summary = (tmp_path / "bundle" / "summary.md").read_text()
    assert "grew after arming than the sampled blocks hold" in summary


SOON_JOB = """
import os, signal, sys, threading
import numpy as np
import blackbox

blackbox.arm(sys.argv[1], sample_interval=3600)  # no tick after arm's own: nothing but the hooks writes text
kept = []


RENAMED = sys.argv[2] == "renamed"


def loader():
    if RENAMED:  # named as it started, then renamed: the name it has as it allocates is the one told
        threading.current_thread().name = "prefetch-loader"
    kept.append(np.ones(64 << 20, np.uint8))  # PLANT: soon


t = threading.Thread(target=loader, name="Thread-early" if RENAMED else "prefetch-loader")
t.start()
t.join()
os.kill(os.getpid(), signal.SIGKILL)  # at once: no tick between the allocation and the death
"""


@pytest.mark.slow
@pytest.mark.parametrize("naming", ["started", "renamed"])
def test_a_stack_and_thread_name_reach_the_ring_however_soon_the_process_dies(tmp_path: Path, naming: str) -> None:
    proc, meta, job = run(tmp_path, SOON_JOB, naming)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    top = meta["allocations"]["sites"][0]
    assert top["site"] == f"loader ({job}:{line_of(SOON_JOB, 'soon')})" and top["thread"] == "prefetch-loader", top
    assert top["live_bytes"] == 64 * MiB  # a block of 64 MiB is sampled with probability 1 - e^-64


RENAMED_JOB = """
import os, signal, sys, threading, time
import numpy as np
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.05)
kept = []


def loader():
    time.sleep(1.5)  # the tick's once-a-second look at every thread's name has seen the first name
    threading.current_thread().name = "prefetch-loader"
    kept.append(np.ones(64 << 20, np.uint8))  # PLANT: renamed
    time.sleep(0.3)  # ticks write the new stack's text, with the thread's name, into the table


t = threading.Thread(target=loader, name="Thread-early")
t.start()
t.join()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_thread_renamed_between_the_ticks_looks_is_named_by_its_new_name(tmp_path: Path) -> None:
    proc, meta, job = run(tmp_path, RENAMED_JOB)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    top = meta["allocations"]["sites"][0]
    assert top["site"] == f"loader ({job}:{line_of(RENAMED_JOB, 'renamed')})" and top["thread"] == "prefetch-loader"

WORKERS_JOB = """
import os, signal, sys, time
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Cached(Dataset):
    def __init__(self):
        self.cache = []

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        self.cache.append(np.ones(1 << 17))  # PLANT: item (1 MiB an item, kept by the worker)
        time.sleep(0.005)
        return torch.tensor([float(i)])


if __name__ == "__main__":
    short = DataLoader(Cached(), batch_size=1, num_workers=1, multiprocessing_context="fork")
    for step, _ in enumerate(short):  # a worker that ends cleanly while the job runs: folded, sites kept
        if step == 19:
            break
    del short
    time.sleep(1.0)
    loader = DataLoader(Cached(), batch_size=1, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True)
    for step, _ in enumerate(loader):
        time.sleep(0.01)
        if step == 40:
            print("workers", *(w.pid for w in loader._iterator._workers), flush=True)
            time.sleep(0.3)  # the workers' ticks
            os.kill(os.getpid(), signal.SIGKILL)  # the main process alone: its workers then end by themselves
"""


@pytest.mark.slow
def test_fork_workers_ending_after_the_main_process_died_keep_their_allocation_sites(tmp_path: Path) -> None:
    job = tmp_path / "train.py"
    job.write_text(WORKERS_JOB)
    env = {k: v for k, v in os.environ.items() if k != "BLACKBOX_ALLOCATIONS"} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--",
                           sys.executable, str(job)], capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]  # blackbox run ends as its job did
    workers = {int(p) for p in re.search(r"workers (\d+) (\d+)", proc.stdout).groups()}  # type: ignore[union-attr]
    (bundle,) = (tmp_path / "run").glob("*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    site = f"Cached.__getitem__ ({job}:{line_of(WORKERS_JOB, 'item')})"
    kept = {m["pid"]: m for m in meta["rings"] if m["pid"] in workers}
    assert set(kept) == workers, [(m["role"], m["pid"]) for m in meta["rings"]]  # neither was folded away
    for m in kept.values():
        top = m["allocations"]["sites"][0]
        assert m["role"] == "worker" and top["site"] == site, (m["role"], top)
        assert 10 * MiB <= top["live_bytes"] <= 40 * MiB, top  # about 20 items each, 1 MiB an item
    # the first loader's worker ended cleanly while the job ran: folded, with its largest site
    folded = [s for g in meta.get("helpers") or [] for s in g.get("sites") or []]
    assert any(s["site"] == site and 10 * MiB <= s["live_bytes"] <= 40 * MiB for s in folded), meta.get("helpers")
    summary = (bundle / "summary.md").read_text()
    across = summary.split("## Who holds the memory, in every process", 1)[1].split("\n## ", 1)[0]
    assert "Cached.__getitem__" in next(line for line in across.splitlines() if line.startswith("| `"))


SUBINTERPRETER = "kept = [bytearray(1 << 16) for _ in range(2000)]\nassert sum(len(b) for b in kept) == 2000 << 16\n"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="subinterpreters with a GIL of their own: Python 3.12+")
def test_subinterpreters_keep_working_armed_with_the_defaults(tmp_path: Path, writer_backend: str) -> None:
    """A subinterpreter with a GIL of its own runs its code on this thread and on another while the main
    interpreter allocates, armed with the defaults (stacks and allocations sampled every 10 ms): reading
    every interpreter's frames (``sys._current_frames``) crashed the process (free(): invalid pointer)."""
    import threading

    if sys.version_info >= (3, 13):
        import _interpreters as interpreters  # type: ignore[import-not-found]

        iid = interpreters.create("isolated")
        run_in = lambda: interpreters.exec(iid, SUBINTERPRETER)  # noqa: E731
    else:
        import _xxsubinterpreters as interpreters  # type: ignore[import-not-found]

        iid = interpreters.create(isolated=True)
        run_in = lambda: interpreters.run_string(iid, SUBINTERPRETER)  # noqa: E731
    rec = blackbox.Recorder.arm(tmp_path / "s.ring", sample_interval=0.01)
    try:
        assert rec.armed and rec._allocs is not None, rec.notes
        errors = [run_in()]
        other = threading.Thread(target=lambda: errors.append(run_in()))
        other.start()
        mine = [bytearray(1 << 16) for _ in range(4000)]  # the main interpreter allocates meanwhile
        other.join()
        rec.sample_now()
    finally:
        rec.disarm()
        interpreters.destroy(iid)
    assert errors == [None, None] and len(mine) == 4000
    meta = blackbox.recover(tmp_path / "s.ring", tmp_path / "bundle")
    assert json.loads((meta / "metadata.json").read_text())["allocations"]["recorded"] is True


FAST_JOB = """
import os, signal, sys, time
import numpy as np
import blackbox

blackbox.arm(sys.argv[1], sample_interval=0.05)
before = [np.ones(1 << 17) for _ in range(64)]  # PLANT: before (64 MiB, sampled at R = 1 MiB)
end = time.monotonic() + 1.5
while time.monotonic() < end:  # a job that allocates gigabytes a second: sampling it all would cost too much
    for _ in range(300):
        scratch = np.empty(1 << 17)
    time.sleep(0.001)
size = int(blackbox.active()._allocs._mean)  # the R it raised to: blocks of R, each sampled with p = 1 - 1/e
after = [np.empty(size // 8) for _ in range(16)]  # PLANT: after (16 R untouched, sampled at the raised R)
print("after", 16 * (size // 8) * 8, flush=True)
time.sleep(0.2)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_job_allocating_too_fast_gets_a_larger_interval_and_unbiased_estimates(tmp_path: Path) -> None:
    proc, meta, job = run(tmp_path, FAST_JOB)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    report = meta["allocations"]
    raised = report["mean_bytes_raised_to"]
    assert report["mean_bytes"] == MiB and raised is not None and raised > MiB, report["mean_bytes_raised_to"]
    assert any(n.startswith(f"allocations: sampling interval raised to {raised} bytes") for n in meta["notes"])
    after = int(re.search(r"after (\d+)", proc.stdout).group(1))  # type: ignore[union-attr]
    for mark, truth in (("before", 64 * MiB), ("after", after)):  # each block weighted by the R it met
        # (<module> or, before 3.12, the list comprehension's own frame)
        (site,) = [s for s in report["sites"] if s["site"].endswith(f"({job}:{line_of(FAST_JOB, mark)})")]
        assert abs(site["live_bytes"] - truth) <= 2 * site["error_bytes"], (mark, truth, site)  # within 4 sigma
    assert f"raised to {raised / MiB:.1f} MiB" in (tmp_path / "bundle" / "summary.md").read_text()


PACED_JOB = """
import os, signal, sys, time
import numpy as np
import blackbox

os.sched_setaffinity(0, {int(sys.argv[2])})  # one core (its sampler thread too), shared with the test's spinners
blackbox.arm(sys.argv[1], sample_interval=0.05)
work = np.ones(1 << 14)
end = time.monotonic() + 3.0
while time.monotonic() < end:  # 0.63 samples an iteration at R = 1 MiB
    scratch = np.empty(1 << 17)
    if sys.argv[3] == "computes":  # about 0.4 ms of work: some 1,500 samples a second of running
        for _ in range(120):
            work.sum()
    else:  # waits as for input: some 125 samples a second, every one of them while it runs
        time.sleep(0.005)
print("R", int(blackbox.active()._allocs._mean), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.parametrize("pace", ["computes", "waits"])
def test_the_sampling_rate_is_per_second_the_job_ran_not_waited_for_a_core(tmp_path: Path, pace: str) -> None:
    """R is raised past MAX_SAMPLES_PER_S samples a second of the time the job ran: wall time less its main
    thread's wait for a core. Starved to about a quarter of one core by three spinners, the computing job
    samples some 400 blocks a second of wall time (below the cap, where a wall-time rate never raises R)
    and about 1,500 a second of running: R is raised, and the note says it waited. The job that waits as
    for input samples 125 a second of wall time, all of it its own: R is kept."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    spin = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
            for _ in range(3)]  # fmt: skip
    try:
        proc, meta, _ = run(tmp_path, PACED_JOB, str(cpu), pace)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    raised = meta["allocations"]["mean_bytes_raised_to"]
    notes = [n for n in meta["notes"] if n.startswith("allocations: sampling interval raised to")]
    if pace == "waits":
        assert raised is None and notes == [] and "R 1048576" in proc.stdout, (meta["allocations"], notes)
        return
    assert raised is not None and raised >= 2 * MiB and f"R {raised}" in proc.stdout, meta["allocations"]
    assert "for a core" in notes[-1], notes
