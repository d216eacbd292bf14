"""memory.png answers "did memory leak, and what killed it": real jobs, real cgroups, a real OOM kill.

The properties asserted are the picture's, not its pixels: which panels it has, what each axis
spans, which lines and limits are drawn where, and the note a reader needs."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest
from conftest import REPO, run_py, spawn_py

from blackbox.recovery.pipeline import recover_rings

pytest.importorskip("matplotlib", reason="the picture is drawn only where matplotlib is installed")
from blackbox.views.plot import memory_figure  # noqa: E402

MiB = 1 << 20
GiB = float(1 << 30)

LEAK_BESIDE_PAGE_CACHE = """
import os, sys, time
import blackbox
with open(os.path.join(sys.argv[2], "cache.bin"), "wb") as f:  # the container's page cache, charged here
    for _ in range(256):
        f.write(b"\\1" * (1 << 20))
blackbox.arm(sys.argv[1], capacity=1 << 14, sample_interval=0.05)
kept = []
for step in range(64):  # the leak: 1 MiB a step
    blackbox.step(step)
    kept.append(bytearray(b"\\1" * (1 << 20)))
    time.sleep(0.03)
time.sleep(0.2)
"""

MAPS_THEN_LEAKS = """
import mmap, sys, time
import blackbox
blackbox.arm(sys.argv[1], capacity=1 << 14, sample_interval=0.05)
with open(sys.argv[2], "rb") as f:  # pages the parent read first: in this RSS, charged to the parent's cgroup
    shared = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
touched = sum(shared[i] for i in range(0, len(shared), 4096))
time.sleep(0.2)
kept = []
while True:  # then a leak, until the kernel's OOM killer ends it
    kept.append(bytearray(b"\\1" * (2 << 20)))
    time.sleep(0.02)
"""

GPU_LEAK = """
import sys, time, os, signal
sys.path.insert(0, sys.argv[2])
import fake_torch
fake_torch.install()
import blackbox
blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05)
fake_torch.state["initialised"] = True
for step in range(30):  # 3 GiB allocated, then 64 MiB more a step, on a device of 80 GiB
    blackbox.step(step)
    fake_torch.state["allocated"] += 64 << 20
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _panels(fig: Any) -> dict[str, Any]:
    return {ax.get_ylabel(): ax for ax in fig.axes}


def _line(ax: Any, prefix: str) -> Any:
    (line,) = [line for line in ax.get_lines() if str(line.get_label()).startswith(prefix)]
    return line


def _limit_lines(ax: Any) -> list[float]:
    """The heights of the horizontal limit lines (red) drawn in ``ax``."""
    lines = [line for line in ax.get_lines() if line.get_color() == "red" and len(line.get_ydata())]
    return [float(line.get_ydata()[0]) for line in lines]


def _notes(fig: Any) -> list[str]:
    return [" ".join(t.get_text().split()) for t in fig.texts if t.get_gid() == "note"]  # as one line


def _gib(recovered: Any, column: str) -> float:
    return float(pc.max(recovered.table[column]).as_py()) / GiB


@pytest.mark.slow
def test_a_leak_beside_a_large_page_cache_spans_the_job_axis(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    # GIVEN a CPU job in a memory cgroup whose usage is mostly page cache (256 MiB) that leaks 64 MiB
    cg = memory_cgroup(1 << 30)
    rings = tmp_path / "rings"
    rings.mkdir()
    run_py(LEAK_BESIDE_PAGE_CACHE, str(rings), str(tmp_path), preexec_fn=cg.join)
    recovered = recover_rings([rings])
    # WHEN it is drawn
    fig = memory_figure(recovered.table, recovered.meta)
    panels = _panels(fig)
    job_ax = fig.axes[0]
    # THEN there is no GPU panel (no GPU samples), and the job's axis is scaled to the job's own memory:
    assert not [label for label in panels if "GPU" in label], panels
    rss = np.asarray(_line(job_ax, "host_rss").get_ydata())
    bottom, top = job_ax.get_ylim()
    assert bottom == 0 and top >= rss.max()
    assert (rss.max() - rss.min()) / top >= 0.4, "the 64 MiB leak is a slope across the panel, not a flat line"
    # the cgroup's usage (page cache and all) is far above that axis, so it has its own panel, with its limit
    usage = _gib(recovered, "cgroup_usage")
    assert usage > top
    cgroup_ax = panels["cgroup (GiB)"]
    assert cgroup_ax.get_ylim()[1] >= max(usage, 1.0)
    assert _limit_lines(cgroup_ax) == [1.0] and _limit_lines(job_ax) == []
    assert "host_rss" in _line(job_ax, "host_rss").get_label() and "\u2192" in _line(job_ax, "host_rss").get_label()
    assert _notes(fig) == [], "RSS stayed under the limit: nothing to explain"


def test_rss_above_a_cgroup_limit_the_usage_is_below_is_explained(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    # GIVEN 96 MiB of file pages this (parent) process wrote and read: charged to this process's cgroup
    shared = tmp_path / "shared.bin"
    shared.write_bytes(b"\1" * (96 * MiB))
    assert len(shared.read_bytes()) == 96 * MiB
    # and a job in a 192 MiB cgroup that maps them (its RSS counts them, its cgroup does not), then leaks
    limit = 192 * MiB
    cg = memory_cgroup(limit)
    rings = tmp_path / "rings"
    rings.mkdir()
    job = spawn_py(MAPS_THEN_LEAKS, str(rings), str(shared), preexec_fn=cg.join, stdout=subprocess.DEVNULL)
    # WHEN the kernel's OOM killer ends it
    assert job.wait(timeout=120) == -signal.SIGKILL
    assert cg.oom_kills() >= 1
    recovered = recover_rings([rings])
    fig = memory_figure(recovered.table, recovered.meta)
    job_ax = fig.axes[0]
    # THEN the limit is on the job's own axis (it is within reach of the job's memory), RSS drawn above it,
    assert _limit_lines(job_ax) == [limit / GiB]
    assert np.max(_line(job_ax, "host_rss").get_ydata()) > limit / GiB
    # the usage never above it, and a note under the panels says why RSS may be
    assert np.max(_line(job_ax, "cgroup usage").get_ydata()) <= limit / GiB
    (note,) = _notes(fig)
    assert "RSS counts every page the process maps" in note and "charged to another cgroup" in note
    assert "limit 192.0 MiB" in note
    assert "oom" in " ".join(t.get_text() for t in job_ax.texts), "the death is marked with its cause"


def test_a_gpu_leak_is_drawn_on_its_own_scale_with_the_device_total_named(tmp_path: Path) -> None:
    # GIVEN a job on a (fake) 80 GiB device whose allocations grow from 3 GiB, then SIGKILLed
    rings = tmp_path / "rings"
    rings.mkdir()
    job = spawn_py(GPU_LEAK, str(rings), str(REPO / "tests"))
    assert job.wait(timeout=60) == -signal.SIGKILL
    recovered = recover_rings([rings])
    # WHEN it is drawn
    fig = memory_figure(recovered.table, recovered.meta)
    gpu_ax = _panels(fig)["GPU memory (GiB)"]
    # THEN the GPU panel is scaled to the job's GPU memory, the device's 80 GiB named in the legend, not drawn
    reserved = _gib(recovered, "gpu_reserved")
    assert reserved <= gpu_ax.get_ylim()[1] < 80
    allocated = np.asarray(_line(gpu_ax, "gpu_allocated").get_ydata())
    assert (allocated.max() - allocated.min()) / gpu_ax.get_ylim()[1] >= 0.15, "the growth is visible"
    assert _limit_lines(gpu_ax) == []
    assert "device total 80.0 GiB (above)" in [t.get_text() for t in gpu_ax.get_legend().get_texts()]
