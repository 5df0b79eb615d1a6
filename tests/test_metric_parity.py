"""The figures a user of vLLM's `bench serve`, SGLang's bench_serving, GuideLLM or LoadGen
compares soakspec's with: where they are the same quantity they agree, and where soakspec
counts otherwise the difference is one the README names.

vLLM reports `request_goodput = good_completed / dur_s` beside `request_throughput =
completed / dur_s`: both are requests the server completed, over one duration, so goodput
never exceeds the request rate. soakspec's "Achieved req/s" (`qps`) is what the server
delivered in a level's buckets; its goodput rate must be a part of that, not of what was sent.
"""

from __future__ import annotations

import pytest

from soakspec.judge.joined import join
from soakspec.judge.judge import judge_run
from soakspec.judge.summary import summarize_run
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.report import common as C


def _overloaded(rules: str):
    """An open loop (2 buckets of 10 s, 8 requests each) against a server that finished only
    the first bucket's requests within the level: the second bucket's 8 ended 5 s after the
    level's last bucket closed (drained), as under overload, each within its deadline."""
    spec = small_spec(rules, mode="open", levels="[1rps]", duration="20s", bucket="10s")
    b = EvidenceBuilder(spec, scheduled=False)
    me = b.level("a", 0)["measure_end"]
    for r in b.measured("a", 0, 1):
        r["end"] = me + 5.0
        r["latency"] = r["end"] - r["intended_start"]
        r["tpot"] = (r["latency"] - r["ttft"]) / (r["output_tokens"] - 1)
    run = join(spec, b.build())
    return run, judge_run(run), summarize_run(run)


def test_goodput_rate_is_the_part_of_the_achieved_rate_that_met_the_slo():
    run, verdict, results = _overloaded("require goodput_rate(latency < 1h) >= 0.6rps per level")
    (row,) = C.level_rows(results)
    assert row.qps == pytest.approx(8 / 20)  # delivered in the level's buckets: the first bucket's 8
    (g,) = results["goodput"]
    assert g["met"] == 16 and g["requests"] == 16 and g["goodput"] == 1.0  # the share: of the requests sent
    # every request met the SLO, so the goodput rate is the achieved rate -- not 16 / 20 s,
    # the rate the load generator sent them at, above what the server delivered
    assert g["goodput_rate"] == pytest.approx(row.qps)
    (rule,) = [r for r in verdict.rules if r.rule.startswith("goodput_rate")]
    assert rule.observed == pytest.approx(8 / 20)
    assert rule.status == "fail"  # 0.4 of 0.6 rps: the server did not deliver 0.6 good requests a second


def test_goodput_rate_counts_only_delivered_requests_that_meet_the_slo():
    run, verdict, results = _overloaded("require goodput_rate(latency < 10s) >= 0.01rps per level")
    (g,) = results["goodput"]
    assert g["met"] == 11  # the share: 3 of the drained 8 still ended within 10 s
    (row,) = C.level_rows(results)
    # the rate: of the 8 the server delivered within the level (every one met it), not 11 / 20 s
    assert g["goodput_rate"] == pytest.approx(8 / 20) == pytest.approx(row.qps)


def test_latency_figures_are_vllms_formulas_over_the_same_requests():
    """results.json's TTFT, TPOT, ITL and latency (mean, p50, p95, p99) are vLLM's formulas --
    np.percentile's linear interpolation, TPOT = (latency - TTFT) / (tokens - 1) -- over the
    measured completed requests, timed from their intended start (README's comparison table)."""
    import numpy as np

    spec = small_spec("require failed == 0", mode="open", levels="[1rps]", duration="20s", bucket="10s")
    b = EvidenceBuilder(spec, per_bucket=40, scheduled=False)
    rng = np.random.default_rng(7)
    for r in b.measured("a"):
        n = int(rng.integers(2, 64))
        gaps = [round(float(g), 6) for g in rng.uniform(0.002, 0.05, n - 1)]
        r["first_token"] = r["intended_start"] + float(rng.uniform(0.05, 2.0))
        r["end"] = r["first_token"] + sum(gaps)
        r.update(output_tokens=n, chunks=n, itl=gaps, ttft=r["first_token"] - r["intended_start"],
                 latency=r["end"] - r["intended_start"], tpot=round(sum(gaps) / (n - 1), 6))
    recs = list(b.measured("a"))
    (lv,) = summarize_run(join(spec, b.build()))["backends"][0]["levels"]
    peer = {
        "ttft": [r["first_token"] - r["intended_start"] for r in recs],
        "latency": [r["end"] - r["intended_start"] for r in recs],
        "tpot": [(r["end"] - r["first_token"]) / (r["output_tokens"] - 1) for r in recs],
        "itl": [g for r in recs for g in r["itl"]],
    }
    for name, vals in peer.items():
        got = lv[name]
        assert got["count"] == len(vals), name
        assert got["mean"] == pytest.approx(float(np.mean(vals)), rel=1e-5, abs=1e-6), name
        for q in (50, 95, 99):
            assert got[f"p{q}"] == pytest.approx(float(np.percentile(vals, q)), rel=1e-5, abs=1e-6), (name, q)
