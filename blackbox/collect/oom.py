"""Out-of-memory errors: which exceptions are OOMs, and the figures in their messages.

Pure functions, no torch: the recorder classifies exceptions as they happen,
and recovery parses the recorded messages (``parse_oom``) where torch may not
be installed. The message formats are PyTorch's (every version's layout),
MPS, XPU, PyTorch's CPU allocator, JAX/XLA, TensorFlow, cuBLAS/cuDNN, CUDA
runtime errors and the C library's ENOMEM text.
"""

from __future__ import annotations

import errno
import re
from typing import Any

SIZE = r"\d+(?:\.\d+)? ?(?:bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)"
_UNITS = {
    "bytes": 1,
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 1 << 10,  # MPS prints binary multiples with these names
    "MB": 1 << 20,
    "GB": 1 << 30,
    "TB": 1 << 40,
}
MAX_CHAIN = 16
# characters of an exception's message searched for an out-of-memory error's words (a wrapped worker's
# traceback included): a 50 MiB message took the excepthook 13 to 28 s, at the job's death
MAX_OOM_TEXT = 256 << 10

# Messages that mean "memory ran out". Each names its allocator, so look-alikes
# ("failed to allocate seat in queue", "Quota resource exhausted") do not match.
_OOM_TEXT = re.compile(
    "|".join(
        [
            r"\b(?:CUDA|HIP|XPU) out of memory\b",
            r"\bAllocation on device \d+ would exceed allowed memory\. \(out of memory\)",
            r"\bMPS backend out of memory\b",
            r"\bDefaultCPUAllocator: (?:can't allocate memory|not enough memory)",
            r"\bRESOURCE_EXHAUSTED: (?:Out of memory|Failed to allocate request)",
            r"\bResource exhausted: Out of memory",
            r"\bOOM when allocating tensor\b",
            r"\bCUBLAS_STATUS_ALLOC_FAILED\b",
            r"\bCUDNN_STATUS_ALLOC_FAILED\b",
            r"\b(?:CUDA|HIP) error: out of memory\b",
            r"\b(?:cudaErrorMemoryAllocation|hipErrorOutOfMemory|CUDA_ERROR_OUT_OF_MEMORY)\b",
            r"\bCuda failure 'out of memory'",  # NCCL's "Last error" of an ncclUnhandledCudaError
            r"\[Errno 12\] Cannot allocate memory",
            r"\bstd::bad_alloc\b",
        ]
    )
)
# A device's out-of-memory met outside PyTorch's caching allocator (its context, cuBLAS's or cuDNN's workspace,
# NCCL's buffers, a launch): the CUDA runtime's or a library's status, with no figure to read
_DEVICE_OOM_TEXT = re.compile(
    r"\b(?:CUDA|HIP) error: out of memory\b|\b(?:CUBLAS|CUDNN)_STATUS_ALLOC_FAILED\b"
    r"|\b(?:cudaErrorMemoryAllocation|hipErrorOutOfMemory|CUDA_ERROR_OUT_OF_MEMORY)\b|\bCuda failure 'out of memory'"
)
_OOM_CLASS_NAMES = frozenset({"OutOfMemoryError", "ResourceExhaustedError"})

# ---------------------------------------------------------------- parsing
_GPU = re.compile(
    r"(?P<backend>CUDA|HIP|XPU) out of memory\. Tried to allocate (?P<requested>" + SIZE + r")\."
    r"(?: GPU (?P<device>\d+) has a total capac(?:i)?ty of (?P<capacity>" + SIZE + r") of which "
    r"(?P<free>" + SIZE + r") is free\.)?"
)
_GPU_ALLOWED = re.compile(r"(?P<allowed>" + SIZE + r") allowed;")
_GPU_ALLOCATED = re.compile(r"Of the allocated memory (?P<allocated>" + SIZE + r") is allocated by PyTorch")
_GPU_PRIVATE = re.compile(r"with (?P<private_pools>" + SIZE + r") allocated in private pools")
_GPU_UNALLOCATED = re.compile(r"and (?P<reserved_unallocated>" + SIZE + r") is reserved by PyTorch but unallocated")
_GPU_LEGACY = re.compile(
    r"(?P<backend>CUDA|HIP) out of memory\. Tried to allocate (?P<requested>" + SIZE + r") \(GPU (?P<device>\d+); "
    r"(?P<capacity>" + SIZE + r") total capacity; (?P<allocated>" + SIZE + r") already allocated; "
    r"(?P<free>" + SIZE + r") free; (?:(?P<allowed>" + SIZE + r") allowed; )?"
    r"(?P<reserved>" + SIZE + r") reserved in total by PyTorch\)"
)
_PREEMPTIVE = re.compile(
    r"(?P<backend>CUDA|HIP) out of memory\. Allocation was preemptively rejected.*?"
    r"Requested size: (?P<requested>" + SIZE + r")"
)
# cudaMallocAsync's (PyTorch's CUDAMallocAsyncAllocator.cpp), one figure a line, as seen on an H200, torch 2.11
_ASYNC = re.compile(r"Allocation on device (?P<device>\d+) would exceed allowed memory\. \(out of memory\)")
_ASYNC_FIGURES = {
    "allocated": re.compile(r"Currently allocated\s*: (?P<allocated>" + SIZE + ")"),
    "requested": re.compile(r"Requested\s*: (?P<requested>" + SIZE + ")"),
    "capacity": re.compile(r"Device limit\s*: (?P<capacity>" + SIZE + ")"),
    "free": re.compile(r"Free \(according to CUDA\)\s*: (?P<free>" + SIZE + ")"),
}
_MPS = re.compile(
    r"MPS backend out of memory \(MPS allocated: (?P<allocated>" + SIZE + r"), other allocations: "
    r"(?P<other>" + SIZE + r"), max allowed: (?P<capacity>" + SIZE + r")\)\. "
    r"Tried to allocate (?P<requested>" + SIZE + r")"
)
_CPU = re.compile(
    r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate "
    r"(?P<requested>\d+) bytes"
)
_XLA = re.compile(
    r"(?:Out of memory while trying to allocate (?P<a>\d+) bytes|Out of memory allocating (?P<b>\d+) bytes"
    r"|Failed to allocate request for \S+ \((?P<c>\d+)B\) on device ordinal (?P<device>\d+))"
)
_TF = re.compile(r"OOM when allocating tensor (?:with|of) shape ?\[(?P<shape>[\d, ]*)\] and type (?P<dtype>\w+)")

DEVICE_BACKENDS = frozenset({"CUDA", "HIP", "XPU", "MPS"})
OOM_FIELDS = ("requested", "capacity", "free", "allocated", "reserved_unallocated", "private_pools", "allowed")


def size_bytes(text: str) -> int:
    """``"2.00 GiB"`` -> 2147483648 (two printed decimals: about 0.5% of a unit of error)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?) ?(\w+)", text.strip())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"expected a size such as '2.00 GiB', found {text!r}")
    return round(float(m.group(1)) * _UNITS[m.group(2)])


def is_oom_text(message: str) -> bool:
    """True when a message reads as an out-of-memory error of some framework."""
    return _OOM_TEXT.search(message) is not None


def on_device(message: str) -> bool:
    """True when an out-of-memory message is an accelerator's (CUDA, HIP, XPU, MPS), figures or not."""
    return is_device_oom_text(message) or (parse_oom(message) or {}).get("backend") in DEVICE_BACKENDS


def is_device_oom_text(message: str) -> bool:
    """True when a message is a GPU's out-of-memory met outside PyTorch's caching allocator (the CUDA or HIP
    runtime's status, cuBLAS's, cuDNN's, NCCL's): a device's memory, though the message gives no figure."""
    return _DEVICE_OOM_TEXT.search(message) is not None


def parse_oom(message: str) -> dict[str, Any] | None:
    """The figures of an OOM message, in bytes (None where the message has no such figure).

    Returns None when the message is not an out-of-memory message. Keys:
    ``backend``, ``device`` and the byte counts in ``OOM_FIELDS``.
    """
    if not is_oom_text(message):
        return None
    out: dict[str, Any] = dict.fromkeys(OOM_FIELDS)
    out["backend"] = None
    out["device"] = None

    def take(m: re.Match[str] | None, *names: str) -> None:
        if m is None:
            return
        for name in names:
            v = m.groupdict().get(name)
            if v is not None:
                out[name] = size_bytes(v)

    if m := _GPU_LEGACY.search(message):
        out["backend"], out["device"] = m["backend"], int(m["device"])
        take(m, "requested", "capacity", "allocated", "free", "allowed")
        reserved = size_bytes(m["reserved"])
        out["reserved_unallocated"] = max(0, reserved - (out["allocated"] or 0))
    elif m := _GPU.search(message):
        out["backend"] = m["backend"]
        out["device"] = int(m["device"]) if m["device"] else None
        take(m, "requested", "capacity", "free")
        take(_GPU_ALLOWED.search(message), "allowed")
        take(_GPU_ALLOCATED.search(message), "allocated")
        take(_GPU_PRIVATE.search(message), "private_pools")
        take(_GPU_UNALLOCATED.search(message), "reserved_unallocated")
    elif m := _ASYNC.search(message):
        out["backend"], out["device"] = "CUDA", int(m["device"])
        for name, pattern in _ASYNC_FIGURES.items():
            take(pattern.search(message), name)
    elif m := _PREEMPTIVE.search(message):
        out["backend"] = m["backend"]
        take(m, "requested")
    elif m := _MPS.search(message):
        out["backend"] = "MPS"
        take(m, "requested", "capacity", "allocated")
    elif m := _CPU.search(message):
        out["backend"], out["requested"] = "CPU", int(m["requested"])
    elif m := _XLA.search(message):
        out["backend"] = "XLA"
        out["requested"] = int(m["a"] or m["b"] or m["c"])
        out["device"] = int(m["device"]) if m["device"] else None
    elif _TF.search(message):
        out["backend"] = "TensorFlow"
    return out


# ---------------------------------------------------------------- exceptions
def describe(exc: BaseException) -> str:
    """``Type: message`` as a traceback's last line prints it."""
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable message>"
    return f"{name}: {text}" if text else name


def is_oom_exception(exc: BaseException) -> bool:
    """This exception itself (not its chain) is an out-of-memory error."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    try:
        text = str(exc)[:MAX_OOM_TEXT]
    except Exception:
        text = ""
    if any(c.__name__ in _OOM_CLASS_NAMES for c in type(exc).__mro__):
        # torch.OutOfMemoryError is always one; TensorFlow's ResourceExhaustedError only with its OOM text
        return type(exc).__name__ == "OutOfMemoryError" or is_oom_text(text)
    return is_oom_text(text)


def find_oom(exc: BaseException) -> BaseException | None:
    """The first OOM in the exception or its causes/contexts (an OOM wrapped in another error)."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < MAX_CHAIN:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if is_oom_exception(e):
            return e
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return None


def classify(exc: BaseException) -> tuple[str, str, str]:
    """(kind, label, wrapper): kind ``oom`` or ``exception``; the label describes the OOM
    when one is in the chain; ``wrapper`` describes the outer exception when it differs."""
    oom = find_oom(exc)
    if oom is None:
        return "exception", describe(exc), ""
    return "oom", describe(oom), ("" if oom is exc else describe(exc))
