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

from ._errors import BundleDestinationError, one_line
from .recovery.bundle import PLOT, SUMMARY, Reader, stream_bundle, write_job_bundle
from .recovery.job import JobPass
from .recovery.pipeline import RecoveryPass
from .views.summary import bundle_summary, job_summary

PLOT_ALL_UP_TO = 32  # rings drawn together in memory.png; beyond, the first death's ring alone


def _views(meta: dict[str, Any], read: Reader, *, plot: bool) -> dict[str, bytes]:
    files = {SUMMARY: bundle_summary(meta).encode("utf-8")}
    if plot and importlib.util.find_spec("matplotlib") is not None:
        from .views.plot import MAX_SAMPLE_ROWS, PLOT_COLUMNS, PLOT_KINDS, memory_figure

        rings = meta.get("rings") or []
        first = meta.get("first_death")
        pick: list[tuple[str, str, Any]] = [("kind", "in", PLOT_KINDS)]
        if len(rings) > PLOT_ALL_UP_TO:
            who = first or min(rings, key=lambda m: (m.get("rank") is None, m.get("rank") or 0))
            pick += [("pid", "=", who.get("pid")), ("host", "=", who.get("host"))]
        buf = io.BytesIO()
        memory_figure(read(pick, PLOT_COLUMNS, MAX_SAMPLE_ROWS), meta).savefig(buf, format="png", dpi=110)
        files[PLOT] = buf.getvalue()
    return files


def write_postmortem(
    inputs: list[Path],
    out: str | os.PathLike[str],
    exit_status: int | None = None,
    *,
    plot: bool = True,
    launcher_pid: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Recover every ring named (files, or folders of ``*.ring``) into the bundle ``out`` (a folder
    or a pyarrow filesystem URI), a ring at a time; returns the metadata written.

    ``exit_status``: how the job ended, where the caller saw it (``blackbox run``, whose pid is
    ``launcher_pid``).
    ``plot``: also render memory.png when matplotlib is installed.
    ``extra``: fields added to the bundle's metadata (``blackbox run``: ``left_running``).
    """
    recovery = RecoveryPass(inputs, exit_status, launcher_pid, extra)
    return stream_bundle(recovery, out, lambda meta, read: _views(meta, read, plot=plot))


def printable(text: str) -> str:
    """Markdown with every control character but newlines escaped (names from other users' bundles
    reach a terminal)."""
    return "\n".join(one_line(line) for line in text.split("\n"))


def job_account(targets: list[str]) -> tuple[JobPass, dict[str, Any], str]:
    """Read the node bundles under ``targets`` (bundle folders, folders of bundles, URI prefixes):
    (the pass, the job's metadata, its summary.md)."""
    job = JobPass(targets)
    meta = job.finish()
    rows = job.rows()
    try:
        text = job_summary(meta, rows, job.first_death_ring(meta))
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError):
        # the first death's own account, read as its bundle wrote it, has fields of the wrong type
        text = job_summary(meta, rows, None)
    return job, meta, printable(text)


def write_job(targets: list[str], out: str | os.PathLike[str]) -> dict[str, Any]:
    """The job-wide bundle of the node bundles under ``targets`` into ``out`` (a folder or a URI):
    ranks.parquet (every host's rows), summary.md and metadata.json; returns the metadata."""
    job, meta, summary = job_account(targets)
    where = os.fspath(out)
    key = where.rstrip("/") if "://" in where else os.path.realpath(where)
    for place in job.places:
        read = str(place).rstrip("/") if place.fs is not None else os.path.realpath(str(place))
        if key == read or read.startswith(key.rstrip("/") + "/"):
            raise BundleDestinationError(f"{where}: expected a new place for the job's bundle, found {read}, "
                                         "a bundle it reads (it would be replaced)")  # fmt: skip
    write_job_bundle(out, job.ranks(), meta, {SUMMARY: summary.encode("utf-8")})
    return meta
