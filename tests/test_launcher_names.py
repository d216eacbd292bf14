"""What a launcher's ring is named by its command: torchrun's agent and accelerate's launcher, however started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import REPO

from blackbox.recovery.helpers import process_name

EMPTY = pa.table({"kind": pa.array([], pa.string())})


@pytest.mark.parametrize(("argv", "name"), [
    (["/v/bin/torchrun", "--nproc-per-node=2", "train.py"], "torchrun agent"),
    (["-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"], "torchrun agent"),
    (["/v/lib/python3.11/site-packages/torch/distributed/run.py", "train.py"], "torchrun agent"),
    (["-m", "torch.distributed.launch", "train.py"], "torchrun agent"),
    (["/v/bin/accelerate", "launch", "--multi_gpu", "train.py"], "accelerate launcher"),
    (["-m", "accelerate.commands.launch", "--multi_gpu", "train.py"], "accelerate launcher"),
    (["/v/lib/python3.11/site-packages/accelerate/commands/launch.py", "train.py"], "accelerate launcher"),
    (["/v/bin/accelerate", "config"], "main process"),  # not a launch
    (["-m", "mytrainer", "launch"], "main process"),
    (["train.py", "launch"], "main process"),
    (["-m"], "main process"),
])  # fmt: skip
def test_a_launchers_ring_is_named_by_its_command(argv: list[str], name: str) -> None:
    assert process_name({"role": "main", "argv": argv}, EMPTY) == name


def test_a_module_run_with_dash_m_is_named_in_the_argv_recorded_before_runpy_sets_it(tmp_path: Path) -> None:
    # GIVEN `python -m pkg.job`, whose package's __init__ runs while sys.argv[0] is still "-m" (as blackbox
    # run's start-up arms: before runpy set it to the module's file)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(
        "import sys\nfrom blackbox.collect.identity import command_argv\nprint(sys.argv[0], command_argv())\n")
    (tmp_path / "pkg" / "job.py").write_text("")
    out = subprocess.run([sys.executable, "-m", "pkg.job", "--flag"], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={"PYTHONPATH": f"{REPO}:{tmp_path}"}).stdout  # fmt: skip
    # THEN the argv recorded names the module (it read ['-m', '--flag'])
    assert out == "-m ['-m', 'pkg.job', '--flag']\n", out


@pytest.mark.parametrize("victim", [{"pid": 50, "role": "accelerate launcher"}, {"pid": 50, "role": "torchrun agent"},
                                    None, {"pid": 50, "role": None}])  # fmt: skip
def test_a_rank_a_launcher_stopped_is_said_stopped_by_it_whatever_its_bundle_says(victim: object) -> None:
    from blackbox.recovery.attempts import deaths

    at = "2026-11-23T10:00:{:02d}.000000Z"
    sigterm = {"signal": "SIGTERM", "sender": "pt_elastic", "sender_pid": 50, "time": at.format(5)}
    # GIVEN rank 1 killed at :04, then its launcher's SIGTERM to rank 0 at :05, the launcher's own death at :06 (its
    # ring's victim as job.py's reading of a bundle may hold it: named, missing, or with no role)
    ring = {"host": "n1", "role": "main", "started_at": at.format(0)}
    group = [
        ring | {"pid": 11, "rank": 1, "ppid": 50, "last_event_at": at.format(4),
                "death": {"cause": "killed", "time": at.format(4), "victim": {"pid": 11}}},
        ring | {"pid": 10, "rank": 0, "ppid": 50, "last_event_at": at.format(5),
                "death": {"cause": "signal", "time": at.format(5), "killed_by": sigterm, "victim": {"pid": 10}}},
        ring | {"pid": 50, "rank": None, "last_event_at": at.format(6), "raised": "ChildFailedError",
                "death": {"cause": "exception", "time": at.format(6), "victim": victim}},
    ]  # fmt: skip
    first, collateral, _ = deaths(group)
    # THEN rank 1 died first, and rank 0 was stopped by accelerate launch where its ring says so, else by torchrun
    assert first is not None and first["pid"] == 11
    stopped, launcher = collateral  # (the launcher's exception: its report of rank 1's death, collateral too)
    assert launcher["pid"] == 50 and launcher["death"]["collateral_of"]["reported"] is True, launcher["death"]
    named = isinstance(victim, dict) and victim.get("role") == "accelerate launcher"
    assert stopped["death"]["collateral_of"]["by"] == ("accelerate launch" if named else "torchrun")
