"""Python stacks in the ring: sampled at each tick, interned in the stack table, joined to memory.

Real processes killed by SIGKILL and by the kernel's OOM killer must leave stacks
that name the function that leaked; threads, the depth cap, thousands of distinct
stacks (generation flips) and a kill at any instant must never give a wrong stack.
Both write paths (the C extension and the pure-Python one) run every test.
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import BACKENDS, run_py, spawn_py
from test_export import validate_trace

import blackbox
from blackbox import _recorder
from blackbox.cli import info, main
from blackbox.collect import stacks as stacks_mod
from blackbox.recovery.bundle import read_bundle
from blackbox.recovery.kinds import of_kind
from blackbox.recovery.timeline import STACK_LOST, py_rows, ring_table
from blackbox.ring import format as fmt
from blackbox.ring.reader import find_rings, read_ring
from blackbox.ring.scan import scan_stack_spans
from blackbox.ring.writer import c_writer_module

MiB = 1 << 20


def innermost(folded: str | None) -> str:
    """The function of a folded stack's innermost frame (``leak`` of ``...;leak (job.py:9)``)."""
    assert folded, "a stack sample without a stack"
    return folded.rsplit(";", 1)[-1].rsplit(" (", 1)[0]


def stack_rows(ring_path: Path) -> list[dict]:
    return py_rows(of_kind(ring_table(read_ring(ring_path)), "stack_sample"))


def child_env(backend: str) -> dict[str, str]:
    if backend == "c" and c_writer_module() is None:
        pytest.skip("the C write path blackbox.ring._cwriter is not built")
    return {"BLACKBOX_WRITER": backend}


def qualified(name: str) -> str:
    """A frame's name as the sampler gives it: qualified (``co_qualname``) from Python 3.11, the function's
    own name on 3.10, whose code objects hold no qualified name."""
    return name if sys.version_info >= (3, 11) else name.rsplit(".", 1)[-1]


# ---------------------------------------------------------------- in process, both write paths
def test_a_tick_samples_the_main_thread_before_its_memory_sample(
    recorder: blackbox.Recorder, writer_backend: str
) -> None:
    def working_here() -> None:
        recorder.sample_now()

    working_here()
    table = ring_table(read_ring(recorder.path))
    rows = py_rows(table)
    i = max(k for k, r in enumerate(rows) if r["kind"] == "stack_sample")
    stack = rows[i]
    assert innermost(stack["detail"]) == qualified(
        "test_a_tick_samples_the_main_thread_before_its_memory_sample.<locals>.working_here"
    )
    assert "sample_now" not in stack["detail"], "blackbox's own frames are left out of a synchronous sample"
    assert (stack["thread"], stack["label"]) == (threading.main_thread().ident, "MainThread")
    assert stack["stack_depth"] == len(stack["detail"].split(";"))
    assert rows[i + 1]["kind"] == "sample" and rows[i + 1]["stack"] == stack["detail"], "the tick's stack is joined"
    assert all(r["stack"] is None for r in rows if r["kind"] not in ("sample", "cgroup_sample", "gpu_sample"))
    assert recorder.writer_backend == writer_backend


def test_a_repeating_stack_costs_one_record_and_no_entry(tmp_path: Path) -> None:
    # allocation sampling off: its new allocation stacks would be entries of the same table
    recorder = blackbox.Recorder.arm(tmp_path / "t.ring", capacity=256, sample_interval=3600, allocations=False)
    strings = len(read_ring(recorder.path).strings)
    for i in range(50):
        recorder.sample_now()  # the same stack each time
        if i == 0:
            first = read_ring(recorder.path).stacks
    ring = read_ring(recorder.path)
    assert ring.stacks is not None and first is not None
    assert ring.stacks.frames == first.frames and ring.stacks.stacks == first.stacks, "nothing new after the first"
    assert len(ring.strings) == strings, "stacks never touch the string region"
    here = [r["detail"] for r in stack_rows(recorder.path) if "test_a_repeating" in (r["detail"] or "")]
    recorder.disarm()
    assert len(here) == 51 and len(set(here[1:])) == 1  # arm's own sample (from this function), then the 50


def test_deep_recursion_keeps_the_innermost_frames_and_the_depth(recorder: blackbox.Recorder) -> None:
    def recurse(n: int) -> None:
        if n:
            recurse(n - 1)
        else:
            recorder.sample_now()

    recurse(300)
    stack = next(r for r in reversed(stack_rows(recorder.path)) if r["detail"] and "recurse" in r["detail"])
    frames = stack["detail"].split(";")
    assert frames[0] == fmt.STACK_TRUNCATED_TEXT
    assert len(frames) == 1 + fmt.MAX_STACK_DEPTH and all(innermost(f).endswith("recurse") for f in frames[1:])
    assert stack["stack_depth"] > 300, "the depth before the cap: the recursion and its callers"


def test_named_threads_are_sampled_where_they_block(tmp_path: Path, writer_backend: str) -> None:
    stop = threading.Event()

    def blocked_in_c() -> None:
        while not stop.is_set():
            time.sleep(0.01)  # a C call that releases the GIL: the stack shows this frame

    ready = threading.Event()

    def waiting_loader() -> None:
        ready.set()
        stop.wait()

    by_object = threading.Thread(target=blocked_in_c, name="sleeper")
    by_object.start()
    rec = blackbox.Recorder.arm(tmp_path / "t.ring", capacity=1024, sample_interval=3600,
                                stack_threads=["loader", by_object])  # fmt: skip
    late = threading.Thread(target=waiting_loader, name="loader")  # started after arm: found by name
    late.start()
    try:
        ready.wait()
        time.sleep(0.1)  # into stop.wait()
        rec.sample_now()
    finally:
        stop.set()
        by_object.join()
        late.join()
        rec.disarm()
    rows = stack_rows(rec.path)
    labels = [r["label"] for r in rows]  # arm's tick (no loader yet), sample_now's, disarm's (threads ended)
    assert labels[:3] == ["MainThread", "sleeper", "MainThread"] and labels[5:] == ["MainThread"]
    assert sorted(labels[3:5]) == ["loader", "sleeper"], "the main thread first in every tick"
    tick = {r["label"]: r for r in rows[2:5]}
    assert tick["sleeper"]["thread"] == by_object.ident
    assert innermost(tick["sleeper"]["detail"]).endswith("blocked_in_c"), "the frame that made the C call"
    assert tick["loader"]["thread"] == late.ident and "waiting_loader" in tick["loader"]["detail"]
    assert innermost(tick["loader"]["detail"]) == qualified("Condition.wait")


def test_thousands_of_distinct_stacks_flip_generations_and_never_resolve_wrong(
    tmp_path: Path, writer_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_recorder, "DEFAULT_STACKS_SIZE", 16 << 10)  # 8 KiB halves: flips every few dozen stacks
    # allocations off: another thread's sampled allocation (xdist's IO thread) writes its stack into the table's
    # tail at once, and this read of the live ring could meet that entry in flight (its CRC not yet true)
    rec = blackbox.Recorder.arm(tmp_path / "d.ring", capacity=8192, sample_interval=3600, allocations=False)
    strings_before = len(read_ring(rec.path).strings)
    functions = []
    for i in range(3000):
        code = compile(f"def distinct_{i}(sample):\n    sample()\n", f"<generated {i}>", "exec")
        namespace: dict = {}
        exec(code, namespace)
        functions.append(namespace[f"distinct_{i}"])
    sampler = rec._stacks
    assert sampler is not None
    for f in functions:
        f(sampler.sample)
    generations = sampler.generation
    ring = read_ring(rec.path)
    facts = info.ring_facts(str(rec.path))["stack_table"]  # blackbox info, before disarm's tick samples again
    rec.disarm()
    assert generations > 10, "the table flipped generations many times"
    assert ring.stacks is not None and ring.stacks.damaged == 0, "a flip never leaves a torn entry behind"
    assert {g for g, _ in ring.stacks.stacks} == {generations - 1, generations}, "the two newest, one per half"
    assert facts["generations"] == [generations - 1, generations] and facts["damaged_entries"] == 0
    assert len(ring.strings) == strings_before, "the string region is never touched by stacks"
    rows = [r for r in py_rows(of_kind(ring_table(ring), "stack_sample")) if r["detail"] != STACK_LOST]
    got = [innermost(r["detail"]) for r in rows if "distinct_" in r["detail"]]
    assert len(got) >= 20, "the newest generations resolve"
    numbers = [int(g.rsplit("_", 1)[1]) for g in got]
    assert numbers == sorted(numbers) and numbers[-1] == 2999, "every resolved stack is the one sampled, in order"
    lost = sum(1 for r in py_rows(of_kind(ring_table(ring), "stack_sample")) if r["detail"] == STACK_LOST)
    assert lost > 2000, "samples of overwritten generations read as lost, never as another stack"


def test_the_stack_tables_last_turn_after_the_allocation_hooks_stopped_warns_nothing(tmp_path: Path) -> None:
    # (disarm stops the hooks, then the stack sampler's last sample may turn its table over: the new half's
    # tail was then handed to hooks no longer there, which raised, and disarm warned "stopped sampling stacks")
    from blackbox.collect.allocs import sample_module

    if sample_module() is None:
        pytest.skip("allocation sampling needs the C extension")
    rec = blackbox.Recorder.arm(tmp_path / "d.ring", capacity=4096, sample_interval=3600)
    try:
        allocs, sampler = rec._allocs, rec._stacks
        assert allocs is not None and sampler is not None and sampler._table.on_flip is not None
        allocs.stop()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sampler._table._flip()
            sampler.sample()
        assert sampler._table.generation == 2
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rec.disarm()


def test_a_failing_stack_table_is_one_warning_and_the_recorder_runs_on(
    recorder: blackbox.Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object) -> int:
        raise RuntimeError("stack table broken")

    monkeypatch.setattr(stacks_mod.StackTable, "intern", broken)

    def somewhere_new() -> None:
        recorder.sample_now()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        somewhere_new()
        somewhere_new()
        recorder.mark("still", 1)
    assert [str(w.message) for w in caught] == ["blackbox stopped sampling stacks: RuntimeError: stack table broken"]
    ring = read_ring(recorder.path)
    kinds = [fmt.kind_name(int(k)) for k in ring.records["kind"]]
    assert recorder.armed and kinds[-1] == "mark" and kinds.count("sample") == 3  # arm's tick and two more
    assert kinds.count("stack_sample") == 1, "only arm's tick sampled a stack"


def test_bad_stack_threads_and_stacks_off(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = blackbox.Recorder.arm(tmp_path / "b.ring", capacity=64, sample_interval=3600, stack_threads=[42])
    assert rec.armed and len(caught) == 1 and "stack_threads takes thread names" in str(caught[0].message)
    rec.disarm()
    off = blackbox.Recorder.arm(tmp_path / "o.ring", capacity=64, sample_interval=3600, stacks=False)
    off.sample_now()
    off.disarm()
    assert not stack_rows(off.path) and read_ring(off.path).meta["options"]["stack_threads"] is None


# ---------------------------------------------------------------- real deaths
LEAK_IDLE_JOB = """
import os, signal, sys, time, blackbox
blackbox.arm(sys.argv[1], capacity=1 << 14, sample_interval=0.03, allocations=True)
hog = []
def leak(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hog.append(b"\\1" * (1 << 20))
        time.sleep(0.004)
def idle(seconds):
    time.sleep(seconds)
cycles = int(sys.argv[2])
for cycle in range(cycles if cycles else 10**9):
    leak(0.3)
    idle(0.3)
    print(cycle, flush=True)
leak(0.4)
os.kill(os.getpid(), signal.SIGKILL)
"""


def assert_names_the_leak(ring_dir: Path, bundle: Path, *, last: bool) -> dict:
    """The bundle's last stack samples name ``leak`` (what it was doing), and so does the top site of
    its sampled allocations (who holds the memory); returns the metadata. ``last``: the very last
    sample is in ``leak`` (else: one of the last second's, as when the kernel kills the job a moment
    into a leak phase, before its first tick)."""
    blackbox.recover(ring_dir, bundle)
    _, meta = read_bundle(bundle)  # (the sites' stacks are in allocations.parquet, put back)
    report = meta["stacks"]
    assert report["threads"] == ["MainThread"] and "memory_growth" not in report
    assert {innermost(e["stack"]) for e in report["last"]} >= {"leak"}
    assert innermost(meta["allocations"]["sites"][0]["stack"]) == "leak", meta["allocations"]["sites"][:2]
    (ring_path,) = find_rings([ring_dir])
    rows = stack_rows(ring_path)
    if last:
        assert innermost(rows[-1]["detail"]) == "leak", "the last stack sampled before the death"
    else:
        end = max(r["time"] for r in rows)  # ISO strings in UTC: their order is the time order
        cut = (datetime.fromisoformat(end[:26]) - timedelta(seconds=1)).isoformat()
        assert "leak" in {innermost(r["detail"]) for r in rows if r["time"][:26] >= cut}
    summary = (bundle / "summary.md").read_text()
    held = summary.split("## Who holds the memory", 1)[1]
    first_row = next(line for line in held.splitlines() if line.startswith("| `"))
    assert first_row.startswith("| `leak (<string>:"), first_row
    doing = summary.split("## What it was doing", 1)[1]
    assert "Threads sampled: `MainThread`" in doing and "## Where memory grew" not in summary
    return dict(meta)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkilled_job_names_its_leaking_function(tmp_path: Path, backend: str) -> None:
    ring_dir = tmp_path / "rings"
    proc = run_py(LEAK_IDLE_JOB, str(ring_dir), "4", env=child_env(backend), check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    meta = assert_names_the_leak(ring_dir, tmp_path / "bundle", last=True)
    assert meta["death"]["cause"] == "killed"
    (ring_path,) = find_rings([ring_dir])
    assert read_ring(ring_path).meta["writer"]["backend"] == backend


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_oom_killed_job_names_its_leaking_function(tmp_path: Path, backend: str, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    cg = memory_cgroup(300 * MiB)
    kills = cg.oom_kills()
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir()
    child = spawn_py(LEAK_IDLE_JOB, str(ring_dir), "0", stdout=subprocess.PIPE, preexec_fn=cg.join,
                     env=child_env(backend))  # fmt: skip
    out, _ = child.communicate(timeout=300)
    assert child.returncode == -signal.SIGKILL and cg.oom_kills() == kills + 1, "the kernel's OOM killer did it"
    assert len(out.split()) >= 2, "the job went through leak/idle cycles before it died"
    meta = assert_names_the_leak(ring_dir, tmp_path / "bundle", last=False)
    assert meta["death"]["cause"] == "host_oom_kill"


def test_a_kill_while_a_half_is_zeroed_leaves_each_stack_whole_or_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a stack table that flipped once: generation 1's stacks fill the first half, which the next flip
    # zeroes while older records still name them (32 KiB: a half holds about 30 of them; 16 KiB held 16 under
    # Python 3.13's pytest, whose deeper stacks take more of it)
    monkeypatch.setattr(_recorder, "DEFAULT_STACKS_SIZE", 32 << 10)
    rec = blackbox.Recorder.arm(tmp_path / "d.ring", capacity=4096, sample_interval=3600)
    sampler = rec._stacks
    assert sampler is not None
    functions = []
    for i in range(400):
        namespace: dict = {}
        exec(compile(f"def gen_{i}(sample):\n    sample()\n", f"<gen {i}>", "exec"), namespace)
        functions.append(namespace[f"gen_{i}"])
    for f in functions:
        if sampler.generation == 2:
            break
        f(sampler.sample)
    hdr = read_ring(rec.path).header
    table = bytearray(rec.path.read_bytes()[hdr.stacks_offset : hdr.stacks_offset + hdr.stacks_size])
    rec.disarm()
    half = len(table) // 2
    first = scan_stack_spans([(0, bytearray(table))], len(table))
    named = {key: frames for key, frames in first.stacks.items() if key[0] == 1}
    assert len(named) > 20 and all((1, f) in first.frames for frames in named.values() for f in frames)

    def partial_stacks(zeroed: range) -> int:
        """Generation 1's stacks that resolve with a frame missing, once these words of its half are zero."""
        cut = bytearray(table)
        for w in zeroed:
            cut[8 * w : 8 * w + 8] = bytes(8)
        scan = scan_stack_spans([(0, cut)], len(cut))
        return sum(1 for key, frames in named.items()
                   if key in scan.stacks and not all((1, f) in scan.frames for f in frames))  # fmt: skip

    words = half // 8
    # WHEN a kill cuts the zeroing short after any word, zeroed as stacks.zero_down does (top down)
    # THEN every stack of generation 1 is whole or lost: never one with a frame gone
    assert [k for k in range(0, words + 1, 8) if partial_stacks(range(words - k, words))] == []
    # (zeroed bottom up, as before, cuts left stacks without their frames: the flake's cause)
    assert any(partial_stacks(range(0, k)) for k in range(0, words + 1, 8))
    # AND zero_down zeroes the whole region, a tail shorter than a word too
    region = bytearray(b"\xff" * 43)
    stacks_mod.zero_down(memoryview(region))
    assert region == bytes(43)


CHURN_JOB = """
import sys, blackbox
from blackbox import _recorder
_recorder.DEFAULT_STACKS_SIZE = 16 << 10
rec = blackbox.arm(sys.argv[1], capacity=1 << 15, sample_interval=3600)
sample = rec._stacks.sample
functions = []
for i in range(400):
    ns = {}
    exec(compile(f"def churn_{i}(sample):\\n    sample()\\n", f"<churn {i}>", "exec"), ns)
    functions.append(ns[f"churn_{i}"])
print("ready", flush=True)
i = 0
while True:
    blackbox.mark("i", i)
    functions[i % 400](sample)
    i += 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kill_at_any_instant_never_gives_a_wrong_stack(tmp_path: Path, backend: str) -> None:
    rng = random.Random(13)
    checked = 0
    for trial in range(4):
        ring_dir = tmp_path / f"rings{trial}"
        child = spawn_py(CHURN_JOB, str(ring_dir), stdout=subprocess.PIPE, env=child_env(backend))
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.2, 0.8))  # generations flip every few dozen samples meanwhile
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        (ring_path,) = find_rings([ring_dir])
        rows = py_rows(ring_table(read_ring(ring_path)))
        last_mark = None
        for r in rows:
            if r["kind"] == "mark" and r["label"] == "i":
                last_mark = r["value"]
            elif r["kind"] == "stack_sample" and last_mark is not None and r["detail"] != STACK_LOST:
                assert innermost(r["detail"]) == f"churn_{last_mark % 400}", (r, last_mark)
                checked += 1
    assert checked > 100, "enough stacks resolved to check"


# ---------------------------------------------------------------- export
@pytest.fixture(scope="module")
def killed_bundle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("killed")
    proc = run_py(LEAK_IDLE_JOB, str(d / "rings"), "2", check=False)
    assert proc.returncode == -signal.SIGKILL
    blackbox.recover(d / "rings", d / "bundle")
    yield d / "bundle"


FLAMEGRAPH_PL = re.compile(r"^(.*)\s+?(\d+(?:\.\d*)?)$")  # how flamegraph.pl splits a line
SPEEDSCOPE = re.compile(r"^(.*) (\d+)$")  # speedscope's importer for folded stacks


@pytest.mark.slow
def test_export_folded_reads_as_flamegraph_pl_and_speedscope_read_it(killed_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "stacks.folded"
    assert main(["export", "--folded", str(killed_bundle), "-o", str(out)]) == 0
    text = out.read_text()
    lines = text.splitlines()
    # speedscope recognises the format when every line ends with a space and a number (src/import/index.ts)
    assert len(text.split("\n")) == len(re.split(r" \d+\r?\n", text)) > 1
    table = of_kind(ring_table(read_ring(find_rings([killed_bundle.parent / "rings"])[0])), "stack_sample")
    for pattern in (FLAMEGRAPH_PL, SPEEDSCOPE):
        parsed = [pattern.match(line) for line in lines]
        assert all(parsed), lines
        assert sum(int(m.group(2)) for m in parsed if m) == table.num_rows, "every sample counted once"
        stacks = {m.group(1) for m in parsed if m}
        assert stacks == set(table["detail"].to_pylist()), "each distinct folded stack, frames outermost first"
    top = SPEEDSCOPE.match(lines[0])
    assert top and top.group(1).split(";")[0].startswith("<module> (<string>:")


@pytest.mark.slow
def test_export_perfetto_has_the_stacks(killed_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    assert main(["export", "--perfetto", str(killed_bundle), "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    frames = trace["stackFrames"]

    def folded(sf: str) -> str:
        names = []
        while sf is not None:
            names.append(frames[sf]["name"])
            sf = frames[sf].get("parent")
        return ";".join(reversed(names))

    samples = [e for e in trace["traceEvents"] if e["ph"] == "P"]
    table = of_kind(ring_table(read_ring(find_rings([killed_bundle.parent / "rings"])[0])), "stack_sample")
    assert [folded(e["sf"]) for e in samples] == table["detail"].to_pylist()
    flame = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "stack"]
    assert {e["name"].rsplit(" (", 1)[0] for e in flame} >= {"<module>", "leak", "idle"}
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert any(n.startswith("stacks: MainThread") for n in names)


FORK_WHILE_SAMPLING = """
import os, sys, time, blackbox
rec = blackbox.arm(sys.argv[1], capacity=256, sample_interval=3600)
rec._stacks._busy.acquire()  # as if the sampler thread were inside a sample when the job forks
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    print(f"{time.monotonic() - t0:.3f}", flush=True)  # the at-fork hook has run: the child's ring is dropped
    os._exit(0)
os.waitpid(pid, 0)
rec._stacks._busy.release()
"""


def test_a_fork_while_a_sample_is_in_flight_never_waits(tmp_path: Path) -> None:
    proc = run_py(FORK_WHILE_SAMPLING, str(tmp_path / "rings"))
    assert float(proc.stdout.split()[0]) < 1.0, "the child drops the parent's stack table without waiting"
