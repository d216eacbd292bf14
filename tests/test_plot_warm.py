"""matplotlib readied on a thread beside the bundle's writing (views/plot_warm.py): after the verdict, never
changing the picture, never outliving the recovery, its failures dropped."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from blackbox import _postmortem
from blackbox._postmortem import write_postmortem
from blackbox.views import plot_warm

pytest.importorskip("matplotlib")

GOLDEN = Path(__file__).parent / "data" / "ring-v4.ring"


def _ring(tmp_path: Path) -> Path:
    ring = tmp_path / "r.ring"
    shutil.copyfile(GOLDEN, ring)
    return ring


def test_picture_is_the_same_with_and_without_warming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ring = _ring(tmp_path)
    write_postmortem([ring], tmp_path / "warm", raw=False)
    monkeypatch.setattr(plot_warm.PlotWarmer, "start", lambda self: None)
    write_postmortem([ring], tmp_path / "cold", raw=False)
    warm, cold = (tmp_path / "warm" / "memory.png").read_bytes(), (tmp_path / "cold" / "memory.png").read_bytes()
    assert warm[:8] == b"\x89PNG\r\n\x1a\n"
    assert warm == cold


def test_warming_starts_once_the_verdict_is_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "bundle"
    seen: list[Any] = []
    real = plot_warm._warm

    def warm() -> None:
        seen.append(json.loads((out / "metadata.json").read_text())["complete"])
        real()

    monkeypatch.setattr(plot_warm, "_warm", warm)
    meta = write_postmortem([_ring(tmp_path)], out, raw=False)
    assert seen == [False]  # the verdict's bundle (complete: false) was at OUT when the warming began
    assert meta["complete"] is True
    assert (out / "memory.png").stat().st_size > 0


def test_no_thread_outlives_the_recovery_even_when_it_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = plot_warm._warm
    started = threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.5)
        real()

    def views(*args: Any, **kwargs: Any) -> dict[str, bytes]:
        raise RuntimeError("planted: the views fail after the verdict")

    monkeypatch.setattr(plot_warm, "_warm", slow)
    monkeypatch.setattr(_postmortem, "_views", views)
    with pytest.raises(RuntimeError, match="planted"):
        write_postmortem([_ring(tmp_path)], tmp_path / "bundle", raw=False)
    assert started.is_set()
    assert not [t for t in threading.enumerate() if t.name == "blackbox-plot-warm"]


def test_no_warming_without_a_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(plot_warm, "_warm", lambda: calls.append(True))
    write_postmortem([_ring(tmp_path)], tmp_path / "bundle", raw=False, plot=False)
    assert calls == []
    assert not (tmp_path / "bundle" / "memory.png").exists()


def test_a_failure_while_warming_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from matplotlib.figure import Figure

    real_text = Figure.text

    def text(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "blackbox-plot-warm":
            raise ValueError("planted in the warming thread")
        return real_text(self, *args, **kwargs)

    escaped: list[BaseException | None] = []  # what a thread let go of (pytest's own hook only warns of it)
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    monkeypatch.setattr(Figure, "text", text)
    meta = write_postmortem([_ring(tmp_path)], tmp_path / "bundle", raw=False)
    assert meta["complete"] is True
    assert (tmp_path / "bundle" / "memory.png").read_bytes()[:4] == b"\x89PNG"
    assert escaped == []
    err = capfd.readouterr().err
    assert "planted" not in err and "Traceback" not in err


def test_warmer_waits_for_nothing_when_never_started() -> None:
    warmer = _postmortem.PlotWarmer()
    warmer.wait()  # returns at once: no thread
    assert warmer._thread is None


def test_a_backend_named_in_the_environment_that_this_python_lacks_changes_nothing(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    # GIVEN `blackbox recover` run from a notebook's shell cell: MPLBACKEND names the kernel's inline backend,
    # which blackbox's Python has not (matplotlib's import raised ValueError: recover exited 1, no timeline)
    ring = _ring(tmp_path)
    env = dict(os.environ, MPLBACKEND="module://no_such_backend_module.inline")
    done = subprocess.run([sys.executable, "-m", "blackbox", "recover", str(ring), "-o", str(tmp_path / "b")],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    # THEN the whole bundle is written, the picture the same as without it
    assert done.returncode == 0, done.stderr[-2000:]
    write_postmortem([ring], tmp_path / "plain", raw=False)
    assert (tmp_path / "b" / "memory.png").read_bytes() == (tmp_path / "plain" / "memory.png").read_bytes()
    assert (tmp_path / "b" / "timeline.parquet").stat().st_size > 0


def test_a_picture_that_cannot_be_drawn_is_one_warning_and_the_rest_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blackbox._errors import BlackboxWarning
    from blackbox.views import plot

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("planted: a backend this Python lacks")

    # GIVEN the drawing of memory.png fails
    monkeypatch.setattr(plot, "memory_figure", fails)
    # WHEN the rings are recovered
    with pytest.warns(BlackboxWarning, match="memory.png not drawn, the rest of the bundle written: ValueError: "
                                             "planted"):  # fmt: skip
        meta = write_postmortem([_ring(tmp_path)], tmp_path / "bundle", raw=False)
    # THEN the bundle is whole but for the picture
    assert meta["complete"] is True
    names = {p.name for p in (tmp_path / "bundle").iterdir()}
    assert {"timeline.parquet", "metadata.json", "summary.md"} <= names and "memory.png" not in names
