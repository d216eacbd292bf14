"""The bundle: a folder (or URI prefix) holding timeline.parquet, ranks.parquet, metadata.json,
summary.md, memory.png, ``crash-<pid>.txt`` where faulthandler left a native crash's tracebacks, and
the rings it read, zstd-compressed, in ``rings/``.

The only module that writes a bundle, and the one that reads it back. What the
views render is handed in as bytes: this module imports no view.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar, cast

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .._errors import BundleDestinationError, NothingThereError
from ..ring.inputs import Folder, folder_at, open_folder, open_input
from ..ring.packed import KeptRings, Packed, pack, stored_name
from . import live_stacks
from .outfolder import OutFolder
from .pipeline import OOM_REPORT, RecoveryPass, recover_rings
from .ranks import rank_rows, ranks_table
from .spill import SpilledRings
from .timeline import TIMELINE_SCHEMA

TIMELINE = "timeline.parquet"
METADATA = "metadata.json"
SUMMARY = "summary.md"
PLOT = "memory.png"
RANKS = "ranks.parquet"
BUNDLE_FILES = frozenset({TIMELINE, RANKS, METADATA, SUMMARY, PLOT, OOM_REPORT, live_stacks.ALLOCATIONS})
# and crash-<pid>.txt
RAW_RINGS = "rings"  # the folder of the rings read, each <ring>.zst
MAX_METADATA_BYTES = 256 << 20
# Delta encoding turns seq and time into a few bits per row; dictionaries carry the strings. The folded
# stacks too: written plain, a row group repeating one 64 KiB stack was decoded to 8 GB, past what Arrow can
# hold ("Take operation overflowed binary array capacity").
_DELTA = ("seq", "time", "step")
_DICTIONARY = ["kind", "label", "host", "thread", "pid", "rank", "device", "detail", "stack", "job"]
# Min/max statistics where queries filter (DuckDB skips row groups with them); the rest skip the cost.
_STATISTICS = ["seq", "time", "kind", "step", "pid", "rank", "host", "device", "value", "job"]
ROW_GROUP = 1 << 17  # rows per row group: the writer holds one row group at a time
_FEW_ROWS = 1024  # rings of fewer rows than this, on average, are combined into one chunk before writing
_COMPACT = 64  # such rings' tables held at most before they are combined (memory flat in the ring count)


class Destination:
    """Where a bundle goes: a local folder (made whole in a private folder beside it, then put in place
    at once) or a pyarrow filesystem URI (``s3://bucket/prefix``, ``gs://``, ``hdfs://``; ``file://`` is
    a local folder)."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        text = os.fspath(out)
        self.fs: pafs.FileSystem = pafs.LocalFileSystem()
        self.root = text
        self.local: Path | None = Path(text)
        if "://" in text:
            try:
                self.fs, self.root = pafs.FileSystem.from_uri(text)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
                raise BundleDestinationError(
                    f"{text}: expected a local folder or a pyarrow filesystem URI, found: {exc}"
                ) from None
            self.local = Path(self.root) if isinstance(self.fs, pafs.LocalFileSystem) else None

    def path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def key(self) -> tuple[str, str]:
        """Where the writer puts the files, however OUT was spelled (``file://``, a URI's ``?region=``,
        links on the way): the filesystem's kind and the folder's real path, or the path in it."""
        if self.local is not None:
            return "local", os.path.realpath(self.local)
        return self.fs.type_name, self.root.rstrip("/")


_PARQUET: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 1,
    "use_dictionary": _DICTIONARY,
    "column_encoding": dict.fromkeys(_DELTA, "DELTA_BINARY_PACKED"),
    "write_statistics": _STATISTICS,
    # rows the writer encodes per call (1,024 by default): a 1 M-row timeline 211 ms to 197 ms, the same
    # bytes; no larger, as a dictionary column's size is checked against its page limit per batch
    "write_batch_size": 8192,
}


def write_timeline(table: pa.Table, path: str | Path | BinaryIO, filesystem: pafs.FileSystem | None = None) -> None:
    pq.write_table(
        table,
        path if not isinstance(path, (str, Path)) else str(path),
        filesystem=filesystem,
        row_group_size=ROW_GROUP,
        **_PARQUET,
    )


Reader = Callable[[list[tuple[str, str, Any]] | None, list[str] | None, int], pa.Table]
Views = Callable[[dict[str, Any], "Reader | None"], dict[str, bytes]]


def stream_bundle(
    recovery: RecoveryPass,
    out_dir: str | os.PathLike[str],
    views: Views,
    after_verdict: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Write a recovery into ``out_dir`` (a folder or a URI), verdict first: as soon as the last ring
    is diagnosed, a bundle of the verdict alone (metadata.json with ``complete: false``, summary.md,
    ranks.parquet and the recovered text files) is put in place; then the whole bundle (the timeline
    too, the views, metadata.json with ``complete: true``) replaces it. A recovery killed midway leaves
    the verdict. Returns the metadata (its ``rings``, where there are several, a ``SpilledRings``).

    The timeline is written a ring at a time (rows in shared row groups, rings' metadata spilled to
    disk: memory is bounded by the rings in flight); the last ring's rows wait until the verdict is out.

    ``views(meta, read)``: renders the views (file name -> bytes: summary.md, memory.png); ``read`` is
    None for the verdict (no timeline yet), else ``read(filters, columns, max_rows)`` reads the written
    timeline back (pyarrow filters, e.g. one pid's rows), thinned to at most about ``max_rows`` rows.
    ``after_verdict(meta)``: called with the verdict's metadata once it is in place (the caller readies the
    views' drawing then; `blackbox run`'s snapshot says its line).

    Locally (``outfolder``) each of the two is made in a private folder beside ``out_dir`` (mode 0700,
    files 0600) and put in its place whole, replacing what was there at once: no existing path is ever
    opened for writing, concurrent recoveries into one folder leave one of their bundles, never a mix,
    and no file of an earlier bundle survives. On object storage metadata.json is written last each time.
    """
    try:
        return _write(out_dir, lambda out: _fill(recovery, views, out, after_verdict))
    finally:
        recovery.close()  # the rings' folders, and the rings held open for rings/, whatever happened
        if recovery.kept is not None:
            recovery.kept.close()


class _Folder(Protocol):
    def create(self, name: str) -> BinaryIO: ...  # a new file of the bundle being written, open for writing

    def open_back(self, name: str) -> BinaryIO: ...  # a file already written into it, open for reading

    def mkdir(self, name: str) -> None: ...  # a new folder in it

    def remove(self, name: str) -> None: ...  # a file written into it, removed


class _Out(Protocol):
    def folder(self) -> _Folder: ...  # where the next bundle is made

    def put(self, folder: Any) -> None: ...  # put it at OUT whole


_T = TypeVar("_T")


def _write(out_dir: str | os.PathLike[str], fill: Callable[[_Out], _T]) -> _T:
    """Run ``fill`` over a bundle's destination: on object storage after retiring an earlier bundle's
    metadata; locally in a private holder beside it (``OutFolder``), removed after."""
    dest = Destination(out_dir)
    if dest.local is None:
        return fill(_Prefix(dest))
    with OutFolder(dest.local, _bundle_file) as out:
        return fill(out)


class _Prefix:
    """A bundle on object storage, where each object appears whole on its own: one folder, the prefix,
    whose earlier bundle's metadata.json is removed before anything is written (``_retire_remote``)."""

    def __init__(self, dest: Destination) -> None:
        self.dest = dest
        _retire_remote(dest)

    def folder(self) -> _Prefix:
        return self

    def put(self, folder: Any) -> None:
        """Nothing to move: metadata.json, written last, makes the prefix a bundle."""

    def create(self, name: str) -> BinaryIO:
        # compression=None: by default pyarrow compresses a stream whose name ends in .zst (rings/*.zst) again
        return cast(BinaryIO, self.dest.fs.open_output_stream(self.dest.path(name), compression=None))

    def open_back(self, name: str) -> BinaryIO:
        return cast(BinaryIO, self.dest.fs.open_input_file(self.dest.path(name)))

    def mkdir(self, name: str) -> None:
        self.dest.fs.create_dir(self.dest.path(name))

    def remove(self, name: str) -> None:
        self.dest.fs.delete_file(self.dest.path(name))


def _last_files(create: Callable[[str], BinaryIO], ranks: pa.Table, files: dict[str, bytes],
                meta: dict[str, Any], stacks: bool = True) -> None:  # fmt: skip
    """What follows the timeline: ranks.parquet, the other files (views, recovered texts), allocations.parquet
    (a bundle of rings: ``stacks``, even with no row) and, last, metadata.json (a bundle is there once it is)."""
    with create(RANKS) as sink:
        pq.write_table(ranks, sink, compression="zstd")
    for name, data in files.items():
        with create(name) as f:
            f.write(data)
    if stacks:
        with create(live_stacks.ALLOCATIONS) as f:
            live_stacks.write(live_stacks.bundle_rows(meta), f)
    with create(METADATA) as f:
        _dump(meta, f)


def _retire_remote(dest: Destination) -> None:
    """Before writing a bundle to object storage, where objects appear one by one: remove an earlier
    bundle's metadata.json first, then its other files, so a reader listing the prefix never takes
    the earlier metadata for the new tables (a prefix is a bundle once its metadata.json is there)."""
    dest.fs.create_dir(dest.root, recursive=True)
    infos = dest.fs.get_file_info(pafs.FileSelector(dest.root, allow_not_found=True))
    names = {i.base_name for i in infos if i.type == pafs.FileType.File and _bundle_file(i.base_name)}
    for name in sorted(names, key=lambda n: n != METADATA):  # metadata.json first
        with contextlib.suppress(FileNotFoundError):
            dest.fs.delete_file(dest.path(name))
    if any(i.base_name == RAW_RINGS and i.type == pafs.FileType.Directory for i in infos):
        dest.fs.delete_dir_contents(dest.path(RAW_RINGS), missing_dir_ok=True)


def write_job_bundle(out_dir: str | os.PathLike[str], ranks: pa.Table, meta: dict[str, Any],
                     views: dict[str, bytes]) -> None:  # fmt: skip
    """Write a job-wide bundle (no timeline: each node bundle keeps its own): ranks.parquet, the views
    (summary.md) and, last, metadata.json; made whole and put in place like a bundle of rings."""

    def fill(out: _Out) -> None:
        folder = out.folder()
        _last_files(folder.create, ranks, views, meta, stacks=False)
        out.put(folder)

    _write(out_dir, fill)


def read_thinned(
    source: Any, filters: list[tuple[str, str, Any]] | None, columns: list[str] | None, max_rows: int
) -> pa.Table:
    """The rows of a timeline file that pass ``filters``, read a batch at a time and thinned evenly to
    between ``max_rows`` and twice that (every 2nd, 4th, ... row kept): memory bounded by ``max_rows``
    whatever the file's size."""
    flat = bool(filters) and all(isinstance(f, tuple) and len(f) == 3 for f in filters or [])
    if flat:  # a value list read once here, not used up by the expression before the row groups see it
        filters = [(c, op, list(v) if op in ("in", "not in") else v) for c, op, v in filters or []]
    where = pq.filters_to_expression(filters) if filters else None
    kept: list[pa.Table] = []
    held, stride, seen = 0, 1, 0
    file = pq.ParquetFile(source)
    groups = _row_groups(file.metadata, filters if flat and filters else [])
    for batch in file.iter_batches(batch_size=16384, columns=columns, row_groups=groups) if groups else ():
        part = pa.Table.from_batches([batch])
        if where is not None:
            part = part.filter(where)
        first = (-seen) % stride
        seen += part.num_rows
        part = part.take(pa.array(range(first, part.num_rows, stride), type=pa.int64()))
        kept.append(part)
        held += part.num_rows
        while held > 2 * max_rows:  # halve what is held, and keep half as many from now on
            table = pa.concat_tables(kept)
            kept, stride = [table.take(pa.array(range(0, table.num_rows, 2), type=pa.int64()))], stride * 2
            held = kept[0].num_rows
    if not kept:
        empty = file.schema_arrow.empty_table()
        return empty.select(columns) if columns else empty
    return pa.concat_tables(kept)


def _row_groups(meta: pq.FileMetaData, filters: list[tuple[str, str, Any]]) -> list[int]:
    """The row groups whose min/max statistics do not rule out every ``=`` and ``in`` filter of a flat
    list (any other filter, a column without statistics, or statistics Python cannot compare rules
    nothing out)."""
    index = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    tests = [(index[c], v if op == "in" else [v]) for c, op, v in filters if op in ("=", "in") and c in index]
    return [g for g in range(meta.num_row_groups) if not any(_rules_out(meta.row_group(g).column(c), v)
                                                             for c, v in tests)]  # fmt: skip


def _rules_out(chunk: pq.ColumnChunkMetaData, values: list[Any]) -> bool:
    """Whether a column chunk's statistics show it holds none of ``values``."""
    try:
        stats = chunk.statistics
        if stats is None or not stats.has_min_max or stats.null_count != 0:
            return False
        low, high = stats.min, stats.max  # a ns timestamp becomes a Python value only through pandas
        return not any(low <= v <= high for v in values)
    except (TypeError, ValueError, pa.ArrowException):  # another type than the column's
        return False


def _fill(
    recovery: RecoveryPass, views: Views, out: _Out, after_verdict: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    whole = out.folder()
    verdict: list[Verdict] = []

    def put_verdict() -> Verdict:
        done = _put_verdict(recovery, views, out)
        if after_verdict is not None:
            after_verdict(done[0])
        return done

    def tables() -> Iterator[pa.Table]:
        for table in recovery.tables():
            if recovery.last and not verdict:  # every ring diagnosed: the verdict goes out before these rows
                verdict.append(put_verdict())
            yield table
            del table  # not held while the next ring is decoded

    with whole.create(TIMELINE) as sink, pq.ParquetWriter(sink, TIMELINE_SCHEMA, **_PARQUET) as writer:
        _write_row_groups(writer, tables(), lambda: recovery.last)
    meta, ranks, texts = verdict[0] if verdict else put_verdict()

    def read(filters: list[tuple[str, str, Any]] | None, columns: list[str] | None, max_rows: int) -> pa.Table:
        with whole.open_back(TIMELINE) as f, _native(f) as source:
            table = read_thinned(source, filters, columns, max_rows)
        return table if len(meta.get("rings") or []) < 2 else table.sort_by("time")  # rings' rows interleave

    meta["complete"] = True
    if recovery.kept is not None:  # after the timeline: the verdict is out, the rest waits for the rings
        meta["raw_rings"] = _put_raw_rings(whole, recovery.kept)
    _last_files(whole.create, ranks, {**texts, **views(meta, read)}, meta)
    out.put(whole)
    return meta


Verdict = tuple[dict[str, Any], pa.Table, dict[str, bytes]]  # the metadata, ranks.parquet's table, the texts


def _put_verdict(recovery: RecoveryPass, views: Views, out: _Out) -> Verdict:
    """The metadata of every ring, put at OUT as a bundle of its own with summary.md, ranks.parquet and
    the recovered texts, ``complete: false``: (the metadata, the ranks, the texts)."""
    meta = recovery.finish()
    meta["complete"] = False
    ranks = ranks_table(rank_rows(meta))
    texts = {name: text.encode("utf-8") for name, text in recovery.files.items()}
    folder = out.folder()
    _last_files(folder.create, ranks, {**texts, **views(meta, None)}, meta)
    out.put(folder)
    return meta, ranks, texts


def _write_row_groups(
    writer: pq.ParquetWriter, tables: Iterator[pa.Table], last: Callable[[], bool] = lambda: False
) -> None:
    """Write the rings' timelines as row groups of ``ROW_GROUP`` rows, small rings sharing one: the
    writer keeps every row group's metadata until the footer (about 80 KiB each, whatever its size), so
    the row groups follow the rows written, not the ring count. While the next ring is decoded, holds
    at most a row group's rows, never a whole ring's table. ``last()``: the table just taken is the last
    one, so its rows left over go with its full row groups, in one call (no copy of them is held)."""
    held: list[pa.Table] = []
    rows = 0
    for table in tables:
        # a ring's table has the schema already (a cast would cost a call per column). A large one is held as a
        # new table on the same buffers, so that what is cached for the ring's own table goes with it; a small one
        # as it is (a slice costs more than the rest of a tiny ring's row-group work)
        if not table.schema.equals(TIMELINE_SCHEMA, check_metadata=True):
            table = table.cast(TIMELINE_SCHEMA)
        elif table.num_rows > _FEW_ROWS:
            table = table.slice(0)
        held.append(table)
        rows += table.num_rows
        del table
        if rows >= ROW_GROUP and not last():
            whole = pa.concat_tables(held)
            held.clear()
            full = rows - rows % ROW_GROUP
            writer.write_table(whole.slice(0, full), row_group_size=ROW_GROUP)
            rows -= full
            if rows:  # a copy of the rest: a slice would keep every buffer of the ring it came from
                held.append(whole.slice(full).take(pa.array(range(rows), type=pa.int64())))
            del whole
        elif len(held) >= _COMPACT and rows < len(held) * _FEW_ROWS:  # many small rings: their rows copied into
            held = [pa.concat_tables(held).combine_chunks()]  # one chunk per column (a ring's own buffers: ~40 KiB)
    if rows:
        many = len(held) > 1 and rows < len(held) * _FEW_ROWS
        whole = pa.concat_tables(held)
        held.clear()
        if many:  # many small rings: one chunk per column, copied
            whole = whole.combine_chunks()  # (the writer's cost goes per chunk: 1,000 rings of 3 rows, 0.1 s to 0.02 s)
        writer.write_table(whole, row_group_size=ROW_GROUP)


def _dump(meta: dict[str, Any], sink: Any) -> None:
    """metadata.json (``json.dump(meta, indent=2)``'s text) into ``sink`` (any binary writer), a MiB per
    write; the rings of a ``SpilledRings`` are copied one at a time."""
    held: list[str] = []
    size = 0

    def put(text: str) -> None:
        nonlocal size, held
        held.append(text)
        size += len(text)
        if size >= 1 << 20:
            sink.write("".join(held).encode("utf-8"))
            held, size = [], 0

    def indented(value: Any, level: int) -> str:
        return json.dumps(value, indent=2).replace("\n", "\n" + "  " * level)

    meta = live_stacks.strip(meta)[0]  # the stacks are in allocations.parquet
    if isinstance(meta.get("rings"), list):
        meta = {**meta, "rings": [live_stacks.strip(m)[0] if isinstance(m, dict) else m for m in meta["rings"]]}
    put("{")
    for n, (key, value) in enumerate(meta.items()):
        put(("," if n else "") + f"\n  {json.dumps({key: None})[1:-7]}: ")  # the key as json writes one
        if isinstance(value, SpilledRings):
            stacked = set(value.with_stacks())
            for i in range(len(value)):  # kept as json writes it: copied, not parsed and encoded again
                text = indented(live_stacks.strip(value[i])[0], 0) if i in stacked else value.text(i)
                put(("[" if not i else ",") + "\n    " + text.replace("\n", "\n    "))
            put("\n  ]" if len(value) else "[]")
        else:
            put(indented(value, 1))
    put("\n}\n" if meta else "}\n")
    sink.write("".join(held).encode("utf-8"))


def _put_raw_rings(folder: _Folder, kept: KeptRings) -> dict[str, Any]:
    """Each ring the recovery kept, zstd-compressed into ``rings/<ring>.zst`` from the descriptor it was
    read through (then closed); what ``metadata.json`` says of them (``raw_rings``)."""
    kept_rows: list[dict[str, Any]] = []
    skipped = list(kept.skipped)
    taken: set[str] = set()
    try:
        made = _made(folder) if kept.held else None
        for path, fd, size in kept.held:
            name = f"{RAW_RINGS}/{stored_name(path, taken)}"
            try:
                if made is not None:
                    raise made
                with folder.create(name) as sink:
                    packed = _pack_kept(kept, fd, size, sink)
            except OSError as exc:  # a full disk, a read error: the rest of the bundle still goes
                why = f"{name}: not written ({exc.strerror or exc})"
                skipped.append({"ring": str(path), "raw_bytes": size, "reason": why})
                if made is None:
                    with contextlib.suppress(OSError):
                        folder.remove(name)  # what it holds so far, so that the rest has room
                continue
            kept_rows.append({"ring": str(path), "file": name, "raw_bytes": packed.raw_bytes,
                              "compressed_bytes": packed.compressed_bytes, "sha256": packed.sha256})  # fmt: skip
    finally:
        kept.close()
    return {"kept": kept_rows, "skipped": skipped, "max_rings": kept.max_rings, "max_bytes": kept.max_bytes}


def _pack_kept(kept: KeptRings, fd: int, size: int, sink: BinaryIO) -> Packed:
    """The ring at ``fd`` into ``sink``: as compressed ahead while the rings were decoded, or now."""
    done = kept.take(fd, size)
    if done is None:
        return pack(fd, size, sink)
    try:
        for piece in done.pieces:
            sink.write(piece)
        return done.packed
    finally:
        kept.release(done)


def _made(folder: _Folder) -> OSError | None:
    """Make ``rings/`` in ``folder``: None, or why it could not be made."""
    try:
        folder.mkdir(RAW_RINGS)
    except OSError as exc:
        return exc
    return None


def _bundle_file(name: str) -> bool:
    return name in BUNDLE_FILES or name == RAW_RINGS or (name.startswith("crash-") and name.endswith(".txt"))


def read_bundle(bundle: str | os.PathLike[str] | Folder) -> tuple[pa.Table, dict[str, Any]]:
    """(timeline, metadata) of a bundle folder (by path, or already open) or URI; a verdict alone
    (``complete: false``: its recovery was cut short before the timeline) is refused in one line."""
    dest = Destination(bundle.path if isinstance(bundle, Folder) else bundle)
    with _files(dest, bundle if isinstance(bundle, Folder) else None) as open_file:  # one folder, both files
        with open_file(METADATA) as f:
            meta = parse_metadata(f.read(MAX_METADATA_BYTES), dest.path(METADATA))
        if meta.get("complete") is False:
            raise BundleDestinationError(
                f"{dest.path(METADATA)}: expected a whole bundle, found a verdict alone (complete: false: its "
                "recovery was cut short before the timeline; recover the rings again)"
            )
        with open_file(TIMELINE) as f, _native(f) as source:
            table = pq.read_table(source)
        try:
            stacks_file = open_file(live_stacks.ALLOCATIONS)
        except (NothingThereError, FileNotFoundError):  # a bundle older than the file, or a job-wide one
            return table, meta
        with stacks_file as f, _native(f) as source:
            found = live_stacks.read(source, _size(f), dest.path(live_stacks.ALLOCATIONS))
    return table, live_stacks.attach(meta, found)


def _size(f: BinaryIO) -> int:
    try:
        return os.fstat(f.fileno()).st_size
    except (OSError, ValueError, AttributeError):  # an object store's file: its own size
        return int(f.size()) if hasattr(f, "size") else 0


def _native(f: BinaryIO) -> Any:
    """An Arrow file over the open local file ``f`` (the same file, by its descriptor's /proc link): Arrow
    reads ahead on threads of its own, and a Python file makes them call back into Python; one still
    reading as the interpreter ends is stopped inside a C++ frame (std::terminate: ``blackbox export``
    exited -6 after its answer, 2 runs in 80, apache/arrow#34314). ``f`` itself where there is none."""
    if not hasattr(f, "fileno") or isinstance(f, pa.NativeFile):
        return contextlib.nullcontext(f)
    try:
        return pa.OSFile(f"/proc/self/fd/{f.fileno()}", "rb")
    except (OSError, ValueError, pa.ArrowException):
        return contextlib.nullcontext(f)


def parse_metadata(raw: bytes, where: str) -> dict[str, Any]:
    """A bundle's metadata.json (untrusted: JSON only, an object, or one line saying what was found)."""
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BundleDestinationError(f"{where}: expected JSON, found {type(exc).__name__}") from None
    if not isinstance(meta, dict):
        raise BundleDestinationError(f"{where}: expected a JSON object, found {type(meta).__name__}")
    return meta


def _open(dest: Destination, name: str) -> BinaryIO:
    """A bundle file, opened for reading; a local one as untrusted input (``ring.inputs``: a regular
    file of the folder's owner or the invoking user, never through a link)."""
    with _files(dest) as open_file:
        return open_file(name)


@contextlib.contextmanager
def _files(dest: Destination, held: Folder | None = None) -> Iterator[Callable[[str], BinaryIO]]:
    """Opens files of one bundle: a local bundle's folder (``held``, else opened here) is opened once,
    each file relative to it (a folder swapped meanwhile for another user's bundle changes nothing)."""
    if dest.local is None and held is None:
        yield lambda name: cast(BinaryIO, dest.fs.open_input_file(dest.path(name)))
        return
    with folder_at(held) if held is not None else open_folder(Path(dest.local or "")) as folder:

        def open_file(name: str) -> BinaryIO:
            fd, _ = open_input(folder, name, {folder.uid}, f"a bundle's {name}")
            return os.fdopen(fd, "rb")

        yield open_file


def is_bundle(path: str | os.PathLike[str]) -> bool:
    text = os.fspath(path)
    if "://" in text:
        return True
    try:
        return stat.S_ISREG(os.lstat(Path(text) / METADATA).st_mode)
    except OSError:
        return False


def load(
    targets: list[str], progress: Callable[[int, int, str], None] | None = None
) -> tuple[pa.Table, dict[str, Any]]:
    """(timeline, metadata) of one bundle, or of rings and ring folders recovered in memory (``progress``
    told of each ring as ``recover_rings`` tells it)."""
    if len(targets) == 1 and is_bundle(targets[0]):
        return read_bundle(targets[0])
    recovered = recover_rings([Path(t) for t in targets], progress=progress)
    return recovered.table, recovered.meta


def read_metadata(bundle: str | os.PathLike[str]) -> dict[str, Any]:
    """metadata.json of a bundle (a folder or URI; read as untrusted, a JSON object or one line)."""
    dest = Destination(bundle)
    with _open(dest, METADATA) as f:
        return parse_metadata(f.read(MAX_METADATA_BYTES), dest.path(METADATA))


def read_summary(out_dir: str | os.PathLike[str]) -> str:
    """summary.md of a bundle written by stream_bundle (local folder or URI)."""
    with _open(Destination(out_dir), SUMMARY) as f:
        return bytes(f.read(MAX_METADATA_BYTES)).decode("utf-8", "replace")
