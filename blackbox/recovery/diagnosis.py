"""What killed the job, which process died, how sure we are, and what to change: a pure function of
the recovered timeline, the ring's header metadata and the evidence gathered outside it.

``death`` fields: ``cause`` (one of CAUSES), ``confidence`` (CONFIDENCE), ``headline`` (one sentence),
``evidence`` (the facts that decided it), ``time``, ``step``, ``victim`` (the process that died: pid,
role, name, memory at the end), ``exit_status`` (as a shell reports it, where known), ``killed_by`` (the
last signal's sender, where one was recorded), and the analysis (``host_growth``, ``memory_at_end``,
``gpu_oom``, ``levers``). The rules, in order:

1. the writer is still alive: ``unknown`` (a snapshot, not a death);
2. the kernel logged an OOM kill, inside this ring's life, of one of its children (a DataLoader
   worker) or of a worker its job's errors name as dead (a forkserver's worker, no child of the job's),
   and the job then ended abnormally: ``host_oom_kill`` with that process as the victim;
3. a clean end was recorded (the job's own exit path ran):
   an uncaught ``KeyboardInterrupt``: ``interrupted``; PyTorch's "DataLoader worker (pid N) is killed by
   signal" with OOM evidence (the cgroup's oom_kill counter rose, memory at the limit): ``host_oom_kill``
   (the worker the victim), else ``killed`` or ``signal``; an out-of-memory exception: ``oom_exception``;
   another uncaught exception: ``exception``; the exit record that clean end armed (a ``disarm`` of
   value 1) never came: the process died while it shut down, told as in 4 (the kernel's kill of it, a
   signal ``blackbox run`` saw, else SIGKILL); a SIGINT that raised a KeyboardInterrupt the job caught,
   the last signal, no step after it, then a nonzero exit: ``interrupted`` (the job's own handling turned
   it into that status); else by the exit status: 0 ``clean_exit``, 130 ``interrupted``, others
   ``nonzero_exit``;
4. no clean end: the kernel logged this pid's OOM kill after its last event: ``host_oom_kill``
   (certain); the process called ``os._exit``: by its status, as in 3; the cgroup's oom_kill counter
   rose after the last sample: ``host_oom_kill`` (strong); a native crash: ``signal``; a fatal signal
   recorded (by the C handler, or without the C extension faulthandler's stack in its slot of
   ``<ring>.signals``): ``signal`` (``interrupted`` for SIGINT, ``userspace_oom_kill`` from earlyoom or
   systemd-oomd); ``blackbox run`` saw it exit (not die of a signal; C code calling ``_exit``): by its
   status, as in 3; SIGKILL (seen by ``blackbox run``, or no handler ran on this boot):
   ``userspace_oom_kill`` after such a daemon's SIGTERM, ``host_oom_kill`` (probable) with memory at 95%
   of the limit or more at the last sample, else ``killed``; ``unknown`` when the host rebooted or
   cannot be told. Exit status 137 alone is never called an OOM.

The exit status (``exit_status``) is, first, the ring's own record of how the process exited (written
inside libc's exit() after the interpreter finished, or by ``os._exit``): a fact about this very
process, which a later recovery reads as ``blackbox run`` did; else what ``blackbox run`` saw; else the
last ``sys.exit`` call (whose SystemExit the job may have caught).

``step`` is the step in force at the death: for a death of the ring's own process, at its last
record; for a child's, at the main process's last record before the kernel's kill.
"""

from __future__ import annotations

import signal as signals
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .._units import human_bytes
from ..collect.identity import SPAWNED_RANK
from ..ring import format as fmt
from ..ring.reader import without_c_extension
from .crash import faulthandler_frame, native_crash, shutdown_where
from .evidence import Evidence, KernelKill
from .exits import HOW_KNOWN, MAX_SAID, RUN_SAW, exit_message, exit_status, interrupted_by, signal_of
from .facts import Facts, counter_rose, facts, near_limit
from .first_process import came_first, dropped_as_init, dropped_before, sender_of, with_grace_lever
from .gpu_oom import EXPANDABLE_ON, gpu_oom_kind
from .hang import with_hang
from .headline import headline, raised_from, raised_site, sender_role, sent_from, short_text
from .helpers import process_name, start_method
from .kinds import of_kind
from .levers import analysis
from .limits import limit_hit
from .rendezvous import rendezvous_levers
from .slurm import SENDERS as SLURM_SENDERS
from .timeline import iso_ns
from .timing import death_timing, peer_lost

STOPS = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")  # a request to stop, whose handler may raise to end the job
CAUSES = ("clean_exit", "nonzero_exit", "interrupted", "exception", "oom_exception", "host_oom_kill",
          "userspace_oom_kill", "killed", "signal", "hang", "unknown")  # fmt: skip
CONFIDENCE = ("certain", "strong", "probable", "unknown")
NEAR_LIMIT = 0.95
OOM_DAEMONS = ("earlyoom", "systemd-oomd", "oomd", "nohang", "low-memory-mon")
CRASH_SIGNALS = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL")  # faulthandler's: a native crash
DEFAULT_ACTION = "default action"  # the detail collect.signals writes for a signal that ended the process
NATIVE = "handled by a native handler"  # ...for one a handler set outside Python took (faulthandler, torch's)
# what a native handler raises again to die of it (faulthandler a crash, PyTorch's workers a SIGTERM); not
# SIGUSR1, SIGUSR2 or SIGHUP, which a native handler takes to dump stacks and go on (faulthandler.register)
TERMINATING = frozenset({"SIGTERM", "SIGINT", *CRASH_SIGNALS})
THREADS_SAID = 3  # threads' uncaught exceptions said in the evidence, the last ones
RAISED_AGAIN_S = 0.25  # a process that lived on past its native handler writes a sample within 0.1 s
NOT_KNOWN_WITHOUT_C = ("not known: this process ran without blackbox's C extension, which records a signal's sender, "
                       "a signal the job's own handler takes, and the status of an exit that calls neither sys.exit "
                       "nor os._exit")  # fmt: skip
OWN_END = ("cause", "confidence", "headline", "evidence", "time", "step", "victim", "exit_status", "killed_by")


def diagnose(table: pa.Table, clean: bool, ev: Evidence, meta: dict[str, Any]) -> dict[str, Any]:
    """``death`` for one ring (see the module docstring)."""
    f = facts(table, meta.get("clock") or {})
    ident = meta.get("identity") or {}
    name = process_name(ident, table)
    d = _Death(f, ev, ident, name)
    d.decide(clean)
    if without_c_extension(meta) and not (ev.writer_alive and not clean):
        d.evidence.append(NOT_KNOWN_WITHOUT_C)
    death = with_grace_lever(d.result())
    gpu = death.get("gpu_oom")
    if gpu and gpu["kind"] == "fragmentation" and _noted(table, fmt.NOTE_EXPANDABLE):
        lever = EXPANDABLE_ON
        gpu["levers"] = [lever]
        death["levers"] = [lever, *(x for x in death["levers"] if "expandable_segments" not in x)]
    death.update(death_timing(table, meta.get("sample_interval_s"), not clean and d.when is f.last_event))
    death["peer_lost"] = peer_lost(death.get("evidence"))
    if death["cause"] == "exception" and (said := rendezvous_levers(f.main_uncaught, ident.get("argv"))):
        death["levers"] = [*said, *death.get("levers", [])]  # (torchrun's agent, before any rank ran)
    if death["victim"].get("pid") != d.pid:  # a child's death: this process's own end too, for the bundle
        own = _Death(f, ev, ident, name, children=False)
        own.decide(clean)
        death["own_end"] = {k: v for k, v in own.result().items() if k in OWN_END}
    oom = f.main_uncaught[-1] if death["cause"] == "oom_exception" and f.main_uncaught else None
    kill = ev.kernel_kills[-1].line if ev.kernel_kills else None
    if (hit := limit_hit(death["cause"], meta.get("limits"), f.samples[-1] if f.samples else None, oom, kill)):
        death["limit"] = hit
        death["evidence"].append(f"the limit it hit: {hit['text']}")
    ranked = isinstance(ident.get("world_size"), int) and ident["world_size"] > 1
    late = (f.clean_end_ns + f.to_wall, ev.crash) if d.in_shutdown and f.clean_end_ns is not None else None
    return with_hang(death, table, ranked, d.crash is not None, (ev.flight, ev.flight_note), late)


def _noted(table: pa.Table, note: str) -> bool:
    """The recorder wrote this note (a ``mark`` labelled ``blackbox: <note>``) into the ring."""
    labels = of_kind(table, "mark", columns=["label"])["label"]
    return any(fmt.NOTE_PREFIX + note in chunk.dictionary.to_pylist() for chunk in labels.chunks)


class _Death:
    def __init__(self, f: Facts, ev: Evidence, ident: dict[str, Any], name: str, *, children: bool = True) -> None:
        self.f, self.ev, self.ident = f, ev, ident
        self.pid = ident.get("pid")
        self.children = children  # a child's death may be the ring's (False: this process's own end alone)
        self.cause, self.confidence = "unknown", "unknown"
        self.evidence: list[str] = []
        self.when: dict[str, Any] | None = f.last_event
        self.victim: dict[str, Any] = {"pid": self.pid, "role": name, "start_method": start_method(ident)}
        self.killed_by: dict[str, Any] | None = None
        self.handled: dict[str, Any] | None = None  # a signal the job's own handler took before its end
        self.in_shutdown = False  # the process died after its clean end, before libc's exit()
        self.stat_at_end = f.stats[-1] if f.stats else None
        self.death_ns: int | None = None  # the monotonic time of the death, where the kernel stamped it
        self.crash: dict[str, Any] | None = None  # a native crash: its signal and the job's innermost frame
        self.exec_into: str | None = None  # the program the process replaced itself with (exec)
        self.status, self.exit_how = exit_status(f, ev)

    # ---------------------------------------------------------------- the rules
    def decide(self, clean: bool) -> None:
        f, ev = self.f, self.ev
        near = near_limit(f.samples[-1] if f.samples else None)
        if ev.writer_alive and not clean:
            self._set("unknown", "certain", "the writer process is still alive: this is a snapshot, not a death")
            return
        others = ev.kernel_kills if self.children else []
        child_kill = next((k for k in reversed(others) if k.pid != self.pid), None)
        if ev.exec_into is not None and not clean:  # the process went on as another program: no end of it
            self._set("clean_exit", "certain", f"the process replaced itself (exec) with `{ev.exec_into}`: "
                      "the same process (its pid and start time) went on in that program's ring")  # fmt: skip
            self.exec_into = ev.exec_into
            return
        if ev.exec_mark is not None and not clean:
            if ev.exit_status in (None, 0):  # its last act, and nothing saw the program it became fail
                saw = ", which exited with status 0 (`blackbox run` saw it)" if ev.exit_status == 0 else \
                    ": what that program did is not recorded here"  # fmt: skip
                self._set("clean_exit", "certain", f"the process replaced itself (exec) with `{ev.exec_mark}`, its "
                          f"last act in this ring (a mark written just before the exec){saw}")  # fmt: skip
                self.exec_into = ev.exec_mark
                return
            self.evidence.append(f"the process replaced itself (exec) with `{ev.exec_mark}` (a mark written just "
                                 f"before the exec), which ended with exit status {ev.exit_status}")  # fmt: skip
        if clean:
            self.evidence.insert(0, "a clean end was recorded (the process ran its exit handlers)")
            self._clean(child_kill, near)
        else:
            self.evidence.insert(0, "no clean end: the process ended without running its exit handlers")
            self._not_clean(near)
            self.evidence += dropped_before(self.f.signals, self.killed_by)  # (the SIGKILL's own said already)
        if (clean or self.exit_how == fmt.EXIT_OS) and self.cause in ("clean_exit", "nonzero_exit", "exception"):
            self._handled_signal()
        self._thread_deaths()
        if self.status is not None and not any("exit status" in e for e in self.evidence):
            self.evidence.append(f"exit status {self.status} ({HOW_KNOWN.get(self.exit_how or '', 'recorded')})")
        at = self.death_ns if self.death_ns is not None else f.last_ns
        memory = near_limit(f.sample_before(at))
        if memory is not None:
            self.evidence.insert(1, memory[1].replace("last sample", "the last sample before the death"))

    def _clean(self, child_kill: KernelKill | None, near: tuple[float, str] | None) -> None:
        f = self.f
        uncaught = f.main_uncaught
        if self.status == 0 and len(uncaught):  # sys.last_exc read at exit is an older one where it exits 0
            detail = uncaught.column("detail").cast(pa.string())
            uncaught = uncaught.keep(pc.invert(pc.starts_with(detail, fmt.LAST_EXC)))
        if uncaught and uncaught[-1]["label"] and uncaught[-1]["label"].startswith("KeyboardInterrupt"):
            s, why = interrupted_by(f)
            self.killed_by = sender_of(s) if s is not None else None
            self._set("interrupted", "certain", why)
            self.when = uncaught[-1]
            return
        worker = f.worker_killed() if self.children else None
        if child_kill is not None and (uncaught or (self.status or 0) != 0):
            self._child_oom(child_kill)
            return
        if worker is not None:
            self._worker_death(worker, uncaught[-1])
            return
        if uncaught:
            exc = uncaught[-1]
            self.cause = "oom_exception" if exc["kind"] == "oom" else "exception"
            self.confidence = "certain"
            at = f" at step {exc['step']}" if exc["step"] is not None else " before any step"
            detail = str(exc.get("detail") or "")
            if detail.startswith(fmt.HANDLED_EXIT_PREFIX):  # its own handler caught it, then sys.exit(N)
                self.evidence.append(f"{exc['kind']}{at}: {short_text(exc['label'])}; the job caught it and exited "
                                     f"with status {detail[len(fmt.HANDLED_EXIT_PREFIX):]}")  # fmt: skip
            else:
                self.evidence.append(f"uncaught {exc['kind']}{at}: {short_text(exc['label'])}")
            if exc.get("traceback"):
                self.evidence.append(f"raised at {raised_from(exc['traceback'])}")
            self.when = exc
            return
        if self._died_in_shutdown(near):
            return
        caught = self._caught_interrupt()
        if self.status not in (None, 0) and caught is not None:
            self._interrupt_caught(caught)
            return
        if self.status not in (None, 0):
            self._exited(f"the process exited by itself: exit status {self.status} "
                         f"({HOW_KNOWN.get(self.exit_how or '', 'recorded')})")  # fmt: skip
            return
        self.cause, self.confidence = "clean_exit", "certain" if self.status == 0 else "strong"
        if child_kill is not None:
            self.evidence.append(f"a child process, pid {child_kill.pid}, was OOM-killed meanwhile: {child_kill.line}")
        if self.status is None and not f.exit_armed:
            self.evidence.append("no exit status was recorded (a note says why): a kill while the process shut "
                                 "down, after this clean end, would read the same")  # fmt: skip

    def _died_in_shutdown(self, near: tuple[float, str] | None) -> bool:
        """The clean end armed the exit record (written inside libc's exit()) and none came: the process
        never reached exit(); it died while it shut down (later exit handlers, finalization). What ended it
        is told as for a death with no clean end: the kernel's OOM kill of it, a signal `blackbox run`
        saw, else SIGKILL (or os._exit or a crash in a later exit handler: no record tells those apart)."""
        f, ev = self.f, self.ev
        run_saw = signal_of(ev.exit_status)
        late = f.late_signals or f.signals[:0]  # taken after the clean end, by the handler left for the shutdown
        fatal = late.where("detail", DEFAULT_ACTION)
        if fatal and (ev.exit_status is not None and run_saw != signals.Signals.__members__.get(fatal[-1]["label"])):
            fatal = fatal[:0]  # `blackbox run` saw it end otherwise
        in_exit = bool(fatal) and self.exit_how == fmt.EXIT_PROCESS  # exit() began (its status recorded), then this
        if not in_exit and (not f.exit_armed or self.exit_how == fmt.EXIT_PROCESS or
                            (ev.exit_status is not None and run_saw is None)):  # fmt: skip
            return False  # it reached exit(), or `blackbox run` saw it exit by itself (C calling _exit)
        self.in_shutdown = True
        began = self.status
        self.status, self.exit_how = (ev.exit_status, RUN_SAW) if ev.exit_status is not None else (None, None)
        self.evidence.append(f"exit({began}) began (the status it recorded), but the process died inside it, as the "
                             "libraries tore down (C++ static destructors, native exit handlers)" if in_exit else
                             "but no exit record, which that clean end armed: the process never reached exit(), "
                             "it died while it shut down")  # fmt: skip
        own = next((k for k in reversed(ev.kernel_kills) if k.pid == self.pid), None)
        if own is not None:
            self.victim.update(name=own.name, **own.rss)
            self._set("host_oom_kill", "certain", f"kernel log: {own.line}")
            self._at(own.time_ns, own=True)
        elif fatal:
            s = fatal[-1]
            self.killed_by, self.when = sender_of(s), s
            who = sent_from(s)
            took = (self.f.ns_of_signal(s) - f.clean_end_ns) / 1e9 if f.clean_end_ns is not None else None
            after = f", {took:.1f} s after its clean end" if took is not None and took >= 0 else ""
            where = shutdown_where(ev.crash, s["label"]) or ("a crash in native code" if s["label"] in CRASH_SIGNALS
                                                             else "its exit handlers, finalization: a join or a "
                                                             "library's teardown that hung")  # fmt: skip
            self._set("interrupted" if s["label"] == "SIGINT" else "signal", "certain",
                      f"{s['label']}{who}{self._role(s)} with its default action at {s['time']}, while it shut "
                      f"down{after} ({where})")  # fmt: skip
            if s["label"] in CRASH_SIGNALS:
                self.crash = native_crash(ev.crash, s["label"], self.pid, f.signals)[0]
                self.evidence += [self.crash["fault_told"]] if self.crash.get("fault_told") else []
        elif run_saw is not None and run_saw != signals.SIGKILL:
            self._set("signal", "certain", f"`blackbox run` saw the job end by {signals.Signals(run_saw).name}")
        elif run_saw == signals.SIGKILL or ev.same_boot:
            how = ("`blackbox run` saw the job end by SIGKILL" if run_saw else
                   "same boot, no exit record: SIGKILL (or os._exit or a crash in a later exit handler)")  # fmt: skip
            self._sigkill(near, self.f.signals[-1] if self.f.signals else None, seen=run_saw is not None, how=how)
        else:
            self.evidence.append("the host rebooted or could not be checked: SIGKILL, power loss or kernel crash")
        return True

    def _caught_interrupt(self) -> dict[str, Any] | None:
        """The last signal, where it is a SIGINT that raised KeyboardInterrupt which the job caught (none
        went uncaught) and no step began after it: the job's own handling of the interrupt ended it."""
        f = self.f
        if not len(f.signals):
            return None
        s = f.signals[-1]
        if s["label"] != "SIGINT" or s["detail"] != "raised KeyboardInterrupt":
            return None
        return s if s["step"] == (f.last_event or {}).get("step") else None

    def _interrupt_caught(self, s: dict[str, Any]) -> None:
        """Ended by an interrupt the job caught and turned into its exit status (Lightning: exit 1)."""
        self.handled, self.killed_by = s, sender_of(s)
        who = sent_from(s)
        self._set("interrupted", "certain", f"SIGINT{who} at {s['time']} raised KeyboardInterrupt, which the job "
                  f"caught; it then exited by itself with status {self.status} "
                  f"({HOW_KNOWN.get(self.exit_how or '', 'recorded')}): its own handling of the interrupt")  # fmt: skip
        self.when = s

    def _exited(self, why: str) -> None:
        """The process ended by itself with ``self.status``: 0 clean, 130 an interrupt, else nonzero."""
        interrupted = self.status == 130
        cause = "clean_exit" if self.status == 0 else "interrupted" if interrupted else "nonzero_exit"
        self._set(cause, "certain", why + (" (130: an interrupt)" if interrupted else ""))

    def _child_oom(self, kill: KernelKill) -> None:
        f = self.f
        worker = f.worker_killed()
        series = f.children.get(kill.pid)
        named = worker is not None and kill.pid in worker[0]
        role = "DataLoader worker" if named or kill.name.startswith("pt_data") else self._child_role(kill.pid)
        self.victim = {"pid": kill.pid, "role": role, "name": kill.name,
                       "rss": series.at(kill.time_ns) if series else None, **kill.rss}  # fmt: skip
        self._set("host_oom_kill", "certain", f"kernel log: {kill.line}")
        if kill.pid in self.ev.cgroup_matched:  # no process sampled it, nor did the job's error name it
            self.confidence = "strong"
            self.evidence.append(f"pid {kill.pid} is taken for the job's by its memory cgroup (the kernel's "
                                 "task_memcg) and its name: no sampled child was it (a forkserver's worker is "
                                 "the job's grandchild), nor did the job's error name it")  # fmt: skip
        self._at(kill.time_ns)
        self.stat_at_end = f.stat_before(kill.time_ns) or self.stat_at_end
        if f.main_uncaught:
            self.evidence.append(f"then, in the job: {short_text(f.main_uncaught[-1]['label'])}")

    def _child_role(self, pid: int) -> str:
        series = self.f.children.get(pid)
        return "DataLoader worker" if series is not None and "pt_data" in series.name else "child process"

    def _worker_death(self, worker: tuple[list[int], str], exc: dict[str, Any]) -> None:
        f = self.f
        pids, how = worker
        pid = pids[0]
        series = f.children.get(pid)
        last_seen = int(series.times[-1]) if series is not None and len(series.times) else f.last_ns
        self.victim = {"pid": pid, "role": "DataLoader worker", "rss": series.at(last_seen) if series else None}
        self.when = exc
        self.death_ns = last_seen
        self.evidence.append(f"in the job: {short_text(exc['label'])}")
        before, after = f.sample_before(last_seen), f.sample_before(f.last_ns)
        rose = counter_rose(before, after)
        near = near_limit(before)
        killed = how.lower() == "killed"
        if killed and rose:
            self._set("host_oom_kill", "strong", rose)
        elif killed and near is not None and near[0] >= NEAR_LIMIT:
            self._set("host_oom_kill", "probable", f"when the worker was last seen, {near[1][len('last sample: ') :]}")
        else:
            self.cause, self.confidence = ("killed" if killed else "signal"), "certain"
        self.stat_at_end = f.stat_before(last_seen) or self.stat_at_end

    def _not_clean(self, near: tuple[float, str] | None) -> None:
        f, ev = self.f, self.ev
        own = next((k for k in reversed(ev.kernel_kills) if k.pid == self.pid), None)
        sig = signal_of(self.status)
        last_signal = f.signals[-1] if f.signals else None
        fatal = f.signals.where("detail", DEFAULT_ACTION)
        rose = counter_rose(f.samples[0] if f.samples else None, f.samples[-1] if f.samples else None, ev)
        if own is not None:
            self.victim.update(name=own.name, **own.rss)
            self._set("host_oom_kill", "certain", f"kernel log: {own.line}")
            self._at(own.time_ns, own=True)
        elif self.exit_how == fmt.EXIT_OS:
            self._exited(f"the process called os._exit({self.status}): exit status {self.status}, at once, "
                         "without running its exit handlers")  # fmt: skip
        elif rose:
            self._set("host_oom_kill", "strong", rose)
        elif ev.crash:
            self.crash, why = native_crash(ev.crash, signals.Signals(sig).name if sig else None, self.pid, f.signals)
            self.killed_by = sender_of(self.crash["sent"]) if self.crash.get("sent") else None
            self._set("signal", "certain", why)
        elif ev.signal_stacks:  # faulthandler's stack in the slot of the signal that ended it (no C extension)
            name, stack = next(iter(ev.signal_stacks.items()))
            why = f"{name} with its default action, in {faulthandler_frame(stack)} (its stack then, by faulthandler)"
            self._set("interrupted" if name == "SIGINT" else "signal", "certain", why)
        elif fatal:
            s = fatal[-1]
            self.killed_by = sender_of(s)
            who = sent_from(s)
            if (s["sender"] or "") in OOM_DAEMONS:
                self._set("userspace_oom_kill", "certain", f"{s['label']}{who}, a userspace OOM killer")
            elif self._ended_by_its_pool(s):
                self.killed_by = None
                self._set("clean_exit", "probable", f"SIGTERM{who}, its parent, at {s['time']}: multiprocessing "
                          "ends a Pool's workers so (Pool.terminate(), the end of a `with Pool(...)` block); "
                          "whatever made the parent end it is the parent's own story")  # fmt: skip
            else:
                cause = "interrupted" if s["label"] == "SIGINT" else "signal"
                self._set(cause, "certain", f"{s['label']}{who}{self._role(s)} with its default action at {s['time']}")
                if s["label"] in CRASH_SIGNALS:  # no dump
                    self.crash = native_crash(None, s["label"], self.pid, f.signals)[0]
            self.when = s
        elif (again := self._raised_again(last_signal, sig)) is not None:
            self._died_of_native(again)
        elif sig is not None and sig != signals.SIGKILL:
            self._set("signal", "certain", f"`blackbox run` saw the job end by {signals.Signals(sig).name}")
            if signals.Signals(sig).name in CRASH_SIGNALS:  # faulthandler's tracebacks went elsewhere, or none
                self.crash = {"signal": signals.Signals(sig).name, "site": None}
        elif sig is None and self.exit_how == RUN_SAW and ev.exec_mark is not None:
            self._exited(f"`blackbox run` saw the program it replaced itself with exit: exit status {self.status}")
        elif sig is None and self.exit_how == RUN_SAW:
            self._exited(f"`blackbox run` saw the process exit by itself: exit status {self.status}, without "
                         "running its exit handlers (os._exit before blackbox armed, or C calling _exit)")  # fmt: skip
        elif sig == signals.SIGKILL or ev.same_boot:
            self._sigkill(near, last_signal, seen=sig is not None)
        else:
            self.evidence.append("the host rebooted or could not be checked: SIGKILL, power loss or kernel crash")

    def _sigkill(
        self, near: tuple[float, str] | None, last_signal: dict[str, Any] | None, *, seen: bool, how: str = ""
    ) -> None:
        uncaught = self.f.main_uncaught  # (one, then no clean end: it died as it exited, its exit handlers unrun)
        after = f"after its uncaught {short_text(uncaught[-1]['label'])}, " if uncaught else "no exception, "
        how = how or ("`blackbox run` saw the job end by SIGKILL" if seen else
                      f"same boot, {after}no handler ran: SIGKILL (or os._exit)")  # fmt: skip
        recent = last_signal if last_signal and self.f.last_ns - self.f.ns_of_signal(last_signal) < 120e9 else None
        if recent and (recent["sender"] or "") in OOM_DAEMONS:
            self.killed_by = sender_of(recent)
            self._set("userspace_oom_kill", "strong", f"{recent['label']} from {recent['sender']}, then {how}")
        elif near is not None and near[0] >= NEAR_LIMIT:
            self._set(
                "host_oom_kill", "probable", f"{how}, with memory at the cgroup's limit (no kernel log to confirm)"
            )
        elif (over := self._at_slurm_limit()) is not None:
            self.killed_by = {"signal": "SIGKILL", "sender": "slurmstepd", "sender_pid": None, "time": None,
                              "reason": "Slurm's memory limit (JobAcctGatherParams=OverMemoryKill)"}  # fmt: skip
            self._set("userspace_oom_kill", "strong", f"{how}; {over}")
        else:
            self._set("killed", "certain" if seen else "strong", how)
            self.evidence += self.ev.others_said  # what its cgroup's oom_kill counter counted since, not it
            if recent:
                self.killed_by = sender_of(recent)
                self.evidence.append(came_first(self.f.signals, self.f.signal_ns, self.f.last_ns, self._role(recent)))

    def _thread_deaths(self) -> None:
        """Threads that died of an uncaught exception while the process went on (a prefetcher, an uploader: a
        main thread that then waits for them hangs), said whatever the cause, the last THREADS_SAID of them."""
        errors = self.f.errors
        died = [errors[i] for i in range(len(errors))
                if str(errors[i].get("detail") or "").startswith("uncaught in thread ")]  # fmt: skip
        for row in died[-THREADS_SAID:]:
            at = f" at step {row['step']}" if row.get("step") is not None else ""
            site = f", raised at {raised_site(row)}" if row.get("traceback") else ""
            self.evidence.append(f"{row['detail']}{at}, at {row['time']} (the process went on): "
                                 f"{short_text(row['label'], 200)}{site}")  # fmt: skip

    def _raised(self) -> dict[str, Any] | None:
        """The uncaught exception's row the death is timed by, where it is one."""
        return self.when if self.when and self.when.get("kind") in ("exception", "oom") else None

    def _ended_by_its_pool(self, s: dict[str, Any]) -> bool:
        """A multiprocessing worker (no DataLoader's: those take SIGTERM in a handler of their own) that its
        parent (or, forked by a forkserver, the process whose Pool it serves) ended by SIGTERM: a Pool's
        teardown, no death of the job. Not a rank torch.multiprocessing.spawn started: its parent ends the others
        so after one of them failed (their deaths collateral of that one's)."""
        parents = {self.ident.get("ppid"), self.ident.get("mp_parent")} - {None}  # (a forkserver's child: both)
        return (self.ident.get("role") == "worker" and self.victim["role"] != SPAWNED_RANK and s["label"] == "SIGTERM"
                and s["sender_pid"] in parents)  # fmt: skip

    def _raised_again(self, last: dict[str, Any] | None, status_signal: int | None) -> dict[str, Any] | None:
        """The signal a native handler took as the process's last record (nothing after it for
        ``RAISED_AGAIN_S``), where that handler raised it again with its default action and the process died
        of it: the job's own faulthandler after a crash (``PYTHONFAULTHANDLER=1``), PyTorch's DataLoader
        worker's handler after a SIGTERM. None where the process lived on (a SIGKILL came later) or its exit
        status names another signal."""
        if last is None or last["detail"] != NATIVE or last["label"] not in TERMINATING:
            return None
        if status_signal is not None and signals.Signals(status_signal).name != last["label"]:
            return None
        return last if self.f.last_ns - self.f.ns_of_signal(last) <= RAISED_AGAIN_S * 1e9 else None

    def _died_of_native(self, s: dict[str, Any]) -> None:
        self.when = s
        if s["label"] in CRASH_SIGNALS:
            self.crash = native_crash(None, s["label"], self.pid, self.f.signals)[0]
            self._set("signal", "strong", f"{s['label']} at {s['time']}, taken by a native handler (the job's own "
                      "faulthandler: its traceback went where the job sent it, stderr by default), and nothing "
                      "was recorded after it: the handler raised it again, with its default action")  # fmt: skip
            return
        parent = self.ident.get("ppid")
        if s["label"] == "SIGTERM" and isinstance(parent, int) and s["sender_pid"] == parent:
            self._set("clean_exit", "probable", f"SIGTERM from its parent (pid {parent}) at {s['time']}, taken by "
                      "a native handler: PyTorch's DataLoader worker exits 0 on its parent's SIGTERM (the parent "
                      "shutting its workers down)")  # fmt: skip
            return
        self.killed_by = sender_of(s)
        who = sent_from(s)
        self._set("interrupted" if s["label"] == "SIGINT" else "signal", "strong",
                  f"{s['label']}{who}{self._role(s)} at {s['time']}, taken by a native handler, and nothing was "
                  "recorded after it: the handler raised it again, with its default action (PyTorch's DataLoader "
                  "workers' does)")  # fmt: skip

    def _handled_signal(self) -> None:
        """A signal the job's own handler took before it ended by itself: a graceful shutdown (Lightning's
        SIGTERM checkpoint-and-exit, a requeue on SIGUSR1), said where the job's end alone would hide it."""
        handled = [s for s in self.f.in_life() if s["detail"] not in (DEFAULT_ACTION, "raised KeyboardInterrupt")]
        self.evidence += dropped_as_init(handled)
        handled = [s for s in handled if s["detail"] != fmt.DROPPED_AS_INIT]
        if not handled:
            return
        s, exc = handled[-1], self._raised()
        who, went_on = sent_from(s), self.f.steps_since(self.f.ns_of_signal(s))
        if went_on > 1:  # the job went on: its handler may have asked for the end (a flag read at an epoch's end),
            self.evidence.append(f"{s['label']}{who} at {s['time']} was {s['detail'] or 'handled'}, and the job went "
                                 f"on ({went_on} steps after it) before it ended")  # fmt: skip
            self.handled = {**s, "steps_after": went_on}  # or not (a SIGUSR1 logged): no graceful shutdown told
            return
        self.handled = s
        if exc is not None and s["label"] in STOPS and s["step"] == exc["step"] and s["time"] <= exc["time"]:
            self._set("signal", "certain", f"{s['label']}{who}{self._role(s)} at {s['time']} was {s['detail']}, "
                      "which raised the exception it died of (torchrun's agent raises SignalException)")  # fmt: skip
            self.killed_by = sender_of(s)
            return
        self.evidence.append(f"{s['label']}{who}{self._role(s)} at {s['time']} was {s['detail'] or 'handled'}, "
                             "and the job then ended by itself (a graceful shutdown)")  # fmt: skip

    # ---------------------------------------------------------------- helpers
    def _at_slurm_limit(self) -> str | None:
        """Slurm's OverMemoryKill: it polls the step's RSS and SIGKILLs a step over the job's ``--mem``
        ("exceeded memory limit (X > Y), being killed"), with no kernel OOM kill and no cgroup limit."""
        limit, last = self.ev.slurm_mem_limit, self.f.samples[-1] if self.f.samples else None
        if not limit or not last or last.get("host_rss") is None:
            return None
        rss = last["host_rss"] + max(0, last.get("children_rss") or 0)
        if rss < NEAR_LIMIT * limit:
            return None
        return (f"RSS {human_bytes(rss)} (with its children) at the last sample, at the job's memory limit "
                f"{human_bytes(limit)} in Slurm's account (--mem): "
                "Slurm's OverMemoryKill SIGKILLs a step over it")  # fmt: skip

    def _role(self, row: dict[str, Any]) -> str:
        """What a scheduler's signal meant: Slurm's own account where it was read (and the sender is
        Slurm's), else that it was a scheduler's; the reason also goes into ``killed_by``."""
        sender = row["sender"] or ""
        if sender in SLURM_SENDERS and self.ev.slurm:
            if self.killed_by is not None and self.killed_by.get("sender") == sender:
                self.killed_by["reason"] = self.ev.slurm
            return f" (Slurm: {self.ev.slurm})"
        return sender_role(sender)

    def _set(self, cause: str, confidence: str, why: str) -> None:
        self.cause, self.confidence = cause, confidence
        self.evidence.append(why)

    def _at(self, mono_ns: int, *, own: bool = False) -> None:
        """The death at the kernel's stamp; its step, the one in force: at the ring's last record when
        its own process died (nothing it wrote came after), else at the last record before the stamp."""
        self.death_ns = mono_ns
        step = (self.f.last_event or {}).get("step") if own else self.f.step_at(mono_ns)
        self.when = {"time": iso_ns(mono_ns + self.f.to_wall), "step": step}

    def _exit_message(self) -> str | None:
        said = exit_message(self.f, self.status) if self.cause == "nonzero_exit" else None
        return short_text(said, MAX_SAID) if said else None

    def result(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "cause": self.cause,
            "confidence": self.confidence,
            "headline": headline(self.cause, self.victim, self.killed_by, self.status, self.handled,
                                 in_shutdown=self.in_shutdown, crash=self.crash, raised=self._raised(),
                                 said=self._exit_message()),  # fmt: skip
            "evidence": self.evidence,
            "time": self.when["time"] if self.when else None,
            "step": self.when["step"] if self.when else None,
            "victim": {k: v for k, v in self.victim.items() if v is not None},
            "exit_status": self.status,
            "killed_by": self.killed_by,  # (and where it ended by itself after its own handler took one: handled_by)
            **({"handled_by": sender_of(self.handled)} if self.handled is not None and self.killed_by is None
               and not self.handled.get("steps_after") else {}),
        }
        if self.in_shutdown:
            d["in_shutdown"] = True
        if self.exec_into is not None:
            d["headline"] = (f"The {self.victim.get('role') or 'process'} (pid {self.pid}) replaced itself with "
                             f"`{self.exec_into}` (exec): it went on there.")  # fmt: skip
        d.update(analysis(self.f, self.cause, self.victim, self.stat_at_end))
        uncaught = self.f.main_uncaught
        if self.cause == "oom_exception" and uncaught:
            gpu = gpu_oom_kind(uncaught[-1])
            if gpu:
                d["gpu_oom"] = gpu
                d["levers"] = gpu["levers"] + d.get("levers", [])
        return d
