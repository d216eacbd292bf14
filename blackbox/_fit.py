"""Growth and the time it leaves: a least-squares slope with an honest interval, and the forecast of when
a growing figure reaches a limit. Shared by the live alerts (``collect.alerts``, on the sampler thread,
over a window of about a hundred points) and recovery (``recovery.levers``, over a whole ring), so the
forecast the job was given and the one judged after its death are the same arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

# Student's t, two-sided 95%, for 1..10 degrees of freedom; beyond, 1.96 + 2.5 / df is within 0.01
_T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)


def t95(df: float) -> float:
    return _T95[max(int(df), 1) - 1] if df < 11 else 1.96 + 2.5 / df


def trend(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """(slope, half-width of its 95% interval) of ``y`` over ``x`` by least squares, the points in time
    order; None with fewer than 3 points or one value of ``x``. Points that are not finite are left out
    (figures no process has, from a damaged or planted ring): see ``finite_trend``."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) <= 0:
        return None
    with np.errstate(all="ignore"):  # such figures may still overflow into non-finite sums
        fit = finite_trend(x, y)
    return fit if fit is not None and np.isfinite(fit[0]) and not np.isnan(fit[1]) else None


def finite_trend(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """``trend`` of points known finite (the live alerts' window: 9 us for 150 points where
    ``trend`` takes 34 us, most of it in its checks).

    The interval comes from the residuals, widened for their serial correlation: memory samples are
    not independent draws (a warm-up, a plateau, a cache filled once leave long runs of residuals of
    one sign), so the effective number of points is n (1 - r) / (1 + r), r the residuals' lag-1
    autocorrelation. A slope inside its interval's reach of zero is not growth but noise."""
    n = len(x)
    if n < 3:
        return None
    dx, dy = x - x.sum() / n, y - y.sum() / n
    sxx = float(dx @ dx)
    if not sxx > 0:
        return None
    slope = float(dx @ dy) / sxx
    resid = dy - slope * dx
    sse = float(resid @ resid)
    lag = float(resid[1:] @ resid[:-1])
    if not (math.isfinite(slope) and math.isfinite(sse) and math.isfinite(lag)):
        return None
    r = min(max(lag / sse, 0.0), 0.99) if sse > 0 else 0.0
    n_eff = n * (1 - r) / (1 + r)
    if n_eff <= 2.5:  # too few independent points to tell a trend from a drift
        return slope, math.inf
    se = math.sqrt(sse / (n - 2) / sxx * (1 + r) / (1 - r))
    return slope, t95(n_eff - 2) * se


def beyond_noise(fit: tuple[float, float] | None) -> bool:
    """The fit says the figure grows: its slope is positive and its 95% interval excludes zero."""
    return fit is not None and fit[0] > 0 and fit[1] < fit[0]


def time_to(headroom: float, fit: tuple[float, float] | None) -> tuple[float, float] | None:
    """(time, half-width of its 95% interval) until ``headroom`` is used at the fit's slope, in the fit's
    units of ``x`` (seconds, or steps); None where the growth is not beyond its noise. The half-width is
    the slope's, carried over (time * error / slope): "45 ± 8 s"."""
    if not beyond_noise(fit) or headroom < 0:
        return None
    assert fit is not None
    slope, error = fit
    t = headroom / slope
    return t, t * error / slope
