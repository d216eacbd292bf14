"""What a process of the job is, named as its user would name it (pure).

A ring's ``identity.role`` says where the process stands (the job's own, a
multiprocessing child, torch.compile's, another Python child); its name says
what it is:

- ``main``: the ``torchrun agent`` where its command is torchrun
  (``torchrun``, ``python -m torch.distributed.run`` or ``.launch``), the
  ``accelerate launcher`` where it is ``accelerate launch`` (which runs
  torchrun's agent in its own process for several processes), else the
  ``main process``;
- ``worker``: a multiprocessing child, named by what it ran: as it named itself
  (``blackbox helper: NAME``, from its Process's target, FORMAT.md), else from
  its own stack samples: a ``DataLoader worker`` (torch's ``_worker_loop``), a
  ``multiprocessing Pool worker`` (``multiprocessing/pool.py``'s ``worker``),
  else a ``multiprocessing worker``; its start method (``fork``, ``spawn``,
  ``forkserver``) is ``identity.start_method``, said beside the name;
- ``compile_worker``, ``mp_service``, ``child``: as ``ROLE`` says.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..collect.identity import SPAWNED_RANK
from ..ring import format as fmt
from .kinds import of_kind

ROLE = {"main": "main process", "worker": "multiprocessing worker", "mp_service": "multiprocessing service process",
        "compile_worker": "torch.compile worker", "child": "child process"}  # fmt: skip
# (a frame of the stack, as a stack sample folds it: "function (path:line)"; the name it gives)
WORKER_FRAMES = (
    (r"(^|;)_worker_loop \([^;]*torch/utils/data/", "DataLoader worker"),
    (r"(^|;)worker \([^;]*multiprocessing/pool\.py:", "multiprocessing Pool worker"),
    (r"(^|;)_wrap \([^;]*torch/multiprocessing/spawn\.py:", SPAWNED_RANK),
)
TORCHRUN = ("torch/distributed/run.py", "torch/distributed/launch.py")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")  # as `python -m` names them
ACCELERATE = "accelerate/commands/launch.py"  # `python -m accelerate.commands.launch`, once runpy ran it
ACCELERATE_MODULE = "accelerate.commands.launch"
START_METHODS = ("fork", "spawn", "forkserver")
LAUNCHED_BY = {"torchrun agent": "torchrun", "accelerate launcher": "accelerate launch"}  # a launcher's ring -> said


def process_name(ident: dict[str, Any], table: pa.Table) -> str:
    """The name of the process that wrote this ring (see the module docstring)."""
    role = str(ident.get("role"))
    if role == "worker":
        return _worker_kind(table)
    if role in ("main", "None") and (launcher := _launcher(ident.get("argv"))):
        return launcher
    return ROLE.get(role, "main process")


def launcher_said(death: Any) -> str | None:
    """``torchrun`` or ``accelerate launch`` where a ring's death names its process as that launcher, else None
    (a death read from a bundle is whatever the bundle holds)."""
    victim = death.get("victim") if isinstance(death, dict) else None
    role = victim.get("role") if isinstance(victim, dict) else None
    return LAUNCHED_BY.get(role) if isinstance(role, str) else None


def start_method(ident: dict[str, Any]) -> str | None:
    method = ident.get("start_method")
    return method if method in START_METHODS else None


def _launcher(argv: Any) -> str | None:
    """``torchrun agent`` or ``accelerate launcher`` where the command is one, else None."""
    if not isinstance(argv, list) or not argv or not isinstance(argv[0], str):
        return None
    module = argv[1] if argv[0] == "-m" and len(argv) > 1 and isinstance(argv[1], str) else None  # python -m M
    if os.path.basename(argv[0]) == "torchrun" or argv[0].endswith(TORCHRUN) or module in TORCHRUN_MODULES:
        return "torchrun agent"
    launch = argv[1:2] == ["launch"] and os.path.basename(argv[0]) == "accelerate"
    return "accelerate launcher" if launch or argv[0].endswith(ACCELERATE) or module == ACCELERATE_MODULE else None


def _worker_kind(table: pa.Table) -> str:
    """What a multiprocessing child ran: as it named itself (a ``blackbox helper: NAME`` mark), else from the
    distinct stacks it sampled."""
    named = [w[len(fmt.HELPER_PREFIX) :] for w in _mark_labels(table) if w.startswith(fmt.HELPER_PREFIX)]
    if named:
        return named[0][:64]
    stacks = of_kind(table, "stack_sample", columns=["detail"])["detail"]
    if not len(stacks):
        return ROLE["worker"]
    distinct = pc.unique(stacks.combine_chunks().cast(pa.string())).drop_null()
    for pattern, name in WORKER_FRAMES:
        if pc.any(pc.match_substring_regex(distinct, pattern)).as_py():
            return name
    return ROLE["worker"]


def _mark_labels(table: pa.Table) -> list[str]:
    """The distinct labels of the ring's marks, through each chunk's dictionary (the marks may be many)."""
    words: list[str] = []
    for chunk in of_kind(table, "mark", columns=["label"])["label"].chunks:
        values = chunk.dictionary.to_pylist() if pa.types.is_dictionary(chunk.type) else chunk.to_pylist()
        words += (w for w in values if isinstance(w, str))
    return words


_RANK_SAID = re.compile(r"(\d{1,9}) of (\d{1,9})")


def with_group_rank(meta: dict[str, Any], table: pa.Table) -> pa.Table:
    """Where the ring's identity names no rank and its process said one as it joined its process group (a
    ``blackbox rank: R of N`` mark, collect/dist_rank.py: ``torch.multiprocessing.spawn``'s ranks), that rank
    and world size in ``meta``'s identity and the timeline's ``rank`` column; else the table as it was."""
    ident = meta.get("identity")
    if not isinstance(ident, dict) or ident.get("rank") is not None or "rank" not in table.column_names:
        return table
    said = next((m for w in _mark_labels(table) if w.startswith(fmt.RANK_PREFIX)
                 and (m := _RANK_SAID.fullmatch(w[len(fmt.RANK_PREFIX) :]))), None)  # fmt: skip
    if said is None or not int(said.group(1)) < int(said.group(2)):
        return table
    rank, size = int(said.group(1)), int(said.group(2))
    meta["identity"] = {**ident, "rank": rank, "world_size": ident.get("world_size") or size}
    at = table.schema.get_field_index("rank")
    column = pa.array(np.full(table.num_rows, rank, np.int64)).cast(table.schema.field(at).type)
    return table.set_column(at, table.schema.field(at), column)
