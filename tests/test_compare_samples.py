"""How `soakspec compare` holds a level's samples (soakspec.compare.Sorted): itl's gaps counted by
value, never one float per gap, with figures identical to those of the plain sorted list."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from soakspec.compare import Sorted, compare, parse_rule, percentile_draws
from soakspec.judge import stats
from soakspec.judge.index import index
from soakspec.judge.measures import PerToken
from soakspec.judge.summary import dist_values
from soakspec.judge.testing import EvidenceBuilder, small_spec

SPEC = small_spec(duration="4m", bucket="1m")


def reference_draws(xs: list[float], q: float, rng: random.Random, draws: int, size: int | None = None) -> list[float]:
    """percentile_draws as it was when it held a sorted list of Python floats: the figures of
    every comparison made so far, which the compact forms must reproduce bit for bit."""
    big = len(xs)
    n = big if size is None else max(1, min(size, big))
    if big == 1:
        return [float(xs[0])] * draws
    h = (n - 1) * q / 100.0
    lo = min(int(math.floor(h)), n - 1)
    frac = h - lo
    k = lo + 1
    beta = lambda a, b: rng.betavariate(a, b) if b > 0 else 1.0 - 1e-12
    out = []
    for _ in range(draws):
        u1 = beta(k, n + 1 - k)
        a = xs[min(big - 1, int(u1 * big))]
        if frac > 0 and k < n:
            u2 = u1 + (1.0 - u1) * beta(1, n - k)
            b = xs[min(big - 1, int(u2 * big))]
            out.append(a + frac * (b - a))
        else:
            out.append(float(a))
    return out


# samples with many ties: a few distinct values, each repeated
tied = st.lists(st.floats(0, 10, allow_nan=False, width=32), min_size=1, max_size=8).flatmap(
    lambda pool: st.lists(st.sampled_from(pool), min_size=1, max_size=400))
qs = st.one_of(st.sampled_from([0.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0]), st.floats(0, 100))


@settings(max_examples=150, deadline=None)
@given(tied, qs, st.integers(0, 2**32), st.one_of(st.none(), st.integers(1, 500)))
def test_the_counted_form_draws_and_points_exactly_as_the_sorted_list(xs, q, seed, size):
    ordered = sorted(xs)
    u, c = np.unique(np.asarray(xs, dtype=np.float64), return_counts=True)
    counted = Sorted.counted(stats.Counted(u, c))
    array = Sorted.of(list(reversed(xs)))  # any order in: sorted on the way
    assert counted.n == array.n == len(xs)
    assert len(counted.values) == len(set(xs))  # held by distinct value
    js = np.arange(len(xs))
    assert counted.take(js).tolist() == array.take(js).tolist() == ordered
    expect = reference_draws(ordered, q, random.Random(seed), 40, size)
    for form in (ordered, counted, array):
        got = percentile_draws(form, q, random.Random(seed), 40, size)
        assert got == expect
        assert all(type(v) is float for v in got)
    point = stats.percentile(ordered, q)
    assert counted.percentile(q) == array.percentile(q) == point


def microsecond_run(seed: int, ttft_factor: float = 1.0, per_bucket: int = 100) -> EvidenceBuilder:
    """A run whose gaps are whole microseconds (as a recorder writes them): its ITL is counted."""
    b = EvidenceBuilder(SPEC, per_bucket=per_bucket, run_id=f"run{seed}")
    rng = random.Random(seed)
    for r in b.measured("a"):
        ttft = rng.lognormvariate(-2.3, 0.35) * ttft_factor
        gaps = [rng.randint(800, 1400) / 1e6 for _ in range(63)]
        r.update(ttft=ttft, first_token=r["start"] + ttft, itl=gaps, tpot=sum(gaps) / 63,
                 latency=ttft + sum(gaps), end=r["start"] + ttft + sum(gaps))
    return b


def test_compare_gets_itl_by_counting_never_one_float_per_gap(monkeypatch):
    """A day-long soak has ~10^9 gaps: compare must not ask for them one by one (memory). With
    itl's values() unavailable the comparison is the same, and its itl figures are the gate's."""
    base, new = microsecond_run(1).build(), microsecond_run(2, ttft_factor=1.2).build()
    rules = [parse_rule("require p99(itl) regression <= 5%"), parse_rule("require p50(ttft) regression <= 5%")]
    free = compare(base, new, rules=rules, resamples=300).to_json()

    def no(self, records):
        raise AssertionError("compare asked for every ITL gap")

    monkeypatch.setattr(PerToken, "values", no)
    held = compare(base, new, rules=rules, resamples=300).to_json()
    assert held == free
    itl = {r["stat"]: r for r in held["rows"] if r["metric"] == "itl"}
    assert itl["p99"]["gaps_base"] == 400 * 63 and itl["p99"]["n_base"] == 400 and itl["p99"]["verdict"] != "missing"
    gate = dist_values(index(base)[0].levels[0].records, "itl")
    assert itl["p99"]["base"] == gate.percentile(99) and itl["p50"]["base"] == gate.percentile(50)
    assert held["rules"][1]["status"] == "fail"  # the TTFT regression is still found


def test_gaps_that_cannot_be_counted_are_still_compared():
    """Gaps that are not whole microseconds have no counted form: compare reads them as values."""
    b = EvidenceBuilder(SPEC, per_bucket=100, run_id="floaty")
    rng = random.Random(4)
    for r in b.measured("a"):
        gaps = [rng.lognormvariate(-4.0, 0.25) for _ in range(63)]
        r.update(itl=gaps, tpot=sum(gaps) / 63)
    ev = b.build()
    c = compare(ev, ev, resamples=200)
    itl = next(r for r in c.rows if (r.metric, r.stat) == ("itl", "p99"))
    assert itl.gaps_base == 400 * 63 and itl.change == 0 and itl.verdict == "no significant change"
    assert itl.base == pytest.approx(stats.percentile([g for r in b.measured("a") for g in r["itl"]], 99), rel=0, abs=0)


def binned_counted(gaps_us: np.ndarray, edges: np.ndarray) -> stats.Counted:
    """Whole-µs gaps counted as a binned cell counts them (judge/table.py `GapCells`)."""
    from soakspec.judge import gapbins
    from soakspec.judge.table import CellBins, _binned, _value_counts

    v, n = _value_counts(np.asarray(gaps_us, dtype=np.int64))
    bv, bn = _binned(v, n, edges)
    return stats.Counted((bv + gapbins.bin_last(bv, edges)) / 2e6, bn, CellBins.of(v, n, edges).in_seconds(bv, edges))


spread_gaps = st.lists(st.integers(1, 200_000), min_size=2, max_size=300)


@settings(max_examples=200, deadline=None)
@given(spread_gaps, spread_gaps, qs, st.integers(0, 2**32), st.integers(1, 60),
       st.lists(st.floats(0.001, 0.2), max_size=3))
def test_binned_gaps_bound_every_draw_and_the_interval_the_gaps_themselves_give(gb, gn, q, seed, size, thresholds):
    """Binned sides: each draw's percentile lies within the bounds drawn for it (the same
    resamples), within a bin's width of them, and the row's interval holds the interval the
    gaps held exactly give -- a change smaller than a bin is never read as a whole bin."""
    from soakspec.compare.intervals import _binned_interval, percentile_draw_bounds
    from soakspec.judge import gapbins

    edges = gapbins.edges_for(thresholds)
    xb, xn = Sorted.counted(binned_counted(np.asarray(gb), edges)), Sorted.counted(binned_counted(np.asarray(gn), edges))
    eb, en = Sorted.of(np.asarray(gb) / 1e6), Sorted.of(np.asarray(gn) / 1e6)
    for binned, exact in ((xb, eb), (xn, en)):
        want = np.asarray(percentile_draws(exact, q, random.Random(seed), 50, size))
        lo, hi = percentile_draw_bounds(binned, q, random.Random(seed), 50, size)
        assert (lo <= want).all() and (want <= hi).all()
        assert (hi - lo <= np.maximum(hi, 1e-3) * 2.0 ** (1 - gapbins.BIN_BITS) + 1e-12).all()  # a bin, no wider
    rng = random.Random(seed)
    db, dn = percentile_draws(eb, q, rng, 400, size), percentile_draws(en, q, rng, 400, size)
    rel = [y / x - 1 for x, y in zip(db, dn)]
    got = _binned_interval(xb, xn, q, random.Random(seed), 400, (size, size), 0.05)
    assert got is not None  # gaps of 1 µs and more: a base draw is never 0
    assert got[0] <= stats.percentile(rel, 2.5) + 1e-12 and stats.percentile(rel, 97.5) - 1e-12 <= got[1]


def _two_level_run(tmp_path, name: str, high_us: int):
    """A run whose every request has 55 gaps of 15 ms and 8 of `high_us` (its p99), read from
    disk with cells that bin (CELL_EXACT_MAX made tiny: a real server's day crosses it)."""
    b = EvidenceBuilder(SPEC, per_bucket=100, run_id=name)
    for r in b.measured("a"):
        gaps = [0.015] * 55 + [high_us / 1e6] * 8
        r.update(itl=gaps, tpot=sum(gaps) / 63, latency=r["ttft"] + sum(gaps), end=r["start"] + r["ttft"] + sum(gaps))
    return b.write(tmp_path / name)


def test_a_change_smaller_than_a_bin_is_never_read_as_a_pass_or_a_whole_bin(tmp_path, monkeypatch):
    """Base p99(itl) 20.448 ms and new 20.511 ms: a 0.31 % regression whose two p99s fall in
    neighbouring bins (32 µs wide), whose midpoints differ by 0.16 %. Against `regression <=
    0.2%`, gaps held exactly FAIL; binned, the bins cannot tell 0.16 % from 0.31 %, so the rule
    is INCONCLUSIVE and says why -- the midpoints alone made it a PASS."""
    from soakspec.judge import gapbins
    from soakspec.judge.evidence import load_evidence, spec_itl_thresholds, spec_windows

    roots = _two_level_run(tmp_path, "base", 20448), _two_level_run(tmp_path, "new", 20511)
    rules = [parse_rule("require p99(itl) regression <= 0.2%")]
    exact = compare(*(load_evidence(r) for r in roots), rules=rules, resamples=300)
    monkeypatch.setattr(gapbins, "CELL_EXACT_MAX", 1)
    sides = [load_evidence(r, windows=spec_windows(SPEC), itl_thresholds=spec_itl_thresholds(SPEC)) for r in roots]
    assert all(s.backends[0].table.cells.binned for s in sides)  # binned: the case under test
    binned = compare(*sides, rules=rules, resamples=300)
    row = lambda c: next(r for r in c.rows if (r.metric, r.stat) == ("itl", "p99"))
    assert exact.rules[0].status == "fail" and row(exact).low == pytest.approx(20511 / 20448 - 1)
    assert binned.rules[0].status == "inconclusive" and binned.outcome == "INCONCLUSIVE"
    got = row(binned)
    assert got.low <= 20511 / 20448 - 1 <= got.high and got.low < 0.002 < got.high
    assert "bins" in got.note and got.change == pytest.approx(20495.5 / 20463.5 - 1)  # the bins' midpoints


# per-request times as a recorder makes them: epoch seconds in whole microseconds, subtracted
epoch_times = st.lists(st.tuples(st.integers(0, 86_400_000_000), st.integers(0, 600_000_000)), min_size=1, max_size=300).map(
    lambda ps: [(1.7e9 * 1e6 + s + d) / 1e6 - (1.7e9 * 1e6 + s) / 1e6 for s, d in ps])
any_floats = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300)


@settings(max_examples=150, deadline=None)
@given(st.one_of(epoch_times, any_floats, tied), qs, st.integers(0, 2**32), st.one_of(st.none(), st.integers(1, 500)))
def test_a_compact_sample_draws_and_points_exactly_as_the_float64_one(xs, q, seed, size):
    """`Sorted.compact` (the base run's samples, held in 4 bytes a value where that is exact)
    reads back every order statistic bit for bit -- -0.0 and 0.0 apart -- and so gives the same
    draws and points; a sample it cannot hold exactly stays float64."""
    array = Sorted.of(xs)
    small = array.compact()
    js = np.arange(len(xs))
    assert small.n == array.n
    assert small.take(js).view(np.uint64).tolist() == array.take(js).view(np.uint64).tolist()
    assert percentile_draws(small, q, random.Random(seed), 40, size) == percentile_draws(array, q, random.Random(seed), 40, size)
    p, r = small.percentile(q), array.percentile(q)
    assert p == r and math.copysign(1, p) == math.copysign(1, r)


def test_the_base_runs_samples_are_held_in_4_bytes_a_request():
    """compare reads the base run's samples up front and holds them until the rows are made
    (RunSamples.read(keep=False)): a recorder's times (epoch seconds in whole microseconds) in 4
    bytes a request, not 8 -- a day-long run's ttft, tpot and latency 120 MB, not 240."""
    from soakspec.compare import RunSamples

    b = EvidenceBuilder(SPEC, per_bucket=100, run_id="recorded")
    rng = random.Random(3)
    for r in b.measured("a"):  # ttft and latency from the stamps, as the runner's records give them
        ttft, gaps = rng.lognormvariate(-2.3, 0.35), [rng.randint(800, 1400) / 1e6 for _ in range(63)]
        r.update(first_token=round(r["start"] + ttft, 6), end=round(r["start"] + ttft + sum(gaps), 6), itl=gaps)
        r.pop("ttft", None), r.pop("latency", None)
    lv = RunSamples.read(b.build(), keep=False).backends[0].levels[0]
    for name in ("ttft", "latency"):
        xs = lv.samples[name][0]
        assert xs.n == 400 and xs.values.itemsize == 4, (name, xs.values.dtype)
