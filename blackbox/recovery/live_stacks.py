"""allocations.parquet: every ring's live bytes by allocating stack, kept out of metadata.json.

A process's folded allocating stacks (``allocations.stacks``: up to 500, each a
few KiB of frames) were two thirds of metadata.json (a 40-step torch job's: 250
of 360 KB). The bundle keeps them in a table of their own, one row a stack,
which ``read_bundle`` puts back where ``blackbox export --live``, ``--pprof``
and the report read them. The functions here are the only ones that know the
file: ``strip`` takes the stacks out of one ring's metadata, ``bundle_rows``
makes the table's rows of a bundle's, ``attach`` puts them back, ``read``
reads the file of an untrusted bundle within bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._errors import BundleDestinationError
from .spill import SpilledRings

ALLOCATIONS = "allocations.parquet"
SCHEMA = pa.schema(
    [
        ("ring", pa.int32()),  # the ring's index in metadata.json's ``rings``; 0 where the bundle is of one ring
        ("pid", pa.int64()),
        ("stack", pa.string()),  # folded: outermost;...;innermost
        ("live_bytes", pa.int64()),
    ]
)
MAX_FILE_BYTES = 256 << 20  # a bundle's file is read whole: 500 stacks of every one of 25,000 rings is less
MAX_DECODED_BYTES = 1 << 30  # what its row groups say they hold once decoded (a small file can claim more)


def strip(meta: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One ring's metadata without ``allocations.stacks`` (a shallow copy; ``meta`` is not changed), and
    those stacks."""
    allocations = meta.get("allocations")
    if not isinstance(allocations, dict) or "stacks" not in allocations:
        return meta, []
    stacks = allocations["stacks"] if isinstance(allocations["stacks"], list) else []
    return {**meta, "allocations": {k: v for k, v in allocations.items() if k != "stacks"}}, stacks


Row = tuple[int, "int | None", str, int]
INT64_MAX = (1 << 63) - 1


def rows(ring: int, pid: Any, stacks: list[dict[str, Any]]) -> Iterator[Row]:
    """The table's rows for one ring's stacks (live bytes past int64, a hostile ring's sum, held at its
    most: metadata.json's sites keep the exact figure)."""
    who = pid if isinstance(pid, int) and not isinstance(pid, bool) and abs(pid) <= INT64_MAX else None
    for s in stacks:
        yield ring, who, str(s.get("stack", "")), max(0, min(int(s.get("live_bytes") or 0), INT64_MAX))


def bundle_rows(meta: dict[str, Any]) -> list[Row]:
    """The rows of a bundle's metadata: of its one ring, or of each of its ``rings`` (spilled or a list)."""
    rings = meta.get("rings")
    if isinstance(rings, SpilledRings):
        found: list[Row] = []
        for i in rings.with_stacks():
            ring = rings[i]
            found += rows(i, ring.get("pid"), strip(ring)[1])
        return found
    if isinstance(rings, list):
        return [row for i, ring in enumerate(rings) if isinstance(ring, dict)
                for row in rows(i, ring.get("pid"), strip(ring)[1])]  # fmt: skip
    return list(rows(0, meta.get("pid"), strip(meta)[1]))


def table(found: list[Row]) -> pa.Table:
    ring, pid, stack, live = zip(*found, strict=True) if found else ((), (), (), ())
    return pa.table([pa.array(ring, pa.int32()), pa.array(pid, pa.int64()), pa.array(stack, pa.string()),
                     pa.array(live, pa.int64())], schema=SCHEMA)  # fmt: skip


def write(found: list[Row], sink: BinaryIO) -> None:
    pq.write_table(table(found), sink, compression="zstd")


def read(source: Any, size: int, where: str) -> pa.Table:
    """The file of a bundle (untrusted): at most ``MAX_FILE_BYTES``; its columns at most
    ``MAX_DECODED_BYTES`` as its footer declares them and, for the stacks, as their text would be once a
    dictionary's values are repeated on every row (a small file can name one 100 KB stack on 20,000 rows);
    the schema above (the stacks may be dictionary-encoded). Else one line saying what was found."""
    if size > MAX_FILE_BYTES:
        raise BundleDestinationError(f"{where}: expected at most {MAX_FILE_BYTES} bytes, found {size}")
    try:
        parquet = pq.ParquetFile(source)
        meta = parquet.metadata
        declared = sum(meta.row_group(g).column(i).total_uncompressed_size for g in range(meta.num_row_groups)
                       for i in range(meta.num_columns))  # fmt: skip
        if declared > MAX_DECODED_BYTES:
            raise BundleDestinationError(f"{where}: expected at most {MAX_DECODED_BYTES} bytes decoded, found "
                                         f"{declared} declared")  # fmt: skip
        found_schema = parquet.schema_arrow
        if [(f.name, _plain(f.type)) for f in found_schema] != [(f.name, f.type) for f in SCHEMA]:
            raise BundleDestinationError(f"{where}: expected the columns {_columns(SCHEMA)}, found "
                                         f"{_columns(found_schema)}")  # fmt: skip
        # the stacks as a dictionary: their text counted before it is repeated (threads: apache/arrow#34314)
        found = pq.ParquetFile(source, read_dictionary=["stack"]).read(use_threads=False)
        text = 0
        for chunk in found["stack"].chunks:
            if pa.types.is_dictionary(chunk.type):
                lengths = pc.binary_length(chunk.dictionary.cast(pa.large_binary()))
                text += pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0
        if text > MAX_DECODED_BYTES:
            raise BundleDestinationError(f"{where}: expected at most {MAX_DECODED_BYTES} bytes decoded, found "
                                         f"{text} bytes of stacks once their dictionary is repeated")  # fmt: skip
        return found.cast(SCHEMA)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise BundleDestinationError(f"{where}: expected a Parquet table, found {type(exc).__name__}") from None


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} ({f.type})" for f in schema)


def attach(meta: dict[str, Any], found: pa.Table) -> dict[str, Any]:
    """``meta`` (a bundle's metadata, as read) with each ring's stacks back in ``allocations.stacks``,
    largest first, for the rings whose allocations were recorded and that have rows (a ring with none live has
    no ``stacks``, as in memory), where metadata.json does not hold them itself (a bundle older than the file);
    a row naming no such ring is left out."""
    by_ring: dict[int, list[dict[str, Any]]] = {}
    for ring, stack, live in zip(found["ring"].to_pylist(), found["stack"].to_pylist(),
                                 found["live_bytes"].to_pylist(), strict=True):  # fmt: skip
        if ring is not None and stack is not None and live is not None:
            by_ring.setdefault(ring, []).append({"stack": stack, "live_bytes": live})
    rings = meta.get("rings")
    targets = list(enumerate(rings)) if isinstance(rings, list) else [(0, meta)]
    for i, ring_meta in targets:
        allocations = ring_meta.get("allocations") if isinstance(ring_meta, dict) else None
        if not isinstance(allocations, dict) or not allocations.get("recorded"):
            continue
        if i in by_ring and "stacks" not in allocations:
            allocations["stacks"] = sorted(by_ring[i], key=lambda s: -s["live_bytes"])
    return meta
