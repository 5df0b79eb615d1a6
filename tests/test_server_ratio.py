"""`ratio(server("num"), server("den"))`: the ratio of two server counters' increases over a
scope (a prefix-cache hit rate, a speculative-decoding acceptance rate): the language (parse,
check, fmt, plan), the judge on built evidence, and a real run against the simulator."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.judge.judge import judge
from soakspec.judge.testing import EvidenceBuilder, metrics_rows, small_spec
from soakspec.lang import check, parse
from soakspec.lang.fmt import fmt, rule_text
from soakspec.plan import plan, render_text

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
RATIO = f'ratio(server("{HITS}"), server("{QUERIES}"))'

SPEC = ('soak "s" {}\nbackend "a" {\n  url = "http://127.0.0.1:8000"\n}\n'
        'workload "w" {\n  load {\n    concurrency = 2\n  }\n  duration = 2m\n  bucket = 1m\n}\n'
        "gate {\n  {rules}\n}\n")


def _check(rules: str):
    text = SPEC.replace("{rules}", "\n  ".join(rules.splitlines()))
    spec, diags = check(parse(text)[0])
    return spec, [d for d in diags if d.severity == "error"], text


# ---------------------------------------------------------------------------- the language


def test_a_ratio_of_two_server_counters_checks_into_numerator_and_denominator():
    spec, errors, _ = _check(f"require {RATIO} >= 50% per bucket\nwarn {RATIO} > 0.25")
    assert not errors, errors
    r, w = spec.gate.rules
    assert (r.expr.metric, r.expr.agg, r.expr.server, r.expr.over, r.scope, r.threshold) == ("server", "ratio", HITS, QUERIES, "bucket", 0.5)
    assert w.threshold == 0.25  # a plain fraction, as other ratio rules take
    assert r.text == f"require {RATIO} >= 50% per bucket"
    both = plan(spec).backends[0].metrics.families
    assert HITS in both and QUERIES in both


def test_a_ratio_rule_spans_the_call_and_each_argument():
    tree, _ = parse(SPEC.replace("{rules}", f"require {RATIO} >= 50%"))
    expr = tree.body[-1].body[0].expr
    assert (expr.span.line, expr.span.column, expr.span.end_column) == (13, 11, 11 + len(RATIO))
    assert expr.args[1].span.column == 11 + len(f'ratio(server("{HITS}"), ')


def test_the_denominators_family_is_scraped_even_when_not_a_default():
    spec, errors, _ = _check('require ratio(server("my_hits_total"), server("my_lookups_total")) > 10%')
    assert not errors
    p = plan(spec)
    assert {"my_hits_total", "my_lookups_total"} <= set(p.backends[0].metrics.families)
    assert "keeps, for the gate's rules, my_hits_total, my_lookups_total" in render_text(p)


def test_fmt_round_trips_a_ratio_rule_and_the_plan_prints_it():
    spec, errors, text = _check(f"require {RATIO}>=50%   per bucket")
    once = fmt(parse(text)[0])
    assert f"require {RATIO} >= 50% per bucket" in once and fmt(parse(once)[0]) == once
    assert spec.gate.rules[0].text == f"require {RATIO} >= 50% per bucket"


@pytest.mark.parametrize("rule, code, words", [
    (f'require ratio(server("{HITS}")) >= 50%', "E305", "takes both"),  # one argument: the outcome form, not a server's
    (f'require ratio(server("{HITS}"), server("{QUERIES}"), server("x_total")) >= 50%', "E305", "takes two arguments"),
    (f'require ratio(server("{HITS}"), failed) >= 50%', "E305", "not one of the server's own metrics"),
    (f'require ratio(server("{HITS}"), server("{HITS}")) >= 50%', "E305", "by itself"),
    (f'require ratio(server("vllm:kv_cache_usage_perc"), server("{QUERIES}")) >= 50%', "E305", "already a ratio"),
    (f'require mean(server("{HITS}"), server("{QUERIES}")) >= 50%', "E303", "only ratio(...) takes two"),
    (f'require drift({RATIO}) <= 10% per level', "E305", "already one number"),
    (f'require ratio(server("not a name"), server("{QUERIES}")) >= 50%', "E302", "Prometheus metric name"),
])
def test_ratio_mistakes_are_reported_with_code_caret_and_hint(rule, code, words):
    _, errors, _ = _check(rule)
    assert [d.code for d in errors] == [code], errors
    (d,) = errors
    assert words in d.message + (d.hint or ""), d
    assert d.span.line == 13 and d.span.column > 1  # a caret under the offending part


def test_the_checker_refuses_the_gauges_the_scraper_averages_as_ratios():
    from soakspec.lang.metrics import SERVER_RATIO_SUFFIXES
    from soakspec.runner.scrape import RATIO_SUFFIXES

    assert SERVER_RATIO_SUFFIXES == RATIO_SUFFIXES


def test_every_ratio_mistake_is_reported_at_once():
    _, errors, _ = _check(f'require ratio(server("{HITS}"), server("{HITS}")) >= 50%\nrequire ratio(failed, server("{QUERIES}")) > 1%')
    assert [d.code for d in errors] == ["E305", "E305"]


def test_an_unclosed_call_expects_a_comma_only_inside_ratio():
    """The grammar takes `f(a, b)` for any name, but only ratio() has a second argument: an
    unclosed p95( expects its ')', an unclosed ratio( a ')' or its next argument's ','."""
    _, diags = parse(SPEC.replace("{rules}", f'require p95(ttft <= 1s\n  require ratio(server("{HITS}") <= 1'))
    assert [d.message for d in diags] == ["unexpected '<=' (expected ')')", "unexpected '<=' (expected ')', ',')"]


# ---------------------------------------------------------------------------- the judge


def _builder(rules: str, hits_per_s, queries_per_s, *, duration: str = "3m", reset_at: float | None = None):
    """Evidence with the two prefix-cache counters scraped every 5 s: `hits_per_s(t)` and
    `queries_per_s(t)` their rates at t (seconds from the first bucket's start); a reset of the
    hits counter (a restarted engine) at `reset_at`."""
    spec = small_spec(rules, duration=duration)
    b = EvidenceBuilder(spec)
    (lv,) = b.manifest["backends"][0]["levels"]
    t0 = lv["buckets"][0]["start"]
    rows = b.metrics["a"] = metrics_rows(t0 - 5, lv["buckets"][-1]["end"] + 5)
    h = q = 0.0
    for prev, row in zip([None] + rows, rows):
        if prev is not None:
            x = prev["t"] - t0
            h += hits_per_s(x) * (row["t"] - prev["t"])
            q += queries_per_s(x) * (row["t"] - prev["t"])
        if reset_at is not None and row["t"] - t0 >= reset_at and prev is not None and prev["t"] - t0 < reset_at:
            h = hits_per_s(x) * (row["t"] - t0 - reset_at)  # the engine restarted: its counter starts again
        row["families"][HITS] = {"type": "counter", "value": h, "series": 1}
        row["families"][QUERIES] = {"type": "counter", "value": q, "series": 1}
    return spec, b, lv


def _the(v):
    (r,) = [r for r in v.rules if r.klass == "performance"]
    return r


def test_the_hit_rate_per_bucket_fails_in_the_bucket_where_it_fell():
    # 60 of 100 tokens a second hit, but in the second minute only 20
    spec, b, _ = _builder(f"require {RATIO} >= 50% per bucket", lambda t: 20.0 if 60 <= t < 120 else 60.0, lambda t: 100.0)
    r = _the(judge(spec, b.build()))
    assert r.status == "fail" and r.where.bucket == 1 and math.isclose(r.observed, 0.2)
    assert f"'{HITS}' +1200 of '{QUERIES}' +6000" in r.message  # both increases, beside the ratio


def test_the_hit_rate_per_level_and_over_the_run_is_the_ratio_of_the_increases():
    # not the mean of the per-bucket ratios: 60/100, 20/50 and 60/100 over three buckets is
    # (3600+1200+3600) / (6000+3000+6000) = 56%, where the mean of ratios is 53.3%
    for scope in ("per level", "per run", ""):
        spec, b, _ = _builder(f"require {RATIO} >= 55% {scope}", lambda t: 20.0 if 60 <= t < 120 else 60.0,
                              lambda t: 50.0 if 60 <= t < 120 else 100.0)
        r = _the(judge(spec, b.build()))
        assert r.status == "pass", (scope, r.message)
        assert math.isclose(r.observed, 8400 / 15000, rel_tol=1e-9), (scope, r.observed)


def test_a_scope_whose_denominator_did_not_increase_has_no_ratio_never_a_pass():
    spec, b, _ = _builder(f"require {RATIO} <= 90% per bucket", lambda t: 0.0, lambda t: 0.0 if t >= 60 else 100.0)
    r = _the(judge(spec, b.build()))
    assert r.status == "inconclusive" and r.where.bucket == 1
    assert "denominator did not increase" in r.message and f"'{QUERIES}' +0" in r.message


def test_a_counter_reset_counts_the_new_value_as_the_bare_counter_rule_does():
    """The hits counter restarts at 90 s (scraped at 85 s and 90 s): the second bucket's hits
    are the rise to 85 s plus the new value (Prometheus' increase()), exactly what a bare rule
    on the counter reads -- never a negative change, never the run's total again."""
    observed = {}
    for rule in (f"require {RATIO} >= 50% per bucket", f'require server("{HITS}") >= 0 per bucket'):
        spec, b, _ = _builder(rule, lambda t: 60.0, lambda t: 100.0, reset_at=90)
        r = _the(judge(spec, b.build()))
        assert r.status == "pass" and r.where.bucket == 1, r.message  # the worst pass: the bucket with the reset
        observed[rule.split()[1][:5]] = r.observed
    assert observed["serve"] == 60 * 55  # 5 s of hits between the last scrape and the restart unseen
    assert math.isclose(observed["ratio"], observed["serve"] / 6000)


def test_both_increases_are_printed_exactly_however_large():
    spec, b, _ = _builder(f"require {RATIO} >= 90% per level", lambda t: 60_000.0, lambda t: 100_000.0)
    r = _the(judge(spec, b.build()))
    assert r.status == "fail" and f"'{HITS}' +10800000 of '{QUERIES}' +18000000" in r.message, r.message


def test_a_gauge_in_a_ratio_is_inconclusive_saying_it_has_no_increase():
    spec, b, _ = _builder('require ratio(server("vllm:num_requests_running"), server("vllm:prefix_cache_queries_total")) > 1%',
                          lambda t: 60.0, lambda t: 100.0)
    r = _the(judge(spec, b.build()))
    assert r.status == "inconclusive" and "is a gauge" in r.message


def test_a_missing_counter_is_inconclusive():
    spec, b, _ = _builder(f'require ratio(server("{HITS}"), server("vllm:spec_decode_num_draft_tokens_total")) > 1%',
                          lambda t: 60.0, lambda t: 100.0)
    r = _the(judge(spec, b.build()))
    assert r.status == "inconclusive" and "has no 'vllm:spec_decode_num_draft_tokens_total'" in r.message


def test_the_json_report_carries_the_ratio_and_both_increases():
    spec, b, _ = _builder(f"require {RATIO} >= 50% per bucket", lambda t: 20.0 if 60 <= t < 120 else 60.0, lambda t: 100.0)
    doc = json.loads(json.dumps(judge(spec, b.build()).to_json()))  # verdict.json
    (r,) = [r for r in doc["rules"] if r["metric"] == "server"]
    assert math.isclose(r["observed"], 0.2) and "+1200 of" in r["observed_text"] and "+6000" in r["observed_text"]


# ---------------------------------------------------------------------------- the generated ASTs


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_generated_ratio_calls_render_and_reparse(data):
    """Property: any generated rule expression -- ratio(a, b) calls among them -- renders to text
    that parses back to the same tree."""
    from soakspec.lang import ast as A
    from soakspec.lang.strategies import _exprs

    expr = data.draw(_exprs().filter(lambda e: isinstance(e, A.MultiCall)))
    text = "gate {\n  " + rule_text(A.Rule("require", expr)) + "\n}\n"
    tree, diags = parse(text)
    assert not diags and tree.body[0].body[0].expr == expr


# ---------------------------------------------------------------------------- a real run


REPLAY_SPEC = """\
soak "t" {{
  issue = "test"
}}
backend "b0" {{
  sim {{
    ttft = 5ms
    itl = 1ms
  }}
  runtime {{
    label = "host-staged"
  }}
  metrics {{
    every = 250ms
  }}
}}
workload "w" {{
  load {{
    mode = replay
    trace = "trace.jsonl"
    hash_block = 16
    prefix_sharing = {sharing}
  }}
  bucket = 1s
  deadline = 5s
  follow_up = false
}}
gate {{
  require ratio(server("vllm:prefix_cache_hits_total"), server("vllm:prefix_cache_queries_total")) >= 50%
}}
claims {{
  claim "test"
}}
"""


@pytest.mark.slow
def test_a_replay_that_shares_prefixes_passes_a_hit_rate_gate_and_one_that_does_not_fails_it(tmp_path):
    """A Mooncake trace whose requests share 7 of their 8 blocks, replayed against the
    simulator: with `prefix_sharing` 14 of 16 requests find 112 of 128 words cached (1568 of
    2048, 76.6%) and the hit-rate gate passes; without, nothing hits (0%) and it fails (exit 1)."""
    from runner_support import run_spec

    rows = [{"timestamp": i * 60, "input_length": 128, "output_length": 2, "hash_ids": [i % 2, 10, 11, 12, 13, 14, 15, 16]}
            for i in range(16)]
    got = {}
    for sharing in ("true", "false"):
        (tmp_path / sharing).mkdir()
        (tmp_path / sharing / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        proc, out = run_spec(tmp_path / sharing, REPLAY_SPEC.format(sharing=sharing))
        verdict = json.loads((out / "verdict.json").read_text())
        (r,) = [r for r in verdict["rules"] if r["metric"] == "server"]
        got[sharing] = (proc.returncode, r["status"], r["observed"])
        report = (out / "report.md").read_text() if (out / "report.md").exists() else ""
        assert report == "" or "ratio(" in report
    assert got == {"true": (0, "pass", 1568 / 2048), "false": (1, "fail", 0.0)}, got


def test_the_report_charts_both_counters_of_a_ratio():
    from soakspec.report.serverview import charted_families

    spec, _, _ = _check(f"require {RATIO} >= 50% per bucket")
    assert charted_families({"name": "a", "server_metrics": {"families": {}}}, spec) == [HITS, QUERIES]
