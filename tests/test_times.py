"""Times as blackbox writes them (nine fractional digits, ``Z``) read alike on every supported Python:
``datetime.fromisoformat`` on 3.10 refuses both."""

from __future__ import annotations

import pytest

from blackbox._times import epoch_ns
from blackbox.recovery.timeline import iso_ns


def test_a_time_with_nanoseconds_reads_to_the_nanosecond() -> None:
    assert epoch_ns("2026-01-01T00:00:00.016000123Z") == 1_767_225_600_016_000_123
    assert epoch_ns(iso_ns(1_767_225_600_016_000_123)) == 1_767_225_600_016_000_123


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2026-01-01T00:00:00Z", 1_767_225_600 * 10**9),
        ("2026-01-01T00:00:00.5Z", 1_767_225_600 * 10**9 + 500_000_000),
        ("2026-01-01T00:00:00.016000", 1_767_225_600 * 10**9 + 16_000_000),  # no zone: UTC
        ("2026-01-01T02:00:00.000001+02:00", 1_767_225_600 * 10**9 + 1_000),
        ("2025-12-31T23:30:00-00:30", 1_767_225_600 * 10**9),
    ],
)
def test_fractions_of_any_length_and_any_zone_read(text: str, ns: int) -> None:
    assert epoch_ns(text) == ns


@pytest.mark.parametrize(
    "text", ["2026-13-01T00:00:00Z", "2026-01-32T00:00:00Z", "2026-01-01T00:00:00.0123456789Z",
             "2026-01-01T00:00:00Z and more", "yesterday", "", None, 17, "9" * 50]  # fmt: skip
)
def test_what_is_not_such_a_time_reads_as_none(text: object) -> None:
    assert epoch_ns(text) is None
