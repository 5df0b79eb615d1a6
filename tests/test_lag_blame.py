"""A timing FAIL that the load generator's own schedule lag decided is INCONCLUSIVE, never the
server's (README "Client health": "the schedule lag within its allowance").

Seen on a real vLLM sweep: an open-loop probe at 12 rps FAILed `p50(ttft) < 250ms` at 304 ms
while the client sent each request 159 ms late (p50; within the lane's client_schedule_lag of
1 s, so no bucket was saturated) and the server's own first tokens all came within 250 ms of
the send. TTFT from the intended start is right to hold the lateness (coordinated omission),
but when the lateness is what carries it over the threshold the verdict must not blame the
server. A figure the server fails from the send too and a closed loop keep their FAIL. At a
capped level (max_concurrency) the figure is ttft - schedule_lag: the wait for a slot under the
user's declared cap stays in it, only the client's lateness after the slot comes out; a FAIL
the cap's wait carries stands."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from soakspec.judge import judge
from soakspec.judge.testing import EvidenceBuilder, small_spec

RULE = "p50(ttft) < 250ms per level"
ALLOWANCE = "client_schedule_lag = 1s"  # the lane's: a client 160 ms late is not saturated


def _spec(rule: str = RULE, *, mode: str = "open", levels: str = "[2rps]", gate: str = ALLOWANCE):
    return small_spec(f"require {rule}", mode=mode, levels=levels, gate=gate)


def _timed(b: EvidenceBuilder, *, lag: float, ttft: float, level: int | None = None) -> EvidenceBuilder:
    """Every measured request sent `lag` after its intended start and answered its first token
    `ttft` after the send (its end 1 s after the first token); ttft and latency from the intended
    start, as the runner writes them."""
    for r in b.measured("a", level):
        i = r["intended_start"]
        start = i + lag
        r.update(start=start, first_byte=start + ttft - 0.01, first_token=start + ttft, end=start + ttft + 1.0,
                 ttft=lag + ttft, latency=lag + ttft + 1.0)
    return b


def _rule(v, text: str = RULE):
    return next(r for r in v.rules if r.rule == text)


def test_a_fail_the_clients_schedule_lag_decides_is_inconclusive_naming_both_figures_and_the_lag():
    spec = _spec()
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    ttft = _rule(v)
    health = _rule(v, "client_healthy")
    assert health.status == "pass", health.message  # 160 ms late is within the allowance: no saturated bucket
    assert ttft.status == "inconclusive", ttft.message
    assert ttft.message.startswith("not judged, the load generator's own schedule lag decided it: backend a, rate 2 rps: "), ttft.message
    assert "p50(ttft) = 305ms fails < 250ms" in ttft.message, ttft.message
    assert "measured from the actual send (p50(sent_ttft)) it is 145ms" in ttft.message, ttft.message
    assert "schedule lag (p50(schedule_lag) = 160ms) decides it" in ttft.message, ttft.message
    assert v.outcome == "INCONCLUSIVE"


def test_latency_is_judged_the_same_way():
    rule = "p50(latency) < 1.25s per level"
    spec = _spec(rule)
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    assert _rule(v, rule).status == "inconclusive" and "p50(sent_latency)" in _rule(v, rule).message
    assert v.outcome == "INCONCLUSIVE"


def test_a_server_slow_from_the_send_too_still_fails():
    spec = _spec()
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.3).build())
    ttft = _rule(v)
    assert ttft.status == "fail", ttft.message
    assert "schedule lag" not in ttft.message and "not judged" not in ttft.message
    assert v.outcome == "FAIL"


def test_the_fail_stands_on_the_level_the_server_failed_and_names_the_one_the_lag_decided():
    spec = _spec(levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    _timed(b, lag=0.2, ttft=0.145, level=0)  # the worst level, but the lag's
    _timed(b, lag=0.0, ttft=0.3, level=1)  # the server's own
    v = judge(spec, b.build())
    ttft = _rule(v)
    assert ttft.status == "fail", ttft.message
    assert ttft.message.startswith("backend a, rate 4 rps: p50(ttft) = 300ms"), ttft.message
    assert "1 failing level discounted, the load generator's own schedule lag decided it: backend a, rate 2 rps" in ttft.message
    assert ttft.failing == 1 and ttft.where.level == 1
    assert v.outcome == "FAIL"


def test_a_capped_levels_wait_for_a_slot_is_the_users_and_its_fail_stands():
    """Under max_concurrency the time from the intended start holds the wait for a slot under
    the declared cap (what users see), not only the client's lateness: the FAIL stands."""
    spec = _spec(levels="[2rps]\n    max_concurrency = 1", gate="")
    b = EvidenceBuilder(spec, scheduled=False).with_client()
    recs = sorted(b.measured("a"), key=lambda r: r["intended_start"])
    for prev, r in zip(recs, recs[1:]):  # each waited 200 ms for the slot the one before held
        r["admitted"] = r["start"] + 0.2
        for k in ("start", "first_byte", "first_token", "end"):
            r[k] += 0.2
        r["latency"] = r["ttft"] = None  # derived from the intended start
        prev["end"], prev["latency"] = r["admitted"], None
    v = judge(spec, b.build())
    assert _rule(v, "client_healthy").status == "pass", _rule(v, "client_healthy").message
    ttft = _rule(v)
    assert ttft.status == "fail", ttft.message  # p50(ttft) 300 ms, p50(sent_ttft) 100 ms: the cap's wait
    assert v.outcome == "FAIL"


CAPPED = "[2rps]\n    max_concurrency = 8"


def _capped(b: EvidenceBuilder, *, wait: float, lag: float, ttft: float) -> EvidenceBuilder:
    """A level under max_concurrency: every measured request waited `wait` for its slot
    (`admitted` that long after its intended start; none where it waited none), was sent `lag`
    after the slot, and answered its first token `ttft` after the send (its end 100 ms after
    that); ttft and latency from the intended start, derived as the runner's reader derives them."""
    for r in b.measured("a"):
        i = r["intended_start"]
        start = i + wait + lag
        r.update(admitted=i + wait if wait else None, start=start, first_byte=start + ttft - 0.01, first_token=start + ttft,
                 end=start + ttft + 0.1, ttft=None, latency=None)
    return b


def test_a_capped_fail_the_clients_lag_decides_is_inconclusive_and_says_the_slots_wait_is_kept():
    """At a capped open-loop level each request waited 50 ms for a slot, then the client sent it
    160 ms late (within its allowance), and the server answered in 145 ms: p50(ttft) 355 ms fails
    < 250ms. Less the client's own lateness (ttft - schedule_lag: the slot's 50 ms kept) it is
    195 ms: the lag decided it, so INCONCLUSIVE, saying what the figure is. Before, every capped
    level kept the FAIL."""
    spec = _spec(levels=CAPPED)
    v = judge(spec, _capped(EvidenceBuilder(spec, scheduled=False).with_client(), wait=0.05, lag=0.16, ttft=0.145).build())
    assert _rule(v, "client_healthy").status == "pass", _rule(v, "client_healthy").message
    ttft = _rule(v)
    assert ttft.status == "inconclusive", ttft.message
    assert ttft.message.startswith("not judged, the load generator's own schedule lag decided it: backend a, "), ttft.message
    assert ("p50(ttft) = 355ms fails < 250ms, but measured less the load generator's own lateness (p50(ttft - schedule_lag), "
            "the wait for a slot under max_concurrency kept) it is 195ms: the load generator's own schedule lag "
            "(p50(schedule_lag) = 160ms) decides it") in ttft.message, ttft.message
    assert v.outcome == "INCONCLUSIVE"
    rule = "p50(latency) < 350ms per level"
    spec = _spec(rule, levels=CAPPED)
    v = judge(spec, _capped(EvidenceBuilder(spec, scheduled=False).with_client(), wait=0.05, lag=0.16, ttft=0.145).build())
    assert _rule(v, rule).status == "inconclusive" and "p50(latency - schedule_lag)" in _rule(v, rule).message, _rule(v, rule).message


def test_a_capped_fail_the_slots_wait_carries_over_still_fails():
    """The same client lateness, but each request waited 150 ms for its slot: less the client's
    lateness it is 295 ms, still over 250 ms -- the wait behind the user's cap is what users
    see (and the send figure, 145 ms, would have hidden it): the FAIL stands."""
    spec = _spec(levels=CAPPED)
    v = judge(spec, _capped(EvidenceBuilder(spec, scheduled=False).with_client(), wait=0.15, lag=0.16, ttft=0.145).build())
    ttft = _rule(v)
    assert ttft.status == "fail", ttft.message
    assert "schedule lag" not in ttft.message and "not judged" not in ttft.message
    assert v.outcome == "FAIL"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wait=st.floats(0.0, 0.2), ttft=st.floats(0.01, 0.24), lag=st.floats(0.0, 2.0))
def test_schedule_lag_never_turns_a_capped_servers_pass_into_a_fail(wait, ttft, lag):
    """At a capped level too: a server and cap whose first tokens all came in time from the
    intended start when the client sent on time (the slot's wait included) are never FAILed for
    the client's lateness after the slot."""
    assume(wait + ttft < 0.249)  # on time, it passes
    spec = _spec(levels=CAPPED)
    on_time = judge(spec, _capped(EvidenceBuilder(spec, scheduled=False).with_client(), wait=wait, lag=0.0, ttft=ttft).build())
    assert _rule(on_time).status == "pass", _rule(on_time).message
    late = judge(spec, _capped(EvidenceBuilder(spec, scheduled=False).with_client(), wait=wait, lag=lag, ttft=ttft).build())
    assert _rule(late).status != "fail", _rule(late).message
    assert late.outcome != "FAIL"


def test_a_closed_loop_is_unchanged():
    spec = _spec(mode="closed", levels="[2]", gate="")
    b = EvidenceBuilder(spec)  # (no client samples: the builder's closed loop is sparser than its concurrency)
    for r in b.measured("a"):
        r.update(first_token=r["start"] + 0.3, ttft=0.3, first_byte=r["start"] + 0.29)
    v = judge(spec, b.build())
    assert _rule(v).status == "fail" and v.outcome == "FAIL"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ttft=st.floats(0.01, 0.24), lag=st.floats(0.0, 2.0))
def test_schedule_lag_never_turns_a_servers_pass_into_a_fail(ttft, lag):
    """Whatever the load generator's lateness, a server whose first tokens all came in time from
    the send is never FAILed for it: the run is PASS where the lag leaves it under the threshold,
    INCONCLUSIVE where the lag decides it (or saturates the client)."""
    spec = _spec()
    on_time = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.0, ttft=ttft).build())
    assert _rule(on_time).status == "pass"
    late = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=lag, ttft=ttft).build())
    assert _rule(late).status != "fail", _rule(late).message
    assert late.outcome != "FAIL"


def test_a_sweep_probe_the_lag_decided_neither_holds_nor_fails():
    """The finding itself: the runner's own judgement of an open-loop probe (`probe_judge`),
    its client healthy within the allowance, sent 160 ms late: INCONCLUSIVE, not the server's
    failure at that rate."""
    from soakspec.judge.sweep import probe_judge
    from soakspec.judge.testing import client_rows, spec_from_text

    head = ('soak "s" {}\nbackend "b0" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "host-staged"\n  }\n}\n'
            'workload "w0" {\n  load {\n    mode = open\n    rate = [2rps, 3rps]\n    %s  }\n  duration = 1m\n  bucket = 20s\n'
            '  deadline = 30s\n  follow_up = false\n}\n' f"gate {{\n  {ALLOWANCE}\n  require {RULE}\n}}\n")
    spec = spec_from_text(head % "rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7\n")
    b = EvidenceBuilder(spec_from_text(head % "seed = 7\n"), per_bucket=40)
    lv1 = b.manifest["backends"][0]["levels"][1]
    b.client["b0"] = client_rows("b0", lv1["started_at"], lv1["drained_at"] + 1.0)
    for r in b.records["b0"]:
        if r["level"] == 1 and r["bucket"] >= 0:
            start = r["intended_start"] + 0.16
            r.update(start=start, first_byte=start + 0.1, first_token=start + 0.145, end=start + 1.145, ttft=0.305, latency=1.305)
    ev = b.build()
    rows = [dict(r) for r in ev.backends[0].records if r.get("level") == 1]
    holds, why = probe_judge(spec)("b0", dict(ev.backends[0].entry["levels"][1]), rows, b.client["b0"])
    assert not holds
    assert why.startswith(f"INCONCLUSIVE: {RULE}: INCONCLUSIVE — not judged, the load generator's own schedule lag decided it"), why


@pytest.mark.parametrize("wait", [0.05, 0.2], ids=["the lag decided it", "the slot's wait carries it"])
def test_a_capped_sweep_probe_the_lag_decided_neither_holds_nor_fails(wait):
    """The same probe under max_concurrency: each request waited `wait` for its slot, then was
    sent 160 ms late. Less the client's lateness (the slot's wait kept) 50 ms of wait leaves
    195 ms, under 250 ms: INCONCLUSIVE; 200 ms leaves 345 ms: the server's (and its cap's) fail."""
    from soakspec.judge.sweep import probe_judge
    from soakspec.judge.testing import client_rows, spec_from_text

    head = ('soak "s" {}\nbackend "b0" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "host-staged"\n  }\n}\n'
            'workload "w0" {\n  load {\n    mode = open\n    rate = [2rps, 3rps]\n    max_concurrency = 8\n    %s  }\n'
            '  duration = 1m\n  bucket = 20s\n  deadline = 30s\n  follow_up = false\n}\n' f"gate {{\n  {ALLOWANCE}\n  require {RULE}\n}}\n")
    spec = spec_from_text(head % "rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7\n")
    b = EvidenceBuilder(spec_from_text(head % "seed = 7\n"), per_bucket=40)
    lv1 = b.manifest["backends"][0]["levels"][1]
    b.client["b0"] = client_rows("b0", lv1["started_at"], lv1["drained_at"] + 1.0)
    for r in b.records["b0"]:
        if r["level"] == 1 and r["bucket"] >= 0:
            start = r["intended_start"] + wait + 0.16
            r.update(admitted=r["intended_start"] + wait, start=start, first_byte=start + 0.1, first_token=start + 0.145,
                     end=start + 0.245, ttft=None, latency=None)
    ev = b.build()
    rows = [dict(r) for r in ev.backends[0].records if r.get("level") == 1]
    holds, why = probe_judge(spec)("b0", dict(ev.backends[0].entry["levels"][1]), rows, b.client["b0"])
    assert not holds
    if wait == 0.2:
        assert why.startswith(f"{RULE}: FAIL"), why
        return
    assert why.startswith(f"INCONCLUSIVE: {RULE}: INCONCLUSIVE — not judged, the load generator's own schedule lag decided it"), why
    assert "(p50(ttft - schedule_lag), the wait for a slot under max_concurrency kept) it is 195ms" in why, why


def test_client_healthy_false_judges_the_times_as_measured():
    spec = _spec(gate="client_healthy = false")
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    assert _rule(v).status == "fail" and v.outcome == "FAIL"


def _saturated_and_lagged():
    """Level 0 (2 rps) fails p50(ttft) beside a saturated bucket; level 1 (4 rps) fails only by
    the client's 200 ms schedule lag."""
    from soakspec.judge.testing import client_rows

    spec = _spec(levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    w = next(x for x in b.level("a", 0)["buckets"] if x["index"] == 1)  # level 0's bucket 1: event-loop lag 300 ms
    b.client["a"] = [client_rows("a", r["start"], r["t"], lag=0.3)[0] if w["start"] <= (r["start"] + r["t"]) / 2 < w["end"]
                     else r for r in b.client["a"]]
    _timed(b, lag=0.0, ttft=0.3, level=0)
    _timed(b, lag=0.2, ttft=0.145, level=1)
    return judge(spec, b.build())


def test_one_level_beside_a_saturated_bucket_and_one_the_lag_decided_is_inconclusive():
    """Both failing levels are the client's, for two reasons: neither is the server's FAIL."""
    v = _saturated_and_lagged()
    ttft = _rule(v)
    assert ttft.status == "inconclusive", ttft.message
    assert ttft.message.startswith("not judged, the load generator was saturated (backend a, rate 2 rps, bucket 1"), ttft.message
    assert v.outcome == "INCONCLUSIVE"


def test_a_mixed_inconclusive_names_both_causes():
    """The INCONCLUSIVE named the saturated bucket only: the 4 rps level, which the schedule
    lag decided, read as if it too were beside the saturation (or as the server's figure). Both
    causes are said, the lag-decided level with its figures."""
    msg = _rule(_saturated_and_lagged()).message
    assert ("; 1 failing level discounted, the load generator's own schedule lag decided it: backend a, rate 4 rps: "
            "p50(ttft) = 345ms fails < 250ms, but measured from the actual send (p50(sent_ttft)) it is 145ms") in msg, msg
    assert msg.index("saturated") < msg.index("schedule lag decided it") < msg.index("; it measured: "), msg


def test_a_send_figure_that_cannot_be_judged_is_said_so_not_that_it_does_not_fail():
    """Few requests at p99: the send figure is INCONCLUSIVE (too few samples), the ttft figure
    FAILs only by the lag. The message said "it does not fail (... needs N more)" -- read as a
    contradiction by a reviewer; it says the server's own figure cannot be judged."""
    rule = "p99(ttft) < 250ms per level"
    spec = _spec(rule)
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    r = _rule(v, rule)
    assert r.status == "inconclusive", r.message
    assert "measured from the actual send (p99(sent_ttft)) it cannot be judged (" in r.message, r.message
    assert "it does not fail" not in r.message


def _abort(b: EvidenceBuilder, rule: str = "abort p95(ttft) > 300ms per bucket", observed: float = 0.305) -> dict:
    """The runner's manifest entry for `rule` fired on bucket 0 of backend a's level 0."""
    lv = b.entry("a")["levels"][0]
    w = lv["buckets"][0]
    metric = rule.split("(")[1].split(")")[0]
    threshold = float(rule.rsplit(" ", 3)[1].removesuffix("ms")) / 1000
    return {"rule": rule, "builtin": False, "metric": metric, "op": ">", "threshold": threshold, "observed": observed,
            "agg": "p", "percentile": 95.0, "requests": 20, "backend": "a", "workload": lv["workload"], "level": 0,
            "level_label": "rate 2 rps", "scope": "bucket", "index": 0, "start": w["start"], "end": w["end"], "at": w["end"] + 1}


def _abort_result(v):
    return next(r for r in v.rules if r.metric == "abort_fired")


def test_an_abort_the_schedule_lag_alone_fired_is_not_judged_a_failure():
    """`abort p95(ttft) > 300ms per bucket` fired at 305 ms on a client sending 160 ms late
    (within its client_schedule_lag: no saturated bucket) to a server answering in 145 ms: the
    abort still stopped the load (the runner's), but the gate does not FAIL the server for it."""
    spec = _spec("failed == 0")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145)
    b.manifest["aborts"] = [_abort(b)]
    v = judge(spec, b.build())
    r = _abort_result(v)
    assert _rule(v, "client_healthy").status == "pass"
    assert r.status == "inconclusive", r.message
    assert ("not judged a failure: the load generator's own schedule lag decided it (from the send it is 145ms: "
            "p95(sent_ttft) over the same requests does not fire > 300ms; p95(schedule_lag) = 160ms)") in r.message, r.message
    assert v.outcome == "INCONCLUSIVE"


def test_an_abort_written_before_the_entry_held_its_aggregate_is_read_from_its_rule():
    spec = _spec("failed == 0")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145)
    old = {k: v for k, v in _abort(b, "abort p95(latency) > 1200ms per bucket", 1.305).items() if k not in ("agg", "percentile")}
    b.manifest["aborts"] = [old]
    r = _abort_result(judge(spec, b.build()))
    assert r.status == "inconclusive" and "p95(sent_latency)" in r.message, r.message


def test_an_abort_the_servers_own_times_fired_still_fails():
    spec = _spec("failed == 0")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.3)  # 300 ms from the send: over 250 ms
    b.manifest["aborts"] = [_abort(b, "abort p95(ttft) > 250ms per bucket", 0.46)]
    v = judge(spec, b.build())
    r = _abort_result(v)
    assert r.status == "fail" and "schedule lag" not in r.message, r.message
    assert v.outcome == "FAIL"
    off = _spec("failed == 0", gate=f"{ALLOWANCE}\n  client_healthy = false")  # the client's checks off: as measured
    b = _timed(EvidenceBuilder(off).with_client(), lag=0.16, ttft=0.145)
    b.manifest["aborts"] = [_abort(b)]
    assert _abort_result(judge(off, b.build())).status == "fail"


@pytest.mark.parametrize("wait", [0.05, 0.2], ids=["the lag fired it", "the slot's wait fired it"])
def test_an_abort_at_a_capped_level_fails_where_the_slots_wait_carries_it(wait):
    """Under max_concurrency the time from the intended start holds the wait for a slot under
    the user's declared cap (what users waited) and the client's lateness after it. `abort
    p95(ttft) > 300ms` fired: where the figure less the client's lateness (ttft - schedule_lag,
    the slot's wait kept) fires too, the FAIL stands; where only the lateness carried it over,
    it is not judged a failure, and says what the figure is."""
    spec = _spec("failed == 0", levels=CAPPED)
    b = _capped(EvidenceBuilder(spec, scheduled=False).with_client(), wait=wait, lag=0.16, ttft=0.145)
    b.manifest["aborts"] = [_abort(b, observed=wait + 0.305)]
    v = judge(spec, b.build())
    r = _abort_result(v)
    if wait == 0.2:
        assert r.status == "fail" and "schedule lag" not in r.message, r.message
        assert v.outcome == "FAIL"
        return
    assert r.status == "inconclusive", r.message
    assert ("not judged a failure: the load generator's own schedule lag decided it (less the load generator's own lateness, "
            "the wait for a slot under max_concurrency kept, it is 195ms: p95(ttft - schedule_lag) over the same requests does "
            "not fire > 300ms; p95(schedule_lag) = 160ms)") in r.message, r.message
    assert v.outcome == "INCONCLUSIVE"


def test_a_run_cut_by_an_abort_the_lag_decided_is_not_failed_for_being_cut():
    spec = _spec("completed_run\n  require failed == 0", levels="[2rps, 4rps]")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145)
    b.manifest["aborts"] = [_abort(b)]
    lv = b.entry("a")["levels"][0]
    lv["completed"] = False
    b.entry("a")["levels"] = [lv]
    b.records["a"] = [r for r in b.records["a"] if r["level"] == 0]
    v = judge(spec, b.build())
    cut = _rule(v, "completed_run")
    assert cut.status == "inconclusive" and "its schedule lag decided it" in cut.message, cut.message


def test_a_warn_the_schedule_lag_decided_stays_warn_and_says_so():
    spec = small_spec(f"warn {RULE}\n  require failed == 0", mode="open", levels="[2rps]", gate=ALLOWANCE)
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    w = _rule(v)
    assert w.status == "warn", w.message
    assert ("1 warning level not the server's own time, the load generator's own schedule lag decided it: backend a, "
            "rate 2 rps: p50(ttft) = 305ms fails < 250ms, but measured from the actual send (p50(sent_ttft)) it is 145ms") in w.message, w.message
    assert v.outcome == "PASS"  # a warn never decides the verdict
    slow = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.3).build())
    assert _rule(slow).status == "warn" and "schedule lag" not in _rule(slow).message


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ttft=st.floats(0.05, 0.6), lag=st.floats(0.0, 0.5))
def test_an_ttft_abort_is_the_servers_failure_exactly_when_its_figure_from_the_send_fires_too(ttft, lag):
    """Whatever the lateness (within the allowance) and the server's time: an abort that fired
    stays a FAIL where the server's own time from the send is over its threshold, and is never
    one where only the lateness carried it over."""
    assume(abs(ttft - 0.3) > 1e-6 and abs(lag + ttft - 0.3) > 1e-6)  # not on the threshold: the stamps' rounding decides there
    spec = _spec("failed == 0")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=lag, ttft=ttft)
    b.manifest["aborts"] = [_abort(b, "abort p95(ttft) > 300ms per bucket", lag + ttft)]
    r = _abort_result(judge(spec, b.build()))
    lag_alone = ttft <= 0.3 < lag + ttft
    assert r.status == ("inconclusive" if lag_alone else "fail"), r.message
