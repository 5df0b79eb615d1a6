"""Audit of rules over a server's Prometheus metrics against Prometheus' own semantics: a
histogram quantile in the +Inf bucket, counters summed over label sets that come and go, and
the scraper against the /metrics answers real servers give."""

from __future__ import annotations

import pytest

from soakspec.judge.judge import judge
from soakspec.judge.testing import EvidenceBuilder, metrics_rows, small_spec

TTFT = "vllm:time_to_first_token_seconds"


def _judged(rule: str, mutate):
    spec = small_spec(rule, duration="3m")
    b = EvidenceBuilder(spec)
    (lv,) = b.manifest["backends"][0]["levels"]
    b.metrics["a"] = metrics_rows(lv["buckets"][0]["start"] - 5, lv["buckets"][-1]["end"] + 5)
    for i, row in enumerate(b.metrics["a"]):
        mutate(i, row)
    return [r for r in judge(spec, b.build()).rules if r.klass == "performance"]


def _beyond_the_buckets(i, row):
    """Every TTFT observation took 30 s: beyond the histogram's largest finite bound (2.5 s)."""
    h = row["families"][TTFT]
    h["buckets"] = [[le, 0.0] for le, _ in h["buckets"][:-1]] + [[None, h["count"]]]
    h["sum"] = 30.0 * h["count"]


@pytest.mark.parametrize("rule, status", [
    (f'require p99(server("{TTFT}")) < 10s', "inconclusive"),  # was PASS with p99 = 2.5
    (f'require p50(server("{TTFT}")) <= 60s per bucket', "inconclusive"),
    (f'require p99(server("{TTFT}")) < 2s', "fail"),  # at least 2.5: certainly not < 2
    (f'require p50(server("{TTFT}")) > 1s', "pass"),  # at least 2.5: certainly > 1
])
def test_a_quantile_in_the_inf_bucket_is_a_lower_bound_never_a_pass_it_cannot_prove(rule, status):
    """histogram_quantile answers the largest finite bound for a quantile in the +Inf bucket:
    judged as a value, `p99 < 10s` passed with p99 = 2.5 for a server whose every TTFT took 30 s
    (vLLM's older TTFT buckets end at 10 s, its e2e latency's at 60 s)."""
    rules = _judged(rule, _beyond_the_buckets)
    assert rules and {r.status for r in rules} == {status}, [r.message for r in rules]
    assert all("+Inf bucket" in r.message and "2.5 or more" in r.message for r in rules), [r.message for r in rules]


def test_a_drift_of_a_quantile_in_the_inf_bucket_is_not_judged_on_its_bound():
    (r,) = _judged(f'require drift(p50(server("{TTFT}"))) <= 10% per level', _beyond_the_buckets)
    assert r.status == "inconclusive", r.message
