"""A notebook's cells named as IPython names them ("Cell In[3]"), not by the file name IPython compiles them under
(``/tmp/ipykernel_8940/1438328138.py`` in a Jupyter kernel, ``<ipython-input-3-...>`` in a terminal shell).

Real shells: IPython's InteractiveShell run in a child process, and a Jupyter kernel that nbclient drives, each
leaking 4 MiB a step at a known line of cell 3 and then SIGKILLed; the site must read ``Cell In[3]:3`` with the
planted bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.recovery.cells import cell_names
from blackbox.recovery.pipeline import recover_rings
from blackbox.ring import format as fmt

CELLS = [
    "import blackbox\nblackbox.arm({rings!r}, sample_interval=0.02)",
    "kept = []",
    "import time\nfor i in range(30):\n    kept.append(bytearray(4 << 20))  # PLANT: 4 MiB a step\n"
    "    blackbox.step(i)\n    time.sleep(0.02)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
]
SHELL = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
for cell in json.loads(sys.argv[1]):
    result = shell.run_cell(cell, store_history=True)  # (as a kernel runs a cell: its count goes up)
    if not result.success:
        raise SystemExit(f"cell failed: {result.error_in_exec or result.error_before_exec}")
"""
KERNEL = """
import json, sys
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in json.loads(sys.argv[1])])
try:
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
except DeadKernelError:
    print("the kernel died", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("shell", ["IPython shell", "Jupyter kernel"])
def test_a_cells_site_reads_as_ipython_names_the_cell(tmp_path: Path, shell: str) -> None:
    pytest.importorskip("IPython")
    if shell == "Jupyter kernel":
        pytest.importorskip("nbclient")
        pytest.importorskip("ipykernel")
    rings = tmp_path / "rings"
    cells = json.dumps([c.format(rings=f"{rings}/") for c in CELLS])
    # GIVEN cells run in turn; cell 3 keeps 4 MiB a step for 30 steps at its line 3; cell 4 SIGKILLs the process
    done = subprocess.run([sys.executable, "-c", SHELL if shell == "IPython shell" else KERNEL, cells],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert done.returncode == (-9 if shell == "IPython shell" else 0), done.stderr[-2000:]
    # WHEN its ring is recovered
    out = tmp_path / "bundle"
    subprocess.run([sys.executable, "-m", "blackbox", "recover", str(rings), "-o", str(out)], check=True,
                   capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    meta = json.loads((out / "metadata.json").read_text())
    # THEN the largest holder is that line of cell 3, named as IPython's tracebacks name it, with the planted bytes
    # (it read `<module> (/tmp/ipykernel_8940/1438328138.py:3)`, a file that does not exist)
    top = meta["allocations"]["sites"][0]
    assert top["site"] == "<module> (Cell In[3]:3)", top
    # (within 3 times its stated 95% error: each 4 MiB block goes unsampled with probability e^-4 at a 1 MiB mean
    # interval, so 3 of the 30 do in 1.7% of runs, 10 MiB off against a stated 5.9; 5 of 30 in 0.03%)
    assert abs(top["live_bytes"] - (120 << 20)) <= 3 * max(top["error_bytes"], 1), top
    summary = (out / "summary.md").read_text()
    assert "`<module> (Cell In[3]:3)`: `kept.append(bytearray(4 << 20))  # PLANT: 4 MiB a step`" in summary
    assert "ipykernel_" not in summary.split("## Raw rings")[0].replace("ipykernel_launcher", "")
    assert "ipython-input" not in summary


def test_a_cell_run_again_is_named_by_its_latest_count_and_marks_naming_no_cell_are_left_out() -> None:
    # GIVEN cell marks: one cell run twice, a terminal shell's cell, and marks the job wrote naming files that are no
    # IPython cell (a library's file, a bare name, a malformed count)
    said = ["In[3] /tmp/ipykernel_1/11.py", "In[7] /tmp/ipykernel_1/11.py", "In[4] <ipython-input-4-ab>",
            "In[1] /usr/lib/python3.11/threading.py", "In[2] y", "In[x] /tmp/ipykernel_1/12.py", "/b.py"]
    strings = {i: fmt.CELL_PREFIX + text for i, text in enumerate(said)} | {99: "<module> (/tmp/ipykernel_1/11.py:2)"}
    # THEN the cells are named by their latest count, and nothing else is (a mark naming threading.py renamed every
    # frame of it "Cell In[1]")
    assert cell_names(strings) == {"/tmp/ipykernel_1/11.py": "Cell In[7]", "<ipython-input-4-ab>": "Cell In[4]"}


CRASH = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
cells = [f"import blackbox\\nblackbox.arm({sys.argv[1]!r}, sample_interval=0.02)",
         "import ctypes, time\\ndef crash():\\n    ctypes.string_at(0)  # PLANT: SIGSEGV at line 3 of cell 2",
         "time.sleep(0.5)\\ncrash()"]
for cell in cells:
    shell.run_cell(cell, store_history=True)
"""


@pytest.mark.slow
def test_a_crash_in_a_cell_names_the_cell(tmp_path: Path) -> None:
    pytest.importorskip("IPython")
    # GIVEN an IPython shell whose cell 3 calls a function of cell 2 that segfaults
    rings = tmp_path / "rings"
    done = subprocess.run([sys.executable, "-c", CRASH, f"{rings}/"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert done.returncode == -11, done.stderr[-2000:]
    # THEN the crash's site and stack name the cells as IPython does (faulthandler's text kept the file names)
    meta = recover_rings([rings]).meta
    crash = meta["native_crash"]
    assert crash["site"] == "crash (Cell In[2]:3)", crash
    assert "<module> (Cell In[3]:2)" in crash["stack"] and "ipython-input" not in crash["stack"], crash["stack"]
    assert "crash (Cell In[2]:3)" in meta["death"]["headline"], meta["death"]["headline"]
