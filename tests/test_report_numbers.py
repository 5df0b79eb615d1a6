"""The numbers reports show: each figure as the judge computed it, printed so that it cannot
read as being on the other side of its threshold, with the right label. Synthetic evidence
(`soakspec.judge.testing`): nothing runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from soakspec.judge.common import format_beside
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.lang.metrics import Kind
from soakspec.report import prepare

_FIGURE = st.one_of(st.none(), st.just("n/a"), st.booleans(), st.integers(-5, 10), st.floats(-1.0, 1e6))  # what a bucket line may hold


def test_a_failing_value_just_over_its_threshold_is_not_printed_as_the_threshold():
    """mean(tpot) = 50.04 ms against `< 50ms` FAILs; every format used to print it as "50ms"
    beside "threshold < 50ms". It now carries the digits that show which side it is on."""
    spec = small_spec("require mean(tpot) < 50ms")
    inp = prepare(spec, EvidenceBuilder(spec, per_bucket=40, latency=0.1 + 0.05004 * 63).build())
    rule = next(r for r in inp.verdict.rules if r.rule == "mean(tpot) < 50ms")
    assert rule.status == "fail"
    assert rule.observed_text == "mean(tpot) = 50.04ms"
    for fmt in ("md", "html", "junit"):
        out = inp.render(fmt)
        assert "mean(tpot) = 50.04ms" in out, fmt
        assert "mean(tpot) = 50ms" not in out, fmt


@pytest.mark.parametrize("value, kind, op, threshold, text", [
    (0.05004, Kind.DURATION, "<", 0.05, "50.04ms"),
    (0.04996, Kind.DURATION, "<", 0.05, "49.96ms"),
    (0.0823, Kind.DURATION, "<", 1.0, "82.3ms"),  # far from the threshold: as format_value prints it
    (150.4, Kind.DURATION, "<", 150.0, "150.4s"),
    (0.050041, Kind.DURATION, "<", 0.05004, "50.041ms"),
    (0.89996, Kind.RATIO, ">=", 0.9, "89.996%"),
    (0.9, Kind.RATIO, ">=", 0.9, "90%"),
    (4.99996, Kind.RATE, ">=", 5.0, "4.99996 rps"),
    (3 * 2**30, Kind.SIZE, "<", 4 * 2**30, "3.0GiB"),
    (2 * 2**30 + 1, Kind.SIZE, "<", 2 * 2**30, "2147483649B"),
    (0.0, Kind.COUNT, "==", 0.0, "0"),
])
def test_format_beside_keeps_the_value_on_its_side_of_the_threshold(value, kind, op, threshold, text):
    assert format_beside(value, kind, op, threshold) == text


def test_a_drift_just_over_its_threshold_is_not_printed_as_the_threshold():
    assert format_beside(0.25004, None, "<=", 0.25, signed=True) == "+25.004%"
    assert format_beside(0.00189, None, "<=", 0.25, signed=True) == "+0.189%"


RAMP_SPEC = '''soak "ramp" {}
backend "a" {
  url = "http://127.0.0.1:8000"
  runtime {
    label = "host-staged"
  }
}
workload "w" {
  load {
    mode = open
    phases {
      ramp {
        rate = 5rps
        ramp_to = 20rps
        duration = 2m
      }
      steady {
        rate = 20rps
        duration = 2m
      }
    }
  }
  bucket = 1m
  deadline = 30s
  follow_up = false
}
gate {
  require failed == 0
}
'''


def test_a_ramp_level_is_not_reported_as_offering_its_end_rate():
    """A 5→20 rps ramp used to read "Offered: 20 req/s (open loop)" in the per-level tables and
    the run's summary, and the HTML chart drew 20 req/s offered in each of its buckets; it reads
    as the ramp it is, and its buckets have no single offered point."""
    import re

    from soakspec.judge.testing import spec_from_text
    from soakspec.report.runsummary import summary_json, summary_lines

    spec = spec_from_text(RAMP_SPEC)
    inp = prepare(spec, EvidenceBuilder(spec, per_bucket=1200).build())  # the steady phase's 20 rps in each minute
    md = inp.render("md")
    ramp_row = next(x for x in md.splitlines() if x.startswith("| a · phase ramp"))
    assert "5→20 req/s (open loop ramp)" in ramp_row and "| 20 req/s" not in ramp_row
    steady_row = next(x for x in md.splitlines() if x.startswith("| a · phase steady"))
    assert "| 20 req/s (open loop) |" in steady_row
    levels = summary_json(inp.results, "d")["levels"]
    assert [lv["offered"] for lv in levels] == ["5→20 req/s (open loop ramp)", "20 req/s (open loop)"]
    assert [lv["offered_rate"] for lv in levels] == [None, 20.0]
    assert any("5→20 req/s (open loop ramp)" in x for x in summary_lines(inp.results, "d"))
    html = inp.render("html")
    qps = re.search(r'<svg class="chart" data-backend="a" data-metric="qps".*?</svg>', html, re.S).group(0)
    assert len(re.findall(r"<title>achieved at", qps)) == 4
    assert len(re.findall(r"<title>offered at", qps)) == 2  # the steady phase's buckets only


def test_an_incomplete_runs_sentence_counts_its_failed_rules():
    """A run killed before it finished is reported as `gate --partial` judges it: INCONCLUSIVE
    (commands/report.py replaces the outcome), with rules that FAIL on what was recorded. The md
    and html verdict sentence said only "N of M required rules could not be decided", leaving
    the failed ones out of the count while the rules below listed them as FAIL."""
    import dataclasses

    from soakspec.report import render

    spec = small_spec("require failed == 0\nrequire p50(ttft) < 5s per level")
    b = EvidenceBuilder(spec)
    b.set_outcome(next(b.measured("a")), "failed", "engine died")
    inp = prepare(spec, b.build())
    verdict = dataclasses.replace(inp.verdict, outcome="INCONCLUSIVE")  # as `report` does with a partial run
    req = [r for r in verdict.rules if r.severity == "require"]
    failed = sum(1 for r in req if r.status == "fail")
    unsure = sum(1 for r in req if r.status in ("inconclusive", "not_evaluated"))
    assert failed == 1
    want = f"{unsure} of {len(req)} required rules could not be decided, 1 failed on the evidence so far"
    for fmt in ("md", "html"):
        assert want in render(verdict, inp.results, inp.meta, spec, fmt), fmt
    # the one-line summary (gate's last line, verdict.json, junit's) counts them too
    assert verdict.summary().endswith("; 1 failed on the evidence so far (failed == 0)"), verdict.summary()
    assert 'failed on the evidence so far (failed == 0)' in render(verdict, inp.results, inp.meta, spec, "junit")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.fixed_dictionaries({}, optional={"total_tokens_per_s": _FIGURE, "wall_s": _FIGURE}), max_size=6))
def test_a_levels_rate_is_unknown_when_a_timed_bucket_has_none(windows):
    """Property: a level's wall-weighted rate (`wall_mean_whole`) is unknown (None) exactly
    when a bucket with a positive wall time has no value; otherwise it is `wall_mean`, the
    buckets' values weighted by their wall times -- never the other buckets' mean read as the
    level's."""
    from soakspec.report.common import num, wall_mean, wall_mean_whole

    gap = any(num(w.get("total_tokens_per_s")) is None and (num(w.get("wall_s")) or 0) > 0 for w in windows)
    assert wall_mean_whole(windows, "total_tokens_per_s") == (None if gap else wall_mean(windows, "total_tokens_per_s"))
