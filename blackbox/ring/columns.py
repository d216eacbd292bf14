"""A ring's valid records held column-major: one row of 64-bit words per word of a slot.

The reader writes each chunk of slots into this layout as it reads them (a transposed copy), so the
timeline takes every field as a contiguous array without a second copy of the ring: a full 128 MiB
ring is held once, not as records and then as columns. The commit word is not kept: the reader
only keeps a slot whose commit word equals its seq.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import format as fmt

WIDTH = fmt.RECORD_SIZE // 8 - 1  # the words of a slot kept: all but the last, the commit word
_FIELDS: dict[str, Any] = {name: spec for name, spec in (fmt.RECORD_DTYPE.fields or {}).items() if name != "commit"}
_BLOCK = 8192  # slots transposed at a time (cache-sized blocks: a strided pass per word costs twice as much)


def empty(n: int) -> np.ndarray:
    """Room for ``n`` records' words."""
    return np.empty((WIDTH, n), np.uint64)


def put(words: np.ndarray, at: int, slots: np.ndarray) -> None:
    """Write ``slots`` (rows of a slot's 16 words) into ``words`` from record ``at`` on."""
    for lo in range(0, len(slots), _BLOCK):
        block = slots[lo : lo + _BLOCK, :WIDTH]
        words[:, at + lo : at + lo + len(block)] = block.T


def field(words: np.ndarray, name: str) -> np.ndarray:
    """One record field of every record, as a contiguous array of its dtype."""
    dt, offset, *_ = _FIELDS[name]
    row = words[offset // 8]
    if dt.itemsize == 8:
        out: np.ndarray = row.view(dt)
        return out
    word = np.dtype({"names": [name], "formats": [dt], "offsets": [offset % 8], "itemsize": 8})
    return np.ascontiguousarray(np.ascontiguousarray(row).view(word)[name])


def fields(words: np.ndarray) -> dict[str, np.ndarray]:
    """Every record field (but commit) by name."""
    return {name: field(words, name) for name in _FIELDS}


def records(words: np.ndarray) -> np.ndarray:
    """The records as the ring's structured dtype (a copy; its commit words equal the seqs)."""
    n = words.shape[1]
    out = np.empty(n, fmt.RECORD_DTYPE)
    rows = out.view("<u8").reshape(n, WIDTH + 1)
    rows[:, :WIDTH] = words.T
    rows[:, WIDTH] = words[int(_FIELDS["seq"][1]) // 8]
    return out
