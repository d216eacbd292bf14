"""``recover -o OUT``: the bundle is made in a private folder beside OUT and put in place whole.

Links planted in OUT redirect nothing, a link or a folder of other files at OUT
is refused untouched, concurrent recoveries into one OUT leave one bundle (never
a mix), and nothing of an earlier bundle survives the next. Where OUT's parent
is another user's, swapping the private folder for a link (or a folder of theirs)
makes root create nothing outside it, and OUT never ends as a link. What a
killed recovery left beside OUT is removed by the next one, and nothing else is.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
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


def files_of(out: Path) -> list[Path]:
    """The bundle's entries, and those of its rings/ (which must be a folder, not a link)."""
    rings = out / "rings"
    assert not rings.is_symlink() and (not rings.exists() or stat.S_IMODE(os.lstat(rings).st_mode) == 0o700)
    return [p for p in out.iterdir() if p != rings] + (list(rings.iterdir()) if rings.exists() else [])


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
    files = dict.fromkeys(["timeline.parquet", "ranks.parquet", "metadata.json", "summary.md", "allocations.parquet"],
                          0o600)  # fmt: skip
    assert modes == {**files, "rings": 0o700}
    assert {p.name: stat.S_IMODE(os.lstat(p).st_mode) for p in (out / "rings").iterdir()} == {"r.ring.zst": 0o600}
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
    assert all(stat.S_ISREG(os.lstat(p).st_mode) for p in files_of(out))
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
                ["timeline.parquet", "ranks.parquet", "metadata.json", "summary.md", "rings", "allocations.parquet",
                 *crash]
            )
            assert [p.name for p in (out / "rings").iterdir()] == [f"{which}.ring.zst"]
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


def test_swapping_the_private_folder_for_a_link_makes_root_create_nothing_outside_it(
    attacker: User, shared: Path, ring: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN OUT in a folder of the attacker's, and a folder of root's the attacker would have root write into
    parent = shared / "theirs"
    parent.mkdir()
    attacker.give(parent)
    target = shared / "root-owned"
    target.mkdir()
    out = parent / "out"

    def swap_every_private_folder() -> None:
        """The attacker's loop: each `.out.*.tmp` root makes is moved aside and, in turns, a link to
        root's folder or a folder of the attacker's put in its place."""
        done: set[str] = set()
        while True:
            for name in os.listdir(parent):
                if name.startswith(".out.") and name.endswith(".tmp") and name not in done:
                    with contextlib.suppress(OSError):
                        os.rename(parent / name, parent / f"moved-{len(done)}")
                        if len(done) % 2 == 0:
                            os.symlink(target, parent / name)
                        else:
                            os.mkdir(parent / name)
                        done.add(name)

    pid = attacker.start(swap_every_private_folder)
    codes = []
    try:
        for _ in range(6):
            # WHEN root recovers into OUT while the attacker swaps
            codes.append(main(["recover", str(ring), "-o", str(out)]))
            err = capsys.readouterr().err
            # THEN nothing is created in root's folder, and OUT is root's own folder of files or absent
            assert os.listdir(target) == []
            assert codes[-1] == 0 or (err.count("\n") == 1 and "found another in its place" in err), err
            if os.path.lexists(out):
                st = os.lstat(out)
                assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
                assert all(stat.S_ISREG(os.lstat(p).st_mode) and os.lstat(p).st_uid == 0 for p in files_of(out))
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    # AND the attacker did swap (the test proves something), and root's recoveries still went through
    assert [p for p in parent.iterdir() if p.name.startswith("moved-")]
    assert 0 in codes and read_bundle(out)[1]["complete"] is True


_HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_only_what_a_killed_recovery_left_beside_out_is_removed(attacker: User, shared: Path, ring: Path) -> None:
    # GIVEN beside OUT: what a killed recovery left (root's, unlocked, holding a folder half written; and
    # one of the code before, files straight inside), a recovery at work (locked), one just made (empty),
    # a folder of the attacker's of the same form, and the attacker's link of that form to a folder of root's
    out = shared / "bundle"
    left = [shared / ".bundle.k1ll3d00.tmp", shared / ".bundle.0ldf0rm1.tmp"]
    (left[0] / "b0").mkdir(parents=True)
    (left[0] / "b0" / "timeline.parquet").write_bytes(b"PAR1 half")
    left[1].mkdir()
    (left[1] / "metadata.json").write_text("{}")
    working, fresh = shared / ".bundle.w0rk1ng0.tmp", shared / ".bundle.n3wn3w00.tmp"
    (working / "b0").mkdir(parents=True)
    fresh.mkdir()
    theirs, link = shared / ".bundle.th31rs00.tmp", shared / ".bundle.l1nk0000.tmp"
    keep = shared / "root-folder"
    keep.mkdir()
    (keep / "data").write_text("keep me")
    attacker.run(lambda: (theirs.mkdir(), (theirs / "f").write_text("mine"), os.symlink(keep, link)))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(working)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        # WHEN root recovers into OUT
        write_postmortem([ring], out, plot=False)
        # THEN what the killed recoveries left is gone, and everything else is as it was
        assert not any(p.exists() for p in left)
        assert (working / "b0").is_dir() and fresh.is_dir() and (theirs / "f").read_text() == "mine"
        assert link.is_symlink() and os.listdir(keep) == ["data"] and (keep / "data").read_text() == "keep me"
        assert read_bundle(out)[1]["complete"] is True
        assert sorted(p.name for p in shared.iterdir() if p.name.startswith(".bundle.")) == sorted(
            p.name for p in (working, fresh, theirs, link)
        )
        # AND an empty one is removed once it is older than a recovery takes to lock it; a locked one never
        old = time.time() - 3600
        for path in (fresh, working):
            os.utime(path, (old, old))
        write_postmortem([ring], out, plot=False)
        assert not fresh.exists() and (working / "b0").is_dir()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def test_a_bundle_s_timeline_is_read_through_an_arrow_file(ring: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Arrow reads ahead on threads of its own: through a Python file they call back into Python, and one
    still reading as the interpreter ends aborts it (``blackbox export`` exited -6 after its answer, 2 runs
    in 80). The timeline is read through an Arrow file over the same descriptor, the same rows."""
    out = tmp_path / "b"
    assert main(["recover", str(ring), "-o", str(out)]) == 0
    sources: list[object] = []
    real = pq.read_table

    def seen(source: object, *args: object, **kwargs: object) -> pa.Table:
        sources.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", seen)
    table, _ = read_bundle(out)
    assert len(sources) == 1 and isinstance(sources[0], pa.NativeFile) and not isinstance(sources[0], pa.PythonFile)
    assert table.equals(real(out / "timeline.parquet"))
