"""soakspec.judge.stats: the one percentile function and the sample-size test."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from soakspec.judge import stats

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
samples = st.lists(finite, min_size=1, max_size=60)
qs = st.floats(min_value=0, max_value=100, allow_nan=False)


def reference_percentile(values, q):
    """Hyndman-Fan type 7 in exact rational arithmetic."""
    xs = sorted(Fraction(v) for v in values)
    h = (len(xs) - 1) * Fraction(q) / 100
    lo = math.floor(h)
    if lo >= len(xs) - 1:
        return xs[-1]
    return xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


def test_known_values():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert stats.percentile(xs, 0) == 1.0
    assert stats.percentile(xs, 100) == 4.0
    assert stats.percentile(xs, 50) == 2.5
    assert stats.percentile(xs, 25) == 1.75  # numpy.percentile([1,2,3,4], 25) == 1.75
    assert stats.percentile([10, 20], 95) == pytest.approx(19.5)
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([], 50) is None
    assert stats.mean([]) is None
    assert stats.mean([1, 2, 3, 4]) == 2.5


@pytest.mark.parametrize("q", [-1, 100.5, float("nan")])
def test_percentile_rejects_bad_q(q):
    with pytest.raises(ValueError):
        stats.percentile([1.0], q)


@given(samples, qs)
def test_matches_exact_reference(values, q):
    """percentile() equals type-7 interpolation computed exactly, to float rounding."""
    got = stats.percentile(values, q)
    want = float(reference_percentile(values, q))
    assert got == pytest.approx(want, rel=1e-9, abs=1e-6)


@given(samples, st.lists(qs, min_size=1, max_size=4))
def test_reordering_in_place_gives_the_same_percentiles(values, qs_):
    """`reorder=True` (the judge's own arrays) partitions the caller's array instead of a copy:
    the same value as the copy gives, one percentile after another on the same array, and the
    array still holds the same values."""
    import numpy as np

    arr = np.array(values, dtype=np.float64)
    for q in qs_:
        assert stats.percentile(arr, q, reorder=True) == stats.percentile(np.array(values), q)
    assert sorted(arr.tolist()) == sorted(values)


@given(samples, st.lists(qs, min_size=1, max_size=4))
def test_a_sorted_samples_percentile_is_read_where_it_lies_bit_for_bit(values, qs_):
    """`presorted=True` (compare's samples, sorted once) reads the order statistics from the
    array as it is: bit for bit the value `percentile` gives for the values in any order, and
    the array is left as it was."""
    import numpy as np

    arr = np.sort(np.array(values, dtype=np.float64))
    before = arr.copy()
    for q in qs_:
        assert stats.percentile(arr, q, presorted=True) == stats.percentile(np.array(values[::-1]), q)
    assert np.array_equal(arr, before)


@given(st.lists(finite, min_size=2, max_size=60), st.integers(min_value=1, max_value=99))
def test_matches_statistics_quantiles(values, q):
    """statistics.quantiles(method='inclusive') is the same method (cut points at whole percents)."""
    assume(len(set(values)) > 1)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    assert stats.percentile(values, q) == pytest.approx(cuts[q - 1], rel=1e-9, abs=1e-6)


@given(samples, qs, qs)
def test_monotone_in_q(values, q1, q2):
    """A higher percentile is never below a lower one."""
    lo, hi = sorted((q1, q2))
    assert stats.percentile(values, lo) <= stats.percentile(values, hi)


@given(samples, qs, st.randoms())
def test_order_invariant(values, q, rnd):
    """Shuffling the samples never changes a percentile or the mean."""
    shuffled = list(values)
    rnd.shuffle(shuffled)
    assert stats.percentile(shuffled, q) == stats.percentile(values, q)
    assert stats.mean(shuffled) == stats.mean(values)


@given(samples, qs)
def test_within_range(values, q):
    assert min(values) <= stats.percentile(values, q) <= max(values)


# ---------------------------------------------------------------- sample sizes


@pytest.mark.parametrize(
    ("q", "confidence", "n"),
    [(50, 0.95, 5), (90, 0.95, 29), (95, 0.95, 59), (99, 0.95, 299), (99, 0.99, 459), (99.9, 0.95, 2995), (50, 0.75, 2), (100, 0.95, 1)],
)
def test_min_samples_known(q, confidence, n):
    assert stats.min_samples_for_percentile(q, confidence) == n


@given(st.floats(min_value=1, max_value=99.9), st.floats(min_value=0.5, max_value=0.999))
def test_min_samples_is_the_smallest(q, c):
    """(q/100)^n <= 1-c holds at n and fails at n-1."""
    n = stats.min_samples_for_percentile(q, c)
    p = q / 100
    assert p**n <= 1 - c
    assert n == 1 or p ** (n - 1) > 1 - c


@given(st.floats(min_value=1, max_value=99), st.floats(min_value=1, max_value=99), st.floats(min_value=0.5, max_value=0.99))
def test_min_samples_monotone_in_q(q1, q2, c):
    lo, hi = sorted((q1, q2))
    assert stats.min_samples_for_percentile(lo, c) <= stats.min_samples_for_percentile(hi, c)


def test_samples_needed():
    assert stats.samples_needed(0, 99, 0.95) == 299
    assert stats.samples_needed(112, 99, 0.95) == 187
    assert stats.samples_needed(299, 99, 0.95) == 0
    assert stats.samples_needed(1000, 99, 0.95) == 0
    # the checker's 95% is 0.9500000000000001: the same answer
    assert stats.samples_needed(0, 95, 95 * 0.01) == 59


def test_binomial_cdf_matches_brute_force():
    for n in (1, 5, 20):
        for p in (0.01, 0.3, 0.5):
            for k in range(-1, n + 1):
                want = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(0, k + 1))
                assert stats.binomial_cdf(k, n, p) == pytest.approx(want, abs=1e-12)


@settings(max_examples=50)
@given(st.integers(min_value=1, max_value=3000), st.sampled_from([50.0, 90.0, 95.0, 99.0]), st.sampled_from([0.9, 0.95, 0.99]))
def test_max_overages_consistent(n, q, c):
    """No overage allowance exactly when n is below the zero-overage minimum."""
    k = stats.max_overages(n, q, c)
    assert (k is None) == (n < stats.min_samples_for_percentile(q, c))
    if k is not None:
        assert stats.binomial_cdf(k, n, 1 - q / 100) <= 1 - c + 1e-12
        assert k + 1 >= n or stats.binomial_cdf(k + 1, n, 1 - q / 100) > 1 - c


# the q a share claim is judged at (`soakspec.lang.samples.share_quantile`): `<= X` gives
# (1 - X) * 100, e.g. 5.000000000000004 for 95%, whose n = 1 sits on the float boundary
_BOUNDARY_QS = sorted({x * 100.0 for x in (0.01, 0.05, 0.1, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999)}
                      | {(1.0 - x) * 100.0 for x in (0.5, 0.8, 0.9, 0.95, 0.99, 0.999)}
                      | {1.0, 5.0, 10.0, 50.0, 90.0, 95.0, 99.0})


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_BOUNDARY_QS), st.sampled_from([0.90, 0.95, 0.99, 90 * 0.01, 95 * 0.01, 99 * 0.01]))
def test_the_judge_allows_no_overage_exactly_from_the_checkers_count(q, c):
    """Property: at the count `min_samples_for_percentile` names (check's W509), the judge's
    `max_overages` allows 0 overages; one sample fewer, none (None) -- even where
    ``(q/100)**n == 1 - c`` up to rounding, as for `goodput(...) <= 95%` at 95% (n = 1)."""
    n = stats.min_samples_for_percentile(q, c)
    assert stats.max_overages(n, q, c) == 0
    if n > 1:
        assert stats.max_overages(n - 1, q, c) is None


def test_exceeds_with_confidence():
    # 10 of 50 above the threshold: the p99 is surely above it
    assert stats.exceeds_with_confidence(10, 50, 99, 0.95)
    # 1 of 50 above: a p99 at or below the threshold explains that easily
    assert not stats.exceeds_with_confidence(1, 50, 99, 0.95)
    assert not stats.exceeds_with_confidence(0, 50, 99, 0.95)
    assert stats.exceeds_with_confidence(1, 1, 100, 0.95)


finite = st.floats(allow_nan=False, allow_infinity=False)
few_values = st.lists(st.sampled_from([0.0, -0.0, 1.0, 1.5, -2.0, 5e-324, 1e300, -1e300]), min_size=1, max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(finite, min_size=1, max_size=200), few_values,
                 st.lists(st.floats(0.001, 100.0), min_size=1, max_size=200)),
       st.one_of(st.sampled_from([0.0, 50.0, 95.0, 99.0, 99.9, 100.0]), st.floats(0, 100)),
       st.integers(1, 40), st.sampled_from([0, 1, 2, 7, 1 << 18]), st.randoms(use_true_random=False))
def test_a_percentile_read_a_chunk_at_a_time_is_the_percentile_of_every_value(xs, q, size, gather, rnd):
    """`percentile_of_chunks` (a day's ttft or latency, never held at once) gives what
    `percentile` of every value gives, bit for bit, whatever the chunks, their order, ties,
    signs and spread, and however few values it may gather to select from."""
    import numpy as np

    rnd.shuffle(xs)
    v = np.asarray(xs, dtype=np.float64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stats, "SELECT_GATHER", gather)
        got, n = stats.percentile_of_chunks(lambda: (v[i:i + size] for i in range(0, len(v), size)), q)
    assert (got, n) == (stats.percentile(xs, q), len(xs))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(finite, min_size=1, max_size=200), few_values,
                 st.lists(st.floats(0.001, 100.0), min_size=1, max_size=200)),
       st.lists(st.one_of(st.sampled_from([0.0, 50.0, 95.0, 99.0, 100.0]), st.floats(0, 100)), min_size=1, max_size=5),
       st.integers(1, 40), st.sampled_from([0, 1, 7, 1 << 18]))
def test_percentiles_sharing_their_passes_are_each_the_percentile_of_every_value(xs, qs, size, gather):
    """Several percentiles read together (the report's p50, p95 and p99 of a day's ttft: their
    counting passes shared) give each what `percentile` gives alone, bit for bit -- equal
    percentiles, ones whose intervals part after the first pass, and ones that finish early."""
    import numpy as np

    v = np.asarray(xs, dtype=np.float64)

    def chunks():
        return (v[i:i + size] for i in range(0, len(v), size))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stats, "SELECT_GATHER", gather)
        got, n = stats.percentiles_of_chunks(chunks, qs)
        alone = [stats.percentile_of_chunks(chunks, q)[0] for q in qs]
    assert n == len(xs)
    assert got == [stats.percentile(xs, q) for q in qs] == alone


def test_the_reports_three_percentiles_of_a_days_values_read_them_as_often_as_one():
    """p50, p95 and p99 of 10^6 distinct values: their counting passes are shared (three and
    a gather, or fewer), not one search after another."""
    import numpy as np

    v = np.random.default_rng(7).lognormal(-2.0, 0.5, 1_000_000)
    calls = []

    def chunks():
        calls.append(1)
        return (v[i:i + 65536] for i in range(0, len(v), 65536))

    got, n = stats.percentiles_of_chunks(chunks, (50, 95, 99))
    assert got == [stats.percentile(v, q) for q in (50, 95, 99)] and n == len(v)
    shared = len(calls)
    calls.clear()
    stats.percentile_of_chunks(chunks, 99)
    assert shared <= len(calls) + 1  # one search's passes (and at most one more gather), not three searches'


def test_a_percentile_of_no_chunks_is_none():
    assert stats.percentile_of_chunks(lambda: iter(()), 50) == (None, 0)
    assert stats.percentiles_of_chunks(lambda: iter(()), (50, 99)) == ([None, None], 0)
    with pytest.raises(ValueError):
        stats.percentiles_of_chunks(lambda: iter(()), ())


@given(st.lists(finite, max_size=60), st.integers(1, 9), st.booleans())
def test_mean_and_extremes_of_chunks_are_those_of_the_values_held_at_once(xs, size, extremes):
    """The mean of values read a chunk at a time (and of one array) is the exactly rounded one
    of the list, whatever the cut, and the true mean's to two ulps -- values near 1e308 whose
    sum is beyond a float too; the least and greatest are min and max. None when empty."""
    import numpy as np

    v = np.asarray(xs, dtype=np.float64)
    got = stats.mean_min_max_of_chunks(lambda: (v[i:i + size] for i in range(0, len(v), size)), extremes=extremes)
    assert stats.mean(v) == stats.mean(xs) == got[0]
    if xs:  # the exactly rounded sum over n: within two ulps of the true mean (values near 1e308 too: no OverflowError)
        true = float(sum(map(Fraction, xs)) / len(xs))
        assert abs(got[0] - true) <= 2 * math.ulp(true) + 2.0 ** -1000
    if not xs:
        assert got == (None, None, None)
    elif extremes:
        assert got[1:] == (min(xs), max(xs))
    else:
        assert got[1:] == (None, None)
