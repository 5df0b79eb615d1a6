"""How many samples a percentile claim needs: pure, shared by the checker and the judge.

`min_samples_for_percentile(q, confidence)` is the smallest n with ``(q/100)**n <= 1 - c``
(MLPerf LoadGen's early-stopping argument; `soakspec.judge.stats` explains it and re-exports
this function, so `check` warning "needs 59 samples" and the judge asking for 59 are one rule),
and `min_samples_for_share(op, X, confidence)`, the same count for a share claim (`goodput(...)
>= X`, judged as the misses of the X-quantile); and `arrival_count_spread(mean, burstiness)`,
how far a random (Poisson or gamma) arrival count may stray from its mean -- check's W515 and
`plan`'s expected counts read it as one rule.
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


def share_quantile(op: str, threshold: float) -> float | None:
    """The quantile a share claim is judged as (`soakspec.judge.goodput.share`): `share >= X`
    claims the misses are at most the overages of the X-quantile (100 X), `share <= X` that the
    hits are at most those of the (1 - X)-quantile; None where any share holds (`>= 0%`,
    `<= 100%`) or the op is not an inequality. At most 100."""
    if op in (">", ">="):
        q = threshold * 100.0
    elif op in ("<", "<="):
        q = (1.0 - threshold) * 100.0
    else:
        return None
    return None if q <= 0 else min(q, 100.0)


def min_samples_for_share(op: str, threshold: float, confidence: float, min_samples: int = 1) -> int | None:
    """The fewest requests a share claim (`goodput(...) >= 99%`) can PASS over at `confidence`
    -- with no overage among them: `min_samples_for_percentile` of its `share_quantile`, and
    at least the gate's `min_samples`; None where no count is needed. Below it the judge's
    `share` is INCONCLUSIVE (or FAIL, when the misses are certain), never PASS: `check`'s
    W509 and the judge ask for one number."""
    q = share_quantile(op, threshold)
    if q is None:
        return None
    return max(min_samples_for_percentile(q, confidence), min_samples)


COUNT_SIGMAS = 3.0  # the spread of a random arrival count that bad (or good) luck still reaches


def arrival_count_sd(mean: float, burstiness: float = 1.0) -> float:
    """The standard deviation of the count of a seeded Poisson (burstiness 1) or gamma arrival
    process averaging `mean` arrivals: its variance is about mean / burstiness (a renewal
    process's count: its gaps' squared coefficient of variation, 1 / burstiness, times the mean)."""
    if mean < 0 or burstiness <= 0:
        raise ValueError(f"need mean >= 0 and burstiness > 0, got {mean!r}, {burstiness!r}")
    return math.sqrt(mean / burstiness)


def arrival_count_at_most(m: int, mean: float, burstiness: float = 1.0) -> float:
    """P(N <= m) for the arrivals N such a process puts in a span expecting `mean`: Poisson
    (summed in log space) for burstiness 1, else a normal of the gamma renewal count's variance
    (`arrival_count_sd`, continuity corrected). check's W509 asks it how likely a bucket of
    random arrivals falls short of a percentile's samples."""
    if m < 0:
        return 0.0
    if burstiness != 1.0:
        return 0.5 * math.erfc(-(m + 0.5 - mean) / (math.sqrt(2.0) * arrival_count_sd(mean, burstiness)))
    terms = [i * math.log(mean) - mean - math.lgamma(i + 1) for i in range(m + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in terms))


def arrival_count_spread(mean: float, burstiness: float = 1.0) -> float:
    """COUNT_SIGMAS standard deviations of the count of a seeded Poisson (burstiness 1) or gamma
    arrival process averaging `mean` arrivals (`arrival_count_sd`).
    One rule for "clearly" in both directions: check's W515 calls a `requests_per_level` short only
    where it lies more than this above the mean (a count that luck could reach is not short),
    `plan` promises N only where the mean lies more than this above it, and prints a timed level's
    expected count with the range this gives ("~600 (± 3 sd: 527-673)")."""
    return COUNT_SIGMAS * arrival_count_sd(mean, burstiness)


__all__ = ["COUNT_SIGMAS", "arrival_count_at_most", "arrival_count_sd", "arrival_count_spread", "min_samples_for_percentile", "min_samples_for_share", "share_quantile"]
