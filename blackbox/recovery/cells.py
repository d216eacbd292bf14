"""A notebook's cells named in a ring's stacks as IPython names them: ``<module> (Cell In[3]:4)``.

A kernel's ring holds ``blackbox cell: In[N] NAME`` marks (``collect/cells.py``): NAME is the file name IPython
compiled the cell under (``/tmp/ipykernel_8940/1438328138.py``, a file that does not exist), N its execution
count, the highest where the same code ran again. Every frame of such a file is written ``Cell In[N]`` in the
ring's stack table (the stack samples, the allocation sites), in its strings (the exceptions' tracebacks) and in
faulthandler's text of a crash, so in the timeline and all that is read from the ring; the marks themselves keep
the file names. Only names of IPython's forms count (``_CELL_FILE``). A ring without such marks is left as it was.
"""

from __future__ import annotations

import re

from ..ring import format as fmt
from ..ring.reader import Ring

_SAID = re.compile(r"In\[(\d{1,9})\] (.{1,4096})", re.DOTALL)
# The names IPython gives a cell: a Jupyter kernel's (ipykernel: its temporary folder, the code's hash) and a
# terminal shell's. A mark naming any other file (a library's, the job's script) is no cell's and is left out: the
# marks are the job's to write, and one naming threading.py renamed every frame of it.
_CELL_FILE = re.compile(r"(/[^;()\n]{0,1024})?/ipykernel_\d{1,10}/\d{1,20}\.py|<ipython-input-\d{1,9}-[0-9a-f]{1,64}>")


def cell_names(strings: dict[int, str]) -> dict[str, str]:
    """File name -> ``Cell In[N]``, from the ring's cell marks (the highest count where one ran again)."""
    counts: dict[str, int] = {}
    for text in strings.values():
        said = _SAID.fullmatch(text[len(fmt.CELL_PREFIX) :]) if text.startswith(fmt.CELL_PREFIX) else None
        if said is not None and _CELL_FILE.fullmatch(said.group(2)):
            counts[said.group(2)] = max(int(said.group(1)), counts.get(said.group(2), 0))
    return {name: f"Cell In[{n}]" for name, n in counts.items()}


def name_cells(ring: Ring) -> None:
    """``ring``'s frames of a notebook cell's file, in its stack table and strings, named as IPython names the
    cell, in place (before its timeline is made)."""
    names = cell_names(ring.strings)
    if not names:
        return

    def frame(text: str) -> str:  # ``function (file:line)``: the file looked up (a hostile ring's thousand
        head, sep, tail = text.rpartition(" (")  # names cost a dictionary, not a pattern of them all)
        file, colon, line = tail[:-1].rpartition(":")
        return f"{head} ({names[file]}:{line})" if sep and colon and tail.endswith(")") and file in names else text

    def named(text: str) -> str:  # a folded stack or traceback: frames joined by ";"
        return ";".join(map(frame, text.split(";"))) if " (" in text else text

    ring.strings = {i: text if text.startswith(fmt.CELL_PREFIX) else named(text) for i, text in ring.strings.items()}
    if ring.stacks is not None:
        ring.stacks.frames = {key: frame(text) for key, text in ring.stacks.frames.items()}
    quoted = {f'File "{name}"': f'File "{cell}"' for name, cell in names.items()}  # faulthandler's frames
    if ring.crash:
        ring.crash = _faulthandler_named(ring.crash, quoted)
    ring.signal_stacks = {sig: _faulthandler_named(text, quoted) for sig, text in ring.signal_stacks.items()}


def _faulthandler_named(text: str, quoted: dict[str, str]) -> str:
    """faulthandler's ``  File "NAME", line 2 in f`` lines with NAME a cell's, as IPython names it."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        at = line.find('File "')
        end = line.find('"', at + 6) if at >= 0 else -1
        if end > 0 and line[at : end + 1] in quoted:
            lines[i] = line[:at] + quoted[line[at : end + 1]] + line[end + 1 :]
    return "\n".join(lines)
