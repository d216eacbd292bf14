"""An attempt's hang: across its ranks, the rank the others waited for. Pure functions over the rings' slim
metadata, each with its own stall (``hang.stall``, ``death.hang``).

``attempt_hang`` reads an attempt's dead rings (their slim metadata): where some stalled in a collective, or
died of its timeout (gloo's "Timed out waiting", NCCL's watchdog "Watchdog caught collective operation
timeout", a SIGABRT from that watchdog), or waited for another process (a DataLoader's or a Pool's main
process, an idle worker: where one of them hung, the stuck worker needs no steps of its own to be told as
hung), while others stalled outside any (stuck), the stuck rank whose
stall began first is the attempt's first death, whatever signal landed first; the ranks that waited, and
the launcher that the end's signal passed through, are collateral of it; unless a rank that did not stall
died of its own cause (killed, an exception) before that stall had lasted ``HANG_MIN_S``: the others waited
for a dead rank, whose death comes first (attempts.deaths). The chain of senders (``timeout``
-> torchrun's agent -> the ranks) is read from the signals each ring recorded. Where the job turned on
PyTorch's flight recorder and its dumps were read (``recovery.flight``: NCCL's watchdog writes them on a
collective's timeout), they decide: the ranks whose last collective is behind the others' never entered
the one those waited in (what a stack cannot show where the wait is on a GPU stream).

A rank with too few steps to time (stuck before its first, a job that counts none), at one stack outside any
collective while another rank waited in one and none of the attempt kept moving, is stuck too
(``_stuck_before_steps``): a hang at start-up, a rank in its data preparation while the others wait in a
barrier. Its death is then told hung by attempts.deaths, and its ring's by ``hang.as_decided``.
"""

from __future__ import annotations

from typing import Any

from .._times import epoch_ns
from .hang import HANG_MIN_S, SHOWN, handler_ended
from .helpers import launcher_said


def ranked(m: dict[str, Any]) -> bool:
    """Ring ``m`` is a rank's (its ``rank`` an int)."""
    return isinstance(m.get("rank"), int) and not isinstance(m.get("rank"), bool)


def _hang(m: dict[str, Any]) -> dict[str, Any] | None:
    h = m["death"].get("hang")
    return h if isinstance(h, dict) else None


def _waiting(m: dict[str, Any]) -> bool:
    """Its stall waited for another process: in a collective, or for a worker, a pool or a queue (not stuck)."""
    h = _hang(m) or {}
    return bool(h.get("collective") or h.get("waits"))


def _hung_waiting(m: dict[str, Any]) -> bool:
    """It hung (no step for long: its own cause ``hang``) waiting for another process outside any collective:
    a DataLoader's main for its worker's batch, a Pool's for a task (the stuck process may count no steps)."""
    return m["death"].get("cause") == "hang" and bool((_hang(m) or {}).get("waits"))


def _timed_out(m: dict[str, Any]) -> bool:
    return bool((_hang(m) or {}).get("timed_out"))


def _who(m: dict[str, Any]) -> dict[str, Any]:
    return {k: m.get(k) for k in ("rank", "host", "pid")}


def _since(m: dict[str, Any]) -> tuple[float, int]:
    h = _hang(m) or {}
    at = epoch_ns(h.get("since"))
    rank = m.get("rank")
    return (at if at is not None else float("inf")), rank if isinstance(rank, int) else 1 << 31


def attempt_hang(dead: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]] | None:
    """(the stuck ring, the rings that were collateral of it, the attempt's ``hang``), where the attempt's
    deaths are a hang (module docstring); None where they are not. ``hang``: ``stuck`` and ``waited`` (the
    first ``SHOWN`` of each: rank, host, pid, and ``since``, ``stalled_s``, ``step``, ``site``, ``stack``;
    ``collective`` or ``timed_out`` for the waiters), ``stuck_count``, ``waited_count``, ``step_s`` (the
    stuck rank's step time), ``chain`` (the signals that ended it, first sent first) and, where other ranks
    stalled at work beside a stuck one (``busy``: an evaluation), ``at_work`` (the first ``SHOWN``)."""
    # Among ranks, the ranks alone: their launcher (torchrun's agent), still in its monitoring loop while they
    # hung, is neither stuck nor waiting in a collective, nor a peer that died first (its stack, unchanged for
    # 10 s, made it the stuck process, the earliest, whose own cause was its ChildFailedError)
    ranks = [m for m in dead if ranked(m)]
    pool = ranks or dead
    stalled = [m for m in pool if _hang(m) is not None]
    stuck = [m for m in stalled if not _waiting(m) and not _timed_out(m)]
    waited = [m for m in pool if m not in stuck and (_timed_out(m) or _waiting(m))]
    recorded = _flight(stalled)
    if recorded is not None:  # the dumps say who entered the collective and who never did
        behind = [m for m in stalled if id(m) in recorded["_behind"]]
        stuck, waited = behind, [m for m in pool if id(m) in recorded["_entered"] or (m not in behind and
                                                                                        _timed_out(m))]
    if not stuck or not (waited or any(m["death"].get("cause") == "hang" for m in stuck)):
        return None
    at_work = [m for m in stuck if (_hang(m) or {}).get("busy")]
    if len(at_work) < len(stuck):  # a rank really stuck beside ranks at work (an evaluation): the stuck one is it
        stuck = [m for m in stuck if m not in at_work]  # (it read "ranks 0 and 1 ... at work", rank 1 in a wait)
    else:
        at_work = []
    first = min(stuck, key=_since)
    if _peer_died_first(pool, stalled, _since(first)[0]):
        return None  # the stalls waited for a rank that had died: its death comes first, not a hang
    if first["death"].get("cause") != "hang" and not any(_timed_out(m) for m in waited) and not (
        (_hang(first) or {}).get("busy") and waited and ended_from_outside(first)
    ) and not (ended_from_outside(first) and any(_hung_waiting(m) for m in waited)
               ) and not _stuck_before_steps(first, waited, pool):
        return None  # it died of its own cause (an exception after a long evaluation): no hang
    collateral = [m for m in dead if m is not first and m not in stuck]  # the waiters and the launcher
    chain = _chain(dead, first)
    info = {
        "stuck": [_entry(m) for m in sorted(stuck, key=_since)[:SHOWN]],
        "stuck_count": len(stuck),
        "waited": [_entry(m) for m in sorted(waited, key=_since)[:SHOWN]],
        "waited_count": len(waited),
        "step_s": (_hang(first) or {}).get("step_s"),
        "chain": chain,
    }
    if recorded is not None:
        info["flight_recorder"] = {k: v for k, v in recorded.items() if not k.startswith("_")}
    if at_work:
        info["at_work"] = [_entry(m) for m in sorted(at_work, key=_since)[:SHOWN]]
    info["_stuck"] = [m for m in stuck if m is not first]  # (for attempts.deaths: the others stuck, told hung)
    return first, collateral, info


def _stuck_before_steps(first: dict[str, Any], waited: list[dict[str, Any]], pool: list[dict[str, Any]]) -> bool:
    """Rank ``first``, too few steps to time (stuck before its third, or a job that counts none), sat at one
    stack outside any collective (``_same_stack``) while another rank waited in a collective, and a signal
    or SIGKILL ended it: the rank the others waited for (a hang at start-up, before the first step: a rank in
    its data preparation while the others wait in a barrier). Alone its stall is a place, not a hang; and not
    where a process of the attempt kept moving (``pool``: every one stalled): the others may have waited for
    it (a rank at work on a download another polls for)."""
    h = _hang(first) or {}
    return (ended_from_outside(first) and h.get("step_s") is None
            and any((_hang(m) or {}).get("collective") for m in waited)
            and all(_hang(m) is not None for m in pool))  # fmt: skip


def ended_from_outside(m: dict[str, Any]) -> bool:
    """Ring ``m`` was ended by a signal, SIGKILL, or its own handler of a signal (``hang.handler_ended``)."""
    return m["death"].get("cause") in ("signal", "killed") or handler_ended(m["death"]) is not None


def signalled(m: dict[str, Any]) -> dict[str, Any] | None:
    """The signal that ended ring ``m``: the one that killed it, or the one its own handler took before it ended
    by itself (``handled_by``: a checkpoint on SIGTERM, then ``sys.exit(1)``); None: none."""
    killer = m["death"].get("killed_by") or m["death"].get("handled_by")
    return killer if isinstance(killer, dict) else None


def _peer_died_first(dead: list[dict[str, Any]], stalled: list[dict[str, Any]], since_ns: float) -> bool:
    """A rank that did not stall died of its own cause (killed, an exception, out of memory; not a signal, not a
    peer's loss, not a collective's timeout) before the first stall had lasted ``HANG_MIN_S``: the others
    stalled waiting for it (a rank SIGKILLed at step 20 while its peers wait in the all-reduce, and the
    torchrun agent, slow under load, stops them seconds later)."""
    if since_ns == float("inf"):
        return False
    for m in dead:
        d = m["death"]
        if m in stalled or d.get("cause") in ("signal", "hang", "clean_exit") or d.get("peer_lost") or _timed_out(m) \
                or handler_ended(d) is not None:  # (its own handler's end on a signal: a teardown)
            continue
        at = epoch_ns(d.get("time"))
        if at is not None and at - since_ns < HANG_MIN_S * 1e9:
            return True
    return False


def _flight(stalled: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the stalled ranks' flight recorder dumps say, where at least two were read and one process group's
    last collective differs between them: ``pg``, ``seq`` and ``collective`` (the last one entered, by the
    ranks ``entered``), ``behind`` (the ranks whose last was an earlier one: ``last_seq``); ``_entered`` and
    ``_behind``, the rings'. None: no such difference (or too few dumps)."""
    dumps = [(m, g) for m in stalled if isinstance(g := ((_hang(m) or {}).get("flight_recorder") or {}).get("groups"),
                                                    dict)]  # fmt: skip
    if len(dumps) < 2:
        return None
    for pg in sorted({pg for _, g in dumps for pg in g}):
        seqs = [(m, g[pg]) for m, g in dumps if isinstance(g.get(pg), dict) and isinstance(g[pg].get("last_seq"), int)]
        top = max((e["last_seq"] for _, e in seqs), default=None)
        behind = [(m, e) for m, e in seqs if e["last_seq"] != top]
        if top is None or not behind:
            continue
        entered = sorted(((m, e) for m, e in seqs if e["last_seq"] == top), key=lambda me: _since(me[0])[1])
        behind.sort(key=lambda me: _since(me[0])[1])  # by rank
        return {"pg": pg, "seq": top, "collective": entered[0][1].get("last"),
                "entered": [_who(m) for m, _ in entered[:SHOWN]], "entered_count": len(entered),
                "behind": [_who(m) | {"last_seq": e["last_seq"]} for m, e in behind[:SHOWN]],
                "behind_count": len(behind), "files": [str((_hang(m) or {})["flight_recorder"].get("file"))
                                                       for m, _ in dumps[:SHOWN]],
                "_entered": {id(m) for m, _ in entered}, "_behind": {id(m) for m, _ in behind}}  # fmt: skip
    return None


def _entry(m: dict[str, Any]) -> dict[str, Any]:
    h = _hang(m) or {}
    out = _who(m) | {"role": m.get("role")} | {k: h.get(k) for k in ("since", "stalled_s", "step", "site", "work",
                                                                       "collective", "timed_out")}  # fmt: skip
    return out | {"stack": None if h.get("collective") else h.get("stack")}  # a waiter's stack is its collective


def _chain(dead: list[dict[str, Any]], first: dict[str, Any]) -> list[dict[str, Any]]:
    """The signals that ended the stuck ring, outermost sender first: its own killer, then, where that
    sender has a ring of its own here (torchrun's agent under `blackbox run`), the signal that ended it."""
    chain: list[dict[str, Any]] = []
    ring: dict[str, Any] | None = first
    seen: set[Any] = set()
    while ring is not None and id(ring) not in seen:
        seen.add(id(ring))
        killer = signalled(ring)
        if killer is None or not killer.get("signal"):
            break
        to = [m for m in dead if _killed_by_pid(m, killer.get("sender_pid"), ring.get("host"))] or [ring]
        host, pid = ring.get("host"), killer.get("sender_pid")
        sender = next((m for m in dead if m.get("pid") == pid and m.get("host") == host), None)
        chain.insert(0, {"signal": killer.get("signal"), "sender": killer.get("sender"), "sender_pid": pid,
                         "time": killer.get("time"), "launcher": launcher_said((sender or {}).get("death")),
                         "to": [_who(m) for m in to[:SHOWN]], "to_count": len(to)})  # fmt: skip
        ring = sender
    return chain


def _killed_by_pid(m: dict[str, Any], pid: Any, host: Any) -> bool:
    killer = signalled(m)
    return killer is not None and pid is not None and killer.get("sender_pid") == pid and m.get("host") == host
