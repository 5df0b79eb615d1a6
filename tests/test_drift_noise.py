"""drift() and slope() of a percentile account for how many samples each bucket's value rests on.

A bucket's p95 of 80 requests is one of its top few values: two buckets of the same server can
read 20 % apart by chance alone. drift(p95(ttft)) <= 20% compared those point estimates, so
noise could FAIL the server (or PASS it). Each compared bucket's percentile is now taken as
lying between the order statistics the percentile rules' own binomial test puts either side
of it at the gate's confidence (`performance.sampling_interval`), and a drift or slope that
those intervals could carry across the threshold is INCONCLUSIVE, saying so. A mean's interval
is Student's t standard errors, a request (its gaps, for ITL) one draw. Counts and series are
as before: they are not samples of requests.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.judge import judge, stats
from soakspec.judge.testing import EvidenceBuilder, small_spec

RULE = "drift(p95(ttft)) <= 20% per level"


def _rule(v, name):
    return next(r for r in v.rules if r.rule == name)


def _run(rule: str, per_bucket: int, ttft_of, seed: int = 7, duration: str = "4m"):
    """A level of four 1-minute buckets, `per_bucket` requests each, bucket k's TTFTs drawn by
    `ttft_of(k, rng)`."""
    spec = small_spec(f"require {rule}", duration=duration, levels="[2]")
    b = EvidenceBuilder(spec, per_bucket=per_bucket)
    rng = random.Random(seed)
    buckets = len(b.manifest["backends"][0]["levels"][0]["buckets"])
    for k in range(buckets):
        for r in b.measured("a", bucket=k):
            v = ttft_of(k, rng)
            r["ttft"] = v
            r["first_token"] = r["intended_start"] + v
    return _rule(judge(spec, b.build()), rule)


def _lognormal(scale: float):
    return lambda k, rng: scale * rng.lognormvariate(0.0, 0.5)


def test_the_same_server_read_apart_by_chance_is_inconclusive_not_a_failure():
    """80 requests a bucket of one unchanging distribution: p95 is the 77th of 80 values, and
    a fifth of these draws read the last bucket's 21-42 % above the first's. The point drift
    said FAIL; the samples cannot tell that from noise (each bucket's p95 lies anywhere from
    about its 70th to its 80th value at 95 % confidence)."""
    got = [_run(RULE, 80, _lognormal(0.1), seed=s) for s in range(40)]
    noisy = [r for r in got if r.observed is not None and r.observed > 0.2]
    assert noisy, "no draw crossed the threshold: the test shows nothing"
    assert all(r.status == "inconclusive" for r in noisy), [(r.status, r.observed) for r in noisy]
    r = noisy[0]
    assert "sampling noise alone could decide it" in r.message and "95% confidence" in r.message


def test_a_real_step_is_a_failure_and_no_change_a_pass_with_enough_samples():
    """2,000 requests a bucket: a TTFT distribution 60 % slower in the last bucket fails
    whatever the noise; the same distribution throughout passes."""
    slower = _run(RULE, 2000, lambda k, rng: (1.6 if k == 3 else 1.0) * 0.1 * rng.lognormvariate(0.0, 0.5))
    assert slower.status == "fail" and slower.observed > 0.4, slower.message
    same = _run(RULE, 2000, _lognormal(0.1))
    assert same.status == "pass", same.message


def test_a_server_that_drifts_is_never_passed_for_want_of_samples():
    """The intervals only ever widen what the point estimate says: a server whose TTFT grows
    60 % by the last bucket, judged from 80 requests a bucket, is a FAIL or INCONCLUSIVE in
    every draw, never a PASS -- too few samples cannot hide a drift."""
    got = [_run(RULE, 80, lambda k, rng: (1.6 if k == 3 else 1.0) * 0.1 * rng.lognormvariate(0.0, 0.5), seed=s)
           for s in range(30)]
    assert all(r.status in ("fail", "inconclusive") for r in got), [(r.status, r.observed) for r in got]
    assert any(r.status == "inconclusive" for r in got)


def test_identical_values_have_no_noise():
    """A bucket whose requests all read the same TTFT has that value for every order
    statistic and no spread about its mean: nothing changes, for a percentile or a mean."""
    flat = _run(RULE, 80, lambda k, rng: 0.1 if k < 3 else 0.125)
    assert flat.status == "fail" and flat.observed == pytest.approx(0.25)
    mean = _run("drift(mean(ttft)) <= 20% per level", 80, lambda k, rng: 0.1 if k < 3 else 0.125)
    assert mean.status == "fail" and mean.observed == pytest.approx(0.25), mean.message


MEAN_RULE = "drift(mean(ttft)) <= 10% per level"


def test_a_mean_read_apart_by_chance_is_inconclusive_not_a_failure():
    """80 requests a bucket of one unchanging lognormal TTFT: each bucket's mean is known to
    about 6 %, and some draws read the last bucket's more than 10 % from the first's. The point
    drift said FAIL; within the means' t intervals the drift could lie either side of 10 %."""
    got = [_run(MEAN_RULE, 80, _lognormal(0.1), seed=s) for s in range(40)]
    noisy = [r for r in got if r.observed is not None and r.observed > 0.1]
    assert noisy, "no draw crossed the threshold: the test shows nothing"
    assert all(r.status == "inconclusive" for r in noisy), [(r.status, r.observed) for r in noisy]
    assert "Student's t standard errors" in noisy[0].message and "sampling noise alone could decide it" in noisy[0].message


def test_a_mean_that_truly_moves_fails_and_one_that_does_not_passes():
    """2,000 requests a bucket: a mean TTFT 25 % higher in the last bucket (uniform spread,
    each mean known to ~1 %) fails; the same distribution throughout passes; and a server whose
    mean grows 60 %, judged from 80 requests a bucket, is never a PASS."""
    up = _run(MEAN_RULE, 2000, lambda k, rng: (1.25 if k == 3 else 1.0) * 0.1 * rng.uniform(0.5, 1.5))
    assert up.status == "fail" and up.observed == pytest.approx(0.25, abs=0.03), up.message
    same = _run(MEAN_RULE, 2000, _lognormal(0.1))
    assert same.status == "pass", same.message
    drifting = [_run(MEAN_RULE, 80, lambda k, rng: (1.6 if k == 3 else 1.0) * 0.1 * rng.lognormvariate(0.0, 0.5), seed=s)
                for s in range(20)]
    assert all(r.status in ("fail", "inconclusive") for r in drifting), [(r.status, r.observed) for r in drifting]


def test_a_mean_of_gaps_counts_a_request_as_one_draw():
    """drift(mean(itl)): 40 requests a bucket, each streaming 63 gaps of one value (the request's
    batch decides it). 2,520 gaps a bucket would put each mean within ~1 % -- and FAIL an
    unchanging server whenever its requests read a few percent apart; counted as the 40
    requests they are, a drift noise could carry across 5 % is INCONCLUSIVE."""
    rule = "drift(mean(itl)) <= 5% per level"

    def run(seed: int):
        spec = small_spec(f"require {rule}", duration="4m", levels="[2]")
        b = EvidenceBuilder(spec, per_bucket=40)
        rng = random.Random(seed)
        for recs in b.records.values():
            for r in recs:
                if r["itl"]:
                    r["itl"] = [round(0.02 * rng.lognormvariate(0.0, 0.3), 6)] * len(r["itl"])
        return _rule(judge(spec, b.build()), rule)

    got = [run(s) for s in range(30)]
    noisy = [r for r in got if r.observed is not None and r.observed > 0.05]
    assert noisy, "no draw crossed the threshold: the test shows nothing"
    assert all(r.status == "inconclusive" for r in noisy), [(r.status, r.observed, r.message) for r in noisy]


def test_the_mean_interval_is_t_standard_errors_of_the_requests():
    """One bucket's interval, computed by hand: mean -+ t(c; n - 1) s / sqrt(n)."""
    from soakspec.judge.measures import Measure, PerRequest, field
    from soakspec.judge.performance import sampling_interval

    vals = [0.1, 0.12, 0.09, 0.15, 0.11, 0.13, 0.1, 0.08]
    impl = PerRequest(field("ttft"))

    class Scope:  # what `_mean_interval` reads of a scope: its records
        records = [{"ttft": v, "outcome": "completed"} for v in vals]

    got = impl.values(Scope.records)
    assert sorted(got) == sorted(vals)
    m = Measure(float(np.mean(vals)), len(vals), 1, "requests")
    lo, hi = sampling_interval(impl, Scope(), m, "mean", None, 0.95)  # type: ignore[arg-type]
    half = stats.t_quantile(0.95, len(vals) - 1) * float(np.std(vals, ddof=1)) / np.sqrt(len(vals))
    assert lo == pytest.approx(m.value - half, rel=1e-12) and hi == pytest.approx(m.value + half, rel=1e-12)
    one = sampling_interval(impl, type("One", (), {"records": Scope.records[:1]})(), Measure(0.1, 1, 1, "requests"), "mean", None, 0.95)  # type: ignore[arg-type]
    assert one == (-np.inf, np.inf)  # one draw: no spread to know it by


def test_slope_of_a_percentile_is_held_to_the_same_intervals():
    """An unchanging server's p95 slope read from 80 requests a bucket: some draws' point
    slopes exceed 5 %/min; none is a FAIL."""
    got = [_run("slope(p95(ttft)) <= 5% per level", 80, _lognormal(0.1), seed=s) for s in range(20)]
    assert any(r.observed is not None and r.observed > 0.05 for r in got), "no draw crossed: the test shows nothing"
    assert not any(r.status == "fail" for r in got), [(r.status, r.observed) for r in got if r.status == "fail"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.001, 10.0), min_size=60, max_size=400), st.sampled_from([50.0, 90.0, 95.0, 99.0]),
       st.sampled_from([0.9, 0.95, 0.99]))
def test_the_interval_is_the_order_statistics_the_percentile_rules_test_names(values, q, confidence):
    """For n values, the interval's ends are the (n-k)-th smallest value with k =
    max_overages(n, q, c) and the (k'+1)-th with k' = max_overages(n, 100-q, c) -- the bounds
    under which a `pNN < T` (`> T`) rule would PASS -- read a hair outwards, and it holds the
    point percentile."""
    from soakspec.judge.performance import sampling_interval
    from soakspec.judge.measures import Measure

    n = len(values)
    srt = np.sort(np.asarray(values))

    class Impl:  # a Distribution's percentile over these values, as the judge computes it
        def measure(self, sc, agg, p, confidence=0.95):
            return Measure(stats.percentile(srt, p), n, 0)

    point = stats.percentile(srt, q)
    lo, hi = sampling_interval(Impl(), None, Measure(point, n, 0), None, q, confidence)  # type: ignore[arg-type]
    k_hi, k_lo = stats.max_overages(n, q, confidence), stats.max_overages(n, 100.0 - q, confidence)
    if k_hi is None or k_lo is None:
        assert (lo, hi) == (-np.inf, np.inf)
        return
    # each end read a hair outside its order statistic (never inside it: rounding errs outwards)
    hair = 1e-6 * (srt[-1] - srt[0])
    assert max(srt[n - 1 - k_hi], point) <= hi <= max(srt[n - 1 - k_hi], point) + hair
    assert min(srt[k_lo], point) - hair <= lo <= min(srt[k_lo], point)
    assert lo <= point <= hi
