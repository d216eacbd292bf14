"""The bundle: a folder (or URI prefix) holding timeline.parquet, metadata.json, summary.md,
memory.png, and ``crash-<pid>.txt`` where faulthandler left a native crash's tracebacks.

The only module that writes a bundle, and the one that reads it back. What the
views render is handed in as bytes: this module imports no view.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .._errors import BundleDestinationError
from .pipeline import Recovered, recover_rings

TIMELINE = "timeline.parquet"
METADATA = "metadata.json"
SUMMARY = "summary.md"
PLOT = "memory.png"
# Delta encoding turns seq and time into a few bits per row; dictionaries carry the strings.
_DELTA = ("seq", "time", "step")
_DICTIONARY = ["kind", "label", "host", "thread", "pid", "rank", "device"]
# Min/max statistics where queries filter (DuckDB skips row groups with them); the rest skip the cost.
_STATISTICS = ["seq", "time", "kind", "step", "pid", "rank", "host", "device", "value"]


class Destination:
    """Where a bundle goes: a local folder (files replaced atomically) or a pyarrow filesystem URI
    (``s3://bucket/prefix``, ``gs://``, ``hdfs://``, ``file://``)."""

    def __init__(self, out: str | os.PathLike[str], *, create: bool = True) -> None:
        text = os.fspath(out)
        self.uri = "://" in text
        if self.uri:
            try:
                self.fs, self.root = pafs.FileSystem.from_uri(text)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
                raise BundleDestinationError(
                    f"{text}: expected a local folder or a pyarrow filesystem URI, found: {exc}"
                ) from None
            if create:
                self.fs.create_dir(self.root, recursive=True)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), str(Path(text).resolve())
            if create:
                Path(self.root).mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def write_bytes(self, name: str, data: bytes) -> None:
        if not self.uri:
            _atomic_write(Path(self.path(name)), data)
            return
        with self.fs.open_output_stream(self.path(name)) as f:
            f.write(data)


def write_timeline(table: pa.Table, path: str | Path, filesystem: pafs.FileSystem | None = None) -> None:
    pq.write_table(
        table,
        str(path),
        filesystem=filesystem,
        compression="zstd",
        compression_level=1,
        use_dictionary=_DICTIONARY,
        column_encoding=dict.fromkeys(_DELTA, "DELTA_BINARY_PACKED"),
        write_statistics=_STATISTICS,
    )


def write_bundle(recovered: Recovered, out_dir: str | os.PathLike[str], views: dict[str, bytes]) -> None:
    """Write a recovery into ``out_dir`` (a folder or a URI): the timeline, metadata.json, the
    recovered text files, and ``views`` (file name -> bytes: summary.md, memory.png), rendered
    by the caller."""
    dest = Destination(out_dir)
    for name, text in recovered.files.items():
        dest.write_bytes(name, text.encode("utf-8"))
    write_timeline(recovered.table, dest.path(TIMELINE), dest.fs)
    for name, data in views.items():
        dest.write_bytes(name, data)
    dest.write_bytes(METADATA, (json.dumps(recovered.meta, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def read_bundle(bundle: str | os.PathLike[str]) -> tuple[pa.Table, dict[str, Any]]:
    """(timeline, metadata) of a bundle folder or URI."""
    dest = Destination(bundle, create=False)
    table = pq.read_table(dest.path(TIMELINE), filesystem=dest.fs)
    with dest.fs.open_input_stream(dest.path(METADATA)) as f:
        meta = json.loads(bytes(f.read()))
    return table, meta


def is_bundle(path: str | os.PathLike[str]) -> bool:
    return "://" in os.fspath(path) or (Path(path) / METADATA).is_file()


def load(targets: list[str]) -> tuple[pa.Table, dict[str, Any]]:
    """(timeline, metadata) of one bundle, or of rings and ring folders recovered in memory."""
    if len(targets) == 1 and is_bundle(targets[0]):
        return read_bundle(targets[0])
    recovered = recover_rings([Path(t) for t in targets])
    return recovered.table, recovered.meta


def read_summary(out_dir: str | os.PathLike[str]) -> str:
    """summary.md of a bundle written by write_bundle (local folder or URI)."""
    dest = Destination(out_dir, create=False)
    with dest.fs.open_input_stream(dest.path(SUMMARY)) as f:
        return bytes(f.read()).decode("utf-8")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
