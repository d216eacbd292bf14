"""The header metadata's schema, checked before anything uses it.

The header's CRC says the metadata JSON was not damaged, not that it is sane: a
hostile writer computes a CRC too. So the document is held to a nesting depth,
to finite numbers (no ``NaN``, no ``1e999``) and to text that UTF-8 can encode,
and every field recovery uses is checked for its type and range. A field that
fails makes the header corrupt, with a one-line reason naming the field. Fields
may be missing or null (older versions lack some); fields this reader does not
know are held only to the depth, number and text rules.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 16  # the metadata written today nests 3 deep
INT64 = 1 << 63
INT32 = 1 << 31


class Int:
    """An integer (never a bool) in [lo, hi]."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def check(self, v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and self.lo <= v <= self.hi


class Number(Int):
    """An int or a finite float in [lo, hi]."""

    def check(self, v: Any) -> bool:
        if isinstance(v, float):
            return math.isfinite(v) and self.lo <= v <= self.hi
        return super().check(v)


class ListOf:
    def __init__(self, item: type) -> None:
        self.item = item


class MapOf:
    """An object whose keys are free and whose values are all of one type (or null)."""

    def __init__(self, value: type) -> None:
        self.value = value


PID = Int(0, INT32 - 1)
RANK = Int(-INT32, INT32 - 1)  # the timeline's rank column is int32
CLOCK_NS = Int(0, INT64 - 1)
# Each used field: a type (or null), an Int/Number range, a ListOf/MapOf, or a nested dict of fields.
SCHEMA: dict[str, Any] = {
    "format_version": Int(1, 0xFFFF),
    "clock": {"wall_ns": CLOCK_NS, "monotonic_ns": CLOCK_NS, "error_s": Number(0, 10**9)},
    "identity": {
        "host": str,
        "pid": PID,
        "ppid": PID,
        "rank": RANK,
        "local_rank": RANK,
        "world_size": RANK,
        "role": str,
        "start_method": str,
        "mp_parent": PID,
        "attempt": Int(-INT64, INT64 - 1),
        "job": str,
        "argv": ListOf(str),
        "boot_id": str,
    },
    "started_at": str,
    "versions": MapOf(str),
    "sample_interval_s": Number(0, 10**9),
    "cgroup": {"version": Int(1, 2), "path": str},
    "limits": {"address_space": Int(0, INT64 - 1), "mem_total": Int(0, INT64 - 1)},
    "writer": {"package": str, "version": str, "backend": str},
    "liveness": str,
    "record_dtype": ListOf(list),
    "regions": MapOf(int),
    "flight_recorder": {"dump_prefix": str, "buffer_size": Int(0, INT64 - 1)},
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


class _NotFinite(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise _NotFinite(text)
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # a \uD800-\uDFFF escape: the only way JSON text holds one


def parse_meta(blob: bytes) -> tuple[dict[str, Any], list[str]]:
    """The metadata JSON as a dict, and what is wrong with it (empty when it can be used)."""
    try:
        meta = json.loads(blob, parse_constant=_no_constant, parse_float=_finite)
    except _NotFinite:
        return {}, [_NOT_FINITE]
    except (ValueError, RecursionError) as exc:  # bad JSON, NaN/Infinity, an int of over 4300 digits, depth
        return {}, [f"metadata JSON ({type(exc).__name__})"]
    if not isinstance(meta, dict):
        return {}, ["metadata that is not a JSON object"]
    problems = _document_problems(meta, blob)
    if not problems:
        _check_fields(meta, SCHEMA, "", problems)
    return (meta if not problems else {}), problems


_NOT_FINITE = "a metadata number that is not finite"
_TOO_DEEP = f"metadata nested deeper than {MAX_DEPTH} levels"
_LONE_SURROGATE = "metadata text that is not valid Unicode (a lone surrogate)"


def lone_surrogate(meta: Any, blob: bytes) -> bool:
    """``meta``, written as the JSON ``blob``, holds a key or string that is not valid Unicode, which a reader
    refuses (``_LONE_SURROGATE``). Its strings are walked only where the JSON held a surrogate escape: UTF-8
    bytes cannot hold a lone surrogate."""
    return bool(_SURROGATE_ESCAPE.search(blob)) and _lone_surrogate(meta)


def escape_surrogates(meta: Any) -> Any:
    """``meta`` with every lone surrogate escaped: an argument or a path of bytes that are not UTF-8 (Python keeps
    each as a surrogate, ``surrogateescape``) reads ``caf\\xe9``; another lone surrogate ``\\udXXX``."""
    if isinstance(meta, str):
        try:
            return meta.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return meta.encode("utf-8", "backslashreplace").decode()
    if isinstance(meta, dict):
        return {escape_surrogates(k): escape_surrogates(v) for k, v in meta.items()}
    if isinstance(meta, (list, tuple)):
        return [escape_surrogates(v) for v in meta]
    return meta


def _document_problems(meta: dict[str, Any], blob: bytes) -> list[str]:
    """Depth and text of the whole document (its numbers were checked as they were parsed), each walked
    without recursion (``lone_surrogate``)."""
    if not _deep_enough(meta):
        return [_TOO_DEEP]
    if lone_surrogate(meta, blob):
        return [_LONE_SURROGATE]
    return []


def _deep_enough(meta: dict[str, Any]) -> bool:
    """No container lies deeper than MAX_DEPTH: the containers alone walked (json.loads makes plain dicts
    and lists)."""
    stack: list[tuple[Any, int]] = [(meta, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        items = node.values() if type(node) is dict else node
        stack.extend([(item, depth + 1) for item in items if type(item) is dict or type(item) is list])
    return True


def _lone_surrogate(meta: dict[str, Any]) -> bool:
    """A key or string that UTF-8 cannot encode (a document no deeper than MAX_DEPTH)."""
    stack: list[Any] = [meta]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):  # (a writer's metadata may hold tuples: JSON's lists)
            stack.extend(node)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


NULLABLE_OBJECTS = frozenset({"cgroup"})  # other objects, where present, are objects: readers index into them


def _check_fields(obj: dict[str, Any], spec: dict[str, Any], where: str, problems: list[str]) -> None:
    for key, want in spec.items():
        v = obj.get(key)
        name = f"{where}{key}"
        if v is None and not (isinstance(want, dict) and key in obj and key not in NULLABLE_OBJECTS):
            continue
        if isinstance(want, dict):
            if not isinstance(v, dict):
                problems.append(f"metadata {name} of type {type(v).__name__} (expected an object)")
            else:
                _check_fields(v, want, f"{name}.", problems)
        elif not _fits(v, want):
            problems.append(f"metadata {name} {_short(v)} (expected {_expected(want)})")


def _fits(v: Any, want: Any) -> bool:
    if isinstance(want, Int):
        return want.check(v)
    if isinstance(want, ListOf):
        return isinstance(v, list) and all(isinstance(x, want.item) for x in v)
    if isinstance(want, MapOf):
        return isinstance(v, dict) and all(x is None or _fits(x, want.value) for x in v.values())
    if want is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, want)


def _expected(want: Any) -> str:
    if isinstance(want, Int):
        return f"{'a number' if isinstance(want, Number) else 'an integer'} from {want.lo} to {want.hi}"
    if isinstance(want, ListOf):
        return f"a list of {want.item.__name__}"
    if isinstance(want, MapOf):
        return f"an object of {want.value.__name__}"
    return str(want.__name__)


def _short(v: Any) -> str:
    """A value for a message: its type, and a number's first digits (never much of the file's text)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        text = str(v) if not isinstance(v, int) or v.bit_length() < 64 else f"of {v.bit_length()} bits"
        return text[:24]
    return f"of type {type(v).__name__}"
