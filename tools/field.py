"""The field matrix: real third-party training jobs (pytorch/examples mnist, nanoGPT DDP under torchrun,
HF Trainer, Lightning) dealt known deaths, each unarmed, under `arm()` and under `blackbox run`.

For each armed run it says whether the job was unchanged (exit status or signal, output, files, which
process the kernel killed, orphans) against the unarmed run, and whether the recovered verdict (cause,
step, victim, sender) matches the planted truth. Prints one Markdown table and a tally; writes the
details to OUT/field.json and OUT/cells/JOB/DEATH/MODE/cell.json.

    tools/field_setup.sh /tmp/field/venv /tmp/field/src      # once: venvs and third-party sources
    python tools/field.py --tree /work/main --out /tmp/field/out
    python tools/field.py --tree T --cells hf:oom:arm          # one cell again (with its unarmed run)
    python tools/field.py --cells hf:workers-spawn --unarmed 3 # a job whose own error path races: 3 unarmed runs
    python tools/field.py --out /tmp/field/out --report        # the table again from the saved cells
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fieldlib.compare import capped, differences, files_of, judge, load_meta, outputs, truth, verdict  # noqa: E402
from fieldlib.deaths import DEATHS  # noqa: E402
from fieldlib.jobs import JOBS, Env, Job  # noqa: E402
from fieldlib.runner import run_once  # noqa: E402

MODES = ("arm", "run")


def install_tree(tree: Path, out: Path, python: Path) -> tuple[Path, str]:
    """Copy the blackbox tree under test, build its C write path in place; (PYTHONPATH folder, its commit)."""
    copy, pkg = out / "tree", out / "pkg"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(pkg, ignore_errors=True)
    shutil.copytree(tree / "blackbox", copy / "blackbox", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        if (tree / name).exists():
            shutil.copy(tree / name, copy / name)
    built = subprocess.run([str(python), "setup.py", "build_ext", "--inplace", "-q"], cwd=copy, capture_output=True,
                           text=True, check=False)  # fmt: skip
    pkg.mkdir(parents=True)
    (pkg / "blackbox").symlink_to(copy / "blackbox")
    head = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True,
                          text=True, check=False).stdout.strip()  # fmt: skip
    has_c = any((copy / "blackbox" / "ring").glob("_cwriter*.so"))
    return pkg, f"{head or tree} ({'C write path' if has_c else 'pure-Python write path: ' + built.stderr[-200:]})"


def own_bundle(run: Path) -> dict[str, Any] | None:
    """`blackbox run`'s own bundle's metadata, None where it left none, or only the snapshot it wrote while the
    job outlived its SIGTERM (a process in it still running)."""
    found = sorted((run / "bb").glob("run-*/bundle/metadata.json"))
    meta = load_meta(found[-1]) if found else None
    return None if meta is None or (meta.get("first_death") or meta.get("death") or {}).get("alive") else meta


def recover(job: Job, env: Env, pkg: Path, run: Path, mode: str) -> tuple[dict[str, Any] | None, str]:
    """The bundle: blackbox run's own, else `blackbox recover` of the rings (arm(), or a `blackbox run`
    killed with its job, as a Slurm epilogue would, or as its snapshot's line says to, where all it left was
    the snapshot it wrote while the job outlived its SIGTERM)."""
    rings, note = run / "rings", ""
    if mode == "run":
        if (meta := own_bundle(run)) is not None:
            return meta, ""
        rings = max((run / "bb").glob("run-*/rings"), default=run / "rings")
        left = any((run / "bb").glob("run-*/bundle/metadata.json"))
        note = "blackbox run left its snapshot alone" if left else "blackbox run left no bundle"
    if not any(rings.glob("*.ring")):
        return None, note or "no ring"
    if mode == "run":
        run = run / "recovered"  # (beside blackbox run's own folder: its snapshot stays as it was)
    done = subprocess.run([str(job.python(env)), "-m", "blackbox", "recover", str(rings), "-o",
                           str(run / "bundle")], capture_output=True, text=True, env={"PYTHONPATH": str(pkg),
                           "PATH": "/usr/bin:/bin"}, check=False)  # fmt: skip
    trouble = done.stderr.strip()[-300:] if done.returncode else ""
    return load_meta(run / "bundle" / "metadata.json"), "; ".join(x for x in (note, trouble) if x)


def signal_rows(run: Path, mode: str) -> list[dict[str, Any]]:
    """The signals the rings recorded, with their senders (timeline.parquet of the bundle used)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found = sorted((run / "bb").glob("run-*/bundle/timeline.parquet")) if mode == "run" else []
    path = found[-1] if found else run / "bundle" / "timeline.parquet"
    if not path.exists():
        return []
    table = pq.read_table(path, columns=["kind", "pid", "label", "sender", "sender_pid", "detail"])
    return table.filter(pc.equal(table["kind"], "signal")).to_pylist()  # type: ignore[no-any-return]


def run_cell(job: Job, death_name: str, mode: str, env: Env, pkg: Path, out: Path, folder: str = "") -> dict[str, Any]:
    """Run one cell (a rerun: twice into the same folders), recover it; cell.json holds what was seen."""
    death = DEATHS[death_name]
    run = out / "cells" / job.name / death_name / (folder or mode)
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    obs = run_once(job, death, mode, env, pkg, run, True, "a")
    if death.rerun:
        obs["rerun"] = run_once(job, death, mode, env, pkg, run, False, "b")
    cell: dict[str, Any] = {"job": job.name, "death": death_name, "mode": mode, "observed": obs}
    if mode != "unarmed":
        cell["recovery_error"] = recover(job, env, pkg, run, mode)[1]
    (run / "cell.json").write_text(json.dumps(cell, indent=1, default=str))
    return assess(cell, run, env)


def assess(cell: dict[str, Any], run: Path, env: Env) -> dict[str, Any]:
    """What the cell's run left, normalised, and its verdict judged against the truth (from the files on
    disk: ``--report`` judges saved cells again with the field's code as it is now)."""
    job, death, mode, obs = JOBS[cell["job"]], DEATHS[cell["death"]], cell["mode"], cell["observed"]
    replace = {str(run): "<RUN>", str(env.src): "<SRC>", str(env.venv_tv): "<VENV>", str(env.venv): "<VENV>",
               str(Path(__file__).resolve().parent): "<TOOLS>"}  # fmt: skip
    seen = {
        "status": [obs["status"]] + ([obs["rerun"]["status"]] if death.rerun else []),
        "oom_kills": obs["oom_kills"], "kernel_victims": [k["role"] for k in obs["kernel_kills"]],
        "orphans": [o["role"] for o in obs["orphans"] + (obs["rerun"]["orphans"] if death.rerun else [])],
        **outputs(run, ["a", "b"] if death.rerun else ["a"], replace, job.progress),
        "files": files_of(run, timed=death.timed),
    }  # fmt: skip
    cell["seen"] = {k: sorted(v) if isinstance(v, set) else v for k, v in seen.items()}
    if mode != "unarmed":
        meta = own_bundle(run) if mode == "run" else None
        meta = meta or load_meta(run / ("recovered" if mode == "run" else ".") / "bundle" / "metadata.json")
        trouble = cell.get("recovery_error", "")
        t, v = truth(job, death, obs, mode), verdict(meta) if meta else None
        wrong = judge(v, t, death, mode, signal_rows(run, mode)) if v else [f"no verdict: {trouble or 'no bundle'}"]
        if death.leak and not obs["kernel_kills"]:
            wrong.append("no kernel OOM kill happened (the planted leak did not trip the limit)")
        cell.update(truth=t, verdict=v, wrong=wrong, notes=[f"note: {trouble}"] if v and trouble else [])
    return cell


def row(cell: dict[str, Any], bases: list[dict[str, Any]]) -> dict[str, Any]:
    """One armed run against the unarmed runs: a difference counts only where it is one from every unarmed
    run (what the job does by itself in one of them, a race in its own error path, is no change)."""
    timed = DEATHS[cell["death"]].timed
    if bases:
        each = [differences(_sets(b["seen"]), _sets(cell["seen"]), timed, cap=None) for b in bases]
        diffs = capped([d for d in each[0] if all(d in other for other in each[1:])])
    else:
        diffs = ["no unarmed run to compare"]
    cell["differences"] = diffs
    return {"job": cell["job"], "death": cell["death"], "mode": cell["mode"], "unchanged": not diffs,
            "right": not cell["wrong"], "what": cell["wrong"] + diffs + cell["notes"]}  # fmt: skip


def _unarmed_folder(i: int) -> str:
    return "unarmed" if i == 0 else f"unarmed-{i + 1}"


def _sets(seen: dict[str, Any]) -> dict[str, Any]:
    return {k: set(v) if k in ("stdout", "stderr", "files") else v for k, v in seen.items()}


def table(rows: list[dict[str, Any]]) -> str:
    def cut(text: str) -> str:
        return text.replace("|", "\\|").replace("\t", " ")[:160]

    lines = ["| job | death | mode | job unchanged? | verdict right? | what differed |", "|---|---|---|---|---|---|"]
    for r in rows:
        more = f"<br>... {len(r['what']) - 6} more" if len(r["what"]) > 6 else ""
        what = "<br>".join(cut(w) for w in r["what"][:6]) + more
        lines.append(f"| {r['job']} | {r['death']} | {r['mode']} | {'yes' if r['unchanged'] else 'no'} | "
                     f"{'yes' if r['right'] else 'no'} | {what} |")  # fmt: skip
    right = [r for r in rows if r["right"]]
    changed, changed_right = (sum(not r["unchanged"] for r in some) for some in (rows, right))
    lines.append(f"\nOf {len(rows)} armed runs, {len(right)} gave the right verdict; {changed} changed the job "
                 f"({changed_right} of those with the right verdict).")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1], help="blackbox source tree")
    p.add_argument("--venv", type=Path, default=Path("/tmp/field/venv"))
    p.add_argument("--venv-tv", type=Path, default=None, help="torch+torchvision venv (default: VENV-tv)")
    p.add_argument("--src", type=Path, default=Path("/tmp/field/src"))
    p.add_argument("--out", type=Path, default=Path("/tmp/field/out"))
    p.add_argument("--jobs", default=",".join(JOBS))
    p.add_argument("--deaths", default="", help="comma-separated (default: each job's own list)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--cells", default="", help="JOB:DEATH[:MODE],... instead of --jobs/--deaths/--modes")
    p.add_argument("--report", action="store_true", help="judge the cells saved under --out again (no job runs): "
                   "the table, and OUT/report.json")
    p.add_argument("--list", action="store_true", help="list jobs and deaths")
    p.add_argument("--unarmed", type=int, default=1, help="unarmed runs per cell (the job's own variance: an "
                   "armed run differs only where it differs from each of them)")  # fmt: skip
    a = p.parse_args(argv)
    if a.list:
        for job in JOBS.values():
            print(f"{job.name}: {', '.join(job.deaths)}")
        print(f"deaths: {', '.join(DEATHS)}; modes: unarmed (always, as the base), {', '.join(MODES)}")
        return 0
    venv_tv = (a.venv_tv or Path(f"{a.venv}-tv")).absolute()
    env = Env(a.venv.absolute(), venv_tv, a.src.absolute(), a.out.absolute() / "data")
    if a.report:
        return report(a.out.absolute(), env)
    plan: dict[tuple[str, str], list[str]] = {}
    if a.cells:
        for spec in a.cells.split(","):
            job_name, death_name, *mode = spec.split(":")
            plan.setdefault((job_name, death_name), []).extend(mode or list(MODES))
    else:
        for job_name in a.jobs.split(","):
            for death_name in a.deaths.split(",") if a.deaths else JOBS[job_name].deaths:
                plan[(job_name, death_name)] = a.modes.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    pkg, tree = install_tree(a.tree.absolute(), a.out.absolute(), env.venv / "bin" / "python")
    print(f"field: tree {a.tree} at {tree}; {len(plan)} job x death pairs", file=sys.stderr, flush=True)
    for job_name in {j for j, _ in plan}:
        JOBS[job_name].prepare(env)
    rows, started = [], time.monotonic()
    for (job_name, death_name), modes in plan.items():
        job = JOBS[job_name]
        bases = [run_cell(job, death_name, "unarmed", env, pkg, env.data.parent, _unarmed_folder(i))
                 for i in range(max(1, a.unarmed))]  # fmt: skip
        for mode in modes:
            cell = run_cell(job, death_name, mode, env, pkg, env.data.parent)
            rows.append(row(cell, bases))
            (env.data.parent / "cells" / job_name / death_name / mode / "cell.json").write_text(
                json.dumps(cell, indent=1, default=str))
            r = rows[-1]
            print(f"field: {job_name} {death_name} {mode}: unchanged={r['unchanged']} right={r['right']} "
                  f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    (a.out / "field.json").write_text(json.dumps({"tree": tree, "rows": rows}, indent=1, default=str))
    print(f"Tree: {tree}\n\n" + table(rows))
    return 0


def report(out: Path, env: Env) -> int:
    """The table again from the saved cells, each judged again (no job is run)."""
    rows = []
    for unarmed in sorted(out.glob("cells/*/*/unarmed/cell.json")):
        paths = [unarmed, *sorted(unarmed.parent.parent.glob("unarmed-*/cell.json"))]
        bases = [assess(json.loads(u.read_text()), u.parent, env) for u in paths]
        for mode in MODES:
            path = unarmed.parent.parent / mode / "cell.json"
            if path.exists():
                rows.append(row(assess(json.loads(path.read_text()), path.parent, env), bases))
    (out / "report.json").write_text(json.dumps({"rows": rows}, indent=1, default=str))
    print(table(rows))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: each run's cgroup and processes go
    sys.exit(main())
