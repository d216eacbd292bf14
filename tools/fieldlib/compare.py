"""Armed against unarmed (is the job unchanged?) and the recorder's verdict against the planted truth."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from .deaths import Death, cause_of_status
from .jobs import Job

TQDM = re.compile(r"\d+%\|| \d+/\d+ \[|it/s\]|s/it\]")
NUMBER = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?")
FRAME = re.compile(r'\s+File "(?P<file>[^"]+)", line \d+, in (?P<func>.+)$')
CARETS = re.compile(r"\s+[~^]+\s*$")
RANK_PREFIX = re.compile(r"^\[rank\d+\]:")
OWN_LINES = ("blackbox run: rings in", "blackbox run: the job still runs")  # blackbox run's, while the job runs
HIDDEN = ("out", "work")  # the job's own outputs; rings, bundles and step files are the field's


def normal_lines(text: str, replace: dict[str, str], progress: str = "") -> set[str]:
    """Distinct output lines with paths, numbers (timings, pids, losses), addresses and tqdm bars taken out."""
    if "\nblackbox run: exit status" in "\n" + text:  # blackbox run's own account, printed after the job
        text = text[: ("\n" + text).index("\nblackbox run: exit status")]
    for old, new in replace.items():
        text = text.replace(old, new)
    lines, in_frame = set(), False
    for raw in re.split(r"[\r\n]", text):
        line = RANK_PREFIX.sub("", raw.rstrip())
        frame = FRAME.match(line)
        if frame:  # where a traceback passed is timing (which wait a rank was in); a blackbox frame is not
            in_frame = True
            if "blackbox/" in frame["file"]:
                where = frame["file"].split("blackbox/")[-1]
                lines.add(f"traceback passes through blackbox: {where} in {frame['func']}")
            continue
        if in_frame and line.startswith("    ") or CARETS.match(line):
            continue
        in_frame = False
        if not line.strip() or TQDM.search(line) or line.startswith(OWN_LINES):
            continue
        if progress and re.search(progress, line):
            continue
        lines.add(NUMBER.sub("N", re.sub(r"0x[0-9a-fA-F]+", "0xX", line)))
    return lines


def files_of(run: Path, timed: bool) -> set[str]:
    found = set()
    for top in HIDDEN:
        for dirpath, _, names in os.walk(run / top):
            for n in names:
                rel = os.path.relpath(os.path.join(dirpath, n), run)
                found.add(NUMBER.sub("N", rel) if timed else rel)
    return found


def outputs(run: Path, parts: list[str], replace: dict[str, str], progress: str) -> dict[str, set[str]]:
    return {
        stream: set().union(*(normal_lines((run / f"{stream}-{p}.txt").read_text(errors="replace"), replace, progress)
                              for p in parts))
        for stream in ("stdout", "stderr")
    }  # fmt: skip


def differences(base: dict[str, Any], other: dict[str, Any], timed: bool, cap: int | None = 4) -> list[str]:
    """What differs between the unarmed run and an armed one (empty: the job is unchanged). A death dealt
    by the clock (``timed``) may find either run further along: only what the armed run adds counts.
    ``cap``: output lines named per stream and sign (None: all, for :func:`capped` to cut later)."""
    said = [f"{key} {base[key]} -> {other[key]}" for key in ("status", "oom_kills") if base[key] != other[key]]
    said += [
        f"{key} {sorted(base[key])} -> {sorted(other[key])}"
        for key in ("kernel_victims", "orphans")
        if sorted(base[key]) != sorted(other[key])
    ]
    for stream in ("stdout", "stderr"):
        plus = {x for x in other[stream] - base[stream] if not _interleaved(x, base[stream])}
        minus = {x for x in base[stream] - other[stream] if not _interleaved(x, other[stream])}
        for sign, lines in (("+", plus), ("-", set() if timed else minus)):
            said += [f"{stream} {sign} {line[:110]}" for line in sorted(lines)[:cap]]
            if cap is not None and len(lines) > cap:
                said.append(f"{stream} {sign} ... {len(lines) - cap} more lines")
    fewer = set() if timed else base["files"] - other["files"]
    for sign, names in (("+", other["files"] - base["files"]), ("-", fewer)):
        said += [f"files {sign} {n}" for n in sorted(names)[:4]]
    return said


def capped(said: list[str], cap: int = 4) -> list[str]:
    """``differences(..., cap=None)``'s list with at most ``cap`` output lines per stream and sign."""
    out: list[str] = []
    counts: dict[str, int] = {}
    for line in said:
        key = line[:8] if line.startswith(("stdout ", "stderr ")) else ""
        if not key:
            out.append(line)
            continue
        counts[key] = counts.get(key, 0) + 1
        if counts[key] <= cap:
            out.append(line)
    for key, n in counts.items():
        if n > cap:
            out.append(f"{key} ... {n - cap} more lines")
    return out


def _interleaved(line: str, lines: set[str]) -> bool:
    """Two processes' lines written into one pipe at once (ranks): ``line`` is made of lines in ``lines``."""
    ends = {0}
    for i in range(1, len(line) + 1):
        if any(j in ends and line[j:i] in lines for j in range(i)):
            ends.add(i)
    return len(line) in ends and line not in lines


def verdict(meta: dict[str, Any]) -> dict[str, Any]:
    """The recorder's claim: cause, step, victim, sender, exit status (the first death's ring)."""
    rings = meta.get("rings") or [meta]
    first = meta.get("first_death") or {}
    ring = next((r for r in rings if first and r.get("pid") == first.get("pid")), None)
    mains = [r for r in rings if r.get("role") == "main"] or rings
    ring = ring or max(mains, key=lambda r: str(r.get("started_at")))  # a clean end: the last attempt's
    death = ring.get("death") or {}
    return {
        "cause": meta.get("cause"), "confidence": (first or death).get("confidence"),
        "step": (first or death).get("step"), "victim": (first or death).get("victim") or {},
        "killed_by": death.get("killed_by"), "exit_status": death.get("exit_status"),
        "headline": (first or death).get("headline"), "signals": ring.get("signals") or [],
        "attempts": [{"cause": a.get("cause"), "pid": (a.get("first_death") or {}).get("pid"),
                      "step": (a.get("first_death") or {}).get("step")} for a in meta.get("attempts") or []],
        "rings": len(rings),
    }  # fmt: skip


def truth(job: Job, death: Death, obs: dict[str, Any], mode: str) -> dict[str, Any]:
    """What really happened in this run, from the field's own records (never from the recorder)."""
    procs = {int(k): v for k, v in obs["procs"].items()}
    mains = {pid for pid, p in procs.items() if p["role"] == "main" or p["role"].startswith("rank")}
    t: dict[str, Any] = {"causes": list(death.causes), "victims": sorted(mains), "exit_status": death.exit_status}
    if death.leak:
        kills = obs["kernel_kills"]
        t["victims"] = [kills[0]["pid"]] if kills else []
        t["victim_role"] = kills[0]["role"] if kills else None
    elif death.rerun:  # the second run ends cleanly; the first, killed, is an earlier attempt
        t["victims"], t["first_attempt"] = [], {"cause": "killed", "pid": obs["target"]}
    elif death.action in ("sigkill", "pod") or (death.exit_status is not None and job.ranks == 1):
        t["victims"] = [obs["target"]]  # (every rank exits alike: any may be the first death; a pod's end is the
        # job's, not that of a worker killed with it, whose role the field reads as "main": a fork, no exec)
    if not death.causes:
        direct = job.ranks == 1 and not death.timeout  # the job's main process is the field's own child
        status = obs["status"] if direct else (job.sigterm_status if death.signal == "SIGTERM" else 130)
        t["causes"] = list(cause_of_status(status, interrupted_by_handler=death.signal == "SIGINT"))
    if death.sender:
        field_pid = obs.get("field_pid") or procs.get(obs["top_pid"], {}).get("ppid")  # the field's own pid
        t["sender_pid"] = field_pid if death.sender == "field" else obs["top_pid"]
        # torchrun starts its ranks in a session of their own: unarmed too, they get the signal from it
        t["relays"] = sorted(pid for pid, p in procs.items() if p["role"] == "torchrun") if job.ranks > 1 else []
        t["signal"] = death.signal
    if death.namespace:  # the rings know the pids inside the container's PID namespace
        t["victims"] = sorted(procs[pid].get("nspid", pid) if pid in procs else pid for pid in t["victims"])
        procs = {p.get("nspid", pid): p for pid, p in procs.items()}
    t["steps"] = {pid: procs[pid]["steps"] for pid in t["victims"] if pid in procs}
    if death.site:
        t["site"] = death.site
    if death.headline:
        t["headline"] = death.headline
    if "first_attempt" in t:
        t["first_attempt"]["step"] = procs.get(obs["target"], {}).get("steps")
    return t


def judge(v: dict[str, Any], t: dict[str, Any], death: Death, mode: str, rows: list[dict[str, Any]]) -> list[str]:
    """What the verdict got wrong (empty: right)."""
    wrong: list[str] = []
    if v["cause"] not in t["causes"]:
        wrong.append(f"cause {v['cause']} (truth {'/'.join(t['causes'])})")
    pid = v["victim"].get("pid")
    # torchrun's agent, armed under `blackbox run`, that took the sender's own signal and stopped its ranks with
    # it: where the signal landed first, so the first death, as long as the sender named is the true one
    relay_first = pid in t.get("relays", []) and (v["killed_by"] or {}).get("sender_pid") == t.get("sender_pid")
    if t["victims"] and pid not in t["victims"] and not relay_first:
        wrong.append(f"victim {pid} {v['victim'].get('role')} (truth {t['victims']} {t.get('victim_role', '')})")
    elif pid in t["steps"] and t["steps"][pid] is not None and (v["step"] or 0) != t["steps"][pid]:
        wrong.append(f"step {v['step']} (truth {t['steps'][pid]})")
    if t.get("exit_status") is not None and v["exit_status"] != t["exit_status"]:
        wrong.append(f"exit_status {v['exit_status']} (truth {t['exit_status']})")
    if "sender_pid" in t:
        wrong += _sender(v, t, pid, rows)
    if t.get("site") and v["cause"] == "hang" and f"stuck in {t['site']} (" not in (v["headline"] or ""):
        wrong.append(f"hang site not {t['site']}: {v['headline']}")
    if t.get("headline") and t["headline"] not in (v["headline"] or ""):
        wrong.append(f"headline lacks {t['headline']!r}: {v['headline']}")
    first = t.get("first_attempt")
    if first and mode == "arm" and (len(v["attempts"]) < 2 or v["attempts"][0] != first):
        wrong.append(f"attempts {v['attempts']} (truth {first}, then clean_exit)")
    return wrong


def _sender(v: dict[str, Any], t: dict[str, Any], pid: int | None, rows: list[dict[str, Any]]) -> list[str]:
    """The verdict must name the signal and its true sender: in ``killed_by``, or, where the job's own
    handler took it, in the headline, from the ring's record of it (``rows``: the timeline's signals)."""
    senders = [t["sender_pid"], *t.get("relays", [])]
    want = f"{t['signal']} from pid {'/'.join(map(str, senders))}"
    by = v["killed_by"]
    if by:
        ok = by.get("signal") == t["signal"] and by.get("sender_pid") in senders
        got = f"{by.get('signal')} from {by.get('sender')} pid {by.get('sender_pid')}"
        return [] if ok else [f"killed_by {got} (truth {want})"]
    mine = [r for r in rows if r["label"] == t["signal"] and r["pid"] == pid]
    if not mine:
        return [f"no {t['signal']} recorded for pid {pid} (truth {want})"]
    if mine[-1]["sender_pid"] not in senders:
        return [f"{t['signal']} recorded from {mine[-1]['sender']} pid {mine[-1]['sender_pid']} (truth {want})"]
    if t["signal"] not in (v["headline"] or ""):
        return [f"verdict does not name the {t['signal']} (recorded: {want})"]
    return []


def load_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta: dict[str, Any] = json.loads(path.read_text())
        return meta
    except (OSError, ValueError):
        return None
