"""Benchmarks for the ring: mark() cost, recover throughput and size, arm latency.

    .venv/bin/python tools/bench_ring.py [--quick] [--mark]

``--mark`` measures only the write path. ``blackbox.mark`` is also measured while no ring is armed (never
armed, and after ``disarm()``), beside an empty two-argument call into the C extension and beside the armed
call, in the same run. Each write path is measured twice, side by side: as armed (the
ring mapped through a 256 KiB write window, ring/_cwriter.c) and with the whole ring mapped, as it was
before the window (pre-faulted, never unmapped): the difference is what the window costs per event.

Everything is measured side by side in one run; each figure is the median of
several runs. Prints a Markdown table at the end (the one in docs/performance.md).
"""

from __future__ import annotations

import collections
import ctypes
import importlib.util
import mmap
import os
import platform
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import blackbox  # noqa: E402
from blackbox._postmortem import write_postmortem  # noqa: E402
from blackbox.recovery.bundle import TIMELINE  # noqa: E402
from blackbox.ring.reader import read_header  # noqa: E402


def per_call_ns(fn: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def whole_ring_mapped(rec: blackbox.Recorder) -> blackbox.Recorder:
    """The ring as it was before the write window: every page mapped (pre-faulted), none ever unmapped."""
    ring, writer = rec._ring, rec._writer  # noqa: SLF001 (a benchmark of the recorder's insides)
    assert ring is not None and writer is not None and writer.sequence is not None
    writer.sequence.close_window()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(ring.map.addr, len(ring.map), getattr(mmap, "MADV_POPULATE_WRITE", 23)) != 0:
        view = ring.map.buffer  # a kernel before 5.14: touch every page
        for off in range(0, len(ring.map), mmap.PAGESIZE):
            view[off] = view[off]
    return rec


_empty_c = types.ModuleType("empty_c")
EMPTY_C_CALL = "empty call into the C extension, two args (a disarmed Writer.mark)"


def interleaved(cases: dict[str, Callable[[int], None]], n: int, runs: int) -> dict[str, float]:
    """Median ns per call of each case, the cases interleaved run by run so drift hits every case alike."""
    results: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        fn(10_000)  # warm-up
    for _ in range(runs):
        for name, fn in cases.items():
            results[name].append(per_call_ns(fn, n))
    return {name: statistics.median(v) for name, v in results.items()}


def bench_unarmed(tmp: Path, n: int, runs: int) -> dict[str, float]:
    """``blackbox.mark`` never armed, then after ``disarm()``, each beside the same two-argument call into the
    C extension that returns at once, and beside the armed call (``blackbox.mark`` armed is ``Recorder.mark``)."""
    armed = blackbox.Recorder.arm(tmp / "armed.ring", capacity=1 << 18, sample_interval=3600)
    dead = blackbox.Recorder.arm(tmp / "dead.ring", capacity=1 << 18, sample_interval=3600)
    vars(_empty_c)["mark"] = dead.mark  # called as blackbox.mark is: a module global's attribute
    dead.disarm()  # its writer is dead: a call checks that and returns None

    def module_mark(k: int) -> None:
        for i in range(k):
            blackbox.mark("loss", i)

    def armed_mark(k: int) -> None:
        mark = armed.mark
        for i in range(k):
            mark("loss", i)

    def empty_c_call(k: int) -> None:
        for i in range(k):
            _empty_c.mark("loss", i)

    figures = {}
    assert not blackbox.active().armed
    for when, case in (("never armed", "blackbox.mark(label, value), never armed"),
                       ("after disarm()", "blackbox.mark(label, value), after disarm()")):  # fmt: skip
        if when == "after disarm()":
            blackbox.arm(tmp / "module.ring", capacity=1 << 18, sample_interval=3600)
            blackbox.mark("loss", 1)
            blackbox.disarm()
        got = interleaved({case: module_mark, EMPTY_C_CALL: empty_c_call, "armed": armed_mark}, n, runs)
        figures[case] = got[case]
        figures[f"{case}: ratio to the empty C call, same run"] = got[case] / got[EMPTY_C_CALL]
        figures[f"{case}: ratio to the armed call, same run"] = got[case] / got["armed"]
        figures[f"{EMPTY_C_CALL} ({when} run)"] = got[EMPTY_C_CALL]
    armed.disarm()
    return figures


def bench_mark(tmp: Path, n: int, runs: int) -> dict[str, float]:
    rec = blackbox.arm(tmp / "mark.ring", capacity=1 << 18, sample_interval=3600)
    whole = whole_ring_mapped(blackbox.Recorder.arm(tmp / "whole.ring", capacity=1 << 18, sample_interval=3600))
    os.environ["BLACKBOX_WRITER"] = "python"
    py_rec = blackbox.Recorder.arm(tmp / "mark-py.ring", capacity=1 << 18, sample_interval=3600)
    py_whole = whole_ring_mapped(blackbox.Recorder.arm(tmp / "whole-py.ring", capacity=1 << 18, sample_interval=3600))
    del os.environ["BLACKBOX_WRITER"]
    deque_: collections.deque[dict[str, object]] = collections.deque(maxlen=1 << 18)
    monotonic_ns = time.monotonic_ns

    def module_mark(k: int) -> None:
        for i in range(k):
            blackbox.mark("loss", i)

    def recorder_mark(k: int) -> None:
        mark = rec.mark
        for i in range(k):
            mark("loss", i)

    def python_mark(k: int) -> None:
        mark = py_rec.mark
        for i in range(k):
            mark("loss", i)

    def whole_mark(k: int) -> None:
        mark = whole.mark
        for i in range(k):
            mark("loss", i)

    def python_whole_mark(k: int) -> None:
        mark = py_whole.mark
        for i in range(k):
            mark("loss", i)

    def deque_dict(k: int) -> None:
        append = deque_.append
        for i in range(k):
            append({"kind": "mark", "label": "loss", "value": i, "time": monotonic_ns()})

    def empty(k: int) -> None:
        for _ in range(k):
            pass

    cases: dict[str, Callable[[int], None]] = {
        "blackbox.mark(label, value)": module_mark,
        f"Recorder.mark(label, value), {rec.writer_backend} path": recorder_mark,
        f"Recorder.mark(label, value), {rec.writer_backend} path, whole ring mapped (no write window)": whole_mark,
        "Recorder.mark(label, value), pure-Python path": python_mark,
        "Recorder.mark(label, value), pure-Python path, whole ring mapped (no write window)": python_whole_mark,
        "deque.append(dict) (in memory, not crash-safe)": deque_dict,
        "empty loop": empty,
    }
    results = interleaved(cases, n, runs)
    blackbox.disarm()
    for other in (whole, py_rec, py_whole):
        other.disarm()
    return results


def typical_ring(path: Path, events: int, capacity: int = 1 << 20) -> Path:
    """A training-loop-shaped ring of ``capacity`` slots: steps, three phases, a loss mark, host samples."""
    rec = blackbox.Recorder.arm(path, capacity=capacity, sample_interval=0.005)
    step = 0
    while True:
        rec.step()
        for name in ("forward", "backward", "optimizer"):
            with rec.phase(name):
                pass
        rec.mark("loss", 1000 - step % 1000)
        step += 1
        if step * 8 >= events:
            break
    rec.disarm()
    return path


def parquet_floor(ring: Path, rows: int, path: Path) -> float:
    """The floor recovery is held to: the same number of rows, 12 int64 columns (the first 12 words of the
    ring's slots, as they lie in the file), written by pyarrow to Parquet (zstd) from memory: nothing
    validated, decoded or diagnosed. Seconds (the write only)."""
    return parquet_floor_cpu(ring, rows, path)[0]


def parquet_floor_cpu(ring: Path, rows: int, path: Path) -> tuple[float, float]:
    """:func:`parquet_floor`'s write: (seconds, CPU seconds of the process meanwhile)."""
    header = read_header(ring)
    words = np.fromfile(ring, np.int64, rows * 16, offset=header.records_offset).reshape(-1, 16)
    table = pa.table({f"w{i}": np.ascontiguousarray(words[:, i]) for i in range(12)})
    del words
    t0, c0 = time.perf_counter(), time.process_time()
    pq.write_table(table, path, compression="zstd")
    return time.perf_counter() - t0, time.process_time() - c0


def bench_recover(tmp: Path, runs: int, events: int) -> dict[str, float]:
    ring = typical_ring(tmp / "full.ring", events)
    times, plotted, sizes, counts, floors = [], [], [], [], []
    for r in range(runs):  # interleaved: without and with the picture (matplotlib is an optional extra), the floor
        out = tmp / f"bundle{r}"
        t0 = time.perf_counter()
        meta = write_postmortem([ring], out, plot=False)
        times.append(time.perf_counter() - t0)
        counts.append(meta["events"])
        sizes.append((out / TIMELINE).stat().st_size)
        floors.append(parquet_floor(ring, meta["events"], tmp / f"floor{r}.parquet"))
        if importlib.util.find_spec("matplotlib") is not None:
            t0 = time.perf_counter()
            write_postmortem([ring], tmp / f"plotted{r}", plot=True)
            plotted.append(time.perf_counter() - t0)
    n = counts[0]
    t = statistics.median(times)
    tp = statistics.median(plotted) if plotted else float("nan")
    ratios = [ours / floor for ours, floor in zip(times, floors, strict=True)]  # each run beside its own floor
    return {
        "events": n,
        "seconds": t,
        "events_per_s": n / t,
        "floor_seconds": statistics.median(floors),
        "times_floor": statistics.median(ratios),
        "seconds_with_png": tp,
        "parquet_bytes_per_event": statistics.median(sizes) / n,
    }


def bench_arm(tmp: Path, runs: int) -> float:
    times = []
    for r in range(runs):
        t0 = time.perf_counter()
        rec = blackbox.Recorder.arm(tmp / f"arm{r}.ring", capacity=1 << 19, sample_interval=3600)  # 64 MiB
        times.append(time.perf_counter() - t0)
        assert rec.armed
        rec.disarm()
        os.unlink(tmp / f"arm{r}.ring")
    return statistics.median(times)


def main() -> int:
    quick = "--quick" in sys.argv
    only_mark = "--mark" in sys.argv
    n, runs = (50_000, 3) if quick else (300_000, 9)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        tmp = Path(d)
        unarmed = bench_unarmed(tmp, n, runs)
        marks = bench_mark(tmp, n, runs)
        if not only_mark:
            rec = bench_recover(tmp, 3 if quick else 5, 100_000 if quick else 1_000_000)
            arm_s = bench_arm(tmp, 3 if quick else 7)
    base = marks["deque.append(dict) (in memory, not crash-safe)"]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )
    print("\n| measure | median | note |\n|---|---:|---|")
    for name, v in marks.items():
        note = f"{v / base:.2f}x deque" if "deque" not in name else "reference"
        print(f"| {name} | {v:.0f} ns/call | {note} |")
    for name, v in unarmed.items():
        if "ratio" in name:
            print(f"| {name} | {v:.2f}x | measured side by side |")
        else:
            print(f"| {name} | {v:.0f} ns/call | {v / base:.2f}x deque |")
    if only_mark:
        return 0
    print(
        f"| recover {rec['events']:,.0f} events (ring to bundle, no picture) | {rec['seconds']:.2f} s | "
        f"{rec['events_per_s'] / 1e6:.2f} M events/s |"
    )
    print(
        f"| the floor: {rec['events']:,.0f} rows of 12 int64 columns to Parquet (zstd) by pyarrow | "
        f"{rec['floor_seconds']:.2f} s | recover is {rec['times_floor']:.2f}x the floor (median of per-run ratios) |"
    )
    print(
        f"| recover with memory.png (matplotlib installed) | {rec['seconds_with_png']:.2f} s | "
        f"{rec['events'] / rec['seconds_with_png'] / 1e6:.2f} M events/s |"
    )
    print(f"| timeline.parquet size | {rec['parquet_bytes_per_event']:.1f} B/event | typical training timeline |")
    print(f"| arm() of a 64 MiB ring | {arm_s * 1e3:.1f} ms | fallocate + page cache filled + header |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
