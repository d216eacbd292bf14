"""The raw rings a bundle keeps (rings/<ring>.zst): byte for byte the rings recovered, read from the
descriptor they were recovered through, within a cap; read again by `recover` as rings, only as their
bundle lists them (size and sha256) and within a ratio and a budget: a planted decompression bomb, a
changed or cut ring, or a file that is not zstd refused in one line."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import REPO, run_py, spawn_py

from blackbox._errors import NotARingError
from blackbox.cli import main
from blackbox.recovery import bundle
from blackbox.recovery.pipeline import RecoveryPass
from blackbox.ring import format as fmt
from blackbox.ring import packed, reader
from blackbox.ring import packed as unpack
from blackbox.ring.reader import read_header

_KILLED = """
import os, sys, blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.01)
for i in range(int(sys.argv[2])):
    blackbox.step(i)
    blackbox.mark("planted-label", i)
os.kill(os.getpid(), 9)
"""


def killed_ring(folder: Path, steps: int) -> Path:
    """The ring of a real armed child (default size) that marked ``steps`` steps and was SIGKILLed."""
    folder.mkdir(parents=True)
    proc = run_py(_KILLED, str(folder), str(steps), check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (ring,) = folder.glob("*.ring")
    return ring


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return killed_ring(tmp_path_factory.mktemp("killed") / "rings", 3000)


def raw_of(out: Path) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((out / "metadata.json").read_text())["raw_rings"]
    return raw


def test_the_bundle_keeps_each_ring_byte_for_byte_with_its_sha256(ring: Path, tmp_path: Path) -> None:
    # WHEN the SIGKILLed child's ring folder is recovered
    out = tmp_path / "b"
    assert main(["recover", str(ring.parent), "-o", str(out)]) == 0
    # THEN rings/ holds one zstd frame that decompresses to the ring file exactly, as metadata.json says
    (kept,) = raw_of(out)["kept"]
    zst = out / kept["file"]
    assert zst.parent == out / "rings" and zst.name == ring.name + ".zst"
    original = ring.read_bytes()
    assert zstandard.ZstdDecompressor().stream_reader(zst.read_bytes()).read() == original
    assert kept["sha256"] == hashlib.sha256(original).hexdigest()
    assert (kept["raw_bytes"], kept["compressed_bytes"]) == (len(original), zst.stat().st_size)
    assert kept["ring"] == str(ring) and raw_of(out)["skipped"] == []
    assert zst.stat().st_size < len(original) // 20


@pytest.mark.parametrize("named", ["rings folder", "one .ring.zst"])
def test_recovering_the_kept_ring_gives_the_same_verdict_and_rows(ring: Path, tmp_path: Path, named: str) -> None:
    # GIVEN the bundle of the ring
    first = tmp_path / "first"
    assert main(["recover", str(ring), "-o", str(first)]) == 0
    # WHEN its kept ring is recovered again, the rings/ folder or the file named
    target = first / "rings" if named == "rings folder" else next((first / "rings").iterdir())
    again = tmp_path / "again"
    assert main(["recover", str(target), "-o", str(again), "--no-raw"]) == 0
    # THEN the verdict and every timeline row are the same as the original ring's
    before, after = (json.loads((b / "metadata.json").read_text()) for b in (first, again))
    assert after["death"] == before["death"] and after["cause"] == before["cause"] == "killed"
    assert after["recovery"] == before["recovery"] and after["events"] == before["events"] > 3000
    rows = [pq.read_table(b / "timeline.parquet") for b in (first, again)]
    assert rows[1].equals(rows[0])
    assert "planted-label" in rows[1]["label"].to_pylist()


def test_the_ring_kept_is_the_one_read_even_if_its_name_is_swapped_meanwhile(ring: Path, tmp_path: Path) -> None:
    # GIVEN a copy of the ring, recovered; once every ring is read (the verdict), its name is given to other bytes
    folder = tmp_path / "rings"
    folder.mkdir()
    copy = folder / "job.ring"
    copy.write_bytes(ring.read_bytes())
    decoy = folder / "decoy"
    decoy.write_bytes(b"\xff" * 4096)
    out = tmp_path / "b"

    def views(meta: dict[str, Any], read: bundle.Reader | None) -> dict[str, bytes]:
        if read is None:
            os.replace(decoy, copy)
        return {"summary.md": b"# s\n"}

    bundle.stream_bundle(RecoveryPass([copy], keep_raw=True), out, views)
    # THEN rings/ holds the ring that was recovered, never what the name held later
    assert copy.read_bytes() == b"\xff" * 4096
    kept = zstandard.ZstdDecompressor().stream_reader((out / "rings" / "job.ring.zst").read_bytes()).read()
    assert kept == ring.read_bytes()
    assert raw_of(out)["kept"][0]["sha256"] == hashlib.sha256(ring.read_bytes()).hexdigest()


def test_no_raw_keeps_no_ring(ring: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    assert main(["recover", str(ring), "-o", str(out), "--no-raw"]) == 0
    assert not (out / "rings").exists()
    assert "raw_rings" not in json.loads((out / "metadata.json").read_text())
    with_raw = tmp_path / "with"
    assert main(["recover", str(ring), "-o", str(with_raw)]) == 0
    assert [p.name for p in (with_raw / "rings").iterdir()] == [ring.name + ".zst"]


def test_rings_beyond_the_cap_are_skipped_and_named(
    ring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN two SIGKILLed children's rings, and a cap of one ring
    other = killed_ring(tmp_path / "other", 10)
    monkeypatch.setattr("blackbox.ring.packed.MAX_KEPT_RINGS", 1)
    out = tmp_path / "b"
    # WHEN both are recovered into one bundle
    assert main(["recover", str(ring), str(other), "-o", str(out)]) == 0
    # THEN the first is kept, the second is named as not kept, in metadata.json and summary.md
    raw = raw_of(out)
    assert [k["ring"] for k in raw["kept"]] == [str(ring)] and raw["max_rings"] == 1
    ((skipped),) = raw["skipped"]
    assert skipped["ring"] == str(other) and skipped["reason"] == "not kept: beyond the first 1 rings"
    assert [p.name for p in (out / "rings").iterdir()] == [ring.name + ".zst"]
    summary = (out / "summary.md").read_text()
    assert "## Raw rings (1 kept, 1 not kept)" in summary and f"`{other}`: not kept" in summary


def test_a_ring_compressed_after_the_timeline_is_the_same_as_one_compressed_ahead(
    ring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the ring's bundle, its ring compressed ahead while it was decoded (a full default ring fits)
    ahead = tmp_path / "ahead"
    assert main(["recover", str(ring), "-o", str(ahead)]) == 0
    # WHEN it is recovered again with no memory to compress ahead in (an incompressible ring's case)
    monkeypatch.setattr("blackbox.ring.packed.MAX_AHEAD_BYTES", 1024)
    after = tmp_path / "after"
    assert main(["recover", str(ring), "-o", str(after)]) == 0
    # THEN the ring is packed after the timeline, into the same bytes, with the same figures
    assert raw_of(after)["kept"] == raw_of(ahead)["kept"]
    name = f"rings/{ring.name}.zst"
    assert (after / name).read_bytes() == (ahead / name).read_bytes()


def test_once_the_memory_ahead_is_full_each_ring_is_still_read_once(
    ring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN four copies of the ring, and memory ahead for one and a half of them compressed
    folder = tmp_path / "rings"
    folder.mkdir()
    for i in range(4):
        (folder / f"rank{i}.ring").write_bytes(ring.read_bytes())
    one = len(zstandard.ZstdCompressor(level=packed.LEVEL).compress(ring.read_bytes()))
    monkeypatch.setattr(packed, "MAX_AHEAD_BYTES", one * 3 // 2)
    read: list[str] = []
    compress, pack = packed.compress, bundle.pack

    def counted_compress(fd: int, size: int, room: int) -> Any:
        read.append("ahead")
        return compress(fd, size, room)

    def counted_pack(fd: int, size: int, sink: Any) -> Any:
        read.append("after")
        return pack(fd, size, sink)

    monkeypatch.setattr(packed, "compress", counted_compress)
    monkeypatch.setattr(bundle, "pack", counted_pack)
    # WHEN they are recovered
    out = tmp_path / "b"
    assert main(["recover", str(folder), "-o", str(out)]) == 0
    # THEN the first is compressed ahead, the others (which would not fit) once each as they are written
    assert read == ["ahead", "after", "after", "after"]
    for kept in raw_of(out)["kept"]:
        assert zstandard.ZstdDecompressor().stream_reader((out / kept["file"]).read_bytes()).read() == ring.read_bytes()


def test_a_descriptor_handed_over_after_close_is_closed_not_kept(ring: Path) -> None:
    # GIVEN the rings kept by a bundle that has given up (closed), and a decode still running
    kept = packed.KeptRings()
    kept.close()
    fd = os.open(ring, os.O_RDONLY)
    # WHEN that decode hands its descriptor over
    kept.hold(ring, fd)
    # THEN it is closed at once, and nothing is compressed for it
    with pytest.raises(OSError):
        os.fstat(fd)
    assert not [t for t in threading.enumerate() if t.name.startswith("blackbox-pack")]


def test_rings_not_kept_leave_no_descriptor_or_thread_behind(
    ring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN three rings, a cap of one kept, and a fourth ring whose slots cannot be read (its header can)
    others = [killed_ring(tmp_path / f"other{i}", 10) for i in range(2)]
    bad = tmp_path / "bad.ring"
    bad.write_bytes(ring.read_bytes())
    read_slots = reader.read_slots

    def refused(fd: int, header: Any, size: int) -> Any:
        if os.readlink(f"/proc/self/fd/{fd}") == str(bad):
            raise NotARingError(f"{bad}: planted")
        return read_slots(fd, header, size)

    monkeypatch.setattr(reader, "read_slots", refused)
    monkeypatch.setattr("blackbox.ring.packed.MAX_KEPT_RINGS", 1)
    rings = {str(p) for p in (ring, *others, bad)}
    # WHEN they are recovered into one bundle
    assert main(["recover", str(ring), *map(str, others), str(bad), "-o", str(tmp_path / "b")]) == 0
    # THEN every descriptor opened for them is closed, and the thread that compressed them ahead is gone
    assert not [fd for fd, file in _open_files().items() if file in rings]
    assert not [t for t in threading.enumerate() if t.name.startswith("blackbox-pack")]
    raw = raw_of(tmp_path / "b")
    assert [k["ring"] for k in raw["kept"]] == [str(ring)]
    assert [s["ring"] for s in raw["skipped"]] == list(map(str, others))
    unread = json.loads((tmp_path / "b" / "metadata.json").read_text())["unread_rings"]
    assert unread == [{"ring": str(bad), "reason": f"{bad}: planted"}]


def _open_files() -> dict[str, str]:
    """This process's descriptors and what each is open on (the listing's own descriptor left out)."""
    files = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            files[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return files


def _limit_file_size(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails with EFBIG, it does not kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def planted(folder: Path, frame: bytes, raw: bytes | None = None, name: str = "planted.ring.zst") -> Path:
    """``folder`` made a bundle of one kept ring, the .zst ``frame``, listed in its metadata.json as
    ``raw`` (the bytes it should decompress to; by default what it does) as a hostile writer would list it."""
    (folder / "rings").mkdir(parents=True)
    (folder / "rings" / name).write_bytes(frame)
    if raw is None:
        raw = zstandard.ZstdDecompressor().stream_reader(frame, read_across_frames=True).read()
    listed = {"file": f"rings/{name}", "raw_bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    (folder / "metadata.json").write_text(json.dumps({"raw_rings": {"kept": [listed]}}))
    return folder / "rings" / name


def bomb(ring: Path, declared: int) -> tuple[bytes, int, str]:
    """A small .zst: a ring header (the ring's metadata) declaring about ``declared`` bytes, then ones up to
    that size: (the frame, its size once decompressed, the sha256 of those bytes, as a planted listing)."""
    crafted = fmt.encode_header(declared // fmt.RECORD_SIZE, 64 << 10, read_header(ring).meta, stacks_size=8192,
                                crash_size=4096)  # fmt: skip
    size = fmt.decode_header(crafted, len(crafted)).file_size
    compressor, digest = zstandard.ZstdCompressor(level=3).compressobj(), hashlib.sha256(crafted)
    parts, ones, at = [compressor.compress(crafted)], b"\x01" * (1 << 20), len(crafted)
    while at < size:
        piece = ones[: size - at]
        parts.append(compressor.compress(piece))
        digest.update(piece)
        at += len(piece)
    return b"".join([*parts, compressor.flush()]), size, digest.hexdigest()


def test_a_zstd_bomb_is_refused_in_one_line_and_no_file_grows_past_the_ratio(ring: Path, tmp_path: Path) -> None:
    # GIVEN a planted bundle whose one .zst of a few KiB decompresses to 256 MiB of ones, as its ring's header
    # and its bundle's listing (size and sha256) both declare
    frame, size, sha = bomb(ring, 256 << 20)
    assert len(frame) < 64 << 10
    planted_ring = planted(tmp_path / "bundle", frame, raw=b"")
    listed = {"file": f"rings/{planted_ring.name}", "raw_bytes": size, "sha256": sha}
    (tmp_path / "bundle" / "metadata.json").write_text(json.dumps({"raw_rings": {"kept": [listed]}}))
    private = tmp_path / "tmp"
    private.mkdir()
    room = unpack.RATIO_FLOOR + unpack.MAX_RATIO * len(frame)
    # WHEN its rings/ is recovered, no process allowed to write a file past the ratio's room and a MiB
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(private))
    proc = subprocess.run(
        [sys.executable, "-m", "blackbox", "recover", str(planted_ring.parent), "-o", str(tmp_path / "b")],
        capture_output=True, text=True, env=env, timeout=120,
        preexec_fn=lambda: _limit_file_size(room + (1 << 20)),
    )  # fmt: skip
    # THEN one line names what was expected and what was found, and nothing is left behind
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    said = f"{planted_ring}: expected at most 16 MiB and 64 times its {len(frame)} bytes once decompressed"
    assert said in proc.stderr
    assert "found more" in proc.stderr
    assert os.listdir(private) == [] and not (tmp_path / "b").exists()


def test_what_one_recovery_decompresses_is_bounded_in_all(ring: Path, tmp_path: Path) -> None:
    # GIVEN a bundle keeping three rings, and a recovery that may decompress two of them
    folder = tmp_path / "rings"
    folder.mkdir()
    for i in range(3):
        (folder / f"rank{i}.ring").write_bytes(ring.read_bytes())
    assert main(["recover", str(folder), "-o", str(tmp_path / "b")]) == 0
    recovery = RecoveryPass([tmp_path / "b" / "rings"])
    recovery.unpacking = unpack.Unpacking(2 * ring.stat().st_size + 1)
    # WHEN they are recovered
    tables = list(recovery.tables())
    meta = recovery.finish()
    # THEN two are read, the third named unread in one line, and all of the budget but a byte was used
    assert len(tables) == 2
    (unread,) = meta["unread_rings"]
    assert unread["ring"].endswith("rank2.ring.zst") and "beyond what one recovery decompresses" in unread["reason"]
    assert recovery.unpacking.left == 1


def test_a_kept_ring_whose_bytes_are_not_what_its_bundle_lists_is_refused(ring: Path, tmp_path: Path) -> None:
    # GIVEN the ring's bundle, its .zst then replaced by the ring with one byte of a record changed
    out = tmp_path / "b"
    assert main(["recover", str(ring), "-o", str(out)]) == 0
    changed = bytearray(ring.read_bytes())
    changed[read_header(ring).records_offset + 5000] ^= 0xFF
    zst = out / raw_of(out)["kept"][0]["file"]
    zst.write_bytes(zstandard.ZstdCompressor(level=1).compress(bytes(changed)))
    # WHEN the kept ring is recovered, THEN it is refused in one line naming both sizes and hashes
    code, err = _recover_err(zst, tmp_path / "again")
    listed = hashlib.sha256(ring.read_bytes()).hexdigest()[:16]
    found = hashlib.sha256(changed).hexdigest()[:16]
    assert code == 1 and err.count("\n") == 1, err
    assert f"expected the {len(changed)} bytes of sha256 {listed}... its bundle lists, found {len(changed)} bytes " \
           f"of sha256 {found}... (not read); `zstd -dc` gives the ring back" in err  # fmt: skip


def test_a_zst_no_bundle_lists_is_refused_and_zstd_gives_it_back(ring: Path, tmp_path: Path) -> None:
    # GIVEN a ring compressed by hand, in a folder with no bundle's metadata.json
    zst = tmp_path / "x" / "job.ring.zst"
    zst.parent.mkdir()
    zst.write_bytes(zstandard.ZstdCompressor(level=1).compress(ring.read_bytes()))
    # WHEN it is recovered, THEN it is refused in one line that says how to read it
    code, err = _recover_err(zst, tmp_path / "b")
    assert code == 1 and err.count("\n") == 1 and "`zstd -dc` gives the ring back" in err, err
    assert "metadata.json: expected the bundle's metadata.json, found nothing at that path" in err, err
    # AND decompressed by zstd it is recovered as any ring
    (tmp_path / "x" / "job.ring").write_bytes(subprocess.run(["zstd", "-dc", str(zst)], capture_output=True,
                                                             check=True).stdout)  # fmt: skip
    assert main(["recover", str(tmp_path / "x" / "job.ring"), "-o", str(tmp_path / "c"), "--no-raw"]) == 0


def _recover_err(target: Path, out: Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "blackbox", "recover", str(target), "-o", str(out), "--no-raw"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          timeout=120)  # fmt: skip
    return proc.returncode, proc.stderr


def _frame_with_window(log: int) -> bytes:
    """A zstd frame of a few bytes that asks its decompressor for a window of 2**log bytes."""
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=log)
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj()
    return stream.compress(b"x" * 100) + stream.flush()


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (
            b"not zstd at all\n" * 64,
            ": expected a zstd-compressed ring (a window of at most 32 MiB), found data zstd "
            "refuses (zstd decompress error: Unknown frame descriptor)",
        ),
        (
            _frame_with_window(27),
            ": expected a zstd-compressed ring (a window of at most 32 MiB), found data zstd refuses "
            "(zstd decompress error: Frame requires too much memory for decoding)",
        ),
        (
            zstandard.ZstdCompressor().compress(b"plain text, not a ring\n" * 64),
            " (decompressed): expected a blackbox ring",
        ),
    ],
    ids=["not zstd", "a 128 MiB window", "zstd of no ring"],
)
def test_a_zst_that_is_not_a_compressed_ring_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, found: str
) -> None:
    target = planted(tmp_path / "bundle", content, raw=b"listed as anything")
    assert main(["recover", str(target), "-o", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{target}{found}" in err, err


def test_a_frame_cut_short_is_refused_and_zstd_gives_its_events_back(ring: Path, tmp_path: Path) -> None:
    # GIVEN the ring's bundle, its .zst cut short (a copy interrupted) where the ring's first thousand slots end
    out = tmp_path / "b"
    assert main(["recover", str(ring), "-o", str(out)]) == 0
    header = read_header(ring)
    stream = zstandard.ZstdCompressor(level=1).compressobj()
    data = ring.read_bytes()
    cut = stream.compress(data[: header.records_offset + 1000 * 128]) + stream.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
    zst = out / raw_of(out)["kept"][0]["file"]
    zst.write_bytes(cut)
    # WHEN it is recovered, THEN it is refused in one line: not the bytes its bundle lists
    code, err = _recover_err(zst, tmp_path / "again")
    assert code == 1 and err.count("\n") == 1, err
    assert f"expected the {len(data)} bytes of sha256" in err and f"found {header.records_offset + 128000} bytes" in err
    # AND what zstd gives back of it (the CLI stops at its last whole buffer: 992 of the 1000 slots here) is
    # recovered as a truncated ring: every event of those slots salvaged
    back = tmp_path / "cut.ring"
    back.write_bytes(subprocess.run(["zstd", "-dc", str(zst)], capture_output=True).stdout)
    slots = (back.stat().st_size - header.records_offset) // 128
    assert 900 < slots <= 1000
    assert main(["recover", str(back), "-o", str(tmp_path / "c"), "--no-raw"]) == 0
    meta = json.loads((tmp_path / "c" / "metadata.json").read_text())
    assert meta["recovery"]["slots_read"] == slots and meta["recovery"]["slots"] == header.capacity
    seqs = pq.read_table(tmp_path / "c" / "timeline.parquet", columns=["seq"])["seq"].to_pylist()
    assert len(seqs) == meta["events"] == slots - 1 and max(seqs) == slots - 1


_PACKING_STALLS = """
import sys, time
from pathlib import Path
import blackbox.recovery.bundle as bundle
from blackbox._postmortem import write_postmortem

def stalls(*args):
    print("packing", flush=True)
    time.sleep(120)

bundle._pack_kept = stalls
write_postmortem([Path(sys.argv[1])], sys.argv[2], plot=False)
"""


def test_a_recovery_killed_while_packing_the_rings_leaves_the_verdict(ring: Path, tmp_path: Path) -> None:
    # GIVEN a recovery whose packing of the raw ring stalls, SIGKILLed there
    out = tmp_path / "b"
    proc = spawn_py(_PACKING_STALLS, str(ring), str(out), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "packing\n"
    finally:
        proc.kill()
        proc.wait(timeout=60)
    # THEN OUT holds the verdict: its metadata (complete: false) and summary, no rings/ yet
    verdict = json.loads((out / "metadata.json").read_text())
    assert verdict["complete"] is False and verdict["cause"] == "killed" and "raw_rings" not in verdict
    assert sorted(p.name for p in out.iterdir()) == ["allocations.parquet", "metadata.json", "ranks.parquet",
                                                      "summary.md"]  # fmt: skip
    # AND the next recovery into OUT writes the whole bundle, its raw ring with it
    assert main(["recover", str(ring), "-o", str(out)]) == 0
    assert raw_of(out)["kept"][0]["file"] == f"rings/{ring.name}.zst"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the killed one's holder removed


def test_blackbox_run_keeps_the_rings_of_the_job_it_recovers(tmp_path: Path) -> None:
    # GIVEN a job run under `blackbox run` that SIGKILLs itself after a marked step
    job = "import os, blackbox; blackbox.step(7); blackbox.mark('planted-label', 1); os.kill(os.getpid(), 9)"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path), "--", sys.executable, "-c", job],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # it ends as its job did
    # THEN its bundle keeps the job's ring, byte for byte, beside the verdict
    (run,) = tmp_path.glob("run-*")
    (ring,) = (run / "rings").glob("*.ring")
    (kept,) = raw_of(run / "bundle")["kept"]
    assert kept["file"] == f"rings/{ring.name}.zst"
    packed = (run / "bundle" / kept["file"]).read_bytes()
    assert zstandard.ZstdDecompressor().stream_reader(packed).read() == ring.read_bytes()
    assert json.loads((run / "bundle" / "metadata.json").read_text())["cause"] == "killed"


def _fill(folder: Path, leave: int) -> None:
    """Fill ``folder``'s filesystem until ``leave`` bytes are free."""
    filler = folder / "filler"
    with open(filler, "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(bytes(1 << 20))
                f.flush()
                os.fsync(f.fileno())
    st = os.statvfs(folder)
    os.truncate(filler, filler.stat().st_size - leave + st.f_bavail * st.f_frsize)


def test_a_disk_too_full_for_a_raw_ring_still_gets_the_whole_bundle(small_fs: Path, tmp_path: Path) -> None:
    # GIVEN a full default ring (its .zst about 1.8 MiB) and 1.2 MiB left on the bundle's disk
    ring = killed_ring(tmp_path / "full", 300_000)
    _fill(small_fs, 1200 << 10)
    out = small_fs / "b"
    # WHEN it is recovered there
    assert main(["recover", str(ring), "-o", str(out)]) == 0
    # THEN the whole bundle is written; the ring is named as not kept, with the reason, and no part of it left
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["complete"] is True and meta["raw_rings"]["kept"] == []
    ((skipped),) = meta["raw_rings"]["skipped"]
    assert skipped["ring"] == str(ring) and "No space left on device" in skipped["reason"]
    assert list((out / "rings").iterdir()) == []
    assert "## Raw rings (0 kept, 1 not kept)" in (out / "summary.md").read_text()
