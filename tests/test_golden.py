"""Golden rings: every format version ever written stays readable, to the same timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blackbox.recovery.timeline import ring_table
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring

DATA = Path(__file__).parent / "data"
GOLDEN = sorted(DATA.glob("ring-v*.ring"))


def test_a_golden_ring_exists_for_every_supported_version() -> None:
    assert {int(p.stem.split("-v")[1]) for p in GOLDEN} == set(fmt.SUPPORTED_VERSIONS)


@pytest.mark.parametrize("ring_path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_ring_recovers_to_its_expected_timeline(ring_path: Path) -> None:
    expected = json.loads(ring_path.with_suffix(".expected.json").read_text(encoding="utf-8"))
    ring = read_ring(ring_path)
    rows = ring_table(ring).to_pylist()
    for row in rows:
        row["time"] = row["time"].isoformat()
    # Counters added since an old file's expected recovery read as 0 for it.
    counts = ring.recovery.as_dict()
    assert {k: v for k, v in counts.items() if k in expected["recovery"]} == expected["recovery"]
    assert all(v == 0 for k, v in counts.items() if k not in expected["recovery"])
    assert ring.clean == expected["clean"]
    # An old file's expected timeline is never regenerated: columns added since must read as null.
    known = set(expected["rows"][0])
    assert [{k: v for k, v in row.items() if k in known} for row in rows] == expected["rows"]
    assert all(v is None for row in rows for k, v in row.items() if k not in known)


def test_golden_v1_contents_read_by_hand() -> None:
    ring = read_ring(DATA / "ring-v1.ring")
    rec = ring.recovery
    assert (rec.valid, rec.torn, rec.first_seq, rec.last_seq, rec.overwritten) == (31, 1, 16, 46, 15)
    assert rec.strings_damaged == 1 and rec.labels_lost == 0  # counted when the table is built
    rows = ring_table(ring).to_pylist()
    assert rec.labels_lost == 3
    assert rows[0]["time"].isoformat() == "2026-01-01T00:00:00.016000+00:00"
    assert [r["label"] for r in rows[-2:]] == ["ünïcödé", "<blackbox: label #9 lost>"]
    assert [r["value"] for r in rows[-2:]] == [-(1 << 63), (1 << 63) - 1]


def test_golden_v2_new_kinds_read_by_hand() -> None:
    ring = read_ring(DATA / "ring-v2.ring")
    rows = {(r["kind"], r["label"]): r for r in ring_table(ring).to_pylist()}
    gpu = rows[("gpu_sample", None)]
    assert (gpu["device"], gpu["gpu_reserved"], gpu["gpu_alloc_retries"], gpu["host_rss"]) == (0, 70 << 30, 3, None)
    observer = rows[("oom", None)]
    assert (observer["value"], observer["device_total"], observer["device_free"]) == (2 << 30, 80 << 30, 1 << 30)
    assert observer["detail"] == "observer" and observer["oom_requested"] is None
    parsed = next(r for (k, _), r in rows.items() if k == "oom" and r["detail"] == "uncaught")
    assert parsed["oom_requested"] == 2 << 30 and parsed["oom_reserved_unallocated"] == round(6.5 * (1 << 30))
    assert parsed["oom_private_pools"] == 1 << 30 and parsed["device_total"] is None
    exc = rows[("exception", "builtins.ValueError: failed to allocate seat in queue")]
    assert exc["oom_requested"] is None and exc["detail"] == "uncaught"
    sig = rows[("signal", "SIGTERM")]
    assert (sig["value"], sig["detail"]) == (15, "default action")
    alloc = rows[("alloc", None)]
    assert (alloc["address"], alloc["stream"], alloc["value"]) == (0x7F00_0000, 0, 2 << 30)
    module = rows[("module_begin", "Net.fc1")]
    assert (module["gpu_allocated"], module["host_rss"]) == (60 << 30, 100 << 20)


def test_golden_v3_signals_stacks_and_crash_region_read_by_hand() -> None:
    ring = read_ring(DATA / "ring-v3.ring")
    assert ring.crash is not None and ring.crash.startswith("Fatal Python error: Segmentation fault")
    assert ring.stacks is not None and ring.stacks.damaged == 1  # the damaged frame entry, counted once
    rows = ring_table(ring).to_pylist()
    stacks = [r for r in rows if r["kind"] == "stack_sample"]
    assert [r["detail"] for r in stacks] == [
        "<module> (train.py:40);leak (train.py:12)",  # generation 1, in the first half
        "<blackbox: outer frames cut>;idle (träin.py:20)",  # generation 2, deeper than the cap
        "<blackbox: stack lost (its table entry was overwritten or damaged)>",
    ]
    assert {r["thread"] for r in stacks} == {0x7F00_0000_2000}  # the sampled thread, not the writer's
    assert [r["stack_depth"] for r in stacks] == [2, 70, 3]
    usr1, term = [r for r in rows if r["kind"] == "signal"][-2:]  # the two written as the C handler writes
    assert (usr1["sender"], usr1["sender_pid"], usr1["signal_code"]) == ("slurmstepd", 4242, 0)
    assert usr1["step"] == 7  # written by the handler with no step: the step in force fills it
    assert (term["sender"], term["sender_pid"], term["signal_code"], term["detail"]) == (
        None,
        None,
        128,
        "default action",
    )
    assert ring.meta["identity"]["attempt"] == 1 and ring.meta["liveness"] == "ofd-lock"


def test_golden_v3_exit_child_and_cgroup_samples_read_by_hand() -> None:
    rows = {r["kind"]: r for r in ring_table(read_ring(DATA / "ring-v3.ring")).to_pylist()}
    stat, child, exit_ = rows["cgroup_sample"], rows["child_sample"], rows["exit"]
    assert (stat["cgroup_anon"], stat["cgroup_file"], stat["cgroup_shmem"]) == (900 << 20, 80 << 20, 16 << 20)
    assert stat["cgroup_pgmajfault"] == 12 and stat["host_rss"] is None
    assert (child["label"], child["child_pid"], child["child_rss"]) == ("pt_data_worker", 4343, 700 << 20)
    assert exit_["value"] == 2


def test_golden_v4_allocation_samples_and_heap_table_read_by_hand() -> None:
    ring = read_ring(DATA / "ring-v4.ring")
    assert ring.heap is not None and (ring.recovery.heap_live, ring.recovery.heap_torn) == (3, 1)
    assert sorted(ring.heap.slots["size"].tolist()) == [64, 2 << 20, 4 << 20]
    rows = [r for r in ring_table(ring).to_pylist() if r["kind"] in ("alloc_sample", "free_sample")]
    leak = "<blackbox: outer frames cut>;<module> (train.py:40);cache_fill (train.py:33)"
    assert [r["detail"] for r in rows] == [
        leak,  # a kind-3 entry of generation 1, deeper than the frames it keeps
        "idle (träin.py:20)",  # one of generation 2, in the other half
        fmt.STACK_UNWRITTEN_TEXT,  # a fingerprint with no entry
        fmt.NO_PYTHON_TEXT,
        fmt.NO_PYTHON_TEXT,
        leak,
    ]
    assert [r["label"] for r in rows] == ["metrics-cache", None, None, None, None, "metrics-cache"]
    assert [r["alloc_domain"] for r in rows] == ["native", "python", "native", "native", "native", "gpu"]
    assert all(r["step"] == 7 for r in rows)  # filled from the record before: the hooks cannot read it
    assert (rows[0]["value"], rows[0]["sample_weight"], rows[-1]["device"]) == (4 << 20, 5 << 20, 0)


def test_golden_v5_alerts_and_their_actions_read_by_hand() -> None:
    rows = [r for r in ring_table(read_ring(DATA / "ring-v5.ring")).to_pylist() if r["kind"].startswith("alert")]
    memory, forecast, sent, returned = rows
    assert (memory["label"], memory["alert_kind"], memory["alert_level"], memory["limit_kind"]) == (
        "memory critical", "memory", "critical", "cgroup")  # fmt: skip
    assert (memory["value"], memory["limit_bytes"], memory["growth_per_s"]) == (980 << 20, 1 << 30, 12 << 20)
    assert (memory["forecast_ms"], memory["forecast_error_ms"], memory["forecast_steps"]) == (3700, 400, 21)
    assert (forecast["device"], forecast["limit_kind"], forecast["forecast_steps"]) == (0, "gpu", None)  # not counted
    assert (sent["detail"], sent["label"], sent["value"], sent["alert_kind"]) == ("signal sent", "SIGUSR1", 10,
                                                                                  "forecast")  # fmt: skip
    assert (returned["detail"], returned["label"], returned["alert_level"]) == (
        "handler returned", "on_usr1 (train.py:9)", "critical")  # fmt: skip
