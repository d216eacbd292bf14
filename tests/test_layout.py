"""The package's shape: stages as folders, imports only downwards, small modules.

Stages, lowest first: the leaves (errors, version, units), ``ring``, ``collect``,
``recovery``, ``views``, the facade (``blackbox``'s own modules), ``run``, ``cli``.
A module may import its own stage or a lower one, never a higher one; lazy
imports inside functions count too. Inside ``recovery`` the pass runs one way:
timeline and evidence, then diagnosis, then metadata, then the pipeline, then
the bundle writer.
"""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

import pytest
from conftest import REPO, run_py

PACKAGE = REPO / "blackbox"
STAGES = {
    "leaf": 0,
    "ring": 1,
    "collect": 2,
    "recovery": 3,
    "views": 4,
    "facade": 5,
    "run": 6,
    "cli": 7,
    "entry": 8,
}
LEAVES = {
    "blackbox._errors",
    "blackbox._version",
    "blackbox._units",
    "blackbox._times",
    "blackbox._fds",
    "blackbox._jobsignal",
    "blackbox._sigmask",
    "blackbox._fit",
}
RECOVERY_ORDER = {
    "timeline": 0,
    "kinds": 0,
    "evidence": 0,
    "slurm": 0,
    "ranks": 0,
    "spill": 0,
    "live_stacks": 0,
    "attempts": 2,
    "outfolder": 0,
    "pandas_meta": 0,
    "arrays": 0,
    "family": 0,
    "limits": 0,
    "rendezvous": 0,
    "headline": 2,
    "first_process": 2,
    "gpu_oom": 0,
    "exits": 2,
    "stacks": 1,
    "allocs": 1,
    "facts": 1,
    "helpers": 1,
    "cells": 2,
    "relays": 1,
    "alerts": 1,
    "levers": 2,
    "crash": 2,
    "hang": 2,
    "stuck_rank": 2,
    "stall_threads": 1,
    "timing": 1,
    "flight": 0,
    "alloc_levers": 3,
    "diagnosis": 3,
    "metadata": 4,
    "pipeline": 5,
    "bundle": 6,
    "locate": 7,
    "job": 8,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage(module: str) -> str:
    if module in LEAVES:
        return "leaf"
    if module == "blackbox.__main__":
        return "entry"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in STAGES:
        return parts[1]
    return "facade"


def imported_modules(path: Path) -> set[str]:
    """Every blackbox module this file imports, at top level or inside a function."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("blackbox"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("blackbox"):
                continue
            for alias in node.names:  # `from . import format` names a module; `from .x import y` a name in x
                sub = f"{target}.{alias.name}"
                is_module = (REPO / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    REPO / Path(*sub.split("."))
                ).is_dir()
                found.add(sub if is_module else target)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_its_stage_folders() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {"ring", "collect", "recovery", "views", "run", "cli"}
    assert (PACKAGE / "ring" / "FORMAT.md").is_file(), "FORMAT.md lives beside the format module"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_imports_a_higher_stage(path: Path) -> None:
    me = module_name(path)
    upward = [m for m in imported_modules(path) if STAGES[stage(m)] > STAGES[stage(me)]]
    assert not upward, f"{me} ({stage(me)}) imports a higher stage: {sorted(upward)}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "recovery").glob("*.py")), ids=lambda p: p.name)
def test_recovery_runs_one_way(path: Path) -> None:
    me = path.stem
    if me == "__init__":
        return
    backwards = [
        m
        for m in imported_modules(path)
        if m.startswith("blackbox.recovery.") and RECOVERY_ORDER[m.rsplit(".", 1)[1]] > RECOVERY_ORDER[me]
    ]
    assert not backwards, f"recovery.{me} reaches forward into {backwards}"


def test_modules_are_small() -> None:
    sizes = {str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines()) for p in MODULES}
    too_big = {p: n for p, n in sizes.items() if n > 600}
    assert not too_big, f"modules over 600 lines: {too_big}"
    assert statistics.median(sizes.values()) <= 150, f"median module size {statistics.median(sizes.values())}"


def test_public_recover_is_the_function_after_every_stage_is_imported() -> None:
    # A subpackage named like a public function would rebind it on first import.
    out = run_py(
        """
        import blackbox, blackbox.recovery.bundle, blackbox.run.launcher, blackbox.views.summary, blackbox.cli
        import blackbox.ring.reader, blackbox.collect.host
        names = [n for n in blackbox.__all__ if n[0].islower() and not n.startswith('__')]
        print(sorted(n for n in names if not callable(getattr(blackbox, n))))
        """
    )
    assert out.stdout.strip() == "[]"


def test_arming_imports_neither_pyarrow_nor_the_recovery_stage(tmp_path: Path) -> None:
    out = run_py(
        """
        import sys, blackbox
        rec = blackbox.arm(sys.argv[1], capacity=64)
        blackbox.mark("x", 1)
        print(rec.armed, sorted(m for m in sys.modules if m.startswith(("pyarrow", "blackbox.recovery",
              "blackbox.views", "blackbox.cli", "pandas", "matplotlib"))))
        """,
        str(tmp_path),
    )
    assert out.stdout.strip() == "True []"


# What recording does not need: the packed rings' zstandard and its threads (concurrent.futures, logging),
# the temporary files and folder removal (tempfile, shutil and with it bz2 and lzma), socket, and hashlib
# (OpenSSL: 3.7 MiB of the process on its own), and the reader's modules.
NOT_AT_ARM = ("zstandard", "lzma", "bz2", "concurrent.futures", "logging", "socket", "tempfile", "shutil",
              "hashlib", "_hashlib", "secrets", "blackbox.ring.reader", "blackbox.ring.packed")  # fmt: skip


def test_arming_imports_only_what_recording_needs(tmp_path: Path) -> None:
    # GIVEN a process that arms in a folder holding a ring of before (retention reads its header), writes,
    # and disarms
    out = run_py(
        """
        import sys, blackbox
        first = blackbox.arm(sys.argv[1] + "/", capacity=64)
        first.disarm()
        rec = blackbox.arm(sys.argv[1] + "/", capacity=64)
        blackbox.mark("x", 1)
        rec.sample_now()
        rec.disarm()
        print(first.path != rec.path, sorted(m for m in sys.argv[2].split(",") if m in sys.modules))
        """,
        str(tmp_path),
        ",".join(NOT_AT_ARM),
    )
    # THEN none of what recording does not need was imported
    assert out.stdout.strip() == "True []", out.stderr
