"""Stack samples by function, and in speedscope's own format, from the rings of a really killed job.

``data/speedscope-file-format-schema.json`` is speedscope's own schema of its file format, copied from
speedscope 1.25.0 (npm package, ``dist/release/file-format-schema.json``; MIT, ``speedscope-LICENSE.txt``).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, run_py

import blackbox
from blackbox.recovery.kinds import of_kind
from blackbox.ring.reader import find_rings, read_ring
from blackbox.views.speedscope import function_frame, short_path

JOB = """
import os, signal, sys, threading, time, blackbox
blackbox.arm(sys.argv[1], capacity=1 << 13, sample_interval=0.02, stack_threads=["loader"])
def leak(n):
    hog = [b"\\1" * (1 << 20) for _ in range(n)]
    time.sleep(0.1)
    return hog
def load():
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        time.sleep(0.01)
threading.Thread(target=load, name="loader").start()
held = []
for step in range(1, 7):
    blackbox.step(step)
    held.append(leak(4))  # one line
    held.append(leak(2))  # another line of the same function
os.kill(os.getpid(), signal.SIGKILL)
"""
SCHEMA = Path(__file__).parent / "data" / "speedscope-file-format-schema.json"
LINE = re.compile(r":\d+\)$")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("speedscope")
    proc = run_py(JOB, f"{d / 'rings'}/", check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return blackbox.recover(d / "rings", d / "bundle")


def export(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "blackbox", "export", *args, "-o", "-"], capture_output=True,
                          text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def samples(bundle: Path) -> list[tuple[int, str]]:
    (ring,) = find_rings([bundle.parent / "rings"])
    from blackbox.recovery.timeline import ring_table

    rows = of_kind(ring_table(read_ring(ring)), "stack_sample", columns=["thread", "detail"])
    return list(zip(rows["thread"].to_pylist(), rows["detail"].to_pylist(), strict=True))


def test_short_paths_keep_the_package_and_drop_the_rest() -> None:
    assert short_path("/venv/lib/python3.12/site-packages/torch/nn/modules/module.py") == "torch/nn/modules/module.py"
    assert short_path("/usr/lib/python3/dist-packages/numpy/core/numeric.py") == "numpy/core/numeric.py"
    assert short_path("/usr/lib/python3.13/threading.py") == "threading.py"
    assert short_path("/usr/local/lib/python3.13t/asyncio/events.py") == "asyncio/events.py"
    assert short_path("/home/me/project/train.py") == "train.py"
    assert function_frame("forward (/v/lib/python3.10/site-packages/torch/nn/modules/linear.py:125)") == \
        "forward (torch/nn/modules/linear.py)"  # fmt: skip
    assert function_frame("<no frames>") == "<no frames>", "a placeholder stays itself"


@pytest.mark.slow
def test_folded_by_function_makes_one_box_of_each_function(bundle: Path) -> None:
    text = export("--folded", "--by-function", str(bundle))
    lines = [re.fullmatch(r"(.*) (\d+)", line) for line in text.splitlines()]
    assert all(lines), text
    counts = {m.group(1): int(m.group(2)) for m in lines if m}
    sampled = samples(bundle)
    assert sum(counts.values()) == len(sampled), "every sample counted once"
    assert not any(LINE.search(f) for stack in counts for f in stack.split(";")), "no line numbers"
    expected = Counter(";".join(function_frame(f) for f in stack.split(";")) for _, stack in sampled if stack)
    assert counts == dict(expected)
    by_line = export("--folded", str(bundle))
    leak_lines = {s.split(";")[-1] for s in (line.rsplit(" ", 1)[0] for line in by_line.splitlines())
                  if s.split(";")[-1].startswith("leak (")}  # fmt: skip
    leak_functions = {s.split(";")[-1] for s in counts if s.split(";")[-1].startswith("leak (")}
    assert leak_functions == {"leak (<string>)"}, "one box for the function"
    assert len({s.split(";")[-2] for s in counts if s.endswith(";leak (<string>)")}) == 1, \
        "its two calling lines, one box too"  # fmt: skip
    assert leak_lines, "by line it was sampled at its lines"


@pytest.mark.slow
@pytest.mark.parametrize("by_function", [False, True], ids=["by line", "by function"])
def test_speedscope_file_follows_speedscopes_schema_and_holds_every_sample(bundle: Path, by_function: bool) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    profile = json.loads(export("--speedscope", *(["--by-function"] if by_function else []), str(bundle)))
    jsonschema.validate(profile, json.loads(SCHEMA.read_text()))
    frames = profile["shared"]["frames"]
    sampled = samples(bundle)
    threads = Counter(thread for thread, _ in sampled)
    assert sorted(len(p["samples"]) for p in profile["profiles"]) == sorted(threads.values()), "a profile per thread"
    assert {p["name"].rsplit(" ", 1)[-1] for p in profile["profiles"]} == {f"{t:#x}" for t in threads}
    for p in profile["profiles"]:
        assert len(p["weights"]) == len(p["samples"]) and all(w > 0 for w in p["weights"])
        assert abs(p["startValue"] + sum(p["weights"]) - p["endValue"]) < 1e-5, "weights fill the profile's time"
    stacks = Counter(";".join(frames[i]["name"] for i in s) for p in profile["profiles"] for s in p["samples"])
    expected = Counter(";".join(f.rsplit(" (", 1)[0] for f in stack.split(";")) for _, stack in sampled if stack)
    assert stacks == expected, "each sample's stack, outermost first, in its thread's profile"
    module = [f for f in frames if f["name"] == "<module>"]  # leak is called from two lines of it
    if by_function:
        assert len(module) == 1 and "line" not in module[0] and module[0]["file"] == "<string>", "a frame per function"
    else:
        assert len(module) >= 2 and all(isinstance(f["line"], int) for f in module), "a frame per line"
    loader = next(p for p in profile["profiles"] if any(frames[s[-1]]["name"] == "load" for s in p["samples"]))
    assert all(frames[s[-1]]["name"] != "leak" for s in loader["samples"]), "the loader thread's own profile"


def test_by_function_with_perfetto_is_refused_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "blackbox", "export", "--perfetto", "--by-function", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == ("blackbox: error: expected --by-function with --folded or --speedscope, found it "
                                   "with --perfetto")  # fmt: skip
