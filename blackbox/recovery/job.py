"""The job-wide account over node bundles: read their metadata and rank tables, never their timelines.

Rings stay on the node that wrote them, so a job on many hosts leaves one bundle
per host (``blackbox recover`` on each, often straight to object storage). This
module reads the bundles found under what the user named (``locate``): each
one's ``metadata.json`` and ``ranks.parquet`` a bundle at a time, and assembles
the job's metadata: its attempts and first death across every host, with the
bundle that holds that death's timeline.

Every bundle is untrusted input: local files are opened without following links
(``ring.inputs``), every read is bounded, and a bundle that cannot be read is
left out with its one-line reason (``unread_bundles``), never guessed at.
Memory: one bundle's metadata at a time, plus a few fields and one rank row per
ring of the job.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._errors import BlackboxError, BundleDestinationError, RingNotFoundError, one_line
from .._times import epoch_ns
from .._version import __version__
from . import live_stacks
from .attempts import attempt_metadata, group_attempts, raised
from .bundle import METADATA, RANKS, parse_metadata
from .hang import as_decided
from .locate import Place, find_bundles
from .ranks import SCHEMA, collateral_columns, rank_rows, ranks_table, table_rows
from .stuck_rank import ranked

MAX_RANKS_BYTES = 64 << 20  # a ranks.parquet of a million rings is far smaller

MAX_RINGS_PER_BUNDLE = 25_000
# What parsing one metadata.json may build, checked on its bytes before it is parsed: a ring's metadata
# holds 20 to 80 objects and lists and 200 to 700 values, a few KiB; a planted one could hold a 191 MB
# list of floats (2.4 GB parsed). Values are counted from above: commas, colons and containers.
MAX_JSON_BYTES = 32 << 20
MAX_JSON_CONTAINERS = 2_000_000
MAX_JSON_VALUES = 4_000_000
MAX_RANKS_DECODED = 64 << 20  # a ranks table's columns once decoded (25,000 rings of 2.6 KiB)
GAUGES = ("host_rss", "cgroup_usage", "gpu_allocated", "gpu_reserved")
# The longest text kept of each field read from a bundle, once escaped: the job's account holds a few
# fields per ring of every bundle, and names longer than these are not names.
TEXT_LIMITS = {"host": 256, "role": 64, "cause": 64, "confidence": 64, "headline": 1024, "ring": 1024, "stack": 4096}


def _text(v: Any, limit: int = 64) -> str | None:
    """Text as the account keeps it: escaped (it reaches a terminal) and at most ``limit`` characters."""
    if not isinstance(v, str):
        return None
    text = one_line(v[: limit + 1])  # a character more: cut text ends with an ellipsis
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 62 else None


def _int32(v: Any) -> int | None:
    """A rank, local rank or world size: int32 in the ring's header and in both tables."""
    return v if isinstance(v, int) and not isinstance(v, bool) and -(1 << 31) <= v < 1 << 31 else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e15 else None


def _time(v: Any) -> str | None:
    """An ISO-8601 time that a table can hold, else None."""
    return v if epoch_ns(v) is not None else None


def _peaks(v: Any) -> dict[str, Any]:
    peaks = v if isinstance(v, dict) else {}
    out = {}
    for g in GAUGES:
        p = peaks.get(g)
        if isinstance(p, dict) and _int(p.get("bytes")) is not None:
            out[g] = {"bytes": p["bytes"]}
    return out


def _slim(m: dict[str, Any], at: tuple[int, int]) -> dict[str, Any]:
    """What the job-wide account needs of one ring's metadata, each field checked for its type (a
    field of the wrong type is left out, as if not recorded)."""
    raw = m.get("death")
    d: dict[str, Any] = raw if isinstance(raw, dict) else {}
    victim = d.get("victim") if isinstance(d.get("victim"), dict) else None
    death = {
        "cause": _text(d.get("cause")) or "unknown",
        "confidence": _text(d.get("confidence")),
        "headline": _text(d.get("headline"), TEXT_LIMITS["headline"]),
        "time": _time(d.get("time")),
        "step": _int(d.get("step")),
        "victim": {k: _int(victim.get(k)) if k != "role" else _text(victim.get(k)) for k in ("pid", "role", "rss")}
        if victim
        else None,
        "killed_by": _killer(d.get("killed_by")),
        "handled_by": _killer(d.get("handled_by")),
        "hang": _stall(d.get("hang")),
        "time_error_s": _float(d.get("time_error_s")),
        "starved": _starved(d.get("starved")),
        "peer_lost": _text(d.get("peer_lost")),
        "in_shutdown": d.get("in_shutdown") is True,
    }
    return {
        "host": _text(m.get("host"), TEXT_LIMITS["host"]),
        "pid": _int(m.get("pid")),
        "ppid": _int(m.get("ppid")),
        "job": _text(m.get("job")),
        "rank": _int32(m.get("rank")),
        "local_rank": _int32(m.get("local_rank")),
        "world_size": _int32(m.get("world_size")),
        "role": _text(m.get("role")),
        "attempt": _int(m.get("attempt")),
        "started_at": _time(m.get("started_at")),
        "last_event_at": _time(m.get("last_event_at")),
        "last_step": _int(m.get("last_step")),
        "last_step_s": _float(m.get("last_step_s")),
        "clock_error_s": _float(m.get("clock_error_s")),
        "peaks": _peaks(m.get("peaks")),
        "ring": _text(m.get("ring"), TEXT_LIMITS["ring"]),
        "events": _int(m.get("events")) or 0,
        "raised": _text(raised(m)),  # (a launcher's report of a death: attempts.REPORTS)
        "death": death,
        "_at": at,
    }


def _killer(v: Any) -> dict[str, Any] | None:
    """The sender of the signal that ended a ring (``death.killed_by``), each field checked for its type."""
    if not isinstance(v, dict):
        return None
    return {"signal": _text(v.get("signal")), "sender": _text(v.get("sender")), "sender_pid": _int(v.get("sender_pid")),
            "time": _time(v.get("time"))}  # fmt: skip


def _starved(v: Any) -> dict[str, Any] | None:
    """How late a ring's sampler ran at its end (``death.starved``), checked for its type."""
    if not isinstance(v, dict) or _float(v.get("late_s")) is None:
        return None
    return {"late_s": _float(v.get("late_s")), "interval_s": _float(v.get("interval_s"))}


def _stall(v: Any) -> dict[str, Any] | None:
    """A ring's stall before its end (``death.hang``), each field checked for its type."""
    if not isinstance(v, dict):
        return None
    collective = _text(v.get("collective"), 256)  # a waiter's stack is not shown: not kept for each of many ranks
    fr: dict[str, Any] = v["flight_recorder"] if isinstance(v.get("flight_recorder"), dict) else {}
    groups: dict[Any, Any] = fr["groups"] if isinstance(fr.get("groups"), dict) else {}
    flight = {"file": _text(fr.get("file"), TEXT_LIMITS["ring"]), "groups": {
        _text(pg) or "?": {"last_seq": _int(g.get("last_seq")), "last": _text(g.get("last"), 128)}
        for pg, g in list(groups.items())[:64] if isinstance(g, dict)}} if fr else None  # fmt: skip
    return {"flight_recorder": flight, "since": _time(v.get("since")), "step": _int(v.get("step")),
            "stalled_s": _float(v.get("stalled_s")),
            "step_s": _float(v.get("step_s")), "site": _text(v.get("site"), TEXT_LIMITS["ring"]),
            "stack": None if collective else _text(v.get("stack"), TEXT_LIMITS["stack"]), "collective": collective,
            "timed_out": _text(v.get("timed_out"), 300)}  # fmt: skip


def _rings_of(meta: dict[str, Any], where: Place) -> list[dict[str, Any]]:
    rings = meta.get("rings") if "rings" in meta else [meta]
    if not isinstance(rings, list) or not all(isinstance(m, dict) for m in rings):
        raise BundleDestinationError(f"{where}/{METADATA}: expected blackbox bundle metadata, found other JSON")
    if len(rings) > MAX_RINGS_PER_BUNDLE:
        raise BundleDestinationError(
            f"{where}/{METADATA}: expected at most {MAX_RINGS_PER_BUNDLE} rings, found {len(rings)}"
        )
    return rings


def _read_meta(where: Place) -> dict[str, Any]:
    raw = where.read(METADATA, MAX_JSON_BYTES)
    containers = raw.count(b"{") + raw.count(b"[")  # bounds what parsing can build, before it builds it
    if containers > MAX_JSON_CONTAINERS:
        raise BundleDestinationError(
            f"{where}/{METADATA}: expected at most {MAX_JSON_CONTAINERS} JSON objects and lists, found {containers}"
        )
    values = raw.count(b",") + raw.count(b":") + containers + 1  # each value but a container's first follows one
    if values > MAX_JSON_VALUES:
        raise BundleDestinationError(
            f"{where}/{METADATA}: expected at most {MAX_JSON_VALUES} JSON values, found up to {values}"
        )
    meta = parse_metadata(raw, f"{where}/{METADATA}")
    if meta.get("scope") == "job":
        raise BundleDestinationError(f"{where}: expected a bundle of rings, found a job-wide bundle (read it alone)")
    return meta


def _read_ranks(where: Place, rings: list[dict[str, Any]]) -> pa.Table:
    """The bundle's ranks.parquet in the ranks schema, one row per ring of its metadata; where it is
    missing, unreadable or disagrees with the metadata (a bundle from before ranks.parquet, a damaged or
    planted file), the same rows from the metadata."""
    try:
        buf = pa.BufferReader(where.read(RANKS, MAX_RANKS_BYTES))
        table = _ranks_columns(buf, len(rings), f"{where}/{RANKS}")
        columns = [
            table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
            for f in SCHEMA
        ]
        out = pa.Table.from_arrays(columns, schema=SCHEMA)
        table_rows(out.select(["started_at", "last_event_at", "death_time"]))  # times a row can hold
        return out
    except (BlackboxError, pa.ArrowException, OSError, ValueError, OverflowError):
        return ranks_table(rank_rows({"rings": rings}))


def _identity(m: dict[str, Any]) -> tuple[Any, ...]:
    """What names a ring across bundles: its host, pid and start."""
    return m["host"], m["pid"], m["started_at"]


def _recovered_by(v: Any) -> dict[str, str | None] | None:
    """The version that wrote a bundle, checked like any field (it was copied whole: 8 bundles of a
    100 MB one made a job metadata.json of 839 MB)."""
    return {"blackbox": _text(v.get("blackbox"))} if isinstance(v, dict) else None


def _ranks_columns(buf: pa.BufferReader, rows: int, where: str) -> pa.Table:
    """The columns of the ranks schema that a ranks.parquet holds, nothing else, each checked against
    MAX_RANKS_DECODED before it is decoded: as its footer declares them, then, for text, as its values
    would be once a dictionary's are repeated (a 2 MB string in a dictionary page of a few bytes, on every
    row, is 2.5 GB on 1,250 rows)."""
    meta = pq.ParquetFile(buf).metadata
    if meta.num_rows != rows:
        raise BundleDestinationError(f"{where}: expected one row per ring ({rows}), found {meta.num_rows}")
    names = [n for n in SCHEMA.names if n in set(meta.schema.to_arrow_schema().names)]
    leaves = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] in names]
    declared = sum(meta.row_group(g).column(i).total_uncompressed_size for g in range(meta.num_row_groups)
                   for i in leaves)  # fmt: skip
    if declared > MAX_RANKS_DECODED:
        raise BundleDestinationError(f"{where}: expected at most {MAX_RANKS_DECODED} column bytes, found {declared}")
    text = [n for n in names if pa.types.is_string(SCHEMA.field(n).type)]
    buf.seek(0)
    # no thread of Arrow's at all: pq.read_table starts one even with use_threads=False (its dataset scan), and a
    # pool thread alive at the interpreter's end aborts it (`blackbox summary JOB` exited -6: apache/arrow#34314)
    table = pq.ParquetFile(buf, read_dictionary=text).read(columns=names, use_threads=False)
    size = 0
    for name in text:
        for chunk in table[name].chunks:
            if pa.types.is_dictionary(chunk.type):  # the bytes each row's value takes once repeated
                lengths = pc.binary_length(chunk.dictionary.cast(pa.large_binary()))
                size += pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0
    if size > MAX_RANKS_DECODED:
        raise BundleDestinationError(f"{where}: expected at most {MAX_RANKS_DECODED} bytes of text, found {size}")
    return table


@dataclass
class JobPass:
    """Read node bundles one at a time; then ``finish()`` gives the job's metadata and rank rows."""

    targets: list[str]
    places: list[Place] = field(default_factory=list)
    unread: list[dict[str, str]] = field(default_factory=list)
    _rings: list[dict[str, Any]] = field(default_factory=list)
    _bundles: list[dict[str, Any]] = field(default_factory=list)
    _ranks: list[pa.Table] = field(default_factory=list)
    claimed_twice: list[dict[str, Any]] = field(default_factory=list)  # rings two bundles hold, both named
    _seen: dict[tuple[Any, ...], list[int]] = field(default_factory=dict)  # ring identity -> where in _rings
    _next: int = 0  # places read so far
    _finished: bool = False

    def __post_init__(self) -> None:
        named: set[str] = set()
        for target in self.targets:
            try:
                found = find_bundles(target, self.unread)
            except BlackboxError as exc:
                self.unread.append({"bundle": one_line(target), "reason": one_line(str(exc))})
                continue
            if not found:
                self.unread.append({"bundle": one_line(target), "reason": f"{one_line(target)}: found no bundle"})
            for place in found:  # a bundle named twice (itself and its folder, two spellings) is read once
                key = str(place) if place.fs is not None else os.path.realpath(str(place))
                if key not in named:
                    named.add(key)
                    self.places.append(place)
        if not self.places:
            raise RingNotFoundError(
                f"{' '.join(map(one_line, self.targets))}: expected ring files, a bundle, or a folder or URI prefix "
                f"of bundles, found none ({self.unread[-1]['reason'] if self.unread else 'nothing'})"
            )

    def read(self) -> Iterator[Place]:
        """Read each bundle (yielding it once read, for progress); unreadable ones go to ``unread``."""
        while self._next < len(self.places):
            i, where = self._next, self.places[self._next]
            self._next += 1
            try:
                meta = _read_meta(where)
                rings = [_slim(m, (i, j)) for j, m in enumerate(_rings_of(meta, where))]
                ranks = _read_ranks(where, rings)
                keep = self._claims(where, rings)
            except BlackboxError as exc:
                self.unread.append({"bundle": one_line(str(where)), "reason": one_line(str(exc))})
                continue
            rings = [rings[k] for k in keep]
            for m in rings:
                if None not in _identity(m):  # a ring whose identity cannot be read is no other's
                    self._seen.setdefault(_identity(m), []).append(len(self._rings))
                self._rings.append(m)
            self._ranks.append(ranks.take(pa.array(keep, pa.int64())) if len(keep) < ranks.num_rows else ranks)
            self._bundles.append({
                "bundle": one_line(str(where)),
                "hosts": sorted({m["host"] for m in rings if m["host"]}),
                "rings": len(rings),
                "events": sum(m["events"] for m in rings),
                "cause": _text(meta.get("cause")),
                "recovered_by": _recovered_by(meta.get("recovered_by")),
            })  # fmt: skip
            del meta
            yield where

    def _claims(self, where: Place, rings: list[dict[str, Any]]) -> list[int]:
        """Which of a bundle's rings to read: a ring another bundle read already (same host, pid and start)
        is read once where both hold the same account of it, and twice where they differ, both bundles named
        in ``claimed_twice`` either way: a planted bundle that claims another's rings drops nothing silently
        (it once made the real one "a copy", and its SIGKILLs left the verdict). A bundle holding nothing but
        the same accounts as another is a copy, not read, and named so."""
        keep, same = [], []
        for k, m in enumerate(rings):
            earlier = [self._rings[e] for e in self._seen.get(_identity(m), [])]
            if not earlier:
                keep.append(k)
                continue
            other = next((e for e in earlier if {**m, "_at": None} == {**e, "_at": None}), None)
            same.append((m, other or earlier[0], other is not None))
            if other is None:
                keep.append(k)
        first = one_line(str(self.places[same[0][1]["_at"][0]])) if same else ""
        if same and not keep:
            raise BundleDestinationError(f"{where}: expected new rings, found those of {first} (a copy)")
        for m, other, equal in same:
            self.claimed_twice.append({
                "ring": f"host {m['host']} pid {m['pid']} started {m['started_at']}",
                "bundles": [one_line(str(self.places[other["_at"][0]])), one_line(str(where))],
                "same": equal,
            })  # fmt: skip
        return keep

    def ranks(self) -> pa.Table:
        """Every bundle's rows; ``collateral_of`` and ``stopped_by`` as the job-wide account decided them
        (once ``finish()`` has: a rank torn down after a death on another host is collateral job-wide only)."""
        table = pa.concat_tables(self._ranks) if self._ranks else SCHEMA.empty_table()
        if self._finished and table.num_rows == len(self._rings):
            marks = [collateral_columns(m["death"].get("collateral_of")) for m in self._rings]
            for name in collateral_columns(None):  # (its columns, as rank_rows fills them)
                column = pa.array([c[name] for c in marks], type=SCHEMA.field(name).type)
                table = table.set_column(table.schema.get_field_index(name), name, column)
            for name in ("cause", "confidence"):  # a hang its attempt called, across bundles (``as_decided``), or
                was = table[name].to_pylist()  # a wait for a rank at work it found
                told = [m["death"]["cause"] == "hang" or bool(m["death"].get("waited_for")) for m in self._rings]
                column = pa.array([m["death"][name] if t else w for m, w, t in zip(self._rings, was, told,
                                                                                   strict=True)],
                                  type=SCHEMA.field(name).type)  # fmt: skip
                table = table.set_column(table.schema.get_field_index(name), name, column)
        return table

    def finish(self) -> dict[str, Any]:
        """The job's metadata: its bundles, attempts and first death (with the bundle holding it)."""
        for _ in self.read():
            pass
        if not self._bundles:
            raise RingNotFoundError(f"no bundle could be read: {self.unread[0]['reason'] if self.unread else ''}")
        attempts = attempt_metadata(group_attempts(self._rings))
        self._finished = True
        for a in attempts:
            if a["first_death"] is not None:
                a["first_death"]["bundle"] = one_line(str(self.places[self._first_ring(a["first_death"])["_at"][0]]))
        first = attempts[-1]["first_death"] if attempts else None
        return {
            "scope": "job",
            "cause": first["cause"] if first else "clean_exit",
            "first_death": first,
            "attempts": attempts,
            "jobs": len({a["job"] for a in attempts}),
            "hosts": len({m["host"] for m in self._rings if m["host"]}),
            "ring_count": len(self._rings),
            "events": sum(m["events"] for m in self._rings),
            "bundles": self._bundles,
            "unread_bundles": self.unread,
            "claimed_twice": self.claimed_twice,
            "recovered_by": {"blackbox": __version__},
        }

    def _first_ring(self, first: dict[str, Any]) -> dict[str, Any]:
        return next(
            m for m in self._rings
            if (m["host"], m["pid"], m["death"]["time"]) == (first["host"], first["pid"], first["time"])
        )  # fmt: skip

    def rows(self) -> list[dict[str, Any]]:
        return table_rows(self.ranks())

    def first_death_ring(self, meta: dict[str, Any]) -> dict[str, Any] | None:
        """The full metadata of the first death's ring, read again from its bundle (None: no death,
        or its bundle changed meanwhile)."""
        first = meta.get("first_death")
        if not first:
            return None
        told = self._first_ring(first)  # (its slim: where it is, and its death as the attempt told it)
        i, j = told["_at"]
        place = self.places[i]
        try:
            rings = _rings_of(meta_i := _read_meta(place), place)
        except BlackboxError:
            return None
        ring: dict[str, Any] | None = rings[j] if j < len(rings) and rings[j].get("pid") == first["pid"] else None
        if ring is None:
            return None
        ring["death"] = as_decided(ring.get("death") or {}, told["death"], ranked(ring))
        with contextlib.suppress(BlackboxError):  # its stacks (none where its bundle has no readable file)
            live_stacks.attach_bytes(meta_i, place.read(live_stacks.ALLOCATIONS, live_stacks.MAX_FILE_BYTES), place)
        return ring
