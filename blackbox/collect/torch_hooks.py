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
observer would initialise it):

- the allocator's OOM observer: an ``oom`` event with device, requested bytes,
  limit and free bytes, before the exception unwinds;
- opt-in allocator history (``allocator_history``): PyTorch's bounded history,
  drained into the ring as alloc / free / segment events, and on the first OOM
  PyTorch's snapshot pickle beside the ring for its memory viewer
  (https://pytorch.org/memory_viz).

Every hook swallows its own errors: the job's call always proceeds. An exception raised by the job's
own signal handler while a hook ran is the job's: it propagates (``_jobsignal.py``).
"""

from __future__ import annotations

import importlib
import pickle
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
ACTION_KINDS = {name: fmt.KIND_CODES[name] for name in fmt.ALLOCATOR_KINDS if name != "free"}
ACTION_KINDS["free_completed"] = fmt.KIND_CODES["free"]
DEFAULT_HISTORY_ENTRIES = 10_000
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
            if not self._cuda_attached and _cuda_initialised(torch):
                self._cuda_attached = True
                self._attach_cuda(torch)
        if self._history_on and time.monotonic() >= self._next_drain:
            self.drain()

    def _attach(self, torch: Any) -> None:
        self._try("optimizer step hooks", self._attach_optimizer, torch)
        self._try("backward phase", self._attach_backward, torch)
        if self._modules:
            self._try("module hooks", self._attach_modules, torch)

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
        self._oom_detail = self._w.intern("observer")
        self._try("OOM observer", lambda t: t._C._cuda_attach_out_of_memory_observer(self._on_oom), torch)
        if self._history_entries > 0:
            self._try("allocator history", self._start_history, torch)

    def _on_oom(self, device: int, requested: int, limit: int, free: int) -> None:
        """PyTorch's OOM observer: runs in the allocating thread before the error is raised."""
        try:
            payload = (self._oom_detail, int(limit), int(free))
            self._w.event(OOM, "allocator out of memory", int(requested), int(device), payload)
            if self._history_on:
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
        self._next_drain = time.monotonic() + MIN_DRAIN_INTERVAL

    def drain(self) -> int:
        """Copy the allocator history entries not yet in the ring into it; returns how many."""
        torch = self._torch
        if torch is None or not self._history_on:
            return 0
        t0 = time.perf_counter()
        written = 0
        try:
            snapshot = torch.cuda.memory._snapshot()
            for device, trace in enumerate(snapshot.get("device_traces") or []):
                written += self._drain_device(device, trace)
        except Exception as exc:
            self._history_on = False
            self._note(f"allocator history drain failed, history off: {type(exc).__name__}: {exc}")
        cost = time.perf_counter() - t0
        self.history_drains += 1
        self.history_events += written
        self.history_seconds += cost
        self._next_drain = time.monotonic() + max(MIN_DRAIN_INTERVAL, cost / DRAIN_DUTY)
        return written

    def _drain_device(self, device: int, trace: list[dict[str, Any]]) -> int:
        last = self._last_entry.get(device)
        start = 0
        if last is not None:
            for i in range(len(trace) - 1, -1, -1):
                if _entry_key(trace[i]) == last:
                    start = i + 1
                    break
        event = self._w.event
        n = 0
        for entry in trace[start:]:
            kind = ACTION_KINDS.get(entry.get("action", ""))
            if kind is None:
                continue
            payload = (_int(entry.get("addr")), _int(entry.get("stream")), _int(entry.get("time_us")))
            event(kind, None, _int(entry.get("size")), device, payload)
            if self._gpu_blocks is not None:
                self._gpu_blocks(device, entry)
            n += 1
        if trace:
            self._last_entry[device] = _entry_key(trace[-1])
        return n

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
            self.drain()
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


def _cuda_initialised(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def _int(v: Any) -> int:
    return int(v) if isinstance(v, int) else NULL


def _entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (entry.get("time_us"), entry.get("action"), entry.get("addr"), entry.get("size"), entry.get("stream"))
