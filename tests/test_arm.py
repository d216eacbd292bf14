"""arm(): naming, defaults, one recorder per process, and failures that only warn."""

from __future__ import annotations

import os
import re
import socket
import stat
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import run_py

import blackbox
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring


def test_arm_in_blackbox_dir_names_ring_after_host_pid_rank_and_start(tmp_path: Path) -> None:
    out = run_py(
        """
        import blackbox, os
        r = blackbox.arm(capacity=64)
        assert blackbox.arm() is r and blackbox.active() is r
        print(r.path); print(os.getpid())
        """,
        env={"BLACKBOX_DIR": str(tmp_path), "RANK": "3"},
    )
    path, pid = out.stdout.split()
    p = Path(path)
    assert p.parent == tmp_path
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())
    assert re.fullmatch(rf"blackbox-{re.escape(host)}-rank3-pid{pid}-\d{{8}}T\d{{6}}\.\d{{6}}Z\.ring", p.name)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    ring = read_ring(p)
    assert ring.clean  # disarmed at interpreter exit
    assert ring.meta["identity"]["rank"] == 3 and ring.meta["identity"]["pid"] == int(pid)


def test_default_folder_is_var_tmp_per_user(tmp_path: Path) -> None:
    out = run_py("import blackbox.ring.file as r; print(r.default_dir())", env={"BLACKBOX_DIR": ""})
    assert out.stdout.strip() == f"/var/tmp/blackbox-{os.getuid()}"


def test_exit_code_unchanged_and_clean_end_recorded(tmp_path: Path) -> None:
    proc = run_py(
        "import blackbox, sys; blackbox.arm(sys.argv[1], capacity=64); blackbox.mark('bye'); sys.exit(3)",
        str(tmp_path / "e.ring"),
        check=False,
    )
    assert proc.returncode == 3 and proc.stderr == ""
    assert read_ring(tmp_path / "e.ring").clean


def test_uncaught_exception_keeps_traceback_and_status(tmp_path: Path) -> None:
    proc = run_py(
        "import blackbox, sys; blackbox.arm(sys.argv[1], capacity=64); raise KeyError('boom')",
        str(tmp_path / "x.ring"),
        check=False,
    )
    assert proc.returncode == 1 and "KeyError: 'boom'" in proc.stderr


def test_existing_path_warns_and_is_left_untouched(tmp_path: Path) -> None:
    target = tmp_path / "taken.ring"
    target.write_bytes(b"precious")
    with pytest.warns(blackbox.BlackboxWarning, match="could not arm"):
        rec = blackbox.Recorder.arm(target, capacity=64)
    assert not rec.armed and target.read_bytes() == b"precious"
    rec.mark("ignored", 1)
    rec.step()
    with rec.phase("ignored"):
        pass
    rec.disarm()


def test_symlink_path_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = tmp_path / "link.ring"
    link.symlink_to(victim)
    with pytest.warns(blackbox.BlackboxWarning):
        rec = blackbox.Recorder.arm(link, capacity=64)
    assert not rec.armed and victim.read_bytes() == b"keep"


def test_unusable_folder_warns(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(blackbox.BlackboxWarning):
        rec = blackbox.Recorder.arm(blocker / "sub" / "r.ring", capacity=64)
    assert not rec.armed


def test_full_disk_fails_at_arm_with_one_warning(tmp_path: Path) -> None:
    # RLIMIT_FSIZE stands in for a full disk: posix_fallocate fails with EFBIG at arm.
    proc = run_py(
        """
        import resource, signal, sys, warnings
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        import blackbox
        r = blackbox.arm(sys.argv[1], capacity=1 << 16)
        blackbox.mark('still running', 1)
        print('armed' if r.armed else 'disarmed')
        sys.exit(5)
        """,
        str(tmp_path / "big.ring"),
        check=False,
    )
    assert proc.returncode == 5 and proc.stdout.strip() == "disarmed"
    assert proc.stderr.count("BlackboxWarning") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "big.ring").exists()  # no partial ring left behind


def test_tmpfs_folder_warns_but_arms() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this machine")
    from blackbox.ring.file import is_diskless

    if not is_diskless(shm):
        pytest.skip("/dev/shm is not a tmpfs here")
    with pytest.warns(blackbox.BlackboxWarning, match="tmpfs"):
        rec = blackbox.Recorder.arm(shm, capacity=64)
    try:
        assert rec.armed
    finally:
        rec.disarm()
        assert rec.path is not None
        rec.path.unlink()


def test_invalid_settings_warn_and_disarm(tmp_path: Path) -> None:
    for kwargs in ({"capacity": 3}, {"sample_interval": 0}, {"on_fork": "explode"}):
        with pytest.warns(blackbox.BlackboxWarning):
            rec = blackbox.Recorder.arm(tmp_path / "bad.ring", **kwargs)  # type: ignore[arg-type]
        assert not rec.armed
    assert not (tmp_path / "bad.ring").exists()


def test_warnings_as_errors_still_never_raise(tmp_path: Path) -> None:
    target = tmp_path / "dup.ring"
    target.write_bytes(b"")
    proc = run_py(
        "import blackbox, sys; r = blackbox.arm(sys.argv[1]); print(r.armed)",
        str(target),
        env={"PYTHONWARNINGS": "error"},
    )
    assert proc.stdout.strip() == "False" and "BlackboxWarning" in proc.stderr


def test_sampler_writes_samples_and_stops_at_disarm(tmp_path: Path) -> None:
    import time

    rec = blackbox.Recorder.arm(tmp_path / "s.ring", capacity=1024, sample_interval=0.01)
    time.sleep(0.3)
    rec.disarm()
    assert rec._sampler is not None and not rec._sampler.is_alive()
    ring = read_ring(tmp_path / "s.ring")
    samples = ring.records[ring.records["kind"] == 3]
    assert len(samples) >= 10
    gaps = (samples["time"][1:] - samples["time"][:-1]) / 1e9
    assert float(sorted(gaps)[len(gaps) // 2]) < 0.05  # median interval near 10 ms


def test_64_mib_ring_is_preallocated_not_sparse(tmp_path: Path) -> None:
    # arm latency is measured by tools/bench_ring.py; here: the blocks are reserved at arm.
    rec = blackbox.Recorder.arm(tmp_path / "l.ring", capacity=1 << 19, sample_interval=3600)
    try:
        assert rec.armed and rec.path is not None
        assert rec.path.stat().st_size >= (1 << 19) * 128
        assert os.stat(rec.path).st_blocks * 512 >= (1 << 19) * 128  # blocks reserved, not sparse
    finally:
        rec.disarm()


@pytest.mark.parametrize("extension", ["built", "missing"])
def test_module_functions_reach_each_arm_and_go_quiet_after_disarm(tmp_path: Path, extension: str) -> None:
    block = "sys.modules['blackbox.ring._cwriter'] = None" if extension == "missing" else ""
    out = run_py(
        f"""
        import sys
        {block}
        import blackbox
        from blackbox import mark as early_mark, step as early_step  # taken before arm: always forward
        assert early_mark("never armed", 0) is None and early_step(n=1) is None  # nothing, no error
        rec = blackbox.arm(sys.argv[1] + "/a.ring", capacity=64, sample_interval=3600)
        assert blackbox.mark is rec.mark and blackbox.step is rec.step
        early_mark("early", 1); blackbox.mark("direct", 2); blackbox.step(5)
        early_mark("keyword", value=7); early_step(n=6)
        blackbox.disarm()
        assert blackbox.mark is not rec.mark
        blackbox.mark("after", 3); early_mark("after", 4)  # no recorder: nothing, no error
        rec2 = blackbox.arm(sys.argv[1] + "/b.ring", capacity=64, sample_interval=3600)
        early_mark("second", 6)
        blackbox.disarm()
        print(type(early_mark).__name__, rec.writer_backend)
        """,
        str(tmp_path),
    )
    # unarmed, the module's functions are the C extension's forwarders where it is built: one C call
    assert out.stdout.split() == (["Forward", "c"] if extension == "built" else ["function", "python"])
    # without the extension, what goes unrecorded is said once in the process (two arms here), and nothing else
    said = [line for line in out.stderr.splitlines() if "BlackboxWarning" in line]
    assert out.stderr.count("BlackboxWarning") == (0 if extension == "built" else 1), out.stderr
    assert all("C extension" in line and "is not built" in line for line in said), out.stderr
    first, second = read_ring(tmp_path / "a.ring"), read_ring(tmp_path / "b.ring")

    def marks(ring: Any) -> tuple[list[str], list[int]]:  # the job's marks, not arm's notes
        rows = ring.records[ring.records["kind"] == fmt.KIND_CODES["mark"]]
        rows = rows[[not ring.strings[int(i)].startswith(fmt.NOTE_PREFIX) for i in rows["label"]]]
        return [ring.strings[int(i)] for i in rows["label"]], rows["value"].tolist()

    assert marks(first) == (["early", "direct", "keyword"], [1, 2, 7])
    assert first.records["step"][-1] == 6
    assert marks(second)[0] == ["second"]


def test_sync_interval_msyncs_periodically_without_changing_the_sampling(tmp_path: Path) -> None:
    rec = blackbox.Recorder.arm(tmp_path / "s.ring", capacity=1024, sample_interval=0.5, sync_interval=0.05)
    try:
        for i in range(1000):
            rec.mark("m", i)
        time.sleep(0.6)
        assert rec.syncs >= 5 and rec.sync_seconds > 0
    finally:
        rec.disarm()
    ring = read_ring(tmp_path / "s.ring")
    samples = int((ring.records["kind"] == fmt.KIND_CODES["sample"]).sum())
    assert samples <= 4, "arm, one or two ticks at 0.5 s, disarm: syncs do not add samples"
    assert ring.meta["options"]["sync_interval_s"] == 0.05
    with pytest.warns(blackbox.BlackboxWarning, match="sync_interval"):
        bad = blackbox.Recorder.arm(tmp_path / "b.ring", sync_interval=0)
    assert not bad.armed


def test_a_new_path_without_a_suffix_says_it_made_the_ring_file_not_a_folder(tmp_path: Path) -> None:
    # GIVEN paths where nothing is: "rings" (a folder or a file?), "job.ring" and "new/" (plain)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        # WHEN each is armed
        for path in (tmp_path / "rings", tmp_path / "job.ring", str(tmp_path / "new") + "/"):
            blackbox.Recorder.arm(path, capacity=64, sample_interval=3600).disarm()
    # THEN "rings" is the ring file, and arm said so in one warning; the others said nothing
    texts = [str(w.message) for w in said if issubclass(w.category, blackbox.BlackboxWarning)]
    assert (tmp_path / "rings").is_file() and (tmp_path / "job.ring").is_file() and (tmp_path / "new").is_dir()
    assert len(texts) == 1 and f"made the ring file {tmp_path / 'rings'}" in texts[0] and "'/'" in texts[0], texts
