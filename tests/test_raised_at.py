"""Where an exception was raised: its traceback in the ring (``traceback``), and the verdict's site and message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import REPO

from blackbox.recovery.pipeline import recover_rings
from blackbox.recovery.timeline import ring_table
from blackbox.ring import format as fmt
from blackbox.ring.reader import find_rings, read_ring

# the planted truth: train.py's main() calls data.load(), whose json.loads raises in the standard library
DATA = """\
import json


def load(path):
    with open(path) as f:
        return json.loads(f.read())  # LOAD
"""
TRAIN = """\
import sys, blackbox
import data

blackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)


def main():
    for step in range(5):
        blackbox.step(step)
        if step == 3:
            data.load("/dev/null")  # MAIN


main()  # MODULE
"""
RECURSE = """\
import sys, blackbox

blackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)


def descend(n):
    if n == 0:
        raise RecursionError("planted at the bottom")  # BOTTOM
    return descend(n - 1)  # DESCEND


descend(int(sys.argv[2]))  # MODULE
"""


def _line(text: str, tag: str) -> int:
    (n,) = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.endswith(f"# {tag}")]
    return n


def _run(tmp_path: Path, files: dict[str, str], *args: str, writer: str = "") -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "BLACKBOX_WRITER"}
    env |= {"PYTHONPATH": f"{REPO}:{tmp_path}", **({"BLACKBOX_WRITER": writer} if writer else {})}
    return subprocess.run([sys.executable, str(tmp_path / "train.py"), str(tmp_path / "rings"), *args],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)  # fmt: skip


def _recorded(ring_dir: Path, kind: str) -> list[dict]:
    (path,) = find_rings([ring_dir])
    table = ring_table(read_ring(path))
    return table.filter(pc.equal(table["kind"].cast(pa.string()), kind)).to_pylist()


@pytest.mark.parametrize("writer", ["", "python"])
def test_an_uncaught_exception_is_told_at_the_job_line_that_led_to_it(tmp_path: Path, writer: str) -> None:
    # GIVEN a job whose own code (train.py, then data.py) calls json.loads on an empty file at step 3
    proc = _run(tmp_path, {"train.py": TRAIN, "data.py": DATA}, writer=writer)
    assert proc.returncode == 1 and "JSONDecodeError" in proc.stderr, proc.stderr
    # THEN the ring holds its traceback, outermost first, the job's frames then json's, none of blackbox's
    (exc,) = _recorded(tmp_path / "rings", "exception")
    frames = exc["traceback"].split(";")
    assert frames[:3] == [f"<module> ({tmp_path / 'train.py'}:{_line(TRAIN, 'MODULE')})",
                          f"main ({tmp_path / 'train.py'}:{_line(TRAIN, 'MAIN')})",
                          f"load ({tmp_path / 'data.py'}:{_line(DATA, 'LOAD')})"], frames  # fmt: skip
    assert len(frames) > 3 and all("/json/" in f for f in frames[3:]) and "blackbox" not in exc["traceback"]
    # AND the verdict names the innermost line of the job's own code, and the message's first line
    death = recover_rings([tmp_path / "rings"]).meta["death"]
    assert (death["cause"], death["step"]) == ("exception", 3)
    assert death["headline"] == (f"The job died of an uncaught json.decoder.JSONDecodeError at load (data.py:"
                                 f"{_line(DATA, 'LOAD')}): \"Expecting value: line 1 column 1 (char 0)\".")  # fmt: skip
    (said,) = [e for e in death["evidence"] if e.startswith("raised at ")]
    assert said.endswith(f"← load (data.py:{_line(DATA, 'LOAD')}) ← main (train.py:{_line(TRAIN, 'MAIN')}) ← "
                         f"<module> (train.py:{_line(TRAIN, 'MODULE')})"), said  # fmt: skip


OOM = """\
import sys, blackbox, torch

blackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)


def activations():
    return torch.empty(1 << 62, dtype=torch.uint8)  # REQUEST


def evaluate():
    with blackbox.capture_oom("eval", batch=64):
        activations()  # CALL


evaluate()
"""


def test_an_oom_that_capture_oom_recorded_and_the_job_did_not_catch_is_told_at_its_request(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # GIVEN torch's CPU allocator refusing a request inside `capture_oom`, which the job does not catch
    proc = _run(tmp_path, {"train.py": OOM})
    assert proc.returncode == 1 and "DefaultCPUAllocator" in proc.stderr, proc.stderr[-2000:]
    # THEN the capture and the uncaught end are both recorded, the second with the frames outside the block too
    captured, uncaught = _recorded(tmp_path / "rings", "oom")
    assert captured["detail"] == "capture_oom: eval batch=64"
    assert uncaught["detail"] == "uncaught; capture_oom: eval batch=64"
    request = f"activations ({tmp_path / 'train.py'}:{_line(OOM, 'REQUEST')})"
    assert captured["traceback"].endswith(request) and uncaught["traceback"].endswith(request)
    assert uncaught["traceback"].startswith("<module> (") and not captured["traceback"].startswith("<module> (")
    # AND the death is that OOM, at the line that asked (it read "exited with status 1")
    death = recover_rings([tmp_path / "rings"]).meta["death"]
    assert death["cause"] == "oom_exception", death
    assert death["headline"] == (f"The job died of an out-of-memory exception (RuntimeError) at activations "
                                 f"(train.py:{_line(OOM, 'REQUEST')}).")  # fmt: skip


def test_a_deep_traceback_keeps_its_ends_and_says_how_many_frames_went(tmp_path: Path) -> None:
    # GIVEN an exception raised 3,000 calls deep (a string holds 4 KiB: about 60 of these frames)
    proc = _run(tmp_path, {"train.py": "import sys; sys.setrecursionlimit(10000)\n" + RECURSE}, "3000")
    assert proc.returncode == 1 and "planted at the bottom" in proc.stderr, proc.stderr[-2000:]
    (exc,) = _recorded(tmp_path / "rings", "exception")
    frames = exc["traceback"].split(";")
    # THEN the outermost frames and the innermost are kept, and a placeholder counts the ones between
    shift = 1  # (the line put in front of RECURSE)
    assert frames[0].endswith(f"train.py:{_line(RECURSE, 'MODULE') + shift})")
    assert frames[-1].endswith(f"train.py:{_line(RECURSE, 'BOTTOM') + shift})")
    (gap,) = [i for i, f in enumerate(frames) if f.startswith("<blackbox: ")]
    assert gap == 4 and len(exc["traceback"].encode()) <= fmt.MAX_STRING_BYTES
    assert int(frames[gap].split()[1]) + len(frames) - 1 == 3002  # <module>, 3,001 calls of descend
    death = recover_rings([tmp_path / "rings"]).meta["death"]
    assert f"RecursionError at descend (train.py:{_line(RECURSE, 'BOTTOM') + shift})" in death["headline"]
    # AND the evidence counts every frame it does not show (it counted the placeholder as one)
    (said,) = [e for e in death["evidence"] if e.startswith("raised at ")]
    assert said.endswith(f"← … ({3002 - 8} more)"), said


def test_a_traceback_made_only_of_library_frames_names_the_library_line_and_its_first_worded_line(
    tmp_path: Path,
) -> None:
    # GIVEN an exception raised in the standard library's code with no frame of the job's below the arm
    # (a launcher's: torchelastic's ChildFailedError opens its message with a line of "=")
    code = ("import sys, blackbox\nblackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)\n"
            "import runpy\nrunpy.run_path(sys.argv[1] + '/../raiser.py')\n")  # fmt: skip
    raiser = "raise RuntimeError('\\n' + '=' * 40 + '\\ntrain.py FAILED\\n' + '-' * 40)\n"
    proc = _run(tmp_path, {"train.py": code, "raiser.py": raiser})
    assert proc.returncode == 1, proc.stderr
    death = recover_rings([tmp_path / "rings"]).meta["death"]
    assert death["headline"] == 'The job died of an uncaught RuntimeError at <module> (raiser.py:1): "train.py FAILED".'


def test_an_exception_in_a_ring_written_before_tracebacks_reads_as_none() -> None:
    # GIVEN the golden ring of version 5, written before the traceback word (its exception's p1 left 0)
    table = ring_table(read_ring(REPO / "tests" / "data" / "ring-v5.ring"))
    rows = table.filter(pc.is_in(table["kind"].cast(pa.string()), pa.array(["exception", "oom"]))).to_pylist()
    # THEN every exception and OOM row reads no traceback, and a verdict from one says no site
    assert rows and all(r["traceback"] is None for r in rows), rows
    from blackbox.recovery.headline import headline

    (exc,) = [r for r in rows if r["kind"] == "exception"]
    said = headline("exception", {"role": "main process", "pid": 3}, None, 1, raised=exc)
    assert " at " not in said and said.startswith("The job died of an uncaught "), said


def test_an_exception_whose_traceback_cannot_be_read_is_recorded_without_it(tmp_path: Path) -> None:
    # GIVEN a job whose exception's traceback fails to fold (the frame formatter made to raise)
    code = ("import sys, blackbox\nblackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)\n"
            "import blackbox.collect.exceptions as e\ne.frame_text = lambda *a: 1 / 0\n"
            "raise ValueError('planted')\n")  # fmt: skip
    proc = _run(tmp_path, {"train.py": code})
    # THEN the job reports and exits as it would, and its exception is recorded, with no traceback
    assert proc.returncode == 1 and proc.stderr.endswith("ValueError: planted\n"), proc.stderr
    (exc,) = _recorded(tmp_path / "rings", "exception")
    assert (exc["label"], exc["detail"], exc["traceback"]) == ("ValueError: planted", "uncaught", None)


def test_an_exception_the_job_hands_to_its_excepthook_itself_is_recorded_once_more_at_most(tmp_path: Path) -> None:
    # GIVEN a job that calls sys.excepthook itself on an exception capture_oom recorded, then lets it go uncaught
    code = ("import sys, blackbox\nblackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)\n"
            "try:\n    with blackbox.capture_oom('train'):\n        raise MemoryError('planted')\n"
            "except MemoryError:\n    sys.excepthook(*sys.exc_info())\n    raise\n")  # fmt: skip
    proc = _run(tmp_path, {"train.py": code})
    assert proc.returncode == 1 and proc.stderr.count("MemoryError: planted") == 2, proc.stderr
    # THEN the capture and one uncaught record (three before: the second uncaught passed the rule too)
    rows = _recorded(tmp_path / "rings", "oom")
    assert [r["detail"] for r in rows] == ["capture_oom: train", "uncaught; capture_oom: train"], rows


NOTEBOOK_RUNNER = '''\
import sys, blackbox

blackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)


class CellExecutionError(Exception):
    pass


def check():  # as nbconvert's NotebookClient raises a cell's error: a preamble, the cell, the kernel's traceback
    raise CellExecutionError(  # RAISE
        "An error occurred while executing the following cell:\\n------------------\\nbatch['labels']\\n"
        "------------------\\n\\n\\x1b[31m-----------\\x1b[39m\\n\\x1b[31mKeyError\\x1b[39m   Traceback (most recent "
        "call last)\\nCell \\x1b[32mIn[2]\\x1b[39m, line 1\\n----> 1 batch['labels']\\n\\n"
        "\\x1b[31mKeyError\\x1b[39m: 'labels'\\n")


check()
'''


def test_a_message_that_announces_a_cells_error_is_told_by_that_error_without_its_colours(tmp_path: Path) -> None:
    # GIVEN nbconvert's CellExecutionError as a notebook run dies of it: its first line announces the cell, the
    # cell's own error (KeyError: 'labels') comes last, coloured with the terminal's escape codes
    proc = _run(tmp_path, {"train.py": NOTEBOOK_RUNNER})
    assert proc.returncode == 1 and "CellExecutionError" in proc.stderr, proc.stderr
    death = recover_rings([tmp_path / "rings"]).meta["death"]
    # THEN the headline quotes the cell's error (it quoted "An error occurred while executing the following cell:")
    assert death["headline"] == (f"The job died of an uncaught CellExecutionError at check (train.py:"
                                 f"{_line(NOTEBOOK_RUNNER, 'RAISE')}): \"KeyError: 'labels'\".")  # fmt: skip
    # AND no colour's escape code reaches the evidence
    assert not any("\x1b" in e or "\\x1b" in e for e in death["evidence"]), death["evidence"]
