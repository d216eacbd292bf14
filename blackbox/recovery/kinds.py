"""A timeline's rows by kind, found through the ``kind`` column's dictionary codes (no string decode): the
rows of every kind grouped once per table, as the diagnosis, the metadata and the views ask a ring's table for
a dozen kinds each."""

from __future__ import annotations

import weakref

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class _Kinds:
    """A table's ``kind`` column as dictionary codes, per chunk (its words, each row's code; a null or a file's
    bad code: ``len(words)``); and, once rows are asked for, every row's number grouped by kind: one stable sort
    of the codes (a radix sort of bytes), after which the rows of a kind are a slice of it."""

    __slots__ = ("chunks", "ids", "order", "bounds")

    def __init__(self, chunks: list[tuple[list[str], np.ndarray]]) -> None:
        self.chunks = chunks
        self.ids: dict[str | None, int] = {}
        self.order = self.bounds = np.zeros(0, np.int64)

    def rows(self, kinds: tuple[str, ...]) -> np.ndarray:
        if not self.ids:
            self._group()
        parts = [self.order[self.bounds[i] : self.bounds[i + 1]] for i in {self.ids[k] for k in kinds if k in self.ids}]
        parts = [part for part in parts if len(part)]
        if len(parts) == 1:
            return parts[0]  # a view of ``order`` (read-only): ascending, as the sort is stable
        return np.sort(np.concatenate(parts), kind="stable") if parts else np.zeros(0, np.int64)

    def _group(self) -> None:
        ids = self.ids
        codes = []
        for words, chunk in self.chunks:  # each chunk's codes to codes of one dictionary of every chunk's words
            lookup = np.array([ids.setdefault(w, len(ids)) for w in [*words, None]], np.int64)
            codes.append(chunk if len(self.chunks) == 1 and len(ids) == len(lookup) else lookup[chunk])
        whole = codes[0] if len(codes) == 1 else np.concatenate(codes) if codes else np.zeros(0, np.int64)  # (no chunk)
        small = whole.astype(np.uint8 if len(ids) <= 1 << 8 else np.uint16 if len(ids) <= 1 << 16 else np.int64)
        self.order = np.argsort(small, kind="stable")
        self.order.flags.writeable = False  # its slices are handed out
        self.bounds = np.concatenate([[0], np.cumsum(np.bincount(small, minlength=len(ids)))])


_KIND_CODES: dict[int, tuple[weakref.ref[pa.Table], _Kinds]] = {}


def _kinds_of(table: pa.Table) -> _Kinds:
    """The kinds of ``table``, worked out once per table (the diagnosis asks for a dozen kinds of each ring, some
    several times) and kept while the table lives."""
    held = _KIND_CODES.get(id(table))
    if held is not None and held[0]() is table:
        return held[1]
    chunks = []
    for chunk in table["kind"].chunks:
        words = chunk.dictionary.to_pylist()
        indices = chunk.indices if not chunk.indices.null_count else pc.fill_null(chunk.indices, -1)
        codes = indices.to_numpy(zero_copy_only=False)
        if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= len(words)):  # a null, or a file's bad code
            codes = np.where((codes >= 0) & (codes < len(words)), codes, len(words))
        chunks.append((words, codes))
    key = id(table)  # the entry goes with the table (a later table may get its id)
    kinds = _Kinds(chunks)
    _KIND_CODES[key] = (weakref.ref(table, lambda _: _KIND_CODES.pop(key, None)), kinds)
    return kinds


def kind_mask(table: pa.Table, *kinds: str) -> pa.ChunkedArray:
    """Rows whose kind is one of ``kinds``, through the dictionary codes (no string decode)."""
    chunks = []
    for words, codes in _kinds_of(table).chunks:
        wanted = np.fromiter((w in kinds for w in [*words, None]), bool, len(words) + 1)  # a lookup table by code
        chunks.append(pa.array(wanted[codes] if wanted.any() else np.zeros(len(codes), bool)))
    return pa.chunked_array(chunks, pa.bool_())


def of_kind(table: pa.Table, *kinds: str, columns: list[str] | None = None) -> pa.Table:
    """The rows of these kinds (only ``columns``, when given: taking fewer columns is faster), taken by row
    number: a slice where they are one run, never a filter through a mask of every row."""
    return _taken(table.select(columns) if columns else table, rows_of_kind(table, *kinds))


def rows_of_kind(table: pa.Table, *kinds: str) -> np.ndarray:
    """The row numbers of these kinds (int64, ascending, read-only), through the dictionary codes: the rows of
    every kind are grouped once per table."""
    return _kinds_of(table).rows(kinds)


def last_of_kind(table: pa.Table, *kinds: str, columns: list[str], n: int) -> pa.Table:
    """The last ``n`` rows of these kinds (only ``columns``): taken by row number, never through a filtered
    copy of every row of the kind (a ring may hold a million samples)."""
    rows = rows_of_kind(table, *kinds)
    return _taken(table.select(columns), rows[len(rows) - n :] if n > 0 else rows[:0])


def _taken(picked: pa.Table, rows: np.ndarray) -> pa.Table:
    """The rows ``rows`` (ascending) of ``picked``: a slice where they are one run (or none), else a take."""
    if not len(rows) or rows[-1] - rows[0] == len(rows) - 1:
        return picked.slice(int(rows[0]) if len(rows) else 0, len(rows))
    return picked.take(rows)
