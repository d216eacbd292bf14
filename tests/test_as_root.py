"""Recover run as root over folders other users wrote: each attack done for real, as a real user.

The users are made with ``useradd`` (``users.py``) and the attacker's steps run
as that user, so the kernel allows only what it would allow them. Where an
attack needs a step the kernel refuses an unprivileged user here (a hard link to
a file they cannot read, with ``fs.protected_hardlinks`` on; a device node),
root makes that one step, as the same attacker could on a machine that allows it.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, run_py
from users import User, local_users, shared_folder

import blackbox
from blackbox.cli import main
from blackbox.recovery.bundle import read_bundle
from blackbox.ring.folded import FOLDED, fold_line
from blackbox.ring.reader import read_ring


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[User, User]]:
    with local_users("victim", "attacker") as (victim, attacker):
        yield victim, attacker


@pytest.fixture
def shared() -> Iterator[Path]:
    with shared_folder() as path:
        yield path


@pytest.fixture
def secret(shared: Path) -> str:
    """A root-only file's text (like /etc/shadow's): it must never reach a bundle or an error."""
    text = f"root:SECRET-{secrets.token_hex(8)}:19000:0:99999:7:::\n"
    path = shared / "shadow"
    path.write_text(text)
    os.chmod(path, 0o600)
    return text.strip()


def folder_of(user: User, shared: Path, name: str) -> Path:
    folder = shared / name
    folder.mkdir(mode=0o700)
    return user.give(folder)


def ring_of(user: User, folder: Path, name: str, label: str) -> Path:
    """A ring as ``user``'s job leaves it (made here, then given to them)."""
    rec = blackbox.Recorder.arm(folder / name, capacity=128, sample_interval=3600)
    for i in range(10):
        rec.mark(label, i)
    rec.disarm()
    assert rec.path is not None
    return user.give(rec.path)


def recover(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    code = main(["recover", *map(str, args)])
    said = capsys.readouterr()
    return code, said.out + said.err


def everything(bundle: Path) -> str:
    """Every text of a bundle: its text files and the timeline's labels and details."""
    table, _ = read_bundle(bundle)
    texts = [p.read_text(errors="replace") for p in bundle.iterdir() if p.suffix in (".txt", ".md", ".json")]
    labels = [str(v) for c in ("label", "detail") for v in table[c].to_pylist() if v is not None]
    return "\n".join(texts + labels)


def test_a_crash_sidecar_linked_to_a_root_only_file_is_not_read(
    users: tuple[User, User], shared: Path, secret: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the attacker's ring with `x.ring.crash -> the root-only file`, made as the attacker
    _, attacker = users
    folder = folder_of(attacker, shared, "rings")
    ring = ring_of(attacker, folder, "x.ring", "mine")
    attacker.run(lambda: os.symlink(shared / "shadow", f"{ring}.crash"))
    # WHEN root recovers the folder
    code, said = recover(capsys, folder, "-o", shared / "bundle")
    # THEN the ring is recovered, the link is counted as refused, and the file's text is nowhere
    assert code == 0
    meta = json.loads((shared / "bundle" / "metadata.json").read_text())
    assert meta["native_crash"] is None and meta["recovery"]["sidecars_refused"] == 1
    assert not list((shared / "bundle").glob("crash-*.txt"))
    assert "SECRET" not in everything(shared / "bundle") + said


def test_a_crash_sidecar_hard_linked_to_a_root_only_file_is_not_read(
    users: tuple[User, User], shared: Path, secret: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the root-only file hard-linked as the attacker's sidecar (root makes the link, as the attacker
    # could where fs.protected_hardlinks is off): owned by root, the invoking user, but with two names
    _, attacker = users
    folder = folder_of(attacker, shared, "rings")
    ring = ring_of(attacker, folder, "x.ring", "mine")
    os.link(shared / "shadow", f"{ring}.crash")
    # WHEN root recovers the folder; THEN the sidecar is refused unread
    code, said = recover(capsys, folder, "-o", shared / "bundle")
    assert code == 0
    meta = json.loads((shared / "bundle" / "metadata.json").read_text())
    assert meta["recovery"]["sidecars_refused"] == 1
    assert "SECRET" not in everything(shared / "bundle") + said


def test_the_ring_owners_own_crash_sidecar_is_read(
    users: tuple[User, User], shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a regular .crash file of the ring's owner (what a version-1/2 writer left)
    _, attacker = users
    folder = folder_of(attacker, shared, "rings")
    ring = ring_of(attacker, folder, "x.ring", "mine")
    attacker.run(lambda: Path(f"{ring}.crash").write_text("Fatal Python error: Segmentation fault\n"))
    # WHEN root recovers it; THEN its text is in the bundle
    assert recover(capsys, folder, "-o", shared / "bundle")[0] == 0
    meta = json.loads((shared / "bundle" / "metadata.json").read_text())
    assert meta["native_crash"]["first_line"] == "Fatal Python error: Segmentation fault"
    assert meta["recovery"]["sidecars_refused"] == 0


def test_a_ring_linked_to_another_users_ring_is_not_read(
    users: tuple[User, User], shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the victim's ring in the victim's private folder, and in the attacker's folder the attacker's
    # own ring and `stolen.ring -> the victim's ring` (made as the attacker, who cannot read it)
    victim, attacker = users
    theirs = ring_of(victim, folder_of(victim, shared, "victim"), "v.ring", "victim-private")
    folder = folder_of(attacker, shared, "rings")
    ring_of(attacker, folder, "x.ring", "mine")
    attacker.run(lambda: os.symlink(theirs, folder / "stolen.ring"))
    assert "PermissionError" in attacker.run(lambda: _try_read(theirs))
    # WHEN root recovers the attacker's folder
    code, said = recover(capsys, folder, "-o", shared / "bundle")
    # THEN only the attacker's ring is in the bundle; the link is listed with its reason
    assert code == 0
    assert "victim-private" not in everything(shared / "bundle") and "mine" in everything(shared / "bundle")
    meta = json.loads((shared / "bundle" / "metadata.json").read_text())
    (unread,) = meta["unread_rings"]
    assert unread["ring"].endswith("stolen.ring") and "symbolic link" in unread["reason"]
    assert "stolen.ring" in (shared / "bundle" / "summary.md").read_text()
    assert f"blackbox: not recovered: {unread['reason']}\n" in said
    # AND named directly, the link is refused in one line, by recover and by info
    link = str(folder / "stolen.ring")
    for command in (["recover", link, "-o", str(shared / "b2")], ["info", link], ["summary", link]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "symbolic link" in err and "Traceback" not in err


def _try_read(path: Path) -> str:
    try:
        path.read_bytes()
    except OSError as exc:
        return type(exc).__name__
    return "read it"


def test_fifos_never_hang_recover_and_are_not_read(users: tuple[User, User], shared: Path) -> None:
    # GIVEN FIFOs made by the attacker as a ring, as a sidecar and as folded.jsonl
    _, attacker = users
    folder = folder_of(attacker, shared, "rings")
    ring = ring_of(attacker, folder, "x.ring", "mine")

    def plant() -> None:
        for name in ("f.ring", f"{ring.name}.crash", FOLDED):
            os.mkfifo(folder / name)

    attacker.run(plant)
    # WHEN root recovers the folder, and reads the FIFO ring by name (in a child: a hang fails the test)
    cmd = [sys.executable, "-m", "blackbox"]
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    done = subprocess.run([*cmd, "recover", str(folder), "-o", str(shared / "bundle")], env=env, timeout=120,
                          capture_output=True, text=True)  # fmt: skip
    info = subprocess.run([*cmd, "info", str(folder / "f.ring")], env=env, timeout=120, capture_output=True, text=True)
    # THEN recover ends, with the FIFO ring listed and the FIFO sidecar refused; info says what it found
    assert done.returncode == 0, done.stderr
    meta = json.loads((shared / "bundle" / "metadata.json").read_text())
    assert [u["reason"] for u in meta["unread_rings"]] == [f"{folder / 'f.ring'}: expected a ring file, found a FIFO"]
    assert meta["recovery"]["sidecars_refused"] == 1 and "helpers" not in meta
    assert info.returncode == 1 and info.stderr.count("\n") == 1 and "a FIFO" in info.stderr


def test_device_nodes_are_not_read(users: tuple[User, User], shared: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN device nodes as a ring and as a sidecar (root makes them: a user cannot; /dev/zero's numbers)
    _, attacker = users
    folder = folder_of(attacker, shared, "rings")
    ring = ring_of(attacker, folder, "x.ring", "mine")
    try:
        os.mknod(folder / "d.ring", 0o644 | stat.S_IFCHR, os.makedev(1, 5))
        os.mknod(f"{ring}.crash", 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    except PermissionError as exc:
        pytest.skip(f"the kernel refused mknod here: {exc}")
    # WHEN root recovers; THEN neither is read (reading /dev/zero would never end)
    code, _ = recover(capsys, folder, "-o", shared / "bundle")
    assert code == 0
    meta = json.loads((shared / "bundle" / "metadata.json").read_text())
    assert [u["reason"].rsplit(", ", 1)[1] for u in meta["unread_rings"]] == ["found a character device"]
    assert meta["recovery"]["sidecars_refused"] == 1


def test_a_folder_swapped_for_a_link_after_it_was_opened_changes_nothing(
    users: tuple[User, User], shared: Path
) -> None:
    # GIVEN recovery holding the attacker's folder open, and the victim's folder holding a ring of the same name
    victim, attacker = users
    folder = folder_of(attacker, shared, "rings")
    ring_of(attacker, folder, "x.ring", "original")
    theirs = folder_of(victim, shared, "victim")
    ring_of(victim, theirs, "x.ring", "victim-private")
    from blackbox.ring.inputs import open_folder

    with open_folder(folder) as held:
        # WHEN the attacker swaps their folder for a link to the victim's (allowed: they own it, /tmp-like)
        attacker.run(lambda: (os.rename(folder, shared / "rings.old"), os.symlink(theirs, folder)))
        assert folder.is_symlink()
        ring = read_ring(folder / "x.ring", held)
    # THEN the ring read is the one in the folder that was opened
    assert "original" in ring.strings.values() and "victim-private" not in ring.strings.values()


def test_a_root_only_file_linked_as_a_ring_is_refused_and_never_shown(
    users: tuple[User, User], shared: Path, secret: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN the root-only file hard-linked into the attacker's folder as a ring (root makes the link, as
    # above), and a file of the attacker's that is not a ring
    _, attacker = users
    folder = folder_of(attacker, shared, "rings")
    ring_of(attacker, folder, "x.ring", "mine")
    os.link(shared / "shadow", folder / "s.ring")
    attacker.run(lambda: (folder / "junk.ring").write_text("PK\x03\x04 attacker text"))
    # WHEN root recovers the folder, and shows the linked file with info
    code, said = recover(capsys, folder, "-o", shared / "bundle")
    assert main(["info", str(folder / "s.ring")]) == 1
    said += capsys.readouterr().err
    # THEN both are listed as unread, and no byte of either is in any message or bundle file
    assert code == 0
    meta = json.loads((shared / "bundle" / "metadata.json").read_text())
    reasons = {Path(u["ring"]).name: u["reason"] for u in meta["unread_rings"]}
    assert "found a file of uid 0 with 2 names (not read)" in reasons["s.ring"]
    assert "does not start with it" in reasons["junk.ring"]
    shown = said + everything(shared / "bundle")
    assert "SECRET" not in shown and "root:" not in shown and "PK" not in shown and "attacker text" not in shown


def test_folded_helpers_of_another_user_or_through_a_link_are_not_read(
    users: tuple[User, User], shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim, attacker = users
    line = fold_line({"pid": 7, "ppid": 1, "rank": None, "role": "worker", "argv": ["w"]}, time.time_ns(), 1 << 20)
    theirs = folder_of(victim, shared, "victim") / FOLDED
    victim.run(lambda: theirs.write_bytes(line))
    folder = folder_of(attacker, shared, "rings")
    ring_of(attacker, folder, "x.ring", "mine")
    # a link to the victim's folded.jsonl, then the victim's file itself (hard-linked by root, as above)
    for plant in (
        lambda: attacker.run(lambda: os.symlink(theirs, folder / FOLDED)),
        lambda: os.link(theirs, folder / FOLDED),
    ):
        plant()
        assert recover(capsys, folder, "-o", shared / "bundle")[0] == 0
        assert "helpers" not in json.loads((shared / "bundle" / "metadata.json").read_text())
        (folder / FOLDED).unlink()
    # the attacker's own folded.jsonl is read
    attacker.run(lambda: (folder / FOLDED).write_bytes(line))
    assert recover(capsys, folder, "-o", shared / "bundle")[0] == 0
    assert json.loads((shared / "bundle" / "metadata.json").read_text())["helpers"][0]["count"] == 1


def test_summary_of_a_bundle_never_reads_through_a_link(
    users: tuple[User, User], shared: Path, secret: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a bundle in the attacker's hands whose summary.md the attacker replaced with a link
    _, attacker = users
    folder = folder_of(attacker, shared, "rings")
    ring = ring_of(attacker, folder, "x.ring", "mine")
    assert recover(capsys, ring, "-o", shared / "bundle")[0] == 0
    bundle = attacker.give(shared / "bundle")
    attacker.run(lambda: ((bundle / "summary.md").unlink(), os.symlink(shared / "shadow", bundle / "summary.md")))
    # WHEN root prints its summary; THEN it is refused in one line, the file unread
    assert main(["summary", str(bundle)]) == 1
    said = capsys.readouterr()
    assert "symbolic link" in said.err and "SECRET" not in said.out + said.err


def test_the_default_folder_made_by_another_user_is_not_used(users: tuple[User, User]) -> None:
    # GIVEN the attacker made the victim's default ring folder first, open to everyone
    victim, attacker = users
    default = Path(f"/var/tmp/blackbox-{victim.uid}")
    if default.exists():
        pytest.skip(f"{default} exists already")
    try:
        attacker.run(lambda: (default.mkdir(), default.chmod(0o777)))

        # WHEN the victim's job arms with the default folder
        def arm() -> str:
            os.environ.pop("BLACKBOX_DIR", None)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rec = blackbox.Recorder.arm(capacity=128, sample_interval=3600)
            armed = rec.armed
            rec.disarm()
            return f"{armed}|{' '.join(str(w.message) for w in caught)}"

        armed, said = victim.run(arm).split("|", 1)
        # THEN it stays disarmed, says why, and writes nothing into the attacker's folder
        assert armed == "False" and f"owned by uid {attacker.uid}" in said
        assert list(default.iterdir()) == []
    finally:
        subprocess.run(["rm", "-rf", str(default)], check=False)


_OOM_JOB = """
import sys, time
sys.path.insert(0, sys.argv[2])
import fake_torch
fake_torch.install()
import blackbox
rec = blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.02, allocator_history=True)
fake_torch.state["initialised"] = True
for _ in range(500):  # the recorder attaches to CUDA from its sampler thread, once the job initialised it
    if fake_torch.state["observers"]:
        break
    time.sleep(0.01)
fake_torch.state["observers"][0](0, 2 << 30, 80 << 30, 1 << 30)   # the allocator runs out: the snapshot
blackbox.disarm()
"""


def test_the_allocator_snapshot_is_never_written_through_a_planted_link(users: tuple[User, User], shared: Path) -> None:
    # GIVEN a shared ring folder where the attacker linked the snapshot's name to a file of the job's user
    _, attacker = users
    kept = shared / "precious"
    kept.write_text("the job user's own file\n")
    ring = shared / "x.ring"
    attacker.run(lambda: os.symlink(kept, f"{ring}.oom-snapshot.pickle"))
    # WHEN the job hits a CUDA OOM (the fake backend), which writes PyTorch's snapshot beside the ring
    run_py(_OOM_JOB, str(ring), str(REPO / "tests"))
    # THEN the file is untouched and the link is still the attacker's link: nothing was written through it
    assert kept.read_text() == "the job user's own file\n"
    assert Path(f"{ring}.oom-snapshot.pickle").is_symlink()
    # AND without the link, the snapshot is written, as a new file of mode 0600
    os.unlink(f"{ring}.oom-snapshot.pickle")
    os.unlink(ring)
    run_py(_OOM_JOB, str(ring), str(REPO / "tests"))
    written = os.lstat(f"{ring}.oom-snapshot.pickle")
    assert stat.S_ISREG(written.st_mode) and stat.S_IMODE(written.st_mode) == 0o600 and written.st_size > 0
