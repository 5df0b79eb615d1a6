"""metrics.jsonl held as typed series (`judge/scrapes.py`) gives what its rows give, read one
by one as the judge read them before: the same families, types, times, values, histogram
sums, counts and buckets, the same totals and the same first failure -- for any rows, hostile
ones included (values that are not numbers, scrapes out of time order, a bucket list that
changes its bounds, failed scrapes)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from hypothesis import given, settings, strategies as st

from soakspec.judge.scrapes import build_scrapes
from soakspec.judge.table import num


def _reference(rows):
    """The judge's reading of metrics.jsonl before it held series: the rows with a time,
    sorted by it; per family its entries; per entry the value and the histogram it reads."""
    rows = sorted((r for r in rows if isinstance(r, Mapping) and num(r.get("t")) is not None), key=lambda r: float(r["t"]))
    by: dict[str, list] = {}
    for r in rows:
        fams = r.get("families")
        if r.get("ok") is not True or not isinstance(fams, Mapping):
            continue
        for name, fam in fams.items():
            if isinstance(fam, Mapping) and isinstance(fam.get("type"), str):
                by.setdefault(name, []).append((float(r["t"]), fam))
    failed = [r for r in rows if r.get("ok") is not True]
    return by, len(rows), failed


def _hist(p):
    bks = {}
    pairs = p.get("buckets")
    for pair in pairs if isinstance(pairs, (list, tuple)) else ():  # a non-list: a crash before, now no bucket
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and num(pair[1]) is not None:
            bks[num(pair[0]) if pair[0] is not None else None] = float(pair[1])
    return _sum(p.get("sum")), float(num(p.get("count")) or 0.0), bks


# a value that is not finite as the scraper writes it (JSON has none): a gauge's value, a
# histogram's or summary's sum
TEXT = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


def _sum(v):
    return TEXT[v] if isinstance(v, str) and v in TEXT else float(num(v) or 0.0)


def _gauge_value(p):
    v = p.get("value")
    if p["type"] == "gauge" and v in ("+Inf", "-Inf"):
        return TEXT[v]
    return num(v)


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (a sum written "NaN")."""
    return a == b or (a != a and b != b)


_value = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), st.integers(-10, 10**6), st.none(), st.booleans(), st.just("x"),
                   st.just(10**400), st.sampled_from(sorted(TEXT)))
_le = st.one_of(st.none(), st.sampled_from([0.1, 0.5, 1.0, 2.5]), st.just("x"))
_pair = st.one_of(st.tuples(_le, _value).map(list), st.just([1.0]), st.just("junk"))
_entry = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["gauge", "counter", "histogram", "summary"]), st.just(3))},
    optional={"value": _value, "sum": _value, "count": _value, "buckets": st.one_of(st.lists(_pair, max_size=5), st.none(), st.just(7))})
_row = st.fixed_dictionaries(
    {"t": st.one_of(st.sampled_from([1.0, 2.0, 2.0, 3.5, 10.0]), st.floats(0, 100, allow_nan=False), st.none(), st.just("later")),
     "ok": st.one_of(st.just(True), st.just(True), st.just(False), st.none()),
     "families": st.one_of(st.dictionaries(st.sampled_from(["a", "b", "c_total"]), st.one_of(_entry, st.just(1)), max_size=3),
                           st.none())},
    optional={"error": st.sampled_from(["boom", "timeout", None])})


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_row, st.just(5)), max_size=25))
def test_series_give_what_the_rows_give(rows):
    got = build_scrapes(rows)
    by, total, failed = _reference(rows)
    assert got.total == total and got.failed == len(failed)
    assert got.rows == sum(isinstance(r, Mapping) for r in rows)
    assert (got.first_failed or {}).get("error") == (failed[0].get("error") if failed else None)
    assert set(got.series) == set(by)
    for name, pts in by.items():
        s = got.series[name]
        assert s.name == name and s.type == pts[-1][1]["type"]
        assert list(s.times) == [t for t, _ in pts]
        for i, (_, p) in enumerate(pts):
            assert s.value(i) == _gauge_value(p)
            got_h, want_h = s.hist(i), _hist(p)
            assert _same(got_h[0], want_h[0]) and got_h[1:] == want_h[1:]
            assert list(s.hist(i)[2]) == list(_hist(p)[2])  # the buckets in the same order


def test_a_days_scrapes_are_held_in_arrays_not_rows():
    """A histogram family's scrape costs its counts (8 bytes each), not twenty lists of floats:
    the bounds are shared by every scrape that has the same ones."""
    les = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, None]
    rows = [{"t": float(k), "ok": True, "families": {"h": {"type": "histogram", "sum": k * 0.1, "count": float(k),
                                                           "buckets": [[le, float(k)] for le in les]}}} for k in range(1000)]
    s = build_scrapes(rows).series["h"]
    assert len(s.bounds) == 1 and len(s.times) == 1000
    assert s.hist(999) == (999 * 0.1, 999.0, dict.fromkeys(les, 999.0))
