"""Notebook cells named as IPython names them, ``Cell In[3]``, not by the file name it compiles them under.

IPython compiles each cell under a name of its own: ``/tmp/ipykernel_8940/1438328138.py`` in a Jupyter kernel
(a file that never exists) or ``<ipython-input-3-...>`` in a terminal, and so every stack of a notebook named
that. Its own tracebacks say "Cell In[3], line 4": ``CachingCompiler.format_code_name`` reads the shell
compiler's ``_filename_map`` (name -> execution count, IPython 8 and later). Where a shell is running, the
sampler's upkeep reads that map when the shell's execution count has moved (a cell ran) and writes a ``blackbox
cell: In[N] NAME`` mark for each name new or run again under a new count (``ring/FORMAT.md``); recovery
(``recovery/cells.py``) writes ``Cell In[N]`` for that name in the ring's stacks. Nothing is imported and no
shell is made: only an IPython the job loaded, whose shell is up, is read; a map that is not a dict is left be.
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
        self._count: Any = None  # the shell's execution count at the last read

    def poll(self) -> None:
        getter = sys.modules.get("IPython.core.getipython")
        if getter is None:
            return
        try:
            shell = getter.get_ipython()  # (None where no shell was made: it makes none)
            if shell is None or shell.execution_count == self._count:
                return
            self._count = shell.execution_count
            names = getattr(shell.compile, "_filename_map", None)
            items = list(names.items()) if isinstance(names, dict) else []  # (one C call: the GIL held)
        except Exception:  # noqa: BLE001 (a shell half made or torn down: read again at the next cell)
            return
        new = [(n, name) for name, n in items if isinstance(name, str) and isinstance(n, int)
               and not isinstance(n, bool) and self._said.get(name) != n]  # fmt: skip
        for n, name in sorted(new)[-MAX_NEW:]:
            self._said[name] = n
            self._mark(f"{fmt.CELL_PREFIX}In[{n}] {name}")
