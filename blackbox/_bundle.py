"""``recover``: rings in, a bundle folder out (timeline.parquet, metadata.json, summary.md,
and ``crash-<pid>.txt`` where faulthandler left a native crash's tracebacks beside a ring).

The only module of the recovery path that writes files.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ._errors import BundleDestinationError
from ._evidence import gather, kernel_oom_kills
from ._metadata import bundle_metadata, ring_metadata
from ._reader import find_rings, read_ring
from ._signals import read_crash_file
from ._summary import bundle_summary
from ._timeline import merge_tables, ring_table

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

    def write_text(self, name: str, text: str) -> None:
        if not self.uri:
            _atomic_text(Path(self.path(name)), text)
            return
        with self.fs.open_output_stream(self.path(name)) as f:
            f.write(text.encode("utf-8"))


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


def recover_rings(
    inputs: list[Path], exit_status: int | None = None
) -> tuple[pa.Table, dict[str, Any], dict[str, str]]:
    """Read and diagnose every ring named: (timeline, metadata, crash texts by file name). Writes nothing."""
    rings = [read_ring(p) for p in find_rings(inputs)]
    tables = [ring_table(r) for r in rings]
    crashes = [read_crash_file(r.path) for r in rings]
    pids = {p for r in rings if isinstance(p := (r.meta.get("identity") or {}).get("pid"), int)}
    kernel = kernel_oom_kills(pids)  # one pass over the kernel log for every ring
    metas = [
        ring_metadata(r, t, crash, gather(r.meta, exit_status if len(rings) == 1 else None, kernel))
        for r, t, crash in zip(rings, tables, crashes, strict=True)
    ]
    files = {m["native_crash"]["file"]: c for m, c in zip(metas, crashes, strict=True) if c is not None}
    return merge_tables(tables), bundle_metadata(metas), files


def write_bundle(
    inputs: list[Path], out_dir: str | os.PathLike[str], exit_status: int | None = None, *, plot: bool = True
) -> dict[str, Any]:
    """Recover every ring named (files, or folders of ``*.ring``) into ``out_dir`` (a folder or a URI).

    ``exit_status``: how the job ended, where the caller saw it (``blackbox run``).
    ``plot``: also render memory.png when matplotlib is installed.
    Returns the metadata written to metadata.json.
    """
    table, meta, crashes = recover_rings(inputs, exit_status)
    dest = Destination(out_dir)
    for name, text in crashes.items():
        dest.write_text(name, text)
    write_timeline(table, dest.path(TIMELINE), dest.fs)
    dest.write_text(METADATA, json.dumps(meta, indent=2, sort_keys=False) + "\n")
    dest.write_text(SUMMARY, bundle_summary(meta))
    if plot and importlib.util.find_spec("matplotlib") is not None:
        from ._plot import memory_figure

        fig = memory_figure(table, meta)
        with dest.fs.open_output_stream(dest.path(PLOT)) as f:
            fig.savefig(f, format="png", dpi=110)
    return meta


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
    table, meta, _ = recover_rings([Path(t) for t in targets])
    return table, meta


def read_summary(out_dir: str | os.PathLike[str]) -> str:
    """summary.md of a bundle written by write_bundle (local folder or URI)."""
    dest = Destination(out_dir, create=False)
    with dest.fs.open_input_stream(dest.path(SUMMARY)) as f:
        return bytes(f.read()).decode("utf-8")


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
