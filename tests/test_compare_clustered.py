"""compare where a run's requests are not independent draws: slow requests come in runs (a
busy host, a batch that stalls, a slower first bucket), as two runs of one configuration on the
simulator showed -- module doc of soakspec.compare, "Independence"."""

from __future__ import annotations

import math
import random

import numpy as np
from hypothesis import given, settings, strategies as st

import soakspec.compare.intervals as C
from soakspec.compare import compare
from soakspec.compare.intervals import DesignEffects
from soakspec.judge.testing import EvidenceBuilder, small_spec

SPEC = small_spec(duration="4m", bucket="1m")


def clustered(seed: int, factor: float = 1.0, rho: float = 0.9) -> EvidenceBuilder:
    """A clean run of 2000 requests whose TTFTs follow a slowly wandering level: each request's
    shares most of the one before it (an AR(1) with coefficient `rho`, in start order), so slow
    requests come in runs of about (1 + rho) / (1 - rho)."""
    b = EvidenceBuilder(SPEC, per_bucket=500, run_id=f"clustered{seed}")
    rng = random.Random(seed)
    x = rng.gauss(0, 1)
    for r in b.measured("a"):
        x = rho * x + math.sqrt(1 - rho * rho) * rng.gauss(0, 1)
        ttft = 0.05 * math.exp(0.1 * (0.7 * x + 0.3 * rng.gauss(0, 1))) * factor
        gaps = [rng.randint(800, 1400) / 1e6 for _ in range(15)]
        r.update(ttft=ttft, first_token=r["start"] + ttft, itl=gaps, tpot=sum(gaps) / 15,
                 latency=ttft + sum(gaps), end=r["start"] + ttft + sum(gaps))
    return b


def _verdicts(base, new, metrics=("ttft", "latency")) -> list[str]:
    return [r.verdict for r in compare(base, new, resamples=2000).rows if r.metric in metrics]


def test_two_runs_of_one_clustered_configuration_read_no_significant_change(monkeypatch):
    """Eight pairs of runs of one configuration whose slow requests cluster in time: of their
    TTFT and latency rows (48), at most one reads a change (the family-wise 95 % allows about
    one pair in twenty; the design effect's own estimate is noisy). Counted as independent draws
    -- the intervals before the design effect -- five of these eight pairs read a "regression"
    or "improvement" of TTFT."""
    pairs = [(clustered(2 * s).build(), clustered(2 * s + 1).build()) for s in range(1, 9)]
    verdicts = [v for base, new in pairs for v in _verdicts(base, new)]
    assert len(verdicts) == 48 and sum(v != "no significant change" for v in verdicts) <= 1, verdicts
    c = compare(*pairs[2], resamples=2000)
    row = next(r for r in c.rows if (r.metric, r.stat) == ("ttft", "p50"))
    assert row.n_base == 2000 and "design effect" in (row.note or "") and "of 2000 / 2000 requests" in row.note
    monkeypatch.setattr(DesignEffects, "of", classmethod(lambda cls, values: cls.NONE))
    as_independent = [_verdicts(base, new, ("ttft",)) for base, new in pairs]
    assert sum(set(v) != {"no significant change"} for v in as_independent) >= 3, as_independent


def test_a_real_change_of_a_clustered_run_is_still_found():
    """The wider interval does not hide a change that is there: TTFT 25 % slower over the same
    clustered process is a regression at p50 (and its reverse an improvement)."""
    base, slow = clustered(3).build(), clustered(4, factor=1.25).build()
    by = {(r.metric, r.stat): r for r in compare(base, slow, resamples=2000).rows}
    assert by["ttft", "p50"].verdict == "regression" and 0.15 < by["ttft", "p50"].change < 0.35
    back = {(r.metric, r.stat): r for r in compare(slow, base, resamples=2000).rows}
    assert back["ttft", "p50"].verdict == "improvement"


def test_independent_requests_keep_their_interval():
    """Requests drawn independently have a design effect near 1: the interval is about what it
    was. Ten seeded runs of 4000 values: the estimates average below 1.3 and none reaches 3 (an
    estimate is a variance from 8 to 20 batches: noisy, most in the tails, where fewer batches
    hold enough values beyond the quantile; it is never taken below 1)."""
    got = []
    for seed in range(10):
        effects = DesignEffects.of(np.random.default_rng(seed).lognormal(-3.0, 0.3, 4000))
        got += [e for e in effects.effects if e is not None]
    assert len(got) >= 80 and min(got) >= 1.0 and max(got) < 3.0 and np.mean(got) < 1.3, got


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1), ties=st.booleans())
def test_a_design_effect_is_never_below_1_and_largest_for_a_trend(n, seed, ties):
    """At every quantile an estimate is at least 1 (no interval narrower than independent
    draws'), and the same values in rising order -- a level that slows down steadily, every
    slow request at its end -- have the largest effect any order of them can have; a
    quantile with fewer than DEFF_MIN_EVENTS values a batch on its rarer side has none."""
    rng = np.random.default_rng(seed)
    v = rng.integers(0, 20, n).astype(np.float64) if ties else rng.lognormal(0.0, 1.0, n)
    mixed, trend = DesignEffects.of(v), DesignEffects.of(np.sort(v))
    assert len(mixed.effects) == len(trend.effects)
    for q, a, b in zip(mixed.qs, mixed.effects, trend.effects):
        assert (a is None) == (b is None)
        if a is not None:
            assert 1.0 <= a <= b * (1 + 1e-9), (q, a, b)
        else:
            cut = np.percentile(v, q)
            hit = int(np.count_nonzero(v <= cut))
            assert min(hit, n - hit) // C.DEFF_MIN_EVENTS < C.DEFF_MIN_BATCHES or n // C.DEFF_MIN_BATCH < C.DEFF_MIN_BATCHES
    for q in (0.5, 50.0, 97.0, 99.0, 99.99):
        assert mixed.at(q) >= 1.0


def test_a_tail_too_thin_for_batches_takes_the_nearest_estimate_towards_the_median():
    """p99 of 2000 requests has 20 values beyond it -- four a batch of 20 at most: too few to
    estimate by batches; it takes p95's (100 beyond, five a batch), never 1 by default where
    the tail's requests are as clustered as the rest."""
    e = DesignEffects((50.0, 95.0, 99.0), (3.0, 6.0, None))
    assert e.at(99.0) == 6.0 and e.at(97.0) == 6.0 and e.at(99.9) == 6.0 and e.at(50.0) == 3.0
    assert DesignEffects((1.0, 50.0), (None, 2.0)).at(1.0) == 2.0
    assert DesignEffects((99.0,), (None,)).at(99.0) == 1.0 and DesignEffects.NONE.at(95.0) == 1.0


def test_calibration_of_clustered_rows():
    """The design effect's purpose, measured: 40 pairs of runs of one clustered process (AR(1)
    0.9, 2000 requests a side), rows p50/p95/p99 at a 15-row family's 95 %: counted as
    independent draws about a third of the rows read a change that is not there; with the
    design effect at most a few in 120 (the family allows 0.4 in expectation; the estimate's
    noise costs a little), and a 10 % slowdown is still found in nearly every row."""
    from soakspec.compare.intervals import Sorted, _relative, effective, percentile_draws
    from soakspec.judge import stats

    def run(rng: np.random.Generator, shift: float = 1.0) -> np.ndarray:
        z, x, e = np.empty(2000), rng.normal(), rng.normal(size=2000)
        for i in range(2000):
            x = 0.9 * x + math.sqrt(1 - 0.81) * e[i]
            z[i] = x
        return 0.05 * np.exp(0.1 * (0.7 * z + 0.3 * rng.normal(size=2000))) * shift

    def changed(vb: np.ndarray, vn: np.ndarray, q: float, seed: int) -> bool:
        rng = random.Random(seed)
        sb, sn = effective(2000, DesignEffects.of(vb).at(q)), effective(2000, DesignEffects.of(vn).at(q))
        db = percentile_draws(Sorted.of(vb.copy()), q, rng, 6000, sb)
        dn = percentile_draws(Sorted.of(vn.copy()), q, rng, 6000, sn)
        rel = [_relative(y, x) for x, y in zip(db, dn)]
        alpha = 0.05 / 15
        return stats.percentile(rel, 100 * alpha / 2) > 0 or stats.percentile(rel, 100 * (1 - alpha / 2)) < 0

    rng = np.random.default_rng(7)
    false = sum(changed(run(rng), run(rng), q, 10 * k + int(q)) for k in range(40) for q in (50.0, 95.0, 99.0))
    assert false <= 4, false
    found = sum(changed(run(rng), run(rng, 1.1), q, 10 * k + int(q)) for k in range(10) for q in (50.0, 95.0, 99.0))
    assert found >= 27, found


def bursty(seed: int, bursts: int = 0, share: float = 0.0, length: int = 50) -> EvidenceBuilder:
    """A run of 2000 requests whose failures come in `bursts` runs of `length` consecutive
    requests (a server hiccup), at random places, and besides those each request fails
    independently with probability `share`."""
    b = EvidenceBuilder(SPEC, per_bucket=500, run_id=f"bursty{seed}")
    rng = random.Random(seed)
    measured = list(b.measured("a"))
    failed: set[int] = set()
    for _ in range(bursts):
        start = rng.randrange(0, len(measured) - length)
        failed |= set(range(start, start + length))
    failed |= {i for i in range(len(measured)) if rng.random() < share}
    for i in sorted(failed):
        b.set_outcome(measured[i], "failed", "HTTP 500", 500)
    return b


def _errors(base: EvidenceBuilder, new: EvidenceBuilder):
    c = compare(base.build(), new.build(), resamples=2000)
    return c, next(r for r in c.rows if r.metric == "errors")


def test_failures_in_bursts_of_one_configuration_are_no_significant_change():
    """Two runs of one server whose hiccups each fail 50 consecutive requests, one hiccup in
    the base run and three in the new (2.5% and 6.5% of 2000): counted as 4000 independent
    trials the rise read as significant and FAILed the comparison; the 0/1 outcomes in start
    order say the 2000 requests are worth about 40 independent ones (design effect ~50, the
    burst's length), and the row reads no significant change. The row's n stays the requests."""
    c, row = _errors(bursty(1, bursts=1), bursty(2, bursts=3))
    assert (row.base, row.new) == (0.025, 0.0645)
    assert row.verdict == "no significant change" and c.outcome == "PASS", (row, c.reasons)
    assert row.low < 0 < row.high and row.n_base == 2000 and row.n_new == 2000
    assert "failures come in bursts (design effect" in (row.note or "") and "of 2000 / 2000 requests" in row.note


def test_a_real_rise_of_failures_is_still_a_regression():
    """What the wider interval does not hide: an error rate that doubles (5% to 10% of
    requests failing independently) is a regression, and so is one burst of 50 failures where
    the base run had none -- more failures is never a pass (the built-in FAIL)."""
    c, row = _errors(bursty(5, share=0.05), bursty(6, share=0.10))
    assert row.verdict == "regression" and c.outcome == "FAIL" and 0.03 < row.change < 0.07
    c, row = _errors(bursty(7), bursty(8, bursts=1))
    assert (row.base, row.new) == (0.0, 0.025) and row.verdict == "regression" and c.outcome == "FAIL"


def _batch_effect_by_definition(hits: np.ndarray) -> float | None:
    """`batch_effect` as first written: each batch's hits summed from a float64 copy of them."""
    n = len(hits)
    hit = int(np.count_nonzero(hits))
    b = min(C.DEFF_BATCHES, n // C.DEFF_MIN_BATCH, min(hit, n - hit) // C.DEFF_MIN_EVENTS)
    if b < C.DEFF_MIN_BATCHES:
        return None
    p = hit / n
    starts = (np.arange(b, dtype=np.int64) * n) // b
    sizes = np.diff(np.append(starts, n)).astype(np.float64)
    k = np.add.reduceat(hits.astype(np.float64), starts)
    return max(1.0, b / (b - 1) * float(np.sum((k - p * sizes) ** 2)) / (n * p * (1.0 - p)))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1), share=st.floats(0.0, 1.0), runs=st.booleans())
def test_a_design_effect_is_its_definitions_bit_for_bit(n, seed, share, runs):
    """Batches counted where they lie give the very float the float64 copy's sums gave (whole
    counts, exact in any order): compare's intervals do not move by an ulp."""
    hits = np.random.default_rng(seed).random(n) < share
    hits = np.sort(hits) if runs else hits
    assert C.batch_effect(hits) == _batch_effect_by_definition(hits)


def test_a_design_effect_makes_no_copy_of_a_levels_outcomes():
    """A day-long level's outcomes (10^7 requests a side) are not copied as float64 to be
    counted: 8 bytes a request at compare's peak, beside the other run's samples."""
    import tracemalloc

    hits = np.random.default_rng(1).random(1_000_000) < 0.3
    tracemalloc.start()
    try:
        effect = C.batch_effect(hits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert effect is not None
    assert peak < 1 << 20, f"batch_effect held {peak / 2**20:.1f} MiB at once for 10^6 outcomes"


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1), share=st.floats(0.0, 1.0))
def test_a_proportions_design_effect_is_at_least_1_and_largest_for_one_run_of_failures(n, seed, share):
    """The effect of 0/1 outcomes is at least 1 where the batches can tell (None where fewer
    than DEFF_MIN_BATCHES batches would hold DEFF_MIN_EVENTS of the rarer outcome), and the same
    outcomes with every failure in one run have the largest effect any order of them can have."""
    hits = np.random.default_rng(seed).random(n) < share
    mixed, one_run = C.batch_effect(hits), C.batch_effect(np.sort(hits))
    assert (mixed is None) == (one_run is None)
    if mixed is not None:
        assert 1.0 <= mixed <= one_run * (1 + 1e-9)
    else:
        k = int(hits.sum())
        assert min(k, n - k) // C.DEFF_MIN_EVENTS < C.DEFF_MIN_BATCHES or n // C.DEFF_MIN_BATCH < C.DEFF_MIN_BATCHES
