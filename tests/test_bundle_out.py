"""``recover -o OUT``: the bundle is made in a private folder beside OUT and put in place whole.

Links planted in OUT redirect nothing, a link or a folder of other files at OUT
is refused untouched, concurrent recoveries into one OUT leave one bundle (never
a mix), and nothing of an earlier bundle survives the next.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import REPO
from users import User, local_users, shared_folder

import blackbox
from blackbox._postmortem import write_postmortem
from blackbox.cli import main
from blackbox.recovery import bundle
from blackbox.recovery.bundle import read_bundle, read_summary


def ring_with(folder: Path, name: str, label: str, events: int, crash: str | None = None) -> Path:
    rec = blackbox.Recorder.arm(folder / name, capacity=1024, sample_interval=3600)
    for i in range(events):
        rec.mark(label, i)
    rec.disarm()
    assert rec.path is not None
    if crash is not None:
        Path(f"{rec.path}.crash").write_text(crash)
    return rec.path


def mark_labels(table: pa.Table) -> set[str]:
    """The labels of the rings' marks (stack samples carry their thread's name)."""
    return {r["label"] for r in table.select(["kind", "label"]).to_pylist() if r["kind"] == "mark"}


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    return ring_with(tmp_path, "r.ring", "r", 20)


@pytest.fixture(scope="module")
def attacker() -> Iterator[User]:
    with local_users("attacker") as (user,):
        yield user


@pytest.fixture
def shared() -> Iterator[Path]:
    with shared_folder() as path:
        yield path


def test_a_bundle_is_private_and_made_only_of_new_files(ring: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    write_postmortem([ring], out, plot=False)
    assert stat.S_IMODE(os.lstat(out).st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(os.lstat(p).st_mode) for p in out.iterdir()}
    assert modes == dict.fromkeys(["timeline.parquet", "ranks.parquet", "metadata.json", "summary.md"], 0o600)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_links_planted_in_out_redirect_no_write(
    attacker: User, shared: Path, ring: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN OUT made by the attacker, its bundle names linked to root-only files
    keep = {name: shared / f"root-{name}" for name in ("metadata.json", "summary.md", "timeline.parquet")}
    for path in keep.values():
        path.write_text("root's own\n")
        path.chmod(0o600)
    out = shared / "out"

    def plant() -> None:
        out.mkdir()
        for name, target in keep.items():
            os.symlink(target, out / name)

    attacker.run(plant)
    # WHEN root recovers into OUT
    assert main(["recover", str(ring), "-o", str(out)]) == 0
    # THEN the root files are untouched, and OUT is a fresh bundle of root's with no link left
    assert all(path.read_text() == "root's own\n" for path in keep.values())
    st = os.lstat(out)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    assert all(stat.S_ISREG(os.lstat(p).st_mode) for p in out.iterdir())
    assert read_bundle(out)[1]["events"] > 0


def test_out_that_is_a_link_or_a_folder_of_other_files_is_refused_untouched(
    attacker: User, shared: Path, ring: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a root folder with a file in it, OUT a link to it (made by the attacker), and a folder of other files
    precious = shared / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep me")
    attacker.run(lambda: os.symlink(precious, shared / "out"))
    for out in (shared / "out", precious):
        # WHEN root recovers into it; THEN one line says why not, and nothing there changed
        assert main(["recover", str(ring), "-o", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "expected a new folder or an earlier bundle" in err
    assert (shared / "out").is_symlink() and os.listdir(precious) == ["data"]
    assert (precious / "data").read_text() == "keep me"


def test_nothing_of_an_earlier_bundle_survives(tmp_path: Path) -> None:
    # GIVEN a bundle holding a native crash's tracebacks
    crashed = ring_with(tmp_path, "a.ring", "a", 10, crash="Fatal Python error: Aborted\n")
    out = tmp_path / "bundle"
    write_postmortem([crashed], out, plot=False)
    assert [p.name for p in out.glob("crash-*.txt")]
    # WHEN another ring is recovered into the same folder; THEN its file is gone
    write_postmortem([ring_with(tmp_path, "b.ring", "b", 10)], out, plot=False)
    assert not list(out.glob("crash-*.txt"))
    assert mark_labels(pq.read_table(out / "timeline.parquet")) == {"b"}


_WORKER = """
import sys
from pathlib import Path
from blackbox._postmortem import write_postmortem
ring, out = Path(sys.argv[1]), Path(sys.argv[2])
for line in sys.stdin:
    write_postmortem([ring], out, plot=False)
    print("done", flush=True)
"""


def test_concurrent_recoveries_into_one_folder_leave_one_bundle_never_a_mix(tmp_path: Path) -> None:
    # GIVEN two different rings (one with a crash report), and two processes recovering them into one OUT
    a = ring_with(tmp_path, "a.ring", "a", 300, crash="Fatal Python error: Segmentation fault\n")
    b = ring_with(tmp_path, "b.ring", "b", 40)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WORKER), str(r), str(out)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
        for r in (a, b)
    ]  # fmt: skip
    seen = set()
    try:
        for _ in range(25):
            # WHEN both recover at once
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:
                assert p.stdout is not None and p.stdout.readline() == "done\n"
            # THEN OUT is one whole bundle: its files, rows and metadata all from the same ring
            table, meta = read_bundle(out)
            labels = mark_labels(table)
            which = Path(meta["ring"]).stem
            seen.add(which)
            assert labels == {which} and meta["events"] == table.num_rows
            assert bool(list(out.glob("crash-*.txt"))) == (which == "a")
            assert f"pid {meta['pid']}" in read_summary(out)
            crash = [f"crash-{meta['pid']}.txt"] if which == "a" else []
            assert sorted(p.name for p in out.iterdir()) == sorted(
                ["timeline.parquet", "ranks.parquet", "metadata.json", "summary.md", *crash]
            )
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=60)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # every temporary folder removed
    assert seen  # at least one of them won each time; which one is the scheduler's choice


def test_a_filesystem_uri_still_works(ring: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a pyarrow filesystem that is not local (one in-memory filesystem behind every mock:// URI)
    mock, _ = pafs.FileSystem.from_uri("mock:///")
    fake = SimpleNamespace(from_uri=lambda uri: (mock, uri.split("://", 1)[1]))
    local = {k: getattr(pafs, k) for k in ("LocalFileSystem", "FileSelector", "FileType")}
    monkeypatch.setattr(bundle, "pafs", SimpleNamespace(FileSystem=fake, **local))
    # WHEN a bundle is written there; THEN it reads back
    meta = write_postmortem([ring], "mock:///bucket/run1", plot=False)
    table, back = read_bundle("mock:///bucket/run1")
    assert back == json.loads(json.dumps(meta)) and table.num_rows == meta["events"]
    assert read_summary("mock:///bucket/run1").startswith("# blackbox")
