"""Alerts before the death, from what the sampler already reads: written into the ring, so they survive
the kill that follows.

Nothing to configure. At each sample of a job's main process (``Recorder.sample_now``) the engine takes
the memory in use against the limit that will end the job (``collect.limits``: the lowest cgroup limit,
the host's MemTotal, RLIMIT_AS, whichever has the least headroom; and each GPU's memory) and says:

- ``memory``: use crossed ``warning`` (80%) or ``critical`` (95%) of that limit (``arm(alert_levels=...)``,
  ``BLACKBOX_ALERT_LEVELS``). Each level fires once, and again only after use fell 5 points below it.
- ``leak`` (warning): the memory grows, and the fit says it is real: the least-squares growth per second
  over the last ``WINDOW_S`` seconds is at least ``SURE`` times the half-width of its 95% interval (widened
  for the samples' serial correlation, ``_fit.trend``): about four standard errors, so that a steady job's
  noise, fitted twice a second for days, is not taken for a leak; over at least ``MIN_STEPS`` distinct
  steps where the job counts steps (only the points since its first step: a model loading before it is no
  leak; a job that counts no steps is judged after its first ``WARMUP_S``), at ``CONFIRM`` fits in a row,
  with the limit within ``LEAK_HORIZON_S`` at that rate.
- ``forecast``: the time to the limit at that growth, with its error, in seconds and steps. ``critical``
  once it falls under ``alert_before`` (60 s) at ``CONFIRM`` fits in a row; written again (``info``) as
  it changes while a leak holds (at most once a second, or once per 1/60 of the time it leaves), so the
  forecasts the job was given can be judged against its real death afterwards.
- ``fragmentation`` (a GPU): ``warning`` where the caching allocator holds far more than is allocated
  (reserved less allocated at least ``FRAG_SHARE`` of reserved) on a device past the warning level;
  ``critical`` where an OOM came with that much cached (enough free in all, not in one piece).

Every alert carries the forecast of its limit when the growth is real. The cost: a few deque appends
a sample, and a fit over about a hundred points every ``FIT_EVERY_S`` (tools/bench_alerts.py measures
it beside the sampler's tick). What follows an alert (callbacks, the signal, the watchdog) is
``collect.alert_actions``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._fit import beyond_noise, finite_trend, time_to
from .._units import human_bytes
from ..ring import format as fmt
from .limits import GPU, Use, address_space, binding, gpu_use, host_uses

KIND_ALERT = fmt.KIND_CODES["alert"]
MEMORY, LEAK, FRAGMENTATION, FORECAST = (next(c for c, n in fmt.ALERT_KINDS.items() if n == name)
                                         for name in ("memory", "leak", "fragmentation", "forecast"))  # fmt: skip
INFO, WARNING, CRITICAL = (next(c for c, n in fmt.ALERT_LEVELS.items() if n == name)
                           for name in ("info", "warning", "critical"))  # fmt: skip
DEFAULT_LEVELS = (0.80, 0.95)
DEFAULT_BEFORE_S = 60.0
LEVELS_ENV, BEFORE_ENV = "BLACKBOX_ALERT_LEVELS", "BLACKBOX_ALERT_BEFORE"
WINDOW_S = 15.0  # the recent growth: the fit's window
MIN_SPAN_S = 5.0  # a fit over a shorter span says nothing of a trend
MAX_POINTS = 256  # the window's points at most (a short sample interval: a longer stride)
FIT_EVERY_S = 0.5
CONFIRM = 3  # fits in a row that must agree before a forecast under alert_before is said
LEAK_HOLD_S = 5.0  # and for this long before a leak is: memory that wanders (a random walk) is not a leak
LONG_S, LONG_STRIDE_S = 300.0, 1.0  # a leak also grows over this long, where the job has run that long
SURE = 2.0  # growth is said where the slope is this many times the half-width of its 95% interval (about 4 sigma)
MIN_STEPS = 3
WARMUP_S = 60.0  # a job that counts no step: its first minute is taken for its start-up, not a leak
LEAK_HORIZON_S = 3600.0
REARM = 0.05
FRAG_SHARE = 0.30
UPDATE_S, UPDATE_SHARE = 1.0, 1 / 60
RLIMIT_EVERY_S = 10.0
LIMIT_NAMES = {"cgroup": "the cgroup limit", "host": "the host's memory (MemTotal)",
               "rlimit_as": "RLIMIT_AS (the address space)", "gpu": "GPU {device}'s memory"}  # fmt: skip


@dataclass
class Alert:
    """One alert, as ``on_alert`` callbacks get it. Bytes, seconds; None where not known.

    ``kind``: ``memory``, ``leak``, ``fragmentation`` or ``forecast``; ``level``: ``info``, ``warning`` or
    ``critical``; ``limit_kind``: ``cgroup``, ``host``, ``rlimit_as`` or ``gpu`` (``device`` its index);
    ``value``: the memory in use against ``limit`` (a fragmentation alert: the bytes cached beyond those
    allocated, against those reserved); ``growth_per_s`` and the forecast of the time (``forecast_s``) and
    steps (``forecast_steps``) to the limit, each with the half-width of its 95% interval (``_error``);
    ``step`` in force; ``time``: seconds since the epoch; ``top_site``: where the most sampled bytes live
    were allocated (allocations sampled), ``{"site", "line", "live_bytes"}``; ``text``: one line."""

    kind: str
    level: str
    limit_kind: str
    limit: int
    value: int
    device: int | None = None
    step: int | None = None
    time: float = 0.0
    growth_per_s: float | None = None
    forecast_s: float | None = None
    forecast_error_s: float | None = None
    forecast_steps: float | None = None
    forecast_steps_error: float | None = None
    top_site: dict[str, Any] | None = None
    text: str = ""

    def __str__(self) -> str:
        return self.text


def limit_name(kind: str, device: int | None = None) -> str:
    return LIMIT_NAMES.get(kind, kind).format(device=device)


def describe(a: Alert) -> str:
    """The alert in one line, as the ring's reader and the callbacks see it."""
    limit = f"{limit_name(a.limit_kind, a.device)} ({human_bytes(a.limit)})"
    ahead = ""
    if a.forecast_s is not None:
        left = plus_minus(a.forecast_s, a.forecast_error_s)
        ahead = f"; at this rate {limit_name(a.limit_kind, a.device)} in {left} s"
        if a.forecast_steps is not None:
            ahead += f" ({plus_minus(a.forecast_steps, a.forecast_steps_error)} steps)"
    growth = f", growing {human_bytes(int(a.growth_per_s))}/s" if a.growth_per_s else ""
    if a.kind == "memory":
        return f"memory {a.level}: {100 * a.value / max(a.limit, 1):.0f}% of {limit} in use{growth}{ahead}"
    if a.kind == "leak":
        return f"leak: memory grows {human_bytes(int(a.growth_per_s or 0))}/s beyond its noise, {limit}{ahead}"
    if a.kind == "forecast":
        return f"forecast ({a.level}): {human_bytes(a.value)} of {limit} in use{growth}{ahead}"
    held = f"{human_bytes(a.value)} cached beyond what is allocated, of {human_bytes(a.limit)} reserved"
    if a.level == "critical":
        return f"GPU {a.device} fragmentation: out of memory with {held}"
    return f"GPU {a.device} fragmentation: {held}, on a device past {limit_name('gpu', a.device)}'s warning level"


def plus_minus(value: float, error: float | None) -> str:
    digits = 2 if value < 1 else 1 if value < 10 else 0
    return f"{value:.{digits}f}" + (f" ± {error:.{digits}f}" if error is not None else "")


def parse_levels(setting: Any) -> tuple[float, float]:
    """(warning, critical) fractions from ``arm(alert_levels=...)`` or ``BLACKBOX_ALERT_LEVELS`` (``80,95``:
    percents, or fractions); the defaults for None."""
    if setting is None or setting == "":
        return DEFAULT_LEVELS
    parts = [float(p) for p in setting.split(",")] if isinstance(setting, str) else [float(p) for p in setting]
    parts = [p / 100 if p > 1 else p for p in parts]
    if len(parts) != 2 or not 0 < parts[0] <= parts[1] <= 1:
        raise ValueError(f"alert levels must be two fractions or percents, warning <= critical, got {setting!r}")
    return parts[0], parts[1]


@dataclass
class Track:
    """One limit's recent use: the window the fit reads, and which of its alerts have fired.

    The window is ``points`` (time, step, use) rows written twice, at ``head`` and ``head + points``, into
    an array twice that long, so the last ``points`` rows are always one slice in time order: no copy."""

    kind: int
    device: int
    points: int
    fired: set[int] = field(default_factory=set)
    next_fit: float = 0.0
    fit: tuple[float, float] | None = None
    grows: bool = False
    steps: int = 0
    leak_run: int = 0
    soon_run: int = 0
    leaked: bool = False
    soon: bool = False
    quiet_since: float | None = None
    next_update: float = 0.0
    frag: bool = False
    ooms: int = -1
    frag_oom_at: float = 0.0
    started: float = -1.0
    last: float = -1.0
    n: int = 0
    head: int = 0
    rows: np.ndarray = field(init=False)
    long: Track | None = None  # the same, a point a second over LONG_S: what the leak warning also asks

    def __post_init__(self) -> None:
        self.rows = np.zeros((3, 2 * self.points))

    def add(self, t: float, step: int, used: int) -> None:
        if self.started < 0:
            self.started = t
        self.rows[:, self.head] = self.rows[:, self.head + self.points] = (t, step, used)
        self.head = (self.head + 1) % self.points
        self.n = min(self.n + 1, self.points)
        self.last = t
        if self.long is not None and (self.long.last < 0 or t - self.long.last >= LONG_STRIDE_S):
            self.long.add(t, step, used)

    def window(self) -> np.ndarray:
        """(3, n): time, step, use of the window's rows, oldest first (a view)."""
        if self.n < self.points:
            return self.rows[:, : self.n]
        return self.rows[:, self.head : self.head + self.points]

    def grows_long(self) -> bool:
        """Where there is history beyond two windows, it grows too, over the last LONG_S: memory that wanders
        (a cache that fills and empties, a random walk back to its mean) grows over 15 s, not over minutes."""
        long = self.long
        if long is None or long.n < 3 or long.last - long.window()[0, 0] < 2 * WINDOW_S:
            return True
        t, _, u = long.window()
        fit = finite_trend(t - t[0], u)
        return beyond_noise(fit) and fit is not None and fit[0] > SURE * fit[1]

    def refit(self) -> None:
        """The growth per second over the window (``grows``: sure, over a span long enough, and over enough
        steps). Where the job counts steps, only the points since its first step in the window count (a
        model loading before its first step is no leak); a job that counts none is judged once it has run
        ``WARMUP_S``."""
        self.fit, self.grows, self.steps = None, False, 0
        t, s, u = self.window()
        if len(t) < 3:
            return
        if s[-1] >= 0:
            first = int(np.argmax(s >= 0))  # the step only rises from -1: the points since the first step
            t, s, u = t[first:], s[first:], u[first:]
            self.steps = int(np.count_nonzero(np.diff(s))) + 1
        elif t[-1] - self.started < WARMUP_S:
            return
        if len(t) < 3 or t[-1] - t[0] < MIN_SPAN_S:
            return
        self.fit = finite_trend(t - t[0], u)
        sure = beyond_noise(self.fit) and self.fit is not None and self.fit[0] > SURE * self.fit[1]
        self.grows = sure and (self.steps >= MIN_STEPS or s[-1] < 0)

    def step_fit(self) -> tuple[float, float] | None:
        """The growth per step over the window's counted steps (where there are ``MIN_STEPS``)."""
        if self.steps < MIN_STEPS:
            return None
        t, s, u = self.window()
        counted = s >= 0
        return finite_trend(s[counted], u[counted])


class AlertEngine:
    """The sampler's half of the alerts for one armed ring: ``tick`` writes each alert and hands it on."""

    def __init__(self, event: Callable[..., int], interval: float, levels: tuple[float, float],
                 before_s: float, on_alert: Callable[[Alert], None]) -> None:  # fmt: skip
        self._event = event
        self._points = min(MAX_POINTS, max(16, round(WINDOW_S / max(interval, 1e-3))))
        self._stride = max(WINDOW_S / MAX_POINTS, interval) * 0.999  # a point every stride seconds at most
        self.levels, self.before_s = levels, before_s
        self._on_alert = on_alert
        self._tracks: dict[tuple[int, int], Track] = {}
        self._rlimit: int | None = None
        self._rlimit_at = -RLIMIT_EVERY_S
        self.alerts = 0

    def tick(self, probe: Any, figures: tuple[int, ...], gpus: list[tuple[int, tuple[int, ...]]], step: int,
             oom_requests: dict[int, int] | None = None, now: float | None = None) -> None:  # fmt: skip
        """One sample's figures: the host's (a ``HostProbe`` just read, and its ``read()``), each GPU's
        ``gpu_sample`` payload, the step in force (-1: none); ``now``: monotonic seconds (tests give it)."""
        now = time.monotonic() if now is None else now
        if now - self._rlimit_at >= RLIMIT_EVERY_S:
            self._rlimit, self._rlimit_at = address_space(), now
        uses = host_uses(probe, figures, self._rlimit)
        bound = binding(uses)
        for use in uses:
            self._observe(self._track(use[0], -1), now, step, use, use is bound)
        for device, payload in gpus:
            on_device = gpu_use(payload)
            if on_device is not None:
                track = self._track(GPU, device)
                self._observe(track, now, step, on_device, True)
                self._fragmentation(track, now, step, payload, on_device, (oom_requests or {}).get(device))

    def _track(self, kind: int, device: int) -> Track:
        track = self._tracks.get((kind, device))
        if track is None:
            track = self._tracks[(kind, device)] = Track(kind, device, self._points)
            track.long = Track(kind, device, round(LONG_S / LONG_STRIDE_S))
        return track

    def _observe(self, track: Track, now: float, step: int, use: Use, judged: bool) -> None:
        kind, used, limit = use
        if track.last < 0 or now - track.last >= self._stride:
            track.add(now, step, used)
        if not judged:  # not the limit that will be reached first: its window is kept, nothing said
            return
        due = now >= track.next_fit
        crossed = []
        for level, code in zip(self.levels, (WARNING, CRITICAL), strict=True):
            if used >= level * limit and code not in track.fired:
                track.fired.add(code)
                crossed.append(code)
            elif used < (level - REARM) * limit:
                track.fired.discard(code)
        if due or crossed:
            track.next_fit = now + FIT_EVERY_S
            track.refit()
        ahead = time_to(limit - used, track.fit) if track.grows else None
        for code in crossed:
            self._alert(track, MEMORY, code, use, step, ahead)
        if not due:
            return
        track.leak_run = track.leak_run + 1 if ahead is not None and ahead[0] < LEAK_HORIZON_S else 0
        track.soon_run = track.soon_run + 1 if ahead is not None and ahead[0] < self.before_s else 0
        if track.grows:
            track.quiet_since = None
        elif track.quiet_since is None:
            track.quiet_since = now
        if track.leaked and track.quiet_since is not None and now - track.quiet_since >= WINDOW_S:
            track.leaked = track.soon = False  # the growth stopped for a whole window: a new leak is news
        elif track.leaked and not track.soon and ahead is not None and not track.grows_long():
            track.leaked = False  # over minutes it does not grow: memory that fills and empties, no leak
        if track.leak_run >= max(CONFIRM, LEAK_HOLD_S / FIT_EVERY_S) and not track.leaked and track.grows_long():
            track.leaked = True
            self._alert(track, LEAK, WARNING, use, step, ahead)
        elif track.soon_run >= CONFIRM and not track.soon:
            track.soon = True
            self._alert(track, FORECAST, CRITICAL, use, step, ahead)
        elif (track.leaked or track.soon) and ahead is not None and now >= track.next_update:
            self._alert(track, FORECAST, INFO, use, step, ahead)

    def _fragmentation(self, track: Track, now: float, step: int, payload: tuple[int, ...], use: Use,
                       requested: int | None) -> None:  # fmt: skip
        allocated, reserved, ooms = payload[0], payload[1], payload[7]
        if allocated < 0 or reserved <= 0:
            return
        cached = reserved - allocated
        held = cached >= FRAG_SHARE * reserved
        if held and use[1] >= self.levels[0] * use[2] and not track.frag:
            track.frag = True
            self._alert(track, FRAGMENTATION, WARNING, (GPU, cached, reserved), step, None)
        elif cached < FRAG_SHARE / 2 * reserved:
            track.frag = False
        if ooms > track.ooms >= 0 and (cached >= requested if requested else held) and now >= track.frag_oom_at:
            track.frag_oom_at = now + UPDATE_S * 10  # an OOM the job catches and retries: one alert in ten seconds
            self._alert(track, FRAGMENTATION, CRITICAL, (GPU, cached, reserved), step, None)
        track.ooms = max(track.ooms, ooms)

    def _alert(self, track: Track, kind: int, level: int, use: Use, step: int, ahead: tuple[float, float] | None
               ) -> None:  # fmt: skip
        _, used, limit = use
        fit = track.fit if ahead is not None else None
        steps = time_to(limit - used, track.step_fit()) if ahead is not None else None
        a = Alert(fmt.ALERT_KINDS[kind], fmt.ALERT_LEVELS[level], fmt.LIMIT_KINDS[use[0]], limit, used,
                  None if track.device < 0 else track.device, None if step < 0 else step, time.time(),
                  fit[0] if fit else None, *(ahead or (None, None)), *(steps or (None, None)))  # fmt: skip
        a.text = describe(a)
        if ahead is not None:
            track.next_update = track.last + max(UPDATE_S, ahead[0] * UPDATE_SHARE)
        words = (kind, level, use[0], limit, _word(a.growth_per_s), _word(a.forecast_s, 1000),
                 _word(a.forecast_error_s, 1000), _word(a.forecast_steps), _word(a.forecast_steps_error))  # fmt: skip
        self._event(KIND_ALERT, f"{a.kind} {a.level}", used, track.device, words)
        self.alerts += 1
        if level != INFO:  # a forecast written again is for the ring (the judgement after a death), not news
            self._on_alert(a)


def _word(value: float | None, scale: float = 1.0) -> int:
    """A figure as a payload word: rounded, -1 (null) where unknown or negative."""
    if value is None or not value >= 0 or value * scale >= 2**62:
        return -1
    return int(value * scale + 0.5)
