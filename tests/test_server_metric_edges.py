"""Server metrics at the edges of the Prometheus text format: a histogram quantile that is
Prometheus' own (`histogram_quantile`, checked against a reference written here from its
rules), and gauge samples of +Inf, -Inf and NaN (all legal in the exposition) read, judged
and reported honestly -- never a silent pass, never a crash."""

from __future__ import annotations

import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from soakspec.judge.servermetrics import quantile_estimate

# ---------------------------------------------------------------------- histogram_quantile


def reference_histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' `bucketQuantile` (promql/quantile.go) restated from its documented rules:
    q in [0, 1], buckets (upper bound, cumulative count) with +Inf as math.inf; NaN for no
    figure. Sorted by bound; NaN without a +Inf bucket; counts within 1e-12 (relative) of the
    previous one made equal to it, then made monotonic; NaN with fewer than two buckets or no
    observations; the rank q * count(+Inf) found by binary search among the finite buckets; in
    the +Inf bucket the second-highest bound; in a lowest bucket bounded at or below 0 its
    bound; else linear within the bucket, from 0 in the lowest one."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bs = sorted(buckets, key=lambda b: b[0])
    if not bs or bs[-1][0] != math.inf:
        return math.nan
    merged: list[list[float]] = []
    for le, n in bs:
        if merged and merged[-1][0] == le:
            merged[-1][1] += n
        else:
            merged.append([le, n])
    prev = merged[0][1]
    for b in merged[1:]:
        delta = abs(b[1] - prev)
        if delta == 0:
            continue
        if (delta / b[1] if b[1] else math.inf) <= 1e-12:
            b[1] = prev
        else:
            prev = b[1]
    top = merged[0][1]
    for b in merged[1:]:
        top = b[1] = max(top, b[1])
    if len(merged) < 2:
        return math.nan
    total = merged[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    lo, hi = 0, len(merged) - 1  # sort.Search over the finite buckets
    while lo < hi:
        mid = (lo + hi) // 2
        if merged[mid][1] >= rank:
            hi = mid
        else:
            lo = mid + 1
    b = lo
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, count = 0.0, merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    if count == 0:
        return math.nan  # Go's 0/0
    return start + (merged[b][0] - start) * (rank / count)


def _ours(p: str, buckets: list[tuple[float, float]]) -> float:
    v, _ = quantile_estimate(float(p), [(None if le == math.inf else le, n) for le, n in buckets])
    return math.nan if v is None else v


@st.composite
def histograms(draw, monotone: bool = False):
    """Cumulative bucket counts of a histogram as a server exposes them after a Δ: distinct
    bounds (some at or below 0 now and then), usually a +Inf bucket, counts usually monotone --
    and, where not `monotone`, now and then not (a broken exposition, a reset seen per bucket)."""
    les = sorted(draw(st.sets(st.sampled_from([-1.0, 0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0]),
                              min_size=0, max_size=8)))
    if monotone or draw(st.booleans()) or draw(st.booleans()):
        les = [le for le in les if le > 0] + [math.inf]
    per = draw(st.lists(st.integers(0, 50), min_size=len(les), max_size=len(les)))
    cum, acc = [], 0.0
    for k in per:
        acc += k
        cum.append(acc)
    if not monotone and cum and draw(st.booleans()):
        i = draw(st.integers(0, len(cum) - 1))
        cum[i] = float(draw(st.integers(0, 60)))
    return list(zip(les, cum))


# a rule's pNN as written, and the fraction a PromQL query writes for it
PERCENTILES = {"0": 0.0, "1": 0.01, "25": 0.25, "50": 0.5, "90": 0.9, "95": 0.95, "99": 0.99, "99.9": 0.999, "99.99": 0.9999, "100": 1.0}
QS = st.sampled_from(sorted(PERCENTILES, key=float))


@settings(max_examples=500, deadline=None)
@given(histograms(), QS, QS)
@example([(0.1, 4.0), (0.25, 2.0), (0.5, 10.0), (math.inf, 10.0)], "50", "90")  # counts falling: made monotonic
@example([(0.1, 4.0), (0.5, 10.0)], "50", "90")  # no +Inf bucket: NaN
@example([(math.inf, 10.0)], "50", "90")  # +Inf alone: NaN
@example([(-1.0, 3.0), (0.5, 10.0), (math.inf, 10.0)], "1", "90")  # lowest bucket bounded below 0: its bound
@example([(0.1, 0.0), (0.5, 10.0), (math.inf, 10.0)], "0", "90")  # p0 in an empty lowest bucket: NaN
@example([(0.05, 1.0), (0.1, 2.0), (math.inf, 2.0)], "99.9", "100")  # 99.9 / 100 is not 0.999
def test_a_histogram_quantile_is_prometheus_histogram_quantile(buckets, q1, q2):
    """For the same bucket counts, soakspec's quantile is the number histogram_quantile gives
    (and Grafana shows), NaN -- no figure -- exactly where it gives NaN; each lies within the
    bounds of the bucket it is said to fall in; and a higher q never gives a lower one."""
    theirs = [(None if le == math.inf else le, n) for le, n in buckets]
    got = []
    for p in sorted((q1, q2), key=float):
        want, v = reference_histogram_quantile(PERCENTILES[p], buckets), _ours(p, buckets)
        assert (math.isnan(want) and math.isnan(v)) or v == want, (p, want, v)
        est, (lo, hi) = quantile_estimate(float(p), theirs)
        if est is not None:
            assert lo <= est and (hi is None or est <= hi), (est, lo, hi)
            got.append(est)
    assert got == sorted(got)
