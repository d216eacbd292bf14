"""The CUDA collectors on the fake device of the GPU check (tools/gpucheck/fake_cuda.py), each against what
the first runs on an H200 found (docs/gpu.md): they attach as torch initialises CUDA, the history's lost
actions are counted, the history is never read from the sampler before the job loaded torch._inductor (it
raced the job's own import and broke it), expandable segments get one note and no lever to turn them on,
and torch.accelerator is never asked on a CUDA build (it initialises the driver)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_py

import blackbox
from blackbox.collect import gpu as _gpu
from blackbox.recovery.gpu_oom import EXPANDABLE_ON
from blackbox.ring import format as fmt

pytestmark = pytest.mark.slow

PRELUDE = f"""
import json, sys, time
sys.path.insert(0, {str(REPO / "tools" / "gpucheck")!r})
from device import Device
import fake_cuda
dev = Device(True)          # the fake torch, imported before arm, as most jobs import torch first
torch = dev.torch
import blackbox
"""


@pytest.fixture(autouse=True)
def _ring_folder(tmp_path: Path) -> None:
    (tmp_path / "ring").mkdir()  # a folder: the ring and its sidecars go in it


def _recover(ring_dir: Path, out: Path) -> dict[str, Any]:
    blackbox.recover(ring_dir, out, raw=False)
    meta: dict[str, Any] = json.loads((out / "metadata.json").read_text())
    return meta


def test_the_first_allocation_after_cuda_init_is_in_the_history_and_an_oom_in_it_is_observed(tmp_path: Path) -> None:
    code = PRELUDE + """
blackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600, allocator_history=True)  # no sampler tick
dev.init()
first = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
dev.optimizer()
try:
    torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:
    pass
"""
    run_py(code, str(tmp_path / "ring"))
    meta = _recover(tmp_path / "ring", tmp_path / "b")
    assert meta["allocator_history"]["actions"] >= 2, meta["allocator_history"]  # the 1 MiB block and more
    kinds = [e["kind"] for e in meta["exceptions"]]
    assert "oom" in kinds, "the OOM observer was attached at CUDA's initialisation, before any sampler tick"


def test_actions_lost_between_drains_are_counted_exactly(tmp_path: Path) -> None:
    code = PRELUDE + """
def counted():
    s = fake_cuda.ALLOCATOR.counts
    return s["alloc"] + s["free"] + s["seg_alloc"] + s["seg_free"]
rec = blackbox.arm(sys.argv[1], capacity=1 << 14, sample_interval=3600, allocator_history=64)
dev.init()
start = counted()           # the history began with CUDA
opt = dev.optimizer()       # the job loads torch._inductor (through torch._dynamo), as training jobs do
from job import torch_hooks
hooks = torch_hooks(rec)
for burst in (10, 500, 20, 300):   # 64 entries kept: the two large bursts overflow it between drains
    for _ in range(burst):
        t = torch.empty(4096, dtype=torch.uint8, device="cuda")
        del t
    hooks.drain()
print(json.dumps({"pytorch": counted() - start, "lost": hooks.history_lost}))
"""
    out = json.loads(run_py(code, str(tmp_path / "ring")).stdout)
    meta = _recover(tmp_path / "ring", tmp_path / "b")
    history = meta["allocator_history"]
    assert history["lost"] == out["lost"] > 0
    assert fmt.NOTE_HISTORY_LOST in " ".join(meta["notes"])
    # every action PyTorch counted is in the ring or counted lost (free_requested, which has no counter, aside)
    kinds = _kind_counts(tmp_path / "b")
    counted = sum(kinds.get(k, 0) for k in ("alloc", "free", "segment_alloc", "segment_free"))
    assert counted + history["lost"] == out["pytorch"], (counted, history, out)


def _kind_counts(bundle: Path) -> dict[str, int]:
    import pyarrow.parquet as pq

    kinds = pq.read_table(bundle / "timeline.parquet", columns=["kind"])["kind"].cast("string").to_pylist()
    return {k: kinds.count(k) for k in set(kinds)}


def test_the_sampler_never_reads_the_history_before_the_job_loaded_inductor(tmp_path: Path) -> None:
    code = PRELUDE + """
rec = blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05, allocator_history=True)
dev.init()
x = [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
time.sleep(1.6)             # a drain is due after 1 s: the sampler must not take it
print(json.dumps({"imported_by": fake_cuda.STATE["inductor_imported_by"]}))
"""
    proc = run_py(code, str(tmp_path / "ring"))
    assert json.loads(proc.stdout) == {"imported_by": None}
    meta = _recover(tmp_path / "ring", tmp_path / "b")
    assert any("never loaded torch._inductor" in n for n in meta["notes"]), meta["notes"]


def test_an_oom_still_writes_the_snapshot_importing_in_the_dying_thread(tmp_path: Path) -> None:
    code = PRELUDE + """
rec = blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05, allocator_history=True)
dev.init()
x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
try:
    torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError:
    pass
print(json.dumps({"imported_by": fake_cuda.STATE["inductor_imported_by"]}))
"""
    proc = run_py(code, str(tmp_path / "ring"))
    assert json.loads(proc.stdout) == {"imported_by": "MainThread"}
    assert list((tmp_path / "ring").glob("*.oom-snapshot.pickle"))


FRAGMENTED = (
    "CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which 713.12 MiB "
    "is free. Including non-PyTorch memory, this process has 139.10 GiB memory in use. Of the allocated memory "
    "69.50 GiB is allocated by PyTorch, and 69.00 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)  # word for word from the H200 (docs/gpu.md), torch 2.11


@pytest.mark.parametrize("conf", ["expandable_segments:True", ""])
def test_expandable_segments_get_one_note_and_no_lever_to_turn_them_on(tmp_path: Path, conf: str) -> None:
    code = PRELUDE + f"""
blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05)
dev.init()
time.sleep(0.2)
raise torch.OutOfMemoryError({FRAGMENTED!r})
"""
    proc = run_py(code, str(tmp_path / "ring"), check=False, env={"PYTORCH_CUDA_ALLOC_CONF": conf})
    assert proc.returncode == 1
    meta = _recover(tmp_path / "ring", tmp_path / "b")
    death = meta["death"]
    assert death["gpu_oom"]["kind"] == "fragmentation"
    notes = [n for n in meta["notes"] if "expandable_segments" in n]
    if conf:
        assert notes == [fmt.NOTE_EXPANDABLE]
        assert death["levers"][0] == EXPANDABLE_ON
        assert not any("set PYTORCH_CUDA_ALLOC_CONF" in lever for lever in death["levers"])
    else:
        assert notes == []
        assert any("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in lever for lever in death["levers"])


def test_accelerator_is_never_asked_on_a_cuda_build() -> None:
    asked: list[str] = []

    def ask(name: str) -> Any:
        def call(*a: Any) -> Any:
            asked.append(name)
            return True

        return call

    acc = types.SimpleNamespace(is_available=ask("is_available"), current_accelerator=ask("current_accelerator"))
    for version in (types.SimpleNamespace(cuda="13.0", hip=None), types.SimpleNamespace(cuda=None, hip="6.2")):
        torch = types.SimpleNamespace(version=version, accelerator=acc,
                                      _C=types.SimpleNamespace(_accelerator_isAllocatorInitialized=ask("initialised")))
        assert _gpu._accelerator(torch) is None
    assert asked == [], "is_available() counts devices through the driver: it initialises CUDA in the job"
