"""How many samples a percentile claim needs: pure, shared by the checker and the judge.

`min_samples_for_percentile(q, confidence)` is the smallest n with ``(q/100)**n <= 1 - c``
(MLPerf LoadGen's early-stopping argument; `soakspec.judge.stats` explains it and re-exports
this function, so `check` warning "needs 59 samples" and the judge asking for 59 are one rule).
It lives here, at the bottom of the pipeline, because `soakspec.lang` imports nothing above it.
"""

from __future__ import annotations

import math


def _check(q: float, confidence: float) -> None:
    if not 0 < q <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {q!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def min_samples_for_percentile(q: float, confidence: float) -> int:
    """The smallest n with ``(q/100)**n <= 1 - confidence``: below it, no claim that the q-th
    percentile lies at or below any observed value holds at `confidence`.

    p100 is the observed maximum, a statistic of the sample and not an estimate: 1.
    """
    _check(q, confidence)
    if q >= 100:
        return 1
    p = q / 100.0
    alpha = 1.0 - confidence
    n = max(1, math.ceil(math.log(alpha) / math.log(p) - 1e-12))
    # settle floating-point doubt at the boundary with the defining inequality itself
    while n > 1 and p ** (n - 1) <= alpha:
        n -= 1
    while p**n > alpha:
        n += 1
    return n


__all__ = ["min_samples_for_percentile"]
