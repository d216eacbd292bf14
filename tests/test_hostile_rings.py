"""Rings crafted to hurt the one who recovers them (issue 23): escape sequences in every text a ring holds,
a stack table that folds into gigabytes, a string region of long labels. recover runs as root in an
epilogue: what it prints and writes stays inert, what it holds stays bounded (the bound itself, peak RSS
against the ring's size, is measured by tools/fuzz_recover.py --mode stacks and bench_recover_memory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO

from blackbox._postmortem import write_postmortem
from blackbox.recovery.kinds import of_kind
from blackbox.recovery.timeline import LABEL_CUT, MAX_FOLDED_TEXT, STACK_NOT_RENDERED, py_rows, ring_table
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring
from blackbox.ring.scan import ENTRY_COST, MAX_STACK_TEXT, MAX_STRING_TEXT
from blackbox.views.stacks import folded_stacks

sys.path.insert(0, str(REPO / "tools"))
from craft_ring import craft, craft_v3, label_bomb, mixed_records, records_of, stack_bomb, text_ring  # noqa: E402

# What a hostile writer puts in a name: a window title, a clear screen, a forged line, a bidi override, a ";"
EVIL = "\x1b]0;PWNED\x07\x1b[2J\x9b31m\r\nblackbox: forged;\u202eevil"
CONTROLS = ("\x1b", "\x07", "\x9b", "\r", "\u202e")


def blackbox_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blackbox", *args], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"})  # fmt: skip


def dictionary_bytes(column: pa.ChunkedArray) -> int:
    """The bytes of text a dictionary column holds (each distinct value once per chunk)."""
    return sum(chunk.dictionary.nbytes for chunk in column.chunks)


# ---------------------------------------------------------------- 3: text from a ring reaches a terminal inert


def test_recover_summary_prints_no_escape_from_a_ring(tmp_path: Path) -> None:
    ring = text_ring(tmp_path / "evil.ring", EVIL)
    proc = blackbox_cli("recover", str(ring), "-o", str(tmp_path / "b"), "--summary")
    assert proc.returncode == 0, proc.stderr
    summary = (tmp_path / "b" / "summary.md").read_text()
    for text in (proc.stdout, proc.stderr, summary):
        assert not any(c in text for c in CONTROLS), "a control character from the ring was rendered raw"
        assert not any(line.startswith("blackbox: forged") for line in text.splitlines()), "a line was forged"
    for shown in ("host\\x1b]0;PWNED\\x07", "--name=\\x1b]0;PWNED", "thread\\x1b]0;PWNED", "kill\\x1b]0;PWNED"):
        assert shown in summary, f"{shown} is not shown escaped"
    assert "\\u202eevil" in summary and "\\r\\n" in summary


def test_summary_and_info_of_a_ring_print_no_escape(tmp_path: Path) -> None:
    ring = text_ring(tmp_path / "evil.ring", EVIL)
    for args in (["summary", str(ring)], ["info", str(ring)]):
        proc = blackbox_cli(*args)
        assert proc.returncode == 0, proc.stderr
        assert not any(c in proc.stdout + proc.stderr for c in CONTROLS), args[0]
        assert not any(line.startswith("blackbox: forged") for line in proc.stdout.splitlines()), args[0]


def test_the_data_keeps_what_the_ring_holds(tmp_path: Path) -> None:
    # escaping is for rendering: metadata.json and the timeline keep the text as the ring wrote it
    ring = text_ring(tmp_path / "evil.ring", EVIL)
    meta = write_postmortem([ring], tmp_path / "b", plot=False)
    assert meta["host"] == f"host{EVIL}"
    assert json.loads((tmp_path / "b" / "metadata.json").read_text())["argv"] == ["train.py", f"--name={EVIL}"]
    labels = set(pq.read_table(tmp_path / "b" / "timeline.parquet", columns=["label"])["label"].to_pylist())
    assert f"mark{EVIL}" in labels and f"thread{EVIL}" in labels


def test_a_semicolon_in_a_frame_name_never_splits_the_frame(tmp_path: Path) -> None:
    # the writer writes ";" in a name as "," and line breaks as spaces; a crafted ring gets the same from the reader
    ring = text_ring(tmp_path / "evil.ring", EVIL)
    table = ring_table(read_ring(ring))
    stacks = {r["detail"] for r in py_rows(of_kind(table, "stack_sample", columns=["detail"]))}
    flat = EVIL.replace(";", ",").replace("\r", " ").replace("\n", " ")
    assert stacks == {f"outer{flat} (train.py:1);inner{flat} (train.py:2)"}
    assert folded_stacks(table) == f"outer{flat} (train.py:1);inner{flat} (train.py:2) 4\n"


# ---------------------------------------------------------------- 4: a stack table that folds into gigabytes


def test_distinct_deep_stacks_fold_to_bounded_text_the_most_sampled_first(tmp_path: Path) -> None:
    # GIVEN a 1 MiB table whose every record names its own stack of 64 frames of 1,000 bytes (200 MB
    # folded), the newest of them sampled 50 times more
    ring = read_ring(stack_bomb(tmp_path / "bomb.ring", stacks_size=1 << 20, hot=50))
    hot = ring.records[-1]
    # WHEN its timeline is built
    table = ring_table(ring)
    # THEN the text of the distinct stacks stays within the bound
    assert dictionary_bytes(table["detail"]) <= MAX_FOLDED_TEXT + 200 * len(ring.stacks.stacks)
    rows = py_rows(of_kind(table, "stack_sample", columns=["detail"]))
    # the most sampled one is rendered in full, outermost frame first
    frames = [ring.stacks.frames[(int(hot["p2"]), f)] for f in ring.stacks.stacks[(int(hot["p2"]), int(hot["p1"]))]]
    assert rows[-1]["detail"] == ";".join(frames) and len(frames) == fmt.MAX_STACK_DEPTH
    # and the others past the bound keep their id, each its own (they are never merged into one "stack")
    unrendered = [(r["detail"], rec) for r, rec in zip(rows, ring.records, strict=True) if r["detail"][0] == "<"]
    assert len(unrendered) > len(rows) / 2
    assert all(text == STACK_NOT_RENDERED.format(rec["p2"], rec["p1"]) for text, rec in unrendered)


def test_a_stack_table_packed_with_entries_is_read_within_its_bound(tmp_path: Path) -> None:
    # GIVEN a 16 MiB table of 500,000 one-frame stacks (as Python objects, several times the table)
    n = 250_000
    frames = {(g, 1): "f (m.py:1)" for g in (1, 2)}
    stacks = {(g, i): [1] for g in (1, 2) for i in range(1, n + 1)}
    rec = records_of("stack_sample", 3, label=2, p0=1, p1=[1, 2, n], p2=1, p3=1)
    ring = read_ring(craft_v3(tmp_path / "packed.ring", {2: "t"}, frames, stacks, rec, stacks_size=16 << 20))
    # THEN what is kept costs at most the bound; the rest is counted as not read
    kept = sum(ENTRY_COST + 4 * len(ids) for ids in ring.stacks.stacks.values())
    assert kept <= MAX_STACK_TEXT and ring.stacks.cut > 0
    # and the stacks that were kept (the first entries of each half) still resolve
    rows = py_rows(of_kind(ring_table(ring), "stack_sample", columns=["detail"]))
    assert [r["detail"] for r in rows[:2]] == ["f (m.py:1)", "f (m.py:1)"]


def test_one_deep_stack_in_every_row_writes_a_bundle(tmp_path: Path) -> None:
    # 40,000 samples of one stack of 64 frames of 1,000 bytes: written plain, a row group of it was 2.6 GB
    # of text, past what Arrow holds ("Take operation overflowed binary array capacity"): no bundle at all
    frames = {(1, i): f"f{i}_".ljust(988, "x") + f" (m.py:{i})" for i in range(1, 65)}
    rec = records_of("stack_sample", 40_000, label=2, p0=1, p1=1, p2=1, p3=64)
    ring = craft_v3(tmp_path / "deep.ring", {2: "MainThread"}, frames, {(1, 1): list(range(1, 65))}, rec)
    write_postmortem([ring], tmp_path / "b", plot=False)
    detail = pq.read_table(tmp_path / "b" / "timeline.parquet", columns=["kind", "detail"])
    stacks = of_kind(detail, "stack_sample")["detail"]
    assert len(stacks) == 40_000 and stacks.null_count == 0
    assert stacks.unique().to_pylist() == [";".join(frames[(1, i)] for i in range(1, 65))]


# ---------------------------------------------------------------- 9: a string region of long labels


def test_labels_past_the_bound_are_not_read_and_say_so(tmp_path: Path) -> None:
    # GIVEN 6,000 marks each with its own 4 KiB label (24 MiB of labels, each decoded into a str, then a
    # dictionary, then Parquet pages)
    ring = read_ring(label_bomb(tmp_path / "labels.ring", labels=6000))
    # THEN the labels kept cost at most the bound, and the rest of the region is counted as not read
    assert sum(ENTRY_COST + len(t) for t in ring.strings.values()) <= MAX_STRING_TEXT
    assert ring.strings_cut > 0
    table = ring_table(ring)
    labels = table["label"].to_pylist()
    kept = len(ring.strings)
    assert labels[0] == ring.strings[2] and labels[0].endswith("000000000000")  # the first ones, as written
    assert labels[kept] == LABEL_CUT.format(2 + kept)  # the rest: a placeholder that says why
    assert ring.recovery.labels_lost == 6000 - kept
    assert dictionary_bytes(table["label"]) <= MAX_STRING_TEXT + 100 * (6000 - kept)


@pytest.mark.parametrize("size", [1, 4096])
def test_a_ring_within_the_bounds_loses_no_label(tmp_path: Path, size: int) -> None:
    # the writer's region is 1 MiB: every label of a full one is read
    n = (1 << 20) // fmt.pad8(fmt.STRING_ENTRY.size + size)
    ring = read_ring(label_bomb(tmp_path / "full.ring", labels=n, size=max(size, 12)))
    assert ring.strings_cut == 0 and len(ring.strings) == n
    assert ring_table(ring) is not None and ring.recovery.labels_lost == 0
    assert np.all(ring.records["label"] >= 2)


# ---------------------------------------------------------------- every kind with payload words it never writes


@pytest.mark.parametrize("payload", [-1, 0, (1 << 63) - 1, -(1 << 63), 1 << 20])
def test_every_kind_with_any_payload_recovers_every_record(tmp_path: Path, payload: int) -> None:
    """A ring of each kind whose payload words all hold one value, -1 (what a writer leaves unmeasured)
    among them: a child sample naming no child took the whole recovery down with a traceback (int(NaN))."""
    folder = tmp_path / "rings"
    folder.mkdir()
    for kind in fmt.KIND_CODES:
        craft(folder / f"{kind}.ring", 64, kind, events=80, payload=payload)
    meta = write_postmortem([folder], tmp_path / "b", plot=False)
    assert meta["events"] == 64 * len(fmt.KIND_CODES) and not meta.get("unread_rings")
    kinds = pq.read_table(tmp_path / "b" / "timeline.parquet", columns=["kind"])["kind"].to_pylist()
    assert sorted(set(kinds)) == sorted(fmt.KIND_CODES)


def test_marks_among_every_kind_with_any_payload_draw_the_whole_bundle(tmp_path: Path) -> None:
    """memory.png, the report, watch and the exports of a ring whose few records of each kind hold
    anything: a step record with no number drew NaN into the step axis (int(NaN)) and took recover,
    report and watch down."""
    ring = craft_v3(tmp_path / "mixed.ring", {2: "m"}, {}, {}, mixed_records(20_000, 3))
    bundle = tmp_path / "b"
    proc = blackbox_cli("recover", str(ring), "-o", str(bundle), "--summary")
    assert proc.returncode == 0, proc.stderr
    assert (bundle / "memory.png").stat().st_size > 0 and "Traceback" not in proc.stderr
    assert pq.read_metadata(bundle / "timeline.parquet").num_rows == 20_000
    out = str(tmp_path / "out")
    for args in (["report", str(bundle), "-o", out], ["watch", "--once", str(ring)],
                 ["watch", "--once", "--json", str(ring)], ["export", "--perfetto", str(bundle), "-o", out],
                 ["export", "--speedscope", str(bundle), "-o", out], ["plot", str(bundle), "-o", out + ".png"]):
        proc = blackbox_cli(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)


@pytest.mark.parametrize("label", [(1 << 22) + 1, (1 << 31) + 5])
def test_label_ids_beyond_the_counted_table_give_a_timeline_not_an_overflow(tmp_path: Path, label: int) -> None:
    """Label ids are small integers in a real ring; a planted ring of more than 4096 marks whose label ids lie
    past the ids counted in a table (1 << 22) raised OverflowError in ring_table, which stopped a whole
    recovery. Now: every row kept, each label the lost-label text, every one counted lost."""
    good = records_of("mark", 5_000, label=2)
    bad = records_of("mark", 5_000, label=label)
    ring = read_ring(craft_v3(tmp_path / "ids.ring", {2: "m"}, {}, {}, np.concatenate([good, bad])))
    table = ring_table(ring)
    labels = table["label"].to_pylist()
    assert len(labels) == 10_000 and labels[:5_000] == ["m"] * 5_000
    assert set(labels[5_000:]) == {f"<blackbox: label #{label} lost>"}
    assert ring.recovery.labels_lost == 5_000


def test_a_ring_that_trips_a_fault_in_blackbox_loses_only_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ring on which recovery itself fails (here a planted OverflowError, as a ring of huge label ids raised)
    is listed unread with what raised, in one line; the other ring is recovered and the command succeeds."""
    from blackbox.cli import main
    from blackbox.recovery import pipeline

    (tmp_path / "rings").mkdir()
    good = craft_v3(tmp_path / "rings" / "good.ring", {2: "m"}, {}, {}, records_of("mark", 100, label=2))
    bad = craft_v3(tmp_path / "rings" / "bad.ring", {2: "m"}, {}, {}, records_of("mark", 50, label=2))
    real = pipeline.ring_table

    def tripping(ring: object, **kwargs: object) -> pa.Table:
        if getattr(ring, "path", None) == bad:
            raise OverflowError("planted")
        return real(ring, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "ring_table", tripping)
    assert main(["recover", str(good), str(bad), "-o", str(tmp_path / "b"), "--no-raw"]) == 0
    meta = json.loads((tmp_path / "b" / "metadata.json").read_text())
    assert meta["unread_rings"] == [{"ring": str(bad), "reason": f"{bad}: could not be recovered, a fault in "
                                     "blackbox (OverflowError: planted); the other rings were recovered"}]  # fmt: skip
    assert pq.read_table(tmp_path / "b" / "timeline.parquet").num_rows == 100
