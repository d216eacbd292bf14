"""A table-driven corpus of real OOM messages and look-alikes: classification and parsed figures."""

from __future__ import annotations

import errno

import pytest

from blackbox.collect.oom import classify, is_oom_exception, parse_oom, size_bytes

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10
G213 = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.06 GiB is "
    "free. Process 4242 has 3.00 GiB memory in use. Including non-PyTorch memory, this process has 135.50 GiB memory "
    "in use. 120.00 GiB allowed; Of the allocated memory 118.20 GiB is allocated by PyTorch, with 6.00 GiB allocated "
    "in private pools (e.g., CUDA Graphs), and 1.23 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    "  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-"
    "memory-usage-with-pytorch-cuda-alloc-conf)"
)
G21 = (
    "CUDA out of memory. Tried to allocate 6.37 GiB. GPU 0 has a total capacty of 79.11 GiB of which 2.93 GiB is "
    "free. Including non-PyTorch memory, this process has 76.17 GiB memory in use. Of the allocated memory 68.61 GiB "
    "is allocated by PyTorch, and 5.63 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
    "PYTORCH_CUDA_ALLOC_CONF"
)
G210 = (
    "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 3 has a total capacity of 23.69 GiB of which 301.94 MiB "
    "is free. Of the allocated memory 22.10 GiB is allocated by PyTorch, and 812.50 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True"
)
HIP = (
    "HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 255.98 GiB of which 244.65 GiB is "
    "free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, with 17.00 MiB allocated in "
    "private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by PyTorch but unallocated."
)
LEGACY = (
    "CUDA out of memory. Tried to allocate 152.00 MiB (GPU 0; 31.72 GiB total capacity; 24.89 GiB already allocated;"
    " 6.12 MiB free; 30.70 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
    "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
XPU = (
    "XPU out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 15.11 GiB of which 512.00 MiB is "
    "free. Of the allocated memory 13.90 GiB is allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but "
    "unallocated. Please use `empty_cache` to release all unoccupied cached memory."
)
MPS = (
    "MPS backend out of memory (MPS allocated: 7.80 GiB, other allocations: 6.94 GiB, max allowed: 18.13 GiB). Tried "
    "to allocate 3.46 GiB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit"
)
CPU = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "4611686018427387904 bytes. Error code 12 (Cannot allocate memory)"
)

# (message, expected is-OOM, expected figures: field -> bytes)
CORPUS: list[tuple[str, bool, dict[str, int]]] = [
    (
        G213,
        True,
        {
            "requested": 2 * GiB,
            "capacity": size_bytes("139.81 GiB"),
            "free": size_bytes("1.06 GiB"),
            "allocated": size_bytes("118.20 GiB"),
            "private_pools": 6 * GiB,
            "reserved_unallocated": size_bytes("1.23 GiB"),
            "allowed": 120 * GiB,
        },
    ),
    ("torch.OutOfMemoryError: " + G213, True, {"requested": 2 * GiB}),
    (
        "torch.cuda.OutOfMemoryError: " + G21,
        True,
        {
            "requested": size_bytes("6.37 GiB"),
            "capacity": size_bytes("79.11 GiB"),
            "reserved_unallocated": size_bytes("5.63 GiB"),
        },
    ),
    (
        G210,
        True,
        {"requested": 512 * MiB, "free": size_bytes("301.94 MiB"), "reserved_unallocated": size_bytes("812.50 MiB")},
    ),
    (HIP, True, {"requested": 2 * MiB, "allowed": size_bytes("1.05 GiB"), "private_pools": 17 * MiB}),
    (
        LEGACY,
        True,
        {
            "requested": 152 * MiB,
            "capacity": size_bytes("31.72 GiB"),
            "free": size_bytes("6.12 MiB"),
            "allocated": size_bytes("24.89 GiB"),
            "reserved_unallocated": size_bytes("30.70 GiB") - size_bytes("24.89 GiB"),
        },
    ),
    ("RuntimeError: " + LEGACY, True, {"requested": 152 * MiB}),
    (XPU, True, {"requested": GiB, "free": 512 * MiB, "reserved_unallocated": 100 * MiB}),
    (
        MPS,
        True,
        {"requested": size_bytes("3.46 GiB"), "capacity": size_bytes("18.13 GiB"), "allocated": size_bytes("7.80 GiB")},
    ),
    (CPU, True, {"requested": 4611686018427387904}),
    ("DefaultCPUAllocator: not enough memory: you tried to allocate 1048576 bytes.", True, {"requested": MiB}),
    (
        "CUDA out of memory. Allocation was preemptively rejected because it would exceed per_process_memory_fraction "
        "limit. Requested size: 4.00 GiB",
        True,
        {"requested": 4 * GiB},
    ),
    ("CUDA out of memory. Tried to allocate more than 1EB memory.", True, {}),
    (  # cudaMallocAsync's, word for word as torch 2.11 raised it on an H200 (tools/gpu_check.py, docs/gpu.md)
        "Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated     : 0 bytes\n"
        "Requested               : 279.60 GiB\nDevice limit            : 139.80 GiB\n"
        "Free (according to CUDA): 3.12 MiB\nPyTorch limit (set by user-supplied memory fraction)\n"
        "                        : 17179869184.00 GiB",
        True,
        {"requested": size_bytes("279.60 GiB"), "capacity": size_bytes("139.80 GiB"), "free": size_bytes("3.12 MiB"),
         "allocated": 0, "device": 0},
    ),
    (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 3725.29 GiB. GPU",
        True,
        {"requested": size_bytes("3725.29 GiB")},
    ),
    (
        "CUDA out of memory. Tried to allocate 130206.04 GiB. GPU 0 has a total capacity of 79.10 GiB of which 78.50 "
        "GiB is free.",
        True,
        {"requested": size_bytes("130206.04 GiB"), "free": size_bytes("78.50 GiB")},
    ),
    (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 1 has a total capacity of 10.75 GiB of which 0 bytes "
        "is free.",
        True,
        {"free": 0, "requested": 20 * MiB},
    ),
    (
        "CUDA out of memory. Tried to allocate 512 bytes. GPU 0 has a total capacity of 8.00 GiB of which 1020.00 KiB "
        "is free.",
        True,
        {"requested": 512, "free": 1020 * KiB},
    ),
    (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7406166528 "
        "bytes.",
        True,
        {"requested": 7406166528},
    ),
    ("RESOURCE_EXHAUSTED: Out of memory allocating 20029400304 bytes.", True, {"requested": 20029400304}),
    (
        "RESOURCE_EXHAUSTED: Failed to allocate request for 2.99GiB (3206250496B) on device ordinal 0",
        True,
        {"requested": 3206250496},
    ),
    ("RuntimeError: Resource exhausted: Out of memory while trying to allocate 24 bytes.", True, {"requested": 24}),
    (
        "ResourceExhaustedError: OOM when allocating tensor with shape[128,128,109,109] and type float on "
        "/job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc",
        True,
        {},
    ),
    ("OOM when allocating tensor of shape [] and type float", True, {}),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True, {}),
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True, {}),
    ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported", True, {}),
    ("RuntimeError: HIP error: out of memory", True, {}),
    ("cudaErrorMemoryAllocation: out of memory", True, {}),
    ("CUDA_ERROR_OUT_OF_MEMORY: out of memory", True, {}),
    ("hipErrorOutOfMemory", True, {}),
    ("OSError: [Errno 12] Cannot allocate memory", True, {}),
    ("terminate called after throwing an instance of 'std::bad_alloc'", True, {}),
    # look-alikes: must not read as OOMs
    ("failed to allocate seat in queue", False, {}),
    ("Quota resource exhausted: too many requests", False, {}),
    ("allocation failed: no free slot in pool", False, {}),
    ("RuntimeError: DataLoader worker (pid 11635) is killed by signal: Killed. ", False, {}),
    ("ValueError: memory_format out of range", False, {}),
    ("Disk quota exceeded: out of space on /scratch", False, {}),
    ("KeyError: 'allocated_bytes.all.current'", False, {}),
    ("The batch is out of memory-aligned bounds", False, {}),
    ("RESOURCE_EXHAUSTED: rate limit exceeded for project", False, {}),
    ("CUDA error: device-side assert triggered", False, {}),
    ("torch.cuda.OutOfMemoryError is importable", False, {}),
    ("NCCL error: unhandled system error, remote process exited", False, {}),
]


def test_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 40
    assert sum(not oom for _, oom, _ in CORPUS) >= 10


@pytest.mark.parametrize("message,is_oom,figures", CORPUS, ids=[f"{i:02d}" for i in range(len(CORPUS))])
def test_message_classification_and_figures(message: str, is_oom: bool, figures: dict[str, int]) -> None:
    parsed = parse_oom(message)
    assert (parsed is not None) == is_oom
    assert is_oom_exception(RuntimeError(message)) == is_oom
    for field, expected in figures.items():
        assert parsed is not None and parsed[field] == expected, field


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (same name, RuntimeError base), so this test needs no torch."""


class ResourceExhaustedError(Exception):
    """TensorFlow's class: an OOM only with its OOM text."""


@pytest.mark.parametrize(
    "exc,kind",
    [
        (MemoryError(), "oom"),
        (OutOfMemoryError("anything at all"), "oom"),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), "oom"),
        (OSError(errno.ENOSPC, "No space left on device"), "exception"),
        (ResourceExhaustedError("OOM when allocating tensor with shape[2] and type float"), "oom"),
        (ResourceExhaustedError("Quota resource exhausted"), "exception"),
        (ValueError("failed to allocate seat in queue"), "exception"),
    ],
)
def test_exception_types(exc: BaseException, kind: str) -> None:
    assert classify(exc)[0] == kind


def test_oom_wrapped_as_cause_or_context_is_found() -> None:
    try:
        try:
            raise OutOfMemoryError(G213)
        except RuntimeError as inner:
            raise ValueError("step failed") from inner
    except ValueError as outer:
        kind, label, wrapper = classify(outer)
    assert kind == "oom" and label.endswith(G213) and wrapper.endswith("ValueError: step failed")
    try:
        try:
            raise MemoryError("host")
        except MemoryError:
            raise RuntimeError("while handling") from None  # context kept, cause suppressed
    except RuntimeError as outer:
        assert classify(outer)[0] == "oom"


def test_self_referencing_chain_terminates() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert classify(a) == ("exception", "ValueError: a", "")
