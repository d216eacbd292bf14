"""The recovery pass: rings in, timelines and one metadata document out. Writes nothing.

One direction, each step once: read a ring, build its timeline, gather the
evidence outside it (the kernel log is read once for all rings), diagnose the
death, keep its metadata; a few rings at a time, so a writer can stream the
timelines out. Then assemble the metadata of them all.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._errors import BlackboxError
from ..ring import format as fmt
from ..ring.folded import read_folded
from ..ring.inputs import Folder
from ..ring.packed import KeptRings, Unpacking
from ..ring.reader import Listing, Ring, Unread, list_rings, nothing_read, read_header, read_ring
from .alerts import own_signals
from .cells import name_cells
from .diagnosis import diagnose
from .evidence import CgroupCounters, KernelKill, gather, kernel_oom_kills
from .facts import named_workers
from .flight import read_dump
from .helpers import with_group_rank
from .kinds import of_kind
from .metadata import bundle_metadata, helper_groups, ring_metadata
from .relays import RelayIndex
from .spill import SpilledRings
from .timeline import merge_tables, ring_table

OOM_REPORT = "oom-report.txt"


@dataclass
class Recovered:
    """What a recovery found: the merged timeline, the metadata, and the text files beside them."""

    table: pa.Table
    meta: dict[str, Any]
    files: dict[str, str]  # bundle file name -> text (a native crash's tracebacks, a kernel OOM report)


def _window_and_children(ring: Ring) -> tuple[tuple[int, int], set[int]]:
    """(first, last) monotonic ns of the ring's events, and the pids of the children it sampled. A ring with
    no event readable spans from its arm (the header's clock) on: never from the boot, which let a kernel
    kill of its pid long before it (a pid reused) pass for its death."""
    if not ring.count:
        armed = (ring.meta.get("clock") or {}).get("monotonic_ns")
        at = armed if isinstance(armed, int) and not isinstance(armed, bool) and armed > 0 else 0
        return (at, at), set()
    times, kinds = ring.field("time"), ring.field("kind")
    children = ring.field("p0")[kinds == fmt.KIND_CODES["child_sample"]] if ring.header.version >= 3 else np.zeros(0)
    return (int(times.min()), int(times.max())), {int(p) for p in np.unique(children)}


def _sampled_workers(table: pa.Table) -> bool:
    """The ring sampled DataLoader workers of its own (children named ``pt_data*``)."""
    names = of_kind(table, "child_sample", columns=["label"])["label"].unique().to_pylist()
    return any(isinstance(n, str) and n.startswith("pt_data") for n in names)


def _identities(paths: list[Path], listing: Listing) -> dict[Path, tuple[dict[str, Any], int]]:
    """Each ring's header identity and its arm time (wall ns), from the headers alone; unreadable ones left out."""
    out = {}
    for p in paths:
        try:
            meta = read_header(p, listing.folders[p]).meta
        except BlackboxError:
            continue
        ident, wall = meta.get("identity"), (meta.get("clock") or {}).get("wall_ns")
        if isinstance(ident, dict):
            st = listing.stats.get(p)
            ident = {**ident, "_uid": st.st_uid if st is not None else None}  # (a chain is one user's rings)
            out[p] = (ident, wall if isinstance(wall, int) and not isinstance(wall, bool) else 0)
    return out


def exec_successors(idents: dict[Path, tuple[dict[str, Any], int]]) -> dict[Path, str]:
    """Ring -> the command line of the program its process replaced itself with (``exec``), where a later ring
    of the same owner has its host, boot, pid namespace, pid and start time (``identity.start_ticks``: an exec
    keeps it; a pid used again does not): the process went on there, so the earlier ring's lack of a clean end
    is no death.
    (Another user's ring planted beside it, its fields copied, cannot make a death read so.)"""
    chains: dict[tuple[Any, ...], list[tuple[int, Path]]] = {}
    for p, (ident, wall) in idents.items():
        ticks = ident.get("start_ticks")
        key = (ident.get("_uid"), ident.get("host"), ident.get("boot_id"), ident.get("pid_ns"), ident.get("pid"), ticks)
        scalar = all(v is None or isinstance(v, (str, int)) for v in key)  # a crafted header's list is no key
        if scalar and isinstance(ticks, int) and not isinstance(ticks, bool) and isinstance(ident.get("pid"), int):
            chains.setdefault(key, []).append((wall, p))
    out = {}
    for chain in chains.values():
        chain.sort(key=lambda c: (c[0], str(c[1])))
        for (_, p), (_, after) in zip(chain, chain[1:], strict=False):
            argv = idents[after][0].get("argv")
            out[p] = " ".join(map(str, argv))[:200] if isinstance(argv, list) and argv else "another program"
    return out


def exec_mark(table: pa.Table) -> str | None:
    """The command line of the program the ring's process replaced itself with, as its last exec mark says
    (``collect.execs``: written just before the exec), where no failure mark followed it; None where none."""
    last = None
    for chunk in of_kind(table, "mark", columns=["label"])["label"].chunks:
        words = chunk.dictionary.to_pylist() if pa.types.is_dictionary(chunk.type) else chunk.to_pylist()
        if any(isinstance(w, str) and w.startswith(fmt.EXEC_MARKS) for w in words):
            last = next((w for w in reversed(chunk.cast(pa.string()).to_pylist())
                         if isinstance(w, str) and w.startswith(fmt.EXEC_MARKS)), last)  # fmt: skip
    if last is None or last == fmt.EXEC_FAILED:
        return None
    return last[len(fmt.EXEC_PREFIX) :] or "another program"


def _status_owner(idents: dict[Path, tuple[dict[str, Any], int]], paths: list[Path], launcher_pid: int | None,
                  execs: dict[Path, str], job_pid: int | None = None) -> Path | None:  # fmt: skip
    """The ring of the process whose exit status the launcher saw: the process it started (``job_pid``, its
    child; the only ring where the launcher is unknown), the last program it ran where it replaced itself
    (``exec``). A ring of a grandchild (a shell's Python child) never takes the job's status: its process may
    have died otherwise. Nor does one whose shell died before it armed (``( python train.py & )``, ``nohup
    python ... &`` as the script exits): handed to the launcher (a subreaper), it had the launcher as its parent
    at arm, as the child has. Decided from the headers alone, before any decoding."""
    if launcher_pid is None:
        last = [p for p in paths if p not in execs]
        return last[0] if len(last) == 1 else None
    direct = [p for p, (ident, _) in idents.items() if ident.get("ppid") == launcher_pid
              and job_pid in (None, ident.get("pid")) and p not in execs]  # fmt: skip
    return direct[0] if len(direct) == 1 else None


def _workers() -> int:
    return max(1, min(4, len(os.sched_getaffinity(0))))


MAX_RINGS = 4096  # rings recovered at most in one pass: above it, the newest (README, "Running recover as root")


def newest(paths: list[Path], limit: int, listing: Listing) -> tuple[list[Path], list[Path]]:
    """(the ``limit`` rings last modified, in their order; the others, oldest first): a folder any user
    can fill with rings costs recovery at most ``limit`` rings' time. The rings of the folder's owner
    go before any other user's, whatever their times (another user who can write there cannot push
    them out with newer ones); ties go to the later name. Times and owners as ``listing`` found them."""
    if len(paths) <= limit:
        return paths, []

    def rank(path: Path) -> tuple[bool, int, str]:
        st = listing.stats.get(path)
        if st is None:
            return False, 0, str(path)
        return st.st_uid == listing.folders[path].uid, st.st_mtime_ns, str(path)

    order = sorted(range(len(paths)), key=lambda i: rank(paths[i]))
    cut = len(paths) - limit
    kept = set(order[cut:])
    return [p for i, p in enumerate(paths) if i in kept], [paths[i] for i in order[:cut]]


IN_FLIGHT_BYTES = 96 << 20  # ring bytes decoded at once or being written, beyond one ring alone (which always goes)
# A ring holding less than this is decoded in the thread that takes its table, when its turn comes: its
# decode is Python calls that hold the GIL, and handing thousands of tiny rings to worker threads cost more
# in lock hand-offs than it saved (1,000 rings of 3 marks: 2 s of system time with four workers, 0.3 s here).
INLINE_BYTES = 1 << 20


def _bytes_there(path: Path, st: os.stat_result | None) -> int:
    """The bytes a ring really holds on disk (the reader skips its holes): its decoding's cost, from its
    listing's ``st``. A ring kept zstd-compressed (``*.zst``) costs what it decompresses to, unknown until
    it is read: it is decoded alone, as a ring larger than the whole budget is."""
    if path.name.endswith(".zst"):
        return IN_FLIGHT_BYTES + 1
    return 0 if st is None else min(st.st_size, st.st_blocks * 512)


class RecoveryPass:
    """One recovery, a ring at a time: ``tables()`` decodes and diagnoses the rings (a few at once,
    spread over the cores, in order) and yields each ring's timeline; ``finish()`` then assembles the
    metadata. Memory is bounded by the rings in flight, not by how many there are.

    Rings that cannot be read are listed with their reason (``unread_rings``); only when none can be
    read does ``finish()`` raise.

    ``inputs``: ring files and folders, as paths or as folders already open (``inputs.open_child``: Slurm's
    epilogue). Each folder is opened once, and every ring, sidecar and file of the folder is read
    relative to its descriptor, never by its path again (``reader.Listing``); ``close()`` closes those
    opened here. ``owners``: the only uids whose rings are read (the epilogue: the job's user). ``job_pid``: the
    process ``launcher_pid`` started, whose ``exit_status`` that is."""

    def __init__(
        self,
        inputs: Sequence[Path | Folder],
        exit_status: int | None = None,
        launcher_pid: int | None = None,
        extra: dict[str, Any] | None = None,
        *,
        keep_raw: bool = False,
        owners: Collection[int] | None = None,
        job_pid: int | None = None,
    ) -> None:
        self.inputs = [i.path if isinstance(i, Folder) else i for i in inputs]  # as named
        self.extra = extra or {}  # fields the caller adds to the bundle's metadata (`blackbox run`: left_running)
        self.owners = owners
        self.listing = list_rings(inputs, owners)
        self.paths, self.unread = self.listing.rings, self.listing.unread
        self.paths, self.left_out = newest(self.paths, MAX_RINGS, self.listing)  # named in the metadata, not read
        self.kills = kernel_oom_kills()  # one pass over the kernel log for every ring
        self.cgroups = CgroupCounters()  # each cgroup's oom_kill counter, read once
        self.exit_status = exit_status
        idents = _identities(self.paths, self.listing)
        self.execs = exec_successors(idents)  # rings whose process went on in another program (exec)
        self.owner = (_status_owner(idents, self.paths, launcher_pid, self.execs, job_pid)
                      if exit_status is not None else None)  # fmt: skip
        self.metas = SpilledRings()  # each ring's metadata, on disk until metadata.json is written
        self.files: dict[str, str] = {}  # bundle file name -> text (native crash tracebacks, kernel OOM reports)
        self._owners: set[int] = set()
        self._reports: list[tuple[int, str]] = []
        self.last = False  # the table ``tables()`` just yielded is the last: ``finish()`` may be called now
        self.progress: Callable[[int, int, str], None] | None = None  # told (done, all, ring) per ring read
        self.relays = RelayIndex()  # the real senders of the signals `blackbox run` relayed
        self.kept = KeptRings() if keep_raw else None  # the rings read, held open for the bundle's rings/
        self.unpacking = Unpacking()  # kept rings (*.zst) read back: as their bundle lists them, 2 GiB in all

    def _one(self, path: Path) -> tuple[pa.Table, dict[str, Any], KernelKill | None, str | None, int]:
        kept, folder = self.kept, self.listing.folders[path]
        ring = read_ring(path, folder, owners=self.owners, unpacking=self.unpacking,
                         hold=None if kept is None else lambda fd: kept.hold(path, fd))  # fmt: skip
        window, children = _window_and_children(ring)
        name_cells(ring)  # a notebook's cells as IPython names them (Cell In[3]), in its stacks and strings
        table = ring_table(ring, release=True)  # the ring's slots are freed once their columns are taken
        table = with_group_rank(ring.meta, own_signals(self.relays.attribute(table, folder, ring.owner)))
        status = self.exit_status if path == self.owner else None
        pids = children | named_workers(table)  # a forkserver's worker is sampled by none, named by the job
        evidence = gather(ring.writer_locked, ring.meta, status, self.kills, ring.crash, window, pids, self.cgroups,
                          lambda: _sampled_workers(table))  # fmt: skip
        evidence.signal_stacks = ring.signal_stacks  # written by faulthandler where the C extension was not built
        evidence.exec_into = self.execs.get(path)
        evidence.exec_mark = exec_mark(table) if evidence.exec_into is None else None
        if evidence.same_host and table.num_rows:  # the flight recorder's dump, on this host's disk
            life = ((ring.meta.get("clock") or {}).get("wall_ns") or 0) / 1e9, pc.max(table["time"]).value / 1e9
            rank = (ring.meta.get("identity") or {}).get("rank")
            evidence.flight, evidence.flight_note = read_dump(ring.meta.get("flight_recorder"), rank, ring.owner, life)
        death = diagnose(table, ring.clean, evidence, ring.meta)
        kill = evidence.kernel_kills[-1] if evidence.kernel_kills else None
        if kill is not None:
            death["kernel_report"] = {"file": OOM_REPORT, "tasks": kill.tasks}
        meta = ring_metadata(ring, table, evidence, death)
        return table, meta, kill, evidence.crash, ring.owner

    def tables(self) -> Iterator[pa.Table]:
        """Each readable ring's timeline, in the order the rings were found. Up to ``_workers()`` rings
        are decoded at once while their bytes, with those of the ring whose rows the caller is writing,
        stay within ``IN_FLIGHT_BYTES`` (a larger ring is decoded alone; one under ``INLINE_BYTES`` is
        decoded here, in its turn), so memory is bounded by the largest ring whatever the count. The
        next rings are handed out before a table is yielded: they decode while its rows are written.
        With the last one, ``last`` is set: every ring has been diagnosed, so the verdict can be written
        before its rows."""
        workers = _workers()
        Result = tuple[pa.Table, dict[str, Any], KernelKill | None, str | None, int]
        with ThreadPoolExecutor(workers) as pool:
            pending: deque[tuple[Path, int, Future[Result] | None]] = deque()  # None: decoded here, in turn
            waiting = deque((path, _bytes_there(path, self.listing.stats.get(path))) for path in self.paths)
            in_flight = 0  # the bytes of the rings pending and of the one whose rows are being written

            def hand_out() -> None:
                nonlocal in_flight
                while (
                    waiting
                    and len(pending) < workers
                    and (not in_flight or in_flight + waiting[0][1] <= IN_FLIGHT_BYTES)
                ):
                    path, size = waiting.popleft()
                    pending.append((path, size, pool.submit(self._one, path) if size >= INLINE_BYTES else None))
                    in_flight += size

            while waiting or pending:
                hand_out()
                path, size, future = pending.popleft()
                try:
                    table, meta, kill, crash, owner = future.result() if future is not None else self._one(path)
                except Exception as exc:  # besides its input's errors, an I/O error or a fault of blackbox's own
                    self.unread.append(Unread(path, exc if isinstance(exc, BlackboxError) else _fault(path, exc)))
                    in_flight -= size
                    continue
                finally:
                    del future  # it holds the table too
                    if self.progress is not None:
                        self.progress(len(self.paths) - len(waiting) - len(pending), len(self.paths), str(path))
                if kill is not None:
                    head = f"# pid {meta.get('pid')} ({kill.name})\n"
                    self._reports.append((kill.time_ns, head + "\n".join(kill.report) + "\n"))
                if crash is not None and (told := meta["native_crash"] or meta["shutdown_stacks"]):
                    self.files[told["file"]] = crash
                self._owners.add(owner)
                if self.kept is not None:
                    self.kept.offer(path)
                self.metas.append(meta)
                self.last = not waiting and not pending
                hand_out()  # the next rings decode while this one's rows are written
                yield table
                del table  # not held while the next ring is decoded
                in_flight -= size

    def finish(self) -> dict[str, Any]:
        """The bundle's metadata, once ``tables()`` has been consumed."""
        if not self.metas:
            raise nothing_read(self.unread)
        if self._reports:  # one file, the kills in the order the kernel made them
            self.files[OOM_REPORT] = "\n".join(text for _, text in sorted(self._reports))
        meta = bundle_metadata(self.metas)
        if self.exit_status is not None:
            meta["exit_status"] = self.exit_status
        meta.update(self.extra)
        folded = [entry for folder in self.listing.named for entry in read_folded(folder, self._owners)]
        self.close()
        if folded:
            meta["helpers"] = helper_groups(folded)
        if self.unread:
            meta["unread_rings"] = [{"ring": str(u.path), "reason": u.reason} for u in self.unread]
        if self.left_out:
            meta["rings_left_out"] = {"limit": MAX_RINGS, "count": len(self.left_out),
                                      "rings": [str(p) for p in self.left_out]}  # fmt: skip
        return meta

    def close(self) -> None:
        """Close the folders this pass opened (``finish()`` does, once it has read them)."""
        self.listing.close()


def _fault(path: Path, exc: Exception) -> BlackboxError:
    """What went wrong reading one ring that is no error of its input blackbox names: in one line, with
    what raised it (a planted ring that stopped the whole recovery with a traceback now loses only itself)."""
    if isinstance(exc, OSError):
        return BlackboxError(f"{path}: could not be read ({exc.strerror or exc})")
    return BlackboxError(f"{path}: could not be recovered, a fault in blackbox ({type(exc).__name__}: {exc}); "
                         "the other rings were recovered")  # fmt: skip


def recover_rings(
    inputs: Sequence[Path | Folder],
    exit_status: int | None = None,
    launcher_pid: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> Recovered:
    """Read and diagnose every ring named (ring files, or folders of ``*.ring``), all in memory.
    Rings that cannot be read are listed with their reason (``unread_rings``); only when none can be
    read does this raise.

    ``exit_status``: how the job ended, where the caller saw it (``blackbox run``, whose pid is
    ``launcher_pid``): it belongs to the job's own process, the ring whose writer the launcher started.
    ``progress``: called with (rings done, rings in all, the ring) as each ring is diagnosed.
    """
    recovery = RecoveryPass(inputs, exit_status, launcher_pid)
    recovery.progress = progress
    try:
        tables = list(recovery.tables())
        meta = recovery.finish()
    finally:
        recovery.close()
    return Recovered(merge_tables(tables), meta, recovery.files)
