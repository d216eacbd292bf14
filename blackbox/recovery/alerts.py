"""The alerts a job was given before its death, judged against that death (pure).

The ring's ``alert`` records are what the live process said (``collect.alerts``); its ``alert_action``
records what blackbox did about them (``collect.alert_actions``): the alert signal sent or not, the job's
handler entered and returned, the CUDA cache emptied, a callback dropped. Here they are read back beside
the death: each alert's time before the kill, the signal and whether the job's handler ran before the
kill, and how early the death was foreseeable: from the earliest forecast after which every forecast held
(its time to the limit within its 95% interval of the real time left, within ``HELD_SHARE`` of it, or
within ``HELD_S``),
with the forecasts' errors. ``own_signals`` names blackbox the sender of the signal it sent itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..collect.alert_actions import DROPPED, EMPTIED, ENTERED, NOT_SENT, NOT_WATCHED, RETURNED, SENT
from ..collect.alerts import Alert, describe
from .kinds import of_kind, rows_of_kind
from .timeline import py_rows, stamps_ns

HELD_SHARE, HELD_S = 0.25, 1.0  # a forecast off by less than this share of the real time left, or this, held
MAX_LISTED = 50  # alerts listed in metadata.json (the forecast updates are judged, not listed)
OWN_SENDER = "blackbox (alert signal)"
SEND_SLACK_NS = 5 * 10**9  # the signal record follows the sending within this
ALERT_COLUMNS = ["time", "step", "label", "value", "device", "alert_kind", "alert_level", "limit_kind",
                 "limit_bytes", "growth_per_s", "forecast_ms", "forecast_error_ms", "forecast_steps",
                 "forecast_steps_error"]  # fmt: skip


def own_signals(table: pa.Table) -> pa.Table:
    """``table`` with the signal that blackbox sent its own process (the first of that signal after each
    ``signal sent``, from the process itself) naming blackbox as its sender: never taken for another's."""
    actions = of_kind(table, "alert_action", columns=["time", "label", "detail"])
    if not actions.num_rows:
        return table
    actions = actions.filter(pc.equal(actions["detail"].cast(pa.string()), SENT))
    sent = list(zip(stamps_ns(actions["time"]).tolist(), actions["label"].cast(pa.string()).to_pylist(), strict=True))
    rows = rows_of_kind(table, "signal")
    if not sent or not len(rows):
        return table
    take = pa.array(rows)
    times = stamps_ns(table["time"].take(take))
    labels = table["label"].take(take).cast(pa.string()).to_pylist()
    pids, senders = table["pid"].take(take).to_pylist(), table["sender_pid"].take(take).to_pylist()
    hit: list[int] = []
    for t, label in sent:
        for i in range(len(rows)):
            if labels[i] == label and senders[i] == pids[i] and t <= times[i] <= t + SEND_SLACK_NS:
                hit.append(int(rows[i]))
                break
    if not hit:
        return table
    sender = table["sender"].combine_chunks().cast(pa.string()).to_numpy(zero_copy_only=False).astype(object)
    sender[hit] = OWN_SENDER
    column = pa.array(sender, pa.string()).dictionary_encode()
    return table.set_column(table.schema.get_field_index("sender"), "sender", column)


def alert_of(r: dict[str, Any]) -> Alert:
    """An ``alert`` row of the timeline (ALERT_COLUMNS) as the Alert the job was given."""
    ms = r["forecast_ms"]
    a = Alert(r["alert_kind"] or "?", r["alert_level"] or "?", r["limit_kind"] or "?", r["limit_bytes"] or 0,
              r["value"] or 0, r["device"], r["step"], 0.0, r["growth_per_s"],
              None if ms is None else ms / 1000,
              None if ms is None or r["forecast_error_ms"] is None else r["forecast_error_ms"] / 1000,
              r["forecast_steps"], r["forecast_steps_error"] if r["forecast_steps"] is not None else None)  # fmt: skip
    a.text = describe(a)
    return a


def alerts_report(table: pa.Table, death_ns: int | None) -> dict[str, Any] | None:
    """The ``alerts`` of one ring's metadata; None where it holds no alert and no action. ``death_ns``:
    when the process died (the kernel's kill, else its last event), None where it did not die."""
    rows = py_rows(of_kind(table, "alert", columns=ALERT_COLUMNS))
    actions = py_rows(of_kind(table, "alert_action", columns=["time", "step", "label", "value", "detail",
                                                              "alert_kind", "alert_level"]))  # fmt: skip
    if not rows and not actions:
        return None
    stamps = stamps_ns(of_kind(table, "alert", columns=["time"])["time"])
    listed = []
    for r, t in zip(rows, stamps.tolist(), strict=True):
        a = alert_of(r)
        if a.level == "info":
            continue
        entry = {"time": r["time"], "step": r["step"], "kind": a.kind, "level": a.level, "limit_kind": a.limit_kind,
                 "limit_bytes": a.limit, "value": a.value, "device": a.device, "growth_per_s": a.growth_per_s,
                 "forecast_s": a.forecast_s, "forecast_error_s": a.forecast_error_s,
                 "forecast_steps": a.forecast_steps, "forecast_steps_error": a.forecast_steps_error,
                 "before_death_s": _before(death_ns, t), "text": a.text}  # fmt: skip
        listed.append(entry)
    out: dict[str, Any] = {"count": len(listed), "alerts": listed[:MAX_LISTED]}
    out["signal"] = _signal(actions, stamps_ns(of_kind(table, "alert_action", columns=["time"])["time"]), death_ns)
    out["watchdog"] = [{"time": a["time"], "freed_bytes": a["value"], "what": a["label"]}
                       for a in actions if a["detail"] == EMPTIED]  # fmt: skip
    out["callbacks_dropped"] = [a["label"] for a in actions if a["detail"] == DROPPED]
    out["forecast"] = judge(rows, stamps, death_ns)
    out["headline"] = headline(listed)
    return out


def _before(death_ns: int | None, t: int) -> float | None:
    return None if death_ns is None else round((death_ns - t) / 1e9, 3)


def _signal(actions: list[dict[str, Any]], stamps: np.ndarray, death_ns: int | None) -> dict[str, Any] | None:
    """The alert signal: sent (when, before the death, for which alert) and whether the job's handler was
    entered and returned before the kill; or why it was not sent."""
    at = {a["detail"]: (a, int(t)) for a, t in zip(reversed(actions), reversed(stamps.tolist()), strict=True)}
    if NOT_SENT in at:
        a, _ = at[NOT_SENT]
        return {"sent": False, "why": a["label"], "signal_number": a["value"]}
    if SENT not in at:
        return None
    a, t = at[SENT]
    out: dict[str, Any] = {"sent": True, "signal": a["label"], "time": a["time"], "step": a["step"],
                           "alert": f"{a['alert_kind']} {a['alert_level']}", "before_death_s": _before(death_ns, t),
                           "handler": None}  # fmt: skip
    if NOT_WATCHED in at:
        out["handler"] = {"name": at[NOT_WATCHED][0]["label"], "ran": "not watched"}
    if ENTERED in at:
        entered, te = at[ENTERED]
        handler: dict[str, Any] = {"name": entered["label"], "entered_at": entered["time"],
                                   "ran": "running at the death"}
        if RETURNED in at:
            returned, tr = at[RETURNED]
            handler.update(returned_at=returned["time"], ran="returned", seconds=round((tr - te) / 1e9, 3),
                           returned_before_death_s=_before(death_ns, tr))  # fmt: skip
        elif death_ns is None:
            handler["ran"] = "entered"
        out["handler"] = handler
    elif out["handler"] is None:
        out["handler"] = {"ran": "not seen"}
    return out


def judge(rows: list[dict[str, Any]], stamps: np.ndarray, death_ns: int | None) -> dict[str, Any] | None:
    """The forecasts against the real time left: how many, their median error (seconds, and as a share of
    the time left), how many held, and ``foreseeable_s``: the real time left at the earliest forecast from
    which every later one held. None where nothing was forecast or the process did not die."""
    made = [(int(t), r["forecast_ms"] / 1000, (r["forecast_error_ms"] or 0) / 1000)
            for r, t in zip(rows, stamps.tolist(), strict=True) if r["forecast_ms"] is not None]  # fmt: skip
    if death_ns is None or not made:
        return None
    left = np.array([(death_ns - t) / 1e9 for t, _, _ in made])
    said = np.array([f for _, f, _ in made])
    half = np.array([e for _, _, e in made])
    error = said - left
    held = np.abs(error) <= np.maximum(np.maximum(half, HELD_SHARE * np.maximum(left, 0)), HELD_S)
    since = None
    for i in range(len(made) - 1, -1, -1):  # back from the last forecast while each held
        if not held[i]:
            break
        since = float(left[i])
    return {
        "forecasts": len(made),
        "held": int(held.sum()),
        "median_error_s": round(float(np.median(error)), 3),
        "median_abs_error_s": round(float(np.median(np.abs(error))), 3),
        "median_relative_error": round(float(np.median(np.abs(error) / np.maximum(left, 1e-3))), 3),
        "foreseeable_s": None if since is None else round(since, 3),
        "first": {"left_s": round(float(left[0]), 3), "said_s": round(float(said[0]), 3),
                  "error_s": round(float(half[0]), 3)},
    }  # fmt: skip


def headline(listed: list[dict[str, Any]]) -> str | None:
    """"critical at step N, 42 s before the kill; the forecast then said 45 ± 8 s": the first critical
    alert, else the first warning."""
    first = next((a for a in listed if a["level"] == "critical"), None) or (listed[0] if listed else None)
    if first is None:
        return None
    text = f"{first['kind']} {first['level']}"
    if first["step"] is not None:
        text += f" at step {first['step']}"
    if first["before_death_s"] is not None:
        text += f", {_secs(first['before_death_s'])} before the kill"
    if first["forecast_s"] is not None:
        err = first["forecast_error_s"]
        text += f"; the forecast then said {_secs(first['forecast_s'], err)}"
    return text


def _secs(value: float, error: float | None = None) -> str:
    digits = 2 if value < 1 else 1 if value < 10 else 0
    return f"{value:.{digits}f}" + (f" ± {error:.{digits}f}" if error is not None else "") + " s"


def lines(report: dict[str, Any] | None, died: bool = True) -> list[str]:
    """What the alerts say of the death, a sentence each: the first alert that mattered, the signal and the
    job's handler, how early the death was foreseeable (the verdict's evidence, summary.md's section)."""
    if not report:
        return []
    out = []
    if report.get("headline"):
        out.append(f"alerts before the {'death' if died else 'end'}: {report['headline']}")
    s = report.get("signal")
    if s and not s["sent"]:
        out.append(f"blackbox did not send the alert signal: {s['why']}")
    elif s:
        when = f", {_secs(s['before_death_s'])} before the kill" if s["before_death_s"] is not None else ""
        text = f"blackbox sent {s['signal']} at step {s['step']} ({s['alert']}){when}: "
        h = s["handler"] or {}
        name = f"the job's handler {h['name']}" if h.get("name") else "the job's handler"
        ran = h.get("ran")
        if ran == "returned":
            before = h.get("returned_before_death_s")
            text += f"{name} ran and returned {_secs(h['seconds'])} later" + (
                f", {_secs(before)} before the kill" if before is not None else "")
        elif ran == "running at the death":
            text += f"{name} was entered, and was still running when the process died"
        elif ran == "entered":
            text += f"{name} was entered"
        elif ran == "not watched":
            text += f"whether {name} ran is not known ({h.get('name', '')}: not watched)"
        else:
            text += f"{name} was not seen to run before the {'kill' if died else 'end'}"
        out.append(text)
    f = report.get("forecast")
    if f and f.get("foreseeable_s") is not None:
        out.append(f"the death was foreseeable {_secs(f['foreseeable_s'])} before it: every forecast from then "
                   f"on held ({f['held']} of {f['forecasts']} held; median error "
                   f"{f['median_error_s']:+.1f} s)")  # fmt: skip
    elif f:
        out.append(f"the forecasts did not hold to the end ({f['held']} of {f['forecasts']} held; median error "
                   f"{f['median_error_s']:+.1f} s)")  # fmt: skip
    out.extend(f"an on_alert callback was dropped: {what}" for what in report.get("callbacks_dropped") or [])
    return out


def with_alert_evidence(death: dict[str, Any], report: dict[str, Any] | None) -> dict[str, Any]:
    """The death with what the alerts say of it at the end of its evidence."""
    said = lines(report, died=death.get("cause") not in (None, "clean_exit", "unknown"))
    return {**death, "evidence": [*(death.get("evidence") or []), *said]} if said and death else death


LIVE_SHOWN = 3


def live_alerts(table: pa.Table, now_ns: int) -> dict[str, Any] | None:
    """What ``blackbox watch`` says of a running ring's alerts: how many, the last few (info updates
    aside) with their age, the latest forecast, and the alert signal's fate; None where there is none."""
    rows = py_rows(of_kind(table, "alert", columns=ALERT_COLUMNS))
    actions = of_kind(table, "alert_action", columns=["time", "step", "label", "value", "detail", "alert_kind",
                                                      "alert_level"])  # fmt: skip
    if not rows and not actions.num_rows:
        return None
    stamps = stamps_ns(of_kind(table, "alert", columns=["time"])["time"]).tolist()
    said = [(r, t) for r, t in zip(rows, stamps, strict=True) if r["alert_level"] != "info"]
    last = [{"time": r["time"], "age_s": round((now_ns - t) / 1e9, 1), "kind": r["alert_kind"],
             "level": r["alert_level"], "text": alert_of(r).text} for r, t in said[-LIVE_SHOWN:]]  # fmt: skip
    ahead = next(((r, t) for r, t in zip(reversed(rows), reversed(stamps), strict=True)
                  if r["forecast_ms"] is not None), None)  # fmt: skip
    forecast = None
    if ahead is not None:
        a, t = alert_of(ahead[0]), ahead[1]
        forecast = {"limit_kind": a.limit_kind, "device": a.device, "age_s": round((now_ns - t) / 1e9, 1),
                    "forecast_s": a.forecast_s, "forecast_error_s": a.forecast_error_s,
                    "forecast_steps": a.forecast_steps, "forecast_steps_error": a.forecast_steps_error,
                    "growth_per_s": a.growth_per_s}  # fmt: skip
    signal = _signal(py_rows(actions), stamps_ns(actions["time"]), None) if actions.num_rows else None
    return {"count": len(said), "last": last, "forecast": forecast, "signal": signal}
