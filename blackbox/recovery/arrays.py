"""Arrow arrays from numpy without a pass over the rows where none is needed: a column with some rows
null, and a column with every row null.

A 1 M-row ring's timeline has about 50 such columns. ``pa.array(values, mask=...)`` walks the rows
to turn numpy's mask into Arrow's bitmap (1.3 ms a column of a million rows); numpy packs the same
bitmap in 0.07 ms. ``pa.nulls`` writes its zeroed values (8 MB for a million int64), 30 to 80 ms a
column in a recovery that has just made its memory; the values of a null row are never read (the
Parquet writer skips them), so here they are zero pages the kernel maps on demand.
"""

from __future__ import annotations

import mmap

import numpy as np
import pyarrow as pa

_MAPPED = 1 << 20  # buffers of at least this many bytes are zero pages of a mapping of their own
_FEW = 4096  # rows below which pyarrow's own calls cost less (3 rows: pa.nulls 2.7 us, pa.array's mask 7.7 us)


def _zeros(nbytes: int) -> pa.Buffer:
    """``nbytes`` zero bytes, untouched: a private anonymous mapping's pages cost nothing until read
    (calloc would clear them where the allocator reuses its memory), unmapped with the last array."""
    if nbytes < _MAPPED:
        return pa.py_buffer(np.zeros(max(nbytes, 1), np.uint8))
    return pa.py_buffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))


def nulls(n: int, typ: pa.DataType) -> pa.Array:
    """``n`` null rows of ``typ`` (a fixed-width type, or a dictionary of strings with an integer index):
    equal to ``pa.nulls(n, typ)``, which makes a small one."""
    if n * 8 < _MAPPED:
        return pa.nulls(n, typ)
    if pa.types.is_dictionary(typ):
        return pa.DictionaryArray.from_arrays(nulls(n, typ.index_type), pa.array([], typ.value_type))
    bitmap = _zeros((n + 7) // 8)
    return pa.Array.from_buffers(typ, n, [bitmap, _zeros(n * typ.bit_width // 8)], null_count=n)


def _numpy_int(typ: pa.DataType) -> np.dtype | None:
    """The numpy dtype of an Arrow integer type (None for others). Not ``to_pandas_dtype``: that asks
    whether pandas is there, and a command's own process keeps pandas out (``cli._common.skip_pandas``)."""
    if not pa.types.is_integer(typ):
        return None
    return np.dtype(f"{'i' if pa.types.is_signed_integer(typ) else 'u'}{typ.bit_width // 8}")


def masked(values: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    """``values`` where ``valid``, null elsewhere: equal to ``pa.array(values, typ, mask=~valid)``. The
    values' buffer is shared where its numpy type is the Arrow type's (a cast otherwise, as pa.array
    would make it), and the bitmap is packed by numpy."""
    if len(values) < _FEW or values.dtype != _numpy_int(typ) or not values.flags.c_contiguous or values.ndim != 1:
        return pa.array(values, typ, mask=~valid)
    if valid.all():  # no bitmap, as pa.array makes none where no row is null
        return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)], null_count=0)
    bitmap = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(typ, len(values), [pa.py_buffer(bitmap), pa.py_buffer(values)])
