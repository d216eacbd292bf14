"""A longer fuzzing harness for recover than the hypothesis tests: mutate real rings, read them back.

    .venv/bin/python tools/fuzz_recover.py [--mode bytes|header|folder|stacks|bundles] [--iterations N] [--seed S]

Inputs are the golden rings of every format version plus a freshly recorded ring.

- ``bytes`` (the default): 1 to 4 random mutations per ring (bit flips, byte runs
  of zero or garbage, truncation, a header field rewritten, slots swapped or
  duplicated), then read as recover does. A read must either raise a
  BlackboxError with a one-line message or return records that pass the commit
  rule, in seq order, from which a timeline table builds.
- ``header``: structured mutations of the metadata JSON with the CRC recomputed
  (a valid header holding hostile JSON: wrong types, huge ints, NaN, deep
  nesting, lone surrogates, a field removed or replaced), then ``info``,
  ``summary`` and ``recover`` through the CLI: exit 0, or 1 with one line.
- ``folder``: a folder of rings and traps (links to rings and files elsewhere,
  FIFOs and device nodes named ``*.ring``, ``.crash`` and ``folded.jsonl``, a
  folder named ``x.ring``, empty and truncated rings), recovered as root would:
  it must end, recover the good rings, list the others in one line each, and
  never put the bytes of a file it was not meant to read into the bundle.
- ``stacks``: a ring whose stack table is shaped to cost the reader (``hostile_cases.stack_case``:
  distinct deep stacks of 1 KiB frames, tables packed with tiny entries, one deep stack on every record,
  frames holding ``;``, escapes and broken UTF-8, damage), recovered by ``blackbox recover`` in a fresh
  process: exit 0, peak RSS (``VmHWM``) within the ring's size + 300 MiB, the distinct folded stacks
  within their bound, no frame split by a ``;``, nothing raw in summary.md.
- ``bundles``: two genuine node bundles in a job folder with traps planted (``hostile_cases.bundle_case``:
  ranks.parquet decoding to gigabytes, huge ``recovered_by``, metadata.json of millions of values or
  nested deep, a FIFO or a link for it, a bundle claiming another's rings), the job-wide bundle made by
  ``blackbox recover`` in a fresh process: exit 0, every other line on stderr one ``blackbox:`` line, peak
  RSS within 300 MiB + the largest metadata.json read (32 MiB), the genuine first death still named,
  nothing raw in summary.md, a job metadata.json of a few KiB.
- ``allocs``: a version-4 ring whose heap table and allocation stacks are hostile (``hostile_allocs.alloc_case``:
  weights and sizes of u64 max or 0, times and steps at i64 extremes, stacks and threads resolving to nothing
  or to kind-3 entries holding escapes, ``;`` and broken UTF-8, depths that lie, a million distinct stacks,
  a terabyte of table declared on a small file, garbage alloc_sample / free_sample records), recovered by
  ``blackbox recover`` in a fresh process, then ``export --live``, ``export --pprof`` and ``report`` over
  its bundle, each in a fresh process: exit 0 (or 1 with one ``blackbox:`` line), peak RSS within the ring's
  size + 300 MiB, nothing raw in summary.md or metadata.json, live bytes and errors finite, non-negative
  and equal to the weights planted (no sum wrapped), the pprof a gzip'd protobuf.
- ``payloads``: a ring of marks among a few records of every kind whose payload words hold anything (-1, 0,
  text, int64's bounds, random bits: ``craft_ring.mixed_records``, 2,000 to 200,000 records), recovered by
  ``blackbox recover`` in a fresh process, then ``report``, ``plot``, ``watch --once --json`` and the
  ``--perfetto``, ``--speedscope`` and ``--live`` exports: exit 0 (or 1 with one ``blackbox`` line), every
  record in the timeline, peak RSS within the ring's size + 300 MiB (but the two trace exports, which build
  the trace whole in memory: their peak is printed; 375 MiB for 200,000 records). Its first sweep found four
  commands that took a ring whose step record had no number, or a child sample no child, down with int(NaN).

Anything else (another exception, a hang past ``--timeout`` seconds) is a
failure, saved under fuzz-failures/ for replay (``folder``: the seed and
iteration, to rebuild it).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import random
import re
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import zstandard

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "tools"))

from craft_ring import craft_v3, meta_with, mixed_records, with_meta  # noqa: E402
from hostile_allocs import alloc_case  # noqa: E402
from hostile_cases import bundle_case, node_bundles, stack_case  # noqa: E402

import blackbox  # noqa: E402
from blackbox._errors import BlackboxError  # noqa: E402
from blackbox._postmortem import write_postmortem  # noqa: E402
from blackbox.cli import main as cli  # noqa: E402
from blackbox.recovery.job import MAX_JSON_BYTES  # noqa: E402
from blackbox.recovery.timeline import MAX_FOLDED_TEXT, ring_table  # noqa: E402
from blackbox.ring import format as fmt  # noqa: E402
from blackbox.ring.reader import read_header, read_ring  # noqa: E402


def fresh_ring(tmp: Path) -> bytes:
    rec = blackbox.Recorder.arm(tmp / "fresh.ring", capacity=256, sample_interval=3600, strings_size=4096)
    for i in range(600):
        rec.step(i)
        with rec.phase("forward"):
            rec.mark(f"m{i % 7}", i)
    assert rec.path is not None
    data = rec.path.read_bytes()  # as a SIGKILL would leave it: no clean end
    rec.disarm()
    return data


def mutate(data: bytearray, rng: random.Random) -> bytearray:
    for _ in range(rng.randint(1, 4)):
        n = len(data)
        if n == 0:
            break
        op = rng.randrange(7)
        at = rng.randrange(n)
        if op == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            k = rng.randint(1, 256)
            data[at : at + k] = bytes(len(data[at : at + k]))
        elif op == 2:
            k = rng.randint(1, 256)
            data[at : at + k] = rng.randbytes(len(data[at : at + k]))
        elif op == 3:
            del data[rng.randrange(n) :]
        elif op == 4:  # a header field of the prefix
            off = rng.choice([8, 10, 12, 16, 20, 24, 32, 40, 48, 56])
            width = 2 if off in (8, 10) else 4 if off in (12, 16, 20) else 8
            data[off : off + width] = rng.randbytes(width)
        elif op == 5 and n > 8192 + 2 * fmt.RECORD_SIZE:  # copy one slot over another
            a = rng.randrange(4096, n - fmt.RECORD_SIZE)
            b = rng.randrange(4096, n - fmt.RECORD_SIZE)
            data[b : b + fmt.RECORD_SIZE] = data[a : a + fmt.RECORD_SIZE]
        elif op == 6:
            data[at:at] = rng.randbytes(rng.randint(1, 64))
    return data


def check(path: Path) -> str:
    """ "ok", "error:<Class>" or raises AssertionError / another exception for a real failure."""
    try:
        ring = read_ring(path)
    except BlackboxError as exc:
        assert "\n" not in str(exc), "a BlackboxError message is one line"
        return f"error:{type(exc).__name__}"
    r = ring.records
    if len(r):
        assert (r["commit"] == r["seq"]).all(), "a returned record fails the commit rule"
        assert (r["seq"][1:] > r["seq"][:-1]).all(), "records out of seq order"
    table = ring_table(ring)
    assert table.num_rows == len(r)
    return "ok"


# ---------------------------------------------------------------- header: hostile JSON under a valid CRC
HOSTILE = [
    "null", "true", "-1", "0", "1.5", '""', '"x"', "[]", "{}", "[1, 2]", '{"a": 1}', "NaN", "Infinity", "-Infinity",
    "1e999", "9" * 30, "-" + "9" * 30, "9" * 5000, '"\\ud800"', '"' + "a" * 100_000 + '"', "[" * 5000 + "]" * 5000,
    '{"k":' * 200 + "0" + "}" * 200, "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]",
]  # fmt: skip


def _paths(meta: dict[str, object], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for k, v in meta.items():
        out += _paths(v, (*prefix, k)) if isinstance(v, dict) else [(*prefix, k)]
    return [*out, (*prefix, "unknown")]


def header_case(seed: bytes, rng: random.Random) -> bytes:
    meta = read_header_bytes(seed)
    paths = _paths(meta)
    changes = [(rng.choice(paths), rng.choice(HOSTILE)) for _ in range(rng.randint(1, 3))]
    return with_meta(seed, meta_with(meta, *changes))


def read_header_bytes(data: bytes) -> dict[str, object]:
    with tempfile.NamedTemporaryFile(suffix=".ring") as f:
        f.write(data)
        f.flush()
        return read_header(f.name).meta


def check_header(path: Path, out: Path) -> str:
    """Each command ends 0, or 1 with one line on stderr; returns the outcomes, e.g. "0011"."""
    codes = ""
    for command in (["info", str(path)], ["summary", str(path)], ["recover", str(path), "-o", str(out)]):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = cli(command)
        assert code in (0, 1), f"{command[0]} exited {code}"
        assert code == 0 or err.getvalue().count("\n") == 1, f"{command[0]}: {err.getvalue()!r}"
        codes += str(code)
    return codes


# ---------------------------------------------------------------- folder: links, FIFOs, devices
SECRET = "FUZZ-SECRET-a1b2c3"


def folder_case(folder: Path, outside: Path, seeds: list[bytes], rng: random.Random) -> tuple[int, int]:
    """Fill ``folder`` with good rings and traps; returns how many rings it holds that must be recovered,
    and how many more may be (damaged ones that still hold records)."""
    folder.mkdir()
    good = maybe = 0
    for i in range(rng.randint(0, 3)):
        (folder / f"good{i}.ring").write_bytes(seeds[-1])
        good += 1
    foreign = os.stat(outside / "secret.ring").st_uid != os.geteuid()  # else a hard link is the user's own file
    traps: list[tuple[bool, Callable[[str], object]]] = (
        [
            (False, lambda n: os.symlink(outside / "secret.ring", folder / n)),
            (False, lambda n: os.symlink(outside / "ring.ring", folder / n)),
            (False, lambda n: os.mkfifo(folder / n)),
            (False, lambda n: os.mknod(folder / n, 0o600 | stat.S_IFCHR, os.makedev(1, 5))),  # /dev/zero's numbers
            (False, lambda n: (folder / n).mkdir()),
            (False, lambda n: (folder / n).write_bytes(b"")),
            (True, lambda n: (folder / n).write_bytes(seeds[-1][: rng.randrange(len(seeds[-1]))])),
            (True, lambda n: (folder / n).write_bytes(mutate(bytearray(rng.choice(seeds)), rng))),
        ]
        + ([(False, lambda n: os.link(outside / "secret.ring", folder / n))] if foreign else [])
    )
    for i in range(rng.randint(1, 6)):
        readable, make = rng.choice(traps)
        with contextlib.suppress(PermissionError):  # mknod where the kernel refuses it
            make(f"trap{i}.ring")
            maybe += readable
    for name in [f"good{i}.ring" for i in range(good)] + ["folded.jsonl"]:
        side = name + ".crash" if name.endswith(".ring") else name
        choice = rng.randrange(5)
        with contextlib.suppress(PermissionError, FileExistsError):
            if choice == 0:
                os.symlink(outside / "secret.ring", folder / side)
            elif choice == 1:
                os.mkfifo(folder / side)
            elif choice == 2 and foreign:
                os.link(outside / "secret.ring", folder / side)
            elif choice == 3:
                os.mknod(folder / side, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    return good, maybe


def check_folder(folder: Path, out: Path, good: int, maybe: int) -> str:
    try:
        meta = write_postmortem([folder], out, plot=False)
    except BlackboxError as exc:
        assert good == 0, f"{good} good rings, yet: {exc}"  # (a damaged one may be unreadable)
        assert "\n" not in str(exc)
        return "error:nothing readable"
    rings = meta.get("rings", [meta])
    assert good <= len(rings) <= good + maybe, f"{len(rings)} rings recovered of {good} good, {maybe} damaged"
    assert all("\n" not in u["reason"] for u in meta.get("unread_rings", []))
    text = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())  # rings/ too, and decompressed:
    text += b"".join(zstandard.ZstdDecompressor().stream_reader(p.read_bytes()).read() for p in out.glob("rings/*"))
    assert SECRET.encode() not in text, "a file outside the folder reached the bundle"
    return f"ok:{len(meta.get('unread_rings', []))} unread"


# ---------------------------------------------------------------- stacks, bundles: a fresh process each
MiB = 1 << 20
_CHILD = """
import sys
from blackbox.cli import main
code = main(sys.argv[1:])
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(int(status["VmHWM"].split()[0]) * 1024)
sys.exit(code)
"""
PEAKS: list[tuple[int, int, float]] = []  # (peak RSS, allowance, wall) of every fresh-process case


def recover_child(target: Path, out: Path, timeout: int, command: list[str] | None = None
                  ) -> tuple[subprocess.CompletedProcess[str], int]:  # fmt: skip
    if command is None:
        shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    argv = command or ["recover", str(target), "-o", str(out)]
    proc = subprocess.run([sys.executable, "-c", _CHILD, *argv], env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    lines = proc.stdout.split()
    return proc, int(lines[-1]) if lines and lines[-1].isdigit() else 0


def raw_text(text: str) -> bool:
    return any(c in text for c in ("\x1b", "\x07", "\x9b", "\r", "\u202e"))


def check_stacks(path: Path, out: Path, timeout: int) -> str:
    t0 = time.perf_counter()
    proc, peak = recover_child(path, out, timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-300:]}"
    allowance = os.stat(path).st_blocks * 512 + 300 * MiB
    PEAKS.append((peak, allowance, time.perf_counter() - t0))
    assert peak <= allowance, f"peak RSS {peak / MiB:.0f} MiB over the ring + 300 MiB ({allowance / MiB:.0f})"
    detail = pq.read_table(out / "timeline.parquet", columns=["detail", "kind"])
    stacks = list(detail["detail"].chunks)
    text = sum(c.dictionary.nbytes for c in stacks)  # per row group: each distinct stack once
    assert text <= len(stacks) * (MAX_FOLDED_TEXT + (8 << 20)), f"{text / MiB:.0f} MiB of folded stacks"
    assert not any("\n" in (w or "") for c in stacks for w in c.dictionary.to_pylist()[:1000]), "a frame split a line"
    assert not raw_text((out / "summary.md").read_text()), "raw control characters in summary.md"
    return "ok"


def check_bundles(job: Path, out: Path, timeout: int) -> str:
    t0 = time.perf_counter()
    proc, peak = recover_child(job, out, timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-300:]}"
    allowance = 300 * MiB + MAX_JSON_BYTES
    PEAKS.append((peak, allowance, time.perf_counter() - t0))
    assert peak <= allowance, f"peak RSS {peak / MiB:.0f} MiB over 300 MiB + the largest metadata.json read"
    lines = proc.stderr.splitlines()
    assert all(ln.startswith("blackbox: ") for ln in lines), f"stderr: {proc.stderr[-300:]}"
    summary = (out / "summary.md").read_text()
    assert "**First death: rank 5 (host node001," in summary, "the genuine first death is not named"
    assert not raw_text(summary + proc.stdout + proc.stderr), "raw control characters shown"
    assert (out / "metadata.json").stat().st_size < 1 * MiB, "the job's metadata.json grew with what bundles said"
    meta = json.loads((out / "metadata.json").read_text())
    return f"ok:{len(meta['unread_bundles'])} unread, {len(meta['claimed_twice'])} held twice"


def _finite_count(value: object, what: str) -> int:
    assert isinstance(value, int) and not isinstance(value, bool), f"{what} is {value!r}, not an int"
    assert value >= 0, f"{what} is negative: {value}"
    return value


def _strict_json(text: str) -> object:
    def refuse(token: str) -> object:
        raise AssertionError(f"metadata.json holds {token}")

    return json.loads(text, parse_constant=refuse)


def _varints(data: bytes, at: int = 0) -> list[tuple[int, int]]:
    """(field number << 3 | wire type, value or (offset, length)) of a protobuf message's fields, in order."""
    out = []
    while at < len(data):
        key, at = _varint(data, at)
        if key & 7 == 0:
            value, at = _varint(data, at)
        else:
            n, at = _varint(data, at)
            value, at = at << 32 | n, at + n
        out.append((key, value))
    return out


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def pprof_values(data: bytes) -> list[int]:
    """The values of a profile's samples (Profile.sample, field 2; Sample.value, field 2, packed), as int64."""
    values = []
    for key, where in _varints(data):
        if key == (2 << 3 | 2):
            sample = data[where >> 32 : (where >> 32) + (where & 0xFFFFFFFF)]
            for k, packed in _varints(sample):
                if k == (2 << 3 | 2):
                    blob, at = sample[packed >> 32 : (packed >> 32) + (packed & 0xFFFFFFFF)], 0
                    while at < len(blob):
                        v, at = _varint(blob, at)
                        values.append(v - (1 << 64) if v >= 1 << 63 else v)
    return values


def check_allocs(path: Path, out: Path, timeout: int, planted: int) -> str:
    allowance = os.stat(path).st_blocks * 512 + 300 * MiB
    codes, largest, t_case = "", 0, time.perf_counter()
    for argv in (None, ["export", str(out), "--live", "-o", str(out / "live.folded")],
                 ["export", str(out), "--pprof", "-o", str(out / "live.pb.gz")],
                 ["report", str(out), "-o", str(out / "report.html")]):  # fmt: skip
        proc, peak = recover_child(path, out, timeout, argv)
        largest = max(largest, peak)
        what = (argv or ["recover"])[0] + (f" {argv[2]}" if argv and argv[0] == "export" else "")
        assert peak <= allowance, f"{what}: peak RSS {peak / MiB:.0f} MiB over the ring + 300 MiB"
        err = proc.stderr.strip().splitlines()
        assert proc.returncode in (0, 1), f"{what}: exit {proc.returncode}: {proc.stderr[-300:]}"
        one_line = len(err) == 1 and re.match(r"blackbox( [a-z]+)?: ", err[0]) is not None  # (or "blackbox export:")
        assert proc.returncode == 0 or one_line, f"{what}: {err[-3:]}"
        assert not raw_text(proc.stderr), f"{what}: raw control characters on stderr"
        if argv is None and proc.returncode:
            PEAKS.append((largest, allowance, time.perf_counter() - t_case))
            return "error:recover exit 1:" + err[0][:100]
        if argv is None:
            assert not raw_text((out / "summary.md").read_text()), "raw control characters in summary.md"
            text = (out / "metadata.json").read_text()
            assert not raw_text(text), "raw control characters in metadata.json"
            doc = _strict_json(text)
            assert isinstance(doc, dict), "metadata.json is not an object"
            report = doc.get("allocations")
            assert isinstance(report, dict), "no allocations in metadata.json"
            live = _finite_count(report["live_bytes"], "live_bytes")
            _finite_count(report["error_bytes"], "error_bytes")
            assert abs(live - planted) <= planted * 1e-9 + 1, f"live_bytes {live}, yet {planted} planted"
            for site in report["sites"]:
                assert _finite_count(site["live_bytes"], "a site's live_bytes") <= live * (1 + 1e-9) + 1
                _finite_count(site["error_bytes"], "a site's error_bytes")
                assert ";" not in (site["thread"] or ""), "a thread name holding ';'"
        elif proc.returncode == 0 and argv[0] == "export" and argv[2] == "--pprof":
            data = gzip.decompress((out / "live.pb.gz").read_bytes())
            assert data[:1] == b"\x0a", "the pprof does not start with its sample_type field"
            for value in pprof_values(data):
                assert 0 <= value < 1 << 63, f"a pprof sample of {value} bytes (an int64 in the profile)"
        elif proc.returncode == 0 and argv[0] == "export":
            for line in (out / "live.folded").read_text().splitlines():
                _finite_count(int(line.rpartition(" ")[2]), "a folded stack's bytes")
        codes += str(proc.returncode)
    PEAKS.append((largest, allowance, time.perf_counter() - t_case))  # one case: the largest of its commands
    return f"ok:exit {codes}"


def payload_case(path: Path, rng: random.Random) -> int:
    """A ring of ``craft_ring.mixed_records`` with a seed and a size of ``rng``'s; its record count."""
    n = rng.choice([2_000, 20_000, 200_000])
    craft_v3(path, {2: "m"}, {}, {}, mixed_records(n, rng.randrange(1 << 30)))
    return n


def check_payloads(path: Path, out: Path, timeout: int, records: int) -> str:
    allowance = os.stat(path).st_blocks * 512 + 300 * MiB
    codes, largest, traced, t_case = "", 0, 0, time.perf_counter()
    b, o = str(out), str(out / "o")
    for argv in (None, ["report", b, "-o", o], ["plot", b, "-o", o + ".png"], ["watch", "--once", "--json", str(path)],
                 ["export", "--perfetto", b, "-o", o], ["export", "--speedscope", b, "-o", o],
                 ["export", "--live", b, "-o", o]):  # fmt: skip
        proc, peak = recover_child(path, out, timeout, argv)
        what = " ".join((argv or ["recover"])[:2])
        if what in ("export --perfetto", "export --speedscope"):  # the trace is built whole in memory: O(rows)
            traced = max(traced, peak)
        else:
            assert peak <= allowance, f"{what}: peak RSS {peak / MiB:.0f} MiB over the ring + 300 MiB"
            largest = max(largest, peak)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode in (0, 1), f"{what}: exit {proc.returncode}: {proc.stderr[-300:]}"
        one_line = len(err) == 1 and re.match(r"blackbox( [a-z]+)?: ", err[0]) is not None
        assert proc.returncode == 0 or one_line, f"{what}: {err[-3:]}"
        if argv is None:
            assert proc.returncode == 0, f"recover: {err[-3:]}"
            rows = pq.read_metadata(out / "timeline.parquet").num_rows
            assert rows == records, f"{rows} rows in the timeline of {records} records"
        codes += str(proc.returncode)
    PEAKS.append((largest, allowance, time.perf_counter() - t_case))
    return f"ok:exit {codes}:trace exports' peak {traced // MiB} MiB"


class Hang(Exception):
    pass


def _alarm(_signum: int, _frame: object) -> None:
    raise Hang("no result within the time limit (a hang)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["bytes", "header", "folder", "stacks", "bundles", "allocs", "payloads"],
                    default="bytes")  # fmt: skip
    ap.add_argument("--iterations", type=int, default=None,
                    help="default: 20000, or 100 for stacks, bundles, allocs, payloads")  # fmt: skip
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=int, default=60, help="seconds one case may take before it counts as a hang")
    args = ap.parse_args()
    if args.iterations is None:
        args.iterations = 100 if args.mode in ("stacks", "bundles", "allocs", "payloads") else 20_000
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    failures_dir = ROOT / "fuzz-failures"
    signal.signal(signal.SIGALRM, _alarm)
    os.environ.setdefault("MPLBACKEND", "Agg")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        seeds = [p.read_bytes() for p in sorted((ROOT / "tests" / "data").glob("ring-v*.ring"))] + [fresh_ring(tmp)]
        outside = tmp / "outside"
        outside.mkdir()
        (outside / "secret.ring").write_text(SECRET + "\n")
        with contextlib.suppress(PermissionError):  # as root: another user's file, as it would be for real
            os.chown(outside / "secret.ring", 65534, 65534)
        (outside / "ring.ring").write_bytes(seeds[-1])
        good = node_bundles(tmp / "genuine") if args.mode == "bundles" else tmp
        outcomes: dict[str, int] = {}
        failures = 0
        slowest = 0.0
        path = tmp / "case.ring"
        t_start = time.perf_counter()
        for i in range(args.iterations):
            data, note = b"", ""
            t0 = time.perf_counter()
            signal.alarm(args.timeout)
            try:
                if args.mode == "bytes":
                    data = bytes(mutate(bytearray(rng.choice(seeds)), rng))
                    path.write_bytes(data)
                    outcome = check(path)
                elif args.mode == "header":
                    data = header_case(rng.choice(seeds), rng)
                    path.write_bytes(data)
                    outcome = "exit " + check_header(path, tmp / "bundle")
                elif args.mode == "stacks":
                    shape = stack_case(path, rng)
                    outcome = check_stacks(path, tmp / "bundle", args.timeout) + f":{shape['shape']}"
                elif args.mode == "allocs":
                    shape = alloc_case(path, rng)
                    note = f" ({', '.join(shape['traps'])}, {shape['slots']} slots)"
                    outcome = check_allocs(path, tmp / "bundle", args.timeout, shape["planted"])
                    outcome += f":{', '.join(shape['traps'])}, {shape['slots']} slots"
                elif args.mode == "payloads":
                    records = payload_case(path, rng)
                    outcome = check_payloads(path, tmp / "bundle", args.timeout, records) + f":{records} records"
                elif args.mode == "bundles":
                    job = tmp / f"job{i}"
                    job.mkdir()
                    traps = bundle_case(job, good, outside / "secret.ring", rng)
                    outcome = check_bundles(job, tmp / "bundle", args.timeout) + f" ({', '.join(sorted(traps))})"
                    shutil.rmtree(job)
                else:
                    case = tmp / f"case{i}"
                    outcome = check_folder(case, tmp / "bundle", *folder_case(case, outside, seeds, rng))
                    shutil.rmtree(case)
            except Exception as exc:  # a real failure: keep the input
                failures += 1
                failures_dir.mkdir(exist_ok=True)
                (failures_dir / f"case-{args.mode}-{seed}-{i}.ring").write_bytes(data)
                outcome = f"FAILURE:{type(exc).__name__}: {exc}"
                print(f"iteration {i}: {outcome}{note}")
            finally:
                signal.alarm(0)
            took = time.perf_counter() - t0
            if took > 5:
                print(f"iteration {i}: slow, {took:.1f} s ({outcome})")
            slowest = max(slowest, took)
            head, _, rest = outcome.partition(":")
            key = head + (":" + rest.split(":")[0] if rest and head in ("error", "ok") else "")
            outcomes[key] = outcomes.get(key, 0) + 1
    total = time.perf_counter() - t_start
    print(f"mode {args.mode}, seed {seed}: {args.iterations} cases in {total:.1f} s (slowest {slowest * 1e3:.1f} ms)")
    for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {k}: {v}")
    if PEAKS:
        peaks = sorted(p for p, _, _ in PEAKS)
        spare = min(a - p for p, a, _ in PEAKS)
        walls = [w for _, _, w in PEAKS]
        print(f"peak RSS per case: median {statistics.median(peaks) / MiB:.0f} MiB, largest {peaks[-1] / MiB:.0f} "
              f"MiB; closest to the allowance: {spare / MiB:.0f} MiB under; wall per case: median "
              f"{statistics.median(walls):.1f} s, slowest {max(walls):.1f} s")  # fmt: skip
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
