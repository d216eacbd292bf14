"""Training context from torch, with no code in the job beyond ``arm()``.

Attached lazily, from the sampler thread, once the job has imported torch:

- steps: torch's global optimizer step hooks count optimizer steps (the first
  optimizer seen leads, so several optimizers per step count once); a job
  that calls ``blackbox.step()`` itself takes over and the count stops;
- phases: ``optimizer`` (the same hooks) and ``backward`` (the C extension's
  ``PhaseCall`` around ``torch.autograd.backward``, which ``Tensor.backward``
  calls: it adds no Python frame to the job's tracebacks or stacks);
  ``forward`` and per-module events with ``modules=True`` (global module
  forward hooks, cost measured in tools/bench_overhead.py).

And once the job has initialised CUDA itself (never before: attaching the
observer would initialise it), at the initialisation itself where torch queues
work for it (``torch.cuda._queued_calls``: the job's first CUDA call runs them,
before its first allocation, so the history misses none of the job's blocks and
the observer sees an OOM in the very first allocation), else at the sampler's
next tick:

- the allocator's OOM observer: an ``oom`` event with device, requested bytes,
  limit and free bytes, before the exception unwinds;
- opt-in allocator history (``allocator_history``): PyTorch's bounded history,
  drained into the ring as alloc / free / segment events, and on the first OOM
  PyTorch's snapshot pickle beside the ring for its memory viewer
  (https://pytorch.org/memory_viz). PyTorch keeps the history in a ring of its
  own: actions that fall out of it between two drains are lost, and counted
  (PyTorch's own counters of allocations, frees and segments, read before each
  drain, against the actions drained) into a note whose value is the total.
  The history is read only while no module is being imported and once the job
  has loaded torch._inductor (``snapshot_safe``: reading its frames imports
  that module otherwise, seconds, in the reading thread);
- one note where the allocator is not the default one: another backend
  (``cudaMallocAsync``: polling only) or expandable segments (an OOM then is
  not fragmentation in the caching allocator's sense).

Every hook swallows its own errors: the job's call always proceeds. An exception raised by the job's
own signal handler while a hook ran is the job's: it propagates (``_jobsignal.py``).
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._jobsignal import raised_by_signal_handler
from ..ring import format as fmt
from ..ring.file import write_new_file
from ..ring.writer import RingWriter, built_module
from .gpu import NULL, loaded_torch

PHASE_BEGIN = fmt.KIND_CODES["phase_begin"]
PHASE_END = fmt.KIND_CODES["phase_end"]
MODULE_BEGIN = fmt.KIND_CODES["module_begin"]
MODULE_END = fmt.KIND_CODES["module_end"]
OOM = fmt.KIND_CODES["oom"]
MARK = fmt.KIND_CODES["mark"]
ACTION_KINDS = {name: fmt.KIND_CODES[name] for name in fmt.ALLOCATOR_KINDS if name != "free"}
ACTION_KINDS["free_completed"] = fmt.KIND_CODES["free"]
DEFAULT_HISTORY_ENTRIES = 10_000
# PyTorch's counters (torch._C._cuda_memoryStats) of the history actions that have one
COUNTED = {"alloc": ("allocation", "allocated"), "free_completed": ("allocation", "freed"),
           "segment_alloc": ("segment", "allocated"), "segment_free": ("segment", "freed")}  # fmt: skip
DRAIN_DUTY = 0.02  # at most 2% of the time goes to draining the history
MIN_DRAIN_INTERVAL = 1.0


class TorchHooks:
    """The torch-side collectors of one Recorder."""

    def __init__(
        self,
        writer: RingWriter,
        *,
        modules: bool,
        allocator_history: int,
        snapshot_path: Path | None,
        rss: Callable[[], int],
        note: Callable[[str], None],
        gpu_blocks: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        self._w = writer
        self._gpu_blocks = gpu_blocks  # allocation sampling's: each history entry drained, with its frames
        self._modules = modules
        self._history_entries = allocator_history
        self._snapshot_path = snapshot_path
        self._rss = rss
        self._note = note
        self._attached = False
        self._cuda_attached = False
        self.oom_requests: dict[int, int] = {}  # device -> the bytes its last OOM asked for (the observer's)
        self._handles: list[Any] = []
        self._torch: Any = None
        self._orig_backward: Any = None
        self._our_backward: Any = None
        self._lock = threading.Lock()
        # steps
        self._leader: Any = None  # weakref to the optimizer whose steps count
        self._from_optimizer = False
        self._count = 0
        self._opt_t0 = 0
        # modules
        self._names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._local = threading.local()
        # history
        self._history_on = False
        self._last_entry: dict[int, tuple[Any, ...]] = {}
        # device -> [PyTorch's count of COUNTED actions at the history's start, at the last drain, COUNTED
        # actions drained since the start, lost before the last reset of the counters, lost in all]
        self._counted: dict[int, list[int]] = {}
        self.history_lost = 0
        self._pid = os.getpid()
        self._next_drain = 0.0
        self._snapshot_written = False
        self.history_drains = 0
        self.history_events = 0
        self.history_seconds = 0.0
        self._oom_detail = 0

    # ------------------------------------------------------------ attaching
    def poll(self) -> None:
        """Attach what the job's progress allows; drain the history when due."""
        torch = loaded_torch()
        if torch is None:
            return
        with self._lock:
            if not self._attached:
                self._attached = True
                self._torch = torch
                self._attach(torch)
                self._queue_cuda_attach(torch)
            if not self._cuda_attached and _cuda_initialised(torch):
                self._cuda_attached = True
                self._attach_cuda(torch)
        if self._history_on and time.monotonic() >= self._next_drain and snapshot_safe(may_import=False):
            self.drain()

    def _attach(self, torch: Any) -> None:
        self._try("optimizer step hooks", self._attach_optimizer, torch)
        self._try("backward phase", self._attach_backward, torch)
        if self._modules:
            self._try("module hooks", self._attach_modules, torch)

    def _queue_cuda_attach(self, torch: Any) -> None:
        """Have torch attach the CUDA collectors as it initialises CUDA for the job, before the job's first
        allocation. Appended to ``torch.cuda._queued_calls`` directly, not through ``_lazy_call``, whose
        lock a thread initialising CUDA holds for seconds: the sampler never waits. Where torch has no such
        list, or has initialised CUDA already, the sampler's tick attaches them, as before."""
        queued = getattr(getattr(torch, "cuda", None), "_queued_calls", None)
        if not isinstance(queued, list) or _cuda_initialised(torch):
            return

        def at_cuda_init() -> None:
            # Runs in the job's thread inside torch.cuda._lazy_init, under its lock: it never raises (an
            # exception would reach the job as DeferredCudaCallError) and never waits on the sampler's lock.
            try:
                if os.getpid() != self._pid or self._torch is None or not self._lock.acquire(blocking=False):
                    return  # a forked child's, a disarmed recorder's, or the sampler is attaching right now
                try:
                    if not self._cuda_attached:
                        self._cuda_attached = True
                        self._attach_cuda(torch)
                finally:
                    self._lock.release()
            except Exception as exc:
                if raised_by_signal_handler(exc):  # the job's exception: it propagates, as unarmed
                    raise

        queued.append((at_cuda_init, []))

    def _try(self, what: str, fn: Callable[[Any], None], torch: Any) -> None:
        try:
            fn(torch)
        except Exception as exc:
            self._note(f"{what} not attached: {type(exc).__name__}: {exc}")

    def _attach_optimizer(self, torch: Any) -> None:
        opt = importlib.import_module("torch.optim.optimizer")  # torch is loaded: this only binds it
        self._handles.append(opt.register_optimizer_step_pre_hook(self._optimizer_pre))
        self._handles.append(opt.register_optimizer_step_post_hook(self._optimizer_post))
        # The job drives no steps itself: count optimizer steps (step k = k steps completed;
        # events before the first optimizer step carry no step).
        self._from_optimizer = self._w.current_step() < 0

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self._leader is None or self._leader() is None:
                self._leader = weakref.ref(optimizer)
            if self._leader() is optimizer:
                self._opt_t0 = self._w.event(PHASE_BEGIN, "optimizer")
        except Exception as exc:
            if raised_by_signal_handler(exc):  # the job's exception: it propagates, as unarmed
                raise

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self._leader is None or self._leader() is not optimizer:
                return
            t0 = self._opt_t0
            self._w.event(PHASE_END, "optimizer", time.monotonic_ns() - t0 if t0 else None)
            if self._from_optimizer:
                if self._w.current_step() != (self._count if self._count else -1):
                    self._from_optimizer = False  # blackbox.step() was called: the job counts now
                    return
                self._count += 1
                self._w.step(self._count)
        except Exception as exc:
            if raised_by_signal_handler(exc):  # the job's exception: it propagates, as unarmed
                raise

    def _attach_backward(self, torch: Any) -> None:
        """``torch.autograd.backward`` (which ``Tensor.backward`` calls) inside the C extension's PhaseCall:
        the phase's events around the call, with no Python frame of blackbox's in the job's tracebacks or
        stacks. Without the extension the phase is not recorded (a Python wrapper would show there)."""
        cmod = built_module()
        if cmod is None or not hasattr(cmod, "PhaseCall"):
            raise RuntimeError("the C extension blackbox.ring._cwriter is not built, and a Python wrapper would "
                               "add a frame to the job's tracebacks")  # fmt: skip
        autograd = torch.autograd
        original = autograd.backward
        ours = cmod.PhaseCall(original, self._w.event, PHASE_BEGIN, PHASE_END, "backward")
        autograd.backward = ours
        self._orig_backward, self._our_backward = original, ours

    def _attach_modules(self, torch: Any) -> None:
        hooks = importlib.import_module("torch.nn.modules.module")
        self._handles.append(hooks.register_module_forward_pre_hook(self._module_pre))
        try:
            handle = hooks.register_module_forward_hook(self._module_post, always_call=True)
        except TypeError:  # torch < 2.0: no always_call
            handle = hooks.register_module_forward_hook(self._module_post)
        self._handles.append(handle)

    def _gpu_allocated(self) -> int:
        torch = self._torch
        try:
            if torch is not None and self._cuda_attached:
                d = torch.cuda.current_device()
                return int(torch._C._cuda_memoryStats(d)["allocated_bytes"]["all"]["current"])
        except Exception as exc:
            if raised_by_signal_handler(exc):  # the job's exception: it propagates, as unarmed
                raise
        return NULL

    def _name(self, module: Any, depth: int) -> str:
        name = self._names.get(module)
        if name is None:
            root = type(module).__name__
            if depth == 0:
                try:
                    for qual, sub in module.named_modules():
                        self._names.setdefault(sub, f"{root}.{qual}" if qual else root)
                except Exception as exc:
                    if raised_by_signal_handler(exc):
                        raise
            name = self._names.get(module) or root
        return name

    def _module_pre(self, module: Any, args: Any) -> None:
        try:
            local = self._local
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            name = self._name(module, depth)
            if depth == 0:
                local.t0 = self._w.event(PHASE_BEGIN, "forward")
            self._w.event(MODULE_BEGIN, name, None, -1, (self._gpu_allocated(), self._rss()))
        except Exception as exc:
            if raised_by_signal_handler(exc):  # the job's exception: it propagates, as unarmed
                raise

    def _module_post(self, module: Any, args: Any, output: Any) -> None:
        try:
            local = self._local
            depth = max(0, getattr(local, "depth", 1) - 1)
            local.depth = depth
            self._w.event(MODULE_END, self._name(module, depth), None, -1, (self._gpu_allocated(), self._rss()))
            if depth == 0:
                t0 = getattr(local, "t0", 0)
                self._w.event(PHASE_END, "forward", time.monotonic_ns() - t0 if t0 else None)
        except Exception as exc:
            if raised_by_signal_handler(exc):  # the job's exception: it propagates, as unarmed
                raise

    # ------------------------------------------------------------ CUDA
    def _attach_cuda(self, torch: Any) -> None:
        backend = "native"
        try:
            backend = torch.cuda.get_allocator_backend()
        except Exception:
            pass
        if backend != "native":
            self._note(f"allocator backend {backend!r}: no OOM observer or history (polling only)")
            return
        if expandable_segments(torch):
            self._note(fmt.NOTE_EXPANDABLE)
        self._oom_detail = self._w.intern("observer")
        self._try("OOM observer", lambda t: t._C._cuda_attach_out_of_memory_observer(self._on_oom), torch)
        if self._history_entries > 0:
            self._try("allocator history", self._start_history, torch)

    def _on_oom(self, device: int, requested: int, limit: int, free: int) -> None:
        """PyTorch's OOM observer: runs in the allocating thread before the error is raised."""
        try:
            self.oom_requests[int(device)] = int(requested)  # for the fragmentation alert (collect/alerts.py)
            payload = (self._oom_detail, int(limit), int(free))
            self._w.event(OOM, "allocator out of memory", int(requested), int(device), payload)
            if self._history_on and snapshot_safe(may_import=True):  # the dying thread may import, no other
                self.drain()
                self._dump_snapshot()
        except Exception as exc:
            if raised_by_signal_handler(exc):  # the job's exception: it propagates, as unarmed
                raise

    def _start_history(self, torch: Any) -> None:
        # context="alloc", stacks="python": each alloc entry carries the Python stack that made it, which
        # allocation sampling (gpu_blocks) keeps for the blocks it samples
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=self._history_entries
        )
        self._history_on = True
        self._counted = {d: [n, n, 0, 0, 0] for d in _devices(torch) if (n := _counted(torch, d)) is not None}
        self._next_drain = time.monotonic() + MIN_DRAIN_INTERVAL

    def drain(self) -> int:
        """Copy the allocator history entries not yet in the ring into it; returns how many."""
        torch = self._torch
        if torch is None or not self._history_on:
            return 0
        t0 = time.perf_counter()
        written = 0
        try:
            counted = {d: _counted(torch, d) for d in self._counted}  # before the snapshot: none counted late
            snapshot = torch.cuda.memory._snapshot()
            for device, trace in enumerate(snapshot.get("device_traces") or []):
                n, tallied = self._drain_device(device, trace)
                written += n
                self._tally(device, counted.get(device), tallied)
        except Exception as exc:
            self._history_on = False
            self._note(f"allocator history drain failed, history off: {type(exc).__name__}: {exc}")
        cost = time.perf_counter() - t0
        self.history_drains += 1
        self.history_events += written
        self.history_seconds += cost
        self._next_drain = time.monotonic() + max(MIN_DRAIN_INTERVAL, cost / DRAIN_DUTY)
        return written

    def _tally(self, device: int, now: int | None, drained: int) -> None:
        """Actions PyTorch counted that were never drained: lost from its history. Counted from the start
        of the history, so an entry made between the counters' reading and the snapshot (drained one drain
        before it is counted) is never taken for lost; the total only grows, and the note carries it."""
        tally = self._counted.get(device)
        if now is None or tally is None:
            return
        base, last, drained_total, lost_before, lost = tally
        if now < last:  # the job reset PyTorch's counters (reset_accumulated_memory_stats): count from here
            self._counted[device] = [now, now, 0, lost, lost]
            return
        drained_total += drained
        lost_now = max(lost, lost_before + now - base - drained_total)
        self._counted[device] = [base, now, drained_total, lost_before, lost_now]
        if lost_now > lost:
            self.history_lost += lost_now - lost
            self._w.event(MARK, fmt.NOTE_PREFIX + fmt.NOTE_HISTORY_LOST, self.history_lost)

    def _drain_device(self, device: int, trace: list[dict[str, Any]]) -> tuple[int, int]:
        """Write the entries after the last one drained; returns (written, of them COUNTED actions)."""
        last = self._last_entry.get(device)
        start = 0
        if last is not None:
            for i in range(len(trace) - 1, -1, -1):
                if _entry_key(trace[i]) == last:
                    start = i + 1
                    break
        event = self._w.event
        n = tallied = 0
        for entry in trace[start:]:
            action = entry.get("action", "")
            kind = ACTION_KINDS.get(action)
            if kind is None:
                continue
            payload = (_int(entry.get("addr")), _int(entry.get("stream")), _int(entry.get("time_us")))
            event(kind, None, _int(entry.get("size")), device, payload)
            if self._gpu_blocks is not None:
                self._gpu_blocks(device, entry)
            n += 1
            tallied += action in COUNTED
        if trace:
            self._last_entry[device] = _entry_key(trace[-1])
        return n, tallied

    def _dump_snapshot(self) -> None:
        if self._snapshot_written or self._snapshot_path is None or self._torch is None:
            return
        self._snapshot_written = True
        # What torch.cuda.memory._dump_snapshot writes, but never through a link planted at the path
        # (it opens the path with open(..., "wb")): a new file, or none.
        write_new_file(self._snapshot_path, pickle.dumps(self._torch.cuda.memory._snapshot()))

    # ------------------------------------------------------------ detaching
    def detach(self, *, final_drain: bool, in_child: bool = False) -> None:
        """Remove every hook; stop the history this recorder started (not in a forked child)."""
        if final_drain and self._history_on:
            if snapshot_safe(may_import=False):
                self.drain()
            elif not self.history_drains:
                self._note(NEVER_DRAINED)
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles.clear()
        torch = self._torch
        if torch is not None and self._our_backward is not None:
            try:
                if torch.autograd.backward is self._our_backward:
                    torch.autograd.backward = self._orig_backward
            except Exception:
                pass
        if torch is not None and self._history_on and not in_child:
            self._history_on = False
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:
                pass
        self._torch = None


NEVER_DRAINED = ("allocator history not drained: the job never loaded torch._inductor, which PyTorch's snapshot "
                 "imports (seconds, in the calling thread); the snapshot at an OOM is still written")  # fmt: skip


def snapshot_safe(*, may_import: bool) -> bool:
    """Whether the history may be read now (``torch.cuda.memory._snapshot()``). Reading the Python frames
    of its entries imports torch._inductor where the job has not (6 s on an H200 with torch 2.11, measured):
    from the sampler thread that import raced the job's own ``import torch._dynamo`` (an optimizer's
    first use), and the job died of an ImportError. So: never while any module is being imported by any
    thread, and without torch._inductor loaded only where ``may_import`` (the OOM observer, in the dying
    thread, which asked for the snapshot with ``allocator_history``)."""
    for module in list(sys.modules.values()):
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            return False
    inductor = sys.modules.get("torch._inductor")
    return may_import or inductor is not None


def expandable_segments(torch: Any) -> bool:
    """The caching allocator's ``expandable_segments`` setting: torch's own answer where it has one
    (2.12 and newer), else the environment it reads (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF)."""
    settings = ""
    try:
        settings = str(torch._C._accelerator_getAllocatorSettings())
    except Exception:
        settings = ",".join(os.environ.get(k, "") for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))
    return any(
        key.strip().lower() == "expandable_segments" and value.strip().lower() == "true"
        for key, _, value in (item.partition(":") for item in settings.split(","))
    )


def _devices(torch: Any) -> list[int]:
    try:
        return list(range(int(torch.cuda.device_count())))
    except Exception:
        return []


def _counted(torch: Any, device: int) -> int | None:
    """PyTorch's count of the history actions that have a counter (COUNTED), on one device; None where
    its statistics have no such counters (another backend, an older torch, a device not in use)."""
    try:
        stats = torch._C._cuda_memoryStats(device)
        return sum(int(stats[group]["all"][key]) for group, key in COUNTED.values())
    except Exception:
        return None


def _cuda_initialised(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def _int(v: Any) -> int:
    return int(v) if isinstance(v, int) else NULL


def _entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (entry.get("time_us"), entry.get("action"), entry.get("addr"), entry.get("size"), entry.get("stream"))
