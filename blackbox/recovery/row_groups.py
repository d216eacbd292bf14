"""One Parquet file written by several cores: each row group is encoded by pyarrow on a thread of its own
(the encoding lets go of the GIL) as a Parquet file of one row group, and the pieces are joined in order
into one file (``parquet_footer``): their column chunks copied as they are, their footers merged. The file
is byte for byte what one ``pq.ParquetWriter`` writes.

pyarrow writes one file with one thread (``ArrowWriterProperties::use_threads`` is not offered by
``ParquetWriter``), and writing the timeline was the largest single cost of recovering a ring.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from .parquet_footer import MAGIC, Piece, merged_footer


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
        self.pieces: list[tuple[Piece, int]] = []
        self.at = 0
        self._closed = False

    def __enter__(self) -> RowGroupWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(self, encoded: pa.Buffer) -> None:
        piece = Piece(encoded, self.pieces[0][0].frame if self.pieces else None)
        if not self.at:
            self.sink.write(MAGIC)
            self.at = 4
        self.pieces.append((piece, self.at))
        self.sink.write(piece.body)
        self.at += len(piece.body)
        piece.body = memoryview(b"")  # the column chunks are in the sink: only the footer is kept

    def write_table(self, table: pa.Table, row_group_size: int) -> None:
        if not table.schema.equals(self.schema):
            raise ValueError(f"a table of another schema than the writer's: {table.schema} (expected {self.schema})")
        size = max(1, row_group_size)
        groups = [table.slice(start, size) for start in range(0, table.num_rows, size)]
        if len(groups) < 2 or self.workers < 2:
            for group in groups:
                self._append(encode(group, self.options))
            return
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="blackbox-parquet")
        for encoded in self.pool.map(encode, groups, [self.options] * len(groups)):
            self._append(encoded)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.pool is not None:
            self.pool.shutdown()
        if not self.pieces:  # no rows: the file a ParquetWriter closed at once writes
            empty = pa.BufferOutputStream()
            pq.ParquetWriter(empty, self.schema, **self.options).close()
            self.sink.write(empty.getvalue())
            return
        footer = merged_footer(self.pieces)
        self.sink.write(footer + len(footer).to_bytes(4, "little") + MAGIC)
