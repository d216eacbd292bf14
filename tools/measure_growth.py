"""How often the per-step growth verdict is right: real jobs with a planted leak, recovered and judged.

    .venv/bin/python tools/measure_growth.py [--runs N]

Each run is a fresh process of 60 steps with a warm-up (a 48 MiB cache filled at step 3) and 16 MiB of
per-step temporaries (noise), leaking 0, 1 or 3 MiB a step. For each leak it prints every estimate with
its 95% interval, how many runs claimed growth (beyond the noise), and how many intervals held the
planted truth. A clean job (leak 0) must never claim growth; a leaking one must, with the truth inside.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from blackbox.recovery.pipeline import recover_rings  # noqa: E402

JOB = textwrap.dedent("""
    import sys, time, blackbox
    blackbox.arm(sys.argv[1] + "/", sample_interval=0.01)
    leak = int(sys.argv[2])
    kept, cache = [], []
    for step in range(1, 61):
        blackbox.step(step)
        if step == 3:
            cache.append(bytearray(48 << 20))
        scratch = bytearray(16 << 20)
        if leak:
            kept.append(bytearray(leak))
        time.sleep(0.03)
        del scratch
        time.sleep(0.01)
""")
MIB = 1 << 20


def one(leak: int) -> tuple[float, float | None, bool]:
    with tempfile.TemporaryDirectory(prefix="measure-growth-") as tmp:
        subprocess.run([sys.executable, "-c", JOB, tmp, str(leak)], check=True, env={"PYTHONPATH": str(REPO)})
        growth = recover_rings([Path(tmp)]).meta["death"]["host_growth"]
    return growth["rss_per_step"], growth["rss_per_step_error"], bool(growth["rss_per_step_beyond_noise"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    print("| planted leak per step | estimates (MiB per step, 95% interval) | median | claimed growth | "
          "interval held the truth |")  # fmt: skip
    print("|---:|---|---:|---:|---:|")
    for leak in (0, 1 * MIB, 3 * MIB):
        fits = [one(leak) for _ in range(runs)]
        held = sum(1 for b, e, _ in fits if e is not None and abs(b - leak) <= e)
        claimed = sum(1 for *_, beyond in fits if beyond)
        shown = ", ".join(f"{b / MIB:.2f} ± {e / MIB:.2f}" if e is not None else f"{b / MIB:.2f} ± n/a"
                          for b, e, _ in fits)  # fmt: skip
        median = statistics.median(b for b, _, _ in fits) / MIB
        print(f"| {leak / MIB:.0f} MiB | {shown} | {median:.2f} | {claimed}/{runs} | {held}/{runs} |")


if __name__ == "__main__":
    main()
