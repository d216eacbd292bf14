"""The jobs and attempts among many rings, each attempt's first death, and the ranks torn down after it.

Pure functions over a few fields of each ring's metadata (``slim``): a bundle's
rings, or every host's rings of a job read from node bundles.

A new job or attempt needs evidence; timing alone never opens one (ranks of a
large job start over minutes and die one after another, and are still one run):

1. a different job id (``job``: Slurm's job id, torchrun's run id, ``blackbox
   run``'s run id) is a different job. A ring without one joins the job that was
   running when it started, else the rings without an id are one job. A
   launcher of ranks (a ring without a rank whose children on its host are
   ranks: torchrun's agent, which under ``blackbox run -- torchrun`` has the
   run's id, its ranks torchrun's) joins its ranks' job, and the attempt
   running when it ended. The nodes of one world are one job (``_one_world``):
   jobs whose ranks, of one world size, are each a part of that world, none in
   two of them, together all of it, running at once (`blackbox run -- torchrun
   --nnodes 2` on each node gives each node's rings its run's id);
2. within a job, the launcher's restart count (``attempt``) changing is a new
   attempt;
3. a process that already has a ring in the attempt starting again after that
   ring ended is a new attempt (a rerun or requeue the launcher did not count):
   the same rank (a main process with a rank), or, where there is no job id (a
   plain command run again), a main process without a rank on the same host.
   Processes without a rank in a job with an id (Slurm tasks, a launcher's own
   process) are many to a host: one ending before another starts is no restart.

A ring that cannot say (no count, no rank: a DataLoader worker, a helper) joins
the attempt running when it started, or, its start unknown, when it last wrote.

Collateral: a rank torn down by its launcher after another rank of its attempt
died did not die of its own cause. Its death is a signal (``killed_by``) sent by
its parent (torchrun's agent starts its ranks) or by a known launcher
(``LAUNCHERS``, named by the sender's command), recorded after the attempt's
first death that is not such a teardown (on another host: later than that
death by more than the two clocks' error, so that a skewed clock does not make
the teardown first), or sent by a process of the job that itself died of its own
cause within ``UNWINDING_S`` after (a ``multiprocessing.Pool``'s ``__exit__``
terminates its workers while a task's exception unwinds, before the excepthook
records it: the pool's owner's death is the cause). It keeps its cause, is marked
``collateral_of`` (that death's rank, host and pid, and ``by``: the launcher's
name where the sender is a known one, else None: a parent may be ``blackbox
run`` passing on a signal whose sender it did not record, and it is never named
as the sender), and is never the first death nor counted among the deaths. So
are a rank that died of its peer's loss after that death (``peer_lost``: gloo's
"Connection closed by peer"), and a launcher whose own end came as it reported
that death (the exception launchers raise for a failed child, ``REPORTS``:
torchrun's agent's ChildFailedError, ``torch.multiprocessing.spawn``'s
ProcessRaisedException; ``accelerate launch``'s CalledProcessError or status):
``lost_peer`` and ``reported`` in ``collateral_of``.

One signal to many (``_one_signal``): where the first death came of a signal from outside the attempt that
ended others at once (the same signal from the same sender within ``ONE_SIGNAL_S``: ``timeout``'s SIGTERM to
its process group, a terminal's Ctrl-C, Slurm's signal to every task), the topmost of them by their parents is
the death told (the job's main process, not the DataLoader worker or spawned rank the kernel reached first),
and the others are collateral of it with ``same_signal``, ``by`` the sender.

A hang (``stuck_rank.attempt_hang``): where ranks stalled in a collective, or died of its timeout, while
another stalled outside any, that stuck rank is the first death whatever signal landed first, and every
other death of the attempt (the ranks that waited, the launcher the end's signal passed through) is
collateral of it, ``by`` the launcher or what ended the job (``timeout``).

Deaths are ordered by their times; where the first was starved at its end (``death.starved``: its last
record, the time of a SIGKILL, may be older than its death by up to ``time_error_s``), the first death
within that window of a process that ran on time comes first, where there is one (``timing``), unless that
death tells that a peer went away (``death.peer_lost``: gloo's "Connection reset by peer", NCCL's "remote
process exited"), or is a launcher's teardown signal, or a launcher's own end where a child of it died: each
came after a death, so it never displaces one (a rank SIGKILLed while starved, then torchrun's SIGTERM to
another and its own exit, all within the first one's window).

A ring telling of a child's death that the child's own ring tells too (a launcher's ring, of the
kernel's OOM kill of its rank) is never the first death: the child's ring is.
"""

from __future__ import annotations

from typing import Any

from .._times import epoch_ns
from .hang import SHOWN, handler_ended, hang_headline, waited_headline
from .headline import LAUNCHERS
from .helpers import launcher_said
from .stuck_rank import attempt_hang, ended_from_outside, ranked, signalled

# The exceptions launchers raise for a child that failed: a launcher's report of a death, not one of its own
REPORTS = ("ChildFailedError", "ProcessRaisedException", "ProcessExitedException")
ENDERS = ("timeout", "scancel", "srun", "slurmd", "kubelet")  # what ends a hung job from outside, by name
SLIM = ("rank", "host", "pid", "ppid", "role", "job", "attempt", "started_at", "last_event_at", "last_step",
        "clock_error_s")  # fmt: skip
DEFAULT_CLOCK_ERROR_S = 0.1  # assumed where a host's time service did not say how far off its clock may be
ONE_SIGNAL_S = 1.0  # deaths by one signal from one sender this close: one signal to many (a process group)
FAULTS = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGSYS", "SIGTRAP")  # a process's own
UNWINDING_S = 30.0  # a sender that tore a ring down and died of its own cause this soon after: the cause
SLIM_DEATH = ("cause", "confidence", "headline", "victim", "time", "step", "hang", "time_error_s", "starved",
              "peer_lost", "in_shutdown", "alive")  # fmt: skip
SLIM_KILLER = ("signal", "sender", "sender_pid", "time")


def slim(m: dict[str, Any]) -> dict[str, Any]:
    """What grouping into jobs and attempts, and naming their first deaths, take of a ring's metadata."""
    death = m.get("death") or {}
    killer = death.get("killed_by")
    out = {k: m.get(k) for k in SLIM} | {"death": {k: death.get(k) for k in SLIM_DEATH}}
    out["death"]["killed_by"] = {k: killer.get(k) for k in SLIM_KILLER} if isinstance(killer, dict) else None
    took = death.get("handled_by")
    out["death"]["handled_by"] = {k: took.get(k) for k in SLIM_KILLER} if isinstance(took, dict) else None
    out["raised"] = raised(m)
    return out


def _span(m: dict[str, Any]) -> tuple[str, str]:
    """(start, end) of a ring as ISO strings, which sort as times do."""
    start = m.get("started_at") or m.get("last_event_at") or ""
    return start, max(start, m.get("last_event_at") or "")


def _job(m: dict[str, Any]) -> str | None:
    job = m.get("job")
    return job if isinstance(job, str) and job else None


def _count(m: dict[str, Any]) -> int | None:
    count = m.get("attempt")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _slot(m: dict[str, Any]) -> tuple[Any, ...] | None:
    """What a ring is the process of, where a second ring of it means a restart: a rank, or a main
    process without a rank on its host where there is no job id. None: one of many (a worker, a
    helper, a process without a rank in a job with an id)."""
    if m.get("role") not in (None, "main"):
        return None
    rank = m.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return ("rank", rank)
    return ("main", m.get("host")) if _job(m) is None else None


def _launched(rings: list[dict[str, Any]]) -> dict[int, str]:
    """The rings of launchers (a process without a rank whose children on its host are ranks: torchrun's
    agent) -> the job id of those ranks, where the launcher's own differs (`blackbox run -- torchrun`
    gives the agent its run's id, the ranks torchrun's)."""
    parents = {(m.get("host"), m.get("ppid")): _job(m) for m in rings if _job(m) is not None and ranked(m)}
    out = {}
    for m in rings:
        job = parents.get((m.get("host"), m.get("pid"))) if not ranked(m) and m.get("pid") is not None else None
        if job is not None and job != _job(m):
            out[id(m)] = job
    return out


def group_jobs(rings: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rings of each job, the one that started first first (rule 1 of the module docstring)."""
    named: dict[str, list[dict[str, Any]]] = {}
    launched = _launched(rings)
    for m in rings:
        job = launched.get(id(m), _job(m))
        if job is not None:
            named.setdefault(job, []).append(m)
    named = _one_world(named)
    spans = {}
    for job, members in named.items():
        dated = [_span(m) for m in members if _span(m)[0]]
        if dated:
            spans[job] = (min(s for s, _ in dated), max(e for _, e in dated))
    anonymous = []
    for m in (m for m in rings if _job(m) is None and id(m) not in launched):
        at = _span(m)[0]
        running = [j for j, (s, e) in spans.items() if at and s <= at <= e]
        if running:
            named[max(running, key=lambda j: spans[j][0])].append(m)
        else:
            anonymous.append(m)
    jobs = [*named.values(), *([anonymous] if anonymous else [])]
    return sorted(jobs, key=lambda members: min((_span(m)[0] for m in members), default=""))


def _one_world(named: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """``named`` with the jobs that are the nodes of one world merged (rule 1), under the id of the one that
    started first: jobs of ranks of one world size W, each holding fewer than W of them, that overlap in time;
    where their rank sets are disjoint and together are ranks 0 to W-1, exactly. Two worlds of one size at once
    (a rank in two of the jobs) merge nothing."""
    parts: dict[int, list[tuple[str, frozenset[int], tuple[str, str]]]] = {}
    for job, members in named.items():
        sizes = {m.get("world_size") for m in members if ranked(m)}
        ranks = frozenset(int(m["rank"]) for m in members if ranked(m) and m.get("role") in (None, "main"))
        dated = [_span(m) for m in members if _span(m)[0]]
        (size,) = sizes if len(sizes) == 1 else (None,)
        if isinstance(size, int) and 0 < len(ranks) < size and dated:
            parts.setdefault(size, []).append((job, ranks, (min(a for a, _ in dated), max(b for _, b in dated))))
    out = dict(named)
    for size, jobs in parts.items():
        seen = [r for _, ranks, _ in jobs for r in ranks]
        span = (max(s for _, _, (s, _) in jobs), min(e for _, _, (_, e) in jobs))
        whole = len(seen) == len(set(seen)) == size and min(seen) == 0 and max(seen) == size - 1  # (never a range
        if len(jobs) < 2 or not whole or span[0] > span[1]:  # of a world size a bundle may have made up)
            continue  # (not one world's nodes, all of them, all running at one time)
        first = min(jobs, key=lambda j: j[2][0])[0]
        for job, _, _ in jobs:
            if job != first:
                out[first] = [*out[first], *out.pop(job)]
    return out


class _Attempt:
    def __init__(self, count: int | None, start: str) -> None:
        self.count, self.start = count, start
        self.rings: list[dict[str, Any]] = []
        self.ended: dict[tuple[Any, ...], str] = {}  # slot -> when its ring here last wrote


def _attempts_of_job(rings: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rules 2 and 3 of the module docstring, over one job's rings."""
    attempts: list[_Attempt] = []
    parents = {(r.get("host"), r.get("ppid")) for r in rings if ranked(r)}
    launchers = {id(m) for m in rings if not ranked(m) and (m.get("host"), m.get("pid")) in parents}
    for m in sorted((m for m in rings if m.get("started_at") and id(m) not in launchers), key=_span):
        start, end = _span(m)
        count, slot = _count(m), _slot(m)
        current = attempts[-1] if attempts else None
        if count is not None:
            current = next((a for a in reversed(attempts) if a.count == count), None)
            if current is None and attempts and attempts[-1].count is None:
                current = attempts[-1]  # it was opened by rings that do not count (a launcher's own process)
                current.count = count
        if current is None or (slot in current.ended and current.ended[slot] <= start):
            current = _Attempt(count if count is not None else (current.count if current else None), start)
            attempts.append(current)
        current.rings.append(m)
        if slot is not None:
            current.ended[slot] = max(end, current.ended.get(slot, ""))
    # a ring whose start is unknown (a damaged or edited field) opens no attempt of its own: it joins the
    # attempt that had begun when it last wrote (the first, if none had; the last, with no time at all); so
    # does a launcher of ranks (torchrun's agent), whose end is in the attempt running when it ended
    for m in (m for m in rings if not m.get("started_at") or id(m) in launchers):
        if not attempts:
            attempts.append(_Attempt(_count(m), ""))
        pool = [a for a in attempts if a.count == _count(m)] or attempts
        last = m.get("last_event_at") or ""
        pool[-1 if not last else max((i for i, a in enumerate(pool) if a.start <= last), default=0)].rings.append(m)
    return [a.rings for a in attempts]


def group_attempts(rings: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rings of each attempt: the jobs in the order they started, each job's attempts oldest first."""
    return [attempt for job in group_jobs(rings) for attempt in _attempts_of_job(job)]


def job_of(group: list[dict[str, Any]]) -> str | None:
    """The job id of an attempt's rings (rings without one, or a launcher with its own, may have joined it):
    its ranks' where it has ranks."""
    of_ranks = (_job(m) for m in group if ranked(m))
    return next((j for j in of_ranks if j is not None), None) or next((j for j in map(_job, group) if j), None)


def _teardown(m: dict[str, Any]) -> dict[str, Any] | None:
    """The signal that ended this ring (``stuck_rank.signalled``), where its launcher sent it (its parent, or
    a known launcher)."""
    killer = signalled(m)
    if killer is None:
        return None
    pid = killer.get("sender_pid")
    if (isinstance(pid, int) and pid > 0 and pid == m.get("ppid")) or killer.get("sender") in LAUNCHERS:
        return killer
    return None


def _launcher(m: dict[str, Any], killer: dict[str, Any], group: list[dict[str, Any]]) -> str | None:
    """The launcher that sent ``killer`` to ``m``, by the sender's own ring where the attempt holds it (accelerate
    runs torchrun's agent in its own process: the same thread name), else by the sender's command."""
    pid = killer.get("sender_pid")
    sender = next((r for r in group if pid and (r.get("host"), r.get("pid")) == (m.get("host"), pid)), None)
    return launcher_said((sender or {}).get("death")) or LAUNCHERS.get(str(killer.get("sender") or ""))


def _who(m: dict[str, Any]) -> dict[str, Any]:
    return {k: m.get(k) for k in ("rank", "host", "pid")}


def _epoch(iso: str) -> float | None:
    """Seconds since the epoch of a UTC ISO-8601 time (any number of fractional digits); None for an
    edited field (a month 13, a day 32)."""
    ns = epoch_ns(iso)
    return None if ns is None else ns / 1e9


def _error(m: dict[str, Any]) -> float:
    e = m.get("clock_error_s")
    return float(e) if isinstance(e, (int, float)) and not isinstance(e, bool) else DEFAULT_CLOCK_ERROR_S


def _when(m: dict[str, Any]) -> tuple[float, str]:
    """A death's time, to order deaths by (ISO strings of different precisions do not sort as times)."""
    at = _epoch(m["death"]["time"])
    return (at if at is not None else float("inf")), m["death"]["time"]


def _after(m: dict[str, Any], signalled: str | None, first: dict[str, Any]) -> bool:
    """Ring ``m`` was signalled (else died) after ``first`` died: on one host by their times; across
    hosts by more than the two clocks' error."""
    a, b = _epoch(signalled or m["death"]["time"]), _epoch(first["death"]["time"])
    margin = 0.0 if m.get("host") == first.get("host") else _error(m) + _error(first)
    return a is not None and b is not None and a - b > margin


def _by_its_dying_sender(m: dict[str, Any], killer: dict[str, Any], own: list[dict[str, Any]]) -> bool:
    """Ring ``m`` was torn down by a process of the job that then died of its own cause within
    ``UNWINDING_S``: a Pool's ``__exit__`` terminates its workers while the task's exception unwinds, before
    the excepthook records it; the sender's death, later by its clock, is the cause."""
    pid, at = killer.get("sender_pid"), _epoch(str(killer.get("time") or ""))
    for o in own:
        if o.get("pid") == pid and o.get("host") == m.get("host") and at is not None:
            died = _epoch(o["death"]["time"])
            if died is not None and 0 <= died - at <= UNWINDING_S:
                return True
    return False


def _told_by_its_own(m: dict[str, Any], dead: list[dict[str, Any]]) -> bool:
    """Ring ``m``'s death is another process's (its child: a rank under torchrun's agent, a worker) whose
    own ring, dead too, tells it: the kernel's kill of that child, stamped once, read by both."""
    victim = (m["death"].get("victim") or {}).get("pid")
    if not isinstance(victim, int) or isinstance(victim, bool) or victim == m.get("pid"):
        return False
    return any(o is not m and o.get("pid") == victim and o.get("host") == m.get("host") for o in dead)


def _error_s(m: dict[str, Any]) -> float:
    e = m["death"].get("time_error_s")
    return float(e) if isinstance(e, (int, float)) and not isinstance(e, bool) and e >= 0 else 0.0


def _earliest(dead: list[dict[str, Any]], when: dict[int, tuple[float, str]],
              parents: frozenset[tuple[Any, Any]] = frozenset()) -> dict[str, Any]:  # fmt: skip
    """The death that came first, by its time; where that process was starved (its last record, the time of
    a SIGKILL, may be older than its death by up to ``time_error_s``), the first death within that window
    of a process that ran on time until it died, where there is one (not one whose records stopped while it
    waited for a CPU, nor one that came after a death by its nature: a peer gone away, a launcher's teardown
    signal, a launcher's own end where a child of it died, ``parents``). Where every one was starved, the
    times alone decide (nothing better is known)."""
    first = min(dead, key=lambda m: when[id(m)])
    if not first["death"].get("starved"):
        return _killed_with_its_parent(first, dead, when)
    t0 = when[id(first)][0]
    on_time = [m for m in dead if t0 <= when[id(m)][0] <= t0 + _error_s(first) and not m["death"].get("starved")
               and not m["death"].get("peer_lost") and _teardown(m) is None
               and (m.get("host"), m.get("pid")) not in parents]  # fmt: skip
    return _killed_with_its_parent(min(on_time, key=lambda m: when[id(m)]) if on_time else first, dead, when)


def _killed_with_its_parent(
    first: dict[str, Any], dead: list[dict[str, Any]], when: dict[int, tuple[float, str]]
) -> dict[str, Any]:
    """A process SIGKILLed (``killed``: no handler ran) whose parent was SIGKILLed too, within the time its own
    death may lie after its last record, died in one kill with it (a group's SIGKILL, a container's end, a
    grace period's): a parent that outlives a child's death notices it first (a DataLoader's raises "worker
    killed by signal"). The parent's death is then the one told, up to the topmost process so killed: the job's
    own, not whichever of its workers wrote its last record a few milliseconds sooner. Not a launcher over its
    ranks (torchrun's agent, of another rank than its child's): each rank's death is its own."""
    seen = {id(first)}
    while first["death"].get("cause") == "killed":
        t0, error = when[id(first)][0], _error_s(first)
        parent = next((m for m in dead if id(m) not in seen and m["death"].get("cause") == "killed"
                       and (m.get("host"), m.get("pid"), m.get("rank")) == (first.get("host"), first.get("ppid"),
                                                                             first.get("rank"))
                       and t0 <= when[id(m)][0] <= t0 + error), None)  # fmt: skip
        if parent is None:
            return first
        seen.add(id(parent))
        first = parent
    return first


def deaths(
    group: list[dict[str, Any]],
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
    """An attempt's first death (None: none), its collateral rings (see the module docstring), and its hang
    (``stuck_rank.attempt_hang``: the stuck rank is then the first death, its waiters collateral; where the rank
    they waited for was at work, ``busy``, the ends read as without it, and the wait is told beside). Marks
    each collateral ring's slim death with ``collateral_of``. A ring telling of a child's death that the
    child's own ring tells too (a launcher's, of its rank's kernel OOM kill) is never the first death:
    both carry the kernel's one stamp, and which converts it to the earlier time is their clocks' rounding."""
    dead = [m for m in group if m["death"].get("cause") != "clean_exit" and m["death"].get("time")]
    dead = [m for m in dead if not m["death"].get("alive")] or dead  # a snapshot of one running on is no death
    exits = [m for m in group if m["death"].get("cause") == "clean_exit" and m["death"].get("time") and
             handler_ended(m["death"]) is not None and isinstance(m["death"].get("hang"), dict)]  # fmt: skip
    hung = attempt_hang(dead + exits)  # (one whose handler exits 0 on the end's signal may have hung, or waited)
    at_work = hung if hung is not None and (hung[0]["death"].get("hang") or {}).get("busy") else None
    if at_work is not None:  # the others waited for a rank at work (an evaluation): no hang, and none died first
        hung = None  # for it, as it was stopped with them (it read "rank 0 ended by SIGTERM from torchrun", the first)
        at_work[2].pop("_stuck")
        for m in at_work[1]:
            _waited_for_work(m, at_work[0], group)
    if hung is not None:  # a hang: the stuck rank first, whatever signal landed first; its waiters collateral
        stuck, waiters, info = hung
        timed = any((m["death"].get("hang") or {}).get("step_s") for m in waiters)
        for m in [stuck, *info.pop("_stuck")]:  # the first, and any other stuck with no steps of its own
            d = m["death"]
            h = d.get("hang")
            ended = d.get("cause") == "hang" or ended_from_outside(m)
            if ended and isinstance(h, dict) and not h.get("busy") and (
                    m is stuck or h.get("step_s") is None):  # hung: as its waiters say (a worker counts no steps);
                by = _launcher(m, signalled(m) or {}, group)  # its launcher named, not its agent's thread
                d.update(cause="hang", headline=hang_headline(d, h, by))
                if h.get("step_s") is None and not timed:
                    d["confidence"] = "probable"  # no steps timed it, its own nor a waiter's: one stack, long
        for m in waiters:  # stopped by their launcher, or, for that launcher itself, by what ended the job
            sender = str((signalled(m) or {}).get("sender") or "")
            by = _launcher(m, signalled(m) or {}, group) or (sender if sender in ENDERS else None)
            m["death"]["collateral_of"] = _who(stuck) | {"by": by} | (
                {"lost_peer": True} if m["death"].get("peer_lost") else {"reported": True} if _reports_a_death(m)
                else {})  # (a waiter's own end as it lost the stuck rank, a launcher's report of it)  # fmt: skip
        return stuck, waiters, info
    when = {id(m): _when(m) for m in dead}
    parents = frozenset((m.get("host"), m.get("ppid")) for m in dead)
    together = _one_signal(dead, group, when, parents)  # one signal ended several at once: the topmost is told
    dead = [m for m in dead if all(m is not o for o in together)]
    torn = {id(m): k for m in dead if (k := _teardown(m)) is not None}
    told = {id(m) for m in dead if _told_by_its_own(m, dead)}
    own = [m for m in dead if id(m) not in torn and id(m) not in told]
    own = [m for m in own if not m["death"].get("in_shutdown")] or own  # its work done; its end's time unknown
    collateral = []
    if own:
        first_own = _earliest(own, when, parents)
        collateral = [m for m in dead if id(m) in torn and (_after(m, torn[id(m)].get("time"), first_own)
                                                           or _by_its_dying_sender(m, torn[id(m)], own))]  # fmt: skip
    gone = {id(m) for m in collateral}
    rest = [m for m in dead if id(m) not in gone and id(m) not in told] or [m for m in dead if id(m) not in gone]
    rest = [m for m in rest if not m["death"].get("in_shutdown")] or rest
    first = _earliest(rest, when, parents) if rest else None
    for m in collateral:
        m["death"]["collateral_of"] = _who(first or {}) | {"by": _launcher(m, torn[id(m)], group)}
    collateral += together
    if first is not None and not first["death"].get("peer_lost"):  # its peers' ends, as theirs say: collateral
        lost = [m for m in rest if m is not first and m["death"].get("peer_lost") and when[id(m)] >= when[id(first)]]
        for m in lost:
            m["death"]["collateral_of"] = _who(first) | {"by": None, "lost_peer": True}
        collateral += lost
    if first is not None:  # a launcher's own end as it reports its rank's death (torchrun's ChildFailedError)
        reports = [m for m in rest if m is not first and not m["death"].get("collateral_of")
                   and _reports_a_death(m) and when[id(m)] >= when[id(first)]]  # fmt: skip
        for m in reports:
            m["death"]["collateral_of"] = _who(first) | {"by": None, "reported": True}
        collateral += reports
        stopped = [m for m in group if m["death"].get("cause") == "clean_exit" and m["death"].get("time") and
                   (k := _teardown(m)) is not None and (_after(m, k.get("time"), first)
                                                        or _by_its_dying_sender(m, k, [first]))]  # fmt: skip
        for m in stopped:  # its own handler of its launcher's teardown exited 0 (a checkpoint saved, then exit)
            m["death"]["collateral_of"] = _who(first) | {"by": _launcher(m, _teardown(m) or {}, group)}
        collateral += stopped  # (it read "2 ended cleanly", no part of the teardown)
    return first, collateral, None if at_work is None else at_work[2] | {"busy": True}


def _signal_of(m: dict[str, Any], ours: set[tuple[Any, Any]]) -> tuple[tuple[Any, ...], float] | None:
    """(host, signal, sender pid) of the signal that ended ring ``m`` (or that its handler took) and the
    time it came, where a process outside the attempt (``ours``: its rings' host and pid) sent it (not a fault: a
    process's own); else None."""
    k = signalled(m)
    if k is None or not isinstance(k.get("signal"), str) or k["signal"] in FAULTS:
        return None
    pid, at = k.get("sender_pid"), _epoch(str(k.get("time") or ""))
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0 or at is None or (
            pid and (m.get("host"), pid) in ours):  # fmt: skip
        return None  # (a signal from a process of the job is its teardown, told apart)
    return (m.get("host"), k["signal"], pid), at  # (its name may be read in one and not another: `kill` exits fast)


def _one_signal(dead: list[dict[str, Any]], group: list[dict[str, Any]], when: dict[int, tuple[float, str]],
                parents: frozenset[tuple[Any, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    """Where the first death came of one signal that ended other processes at once (``timeout``'s SIGTERM to its
    process group, a terminal's Ctrl-C, Slurm's to every task: the same signal from the same sender, outside the
    attempt, within ``ONE_SIGNAL_S``), the others, marked collateral (``same_signal``) of the topmost of them by
    their parents: the job's main process is the death told, not the DataLoader worker or spawned rank the kernel
    reached a few microseconds sooner (nor is the main process its parent's teardown after that worker's death:
    ``timeout`` is the parent of the command it runs). Where that main process took the signal in its own handler and
    exited 0 (a checkpoint saved), the others are collateral of its clean end, and the attempt has no death. Which
    the kernel reached first says nothing of the job."""
    if not dead:
        return []
    first = _earliest(dead, when, parents)
    ours = {(r.get("host"), r.get("pid")) for r in group}  # (once: a thousand tasks' signal, a thousand rings)
    key = _signal_of(first, ours)
    if key is None:
        return []
    clean = [m for m in group if m["death"].get("cause") == "clean_exit" and m["death"].get("handled_by")]
    same = [first] + [m for m in dead + clean if m is not first and (k := _signal_of(m, ours)) is not None
                      and k[0] == key[0] and abs(k[1] - key[1]) <= ONE_SIGNAL_S]  # fmt: skip
    seen = {id(first)}
    while (parent := next((m for m in same if id(m) not in seen and (m.get("host"), m.get("pid")) == (
            first.get("host"), first.get("ppid"))), None)) is not None:  # fmt: skip
        seen.add(id(parent))
        first = parent
    together = [m for m in same if m is not first and m["death"].get("cause") != "clean_exit"]
    named = next((str(took.get("sender")) for m in same if (took := signalled(m) or {}).get("sender")), None)
    for m in together:  # (the topmost may have taken it in its handler and exited 0: then no death is told)
        by = _launcher(m, signalled(m) or {}, group) or named
        m["death"]["collateral_of"] = _who(first) | {"by": by, "same_signal": key[0][1]}
    return together


def _waited_for_work(m: dict[str, Any], busy: dict[str, Any], group: list[dict[str, Any]]) -> None:
    """Ring ``m``, a hang by its own stall, waited (in a collective, for another process) for rank ``busy`` at work
    and was ended by a signal: no hang of its own (it read "hung ... waiting in backward" beside "no hang"). Its
    slim death takes that signal's cause, a headline that says so, and ``waited_for``."""
    d, h, killer = m["death"], m["death"].get("hang"), m["death"].get("killed_by")
    if d.get("cause") != "hang" or not isinstance(h, dict) or not isinstance(killer, dict) or not (
            h.get("collective") or h.get("waits")):  # fmt: skip
        return
    waited = _who(busy) | {"work": (busy["death"].get("hang") or {}).get("work")}
    d.update(cause="killed" if killer.get("signal") == "SIGKILL" else "signal", confidence="certain", waited_for=waited,
             headline=waited_headline(d, h, waited, _launcher(m, killer, group)))


def _reports_a_death(m: dict[str, Any]) -> bool:
    """Ring ``m`` is a launcher's that ended as it reported a death of the job's: by the exception launchers raise
    for a child that failed (``REPORTS``: torchrun's agent, ``accelerate launch`` of several processes,
    torch.multiprocessing.spawn's parent), or, a launcher by its command, by a CalledProcessError or a nonzero
    status (``accelerate launch`` of one process). Another exception of a process that started ranks (its own
    bug, after a rank died) is a death of its own."""
    cause, raised = m["death"].get("cause"), m.get("raised")
    if ranked(m) or cause not in ("exception", "nonzero_exit"):
        return False
    if cause == "exception" and raised in REPORTS:
        return True
    return launcher_said(m["death"]) is not None and (cause == "nonzero_exit" or raised == "CalledProcessError")


def raised(m: dict[str, Any]) -> str | None:
    """The class name of the ring's last uncaught exception (``ChildFailedError``), where it recorded one (a
    bundle's metadata read back: anything of another type is none)."""
    listed = m.get("exceptions")
    found = [e for e in (listed if isinstance(listed, list) else []) if isinstance(e, dict)
             and str(e.get("detail")).startswith("uncaught")]  # fmt: skip
    label = found[-1].get("label") if found else None
    return label.split(":", 1)[0].rsplit(".", 1)[-1].strip()[:200] if isinstance(label, str) and label else None


def attempt_metadata(groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per attempt: its job, its number within the job (1-based, oldest first), the launcher's
    own count, its rings, span, last step, first death and cause, how many died of their own cause
    (``deaths``) and how many were torn down after the first death (``collateral``); where a process
    of it runs on past a death (an orphaned rank), ``still_running``. Marks the collateral rings' slim deaths
    (``collateral_of``)."""
    out: list[dict[str, Any]] = []
    for group in groups:
        job = job_of(group)
        n = out[-1]["attempt"] + 1 if out and out[-1]["job"] == job else 1
        first, collateral, hang = deaths(group)
        dead = sum(1 for m in group if m["death"].get("cause") != "clean_exit" and m["death"].get("time")
                   and not m["death"].get("alive"))  # fmt: skip
        alive = [m for m in group if m["death"].get("alive")] if first and not first["death"].get("alive") else []
        steps = [m["last_step"] for m in group if m.get("last_step") is not None]
        spans = [_span(m) for m in group]
        out.append({
            "job": job,
            "attempt": n,
            "launcher_attempt": next((c for c in map(_count, group) if c is not None), None),
            "rings": len(group),
            "started_at": min(s for s, _ in spans) or None,
            "ended_at": max(e for _, e in spans) or None,
            "last_step": max(steps) if steps else None,
            "cause": first["death"]["cause"] if first else "clean_exit",
            "first_death": _first_death(first),
            "deaths": dead - sum(1 for m in collateral if m["death"].get("cause") != "clean_exit"),
            "collateral": len(collateral),
            **({"hang": hang} if hang is not None else {}),
            **({"still_running": [_who(m) | {"headline": m["death"].get("headline")} for m in alive[:SHOWN]],
                "still_running_count": len(alive)} if alive else {}),
        })  # fmt: skip
    return out


def _first_death(m: dict[str, Any] | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return _who(m) | {"role": m.get("role")} | {k: m["death"].get(k) for k in SLIM_DEATH}
