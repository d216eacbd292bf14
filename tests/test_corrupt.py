"""Bad input: every valid record is salvaged, or a one-line BlackboxError says what was wrong."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import labels_of

import blackbox
from blackbox.cli import main
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    rec = blackbox.Recorder.arm(tmp_path / "good.ring", capacity=128, sample_interval=3600)
    for i in range(100):
        rec.mark(f"m{i % 5}", i)
    rec.disarm()
    assert rec.path is not None
    return rec.path


def _copy(src: Path, name: str) -> Path:
    dst = src.with_name(name)
    shutil.copyfile(src, dst)
    return dst


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "expected" in text and "found" in text
    return text


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(blackbox.RingNotFoundError) as e:
        read_ring(tmp_path / "nope.ring")
    assert "found nothing" in _one_line(e)


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.ring").write_bytes(b"")
    with pytest.raises(blackbox.NotARingError) as e:
        read_ring(tmp_path / "empty.ring")
    assert "empty file" in _one_line(e)


def test_garbage_file(tmp_path: Path) -> None:
    (tmp_path / "junk.ring").write_bytes(b"PK\x03\x04 this is a zip, not a ring" * 100)
    with pytest.raises(blackbox.NotARingError) as e:
        read_ring(tmp_path / "junk.ring")
    assert "PK" not in _one_line(e) and "zip" not in str(e.value)  # never a file's bytes: it may be another user's


def test_short_file_with_magic(tmp_path: Path) -> None:
    (tmp_path / "short.ring").write_bytes(fmt.MAGIC + b"\x01")
    with pytest.raises(blackbox.NotARingError) as e:
        read_ring(tmp_path / "short.ring")
    assert "9-byte file" in _one_line(e)


def test_wrong_version(ring: Path) -> None:
    bad = _copy(ring, "v99.ring")
    with open(bad, "r+b") as f:
        f.seek(8)
        f.write((99).to_bytes(2, "little"))
    with pytest.raises(blackbox.UnsupportedVersionError) as e:
        read_ring(bad)
    assert "version 99" in _one_line(e)


def test_bit_flip_in_header(ring: Path) -> None:
    bad = _copy(ring, "flip.ring")
    data = bytearray(bad.read_bytes())
    data[100] ^= 0x10  # inside the metadata JSON
    bad.write_bytes(bytes(data))
    with pytest.raises(blackbox.CorruptHeaderError) as e:
        read_ring(bad)
    assert "checksum" in _one_line(e)


def test_bit_flip_in_a_record_drops_only_that_record(ring: Path) -> None:
    good = read_ring(ring)
    bad = _copy(ring, "recflip.ring")
    data = bytearray(bad.read_bytes())
    slot = int(good.records["seq"][50]) % 128
    data[good.header.records_offset + slot * fmt.RECORD_SIZE + 40] ^= 0x01  # the label id
    data[good.header.records_offset + slot * fmt.RECORD_SIZE + 120] ^= 0x01  # and the commit word
    bad.write_bytes(bytes(data))
    damaged = read_ring(bad)
    assert damaged.recovery.valid == good.recovery.valid - 1 and damaged.recovery.torn == 1
    assert damaged.recovery.holes == 1
    assert set(damaged.records["seq"].tolist()) == set(good.records["seq"].tolist()) - {int(good.records["seq"][50])}


def test_truncated_file_salvages_the_slots_it_still_has(ring: Path) -> None:
    good = read_ring(ring)
    bad = _copy(ring, "trunc.ring")
    keep = good.header.records_offset + 40 * fmt.RECORD_SIZE + 17
    with open(bad, "r+b") as f:
        f.truncate(keep)
    part = read_ring(bad)
    assert part.recovery.slots_read == 40 and part.recovery.slots == 128
    assert 0 < part.recovery.valid <= 40
    expected = {int(s) for s in good.records["seq"] if int(s) % 128 < 40}
    assert set(part.records["seq"].tolist()) == expected


def test_truncated_inside_header(ring: Path) -> None:
    bad = _copy(ring, "hdr.ring")
    with open(bad, "r+b") as f:
        f.truncate(80)
    with pytest.raises(blackbox.CorruptHeaderError):
        read_ring(bad)


def test_zeroed_records_give_an_empty_timeline_not_an_error(ring: Path, tmp_path: Path) -> None:
    good = read_ring(ring)
    bad = _copy(ring, "zero.ring")
    with open(bad, "r+b") as f:
        f.seek(good.header.records_offset)
        f.write(bytes(128 * fmt.RECORD_SIZE))
    z = read_ring(bad)
    assert z.recovery.valid == 0 and z.recovery.empty == 128
    out = blackbox.recover(bad, tmp_path / "zb")
    assert "0 events recovered" in (out / "summary.md").read_text()


def test_damaged_string_entry_loses_only_its_label(ring: Path) -> None:
    good = read_ring(ring)
    bad = _copy(ring, "str.ring")
    data = bytearray(bad.read_bytes())
    region = data[good.header.strings_offset : good.header.strings_offset + 4096]
    at = bytes(region).index(b"m2")
    data[good.header.strings_offset + at] ^= 0xFF
    bad.write_bytes(bytes(data))
    damaged = read_ring(bad)
    assert damaged.recovery.strings_damaged == 1 and damaged.recovery.valid == good.recovery.valid
    labels = labels_of(damaged)
    assert "m1" in labels and "m3" in labels and "m2" not in labels


def test_cli_prints_one_line_and_exits_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "junk.ring").write_bytes(b"\x00garbage")
    for argv in (
        ["recover", str(tmp_path / "junk.ring"), "-o", str(tmp_path / "o")],
        ["info", str(tmp_path / "missing.ring")],
        ["recover", str(tmp_path), "-o", str(tmp_path / "o2")],
    ):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("blackbox: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_zeroed_hole_in_string_region_keeps_the_entries_after_it(ring: Path) -> None:
    good = read_ring(ring)
    bad = _copy(ring, "hole.ring")
    data = bytearray(bad.read_bytes())
    first = fmt.string_entry(1, fmt.STRING_FULL_TEXT)  # the entry every ring starts with
    hole = slice(good.header.strings_offset, good.header.strings_offset + len(first))
    data[hole] = bytes(len(first))
    bad.write_bytes(bytes(data))
    holed = read_ring(bad)
    assert holed.strings == {k: v for k, v in good.strings.items() if k != fmt.STRING_FULL_ID}
    assert holed.recovery.valid == good.recovery.valid
