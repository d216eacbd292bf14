"""Every error the command prints is one line: the path, what was expected, what was found. A full
disk's error names no file: the command names the one it was writing."""

from __future__ import annotations

import argparse
import errno
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_py

from blackbox.cli import main, run_command

JOB = """
import sys, time, blackbox
blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.02)
for step in range(20):
    blackbox.step(step)
    time.sleep(0.01)
"""


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs, full: mounted here (we run as root) or the test is skipped."""
    where = tmp_path / "full"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with open(where / "ballast", "wb", buffering=0) as ballast, pytest.raises(OSError, match="No space"):
            while True:
                ballast.write(bytes(4096))
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def rings(tmp_path: Path) -> Path:
    folder = tmp_path / "rings"
    folder.mkdir()
    run_py(JOB, str(folder))
    return folder


@pytest.mark.parametrize(
    ("command", "out", "what"),
    [
        (["recover"], "bundle", "the bundle"),
        (["plot"], "memory.png", "the picture"),
        (["export", "--perfetto"], "trace.json", "the trace"),
        (["export", "--folded"], "stacks.folded", "the folded stacks"),
        (["export", "--speedscope"], "stacks.speedscope.json", "the speedscope profile"),
    ],
)
def test_a_full_disk_is_one_line_naming_what_was_being_written(
    command: list[str], out: str, what: str, rings: Path, full_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if command == ["plot"]:
        pytest.importorskip("matplotlib", reason="plot draws only where matplotlib is installed")
    target = full_disk / out
    assert main([*command, str(rings), "-o", str(target)]) == 1
    err = capsys.readouterr().err
    assert err == f"blackbox: error: {target}: expected to write {what}, found No space left on device\n"
    assert sorted(p.name for p in full_disk.iterdir()) == ["ballast"], "nothing half-written is left"


def _failing(exc: OSError) -> types.ModuleType:
    module = types.ModuleType("failing")

    def run(args: argparse.Namespace) -> int:
        raise exc

    module.run = run  # type: ignore[attr-defined]
    return module


def test_an_os_error_no_command_named_is_still_one_line_with_its_path(capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = argparse.Namespace(target=["in.ring"], out="out/")
    # a write to a full disk: the command's output named
    assert run_command(_failing(OSError(errno.ENOSPC, "No space left on device")), nowhere) == 1
    assert capsys.readouterr().err == "blackbox: error: out/: expected to write it, found No space left on device\n"
    # an error naming its file: that file
    assert run_command(_failing(PermissionError(errno.EACCES, "Permission denied", "/x/y")), nowhere) == 1
    assert capsys.readouterr().err == "blackbox: error: /x/y: expected to read or write it, found Permission denied\n"
    # any other: the command's paths
    assert run_command(_failing(OSError(errno.EIO, "Input/output error")), nowhere) == 1
    err = capsys.readouterr().err
    assert err == "blackbox: error: in.ring, out/: expected to read or write these, found Input/output error\n"
