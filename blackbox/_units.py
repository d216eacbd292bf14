"""Units for people: byte counts as KiB, MiB, GiB (shared by every stage that writes prose)."""

from __future__ import annotations


def human_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"n/a"``. Powers of 1024. A figure no float holds (a hostile ring's)
    is said by its power of two."""
    if n is None:
        return "n/a"
    try:
        value = float(n)
    except OverflowError:
        return f"{'-' if n < 0 else ''}2^{abs(int(n)).bit_length() - 1} B or beyond"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
