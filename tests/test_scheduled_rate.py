"""An open loop's offered rate is what its schedule put in the measured window. A seeded random
schedule only averages its nominal rate: at 40 rps one 10 s window held 444 arrivals, and a run
summary that showed "40 req/s (open loop)" beside 43.7 achieved read as the server beating the
offer. results.json adds `scheduled_rate` (the nominal `rate` keeps its meaning) and the reports
show the scheduled rate as offered, the nominal beside it where they differ."""

from __future__ import annotations

import pytest

from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.report import prepare
from soakspec.report.runsummary import summary_json, summary_lines


def _inputs(per_bucket: int, mode: str = "open"):
    spec = small_spec(mode=mode, levels="[2rps]" if mode == "open" else "[2]", duration="2m", bucket="1m")
    return prepare(spec, EvidenceBuilder(spec, per_bucket=per_bucket, scheduled=False).build())


def test_a_schedule_above_its_nominal_rate_is_shown_as_offered_with_the_nominal_beside():
    """133 arrivals in each 60 s bucket of a 2 rps level: 2.22 req/s offered, 2 nominal."""
    inp = _inputs(133)
    (lv,) = inp.results["backends"][0]["levels"]
    assert lv["rate"] == 2.0 and lv["scheduled_rate"] == pytest.approx(133 / 60)
    lines = summary_lines(inp.results, "/ev", inp.verdict)
    assert any("2.22 req/s scheduled (open loop, 2 nominal)" in x for x in lines), lines
    doc = summary_json(inp.results, "/ev", inp.verdict)["levels"][0]
    assert doc["offered_rate"] == 2.0 and doc["scheduled_rate"] == pytest.approx(133 / 60)
    assert "2.22 req/s scheduled (open loop, 2 nominal)" in inp.render("md")  # the report's per-level table


def test_a_schedule_at_its_nominal_rate_reads_as_before():
    """Constant arrivals (120 in each 60 s bucket at 2 rps): the offer is the nominal rate, said once."""
    inp = _inputs(120)
    (lv,) = inp.results["backends"][0]["levels"]
    assert lv["scheduled_rate"] == pytest.approx(2.0)
    lines = summary_lines(inp.results, "/ev", inp.verdict)
    assert any("2 req/s (open loop)" in x for x in lines) and not any("scheduled" in x for x in lines)


def test_a_closed_loop_has_no_scheduled_rate():
    (lv,) = _inputs(8, mode="closed").results["backends"][0]["levels"]
    assert lv["scheduled_rate"] is None


def test_a_level_its_count_ended_offers_its_count_not_a_rate():
    """A count-bounded level's window runs to its drain, after its last arrival: arrivals over
    it would read below the nominal rate of a constant schedule. No scheduled rate there."""
    from soakspec.judge.testing import spec_from_text

    text = small_spec(mode="open", levels="[2rps]").canonical_text.replace("rate = [2rps]", "rate = [2rps]\n    requests_per_level = 16")
    spec = spec_from_text(text)
    b = EvidenceBuilder(spec)
    lv = b.level("a", 0)
    lv["ended_by"] = "count"
    (row,) = prepare(spec, b.build()).results["backends"][0]["levels"]
    assert row["scheduled_rate"] is None and row["rate"] == 2.0
