"""``blackbox recover BUNDLE/rings`` run as root over a bundle a user planted: the work is bounded.

summary.md tells its readers to run that command, so a user who plants a bundle of decompression bombs
(each a .zst of a few dozen KiB whose ring header, and whose bundle's listing, declare 1 GiB of non-zero
bytes) gets root to run it. The attacker is a user made with ``useradd`` (``users.py``); root's command
runs in a process of its own, which reports what it wrote (``wchar``) and its peak memory (``VmHWM``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from conftest import REPO
from users import local_users, shared_folder

from blackbox.ring import format as fmt
from blackbox.ring import packed as unpack

pytestmark = pytest.mark.slow  # root's command in a process of its own, and a user
FILES = 64  # the most rings a bundle keeps
DECLARED = 1 << 30

_MEASURED = """
import atexit, sys
from blackbox.cli import main

def said():
    io = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    hwm = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(f"MEASURED wchar={io['wchar'].strip()} vmhwm_kib={hwm}", file=sys.stderr)

atexit.register(said)
sys.exit(main(sys.argv[1:]))
"""


def _bomb() -> bytes:
    """One zstd frame: a ring header declaring 1 GiB of slots, then that many bytes of ones."""
    header = fmt.encode_header(DECLARED // fmt.RECORD_SIZE, 64 << 10, {"identity": {"host": "h", "pid": 1}})
    size = fmt.decode_header(header, len(header)).file_size
    stream = zstandard.ZstdCompressor(level=3).compressobj()
    parts, ones, at = [stream.compress(header)], b"\x01" * (1 << 20), len(header)
    while at < size:
        parts.append(stream.compress(ones[: size - at]))
        at += min(len(ones), size - at)
    return b"".join([*parts, stream.flush()])


def test_a_bundle_of_decompression_bombs_costs_root_a_bounded_work(tmp_path: Path) -> None:
    frame = _bomb()
    assert len(frame) < 64 << 10, len(frame)
    with local_users("bomber") as (attacker,), shared_folder() as shared:
        # GIVEN the attacker's bundle: 64 such .zst in rings/, each listed in its metadata.json as 1 GiB
        bundle = shared / "bundle"
        (bundle / "rings").mkdir(parents=True)
        kept = []
        for i in range(FILES):
            (bundle / "rings" / f"r{i}.ring.zst").write_bytes(frame)
            kept.append({"file": f"rings/r{i}.ring.zst", "raw_bytes": DECLARED + (64 << 10), "sha256": "0" * 64})
        (bundle / "metadata.json").write_text(json.dumps({"raw_rings": {"kept": kept}}))
        attacker.give(bundle)
        # WHEN root recovers its rings, as summary.md says to
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", _MEASURED, "recover", str(bundle / "rings"), "-o",
                               str(tmp_path / "again")], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
        wall = time.monotonic() - started
    # THEN each .zst is refused in one line, and the whole recovery wrote and held little, quickly
    measured = dict(kv.split("=") for kv in proc.stderr.rsplit("MEASURED ", 1)[1].split())
    written, peak = int(measured["wchar"]), int(measured["vmhwm_kib"]) << 10
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("MEASURED")]
    assert proc.returncode == 1 and len(lines) == 1 and f"(and {FILES - 1} more" in lines[0], proc.stderr
    room = unpack.RATIO_FLOOR + unpack.MAX_RATIO * len(frame)
    assert written < 2 * room + (1 << 20), f"wrote {written >> 20} MiB"  # two attempted, within the ratio each
    assert peak < 400 << 20, f"peak {peak >> 20} MiB"
    assert wall < 60, wall
