"""Hangs: a process that made no progress for a long time before it ended, and, across an attempt's ranks,
the rank that was stuck while the others waited for it in a collective.

Pure functions. ``stall`` reads one ring's timeline: how long before its death its last step came, against
its own step time, and what its main thread was doing since (its stack samples). A stall is kept
(``death.hang``) when it is at least ``HANG_FACTOR`` times the median of the last ``STEPS_SEEN`` step
intervals, longer than any of them, and at least ``HANG_MIN_S``; a death by a signal or SIGKILL after such
a stall is a ``hang`` (``with_hang``). A stall is *in a collective* when that stack is inside one
(``torch.distributed``, DeepSpeed's comm, DDP), or, for a rank of several, inside ``backward`` with none of
the job's own code deeper (where DDP all-reduces the gradients; a custom autograd Function's own backward is
the job's code); it *waits* for another process of the job where it is inside multiprocessing's pipes,
queues or pool, a future or a DataLoader's wait for a batch, again with none of its own code deeper (a Pool
worker running a task has the pool's frames above it); else the process was *stuck* where its stack says.
Where the main thread waited for a thread of its own (a join, a queue's get, a future) and it is known which
(every thread is sampled once the main thread stands still, and the thread it joins is marked:
collect/stacks.py, stall_threads.py), that thread and its line are where it was stuck.

A stall whose main thread kept moving (its most sampled stack under ``BUSY_SHARE`` of its samples, or its
stack changing between ``BUSY_MOVES`` of consecutive samples: stall_threads.py) was ``busy``: working without steps, an
evaluation or a checkpoint, not stuck; its death keeps its cause.

Across an attempt's ranks, the rank the others waited for: ``stuck_rank``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._times import epoch_ns
from .allocs import is_job_frame, site_of
from .crash import crashing_stack, innermost_first, short_frame, shutdown_signal
from .headline import sender_named
from .kinds import of_kind
from .stacks import codes as stack_codes
from .stall_threads import (
    busy,
    innermost_is,
    joined,
    waits_for_others,
    with_threads,
)
from .timeline import iso_ns

HANG_FACTOR = 10.0  # a stall this many times the job's own step time (the median of its last steps)...
HANG_MIN_S = 2.0  # ...and at least this long (and longer than any of those steps) is no progress
STEPS_SEEN = 50  # the step intervals the step time is taken from: the last ones
SAME_STACK_S = 10.0  # without steps: the main thread's stack unchanged this long before the end is no progress...
STILL_SAMPLES = 5  # ...in this many samples at least
PLACE_SAMPLES = 3  # a stall with fewer stack samples since its last step names no place...
STALE_S = 2.0  # ...nor one whose last stack sample came this long before its end (the sampler kept out)
# (torchrun's own code, its agent's monitoring loop among it, waits in no collective: the agent's stack held
# still for 10 s read as a rank that waited, "launch_agent (api.py)"); nor do torch.distributed.checkpoint's writes,
# I/O (its collectives go through distributed_c10d: a rank stuck writing its shard read as waiting, the hang untold)
_COLLECTIVE = re.compile(r"/torch/distributed/(?!elastic/|launcher/|run\.py|checkpoint/)|/deepspeed/comm/|"
                         r"/torch/nn/parallel/distributed\.py")
_C10D = re.compile(r"/torch/distributed/distributed_c10d\.py")
# the main process waiting for a batch from its DataLoader's worker processes
_LOADER_WAIT = re.compile(r"_MultiProcessingDataLoaderIter\._(?:try_)?get_data \([^;]*/torch/utils/data/dataloader\.py")
_BACKWARD = re.compile(r"/torch/autograd/|/torch/_tensor\.py")
_MODULE_CALL = re.compile(r"^Module\._call_impl \(.*/torch/nn/modules/module\.py:")  # a module run: its forward
# an exception that is a collective's timeout: gloo's, NCCL's watchdog, the c10d store's
TIMEOUT = re.compile(r"Timed out waiting|Watchdog caught collective operation timeout|collective operation timeout|"
                     r"DistBackendError.*[Tt]imeout|[Ss]ocket [Tt]imeout")  # fmt: skip
HANDLED = "handled by the job's handler"  # a signal record's detail (collect/signals.py)
SHOWN = 20  # ranks listed by name in an attempt's hang (the rest counted)
COMMON_OF = 256  # the distinct stacks a stall's common frame is read from (the first, by code)


def collective_of(stack: str | None, ranked: bool) -> str | None:
    """The collective a folded stack waits in (``all_reduce``, ``barrier``...; ``backward (where DDP
    all-reduces the gradients)`` for a rank of several in autograd), None where it is in none, or where the job's
    own code or a module's forward runs deeper than a distributed wrapper's frame (DDP's forward running the
    model: an evaluation)."""
    if not stack:
        return None
    frames = stack.split(";")
    c10d = [frame.rpartition(" (")[0] for frame in frames if _C10D.search(frame)]
    if c10d:  # the innermost of torch.distributed's public functions (init_process_group, not the helper it calls)
        return next((f for f in reversed(c10d) if not f.startswith("_")), c10d[-1])
    for i in range(len(frames) - 1, -1, -1):
        if _COLLECTIVE.search(frames[i]):  # a wrapper's forward running the model (DDP, FSDP): no wait, at work
            deeper = frames[i + 1 :]
            return None if any(is_job_frame(f) or _MODULE_CALL.search(f) for f in deeper) else short_frame(frames[i])
    if ranked and innermost_is(frames, _BACKWARD):  # (the job's own code deeper: its own backward, stuck there)
        return "backward (where DDP all-reduces the gradients)"
    return None


def stall(table: pa.Table, end_ns: int, ranked: bool) -> dict[str, Any] | None:
    """The ring's stall before ``end_ns`` (its death, UTC ns), where it is one (module docstring): ``since``
    (the last step's time), ``step``, ``stalled_s``, ``step_s`` (the median step time), ``longest_s`` (the
    longest of those steps), ``stack`` (the main thread's most sampled stack since, folded), ``share`` and
    ``samples`` (of its samples since), ``site`` (that stack's innermost frame of the job's own code) and
    ``collective`` (what it waited in, or null). None: no stall, or fewer than two steps to time."""
    steps = of_kind(table, "step", columns=["time", "step"])
    if steps.num_rows < 3:
        return _same_stack(table, end_ns, ranked, steps["step"][-1].as_py() if steps.num_rows else None)
    steps = steps.slice(max(0, steps.num_rows - STEPS_SEEN - 1))  # the last ones are all it reads
    times = steps["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    gaps = np.diff(times[-(STEPS_SEEN + 1) :]) / 1e9
    step_s, longest, last = float(np.median(gaps)), float(gaps.max()), int(times[-1])
    stalled = (end_ns - last) / 1e9
    if stalled < max(HANG_FACTOR * step_s, HANG_MIN_S) or stalled <= longest:
        return None
    stack, share, count, moves, common, sampled = _stack_since(table, last, end_ns)
    quiet = round((end_ns - sampled) / 1e9, 3) if sampled is not None else None
    if count < PLACE_SAMPLES or (quiet or 0) > STALE_S:  # its samples came before it stopped: a C call that held the
        stack = common = share = None  # GIL kept the sampler out since (it read "stuck in" an evaluation's line)
    return with_threads(table, last, end_ns, {"unsampled_s": quiet if stack is None and count else None,
        "since": iso_ns(last), "step": steps["step"][-1].as_py(), "stalled_s": round(stalled, 3),
        "step_s": round(step_s, 6), "longest_s": round(longest, 6), "stack": stack, "share": share,
        "samples": count, "moves": moves, "site": site_of(stack) if stack else None, "work": common,
        "collective": collective_of(stack, ranked), "waits": waits_for_others(stack),
        "loader": bool(stack and _LOADER_WAIT.search(stack))})  # fmt: skip


def _same_stack(table: pa.Table, end_ns: int, ranked: bool, step: int | None) -> dict[str, Any] | None:
    """Without steps to time (a job that counts none, or stuck before its third): the stall is the main
    thread's stack unchanged in every sample over at least ``SAME_STACK_S`` before the end (``STILL_SAMPLES``
    of them at least); ``since`` is the first of those samples, ``step_s`` and ``longest_s`` null. Its place
    is told, but no hang is called (``busy`` null): a stack sample names a line, so a wait in a lock and a
    loop on one line (a generator expression) look the same without steps to tell progress by."""
    rows = of_kind(table, "stack_sample", columns=["time", "label", "detail"])
    rows = rows.filter(pc.less_equal(rows["time"].cast(pa.int64()), end_ns))
    main = rows.filter(pc.equal(rows["label"].cast(pa.string()), "MainThread"))
    rows = main if main.num_rows else rows
    rows = rows.take(pc.array_sort_indices(rows["time"].cast(pa.int64()))).unify_dictionaries().combine_chunks()
    codes, words = stack_codes(rows["detail"])  # (integer codes: a ring's deep stacks as text are gigabytes)
    if len(codes) < STILL_SAMPLES or codes[-1] < 0:
        return None
    other = np.flatnonzero(codes != codes[-1])
    first = int(other[-1]) + 1 if len(other) else 0
    since = int(rows["time"].cast(pa.int64())[first].as_py())
    stalled, stack = (end_ns - since) / 1e9, str(words[codes[-1]])
    if stalled < SAME_STACK_S or len(codes) - first < STILL_SAMPLES:
        return None
    return with_threads(table, since, end_ns, {
        "since": iso_ns(since), "step": step, "stalled_s": round(stalled, 3), "step_s": None, "longest_s": None,
        "stack": stack, "share": 1.0, "samples": len(codes) - first, "moves": 0, "site": site_of(stack),
        "collective": collective_of(stack, ranked), "waits": waits_for_others(stack),
        "loader": bool(_LOADER_WAIT.search(stack))})  # fmt: skip


def _stack_since(
    table: pa.Table, since_ns: int, end_ns: int
) -> tuple[str | None, float | None, int, int, str | None, int | None]:
    """The main thread's most sampled stack after ``since_ns`` (to ``end_ns``), its share, the samples, how many
    times the stack changed from one sample to the next, where all of them were (``_common``), and the last
    sample's time (UTC ns)."""
    rows = of_kind(table, "stack_sample", columns=["time", "label", "detail"])
    t = rows["time"].cast(pa.int64())
    rows = rows.filter(pc.and_(pc.greater(t, since_ns), pc.less_equal(t, end_ns)))
    main = rows.filter(pc.equal(rows["label"].cast(pa.string()), "MainThread"))
    chosen = main if main.num_rows else rows
    chosen = chosen.take(pc.array_sort_indices(chosen["time"].cast(pa.int64())))  # (in time order: its moves)
    codes, words = stack_codes(chosen.unify_dictionaries().combine_chunks()["detail"])
    codes = codes[codes >= 0]
    if not len(codes):
        return None, None, 0, 0, None, None
    n = np.bincount(codes)
    i = int(np.argmax(n))
    moves = int(np.count_nonzero(codes[1:] != codes[:-1]))
    common = _common([str(words[c]) for c in np.unique(codes)[:COMMON_OF]])
    last = int(chosen["time"].cast(pa.int64())[-1].as_py())
    return str(words[i]), round(float(n[i]) / len(codes), 4), len(codes), moves, common, last


def _common(stacks: list[str]) -> str | None:
    """The innermost frame of the job's own code that every folded stack of ``stacks`` passes through (a busy
    rank's ``estimate_loss``, where the stacks part below it), its line dropped where they differ there."""
    prefix: list[str] = []
    for level in zip(*(st.split(";") for st in stacks), strict=False):
        if len({f.rpartition(":")[0] for f in level}) > 1:
            break
        if len(set(level)) > 1:  # one function at several lines: the function, without a line
            prefix.append(level[0].rpartition(":")[0] + ")")
            break
        prefix.append(level[0])
    job = [f for f in prefix if is_job_frame(f)]
    return job[-1] if job else None


def with_hang(
    death: dict[str, Any],
    table: pa.Table,
    ranked: bool,
    crashed: bool,
    flight: tuple[dict[str, Any] | None, str | None] = (None, None),
    late: tuple[int, str | None] | None = None,
) -> dict[str, Any]:
    """``death`` with its ``hang`` where the ring stalled before it; a death by a signal from outside or
    SIGKILL after the stall (never a native crash: a watchdog's abort is the wait ending) becomes ``hang``.
    ``flight``: the rank's flight recorder dump summed up (``recovery.flight``), and why one was not read;
    ``late``: for a death after the clean end, that end's time (UTC ns) and the ring's crash region
    (``_in_shutdown``)."""
    end = epoch_ns(death.get("time"))
    took = handler_ended(death)  # the signal its own handler took, then ended it (an exit, a KeyboardInterrupt)
    exited = took is not None
    if end is None or death.get("cause") not in ("signal", "killed", "exception", "interrupted") and not exited:
        return death
    upto = epoch_ns(took.get("time")) if took is not None else None  # (its handler's end: its own stack)
    st = stall(table, upto if upto is not None and upto <= end else end, ranked)
    if st is None:
        return death
    if late is not None:
        _in_shutdown(st, end, *late, ranked)
    dump, note = flight
    if dump is not None:
        st["flight_recorder"] = dump
    if note is not None:
        death = {**death, "evidence": [*death.get("evidence", []), note]}
    told = next((e for e in death.get("evidence", []) if TIMEOUT.search(str(e))), None)
    if death["cause"] == "exception" and told is not None:  # the collective's own timeout ended its wait
        st["timed_out"] = str(told).split(": ", 1)[-1][:300] if str(told).startswith("uncaught") else str(told)[:300]
    elif crashed and st["collective"] and "SIGABRT" in str(death.get("headline")):
        st["timed_out"] = "SIGABRT while it waited in a collective (NCCL's watchdog aborts a rank whose collective " \
                          "timed out)"
    shutdown = _shutdown_since(table, st, end) if death["cause"] in ("signal", "killed") else None
    if took is not None:  # a signal that came long after it stopped, which its handler took to end it: a hang
        at, since = epoch_ns(took.get("time")), epoch_ns(st.get("since"))
        if at is None or since is None or (at - since) / 1e9 < max(HANG_FACTOR * float(st["step_s"] or 0), HANG_MIN_S):
            return death  # (it came as the process worked, or soon after: a graceful shutdown)
        st["handled"] = {"signal": took.get("signal"), "sender": took.get("sender"), "time": took.get("time"),
                         "ended_it": True}  # fmt: skip
    if shutdown is not None:  # the job's own handler began its shutdown: no hang, a shutdown past its grace
        st["shutdown"] = shutdown
        grace = f"{shutdown['lasted_s']:.1f} s" if shutdown["lasted_s"] is not None else "its time"
        where = f", still in {short_frame(st['site'])}" if st.get("site") else ""
        lever = (f"the shutdown the job's handler began on {shutdown['signal']} outlasted the grace it was given "
                 f"({grace}{where}): save less or earlier (Slurm's sbatch --signal=USR1@120 warns 2 minutes "
                 "ahead), or give it more (Slurm's KillWait, `timeout -k`, Kubernetes' "
                 "terminationGracePeriodSeconds)")  # fmt: skip
        ev = (f"{shutdown['signal']}{' from ' + shutdown['sender'] if shutdown['sender'] else ''} at "
              f"{shutdown['time']} was taken by the job's own handler (a graceful shutdown); {grace} later"
              f"{where}, it was ended before it finished")  # fmt: skip
        levers = death.get("levers") or []
        return {**death, "hang": st, "evidence": [*death.get("evidence", []), _stall_evidence(st), ev],
                "levers": [lever, *levers] if death["cause"] == "killed" else levers}
    if st["step_s"] is None:  # no steps to time it by: the place is told, no hang called (``_same_stack``)
        st["busy"] = None
        mine = st.get("site") and is_job_frame(st["site"])  # (a launcher's own loop, torchrun's agent: no line of
        return {**death, "hang": st, "evidence": [*death.get("evidence", []), _stall_evidence(st)],  # the job's)
                "levers": [_place_lever(st), *(death.get("levers") or [])] if mine else death.get("levers")}
    # Its stack changing from sample to sample, it was working (an evaluation, a checkpoint, a slow data
    # pass killed at the time limit): no progress in steps, but not stuck. It keeps its cause.
    st["busy"] = None if st["share"] is None else busy(st["samples"], st["share"], st["moves"])  # (unsampled: unknown)
    out = {**death, "hang": st, "evidence": [*death.get("evidence", []), _stall_evidence(st)]}
    if (death["cause"] in ("signal", "killed") or exited) and not crashed and not st["busy"]:
        out.update(cause="hang", confidence="strong", headline=hang_headline(death, st), levers=hang_levers(st, ranked))
        if exited:  # (its handler's end was no graceful shutdown: it ended a hang)
            out["evidence"] = [e.removesuffix(" (a graceful shutdown)") if isinstance(e, str) else e
                               for e in out["evidence"]]  # fmt: skip
    return out


def handler_ended(death: dict[str, Any]) -> dict[str, Any] | None:
    """The signal the process's own handler took, which then ended it by itself: an exit after it
    (``handled_by``), or the KeyboardInterrupt it raised (``signal.default_int_handler`` for SIGTERM, a
    ``kill -INT``: ``interrupted`` with its sender); None where its end was no handler's of a signal."""
    cause, took = death.get("cause"), death.get("handled_by")
    if cause in ("nonzero_exit", "clean_exit") and isinstance(took, dict):
        return took
    killer = death.get("killed_by")
    return killer if cause == "interrupted" and isinstance(killer, dict) and killer.get("signal") else None


def _place_lever(st: dict[str, Any]) -> str:
    """The lever of a stall without steps: where the main thread stayed."""
    return (f"look at {short_frame(st['site'])}: the main thread was there in every stack sample for the last "
            f"{st['stalled_s']:.0f} s before the end (waiting there, or looping on that one line)")


def as_decided(death: dict[str, Any], decided: dict[str, Any], ranked: bool) -> dict[str, Any]:
    """A ring's full ``death`` as its attempt told it (``decided``, its slim death after ``attempt_hang``): a
    stall the ring alone calls no hang (no steps to time it by: a rank stuck before its first step, a Pool
    worker), told hung by the processes that waited for it, takes the attempt's cause, confidence and
    headline, and a hang's levers before its own; a rank's stall its attempt found waiting for a rank at work
    (``waited_for``) is no hang: it takes the attempt's cause and headline, without a hang's levers."""
    h = death.get("hang")
    if decided.get("waited_for") and death.get("cause") == "hang" and isinstance(h, dict):  # it waited for work
        own = hang_levers(h, ranked)
        return {**death, **{k: decided.get(k) for k in ("cause", "confidence", "headline", "waited_for")},
                "levers": [lever for lever in death.get("levers") or [] if lever not in own]}  # fmt: skip
    if decided.get("cause") != "hang" or death.get("cause") == "hang" or not isinstance(h, dict):
        return death
    place = _place_lever(h) if h.get("site") else None
    rest = [lever for lever in death.get("levers") or [] if lever != place]
    return {**death, "cause": "hang", "confidence": decided.get("confidence"), "headline": decided.get("headline"),
            "levers": [*hang_levers(h, ranked), *rest]}  # fmt: skip


def snapshot_death(death: dict[str, Any], table: pa.Table, end_ns: int | None, ranked: bool) -> dict[str, Any]:
    """``death`` of a process that runs still (its ring a snapshot: a rank left running after its launcher was
    killed, a job recovered by hand while it hangs), with ``alive`` and ``headline`` (``running``: the sentence
    that says it runs); where it stalled up to its last record and was not busy, its ``hang``, the sentence
    that tells where it is stuck or waits, the stall's evidence and where to look."""
    out = {**death, "alive": True}
    st = stall(table, end_ns, ranked) if end_ns is not None else None
    last = _taken(table, None, end_ns, last=True)  # (a SIGTERM its handler took: `blackbox run` snapshots after)
    taken = f" It took {_said(last[1])} at {last[1]['time']} in its own handler." if last else ""
    if st is None or end_ns is None:
        return {**out, "headline": str(death.get("headline") or "") + taken}
    st["busy"] = None if st["step_s"] is None or st["share"] is None else busy(st["samples"], st["share"], st["moves"])
    out.update(hang=st, evidence=[*death.get("evidence", []), _stall_evidence(st)])
    if st["busy"]:
        return {**out, "headline": str(death.get("headline") or "") + taken}
    if st["step_s"] is None:
        told = f" Its main thread's stack has been the same for {st['stalled_s']:.1f} s, {_where(st)}."
    else:
        told = f" It has made no step for {st['stalled_s']:.1f} s (its steps took {st['step_s']:.3g} s), {_where(st)}."
    _shutdown_since(table, st, end_ns)  # a signal its handler took long after it stopped: ``st["handled"]``
    if handled := st.get("handled"):  # (Lightning's flag: `blackbox run`'s snapshot before the SIGKILL to come)
        told += (f" {_said(handled)} came at {handled['time']}, taken by its own handler, which cannot act on it "
                 "while the process hangs.")
    else:
        told += taken
    out["headline"] = str(death.get("headline") or "") + told
    if st.get("site") and is_job_frame(st["site"]) or joined(st):
        out["levers"] = [*hang_levers(st, ranked)[:1], *(death.get("levers") or [])]
    return out


def _taken(table: pa.Table, since_ns: int | None, end_ns: int | None, last: bool = False
           ) -> tuple[int, dict[str, Any]] | None:  # fmt: skip
    """The first (``last``: the last) signal the process's own handler took from ``since_ns`` up to ``end_ns``
    (either bound None: none): its time (UTC ns) and ``signal``, ``sender``, ``time``; None where it took none."""
    rows = of_kind(table, "signal", columns=["time", "label", "detail", "sender"])
    t = rows["time"].cast(pa.int64())
    mask = pc.equal(rows["detail"].cast(pa.string()), HANDLED)
    if since_ns is not None:
        mask = pc.and_(mask, pc.greater_equal(t, since_ns))
    if end_ns is not None:
        mask = pc.and_(mask, pc.less_equal(t, end_ns))
    rows = rows.filter(mask)
    if not rows.num_rows:
        return None
    i = int(pc.index(rows["time"], pc.max(rows["time"])).as_py()) if last else 0
    at = int(rows["time"].cast(pa.int64())[i].as_py())  # (never to_pylist: no pandas, no ns datetimes there)
    sender = rows["sender"][i].as_py() if "sender" in rows.column_names else None
    return at, {"signal": str(rows["label"][i].as_py()), "sender": str(sender) if sender else None, "time": iso_ns(at)}


def _said(taken: dict[str, Any]) -> str:
    """A signal taken, as said: ``SIGTERM from timeout``."""
    return f"{taken['signal']}{' from ' + taken['sender'] if taken.get('sender') else ''}"


def _in_shutdown(st: dict[str, Any], end_ns: int, clean: int, text: str | None, ranked: bool) -> None:
    """A process that died as it shut down, after its clean end (an exit handler, a library's teardown): the
    stacks sampled before that end are its exit path, blackbox's own end among them, not where it hung. Where
    it was is the stack the C handler wrote at the signal that ended it (``shutdown_stacks``), else unknown;
    ``shutdown_s``: from the clean end to the death."""
    stack = crashing_stack(text) if shutdown_signal(text) else None
    st.update(stack=stack, share=1.0 if stack else None, samples=1 if stack else 0, moves=0, loader=False, waits=False,
              site=site_of(stack) if stack else None, collective=collective_of(stack, ranked) if stack else None,
              shutdown_s=round((end_ns - clean) / 1e9, 3) if end_ns >= clean else None)


def _shutdown_since(table: pa.Table, st: dict[str, Any], end_ns: int) -> dict[str, Any] | None:
    """The signal the job's own handler took after its last step (its shutdown began there): ``signal``,
    ``sender``, ``time``, ``lasted_s`` (from it to the end); None where its handler took none, or took it long
    after the process had stopped (a hang: ``st["handled"]`` then says which, for the headline: Lightning's
    handler only sets a flag the stuck loop never reads)."""
    since = epoch_ns(st.get("since"))
    first = _taken(table, since, end_ns) if since is not None else None
    if since is None or first is None:
        return None
    at, taken = first
    if (at - since) / 1e9 >= max(HANG_FACTOR * float(st["step_s"] or 0.0), HANG_MIN_S):
        st["handled"] = taken
        return None  # it had stopped long before the signal came: a hang, whatever its handler did after
    return taken | {"lasted_s": round((end_ns - at) / 1e9, 3)}


def hang_levers(st: dict[str, Any], ranked: bool) -> list[str]:
    """What to change after a hang: where to look, and, for a rank, what makes the next one end and tell."""
    if st.get("loader"):
        out = ["look at the dataset's __getitem__ and collate_fn: a DataLoader worker never delivered its batch (the "
               "workers' rings hold their stacks); DataLoader(timeout=600) raises where it would wait forever"]
    elif joined(st):
        th = st["threads"][0]
        out = [f"look at {short_frame(th['site'] or th['stack'].rpartition(';')[2])}: its thread '{th['thread']}' "
               f"was there in {100 * th['share']:.0f}% "
               f"of its {th['samples']} stack samples while the main thread waited for it in "
               f"{short_frame(st['site'] or st['stack'].rpartition(';')[2])} for {st['stalled_s']:.0f} s"]
    elif (dead := st.get("dead_thread")) and st.get("site") and not st.get("waits"):
        out = [f"its thread '{dead['thread']}' died of {dead['error']} at {dead['time']}, and the main thread then "
               f"waited in {short_frame(st['site'])} for {st['stalled_s']:.0f} s for a thread of its own: a thread "
               "that feeds or is joined by the main thread and dies leaves it waiting forever; have it pass its "
               "exception on (put it on the queue, or a future's set_exception), or wait with a timeout"]
    elif st.get("step_s") is None and st.get("site") and not st.get("collective"):  # no steps: stuck or looping
        out = [_place_lever(st)]
    else:
        out = [f"look at {short_frame(st['site'])}: the process stayed there for {st['stalled_s']:.0f} s (waiting on "
               "a data source, a lock or I/O, or looping on that one line)" if st.get("site") and not
               st.get("collective") else
               "find the rank that never entered the collective this one waited in (the job's other ranks)"]
    if ranked:
        out.append("a collective timeout shorter than the job's time limit (init_process_group(timeout="
                   "timedelta(minutes=10))) ends the waiting ranks with the collective named, before the scheduler")
        if not st.get("flight_recorder"):
            out.append("TORCH_FR_BUFFER_SIZE=2000 turns PyTorch's flight recorder on: on a collective's timeout NCCL "
                       "dumps each rank's collectives, which blackbox reads to name the rank that never entered it")
    return out


def _where(st: dict[str, Any]) -> str:
    if joined(st):
        th = st["threads"][0]
        at = f" in {short_frame(st['site'])}" if st.get("site") else ""
        where = short_frame(th["site"] or th["stack"].rpartition(";")[2])
        return f"waiting{at} for its thread '{th['thread']}', {'stuck in' if th['stuck'] else 'in'} {where}"
    if st.get("joins") and st.get("site") and not st.get("waits"):  # (a future's may be a worker process's)
        dead = st.get("dead_thread")
        return f"waiting in {short_frame(st['site'])} for a thread of its own" + (
            f"; its thread '{dead['thread']}' had died of {dead['error']}"
            f"{'' if dead['step'] is None else ' at step ' + str(dead['step'])}" if dead else "")  # fmt: skip
    if st.get("collective"):
        return f"waiting in {st['collective']}"
    if st.get("loader"):
        at = f" in {short_frame(st['site'])}" if st.get("site") else ""
        return f"waiting for a batch from its DataLoader's workers{at}"
    if st.get("site"):
        return f"stuck in {short_frame(st['site'])}"
    return "where no stack was taken" if st.get("shutdown_s") is not None else "where no stack was sampled"


def _stall_evidence(st: dict[str, Any]) -> str:
    seen = (f"; {100 * st['share']:.0f}% of the main thread's {st['samples']} stack samples since were "
            f"{innermost_first(st['stack'])}") if st.get("stack") else "; no stack was sampled since"  # fmt: skip
    if not st.get("stack") and st.get("samples"):
        n = st["samples"]
        seen = (f"; {n} stack sample{'s' if n > 1 else ''} since, the last {st.get('unsampled_s') or 0:.1f} s before "
                "the end: not where it stopped, which no sample says (the sampler could not run: a C call that held "
                "the GIL, as torch.save into a pipe does)")  # fmt: skip
    if st.get("shutdown_s") is not None:  # (``_in_shutdown``)
        seen = (f"; it ended its work and shut down for {st['shutdown_s']:.1f} s after its clean end, "
                + (f"in {innermost_first(st['stack'])} at the signal" if st.get("stack") else
                   "where no stack was taken (inside exit(), or a Python without the dump)"))  # fmt: skip
    others = [f"'{th['thread']}' {'stuck in' if th['stuck'] else 'at'} "
              f"{short_frame(th['site'] or th['stack'].rpartition(';')[2])} ({100 * th['share']:.0f}% of "
              f"{th['samples']} samples)" for th in st.get("threads") or []]  # fmt: skip
    if others:
        seen += f"; its other threads in that time: {'; '.join(others)}"
    if st.get("busy"):
        work = f" in {short_frame(st['work'])}" if st.get("work") else ""
        seen += (f"; its stack kept changing ({st.get('moves', 0)} times between consecutive samples): busy{work}, "
                 "not stuck (no hang called)")  # fmt: skip
    if st.get("step_s") is None:  # no steps to time (``_same_stack``)
        return (f"the main thread's stack was the same in every sample for the last {st['stalled_s']:.1f} s before "
                f"the end (from {st['since']}; {st['samples']} samples; too few steps to time: "
                f"{'none' if st['step'] is None else 'the last ' + str(st['step'])}){seen}")  # fmt: skip
    return (f"no step for {st['stalled_s']:.1f} s before the end (the last, step {st['step']}, at {st['since']}; its "
            f"steps took {st['step_s']:.3g} s, median of the last {STEPS_SEEN} at most, the longest "
            f"{st['longest_s']:.3g} s){seen}")  # fmt: skip


def waited_headline(death: dict[str, Any], st: dict[str, Any], busy: dict[str, Any], by: str | None = None) -> str:
    """The verdict's sentence for a rank that waited for ``busy``, a rank at work (``attempts.deaths``), until a
    signal ended it: what ended it, after how long a wait where, and for whom."""
    v, killer = death.get("victim") or {}, death.get("killed_by") or {}
    sender = by or sender_named(killer)
    how = f"{killer.get('signal')} from {sender}" if sender else str(killer.get("signal") or "a signal")
    where = f"in {st['collective']}" if st.get("collective") else _where(st)
    work = f", at work in {short_frame(busy['work'])}" if busy.get("work") else ", at work"
    return (f"The {v.get('role', 'process')} (pid {v.get('pid')}) was ended by {how} after it waited "
            f"{st.get('stalled_s') or 0:.1f} s {where} for rank {busy.get('rank')}{work}: no hang of its own.")


def hang_headline(death: dict[str, Any], st: dict[str, Any], by: str | None = None) -> str:
    """The verdict's sentence for a death after the stall ``st``: who hung, how long, where, what ended it
    (``by``: the launcher that sent the signal, where the attempt knows it, in place of the sender's name)."""
    v = death.get("victim") or {}
    killer = death.get("killed_by") or {}
    sender = by or sender_named(killer)
    how = f"{killer['signal']} from {sender}" if killer.get("signal") and sender else (
        killer.get("signal") or ("SIGKILL" if death["cause"] == "killed" else "a signal"))  # fmt: skip
    taken = st.get("handled")
    took = death.get("handled_by") if isinstance(death.get("handled_by"), dict) and not killer else None
    if (taken or {}).get("ended_it") or took:  # its handler took it, and the process then ended by itself
        t: dict[str, Any] = taken if taken and taken.get("ended_it") else took or {}
        how = f"{t.get('signal')} from {by or t.get('sender')}" if by or t.get("sender") else str(t.get("signal"))
        how = f"{how} came at {t.get('time')}, and its own handler"
    elif taken:  # a signal its own handler took while it hung, before the one that ended it (a signal the handler
        if killer.get("signal") == taken["signal"]:  # took ended nothing: what did, unrecorded, was a SIGKILL)
            how = "SIGKILL"
        how = (f"{_said(taken)} came at {taken['time']}, taken by the job's own handler, which could not act on it "
               f"while the process hung; then {how}")
    if st.get("shutdown_s") is not None:
        return (f"The {v.get('role', 'process')} (pid {v.get('pid')}) hung as it shut down, after its work: "
                f"{st['shutdown_s']:.1f} s after its clean end, {_where(st)}; then {how} ended it.")  # fmt: skip
    if st.get("step_s") is None:
        return (f"The {v.get('role', 'process')} (pid {v.get('pid')}) hung: the same stack for {st['stalled_s']:.1f} s "
                f"before the end, {_where(st)}; then {how} ended it.")  # fmt: skip
    return (f"The {v.get('role', 'process')} (pid {v.get('pid')}) hung: no step for {st['stalled_s']:.1f} s (its "
            f"steps took {st['step_s']:.3g} s), {_where(st)}; then {how} ended it.")  # fmt: skip
