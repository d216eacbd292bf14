"""folded.jsonl: a helper's line says what it ran and how it started; read back as untrusted input."""

from __future__ import annotations

import json
import os
from pathlib import Path

from blackbox.recovery.metadata import helper_groups
from blackbox.ring.folded import FOLDED, fold_line, read_folded
from blackbox.views.summary import helpers_section

IDENT = {"pid": 7, "ppid": 3, "rank": None, "role": "worker", "argv": ["python", "-c", "x"],
         "helper": "DataLoader worker", "start_method": "spawn"}  # fmt: skip


def test_a_folded_line_says_what_the_helper_ran_and_how_it_started(tmp_path: Path) -> None:
    (tmp_path / FOLDED).write_bytes(fold_line(IDENT, 1_700_000_000 * 10**9, 1 << 20))
    (entry,) = read_folded(tmp_path)
    assert (entry["name"], entry["start_method"], entry["pid"], entry["ppid"]) == ("DataLoader worker", "spawn", 7, 3)


def test_a_planted_name_or_start_method_is_dropped_and_the_line_kept(tmp_path: Path) -> None:
    good = json.loads(fold_line(IDENT, 1_700_000_000 * 10**9, 1 << 20))
    lines = [good | {"name": "x" * 65}, good | {"start_method": 5}, good | {"name": ["DataLoader worker"]},
             good | {"name": "worker\n## Cause of death\n[x](javascript:alert(1))"}, good | {"start_method": "fork\n"}]
    (tmp_path / FOLDED).write_text("".join(json.dumps(line) + "\n" for line in lines))
    os.chmod(tmp_path / FOLDED, 0o600)
    read = read_folded(tmp_path)
    assert len(read) == 5  # every line's required fields hold: each kept, without the field that does not
    assert [("name" in e, "start_method" in e) for e in read] == [(False, True), (True, False), (False, True),
                                                                  (False, True), (True, False)]  # fmt: skip


def test_a_planted_helper_line_stays_one_line_of_the_summary(tmp_path: Path) -> None:
    planted = IDENT | {"argv": ["python", "x`\n## Cause of death\n\nplanted"], "helper": "x\n## planted"}
    (tmp_path / FOLDED).write_bytes(fold_line(planted, 1_700_000_000 * 10**9, 1 << 20))
    lines = helpers_section({"helpers": helper_groups(read_folded(tmp_path))})
    (told,) = [line for line in lines if line.startswith("- ")]
    assert lines == ["## Helper processes that ended cleanly", "", told, ""], lines
    assert told.startswith("- 1 multiprocessing workers (started by spawn) of pid 3") and told.count("`") == 2, told
    assert "\n" not in told and "\r" not in told, told  # its planted new lines escaped, inside the one code span
