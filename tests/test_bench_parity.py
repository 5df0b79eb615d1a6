"""The figures a user of vLLM's `bench serve` or SGLang's `bench_serving` looks for: TTFT and
latency from the send (`sent_ttft`, `sent_latency`: after the wait for a slot under
max_concurrency, where `ttft` and `latency` run from the intended start), and the total token
throughput (prompt + output tokens per second, `total_throughput`)."""

from __future__ import annotations

import math

import pytest

from soakspec.diagnostics import Severity
from soakspec.evidence import schema
from soakspec.judge import judge
from soakspec.judge.summary import summarize
from soakspec.judge.testing import EvidenceBuilder
from soakspec.lang import check, fmt, parse

from test_clienthealth import _small_spec, _with_client
from test_max_concurrency import _waited

CAPPED = "[2rps]\n    max_concurrency = 1"


def _statuses(spec, ev) -> dict[str, str]:
    return {r.rule: r.status for r in judge(spec, ev).rules}


def _level(spec, ev) -> dict:
    (be,) = summarize(ev, spec)["backends"]
    (lv,) = be["levels"]
    return lv


# ---------------------------------------------------------------- from the send


def test_under_a_cap_sent_ttft_is_the_servers_ttft_while_ttft_counts_the_queue():
    """Every request but the first waited 200 ms for a slot under max_concurrency = 1; once sent
    the server answered its first token in 100 ms. ttft (from the intended start) is 300 ms, the
    wait included; sent_ttft (from the send, as bench serve measures) is the server's 100 ms: a
    rule on it passes where the same rule on ttft fails, and results.json gives both."""
    rules = ["require p50(sent_ttft) < 150ms per level", "require p50(ttft) < 150ms per level",
             "require goodput(sent_ttft < 150ms) >= 50%"]
    spec = _small_spec("\n".join(rules), mode="open", levels=CAPPED)
    b = _waited(EvidenceBuilder(spec))
    ev = _with_client(b.build(), lag=0.002, cpu=0.2)
    st = _statuses(spec, ev)
    assert st["p50(sent_ttft) < 150ms per level"] == "pass"
    assert st["p50(ttft) < 150ms per level"] == "fail"
    assert st["goodput(sent_ttft < 150ms) >= 50%"] == "pass"
    lv = _level(spec, ev)
    assert lv["sent_ttft"]["p50"] == pytest.approx(0.1) and lv["sent_ttft"]["max"] == pytest.approx(0.1)
    assert lv["ttft"]["p50"] == pytest.approx(0.3)
    recs = list(b.measured("a"))
    assert lv["sent_latency"]["max"] == pytest.approx(max(r["end"] - r["start"] for r in recs))
    assert lv["latency"]["max"] == pytest.approx(max(r["end"] - r["intended_start"] for r in recs))


def test_a_level_without_a_cap_gives_no_second_pair_in_results_but_rules_still_read_it():
    """Without max_concurrency, sent_ttft is ttft less only the client's own lateness (closed
    loop: equal): results.json leaves it out (null), a rule on it is judged all the same."""
    spec = _small_spec("require max(sent_ttft) <= 100ms per level")
    ev = EvidenceBuilder(spec).build()
    lv = _level(spec, ev)
    assert lv["sent_ttft"] is None and lv["sent_latency"] is None and lv["ttft"]["max"] == pytest.approx(0.1)
    assert _statuses(spec, ev)["max(sent_ttft) <= 100ms per level"] == "pass"


def test_a_request_that_timed_out_before_its_first_token_bounds_sent_ttft_from_its_send():
    """A timeout without a first token is a censored sample of sent_ttft, known only to exceed
    its time from the send to the deadline -- not from the intended start, which a queue
    before the send would inflate into a FAIL the server never earned."""
    spec = _small_spec("require max(sent_ttft) < 1.1s per level\nrequire max(ttft) < 1.1s per level",
                       mode="open", levels=CAPPED)
    b = _waited(EvidenceBuilder(spec))
    r = max(b.measured("a"), key=lambda r: r["intended_start"])  # waited 200 ms; no request after it
    r.update(outcome="timeout", first_token=None, ttft=None, tpot=None, itl=[], output_tokens=0, chunks=0,
             finish_reason=None, output_sha256=None, output_chars=0)  # the deadline at 1.0 s from its send
    st = _statuses(spec, _with_client(b.build(), lag=0.002, cpu=0.2))
    assert st["max(ttft) < 1.1s per level"] == "fail"  # 1.2 s from its intended start, at least
    assert st["max(sent_ttft) < 1.1s per level"] != "fail"  # more than 1.0 s from its send: unknown whether above 1.1 s


# ---------------------------------------------------------------- total token throughput


def test_total_throughput_is_prompt_and_output_tokens_per_second_by_the_bucket_they_ended_in():
    spec = _small_spec("require min(total_throughput) >= 10 per bucket", mode="open", levels="[2rps]")
    b = EvidenceBuilder(spec)
    for k, r in enumerate(b.measured("a")):
        r["prompt_tokens"] = 100 + k
    ev = b.build()
    (be,) = summarize(ev, spec)["backends"]
    (lv,) = be["levels"]
    windows = [w for w in be["buckets"] if w["level"] == lv["index"]]
    assert len(windows) == 2
    for w in windows:
        ended = [r for r in b.records["a"] if r["bucket"] >= 0 and r["outcome"] == "completed" and w["started"] <= r["end"] < w["ended"]]
        assert ended
        want = sum(r["prompt_tokens"] + r["output_tokens"] for r in ended) / w["wall_s"]
        assert w["total_tokens_per_s"] == pytest.approx(want)
        assert w["total_tokens_per_s"] > w["output_tokens_per_s"] > 0
    assert _statuses(spec, ev)["min(total_throughput) >= 10 per bucket"] == "pass"


def test_a_bucket_with_a_request_of_no_prompt_count_has_no_total_and_its_rule_is_inconclusive():
    """A total without the prompt tokens of a request would read as the whole: the bucket has
    none, and a rule over it is INCONCLUSIVE, saying why (missing data is never a pass)."""
    rule = "require mean(total_throughput) >= 1"
    spec = _small_spec(rule, mode="open", levels="[2rps]")
    b = EvidenceBuilder(spec)
    next(b.measured("a"))["prompt_tokens"] = None
    v = judge(spec, b.build())
    got = next(r for r in v.rules if r.rule == rule.removeprefix("require "))
    assert got.status == "inconclusive" and "no prompt token count" in got.message
    (be,) = summarize(b.build(), spec)["backends"]
    assert [w["total_tokens_per_s"] is None for w in be["buckets"]] == [True, False]


# ---------------------------------------------------------------- the language


NEW_RULES = ["require p99(sent_ttft) < 1s per level", "require mean(sent_latency) <= 2m per bucket",
             "require goodput(sent_ttft < 500ms and sent_latency < 5s) >= 90%", "warn min(total_throughput) >= 1000 per bucket",
             "abort p99(sent_ttft) > 10s per window 30s"]


@pytest.mark.parametrize("rule", NEW_RULES)
def test_the_checker_takes_the_new_metrics_in_a_rule(rule):
    spec = _small_spec(rule, mode="open", levels=CAPPED)
    assert spec is not None


@pytest.mark.parametrize("word, meant", [("total_token_throughput", "total_throughput")])
def test_bench_serves_name_for_the_total_points_at_the_metric(word, meant):
    text = ('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\nworkload "w" {\n  load { concurrency = 1 }\n'
            f'  duration = 60s\n}}\ngate {{\n  require min({word}) >= 1\n}}\n')
    spec, diags = check(parse(text)[0])
    assert spec is None
    errs = [d for d in diags if d.severity == Severity.ERROR]
    assert errs and any(meant in (d.message + " " + str(d.hint or "")) for d in errs), errs


def test_fmt_round_trips_rules_on_the_new_metrics():
    text = "gate {\n" + "\n".join(NEW_RULES) + "\n}\n"
    tree, diags = parse(text)
    assert tree is not None and not diags
    out = fmt(tree)
    assert parse(out)[0] == tree and fmt(parse(out)[0]) == out
    for name in ("sent_ttft", "sent_latency", "total_throughput"):
        assert name in out


def test_an_abort_on_sent_ttft_reads_the_time_from_the_send():
    from soakspec.evidence.record import RequestRecord
    from soakspec.runner.abort import row_of

    rec = RequestRecord("r", backend="a", intended_start=10.0, admitted=11.5, start=11.5, first_token=11.6, end=12.5)
    vals = row_of(rec).values
    assert vals["sent_ttft"] == pytest.approx(0.1) and vals["ttft"] == pytest.approx(1.6)
    assert vals["sent_latency"] == pytest.approx(1.0)
    assert not math.isnan(vals["sent_latency"])


# ---------------------------------------------------------------- reports


def test_reports_give_the_total_beside_the_output_and_a_capped_levels_times_from_the_send():
    from soakspec.report import common as C
    from soakspec.report import md
    from soakspec.report.runsummary import summary_json, summary_lines

    spec = _small_spec("require failed == 0", mode="open", levels=CAPPED)
    b = _waited(EvidenceBuilder(spec))
    ev = _with_client(b.build(), lag=0.002, cpu=0.2)
    results = summarize(ev, spec)
    (row,) = C.level_rows(results)
    assert row.total_tokens_per_s == pytest.approx(row.tokens_per_s * 2)  # 64 prompt and 64 output tokens each
    head, _, line = md.level_table(results)
    cells = dict(zip([c.strip() for c in head.split("|")], [c.strip() for c in line.split("|")]))
    assert cells["Total tok/s"] == md._fmt_rate(row.total_tokens_per_s) != cells["Output tok/s"]
    (lv,) = summary_json(results, "run")["levels"]
    assert lv["total_tokens_per_s"] == pytest.approx(row.total_tokens_per_s)
    assert any("total tok/s" in x for x in summary_lines(results, "run"))
    assert not schema.validate("results", results)
    (note,) = C.cap_notes(results)
    assert "From the send" in note and "TTFT p50 / p95 / p99 100ms / 100ms / 100ms" in note, note
    # an uncapped level: no note, no second pair
    spec = _small_spec("require failed == 0", mode="open", levels="[2rps]")
    assert C.cap_notes(summarize(_with_client(EvidenceBuilder(spec).build(), lag=0.002, cpu=0.2), spec)) == []
