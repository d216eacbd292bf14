"""The C and the pure-Python write paths write the same bytes."""

from __future__ import annotations

import mmap
import shutil
import threading

import numpy as np
import pytest

from blackbox.ring import format as fmt
from blackbox.ring.writer import RingWriter, c_writer_module

CAP = 64
STRINGS = 4096


def _write_script(backend: str) -> tuple[np.ndarray, bytes, list[str]]:
    """Drive one writer through every kind of write; return its records, strings and errors."""
    buf = mmap.mmap(-1, STRINGS + CAP * fmt.RECORD_SIZE)
    errors: list[str] = []
    w = RingWriter(buf, STRINGS, CAP, 0, STRINGS, lambda e: errors.append(type(e).__name__), backend=backend)
    assert w.backend == backend
    w.mark("loss", 7)
    w.mark("loss")
    w.mark(label="kw", value=-3)
    w.step()
    w.step(10)
    w.step(n=None)
    w.event(6, "forward")
    w.event(7, "forward", 1234, device=3)
    w.event(kind=5, label=None, value=None, device=-2)
    w.event(9, "oom text", 1 << 30, 0, payload=(0, 80 << 30, 5 << 20))
    w.event(12, None, 512, 1, [0x7F00, 7, 123456789])
    w.sample((1, 2, 3, -1, -1, -1, -1, -1, -1), device=1)
    w.sample([9] * 9)
    w.mark(42, 2**63 - 1)  # a non-str label is interned by its str()
    # Rejected writes last: the Python path may spend a seq on one (a hole), the C path does not.
    w.mark("big", 2**63)  # out of range: reported, not written
    w.step(-5)  # invalid: reported, not written
    w.mark("float", 1.5)  # not an int: reported, not written
    w.sample((1, 2))  # wrong payload length: reported, not written
    w.event(9, None, None, 0, payload=range(10))  # too long: reported, not written
    assert w.current_step() == 11
    recs = np.frombuffer(buf, dtype=fmt.RECORD_DTYPE, count=CAP, offset=STRINGS).copy()
    strings = bytes(buf[:STRINGS])
    w.kill()
    w.mark("after", 1)  # a killed writer is silent
    buf.close()
    return recs, strings, errors


@pytest.mark.skipif(c_writer_module() is None, reason="the C write path is not built (no C compiler at install)")
def test_c_and_python_paths_write_identical_records() -> None:
    c_recs, c_strings, c_errors = _write_script("c")
    py_recs, py_strings, py_errors = _write_script("python")
    assert c_strings == py_strings
    assert len(c_errors) == len(py_errors) == 5
    written = c_recs["seq"] != 0
    assert written.sum() == 14
    assert sorted(c_recs["seq"][written]) == list(range(1, 15))
    assert (py_recs["seq"][written] == c_recs["seq"][written]).all()
    c_recs, py_recs = c_recs[written], py_recs[written]
    for name in fmt.RECORD_DTYPE.names or ():
        if name != "time":
            assert (c_recs[name] == py_recs[name]).all(), name
    assert (c_recs["thread"] == threading.get_ident()).all()
    order = np.argsort(c_recs["seq"])
    assert (np.diff(c_recs["time"][order].astype(np.int64)) >= 0).all()
    assert (c_recs["commit"] == c_recs["seq"]).all()
    oom = c_recs[c_recs["kind"] == 9][0]
    assert (oom["value"], oom["device"], oom["p1"], oom["p2"], oom["p3"], oom["p8"]) == (
        1 << 30,
        0,
        80 << 30,
        5 << 20,
        -1,
        -1,
    )
    plain = c_recs[c_recs["kind"] == 6][0]
    assert [int(plain[f"p{i}"]) for i in range(fmt.PAYLOAD_WORDS)] == [0] * fmt.PAYLOAD_WORDS


def test_c_write_path_is_built_where_a_compiler_exists() -> None:
    """A dev install builds the extension; a silent build failure would hide the fast path."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on PATH: the pure-Python write path is the expected one")
    assert c_writer_module() is not None or "BLACKBOX_WRITER" in __import__("os").environ


def test_unknown_backend_is_refused() -> None:
    buf = mmap.mmap(-1, STRINGS + CAP * fmt.RECORD_SIZE)
    with pytest.raises(ValueError, match="backend"):
        RingWriter(buf, STRINGS, CAP, 0, STRINGS, print, backend="rust")
    buf.close()
