"""What the kernel spares a PID namespace's first process (a container's entrypoint), told (pure).

That process is given no signal it has no handler for (but a fault the kernel forced), whoever sent it: a pod's
SIGTERM, `docker stop`'s, leaves a Python job with no SIGTERM handler running until the SIGKILL at the grace
period's end. The recorder writes such a signal with the detail ``fmt.DROPPED_AS_INIT``
(``collect.identity.stands_in_for_init``: the process was that first process, armed by ``arm()``, or stood for it
under a ``blackbox run`` that was).
Told here: the evidence of such a signal the job ran on past, and where a SIGKILL followed, the evidence of the
time it ran on from the first of them, and for a SIGTERM the lever (the headline says it through ``killed_by``'s
``dropped``).
"""

from __future__ import annotations

from typing import Any

from ..ring import format as fmt
from .headline import sent_from

GRACE_LEVER = (
    "give the job a SIGTERM handler that saves what it needs and exits within the grace period (Kubernetes' "
    "terminationGracePeriodSeconds, 30 s by default; `docker stop`'s 10 s): as a container's first process it is "
    "spared any signal it has no handler for, so the SIGTERM did nothing, and the runtime's SIGKILL came when the "
    "grace period ran out; or start it under an init that passes signals on (`docker run --init`, tini, "
    "dumb-init), to end at the SIGTERM"
)


def sender_of(row: dict[str, Any]) -> dict[str, Any]:
    """``killed_by`` of a signal's row: ``dropped`` (true) where it was dropped as for a namespace's first
    process."""
    out = {"signal": row["label"], "sender": row["sender"], "sender_pid": row["sender_pid"], "time": row["time"]}
    return {**out, "dropped": True} if row.get("detail") == fmt.DROPPED_AS_INIT else out


def came_first(signals: Any, signal_ns: Any, end_ns: int, role: str) -> str:
    """The evidence of the last signal (``signals[-1]``) before a SIGKILL at ``end_ns`` (``role``: what its sender
    was, or ""); where it was dropped as for a namespace's first process, the time the job ran on after the first
    of the signals so dropped one after another, to its last record."""
    last = len(signals) - 1
    row = signals[last]
    said = f"{row['label']}{sent_from(row)}{role}"
    if row["detail"] != fmt.DROPPED_AS_INIT:
        return f"{said} came first, at {row['time']}"
    first = last
    while first > 0 and signals[first - 1]["detail"] == fmt.DROPPED_AS_INIT:
        first -= 1
    ran_on = max((end_ns - int(signal_ns[first])) / 1e9, 0.0)
    if first == last:
        return f"{said} at {row['time']} was {row['detail']}: the job ran on for {ran_on:.1f} s, to the SIGKILL"
    head = signals[first]
    return (f"{head['label']}{sent_from(head)} at {head['time']} was {row['detail']}, and {last - first} more after "
            f"it, the last {said} at {row['time']}: the job ran on for {ran_on:.1f} s, to the SIGKILL")  # fmt: skip


def dropped_as_init(signals: Any) -> list[str]:
    """Evidence of the signals dropped as for a PID namespace's first process (``fmt.DROPPED_AS_INIT``) where the
    job then ended by itself: no death, nor a handler's graceful shutdown, but what a pod's SIGTERM is to a job
    with no handler, said as such."""
    return [f"{s['label']}{sent_from(s)} at {s['time']} was {s['detail']}: the job ran on" for s in signals
            if s["detail"] == fmt.DROPPED_AS_INIT]  # fmt: skip


def dropped_before(signals: Any, killed_by: dict[str, Any] | None) -> list[str]:
    """Evidence of the signals dropped as for a namespace's first process before a death with no clean end (the
    job ran on past each), but those a SIGKILL's evidence tells (``came_first``: the last ones, dropped in a row,
    where ``killed_by`` is the last of them)."""
    rows = list(signals)
    while killed_by and killed_by.get("dropped") and rows and rows[-1]["detail"] == fmt.DROPPED_AS_INIT:
        rows.pop()
    return dropped_as_init(rows)


def with_grace_lever(death: dict[str, Any]) -> dict[str, Any]:
    """``death`` with the grace lever first where it was a SIGKILL after a dropped SIGTERM (a runtime's request to
    stop: `docker stop`, a pod's deletion); after another signal dropped, the evidence says so, with no lever."""
    killed_by = death.get("killed_by") or {}
    if death.get("cause") != "killed" or not killed_by.get("dropped") or killed_by.get("signal") != "SIGTERM":
        return death
    return {**death, "levers": [GRACE_LEVER, *(death.get("levers") or [])]}
