"""Rule semantics: samples, thresholds, scopes, drift and slope, warn rules, class ordering."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.evidence import schema
from soakspec.judge import Integrity, join, judge, judge_run, render_text, summarize, summarize_run
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.lang.spec import Traces


def rule(v, name):
    return next(r for r in v.rules if r.rule == name)


def set_ttft(r, value):
    r["ttft"] = value
    r["first_token"] = r["intended_start"] + value


def set_latency(r, value):
    r["latency"] = value
    r["end"] = r["intended_start"] + value


# ---------------------------------------------------------------- samples


def test_percentile_with_too_few_samples_is_inconclusive():
    spec = small_spec("require p99(ttft) <= 1s per level")
    v = judge(spec, EvidenceBuilder(spec).build())  # 2 buckets x 8 requests
    r = rule(v, "p99(ttft) <= 1s per level")
    assert r.status == "inconclusive"
    assert r.needs == 299 - 16
    assert "from only 16 requests; needs 283 more; p99 at 95% confidence needs 299" in r.message
    assert v.outcome == "INCONCLUSIVE" and v.exit_code == 3


def test_percentile_with_enough_samples_passes():
    spec = small_spec("require p99(ttft) <= 1s per level")
    v = judge(spec, EvidenceBuilder(spec, per_bucket=150).build())
    r = rule(v, "p99(ttft) <= 1s per level")
    assert r.status == "pass", r.message
    assert r.samples == 300
    assert r.observed_text == "p99(ttft) = 100ms"


def test_gate_min_samples_raises_the_bar():
    spec = small_spec("require p50(ttft) <= 1s per level", gate="min_samples = 40")
    v = judge(spec, EvidenceBuilder(spec).build())
    r = rule(v, "p50(ttft) <= 1s per level")
    assert r.status == "inconclusive" and r.needs == 24
    assert "the gate's min_samples 40" in r.message
    assert rule(v, "min_samples").status == "inconclusive"


def test_certain_violation_fails_even_with_few_samples():
    spec = small_spec("require p99(ttft) <= 1s per level")
    b = EvidenceBuilder(spec)
    for r in list(b.measured("a"))[:8]:
        set_ttft(r, 5.0)
    v = judge(spec, b.build())
    r = rule(v, "p99(ttft) <= 1s per level")
    assert r.status == "fail"
    assert "enough samples violate the threshold" in r.message


def test_one_slow_request_in_few_samples_stays_inconclusive():
    spec = small_spec("require p99(ttft) <= 1s per level")
    b = EvidenceBuilder(spec)
    set_ttft(next(b.measured("a")), 5.0)
    v = judge(spec, b.build())
    assert rule(v, "p99(ttft) <= 1s per level").status == "inconclusive"


@pytest.mark.parametrize(("op", "status"), [("<=", "pass"), ("<", "fail"), (">=", "pass"), (">", "fail"), ("==", "pass"), ("!=", "fail")])
def test_threshold_at_the_observed_value_follows_the_operator(op, status):
    spec = small_spec(f"require p50(ttft) {op} 100ms per level")
    v = judge(spec, EvidenceBuilder(spec).build())
    r = rule(v, f"p50(ttft) {op} 100ms per level")
    assert r.observed == pytest.approx(0.1)
    assert r.status == status


def test_warn_rule_reports_but_never_fails():
    spec = small_spec("require failed == 0\nwarn max(latency) <= 500ms")
    v = judge(spec, EvidenceBuilder(spec).build())
    r = rule(v, "max(latency) <= 500ms")
    assert r.status == "warn" and r.severity == "warn"
    assert "max(latency) = 1s" in r.message
    assert v.outcome == "PASS"
    assert "1 warning" in v.summary()


# ---------------------------------------------------------------- scopes and missing data


def test_empty_scope_is_inconclusive_never_a_pass():
    spec = small_spec("require failed == 0 per window 10s")
    v = judge(spec, EvidenceBuilder(spec, per_bucket=2).build())  # requests at 0s and 30s of each minute
    r = rule(v, "failed == 0 per window 10s")
    assert r.status == "inconclusive"
    assert "no measured requests" in r.message
    assert r.instances == 12
    assert v.outcome == "INCONCLUSIVE"


def test_window_scope_names_the_window():
    spec = small_spec("require failed == 0 per window 30s")
    b = EvidenceBuilder(spec)
    bad = list(b.measured("a", bucket=1))[5]  # 37.5 s into bucket 1: window 3
    b.set_outcome(bad, "failed", "boom", status=500)
    v = judge(spec, b.build())
    r = rule(v, "failed == 0 per window 30s")
    assert r.status == "fail"
    assert r.where.bucket == 3 and r.where.end - r.where.start == pytest.approx(30.0)
    assert r.message.startswith("backend a, concurrency 2, window 3 [")
    assert r.message.endswith(': 1 failed request (HTTP 500: "boom")')


def test_per_bucket_count_rule_reports_every_failing_bucket():
    spec = small_spec("require errors == 0 per bucket", duration="4m")
    b = EvidenceBuilder(spec)
    for k in (0, 2, 3):
        b.set_outcome(next(b.measured("a", bucket=k)), "disconnected", "connection reset", status=None)
    v = judge(spec, b.build())
    r = rule(v, "errors == 0 per bucket")
    assert r.status == "fail" and r.failing == 3 and r.instances == 4
    assert [d.where.bucket for d in r.details] == [0, 2, 3]


def test_backend_target_and_run_scope():
    spec = small_spec('require failed == 0 on "b"\nrequire ratio(completed) >= 95% per run', backends=("a", "b"))
    b = EvidenceBuilder(spec)
    b.set_outcome(next(b.measured("a")), "failed", "x")
    v = judge(spec, b.build())
    assert rule(v, 'failed == 0 on "b"').status == "pass"
    r = rule(v, "ratio(completed) >= 95% per run")
    assert r.status == "pass" and r.samples == 32
    assert r.observed == pytest.approx(31 / 32)


def test_no_traces_declared():
    """`check` rejects this spec (E414); the judge still says why if handed one."""
    spec = small_spec("require trace_coverage >= 90% per bucket")
    spec = dataclasses.replace(spec, backends=tuple(dataclasses.replace(b, traces=Traces()) for b in spec.backends))
    v = judge(spec, EvidenceBuilder(spec).build())
    r = rule(v, "trace_coverage >= 90% per bucket")
    assert r.status == "fail"
    assert "declares no traces" in r.message


def test_evidence_failure_blocks_performance():
    spec = small_spec("require bucket_coverage\nrequire failed == 0")
    b = EvidenceBuilder(spec)
    b.drop_bucket_requests("a", 0, 0)
    b.set_outcome(next(b.measured("a")), "failed", "x")
    v = judge(spec, b.build())
    assert rule(v, "bucket_coverage").status == "fail"
    assert rule(v, "failed == 0").status == "not_evaluated"
    assert v.outcome == "FAIL"


def test_bucket_with_only_failures_is_not_covered():
    spec = small_spec("require bucket_coverage")
    b = EvidenceBuilder(spec)
    for r in b.measured("a", bucket=1):
        b.set_outcome(r, "failed", "x")
    v = judge(spec, b.build())
    assert "no completed request (of 8 measured)" in rule(v, "bucket_coverage").message


def test_unverified_evidence_is_inconclusive():
    spec = small_spec()
    ev = EvidenceBuilder(spec).build()
    v = judge(spec, dataclasses.replace(ev, integrity=Integrity(verified=False)))
    assert rule(v, "artifacts_verified").status == "inconclusive"
    assert v.outcome == "INCONCLUSIVE"


def test_no_artifact_checked_is_never_a_pass():
    """Verified, but nothing compared with a sha256 -- a manifest that lists no artifact, or one
    never finalized (its files never hashed): INCONCLUSIVE saying so, not 'all 0 artifacts match'."""
    from soakspec.judge.evidence import Finding

    spec = small_spec()
    ev = dataclasses.replace(EvidenceBuilder(spec).build(), root="/evidence/run1")  # as read from a directory
    v = judge(spec, dataclasses.replace(ev, integrity=Integrity(checked=0, verified=True)))
    r = rule(v, "artifacts_verified")
    assert r.status == "inconclusive" and v.outcome == "INCONCLUSIVE", r.message
    assert "the manifest lists no artifact: nothing was checked against a sha256" in r.message
    unhashed = Finding("manifest.json", "V204", "6 files never hashed: the run did not finalize its manifest")
    v = judge(spec, dataclasses.replace(ev, integrity=Integrity(checked=0, incomplete=(unhashed,), verified=True)))
    r = rule(v, "artifacts_verified")
    assert r.status == "inconclusive" and "all 0 artifacts" not in r.message
    assert "6 files never hashed: the run did not finalize its manifest: no artifact could be checked" in r.message
    # one artifact checked is a check: it passes as before
    assert rule(judge(spec, dataclasses.replace(ev, integrity=Integrity(checked=1, verified=True))),
                "artifacts_verified").status == "pass"


def test_requests_outside_the_manifest_levels():
    spec = small_spec()
    b = EvidenceBuilder(spec)
    next(b.measured("a"))["level"] = 7
    v = judge(spec, b.build())
    r = rule(v, "completed_run")
    assert r.builtin and r.status == "inconclusive"
    assert "1 measured request belong to no level" in r.message


def test_allow_rehearsal():
    spec = small_spec(gate="allow_rehearsal = true")
    v = judge(spec, EvidenceBuilder(spec, time_scale=0.5, rehearsal=True).build())
    assert rule(v, "full_scale_run").status == "pass"
    assert v.outcome == "PASS", render_text(v)


def test_only_runs_the_named_backends():
    spec = small_spec(backends=("a", "b"))
    v = judge(spec, EvidenceBuilder(spec, only=("b",)).build())
    assert v.outcome == "PASS", render_text(v)
    b = EvidenceBuilder(spec)
    b.manifest["backends"] = [e for e in b.manifest["backends"] if e["name"] == "a"]
    v = judge(spec, b.build())
    assert "backend b did not run" in rule(v, "completed_run").message


# ---------------------------------------------------------------- drift and slope


def test_drift_first_vs_last_quarter():
    spec = small_spec("require drift(mean(latency)) <= 10% per level", duration="4m")
    b = EvidenceBuilder(spec)
    for r in b.measured("a", bucket=3):
        set_latency(r, 1.5)
    v = judge(spec, b.build())
    r = rule(v, "drift(mean(latency)) <= 10% per level")
    assert r.status == "fail"
    assert r.observed == pytest.approx(0.5)
    assert "drift(mean(latency)) = +50%" in r.message
    # bucket 1 and 2 are outside the compared quarters: changing them changes nothing
    for r in b.measured("a", bucket=1):
        set_latency(r, 9.0)
    assert rule(judge(spec, b.build()), "drift(mean(latency)) <= 10% per level").observed == pytest.approx(0.5)


def test_drift_needs_two_buckets():
    spec = small_spec("require drift(mean(latency)) <= 10% per level", duration="1m")
    r = rule(judge(spec, EvidenceBuilder(spec).build()), "drift(mean(latency)) <= 10% per level")
    assert r.status == "inconclusive" and "at least 2 buckets" in r.message


def test_slope_per_minute():
    spec = small_spec("require slope(mean(latency)) <= 5% per level", duration="4m")
    b = EvidenceBuilder(spec)
    for k in range(4):
        for r in b.measured("a", bucket=k):
            set_latency(r, 1.0 + 0.1 * k)  # +0.1 s per minute around a mean of 1.15 s
    r = rule(judge(spec, b.build()), "slope(mean(latency)) <= 5% per level")
    assert r.status == "fail"
    assert r.observed == pytest.approx(0.1 / 1.15)


def test_series_rules_use_bucket_values():
    spec = small_spec("require min(qps) >= 0.1rps per level\nrequire max(in_flight) <= 1 per level\nrequire max(rss) <= 3GiB")
    v = judge(spec, EvidenceBuilder(spec).build())
    assert rule(v, "min(qps) >= 0.1rps per level").observed == pytest.approx(8 / 60)
    assert rule(v, "max(in_flight) <= 1 per level").observed == pytest.approx(8 / 60)
    assert rule(v, "max(rss) <= 3GiB").status == "pass"
    assert v.outcome == "PASS", render_text(v)


def test_a_gpu_that_does_not_report_makes_the_sample_unknown_not_smaller():
    """Two GPUs of 40 GiB each: 80 GiB. When one of them stops reporting (lost mid-run, NVML
    refusing the call on it), the sample's sum is unknown -- never the other GPU's 40 GiB, which
    would pass a bound the server breaks."""
    spec = small_spec("require max(gpu_memory) < 60GiB\nrequire max(gpu_memory_device) < 60GiB")
    b = EvidenceBuilder(spec)
    for row in b.telemetry["a"]:
        row["gpus"] = [dict(row["gpus"][0], index=0), dict(row["gpus"][0], index=1)]
    gpu = [r for r in judge(spec, b.build()).rules if "gpu_memory" in r.rule]
    assert [r.status for r in gpu] == ["fail", "fail"]
    for row in b.telemetry["a"]:
        row["gpus"][1].update(memory_used=None, process_memory_used=None)
    v = judge(spec, b.build())
    gpu = [r for r in v.rules if "gpu_memory" in r.rule]
    assert [r.status for r in gpu] == ["inconclusive", "inconclusive"], render_text(v)
    assert v.outcome == "INCONCLUSIVE"


def _slow_server(records, service_s):
    """Serve `records` (open-loop arrivals) one at a time, `service_s` each, first come first
    served: a request queued behind the others ends later than its arrival + service."""
    free = None
    for r in sorted(records, key=lambda r: r["intended_start"]):
        begin = r["intended_start"] if free is None else max(free, r["intended_start"])
        free = begin + service_s
        set_latency(r, free - r["intended_start"])
        set_ttft(r, free - 0.05 - r["intended_start"])


def test_qps_of_an_overloaded_open_loop_is_what_the_server_delivered():
    """8 req/s offered to a server that serves one request per 0.25 s (4 req/s): achieved qps
    and throughput are its completions per second, not the arrival rate, and a rule that the
    level sustained its offered rate fails. Every request completes (within the 30 s
    deadline), most after the bucket it arrived in and 81 of 160 after the level's last
    bucket. (Counting the requests that started in a bucket gave 8 req/s: the rule passed.)"""
    spec = small_spec("require mean(qps) >= 8rps per level\nrequire mean(throughput) >= 512 per level",
                      mode="open", levels="[8rps]", duration="20s", bucket="5s")
    b = EvidenceBuilder(spec, per_bucket=40)  # 40 arrivals per 5 s bucket, evenly spaced: 8 req/s
    _slow_server(list(b.measured("a")), 0.25)
    lv = b.level("a", 0)
    last = max(r["end"] for r in b.measured("a"))
    lv["drained_at"] = last
    b.records["a"] = [r for r in b.records["a"] if r["bucket"] >= 0]  # no follow-up: it would queue too
    ev = b.build()
    res = summarize(ev, spec)
    bks = res["backends"][0]["buckets"]
    # request k ends at 0.25 (k + 1) s: 19 end in [0, 5), then 20 in each later bucket
    assert [bk["requests"]["completed"] for bk in bks] == [40, 40, 40, 40]  # what arrived in each bucket
    assert [bk["qps"] for bk in bks] == pytest.approx([19 / 5, 20 / 5, 20 / 5, 20 / 5])
    assert [bk["output_tokens_per_s"] for bk in bks] == pytest.approx([19 * 64 / 5, 20 * 64 / 5, 20 * 64 / 5, 20 * 64 / 5])
    v = judge(spec, ev)
    q = rule(v, "mean(qps) >= 8rps per level")
    assert q.status == "fail" and q.observed == pytest.approx(79 / 20)
    tp = rule(v, "mean(throughput) >= 512 per level")
    assert tp.status == "fail" and tp.observed == pytest.approx(79 * 64 / 20)


def test_qps_counts_completions_by_the_bucket_they_ended_in():
    """A bucket's qps counts the backend's completed requests that ended in it, wherever they
    started: a warm-up request that ends in bucket 0 counts there, a request that ends in the
    next bucket counts in that one, one that ends after the level's last bucket in none; the
    follow-up never (moved into bucket 0 here); a failed request never."""
    spec = small_spec(duration="2m")
    b = EvidenceBuilder(spec)  # 8 requests a 60 s bucket, each 1 s long
    lv = b.level("a", 0)
    a = lv["buckets"][0]["start"]
    b.records["a"].append(b.request("a", "w", 0, -1, a - 0.5, conc=2, rate=None))  # ends in bucket 0
    late = list(b.measured("a", bucket=0))[-1]  # started at 52.5 s
    set_latency(late, 10.0)  # ends in bucket 1
    for r in list(b.measured("a", bucket=1))[-2:]:  # started at 105 s and 112.5 s
        set_latency(r, 20.0)  # end after the level's last bucket (within the deadline)
    b.set_outcome(list(b.measured("a", bucket=1))[0], "failed", "engine died")
    fu = next(r for r in b.records["a"] if r["bucket"] == -2)
    fu.update(intended_start=a + 10.0, start=a + 10.0, first_byte=a + 10.05, first_token=a + 10.1, end=a + 11.0)
    res = summarize(b.build(), spec)
    bk0, bk1 = res["backends"][0]["buckets"]
    assert bk0["qps"] == pytest.approx((8 - 1 + 1) / 60)  # less the late one, plus the warm-up one
    assert bk1["qps"] == pytest.approx((8 + 1 - 2 - 1) / 60)  # plus the late one, less the two after the end and the failed one
    assert bk1["output_tokens_per_s"] == pytest.approx(6 * 64 / 60)
    assert bk1["requests"]["completed"] == 7  # by the bucket they started in, as before


# ---------------------------------------------------------------- results.json and determinism


def test_summary_numbers():
    spec = small_spec(duration="4m")
    b = EvidenceBuilder(spec)
    b.set_outcome(next(b.measured("a", bucket=2)), "failed", "engine died")
    res = summarize(b.build(), spec)
    assert not schema.validate("results", res)
    be = res["backends"][0]
    bk = be["buckets"][2]
    assert bk["requests"] == {"total": 8, "completed": 7, "failed": 1, "timeout": 0, "rejected": 0, "disconnected": 0}
    assert bk["qps"] == pytest.approx(7 / 60)
    assert bk["output_tokens_per_s"] == pytest.approx(7 * 64 / 60)
    assert bk["in_flight"] == pytest.approx(8 / 60)
    assert bk["errors"] == {"engine died": 1}
    assert bk["trace_coverage"] == 1.0
    assert bk["terminal_reasons"] == {"finished": 8}
    assert bk["ttft"]["p50"] == pytest.approx(0.1)
    assert bk["rss"]["max"] == 2 << 30
    lv = be["levels"][0]
    assert lv["drift"]["qps"]["change"] == pytest.approx(0.0)
    assert lv["drift"]["rss"]["change"] == pytest.approx(0.0)
    assert be["trace_coverage"]["required"] is None


def test_in_flight_is_exact():
    spec = small_spec()
    b = EvidenceBuilder(spec)
    lv = b.level("a", 0)
    a = lv["buckets"][0]["start"]
    # a warm-up request still running when bucket 0 opens counts for its overlap
    warm = b.request("a", "w", 0, -1, a - 0.5, conc=2, rate=None)
    b.records["a"].append(warm)
    res = summarize(b.build())
    assert res["backends"][0]["buckets"][0]["in_flight"] == pytest.approx((8 * 1.0 + 0.5) / 60)


def test_judging_is_deterministic_and_order_free():
    spec = small_spec("require p50(ttft) <= 1s per bucket\nrequire failed == 0 per level", duration="3m")
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("a"))[5], "failed", "boom")
    first = judge(spec, b.build()).to_json()
    assert judge(spec, b.build()).to_json() == first
    random.Random(4).shuffle(b.records["a"])
    random.Random(5).shuffle(b.traces["a"])
    assert judge(spec, b.build()).to_json() == first
    assert not schema.validate("verdict", first)


def test_a_run_joined_once_for_judge_and_summary_changes_nothing():
    """`soakspec report`/`run` join plan and evidence once and hand the joined run to both."""
    spec = small_spec("require p50(ttft) <= 1s per bucket\nrequire failed == 0 per level", duration="3m")
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("a"))[5], "failed", "boom")
    ev = b.build()
    run = join(spec, ev)
    assert judge_run(run).to_json() == judge(spec, ev).to_json()
    assert judge_run(run).outcome == "FAIL"  # the same joined run judged twice: nothing consumed
    assert summarize_run(run) == summarize(ev, spec)


def test_lost_records_are_never_complete():
    spec = small_spec("require completed_run")
    b = EvidenceBuilder(spec)
    gone = list(b.measured("a", bucket=1))[2]
    b.records["a"].remove(gone)  # the manifest still counts it as sent
    v = judge(spec, b.build())
    r = rule(v, "completed_run")
    assert r.status == "fail"
    assert "16 requests were sent but only 15 recorded: 1 records are lost" in r.message


def test_duplicate_request_ids_are_never_complete():
    spec = small_spec("require completed_run")
    b = EvidenceBuilder(spec)
    first = next(b.measured("a"))
    b.records["a"].append(dict(first))
    b.level("a", 0)["sent"] += 1
    v = judge(spec, b.build())
    assert f"1 request id recorded more than once (first: {first['request_id']})" in rule(v, "completed_run").message



_ID_POOLS = (["a", "b", "c", "d", "e", "f", "g"],  # held as text
             ["soak-5ca1ab1e-0-0000001", "soak-5ca1ab1e-0-0000002", "soak-5ca1ab1e-1-0000001", "r7", "r07", "r007", "9"])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_ID_POOLS).flatmap(lambda pool: st.lists(st.sampled_from(pool), max_size=30)), st.data(),
       st.sampled_from([1, 2, 5, 1 << 16]))
def test_duplicate_request_ids_are_found_through_their_hashes_as_a_set_finds_them(ids, data, step) -> None:
    """duplicate_ids equals a set's answer, for a whole table in any order or some of its rows,
    whatever the slice of sorted hashes it compares at a time -- ids held as text, and the
    runner's (a stem and a number: `r7` and `r07` are two ids) held as numbers."""
    import unittest.mock

    import numpy as np

    from soakspec.evidence import ids as ids_module
    from soakspec.judge import table
    from soakspec.judge.table import Rows, build_table
    from soakspec.judge.validity import duplicate_ids

    t = build_table([{"request_id": rid, "bucket": 0} for rid in ids])
    whole = Rows.of(t, np.random.default_rng(len(ids)).permutation(len(ids)).astype(np.int64))
    want = sorted({x for x in ids if ids.count(x) > 1})
    some = sorted(data.draw(st.sets(st.integers(0, max(len(ids) - 1, 0)), max_size=len(ids)))) if ids else []
    part = [ids[i] for i in some]
    with unittest.mock.patch.object(table, "SCAN_CHUNK", step), unittest.mock.patch.object(ids_module, "REPEAT_CHUNK", step):
        assert duplicate_ids(whole) == want
        assert duplicate_ids(Rows.of(t, np.asarray(some, dtype=np.int64))) == sorted({x for x in part if part.count(x) > 1})


# ---------------------------------------------------------------- timeouts: censored samples


def _timed_out(b, r, after, *, first_token=None):
    """Turn a measured request into a timeout `after` seconds from its send (in place)."""
    b.set_outcome(r, "timeout", "no response within the deadline", status=200 if first_token is not None else None)
    set_latency(r, after)
    if first_token is not None:
        set_ttft(r, first_token)


def test_timeouts_are_not_left_out_of_a_latency_rule():
    """Half the requests timed out after 1 s: p95(latency) is at least 1 s, whatever the other
    half measured (leaving the timeouts out passed `p95(latency) < 600ms` on the fast half)."""
    spec = small_spec("require p95(latency) < 600ms per level\nrequire p95(ttft) < 250ms per level")
    b = EvidenceBuilder(spec, per_bucket=100, latency=0.4)
    for r in list(b.measured("a"))[::2]:
        _timed_out(b, r, 1.0)
    v = judge(spec, b.build())
    lat, ttft = rule(v, "p95(latency) < 600ms per level"), rule(v, "p95(ttft) < 250ms per level")
    assert lat.status == "fail" and ttft.status == "fail", (lat.message, ttft.message)
    assert lat.observed_text == "p95(latency) >= 1s" and lat.samples == 200
    assert "100 of 200 requests timed out before their latency was measured" in lat.message


def test_a_timeout_the_percentile_cannot_reach_leaves_a_rule_passing():
    """One timeout in 300 requests lies beyond p95 at either bound: the rule holds, over all 300."""
    spec = small_spec("require p95(latency) < 600ms per level")
    b = EvidenceBuilder(spec, per_bucket=150, latency=0.4)
    _timed_out(b, next(b.measured("a")), 1.0)
    r = rule(judge(spec, b.build()), "p95(latency) < 600ms per level")
    assert r.status == "pass", r.message
    assert r.samples == 300 and r.observed_text == "p95(latency) = 400ms"
    assert "1 of 300 requests timed out" in r.message


def test_a_threshold_between_the_bounds_is_inconclusive():
    """Timeouts after 1 s under `p95(latency) < 2s`: the timed-out requests would have taken
    somewhere beyond 1 s, so whether p95 is below 2 s cannot be known."""
    spec = small_spec("require p95(latency) < 2s per level")
    b = EvidenceBuilder(spec, per_bucket=100, latency=0.4)
    for r in list(b.measured("a"))[::4]:
        _timed_out(b, r, 1.0)
    r = rule(judge(spec, b.build()), "p95(latency) < 2s per level")
    assert r.status == "inconclusive", r.message
    assert "whether it holds depends on how long they would have taken" in r.message


def test_a_ttft_measured_before_the_deadline_counts():
    """A request that timed out after its first token has a real TTFT: it is a sample like any."""
    spec = small_spec("require p95(ttft) < 250ms per level")
    b = EvidenceBuilder(spec, per_bucket=100, latency=0.4)
    for r in list(b.measured("a"))[::2]:
        _timed_out(b, r, 1.0, first_token=0.9)
    r = rule(judge(spec, b.build()), "p95(ttft) < 250ms per level")
    assert r.status == "fail" and r.observed_text == "p95(ttft) = 900ms", r.message
    assert "100 timed-out requests counted with the ttft measured before the deadline" in r.message


# ---------------------------------------------------------------- measurements the stream did not give


def test_requests_without_token_times_stay_completed_and_are_left_out_with_a_reason():
    """The runner leaves TTFT and TPOT unmeasured (none) where the stream does not tell them:
    tokens without text whose usage came only at the end (no first token), and a first chunk
    that carried every token (no TPOT). The first is still completed -- the server's [DONE] and
    usage decide, so the judge's re-derivation does not call it a failure -- and each metric's
    figures leave the requests out with a stated reason (results.json `excluded`, the reports'
    notes), never as a value; a TTFT rule still counts the untimed one, between its first byte
    and its end (see the next test)."""
    from soakspec.judge.measures import _UNSTREAMED, _UNTIMED
    from soakspec.report.common import exclusion_notes

    spec = small_spec("require failed == 0\nrequire p95(ttft) < 250ms per level\nrequire p50(tpot) < 40ms per level")
    b = EvidenceBuilder(spec)
    untimed, one_chunk = list(b.measured("a"))[:2]
    untimed.update(first_token=None, ttft=None, tpot=None, itl=[], chunks=0, output_tokens=10, itl_source="estimated",
                   output_sha256=None, output_chars=0, empty_text=True)  # fmt: skip
    one_chunk.update(tpot=None, itl=[], chunks=1, output_tokens=10, itl_source="usage")
    run = join(spec, b.build())
    assert run.evidence.backends[0].mislabeled == ()
    v = judge_run(run)
    assert rule(v, "failed == 0").status == "pass"
    ttft_rule = rule(v, "p95(ttft) < 250ms per level")
    assert ttft_rule.samples == 16 and "1 of 16 requests completed without token times" in ttft_rule.message
    assert rule(v, "p50(tpot) < 40ms per level").samples == 14
    results = summarize_run(run)
    (lv,) = results["backends"][0]["levels"]
    assert lv["requests"]["completed"] == 16 and lv["ttft"]["count"] == 15 and lv["tpot"]["count"] == 14
    assert lv["excluded"] == {"ttft": {_UNTIMED: 1}, "tpot": {_UNTIMED: 1, _UNSTREAMED: 1}, "itl": {_UNTIMED: 1}}
    notes = exclusion_notes(results)
    assert "TTFT leaves out 1 completed request of a · concurrency 2: token arrival times unknown (no text, usage not per chunk) (1)" in notes
    assert ("TPOT leaves out 2 completed requests of a · concurrency 2: no token times after the first chunk (not streamed, "
            "or every token in it) (1); token arrival times unknown (no text, usage not per chunk) (1)") in notes


def test_the_times_from_the_send_say_what_they_leave_out_as_ttft_does():
    """No metric silently drops requests: sent_ttft and sent_latency run from `start`, the send,
    so a completed request recorded without one has neither. Where their figures are given (a
    level that declares max_concurrency) results.json's `excluded` counts it under each with the
    reason, the reports' notes say so as they do for TTFT, and a rule left with no value says
    why -- not "none of its completed requests gives a value". A level without a cap gives no
    sent figures and lists nothing for them (ttft and latency say it there)."""
    from soakspec.judge.measures import _UNSENT, _UNTIMED
    from soakspec.report.common import exclusion_notes

    rules = "require failed == 0\nrequire p50(sent_ttft) < 1s per level\nrequire p50(sent_latency) < 5s per level"
    spec = small_spec(rules, mode="open", levels="[2rps]\n    max_concurrency = 4", duration="4m")
    b = EvidenceBuilder(spec)
    unsent, untimed = list(b.measured("a"))[:2]
    unsent.update(start=None)
    untimed.update(first_token=None, ttft=None, tpot=None, itl=[], chunks=0, output_tokens=10, itl_source="estimated",
                   output_sha256=None, output_chars=0, empty_text=True)  # fmt: skip
    results = summarize_run(join(spec, b.build()))
    (lv,) = results["backends"][0]["levels"]
    done = lv["requests"]["completed"]
    assert lv["excluded"]["sent_ttft"] == {_UNSENT: 1, _UNTIMED: 1}, lv["excluded"]
    assert lv["excluded"]["sent_latency"] == {_UNSENT: 1}, lv["excluded"]
    assert lv["sent_ttft"]["count"] == done - 2 and lv["sent_latency"]["count"] == done - 1
    notes = exclusion_notes(results)
    assert ("TTFT from the send leaves out 2 completed requests of a · rate 2 rps, max_concurrency 4: no send time (start) recorded (1); token arrival "
            "times unknown (no text, usage not per chunk) (1)") in notes, notes
    assert "Latency from the send leaves out 1 completed request of a · rate 2 rps, max_concurrency 4: no send time (start) recorded (1)" in notes, notes

    for r in b.measured("a"):
        r.update(start=None)
    v = judge_run(join(spec, b.build()))
    for metric, title in (("sent_ttft", "TTFT from the send"), ("sent_latency", "Latency from the send")):
        got = next(r for r in v.rules if metric in r.rule)
        assert got.status == "inconclusive", got
        assert f"{title} leaves out all {done} completed requests: " in got.message, got.message
        assert "no send time (start) recorded" in got.message, got.message

    plain = small_spec(rules, mode="open", levels="[2rps]", duration="4m")
    b = EvidenceBuilder(plain)
    next(iter(b.measured("a"))).update(start=None)
    (lv,) = summarize_run(join(plain, b.build()))["backends"][0]["levels"]
    assert set(lv["excluded"]) == {"ttft", "tpot", "itl"}, lv["excluded"]


_SHAPES = {  # a completed request each way a stream can leave a metric without its value
    "timed": {},
    "untimed": dict(first_token=None, ttft=None, tpot=None, itl=[], chunks=0, output_tokens=10, itl_source="estimated",
                    output_sha256=None, output_chars=0, empty_text=True),
    "one_chunk": dict(tpot=None, itl=[], chunks=1, output_tokens=10, itl_source="usage"),
    "one_token": dict(tpot=None, itl=[], chunks=1, output_tokens=1, itl_source="exact"),
    "estimated": dict(itl_source="estimated", chunks=32),
    "mismatch": dict(output_tokens=10**6),
}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(sorted(_SHAPES) + ["failed"]), min_size=16, max_size=16))
def test_no_metric_leaves_a_completed_request_out_without_saying_why(shapes):
    """No metric silently drops requests. Every completed request of a level is either a TTFT
    (TPOT) value in its figures or counted under that metric's `excluded` with the reason; ITL
    pools every gap of each request it does not list there. Whatever mix of streams -- untimed
    tokens, a first chunk with every token, one token, estimated tokens per chunk, a usage that
    contradicts the stream -- the counts add up to the level's completed requests."""
    spec = small_spec("require failed == 0")
    b = EvidenceBuilder(spec)
    kept = []
    for r, shape in zip(b.measured("a"), shapes):
        if shape == "failed":
            b.set_outcome(r, "failed", "boom")
        else:
            r.update(_SHAPES[shape])
            kept.append((r, shape))
    (lv,) = summarize_run(join(spec, b.build()))["backends"][0]["levels"]
    done = lv["requests"]["completed"]
    assert done == len(kept)
    for m in ("ttft", "tpot"):
        counted = (lv[m] or {}).get("count", 0)
        assert counted + sum(lv["excluded"][m].values()) == done, (m, lv[m], lv["excluded"])
    pooled = sum(len(r["itl"]) for r, shape in kept if shape not in ("untimed", "estimated", "mismatch"))
    assert (lv["itl"] or {}).get("count", 0) == pooled
    assert sum(lv["excluded"]["itl"].values()) == sum(s in ("untimed", "estimated", "mismatch") for _, s in kept)


def test_a_spec_whose_backends_are_not_in_the_evidence_passes_no_sample_check():
    """Judged with a spec none of whose backends ran (`gate --spec` of another run's spec):
    `min_samples` and `client_healthy` looked at nothing, which is no pass."""
    ran = small_spec(backends=("a",))
    other = small_spec(backends=("z",))
    v = judge(other, EvidenceBuilder(ran).with_client().build())
    for name in ("min_samples", "client_healthy"):
        assert rule(v, name).status == "inconclusive", rule(v, name).message
    assert "nothing was measured" in rule(v, "min_samples").message
    assert v.outcome == "INCONCLUSIVE"


def test_a_server_cannot_take_its_slow_requests_out_of_a_ttft_rule_by_leaving_their_tokens_untimed():
    """A misbehaving server that sends the tokens of its slow requests without text (usage only
    at the end) leaves them without a first token: the TTFT figures say so, but the rule counts
    each between its first byte and its end. 30 slow requests of 300, p95(ttft) < 250ms: the
    fast 270 alone would pass; with the 30 somewhere up to 2 s, it cannot be claimed."""
    spec = small_spec("require p95(ttft) < 250ms per level")
    b = EvidenceBuilder(spec, per_bucket=150)
    for r in list(b.measured("a"))[::10]:
        set_latency(r, 2.0)
        r.update(first_token=None, ttft=None, tpot=None, itl=[], chunks=0, itl_source="estimated", empty_text=True,
                 output_sha256=None, output_chars=0)  # fmt: skip
    r = rule(judge(spec, b.build()), "p95(ttft) < 250ms per level")
    assert r.status == "inconclusive", r.message
    assert r.samples == 300 and "30 of 300 requests completed without token times" in r.message
    assert "where within their bounds they lie" in r.message


@pytest.mark.parametrize("op", ["==", "!="])
def test_an_equality_time_rule_with_timeouts_is_judged_not_crashed(op):
    """`p95(latency) == 600ms` (or `!=`) over a level with timeouts: no side of the bounds is
    worse for an equality, so between unequal bounds it cannot be decided (it raised KeyError)."""
    spec = small_spec(f"require p95(latency) {op} 600ms per level")
    b = EvidenceBuilder(spec, per_bucket=100, latency=0.4)
    for r in list(b.measured("a"))[::2]:
        _timed_out(b, r, 1.0)
    r = rule(judge(spec, b.build()), f"p95(latency) {op} 600ms per level")
    assert r.status == "inconclusive" and "p95(latency) >= 1s" in r.message, r.message


def test_a_levels_percentile_pools_its_buckets_samples_never_averages_their_percentiles():
    """AIPerf's adaptive search reported the mean of per-run percentiles as if it were the pooled
    one; Locust bucketed latencies to two significant digits. Two buckets of 150 requests, one
    at 100 ms and one at 1 s: the level's p95 is the pooled samples' (1 s) -- the mean of the
    buckets' p95s (550 ms) would pass the rule -- and a latency of 1.234567 s is judged as that,
    not as 1.2 s."""
    spec = small_spec("require p95(latency) < 600ms per level\nrequire max(latency) <= 1.234567s per level")
    b = EvidenceBuilder(spec, per_bucket=150)
    for r in b.measured("a"):
        set_latency(r, 0.1 if r["bucket"] == 0 else 1.234567)
    v = judge(spec, b.build())
    p95 = rule(v, "p95(latency) < 600ms per level")
    assert p95.status == "fail" and p95.samples == 300
    assert p95.observed == pytest.approx(1.234567, abs=1e-6)
    assert rule(v, "max(latency) <= 1.234567s per level").status == "pass"
    b2 = EvidenceBuilder(spec, per_bucket=150)
    for r in b2.measured("a"):
        set_latency(r, 0.1 if r["bucket"] == 0 else 1.234568)  # one microsecond more
    assert rule(judge(spec, b2.build()), "max(latency) <= 1.234567s per level").status == "fail"


@pytest.mark.parametrize(("outcome", "status", "error", "said"), [
    # the runner's own message already begins with the status: not `HTTP 500: "HTTP 500: ..."`
    ("failed", 500, 'HTTP 500: {"object":"error","message":"boom"}', 'HTTP 500: "{"object":"error","message":"boom"}"'),
    ("failed", 503, "HTTP 503", "HTTP 503"),  # an empty body
    ("rejected", 429, 'HTTP 429: {"error": "rate limited"}', 'HTTP 429: "{"error": "rate limited"}"'),
    # a deadline after the 200 head: the deadline, not `HTTP 200: "deadline passed ..."`
    ("timeout", 200, "deadline passed before the response finished", "deadline passed before the response finished"),
    ("disconnected", 200, "connection closed before the response finished", "connection closed before the response finished"),
    ("disconnected", None, "broken pipe (epipe)", 'connection lost: "broken pipe (epipe)"'),
])
def test_a_failure_message_says_the_status_and_the_error_once(outcome, status, error, said):
    noun = {"failed": "failed request", "rejected": "rejected request", "timeout": "timed-out request",
            "disconnected": "disconnected request"}[outcome]
    counted = {"failed": "failed", "rejected": "rejected", "timeout": "timeouts", "disconnected": "disconnected"}[outcome]
    spec = small_spec(f"require {counted} == 0")
    b = EvidenceBuilder(spec)
    b.set_outcome(list(b.measured("a", bucket=1))[5], outcome, error, status=status)
    r = rule(judge(spec, b.build()), f"{counted} == 0")
    assert r.status == "fail"
    assert r.message.endswith(f": 1 {noun} ({said})"), r.message


def test_a_time_rule_whose_metric_leaves_out_every_completed_request_says_how_many_and_why():
    """A server that sends usage only in a final chunk: every request completed, its tokens per
    chunk estimated, so TPOT and ITL leave every one out. The rules said "cannot be computed: no
    completed requests" / "no completed gaps" beside 148 completed requests; the reason was only
    in the report's notes. A bucket where nothing completed still says so."""
    spec = small_spec("require mean(tpot) < 1s per bucket\nrequire p99(itl) < 1s\nrequire mean(ttft) < 1s per bucket")
    b = EvidenceBuilder(spec)
    for r in b.measured("a"):
        r.update(itl_source="estimated")
    for r in b.measured("a", bucket=1):
        b.set_outcome(r, "failed", "HTTP 500: boom", status=500)
    v = judge(spec, b.build())
    n = len([r for r in b.measured("a") if r["bucket"] != 1])
    why = "estimated tokens per chunk (final usage spread over the chunks)"
    itl = rule(v, "p99(itl) < 1s")
    assert itl.status == "inconclusive"
    assert itl.message.endswith(f"p99(itl) cannot be computed: ITL leaves out all {n} completed requests: {why}"), itl.message
    tpot = rule(v, "mean(tpot) < 1s per bucket")
    k = len(list(b.measured("a", bucket=0)))
    assert "bucket 0 [" in tpot.message and f"mean(tpot) cannot be computed: TPOT leaves out all {k} completed requests: {why}" in tpot.message, tpot.message
    assert "no completed requests" not in tpot.message.split("\n")[0], tpot.message
    ttft = rule(v, "mean(ttft) < 1s per bucket")
    assert "bucket 1 [" in ttft.message and "mean(ttft) cannot be computed: no completed requests" in ttft.message, ttft.message
