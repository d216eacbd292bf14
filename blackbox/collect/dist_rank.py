"""The rank of a process that learns it only as it joins its process group.

``torch.multiprocessing.spawn`` (as pytorch/examples' DDP scripts start their ranks) passes each rank its
number as an argument: ``init_process_group(rank=r, world_size=n)`` with no ``RANK`` in the environment, where
the ring's identity reads it at arm. So every such ring said "rank -", and a first death named only a pid.
Once the default process group is up, the sampler's upkeep asks ``torch.distributed`` once and writes a
``blackbox rank: R of N`` mark (``ring/FORMAT.md``); recovery takes the ring's rank and world size from it
where its identity has none. Nothing is imported: only a ``torch.distributed`` the job imported is asked, and
``is_initialized``, ``get_rank`` and ``get_world_size`` run no collective and touch no device.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ..ring import format as fmt


class DistRank:
    """Writes the process's rank in its default process group once, where its identity had none."""

    def __init__(self, known: bool, mark: Callable[[str], object]) -> None:
        self._done = known
        self._mark = mark

    def poll(self) -> None:
        if self._done:
            return
        dist = sys.modules.get("torch.distributed")
        if dist is None or getattr(getattr(dist, "__spec__", None), "_initializing", False):
            return  # (not imported, or still being imported by the job's thread: asked again next tick)
        try:
            if not dist.is_available() or not dist.is_initialized():
                return
            rank, size = dist.get_rank(), dist.get_world_size()
        except Exception:  # noqa: BLE001 (a module half made, a group torn down meanwhile: asked next tick)
            return  # (raised, it was a warning on the job's stderr: "blackbox dropped an event")
        self._done = True  # (asked once: a group torn down and made again keeps the first rank said)
        if isinstance(rank, int) and isinstance(size, int) and 0 <= rank < size:
            self._mark(f"{fmt.RANK_PREFIX}{rank} of {size}")
