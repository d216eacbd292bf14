"""folded.jsonl: a helper's line says what it ran and how it started; read back as untrusted input."""

from __future__ import annotations

import json
import os
from pathlib import Path

from blackbox.ring.folded import FOLDED, fold_line, read_folded

IDENT = {"pid": 7, "ppid": 3, "rank": None, "role": "worker", "argv": ["python", "-c", "x"],
         "helper": "DataLoader worker", "start_method": "spawn"}  # fmt: skip


def test_a_folded_line_says_what_the_helper_ran_and_how_it_started(tmp_path: Path) -> None:
    (tmp_path / FOLDED).write_bytes(fold_line(IDENT, 1_700_000_000 * 10**9, 1 << 20))
    (entry,) = read_folded(tmp_path)
    assert (entry["name"], entry["start_method"], entry["pid"], entry["ppid"]) == ("DataLoader worker", "spawn", 7, 3)


def test_a_planted_name_or_start_method_is_dropped_and_the_line_kept(tmp_path: Path) -> None:
    good = json.loads(fold_line(IDENT, 1_700_000_000 * 10**9, 1 << 20))
    lines = [good | {"name": "x" * 65}, good | {"start_method": 5}, good | {"name": ["DataLoader worker"]}]
    (tmp_path / FOLDED).write_text("".join(json.dumps(line) + "\n" for line in lines))
    os.chmod(tmp_path / FOLDED, 0o600)
    read = read_folded(tmp_path)
    assert len(read) == 3  # every line's required fields hold: each kept, without the field that does not
    assert [("name" in e, "start_method" in e) for e in read] == [(False, True), (True, False), (False, True)]
