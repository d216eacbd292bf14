"""Notebook cells named as IPython names them, ``Cell In[3]``, not by the file name it compiles them under.

IPython compiles each cell under a name of its own: ``/tmp/ipykernel_8940/1438328138.py`` in a Jupyter kernel
(a file that never exists) or ``<ipython-input-3-...>`` in a terminal, and so every stack of a notebook named
that. Its own tracebacks say "Cell In[3], line 4": ``CachingCompiler.format_code_name`` reads the shell
compiler's ``_filename_map`` (name -> execution count, IPython 8 and later). Where a shell is running, the
sampler's upkeep reads that map when the shell's execution count or the map's size has moved (a cell ran) and
writes a ``blackbox cell: In[N] NAME`` mark for each name new or run again under a new count
(``ring/FORMAT.md``); recovery (``recovery/cells.py``) writes ``Cell In[N]`` for that name in the ring's stacks.
A cell that dies before the next tick (a crash at its first line) keeps IPython's file name. Nothing is imported
and no shell is made: only an IPython the job loaded, whose shell is up, is read; a map that is not a dict is left
be.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..ring import format as fmt

MAX_NEW = 256  # marks written by one poll: a recorder armed late in a long session says its latest cells


class CellNames:
    """Writes the execution count of each cell name the shell's compiler gave, as they come."""

    def __init__(self, mark: Callable[[str], object]) -> None:
        self._mark = mark
        self._said: dict[str, int] = {}
        self._seen: Any = None  # (the shell's execution count, its map's size) at the last read

    def poll(self) -> None:
        getter = sys.modules.get("IPython.core.getipython")
        if getter is None:
            return
        try:
            shell = getter.get_ipython()  # (None where no shell was made: it makes none)
            names = getattr(shell.compile, "_filename_map", None) if shell is not None else None
            if not isinstance(names, dict) or (shell.execution_count, len(names)) == self._seen:
                return  # (IPython raises the count before it compiles the cell: the size moves after)
            self._seen = (shell.execution_count, len(names))
            items = list(names.items())  # (one C call: the GIL held)
        except Exception:  # noqa: BLE001 (a shell half made or torn down: read again at the next cell)
            return
        new = [(n, name) for name, n in items if isinstance(name, str) and isinstance(n, int)
               and not isinstance(n, bool) and self._said.get(name) != n]  # fmt: skip
        for n, name in sorted(new)[-MAX_NEW:]:
            self._said[name] = n
            self._mark(f"{fmt.CELL_PREFIX}In[{n}] {name}")
