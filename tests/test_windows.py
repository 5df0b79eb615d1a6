"""One cut of time into windows (soakspec.windows), shared by the runner's buckets, its abort
windows and the judge's per-window scopes: a time on an edge belongs to the window that starts
there, everywhere."""

from __future__ import annotations

import math

from hypothesis import given, strategies as st

from soakspec import windows
from soakspec.plan import AbortRule
from soakspec.runner.abort import AbortWatch, Row

origins = st.floats(min_value=0.0, max_value=2e9, allow_nan=False)
lengths = st.floats(min_value=1e-3, max_value=600.0, allow_nan=False)


@given(origins, lengths, st.integers(min_value=1, max_value=50), st.data())
def test_a_time_is_in_exactly_the_window_whose_start_is_last_at_or_before_it(origin, length, n, data):
    """holding(starts, t) is the one k with starts[k] <= t < starts[k + 1] (the last window
    open-ended, -1 before the first) -- for times drawn on and beside every edge."""
    starts = windows.starts(origin, n * length, length)
    assert all(a < b for a, b in zip(starts, starts[1:]))
    k = data.draw(st.integers(min_value=0, max_value=len(starts) - 1))
    for t in (starts[k], math.nextafter(starts[k], math.inf), math.nextafter(starts[k], -math.inf)):
        got = windows.holding(starts, t)
        want = [j for j, a in enumerate(starts) if a <= t and (j + 1 == len(starts) or t < starts[j + 1])]
        assert [got] == (want or [-1])


def test_a_whole_number_of_windows_has_no_empty_last_window():
    assert windows.count(0.3, 0.1) == 3  # 0.3 / 0.1 == 2.9999999999999996
    assert windows.count(0.31, 0.1) == 4
    assert windows.count(0.0, 5.0) == 1


@given(lengths, st.integers(min_value=0, max_value=200), st.floats(min_value=1e-3, max_value=1.0))
def test_the_windows_lengths_cut_the_duration_as_the_plans_buckets_do(length, n, part):
    """`lengths` (what `check` expects of a level's buckets, W517) are the plan's buckets: one a
    window, each `length` but the last, which ends at the level's end."""
    from soakspec.plan import _buckets

    duration = (n + part) * length
    got = windows.lengths(duration, length)
    assert len(got) == windows.count(duration, length)
    assert [b.length_s for b in _buckets(duration, length)] == list(got)
    assert all(x == length for x in got[:-1]) and 0 < got[-1] <= length
    assert math.isclose(math.fsum(got), duration, rel_tol=1e-9)


@given(origins, st.sampled_from([0.1, 0.3, 0.7, 1.1, 2.5, 20.0]), st.integers(min_value=2, max_value=12), st.data())
def test_an_abort_fires_on_the_window_a_request_on_its_edge_started_in(origin, w, n, data):
    """A failed request that starts exactly where a window starts fires a `per window` abort
    rule on that window (its index and start in the manifest's abort entry), not the one
    before it."""
    rule = AbortRule(text="abort if count(failed) >= 1 per window", metric="failed", agg="count", percentile=None,
                     op=">=", threshold=1.0, scope="window", window_s=w)
    fired: list = []
    watch = AbortWatch("b", [rule], on_fire=fired.append)
    watch.level_started("wl", 0, "c", origin, n * w, n * w)
    starts = windows.starts(origin, n * w, w)
    k = data.draw(st.integers(min_value=0, max_value=len(starts) - 1))
    watch.observe([Row(0, starts[k], "failed", {})], now=origin + n * w + 1.0)
    assert [(f.index, f.start) for f in fired] == [(k, starts[k])]


def test_the_judge_counts_a_request_on_a_window_edge_in_one_window():
    """`per window` scopes are [start, next start): a failed request that starts exactly on an
    edge fails the window it starts, not also the one before it (whose start + length float
    rounding put past that edge)."""
    from soakspec.judge import judge
    from soakspec.judge.testing import EvidenceBuilder, small_spec

    spec = small_spec("require failed == 0 per window 100ms")
    b = EvidenceBuilder(spec, t0=1.0)  # small times: more of the float rounding that the big ones hide
    level = b.entry("a")["levels"][0]
    t0, t1 = level["measure_start"], level["measure_end"]
    starts = windows.starts(t0, t1 - t0, 0.1)
    k = next(j for j in range(1, len(starts)) if starts[j - 1] + 0.1 > starts[j])  # the rounding that counted it twice
    r = next(b.measured("a"))
    shift = starts[k] - (r["intended_start"] if r.get("intended_start") is not None else r["start"])
    for f in ("intended_start", "start", "first_byte", "first_token", "end"):
        if r.get(f) is not None:
            r[f] += shift
    r["bucket"] = windows.holding([bk["start"] for bk in level["buckets"]], starts[k])
    b.set_outcome(r, "failed", "boom", status=500)
    v = judge(spec, b.build())
    got = next(x for x in v.rules if x.rule == "failed == 0 per window 100ms")
    assert (got.status, got.failing) == ("fail", 1)
    assert [d.where.bucket for d in got.details] == [k]
