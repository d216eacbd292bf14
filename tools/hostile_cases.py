"""Hostile inputs for ``tools/fuzz_recover.py --mode stacks|bundles`` (issue 23's findings, made at random).

- ``stack_case``: a version-3 ring whose stack table is shaped to cost the reader: deep stacks of long
  frames each sampled once, tables packed with tiny entries, one deep stack on every record, frames
  holding ``;``, escapes and broken UTF-8, damaged entries; up to 64 MiB of table.
- ``node_bundles``: two genuine node bundles (four crafted rings each, rank 5 on node001 dying first).
- ``bundle_case``: those bundles in a job folder with traps planted: ranks.parquet whose text decodes to
  gigabytes, a 1 MiB-per-bundle ``recovered_by``, metadata.json of millions of values, nested deep, of
  the wrong types, a FIFO or a link in its place, a planted bundle that claims node001's rings or copies
  them, host names holding escape sequences.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from craft_ring import craft_v3, records_of

from blackbox._postmortem import write_postmortem
from blackbox.ring import format as fmt

MiB = 1 << 20
EVIL = ["\x1b]0;PWNED\x07", "\x1b[2J", "\r\nblackbox: forged", ";", "\u202e", "\x9b31m", "\udcff"]


def _frame(rng: random.Random, size: int) -> str:
    text = "".join(rng.choice(["x", "y", *EVIL]) for _ in range(max(1, size // 8)))
    return (text * 8)[: max(1, size - 12)] + " (m.py:1)"


def stack_case(path: Path, rng: random.Random) -> dict[str, Any]:
    """Write one hostile ring at ``path``; returns what it is (its shape)."""
    shape = rng.choice(["distinct deep", "packed tiny", "one deep everywhere", "mixed"])
    table = rng.choice([1, 2, 8, 16, 64]) * MiB
    depth = rng.randint(1, fmt.MAX_STACK_DEPTH) if shape != "packed tiny" else rng.randint(1, 2)
    frame_bytes = rng.choice([1, 16, 200, 1000]) if shape != "distinct deep" else 1000
    entry = fmt.pad8(fmt.STACK_ENTRY.size + 4 * depth)
    frames: dict[tuple[int, int], str] = {}
    stacks: dict[tuple[int, int], list[int]] = {}
    keys: list[tuple[int, int]] = []
    for gen in (1, 2):
        for fid in range(1, 2 * depth + 1):
            frames[(gen, fid)] = _frame(rng, frame_bytes)
        room = table // 2 - 2 * depth * fmt.pad8(fmt.STACK_ENTRY.size + 4 * frame_bytes + 16)
        count = room // entry if shape != "one deep everywhere" else 1
        for sid in range(1, max(1, min(count, 400_000)) + 1):
            stacks[(gen, sid)] = [1 + j + depth * ((sid >> (j % 20)) & 1) for j in range(depth)]
            keys.append((gen, sid))
    records = rng.choice([1_000, 30_000, 200_000])
    if shape in ("one deep everywhere", "mixed"):
        picks = [keys[0]] * records if shape == "one deep everywhere" else [rng.choice(keys) for _ in range(records)]
    else:
        picks = keys[:records]
    gens, sids = np.array(picks, np.int64).T
    rec = records_of("stack_sample", len(picks), label=2, p0=1, p1=sids, p2=gens, p3=depth)
    samples = records_of("sample", len(picks), p0=(np.arange(len(picks)) * 4096 + (1 << 30)))
    both = np.empty(2 * len(picks), fmt.RECORD_DTYPE)
    both[0::2], both[1::2] = rec, samples  # a tick: its stack, then its memory sample
    both["time"] = np.sort(both["time"])
    craft_v3(path, {2: "MainThread" + rng.choice(EVIL)}, frames, stacks, both, stacks_size=table)
    if rng.random() < 0.3:  # damage: zero or garbage runs in the table
        with open(path, "r+b") as f:
            h = fmt.decode_header(f.read(fmt.MAX_HEADER_SIZE), os.fstat(f.fileno()).st_size)
            for _ in range(rng.randint(1, 20)):
                f.seek(h.stacks_offset + rng.randrange(h.stacks_size))
                f.write(rng.choice([bytes(rng.randint(1, 512)), rng.randbytes(rng.randint(1, 512))]))
    return {"shape": shape, "table": table, "depth": depth, "frame": frame_bytes, "records": len(picks)}


# ---------------------------------------------------------------- bundles


def node_bundles(folder: Path) -> Path:
    """Two node bundles of a real job (``tools/fleet.py``: eight processes under two host names, every one
    SIGKILLed, rank 5 on node001 first): the truth a job folder's traps must not hide."""
    rings = folder / "rings"
    subprocess.run([sys.executable, str(Path(__file__).with_name("fleet.py")), str(rings), "--ranks", "8", "--hosts",
                    "2", "--ring-mib", "1", "--victim", "5", "--per-host"], check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)))  # fmt: skip
    out = folder / "good"
    for host in ("node000", "node001"):
        write_postmortem([rings / host], out / host, plot=False)
    return out


def _edit(bundle: Path, change: Any) -> None:
    meta = json.loads((bundle / "metadata.json").read_text())
    change(meta)
    (bundle / "metadata.json").write_text(json.dumps(meta))


def _inflate(bundle: Path, count: int, pid: int) -> None:
    """``count`` rings in the bundle's metadata (copies of its first with new pids), no ranks.parquet."""
    _edit(bundle, lambda m: m.update(rings=[dict(m["rings"][0], pid=pid + i) for i in range(count)]))
    (bundle / "ranks.parquet").unlink(missing_ok=True)


def _ranks_bomb(bundle: Path, rows: int, column: str, text: str) -> None:
    base = pq.read_table(bundle / "ranks.parquet") if (bundle / "ranks.parquet").exists() else None
    meta = json.loads((bundle / "metadata.json").read_text())
    from blackbox.recovery.ranks import rank_rows, ranks_table

    table = ranks_table(rank_rows(meta)) if base is None or base.num_rows != rows else base
    values = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([text]))
    if column in table.column_names:
        table = table.set_column(table.schema.get_field_index(column), column, values)
    else:
        table = table.append_column(column, values)
    pq.write_table(table, bundle / "ranks.parquet", compression="zstd", compression_level=19, store_schema=False)


def _planted(job: Path, good: Path, name: str, pid: int) -> Path:
    """A copy of node000 under new pids (``pid`` + 10,000 times each ring's index)."""
    shutil.copytree(good / "node000", job / name)
    _edit(job / name, lambda m: [r.update(pid=pid + 10_000 * i) for i, r in enumerate(m["rings"])])
    (job / name / "ranks.parquet").unlink()
    return job / name


def bundle_case(job: Path, good: Path, secret: Path, rng: random.Random) -> list[str]:
    """The good bundles in ``job`` with 1 to 3 traps; returns the traps' names. node001 (which holds the
    first death) is only ever claimed by a planted bundle, never changed itself."""
    for host in ("node000", "node001"):
        shutil.copytree(good / host, job / host)
    traps = []
    for i in range(rng.randint(1, 3)):
        trap = rng.choice(["ranks extra column", "ranks text", "recovered_by", "floats", "long string", "nesting",
                           "wrong types", "containers", "fifo", "link", "claims node001", "copy of node001",
                           "escapes", "garbage ranks"])  # fmt: skip
        traps.append(trap)
        # each trap in a bundle of its own (a trap reads the metadata the genuine writer wrote)
        where = job / "node000" if i == 0 and rng.random() < 0.5 else _planted(job, good, f"plant{i}", 4_300_000 + i)
        if trap == "ranks extra column":
            _inflate(where, 1250, 4_400_000 + 10_000 * i)
            _ranks_bomb(where, 1250, "x", "y" * (2 * MiB))
        elif trap == "ranks text":
            _inflate(where, 40, 4_500_000 + 10_000 * i)
            _ranks_bomb(where, 40, rng.choice(["host", "cause", "ring"]), "h" * (2 * MiB))
        elif trap == "recovered_by":
            _edit(where, lambda m: m.update(recovered_by={"blackbox": "v" * rng.choice([MiB, 20 * MiB])}))
        elif trap == "floats":
            text = (where / "metadata.json").read_text().rstrip()[:-1]
            n = rng.choice([1_000_000, 5_000_000, 8_000_000])
            (where / "metadata.json").write_text(text + ', "x": [' + ",".join(["1.5"] * n) + "]}")
        elif trap == "long string":
            _edit(where, lambda m: m.update(x="s" * rng.choice([MiB, 30 * MiB])))
        elif trap == "nesting":
            text = (where / "metadata.json").read_text().rstrip()[:-1]
            (where / "metadata.json").write_text(text + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
        elif trap == "wrong types":
            _edit(where, lambda m: [r.update(host=[1], pid="x", death=5, started_at=7) for r in m["rings"][:2]])
        elif trap == "containers":
            (where / "metadata.json").write_text('{"rings": [' + ",".join(["{}"] * 2_100_000) + "]}")
        elif trap == "fifo":
            (where / "metadata.json").unlink()
            os.mkfifo(where / "metadata.json")
        elif trap == "link":
            (where / "metadata.json").unlink()
            (where / "metadata.json").symlink_to(secret)
        elif trap in ("claims node001", "copy of node001"):
            shutil.copytree(good / "node001", job / f"aaa{i}")
            if trap == "claims node001":  # sorts first, every ring of node001 ended cleanly by its account
                _edit(job / f"aaa{i}", lambda m: [r.update(death={"cause": "clean_exit", "time": r["last_event_at"]})
                                                  for r in m["rings"]])  # fmt: skip
                (job / f"aaa{i}" / "ranks.parquet").unlink()
        elif trap == "escapes":
            _edit(where, lambda m: [r.update(host=r["host"] + rng.choice(EVIL[:6])) for r in m["rings"]])
        elif trap == "garbage ranks":
            (where / "ranks.parquet").write_bytes(b"PAR1" + rng.randbytes(rng.randint(0, 4096)) + b"PAR1")
    return traps
