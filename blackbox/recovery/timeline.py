"""Rings to Arrow tables: the timeline, as pure functions (no file writing here).

The column set and types are specified in FORMAT.md ("Timeline columns");
``TIMELINE_SCHEMA`` below is the definition the spec test compares against.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from ..collect.oom import parse_oom
from ..ring import columns
from ..ring import format as fmt
from ..ring.heap import alloc_stacks
from ..ring.reader import Ring
from ..ring.scan import StackScan
from .arrays import masked, nulls
from .pandas_meta import with_nullable_ints

GAUGES = tuple(c for c in fmt.SAMPLE_FIELDS + fmt.GPU_SAMPLE_FIELDS if c)
COUNTERS = frozenset({"cgroup_oom_kills", "psi_some_us", "psi_full_us", "gpu_alloc_retries", "gpu_ooms"})
BYTE_GAUGES = tuple(g for g in GAUGES if g not in COUNTERS)
_DICT_STR = pa.dictionary(pa.int32(), pa.string())
_KIND_SIGNAL = fmt.KIND_CODES["signal"]
_KIND_STACK_SAMPLE = fmt.KIND_CODES["stack_sample"]
_KIND_SAMPLE = fmt.KIND_CODES["sample"]
_ALLOC_KINDS = np.array([fmt.KIND_CODES["alloc_sample"], fmt.KIND_CODES["free_sample"]])
_NO_STEP_KINDS = np.array([_KIND_SIGNAL, *_ALLOC_KINDS.tolist()])  # written where the step cannot be read
# The kinds a sampler tick writes after its stack samples: they get the tick's stack in ``stack``.
_MEMORY_KINDS = np.array([fmt.KIND_CODES[k] for k in ("sample", "gpu_sample", "cgroup_sample", "child_sample")])
_IS_ALLOC, _IS_NO_STEP, _IS_MEMORY = (np.isin(np.arange(256), k) for k in (_ALLOC_KINDS, _NO_STEP_KINDS, _MEMORY_KINDS))
_VIRTUAL_IDS = 1 << 33  # string ids above any u4 id: folded stacks joined into ``detail``
STACK_LOST = "<blackbox: stack lost (its table entry was overwritten or damaged)>"
FRAME_LOST = "<blackbox: frame lost>"
# The distinct folded stacks of one ring are rendered, the most sampled first, while their text stays within
# this; the rest keep their id. A table of 1 MiB (the writer's) of 64 frames of 1 KiB folds to 200 MB at
# worst, and a crafted table of 8 MiB to 2 GB: each copy of the text (the timeline's dictionaries, Parquet's
# pages) would cost that much.
MAX_FOLDED_TEXT = 8 << 20
STACK_NOT_RENDERED = "<blackbox: stack {}:{} not rendered (the ring's distinct stacks pass 8 MiB of folded text)>"
LABEL_CUT = "<blackbox: label #{} lost (damaged, or past the 16 MiB of labels a ring may hold)>"
# Figures parsed from the message of an ``oom`` event (see _oom.parse_oom), bytes.
OOM_COLUMNS = (
    "oom_requested",
    "oom_capacity",
    "oom_free",
    "oom_allocated",
    "oom_reserved_unallocated",
    "oom_private_pools",
)

TIMELINE_SCHEMA = with_nullable_ints(pa.schema(
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
    + [
        (c, _DICT_STR if c in fmt.STRING_COLUMNS | fmt.TEXT_COLUMNS | fmt.CODED_COLUMNS.keys() else pa.int64())
        for c in fmt.PAYLOAD_COLUMN_ORDER
    ]
    + [(c, pa.int64()) for c in OOM_COLUMNS]
    + [("stack", _DICT_STR), ("job", _DICT_STR)]
))  # fmt: skip
_NAMES = TIMELINE_SCHEMA.names


def ring_times(ring: Ring, mono: np.ndarray) -> tuple[np.ndarray, int]:
    """UTC nanoseconds of each record, made non-decreasing; also how many were raised.

    The header's clock pair maps the monotonic stamps onto the wall clock.
    Stamps are taken with the seq in one GIL-atomic step, so a raise only
    happens with a damaged record or a writer without a GIL.
    """
    clock = ring.meta.get("clock") or {}
    wall0, mono0 = int(clock.get("wall_ns") or 0), int(clock.get("monotonic_ns") or 0)
    t = np.asarray(mono, dtype=np.int64) + np.int64(wall0 - mono0)
    fixed = np.maximum.accumulate(t) if len(t) else t
    return fixed, int((fixed != t).sum())


_DENSE = 1 << 22  # ids below this are counted in a table, not sorted


def _dense_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values ascending, index of each value among them): np.unique without a sort
    when the values are small non-negative ids, as kinds and label ids are, or such ids and
    folded stacks' ids (``_VIRTUAL_IDS`` up), as the ``detail`` column holds."""
    if len(values) and int(values.max()) < _DENSE:
        return _counted(values)
    if len(values) > 4096 and int(values.min()) >= 0 and values.dtype != np.uint64:  # (a sort costs less for few)
        if values.dtype.kind == "u":  # u4 label ids: numpy refuses an ``initial`` below (1 << 33, -1) out of u4
            values = values.astype(np.int64)
        high = values >= _DENSE  # no copies of the values but one: a ring may hold a million rows
        if int(np.min(values, where=high, initial=_VIRTUAL_IDS)) >= _VIRTUAL_IDS and int(values.max()) < (
            _VIRTUAL_IDS + _DENSE
        ):
            top = int(np.max(values, where=~high, initial=-1)) + 1  # the high ids go just above the low ones
            shift = _VIRTUAL_IDS - top
            shifted = values.copy()
            np.subtract(shifted, shift, out=shifted, where=high)  # the same order, all below 2 * _DENSE
            uniq, codes = _counted(shifted)
            return np.where(uniq >= top, uniq + shift, uniq), codes
    uniq, inverse = np.unique(values, return_inverse=True)
    return uniq, inverse.astype(np.int32)


def _counted(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    present = np.bincount(values, minlength=1) > 0
    uniq = np.flatnonzero(present)
    position = (np.cumsum(present) - 1).astype(np.int32)
    return uniq, position[values]


def _labels(ids: np.ndarray, strings: dict[int, str], cut: bool = False) -> tuple[pa.Array, int]:
    """Dictionary-encoded labels; ids whose string is missing become a placeholder (``cut``: the string
    region was not read to its end)."""
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
            words.append(strings.get(sid, LABEL_CUT.format(sid) if cut else f"<blackbox: label #{sid} lost>"))
    dictionary = _dictionary(tuple(w if w is not None else "" for w in words))
    valid = indices != 0 if len(uniq) and uniq[0] == 0 else np.ones(len(indices), bool)
    arr = pa.DictionaryArray.from_arrays(masked(indices, valid, pa.int32()), dictionary)
    return arr, lost


def _kinds(codes: np.ndarray) -> pa.Array:
    uniq, indices = _dense_codes(codes)
    dictionary = _dictionary(tuple(fmt.kind_name(int(c)) for c in uniq.tolist()))
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)


def _constant(value: Any, n: int, typ: pa.DataType) -> pa.Array:
    if value is None:
        return nulls(n, typ)
    return pa.array(np.full(n, value), typ)


def _const_str(value: str | None, n: int) -> pa.Array:
    if value is None:
        return nulls(n, _DICT_STR)
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), _dictionary((value,)))


_DICTIONARIES: dict[tuple[str, ...], pa.Array] = {}
_DICTIONARY_TEXT = 4096  # dictionaries of at most this many characters are kept, at most _DICTIONARY_COUNT of them
_DICTIONARY_COUNT = 1024


def _dictionary(words: tuple[str, ...]) -> pa.Array:
    """A string array of ``words``, one array for every ring with the same small dictionary (kinds, a host, a
    few labels): building it costs more than the rest of a tiny ring's column. Arrow arrays are immutable."""
    held = _DICTIONARIES.get(words)
    if held is None:
        held = pa.array(words, pa.string())
        if len(_DICTIONARIES) < _DICTIONARY_COUNT and sum(map(len, words)) <= _DICTIONARY_TEXT:
            _DICTIONARIES[words] = held
    return held


def ring_table(ring: Ring, *, release: bool = False) -> pa.Table:
    """The timeline of one ring, one row per valid record, in seq order.

    Updates ``ring.recovery.labels_lost`` and ``time_clamped`` as it goes. ``release``: drop the ring's
    records (``Ring.release``) as soon as their columns are taken, so a big ring is not held twice.
    """
    n = ring.count
    r = columns.fields(ring.words)
    if release:
        ring.release()
    with ThreadPoolExecutor(1, "blackbox-table") if n >= _BESIDE_ROWS else contextlib.nullcontext() as beside:
        return _table(ring, r, n, beside)


# A ring of at least this many records has its payload columns made on a thread of their own, beside the
# others (numpy's loops let go of the GIL): a full ring's ring_table on the 2-vCPU VM, medians of 9: 57 ms to 42-46 ms
_BESIDE_ROWS = 1 << 16


def _table(ring: Ring, r: dict[str, np.ndarray], n: int, beside: ThreadPoolExecutor | None) -> pa.Table:
    """``ring_table``'s columns; the payload's on ``beside`` where given, else made here after the others."""
    ident = ring.meta.get("identity") or {}
    cut = ring.strings_cut > 0
    allocs = _alloc_stacks(r, ring.stacks) if ring.header.version >= 4 else None
    stack_rows = np.flatnonzero(r["kind"] == _KIND_STACK_SAMPLE) if ring.header.version >= 3 else np.zeros(0, int)
    folded_stacks = _stacks(r, stack_rows, ring.stacks)
    details = folded_stacks if allocs is None else _joined(folded_stacks, allocs[0], allocs[1], allocs[2])
    payload_of = (r, ring.header.version, ring.strings, details, cut)
    payload: Future[dict[str, pa.Array]] | None = None
    if beside is not None:
        with contextlib.suppress(RuntimeError):  # the interpreter is shutting down (an atexit hook): made here
            payload = beside.submit(_payload, *payload_of)
    times, clamped = ring_times(ring, r["time"])
    labels, lost = _labels(*_alloc_labels(r["label"], ring.strings, allocs), cut)
    ring.recovery.time_clamped = clamped
    ring.recovery.labels_lost = lost
    has_value = (r["flags"] & fmt.FLAG_VALUE) != 0
    step = _step_in_force(r["kind"], r["step"]) if ring.header.version >= 3 else r["step"]
    device = r["device"]
    thread = r["thread"]
    if len(stack_rows):  # the sampled thread, not the sampler's
        thread = thread.copy()
        thread[stack_rows] = r["p0"][stack_rows]
    cols: dict[str, pa.Array] = {
        "seq": pa.array(r["seq"], pa.uint64()),
        "time": pa.array(times, pa.timestamp("ns", tz="UTC")),
        "kind": _kinds(r["kind"]),
        "label": labels,
        "value": masked(r["value"], has_value, pa.int64()),
        "step": masked(step, step >= 0, pa.int64()),
        "thread": pa.array(thread, pa.uint64()),
        "pid": _constant(_int_or_none(ident.get("pid")), n, pa.int64()),
        "rank": _constant(_int_or_none(ident.get("rank")), n, pa.int32()),
        "host": _const_str(_str_or_none(ident.get("host")), n),
        "device": masked(device, device >= 0, pa.int16()),
    }
    cols.update(_oom_figures(r["kind"], labels))
    cols["stack"] = stack_in_force(r["kind"], folded_stacks)
    cols["job"] = _const_str(_str_or_none(ident.get("job")), n)
    cols.update(payload.result() if payload is not None else _payload(*payload_of))
    return pa.Table.from_arrays([cols[name] for name in _NAMES], schema=TIMELINE_SCHEMA)  # (from_pydict: 2x the cost)


def _step_in_force(kinds: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Steps, with a signal's and an allocation sample's filled in from the record before it: the signal
    handler and the allocation hooks cannot read the step."""
    signals = _IS_NO_STEP[kinds]  # a lookup by the u1 code: np.isin costs more on a small ring
    if not (signals & (step < 0)).any():
        return step
    index = np.arange(len(step))
    before = np.maximum.accumulate(np.where(signals, -1, index))
    filled = step.copy()
    fill = signals & (step < 0) & (before >= 0)
    filled[fill] = step[before[fill]]
    return filled


def _stacks(
    r: dict[str, np.ndarray], rows: np.ndarray, table: StackScan | None
) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """(rows, a string id per row, id -> text): the folded stack (outermost frame first, ``;``-joined)
    of each stack_sample row, each distinct one resolved once, the most sampled first, while their text
    stays within MAX_FOLDED_TEXT (the rest: ``STACK_NOT_RENDERED``, naming its id); the ids lie above any
    u4 string id."""
    if not len(rows):
        return rows, np.zeros(0, np.int64), {}
    keys = (r["p2"][rows].astype(np.uint64) << np.uint64(32)) | (
        r["p1"][rows].astype(np.uint64) & np.uint64(0xFFFFFFFF)
    )
    uniq, inverse = np.unique(keys, return_inverse=True)
    # a depth past the cap reads like the cap plus one (the "outer frames cut" marker), one below 0 like 0
    depth = np.clip(r["p3"].view(np.int64)[rows], 0, fmt.MAX_STACK_DEPTH + 1)
    pairs, inverse, counts = np.unique(
        inverse.ravel().astype(np.int64) * (fmt.MAX_STACK_DEPTH + 2) + depth, return_inverse=True, return_counts=True
    )
    ids: dict[str, int] = {}
    per_pair = np.zeros(len(pairs), np.int64)
    budget = MAX_FOLDED_TEXT
    for i in np.argsort(-counts, kind="stable").tolist():
        pair = int(pairs[i])
        key, d = int(uniq[pair // (fmt.MAX_STACK_DEPTH + 2)]), pair % (fmt.MAX_STACK_DEPTH + 2)
        gen, sid = key >> 32, key & 0xFFFFFFFF
        text = folded(table, gen, sid, d, budget)
        if text is None:
            text = STACK_NOT_RENDERED.format(gen, sid)
        elif text not in ids:
            budget -= len(text) if text.isascii() else 4 * len(text)  # its bytes in UTF-8, at most
        per_pair[i] = ids.setdefault(text, _VIRTUAL_IDS + len(ids))
    return rows, per_pair[inverse.ravel()], {v: k for k, v in ids.items()}


def _alloc_stacks(r: dict[str, np.ndarray], table: StackScan | None) -> tuple[np.ndarray, np.ndarray, dict[int, str],
                                                                             dict[int, str]] | None:  # fmt: skip
    """(rows, a string id per row, id -> folded stack, id -> thread name) of the alloc_sample and free_sample
    rows, each distinct fingerprint resolved once (ids above the stack samples' virtual ids)."""
    rows = np.flatnonzero(_IS_ALLOC[r["kind"]])
    if not len(rows):
        return None
    uniq, inverse, counts = np.unique(r["p2"][rows].view(np.uint64), return_inverse=True, return_counts=True)
    texts: dict[int, str] = {}
    names: dict[int, str] = {}
    fingerprints = uniq.tolist()
    resolved = alloc_stacks(table, [fingerprints[i] for i in np.argsort(-counts, kind="stable").tolist()])
    ids: dict[tuple[str, str], int] = {}  # one id per distinct text: a million unwritten stacks are one
    per_fingerprint = np.empty(len(fingerprints), np.int64)
    for i, fingerprint in enumerate(fingerprints):
        found = resolved[int(fingerprint)]
        per_fingerprint[i] = at = ids.setdefault((found.folded, found.thread), 2 * _VIRTUAL_IDS + len(ids))
        texts[at] = found.folded
        names[at] = found.thread
    return rows, per_fingerprint[inverse.ravel()], texts, names


def _alloc_labels(ids: np.ndarray, strings: dict[int, str], allocs: tuple[Any, ...] | None
                  ) -> tuple[np.ndarray, dict[int, str]]:  # fmt: skip
    """Label ids and strings, an allocation sample labelled with its thread's name where known."""
    if allocs is None:
        return ids, strings
    rows, row_ids, _, names = allocs
    out = ids.astype(np.int64)
    named = np.array([bool(names[i]) for i in row_ids.tolist()], bool)
    out[rows[named]] = row_ids[named]
    return out, {**strings, **{k: v for k, v in names.items() if v}}


def _joined(stacks: tuple[np.ndarray, np.ndarray, dict[int, str]], rows: np.ndarray, ids: np.ndarray,
            texts: dict[int, str]) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:  # fmt: skip
    """The ``detail`` texts of stack samples and of allocation samples, as one (rows, ids, texts)."""
    return np.concatenate([stacks[0], rows]), np.concatenate([stacks[1], ids]), {**stacks[2], **texts}


def stack_in_force(kinds: np.ndarray, stacks: tuple[np.ndarray, np.ndarray, dict[int, str]]) -> pa.Array:
    """The ``stack`` column: on each memory sample (``sample``, ``gpu_sample``, ``cgroup_sample``,
    ``child_sample``), the folded stack of the first thread sampled in the same sampler tick (the
    main thread while it runs). A tick writes its stack samples just before its ``sample`` and its
    other memory records just after, so a tick is the run of rows up to and including one ``sample``
    (its stacks) and the rows after it (its other figures). ``stacks``: ``_stacks``'s rows, string
    ids and texts."""
    rows, ids, texts = stacks
    n = len(kinds)
    if not len(rows):
        return nulls(n, _DICT_STR)
    tick = np.cumsum(kinds == _KIND_SAMPLE)  # at or after the k-th sample: k
    ticks, first = np.unique(tick[rows] + 1, return_index=True)  # a stack sample precedes its tick's sample
    memory = np.flatnonzero(_IS_MEMORY[kinds])
    pos = np.minimum(np.searchsorted(ticks, tick[memory]), len(ticks) - 1)
    found = ticks[pos] == tick[memory]
    uniq, local = np.unique(ids[first[pos[found]]], return_inverse=True)
    index = np.zeros(n, np.int32)
    valid = np.zeros(n, bool)
    index[memory[found]] = local.ravel()
    valid[memory[found]] = True
    words = pa.array([texts[int(u)] for u in uniq.tolist()], pa.string())
    return pa.DictionaryArray.from_arrays(masked(index, valid, pa.int32()), words)


def folded(table: StackScan | None, gen: int, sid: int, depth: int, budget: int | None = None) -> str | None:
    """One stack as ``outer (file:line);...;inner (file:line)``, from the ring's stack table; None where
    its text would take more than ``budget`` bytes (UTF-8), which is then not built."""
    frames = table.stacks.get((gen, sid)) if table is not None else None
    if frames is None:
        return STACK_LOST
    names = [table.frames.get((gen, f), FRAME_LOST) for f in frames] if table is not None else []
    if depth > len(names):
        names.insert(0, fmt.STACK_TRUNCATED_TEXT)
    if budget is not None and sum(len(n) if n.isascii() else 4 * len(n) for n in names) + len(names) > budget:
        return None
    return ";".join(names)


def _payload(
    r: dict[str, np.ndarray],
    version: int,
    strings: dict[int, str],
    stacks: tuple[np.ndarray, np.ndarray, dict[int, str]],
    cut: bool = False,
) -> dict[str, pa.Array]:
    """Payload words to columns: each kind fills the columns its layout names, others are null.
    ``stacks``: the folded stack of each stack_sample row, which fills its ``detail``.

    Memory: a column fed by one word of every kind that has it shares that word's array (its other
    rows are masked as null, not copied); the columns no kind fills share one all-null array."""
    n = len(r["kind"])
    sources: dict[str, list[tuple[np.ndarray, int]]] = {}  # column -> (rows of a kind, its word) per kind
    texts: dict[str, list[tuple[np.ndarray, int]]] = {}  # text column -> (rows, first word) per kind
    present = np.bincount(r["kind"], minlength=256)  # the kinds a ring holds: no pass for the others
    for code, words in fmt.payload_columns(version).items():
        if not present[code]:
            continue
        mask = r["kind"] == code  # a kind of few rows is read at its rows alone (its words' other pages: zero)
        rows = np.flatnonzero(mask) if present[code] * 8 < n else mask
        for i, name in enumerate(words):
            if name is None or name in fmt.RESOLVED_WORDS:
                continue
            if name in fmt.TEXT_COLUMNS:
                if i == 0 or words[i - 1] != name:
                    texts.setdefault(name, []).append((rows, i))
                continue
            sources.setdefault(name, []).append((rows, i))
    detail = _word_column(r, n, sources.get("detail", []), string=True)
    stack_rows, stack_ids, stack_texts = stacks
    if len(stack_rows):
        strings = {**strings, **stack_texts}
        values, present = detail if detail is not None else (np.zeros(n, np.int64), np.zeros(n, bool))
        values, present = values.copy(), present.copy()
        values[stack_rows], present[stack_rows] = stack_ids, True
        detail = values, present
    null_ints, null_strings = nulls(n, pa.int64()), nulls(n, _DICT_STR)  # shared by every empty column
    out: dict[str, pa.Array] = {}
    for name in fmt.PAYLOAD_COLUMN_ORDER:
        if name in fmt.TEXT_COLUMNS:
            out[name] = _text_column(r, n, texts[name]) if name in texts else null_strings
        elif name in fmt.STRING_COLUMNS:
            ids = detail if name == "detail" else _word_column(r, n, sources.get(name, []), string=True)
            out[name] = _strings_column(*ids, strings, cut) if ids is not None else null_strings
        elif name in fmt.CODED_COLUMNS:
            column = _word_column(r, n, sources.get(name, []))
            out[name] = _coded(column, fmt.CODED_COLUMNS[name]) if column is not None else null_strings
        else:
            column = _word_column(r, n, sources.get(name, []))
            out[name] = masked(*column, pa.int64()) if column is not None else null_ints
    return out


def _word_column(
    r: dict[str, np.ndarray], n: int, sources: list[tuple[np.ndarray, int]], string: bool = False
) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, present) of a payload column fed by (rows, word) per kind; None if no row has it. The
    values are the word's own array where one word feeds every kind (Arrow then shares it)."""
    if not sources:
        return None
    words = {i for _, i in sources}
    values = r[f"p{sources[0][1]}"].view(np.int64)
    if len(words) > 1:
        values = np.zeros(n, np.int64)
        for rows, i in sources:
            values[rows] = r[f"p{i}"].view(np.int64)[rows]
    present = np.zeros(n, bool)
    for rows, i in sources:  # ``rows``: a mask, or the row numbers of a kind of few rows
        w = r[f"p{i}"].view(np.int64)[rows]
        present[rows] |= (w > 0) if string else (w >= 0)
    return values, present


def _text_column(r: dict[str, np.ndarray], n: int, spans: list[tuple[np.ndarray, int]]) -> pa.Array:
    """Text stored in two consecutive payload words (zero padded UTF-8); null where unset (zero, or
    the -1 of "not measured"). Each distinct text is decoded once."""
    indices, valid = np.zeros(n, np.int32), np.zeros(n, bool)
    words: dict[str, int] = {}
    for rows, first in spans:
        at = np.flatnonzero(rows) if rows.dtype == bool else rows
        pair = np.stack([r[f"p{first}"][at], r[f"p{first + 1}"][at]], axis=1).astype(np.int64)
        uniq, inverse = np.unique(pair.view("S16").ravel(), return_inverse=True)  # S16 drops the zero padding
        codes = np.asarray(
            [-1 if not t or t == b"\xff" * len(t) else words.setdefault(t.decode("utf-8", "replace"), len(words))
             for t in uniq.tolist()], np.int64)[inverse.ravel()]  # fmt: skip
        indices[at], valid[at] = np.maximum(codes, 0), codes >= 0
    dictionary = pa.array(list(words), pa.string())
    return pa.DictionaryArray.from_arrays(masked(indices, valid, pa.int32()), dictionary)


def _coded(column: tuple[np.ndarray, np.ndarray], names: dict[int, str]) -> pa.Array:
    """A coded payload column as its names (an unknown code as ``code_<n>``)."""
    values, present = column
    uniq, inverse = np.unique(np.where(present, values, 0), return_inverse=True)
    words = [names.get(int(u), f"code_{int(u)}") for u in uniq.tolist()]
    indices = masked(inverse.ravel().astype(np.int32), present, pa.int32())
    return pa.DictionaryArray.from_arrays(indices, pa.array(words))


def _strings_column(ids: np.ndarray, present: np.ndarray, strings: dict[int, str], cut: bool) -> pa.Array:
    ids = np.where(present, ids, 0).astype(np.int64)
    arr, _ = _labels(ids, strings, cut)
    return arr


def _oom_figures(kinds: np.ndarray, labels: pa.Array) -> dict[str, pa.Array]:
    """OOM_COLUMNS from the messages of ``oom`` events (parsed once per distinct message)."""
    n = len(kinds)
    rows = np.flatnonzero(kinds == fmt.KIND_CODES["oom"])
    if not len(rows):
        return dict.fromkeys(OOM_COLUMNS, nulls(n, pa.int64()))  # one array for the six columns
    out = {c: np.zeros(n, np.int64) for c in OOM_COLUMNS}
    valid = {c: np.zeros(n, bool) for c in OOM_COLUMNS}
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
    return {c: masked(out[c], valid[c], pa.int64()) for c in OOM_COLUMNS}


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


def stamps_ns(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A timestamp column (never null in a timeline) as int64 nanoseconds: numpy's datetime64 viewed
    as int64, zero-copy for one chunk (a cast kernel costs 7 us a call, a tiny ring's diagnosis makes a dozen)."""
    stamps: np.ndarray = column.to_numpy().view(np.int64)
    return stamps


def py_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows as dicts, timestamps as ISO-8601 strings. pyarrow turns a nanosecond timestamp into a
    Python value only through pandas, which a plain install does not have."""
    if not table.num_rows:
        return []
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            stamps = [s for chunk in table.column(i).chunks for s in chunk.view(pa.int64()).to_pylist()]
            table = table.set_column(i, field.name, pa.array([iso_ns(s) for s in stamps], pa.string()))
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows
