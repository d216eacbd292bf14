"""ISO-8601 times as blackbox writes them (UTC, ``Z``, up to nanoseconds), read alike on every Python.

``datetime.fromisoformat`` on Python 3.10 takes neither a ``Z`` nor more than six
fractional digits, and blackbox writes nine (``recovery.timeline.iso_ns``): every
reader of those times goes through ``epoch_ns``.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)?")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def epoch_ns(iso: Any) -> int | None:
    """Nanoseconds since the epoch of an ISO-8601 time: any number of fractional digits up to nine,
    ``Z``, an offset such as ``+02:00``, or none (UTC). None where it is not such a time (a month 13,
    trailing text, not a string)."""
    if not isinstance(iso, str) or len(iso) > 40:
        return None
    m = _ISO.fullmatch(iso)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(m[i]) for i in range(1, 7))
    zone = m[8] or "Z"
    try:
        at = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
        if zone != "Z":
            sign = 1 if zone[0] == "+" else -1
            at -= sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    except (ValueError, OverflowError):
        return None
    fraction = int((m[7] or "0").ljust(9, "0"))
    return (at - _EPOCH) // timedelta(seconds=1) * 1_000_000_000 + fraction
