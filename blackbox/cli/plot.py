"""Plot the job's memory over time (its processes, its cgroup, its GPUs), with limits, steps and the
death marked, to a PNG."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import BlackboxError, RingNotFoundError, one_line
from ._common import own_process, run_rings, standalone, to_stdout, writing
from ._tty import progress

if TYPE_CHECKING:  # the command line loads no Arrow until a command reads rings or bundles
    import pyarrow as pa


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        nargs="+",
        metavar="BUNDLE|RING|DIR",
        help="a bundle; ring files or folders of rings (recovered in memory); a `blackbox run` folder (its "
        "bundle, or its rings while the job runs); folders of bundles (the first death's bundle)",
    )
    parser.add_argument("-o", "--out", default="memory.png", metavar="FILE",
                        help="PNG to write, - for standard output (default: memory.png)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    own_process()
    from ..views.plot import memory_figure

    with progress("recovering") as tick:
        table, meta, drawn = picture_source([str(t) for t in args.target], tick)
    figure = memory_figure(table, meta)
    if to_stdout(args.out):
        figure.savefig(sys.stdout.buffer, format="png", dpi=110)
        sys.stdout.buffer.flush()
        return 0
    with writing(args.out, "the picture"):
        figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out} ({drawn})")
    return 0


def picture_source(
    targets: list[str], progress: Callable[[int, int, str], None] | None = None
) -> tuple[pa.Table, dict[str, Any], str]:
    """(timeline, metadata, what it is) for what ``summary`` would describe of ``targets``: one bundle;
    rings recovered in memory; of several bundles (a folder of them, a run folder, a URI prefix), the
    one holding the first death; a run folder whose job has written no bundle yet, its rings. ``progress``
    is told of each ring recovered in memory."""
    from ..recovery.bundle import read_bundle
    from ..recovery.job import JobPass
    from ..recovery.locate import kind_of
    from ..recovery.pipeline import recover_rings
    from ..ring.inputs import open_named

    kind = kind_of(targets)
    if kind == "rings":
        return _rings(recover_rings([Path(t) for t in targets], progress=progress), "recovered in memory")
    if kind == "bundle":
        return (*_node_bundle(targets[0], read_bundle), f"the bundle {one_line(targets[0])}")
    try:
        job = JobPass(targets)
    except RingNotFoundError:
        live = [rings for rings in map(run_rings, targets) if rings is not None]
        if len(live) != len(targets):
            raise
        with contextlib.ExitStack() as stack:  # each run's rings/ opened once, never through a link
            held = [stack.enter_context(open_named(rings, follow=False)) for rings in live]
            recovered = recover_rings(held, progress=progress)  # a run folder whose job runs still: no bundle yet
        return _rings(recovered, f"in {', '.join(map(str, live))}: no bundle yet")
    if len(job.places) == 1:
        place = job.places[0]
        return (*_node_bundle(str(place), read_bundle, place), f"the bundle {one_line(str(place))}")
    meta = job.finish()
    first = meta.get("first_death")
    chosen = next((p for p in job.places if first and one_line(str(p)) == first.get("bundle")), None)
    if chosen is None:
        raise BlackboxError(
            f"{' '.join(map(one_line, targets))}: expected one bundle, or bundles with a death to draw, found "
            f"{len(job.places)} bundles and no death (name one: blackbox plot {one_line(str(job.places[0]))})"
        )
    bundle = str(chosen)
    return (*_node_bundle(bundle, read_bundle, chosen),
            f"the first death's bundle {one_line(bundle)}, of {len(job.places)}")  # fmt: skip


def _rings(recovered: Any, where: str) -> tuple[pa.Table, dict[str, Any], str]:
    """The rings' timeline as the bundle's memory.png draws it: of a job of many processes, one."""
    import pyarrow.compute as pc

    from ..views.plot import drawn_process

    table, meta = recovered.table, recovered.meta
    n = len(meta.get("rings") or [meta])
    drawn = f"{n} ring{'' if n == 1 else 's'} {where}"
    who = drawn_process(meta)
    if who is not None:
        table = table.filter(pc.equal(table["pid"], who.get("pid")))
        table = table.filter(pc.equal(table["host"].cast("string"), who.get("host")))
        drawn += f"; of {n} processes, pid {who.get('pid')} on {one_line(str(who.get('host')))} drawn"
    return table, meta, drawn


def _node_bundle(bundle: str, read_bundle: Any, place: Any = None) -> tuple[pa.Table, dict[str, Any]]:
    """A node bundle's timeline and metadata; a job-wide bundle (no timeline) named for what it is. A bundle
    found below a folder (``place``, a ``locate.Place``) is read from that folder's descriptor, never its path."""
    from ..recovery.bundle import MAX_METADATA_BYTES, METADATA, TIMELINE, parse_metadata
    from ..recovery.locate import find_bundles

    local = place is not None and place.fs is None
    try:
        if local:
            with place.folder() as folder:
                return read_bundle(folder)  # type: ignore[no-any-return]
        return read_bundle(bundle)  # type: ignore[no-any-return]
    except RingNotFoundError:
        places = [place] if local else find_bundles(bundle)
        meta = parse_metadata(places[0].read(METADATA, MAX_METADATA_BYTES), f"{bundle}/{METADATA}") if places else {}
        if meta.get("scope") != "job":
            raise
        first = meta.get("first_death")
        bundle_of_first = first.get("bundle") if isinstance(first, dict) else None
        where = f": blackbox plot {one_line(bundle_of_first)}" if isinstance(bundle_of_first, str) else ""
        raise BlackboxError(
            f"{one_line(bundle)}: expected a bundle with a {TIMELINE}, found a job-wide bundle (the first death's "
            f"timeline is in its node bundle{where})"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox plot", argv)
