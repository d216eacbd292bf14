"""The recovery pass: rings in, one timeline and one metadata document out. Writes nothing.

One direction, each step once: read every ring, build its timeline, gather the
evidence outside it (the kernel log is scanned once for all rings), diagnose
the death, assemble the metadata; then merge the rings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..ring.folded import read_folded
from ..ring.reader import find_rings, read_ring
from .diagnosis import diagnose
from .evidence import gather, kernel_oom_kills
from .metadata import bundle_metadata, helper_groups, ring_metadata
from .timeline import merge_tables, ring_table


@dataclass
class Recovered:
    """What a recovery found: the merged timeline, the metadata, and the text files beside them."""

    table: pa.Table
    meta: dict[str, Any]
    files: dict[str, str]  # bundle file name -> text (a native crash's tracebacks, per ring)


def recover_rings(inputs: list[Path], exit_status: int | None = None) -> Recovered:
    """Read and diagnose every ring named (ring files, or folders of ``*.ring``).

    ``exit_status``: how the job ended, where the caller saw it (``blackbox run``); it
    belongs to a single ring only, so with several rings it is not used per ring.
    """
    rings = [read_ring(p) for p in find_rings(inputs)]
    folded = [entry for p in inputs if p.is_dir() for entry in read_folded(p)]
    pids = {p for r in rings if isinstance(p := (r.meta.get("identity") or {}).get("pid"), int)}
    kernel = kernel_oom_kills(pids)  # one pass over the kernel log for every ring
    status = exit_status if len(rings) == 1 else None
    tables, metas, files = [], [], {}
    for ring in rings:
        table = ring_table(ring)
        evidence = gather(ring.path, ring.meta, status, kernel, ring.crash)
        meta = ring_metadata(ring, table, evidence, diagnose(table, ring.clean, evidence))
        if evidence.crash is not None and meta["native_crash"]:
            files[meta["native_crash"]["file"]] = evidence.crash
        tables.append(table)
        metas.append(meta)
    meta = bundle_metadata(metas)
    if folded:
        meta["helpers"] = helper_groups(folded)
    return Recovered(merge_tables(tables), meta, files)
