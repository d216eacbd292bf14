"""What the sdist and the wheel carry, built as `python -m build` builds them (setuptools' PEP 517 hooks) from
a copy of this tree: the wheel has both specs (FORMAT.md, BUNDLE.md) and no torch extra; the sdist has the
tests with their data and tools/."""

from __future__ import annotations

import ast
import email
import re
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
    assert "blackbox-run.pth" in names, "at the top, for site-packages: a job that sets PYTHONPATH arms through it"


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


def project_name() -> str:
    """[project]'s name in pyproject.toml (read without tomllib, which Python 3.10 lacks)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    table = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    (name,) = re.findall(r'^name = "([^"]+)"', table, flags=re.M)
    return name


def test_readme_installs_this_distribution_under_its_own_name() -> None:
    # GIVEN the distribution's name, and README's Install section
    name = project_name()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    # THEN the section installs this clone (pip install . ; a wheel built from it, named after the distribution)
    # and, once published, the distribution by the name its metadata gives, and names no other distribution
    assert re.search(r"^pip install \.\s", install, flags=re.M), install
    wheel = name.replace("-", "_")
    assert f"`pip install dist/{wheel}-*.whl`" in install and "`pip wheel --no-deps . -w dist`" in install, install
    named = set(re.findall(r"pip install ([A-Za-z0-9][A-Za-z0-9._-]*)(?![/\w.-])", install))
    assert named == {name}, f"README installs {sorted(named)}, the metadata's name is {name}"
    # AND the name is not one a package on the index already holds (checked when it was chosen: `pip index
    # versions` and `pip download --no-deps` found nothing for it), nor the import's own name
    assert name not in ("blackbox", "blackbox-recorder")


def test_the_pths_readable_copy_is_the_code_it_runs() -> None:
    # blackbox-run.pth runs one line (a .pth runs lines that start with `import`); its comment shows that code
    # readably, for whoever inspects site-packages: the two say the same, character for character
    lines = (REPO / "blackbox" / "run" / "blackbox-run.pth").read_text().splitlines()
    shown = "".join(line.removeprefix("#   ") + "\n" for line in lines if line.startswith("#   "))
    (run,) = [line for line in lines if not line.startswith("#")]
    call = next(n for n in ast.walk(ast.parse(run)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "exec")
    assert isinstance(call.args[0], ast.Constant) and call.args[0].value == shown
