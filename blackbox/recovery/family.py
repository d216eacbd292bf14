"""A bundle's deaths told with each other: a helper and the process that started it (pure).

Each ring is diagnosed alone. Beside the others of its bundle, two things change:

- A ring that tells of its child's death (the kernel's OOM kill of a Pool
  helper, PyTorch's "DataLoader worker is killed") while that child's own ring
  is in the bundle tells it twice. The child's ring is the one that tells that
  death; this ring then tells its own process's end (``death.own_end``: the
  ``TimeoutError`` its main raised 20 s later, its exit), with the child's death
  named among its evidence and in ``death.after``. Its analysis (levers, worker
  memory) stays.
- A helper's ring records no step (the steps are its parent's): a helper's
  death with no step takes the step its parent was at then, from the parent's
  ``recent_steps``.
"""

from __future__ import annotations

from typing import Any

from .._times import epoch_ns

RECENT_STEPS = 64  # the last steps' starts a ring's metadata keeps, for its helpers' deaths


def extra(m: dict[str, Any]) -> dict[str, Any]:
    """What retelling takes of a ring's metadata beyond its slim form."""
    return {"own_end": (m.get("death") or {}).get("own_end"), "recent_steps": m.get("recent_steps")}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def step_at(recent: Any, when: Any) -> int | None:
    """The step in force at ``when`` (ISO UTC) by a ring's ``recent_steps`` ([[ISO start, step], ...], in
    order); None before the first of them or where either cannot be read."""
    at = epoch_ns(when) if isinstance(when, str) else None
    if at is None or not isinstance(recent, list):
        return None
    step = None
    for entry in recent:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            return None
        start = epoch_ns(entry[0])
        if start is None or start > at:
            break
        step = _int(entry[1])
    return step


def retell(slims: list[dict[str, Any]], extras: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The deaths retold (index in ``slims`` -> the fields of its death that change), as the module
    docstring says."""
    at = {(m.get("host"), m.get("pid")): i for i, m in enumerate(slims)}
    out: dict[int, dict[str, Any]] = {}
    for i, m in enumerate(slims):
        death, own = m["death"], extras[i].get("own_end")
        victim = _int((death.get("victim") or {}).get("pid"))
        child = at.get((m.get("host"), victim)) if victim is not None and victim != m.get("pid") else None
        if child is not None and isinstance(own, dict):
            told = slims[child]["death"]
            name = f"{(told.get('victim') or {}).get('role') or 'child process'} (pid {victim})"
            after = {"pid": victim, "role": (told.get("victim") or {}).get("role"), "cause": told.get("cause"),
                     "time": told.get("time")}  # fmt: skip
            evidence = [*(own.get("evidence") or []), f"its {name} died before it, at {told.get('time')}: "
                        f"{told.get('cause')} (that process's own ring tells it)"]  # fmt: skip
            out[i] = {**own, "evidence": evidence, "after": after}
        step = out.get(i, death).get("step")
        parent = at.get((m.get("host"), m.get("ppid")))
        if step is None and m.get("role") not in (None, "main") and parent is not None:
            step = step_at(extras[parent].get("recent_steps"), out.get(i, death).get("time"))
            if step is not None:
                out.setdefault(i, {})["step"] = step
    return out
