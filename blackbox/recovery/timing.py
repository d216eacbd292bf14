"""How well a death's time is known, where it is the process's last record (a SIGKILL stamps nothing), and
whether the process was starved of CPU at its end. Pure functions over one ring's timeline.

A process killed without a trace died after its last record, and, had it gone on as in its last seconds,
before the next one: ``time_error_s`` is the longest gap between its consecutive records over its last
``RECENT_S`` seconds (at least its last ``MIN_GAPS`` gaps). Its sampler asks to wake every
``sample_interval_s``; where its last intervals ran later than that by more than the interval itself (and
``MIN_LATE_S``), the process was *starved* (of CPU, or of the GIL held by a long native call), and may
have gone that long (the interval and its lateness) without a record before it died: ``time_error_s`` is
at least that. So a starved process may look as if it died before processes that died earlier
(``attempts.deaths`` takes that into account, and the summary says so).

A death whose exception says that a peer went away (``peer_lost``: its socket reset or closed, NCCL's
remote error) came after that peer's death, however well its own time is known: it never displaces one.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa

from .kinds import of_kind

RECENT_S = 5.0
MIN_GAPS = 4
LAST_SAMPLES = 5  # sampler intervals looked at for starvation: the last ones
MIN_LATE_S = 0.1
# What an exception says where the process's peer went away: gloo's pair.cc (a read or write on the peer's
# socket), NCCL's ncclRemoteError ("remote process exited or there was a network error"), torchrun's agent
# whose rendezvous store, another node's agent, went away (RendezvousConnectionError).
PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe|remote process exited|ncclRemoteError|"
                       r"RendezvousConnectionError")


def _ns(table: pa.Table) -> np.ndarray:
    times: np.ndarray = table["time"].cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    return times


def death_timing(table: pa.Table, interval_s: Any, from_last_record: bool) -> dict[str, Any]:
    """``time_error_s`` (seconds after the death's time within which it came; 0.0 where that time is a
    record of the death itself, None where too few records tell) and ``starved`` (``late_s``: how much
    later than ``interval_s`` its sampler's last intervals ran at most, ``interval_s``; None: on time)."""
    hungry = starved(table, interval_s)
    error = _error(table) if from_last_record else 0.0
    if hungry is not None and error is not None and from_last_record:  # it may have gone unscheduled that long
        error = max(error, round(hungry["late_s"] + hungry["interval_s"], 6))
    return {"time_error_s": error, "starved": hungry}


def peer_lost(evidence: Any) -> str | None:
    """The words of a death's evidence that say a peer went away (``PEER_LOST``); None: none do."""
    for e in evidence if isinstance(evidence, list) else ():
        hit = PEER_LOST.search(e) if isinstance(e, str) else None
        if hit:
            return hit.group(0)
    return None


TAIL = 4096  # records looked at: the last ones (the ring is in write order; its times nearly so)


def _error(table: pa.Table) -> float | None:
    times = np.sort(_ns(table.slice(max(0, table.num_rows - TAIL))))
    if len(times) < 2:
        return None
    recent = times[times >= times[-1] - int(RECENT_S * 1e9)]
    if len(recent) < MIN_GAPS + 1:
        recent = times[-(MIN_GAPS + 1) :]
    return round(float(np.diff(recent).max()) / 1e9, 6)


def starved(table: pa.Table, interval_s: Any) -> dict[str, Any] | None:
    """Its sampler's last intervals against the one it asked for (module docstring); None: on time, or not
    enough samples to tell."""
    if not isinstance(interval_s, (int, float)) or isinstance(interval_s, bool) or interval_s <= 0:
        return None
    samples = of_kind(table, "sample", columns=["time"])
    times = _ns(samples.slice(max(0, samples.num_rows - 4 * LAST_SAMPLES)))
    if len(times) < 2:
        return None
    late = float(np.diff(np.sort(times)[-(LAST_SAMPLES + 1) :]).max()) / 1e9 - float(interval_s)
    if late <= max(float(interval_s), MIN_LATE_S):
        return None
    return {"late_s": round(late, 6), "interval_s": float(interval_s)}
