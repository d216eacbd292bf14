"""A post-mortem bundle from rings: the recovery pass, the views, then the one bundle writer.

This is where the stages meet, above all of them: ``recovery.pipeline`` reads and
diagnoses, ``views`` render the summary and the picture, ``recovery.bundle``
writes. ``blackbox.recover()``, ``blackbox recover``, ``blackbox run`` and the
demo all come through here.
"""

from __future__ import annotations

import importlib.util
import io
import os
from pathlib import Path
from typing import Any

from .recovery.bundle import PLOT, SUMMARY, write_bundle
from .recovery.pipeline import Recovered, recover_rings
from .views.summary import bundle_summary


def render(recovered: Recovered, *, plot: bool = True) -> dict[str, bytes]:
    """The views a bundle carries, by file name: summary.md, and memory.png where matplotlib is installed."""
    files = {SUMMARY: bundle_summary(recovered.meta).encode("utf-8")}
    if plot and importlib.util.find_spec("matplotlib") is not None:
        from .views.plot import memory_figure

        buf = io.BytesIO()
        memory_figure(recovered.table, recovered.meta).savefig(buf, format="png", dpi=110)
        files[PLOT] = buf.getvalue()
    return files


def write_postmortem(
    inputs: list[Path], out: str | os.PathLike[str], exit_status: int | None = None, *, plot: bool = True
) -> dict[str, Any]:
    """Recover every ring named (files, or folders of ``*.ring``) into the bundle ``out`` (a folder
    or a pyarrow filesystem URI); returns the metadata written.

    ``exit_status``: how the job ended, where the caller saw it (``blackbox run``).
    ``plot``: also render memory.png when matplotlib is installed.
    """
    recovered = recover_rings(inputs, exit_status)
    write_bundle(recovered, out, render(recovered, plot=plot))
    return recovered.meta
