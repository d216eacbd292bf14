"""One Parquet file written by several threads (recovery/row_groups.py, recovery/parquet_footer.py): row groups
encoded apart and joined, byte for byte the file one ``pq.ParquetWriter`` writes, and footers it cannot merge
refused."""

from __future__ import annotations

import io
import threading

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blackbox.recovery import parquet_footer, row_groups
from blackbox.recovery.bundle import _PARQUET
from blackbox.recovery.parquet_footer import FooterError, Piece, merged_footer
from blackbox.recovery.row_groups import RowGroupWriter, encode
from blackbox.recovery.timeline import TIMELINE_SCHEMA


def one_writer(tables: list[tuple[pa.Table, int]], schema: pa.Schema, **options: object) -> bytes:
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, **options) as writer:
        for table, size in tables:
            writer.write_table(table, row_group_size=size)
    return bytes(sink.getvalue().to_pybytes())


def joined(tables: list[tuple[pa.Table, int]], schema: pa.Schema, workers: int, **options: object) -> bytes:
    sink = io.BytesIO()
    with RowGroupWriter(sink, schema, workers=workers, **options) as writer:
        for table, size in tables:
            writer.write_table(table, size)
    return sink.getvalue()


def timeline_rows(n: int, seed: int) -> pa.Table:
    """Rows of the timeline's schema with what makes footers differ: dictionaries, nulls, statistics of
    several widths, delta-encoded columns, all-null columns."""
    rng = np.random.default_rng(seed)
    labels = np.array(["loss", "forward", "backward", "optimizer", "x" * 300, None], dtype=object)
    columns: dict[str, pa.Array] = {
        "seq": pa.array(np.arange(n, dtype=np.uint64) + 7),
        "time": pa.array((1_790_000_000_000_000_000 + np.cumsum(rng.integers(0, 10**6, n))).astype("M8[ns]")),
        "kind": pa.array(rng.choice(["step", "mark", "sample"], n)).dictionary_encode(),
        "label": pa.array(rng.choice(labels, n)).dictionary_encode(),
        "value": pa.array(np.where(rng.random(n) < 0.3, None, rng.integers(-(1 << 62), 1 << 62, n)), pa.int64()),
        "step": pa.array(np.arange(n) // 8, pa.int64()),
    }
    arrays = []
    for field in TIMELINE_SCHEMA:
        array = columns.get(field.name)
        arrays.append(pa.nulls(n, field.type) if array is None else array.cast(field.type))
    return pa.Table.from_arrays(arrays, schema=TIMELINE_SCHEMA)


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_a_joined_timeline_is_byte_for_byte_what_one_writer_writes(workers: int) -> None:
    calls = [(timeline_rows(10_000, 1), 3_000), (timeline_rows(1, 2), 3_000), (timeline_rows(7_001, 3), 1_000)]
    expected = one_writer(calls, TIMELINE_SCHEMA, **_PARQUET)
    assert joined(calls, TIMELINE_SCHEMA, workers, **_PARQUET) == expected
    back = pq.read_table(pa.BufferReader(expected))
    assert back.num_rows == 17_002 and pq.ParquetFile(pa.BufferReader(expected)).metadata.num_row_groups == 4 + 1 + 8


def test_no_rows_is_the_file_a_writer_closed_at_once_writes() -> None:
    assert joined([], TIMELINE_SCHEMA, 4, **_PARQUET) == one_writer([], TIMELINE_SCHEMA, **_PARQUET)


def test_pyarrow_s_default_options_join_the_same() -> None:
    """Other encodings (dictionaries everywhere, statistics on every column), row groups of one row."""
    table = pa.table({"x": pa.array(np.arange(4_000) % 97), "s": pa.array([f"v{i % 13}" for i in range(4_000)])})
    calls = [(table.slice(0, 40), 1), (table.slice(40), 700)]
    assert joined(calls, table.schema, 3) == one_writer(calls, table.schema)


def with_ordinals(encoded: pa.Buffer) -> bytes:
    """A piece whose row groups carry an ordinal (RowGroup field 7, i16) of 0, as an encrypted file's do:
    pyarrow writes none otherwise."""
    piece = Piece(encoded)
    data = bytes(encoded)
    footer = bytearray(data[len(data) - 8 - int.from_bytes(data[-8:-4], "little") : -8])
    first = bytes(footer).index(piece.footer)  # where its row groups lie in the whole footer
    for _, end, _, ordinal in reversed(piece.groups):
        assert ordinal is None and footer[first + end - 1] == 0  # the row group's STOP; its last field is 6
        footer[first + end - 1 : first + end] = bytes([0x14, 0x00, 0x00])  # field 7 (delta 1), i16, value 0; STOP
    body = bytes(memoryview(encoded)[: 4 + len(piece.body)])
    return body + bytes(footer) + len(footer).to_bytes(4, "little") + b"PAR1"


def test_row_group_ordinals_are_numbered_across_the_pieces() -> None:
    tables = [timeline_rows(500, s) for s in (11, 12, 13)]
    pieces, at = [], 4
    for table in tables:
        piece = Piece(with_ordinals(encode(table, _PARQUET)), pieces[0][0].frame if pieces else None)
        pieces.append((piece, at))
        at += len(piece.body)
    footer = merged_footer(pieces)
    whole = b"PAR1" + b"".join(bytes(p.body) for p, _ in pieces) + footer + len(footer).to_bytes(4, "little") + b"PAR1"
    back = Piece(whole)
    ordinals = [parquet_footer._unzigzag(parquet_footer._varint(back.footer, o[0])[0]) for *_, o in back.groups if o]
    assert b"ARROW:schema" not in back.footer and b"ARROW:schema" in back.frame[2], "a piece keeps its row groups alone"
    assert ordinals == [0, 1, 2]
    assert pq.read_table(pa.BufferReader(whole)).equals(pa.concat_tables(tables))


def test_duckdb_reads_the_joined_file_and_skips_row_groups_by_its_moved_statistics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "t.parquet"
    table = timeline_rows(50_000, 4)
    path.write_bytes(joined([(table, 5_000)], TIMELINE_SCHEMA, 4, **_PARQUET))
    [(count, total)] = duckdb.sql(f"select count(*), sum(value) from '{path}' where seq >= 30007").fetchall()
    rest = table.slice(30_000)
    assert count == 20_000 and total == sum(v for v in rest["value"].to_pylist() if v is not None)
    groups = pq.ParquetFile(path).metadata
    firsts = [groups.row_group(g).column(0).statistics.min for g in range(groups.num_row_groups)]
    assert firsts == [7 + 5_000 * g for g in range(10)]


def test_a_footer_with_a_page_index_is_refused() -> None:
    table = timeline_rows(100, 5)
    with pytest.raises(FooterError, match="page index"):
        Piece(encode(table, {**_PARQUET, "write_page_index": True}))


def test_pieces_of_other_schemas_are_refused() -> None:
    table = timeline_rows(100, 6)
    first = Piece(encode(table, _PARQUET))
    with pytest.raises(FooterError, match="different schemas"):
        Piece(encode(table.select(["seq", "time"]), _PARQUET), first.frame)
    with pytest.raises(FooterError, match="not a Parquet file"):
        Piece(b"PAR1 not one PAR2")


def test_offsets_move_by_where_each_piece_lands() -> None:
    """Each piece's data pages begin at 4 in its own file; joined, at 4 plus the bytes before them."""
    tables = [timeline_rows(2_000, s) for s in (7, 8, 9)]
    pieces, at = [], 4
    for table in tables:
        piece = Piece(encode(table, _PARQUET), pieces[0][0].frame if pieces else None)
        pieces.append((piece, at))
        at += len(piece.body)
    data = b"PAR1" + b"".join(bytes(p.body) for p, _ in pieces)
    footer = merged_footer(pieces)
    meta = pq.ParquetFile(pa.BufferReader(data + footer + len(footer).to_bytes(4, "little") + b"PAR1")).metadata
    assert meta.num_rows == 6_000
    starts = [meta.row_group(g).column(0).dictionary_page_offset or meta.row_group(g).column(0).data_page_offset
              for g in range(3)]  # fmt: skip
    assert starts == [at for _, at in pieces]


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, 1 << 31, -(1 << 40), (1 << 63) - 1, -(1 << 63)])
def test_zigzag_varints_read_back(value: int) -> None:
    raw, end = parquet_footer._varint(parquet_footer._zigzag(value), 0)
    assert parquet_footer._unzigzag(raw) == value and end == len(parquet_footer._zigzag(value))


def test_row_groups_are_encoded_on_several_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encodings overlap (each waits at a barrier the others must reach), and the file is unchanged."""
    barrier = threading.Barrier(3, timeout=30)
    real = row_groups.encode

    def meeting(table: pa.Table, options: dict[str, object]) -> pa.Buffer:
        barrier.wait()
        return real(table, options)

    monkeypatch.setattr(row_groups, "encode", meeting)
    table = timeline_rows(3_000, 10)
    assert joined([(table, 1_000)], TIMELINE_SCHEMA, 3, **_PARQUET) == one_writer([(table, 1_000)], TIMELINE_SCHEMA,
                                                                                  **_PARQUET)  # fmt: skip


def test_a_table_of_another_schema_is_refused() -> None:
    with RowGroupWriter(io.BytesIO(), TIMELINE_SCHEMA, workers=2, **_PARQUET) as writer, pytest.raises(ValueError):
        writer.write_table(pa.table({"x": [1]}), 10)


def with_gaps(n: int, seed: int) -> pa.Table:
    """Timeline rows where some columns are null in some row groups only, a dictionary column is all null with
    a dictionary of words (written whole: never copied from another row group) and another with none."""
    table = timeline_rows(n, seed)
    step = pa.array(np.arange(n), pa.int64(), mask=np.arange(n) < n // 2)  # null in the first row groups only
    stack = pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array(["a;b", "c"]))
    table = table.set_column(table.schema.get_field_index("step"), "step", step)
    at = table.schema.get_field_index("stack")
    return table.set_column(at, "stack", stack.cast(TIMELINE_SCHEMA.field("stack").type))


@pytest.mark.parametrize("workers", [1, 3])
def test_all_null_columns_are_copied_into_row_groups_and_the_file_is_unchanged(
    workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row groups of at least SPLICE_ROWS rows: an all-null column is encoded once per row-group size, then its
    chunk is copied; the file is byte for byte what one writer writes, over several calls and a short tail."""
    monkeypatch.setattr(row_groups, "SPLICE_ROWS", 1_000)
    encoded: list[tuple[int, tuple[str, ...]]] = []
    real = row_groups.encode

    def counted(table: pa.Table, options: dict[str, object]) -> pa.Buffer:
        encoded.append((table.num_rows, tuple(table.column_names)))
        return real(table, options)

    monkeypatch.setattr(row_groups, "encode", counted)
    calls = [(with_gaps(12_000, 21), 2_000), (with_gaps(5_500, 22), 2_000), (timeline_rows(700, 23), 2_000)]
    assert joined(calls, TIMELINE_SCHEMA, workers, **_PARQUET) == one_writer(calls, TIMELINE_SCHEMA, **_PARQUET)
    never_null = {"seq", "time", "kind", "label", "value", "stack"}  # stack: all null, but a dictionary of words
    copied = {"pid", "rank", "host", "device", "job", "detail", "sender", "oom_free"}
    heads = [set(names) for rows, names in encoded if rows == 2_000 and "seq" in names]
    nulls = [set(names) for rows, names in encoded if rows == 2_000 and "seq" not in names]  # the null columns alone
    assert len(heads) == 6 + 2 and all(never_null <= names for names in heads)
    for name in copied:  # in no row group's own encoding of 2,000 rows, and once with the other null columns
        assert not any(name in names for names in heads) and sum(name in names for names in nulls) == 1
    assert any("step" in names for names in heads) and any("step" in names for names in nulls)
    assert any(rows == 700 and len(names) == 54 for rows, names in encoded), "a row group under SPLICE_ROWS: whole"


def test_pyarrow_s_defaults_with_all_null_columns_join_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_groups, "SPLICE_ROWS", 100)
    n = 3_000
    table = pa.table({
        "x": pa.array(np.arange(n) % 97),
        "none": pa.nulls(n, pa.int64()),
        "s": pa.array([f"v{i % 13}" for i in range(n)]),
        "words": pa.nulls(n, pa.string()),
        "codes": pa.nulls(n, pa.dictionary(pa.int32(), pa.string())),
    })  # fmt: skip
    calls = [(table, 500), (table.slice(7, 1_234), 500)]
    assert joined(calls, table.schema, 2) == one_writer(calls, table.schema)


def _struct_beside_nulls() -> tuple[list[tuple[pa.Table, int | None]], pa.Schema, dict[str, object]]:
    """A column of two leaves (a struct) beside an all-null one: the row group's column chunks are leaves."""
    table = pa.table({"s": pa.array([{"a": i, "b": -i} for i in range(10)]), "n": pa.nulls(10, pa.int64())})
    return [(table, 5)], table.schema, {}


def _nulls_in_other_chunks() -> tuple[list[tuple[pa.Table, int | None]], pa.Schema, dict[str, object]]:
    """An all-null column whose rows lie in other Arrow chunks in another row group of the same size: its pages
    follow the chunks (tiny pages show it)."""
    one = pa.table({"x": pa.array(range(8), pa.int64()), "n": pa.nulls(8, pa.int64())})
    split = pa.Table.from_batches([one.slice(0, 3).to_batches()[0], one.slice(3).to_batches()[0]])
    return [(one, 8), (split, 8)], one.schema, {"data_page_size": 1, "write_batch_size": 4}


def _other_schema_metadata() -> tuple[list[tuple[pa.Table, int | None]], pa.Schema, dict[str, object]]:
    """A table whose schema metadata is not the writer's (ParquetWriter writes its own), in a row group with a
    null column (copied) and one without (encoded whole)."""
    schema = pa.schema([("x", pa.int64()), ("n", pa.int64())], metadata={b"who": b"the writer"})
    n = pa.array(range(300), pa.int64(), mask=np.arange(300) < 250)
    table = pa.table({"x": pa.array(range(300), pa.int64()), "n": n})
    return [(table.replace_schema_metadata({b"who": b"the table"}), 250)], schema, {}


def _no_rows() -> tuple[list[tuple[pa.Table, int | None]], pa.Schema, dict[str, object]]:
    """A call with no rows, alone and after rows: ParquetWriter writes a row group of none (its data page offset 0)."""
    table = pa.table({"x": pa.array([1, 2, 3], pa.int64())})
    return [(table.slice(0, 0), 10), (table, 10), (table.slice(0, 0), 10)], table.schema, {}


def _default_sizes() -> tuple[list[tuple[pa.Table, int | None]], pa.Schema, dict[str, object]]:
    """Row group sizes None and -1: pyarrow's default, as ParquetWriter takes them."""
    table = timeline_rows(2_000, 31)
    return [(table, None), (table, -1)], table.schema, _PARQUET


def _no_rows_at_default_sizes() -> tuple[list[tuple[pa.Table, int | None]], pa.Schema, dict[str, object]]:
    """No rows at pyarrow's default size (a size of none made no row group, and raised), alone and after rows."""
    table = pa.table({"x": pa.array([1, 2, 3], pa.int64())})
    return [(table.slice(0, 0), None), (table, None), (table.slice(0, 0), -1)], table.schema, {}


def _no_rows_no_pages() -> tuple[list[tuple[pa.Table, int | None]], pa.Schema, dict[str, object]]:
    """No rows after rows, with no dictionary: a row group of no pages, whose file offset ParquetWriter leaves 0."""
    table = pa.table({"c": pa.nulls(100, pa.float64())})
    return [(table, 20_000), (table.slice(0, 0), 1)], table.schema, {"use_dictionary": False}


def _options_it_cannot_join() -> tuple[list[tuple[pa.Table, int | None]], pa.Schema, dict[str, object]]:
    """A page index spans the row groups: such options are written by one ParquetWriter."""
    table = timeline_rows(3_000, 32)
    return [(table, 1_000)], table.schema, {**_PARQUET, "write_page_index": True}


@pytest.mark.parametrize(
    "case",
    [_struct_beside_nulls, _nulls_in_other_chunks, _other_schema_metadata, _no_rows, _default_sizes,
     _options_it_cannot_join, _no_rows_at_default_sizes, _no_rows_no_pages],
)  # fmt: skip
@pytest.mark.parametrize("workers", [1, 3])
def test_what_a_fuzz_of_other_tables_found_is_written_as_one_writer_writes_it(
    case: object, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(row_groups, "SPLICE_ROWS", 1)  # every row group's null columns copied where they can be
    calls, schema, options = case()  # type: ignore[operator]
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, **options) as writer:
        for table, size in calls:
            writer.write_table(table, row_group_size=size)
    expected = bytes(sink.getvalue().to_pybytes())
    got = io.BytesIO()
    with RowGroupWriter(got, schema, workers=workers, **options) as ours:
        for table, size in calls:
            ours.write_table(table, size)
    assert got.getvalue() == expected
    assert pq.read_table(pa.BufferReader(expected)).num_rows == sum(t.num_rows for t, _ in calls)


def test_a_row_group_size_of_zero_is_refused_as_parquet_writer_refuses_it() -> None:
    table = timeline_rows(10, 33)
    with RowGroupWriter(io.BytesIO(), TIMELINE_SCHEMA, **_PARQUET) as writer, pytest.raises(ValueError, match="0"):
        writer.write_table(table, 0)
