"""What the sampled allocations say to change, and what they do not cover: pure functions.

``with_site_lever`` puts the allocation sites' lever first in an out-of-memory
death, of the memory that ran out (a CUDA out-of-memory: the GPU's sampled
blocks, none if none was sampled, and after a fragmented cache's own lever; any
other: the host's): the site that grew most where one grew across steps (a
leak), else a spike where the largest holder was allocated in the step the job
died in and nothing grew before it (one allocation too large for the limit:
chunk it, lower the batch, checkpoint activations, or raise the limit; the leak
levers are then dropped), else the largest holder. A spike's block is compared
with what the process really held: a block requested larger than the anonymous
memory at the last sample was requested, not all touched (the kernel charges
touched pages).

``coverage`` compares the sampled live bytes with the process's anonymous
resident memory at the end (``host_anon``, from the ring's last ``sample``):
what the hooks never saw is said with its figures and the reasons it may have
(memory allocated before arming, allocators the hooks do not reach: a malloc
reached through ``dlsym`` before arming, ``mmap``, a custom allocator, and
memory freed but kept by the allocator).
"""

from __future__ import annotations

import re
from typing import Any

from .._units import human_bytes
from .levers import LIMIT_LEVER, MAIN_LEVERS

MEMORY_CAUSES = frozenset({"host_oom_kill", "userspace_oom_kill", "oom_exception"})
SPIKE_SHARE = 0.5  # of the largest holder's live bytes, allocated in the last step, for a spike
SPIKE_GROWTH = 0.25  # growth elsewhere (bytes grown) below this share of the spike's bytes: still a spike
ONE_BLOCK = 0.9  # the largest block this share of the spike's bytes at least: "one allocation of N"
GPU = "gpu"  # the domain of the CUDA caching allocator's blocks
DATALOADER_WORKER = "torch/utils/data/_utils/worker.py:"  # a DataLoader worker loop's frame (no Pool's, no rank's)
LEAK_LEVERS = frozenset({*MAIN_LEVERS, LIMIT_LEVER})
UNSEEN = (
    "allocators the hooks do not see (a malloc reached through dlsym before arming, mmap, a custom allocator), "
    "memory freed but kept by the allocator (glibc's arenas), thread stacks"
)


def _at(site: dict[str, Any]) -> str:
    name, _, where = site["site"].rpartition(" (")
    return f"`{where.rstrip(')')}` (`{name}`)"


def _thread(site: dict[str, Any]) -> str:
    return "" if site.get("thread") in (None, "MainThread") else f" in thread `{site['thread']}`"


def _why(site: dict[str, Any], role: str | None) -> str:
    name = site["site"].rpartition(" (")[0]
    line = site.get("line") or ""
    stack = site.get("stack") or ""
    if name.endswith("__getitem__") or DATALOADER_WORKER in stack or (role == "worker" and not stack):
        return "the Dataset keeps what __getitem__ makes (a cache in every worker): return it without keeping it"
    if ".append(" in line or ".extend(" in line or "+=" in line:
        return "a list appended in the loop keeps every step's objects: keep `x.item()` or a bounded deque"
    if "cache" in line.lower() or "cache" in name.lower() or re.search(r"\]\s*=", line):
        return "a cache that never evicts: bound it (functools.lru_cache(maxsize=...), or evict by size)"
    if GPU in site.get("domains", []):
        return "tensors kept on the GPU across steps: keep `.item()` or `.detach().cpu()` of what you log"
    return "memory allocated there is kept: find what holds on to it"


def _rate(site: dict[str, Any]) -> str:
    if site.get("growth_by") == "step" and site.get("growth_per_step") is not None:
        return f"{human_bytes(site['growth_per_step'])} per step since step {site.get('first_step')}"
    return f"{human_bytes(site.get('growth_per_s'))} per second"


def site_lever(site: dict[str, Any], role: str | None, *, grew: bool = False) -> str:
    """What to change, from where the memory is held or grew (the site's function, line and thread)."""
    if grew:
        what = f"grew {_rate(site)} and holds {human_bytes(site.get('live_bytes'))}"
    else:
        what = f"holds most of the sampled memory ({human_bytes(site.get('live_bytes'))})"
    return f"{_at(site)}{_thread(site)} {what}: {_why(site, role)}"


def holder(allocations: dict[str, Any] | None) -> dict[str, Any] | None:
    """The largest holder that is not an import's memory (else the largest)."""
    sites = (allocations or {}).get("sites") or []
    return next((s for s in sites if not s.get("imports")), sites[0] if sites else None)


def spike_of(allocations: dict[str, Any] | None, death: dict[str, Any]) -> dict[str, Any] | None:
    """The spike (``site``, ``line``, ``thread``, ``bytes`` allocated in the last step, ``largest_block``,
    ``step``) where the largest holder was allocated mostly in the step the ring ended in and nothing grew
    across the steps before (no site, nor the process's RSS beyond its noise); else None."""
    top = holder(allocations)
    if top is None or not top.get("last_step_bytes") or allocations is None:
        return None
    if top["last_step_bytes"] < SPIKE_SHARE * top["live_bytes"] or top.get("growth_per_step"):
        return None
    grown = sum(int(g.get("grown_bytes") or 0) for g in allocations.get("grew") or [])
    if grown >= SPIKE_GROWTH * top["last_step_bytes"]:
        return None
    host = death.get("host_growth") or {}
    if host.get("rss_per_step_beyond_noise") and (host.get("rss_per_step") or 0) > 0:
        return None
    step = death.get("step")
    return {"site": top["site"], "line": top.get("line") or "", "thread": top.get("thread"),
            "bytes": top["last_step_bytes"], "largest_block": top.get("largest_block"), "step": step,
            "ran_s": allocations.get("last_step_ran_s"), "step_s": allocations.get("step_s")}  # fmt: skip


def after_step_lever(site: dict[str, Any], allocations: dict[str, Any]) -> str:
    """The lever of a site that grew only after the last step began, which then ran long: the loop had ended
    there (an evaluation, a notebook's later cell: what it keeps is what holds the memory) or that step was a
    heavy one (a larger batch, its activations held for backward); the samples alone do not tell which."""
    line = f" (`{site['line']}`)" if site.get("line") else ""
    ran = allocations.get("last_step_ran_s")
    since = f", {ran:.1f} s with no step since" if isinstance(ran, (int, float)) else ""
    return (f"{_at(site)}{line}{_thread(site)} allocated {human_bytes(site.get('grown_bytes'))} after the last step "
            f"began and kept it ({_rate(site)}{since}{_step_s(allocations)}): where the loop had ended there (an "
            "evaluation, a notebook's later cell), that is what holds the memory: keep less of it, or free it; "
            "where it was one step's work (a larger batch), lower the batch size, chunk it or checkpoint "
            "activations")  # fmt: skip


def _step_s(said: dict[str, Any]) -> str:
    """``, against S s a step`` where ``said`` (a spike, the allocations) holds the steps' median time."""
    step_s = said.get("step_s")
    return f", against {step_s:.3g} s a step" if isinstance(step_s, (int, float)) else ""


def spike_lever(spike: dict[str, Any], last_sample: dict[str, Any] | None) -> str:
    """The spike's lever: one allocation of N at line L in step S (or N allocated there, its largest block M,
    where no one block makes most of it), and requested against touched."""
    line = f" (`{spike['line']}`)" if spike.get("line") else ""
    block = spike.get("largest_block") or 0
    largest = f" (its largest block {human_bytes(block)})" if block else ""
    what = (f"one allocation of {human_bytes(spike['bytes'])}" if block >= ONE_BLOCK * spike["bytes"] else
            f"{human_bytes(spike['bytes'])} allocated{largest}")
    step = "" if spike.get("step") is None else f" in step {spike['step']}, the step it died in,"
    if spike.get("step") is not None and spike.get("ran_s") is not None:  # its loop had ended, or something else ran
        step = f" after step {spike['step']} began (no step for {spike['ran_s']:.1f} s{_step_s(spike)}),"
    text = (f"{what} at {_at(spike)}{line}{_thread(spike)}{step} with no "
            "growth across the steps before it: a spike, not a leak; chunk it (work on it in pieces), lower the "
            "batch size, checkpoint activations, or raise the limit")  # fmt: skip
    touched = (last_sample or {}).get("host_anon")
    if isinstance(touched, int) and 0 < touched < block:
        limit = (last_sample or {}).get("cgroup_limit")
        under = f" under a limit of {human_bytes(limit)}" if isinstance(limit, int) and limit > 0 else ""
        text += (f". Its largest block, {human_bytes(block)}, was requested, not all touched: the process held "
                 f"{human_bytes(touched)} of anonymous memory at its last sample{under} (the kernel counts "
                 "pages as they are touched)")  # fmt: skip
    return text


def of_memory(allocations: dict[str, Any], device: bool) -> dict[str, Any]:
    """The sites (and growers) of the memory that ran out: the GPU's blocks for a device out-of-memory, the
    host's (Python's and native) for any other; a site holding both counts for either."""

    def ours(site: dict[str, Any]) -> bool:
        domains = set(site.get("domains") or ())
        return (GPU in domains) if device else not domains or bool(domains - {GPU})

    return {**allocations, "sites": [s for s in allocations.get("sites") or [] if ours(s)],
            "grew": [s for s in allocations.get("grew") or [] if ours(s)]}  # fmt: skip


def with_site_lever(death: dict[str, Any], allocations: dict[str, Any] | None, role: str | None,
                    last_sample: dict[str, Any] | None = None, pid: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The death with its allocation sites' lever first (second after a fragmented GPU cache's lever), where it
    ran out of memory: the site that grew most, or a spike (``memory_pattern``: ``spike``, the leak levers
    dropped), or the largest holder, of the memory that ran out (the GPU's sampled blocks for a CUDA
    out-of-memory, the host's for any other: a host line never heads a device's levers). Where the process
    killed is another one (``victim.pid`` is not ``pid``: a DataLoader worker, a pool's helper), these sites
    are not the victim's: its own levers stay first and this process's site comes last, named as its."""
    if not death or death.get("cause") not in MEMORY_CAUSES or allocations is None or not allocations.get("recorded"):
        return death
    device = bool(death.get("gpu_oom"))
    allocations = of_memory(allocations, device)
    if device and not allocations["sites"]:
        return death
    top, grew, levers = holder(allocations), allocations["grew"], list(death.get("levers") or [])
    victim = (death.get("victim") or {}).get("pid")
    if isinstance(victim, int) and isinstance(pid, int) and victim != pid:
        site = grew[0] if grew else top
        if site is None:
            return death
        return {**death, "levers": [*levers, f"in this process (pid {pid}, not the one killed): "
                                              f"{site_lever(site, role, grew=bool(grew))}"]}  # fmt: skip
    unseen = None if device else unseen_lever(death, allocations)  # (the host's RSS: not the device's memory)
    if unseen is not None:
        held = [site_lever(top, role)] if top is not None else []
        return {**death, "memory_pattern": "unseen_growth", "levers": [unseen, *levers, *held]}
    if top is None:
        return death
    if grew and grew[0].get("after_last_step"):  # a loop that had ended, or one heavy step: not told apart here
        first = _first(death, after_step_lever(grew[0], allocations), _no_leak_levers(levers))
        return {**death, "memory_pattern": "after_last_step", "levers": first}
    spike = spike_of(allocations, death)
    if spike is not None:
        first = _first(death, spike_lever(spike, last_sample), _no_leak_levers(levers))
        return {**death, "memory_pattern": "spike", "spike": spike, "levers": first}
    lever = site_lever(grew[0], role, grew=True) if grew else site_lever(top, role)
    return {**death, "memory_pattern": "growth" if grew else "held", "levers": _first(death, lever, levers)}


def _no_leak_levers(levers: list[str]) -> list[str]:
    """``levers`` without those that tell a leak (what grew across steps), where no leak is the story."""
    return [lever for lever in levers if lever not in LEAK_LEVERS and not lever.startswith("memory grew ")]


def _first(death: dict[str, Any], lever: str, levers: list[str]) -> list[str]:
    """The site's lever first, except after a fragmented device's own lever: there the cache's layout, not
    what was held, failed the request (the held memory is what to lower next)."""
    if (death.get("gpu_oom") or {}).get("kind") == "fragmentation" and levers:
        return [levers[0], lever, *levers[1:]]
    return [lever, *levers]


def coverage(allocations: dict[str, Any] | None, anon_end: Any, anon_at_arm: Any) -> dict[str, Any] | None:
    """Sampled live host bytes against the process's anonymous resident memory at the end: ``anon_rss``,
    ``anon_rss_at_arm`` (the first sample's), ``sampled_bytes`` (host blocks), ``unaccounted_bytes`` (anon
    RSS the samples do not account for, 0 if none), ``unseen_growth_bytes`` (what it grew after arming
    beyond the sampled blocks, null without the figure at arm) and ``reasons``; None without the figure at
    the end."""
    if not allocations or not allocations.get("recorded") or not isinstance(anon_end, int) or anon_end <= 0:
        return None
    sampled = int(allocations.get("host_live_bytes", allocations.get("live_bytes")) or 0)
    at_arm = anon_at_arm if isinstance(anon_at_arm, int) and anon_at_arm > 0 else None
    unseen = max(0, anon_end - at_arm - sampled) if at_arm is not None else None
    reasons = []
    if sampled > anon_end:
        reasons.append("blocks requested but not all touched (the kernel counts pages as they are touched)")
    else:
        if at_arm is not None:
            reasons.append(f"{human_bytes(at_arm)} was resident when blackbox armed (allocated before it: the "
                           "interpreter, the libraries, what the job made before arm())")  # fmt: skip
        if unseen:
            reasons.append(f"{human_bytes(unseen)} more grew after arming than the sampled blocks hold: {UNSEEN}")
        elif at_arm is None:
            reasons.append(UNSEEN)
    return {"anon_rss": anon_end, "anon_rss_at_arm": at_arm, "sampled_bytes": sampled,
            "unaccounted_bytes": max(0, anon_end - sampled), "unseen_growth_bytes": unseen,
            "reasons": reasons}  # fmt: skip


def unseen_lever(death: dict[str, Any], allocations: dict[str, Any] | None) -> str | None:
    """Where the process grew per step beyond its noise but no sampled site grew: the growth is in memory the
    hooks do not see, said with its figures; None otherwise."""
    host = death.get("host_growth") or {}
    if not (host.get("rss_per_step_beyond_noise") and (host.get("rss_per_step") or 0) > 0):
        return None
    if not allocations or allocations.get("grew"):
        return None
    cov = allocations.get("coverage") or {}
    figures = ""
    if cov.get("anon_rss") is not None:
        figures = (f" (the samples account for {human_bytes(cov['sampled_bytes'])} of "
                   f"{human_bytes(cov['anon_rss'])} of anonymous memory at the end"
                   + (f"; {human_bytes(cov['unseen_growth_bytes'])} grew after arming beyond them"
                      if cov.get("unseen_growth_bytes") else "") + ")")  # fmt: skip
    return (f"the process grew {human_bytes(int(host['rss_per_step']))} per step but no sampled allocation site "
            f"grew{figures}: the growth is in memory the hooks do not see: {UNSEEN}; look for a C library's own "
            "malloc (ctypes, cffi), mmap, or a custom allocator")  # fmt: skip
