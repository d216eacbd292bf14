"""How much address space arming takes (what `ulimit -v`, RLIMIT_AS, counts), unarmed against armed.

Starts a Python process that imports numpy, arms or not, and reports its VmSize and its largest mappings,
with no address-space limit and under one (where arming makes its ring and sampler stack small). The
difference is what the job loses of its limit: its MemoryError comes that much earlier.

    python tools/bench_address_space.py [--limit-kib 2000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

PROBE = """
import json, resource, sys, time
import numpy
if sys.argv[1] == "armed":
    import blackbox
    blackbox.arm(sys.argv[2] + "/")
    time.sleep(0.3)  # the sampler's first ticks: its thread's malloc arena is made by then
def kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
maps = []
for line in open("/proc/self/maps"):
    parts = line.split()
    lo, hi = (int(x, 16) for x in parts[0].split("-"))
    maps.append(((hi - lo) >> 10, parts[5] if len(parts) > 5 else "[anon]"))
print(json.dumps({"vm_kib": kib("VmSize"), "big": sorted(maps, reverse=True)[:6]}))
"""


def probe(mode: str, limit_kib: int | None, folder: str) -> dict[str, object]:
    pre = (lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_AS, (limit_kib << 10,) * 2)) \
        if limit_kib else None  # fmt: skip
    out = subprocess.run([sys.executable, "-c", PROBE, mode, folder], capture_output=True, text=True, check=True,
                         preexec_fn=pre)  # fmt: skip
    result: dict[str, object] = json.loads(out.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-kib", type=int, default=2_000_000, help="the RLIMIT_AS to compare under (KiB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for limit in (None, args.limit_kib):
            plain, armed = probe("unarmed", limit, folder), probe("armed", limit, folder)
            before, after = float(str(plain["vm_kib"])) / 1024, float(str(armed["vm_kib"])) / 1024
            where = f"RLIMIT_AS {limit} KiB" if limit else "no address-space limit"
            print(f"{where}: VmSize {before:.1f} MiB unarmed, {after:.1f} MiB armed: +{after - before:.1f} MiB")
            print(f"  largest mappings armed (KiB, what): {armed['big']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
