"""Rings of one process that replaced its program (exec): the same owner, host, boot, pid and start time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blackbox.recovery.pipeline import exec_successors


def _ident(pid: int, ticks: int | None, argv: list[str], uid: int = 1000) -> dict[str, Any]:
    return {"host": "h", "boot_id": "b", "pid_ns": "pid:[1]", "pid": pid, "start_ticks": ticks, "argv": argv,
            "_uid": uid}


def test_a_later_ring_of_the_same_process_is_what_it_execd() -> None:
    a, b, c = Path("launch.ring"), Path("train.ring"), Path("again.ring")
    idents = {b: (_ident(7, 500, ["train.py", "6"]), 20), a: (_ident(7, 500, ["launch.py"]), 10),
              c: (_ident(7, 500, ["train.py", "--resume"]), 30)}  # fmt: skip
    assert exec_successors(idents) == {a: "train.py 6", b: "train.py --resume"}


def test_a_pid_used_again_another_owner_or_container_or_no_start_time_is_no_exec() -> None:
    first, reused, planted, old, boxed = (Path(f"{n}.ring") for n in range(5))
    idents = {first: (_ident(7, 500, ["train.py"]), 10), reused: (_ident(7, 900, ["other.py"]), 20),
              planted: (_ident(7, 500, ["evil.py"], uid=1001), 30), old: (_ident(8, None, ["x.py"]), 5),
              boxed: ({**_ident(7, 500, ["rank1.py"]), "pid_ns": "pid:[2]"}, 40)}  # fmt: skip
    assert exec_successors(idents) == {}
