"""What a ring's timeline says about how its process ended: pure extraction, no verdict.

``Facts`` collects, once, the rows the diagnosis and the levers read: host
samples, each child process's memory over time, the cgroup's memory.stat, the
uncaught exceptions and OOMs, the signals (with who sent them), the exit
events. Times are kept as monotonic nanoseconds (the ring's clock, which the
kernel log also uses) and as ISO-8601 strings for the report.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._units import human_bytes
from .kinds import of_kind, rows_of_kind
from .timeline import py_rows, stamps_ns

if TYPE_CHECKING:
    from .evidence import Evidence

SAMPLE_COLUMNS = ["time", "step", "host_rss", "children_rss", "cgroup_usage", "cgroup_limit", "cgroup_oom_kills",
                  "mem_available"]  # fmt: skip
STAT_COLUMNS = ["time", "cgroup_anon", "cgroup_file", "cgroup_shmem", "cgroup_file_dirty", "cgroup_file_writeback"]
ERROR_COLUMNS = ["time", "kind", "step", "label", "detail", "traceback", "oom_requested", "oom_reserved_unallocated",
                 "oom_capacity", "oom_free"]  # fmt: skip
SIGNAL_COLUMNS = ["time", "step", "label", "value", "detail", "sender", "sender_pid", "signal_code", "address"]
_WORKER_KILLED = re.compile(
    r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\)? (?:is killed by signal|exited unexpectedly)(?:: ([\w ]+))?"
)


@dataclass
class Series:
    """One process's resident memory over time (monotonic ns, bytes), and the step in force in the
    process that sampled it at each sample (NaN before the first)."""

    pid: int
    name: str
    times: np.ndarray
    rss: np.ndarray
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def growth(self) -> int:
        return int(self.rss[-1] - self.rss[0]) if len(self.rss) else 0

    def at(self, t_ns: int) -> int | None:
        """Its RSS at the last sample at or before ``t_ns``."""
        i = int(np.searchsorted(self.times, t_ns, side="right")) - 1
        return int(self.rss[i]) if i >= 0 else None


class Rows(Sequence[dict[str, Any]]):
    """Some rows of a table (``rows``: their numbers, in order) as dicts, times as ISO strings, made one at
    a time when asked: a ring may hold a million samples or signals, and neither a dict per row nor a
    filtered copy of the table is made for them."""

    def __init__(self, table: pa.Table, rows: np.ndarray) -> None:
        self.table, self.rows = table, rows

    @classmethod
    def of_kind(cls, table: pa.Table, *kinds: str, columns: list[str]) -> Rows:
        return cls(table.select(columns), rows_of_kind(table, *kinds))

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> Rows: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | Rows:
        if isinstance(i, slice):
            return Rows(self.table, self.rows[i])
        return py_rows(self.table.slice(int(self.rows[i]), 1))[0]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for lo in range(0, len(self.rows), 4096):
            yield from py_rows(self.table.take(self.rows[lo : lo + 4096]))

    def index(self, row: Any, start: int = 0, stop: int | None = None) -> int:
        """Searched from the end (the rows asked about are the last ones)."""
        for i in reversed(range(start, len(self) if stop is None else stop)):
            if self[i] == row:
                return i
        raise ValueError("row not found")

    def column(self, name: str) -> pa.ChunkedArray:
        if not len(self.rows):
            return self.table[name].slice(0, 0)
        return self.table[name].take(self.rows)

    def keep(self, mask: pa.ChunkedArray) -> Rows:
        """The rows where ``mask`` (over these rows) is true."""
        return Rows(self.table, self.rows[pc.fill_null(mask, False).to_numpy(zero_copy_only=False)])

    def where(self, column: str, value: Any) -> Rows:
        """The rows whose ``column`` equals ``value``."""
        if not len(self.rows):
            return self
        return self.keep(pc.equal(self.column(column), value))

    def floats(self, column: str) -> np.ndarray:
        """A column as float64, NaN where null (a value past 2**53 rounded, not refused: a crafted ring holds any)."""
        if not len(self.rows):
            return np.zeros(0, np.float64)
        values: np.ndarray = self.column(column).cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        return values

    def ns(self) -> np.ndarray:
        """The rows' times as int64 ns."""
        if not len(self.rows):
            return np.zeros(0, np.int64)
        stamps: np.ndarray = stamps_ns(self.table["time"])[self.rows]
        return stamps


@dataclass
class Facts:
    samples: Rows  # host samples
    sample_ns: np.ndarray  # their monotonic times
    stats: Rows  # cgroup memory.stat samples
    stat_ns: np.ndarray
    errors: Rows  # uncaught / captured exceptions and OOMs, in order
    signals: Rows
    signal_ns: np.ndarray
    exits: Rows  # exit events: value = the status
    exit_armed: bool = False  # the last clean end armed the exit record (a disarm record of value 1)
    late_signals: Rows | None = None  # the signals after the last clean end (taken while it shut down)
    clean_end_ns: int | None = None  # the last clean end's time (monotonic ns)
    children: dict[int, Series] = field(default_factory=dict)
    steps: pa.Table | None = None  # every record's time and step (the step in force when it was written)
    last_event: dict[str, Any] | None = None
    first_ns: int = 0
    last_ns: int = 0
    to_wall: int = 0  # add to a monotonic ns to get UTC ns

    @property
    def main_uncaught(self) -> Rows:
        if not len(self.errors):
            return self.errors
        detail = self.errors.column("detail").cast(pa.string())
        return self.errors.keep(pc.or_(pc.equal(detail, "uncaught"), pc.starts_with(detail, "uncaught;")))

    def in_life(self) -> Rows:
        """The signals up to the last clean end (none of those taken while the process shut down)."""
        late = self.late_signals
        return self.signals if late is None or not len(late) else Rows(self.signals.table, self.signals.rows[
            ~np.isin(self.signals.rows, late.rows)])  # fmt: skip

    def worker_killed(self) -> tuple[list[int], str] | None:
        """(pids, how) from PyTorch's "DataLoader worker (pid N) is killed by signal: Killed" in an uncaught error."""
        for r in reversed(self.main_uncaught):
            m = _WORKER_KILLED.search(r["label"] or "")
            if m:
                return [int(p) for p in re.findall(r"\d+", m.group(1))], (m.group(2) or "exited unexpectedly").strip()
        return None

    def ns_of_signal(self, row: dict[str, Any]) -> int:
        """The monotonic time of one of ``signals``' rows."""
        return int(self.signal_ns[self.signals.index(row)])

    def steps_since(self, t_ns: int) -> int:
        """How many steps began after ``t_ns``: the steps in force in the records after it, less the one at it."""
        if self.steps is None or not self.steps.num_rows:
            return 0
        i = int(np.searchsorted(_ns(self.steps), t_ns + self.to_wall, side="right"))
        return len(set(pc.unique(self.steps["step"].slice(i)).to_pylist()) - {None, self.step_at(t_ns)})

    def sample_before(self, t_ns: int) -> dict[str, Any] | None:
        i = int(np.searchsorted(self.sample_ns, t_ns, side="right")) - 1
        return self.samples[i] if i >= 0 else None

    def step_at(self, t_ns: int) -> int | None:
        """The step in force at ``t_ns``: that of the last record of any kind at or before it (samples
        alone lag: several steps may pass between two)."""
        if self.steps is None or not self.steps.num_rows:
            return None
        i = int(np.searchsorted(_ns(self.steps), t_ns + self.to_wall, side="right")) - 1
        step: int | None = self.steps["step"][i].as_py() if i >= 0 else None
        return step

    def stat_before(self, t_ns: int) -> dict[str, Any] | None:
        i = int(np.searchsorted(self.stat_ns, t_ns, side="right")) - 1
        return self.stats[i] if i >= 0 else None


def _ns(table: pa.Table) -> np.ndarray:
    return stamps_ns(table["time"])


def named_workers(table: pa.Table) -> set[int]:
    """The pids of the DataLoader workers the job's own errors name as dead (PyTorch's "DataLoader worker
    (pid N) is killed by signal" or "exited unexpectedly"): the kernel's OOM kill of one is this ring's
    evidence, though the ring may never have sampled it (a forkserver's worker is no child of the job's)."""
    out: set[int] = set()
    for text in Rows.of_kind(table, "oom", "exception", columns=["label"]).column("label").unique().to_pylist():
        m = _WORKER_KILLED.search(text or "")
        if m:
            out.update(int(p) for p in re.findall(r"\d+", m.group(1)))
    return out


def _exit_armed(table: pa.Table) -> bool:
    """The last ``disarm`` record says the exit record was armed (value 1, FORMAT.md "Kinds")."""
    rows = rows_of_kind(table, "disarm")
    return bool(len(rows)) and table["value"][int(rows[-1])].as_py() == 1


def _after_clean_end(table: pa.Table, signals: Rows) -> tuple[Rows, int | None]:
    """The signals recorded after the last clean end (taken while the process shut down: FORMAT.md, "Kinds"),
    and that clean end's time (UTC ns; None: none)."""
    rows = rows_of_kind(table, "disarm")
    if not len(rows):
        return signals[len(signals) :], None
    return Rows(signals.table, signals.rows[signals.rows > rows[-1]]), int(stamps_ns(table["time"])[rows[-1]])


def facts(table: pa.Table, clock: dict[str, Any]) -> Facts:
    """The end-of-life facts of one ring's timeline; ``clock`` is the ring's (wall_ns, monotonic_ns) pair."""
    wall0, mono0 = int(clock.get("wall_ns") or 0), int(clock.get("monotonic_ns") or 0)
    to_wall = wall0 - mono0
    samples = Rows.of_kind(table, "sample", columns=SAMPLE_COLUMNS)
    stats = Rows.of_kind(table, "cgroup_sample", columns=STAT_COLUMNS)
    signals = Rows.of_kind(table, "signal", columns=SIGNAL_COLUMNS)
    late, clean_end = _after_clean_end(table, signals)
    ends = Rows(table.select(["time", "step"]), np.array([0, table.num_rows - 1])) if table.num_rows else None
    end_ns = ends.ns() - to_wall if ends else np.zeros(2, np.int64)
    out = Facts(
        samples=samples,
        sample_ns=samples.ns() - to_wall,
        stats=stats,
        stat_ns=stats.ns() - to_wall,
        errors=Rows.of_kind(table, "oom", "exception", columns=ERROR_COLUMNS),
        signals=signals,
        signal_ns=signals.ns() - to_wall,
        exits=Rows.of_kind(table, "exit", columns=["time", "step", "value", "label", "detail"]),
        exit_armed=_exit_armed(table),
        late_signals=late,
        clean_end_ns=None if clean_end is None else clean_end - to_wall,
        steps=table.select(["time", "step"]),
        last_event=ends[-1] if ends else None,
        first_ns=int(end_ns[0]),
        last_ns=int(end_ns[-1]),
        to_wall=to_wall,
    )
    kids = of_kind(table, "child_sample", columns=["time", "step", "label", "child_pid", "child_rss"])
    if kids["child_pid"].null_count:  # a damaged or crafted sample names no child: it is no child's reading
        kids = kids.filter(kids["child_pid"].is_valid())
    if kids.num_rows:
        pid = kids["child_pid"].to_numpy(zero_copy_only=False)
        rss = kids["child_rss"].fill_null(0).to_numpy(zero_copy_only=False)
        t = _ns(kids) - to_wall
        steps = kids["step"].cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        order = np.argsort(pid, kind="stable")  # each child's rows together, in time order
        pids, starts = np.unique(pid[order], return_index=True)
        names = kids["label"].take(order[starts]).to_pylist()  # a child's name from its first row
        for p, rows, name in zip(pids.tolist(), np.split(order, starts[1:]), names, strict=True):
            alive = rows[rss[rows] > 0]  # 0: read as a zombie, after it died (a live process has pages)
            out.children[int(p)] = Series(int(p), name or "", t[alive], rss[alive].astype(np.int64), steps[alive])
    return out


def near_limit(sample: dict[str, Any] | None) -> tuple[float, str] | None:
    """(usage / limit, the words) of the cgroup at a sample, where it has a limit."""
    if not sample or not sample.get("cgroup_limit") or sample.get("cgroup_usage") is None:
        return None
    frac = sample["cgroup_usage"] / sample["cgroup_limit"]
    return frac, (
        f"last sample: cgroup usage {human_bytes(sample['cgroup_usage'])} of its "
        f"{human_bytes(sample['cgroup_limit'])} limit ({100 * frac:.0f}%)"
    )


def counter_rose(first: dict[str, Any] | None, last: dict[str, Any] | None, ev: Evidence | None = None) -> str | None:
    """The cgroup's oom_kill counter rose: between two samples, or (``ev``) after the last one, by more than the
    kernel log's kills of other processes there since (``ev.others_killed``: recovered after another process of
    the cgroup was OOM-killed, a SIGKILL read as the OOM killer's)."""
    if not last or last.get("cgroup_oom_kills") is None:
        return None
    if ev is None:
        before = (first or {}).get("cgroup_oom_kills")
        if before is not None and last["cgroup_oom_kills"] > before:
            return f"the memory cgroup's oom_kill counter rose from {before} to {last['cgroup_oom_kills']} meanwhile"
        return None
    if ev.cgroup_oom_kills_now is None or not ev.same_boot:
        return None
    if ev.cgroup_oom_kills_now - last["cgroup_oom_kills"] > len(ev.others_killed):  # (not others' kills alone)
        return (f"the memory cgroup's oom_kill counter rose from {last['cgroup_oom_kills']} (last sample) "
                f"to {ev.cgroup_oom_kills_now}")  # fmt: skip
    return None
