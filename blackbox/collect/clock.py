"""How far this host's wall clock may be off, as its time service tells the kernel (``adjtimex``).

Deaths on two hosts are ordered by their wall clocks; two deaths closer than the
clocks' errors cannot be told apart. The kernel keeps the bound that NTP, chrony or
PTP last set (``maxerror``, growing by 500 ppm between updates); reading it needs no
privilege. None where the clock is not synchronised or the call is not available.
"""

from __future__ import annotations

import ctypes

_TIME_ERROR = 5  # adjtimex's return when the clock is not synchronised
_STA_UNSYNC = 0x0040


class _Timex(ctypes.Structure):
    _fields_ = [
        ("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
        ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
        ("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long), ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
        ("_pad", ctypes.c_int * 11),
    ]  # fmt: skip


def clock_error_s() -> float | None:
    """The kernel's bound on this host's wall-clock error in seconds, or None (not synchronised,
    or unknown). Reads only (``modes`` 0)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the interpreter's own symbols: find_library would run ldconfig
        timex = _Timex()
        state = libc.adjtimex(ctypes.byref(timex))
    except (OSError, AttributeError):
        return None
    if state < 0 or state == _TIME_ERROR or timex.status & _STA_UNSYNC:
        return None
    return float(timex.maxerror) / 1e6
