"""Abort rules (issue 16): `abort EXPR OP VALUE per bucket|window D` in the gate.

The checker accepts only what a finished bucket's own records give (E422 otherwise); the plan
resolves them per backend, with the built-in abort unless `abort_default = false`; the runner's
pure evaluator (`runner/abort.py`) fires on a finished bucket or window; a fired abort stops
the load, the manifest records it and the judge FAILs naming it. The end-to-end runs use the
simulator as a real subprocess with short levels."""

from __future__ import annotations

import dataclasses

import json
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from soakspec import windows
from soakspec.diagnostics import Severity
from soakspec.evidence.schema import validate
from soakspec.judge import judge
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.lang import check, fmt, parse
from soakspec.plan import DEFAULT_ABORT_MIN_REQUESTS, AbortRule, plan, render_text
from soakspec.runner.abort import AbortWatch, Fired, Row, holds, row_of, value
from tests.runner_support import new_marker, run_soakspec, sim_spec, wait_no_survivors

WORKLOAD = 'workload "w" {\n  load { concurrency = 1 }\n  duration = 60s\n}\n'
BACKEND = 'backend "a" {\n  url = "http://127.0.0.1:8000"\n}\nbackend "b" {\n  url = "http://127.0.0.1:8001"\n}\n'


def _check(gate: str):
    text = 'soak "x" {}\n' + BACKEND + WORKLOAD + "gate {\n" + gate + "}\n"
    tree, diags = parse(text)
    assert tree is not None, diags
    spec, more = check(tree)
    return spec, [(d.code, d.span.line, d.span.column) for d in diags + more if d.severity is Severity.ERROR]


# ---------------------------------------------------------------- check


def test_abort_rules_go_to_gate_aborts_not_to_the_judges_rules():
    spec, errors = _check('  require failed == 0\n  abort ratio(errors) > 50% per window 30s\n  abort p99(ttft) > 2s per bucket on "b"\n')
    assert errors == []
    assert [r.text for r in spec.gate.rules] == ["require failed == 0"]
    w, b = spec.gate.aborts
    assert (w.expr.metric, w.expr.agg, w.op, w.threshold, w.scope, w.window_s) == ("errors", "ratio", ">", 0.5, "window", 30.0)
    assert (b.expr.metric, b.expr.percentile, b.threshold, b.scope, b.backend) == ("ttft", 99.0, 2.0, "bucket", "b")
    assert spec.gate.abort_default is True


@pytest.mark.parametrize(
    "rule, where",
    [
        ("abort ratio(errors) > 50%", (13, 3)),  # no per: the whole statement
        ("abort ratio(errors) > 50% per level", (13, 29)),  # only bucket or window
        ("abort trace_coverage per bucket", (13, 9)),  # not computable live
        ("abort mean(throughput) < 5 per bucket", (13, 9)),  # a per-bucket series, not a record field
        ("abort rate(errors) > 5rps per bucket", (13, 9)),  # rate is not live
        ("abort drift(p50(ttft)) > 10% per bucket", (13, 9)),
    ],
)
def test_abort_rules_the_runner_cannot_evaluate_live_are_E422(rule, where):
    _, errors = _check(f"  {rule}\n")
    assert errors == [("E422", *where)]


def test_abort_default_can_be_turned_off_and_is_a_bool():
    spec, errors = _check("  abort_default = false\n")
    assert errors == [] and spec.gate.abort_default is False
    _, errors = _check('  abort_default = "no"\n')
    assert [e[0] for e in errors] == ["E104"]


def test_an_abort_rule_in_the_compare_block_is_E422():
    text = 'soak "x" {}\n' + BACKEND + WORKLOAD + "compare {\n  abort regression(p99(ttft)) <= 5%\n}\n"
    tree, diags = parse(text)
    _, more = check(tree)
    assert [(d.code, d.span.line) for d in diags + more] == [("E422", 13)]


def test_abort_rules_survive_fmt():
    text = 'soak "x" {}\n' + BACKEND + WORKLOAD + 'gate {\n  abort   ratio(errors)>50% per window 30s on "b"\n  abort_default = false\n}\n'
    tree, _ = parse(text)
    once = fmt(tree)
    assert "abort ratio(errors) > 50% per window 30s on \"b\"" in once
    assert fmt(parse(once)[0]) == once
    assert check(parse(once)[0])[0].gate.aborts == check(tree)[0].gate.aborts


# ---------------------------------------------------------------- plan


def test_the_plan_resolves_abort_rules_per_backend_with_the_builtin_last():
    spec, _ = _check('  abort ratio(errors) > 50% per window 30s\n  abort max(latency) > 10s per bucket on "b"\n')
    p = plan(spec, time_scale=0.1)
    a, b = p.backends
    assert [(r.metric, r.scope, r.window_s, r.builtin) for r in a.aborts] == [
        ("errors", "window", pytest.approx(3.0), False), ("errors", "bucket", None, True)]
    assert [(r.metric, r.agg) for r in b.aborts] == [("errors", "ratio"), ("latency", "max"), ("errors", "ratio")]
    builtin = a.aborts[-1]
    assert (builtin.op, builtin.threshold, builtin.min_requests) == (">=", 1.0, DEFAULT_ABORT_MIN_REQUESTS)
    assert "stops its load when: abort ratio(errors) > 50% per window 30s" in render_text(p)  # `soakspec plan` says so
    assert plan(spec).backends[0].aborts[0].window_s == 30.0
    off, _ = _check("  abort_default = false\n")
    assert plan(off).backends[0].aborts == ()


# ---------------------------------------------------------------- the pure evaluator


def _rule(metric="errors", agg="ratio", op=">", threshold=0.5, scope="bucket", window_s=None, percentile=None, min_requests=1):
    return AbortRule("abort test", metric, agg, percentile, op, threshold, scope, window_s, min_requests)


def _rows(outcomes, bucket=0, start=0.0, ttft=0.1):
    return [Row(bucket, start, o, {"ttft": ttft, "latency": ttft * 2}) for o in outcomes]


def test_value_of_outcome_and_distribution_rules():
    rows = _rows(["completed", "failed", "timeout", "completed"])
    assert value(_rule(), rows) == 0.5
    assert value(_rule(agg="count"), rows) == 2.0
    assert value(_rule(metric="timeouts", agg="count"), rows) == 1.0
    xs = [Row(0, 0.0, "completed", {"ttft": t}) for t in (0.1, 0.2, 0.3, 0.4)] + [Row(0, 0.0, "failed", {"ttft": 9.0})]
    assert value(_rule(metric="ttft", agg="max"), xs) == 0.4  # failed requests are not in a distribution
    assert value(_rule(metric="ttft", agg="p", percentile=50.0), xs) == pytest.approx(0.25)  # interpolated, as the judge
    assert value(_rule(metric="ttft", agg="p", percentile=100.0), xs) == pytest.approx(0.4)
    assert value(_rule(metric="ttft", agg="mean"), xs) == pytest.approx(0.25)
    assert value(_rule(min_requests=6), rows) is None  # too few: never fires on nothing
    assert value(_rule(metric="ttft", agg="max"), _rows(["failed"])) is None


def test_a_bucket_rule_fires_once_at_its_bucket_and_stops_the_watch():
    fired = []
    watch = AbortWatch("a", [_rule(threshold=0.5)], on_fire=fired.append)
    watch.level_started("w", 0, "concurrency 2", 100.0, 10.0, 1.0)
    watch.observe(_rows(["completed", "failed"], bucket=0, start=100.1), now=100.5)
    watch.bucket_done(0, now=101.0)
    assert fired == []  # 50% is not > 50%
    watch.observe(_rows(["failed", "failed", "completed"], bucket=1, start=101.2), now=101.9)
    assert fired == []  # bucket 1 has not ended yet
    watch.bucket_done(1, now=102.0)
    (f,) = fired
    assert (f.scope, f.index, f.requests, f.start, f.end, f.at) == ("bucket", 1, 3, 101.0, 102.0, 102.0)
    assert f.observed == pytest.approx(2 / 3) and watch.fired is f
    watch.observe(_rows(["failed"] * 5, bucket=2, start=102.1), now=102.5)
    watch.bucket_done(2, now=103.0)
    assert len(fired) == 1


def test_a_window_rule_fires_on_the_first_record_after_its_window_ends():
    fired = []
    watch = AbortWatch("a", [_rule(scope="window", window_s=2.0, threshold=0.9, op=">=")], on_fire=fired.append)
    watch.level_started("w", 1, "rate 5 rps", 10.0, 20.0, 5.0)
    watch.observe([Row(0, 10.5, "failed", {}), Row(0, 11.5, "failed", {})], now=11.9)
    assert fired == []  # window [10, 12) still open
    watch.observe([Row(0, 12.1, "completed", {})], now=12.2)
    (f,) = fired
    assert (f.scope, f.index, f.level, f.requests, f.observed) == ("window", 0, 1, 2, 1.0)
    # warmup requests (bucket -1) belong to no window
    w2 = AbortWatch("a", [_rule(scope="window", window_s=2.0)], on_fire=fired.append)
    w2.level_started("w", 0, "c", 10.0, 20.0, 5.0)
    w2.observe([Row(-1, 10.5, "failed", {})], now=13.0)
    assert w2.fired is None


def _slow_successes(watch, *, known: bool = True):
    """A level (bucket 0 = [0, 1)) in which 10 requests start; one fails at once, nine are
    still streaming when the bucket ends (their successes take 1.5 s)."""
    watch.level_started("w", 0, "rate 10 rps", 0.0, 4.0, 1.0, deadline_s=5.0, starts_known=known)
    for k in range(10):
        watch.started(0, k / 10)
    watch.observe(_rows(["failed"], bucket=0, start=0.05), now=0.1)
    watch.bucket_done(0, now=1.0)


@pytest.mark.parametrize("rule", [_rule(threshold=0.5), _rule(scope="window", window_s=1.0, threshold=0.5)], ids=["bucket", "window"])
def test_a_bucket_is_judged_over_its_requests_not_over_the_fast_failures_that_finished_first(rule):
    """Open loop, 20% of requests failing at once and the rest streaming for 1.5 s: at each
    bucket's end the only finished request of it was a failure, `ratio(errors) > 50%` saw
    "1 over 1 requests" and aborted a run whose buckets fail 10-20%. A bucket (or window) is
    judged once its requests have finished, over all of them."""
    fired = []
    watch = AbortWatch("a", [rule], on_fire=fired.append)
    _slow_successes(watch)
    assert fired == []  # nine of its ten requests are still in flight: nothing is known yet
    watch.observe([Row(0, k / 10, "completed", {}) for k in range(1, 10)], now=1.6)
    assert fired == [] and watch._rows == []  # judged (10% errors) and forgotten


def test_an_outcome_rule_fires_before_the_bucket_finishes_when_the_rest_cannot_save_it():
    """Nine of ten failed and one is in flight: ratio(errors) is at least 90% whatever it does,
    so `> 50%` fires at the bucket's end; a distribution rule waits for every request."""
    fired = []
    watch = AbortWatch("a", [_rule(threshold=0.5), _rule(metric="ttft", agg="max", threshold=0.05)], on_fire=fired.append)
    watch.level_started("w", 0, "c", 0.0, 4.0, 1.0, deadline_s=5.0, starts_known=True)
    for k in range(10):
        watch.started(0, k / 10)
    watch.observe(_rows(["failed"] * 9, bucket=0, start=0.5), now=0.9)
    watch.bucket_done(0, now=1.0)
    assert [(f.rule.metric, f.index, f.at) for f in fired] == [("errors", 0, 1.0)]
    fired.clear()
    watch = AbortWatch("a", [_rule(metric="ttft", agg="max", threshold=0.05)], on_fire=fired.append)
    watch.level_started("w", 0, "c", 0.0, 4.0, 1.0, deadline_s=5.0, starts_known=True)
    watch.started(0, 0.1)
    watch.started(0, 0.2)
    watch.observe(_rows(["completed"], bucket=0, start=0.1, ttft=0.01), now=0.5)
    watch.bucket_done(0, now=1.0)
    assert fired == []
    watch.observe(_rows(["completed"], bucket=0, start=0.2, ttft=0.2), now=1.2)
    assert [(f.index, f.observed, f.requests) for f in fired] == [(0, 0.2, 2)]


def test_with_load_processes_a_bucket_waits_until_their_starts_are_reported():
    """`--workers`: the load processes report the requests they start with their records; a
    bucket is judged once every start before its end has been reported and those requests
    have finished -- not on the part of it a process has reported so far."""
    fired = []
    watch = AbortWatch("a", [_rule(threshold=0.5)], on_fire=fired.append)
    watch.level_started("w", 0, "c", 0.0, 4.0, 1.0, deadline_s=5.0, starts_known=True, starts_until=float("-inf"))
    watch.started(0, 0.1)
    watch.started_until(0.5)
    watch.observe(_rows(["failed"], bucket=0, start=0.1), now=0.6)
    watch.bucket_done(0, now=1.0)
    assert fired == []  # the processes have not said what they started in [0.5, 1)
    for k in range(6, 10):
        watch.started(0, k / 10)
    watch.started_until(1.05)
    watch.observe(_rows(["completed"] * 3, bucket=0, start=0.7), now=1.1)
    assert fired == []  # one of the five still in flight: 1 or 2 failed of 5, not > 50% for sure
    watch.observe(_rows(["completed"], bucket=0, start=0.9), now=1.5)
    assert fired == [] and watch._rows == []  # judged: 1 of 5 failed


def test_without_start_counts_a_bucket_waits_for_its_deadline_or_the_levels_drain():
    """`--workers`: the watch is not told of each start; a bucket is judged when every request
    of it has ended by its deadline (+ SETTLE_S), or when the level drained, if sooner."""
    from soakspec.runner.abort import SETTLE_S

    for drained in (False, True):
        fired = []
        watch = AbortWatch("a", [_rule(threshold=0.5)], on_fire=fired.append)
        _slow_successes(watch, known=False)
        watch.observe(_rows(["failed"], bucket=0, start=0.5), now=1.4)
        assert fired == []
        if drained:
            watch.level_drained(now=1.7)
        else:
            watch.observe([], now=1.0 + 5.0 + SETTLE_S)
        assert [(f.index, f.observed, f.requests) for f in fired] == [(0, 1.0, 2)]


def test_the_builtin_abort_needs_a_whole_bucket_of_at_least_its_minimum_none_completed():
    spec, _ = _check("")
    (builtin,) = plan(spec).backends[0].aborts
    fired = []
    watch = AbortWatch("a", [builtin], on_fire=fired.append)
    watch.level_started("w", 0, "c", 0.0, 10.0, 1.0)
    watch.observe(_rows(["failed"] * (DEFAULT_ABORT_MIN_REQUESTS - 1), bucket=0, start=0.5), now=0.9)
    watch.bucket_done(0, now=1.0)
    assert fired == []  # too few requests to call the server dead
    watch.observe(_rows(["failed"] * 30 + ["completed"], bucket=1, start=1.5), now=1.9)
    watch.bucket_done(1, now=2.0)
    assert fired == []  # one completed request: not degenerate
    watch.observe(_rows(["rejected", "timeout"] * DEFAULT_ABORT_MIN_REQUESTS, bucket=2, start=2.5), now=2.9)
    watch.bucket_done(2, now=3.0)
    assert [(f.index, f.observed, f.rule.builtin) for f in fired] == [(2, 1.0, True)]


def _records(errors: dict[str, int], bucket: int = 0, start: float = 0.5) -> list[Row]:
    """Rows of finished requests as the runner writes them: `errors` maps (outcome, error) text
    "outcome|error" to a count."""
    from soakspec.runner.records import Outcome, RequestRecord

    out = []
    for key, n in errors.items():
        outcome, error = key.split("|", 1)
        for i in range(n):
            rec = RequestRecord(f"r{len(out)}", outcome=Outcome(outcome), error=error or None, bucket=bucket)
            rec.start = rec.end = start + i * 1e-3
            out.append(row_of(rec))
    return out


HTTP_500 = "failed|HTTP 500: " + '{"error": "EngineCore encountered an issue"}'
REFUSED = "disconnected|connect failed: connection refused (econnrefused)"
HELD = "disconnected|held back: the backend refused its last 3 connects (connection refused (econnrefused))"


@pytest.mark.parametrize(("errors", "said", "gone"), [
    # a server that answers and fails every request: a gate FAIL, saying what the answers were
    ({HTTP_500: 40, "timeout|deadline passed before the response finished": 2},
     "42 requests, none completed: 40 HTTP 500, 2 timeout", False),
    # a server that is gone: refused connects, the arrivals held back after them, a request cut in flight
    ({REFUSED: 12, HELD: 29, "disconnected|connection reset by peer (econnreset)": 1},
     "42 requests, none completed: 29 held back (connections refused), 12 connection refused, 1 connection reset by peer",
     True),
    ({REFUSED: 42}, "42 requests, none completed: 42 connection refused", True),
    # connections broken, none refused: the server answers (or accepts), it is not gone
    ({"disconnected|connection closed before the response": 42}, "42 requests, none completed: 42 connection closed before the response",
     False),
    ({REFUSED: 20, HTTP_500: 22}, "42 requests, none completed: 22 HTTP 500, 20 connection refused", False),
])  # fmt: skip
def test_the_builtin_abort_names_the_outcomes_it_saw_and_whether_the_server_is_gone(errors, said, gone):
    """The built-in abort said "observed 100% over 42 requests" -- never what the requests were,
    so a server refusing every connection read like one failing every request. It names them
    ("42 requests, none completed: 42 connection refused"), to the runner and the judge alike,
    and tells a gone server (refused connects, arrivals held back after them, requests cut in
    flight: the runner then aborts the run, exit 4) from one that answers and fails (a FAIL)."""
    spec, _ = _check("")
    (builtin,) = plan(spec).backends[0].aborts
    fired = []
    watch = AbortWatch("a", [builtin], on_fire=fired.append)
    watch.level_started("w", 0, "c", 0.0, 10.0, 1.0)
    watch.observe(_records(errors), now=0.9)
    watch.bucket_done(0, now=1.0)
    (f,) = fired
    assert f.describe().endswith(f"at bucket 0 of w / c: {said}"), f.describe()
    assert f.gone is gone
    b = EvidenceBuilder(small_spec("require failed == 0"))
    b.manifest["aborts"] = [f.to_json()]
    assert validate("manifest", b.manifest) == []
    (r,) = [r for r in judge(b.spec, b.build()).rules if r.metric == "abort_fired"]
    assert r.status == "fail" and f"(threshold >= 100%); {said}; the rest of the load was not run" in r.message, r.message


def test_the_outcomes_in_words_are_worked_out_only_when_an_abort_fires(monkeypatch):
    """`cause_of` (a regex and prefix tests) ran on every failed record the watch was fed --
    a failing server's thousands a second on the load's own loop -- though only a fired abort
    reads it. Rows that fire nothing never work it out; the rows of a fire do, once each."""
    from soakspec.runner import abort

    calls = []
    real = abort.cause_of
    monkeypatch.setattr(abort, "cause_of", lambda o, e: calls.append(o) or real(o, e))
    fired = []
    watch = AbortWatch("a", [_rule(threshold=0.9, min_requests=10)], on_fire=fired.append)
    watch.level_started("w", 0, "c", 0.0, 10.0, 1.0)
    watch.observe(_records({HTTP_500: 5, "completed|": 5}), now=0.9)
    watch.bucket_done(0, now=1.0)
    assert fired == [] and calls == []
    watch.observe(_records({HTTP_500: 10}, bucket=1, start=1.5), now=1.9)
    watch.bucket_done(1, now=2.0)
    (f,) = fired
    assert f.outcomes == (("HTTP 500", 10),) and len(calls) == 10


def test_rows_no_rule_reads_again_are_forgotten():
    watch = AbortWatch("a", [_rule(threshold=2.0)])
    watch.level_started("w", 0, "c", 0.0, 100.0, 1.0)
    for k in range(50):
        watch.observe(_rows(["completed"] * 20, bucket=k, start=k + 0.5), now=k + 0.9)
        watch.bucket_done(k, now=k + 1.0)
    assert len(watch._rows) == 0


outcome = st.sampled_from(["completed", "failed", "timeout", "rejected", "disconnected"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 3.0), st.lists(st.tuples(st.floats(0.0, 2.0), outcome), max_size=4)), max_size=25),
       st.floats(0.1, 1.0), st.integers(1, 3), st.sampled_from([0.5, 0.75, 3.0]))  # fmt: skip
@example(calls=[(3.0, [])] * 4 + [(2.5, [])] * 2 + [(3.0, [(0.0, "failed")])], threshold=1.0, min_requests=1, w=0.5)
@example(calls=[(3.0, [])] * 6 + [(2.0, [(0.2, "failed")])], threshold=1.0, min_requests=1, w=0.75)  # the short last window
def test_window_rules_fire_where_evaluating_every_window_at_every_call_would(calls, threshold, min_requests, w):
    """The watch evaluates each `per window` rule only on the windows that ended since its last
    call (a day of 1 s windows is 86,400, and it is told of every batch of records). It fires
    on the window, with the value and count, that a reference evaluating every ended window not
    yet evaluated at every call gives -- with bucket ends (and the rows they forget) between.
    The windows are the judge's (soakspec.windows): the last may be shorter and holds a request
    that starts at the level's very end (the reference stopped at the last whole window, and
    took none at the end: a case hypothesis found once in CI)."""
    m, blen, length = 10.0, 2.0, 20.0  # windows within buckets, across them, longer than them
    rule = _rule(scope="window", window_s=w, threshold=threshold, op=">=", min_requests=min_requests)
    never = _rule(threshold=2.0)  # a bucket rule that never fires: its bucket ends forget rows
    watch = AbortWatch("a", [never, rule])
    watch.level_started("w", 0, "c", m, length, blen)
    seen: list[Row] = []
    done: set[int] = set()
    want = None

    starts = windows.starts(m, length, w)

    def reference(now: float) -> None:  # every ended window not yet evaluated, in order, until one fires
        nonlocal want
        for j, a in enumerate(starts):
            last = j == len(starts) - 1
            b = m + length if last else starts[j + 1]
            if now < b:
                break
            if want is None and j not in done:
                done.add(j)
                inside = [r for r in seen if a <= r.start and (r.start < b or (last and r.start <= b))]
                fires, v = holds(rule, inside)
                if fires:
                    want = (j, v, len(inside))

    now, bucket_ended = m, -1
    for step, batch in calls:
        now += step
        rows = [Row(int((now - lag - m) // blen), now - lag, o, {}) for lag, o in batch if now - lag >= m]
        watch.observe(rows, now=now)
        seen += rows
        reference(now)
        while bucket_ended + 1 < int(min(now, m + length) - m) // blen:
            bucket_ended += 1
            watch.bucket_done(bucket_ended, now=now)
            reference(now)
    got = watch.fired
    assert (None if got is None else (got.index, got.observed, got.requests)) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(outcome, min_size=1, max_size=40), st.floats(0, 1), st.floats(0, 1), st.sampled_from([">", ">="]))
def test_firing_is_monotone_in_the_threshold(outcomes, t1, t2, op):
    """A rule `X > t` that fires at t fires at every lower t; `X < t` the other way."""
    lo, hi = sorted((t1, t2))
    rows = _rows(outcomes)
    if holds(_rule(op=op, threshold=hi), rows)[0]:
        assert holds(_rule(op=op, threshold=lo), rows)[0]
    less = "<" if op == ">" else "<="
    if holds(_rule(op=less, threshold=lo), rows)[0]:
        assert holds(_rule(op=less, threshold=hi), rows)[0]


@settings(max_examples=100, deadline=None)
@given(st.lists(outcome, min_size=1, max_size=40), st.lists(outcome, max_size=10))
def test_more_failures_never_stop_an_error_ratio_abort_from_firing(outcomes, more):
    rows = _rows(outcomes)
    if holds(_rule(threshold=0.3), rows)[0]:
        assert holds(_rule(threshold=0.3), rows + _rows(["failed"] * len(more)))[0]


# ---------------------------------------------------------------- the judge


def _fired(rule: str = "abort ratio(errors) > 50% per window 1s") -> dict:
    return {"rule": rule, "builtin": False, "metric": "errors", "op": ">", "threshold": 0.5, "observed": 0.8,
            "requests": 40, "backend": "a", "workload": "w", "level": 0, "level_label": "concurrency 2",
            "scope": "window", "index": 0, "start": 1.0, "end": 2.0, "at": 2.01}  # fmt: skip


def test_the_judge_fails_a_run_whose_manifest_records_a_fired_abort_naming_the_rule():
    spec = small_spec("require failed == 0")
    b = EvidenceBuilder(spec)
    clean = judge(spec, b.build())
    assert clean.outcome == "PASS" and "abort_fired" not in [r.metric for r in clean.rules]
    b.manifest["aborts"] = [_fired()]
    v = judge(spec, b.build())
    assert v.outcome == "FAIL"
    (r,) = [r for r in v.rules if r.metric == "abort_fired"]
    assert r.status == "fail" and "abort ratio(errors) > 50% per window 1s" in r.message and "observed 80% over 40" in r.message
    b.manifest["aborts"] = ["garbage"]  # a malformed abort is still an abort
    assert judge(spec, b.build()).outcome == "FAIL"


@pytest.mark.parametrize(("rule", "observed", "said"), [
    (_rule(threshold=1.0, op=">="), 1.0, "observed 100% over 37 requests"),  # "observed 1" read as 1 error of 37
    (_rule(metric="latency", agg="max", threshold=1.0), 1.1234, "observed 1.12s over 37 requests"),
    (_rule(metric="ttft", agg="p", percentile=99.0, threshold=0.5), 0.0425, "observed 42.5ms over 37 requests"),
    (_rule(metric="failed", agg="count", threshold=3.0), 5.0, "observed 5 over 37 requests"),
])
def test_a_fired_abort_says_what_it_observed_in_its_rules_unit_to_the_runner_and_the_judge(rule, observed, said):
    """`soakspec run`'s line (`Fired.describe`) and the gate's abort_fired both print the value
    as the rule reads it: a ratio as a percentage, a time as a duration."""
    rule = dataclasses.replace(rule, text="abort the rule")
    fired = Fired(rule, "a", "w", 0, "concurrency 2", "bucket", 0, 1.0, 2.0, 2.01, observed, 37)
    assert fired.describe().endswith(f": {said}"), fired.describe()
    spec = small_spec("require failed == 0")
    b = EvidenceBuilder(spec)
    b.manifest["aborts"] = [fired.to_json()]
    assert validate("manifest", b.manifest) == []
    (r,) = [r for r in judge(spec, b.build()).rules if r.metric == "abort_fired"]
    assert f"fired: {said} (threshold" in r.message, r.message
    # a manifest from before `agg` was recorded: the rule's text names it
    old = {k: v for k, v in fired.to_json().items() if k not in ("agg", "percentile")}
    b.manifest["aborts"] = [dict(old, rule="abort ratio(errors) >= 100% per bucket", metric="errors", observed=1.0)]
    (r,) = [r for r in judge(spec, b.build()).rules if r.metric == "abort_fired"]
    assert "fired: observed 100% over 37 requests" in r.message, r.message


def test_the_manifest_schema_describes_aborts():
    spec = small_spec("require failed == 0")
    b = EvidenceBuilder(spec)
    b.manifest["aborts"] = [_fired()]
    assert validate("manifest", b.manifest) == []
    b.manifest["aborts"] = [dict(_fired(), scope="level")]
    assert [e for e in validate("manifest", b.manifest) if e.startswith("/aborts/0/scope")]


# ---------------------------------------------------------------- end to end (subprocess)


def _run(tmp_path: Path, text: str, name: str = "s.soak", extra: tuple[str, ...] = ()):
    path = tmp_path / name
    path.write_text(text)
    marker = new_marker()
    out = tmp_path / "ev"
    t = time.monotonic()
    proc = run_soakspec(["run", str(path), "--out", str(out), *extra], marker, tmp_path, timeout=120)
    took = time.monotonic() - t
    assert wait_no_survivors(marker) == []
    manifest = json.loads((out / "manifest.json").read_text())
    return proc, manifest, out, took


TWO_LEVELS = "mode = closed\n    concurrency = [2, 4]"


# --workers: the records arrive from the load processes as lines (the slow lane)
@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_an_abort_rule_fires_on_a_failing_simulator_and_stops_the_run_early(tmp_path, workers):
    rule = "abort ratio(errors) > 50% per window 1s"
    text = sim_spec(sim="ttft = 5ms\n    itl = 1ms\n    error_rate = 0.8", load=TWO_LEVELS, duration="8s", bucket="2s",
                    gate=f"require failed == 0\n  {rule}")
    # the simulator fails requests on purpose: no pre-flight (which would stop the run before any level)
    proc, manifest, out, took = _run(tmp_path, text, extra=("--workers", str(workers), "--no-preflight"))
    assert proc.returncode == 1, proc.stderr
    assert manifest["status"] == "complete"  # the run stopped as its spec asked, nothing crashed
    (fired,) = manifest["aborts"]
    assert (fired["rule"], fired["scope"], fired["index"], fired["level"]) == (rule, "window", 0, 0)
    assert fired["observed"] > 0.5 and fired["requests"] > 0 and fired["start"] < fired["end"] <= fired["at"]
    (be,) = manifest["backends"]
    assert len(be["levels"]) == 1 and be["levels"][0]["completed"] is False  # concurrency 4 never ran
    assert [b["index"] for b in be["levels"][0]["buckets"]] == [0]  # the windows that had begun, which its requests name
    assert "does not list" not in proc.stdout
    assert took < 16 / 2  # planned: 2 levels of 8 s
    assert f"abort rule '{rule}' fired" in proc.stderr
    assert "abort_fired" in proc.stdout and rule in proc.stdout
    rep = run_soakspec(["report", str(out), "--format", "md"], new_marker(), tmp_path)
    assert rep.returncode == 0 and rule in rep.stdout and "abort_fired" in rep.stdout
    gate = run_soakspec(["gate", str(out)], new_marker(), tmp_path)
    assert gate.returncode == 1 and rule in gate.stdout


@pytest.mark.slow
def test_fast_failures_among_slow_successes_do_not_abort_a_run_within_its_rule(tmp_path):
    """20% of requests fail at once, the rest stream for 1.5 s: `ratio(errors) > 60% per bucket`
    fired at the first bucket's end on "1 over 1 requests" (the bucket's only finished one),
    though no bucket fails more than about 20%; the run now completes and passes."""
    text = sim_spec(sim="ttft = 1500ms\n    itl = 5ms\n    error_rate = 0.2\n    seed = 3", load="mode = open\n    rate = [10rps]",
                    duration="3s", bucket="1s", gate="require ratio(failed) <= 60% per bucket\n  abort ratio(errors) > 60% per bucket")
    proc, manifest, _, _ = _run(tmp_path, text, extra=("--no-preflight",))
    assert manifest["aborts"] == [], manifest["aborts"]
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_healthy_simulator_without_abort_rules_runs_to_the_end(tmp_path):
    text = sim_spec(load=TWO_LEVELS, duration="2s", bucket="1s", gate="require failed == 0")
    proc, manifest, _, _ = _run(tmp_path, text)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert manifest["aborts"] == []
    assert [lv["completed"] for lv in manifest["backends"][0]["levels"]] == [True, True]


@pytest.mark.slow
def test_the_builtin_abort_fires_when_every_request_fails_and_can_be_turned_off(tmp_path):
    failing = "ttft = 5ms\n    itl = 1ms\n    error_rate = 1.0"
    text = sim_spec(sim=failing, load=TWO_LEVELS, duration="4s", bucket="1s", gate="require failed == 0")
    (tmp_path / "on").mkdir()
    proc, manifest, _, _ = _run(tmp_path / "on", text, extra=("--no-preflight",))
    assert proc.returncode == 1
    (fired,) = manifest["aborts"]
    assert fired["builtin"] is True and fired["scope"] == "bucket" and fired["observed"] == 1.0
    assert fired["requests"] >= DEFAULT_ABORT_MIN_REQUESTS
    assert len(manifest["backends"][0]["levels"]) == 1
    off = sim_spec(sim=failing, load=TWO_LEVELS, duration="1s", bucket="1s", gate="require failed == 0\n  abort_default = false")
    (tmp_path / "off").mkdir()
    proc, manifest, _, _ = _run(tmp_path / "off", off, extra=("--no-preflight",))
    assert proc.returncode == 1 and manifest["aborts"] == []
    assert [lv["completed"] for lv in manifest["backends"][0]["levels"]] == [True, True]


def _timing_abort(b: EvidenceBuilder, metric: str = "ttft") -> dict:
    """The runner's entry for `abort p95(<metric>) > 500ms per bucket` fired on bucket 0 of level 0."""
    lv = b.entry("a")["levels"][0]
    start = lv["measure_start"]
    return dict(_fired(f"abort p95({metric}) > 500ms per bucket"), metric=metric, threshold=0.5, observed=1.1,
                scope="bucket", index=0, start=start, end=start + 60.0, at=start + 61.0)


@pytest.mark.parametrize("metric", ["ttft", "schedule_lag"])
def test_a_timing_abort_where_the_load_generator_was_saturated_is_inconclusive_not_a_server_failure(metric):
    """A client stalled 1.2 s reads a 23 ms server's TTFT p95 as 1.1 s and fires `abort p95(ttft)
    > 500ms`: the README's client-health promise -- a timing figure beside a saturated bucket
    never FAILs the server -- holds for the abort the figure fired too. Where the client kept
    up, the same abort still FAILs, and `client_healthy = false` keeps it a FAIL."""
    spec = small_spec("require failed == 0", mode="open", levels="[2rps]")
    saturated = EvidenceBuilder(spec).with_client(lag=0.3)
    saturated.manifest["aborts"] = [_timing_abort(saturated, metric)]
    v = judge(spec, saturated.build())
    (r,) = [r for r in v.rules if r.metric == "abort_fired"]
    assert r.status == "inconclusive", r.message
    assert "load generator was saturated in bucket 0" in r.message and "event-loop lag p99 300 ms" in r.message
    assert v.outcome == "INCONCLUSIVE"

    healthy = EvidenceBuilder(spec).with_client()
    healthy.manifest["aborts"] = [_timing_abort(healthy, metric)]
    (r,) = [r for r in judge(spec, healthy.build()).rules if r.metric == "abort_fired"]
    assert r.status == "fail" and "saturated" not in r.message

    off = small_spec("require failed == 0", mode="open", levels="[2rps]", gate="client_healthy = false")
    (r,) = [r for r in judge(off, saturated.build()).rules if r.metric == "abort_fired"]
    assert r.status == "fail"


def _cut_by(b: EvidenceBuilder, abort: dict) -> EvidenceBuilder:
    """What the runner leaves when `abort` stops backend a's load in bucket 0 of its first level:
    that level cut at the abort (completed = false, only bucket 0 begun, its records up to the
    cut), the later level never run, the follow-up never sent (`runner/collect.py` NOT_SENT)."""
    from soakspec.runner.collect import NOT_SENT

    b.manifest["aborts"] = [abort]
    be = b.entry("a")
    lv = be["levels"][0]
    cut = lv["buckets"][0]["start"] + 30.0
    lv.update(completed=False, measure_end=cut, buckets=[dict(lv["buckets"][0], end=cut)])
    be["levels"] = [lv]
    b.records["a"] = [r for r in b.records["a"] if r["bucket"] >= 0 and r["level"] == 0 and r["start"] < cut]
    lv["sent"] = len(b.records["a"])
    b.followups["a"] = {"passed": False, "reason": NOT_SENT, "record": None, "required": True, "server_idle": None}
    return b


def test_a_run_cut_by_a_timing_abort_on_the_clients_lag_is_inconclusive_not_failed_for_being_cut():
    """`abort p95(ttft) > 500ms` fired on a load generator saturated in that bucket (the
    README: INCONCLUSIVE, exit 3, never a FAIL blamed on the server) and stopped the load as
    it must. But the spec's `require completed_run`, `require duration_coverage` and `require
    follow_up` then FAILed the run (exit 1) for the cut level, the level never run and the
    follow-up never sent -- the client's doing, through the abort the gate itself discounts.
    They are INCONCLUSIVE now, naming the abort; where the client kept up the cut stays a FAIL."""
    spec = small_spec("require completed_run\n  require duration_coverage\n  require follow_up\n  require failed == 0",
                      mode="open", levels="[2rps, 4rps]")
    saturated = EvidenceBuilder(spec).with_client(lag=0.3)
    v = judge(spec, _cut_by(saturated, _timing_abort(saturated)).build())
    by = {r.rule: r for r in v.rules}
    assert by["abort_fired"].status == "inconclusive", by["abort_fired"].message
    for name in ("completed_run", "duration_coverage", "follow_up"):
        assert by[name].status == "inconclusive", (name, by[name].message)
        assert "abort p95(ttft) > 500ms per bucket" in by[name].message and "lag" in by[name].message, by[name].message
    assert by["failed == 0"].status != "not_evaluated"
    assert v.outcome == "INCONCLUSIVE"

    healthy = EvidenceBuilder(spec).with_client()
    v = judge(spec, _cut_by(healthy, _timing_abort(healthy)).build())
    by = {r.rule: r for r in v.rules}
    assert all(by[n].status == "fail" for n in ("abort_fired", "completed_run", "duration_coverage", "follow_up"))
    assert v.outcome == "FAIL"

    errors = EvidenceBuilder(spec).with_client(lag=0.3)  # a count abort is the server's: the cut it made FAILs
    v = judge(spec, _cut_by(errors, dict(_timing_abort(errors), rule="abort ratio(errors) > 50% per bucket", metric="errors")).build())
    assert {r.rule: r for r in v.rules}["completed_run"].status == "fail" and v.outcome == "FAIL"


def test_an_error_abort_while_the_load_generator_was_saturated_still_fails():
    """Counts are the server's: a stalled client does not turn the server's errors into its own."""
    spec = small_spec("require failed == 0", mode="open", levels="[2rps]")
    b = EvidenceBuilder(spec).with_client(lag=0.3)
    b.manifest["aborts"] = [dict(_timing_abort(b), rule="abort ratio(errors) > 50% per bucket", metric="errors")]
    (r,) = [r for r in judge(spec, b.build()).rules if r.metric == "abort_fired"]
    assert r.status == "fail"
