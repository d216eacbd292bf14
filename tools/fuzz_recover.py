"""A longer fuzzing harness for recover than the hypothesis tests: mutate real rings, read them back.

    .venv/bin/python tools/fuzz_recover.py [--iterations 20000] [--seed S]

Inputs are the golden rings of every format version plus a freshly recorded ring.
Each iteration applies 1 to 4 random mutations (bit flips, byte runs of zero or
garbage, truncation, a header field rewritten, slots swapped or duplicated) and
then reads the result as recover does. A read must either raise a BlackboxError
with a one-line message or return records that pass the commit rule, in seq
order, from which a timeline table builds; anything else (another exception, a
hang) is a failure, saved under fuzz-failures/ for replay.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import blackbox  # noqa: E402
from blackbox._errors import BlackboxError  # noqa: E402
from blackbox.recovery.timeline import ring_table  # noqa: E402
from blackbox.ring import format as fmt  # noqa: E402
from blackbox.ring.reader import read_ring  # noqa: E402


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    failures_dir = ROOT / "fuzz-failures"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        seeds = [p.read_bytes() for p in sorted((ROOT / "tests" / "data").glob("ring-v*.ring"))] + [fresh_ring(tmp)]
        outcomes: dict[str, int] = {}
        failures = 0
        slowest = 0.0
        path = tmp / "case.ring"
        t_start = time.perf_counter()
        for i in range(args.iterations):
            data = mutate(bytearray(rng.choice(seeds)), rng)
            path.write_bytes(data)
            t0 = time.perf_counter()
            try:
                outcome = check(path)
            except Exception as exc:  # a real failure: keep the input
                failures += 1
                failures_dir.mkdir(exist_ok=True)
                (failures_dir / f"case-{seed}-{i}.ring").write_bytes(data)
                outcome = f"FAILURE:{type(exc).__name__}: {exc}"
                print(f"iteration {i}: {outcome}")
            slowest = max(slowest, time.perf_counter() - t0)
            key = outcome.split(":")[0] + (":" + outcome.split(":")[1] if outcome.startswith("error") else "")
            outcomes[key] = outcomes.get(key, 0) + 1
    total = time.perf_counter() - t_start
    print(f"seed {seed}: {args.iterations} mutated rings in {total:.1f} s (slowest read {slowest * 1e3:.1f} ms)")
    for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {k}: {v}")
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
