"""The statistics of `soakspec compare`, pure numerics: a sample held sorted (`Sorted`), the
bootstrap of a percentile's change, Fieller's interval of a ratio of means, Newcombe's of a
difference of shares, the family-wise confidence and the draws it needs, and the design effects
of values that are not independent draws. Nothing here knows evidence, levels or the judge's
metrics: what is sampled is `soakspec.compare.samples`, how a row uses these is
`soakspec.compare.rows`.

Resamples. A row's interval is the (1 - confidence) / (2m) and 1 - (1 - confidence) / (2m)
percentiles of its draws (m rows, Bonferroni): with 56 rows at 95 % that is the 0.045 % tail,
which 100 draws do not reach at all -- the interval is then the draws' extremes, noise, and two
runs of one configuration read "regression" on a row far more often than 5 % of the time. So
the draws per side are at least `min_resamples(m, confidence)` = MIN_TAIL_DRAWS / tail (10 draws
beyond each end; 6 000 for 15 rows, 22 400 for 56 at 95 %): the default (DEFAULT_RESAMPLES) is
raised to it silently (the method line says how many), an explicit smaller count is raised
with a note (`Comparison.resamples_requested`; the command says so on stderr). The percentile
rows cost two Beta variates a draw whatever the sample size.

Why a bootstrap and how it stays cheap. An exact rank method gives a distribution-free interval
for ONE percentile (order statistics and the binomial), but there is no exact interval for the
difference of two runs' percentiles, and combining two one-sample intervals is badly
conservative. The bootstrap of the difference is the standard answer. Resampling a soak's
100 000 samples thousands of times would be slow in pure Python, so the percentile rows use the
*exact* bootstrap distribution of an order statistic instead of materialised resamples: the
k-th smallest of n draws from the empirical distribution is `x[floor(n * U)]` with
`U ~ Beta(k, n + 1 - k)` (the k-th of n uniforms), and the next order statistic, given that
one, is `U + (1 - U) * Beta(1, n - k)`. One draw of the interpolated percentile therefore costs
two Beta variates whatever n is, and is distributed exactly as the percentile of a full
bootstrap resample.

Means. A level's qps and throughput are a mean over its buckets -- often 4 to 10 values -- and
are not bootstrapped: a resample of 4 values cannot reach a t distribution's tails, and at a
15-row comparison's 0.17 % tail the bootstrap called two runs of one configuration changed on
a throughput row 7.0 % of the time with 4 buckets (2.3 % with 6; 0.33 % allowed). Their
interval is Fieller's for the ratio of two independent means (`mean_ratio_interval`), with
Student's t at the Welch-Satterthwaite degrees of freedom: no resampling, and the same Monte
Carlo calls a change 0.3 % (4 buckets), 0.2 % (6), 0.3 % (10) of the time. A base mean not
distinguishable from 0 at the row's confidence has no bounded ratio: insufficient samples.
Buckets are treated as independent; a level whose throughput drifts over time breaks that.

Binned gaps. A long soak of a real server counts its gaps in bins (judge/gapbins.py: a cell of
more than a few thousand distinct gaps keeps each gap's top 10 bits, bins at most 0.2 % of a
gap wide), so a percentile of its itl is known within a bin, and the figures are bin midpoints.
Bootstrapped from midpoints alone, a true change smaller than a bin would read as 0 or as a
whole bin -- and at millions of requests a side the interval is narrow enough that a p99 on
either side of a bin's edge can read as a 0.2 % "regression" of two identical runs. So where a
side is binned, each draw's percentile is taken as the least and the greatest its bins allow
(the same resamples: the same Beta variates), each draw's change as the least and the greatest
new / base - 1 those allow, and the interval runs from the alpha/2 percentile of the least to
the 1 - alpha/2 percentile of the greatest: it holds the interval the gaps themselves would
give, wider by about a bin at most. The row's note says so. Exact sides (a short run, a
simulator's few distinct gaps) are untouched.

Confidence. `confidence` (default 95 %) is family-wise over the comparison: with m rows, each
row's interval is a (1 - (1 - confidence) / m) interval (Bonferroni, `family_confidence`: the
family, and why intervals rather than Holm's step-down, are said there), so "no significant
change" on a whole comparison of identical configurations is wrong at most 1 - confidence of the
time, not once per row. Rules, the built-in errors FAIL and lint-claims --compare use the same
intervals; the method line and JSON (`method.family_rows`) name m.

Independence. The requests of a level are treated as independent draws. The inter-token gaps
of one request are not (they share its batch, its position in the queue), so itl's interval is
an m-out-of-n bootstrap: resamples as large as the number of requests, not of gaps (the same
Beta draws with n = requests), and its sample-size rule counts requests -- Kish's effective
number of them, (sum of gaps)^2 / sum of each request's gaps squared (`stats.effective_units`),
which is the requests when they are of one length and fewer when they are not: a request of
1000 gaps among requests of 16 holds most of the gaps, and the pooled percentile moves with
the few long requests. Counted as plain requests, two runs of one configuration (nine in ten
requests of 16 gaps, one in ten of 1000) read a p50(itl) change 23 % of the time where the
row allows 0.33 %; lengths from a geometric distribution (mean 100): 1.8 %, and 0.1 % counted
effectively. The row's n is that effective number; its note names the requests and gaps.

Nor are requests close in time independent of each other: slow requests come in runs (a busy
host, a batch that stalls, a first bucket slower than the rest). Six runs of one configuration
on the simulator, compared pairwise, read a "significant" p95/p99 TTFT change in 8 of 15 pairs
where the family allows 5 %: 36-68 % of the slowest 5 % started within 50 ms of another slow
one (about 15 % if placed at random). A percentile row of ttft, tpot or latency therefore
resamples n / d values a side (the m-out-of-n bootstrap above), d the level's design effect at
that quantile (`DesignEffects`): the variance of the share of its values at or below the
quantile, estimated from the means of up to DEFF_BATCHES batches of consecutive requests in
start order (batch means, as an MCMC chain's effective size is found), over the p (1 - p) / n of
independent draws; 1 for independent requests, about k where they come in runs of k, never
below 1. It is estimated on a grid of quantiles (DEFF_GRID; between two, the larger), from
batches of at least DEFF_MIN_BATCH requests that hold DEFF_MIN_EVENTS values beyond the quantile
each on average; a tail too thin for five such batches takes the nearest quantile towards the
median that has them (p99 of 2000 requests: p95's). The sample-size rule (`need`) and the row's
n stay the requests; the note names the effective numbers and the effect. Measured with an AR(1)
process in start order (coefficient 0.9, 2000 requests a side, p50/p95/p99 at a 15-row family's
95 %: tests/test_compare_clustered.py): counted as independent, 35 of 120 rows read a change that
is not there; with the design effect, none (at coefficient 0.99, runs longer than its batches
resolve: 86 -> 14); a 10 % slowdown is still found in 59 of 60 rows; independent requests'
intervals are 2 % wider (the estimate's noise, never below 1). itl keeps Kish's effective
requests above (its gaps are resampled as requests already). qps and throughput are means over
buckets (Fieller, "Means"). Failures come in bursts, too: a server hiccup fails 50 consecutive
requests, and counted as 50 independent trials such a burst read as a significant change
(one burst in the base run and three in the new, 2.5 % against 6.5 % of 2000 requests, FAILed
the comparison). So errors' Newcombe interval counts k / d failures of n / d trials a side, d
the design effect of the level's 0/1 outcomes (did not complete) in start order, estimated by
the same batch means (`batch_effect`: the share's variance from up to DEFF_BATCHES batches of
consecutive requests, over p (1 - p) / n; never below 1; 1 where the failures are too few for
DEFF_MIN_BATCHES batches to hold DEFF_MIN_EVENTS each -- a side with none has no bursts to see).
A burst of b failures makes d about b: that pair now reads no significant change (2000 requests
worth about 40 independent ones), while a doubling of independent failures (5 % to 10 %) and
one burst of 50 where the base run had none are still regressions (tests/test_compare_clustered.py).
The row's n stays the requests; its note names the effective numbers and the effect. What no interval
within a run can see is run-to-run variation (another load on the machine, a warmer cache):
two runs of one configuration on a busy host can differ for real. A rule's threshold
(`regression <= 5%`) is where a reviewer says how much change matters.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
import random
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any, ClassVar

import numpy as np

from soakspec.judge import stats


DEFAULT_RESAMPLES = 4000
MIN_RESAMPLES = 100
MIN_TAIL_DRAWS = 10  # bootstrap draws beyond each end of a row's interval, at the least (module doc, "Resamples")


# requests close in time are not independent draws (module doc, "Independence"): a percentile
# row's interval counts n / design effect samples, the effect estimated from up to DEFF_BATCHES
# batches of the level's values in the order their requests started (each of DEFF_MIN_BATCH values
# and DEFF_MIN_EVENTS on the rarer side of the quantile on average, at the least; with fewer than
# DEFF_MIN_BATCHES such batches, no estimate there), at each quantile of DEFF_GRID
DEFF_BATCHES = 20
DEFF_MIN_BATCH = 10
DEFF_MIN_BATCHES = 5
DEFF_MIN_EVENTS = 5  # values beyond the quantile a batch holds on average, at the least
DEFF_CUT_SAMPLE = 100_000
DEFF_GRID = (1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9)


class Sorted:
    """A sample in ascending order, held compactly (compare/samples.py, "Samples"): `n`, `at(j)` the
    j-th smallest (0-based), `take(js)` those of an index array, `percentile(q)` type 7.

    Two forms of one thing: `Sorted.of(xs)` keeps a sorted float64 array (per-request metrics,
    one value per request); `Sorted.counted(c)` keeps a `stats.Counted`'s distinct values and
    their cumulative counts (itl: O(distinct gaps), whatever the number of gaps), where the
    j-th smallest is the first value whose cumulative count exceeds j."""

    __slots__ = ("values", "cum", "n", "_counted", "_quanta")

    def __init__(self, values: np.ndarray, cum: np.ndarray | None, counted: stats.Counted | None = None,
                 quanta: tuple[float, int] | None = None) -> None:
        self.values = values
        self.cum = cum  # None: `values` is the sample itself
        self.n = len(values) if cum is None else (int(cum[-1]) if len(cum) else 0)
        self._counted = counted
        self._quanta = quanta  # (k0, e): `values` are uint32 offsets d, the sample's values (k0 + d) * 2**e (`compact`)

    @classmethod
    def of(cls, xs: Any, *, consume: bool = False) -> Sorted:
        """`xs` (any order) as a sorted float64 array. `consume`: the caller gives `xs` up, so
        a float64 array that owns its data is sorted in place -- no second array the length of a
        level's requests (a day-long level's ttft: 80 MB a side at 10^7); a view (of a table's
        column, say) or anything else is sorted as a copy."""
        if consume and stats.own_array(xs) and xs.dtype == np.float64:
            xs.sort()
            return cls(xs, None)
        return cls(np.sort(np.asarray(xs, dtype=np.float64)), None)

    @classmethod
    def counted(cls, c: stats.Counted) -> Sorted:
        return cls(c.values, c.cum, c)

    def compact(self) -> Sorted:
        """The same sample in 4 bytes a value where that is exact, else itself: a sorted float64
        sample whose values are all whole multiples k of one power of two 2**e, within 2**32
        multiples of the least (a run's times are differences of epoch seconds, multiples of
        2**-22: ttft, tpot and latency of a day-long run within 1024 s of their least), held as
        uint32 offsets from it. Read back as (k0 + d) * 2**e: a whole number below 2**53 scaled
        by a power of two, the very float64 it was -- checked value by value (bits compared)
        before the float64 array is let go. What compare holds of the base run (its samples,
        read up front: 24 -> 12 bytes a request)."""
        v = self.values
        if self.cum is not None or self._quanta is not None or not len(v) or v.dtype != np.float64:
            return self
        q = _quanta_of(v)
        if q is None:
            return self
        k0, e = q
        d = np.empty(len(v), dtype=np.uint32)
        for a in range(0, len(v), _QUANTA_CHUNK):
            part = v[a:a + _QUANTA_CHUNK]
            off = np.ldexp(part, -e) - k0
            d[a:a + _QUANTA_CHUNK] = off
            back = np.ldexp(d[a:a + _QUANTA_CHUNK].astype(np.float64) + k0, e)
            if not np.array_equal(back.view(np.uint64), part.view(np.uint64)):
                return self
        return Sorted(d, None, None, (k0, e))

    def __len__(self) -> int:
        return self.n

    def take(self, js: np.ndarray) -> np.ndarray:
        """The js-th smallest values (0-based indexes, 0 <= j < n), float64."""
        if self._quanta is not None:
            k0, e = self._quanta
            return np.ldexp(self.values[js].astype(np.float64) + k0, e)
        if self.cum is None:
            return self.values[js]
        return self.values[np.searchsorted(self.cum, js, side="right")]

    def at(self, j: int) -> float:
        return float(self.take(np.asarray([j], dtype=np.int64))[0])

    @property
    def binned(self) -> bool:
        """Whether the values are bins (a real server's gaps, judge/gapbins.py): the j-th
        smallest is then known only within its bin (`take_bounds`)."""
        return self._counted is not None and not self._counted.exact

    def take_bounds(self, js: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The least and greatest the js-th smallest values can be: a bin's first and last
        value; both `take(js)` where the sample is held exactly."""
        if not self.binned:
            v = self.take(js)
            return v, v
        assert self._counted is not None and self._counted.bins is not None and self.cum is not None
        i = np.searchsorted(self.cum, js, side="right")
        return self._counted.bins.lo[i], self._counted.bins.hi[i]

    def percentile(self, q: float) -> float | None:
        """`stats.percentile` of the sample (type 7), None when it is empty."""
        if self._counted is not None:
            return self._counted.percentile(q)
        if self._quanta is not None:
            return stats.percentile_of_sorted(self.n, q, self.at)
        return stats.percentile(self.values, q, presorted=True)


_QUANTA_CHUNK = 1 << 16  # values `Sorted.compact` converts and checks at a time


def _quanta_of(v: np.ndarray) -> tuple[float, int] | None:
    """(k0, e) such that every value of the sorted float64 `v` is (k0 + d) * 2**e for a whole
    d in [0, 2**32), k0 = v[0] / 2**e; None where there is none (a NaN or an infinity, a -0.0,
    values finer than their range allows). e is the coarsest power of two all the values are
    multiples of: each value's, a chunk at a time, from its mantissa's lowest set bit."""
    if not (np.isfinite(v[0]) and np.isfinite(v[-1])):
        return None
    e: int | None = None
    for a in range(0, len(v), _QUANTA_CHUNK):
        part = v[a:a + _QUANTA_CHUNK]
        if np.any(np.signbit(part) & (part == 0)):
            return None  # -0.0 would read back as 0.0
        part = part[part != 0]
        if not len(part):
            continue
        f, x = np.frexp(part)
        m = np.ldexp(f, 53).astype(np.int64)  # the mantissa as a whole number (53 bits, exact)
        low = np.frexp((m & -m).astype(np.float64))[1] - 1  # its lowest set bit's position
        least = int(np.min(x.astype(np.int64) - 53 + low))
        e = least if e is None else min(e, least)
    if e is None:  # every value 0
        e = 0
    with np.errstate(over="ignore"):  # values too wide for their finest quantum: inf, refused below
        k0, top = float(np.ldexp(v[0], -e)), float(np.ldexp(v[-1], -e))
    if not (math.isfinite(k0) and math.isfinite(top)) or abs(k0) >= 2.0 ** 53 or abs(top) >= 2.0 ** 53:
        return None
    if top - k0 >= 2.0 ** 32:
        return None
    return k0, e


def _beta(rng: random.Random, a: float, b: float) -> float:
    return rng.betavariate(a, b) if b > 0 else 1.0 - 1e-12


def _draw_ranks(n: int, big: int, q: float, rng: random.Random, draws: int) -> tuple[np.ndarray, np.ndarray | None, float]:
    """For `draws` bootstrap resamples of size n from a sample of `big`: the sample indexes of
    the two order statistics the type-7 q-th percentile interpolates between (the second None
    when it needs one), and the interpolation's fraction (module doc: Beta variates)."""
    h = (n - 1) * q / 100.0
    lo = min(int(math.floor(h)), n - 1)
    frac = h - lo
    k = lo + 1  # the 1-based order statistic below h
    second = frac > 0 and k < n
    u1s = np.empty(draws, dtype=np.float64)
    u2s = np.empty(draws if second else 0, dtype=np.float64)
    for i in range(draws):
        u1 = _beta(rng, k, n + 1 - k)
        u1s[i] = u1
        if second:
            u2s[i] = u1 + (1.0 - u1) * _beta(rng, 1, n - k)
    ja = np.minimum(big - 1, (u1s * big).astype(np.int64))
    jb = np.minimum(big - 1, (u2s * big).astype(np.int64)) if second else None
    return ja, jb, frac


def percentile_draws(xs: Sequence[float] | Sorted, q: float, rng: random.Random, draws: int,
                     size: int | None = None) -> list[float]:
    """`draws` values of the type-7 q-th percentile of a bootstrap resample of `xs` (sorted,
    or a `Sorted`), drawn from its exact distribution via the order statistics of uniforms
    (module doc). `size`: the resample's size when it is not len(xs) (an m-out-of-n bootstrap:
    itl's gaps resampled as if there were only as many as requests). The Beta variates are
    drawn one draw after the other (the rng's sequence is the figures' identity); only the
    look-ups into the sample are vectorised."""
    sample = xs if isinstance(xs, Sorted) else Sorted(np.asarray(xs, dtype=np.float64), None)
    big = sample.n
    n = big if size is None else max(1, min(size, big))
    if big == 1:
        return [sample.at(0)] * draws
    ja, jb, frac = _draw_ranks(n, big, q, rng, draws)
    a = sample.take(ja)
    if jb is None:
        return a.tolist()
    b = sample.take(jb)
    return (a + frac * (b - a)).tolist()


def percentile_draw_bounds(xs: Sorted, q: float, rng: random.Random, draws: int,
                           size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`percentile_draws` (the same rng sequence, so the same resamples) as the least and the
    greatest each draw's percentile can be: for binned values (`Sorted.binned`) each order
    statistic anywhere in its bin, and type-7 interpolation is increasing in both order
    statistics. Equal to `percentile_draws` for a sample held exactly."""
    big = xs.n
    n = big if size is None else max(1, min(size, big))
    if big == 1:
        lo1, hi1 = xs.take_bounds(np.zeros(draws, dtype=np.int64))
        return lo1, hi1
    ja, jb, frac = _draw_ranks(n, big, q, rng, draws)
    a_lo, a_hi = xs.take_bounds(ja)
    if jb is None:
        return a_lo, a_hi
    b_lo, b_hi = xs.take_bounds(jb)
    lo, hi = a_lo + frac * (b_lo - a_lo), a_hi + frac * (b_hi - a_hi)
    if not xs.binned:
        return lo, hi
    wide = (a_hi > a_lo) | (b_hi > b_lo)  # rounded interpolation is not monotone by an ulp or two: widened as `Counted.percentile_bounds` is
    return (np.where(wide, lo - stats.INTERPOLATION_ULPS * np.spacing(np.abs(lo)), lo),
            np.where(wide, hi + stats.INTERPOLATION_ULPS * np.spacing(np.abs(hi)), hi))


def mean_ratio_interval(xb: Sequence[float], xn: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """The interval of mean(xn) / mean(xb) - 1 (independent samples of a few values each: a
    level's buckets) at `confidence`: Fieller's interval of a ratio of two means, with Student's
    t at the Welch-Satterthwaite degrees of freedom of mean(xn) - R * mean(xb). None when the
    base's mean is not distinguishable from 0 at that confidence (the interval is unbounded).
    A bootstrap of 4 to 10 buckets cannot see t's tails: at a 15-row comparison's 0.17 % tail
    it called two runs of one configuration changed 5% of the time, not 0.33% (module doc)."""
    kb, kn = len(xb), len(xn)
    if kb < 2 or kn < 2:  # no variance from one value: nothing to say the interval is
        return None
    mb, mn = math.fsum(xb) / kb, math.fsum(xn) / kn
    if mb <= 0 or not math.isfinite(mn / mb):  # a base so close to 0 that the ratio overflows
        return None
    vb = math.fsum((x - mb) ** 2 for x in xb) / (kb - 1) / kb  # the variance of each mean
    vn = math.fsum((x - mn) ** 2 for x in xn) / (kn - 1) / kn
    r = mn / mb
    var = vn + r * r * vb  # of mean(xn) - r * mean(xb)
    if var <= 0:
        return r - 1.0, r - 1.0
    df = var * var / (vn * vn / (kn - 1) + (r * r * vb) ** 2 / (kb - 1))
    t = stats.t_quantile(1.0 - (1.0 - confidence) / 2, df)
    g = t * t * vb / (mb * mb)
    if g >= 1:
        return None
    half = (t / mb) * math.sqrt(vn * (1 - g) + r * r * vb)
    low, high = (r - half) / (1 - g) - 1.0, (r + half) / (1 - g) - 1.0
    return (low, high) if math.isfinite(low) and math.isfinite(high) else None


def mean_draws(xs: Sequence[float], rng: random.Random, draws: int) -> list[float]:
    n = len(xs)
    return [math.fsum(xs[rng.randrange(n)] for _ in range(n)) / n for _ in range(draws)]


def _seed(seed: int, *parts: Any) -> int:
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return int.from_bytes(h[:8], "big")


def _relative(new: float, base: float) -> float | None:
    """new / base - 1; None where it is not a number: a base of 0, or one so close to 0 (a
    subnormal TTFT) that the ratio overflows to infinity -- JSON has no Infinity."""
    if not base > 0:
        return None
    v = new / base - 1.0
    return v if math.isfinite(v) else None


@dataclasses.dataclass(frozen=True)
class DesignEffects:
    """How far a level's per-request values, in time order, are from independent draws, at each
    quantile of DEFF_GRID (module doc, "Independence"): the variance of the share of values at or
    below the quantile, estimated from the means of batches of consecutive values, over what
    independent draws would give it -- 1 for independent requests, about k where slow requests
    come in runs of k. Never below 1: no interval is made narrower than independent draws'.
    None at a quantile too far in the tail for its batches to hold DEFF_MIN_EVENTS values beyond
    it each (a p99 of 400 requests: 4 values beyond it in all)."""

    qs: tuple[float, ...]
    effects: tuple[float | None, ...]

    NONE: ClassVar[DesignEffects]

    @classmethod
    def of(cls, values: np.ndarray) -> DesignEffects:
        """The effects of `values` in time order: a level's requests in the order they started
        (the judge's order of a level's rows)."""
        n = len(values)
        if n < DEFF_MIN_BATCHES * DEFF_MIN_BATCH:
            return cls.NONE
        effects: list[float | None] = []
        # the cuts from at most ~DEFF_CUT_SAMPLE values (every k-th): a cut need only be near its
        # quantile (the share below it is counted over all), and a day's level is not copied
        for cut in np.percentile(values[::max(1, n // DEFF_CUT_SAMPLE)], DEFF_GRID):
            effects.append(batch_effect(values <= cut))
        return cls(DEFF_GRID, tuple(effects))

    def at(self, q: float) -> float:
        """The effect at the q-th percentile: the grid's own where q is on it, else the larger
        of the two grid quantiles either side (the nearest end beyond the grid); where the tail
        holds too few values for an estimate, the nearest quantile towards the median that has
        one (no estimate anywhere: 1)."""
        if not self.qs:
            return 1.0
        i = bisect.bisect_left(self.qs, q)
        near = [i] if i < len(self.qs) and self.qs[i] == q else [j for j in (i - 1, i) if 0 <= j < len(self.qs)]
        got = []
        for j in near:
            step = 1 if self.qs[j] < 50.0 else -1
            while self.effects[j] is None and 0 <= j + step < len(self.qs) and (self.qs[j] - 50.0) * (self.qs[j + step] - 50.0) >= 0:
                j += step
            if self.effects[j] is not None:
                got.append(self.effects[j])
        return max(got, default=1.0)  # type: ignore[type-var]


DesignEffects.NONE = DesignEffects((), ())


def batch_effect(hits: np.ndarray) -> float | None:
    """The design effect of the share of True in `hits` (0/1 outcomes in the order their
    requests started): the variance of the share estimated from the means of up to DEFF_BATCHES
    batches of consecutive outcomes, over the p (1 - p) / n of independent draws; never below 1.
    None where the batches cannot tell: fewer than DEFF_MIN_BATCHES batches of DEFF_MIN_BATCH
    outcomes holding DEFF_MIN_EVENTS of the rarer outcome each on average. A percentile's
    (`DesignEffects`: the values at or below its quantile) and a proportion's (`errors`: the
    requests that did not complete) alike (module doc, "Independence")."""
    n = len(hits)
    hit = int(np.count_nonzero(hits))
    b = min(DEFF_BATCHES, n // DEFF_MIN_BATCH, min(hit, n - hit) // DEFF_MIN_EVENTS)
    if b < DEFF_MIN_BATCHES:  # too few outcomes either side for batches to tell
        return None
    p = hit / n
    starts = (np.arange(b, dtype=np.int64) * n) // b
    ends = np.append(starts[1:], n)
    sizes = (ends - starts).astype(np.float64)
    # each batch's hits counted where they lie: `hits.astype(float64)` summed by reduceat made a
    # float64 copy of a whole level's outcomes (8 bytes a request: compare's peak, at the first
    # level's design effects, beside the other run's samples); whole counts below 2**53, so the
    # same float64 values whatever the order they are summed in
    k = np.array([np.count_nonzero(hits[s:e]) for s, e in zip(starts.tolist(), ends.tolist())], dtype=np.float64)
    # Var(share) from the batches (a ratio estimator, b - 1 degrees of freedom) over the
    # p (1 - p) / n of independent draws
    d = b / (b - 1) * float(np.sum((k - p * sizes) ** 2)) / (n * p * (1.0 - p))
    return max(1.0, d)


def effective(n: int, effect: float) -> int:
    """`n` values of design effect `effect` as a number of independent draws."""
    return max(1, int(n / effect)) if effect > 1.0 else n


def _binned_interval(xb: Sorted, xn: Sorted, q: float, rng: random.Random, draws: int, sizes: tuple[int, int],
                     alpha: float) -> tuple[float, float] | None:
    """The bootstrap interval of new / base - 1 where a side's gaps are binned: each draw's
    percentile is known only within [least, greatest] (`percentile_draw_bounds`), so its change
    within [new least / base greatest - 1, new greatest / base least - 1]. The interval's low end
    is the alpha/2 percentile of the draws' least changes, its high end the 1 - alpha/2
    percentile of their greatest: it holds the interval the gaps themselves would give (the
    same resamples, each change within its bounds). None when a base draw can be 0 too often
    (no relative change)."""
    b_lo, b_hi = percentile_draw_bounds(xb, q, rng, draws, sizes[0])
    n_lo, n_hi = percentile_draw_bounds(xn, q, rng, draws, sizes[1])
    ok = b_lo > 0
    if int(ok.sum()) < draws * (1 - alpha / 2):
        return None
    least, most = n_lo[ok] / b_hi[ok] - 1.0, n_hi[ok] / b_lo[ok] - 1.0
    low, high = stats.percentile(least, 100 * alpha / 2), stats.percentile(most, 100 * (1 - alpha / 2))
    assert low is not None and high is not None
    return low, high


def wilson(k: float, n: float, z: float) -> tuple[float, float]:
    """The Wilson score interval of the proportion k / n (n > 0) at normal quantile z."""
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def proportion_difference(kb: float, nb: float, kn: float, nn: float, confidence: float) -> tuple[float, float, float]:
    """(kn/nn - kb/nb, low, high): the difference of two independent proportions with Newcombe's
    hybrid score interval (Newcombe 1998, method 10: each side's Wilson interval, combined).
    Unlike the normal (Wald) interval it holds its coverage at shares of 0 and 1 -- the usual
    case for errors -- and needs no resampling. Counts may be fractional: k / d of n / d trials,
    a share's effective size where its trials are not independent (design effect d)."""
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2)
    pb, pn = kb / nb, kn / nn
    lb, ub = wilson(kb, nb, z)
    ln, un = wilson(kn, nn, z)
    d = pn - pb
    return d, d - math.sqrt((pn - ln) ** 2 + (ub - pb) ** 2), d + math.sqrt((un - pn) ** 2 + (pb - lb) ** 2)


def family_confidence(confidence: float, rows: int) -> float:
    """Each row's confidence in a comparison of `rows` rows at family-wise `confidence`:
    1 - (1 - confidence) / rows (Bonferroni; module doc, "Confidence").

    The family is every row of one `compare` invocation: each metric x statistic x matched
    level (and turn) x backend pair, a rule's extra percentile included; unpaired levels have
    no rows and do not count. Widening every row's interval to this confidence makes the
    intervals simultaneous: the chance that ANY of them misses its true change -- so that two
    runs of one configuration read "significant" anywhere -- is at most 1 - confidence, however
    the rows depend on each other (a level's p50/p95/p99 move together; Bonferroni needs no
    model of that). Why intervals and not Holm's step-down over p-values: every consumer reads
    an interval, not a yes/no against 0 -- a rule checks its ends against a threshold
    (`regression <= 5%`), lint-claims checks a claimed size against it (CB502) -- and Holm gives
    decisions, not intervals to match them (its compatible intervals, Strassburger & Bretz 2008,
    end at 0 for every rejected row). Holm would reject more only where several rows changed for
    real, where one significant row already shows the change; whether a comparison of two runs
    of one configuration reads changed anywhere is the same under both (Holm's first step is
    Bonferroni's test of the smallest p-value, and it stops there when that fails). Each row
    shows its interval at this confidence and no separate "raw" 95 % one: a raw interval's
    verdict is the one the correction exists to discard. Monotone: a row significant at a confidence is significant at
    every lower one (its intervals are nested: the same draws, wider quantiles), so the
    corrected verdicts are a subset of uncorrected ones (tests/test_compare_family.py)."""
    return 1.0 - (1.0 - confidence) / max(1, rows)


def min_resamples(rows: int, confidence: float) -> int:
    """The fewest bootstrap draws per side that leave MIN_TAIL_DRAWS beyond each end of every
    row's interval (module doc, "Resamples"): with `rows` rows each tail is (1 - confidence) /
    (2 * rows) of the draws."""
    tail = (1.0 - confidence) / (2 * max(1, rows))
    return max(MIN_RESAMPLES, math.ceil(MIN_TAIL_DRAWS / tail - 1e-6))
