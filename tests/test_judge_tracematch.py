"""The judge's streamed trace matching (`soakspec.judge.tracematch.match_table`: id forms
inverted, one id -> row lookup, traces consumed as they are read) matches exactly what
`soakspec.evidence.traces.match_traces` matches: the same requests covered by the same number
of traces, the same reason for each id a trace carried without matching."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from soakspec.evidence.traces import Trace, match_traces
from soakspec.judge.table import build_table
from soakspec.judge.tracematch import invertible, match_table

FORMS = st.lists(st.sampled_from(["{id}", "cmpl-{id}", "{id}-0", "chatcmpl-{id}-x"]), min_size=1, max_size=3, unique=True)


@st.composite
def cases(draw):
    n = draw(st.integers(1, 30))
    ids = [f"r{draw(st.integers(0, n))}" for _ in range(n)]  # some recorded twice
    reqs = []
    for k, rid in enumerate(ids):
        start = 100.0 + k
        reqs.append({"request_id": rid, "bucket": 0, "start": draw(st.sampled_from([start, None])),
                     "end": draw(st.sampled_from([start + 1.0, None, start - 5.0])),
                     "server_id": draw(st.sampled_from([None, f"srv-{k}", f"srv-{k % 3}"]))})
    forms = draw(FORMS)
    traces = []
    for _ in range(draw(st.integers(0, 40))):
        rid = f"r{draw(st.integers(0, n + 2))}"
        tid = draw(st.sampled_from([None, f"srv-{draw(st.integers(0, n))}", *[f.format(id=rid) for f in forms],
                                    "cmpl-" + rid]))
        times = tuple(draw(st.lists(st.floats(95.0, 140.0), max_size=2)))
        if draw(st.booleans()):  # stamped after a wall-clock step (of the steps drawn below, or not)
            times = tuple(t + draw(st.sampled_from([10.0, -7.5, 3.0])) for t in times)
        payload = draw(st.sampled_from([None, {"terminal_reason": "length"}, {"status": 500}]))
        traces.append(Trace(tid, times, payload, None, "t"))
    steps = draw(st.sampled_from([(), (10.0,), (-7.5, 10.0)]))  # the wall-clock steps client.jsonl recorded
    return reqs, forms, traces, draw(st.sampled_from([0.0, 0.5, 2.0])), steps


@settings(max_examples=300, deadline=None)
@given(cases())
def test_streamed_matching_equals_match_traces(case):
    reqs, forms, traces, window, steps = case
    assert invertible(forms)
    ref = match_traces(reqs, traces, "request_id", forms, window, steps=steps)
    table = build_table(reqs)
    got = match_table(table, iter(traces), forms, window, steps)
    want_rows = Counter(a.request_id for a in ref.assignments if a.matched)
    # match_traces names the request id; a duplicated id covers each of its records
    got_ids = Counter()
    for i, ps in got.kept.items():
        got_ids[table.ids[i]] = max(got_ids[table.ids[i]], len(ps))
    assert dict(got_ids) == dict(want_rows)
    why = {a.request_id: a.reason for a in ref.assignments if a.request_id is not None and not a.matched}
    assert got.unmatched_reason == why
    stepped = Counter(a.wall_step for a in ref.assignments if a.matched and a.wall_step)
    assert got.stepped == dict(stepped)


def test_a_trace_two_records_could_take_across_different_steps_goes_by_the_first_step():
    """Two records of one id, the trace fitting the second's window across the first recorded
    step and the first's across the second: the judge (steps tried in their order, a chunk of
    traces at once) and `match_traces` (the runner's choice) both place it across the first."""
    reqs = [{"request_id": "a", "bucket": 0, "start": 114.0, "end": 115.0},
            {"request_id": "a", "bucket": 0, "start": 104.0, "end": 107.0}]
    traces = [Trace("a", (115.5,), None, None, "t")]
    ref = match_traces(reqs, traces, "request_id", ["{id}"], 0.0, steps=(10.0, 1.0))
    got = match_table(build_table(reqs), iter(traces), ["{id}"], 0.0, (10.0, 1.0))
    assert [a.wall_step for a in ref.assignments] == [10.0] and got.stepped == {10.0: 1}
