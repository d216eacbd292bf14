"""PyMem's hooks count every Python block once, whichever allocator serves it: pymalloc (blocks up to 512
bytes from its own arenas, larger ones from malloc, which the native hooks also see), malloc itself
(PYTHONMALLOC=malloc: every block), or tracemalloc's wrapper in between. A block seen by both hooks would
read double."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

import blackbox
from blackbox.collect.allocs import sample_module

if sample_module() is None:
    pytest.skip("the C extension blackbox.collect._csample is not built", allow_module_level=True)

JOB = """
import os, signal, sys
import blackbox

rec = blackbox.arm(sys.argv[1], sample_interval=0.05, allocations=256 << 10)
small = [bytes(200) + bytes([i & 255]) for i in range(200_000)]  # PLANT: small
large = [bytearray(4000) for _ in range(2_000)]  # PLANT: large
print("sizes", sys.getsizeof(small[0]), sys.getsizeof(large[0]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["pymalloc", "PYTHONMALLOC=malloc", "-X tracemalloc"])
def test_python_blocks_are_counted_once_whichever_allocator_serves_them(tmp_path: Path, how: str) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if k not in ("BLACKBOX_ALLOCATIONS", "PYTHONMALLOC")}
    env["PYTHONPATH"] = str(REPO)
    flags = ["-X", "tracemalloc"] if how == "-X tracemalloc" else []
    if how.startswith("PYTHONMALLOC"):
        env["PYTHONMALLOC"] = "malloc"
    proc = subprocess.run([sys.executable, *flags, str(job), f"{tmp_path / 'rings'}/"], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    small_size, large_size = (int(x) for x in proc.stdout.split("sizes ")[1].split())
    blackbox.recover(tmp_path / "rings", tmp_path / "bundle")
    sites = json.loads((tmp_path / "bundle" / "metadata.json").read_text())["allocations"]["sites"]
    lines = JOB.splitlines()
    for mark, truth in (("small", 200_000 * small_size), ("large", 2_000 * large_size)):
        at = f"({job}:{next(i for i, t in enumerate(lines, 1) if f'PLANT: {mark}' in t)})"
        got = [s for s in sites if s["site"].endswith(at)]
        assert len(got) == 1, (mark, [s["site"] for s in sites[:5]])
        # within 4 sigma of the requested bytes: a block counted twice would read double
        assert abs(got[0]["live_bytes"] - truth) <= 2 * got[0]["error_bytes"], (mark, truth, got[0])
