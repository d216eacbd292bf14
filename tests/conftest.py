from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import blackbox
from blackbox._reader import Ring, read_ring
from blackbox._writer import c_writer_module

REPO = Path(__file__).resolve().parent.parent


def run_py(
    code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120, check: bool = True, preexec_fn=None
) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet in a fresh interpreter with the repo importable."""
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        preexec_fn=preexec_fn,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def spawn_py(code: str, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=full_env, text=True, **kw)


BACKENDS = ["c", "python"]


@pytest.fixture(params=BACKENDS)
def writer_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once with the C write path and once with the pure-Python one."""
    backend: str = request.param
    if backend == "c" and c_writer_module() is None:
        pytest.skip("the C write path blackbox._cwriter is not built (no C compiler at install)")
    monkeypatch.setenv("BLACKBOX_WRITER", backend)
    return backend


@pytest.fixture
def recorder(tmp_path: Path, writer_backend: str) -> Iterator[blackbox.Recorder]:
    """An armed Recorder on a small ring, not the process-wide one; disarmed after."""
    rec = blackbox.Recorder.arm(tmp_path / "t.ring", capacity=256, sample_interval=3600)
    assert rec.armed
    assert rec.writer_backend == writer_backend
    yield rec
    rec.disarm()


def reread(rec: blackbox.Recorder) -> Ring:
    assert rec.path is not None
    return read_ring(rec.path)


def labels_of(ring: Ring) -> list[str | None]:
    return [ring.strings.get(int(i)) if i else None for i in ring.records["label"]]
