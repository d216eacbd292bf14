"""Fork policy: a forked child never writes into its parent's ring."""

from __future__ import annotations

from pathlib import Path

from conftest import labels_of, run_py

from blackbox.ring.reader import read_ring

FORK_JOB = """
import os, sys, blackbox
rec = blackbox.arm(sys.argv[1], capacity=256, sample_interval=0.01, on_fork=sys.argv[2])
blackbox.mark("parent before fork")
pid = os.fork()
if pid == 0:
    for i in range(50):
        blackbox.mark("child", i)
    child = blackbox.active()
    print("child-armed" if child.armed else "child-disarmed", child.path, flush=True)
    blackbox.disarm()
    os._exit(0)
os.waitpid(pid, 0)
blackbox.mark("parent after fork")
print("parent", rec.path, flush=True)
"""


def _lines(out: str) -> dict[str, str]:
    return {line.split()[0]: line.split()[-1] for line in out.splitlines()}


def test_forked_child_is_disarmed_by_default(tmp_path: Path) -> None:
    out = _lines(run_py(FORK_JOB, str(tmp_path), "disarm").stdout)
    assert "child-disarmed" in out
    rings = list(tmp_path.glob("*.ring"))
    assert rings == [Path(out["parent"])]
    ring = read_ring(rings[0])
    labels = labels_of(ring)
    assert "child" not in labels
    assert labels.index("parent before fork") < labels.index("parent after fork")
    assert ring.clean and ring.recovery.torn == 0


def test_forked_child_rearms_its_own_ring_when_asked(tmp_path: Path) -> None:
    out = _lines(run_py(FORK_JOB, str(tmp_path), "rearm").stdout)
    parent_path, child_path = Path(out["parent"]), Path(out["child-armed"])
    assert parent_path != child_path and child_path.parent == tmp_path
    parent, child = read_ring(parent_path), read_ring(child_path)
    assert "child" not in labels_of(parent)
    child_values = [int(v) for v, lab in zip(child.records["value"], labels_of(child), strict=True) if lab == "child"]
    assert child_values == list(range(50))
    assert child.meta["identity"]["pid"] != parent.meta["identity"]["pid"]
    assert child.meta["identity"]["ppid"] == parent.meta["identity"]["pid"]
    assert parent.clean and child.clean
