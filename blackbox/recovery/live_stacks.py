"""allocations.parquet: every ring's allocating stacks, kept out of metadata.json.

A process's folded allocating stacks (``allocations.stacks``: up to 500, each a
few KiB of frames) were two thirds of metadata.json (a 40-step torch job's: 250
of 360 KB), and its sites' stacks (``allocations.sites[i].stack``, 20 of them)
nearly all of the rest (79 of 90 KB a ring of a torchrun job). The bundle keeps
both in a table of their own, one row a stack (``site``: null for a live stack,
else the index of the site whose stack it is), which ``read_bundle`` puts back
where ``blackbox export --live``, ``--pprof``, the summary and the report read
them. The functions here are the only ones that know the file: ``strip`` takes
the stacks out of one ring's metadata, ``bundle_rows`` makes the table's rows of
a bundle's, ``attach`` puts them back, ``read`` reads the file of an untrusted
bundle within bounds (a file of the version before ``site``, its four columns,
too).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._errors import BundleDestinationError

ALLOCATIONS = "allocations.parquet"
SCHEMA = pa.schema(
    [
        ("ring", pa.int32()),  # the ring's index in metadata.json's ``rings``; 0 where the bundle is of one ring
        ("pid", pa.int64()),
        ("stack", pa.string()),  # folded: outermost;...;innermost
        ("live_bytes", pa.int64()),
        ("site", pa.int32()),  # null: a live stack (allocations.stacks); else sites[site]'s stack
    ]
)
BEFORE_SITES = pa.schema(list(SCHEMA)[:4])  # the file as first written (live stacks alone)
MAX_FILE_BYTES = 256 << 20  # a bundle's file is read whole: 500 stacks of every one of 25,000 rings is less
MAX_DECODED_BYTES = 1 << 30  # what its row groups say they hold once decoded (a small file can claim more)


Stacks = list[tuple["int | None", dict[str, Any]]]  # (None, a live stack) or (i, sites[i])


def holds_stacks(meta: dict[str, Any]) -> bool:
    """Whether one ring's metadata holds stacks that the bundle keeps in the file."""
    allocations = meta.get("allocations")
    if not isinstance(allocations, dict):
        return False
    sites = allocations.get("sites")
    return bool(allocations.get("stacks")) or _site_stacks(sites)


def _site_stacks(sites: Any) -> bool:
    return isinstance(sites, list) and any(isinstance(s, dict) and "stack" in s for s in sites)


def strip(meta: dict[str, Any]) -> tuple[dict[str, Any], Stacks]:
    """One ring's metadata without ``allocations.stacks`` nor its sites' ``stack`` (a shallow copy; ``meta``
    is not changed), and those stacks: (None, a live stack) and (i, site i)."""
    allocations = meta.get("allocations")
    if not isinstance(allocations, dict):
        return meta, []
    live = allocations.get("stacks")
    found: Stacks = [(None, s) for s in live if isinstance(s, dict)] if isinstance(live, list) else []
    sites = allocations.get("sites")
    kept = {k: v for k, v in allocations.items() if k != "stacks"}
    if isinstance(sites, list) and _site_stacks(sites):  # (the isinstance narrows for mypy)
        found += [(i, s) for i, s in enumerate(sites) if isinstance(s, dict) and isinstance(s.get("stack"), str)]
        kept["sites"] = [{k: v for k, v in s.items() if k != "stack"} if isinstance(s, dict) else s for s in sites]
    elif "stacks" not in allocations:
        return meta, []
    return {**meta, "allocations": kept}, found


Row = tuple[int, "int | None", str, int, "int | None"]
INT64_MAX = (1 << 63) - 1


def rows(ring: int, pid: Any, stacks: Stacks) -> Iterator[Row]:
    """The table's rows for one ring's stacks (live bytes past int64, a hostile ring's sum, held at its
    most: metadata.json's sites keep the exact figure)."""
    who = pid if isinstance(pid, int) and not isinstance(pid, bool) and abs(pid) <= INT64_MAX else None
    for site, s in stacks:
        live = s.get("live_bytes")
        live = live if isinstance(live, (int, float)) and not isinstance(live, bool) and live == live else 0
        yield ring, who, str(s.get("stack", "")), max(0, int(min(live, INT64_MAX))), site


def bundle_rows(meta: dict[str, Any]) -> list[Row]:
    """The rows of a bundle's metadata: of its one ring, or of each of its ``rings`` (spilled or a list)."""
    from .spill import SpilledRings  # (spill imports this module)

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
    ring, pid, stack, live, site = zip(*found, strict=True) if found else ((), (), (), (), ())
    return pa.table([pa.array(ring, pa.int32()), pa.array(pid, pa.int64()), pa.array(stack, pa.string()),
                     pa.array(live, pa.int64()), pa.array(site, pa.int32())], schema=SCHEMA)  # fmt: skip


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
        columns = [(f.name, _plain(f.type)) for f in found_schema]
        if columns not in ([(f.name, f.type) for f in SCHEMA], [(f.name, f.type) for f in BEFORE_SITES]):
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
        if found.num_columns == len(BEFORE_SITES):  # the version before ``site``: live stacks alone
            found = found.append_column("site", pa.nulls(found.num_rows, pa.int32()))
        return found.cast(SCHEMA)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise BundleDestinationError(f"{where}: expected a Parquet table, found {type(exc).__name__}") from None


def attach_bytes(meta: dict[str, Any], raw: bytes, bundle: Any) -> dict[str, Any]:
    """``attach`` of the file's bytes ``raw``, read from ``bundle`` (named in the error a bad file gives)."""
    return attach(meta, read(pa.BufferReader(raw), len(raw), f"{bundle}/{ALLOCATIONS}"))


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} ({f.type})" for f in schema)


def attach(meta: dict[str, Any], found: pa.Table) -> dict[str, Any]:
    """``meta`` (a bundle's metadata, as read) with each ring's stacks back in ``allocations.stacks``,
    largest first, for the rings whose allocations were recorded and that have rows (a ring with none live has
    no ``stacks``, as in memory), where metadata.json does not hold them itself (a bundle older than the file),
    and each site's ``stack`` back where the site has none; a row naming no such ring or site is left out."""
    by_ring: dict[int, list[dict[str, Any]]] = {}
    by_site: dict[tuple[int, int], str] = {}
    columns = (found[name].to_pylist() for name in ("ring", "stack", "live_bytes", "site"))
    for ring, stack, live, site in zip(*columns, strict=True):
        if ring is not None and stack is not None and site is not None:
            by_site[(ring, site)] = stack
        elif ring is not None and stack is not None and live is not None:
            by_ring.setdefault(ring, []).append({"stack": stack, "live_bytes": live})
    rings = meta.get("rings")
    targets = list(enumerate(rings)) if isinstance(rings, list) else [(0, meta)]
    for i, ring_meta in targets:
        allocations = ring_meta.get("allocations") if isinstance(ring_meta, dict) else None
        if not isinstance(allocations, dict) or not allocations.get("recorded"):
            continue
        if i in by_ring and "stacks" not in allocations:
            allocations["stacks"] = sorted(by_ring[i], key=lambda s: -s["live_bytes"])
        sites = allocations.get("sites")
        for j, site in enumerate(sites if isinstance(sites, list) else ()):
            if isinstance(site, dict) and "stack" not in site and (i, j) in by_site:
                site["stack"] = by_site[(i, j)]
    return meta
