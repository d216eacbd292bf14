"""What the sdist and the wheel carry, built as `python -m build` builds them (setuptools' PEP 517 hooks) from
a copy of this tree: the wheel has both specs (FORMAT.md, BUNDLE.md) and no torch extra; the sdist has the
tests with their data and tools/."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

BUILD = """
import sys
from setuptools import build_meta
out = sys.argv[1]
sdist = build_meta.build_sdist(out)
wheel = build_meta.build_wheel(out)
print("BUILT", sdist, wheel)
"""
SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".*_cache")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=SKIP, symlinks=True)
    out = tmp / "dist"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=src, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sdist, wheel = proc.stdout.rsplit("BUILT ", 1)[1].split()
    return out / sdist, out / wheel


@pytest.mark.slow
def test_the_wheel_carries_both_specs_and_needs_no_torch(built: tuple[Path, Path]) -> None:
    with zipfile.ZipFile(built[1]) as wheel:
        names = set(wheel.namelist())
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(wheel.read(meta_name))
    assert {"blackbox/recovery/BUNDLE.md", "blackbox/ring/FORMAT.md", "blackbox/py.typed"} <= names
    assert "torch" not in (meta.get_all("Provides-Extra") or [])
    requires = [r.split(";")[0] for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert sorted(r.split(">")[0] for r in requires) == ["numpy", "pyarrow", "zstandard"], "the core dependencies"
    assert not [r for r in meta.get_all("Requires-Dist") or [] if r.startswith("torch")]
    assert not [n for n in names if n.startswith(("tests/", "tools/"))], "the wheel is the package alone"


@pytest.mark.slow
def test_the_sdist_carries_the_tests_their_data_and_the_tools(built: tuple[Path, Path]) -> None:
    with tarfile.open(built[0]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    data = {p.relative_to(REPO).as_posix() for p in (REPO / "tests" / "data").iterdir()}
    assert data and data <= names
    tools = {p.relative_to(REPO).as_posix() for p in (REPO / "tools").glob("*") if p.is_file()}
    assert tools and tools <= names
    assert {"tests/conftest.py", "blackbox/recovery/BUNDLE.md", "blackbox/ring/_cwriter.c"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so"))]
