"""A level's `per window` scopes, cut in one pass (`soakspec.judge.scope.window_rows`).

What a user would notice: the same requests in each window as selecting each window over the
whole level gives -- a request on a window's edge in the later window, the level's end in the
last window, a request before the level's start or after its end in none, a request with no
usable start in none -- and a day-long level's thousands of windows judged in seconds, not
the minutes that selecting every window over every row took."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from soakspec.judge.index import req_time
from soakspec.judge import scope
from soakspec.judge.scope import window_rows
from soakspec.judge.table import Rows, build_table, ordered


def _started_in(a: float, b: float, last: bool):
    """The reference: one window's selection over every row (what window_scopes did)."""
    def mask(t, idx):
        rt = t.req_time(idx)
        ok = (a <= rt) & ((rt < b) | (last & (rt <= b)))
        for p in np.nonzero(np.isin(idx, t.odd(idx)))[0].tolist():
            v = req_time(t.rec(int(idx[p])))
            ok[p] = v is not None and a <= v and (v < b or (last and v <= b))
        return ok
    return mask


TIMES = st.one_of(st.sampled_from([0.0, 1.0, 2.5, 3.0, 4.0, 5.0, 5.5, 6.0, -1.0, 7.0]), st.floats(-2, 8, allow_nan=False),
                  st.none(), st.just(float("nan")), st.just("x"), st.just(2**60))


@st.composite
def levels(draw):
    n = draw(st.integers(0, 30))
    rows = [{"request_id": f"r{i}", "workload": "w", "level": 0, "bucket": 0, "outcome": "completed",
             "start": draw(st.one_of(st.sampled_from([1.0, 2.5, 3.0, 5.0, 5.5, 6.0]), st.floats(-2, 8, allow_nan=False), st.none())),
             "intended_start": draw(TIMES)} for i in range(n)]
    starts = sorted(draw(st.sets(st.sampled_from([0.0, 1.0, 2.5, 3.0, 4.0, 5.0]), min_size=1, max_size=6)))
    end = draw(st.sampled_from([x for x in (3.0, 5.0, 5.5, 6.0) if x > starts[-1]] or [starts[-1] + 1.0]))
    return rows, starts, end


@settings(max_examples=300, deadline=None)
@given(levels(), st.data())
def test_windows_cut_at_once_hold_what_each_window_selects(level, data):
    """Rows in any order are cut into what each window selects; a level's rows in time order
    (the judge's) are cut into views of them, no copy."""
    rows, starts, end = level
    split = data.draw(st.integers(0, len(rows)))  # two tables (two backends' parts), or one
    parts = [build_table(rows[:split]), build_table(rows[split:])] if data.draw(st.booleans()) else [build_table(rows)]
    chosen = [np.asarray(sorted(data.draw(st.sets(st.integers(0, t.n - 1), max_size=t.n))) if t.n else [], dtype=np.int64)
              for t in parts]
    in_time = data.draw(st.booleans())  # a level's rows as the judge holds them: in time order
    if in_time:
        chosen = [ordered(t, c) for t, c in zip(parts, chosen)]
    recs = Rows(tuple(zip(parts, chosen)))
    chunk = data.draw(st.sampled_from([1, 3, scope.WINDOW_CHUNK]))  # rows cut a chunk at a time
    was, scope.WINDOW_CHUNK = scope.WINDOW_CHUNK, chunk
    try:
        got = window_rows(recs, starts, end)
    finally:
        scope.WINDOW_CHUNK = was
    assert len(got) == len(starts)
    for k, a in enumerate(starts):
        last = k == len(starts) - 1
        want = recs.select(_started_in(a, end if last else starts[k + 1], last))
        assert len(got[k].parts) == len(want.parts)
        level_rows = {id(t): c for t, c in recs.parts}
        for (gt, gi), (wt, wi) in zip(got[k].parts, want.parts):
            assert gt is wt and np.array_equal(gi, wi), (k, gi, wi)
            if in_time and not len(gt.odd_rows) and len(gi):  # views of the level's rows, not copies
                assert np.shares_memory(gi, level_rows[id(gt)])
