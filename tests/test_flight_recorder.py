"""PyTorch's flight recorder dumps, read as untrusted input: a pickle is never unpickled (a planted one runs
nothing and is refused in one line), a link is not followed, another user's or an earlier job's dump is not
read; and where the job turned the recorder on, arm notes where its dumps will be."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

import pytest
from conftest import run_py

from blackbox.recovery.flight import decode, read_dump
from blackbox.ring.reader import read_header

DUMP = {"version": "2.10", "pg_config": {"0": {"name": "0", "ranks": "[0, 1, 2]"}}, "pg_status": {},
        "entries": [{"record_id": i, "pg_id": 0, "collective_seq_id": i + 1, "p2p_seq_id": 0, "is_p2p": False,
                     "profiling_name": "gloo:all_reduce", "state": "scheduled", "retired": True,
                     "time_created_ns": 10**18 + i, "input_sizes": [[4]], "frames": []} for i in range(5)]}  # fmt: skip


def _life() -> tuple[float, float]:
    """A ring's life that ended now, in epoch seconds."""
    return time.time() - 60, time.time()


class Planted:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, ("touch planted-ran",)


def _config(tmp_path: Path) -> dict[str, object]:
    return {"dump_prefix": str(tmp_path / "nccl_trace_rank_"), "buffer_size": 2000}


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_dump_of_plain_data_reads_as_pickle_would(protocol: int) -> None:
    assert decode(pickle.dumps(DUMP, protocol=protocol)) == DUMP


def test_a_rank_s_dump_says_the_last_collective_it_entered(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(DUMP, protocol=2))
    dump, note = read_dump(_config(tmp_path), 1, os.getuid(), _life())
    assert note is None and dump == {"file": str(tmp_path / "nccl_trace_rank_1"), "groups": {
        "0": {"last_seq": 5, "last": "gloo:all_reduce", "state": "scheduled", "entries": 5}}}  # fmt: skip


def test_a_planted_pickle_runs_nothing_and_is_refused_in_one_line(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [Planted()]}))
    monkeypatch.chdir(tmp_path)
    dump, note = read_dump(_config(tmp_path), 0, os.getuid(), _life())
    assert dump is None and note is not None and "\n" not in note and "GLOBAL" in note, note
    assert not (tmp_path / "planted-ran").exists()


@pytest.mark.parametrize("case", ["link", "stale", "other owner", "relative", "none"])
def test_a_dump_that_is_not_this_rank_s_is_not_read(tmp_path: Path, case: str) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    config = _config(tmp_path)
    if case == "link":
        (tmp_path / "elsewhere").write_bytes(pickle.dumps(DUMP))
        path.symlink_to(tmp_path / "elsewhere")
    elif case != "none":
        path.write_bytes(pickle.dumps(DUMP))
    if case == "stale":  # an earlier job's, at torch's default path
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    if case == "other owner":
        if os.getuid() != 0:
            pytest.skip("changing a file's owner needs root")
        os.chown(path, 65534, 65534)
    if case == "relative":
        config = {"dump_prefix": "nccl_trace_rank_", "buffer_size": 2000}
    dump, note = read_dump(config, 0, os.getuid(), _life())
    assert dump is None
    expected = {"link": "symbolic link", "stale": "outside this process's life", "other owner": "uid 65534",
                "relative": "relative", "none": None}[case]  # fmt: skip
    assert (note is None) if expected is None else (expected in str(note) and "\n" not in str(note)), note


def test_arm_notes_where_the_flight_recorder_dumps_where_the_job_turned_it_on(tmp_path: Path) -> None:
    code = "import sys, blackbox; blackbox.arm(sys.argv[1] + '/'); blackbox.disarm()"
    run_py(code, str(tmp_path / "on"), env={"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "/x/fr_"})
    run_py(code, str(tmp_path / "default"), env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"})
    run_py(code, str(tmp_path / "off"), env={"TORCH_FR_DUMP_TEMP_FILE": "/x/fr_"})  # no buffer: no recorder
    metas = {d: read_header(next((tmp_path / d).glob("*.ring"))).meta for d in ("on", "default", "off")}
    assert metas["on"]["flight_recorder"] == {"dump_prefix": "/x/fr_", "buffer_size": 2000}
    assert metas["default"]["flight_recorder"] == {"dump_prefix": "/tmp/nccl_trace_rank_", "buffer_size": 100}
    assert "flight_recorder" not in metas["off"]  # absent, never null: older readers refuse a null object
