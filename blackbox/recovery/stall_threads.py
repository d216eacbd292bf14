"""The other threads of a stalled process: which one its main thread waited for, and where that one was.

Pure functions over a ring's timeline, for ``recovery.hang``. Once the main thread's stack has stood still
for 2 s the recorder samples every thread once a second, and, where the main thread is inside a thread's
``join``, marks which one (``blackbox joins: NAME``, collect/stacks.py). A stall's ``threads`` are those
threads' most sampled stacks; the thread waited for is named where it is known: the joined one, else, in a
queue's get or a future's wait, the one thread stuck at the job's own code (where no thread of the job had
died of an exception: a dead producer and a logger's sleeping loop would read as that logger stuck).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..ring import format as fmt
from .allocs import is_job_frame, is_stdlib_frame, site_of
from .kinds import of_kind
from .timeline import iso_ns

BUSY_SHARE = 0.5  # a stall whose most sampled stack is under this share of 4 or more samples was busy, not stuck
BUSY_MOVES = 0.1  # or whose stack changed between this share of its consecutive samples (at least 3 times): an
# evaluation's loop spends most samples in one op (a matmul) yet keeps moving; a stuck process moves once at most

# a wait for another process of the job: multiprocessing's pipes, queues, pool and locks, a future, a DataLoader's
# wait for a batch; what waits there is not what is stuck (a Pool's main and its idle worker wait for the one stuck)
_IPC_WAIT = re.compile(r"/multiprocessing/(?:connection|queues|pool|synchronize|managers)\.py|/concurrent/futures/|"
                       r"/torch/utils/data/dataloader\.py")  # fmt: skip
# a thread waiting for another thread: a join, a queue, an event or condition, a future
_THREAD_WAIT = re.compile(r"/threading\.py:|/queue\.py:|/concurrent/futures/")
# the main thread waiting for a thread of its own to end or deliver: a join, a queue's get, a future (an event's
# or a lock's wait names no thread: a watchdog polling beside it is not what it waits for)
_THREAD_JOIN = re.compile(r"(?:^|\.)join \([^;]*/threading\.py:")
_JOIN = re.compile(r"(?:^|\.)join \([^;]*/threading\.py:|(?:^|\.)get \([^;]*/queue\.py:|/concurrent/futures/_base\.py:")
_DIED = "uncaught in thread "  # an exception record's detail where a thread of the process died of it
ERROR_SAID = 160  # characters of a dead thread's exception said in a headline (the job's own text)
SHOWN_THREADS = 3  # other threads of a stalled process kept in its ``hang``
LAST_ROWS = 4096  # the last rows of a kind read for them: about 4 minutes of 16 threads sampled once a second


def waits_for_others(stack: str | None) -> bool:
    """The folded stack waits for another process of the job (``_IPC_WAIT``), with no frame of the job's own
    code deeper than that wait (a Pool worker running the job's task has the pool's frames above it)."""
    return bool(stack) and innermost_is(str(stack).split(";"), _IPC_WAIT)


def innermost_is(frames: list[str], where: re.Pattern[str]) -> bool:
    """Some frame matches ``where`` and none deeper is the job's own code."""
    deepest = max((i for i, f in enumerate(frames) if where.search(f)), default=-1)
    return deepest >= 0 and not any(map(is_job_frame, frames[deepest + 1 :]))


def busy(samples: int, share: float, moves: int) -> bool:
    """Of 4 samples or more, the most sampled stack under ``BUSY_SHARE``, or moves in ``BUSY_MOVES`` of them."""
    return samples >= 4 and (share < BUSY_SHARE or moves >= max(3, BUSY_MOVES * samples))


def with_threads(table: pa.Table, since_ns: int, end_ns: int, st: dict[str, Any]) -> dict[str, Any]:
    """``st`` with ``threads``: the process's other threads sampled in the stall (all are, once the main
    thread's stack stood still for 2 s: collect/stacks.py), each with its most sampled stack since: ``thread``
    (its name), ``stack``, ``site`` (its innermost frame of the job's own code, else a library's, else null),
    ``samples``, ``share``, ``moves``, ``stuck`` (a site, not busy, not waiting for another process: a
    DataLoader's pin-memory thread waits for the workers), ``joined`` (the main thread was inside its ``join``:
    the recorder's ``blackbox joins:`` mark); the joined first, then the stuck, the job's own code before a
    library's, one not itself waiting for another thread first; ``SHOWN_THREADS`` at most. ``joins``: the main
    thread waited for a thread of its own (a join, a queue's get, a future, with none of the job's code deeper;
    not for a DataLoader's batch, not in a collective). Where it is known which (``joined``: the joined
    thread, else, for a queue or a future, one thread alone stuck at the job's own code and none of its
    threads dead of an exception: ``thread_died``), that one is named, and the process waited for no other
    (``waits`` false). ``dead_thread``: where it waited for a thread of its own and some thread had died of an
    exception, the last to die: ``thread``, ``error``, ``step``, ``time`` (a producer dead, its queue empty).
    """
    rows = of_kind(table, "stack_sample", columns=["time", "thread", "label", "detail"])
    rows = _window(rows, since_ns, end_ns, pc.not_equal(rows["label"].cast(pa.string()), "MainThread"))
    per: dict[Any, tuple[Any, list[str]]] = {}
    for ident, name, detail in zip(rows["thread"].to_pylist(), rows["label"].cast(pa.string()).to_pylist(),
                                   rows["detail"].cast(pa.string()).to_pylist(), strict=True):  # fmt: skip
        if detail:
            per.setdefault(ident, (name, []))[1].append(detail)
    marks = of_kind(table, "mark", columns=["time", "label", "value"])
    marks = _window(marks, since_ns, end_ns, pc.starts_with(marks["label"].cast(pa.string()), fmt.JOINS_PREFIX))
    marked = marks["value"].to_pylist()
    candidates: list[tuple[tuple[bool, bool, bool, bool, int], dict[str, Any]]] = []
    for ident, (name, seen) in per.items():
        stack, most = Counter(seen).most_common(1)[0]
        share, moves = round(most / len(seen), 4), sum(a != b for a, b in zip(seen, seen[1:], strict=False))
        site: str | None = site_of(stack)
        site = None if site is None or is_stdlib_frame(site) else site  # (an idle pool thread: none)
        waiting = innermost_is(stack.split(";"), _THREAD_WAIT)  # itself waiting for another thread
        stuck = site is not None and not busy(len(seen), share, moves) and not waits_for_others(stack)
        mine = bool(marked) and ident == marked[-1]
        order = (not mine, not stuck, site is None or not is_job_frame(site), waiting, -len(seen))
        candidates.append((order, {"thread": name, "stack": stack, "site": site, "samples": len(seen), "share": share,
                                   "moves": moves, "stuck": stuck, "joined": mine}))  # fmt: skip
    threads = [e for _, e in sorted(candidates, key=lambda r: r[0])]
    st["threads"] = threads[:SHOWN_THREADS]
    st["joins"] = bool(st["stack"] and not st["loader"] and not st["collective"]) and innermost_is(
        str(st["stack"]).split(";"), _JOIN)
    dead = _window(of_kind(table, "exception", columns=["time", "label", "detail", "step"]), 0, end_ns)
    dead = dead.filter(pc.starts_with(dead["detail"].cast(pa.string()), _DIED))
    st["thread_died"] = dead.num_rows > 0
    if dead.num_rows and st["joins"]:  # the last to die, told beside the main thread's wait (a live thread of the
        # job's that stands still may be a heartbeat's sleep: a dead one is what a hung wait most often waits for)
        step = dead["step"][-1].as_py()
        st["dead_thread"] = {"thread": str(dead["detail"][-1].as_py())[len(_DIED):], "error": str(
            dead["label"][-1].as_py() or "an exception")[:ERROR_SAID], "step": step if isinstance(step, int) else None,
            "time": iso_ns(int(dead["time"].cast(pa.int64())[-1].as_py()))}  # fmt: skip
    if joined(st):
        st["waits"] = False
    return st


def _window(rows: pa.Table, since_ns: int, end_ns: int, keep: Any = None) -> pa.Table:
    """The last ``LAST_ROWS`` of ``rows`` after ``since_ns`` up to ``end_ns`` (and where ``keep``), in time order:
    only those are copied (a ring's million rows of deep stacks are gigabytes of text, past what Arrow takes
    at once, and memory recovery bounds)."""
    t = rows["time"].cast(pa.int64())
    mask = pc.and_(pc.greater(t, since_ns), pc.less_equal(t, end_ns))
    if keep is not None:
        mask = pc.and_(mask, keep)
    index = np.flatnonzero(mask.fill_null(False).to_numpy(zero_copy_only=False))[-LAST_ROWS:]
    rows = rows.take(pa.array(index, pa.int64()))
    return rows.take(pc.array_sort_indices(rows["time"].cast(pa.int64())))


def joined(st: dict[str, Any]) -> bool:
    """It is known which thread of its own the main thread waited for (``with_threads``): the one whose join it
    was inside; else, in a queue's get or a future's wait, the one thread stuck at the job's own code, where no
    thread of it had died of an exception (a producer dead, a logger's loop would read as the one stuck)."""
    threads = st.get("threads") or []
    if not st.get("joins") or not threads:
        return False
    if threads[0].get("joined"):
        return True
    stuck = [th for th in threads if th.get("stuck") and is_job_frame(th["site"])]
    return (len(stuck) == 1 and stuck[0] is threads[0] and not st.get("thread_died")
            and not innermost_is(str(st["stack"]).split(";"), _THREAD_JOIN))  # fmt: skip
