"""A stand-in CUDA build of torch for ``gpu_check.py --dry-run``: the same jobs, on a CPU, with no torch.

It is a model of PyTorch's caching allocator just deep enough to drive every code path the GPU check
drives on a real device: segments carved into blocks (so freeing every other block leaves the bytes
cached but in pieces: fragmentation), the OOM observer called with PyTorch's arguments, the OutOfMemory
message in PyTorch's words, the bounded allocator history with each entry's Python frames, the nested
and the flat ``memory_stats``, and the optimizer step hooks. ``install()`` puts it in ``sys.modules`` as
``torch``; nothing here imports the real one.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import types
from typing import Any

MiB, GiB = 1 << 20, 1 << 30
CAPACITY = 8 * GiB  # the fake device's total memory
CONTEXT = 512 * MiB  # what the CUDA context and the libraries' kernels hold (not PyTorch's)
SEGMENT_ROUND = 2 * MiB


class OutOfMemoryError(RuntimeError):
    pass


def format_size(n: int) -> str:
    """PyTorch's ``format_size`` (c10/cuda/CUDACachingAllocator.cpp)."""
    if n <= 1024:
        return f"{n} bytes"
    if n <= 1 << 20:
        return f"{n / 1024:.2f} KiB"
    if n <= 1 << 30:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


class Allocator:
    """Segments of blocks; first fit in the cache, then a new segment, then the cache freed, then OOM."""

    def __init__(self) -> None:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
        self.backend = "cudaMallocAsync" if "backend:cudaMallocAsync" in conf else "native"
        self.expandable = "expandable_segments:True" in conf
        self.segments: list[list[list[int]]] = []  # each: blocks [addr, size, live]
        self.next_addr = 0x7F0000000000
        self.observers: list[Any] = []
        self.history: list[dict[str, Any]] | None = None
        self.max_entries = 0
        self.counts = {"alloc": 0, "free": 0, "seg_alloc": 0, "seg_free": 0, "ooms": 0}
        self.peak = 0

    # ------------------------------------------------------------ figures
    def reserved(self) -> int:
        return sum(b[1] for seg in self.segments for b in seg)

    def allocated(self) -> int:
        return sum(b[1] for seg in self.segments for b in seg if b[2])

    def device_free(self) -> int:
        return CAPACITY - CONTEXT - self.reserved()

    def nested_stats(self) -> dict[str, Any]:
        a, r = self.allocated(), self.reserved()
        inactive = sum(b[1] for seg in self.segments for b in seg if not b[2] and len(seg) > 1)
        return {
            "allocated_bytes": {"all": {"current": a, "peak": self.peak}},
            "reserved_bytes": {"all": {"current": r, "peak": r}},
            "active_bytes": {"all": {"current": a, "peak": self.peak}},
            "inactive_split_bytes": {"all": {"current": inactive, "peak": inactive}},
            "allocation": {"all": {"allocated": self.counts["alloc"], "freed": self.counts["free"]}},
            "segment": {"all": {"allocated": self.counts["seg_alloc"], "freed": self.counts["seg_free"]}},
            "num_alloc_retries": 0,
            "num_ooms": self.counts["ooms"],
        }

    def flat_stats(self) -> dict[str, int]:
        out: dict[str, int] = {}

        def walk(prefix: str, d: dict[str, Any]) -> None:
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(f"{prefix}{k}.", v)
                else:
                    out[f"{prefix}{k}"] = v

        walk("", self.nested_stats())
        return out

    # ------------------------------------------------------------ history
    def _trace(self, action: str, addr: int, size: int) -> None:
        if self.history is None:
            return
        frames: list[dict[str, Any]] = []
        f = sys._getframe(2)
        while f is not None and len(frames) < 64:
            if "fake_cuda" not in f.f_code.co_filename:
                frames.append({"name": f.f_code.co_name, "filename": f.f_code.co_filename, "line": f.f_lineno})
            f = f.f_back  # type: ignore[assignment]
        entry = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": int(time.time() * 1e6)}
        if action == "alloc":
            entry["frames"] = frames
        self.history.append(entry)
        if len(self.history) > self.max_entries:
            del self.history[: len(self.history) - self.max_entries]

    # ------------------------------------------------------------ malloc / free
    def malloc(self, size: int) -> list[int]:
        size = max(512, (size + 511) // 512 * 512)
        block = self._from_cache(size) or self._new_segment(size)
        if block is None:
            self._release_cache()
            block = self._new_segment(size)
        if block is None:
            self.counts["ooms"] += 1
            total = CAPACITY
            for obs in list(self.observers):
                obs(0, size, total, self.device_free())
            a, r = self.allocated(), self.reserved()
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {format_size(size)}. GPU 0 has a total capacity of "
                f"{format_size(total)} of which {format_size(self.device_free())} is free. Including non-PyTorch "
                f"memory, this process has {format_size(r + CONTEXT)} memory in use. Of the allocated memory "
                f"{format_size(a)} is allocated by PyTorch, and {format_size(r - a)} is reserved by PyTorch but "
                "unallocated. If reserved but unallocated memory is large try setting "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
                "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
            )
        self.counts["alloc"] += 1
        self.peak = max(self.peak, self.allocated())
        self._trace("alloc", block[0], block[1])
        return block

    def _from_cache(self, size: int) -> list[int] | None:
        for seg in self.segments:
            for i, b in enumerate(seg):
                if not b[2] and b[1] >= size:
                    if b[1] - size >= 512:  # split: the rest stays cached in this segment
                        seg.insert(i + 1, [b[0] + size, b[1] - size, 0])
                        b[1] = size
                    b[2] = 1
                    return b
        return None

    def _new_segment(self, size: int) -> list[int] | None:
        seg_size = (size + SEGMENT_ROUND - 1) // SEGMENT_ROUND * SEGMENT_ROUND
        if seg_size > self.device_free():
            return None
        block = [self.next_addr, size, 1]
        seg = [block] + ([[self.next_addr + size, seg_size - size, 0]] if seg_size > size else [])
        self.next_addr += seg_size
        self.segments.append(seg)
        self.counts["seg_alloc"] += 1
        self._trace("segment_map" if self.expandable else "segment_alloc", block[0], seg_size)
        return block

    def _release_cache(self) -> None:
        keep = []
        for seg in self.segments:
            if any(b[2] for b in seg):
                keep.append(seg)
            else:
                self.counts["seg_free"] += 1
                self._trace("segment_unmap" if self.expandable else "segment_free", seg[0][0], sum(b[1] for b in seg))
        self.segments = keep
        if self.expandable:  # expandable segments: one growing mapping, never stranded pieces
            for seg in self.segments:
                seg[:] = [b for b in seg if b[2]]

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: the segments with no live block go back to the device."""
        self._release_cache()

    def free(self, block: list[int]) -> None:
        self._trace("free_requested", block[0], block[1])
        block[2] = 0
        self.counts["free"] += 1
        self._trace("free_completed", block[0], block[1])
        for seg in self.segments:  # merge neighbours, as the allocator does
            i = 0
            while i < len(seg) - 1:
                if not seg[i][2] and not seg[i + 1][2]:
                    seg[i][1] += seg[i + 1][1]
                    del seg[i + 1]
                else:
                    i += 1


ALLOCATOR = Allocator()
STATE: dict[str, Any] = {"initialised": False, "step_pre": [], "step_post": [], "inductor_imported_by": None}


class Tensor:
    """A device buffer: freed when the last reference goes, as a torch tensor's storage is."""

    def __init__(self, nbytes: int) -> None:
        self._block = ALLOCATOR.malloc(nbytes)
        self.nbytes = nbytes

    def __del__(self) -> None:
        block = getattr(self, "_block", None)
        if block is not None and block[2]:
            ALLOCATOR.free(block)


def _record_memory_history(enabled: Any = "all", context: Any = None, stacks: Any = None,
                           max_entries: int = sys.maxsize) -> None:  # fmt: skip
    if enabled is None:
        ALLOCATOR.history = None
    else:
        ALLOCATOR.history = []
        ALLOCATOR.max_entries = max_entries


def _inductor_import() -> None:
    """What torch 2.11 does where the job has not imported torch._inductor: the snapshot's Python frames, or
    an optimizer's first use (through torch._dynamo), import it, for seconds (0.3 here), in the calling thread."""
    if "torch._inductor" not in sys.modules:
        time.sleep(0.3)
        sys.modules["torch._inductor"] = types.ModuleType("torch._inductor")
        STATE["inductor_imported_by"] = threading.current_thread().name


class Optimizer:
    """``torch.optim.SGD`` and the like: the first one imports torch._dynamo, and so torch._inductor."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        _inductor_import()
        self.params = list(params)


def _snapshot() -> dict[str, Any]:
    if any("frames" in e for e in ALLOCATOR.history or []):
        _inductor_import()
    segments = [
        {"address": seg[0][0], "total_size": sum(b[1] for b in seg), "device": 0,
         "blocks": [{"address": b[0], "size": b[1], "state": "active_allocated" if b[2] else "inactive"} for b in seg]}
        for seg in ALLOCATOR.segments
    ]  # fmt: skip
    return {"segments": segments, "device_traces": [list(ALLOCATOR.history or [])]}


def install() -> types.ModuleType:
    """Put the fake torch (and its submodules) in ``sys.modules``."""
    torch = types.ModuleType("torch")
    torch.__spec__ = None
    cuda = types.ModuleType("torch.cuda")
    cuda.is_initialized = lambda: STATE["initialised"]  # type: ignore[attr-defined]
    cuda.is_available = lambda: True  # type: ignore[attr-defined]
    cuda.current_device = lambda: 0  # type: ignore[attr-defined]
    cuda.device_count = lambda: 1  # type: ignore[attr-defined]
    cuda.mem_get_info = lambda d=0: (ALLOCATOR.device_free(), CAPACITY)  # type: ignore[attr-defined]
    cuda.get_allocator_backend = lambda: ALLOCATOR.backend  # type: ignore[attr-defined]
    cuda.memory_stats = lambda d=0: ALLOCATOR.flat_stats()  # type: ignore[attr-defined]
    cuda.synchronize = lambda d=None: None  # type: ignore[attr-defined]
    cuda.empty_cache = ALLOCATOR.empty_cache  # type: ignore[attr-defined]
    cuda.get_device_name = lambda d=0: "fake CUDA device (gpu_check --dry-run)"  # type: ignore[attr-defined]
    cuda.OutOfMemoryError = OutOfMemoryError  # type: ignore[attr-defined]
    cuda._queued_calls = []  # type: ignore[attr-defined]  # run at initialisation, as torch.cuda._lazy_init does

    def dump(path: str) -> None:
        with open(path, "wb") as f:
            pickle.dump(_snapshot(), f)

    cuda.memory = types.SimpleNamespace(  # type: ignore[attr-defined]
        _record_memory_history=_record_memory_history, _snapshot=_snapshot, _dump_snapshot=dump
    )
    torch.cuda = cuda  # type: ignore[attr-defined]
    torch.uint8 = "uint8"  # type: ignore[attr-defined]
    torch.empty = lambda n, dtype=None, device=None: Tensor(n)  # type: ignore[attr-defined]
    torch.OutOfMemoryError = OutOfMemoryError  # type: ignore[attr-defined]
    torch.version = types.SimpleNamespace(hip=None, cuda="13.0", __version__="fake")  # type: ignore[attr-defined]
    torch.__version__ = "0.0+fake"  # type: ignore[attr-defined]

    def stats(device: int) -> dict[str, Any]:  # answers inside the initialisation too, as torch's does
        return ALLOCATOR.nested_stats()

    torch._C = types.SimpleNamespace(  # type: ignore[attr-defined]
        _cuda_memoryStats=stats, _cuda_attach_out_of_memory_observer=ALLOCATOR.observers.append
    )
    torch.autograd = types.SimpleNamespace(backward=lambda *a, **k: None)  # type: ignore[attr-defined]
    optimizer = types.ModuleType("torch.optim.optimizer")

    def pre(fn: Any) -> Any:
        STATE["step_pre"].append(fn)
        return types.SimpleNamespace(remove=lambda: STATE["step_pre"].remove(fn))

    def post(fn: Any) -> Any:
        STATE["step_post"].append(fn)
        return types.SimpleNamespace(remove=lambda: STATE["step_post"].remove(fn))

    optimizer.register_optimizer_step_pre_hook = pre  # type: ignore[attr-defined]
    optimizer.register_optimizer_step_post_hook = post  # type: ignore[attr-defined]
    optim = types.ModuleType("torch.optim")
    optim.optimizer = optimizer  # type: ignore[attr-defined]
    optim.SGD = optim.AdamW = Optimizer  # type: ignore[attr-defined]
    torch.optim = optim  # type: ignore[attr-defined]
    sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.optim": optim, "torch.optim.optimizer": optimizer})
    return torch


def optimizer_step(optimizer: object) -> None:
    """What ``optimizer.step()`` does to the global step hooks."""
    for fn in list(STATE["step_pre"]):
        fn(optimizer, (), {})
    for fn in list(STATE["step_post"]):
        fn(optimizer, (), {})
