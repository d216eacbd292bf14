"""The account of many processes at once, the same length at 8 ranks and at 8,000.

Pure functions over a bundle's (or a job's) metadata and its rank rows
(``recovery.ranks.rank_rows``): the attempts, the first death, the other ranks
grouped by how they ended, and the outliers. The per-rank detail stays in
ranks.parquet.
"""

from __future__ import annotations

import statistics
from typing import Any

from .._times import epoch_ns
from .._units import human_bytes
from ..recovery.attempts import group_attempts
from ..recovery.crash import short_frame
from ..recovery.headline import LAUNCHERS
from ..recovery.helpers import ROLE

DEFAULT_CLOCK_ERROR_S = 0.1  # assumed where a host's time service did not say how far off it may be
MAX_GROUPS = 12
MAX_MISSING = 20


def _t(iso: str | None) -> float | None:
    ns = epoch_ns(iso)
    return None if ns is None else ns / 1e9


def _who(r: dict[str, Any]) -> str:
    if (helper := _rank_helper(r)) is not None:
        return f"{helper} (host {r.get('host')}, pid {r.get('pid')})"
    if r.get("rank") is not None:
        return f"rank {r['rank']} (host {r.get('host')}, pid {r.get('pid')})"
    return f"pid {r.get('pid')} on host {r.get('host')}"


def _rank_helper(r: dict[str, Any]) -> str | None:
    """``rank 1's worker``: a process of a rank's that is not the rank itself (its DataLoader's or a Pool's worker,
    which inherits the rank's number: ``of_rank``, set by ``_of_ranks``), by its role; None for any other."""
    role = r.get("role")
    if r.get("of_rank") is not True or not isinstance(r.get("rank"), int) or not isinstance(role, str):
        return None
    return f"rank {r['rank']}'s {role.replace('_', ' ')}"


def _of_ranks(mains: set[tuple[Any, Any]], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` (rows, the first death, a hang's entries), each process of a rank's own copied with ``of_rank``:
    not its main process (role) while that rank's main process is on its host (``mains``: (host, rank)). An
    ``mp.spawn`` rank is a multiprocessing worker too, but no other process has its rank."""
    return [r | {"of_rank": True} if r.get("role") not in (None, "main") and (r.get("host"), r.get("rank")) in mains
            else r for r in items]  # fmt: skip


def _seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if abs(s) < 1 else f"{s:.1f} s"


def _step(v: Any) -> str:
    return "-" if v is None else f"{v:,}"


MAX_ATTEMPT_LINES = 10  # earlier attempts listed by name; beyond, the first and last few and a count


def _job_name(a: dict[str, Any]) -> str:
    return f"job `{a['job']}`" if a.get("job") else "the rings without a job id"


def _attempt_line(a: dict[str, Any], of: int, jobs: int) -> str:
    where = f"{_job_name(a)}, " if jobs > 1 else ""
    d = a.get("first_death")
    if not d:
        return f"- {where}attempt {a['attempt']} of {of}: {a['cause']}, last step {_step(a.get('last_step'))}"
    who = f"rank {d['rank']} on {d['host']}" if d.get("rank") is not None else f"pid {d['pid']} on {d['host']}"
    return f"- {where}attempt {a['attempt']} of {of}: {d['cause']} at step {_step(d.get('step'))} ({who}, {d['time']})"


def attempt_lines(attempts: list[dict[str, Any]]) -> list[str]:
    """The last attempt (of the job that started last) first, then one line for each earlier one, at
    most ``MAX_ATTEMPT_LINES`` of them (the first and the last few, and how many more)."""
    if len(attempts) < 2:
        return []
    last = attempts[-1]
    counts: dict[Any, int] = {}
    for a in attempts:
        counts[a.get("job")] = max(counts.get(a.get("job"), 0), a["attempt"])
    jobs, n = len(counts), last["attempt"]
    lines = ["## Attempts", ""]
    if jobs > 1:
        lines.append(f"These rings are of {jobs} jobs. This account is of the job that started last, "
                     f"{_job_name(last)}: its attempt {n} of {n}. "
                     "Earlier attempts, of it and of the other jobs:")  # fmt: skip
    else:
        lines.append(f"This account is of attempt {n} of {n} (the last). Earlier attempts:")
    lines.append("")
    earlier = [_attempt_line(a, counts[a.get("job")], jobs) for a in attempts[:-1]]
    if len(earlier) > MAX_ATTEMPT_LINES:
        half = MAX_ATTEMPT_LINES // 2
        more = len(earlier) - 2 * half
        earlier = [*earlier[:half], f"- ... and {more} more (metadata.json: attempts)", *earlier[-half:]]
    return [*lines, *earlier, ""]


def _error(r: dict[str, Any]) -> float:
    e = r.get("clock_error_s")
    return float(e) if isinstance(e, (int, float)) else DEFAULT_CLOCK_ERROR_S


def first_death_lines(first: dict[str, Any] | None, rows: list[dict[str, Any]]) -> list[str]:
    """Who died first; and where a death on another host is closer than the two clocks can tell apart,
    that the order between them is not known."""
    if not first:
        return [_no_death(rows), ""]
    if first.get("alive"):  # a snapshot of one that runs on (a hang recovered by hand), no death
        return [f"**No death: {_who(first)} is still running**; recovered as a snapshot at {first['time']}, step "
                f"{_step(first.get('step'))}.", *(["", first["headline"]] if first.get("headline") else []), ""]
    lines = [f"**First death: {_who(first)}**, `{first['cause']}` at {first['time']}, step {_step(first.get('step'))}."]
    if first.get("headline"):
        lines += ["", first["headline"]]
    torn = [r for r in rows if r.get("collateral_of") is not None]
    if torn:
        lines += ["", _torn_down_sentence(first, rows, torn)]
    t0 = _t(first["time"])
    me = next((r for r in rows if r.get("pid") == first.get("pid") and r.get("host") == first.get("host")), {})
    e0 = _window(me)
    close: list[tuple[float, float, dict[str, Any]]] = []
    uncertain: list[tuple[float, dict[str, Any]]] = []
    for r in rows:
        t = _t(r.get("death_time"))
        if t is None or t0 is None or r is me or r.get("cause") in ("clean_exit", None) or r.get("collateral_of"):
            continue
        margin = 0.0 if r.get("host") == first.get("host") else _error(me) + _error(r)
        if r.get("host") != first.get("host") and abs(t - t0) <= margin:
            close.append((abs(t - t0), margin, r))
        elif t <= t0 + e0 + margin and t0 <= t + _window(r) + margin and (e0 or _window(r)):
            uncertain.append((t, r))  # its death's window and the first's overlap: either may have come first
    if close:
        gap, margin, r = min(close, key=lambda c: c[0])
        lines += ["", f"Order not known: {_who(r)} died {gap * 1e3:.1f} ms from it, within the two hosts' clock "
                      f"error (±{margin * 1e3:.0f} ms together; ±{DEFAULT_CLOCK_ERROR_S * 1e3:.0f} ms assumed per "
                      "host whose time service did not report one). "
                      f"{len(close)} death(s) on other hosts are that close."]  # fmt: skip
    if uncertain and t0 is not None:
        t, r = min(uncertain, key=lambda c: c[0])
        lines += ["", f"Order not known: {_who(r)} ended {_seconds(abs(t - t0))} {'before' if t < t0 else 'after'} "
                      "it by their last records, "
                      f"within the time their deaths may have come after those records (up to {_seconds(_window(r))} "
                      f"for it, {_seconds(e0)} for the first death, the longest gap between each one's last "
                      f"records). {len(uncertain)} death(s) are that close."]  # fmt: skip
    lines += _starved_lines(rows)
    return [*lines, ""]


def _no_death(rows: list[dict[str, Any]]) -> str:
    """The sentence where no process died of its own cause: where one signal reached several and the topmost took
    it in its own handler and exited 0 (``timeout``'s SIGTERM, a checkpoint saved), the others ended by it."""
    none = "No process records a death: every writer ended cleanly or is still running."
    torn = [r for r in rows if r.get("same_signal") and r.get("collateral_of") is not None]
    if not torn:
        return none
    top = next((r for r in rows if (r.get("host"), r.get("pid")) == (torn[0].get("host"), torn[0]["collateral_of"])),
               None)  # fmt: skip
    if top is None:
        return none
    sig, by = torn[0]["same_signal"], f" from {torn[0]['stopped_by']}" if torn[0].get("stopped_by") else ""
    return (f"No process died of its own cause: one {sig}{by} reached them at once; {_short(top)} took it in its "
            f"own handler and exited cleanly, {_named(torn)} ended by it.")  # fmt: skip


def _window(r: dict[str, Any]) -> float:
    """How long after its recorded time a death may have come (``death_time_error_s``; 0 where unknown)."""
    e = r.get("death_time_error_s")
    return float(e) if isinstance(e, (int, float)) and e > 0 else 0.0


def _starved_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Processes starved of CPU at their end: their last records, the times of their deaths, may be early."""
    starved = [r for r in rows if isinstance(r.get("starved_late_s"), (int, float))]
    if not starved:
        return []
    late = max(r["starved_late_s"] for r in starved)
    return ["", f"Starved at the end: {_named(starved)} ({len(starved)} of {len(rows)}): their samplers ran up to "
                f"{_seconds(late)} later than asked, short of CPU or of the GIL; the time of a death that left no "
                "record of its own is its last record, which may be older than the death by that much."]  # fmt: skip


ENDED = {
    "killed": "killed", "host_oom_kill": "killed by the kernel's OOM killer",
    "userspace_oom_kill": "killed by a userspace OOM killer", "signal": "ended by a signal",
    "interrupted": "interrupted", "exception": "died of an uncaught exception",
    "oom_exception": "died of an out-of-memory exception", "nonzero_exit": "exited with an error", "hang": "hung",
}  # fmt: skip
MAX_NAMED = 6  # ranks (or ranges of ranks) named in one list


def _short(r: dict[str, Any]) -> str:
    if (helper := _rank_helper(r)) is not None:
        return f"{helper} (pid {r.get('pid')})"
    return f"rank {r['rank']}" if r.get("rank") is not None else f"pid {r.get('pid')}"


def _role_of(r: dict[str, Any]) -> str:
    """``multiprocessing worker ``: a process's role as its headline names it (``helpers.ROLE``), but the main one's."""
    role = str(r.get("role"))
    return f"{ROLE[role]} " if role in ROLE and role != "main" else ""


def _named(rows: list[dict[str, Any]]) -> str:
    """``ranks 0 and 2``, ``ranks 0, 2 to 9 and 12``: ranks as ranges, processes without one by role and pid,
    at most ``MAX_NAMED`` parts and how many more."""
    ranks = sorted({r["rank"] for r in rows if isinstance(r.get("rank"), int) and _rank_helper(r) is None})
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and runs[-1][1] == rank - 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    parts: list[str] = []
    for lo, hi in runs:
        parts += [f"{lo} to {hi}"] if hi > lo + 1 else [str(v) for v in range(lo, hi + 1)]
    parts = [("rank " if len(ranks) == 1 else "ranks ") + parts[0], *parts[1:]] if parts else []
    parts += [_short(r) for r in rows if _rank_helper(r) is not None]
    parts += [f"{_role_of(r)}pid {r.get('pid')}" for r in rows
              if not isinstance(r.get("rank"), int)]  # fmt: skip
    if len(parts) > MAX_NAMED:
        parts = [*parts[:MAX_NAMED], f"{len(parts) - MAX_NAMED} more"]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _torn_down_sentence(first: dict[str, Any], rows: list[dict[str, Any]], torn: list[dict[str, Any]]) -> str:
    """``3 ranks: rank 1 killed; ranks 0 and 2 stopped by torchrun after rank 1 died.``"""
    ranks = all(r.get("rank") is not None and r.get("role") in (None, "main") for r in rows)
    noun = "ranks" if ranks else "processes"
    parts = [f"{_short(first)} {ENDED.get(first['cause'], first['cause'])}"]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in torn:
        by.setdefault(_after_first(first, r), []).append(r)
    parts += [f"{_named(members)} {after}" for after, members in by.items()]
    me = (first.get("host"), first.get("pid"))
    dead = [r for r in rows if r.get("collateral_of") is None and r.get("cause") not in ("clean_exit", None)
            and (r.get("host"), r.get("pid")) != me]  # fmt: skip
    hung = [r for r in dead if first["cause"] == "hang" and r.get("cause") == "hang"]  # stuck as the first was
    if hung:
        parts.append(f"{_named(hung)} hung too")
    others = len(dead) - len(hung)
    if others:
        parts.append(f"{others} other{'s' if others != 1 else ''} died of {'their' if others != 1 else 'its'} own "
                     f"cause{'s' if others != 1 else ''}")  # fmt: skip
    clean = sum(1 for r in rows if r.get("cause") == "clean_exit" and r.get("collateral_of") is None)
    if clean:
        parts.append(f"{clean} ended cleanly")
    return f"{len(rows)} {noun}: " + "; ".join(parts) + "."


def _after_first(first: dict[str, Any], r: dict[str, Any]) -> str:
    """How a collateral row ended, after the first death: stopped by its launcher; in a hang, that or its own
    end while it waited for the stuck rank (a collective's timeout)."""
    if r.get("same_signal"):  # one signal to many at once (a process group's): not after the first, with it
        by = f" from {r['stopped_by']}" if r.get("stopped_by") else ""
        return f"ended with it by the same {r['same_signal']}{by} (one signal to them all)"
    if r.get("lost_peer"):  # its own exception, of its peer's loss (gloo's "Connection closed by peer")
        return f"lost a peer after {_short(first)} died"
    if r.get("reported"):  # a launcher's exception or status, telling of its rank's death
        return f"reported {_short(first)}'s death and ended (`{r.get('cause')}`)"
    role = str((first.get("victim") or {}).get("role") or "")
    by_first = bool(r.get("stopped_by")) and first.get("rank") is None and r["stopped_by"] in role
    if first.get("cause") != "hang" and by_first:  # the first death is the launcher that stopped it, as it went down
        return f"stopped by {_short(first)} ({r['stopped_by']}) as it went down"
    if first.get("cause") != "hang":
        return f"stopped by {r.get('stopped_by') or 'the parent process'} after {_short(first)} died"  # a Pool's main
    if r.get("stopped_by"):
        return f"stopped by {r['stopped_by']} after {_short(first)} hung"
    if r.get("rank") is None:  # the launcher: torchrun's agent failing the job
        return f"ended (`{r.get('cause')}`) after {_short(first)} hung"
    return f"ended (`{r.get('cause')}`) while waiting for {_short(first)}"


RUNNING = "still running when recovered (snapshots, not deaths)"


def ended_lines(first: dict[str, Any] | None, rows: list[dict[str, Any]],
                alive: frozenset[tuple[Any, Any]] = frozenset()) -> list[str]:  # fmt: skip
    """The processes grouped by how they ended: count and time spread after the first death. ``alive``:
    (host, pid) of the processes that ran on (the attempt's ``still_running``)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    collateral: set[str] = set()  # the groups of processes torn down after the first death
    for r in rows:
        if (r.get("host"), r.get("pid")) in alive:
            key = RUNNING
        elif r.get("collateral_of") is not None and (first or r.get("same_signal")):  # not a death of its own
            key = _after_first(first or {}, r)  # (torn down after the first death, or ended with it by one signal)
            collateral.add(key)
        else:
            key = f"`{r.get('cause') or 'unknown'}`"
        groups.setdefault(key, []).append(r)
    t0 = _t(first["time"]) if first else None
    me = (first.get("host"), first.get("pid")) if first else None
    lines = ["## How they ended", ""]
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for cause, members in ordered[:MAX_GROUPS]:
        ranks = sum(1 for m in members if m.get("rank") is not None)
        noun = ("rank" if ranks == len(members) else "process") + ("" if len(members) == 1 else
                ("s" if ranks == len(members) else "es"))  # fmt: skip
        times = [t for t in (t0 if (m.get("host"), m.get("pid")) == me else _t(m.get("death_time")) for m in members)
                 if t is not None]  # (the first death's own row at its time: a table's rounding read "-0 ms")
        text = f"- {len(members)} {noun} {cause}"
        if cause == RUNNING:
            lines.append(f"{text}: {_named(members)}")
            continue
        if cause in collateral:
            within = f", within {_seconds(max(times) - t0)}" if times and t0 is not None and max(times) >= t0 else ""
            lines.append(f"{text}{within}: {_named(members)} (collateral, not counted as deaths)")
            continue
        if times and t0 is not None and cause != "`clean_exit`":
            lo, hi = min(times) - t0, max(times) - t0
            others = [m for m in members if (m.get("host"), m.get("pid")) != me]
            if lo == hi == 0:
                text += " (the first death)"
            elif lo == 0 and 0 < len(others) < len(members):  # (the first death is not "within" it: it is it)
                text += f" (the first death, then {len(others)} more within {_seconds(hi)})"
            elif lo >= 0:
                text += f" within {_seconds(hi)} after the first death"
            else:
                text += f", from {_seconds(lo)} to {_seconds(hi)} around the first death"
        lines.append(text)
    if len(ordered) > MAX_GROUPS:
        lines.append(
            f"- {sum(len(m) for _, m in ordered[MAX_GROUPS:])} more in {len(ordered) - MAX_GROUPS} other causes"
        )
    return [*lines, ""]


def running_lines(attempt: dict[str, Any]) -> list[str]:
    """The processes of the attempt that ran on past its first death (an orphaned rank of a killed launcher:
    still holding its memory and devices), each with where it was (its headline: stuck, waiting, or working)."""
    running = attempt.get("still_running") or []
    if not running:
        return []
    count = int(attempt.get("still_running_count") or len(running))
    lines = ["## Still running", "",
             f"{count} process{'es' if count > 1 else ''} of this attempt ran on past its first death (orphaned: "
             "no launcher will stop them; they still hold their memory and devices). As recovered:", ""]  # fmt: skip
    lines += [f"- {_who(r)}: {r.get('headline') or 'no death recorded'}" for r in running]
    if count > len(running):
        lines.append(f"- {count - len(running)} more")
    return [*lines, ""]


def _frames(stack: Any, shown: int = 4) -> str:
    frames = str(stack).split(";") if stack else []
    text = " ← ".join(f"`{short_frame(f)}`" for f in reversed(frames[-shown:]))
    return text + (" ← …" if len(frames) > shown else "")


def hang_lines(hang: dict[str, Any] | None) -> list[str]:
    """An attempt's hang (``recovery.stuck_rank.attempt_hang``): the stuck rank, how long and where; the ranks that
    waited for it and where; the signals that ended it, first sent first."""
    if not hang or not hang.get("stuck"):
        return []
    stuck = hang["stuck"]
    first = stuck[0]
    who = _named(stuck) + (f" (of {hang['stuck_count']})" if hang.get("stuck_count", 0) > len(stuck) else "")
    step_s = f"; its steps took {hang['step_s']:.3g} s" if isinstance(hang.get("step_s"), (int, float)) else ""
    where = f"stuck in {_frames(first['stack'])}" if first.get("stack") else "with no stack sampled"
    then = "before any step" if first.get("step") is None else f"after step {_step(first.get('step'))}"
    since = (f"since step {_step(first.get('step'))} at {first.get('since')}{step_s}" if step_s else
             f"the same stack since {first.get('since')}, {then}")  # (too few steps to time: ``hang._same_stack``)
    lines = [f"**A hang:** {who} made no progress for {_secs(first.get('stalled_s'))} before the end ({since}), "
             f"{where}."]  # fmt: skip
    if hang.get("busy"):  # the others waited for a rank at work: a slow evaluation, or a loop that never ends
        work = f" in `{short_frame(first['work'])}`" if first.get("work") else ""
        most = f"; most often in {_frames(first['stack'])}" if first.get("stack") else ""
        its = "their stacks" if len(stuck) > 1 else "its stack"
        lines = [f"**Waiting for a rank at work:** {who} took no step for {_secs(first.get('stalled_s'))} before the "
                 f"end ({since}), at work{work}, {its} changing all along (not stuck: no hang){most}."]  # fmt: skip
    for w in hang.get("at_work") or []:  # beside the stuck rank, a rank at work (its own evaluation)
        lines.append(f"- {_short(w)} was at work meanwhile" + (f", in `{short_frame(w['work'])}`" if w.get("work")
                                                                else "") + " (its stack changing: not stuck)")
    groups: dict[str, list[dict[str, Any]]] = {}
    for w in hang.get("waited") or []:
        how = f"in {w['collective']}" if w.get("collective") else f"at `{short_frame(w['site'])}`" if w.get("site") \
            else "waiting"  # (for a worker, a pool, a queue: no collective)
        groups.setdefault("timed out" if w.get("timed_out") else how, []).append(w)
    more = hang.get("waited_count", 0) - len(hang.get("waited") or [])
    for how, members in groups.items():
        told = f" ({members[0]['timed_out']})" if how == "timed out" else ""
        at = f" from step {_step(members[0].get('step'))}" if members[0].get("step") is not None else ""
        lines.append(f"- {_named(members)} waited for it{at}, " + (f"then timed out{told}" if told else how))
    if more > 0:
        lines.append(f"- {more} more waited (metadata.json: attempts[].hang)")
    fr = hang.get("flight_recorder")
    if isinstance(fr, dict):
        behind = ", ".join(f"{_short(b)}'s last was #{b.get('last_seq')}" for b in (fr.get("behind") or [])[:MAX_NAMED])
        lines.append(f"- the flight recorder's dumps: {_named(fr.get('entered') or [])} entered {fr.get('collective')} "
                     f"#{fr.get('seq')} (process group {fr.get('pg')}); {behind}")  # fmt: skip
    chain = hang.get("chain") or []
    for i, link in enumerate(chain):
        to = link.get("to") or []
        after = chain[i + 1] if i + 1 < len(chain) else None
        if after is not None and len(to) == 1 and to[0].get("pid") == after.get("sender_pid"):
            named = f"{_sender(after)} (pid {after.get('sender_pid')})"  # the launcher the next signal came from
        else:
            named = _named(to) + (f" (of {link['to_count']})" if link.get("to_count", 0) > len(to) else "")
        lines.append(f"- then {_sender(link)} (pid {link.get('sender_pid')}) sent {link.get('signal')} to {named} "
                     f"at {link.get('time')}")  # fmt: skip
    return [*lines, ""]


def _sender(link: dict[str, Any]) -> str:
    said = link.get("launcher") or LAUNCHERS.get(str(link.get("sender")), link.get("sender"))
    return str(said or "an unknown sender")


def _secs(v: Any) -> str:
    return _seconds(float(v)) if isinstance(v, (int, float)) else "?"


HIGH = 1.2  # a peak or a step time this many times the median is an outlier
LOW = 0.99  # a last step this far below the median is one


def _outlier(rows: list[dict[str, Any]], column: str, what: str, fmt: Any, low: bool = False) -> str | None:
    have = [r for r in rows if r.get(column) is not None]
    if len(have) < 2:
        return None
    pick = (min if low else max)(have, key=lambda r: r[column])
    median = statistics.median(r[column] for r in have)
    if (pick[column] > LOW * median) if low else (pick[column] < HIGH * median):
        return None
    return f"- {what}: {_who(pick)} {fmt(pick[column])} (median {fmt(median)})"


def outlier_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The highest peaks, the slowest last step, the earliest stop, and ranks that left no ring."""
    found = [
        _outlier(rows, "peak_host_rss", "highest peak host RSS", lambda v: human_bytes(int(v))),
        _outlier(rows, "peak_gpu_allocated", "highest peak GPU allocated", lambda v: human_bytes(int(v))),
        _outlier(rows, "last_step_s", "slowest last step", lambda v: f"{v:.3f} s"),
        _outlier(rows, "last_step", "stopped earliest", lambda v: f"at step {_step(int(v))}", low=True),
    ]
    lines = [line for line in found if line]
    sizes = {r["world_size"] for r in rows if isinstance(r.get("world_size"), int)}
    if sizes:
        world = max(sizes)
        present = {r["rank"] for r in rows if isinstance(r.get("rank"), int)}
        missing = sorted(set(range(world)) - present)
        if missing:
            shown = ", ".join(map(str, missing[:MAX_MISSING])) + (", ..." if len(missing) > MAX_MISSING else "")
            lines.append(f"- {len(missing)} of {world} ranks left no ring: {shown}")
    return ["## Outliers", "", *lines, ""] if lines else []


def across_lines(meta: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Attempts, first death, how the last attempt's processes ended, outliers; at most ~70 lines."""
    attempts = meta.get("attempts") or []
    if len(attempts) > 1:
        groups = group_attempts(rows)  # the rows of the attempt this account is of, grouped as its rings were
        rows = groups[-1] if groups else rows
    first = meta.get("first_death")
    last = attempts[-1] if attempts else {}
    alive = frozenset((r.get("host"), r.get("pid")) for r in last.get("still_running") or [])
    mains = {(r.get("host"), r.get("rank")) for r in rows if isinstance(r.get("rank"), int) and r.get("role") in
             (None, "main")}  # fmt: skip
    if mains:  # a rank's own processes named as its (``_rank_helper``)
        rows = _of_ranks(mains, rows)
        first = _of_ranks(mains, [first])[0] if first else first
        if isinstance(hang := last.get("hang"), dict):
            named = {k: _of_ranks(mains, hang.get(k) or []) for k in ("stuck", "waited", "at_work")}
            last = last | {"hang": hang | named}
    return [
        *attempt_lines(attempts),
        "## First death",
        "",
        *first_death_lines(first, rows),
        *hang_lines(last.get("hang")),
        *running_lines(last),
        *ended_lines(first, rows, alive),
        *outlier_lines(rows),
        "One row per process, with its peaks and last step: `ranks.parquet`.",
        "",
    ]
