"""Rings' metadata kept on disk while a recovery runs, so its memory does not grow with the ring count.

A recovery of thousands of rings keeps each ring's full metadata (its death and
evidence, last events, peaks, stacks: a few KiB as Python objects) until
metadata.json is written. ``SpilledRings`` holds them as JSON in an unnamed
temporary file instead, and reads one back at a time: a read-only sequence of
dicts, each as metadata.json will hold it. The JSON is kept as metadata.json
writes it (``indent=2``), so writing it there is a copy (``text``), not a parse
and an encode per ring.
"""

from __future__ import annotations

import errno
import io
import json
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO, TypeVar, overload

from .live_stacks import holds_stacks

T = TypeVar("T")


# json.dumps(meta, indent=2)'s text. No check for cycles (a ring's metadata is a tree recovery builds): a
# quarter of the encoding's time, which the indent keeps in Python
_ENCODER = json.JSONEncoder(indent=2, check_circular=False)


class SpilledRings(Sequence[dict[str, Any]]):
    """Rings' metadata, appended one at a time and read back in order (``rings[i]``, iteration).

    Kept in an unnamed temporary file (gone with its last reference or the process); where none can be
    made (a read-only or full temporary folder), in memory."""

    def __init__(self, metas: Sequence[dict[str, Any]] = ()) -> None:
        self._file: BinaryIO
        try:  # unbuffered: a full disk is an error of the write that meets it, not of a later call
            self._file = tempfile.TemporaryFile(prefix="blackbox-rings-", buffering=0)
        except OSError:
            self._file = io.BytesIO()
        self._ends = array("q", [0])  # ring i's JSON is bytes [_ends[i], _ends[i + 1])
        self._derived: dict[str, tuple[int, Any]] = {}  # key -> (ring count, value): see ``derived``
        self._with_stacks: list[int] = []  # the rings with stacks kept apart (live_stacks.py)
        for m in metas:
            self.append(m)

    def append(self, meta: dict[str, Any]) -> None:
        allocations = meta.get("allocations")
        if isinstance(allocations, dict) and "stacks" in allocations and not allocations["stacks"]:
            # none: kept as metadata.json holds it, and as a reader of the bundle finds it
            meta = {**meta, "allocations": {k: v for k, v in allocations.items() if k != "stacks"}}
        if holds_stacks(meta):  # (metadata.json is then written without them: bundle.py)
            self._with_stacks.append(len(self))
        data = _ENCODER.encode(meta).encode("utf-8")
        try:
            self._put(data)
        except OSError:  # the temporary folder filled up: these rings and the rest are kept in memory
            self._to_memory()
            self._put(data)
        self._ends.append(self._ends[-1] + len(data))

    def _put(self, data: bytes) -> None:
        self._file.seek(self._ends[-1])
        view = memoryview(data)
        while view:
            n = self._file.write(view)
            if not n:
                raise OSError(errno.ENOSPC, "nothing written")
            view = view[n:]

    def _to_memory(self) -> None:
        self._file.seek(0)
        kept = io.BytesIO(self._file.read(self._ends[-1]))
        self._file.close()
        self._file = kept

    def __len__(self) -> int:
        return len(self._ends) - 1

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError("ring index out of range")
        meta: dict[str, Any] = json.loads(self._read(index % n))
        return meta

    def _read(self, i: int) -> bytes:
        self._file.seek(self._ends[i])
        return self._file.read(self._ends[i + 1] - self._ends[i])

    def text(self, index: int) -> str:
        """Ring ``index``'s metadata as ``json.dumps(meta, indent=2)`` writes it."""
        if not 0 <= index < len(self):
            raise IndexError("ring index out of range")
        return self._read(index).decode("utf-8")

    def with_stacks(self) -> list[int]:
        """The rings whose metadata holds stacks kept apart (``live_stacks.holds_stacks``), in order."""
        return list(self._with_stacks)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        i = 0
        while i < len(self):  # as a list's: what is appended meanwhile is read too
            yield self[i]
            i += 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<SpilledRings: {len(self)} rings>"


def derived(rings: Iterable[dict[str, Any]], key: str, make: Callable[[], T]) -> T:
    """``make()``, a value worked out from ``rings``: for a ``SpilledRings``, made once while no ring is
    appended (``key`` names it and whatever else it depends on), since each pass parses every ring's JSON
    again and a bundle's views ask for the same pass several times (rank rows for ranks.parquet and for both
    summaries); rings held in memory (a list, which may change) are passed over again. The value is shared:
    callers do not change it."""
    if not isinstance(rings, SpilledRings):
        return make()
    held = rings._derived.get(key)
    if held is None or held[0] != len(rings):
        held = rings._derived[key] = (len(rings), make())
    value: T = held[1]
    return value
