"""Where PyTorch's flight recorder will dump its ring of collectives, where the job set it up: the header
metadata's ``flight_recorder``, read once at arm from the job's environment (the names torch 2.x reads).

``TORCH_FR_BUFFER_SIZE`` (older: ``TORCH_NCCL_TRACE_BUFFER_SIZE``) above 0 turns the recorder on; NCCL's
watchdog then dumps each rank's entries on a collective's timeout to ``TORCH_FR_DUMP_TEMP_FILE`` (older:
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, default ``/tmp/nccl_trace_rank_``) followed by the rank; a job may dump
them itself (``torch._C._distributed_c10d._dump_fr_trace()``, gloo included). Nothing of torch is imported.
"""

from __future__ import annotations

import os
from typing import Any

BUFFER_ENVS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
PREFIX_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
MAX_PREFIX = 4096


def flight_recorder() -> dict[str, Any] | None:
    """``{"dump_prefix", "buffer_size"}`` where the flight recorder is on, else None."""
    size = next((v for v in (os.environ.get(n, "").strip() for n in BUFFER_ENVS) if v), "")
    if not size.isdigit() or int(size) <= 0:
        return None
    prefix = next((v for v in (os.environ.get(n, "") for n in PREFIX_ENVS) if v), DEFAULT_PREFIX)
    return {"dump_prefix": prefix[:MAX_PREFIX], "buffer_size": min(int(size), 1 << 40)}
