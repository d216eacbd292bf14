"""What the kernel spares a PID namespace's first process (a container's entrypoint), told (pure).

That process is given no signal it has no handler for (but a fault), whoever sent it: a pod's SIGTERM, `docker
stop`'s, leaves a Python job with no SIGTERM handler running until the SIGKILL at the grace period's end. The
recorder writes such a signal with the detail ``fmt.DROPPED_AS_INIT`` (``collect.identity.stands_in_for_init``:
the process was that first process, armed by ``arm()``, or stood for it under a ``blackbox run`` that was).
Told here: the evidence of such a signal the job ran on past, and where a SIGKILL followed, the evidence of the
time it ran on and the lever (the headline says it through ``killed_by``'s ``dropped``).
"""

from __future__ import annotations

from typing import Any

from ..ring import format as fmt
from .headline import sent_from


def grace_lever(signal: str) -> str:
    """What to change where a dropped ``signal`` was followed by a SIGKILL."""
    return (f"give the job a {signal} handler that saves what it needs and exits within the grace period "
            "(Kubernetes' terminationGracePeriodSeconds, 30 s by default; `docker stop`'s 10 s): as a container's "
            f"first process it is spared any signal it has no handler for, so the {signal} did nothing and the "
            "SIGKILL came when the grace period ran out; or start it under an init that passes signals on "
            "(`docker run --init`, tini, dumb-init), to end at the signal")  # fmt: skip


def sender_of(row: dict[str, Any]) -> dict[str, Any]:
    """``killed_by`` of a signal's row: ``dropped`` (true) where it was dropped as for a namespace's first
    process."""
    out = {"signal": row["label"], "sender": row["sender"], "sender_pid": row["sender_pid"], "time": row["time"]}
    return {**out, "dropped": True} if row.get("detail") == fmt.DROPPED_AS_INIT else out


def came_first(row: dict[str, Any], role: str, ran_on_s: float) -> str:
    """The evidence of the signal before a SIGKILL (``role``: what its sender was, or ""); one dropped as for a
    namespace's first process with the time the job then ran on, to its last record."""
    said = f"{row['label']}{sent_from(row)}{role}"
    if row.get("detail") != fmt.DROPPED_AS_INIT:
        return f"{said} came first, at {row['time']}"
    return f"{said} at {row['time']} was {row['detail']}: the job ran on for {max(ran_on_s, 0.0):.1f} s, to the SIGKILL"


def dropped_as_init(signals: Any) -> list[str]:
    """Evidence of the signals dropped as for a PID namespace's first process (``fmt.DROPPED_AS_INIT``) where the
    job then ended by itself: no death, nor a handler's graceful shutdown, but what a pod's SIGTERM is to a job
    with no handler, said as such."""
    return [f"{s['label']}{sent_from(s)} at {s['time']} was {s['detail']}: the job ran on" for s in signals
            if s["detail"] == fmt.DROPPED_AS_INIT]  # fmt: skip


def with_grace_lever(death: dict[str, Any]) -> dict[str, Any]:
    """``death`` with the grace lever first where it was a SIGKILL after a dropped signal."""
    killed_by = death.get("killed_by") or {}
    if death.get("cause") != "killed" or not killed_by.get("dropped"):
        return death
    return {**death, "levers": [grace_lever(str(killed_by["signal"])), *(death.get("levers") or [])]}
