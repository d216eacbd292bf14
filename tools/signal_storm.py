"""Signal storms: two or three signals 0 to 1 ms apart at a job in a loop of ``blackbox.mark``.

    .venv/bin/python tools/signal_storm.py [--trials 400] [--seed S] [--jobs 2]

Each trial starts a job that marks without pause, with a label never seen
before every 50 marks (so a signal often lands while it interns a string), in
one of eight configurations: armed or not, the C or the Python write path
(``BLACKBOX_WRITER``), with or without its own handler for the signals. Once
the job is running, 2 or 3 signals drawn from SIGTERM, SIGINT and SIGUSR1 are
sent with random gaps of 0 to 1 ms. A trial passes when the job ends within
10 s (no hang), with an exit status the same configuration can end with
unarmed (see ``judge``), and, armed with the C extension built, when its ring
records the signals that arrived while it was armed.
Prints one line per failure and a table per configuration.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blackbox.recovery.kinds import of_kind  # noqa: E402
from blackbox.recovery.timeline import ring_table  # noqa: E402
from blackbox.ring.reader import read_ring  # noqa: E402
from blackbox.ring.writer import c_writer_module  # noqa: E402

JOB = r"""
import os, signal, sys, time
armed, handler = sys.argv[2] == "1", sys.argv[3] == "1"
if armed:
    import blackbox
    blackbox.arm(sys.argv[1], capacity=1 << 14, sample_interval=0.01)
    mark = blackbox.mark
else:
    def mark(label, value=None):
        pass
got = []
if handler:
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, lambda signum, frame: got.append(signum))
print("READY", flush=True)
i = 0
while not got:
    mark(f"loss{i // 50}", i)
    i += 1
sys.exit(0)
"""
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
TIMEOUT = 10.0


@dataclass
class Trial:
    armed: bool
    backend: str
    handler: bool
    sent: list[int]
    status: int | None  # the exit status (negative: killed by that signal); None when it hung
    recorded: list[str]
    clean: bool  # the ring recorded a clean end (the job exited, then a signal may have come after)
    ok: bool
    why: str

    @property
    def config(self) -> str:
        return f"{'armed' if self.armed else 'unarmed'}, {self.backend}, {'handler' if self.handler else 'default'}"


def trial(folder: Path, rng: random.Random, armed: bool, backend: str, handler: bool) -> Trial:
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), BLACKBOX_WRITER=backend)
    args = [sys.executable, "-c", JOB, str(folder), "1" if armed else "0", "1" if handler else "0"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    ready = proc.stdout.readline().strip()
    sent: list[int] = [rng.choice(SIGNALS) for _ in range(rng.choice((2, 3)))]
    if ready == "READY":
        time.sleep(rng.uniform(0.0, 0.03))
        for k, s in enumerate(sent):
            if k:
                delay = rng.choice((0.0, rng.uniform(0, 5e-5), rng.uniform(0, 1e-3)))
                end = time.perf_counter() + delay
                while time.perf_counter() < end:
                    pass
            try:
                proc.send_signal(s)
            except ProcessLookupError:
                break
    try:
        status: int | None = proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        status = None
    recorded: list[str] = []
    clean = False
    rings = sorted(folder.glob("*.ring"))
    if armed and rings:
        ring = read_ring(rings[0])
        clean = ring.clean
        table = of_kind(ring_table(ring), "signal", columns=["label"])
        recorded = [str(v) for v in table["label"].to_pylist()]
    ok, why = judge(armed, handler, sent, status, recorded, clean, ready == "READY")
    return Trial(armed, backend, handler, sent, status, recorded, clean, ok, why)


def judge(
    armed: bool, handler: bool, sent: list[int], status: int | None, recorded: list[str], clean: bool, ready: bool
) -> tuple[bool, str]:
    """Unarmed, a job with handlers exits 0, or, when a later signal of the storm arrives while the
    interpreter shuts down (Python has put SIG_DFL back by then), dies of it; without handlers the
    first signal delivered kills it (SIGINT raises KeyboardInterrupt first: the job starts exiting,
    and a later signal may kill it on the way out). Armed, the same, and the ring holds the signals
    that arrived while it was armed: the first one at least, and the one that killed it unless that
    one came after the recorder's clean end."""
    if not ready:
        return False, "the job did not start"
    if status is None:
        return False, f"hung for {TIMEOUT:.0f} s"
    allowed = {-s for s in sent} | ({0} if handler else set())
    if status not in allowed:
        return False, f"exit status {status}, expected one of {sorted(allowed)}"
    if armed and c_writer_module() is not None:
        names = {signal.Signals(s).name for s in sent}
        if not recorded or not set(recorded) <= names:
            return False, f"recorded {recorded}, sent {sorted(names)}"
        killer = signal.Signals(-status).name if status < 0 else None
        if killer is not None and killer not in recorded and not clean:
            return False, f"recorded {recorded}, killed by {killer} before a clean end, unrecorded"
    return True, ""


def storm(trials: int, seed: int, jobs: int, folder: Path) -> list[Trial]:
    rng = random.Random(seed)
    configs = [(a, b, h) for a in (False, True) for b in ("c", "python") for h in (False, True)]
    plans = [(folder / f"t{n}", random.Random(rng.random()), *configs[n % len(configs)]) for n in range(trials)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda p: trial(*p), plans))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="blackbox-storm-") as tmp:
        t0 = time.monotonic()
        results = storm(args.trials, args.seed, args.jobs, Path(tmp))
        took = time.monotonic() - t0
    for r in results:
        if not r.ok:
            print(f"FAIL [{r.config}] sent {[signal.Signals(s).name for s in r.sent]}: {r.why}")
    by = Counter((r.config, r.ok) for r in results)
    built = c_writer_module() is not None
    print(f"\n{len(results)} trials in {took:.0f} s (seed {args.seed}); C extension built: {built}\n")
    print("| configuration | trials | passed | hung |")
    print("|---|---:|---:|---:|")
    for config in sorted({r.config for r in results}):
        hung = sum(1 for r in results if r.config == config and r.status is None)
        print(f"| {config} | {by[(config, True)] + by[(config, False)]} | {by[(config, True)]} | {hung} |")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
