"""One Parquet file written by several cores: each row group is encoded by pyarrow on a thread of its own
(the encoding lets go of the GIL) as a Parquet file of one row group, and the pieces are joined in order
into one file (``parquet_footer``): their column chunks copied as they are, their footers merged. The file
is byte for byte what one ``pq.ParquetWriter`` writes.

pyarrow writes one file with one thread (``ArrowWriterProperties::use_threads`` is not offered by
``ParquetWriter``), and writing the timeline was the largest single cost of recovering a ring.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from .parquet_footer import MAGIC, Column, Columns, FooterError, Frame, Piece, joined_columns, merged_footer


def encode(table: pa.Table, options: dict[str, Any]) -> pa.Buffer:
    """``table`` as a Parquet file of one row group, in memory. The encoding's working memory (about
    12 MiB for the timeline's 54 columns, most of it page buffers) is given back at once: the allocator
    keeps what a thread frees near that thread (mimalloc's heap of the thread, glibc's arena), so each
    encoding thread would hold a copy of it."""
    sink = pa.BufferOutputStream()
    try:
        pq.write_table(table, sink, row_group_size=max(1, table.num_rows), **options)
    finally:
        pa.default_memory_pool().release_unused()
    return sink.getvalue()


# A row group of at least this many rows has its all-null columns copied from the first row group of its size
# that had them, not encoded again: a full ring's timeline is 8 row groups of 131,072 rows where 29 of its 54
# columns hold nothing, and their definition levels were a third of the encoding's time. Smaller row groups are
# encoded whole: the splice's walk of the footers costs more than their nulls.
SPLICE_ROWS = 16_384


def _all_null(column: pa.ChunkedArray) -> bool:
    """Nothing but nulls, written the same whatever rows they are: a dictionary column's dictionary is
    written whole even where no row uses it, so it is one only with an empty dictionary."""
    if column.null_count != len(column):
        return False
    return not pa.types.is_dictionary(column.type) or all(len(c.dictionary) == 0 for c in column.chunks)


class _NullColumns:
    """The column chunks of all-null columns, by (column, rows), to be copied into row groups of that size;
    and the frame of the whole schema's footer. ``prepare`` (on the writer's thread) has those it lacks
    encoded, once each, on the pool where there is one (beside the rest of the row groups: a full ring's two
    sizes of null columns took 24 ms on the writer's thread first); ``encode`` (on any thread) reads them,
    waiting where they are still being encoded."""

    def __init__(self, schema: pa.Schema, options: dict[str, Any]) -> None:
        self.options = options
        self.schema = schema
        # (column, its chunks' lengths) -> (the column chunks of one encoding, this column's among them)
        self.held: dict[tuple[int, tuple[int, ...]], tuple[Future[list[Column]], int]] = {}
        self.frame: Frame = Piece(encode(schema.empty_table(), options)).frame
        # a footer this cannot split, or a schema of nested fields (a column of several column chunks, one a
        # leaf): every row group encoded whole from then on
        self.failed = any(pa.types.is_nested(field.type) for field in schema)

    def prepare(self, groups: list[pa.Table], pool: ThreadPoolExecutor | None = None) -> list[list[int]]:
        """Each row group's columns to copy (none under SPLICE_ROWS rows), those not held yet encoded on
        ``pool`` (or now): for each size, one encoding of the columns it lacks, each taken from a row group
        where it is null. The pool takes its tasks in order, so a row group submitted after these that waits
        on one waits on a task begun."""
        if self.failed:
            return [[] for _ in groups]
        nulls = [
            [i for i in range(g.num_columns) if _all_null(g.column(i))] if g.num_rows >= SPLICE_ROWS else []
            for g in groups
        ]
        # a column's pages depend on how its rows lie in Arrow chunks (the writer's batches start again at each),
        # so one is copied only into row groups whose column has the same chunks
        wanted: dict[int, dict[tuple[int, tuple[int, ...]], pa.ChunkedArray]] = {}  # rows -> key -> the column
        for group, null in zip(groups, nulls, strict=True):
            for i in null:
                key = _key(group, i)
                if key not in self.held:
                    wanted.setdefault(group.num_rows, {}).setdefault(key, group.column(i))
        for columns in wanted.values():
            fields = [self.schema.field(i) for i, _ in columns]
            table = pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields))
            later = pool.submit(self._chunks, table) if pool is not None else _now(self._chunks, table)
            self.held.update((key, (later, j)) for j, key in enumerate(columns))
        return [null if len(null) < g.num_columns else [] for g, null in zip(groups, nulls, strict=True)]

    def _chunks(self, table: pa.Table) -> list[Column]:
        """The column chunks of ``table`` encoded alone, one per column (else FooterError)."""
        found = Columns(encode(table, self.options)).columns
        if len(found) != table.num_columns:
            raise FooterError(f"expected {table.num_columns} column chunks, found {len(found)}")
        return found

    def encode(self, table: pa.Table, null: list[int]) -> pa.Buffer | Piece:
        """``table`` as ``encode`` writes it, the columns ``null`` (all null, held; at least one) copied."""
        copied = set(null)
        try:
            kept = [i for i in range(table.num_columns) if i not in copied]
            group = Columns(encode(table.select(kept), self.options))
            if len(group.columns) != len(kept):
                raise FooterError(f"expected {len(kept)} column chunks, found {len(group.columns)}")
            rest = iter(group.columns)
            columns = [self._held(_key(table, i)) if i in copied else next(rest) for i in range(table.num_columns)]
        except FooterError:  # a footer of another shape (options this does not know): encoded whole from now on
            self.failed = True
            return encode(table, self.options)
        return joined_columns(self.frame, table.num_rows, group, columns)

    def _held(self, key: tuple[int, tuple[int, ...]]) -> Column:
        later, j = self.held[key]
        return later.result()[j]


def _now(job: Callable[[pa.Table], list[Column]], table: pa.Table) -> Future[list[Column]]:
    """``job(table)`` done now, as a future (its FooterError kept in it, as a pool's would be)."""
    done: Future[list[Column]] = Future()
    try:
        done.set_result(job(table))
    except FooterError as exc:
        done.set_exception(exc)
    return done


def _key(table: pa.Table, i: int) -> tuple[int, tuple[int, ...]]:
    return i, tuple(len(chunk) for chunk in table.column(i).chunks)


DEFAULT_ROW_GROUP = 1 << 20  # pyarrow's rows per row group where none is given
# ParquetWriter's options whose files the pieces join into, byte for byte (tests/test_row_groups.py, and a fuzz of
# 1,900 tables of every Arrow type): the others (a page index, bloom filters, content-defined chunking, encryption)
# put what spans row groups in the file, and are written by one ParquetWriter
JOINABLE_OPTIONS = frozenset({
    "compression", "compression_level", "use_dictionary", "write_statistics", "column_encoding", "write_batch_size",
    "data_page_size", "data_page_version", "use_byte_stream_split", "dictionary_pagesize_limit", "store_schema",
    "flavor", "sorting_columns", "max_rows_per_page", "write_page_checksum", "version", "coerce_timestamps",
    "allow_truncated_timestamps", "use_deprecated_int96_timestamps", "use_compliant_nested_type",
})  # fmt: skip


# Each encoding at once holds about 12 MiB (tools/bench_recover_memory.py, `blackbox recover` of a full 1 M-slot
# training ring: 282 MiB with 2 threads, 303 with 4, 377 with 8; the largest of its 14 shapes less its ring: 229
# MiB with 4, 255 with 8, against a bound of 300)
MAX_THREADS = 4


def threads() -> int:
    """Threads that encode row groups: the cores this process may run on, at most ``MAX_THREADS``."""
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


class RowGroupWriter:
    """A ``pq.ParquetWriter`` for one schema whose row groups are encoded on several threads and joined
    in order into ``sink`` (any binary writer: a file, an object-storage stream). ``write_table`` returns
    once its rows are in the sink; ``close`` writes the footer."""

    def __init__(self, sink: BinaryIO, schema: pa.Schema, *, workers: int | None = None, **options: Any) -> None:
        self.sink = sink
        self.schema = schema
        self.options = options
        self.workers = threads() if workers is None else max(1, workers)
        self.pool: ThreadPoolExecutor | None = None
        # options whose files this cannot join as ParquetWriter writes them: it writes them, on one thread
        self.plain = pq.ParquetWriter(sink, schema, **options) if options.keys() - JOINABLE_OPTIONS else None
        self.pieces: list[tuple[Piece, int]] = []
        self.nulls: _NullColumns | None = None
        self.at = 0
        self._closed = False

    def __enter__(self) -> RowGroupWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(self, encoded: pa.Buffer | Piece) -> None:
        first = self.pieces[0][0].frame if self.pieces else None
        piece = encoded if isinstance(encoded, Piece) else Piece(encoded, first)
        if first is not None and piece.frame != first:
            raise FooterError("pieces with different schemas or options")
        if not self.at:
            self.sink.write(MAGIC)
            self.at = 4
        self.pieces.append((piece, self.at))
        for part in piece.parts:
            self.sink.write(part)
            self.at += len(part)
        piece.body, piece.parts = memoryview(b""), []  # the column chunks are in the sink: only the footer is kept

    def _encode(self, table: pa.Table, null: list[int]) -> pa.Buffer | Piece:
        """A row group, its all-null columns ``null`` copied where there are any."""
        return self.nulls.encode(table, null) if null and self.nulls is not None else encode(table, self.options)

    def write_table(self, table: pa.Table, row_group_size: int | None = None) -> None:
        """``ParquetWriter.write_table``: row groups of ``row_group_size`` rows (None or -1: pyarrow's default)."""
        if not table.schema.equals(self.schema):
            raise ValueError(f"a table of another schema than the writer's: {table.schema} (expected {self.schema})")
        if self.plain is not None:
            self.plain.write_table(table, row_group_size=row_group_size)
            return
        if not table.schema.equals(self.schema, check_metadata=True):  # the writer's schema is the one written
            table = pa.Table.from_arrays(table.columns, schema=self.schema)
        if row_group_size is None or row_group_size == -1:
            size = max(1, min(table.num_rows, DEFAULT_ROW_GROUP))  # (no rows: one row group of none)
        elif row_group_size < 1:
            raise ValueError(f"expected a row group size of at least 1 row (or -1), found {row_group_size}")
        else:
            size = row_group_size
        # no rows: one row group of none, as ParquetWriter writes
        groups = [table.slice(start, size) for start in range(0, table.num_rows, size)] or [table]
        if self.nulls is None and table.num_rows >= SPLICE_ROWS:
            self.nulls = _NullColumns(self.schema, self.options)
        if len(groups) < 2 or self.workers < 2:
            nulls = self.nulls.prepare(groups) if self.nulls is not None else [[] for _ in groups]
            for group, null in zip(groups, nulls, strict=True):
                self._append(self._encode(group, null))
            return
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="blackbox-parquet")
        nulls = self.nulls.prepare(groups, self.pool) if self.nulls is not None else [[] for _ in groups]
        for encoded in self.pool.map(self._encode, groups, nulls):
            self._append(encoded)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.plain is not None:
            self.plain.close()
            return
        if self.pool is not None:
            self.pool.shutdown()
        if not self.pieces:  # no rows: the file a ParquetWriter closed at once writes
            empty = pa.BufferOutputStream()
            pq.ParquetWriter(empty, self.schema, **self.options).close()
            self.sink.write(empty.getvalue())
            return
        footer = merged_footer(self.pieces)
        self.sink.write(footer + len(footer).to_bytes(4, "little") + MAGIC)
