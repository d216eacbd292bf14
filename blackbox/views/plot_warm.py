"""matplotlib made ready for ``memory.png`` on a thread of its own, while the rest of the bundle is written.

Importing matplotlib's Figure and its Agg canvas, and loading the font the first text is drawn in, cost
about a second of one core the first time a process draws: as much as recovering a full ring. Drawn after
the timeline, that second came last, on the critical path. ``PlotWarmer.start`` does it beside the writing
instead, once the verdict is out (so it never delays the verdict); ``wait`` joins it before the real figure
is drawn (matplotlib's global state is never used by two threads at once) and before the recovery returns
(no thread outlives it). Any failure here is dropped: the real drawing meets it again and reports it as it
always did.
"""

from __future__ import annotations

import io
import threading


class PlotWarmer:
    """A thread that imports matplotlib and draws a throwaway figure; started at most once."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        thread = threading.Thread(target=_warm, name="blackbox-plot-warm", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no thread to be had (the interpreter shutting down): drawn cold, as before
            return
        self._thread = thread

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()


def _warm() -> None:
    try:
        from .plot import figure_class

        figure = figure_class()(figsize=(1, 1))
        figure.text(0.5, 0.5, "0 B \u2192 1 GiB")  # the default font loaded, as the legend's text needs it
        figure.savefig(io.BytesIO(), format="png", dpi=20)  # the Agg canvas imported, a text rendered
    except Exception:  # noqa: BLE001, S110 (the real figure meets the same failure and reports it)
        pass
