#!/usr/bin/env python3
"""Recover the same rings with this tree and another (an earlier commit) and compare the bundles:
timeline.parquet row for row, metadata.json and summary.md text, ranks.parquet, the raw rings kept. A change that makes
recovery faster must not change what it recovers.

    python tools/compare_bundles.py --baseline SRC RING_OR_FOLDER [...]

Each target is recovered by ``python -m blackbox recover TARGET -o OUT`` with blackbox from each tree
(``git archive REV | tar -x -C SRC``, its C extension built there). What differs by nature between two
recoveries (when and by whom: ``recovered_by``, the recovery's own timings) is left out of the comparison.
Prints one line per target; exits 1 if any bundle differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent.parent
VOLATILE = {"recovered_by", "recovered_at", "recovery_seconds"}


def recover(source: Path, target: str, out: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(source))
    done = subprocess.run([sys.executable, "-m", "blackbox", "recover", target, "-o", str(out)], cwd=source, env=env,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"compare_bundles: {source}: recover {target} failed: {done.stderr.strip()[-2000:]}")


def steady(value: Any) -> Any:
    """The metadata without what differs between two recoveries of the same rings."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [steady(v) for v in value]
    return value


def differences(a: Path, b: Path) -> list[str]:
    found = []
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    for name in names:
        x, y = a / name, b / name
        if not x.exists() or not y.exists():
            found.append(f"{name}: only in {'this tree' if x.exists() else 'the baseline'}")
        elif x.is_dir() and y.is_dir():  # rings/: the raw rings kept, byte for byte
            found += [f"{name}/{d}" for d in differences(x, y)]
        elif name.endswith(".parquet"):
            tx, ty = pq.read_table(x), pq.read_table(y)
            if tx.schema != ty.schema:
                found.append(f"{name}: schemas differ")
            elif tx.to_pylist() != ty.to_pylist():
                found.append(f"{name}: rows differ ({tx.num_rows} and {ty.num_rows} rows)")
        elif name == "metadata.json":
            text = x.read_text()
            if steady(json.loads(text)) != steady(json.loads(y.read_text())):
                found.append(f"{name}: differs")
            elif text != json.dumps(json.loads(text), indent=2) + "\n":
                found.append(f"{name}: not the text json.dumps(indent=2) writes")
        elif name.endswith(".png"):
            continue  # drawn by matplotlib: compared through the rows it draws (timeline.parquet)
        elif x.read_bytes() != y.read_bytes():
            found.append(f"{name}: differs")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="another blackbox source tree")
    ap.add_argument("targets", nargs="+", help="rings or folders of rings")
    args = ap.parse_args(argv)
    base = Path(args.baseline).resolve()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="compare-bundles-") as tmp:
        for n, target in enumerate(args.targets):
            ours, theirs = Path(tmp) / f"{n}-this", Path(tmp) / f"{n}-base"
            recover(HERE, target, ours)
            recover(base, target, theirs)
            found = differences(ours, theirs)
            bad += bool(found)
            print(f"{target}: {'same' if not found else 'DIFFERENT: ' + '; '.join(found)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
