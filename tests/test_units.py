"""Byte counts for people (blackbox._units): every figure a ring can hold is said, none raises."""

from __future__ import annotations

from blackbox._units import human_bytes


def test_bytes_read_in_powers_of_1024() -> None:
    assert [human_bytes(n) for n in (None, 0, 1023, 1536, 5 << 20, 5 << 50)] == [
        "n/a", "0 B", "1023 B", "1.5 KiB", "5.0 MiB", "5120.0 TiB"]  # fmt: skip


def test_a_figure_no_float_holds_is_said_by_its_power_of_two() -> None:
    # a hostile ring's header can hold any JSON integer: summary.md once died on float(10**400) (OverflowError)
    assert human_bytes(10**400) == "2^1328 B or beyond"
    assert human_bytes(-(10**400)) == "-2^1328 B or beyond"
