"""A real server's per-token gaps, counted in bins once a cell holds too many distinct values
(`soakspec.judge.gapbins`, `table.GapCells`, `stats.Counted` with `Bins`).

What a user would notice: a day-long soak of a real server judged in bounded memory (~2 GB of
exact gap counts at 10^7 requests became ~140 MB: benchmarks/README.md, "Spread gaps"), with
the same verdict as counting every gap exactly -- a count beyond any threshold of the spec,
on which side of it a percentile lies (also where it falls between the two gaps either side
of it), the mean, min and max -- and a printed percentile within its stated bounds."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from soakspec.judge import gapbins, stats
import soakspec.judge.table as table_mod
from soakspec.judge.common import compare
from soakspec.judge.evidence import load_evidence, spec_itl_thresholds, spec_windows
from soakspec.judge.joined import join
from soakspec.judge import measures
from soakspec.judge.measures import PerToken
from soakspec.judge.summary import dist_values
from soakspec.judge.judge import judge_run
from soakspec.judge.table import CellBins, TableBuilder, _binned
from soakspec.judge.testing import EvidenceBuilder, small_spec
from tests.test_gap_cells import _keeping_gaps

OPS = ("<", "<=", ">", ">=")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=50),
       st.lists(st.floats(0, 2200, allow_nan=False), max_size=4))
def test_a_bin_holds_its_gaps_is_narrow_and_never_straddles_an_edge(vs, thresholds):
    edges = gapbins.edges_for(thresholds)
    v = np.asarray(vs, dtype=np.int64)
    lo = gapbins.bin_of(v, edges)
    hi = gapbins.bin_last(lo, edges)
    assert (lo <= v).all() and (v <= hi).all()
    assert np.array_equal(gapbins.bin_of(lo, edges), lo) and np.array_equal(gapbins.bin_of(hi, edges), lo)
    assert ((hi - lo) <= np.maximum(0, v * 2.0 ** (1 - gapbins.BIN_BITS))).all()  # at most 0.2% of a gap wide
    for e in edges.tolist():
        assert not ((lo < e) & (e <= hi)).any()  # wholly below or wholly at or above each edge
    order = np.argsort(v, kind="stable")
    assert (np.diff(lo[order]) >= 0).all()  # monotone: a bin's gaps are consecutive


@given(st.floats(1e-6, 2000, allow_nan=False))
def test_the_edges_of_a_threshold_split_the_gaps_the_judge_compares_with_it(t):
    e, f = sorted(gapbins.edges_for([t]).tolist()) if len(gapbins.edges_for([t])) == 2 else [gapbins.edges_for([t])[0]] * 2
    # the least whole microsecond at or above t, and the least above it, as the judge's floats compare
    assert e / 1e6 >= t and (e - 1) / 1e6 < t
    assert f / 1e6 > t and (f - 1) / 1e6 <= t


def _exact(gaps):
    v, n = np.unique(np.asarray(gaps, dtype=np.int64), return_counts=True)
    return stats.Counted(v / 1e6, n)


def _binned_counted(gaps, edges):
    """As a binned cell answers (`GapCells.counts_of`, `RequestTable.gap_counts`)."""
    v, n = np.unique(np.asarray(gaps, dtype=np.int64), return_counts=True)
    info = CellBins.of(v, n, edges)
    bv, bn = _binned(v, n, edges)
    return stats.Counted((bv + gapbins.bin_last(bv, edges)) / 2e6, bn, info.in_seconds(bv, edges))


GAPS = st.lists(st.one_of(st.integers(0, 3_000_000), st.integers(15_000, 25_000)), min_size=1, max_size=300)


@st.composite
def thresholds_near(draw, gaps):
    """Thresholds on, just beside and between the gaps (where a percentile meets one), and anywhere."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        k = draw(st.sampled_from(gaps))
        out.append(draw(st.sampled_from([k, k + 1, k - 1, k + 0.5])) / 1e6)
    out += draw(st.lists(st.floats(0, 3.5, allow_nan=False), max_size=2))
    return out


@settings(max_examples=400, deadline=None)
@given(GAPS, st.data())
def test_binned_gaps_judge_every_threshold_they_were_cut_at_as_exact_counts_do(gaps, data):
    ts = data.draw(thresholds_near(gaps))
    qs = data.draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=4))
    points = data.draw(st.lists(st.floats(0, 3.5, allow_nan=False), max_size=3))
    edges = gapbins.edges_for(ts)
    exact, binned = _exact(gaps), _binned_counted(gaps, edges)
    for want, got in ((exact, binned), (exact.plus(np.asarray(points)), binned.plus(np.asarray(points)))):
        assert got.n == want.n and got.min() == want.min() and got.max() == want.max()
        assert math.isclose(got.mean(), want.mean(), rel_tol=1e-12, abs_tol=1e-15)
        for t in ts:
            for op in OPS:
                assert got.count(op, t) == want.count(op, t), (op, t)
        for q in qs:
            p, (lo, hi) = want.percentile(q), got.percentile_bounds(q)
            assert lo <= p <= hi and lo <= got.percentile(q) <= hi
            assert hi - lo <= max(abs(hi), 1e-6) * 2.0 ** (1 - gapbins.BIN_BITS) * 1.0001
            for t in ts:
                for op in OPS:
                    assert compare(got.percentile(q), op, t) == compare(p, op, t), (q, op, t, p, got.percentile(q))


@pytest.mark.parametrize(("gaps", "q", "t", "p"), [
    # p75 is 20,030 µs, halfway from the largest gap below 20,031 to the smallest above it:
    # 20,010 read as its bin's midpoint (20,015) would put p75 past the threshold
    ([20_000, 20_010, 20_050], 75.0, 0.020031, 0.020030),
    # p25 is 20,030, halfway up to 20,060: read as its bin's midpoint (20,047.5), below 20,028
    ([20_000, 20_060, 20_063], 25.0, 0.020028, 0.020030),
], ids=["the gap below", "the gap above"])
def test_a_percentile_between_the_gaps_either_side_of_a_threshold_is_exact(gaps, q, t, p):
    binned = _binned_counted(gaps, gapbins.edges_for([t]))
    assert not binned.exact
    assert binned.percentile(q) == pytest.approx(p, abs=1e-12) and binned.percentile_bounds(q)[0] == binned.percentile_bounds(q)[1]
    assert compare(binned.percentile(q), "<", t) == compare(_exact(gaps).percentile(q), "<", t)


def test_a_threshold_the_bins_were_not_cut_at_is_not_counted_from_them():
    gaps = list(range(20_000, 20_100))
    binned = _binned_counted(gaps, gapbins.edges_for([0.05]))
    assert binned.count("<", 0.05) == 100  # an edge: exact
    with pytest.raises(stats.InexactCount):
        binned.count("<", 0.020050)  # inside a 32 µs bin of gaps either side of it


def test_a_busy_cell_is_binned_as_its_gaps_arrive_and_stays_small(monkeypatch):
    """A cell past CELL_EXACT_MAX distinct gaps holds bins (a bounded number, whatever its
    size), from the block it crossed on -- not every exact gap until the table is finished."""
    rng = np.random.default_rng(1)
    b = TableBuilder(keep_gaps=False, gap_edges=gapbins.edges_for([0.05]))
    gaps_all = []
    for i in range(10_000):  # one bucket: one cell (its gaps counted GAP_CHUNK at a time)
        gaps = np.rint(rng.lognormal(math.log(20_000), 0.35, 63)).astype(np.int64)
        gaps_all.extend(gaps.tolist())
        b.add({"request_id": f"r{i}", "workload": "w", "level": 0, "bucket": 0, "outcome": "completed",
               "itl_source": "exact", "itl": (gaps / 1e6).tolist()})
        if i == 8000:
            assert b.cells is not None and 0 in b.cells.binned  # binned as it went, not at the end
            assert sum(len(v) for v, _ in b.cells.pending[0]) < 4 * 2**(gapbins.BIN_BITS + 2)
    t = b.finish(reload=lambda: None)
    assert len(np.unique(gaps_all)) > gapbins.CELL_EXACT_MAX
    assert t.cells is not None and len(t.cells.vals[0]) < 3 * 2**gapbins.BIN_BITS  # ~512 bins an octave
    got = t.gap_counts(np.arange(t.n))
    want = _exact(gaps_all)
    assert got is not None and not got.exact
    assert got.count("<", 0.05) == want.count("<", 0.05) and got.max() == want.max()
    lo, hi = got.percentile_bounds(99)
    assert lo <= want.percentile(99) <= hi


def _spread_gaps(b: EvidenceBuilder, rng: random.Random) -> list[float]:
    """Every gap of the builder's records drawn as a real server's (lognormal, median 20 ms,
    whole microseconds); returns them sorted."""
    gaps = []
    for recs in b.records.values():
        for r in recs:
            if r["itl"]:
                r["itl"] = [round(rng.lognormvariate(math.log(0.02), 0.3), 6) for _ in r["itl"]]
                gaps += r["itl"]
    return sorted(gaps)


def _every_gap_kept(root):
    """The evidence at `root` read as the reference judge reads it: every gap kept, no cells."""
    with _keeping_gaps():
        kept = load_evidence(root)
    for be in kept.backends:
        be.table.cells = None
    return kept


@pytest.mark.parametrize(("seed", "windowed"), [(s, s % 2 == 0) for s in range(6)])
def test_evidence_whose_cells_are_binned_gets_the_verdict_of_every_gap_kept(tmp_path, monkeypatch, seed, windowed):
    """Evidence read from disk with cells that bin (CELL_EXACT_MAX made tiny here; a real
    server's day crosses it), thresholds taken from the spec, gets the statuses every gap kept
    gives, rule by rule -- a per window rule, a drift of p99(itl), thresholds placed on the gaps
    themselves -- and each ITL figure it prints lies within 0.1% of the exact one."""
    rng = random.Random(seed)
    spec0 = small_spec("require p99(itl) < 30ms", levels="[2, 4]")
    b = EvidenceBuilder(spec0, per_bucket=rng.randrange(20, 60))
    gaps = _spread_gaps(b, rng)
    t1, t2 = gaps[len(gaps) * 99 // 100], gaps[len(gaps) // 2]  # thresholds on the gaps themselves
    rules = (f"require p99(itl) < {t1 * 1e3:.3f}ms\nrequire p50(itl) <= {t2 * 1e3:.3f}ms\nrequire max(itl) < 200ms\n"
             f"require mean(itl) > {t2 * 1e3:.3f}ms\nwarn drift(p99(itl)) < 5%\n"
             f"require p95(itl) < {t1 * 1.5e3:.3f}ms\nrequire p50(itl) < {t2 * 0.8e3:.3f}ms")
    if windowed:
        rules += f"\nrequire p90(itl) < {t1 * 1e3:.3f}ms per window 7s"
    spec = small_spec(rules, levels="[2, 4]")
    b.spec = spec
    root = b.write(tmp_path / "run")
    monkeypatch.setattr(gapbins, "CELL_EXACT_MAX", 4)
    monkeypatch.setattr(table_mod, "MERGE_PENDING", 3)  # a scope's cells merged a few at a time
    if seed % 3 == 1:  # every selection read as a day's is: its rows a few at a time
        monkeypatch.setattr(measures, "CHUNKED_ROWS", 1)
        monkeypatch.setattr(table_mod, "SCAN_CHUNK", 5)
    ev = load_evidence(root, windows=spec_windows(spec), itl_thresholds=spec_itl_thresholds(spec))
    assert ev.backends[0].table.cells is not None and ev.backends[0].table.cells.binned  # binned, the case under test
    got = judge_run(join(spec, ev))
    monkeypatch.undo()
    want = judge_run(join(spec, _every_gap_kept(root)))
    assert [(r.rule, r.status) for r in got.rules] == [(r.rule, r.status) for r in want.rules]
    assert {"pass", "fail"} <= {r.status for r in got.rules}  # not all inconclusive
    for g, w in zip(got.rules, want.rules):
        if g.observed is not None and w.observed is not None and "itl" in g.rule:
            assert g.observed == pytest.approx(w.observed, rel=2.0 ** -gapbins.BIN_BITS, abs=1e-9), g.rule


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["drift", "slope"]), st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0, 0.002), st.floats(0, 1)),
                                                   min_size=2, max_size=12), st.data())
def test_a_trend_of_binned_percentiles_lies_within_the_bounds_the_judge_gives_it(wrapper, points, data):
    """drift() or slope() over buckets whose values are only known within bounds: whatever the
    exact values within them, the trend lies within `_trend_bounds` (the judge says
    INCONCLUSIVE where the threshold lies inside)."""
    from types import SimpleNamespace

    from soakspec.judge.measures import Measure, quarters, relative_change, slope
    from soakspec.judge.performance import _trend_bounds

    n = len(points)
    used_all = []
    truth = []
    for k, (v, width, where) in enumerate(points):
        lo, hi = v, v * (1 + width)
        used_all.append((SimpleNamespace(start=60.0 * k, end=60.0 * (k + 1)),
                         Measure((lo + hi) / 2, 100, bounds=(lo, hi) if hi > lo else None)))
        truth.append(lo + where * (hi - lo))
    q = quarters(n)
    pick = list(range(q)) + list(range(n - q, n)) if wrapper == "drift" else list(range(n))
    used = [used_all[i] for i in pick]
    vals = [truth[i] for i in pick]
    rule = SimpleNamespace(expr=SimpleNamespace(wrapper=wrapper))
    bounds = _trend_bounds(rule, n, used)
    if not any(m.bounds for _, m in used):
        assert bounds is None
        return
    if wrapper == "drift":
        want = relative_change(stats.median(vals[:q]), stats.median(vals[len(vals) - q:]))
    else:
        want = slope([(s.start + s.end) / 2 for s, _ in used], vals)
    assert bounds is not None and want is not None
    assert bounds[0] - 1e-12 <= want <= bounds[1] + 1e-12


def test_results_and_reports_say_which_itl_percentiles_lie_within_bounds(tmp_path, monkeypatch):
    """results.json's ITL percentiles of binned gaps carry `bounds` (least, greatest) that
    hold the exact percentile, the document stays valid, and the reports mark those figures
    "≈"; evidence counted exactly says nothing of bounds."""
    import json

    from soakspec.evidence.schema import validate
    from soakspec.report import prepare
    from soakspec.report.runsummary import summary_lines

    rng = random.Random(7)
    spec = small_spec("require p99(itl) < 30ms", levels="[2, 4]")
    b = EvidenceBuilder(spec, per_bucket=40)
    _spread_gaps(b, rng)
    root = b.write(tmp_path / "run")
    kept = _every_gap_kept(root)
    exact = json.loads(json.dumps(prepare(spec, kept).results, default=str))
    monkeypatch.setattr(gapbins, "CELL_EXACT_MAX", 4)
    inputs = prepare(spec, load_evidence(root, itl_thresholds=spec_itl_thresholds(spec)))
    got = json.loads(json.dumps(inputs.results, default=str))
    assert validate("results", got) == []
    levels, want = got["backends"][0]["levels"], exact["backends"][0]["levels"]
    assert any("bounds" in lv["itl"] for lv in levels)
    for lv, w in zip(levels, want):
        assert "bounds" not in w["itl"]
        for k, (lo, hi) in lv["itl"].get("bounds", {}).items():
            assert lo < hi and lo <= lv["itl"][k] <= hi and lo <= w["itl"][k] <= hi, (k, lo, hi, w["itl"][k])
    assert "≈" in inputs.render("md") and "≈" in inputs.render("html")
    assert any("≈" in line for line in summary_lines(got, root))  # the summary `soakspec run` prints
    assert "≈" not in prepare(spec, kept).render("md") and not any("≈" in line for line in summary_lines(exact, root))


@pytest.mark.parametrize("seed", range(6))
def test_a_spec_whose_itl_thresholds_the_bins_were_not_cut_at_gets_the_exact_verdict(tmp_path, monkeypatch, seed):
    """Evidence read for one spec (bins cut at its thresholds) and judged with another whose ITL
    thresholds lie on the gaps themselves, between two of them, and inside a bin: every rule's
    status is the one every gap kept gives (the judge counts such a scope's gaps exactly), and
    the rules judged after such a fallback still get the same statuses."""
    rng = random.Random(100 + seed)
    read_with = small_spec("require p99(itl) < 30ms", levels="[2, 4]")
    b = EvidenceBuilder(read_with, per_bucket=40)
    gaps = _spread_gaps(b, rng)
    p99, p50 = gaps[len(gaps) * 99 // 100], gaps[len(gaps) // 2]
    root = b.write(tmp_path / "run")
    judged_with = small_spec(f"require p99(itl) < {p99 * 1e3:.3f}ms\nrequire p50(itl) <= {p50 * 1e3:.4f}ms\n"
                             f"require p99(itl) < {(p99 + 0.5e-6) * 1e3:.4f}ms\nrequire p99(itl) < 30ms\n"
                             f"require p90(itl) < {p99 * 1e3:.3f}ms per bucket\nwarn drift(p99(itl)) < 5%", levels="[2, 4]")
    monkeypatch.setattr(gapbins, "CELL_EXACT_MAX", 4)
    ev = load_evidence(root, itl_thresholds=spec_itl_thresholds(read_with))
    assert ev.backends[0].table.cells.binned
    run = join(judged_with, ev)
    got = judge_run(run)
    monkeypatch.undo()
    kept = join(judged_with, _every_gap_kept(root))
    want = judge_run(kept)
    selections = lambda r: [bi.measured for bi in r.judged] + [lv.records for lv in r.levels.values()]
    gaps = [len(dist_values(s, "itl")) for s in selections(kept)]

    def one_by_one(self, records):
        raise AssertionError("the summary read every gap again")

    monkeypatch.setattr(PerToken, "values", one_by_one)  # a day's gaps one float each: GBs
    # the summary, after those rules, still counts the whole run's gaps and each level's
    assert [dist_values(s, "itl").n for s in selections(run)] == gaps and min(gaps) > 0
    assert [(r.rule, r.status) for r in got.rules] == [(r.rule, r.status) for r in want.rules]
    assert {"pass", "fail"} <= {r.status for r in got.rules}
