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
import shlex
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from ._errors import BundleDestinationError, one_line
from ._warn import warn
from .recovery.bundle import PLOT, SUMMARY, Destination, Reader, stream_bundle, write_job_bundle
from .recovery.job import JobPass
from .recovery.pipeline import RecoveryPass
from .ring.inputs import Folder
from .views.plot_warm import PlotWarmer
from .views.summary import bundle_summary, job_summary


def _views(meta: dict[str, Any], read: Reader, *, warmer: PlotWarmer | None) -> dict[str, bytes]:
    """summary.md and (``warmer``: matplotlib is installed and a plot wanted) memory.png."""
    files = {SUMMARY: bundle_summary(meta).encode("utf-8")}
    if warmer is not None:
        warmer.wait()  # matplotlib ready, and no longer used by its thread
        from .views.plot import MAX_SAMPLE_ROWS, PLOT_COLUMNS, PLOT_KINDS, drawn_process, memory_figure

        pick: list[tuple[str, str, Any]] = [("kind", "in", PLOT_KINDS)]
        who = drawn_process(meta)  # a job of many processes: one of them
        if who is not None:
            pick += [("pid", "=", who.get("pid")), ("host", "=", who.get("host"))]
        buf = io.BytesIO()
        try:
            memory_figure(read(pick, PLOT_COLUMNS, MAX_SAMPLE_ROWS), meta).savefig(buf, format="png", dpi=110)
        except Exception as e:  # noqa: BLE001 (a picture is never worth the bundle: the rest is written, this said)
            warn(f"memory.png not drawn, the rest of the bundle written: {one_line(f'{type(e).__name__}: {e}')[:300]}")
        else:
            files[PLOT] = buf.getvalue()
    return files


def _verdict_views(meta: dict[str, Any], again: str) -> dict[str, bytes]:
    """summary.md of the verdict written first (no timeline yet), saying under its title that the rest
    follows, and the command that writes it (``again``) if it never does."""
    title, _, rest = bundle_summary(meta).partition("\n")
    note = (f"> **Verdict only.** Recovery writes this first; `timeline.parquet` and `memory.png` follow. "
            f"If this note is still here, it was cut short: `{again}` writes the whole bundle.")  # fmt: skip
    return {SUMMARY: f"{title}\n\n{note}\n{rest}".encode()}


def write_postmortem(
    inputs: Sequence[Path | Folder],
    out: str | os.PathLike[str],
    exit_status: int | None = None,
    *,
    plot: bool = True,
    launcher_pid: int | None = None,
    job_pid: int | None = None,
    extra: dict[str, Any] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    raw: bool = True,
    owners: Collection[int] | None = None,
    on_verdict: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Recover every ring named (files, or folders of ``*.ring``) into the bundle ``out`` (a folder
    or a pyarrow filesystem URI), a ring at a time, the verdict first; returns the metadata written.

    ``exit_status``: how the job ended, where the caller saw it (``blackbox run``, whose pid is
    ``launcher_pid``, and the pid of the process it started ``job_pid``).
    ``plot``: also render memory.png when matplotlib is installed.
    ``extra``: fields added to the bundle's metadata (``blackbox run``: ``left_running``).
    ``progress``: called with (rings done, rings in all, the ring) as each ring is diagnosed.
    ``raw``: also keep each ring read, zstd-compressed, in the bundle's ``rings/`` (within a cap).
    ``owners``: the only uids whose rings are read (Slurm's epilogue: the job's user).
    ``on_verdict``: called with the verdict's metadata once it is in place, before the rest is written.
    """
    recovery = RecoveryPass(inputs, exit_status, launcher_pid, extra, keep_raw=raw, owners=owners, job_pid=job_pid)
    recovery.progress = progress
    named = [shlex.quote(str(p)) for p in recovery.inputs[:3]] + (["..."] if len(inputs) > 3 else [])
    again = one_line(f"blackbox recover {' '.join(named)} -o {shlex.quote(os.fspath(out))}").replace("`", "'")
    # matplotlib readied beside the timeline's writing, once the verdict is out (views/plot_warm.py)
    warmer = PlotWarmer() if plot and importlib.util.find_spec("matplotlib") is not None else None

    def after_verdict(meta: dict[str, Any]) -> None:
        if warmer is not None:
            warmer.start()
        if on_verdict is not None:
            on_verdict(meta)

    try:
        return stream_bundle(
            recovery,
            out,
            lambda meta, read: _verdict_views(meta, again) if read is None else _views(meta, read, warmer=warmer),
            after_verdict=after_verdict,
        )
    finally:
        if warmer is not None:
            warmer.wait()


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
    kind, key = Destination(out).key()  # as the writer resolves it, not as it is spelled
    for place in job.places:
        if place.fs is None:
            read = ("local", os.path.realpath(str(place)))
        else:
            read = (place.fs.type_name, place.root.rstrip("/"))
        if read[0] == kind and (read[1] == key or read[1].startswith(f"{key.rstrip('/')}/")):
            raise BundleDestinationError(
                f"{where}: expected a new place for the job's bundle, found "
                f"{one_line(str(place))}, a bundle it reads (it would be replaced)"
            )
    write_job_bundle(out, job.ranks(), meta, {SUMMARY: summary.encode("utf-8")})
    return meta
