"""The plain install is the product: a fresh virtual environment with the package and its declared
dependencies only (numpy, pyarrow, zstandard: no pandas, no torch, no matplotlib), every command end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

JOB = """
import os, sys, time, blackbox
blackbox.arm(sys.argv[1] + "/", capacity=4096, sample_interval=0.02)
for i in range(50):
    blackbox.step(i)
    blackbox.mark("loss", i)
try:
    raise MemoryError("out of host memory")
except MemoryError:
    pass
time.sleep(0.2)
os.kill(os.getpid(), 9)
"""


BUILD_OUTPUTS = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("plain") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(REPO)],
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv


def blackbox(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return subprocess.run([str(venv / "bin/blackbox"), *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)  # fmt: skip


@pytest.mark.slow
def test_every_command_works_with_only_the_declared_dependencies(plain: Path, tmp_path: Path) -> None:
    python = str(plain / "bin/python")
    have = subprocess.run([python, "-c", "import importlib.util as u; print([m for m in ('pandas', 'torch', "
                           "'matplotlib', 'duckdb') if u.find_spec(m)])"], capture_output=True, text=True)  # fmt: skip
    assert have.stdout.strip() == "[]"  # the lane really is plain
    subprocess.run([python, "-c", JOB, str(tmp_path / "rings")], timeout=120)
    (ring,) = (tmp_path / "rings").glob("*.ring")

    out = blackbox(plain, "recover", "rings", "-o", "bundle", "--summary", cwd=tmp_path)
    assert out.returncode == 0 and "Cause of death" in out.stdout, out.stderr
    meta = json.loads((tmp_path / "bundle" / "metadata.json").read_text())
    assert meta["death"]["cause"] == "killed" and meta["last_step"] == 49
    assert meta["exceptions"] == [] or all(e["time"].endswith("Z") for e in meta["exceptions"])

    for args in (
        ["summary", "rings"],
        ["summary", "bundle"],
        ["info", str(ring)],
        ["info", str(ring), "--json"],
        ["export", "--perfetto", "rings", "-o", "trace.json"],
        ["export", "--perfetto", "bundle", "-o", "trace2.json"],
        ["watch", "--once", str(ring)],
        ["prune", "rings", "--max-count", "5", "--dry-run"],
        ["demo", "--dir", "demo", "--kill-after", "5"],
    ):
        out = blackbox(plain, *args, cwd=tmp_path)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stderr[-2000:])
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]

    plot = blackbox(plain, "plot", "rings", "-o", "m.png", cwd=tmp_path)
    assert plot.returncode == 1 and plot.stderr.count("\n") == 1 and "pip install matplotlib" in plot.stderr

    run = blackbox(
        plain, "run", "--dir", "r", "--", python, "-c", "import sys; print('job'); sys.exit(3)", cwd=tmp_path
    )
    assert run.returncode == 3 and run.stdout == "job\n" and "cause:" in run.stderr, run.stderr
    (folder,) = (tmp_path / "r").glob("run-*")
    assert (folder / "bundle" / "metadata.json").is_file() and (folder / "bundle" / "summary.md").is_file()


SIGTERM_IN_C = """
import ctypes, sys, blackbox
blackbox.arm(sys.argv[1] + "/", capacity=4096, sample_interval=0.05)
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)
libc.pthread_mutex_lock(mutex)
print("READY", flush=True)
libc.pthread_mutex_lock(mutex)  # blocked in C for ever
"""


@pytest.fixture(scope="module")
def no_compiler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment where the install found no C compiler (CC and CXX fail)."""
    venv = tmp_path_factory.mktemp("nocc") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = dict(os.environ, CC="/bin/false", CXX="/bin/false")
    # from a copy without build outputs: setuptools would take the checkout's up-to-date build/ (or a
    # _cwriter*.so beside its source) as built, and install it without trying the compiler
    source = venv.parent / "source"
    shutil.copytree(REPO, source, ignore=BUILD_OUTPUTS, symlinks=True)
    pip = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-cache-dir", str(source)],
                         capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv


@pytest.mark.slow
def test_an_install_without_a_c_compiler_says_so_and_still_names_a_sigterm(no_compiler: Path, tmp_path: Path) -> None:
    python = str(no_compiler / "bin/python")
    assert not list(no_compiler.rglob("_cwriter*.so"))  # the lane really has no extension
    version = blackbox(no_compiler, "--version", cwd=tmp_path)
    assert "(C extension: NOT built)" in version.stdout and "not recorded" in version.stdout
    # GIVEN a job blocked in C; WHEN SIGTERM arrives THEN it dies of it at once, after one warning at arm
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen([python, "-c", SIGTERM_IN_C, str(tmp_path / "rings")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    proc.send_signal(15)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -15 and err.count("BlackboxWarning") == 1 and "C extension" in err, err
    # AND the verdict is the one the C extension gives, with what is not known said
    out = blackbox(no_compiler, "recover", "rings", "-o", "bundle", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    death = json.loads((tmp_path / "bundle" / "metadata.json").read_text())["death"]
    assert (death["cause"], death["confidence"]) == ("signal", "certain"), death
    assert any(e.startswith("SIGTERM with its default action") for e in death["evidence"])
    assert "## What the recorder could not do" in (tmp_path / "bundle" / "summary.md").read_text()


RAISES = "import numpy\nraise ValueError('planted in a job with a path of its own')\n"


@pytest.mark.slow
def test_a_job_that_sets_pythonpath_is_armed_through_the_installed_pth(plain: Path, tmp_path: Path) -> None:
    # GIVEN blackbox installed as a user installs it (pip, not editable), its .pth beside the packages
    python = str(plain / "bin/python")
    (pth,) = plain.glob("lib/python3*/site-packages/blackbox-run.pth")
    (tmp_path / "src").mkdir()
    (tmp_path / "train.py").write_text(RAISES)
    # (a Python of that install outside a run: nothing armed, blackbox not even imported)
    alone = subprocess.run([python, "-c", "import sys; print('blackbox' in sys.modules)"], capture_output=True,
                           text=True, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert alone.stdout == "False\n" and alone.stderr == "", alone
    # WHEN a job that replaces PYTHONPATH runs, unarmed and under blackbox run
    job = ["sh", "-c", f"PYTHONPATH={tmp_path / 'src'} exec {python} train.py"]
    unarmed = subprocess.run(job, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    armed = blackbox(plain, "run", "--dir", "runs", "--", *job, cwd=tmp_path)
    # THEN it runs as unarmed, and is recorded: its exception is the death, and no warning says it was not
    assert unarmed.returncode == armed.returncode == 1, armed.stderr[-2000:]
    assert unarmed.stderr.splitlines()[-1] in armed.stderr and "not recorded" not in armed.stderr, armed.stderr
    (bundle,) = (tmp_path / "runs").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    assert meta["cause"] == "exception" and "planted in a job with" in json.dumps(meta["death"]), meta


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["another user's", "writable by the group", "a link"])
def test_the_pth_runs_no_boot_folder_it_cannot_trust(plain: Path, tmp_path: Path, planted: str) -> None:
    # GIVEN a boot folder named by BLACKBOX_RUN_BOOT that is not this user's own and private (as root reads it: any
    # Python of the install started with that variable would run the file planted there)
    boot, marker = tmp_path / "boot", tmp_path / "ran"
    real = tmp_path / "real" if planted == "a link" else boot
    real.mkdir(mode=0o700)
    (real / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    if planted == "another user's":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the folder to another user")
        os.chown(real, 65534, 65534)
    elif planted == "writable by the group":
        real.chmod(0o770)
    else:
        boot.symlink_to(real)
    # WHEN a Python of the install starts with it
    python = str(plain / "bin/python")
    proc = subprocess.run([python, "-c", "pass"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "BLACKBOX_RUN_BOOT": str(boot)})  # fmt: skip
    # THEN nothing of it ran, and nothing was said
    assert proc.returncode == 0 and proc.stderr == "" and not marker.exists(), proc.stderr
    # (the same folder made private and ours runs: the check above is not vacuous)
    if planted != "a link":
        os.chown(real, os.getuid(), os.getgid())
        real.chmod(0o700)
        subprocess.run([python, "-c", "pass"], check=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "BLACKBOX_RUN_BOOT": str(boot)})  # fmt: skip
        assert marker.read_text() == "ran"
