from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import private_tmp  # on import, /var/tmp becomes this session's own: before blackbox (numpy's threads) is imported
import pytest

import blackbox
from blackbox.ring.reader import Ring, read_ring
from blackbox.ring.writer import c_writer_module

REPO = Path(__file__).resolve().parent.parent


def tick_kinds() -> list[str]:
    """The records one sample tick writes here: the main thread's stack, a host sample, and the cgroup's
    memory.stat where there is one."""
    from blackbox.collect.host import find_memory_cgroup

    return ["stack_sample", "sample"] + (["cgroup_sample"] if find_memory_cgroup() is not None else [])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (a rendezvous for torchrun's or accelerate's ranks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_py(
    code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120, check: bool = True, preexec_fn=None
) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet in a fresh interpreter with the repo importable."""
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        preexec_fn=preexec_fn,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# Tests send SIGINT, SIGQUIT and SIGHUP to their jobs as a terminal does. A suite started in the background
# by a non-interactive shell (`cmd &`) inherits SIGINT and SIGQUIT ignored, under nohup SIGHUP too, and so
# would every job it starts: a job then never sees the signal (Python installs no KeyboardInterrupt handler
# for an ignored SIGINT), the test waits, and the job lives on as a child of this process, sampled by every
# recorder armed here after it. The suite keeps ignoring them, through a handler that does nothing; an exec
# resets a handled signal to its default, so the jobs get the dispositions a terminal gives them.
for _sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, lambda signum, frame: None)


def spawn_py(code: str, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=full_env, text=True, **kw)


BACKENDS = ["c", "python"]


@pytest.fixture(params=BACKENDS)
def writer_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once with the C write path and once with the pure-Python one."""
    backend: str = request.param
    if backend == "c" and c_writer_module() is None:
        pytest.skip("the C write path blackbox.ring._cwriter is not built (no C compiler at install)")
    monkeypatch.setenv("BLACKBOX_WRITER", backend)
    return backend


@pytest.fixture
def recorder(tmp_path: Path, writer_backend: str) -> Iterator[blackbox.Recorder]:
    """An armed Recorder on a small ring, not the process-wide one; disarmed after. Allocation sampling (on by
    default) is off here: its samples of the test process's own allocations would fill the 256 slots that
    these tests read record by record (real jobs, sampled by default, are the allocation tests')."""
    rec = blackbox.Recorder.arm(tmp_path / "t.ring", capacity=256, sample_interval=3600, allocations=False)
    assert rec.armed
    assert rec.writer_backend == writer_backend
    yield rec
    rec.disarm()


def reread(rec: blackbox.Recorder) -> Ring:
    assert rec.path is not None
    return read_ring(rec.path)


def labels_of(ring: Ring) -> list[str | None]:
    return [ring.strings.get(int(i)) if i else None for i in ring.records["label"]]


class MemoryCgroup:
    """A child memory cgroup under this process's own, with a limit; children join it at exec."""

    def __init__(self, directory: Path, version: int) -> None:
        self.directory = directory
        self.version = version

    def join(self) -> None:  # runs in the child between fork and exec
        (self.directory / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.directory / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise AssertionError(f"no oom_kill counter in {self.directory / name}")


@pytest.fixture(autouse=True)
def _default_ring_folders_left_clean() -> Iterator[None]:
    """What a test leaves in /var/tmp/blackbox-<uid> goes after it (tests/leftovers.py), never a live ring;
    /var/tmp is the session's own (tests/private_tmp.py), so never a ring the suite did not make."""
    from leftovers import clean, snapshot

    before = snapshot()
    yield
    clean(before)


# Under pytest-xdist (tools/test.sh runs `-n 2 --dist loadgroup`) a test file is one unit: its tests run on one
# worker, in order, and set up its module fixtures once. Each worker is its own process, so each makes its
# own private /var/tmp (private_tmp.enter above), memory cgroups (named by pid) and users (named by pid).
# The Slurm files share one unit: one private cluster at a time on the machine.
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = item.module.__name__ if getattr(item, "module", None) is not None else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group("slurm" if module.startswith("test_slurm") else module))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What the session left in its private /var/tmp (or its BLACKBOX_DIR) goes whole."""
    private_tmp.leave()


@pytest.fixture
def memory_cgroup(tmp_path: Path) -> Iterator[Callable[[int], MemoryCgroup]]:
    """Make a memory cgroup with a limit (v1 or v2); skip only where the kernel refuses."""
    from blackbox.collect.host import find_memory_cgroup

    made: list[Path] = []

    def make(limit: int) -> MemoryCgroup:
        own = find_memory_cgroup()
        if own is None:
            pytest.skip("this process is in no memory cgroup (no cgroup v1 memory controller or v2 memory.current)")
        child = own.directory / f"blackbox-test-{os.getpid()}-{len(made)}"
        try:
            child.mkdir()
            made.append(child)
            if own.version == 1:
                (child / "memory.limit_in_bytes").write_text(str(limit))
                if (child / "memory.swappiness").exists():
                    (child / "memory.swappiness").write_text("0")
            else:
                (child / "memory.max").write_text(str(limit))
                if (child / "memory.swap.max").exists():
                    (child / "memory.swap.max").write_text("0")
        except OSError as exc:
            pytest.skip(f"the kernel refused a child memory cgroup under {own.directory}: {exc}")
        return MemoryCgroup(child, own.version)

    yield make
    for d in reversed(made):
        for _ in range(50):
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 48 MiB ext4 filesystem, loop-mounted (skipped only where mounting is refused)."""
    image, mount = tmp_path / "fs.img", tmp_path / "mnt"
    mount.mkdir()
    try:
        subprocess.run(["truncate", "-s", "48M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small ext4 filesystem here: {exc}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def readme_fleet_query() -> str:
    """README's fleet query: the Python block that follows the marker ``<!-- fleet query -->``."""
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- fleet query -->", 1)[1].split("```python\n", 1)[1]
    return block.split("```", 1)[0]
