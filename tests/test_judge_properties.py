"""Properties of `judge` on generated evidence (in-memory `Evidence`, no files).

The generated gates draw from rules for which a failed request can only hurt: outcome counts
bounded above, completion ratios bounded below, distributions and series of completed requests,
evidence checks. (Rules that count *all* requests upwards -- `requests >= 100`,
`min(in_flight) >= 2` -- are excluded on purpose: a failed request is a request.)
"""

from __future__ import annotations

import functools
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soakspec.judge import judge
from soakspec.judge.testing import EvidenceBuilder, small_spec

RULES = (
    "require failed == 0",
    "require errors <= 1 per level",
    "require timeouts == 0 per bucket",
    "require ratio(completed) >= 90% per level",
    "require ratio(failed) <= 10% per run",
    "require p50(ttft) <= 150ms per level",
    "require p95(latency) <= 2s",
    "require mean(ttft) <= 120ms per bucket",
    "require max(latency) <= 1.5s per level",
    "require min(qps) >= 0.05rps per level",
    "require max(in_flight) <= 1 per level",
    "require failed == 0 per window 20s",
    "require errors <= 1 per window 20s",
    "require bucket_coverage",
    "require duration_coverage",
    "require trace_coverage >= 90% per bucket",
    "require completed_run",
    "require follow_up",
    "warn drift(mean(latency)) <= 10% per level",
    "warn p99(ttft) <= 100ms",
)

PROFILE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@functools.lru_cache(maxsize=None)
def _spec(rules: tuple[str, ...], levels: str, minutes: int, traces: bool, backends: tuple[str, ...]):
    return small_spec("\n".join(rules), levels=levels, duration=f"{minutes}m", traces=traces, backends=backends)


MUTATIONS = ("fail", "timeout", "slow", "untrace", "drop_bucket", "fail_followup")


def _mutate(b: EvidenceBuilder, kind: str, seed: int) -> None:
    rnd = random.Random(seed)
    name = rnd.choice(sorted(b.records))
    measured = list(b.measured(name))
    if not measured:
        return
    r = rnd.choice(measured)
    if kind == "fail":
        b.set_outcome(r, "failed", rnd.choice(["engine died", "no [DONE]"]), status=200)
    elif kind == "timeout":
        b.set_outcome(r, "timeout", "deadline of 30s passed", status=None)
    elif kind == "slow":
        r["latency"] = 3.0
        r["end"] = r["intended_start"] + 3.0
    elif kind == "untrace":
        b.untrace(r["request_id"], name)
    elif kind == "drop_bucket":
        b.drop_bucket_requests(name, r["level"], r["bucket"])
    elif kind == "fail_followup":
        b.followups[name].update(passed=False, reason="HTTP 503")


@st.composite
def scenarios(draw):
    rules = tuple(draw(st.lists(st.sampled_from(RULES), min_size=1, max_size=6, unique=True)))
    levels = draw(st.sampled_from(["[2]", "[2, 4]"]))
    minutes = draw(st.integers(min_value=1, max_value=4))
    # `check` rejects trace_coverage over a backend without traces (E414)
    traces = draw(st.booleans()) or any("trace_coverage" in r for r in rules)
    backends = draw(st.sampled_from([("a",), ("a", "b")]))
    spec = _spec(rules, levels, minutes, traces, backends)
    b = EvidenceBuilder(spec, per_bucket=draw(st.integers(min_value=1, max_value=8)))
    for kind, seed in draw(st.lists(st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 2**32)), max_size=3)):
        _mutate(b, kind, seed)
    return spec, b


def _add_failed_request(b: EvidenceBuilder, seed: int) -> None:
    rnd = random.Random(seed)
    entry = rnd.choice(b.manifest["backends"])
    lv = rnd.choice(entry["levels"])
    bk = rnd.choice(lv["buckets"])
    start = bk["start"] + rnd.random() * (bk["end"] - bk["start"])
    r = b.request(entry["name"], lv["workload"], lv["index"], bk["index"], start, conc=lv["concurrency"], rate=lv["rate"])
    b.set_outcome(r, "failed", "injected failure", status=200)
    b.records[entry["name"]].append(r)


def _statuses(v):
    return [(r.rule, r.status) for r in v.rules]


@PROFILE
@given(scenarios(), st.integers(0, 2**32))
def test_adding_a_failed_request_never_makes_anything_pass(scenario, seed):
    """Adding a failed request never turns FAIL into PASS, and never turns any rule or verdict
    that was not PASS into PASS."""
    spec, b = scenario
    before = judge(spec, b.build())
    _add_failed_request(b, seed)
    after = judge(spec, b.build())
    if before.outcome != "PASS":
        assert after.outcome != "PASS"
    if before.outcome == "FAIL":
        assert after.outcome == "FAIL"
    for (rule, s0), (rule1, s1) in zip(_statuses(before), _statuses(after)):
        assert rule == rule1
        if s0 != "pass":
            assert s1 != "pass", (rule, s0, s1)


@PROFILE
@given(scenarios(), st.integers(0, 2**32))
def test_reordering_requests_never_changes_the_verdict(scenario, seed):
    """The order of rows in requests/traces/telemetry is irrelevant: the verdict JSON is identical."""
    spec, b = scenario
    before = judge(spec, b.build()).to_json()
    rnd = random.Random(seed)
    for rows in (*b.records.values(), *b.traces.values(), *b.telemetry.values()):
        rnd.shuffle(rows)
    assert judge(spec, b.build()).to_json() == before


@PROFILE
@given(scenarios(), st.integers(0, 2**32))
def test_removing_a_bucket_never_makes_evidence_complete(scenario, seed):
    """With one planned bucket's requests removed, the verdict is never PASS, the built-in sample
    check never passes, and a `require bucket_coverage` fails."""
    spec, b = scenario
    rnd = random.Random(seed)
    entry = rnd.choice(b.manifest["backends"])
    lv = rnd.choice(entry["levels"])
    bk = rnd.choice(lv["buckets"])
    b.drop_bucket_requests(entry["name"], lv["index"], bk["index"])
    v = judge(spec, b.build())
    assert v.outcome != "PASS"
    assert next(r for r in v.rules if r.rule == "min_samples").status != "pass"
    for r in v.rules:
        if r.rule == "bucket_coverage":
            assert r.status == "fail"


@PROFILE
@given(scenarios())
def test_judging_twice_gives_the_same_result(scenario):
    """judge is a pure function of (spec, evidence)."""
    spec, b = scenario
    ev = b.build()
    first, second = judge(spec, ev), judge(spec, ev)
    assert first == second
    assert first.to_json() == second.to_json()
    assert first.exit_code == {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3}[first.outcome]


_EXPECT = {"<=": "pass", "<": "fail", ">=": "pass", ">": "fail", "==": "pass", "!=": "fail"}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5000), min_size=16, max_size=16), st.integers(0, 3), st.sampled_from(sorted(_EXPECT)))
def test_threshold_exactly_at_the_observed_value_follows_the_operator(latencies_ms, n_failed, op):
    """`<=`, `>=` and `==` pass at the boundary; `<`, `>` and `!=` fail."""
    top = max(latencies_ms)
    spec = _spec((f"require max(latency) {op} {top}ms per level", f"require failed {op} {n_failed}"), "[2]", 2, True, ("a",))
    b = EvidenceBuilder(spec)
    measured = list(b.measured("a"))
    for r, ms in zip(measured, latencies_ms):
        r["latency"] = ms * 1e-3
        r["end"] = r["intended_start"] + ms * 1e-3
    # failures go to requests other than the slowest, which must stay completed
    slow = {r["request_id"] for r, ms in zip(measured, latencies_ms) if ms == top}
    for r in [r for r in measured if r["request_id"] not in slow][:n_failed]:
        b.set_outcome(r, "failed", "x")
    v = judge(spec, b.build())
    lat = next(r for r in v.rules if r.rule.startswith("max(latency)"))
    cnt = next(r for r in v.rules if r.rule.startswith("failed"))
    assert lat.status == _EXPECT[op], lat.message
    assert cnt.status == _EXPECT[op], cnt.message
