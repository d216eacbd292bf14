"""collect/dist_rank.py: the rank torch.distributed gave a process, said once, never an error of its own."""

from __future__ import annotations

import sys
import types

import pytest

from blackbox.collect.dist_rank import DistRank
from blackbox.ring import format as fmt


def test_a_torch_distributed_still_being_imported_is_asked_again_later(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN torch.distributed half imported by the job's thread (a red team's `python -c "import torch.distributed"`
    # under `blackbox run`: the sampler's AttributeError was a BlackboxWarning on the job's stderr, 2 runs of 4)
    marks: list[str] = []
    half = types.ModuleType("torch.distributed")
    monkeypatch.setitem(sys.modules, "torch.distributed", half)
    said = DistRank(known=False, mark=marks.append)
    said.poll()  # (no is_initialized yet: AttributeError before)
    half.is_available = lambda: True  # type: ignore[attr-defined]
    half.is_initialized = lambda: False  # type: ignore[attr-defined]
    said.poll()
    assert marks == []
    # WHEN its default group is up
    half.is_initialized = lambda: True  # type: ignore[attr-defined]
    half.get_rank, half.get_world_size = (lambda: 1), (lambda: 3)  # type: ignore[attr-defined]
    said.poll()
    said.poll()
    # THEN the rank is said once
    assert marks == [f"{fmt.RANK_PREFIX}1 of 3"]


def test_a_rank_known_from_the_environment_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    marks: list[str] = []
    done = types.ModuleType("torch.distributed")
    done.is_available = done.is_initialized = lambda: True  # type: ignore[attr-defined]
    done.get_rank, done.get_world_size = (lambda: 0), (lambda: 2)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.distributed", done)
    DistRank(known=True, mark=marks.append).poll()
    assert marks == []
