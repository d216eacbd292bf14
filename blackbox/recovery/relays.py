"""The real sender of a signal ``blackbox run`` relayed: never blackbox itself.

``blackbox run`` passes each signal it receives on to its job, so the job's
rings record the launcher's pid as the sender. The launcher wrote down who
really sent each one (``ring/relayed.py``, ``relayed.jsonl`` in the rings
folder); here a ring's signal rows whose sender is that launcher get the
original sender, pid and ``si_code`` back, before anything reads them: the
diagnosis, ``killed_by``, the summary and ``timeline.parquet`` all name who
sent the signal (``timeout``, the shell that ran ``kill``, torchrun), as they
would have unarmed. A signal the kernel sent to the launcher (a terminal's
hang-up) stays the kernel's: no sender pid, no command, code 128.

A row takes the latest relay of its signal by that launcher received no later
than the row's own time (plus ``SLACK_NS`` for the two clocks), else the
earliest (the launcher writes 1 MiB of relays at most: in a longer signal storm
the later rows take the last relay written). The file is untrusted input: it
can only rename the sender of rows that already name the launcher.
"""

from __future__ import annotations

import signal as signals
import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..ring.inputs import Folder
from ..ring.relayed import Relay, read_relayed
from .kinds import rows_of_kind

SLACK_NS = 500_000_000  # the launcher's wall clock against the ring's (monotonic + the pair read at arm)


def _signal_number(label: str | None) -> int:
    try:
        return int(signals.Signals[label or ""])
    except KeyError:
        return 0


def _int_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, null mask) of an int64 column."""
    col = table[name].combine_chunks()
    values = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return values, col.is_null().to_numpy(zero_copy_only=False).astype(bool)


def _chosen(relays: Sequence[Relay], pids: np.ndarray, signos: np.ndarray, times: np.ndarray) -> list[Relay | None]:
    """For each row (sender pid, signal, time): the relay that explains it, or None."""
    chosen: list[Relay | None] = [None] * len(pids)
    groups: dict[tuple[int, int], list[Relay]] = {}
    for r in relays:
        groups.setdefault((r.via, r.signal), []).append(r)
    for (via, sig), group in groups.items():
        at = np.flatnonzero((pids == via) & (signos == sig))
        if not len(at):
            continue
        group.sort(key=lambda r: r.time_ns)
        stamps = np.array([r.time_ns for r in group], np.int64)
        picks = np.maximum(np.searchsorted(stamps, times[at] + SLACK_NS, side="right") - 1, 0)
        for row, k in zip(at.tolist(), picks.tolist(), strict=True):
            chosen[row] = group[k]
    return chosen


def attribute(table: pa.Table, relays: Sequence[Relay]) -> pa.Table:
    """``table`` with the signal rows relayed by ``blackbox run`` naming their original sender."""
    if not relays or not table.num_rows:
        return table
    rows = rows_of_kind(table, "signal")
    launchers = np.array(sorted({r.via for r in relays}), np.int64)
    pid_values, pid_null = _int_column(table, "sender_pid")
    hit = np.isin(pid_values[rows], launchers) & ~pid_null[rows]
    rows = rows[hit]
    if not len(rows):
        return table
    labels = table["label"].take(pa.array(rows)).combine_chunks()
    words = [_signal_number(w) for w in labels.dictionary.to_pylist()]
    signos = np.array(words, np.int64)[pc.fill_null(labels.indices, 0).to_numpy(zero_copy_only=False)]
    times = table["time"].take(pa.array(rows)).cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64)
    chosen = _chosen(relays, pid_values[rows], signos, times)
    keep = [i for i, r in enumerate(chosen) if r is not None]
    if not keep:
        return table
    rows = rows[keep]
    picked = [r for r in chosen if r is not None]
    code_values, code_null = _int_column(table, "signal_code")
    sender = table["sender"].combine_chunks()
    dictionary = sender.dictionary.to_pylist()
    index = {w: i for i, w in enumerate(dictionary)}
    codes = pc.fill_null(sender.indices, 0).to_numpy(zero_copy_only=False).astype(np.int32)
    sender_null = sender.is_null().to_numpy(zero_copy_only=False).astype(bool)
    for row, r in zip(rows.tolist(), picked, strict=True):
        pid_values[row], pid_null[row] = (r.sender_pid or 0), r.sender_pid is None
        code_values[row], code_null[row] = r.code, False
        if r.sender is None or r.sender_pid is None:
            sender_null[row] = True
        else:
            codes[row], sender_null[row] = index.setdefault(r.sender, len(index)), False
    names = pa.array(list(index), pa.string())
    columns = {
        "sender_pid": pa.array(pid_values, pa.int64(), mask=pid_null),
        "signal_code": pa.array(code_values, pa.int64(), mask=code_null),
        "sender": pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=sender_null), names),
    }
    for name, column in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table


class RelayIndex:
    """The relays of each ring folder, read once per folder (rings are recovered on several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: dict[tuple[int, int], list[Relay]] = {}

    def relays(self, folder: Folder, owner: int) -> list[Relay]:
        """The relays recorded in ``folder`` (held open), from a file of its owner or of ``owner``."""
        with self._lock:
            if (folder.fd, owner) not in self._read:
                self._read[(folder.fd, owner)] = read_relayed(folder, {owner})
            return self._read[(folder.fd, owner)]

    def attribute(self, table: pa.Table, folder: Folder, owner: int) -> pa.Table:
        """``table`` (the timeline of a ring in ``folder``, owned by ``owner``) with relayed signals' real senders."""
        return attribute(table, self.relays(folder, owner))
