"""``recover``: rings in, a bundle folder out (timeline.parquet, metadata.json, summary.md,
and ``crash-<pid>.txt`` where faulthandler left a native crash's tracebacks beside a ring).

The only module of the recovery path that writes files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ._evidence import gather
from ._metadata import bundle_metadata, ring_metadata
from ._reader import find_rings, read_ring
from ._signals import read_crash_file
from ._summary import bundle_summary
from ._timeline import merge_tables, ring_table

TIMELINE = "timeline.parquet"
METADATA = "metadata.json"
SUMMARY = "summary.md"
# Delta encoding turns seq and time into a few bits per row; dictionaries carry the strings.
_DELTA = ("seq", "time", "step")
_DICTIONARY = ["kind", "label", "host", "thread", "pid", "rank", "device"]


def write_timeline(table: pa.Table, path: Path) -> None:
    pq.write_table(
        table,
        path,
        compression="zstd",
        compression_level=1,
        use_dictionary=_DICTIONARY,
        column_encoding=dict.fromkeys(_DELTA, "DELTA_BINARY_PACKED"),
        write_statistics=True,
    )


def write_bundle(inputs: list[Path], out_dir: Path, exit_status: int | None = None) -> dict[str, Any]:
    """Recover every ring named (files, or folders of ``*.ring``) into ``out_dir``.

    ``exit_status``: how the job ended, where the caller saw it (``blackbox run``).
    Returns the metadata written to metadata.json.
    """
    rings = [read_ring(p) for p in find_rings(inputs)]
    tables = [ring_table(r) for r in rings]
    crashes = [read_crash_file(r.path) for r in rings]
    metas = [
        ring_metadata(r, t, crash, gather(r.meta, exit_status if len(rings) == 1 else None))
        for r, t, crash in zip(rings, tables, crashes, strict=True)
    ]
    meta = bundle_metadata(metas)
    out_dir.mkdir(parents=True, exist_ok=True)
    for m, crash in zip(metas, crashes, strict=True):
        if crash is not None:
            _atomic_text(out_dir / m["native_crash"]["file"], crash)
    write_timeline(merge_tables(tables), out_dir / TIMELINE)
    _atomic_text(out_dir / METADATA, json.dumps(meta, indent=2, sort_keys=False) + "\n")
    _atomic_text(out_dir / SUMMARY, bundle_summary(meta))
    return meta


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
