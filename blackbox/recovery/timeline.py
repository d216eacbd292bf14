"""Rings to Arrow tables: the timeline, as pure functions (no file writing here).

The column set and types are specified in FORMAT.md ("Timeline columns");
``TIMELINE_SCHEMA`` below is the definition the spec test compares against.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

from ..collect.oom import parse_oom
from ..ring import format as fmt
from ..ring.reader import Ring

GAUGES = tuple(c for c in fmt.SAMPLE_FIELDS + fmt.GPU_SAMPLE_FIELDS if c)
COUNTERS = frozenset({"cgroup_oom_kills", "psi_some_us", "psi_full_us", "gpu_alloc_retries", "gpu_ooms"})
BYTE_GAUGES = tuple(g for g in GAUGES if g not in COUNTERS)
_DICT_STR = pa.dictionary(pa.int32(), pa.string())
_KIND_SIGNAL = fmt.KIND_CODES["signal"]
_KIND_STACK_SAMPLE = fmt.KIND_CODES["stack_sample"]
_VIRTUAL_IDS = 1 << 33  # string ids above any u4 id: folded stacks joined into ``detail``
STACK_LOST = "<blackbox: stack lost (its table entry was overwritten or damaged)>"
FRAME_LOST = "<blackbox: frame lost>"
# Figures parsed from the message of an ``oom`` event (see _oom.parse_oom), bytes.
OOM_COLUMNS = (
    "oom_requested",
    "oom_capacity",
    "oom_free",
    "oom_allocated",
    "oom_reserved_unallocated",
    "oom_private_pools",
)

TIMELINE_SCHEMA = pa.schema(
    [
        ("seq", pa.uint64()),
        ("time", pa.timestamp("ns", tz="UTC")),
        ("kind", _DICT_STR),
        ("label", _DICT_STR),
        ("value", pa.int64()),
        ("step", pa.int64()),
        ("thread", pa.uint64()),
        ("pid", pa.int64()),
        ("rank", pa.int32()),
        ("host", _DICT_STR),
        ("device", pa.int16()),
    ]
    + [(c, _DICT_STR if c in fmt.STRING_COLUMNS | fmt.TEXT_COLUMNS else pa.int64()) for c in fmt.PAYLOAD_COLUMN_ORDER]
    + [(c, pa.int64()) for c in OOM_COLUMNS]
)


def record_columns(records: np.ndarray) -> dict[str, np.ndarray]:
    """Each record field as a contiguous array (Arrow converts strided views slowly).

    One cache-blocked transpose of the 8-byte words replaces a strided pass per field.
    """
    n = len(records)
    width = fmt.RECORD_SIZE // 8
    words = np.ascontiguousarray(records).view("<u8").reshape(n, width)
    rows = np.empty((width, n), np.uint64)
    for lo in range(0, n, 8192):
        rows[:, lo : lo + 8192] = words[lo : lo + 8192].T
    out: dict[str, np.ndarray] = {}
    fields: dict[str, Any] = dict(fmt.RECORD_DTYPE.fields or {})
    for name, (dt, offset, *_) in fields.items():
        if dt.itemsize == 8:
            out[name] = rows[offset // 8].view(dt)
        else:
            word = np.dtype({"names": [name], "formats": [dt], "offsets": [offset % 8], "itemsize": 8})
            out[name] = np.ascontiguousarray(rows[offset // 8].view(word)[name])
    return out


def ring_times(ring: Ring, mono: np.ndarray) -> tuple[np.ndarray, int]:
    """UTC nanoseconds of each record, made non-decreasing; also how many were raised.

    The header's clock pair maps the monotonic stamps onto the wall clock.
    Stamps are taken with the seq in one GIL-atomic step, so a raise only
    happens with a damaged record or a writer without a GIL.
    """
    clock = ring.meta.get("clock") or {}
    wall0, mono0 = int(clock.get("wall_ns", 0)), int(clock.get("monotonic_ns", 0))
    t = np.asarray(mono, dtype=np.int64) + np.int64(wall0 - mono0)
    fixed = np.maximum.accumulate(t) if len(t) else t
    return fixed, int((fixed != t).sum())


def _dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values ascending, index of each value among them): np.unique without a sort
    when the values are small non-negative ids, as kinds and label ids are."""
    if len(values) and int(values.max()) < (1 << 22):
        present = np.bincount(values, minlength=1) > 0
        uniq = np.flatnonzero(present)
        position = np.cumsum(present) - 1
        return uniq, position[values].astype(np.int32)
    uniq, inverse = np.unique(values, return_inverse=True)
    return uniq, inverse.astype(np.int32)


def _labels(ids: np.ndarray, strings: dict[int, str]) -> tuple[pa.Array, int]:
    """Dictionary-encoded labels; ids whose string is missing become a placeholder."""
    uniq, indices = _dense_codes(ids)
    counts = np.bincount(indices, minlength=len(uniq)) if len(uniq) else np.zeros(0, np.int64)
    lost = 0
    words: list[str | None] = []
    for i, sid in enumerate(uniq.tolist()):
        if sid == 0:
            words.append(None)
            continue
        if sid in (fmt.STRING_FULL_ID, fmt.STRING_BUSY_ID) or sid not in strings:
            lost += int(counts[i])
        if sid == fmt.STRING_FULL_ID:
            words.append(fmt.STRING_FULL_TEXT)
        elif sid == fmt.STRING_BUSY_ID:
            words.append(fmt.STRING_BUSY_TEXT)
        else:
            words.append(strings.get(sid, f"<blackbox: label #{sid} lost>"))
    mask = None
    if len(uniq) and uniq[0] == 0:
        mask = indices == 0
    dictionary = pa.array([w if w is not None else "" for w in words], pa.string())
    arr = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32(), mask=mask), dictionary)
    return arr, lost


def _kinds(codes: np.ndarray) -> pa.Array:
    uniq, indices = _dense_codes(codes)
    dictionary = pa.array([fmt.kind_name(int(c)) for c in uniq], pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)


def _constant(value: Any, n: int, typ: pa.DataType) -> pa.Array:
    if value is None:
        return pa.nulls(n, typ)
    return pa.array(np.full(n, value), typ)


def _const_str(value: str | None, n: int) -> pa.Array:
    if value is None:
        return pa.nulls(n, _DICT_STR)
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))


def ring_table(ring: Ring) -> pa.Table:
    """The timeline of one ring, one row per valid record, in seq order.

    Updates ``ring.recovery.labels_lost`` and ``time_clamped`` as it goes.
    """
    records = ring.records
    n = len(records)

    r = record_columns(records)
    ident = ring.meta.get("identity") or {}
    times, clamped = ring_times(ring, r["time"])
    labels, lost = _labels(r["label"], ring.strings)
    ring.recovery.time_clamped = clamped
    ring.recovery.labels_lost = lost
    has_value = (r["flags"] & fmt.FLAG_VALUE) != 0
    step = _step_in_force(r["kind"], r["step"]) if ring.header.version >= 3 else r["step"]
    device = r["device"]
    thread = r["thread"]
    stack_rows = np.flatnonzero(r["kind"] == _KIND_STACK_SAMPLE) if ring.header.version >= 3 else np.zeros(0, int)
    if len(stack_rows):  # the sampled thread, not the sampler's
        thread = thread.copy()
        thread[stack_rows] = r["p0"][stack_rows]
    cols: dict[str, pa.Array] = {
        "seq": pa.array(r["seq"], pa.uint64()),
        "time": pa.array(times, pa.timestamp("ns", tz="UTC")),
        "kind": _kinds(r["kind"]),
        "label": labels,
        "value": pa.array(r["value"], pa.int64(), mask=~has_value),
        "step": pa.array(step, pa.int64(), mask=step < 0),
        "thread": pa.array(thread, pa.uint64()),
        "pid": _constant(_int_or_none(ident.get("pid")), n, pa.int64()),
        "rank": _constant(_int_or_none(ident.get("rank")), n, pa.int32()),
        "host": _const_str(_str_or_none(ident.get("host")), n),
        "device": pa.array(device, pa.int16(), mask=device < 0),
    }
    cols.update(_payload(r, ring.header.version, ring.strings, _stacks(r, stack_rows, ring.stacks)))
    cols.update(_oom_figures(r["kind"], labels))
    return pa.Table.from_pydict(cols, schema=TIMELINE_SCHEMA)


def _step_in_force(kinds: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Steps, with a signal's filled in from the record before it: the handler cannot read the step."""
    signals = kinds == _KIND_SIGNAL
    if not (signals & (step < 0)).any():
        return step
    index = np.arange(len(step))
    before = np.maximum.accumulate(np.where(signals, -1, index))
    filled = step.copy()
    fill = signals & (step < 0) & (before >= 0)
    filled[fill] = step[before[fill]]
    return filled


def _stacks(r: dict[str, np.ndarray], rows: np.ndarray, table: fmt.StackScan | None) -> dict[int, str]:
    """The folded stack (outermost frame first, ``;``-joined) of each stack_sample row."""
    if not len(rows):
        return {}
    keys = (r["p2"][rows].astype(np.uint64) << np.uint64(32)) | (
        r["p1"][rows].astype(np.uint64) & np.uint64(0xFFFFFFFF)
    )
    depth = r["p3"].view(np.int64)[rows]
    texts: dict[tuple[int, int], str] = {}
    out: dict[int, str] = {}
    for row, key, d in zip(rows.tolist(), keys.tolist(), depth.tolist(), strict=True):
        k = (key, d)
        if k not in texts:
            texts[k] = folded(table, key >> 32, key & 0xFFFFFFFF, d)
        out[row] = texts[k]
    return out


def folded(table: fmt.StackScan | None, gen: int, sid: int, depth: int) -> str:
    """One stack as ``outer (file:line);...;inner (file:line)``, from the ring's stack table."""
    frames = table.stacks.get((gen, sid)) if table is not None else None
    if frames is None:
        return STACK_LOST
    names = [table.frames.get((gen, f), FRAME_LOST) for f in frames] if table is not None else []
    if depth > len(names):
        names.insert(0, fmt.STACK_TRUNCATED_TEXT)
    return ";".join(names)


def _payload(
    r: dict[str, np.ndarray], version: int, strings: dict[int, str], stacks: dict[int, str]
) -> dict[str, pa.Array]:
    """Payload words to columns: each kind fills the columns its layout names, others are null.
    ``stacks``: the folded stack of each stack_sample row, which fills its ``detail``."""
    n = len(r["kind"])
    values: dict[str, np.ndarray] = {}
    present: dict[str, np.ndarray] = {}
    texts: dict[str, list[tuple[np.ndarray, int]]] = {}  # text column -> (rows, first word) per kind
    for code, words in fmt.payload_columns(version).items():
        rows = r["kind"] == code
        if not rows.any():
            continue
        for i, name in enumerate(words):
            if name is None or name in fmt.RESOLVED_WORDS:
                continue
            if name in fmt.TEXT_COLUMNS:
                if i == 0 or words[i - 1] != name:
                    texts.setdefault(name, []).append((rows, i))
                continue
            if name not in values:
                values[name] = np.zeros(n, np.int64)
                present[name] = np.zeros(n, bool)
            w = r[f"p{i}"].view(np.int64)
            values[name][rows] = w[rows]
            present[name] |= rows & ((w > 0) if name in fmt.STRING_COLUMNS else (w >= 0))
    if stacks:
        strings = dict(strings)
        values.setdefault("detail", np.zeros(n, np.int64))
        present.setdefault("detail", np.zeros(n, bool))
        virtual: dict[str, int] = {}
        for row, text in stacks.items():
            sid = virtual.setdefault(text, _VIRTUAL_IDS + len(virtual))
            strings[sid] = text
            values["detail"][row], present["detail"][row] = sid, True
    out: dict[str, pa.Array] = {}
    for name in fmt.PAYLOAD_COLUMN_ORDER:
        if name in fmt.TEXT_COLUMNS:
            out[name] = _text_column(r, n, texts.get(name, []))
        elif name not in values:
            out[name] = pa.nulls(n, _DICT_STR if name in fmt.STRING_COLUMNS else pa.int64())
        elif name in fmt.STRING_COLUMNS:
            out[name] = _strings_column(values[name], present[name], strings)
        else:
            out[name] = pa.array(values[name], pa.int64(), mask=~present[name])
    return out


def _text_column(r: dict[str, np.ndarray], n: int, spans: list[tuple[np.ndarray, int]]) -> pa.Array:
    """Text stored in two consecutive payload words (zero padded UTF-8); null where unset."""
    values: list[str | None] = [None] * n
    for rows, first in spans:
        for row in np.flatnonzero(rows).tolist():
            raw = r[f"p{first}"][row : row + 1].tobytes() + r[f"p{first + 1}"][row : row + 1].tobytes()
            text = raw.rstrip(b"\0")
            if text and text != b"\xff" * len(text):
                values[row] = text.decode("utf-8", "replace")
    return pa.array(values, pa.string()).dictionary_encode()


def _strings_column(ids: np.ndarray, present: np.ndarray, strings: dict[int, str]) -> pa.Array:
    ids = np.where(present, ids, 0).astype(np.int64)
    arr, _ = _labels(ids, strings)
    return arr


def _oom_figures(kinds: np.ndarray, labels: pa.Array) -> dict[str, pa.Array]:
    """OOM_COLUMNS from the messages of ``oom`` events (parsed once per distinct message)."""
    n = len(kinds)
    out = {c: np.zeros(n, np.int64) for c in OOM_COLUMNS}
    valid = {c: np.zeros(n, bool) for c in OOM_COLUMNS}
    rows = np.flatnonzero(kinds == fmt.KIND_CODES["oom"])
    if len(rows):
        indices = labels.indices.to_numpy(zero_copy_only=False)
        mask = labels.is_null().to_numpy(zero_copy_only=False)
        dictionary = labels.dictionary.to_pylist()
        parsed: dict[int, dict[str, Any] | None] = {}
        for row in rows.tolist():
            if mask[row]:
                continue
            idx = int(indices[row])
            if idx not in parsed:
                parsed[idx] = parse_oom(dictionary[idx])
            figures = parsed[idx]
            if not figures:
                continue
            for c in OOM_COLUMNS:
                v = figures.get(c.removeprefix("oom_"))
                if v is not None:
                    out[c][row], valid[c][row] = v, True
    return {c: pa.array(out[c], pa.int64(), mask=~valid[c]) for c in OOM_COLUMNS}


def merge_tables(tables: list[pa.Table]) -> pa.Table:
    """Several rings' timelines as one, ordered by time (then host, pid, seq)."""
    if len(tables) == 1:
        return tables[0]
    merged = pa.concat_tables([t.cast(TIMELINE_SCHEMA) for t in tables]).unify_dictionaries()
    return merged.combine_chunks().sort_by([("time", "ascending"), ("pid", "ascending"), ("seq", "ascending")])


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def iso_ns(ns: int | None) -> str | None:
    """UTC ISO-8601 with nanoseconds (``2026-01-01T00:00:00.016000000Z``), or None."""
    if ns is None:
        return None
    seconds, frac = divmod(int(ns), 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac:09d}Z"


def py_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows as dicts, timestamps as ISO-8601 strings. pyarrow turns a nanosecond timestamp into a
    Python value only through pandas, which a plain install does not have."""
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            texts = [iso_ns(s) for s in table.column(i).cast(pa.int64()).to_pylist()]
            table = table.set_column(i, field.name, pa.array(texts, pa.string()))
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def kind_mask(table: pa.Table, *kinds: str) -> pa.ChunkedArray:
    """Rows whose kind is one of ``kinds``, through the dictionary codes (no string decode)."""
    chunks = []
    for chunk in table["kind"].chunks:
        words = chunk.dictionary.to_pylist()
        codes = [i for i, w in enumerate(words) if w in kinds]
        indices = chunk.indices.to_numpy(zero_copy_only=False)
        chunks.append(pa.array(np.isin(indices, codes)))
    return pa.chunked_array(chunks, pa.bool_())


def of_kind(table: pa.Table, *kinds: str, columns: list[str] | None = None) -> pa.Table:
    """The rows of these kinds (only ``columns``, when given: filtering fewer columns is faster)."""
    mask = kind_mask(table, *kinds)
    return (table.select(columns) if columns else table).filter(mask)
