"""Alerts before the death, as pure functions: the engine (collect/alerts.py) fed planted series of memory
against a limit, the fit's forecast, the judgement after the death (recovery/alerts.py), and where the
verdict goes (run/notice.py). The real jobs, in memory cgroups, are in test_alerts_cgroup.py."""

from __future__ import annotations

import os
import random
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from blackbox._fit import time_to, trend
from blackbox.collect import alerts as al
from blackbox.collect.alert_actions import alert_settings, parse_signal
from blackbox.recovery.alerts import headline, judge
from blackbox.ring import format as fmt
from blackbox.run.notice import SNAPSHOT, termination_message, verdict_line

MIB, GIB = 1 << 20, 1 << 30
LIMIT = GIB


class Written:
    """The engine's ``event`` and ``on_alert``: what it wrote and handed on."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []
        self.alerts: list[al.Alert] = []

    def event(self, kind: int, label: Any = None, value: Any = None, device: int = -1, payload: Any = None) -> int:
        self.records.append((kind, label, value, device, payload))
        return 1


def _probe(usage: int) -> tuple[Any, tuple[int, ...]]:
    """A HostProbe just read: a cgroup of LIMIT at ``usage``, a host of 64 GiB with 60 GiB available."""
    probe = types.SimpleNamespace(owner_usage=usage, file_cache=0, mem_total=64 * GIB, vm_size=-1)
    return probe, (usage, usage, LIMIT, 0, 60 * GIB, 0, -1, -1)


def _run(series: list[int], steps: list[int] | None = None, interval: float = 0.1,
         levels: tuple[float, float] = al.DEFAULT_LEVELS) -> Written:  # fmt: skip
    out = Written()
    engine = al.AlertEngine(out.event, interval, levels, al.DEFAULT_BEFORE_S, out.alerts.append)
    for i, used in enumerate(series):
        probe, figures = _probe(used)
        engine.tick(probe, figures, [], steps[i] if steps else -1, now=i * interval)
    return out


def _names(out: Written) -> list[str]:
    return [f"{a.kind} {a.level}" for a in out.alerts]


def test_a_steady_job_with_noise_gets_no_alert() -> None:
    # GIVEN ten minutes of a job at 40% of its limit whose memory moves by a batch's 20 MiB each step
    rng = random.Random(7)
    series = [int(0.4 * LIMIT + rng.choice((0, 20 * MIB)) + rng.gauss(0, 2 * MIB)) for _ in range(6000)]
    # THEN nothing is said
    assert _run(series, steps=[i // 5 for i in range(6000)]).alerts == []


def test_a_leak_is_said_once_with_its_forecast_then_the_forecast_under_a_minute_is_critical() -> None:
    # GIVEN 4 MiB/s from 300 MiB against a 1 GiB limit: the limit 181 s after the start
    out = _run([300 * MIB + int(4 * MIB * 0.1 * i) for i in range(1900)], steps=[i // 10 for i in range(1900)])
    names = _names(out)
    assert names[0] == "leak warning" and names.count("leak warning") == 1, names
    leak = out.alerts[0]
    left = (LIMIT - leak.value) / (4 * MIB)
    assert leak.growth_per_s == pytest.approx(4 * MIB, rel=0.01)
    assert leak.forecast_s == pytest.approx(left, rel=0.02) and leak.forecast_error_s is not None
    assert leak.forecast_steps == pytest.approx(left, rel=0.05)  # a step a second
    assert names.count("forecast critical") == 1 and names.count("memory warning") == 1, names
    critical = out.alerts[names.index("forecast critical")]
    assert critical.forecast_s is not None and critical.forecast_s < al.DEFAULT_BEFORE_S
    assert "forecast info" not in names  # written again as it changes, for the judgement after the death, and
    assert [r[1] for r in out.records].count("forecast info") >= 10  # only for it: no callback is called
    # AND every alert is a record of the ring, its words in FORMAT.md's order
    kind, label, value, device, words = out.records[0]
    assert (kind, label, value, device) == (fmt.KIND_CODES["alert"], "leak warning", leak.value, -1)
    assert words[:4] == (al.LEAK, al.WARNING, 1, LIMIT) and words[5] == round(leak.forecast_s * 1000)


def test_memory_that_fills_and_empties_is_no_leak_once_minutes_show_it() -> None:
    # GIVEN ten minutes of a cache that fills over 30 s (64 MiB) and is emptied, again and again
    series = [int(0.4 * LIMIT) + 64 * MIB * (i % 300) // 300 for i in range(6000)]
    out = _run(series, steps=[i // 10 for i in range(6000)])
    # THEN the first fill may pass for a leak (nothing yet says otherwise); none after the first minute
    assert [a.step for a in out.alerts if (a.step or 0) > 60] == [] and len(out.alerts) <= 1, _names(out)
    assert len(out.records) <= 10  # nor forecasts written again after it (the first fill has a few)


def test_growth_before_the_first_steps_is_no_leak() -> None:
    # GIVEN a model loading at 20 MiB/s for 10 s before its first step, then steady steps
    series = [100 * MIB + int(20 * MIB * 0.1 * min(i, 100)) for i in range(400)]
    steps = [-1 if i < 100 else (i - 100) // 5 for i in range(400)]
    # THEN no leak: the growth happened over fewer than three steps
    assert "leak warning" not in _names(_run(series, steps))


def test_levels_fire_once_each_and_again_only_after_falling_below() -> None:
    # GIVEN use that climbs past 80% and 95%, stays, falls to 50% and climbs past 80% again
    up = [int(f * LIMIT) for f in np.linspace(0.5, 0.97, 50)]
    series = up + [int(0.97 * LIMIT)] * 50 + [LIMIT // 2] * 20 + [int(0.85 * LIMIT)] * 20
    names = [n for n in _names(_run(series)) if n.startswith("memory")]
    assert names == ["memory warning", "memory critical", "memory warning"]


def test_levels_are_settable_in_percents_or_fractions_and_checked() -> None:
    assert al.parse_levels("70,90") == (0.7, 0.9) == al.parse_levels((0.7, 0.9))
    names = _names(_run([int(0.75 * LIMIT)] * 5, levels=al.parse_levels("70,90")))
    assert names == ["memory warning"]
    with pytest.raises(ValueError, match="warning <= critical"):
        al.parse_levels("95,80")


def test_the_limit_judged_is_the_one_with_the_least_headroom() -> None:
    # GIVEN a cgroup with room to spare on a host that is nearly full
    out = Written()
    engine = al.AlertEngine(out.event, 0.1, al.DEFAULT_LEVELS, 60.0, out.alerts.append)
    probe = types.SimpleNamespace(owner_usage=100 * MIB, file_cache=0, mem_total=64 * GIB, vm_size=-1)
    engine.tick(probe, (0, 100 * MIB, 8 * GIB, 0, 2 * GIB, 0, -1, -1), [], -1, now=0.0)
    # THEN the host's memory is the limit named (62 of 64 GiB in use), not the cgroup's
    assert [(a.kind, a.level, a.limit_kind) for a in out.alerts] == [("memory", "warning", "host"),
                                                                       ("memory", "critical", "host")]  # fmt: skip


def test_page_cache_the_kernel_reclaims_first_is_not_use() -> None:
    # GIVEN a cgroup at its limit, 900 MiB of it page cache (a dataset read through the cache)
    out = Written()
    engine = al.AlertEngine(out.event, 0.1, al.DEFAULT_LEVELS, 60.0, out.alerts.append)
    probe = types.SimpleNamespace(owner_usage=LIMIT, file_cache=900 * MIB, mem_total=64 * GIB, vm_size=-1)
    engine.tick(probe, (0, LIMIT, LIMIT, 0, 60 * GIB, 0, -1, -1), [], -1, now=0.0)
    assert out.alerts == []


def _gpu(allocated: int, reserved: int, ooms: int = 0, total: int = 8 * GIB) -> tuple[int, ...]:
    free = total - 512 * MIB - reserved
    return (allocated, reserved, allocated, reserved - allocated, free, total, 0, ooms, allocated)


def test_gpu_fragmentation_warning_and_an_oom_with_enough_cached_is_critical() -> None:
    out = Written()
    engine = al.AlertEngine(out.event, 0.1, al.DEFAULT_LEVELS, 60.0, out.alerts.append)
    probe, figures = _probe(100 * MIB)
    # GIVEN a device 60% full with little cached: nothing; then 94% full, 3 of its 7 GiB reserved cached
    engine.tick(probe, figures, [(0, _gpu(4 * GIB, 4 * GIB + 100 * MIB))], -1, now=0.0)
    assert _names(out) == []
    engine.tick(probe, figures, [(0, _gpu(4 * GIB, 7 * GIB))], -1, now=0.1)
    frag = [a for a in out.alerts if a.kind == "fragmentation"]
    assert [(a.level, a.value, a.limit, a.device) for a in frag] == [("warning", 3 * GIB, 7 * GIB, 0)]
    # WHEN an OOM asked for 1.5 GiB with 3 GiB cached (in pieces): critical
    engine.tick(probe, figures, [(0, _gpu(4 * GIB, 7 * GIB, ooms=1))], -1, {0: 3 * GIB // 2}, now=0.2)
    assert _names(out)[-1] == "fragmentation critical"
    # AND an OOM asking for more than is cached is not fragmentation
    engine.tick(probe, figures, [(0, _gpu(4 * GIB, 7 * GIB, ooms=2))], -1, {0: 4 * GIB}, now=20.0)
    assert _names(out).count("fragmentation critical") == 1


def test_the_fit_forecasts_the_time_to_a_limit_with_its_interval() -> None:
    t = np.arange(100) * 0.1
    rng = np.random.default_rng(3)
    fit = trend(t, 200e6 + 5e6 * t + rng.normal(0, 1e6, 100))
    assert fit is not None
    ahead = time_to(100e6, fit)
    assert ahead is not None and ahead[0] == pytest.approx(20, rel=0.1) and 0 < ahead[1] < 5
    assert time_to(100e6, trend(t, 200e6 + rng.normal(0, 1e6, 100))) is None  # no growth: no forecast


def test_the_judgement_says_how_early_the_death_was_foreseeable() -> None:
    # GIVEN forecasts at 30, 20, 10 s before a death at t = 100 s; the first one said 60 s (wrong)
    rows = [{"forecast_ms": f, "forecast_error_ms": 1000} for f in (60_000, 19_000, 11_000)]
    stamps = np.array([70, 80, 90], np.int64) * 10**9
    j = judge(rows, stamps, 100 * 10**9)
    assert j is not None and (j["forecasts"], j["held"], j["foreseeable_s"]) == (3, 2, 20.0)
    assert j["median_abs_error_s"] == 1.0
    assert judge(rows, stamps, None) is None  # no death: nothing to judge


def test_the_headline_names_the_first_critical_alert_and_what_the_forecast_said() -> None:
    listed = [{"kind": "leak", "level": "warning", "step": 3, "before_death_s": 90.0, "forecast_s": 88.0,
               "forecast_error_s": 9.0},
              {"kind": "forecast", "level": "critical", "step": 40, "before_death_s": 42.0, "forecast_s": 45.2,
               "forecast_error_s": 8.1}]  # fmt: skip
    assert headline(listed) == "forecast critical at step 40, 42 s before the kill; the forecast then said 45 ± 8 s"


def test_alert_settings_read_the_environment_blackbox_run_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLACKBOX_ALERT_SIGNAL", "usr1")
    monkeypatch.setenv("BLACKBOX_ALERT_BEFORE", "30")
    s = alert_settings(True, None, None, None, None)
    assert s == {"levels": [0.8, 0.95], "before_s": 30.0, "watchdog": False, "signal": "SIGUSR1"}
    assert alert_settings(False, None, None, None, None) is None
    assert parse_signal("SIGTERM") == parse_signal(15) == 15
    with pytest.raises(ValueError, match="must name a signal"):
        parse_signal("NOPE")


META = {"cause": "host_oom_kill", "death": {"confidence": "certain", "headline": "The main process (pid 7) was "
        "killed by the kernel OOM killer.", "pid": 7}, "alerts": {"headline": "forecast critical at step 4, 9.0 s "
        "before the kill; the forecast then said 8.5 ± 0.3 s", "signal": None, "forecast": None}}  # fmt: skip


def test_the_verdict_is_one_line_with_what_the_alerts_said() -> None:
    line = verdict_line(META, "/b\nx")
    assert line.startswith("blackbox: host_oom_kill (certain): The main process (pid 7) was killed")
    assert "Before it: alerts before the death: forecast critical at step 4" in line and "\n" not in line


def test_the_termination_message_is_written_only_into_an_empty_regular_file(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    assert termination_message("x", str(log)) is None  # not in a pod: the file is not created
    log.write_text("")
    assert termination_message("the verdict", str(log)) == str(log) and log.read_text() == "the verdict"
    assert termination_message("another", str(log)) is None and log.read_text() == "the verdict"  # the job's wins
    os.symlink(log, tmp_path / "link")
    log.write_text("")
    assert termination_message("x", str(tmp_path / "link")) is None  # never through a link


def test_a_snapshots_termination_message_is_replaced_by_the_verdict_of_the_end(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    snapshot = f"{SNAPSHOT} 1 s after SIGTERM from kubelet: The main process (pid 7) is still running" + "x" * 900
    assert termination_message(snapshot, str(log)) == str(log)
    assert termination_message("blackbox: clean_exit: saved", str(log)) == str(log)
    assert log.read_text() == "blackbox: clean_exit: saved"  # all of it: nothing of the longer snapshot left
    log.write_text("the job's own: blackbox: still running")
    assert termination_message("blackbox: hang", str(log)) is None  # only a message that begins as a snapshot's
