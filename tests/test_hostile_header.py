"""A header whose CRC is valid but whose metadata JSON is hostile: one line and exit status 1 from
recover, info and summary, never a traceback; a folder with such a ring still recovers the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blackbox
from blackbox import _postmortem
from blackbox.cli import main
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_header

sys.path.insert(0, str(REPO / "tools"))
from craft_ring import meta_with, with_meta  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, Any]]:
    rec = blackbox.Recorder.arm(tmp_path_factory.mktemp("base") / "b.ring", capacity=64, sample_interval=0.01)
    for i in range(30):
        rec.step(i)
        rec.mark("m", i)
    rec.disarm()
    assert rec.path is not None
    return rec.path.read_bytes(), read_header(rec.path).meta


def commands(ring: Path, out: Path) -> list[list[str]]:
    r = str(ring)
    return [["info", r], ["info", r, "--json"], ["summary", r], ["recover", r, "-o", str(out)]]


def run_all(ring: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> list[int]:
    """Each command's exit status; any exception but the CLI's own handling fails the test here."""
    codes = []
    for command in commands(ring, out):
        code = main(command)
        err = capsys.readouterr().err
        assert code in (0, 1)
        if code == 1:
            assert err.count("\n") == 1 and err.startswith("blackbox: error: ") and "Traceback" not in err
        codes.append(code)
    return codes


@pytest.fixture
def no_plot(monkeypatch: pytest.MonkeyPatch) -> None:
    views = _postmortem._views
    monkeypatch.setattr(_postmortem, "_views", lambda meta, read, warmer=None: views(meta, read, warmer=None))
    monkeypatch.setattr(_postmortem.PlotWarmer, "start", lambda self: None)  # nor matplotlib readied for it


# What each of these once did (a traceback), from the issue: they must now be a one-line CorruptHeaderError.
CASES: dict[str, tuple[tuple[str, ...], str]] = {
    "RecursionError (deep nesting)": (("identity", "argv"), "[" * 100_000 + "]" * 100_000),
    "nesting past the depth limit": (("versions",), '{"a":' * 40 + "1" + "}" * 40),
    "AttributeError (identity a list)": (("identity",), "[1, 2, 3]"),
    "AttributeError (clock a string)": (("clock",), '"yesterday"'),
    "OverflowError (huge clock)": (("clock", "wall_ns"), "1" + "0" * 40),
    "ValueError (int of 5000 digits)": (("clock", "monotonic_ns"), "9" * 5000),
    "ValueError (clock as text)": (("clock", "wall_ns"), '"12"'),
    "ArrowInvalid (rank over int32)": (("identity", "rank"), str(1 << 40)),
    "TypeError (pid a list)": (("identity", "pid"), "[1]"),
    "OverflowError (pid over the kernel's)": (("identity", "pid"), str(1 << 70)),
    "a bool pid": (("identity", "pid"), "true"),
    "NaN": (("sample_interval_s",), "NaN"),
    "Infinity": (("sample_interval_s",), "Infinity"),
    "1e999": (("sample_interval_s",), "1e999"),
    "a lone surrogate": (("identity", "host"), '"\\ud800"'),
    "argv of numbers": (("identity", "argv"), "[1, 2]"),
    "cgroup version 7": (("cgroup", "version"), "7"),
    "versions of lists": (("versions",), '{"python": [1]}'),
    "identity null (readers index into it)": (("identity",), "null"),
    "clock null": (("clock",), "null"),
    "not an object": ((), "[]"),
    "not JSON": ((), "{'single': 'quotes'}"),
    "regions of text": (("regions",), '{"stacks_size": "8192", "crash_size": 4096}'),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_hostile_field_is_one_line_and_exit_1(
    case: str, base: tuple[bytes, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str], no_plot: None
) -> None:
    path, raw = CASES[case]
    ring = tmp_path / "hostile.ring"
    ring.write_bytes(with_meta(base[0], meta_with(base[1], (path, raw))))
    assert run_all(ring, tmp_path / "bundle", capsys) == [1, 1, 1, 1]
    with pytest.raises(blackbox.CorruptHeaderError):
        read_header(ring)


def test_the_unmodified_header_still_reads(
    base: tuple[bytes, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str], no_plot: None
) -> None:
    ring = tmp_path / "same.ring"
    ring.write_bytes(with_meta(base[0], json.dumps(base[1]).encode()))  # re-laid out, same JSON
    assert run_all(ring, tmp_path / "bundle", capsys) == [0, 0, 0, 0]


def test_a_folder_with_a_hostile_ring_recovers_the_others(
    base: tuple[bytes, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str], no_plot: None
) -> None:
    folder = tmp_path / "rings"
    folder.mkdir()
    (folder / "good.ring").write_bytes(base[0])
    (folder / "hostile.ring").write_bytes(with_meta(base[0], meta_with(base[1], (("clock",), "[[[[]]]]"))))
    assert main(["recover", str(folder), "-o", str(tmp_path / "bundle")]) == 0
    meta = json.loads((tmp_path / "bundle" / "metadata.json").read_text())
    (unread,) = meta["unread_rings"]
    assert unread["ring"].endswith("hostile.ring") and "metadata clock of type list" in unread["reason"]
    assert meta["events"] > 0 and "hostile.ring" in (tmp_path / "bundle" / "summary.md").read_text()


def test_a_cgroup_path_naming_a_fifo_never_hangs(base: tuple[bytes, dict[str, Any]], tmp_path: Path) -> None:
    # GIVEN a ring whose metadata names as its cgroup a folder holding FIFOs where the cgroup files would be
    trap = tmp_path / "trap"
    trap.mkdir()
    for name in ("memory.max", "memory.events", "memory.current"):
        os.mkfifo(trap / name)
    meta = json.loads(json.dumps(base[1]))
    meta["cgroup"] = {"version": 2, "path": str(trap)}
    ring = tmp_path / "r.ring"
    ring.write_bytes(with_meta(base[0], json.dumps(meta).encode()))
    # WHEN it is recovered (in a child: a hang fails the test); THEN it ends
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-m", "blackbox", "summary", str(ring)], env=env, timeout=120,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- structured mutations (hypothesis)
def _paths(meta: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix] if prefix else [()]
    for k, v in meta.items():
        out += _paths(v, (*prefix, k)) if isinstance(v, dict) else [(*prefix, k)]
    return [*out, (*prefix, "unknown_field")]


def _json_values() -> st.SearchStrategy[str]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
    containers = lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3)  # noqa: E731
    nested = st.recursive(scalars, containers, max_leaves=10)
    deep = st.integers(1, 3000).map(lambda n: "[" * n + "]" * n)
    deep_objects = st.integers(1, 500).map(lambda n: '{"k":' * n + "0" + "}" * n)
    huge = st.tuples(st.sampled_from(["", "-"]), st.integers(19, 5000)).map(lambda t: t[0] + "9" * t[1])
    raw = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", '"\\ud800"', '"\\udfff x"', "1.5", "-1"])
    return st.one_of(nested.map(json.dumps), deep, deep_objects, huge, raw)


def _mutations(meta: dict[str, Any]) -> st.SearchStrategy[list[tuple[tuple[str, ...], str]]]:
    return st.lists(st.tuples(st.sampled_from(_paths(meta)), _json_values()), min_size=1, max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_structured_header_mutations_never_give_a_traceback(
    data: st.DataObject, base: tuple[bytes, dict[str, Any]], capsys: pytest.CaptureFixture[str], no_plot: None
) -> None:
    blob = meta_with(base[1], *data.draw(_mutations(base[1])))
    if len(blob) > fmt.MAX_HEADER_SIZE - fmt.PREFIX_SIZE:
        return
    with tempfile.TemporaryDirectory() as d:
        ring = Path(d) / "mutated.ring"
        ring.write_bytes(with_meta(base[0], blob))
        run_all(ring, Path(d) / "bundle", capsys)


def test_a_huge_host_name_is_clipped_in_the_picture(base: tuple[bytes, dict[str, Any]], tmp_path: Path) -> None:
    # matplotlib lays out every character of a title: 100,000 of them took 20 s
    pytest.importorskip("matplotlib")
    from blackbox.recovery.pipeline import recover_rings
    from blackbox.views.plot import memory_figure

    meta = json.loads(json.dumps(base[1]))
    meta["identity"]["host"] = "h" * 100_000
    ring = tmp_path / "r.ring"
    ring.write_bytes(with_meta(base[0], json.dumps(meta).encode()))
    recovered = recover_rings([ring])
    title = memory_figure(recovered.table, recovered.meta)._suptitle.get_text()
    assert len(title) <= 120 and title.startswith("blackbox: hhh")


def test_blackbox_run_bundles_the_good_rings_when_one_has_no_header(tmp_path: Path) -> None:
    # GIVEN a job that leaves a header-less ring beside its own (what a process killed inside arm() leaves)
    code = "import os, pathlib; pathlib.Path(os.environ['BLACKBOX_DIR'], 'killed-in-arm.ring').write_bytes(bytes(8192))"
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "run"), "--",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg"))  # fmt: skip
    # THEN the job's status is kept and its ring is in the bundle, the other listed with its reason
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "run").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    (unread,) = meta["unread_rings"]
    assert unread["ring"].endswith("killed-in-arm.ring") and "does not start with it" in unread["reason"]
    assert meta["events"] > 0 and "killed-in-arm.ring" in proc.stderr  # the summary run prints lists it


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ('"\\ud800"', "metadata text that is not valid Unicode (a lone surrogate)"),
        ('"a\\uDFFFb"', "metadata text that is not valid Unicode (a lone surrogate)"),
        ('"\\ud83d\\ude00"', None),  # a pair: one character, valid
        ('"\\\\ud800"', None),  # an escaped backslash, then the letters: no surrogate
        ('"\xf0\x9f\x98\x80 \xc3\xa9"', None),  # UTF-8 bytes: never a lone surrogate
        ("1e999", "a metadata number that is not finite"),
        ("-1e400", "a metadata number that is not finite"),
        ("[1.5e308]", None),
        ("[" * 15 + "]" * 15, "metadata nested deeper than 16 levels"),
        ("[" * 14 + "]" * 14, None),  # 16 deep with the two objects around it
    ],
)
def test_header_numbers_text_and_depth_are_checked_as_parsed(host: str, problem: str | None) -> None:
    """Numbers are checked as the JSON is parsed, and strings walked only where the JSON holds a surrogate
    escape (UTF-8 bytes cannot hold a lone surrogate): the same answers as a walk of the whole document."""
    from blackbox.ring.schema import parse_meta

    blob = ('{"extra": {"deep": ' + host + "}}").encode("latin-1")
    meta, problems = parse_meta(blob)
    assert problems == ([problem] if problem else [])
    assert (meta == {}) == bool(problem)
