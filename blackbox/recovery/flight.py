"""PyTorch's flight recorder dump of a rank (where the job turned it on: the header's ``flight_recorder``),
read as untrusted input: which collectives the rank had entered when it was dumped.

NCCL's watchdog writes the dump on a collective's timeout to ``<dump_prefix><rank>``; a job may write it
itself (gloo too). It is a pickle, and a pickle is never unpickled here: ``decode`` walks its opcodes
(``pickletools.genops``, a parser that builds nothing) and builds only dicts, lists, tuples, strings,
bytes, numbers, booleans and None from the opcodes that make those; any other opcode (a global, a
reduce: what makes a pickle run code) refuses the file in one line. The file is opened relative to its
folder's descriptor, never through a link, only where its owner is the ring's and it was written inside
the ring's life; at most ``MAX_BYTES`` are read.

``summary``: per process group, the last collective the rank entered (``collective_seq_id``, its
``profiling_name``, ``state``) and the count of entries. Across ranks (``recovery.hang``), a rank whose
last collective is behind the others' never entered the one they waited in.
"""

from __future__ import annotations

import json
import os
import pickletools
import struct
from pathlib import Path
from typing import Any

from .._errors import BlackboxError
from ..ring.inputs import open_folder, open_input, read_at

MAX_BYTES = 32 << 20
MAX_ITEMS = 2_000_000  # containers and values built from one dump
SLACK_S = 60  # a dump may come this long after the ring's last record (the watchdog's own timeout)
_CONTAINERS = {"EMPTY_DICT": dict, "EMPTY_LIST": list}
_VALUES = {"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
           "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "INT", "LONG", "FLOAT", "STRING", "BINSTRING",
           "SHORT_BINSTRING"}  # fmt: skip
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False, "EMPTY_TUPLE": ()}


class DumpError(BlackboxError):
    pass


def decode(data: bytes) -> Any:
    """The data a pickle of plain data holds, without unpickling it (module docstring)."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    built = 0
    try:
        for op, arg, _ in pickletools.genops(data):
            name = op.name
            built += 1
            if built > MAX_ITEMS:
                raise DumpError(f"more than {MAX_ITEMS} opcodes")
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                return stack[-1]
            if name == "MARK":
                marks.append(len(stack))
            elif name in _CONTAINERS:
                stack.append(_CONTAINERS[name]())
            elif name in _CONSTANTS:
                stack.append(_CONSTANTS[name])
            elif name in _VALUES:
                stack.append(arg)
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg or 0)] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                stack.append(memo[int(arg or 0)])
            elif name in ("APPEND", "SETITEM", "SETITEMS", "APPENDS", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST",
                          "DICT"):
                _combine(name, stack, marks)
            else:
                raise DumpError(f"opcode {name}, which builds objects other than plain data")
    except DumpError:
        raise
    except (ValueError, LookupError, TypeError, AttributeError, struct.error, OverflowError, MemoryError) as exc:
        raise DumpError(f"not a pickle of plain data ({type(exc).__name__})") from None
    raise DumpError("a pickle cut short (no STOP)")


def _combine(name: str, stack: list[Any], marks: list[int]) -> None:
    if name in ("TUPLE1", "TUPLE2", "TUPLE3"):
        n = int(name[-1])
        items = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        stack.append(tuple(items))
        return
    if name in ("APPEND", "SETITEM"):
        items = stack[-1:] if name == "APPEND" else stack[-2:]
        del stack[-len(items) :]
    else:
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
    if name in ("TUPLE", "LIST", "DICT"):
        stack.append(tuple(items) if name == "TUPLE" else list(items) if name == "LIST" else {})
        if name == "DICT":
            stack[-1].update(zip(items[::2], items[1::2], strict=True))
    elif name in ("APPEND", "APPENDS"):
        stack[-1].extend(items)
    else:
        target = stack[-1]
        for k, v in zip(items[::2], items[1::2], strict=True):
            target[k] = v  # a key that cannot be one (a list) raises TypeError: refused


def _parsed(data: bytes) -> Any:
    """A dump as torch writes it (a pickle), or as JSON (``_dump_fr_trace_json``, a job's own)."""
    if data[:1] == b"{":
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise DumpError("JSON that does not parse") from None
    return decode(data)


def summary(dump: Any) -> dict[str, Any]:
    """``groups``: per process group (its id), ``last_seq`` (the last collective entered), ``last`` (its
    ``profiling_name``), ``state``, ``entries``; where the dump holds no collective, no group."""
    entries = dump.get("entries") if isinstance(dump, dict) else None
    groups: dict[str, dict[str, Any]] = {}
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or e.get("is_p2p") or not isinstance(e.get("collective_seq_id"), int):
            continue
        pg = str(e.get("pg_id"))
        g = groups.setdefault(pg, {"last_seq": -1, "last": None, "state": None, "entries": 0})
        g["entries"] += 1
        if e["collective_seq_id"] > g["last_seq"]:
            g.update(last_seq=e["collective_seq_id"], last=str(e.get("profiling_name"))[:128],
                     state=str(e.get("state"))[:32])  # fmt: skip
    return {"groups": groups}


def read_dump(
    config: Any, rank: Any, owner: int, life: tuple[float, float]
) -> tuple[dict[str, Any] | None, str | None]:
    """(the rank's dump's ``summary`` with its ``file``, or None; why none was read, where there was one to
    look for): ``config`` is the header's ``flight_recorder``, ``life`` the ring's (start, last record) in
    epoch seconds."""
    if not isinstance(config, dict) or not isinstance(rank, int) or not isinstance(config.get("dump_prefix"), str):
        return None, None
    path = Path(config["dump_prefix"] + str(rank))
    if not path.is_absolute() or path.name in ("", ".", ".."):
        return None, f"flight recorder dump {path}: a path relative to the job's folder, not read"
    try:
        with open_folder(path.parent) as folder:
            fd, st = open_input(folder, path.name, {owner}, "a flight recorder dump")
        try:
            if not life[0] <= st.st_mtime <= life[1] + SLACK_S:
                return None, f"flight recorder dump {path}: written outside this process's life (an earlier job's)"
            if st.st_size > MAX_BYTES:
                return None, f"flight recorder dump {path}: expected at most {MAX_BYTES} bytes, found {st.st_size}"
            data = read_at(fd, st.st_size, 0)
        finally:
            os.close(fd)
        return {"file": str(path), **summary(_parsed(data))}, None
    except BlackboxError as exc:
        if "found nothing" in str(exc) and not isinstance(exc, DumpError):
            return None, None  # no dump: the watchdog did not fire (nor did the job dump it)
        return None, f"flight recorder dump {path}: {exc}"
    except OSError as exc:
        return None, f"flight recorder dump {path}: {exc.strerror or exc}"
