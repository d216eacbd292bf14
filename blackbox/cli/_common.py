"""Helpers shared by subcommands' standalone ``main(argv)``."""

from __future__ import annotations

import argparse
import ctypes
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType


def one_line(module: ModuleType) -> str:
    """A subcommand's help text: the first line of its module docstring."""
    return (module.__doc__ or "").strip().splitlines()[0]


def standalone(module: ModuleType, prog: str, argv: Sequence[str] | None) -> int:
    from . import run_command

    parser = argparse.ArgumentParser(prog=prog, description=one_line(module))
    module.add_arguments(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_command(module, args)


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
        if name == "pandas":
            raise ModuleNotFoundError("not imported by the blackbox command", name=name)
        return None


_PROCESS = {"ours": False, "set": False}


def command_process() -> None:
    """Mark this process as the command's own (the console script, ``python -m blackbox``)."""
    _PROCESS["ours"] = True


def own_process() -> None:
    """Before a command reads rings or bundles: in the command's own process (never a library
    caller's, nor ``blackbox run``'s launcher while its job runs), memory it frees goes back to the
    system and pyarrow imports no pandas (below). Once; a no-op elsewhere."""
    if not _PROCESS["ours"] or _PROCESS["set"]:
        return
    _PROCESS["set"] = True
    release_freed_memory()
    skip_pandas()


M_MMAP_THRESHOLD = -3  # mallopt(3)


def release_freed_memory() -> None:
    """Recovery decodes one large ring after another: glibc raises its mmap threshold as large blocks
    are freed and then keeps them in its arenas, and pyarrow's mimalloc keeps its pages a while, so a
    second 128 MiB ring found 150 MiB still held by the first. A fixed threshold and the system
    allocator for Arrow hand every freed ring back (measured: 6 rings of 128 MiB peak at 351 MiB, as
    one ring alone does, instead of 474)."""
    try:
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):  # not glibc: its own policy stands
        pass
    try:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    except Exception:  # noqa: BLE001 - an optimisation only: whatever pyarrow does, the command goes on
        pass


def skip_pandas() -> None:
    """pyarrow imports pandas, where installed, the first time an array is made from Python objects
    (to ask whether they are pandas objects): 35 MiB and half a second that no command uses. The
    command's own process answers that first question with "no pandas"; pyarrow still imports it
    when a pandas conversion is asked for (``to_pandas``). Library callers are left alone."""
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        import pyarrow as pa

        pa.array([0])
    except Exception:  # noqa: BLE001 - an optimisation only: whatever pyarrow does, the command goes on
        pass
    finally:
        sys.meta_path.remove(finder)
