"""Host probes: memory cgroup discovery (v1 and v2) and limit parsing."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from blackbox.collect import host
from blackbox.collect.host import (
    HostProbe,
    effective_limit_file,
    find_memory_cgroup,
    meminfo_available,
    oom_kill_count,
    parse_limit,
    psi_totals,
    read_proc,
)


def test_read_proc_reads_past_one_page_up_to_its_limit(tmp_path: Path) -> None:
    """The children lists are read with plain system calls: a list longer than one read (a job with
    hundreds of workers) comes whole, a limit bounds it, an unreadable path is None (the thread has gone)."""
    text = b" ".join(str(pid).encode() for pid in range(100000, 102000))  # 13,999 bytes: four reads
    (tmp_path / "children").write_bytes(text)
    assert read_proc(str(tmp_path / "children")) == text
    assert read_proc(str(tmp_path / "children"), 5000) == text[:5000]
    assert read_proc(str(tmp_path / "gone")) is None
    assert read_proc("/proc/self/comm", 64) == Path("/proc/self/comm").read_bytes()


def _fake(tmp_path: Path, cgroup: str, mountinfo: str) -> tuple[str, str]:
    (tmp_path / "cgroup").write_text(cgroup)
    (tmp_path / "mountinfo").write_text(mountinfo)
    return str(tmp_path / "cgroup"), str(tmp_path / "mountinfo")


def test_cgroup_v1_is_found_and_its_effective_limit_is_the_lowest_ancestor(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    job = root / "slurm" / "job_7"
    job.mkdir(parents=True)
    (root / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (root / "slurm" / "memory.limit_in_bytes").write_text(f"{8 << 30}\n")
    (job / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (job / "memory.usage_in_bytes").write_text("12345\n")
    cg, mi = _fake(
        tmp_path, "4:memory:/slurm/job_7\n1:cpu:/\n", f"30 25 0:27 / {root} rw,relatime - cgroup cgroup rw,memory\n"
    )
    found = find_memory_cgroup(cg, mi)
    assert found is not None and found.version == 1 and found.directory == job.resolve()
    assert effective_limit_file(found) == (root / "slurm" / "memory.limit_in_bytes").resolve()


def test_cgroup_v2_is_found_with_memory_max(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    job = root / "user.slice" / "job"
    job.mkdir(parents=True)
    (job / "memory.current").write_text("4096\n")
    (job / "memory.max").write_text("max\n")
    cg, mi = _fake(tmp_path, "0::/user.slice/job\n", f"35 25 0:30 / {root} rw - cgroup2 cgroup2 rw\n")
    found = find_memory_cgroup(cg, mi)
    assert found is not None and found.version == 2 and found.usage.name == "memory.current"
    assert found.limit.name == "memory.max" and effective_limit_file(found) is None  # "max": unlimited


def test_no_memory_cgroup_gives_none(tmp_path: Path) -> None:
    cg, mi = _fake(tmp_path, "1:cpu:/\n", "22 1 0:5 / /proc rw - proc proc rw\n")
    assert find_memory_cgroup(cg, mi) is None


def test_parse_limit() -> None:
    assert parse_limit("max\n") is None and parse_limit("9223372036854771712") is None
    assert parse_limit("268435456\n") == 256 << 20 and parse_limit("garbage") is None and parse_limit("") is None


def test_probe_reads_this_process() -> None:
    probe = HostProbe()
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(64 << 20); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and probe.read()[3] < 64 << 20:
            time.sleep(0.05)
        rss, usage, limit, children, available, oom_kills, psi_some, psi_full, anon = probe.read()
        assert rss > 1 << 20 and 0 < anon < rss
        assert children >= 64 << 20, "the child's 64 MiB buffer counts in children_rss"
        assert 0 < available
        if probe.cgroup is not None:
            assert usage > 0 and oom_kills >= 0
        assert limit == -1 or limit > 0
        if Path("/proc/pressure/memory").exists():
            assert psi_some >= 0 and psi_full >= 0
    finally:
        child.kill()
        child.wait()
        probe.close()
    assert probe.read() == (-1,) * 9


def test_oom_kill_psi_and_meminfo_parsers() -> None:
    assert oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n") == 3  # cgroup v1 memory.oom_control
    assert oom_kill_count("low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\n") == 1  # cgroup v2 memory.events
    assert oom_kill_count("oom 2\n") is None
    psi = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=56\n"
    assert psi_totals(psi) == (1234, 56) and psi_totals("") == (-1, -1)
    assert meminfo_available("MemTotal: 100 kB\nMemAvailable:   2048 kB\n") == 2 << 20
    assert meminfo_available("MemTotal: 100 kB\n") is None


def test_a_child_that_names_itself_after_it_is_first_seen_is_sampled_by_its_new_name() -> None:
    """A spawned DataLoader worker starts as ``python`` and names itself ``pt_data_worker`` once its
    interpreter is up: seen in between, it kept its first name for good, and recovery did not know the
    job's own workers (a CI run under load took another process's OOM-killed worker for one of them)."""
    probe = HostProbe()
    rename = "import sys, time; sys.stdin.readline(); open('/proc/self/comm', 'w').write('pt_data_worker'); " \
             "time.sleep(9)"
    child = subprocess.Popen([sys.executable, "-c", rename], stdin=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(pid == child.pid for pid, _, _ in probe.children() or []):
            time.sleep(0.01)
        first = {pid: name for pid, _, name in probe.children() or []}[child.pid]
        assert first == Path("/proc/self/comm").read_text().strip()  # seen before its rename, with our name
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        names: set[str] = set()
        while time.monotonic() < deadline and "pt_data_worker" not in names:
            names = {name for pid, _, name in probe.children() or [] if pid == child.pid}
            time.sleep(0.01)
        assert names == {"pt_data_worker"}
    finally:
        child.kill()
        child.wait()


def test_between_full_reads_only_the_threads_that_made_children_have_their_lists_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each thread's ``children`` file lists the children it made. Reading every thread's list every tick
    cost 436 us with 64 threads (a job has a thread per core); now all are read once per FULL_SCAN_NS, and
    in between only the main thread's and those of threads that had children at the last full read."""
    monkeypatch.setattr(host, "FULL_SCAN_NS", 400_000_000)
    lists: list[str] = []
    real = host.read_proc

    def counted(path: str, limit: int = 1 << 16) -> bytes | None:
        if path.endswith("/children"):
            lists.append(path)
        return real(path, limit)

    monkeypatch.setattr(host, "read_proc", counted)
    done = threading.Event()
    made: list[Any] = []

    def make_child() -> None:  # a thread that makes a child and stays (its list keeps it)
        made.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
        done.wait(60)

    # GIVEN 32 idle threads and one that made a child, in a process whose main thread made none
    idle = [threading.Thread(target=done.wait, args=(60,)) for _ in range(32)]
    for t in idle:
        t.start()
    first = threading.Thread(target=make_child)
    first.start()
    probe = HostProbe()
    try:
        while not made:
            time.sleep(0.01)
        # WHEN the probe reads the children: first every thread's list, then ticks between full reads
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and made[0].pid not in {pid for pid, _, _ in probe.children() or []}:
            time.sleep(0.05)
        lists.clear()
        seen = {pid for pid, _, _ in probe.children() or []}
        # THEN a tick reads the main thread's list and the maker's (not all 35), and still finds the child
        maker = f"/task/{first.native_id}/children"
        assert made[0].pid in seen and any(p.endswith(maker) for p in lists) and len(lists) < 5, lists
        # AND a child made by another thread shows at the next full read, within FULL_SCAN_NS and a tick
        second = threading.Thread(target=make_child)
        second.start()
        while len(made) < 2:
            time.sleep(0.01)
        t0 = time.monotonic()
        while time.monotonic() < deadline and made[1].pid not in {pid for pid, _, _ in probe.children() or []}:
            time.sleep(0.05)
        assert time.monotonic() - t0 < 0.4 + 2.5, "seen at the next full read"
        lists.clear()
        seen = {pid for pid, _, _ in probe.children() or []}
        assert {made[0].pid, made[1].pid} <= seen and len(lists) < 6, lists
    finally:
        done.set()
        for child in made:
            child.kill()
            child.wait()
        probe.close()


def test_the_probes_pread_holds_the_gil_and_reads_what_os_pread_reads(tmp_path: Path) -> None:
    """The tick's reads take microseconds; releasing the GIL for each let a job's thread busy in Python keep it
    5 ms (the switch interval) before the sampler got it back. PREAD is libc's pread through ctypes.PyDLL."""
    import os

    assert host.PREAD is not os.pread, "libc's pread through PyDLL is available on Linux"
    (tmp_path / "f").write_bytes(b"0123456789" * 1000)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert host.PREAD(fd, 4096, 0) == os.pread(fd, 4096, 0) and host.PREAD(fd, 10, 9995) == b"56789"
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0, "pread leaves the offset alone"
    finally:
        os.close(fd)
    with pytest.raises(OSError) as caught:
        host.PREAD(fd, 16, 0)  # closed now
    assert caught.value.errno == 9
