"""The bundle's tables tell pandas to read their integer columns as pandas' nullable integers.

Read plainly, pandas turns an integer column holding a null (``step`` before the
first step, ``rank`` outside a launcher, ``last_step`` of a ring with none) into
float64: missing values become NaN and large values lose precision. pyarrow's
``to_pandas`` (hence ``pd.read_parquet``) follows the ``pandas`` entry of a
file's schema metadata, the entry pandas itself writes; naming ``Int64``,
``Int32``... there makes every integer column arrive as that nullable dtype
(``<NA>`` where missing), with no ``dtype_backend`` to pass. Other readers
(DuckDB, Polars, Arrow) ignore the entry.
"""

from __future__ import annotations

import json

import pyarrow as pa

PANDAS_KEY = b"pandas"


def _nullable_name(t: pa.DataType) -> str:
    """int64 -> Int64, uint16 -> UInt16: pandas' nullable dtype of an Arrow integer type."""
    name = str(t)
    return "UI" + name[2:] if name.startswith("uint") else "I" + name[1:]


def with_nullable_ints(schema: pa.Schema) -> pa.Schema:
    """``schema`` with a ``pandas`` metadata entry naming a nullable dtype for each integer column."""
    columns = [
        {"name": f.name, "field_name": f.name, "pandas_type": str(f.type), "numpy_type": _nullable_name(f.type),
         "metadata": None}
        for f in schema
        if pa.types.is_integer(f.type)
    ]  # fmt: skip
    meta = {"index_columns": [], "column_indexes": [], "columns": columns, "creator": {"library": "blackbox"}}
    return schema.with_metadata({**(schema.metadata or {}), PANDAS_KEY: json.dumps(meta).encode()})
