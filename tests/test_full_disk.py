"""A full disk, on a real small filesystem (an ext4 image loop-mounted; skipped only where mounting is refused)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import run_py

from blackbox.ring.reader import read_ring

FILL = """
def fill(folder, leave):
    import os
    with open(os.path.join(folder, "filler"), "wb") as f:
        chunk = bytes(1 << 20)
        try:
            while True:
                f.write(chunk); f.flush(); os.fsync(f.fileno())
        except OSError:
            pass
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    if leave and free < leave:
        os.truncate(os.path.join(folder, "filler"), os.path.getsize(os.path.join(folder, "filler")) - leave + free)
"""


def test_disk_full_at_arm_is_one_warning_and_the_job_runs_on(small_fs: Path) -> None:
    code = FILL + (
        "import sys, blackbox\n"
        "fill(sys.argv[1], 4 << 20)\n"  # 4 MiB left: the default 32 MiB ring cannot be reserved
        "rec = blackbox.arm(sys.argv[1])\n"
        "blackbox.mark('still', 1)\n"
        "print('armed', rec.armed)\n"
    )
    proc = run_py(code, str(small_fs))
    assert proc.stdout.strip() == "armed False"
    assert proc.stderr.count("BlackboxWarning") == 1 and "No space left on device" in proc.stderr
    assert list(small_fs.glob("*.ring")) == [], "no partial ring left behind"


def test_disk_full_mid_run_changes_nothing_the_ring_is_reserved(small_fs: Path) -> None:
    code = FILL + (
        "import os, signal, sys, blackbox\n"
        "rec = blackbox.arm(sys.argv[1], capacity=1 << 17, sample_interval=0.01)\n"  # a 16 MiB ring
        "fill(sys.argv[1], 0)\n"  # now the filesystem is full
        "for i in range(300000):\n"  # wraps the ring twice on a full disk
        "    blackbox.mark('after-full', i)\n"
        "print('done', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = run_py(code, str(small_fs), check=False)
    assert proc.returncode == -9 and proc.stdout.strip() == "done" and "Warning" not in proc.stderr
    (ring,) = small_fs.glob("*.ring")
    r = read_ring(ring)
    marks = [
        int(v)
        for v, lab in zip(r.records["value"], r.records["label"], strict=True)
        if r.strings.get(int(lab)) == "after-full"
    ]
    assert r.recovery.torn == 0 and marks[-1] == 299_999
    assert marks == list(range(marks[0], 300_000)), "the newest window, complete, on a full disk"


def test_read_only_folder_is_one_warning_and_the_job_runs_on(small_fs: Path) -> None:
    """Read-only for root too: the filesystem itself is remounted read-only."""
    remount = subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], capture_output=True, text=True)
    if remount.returncode != 0:
        pytest.skip(f"cannot remount read-only here: {remount.stderr.strip()}")
    proc = run_py(
        "import sys, blackbox\nrec = blackbox.arm(sys.argv[1])\nblackbox.mark('x', 1)\nprint('armed', rec.armed)\n",
        str(small_fs),
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "armed False"
    assert proc.stderr.count("BlackboxWarning") == 1 and "Read-only file system" in proc.stderr
