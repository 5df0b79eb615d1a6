"""The mean and p90 beside p50/p95/p99 (what `vllm bench serve` and GuideLLM print), and
`--percentiles` choosing which percentiles the tables show.

results.json's per-level ttft / itl / tpot / latency carry `mean` and `p90` over the same samples
as their other percentiles: the completed requests' own figures (ITL: every token gap pooled),
failed requests left out, none where a level has no sample. The Markdown, HTML and run summary
show each metric's mean in its own column beside the percentiles `--percentiles` chose among
the stored ones (50, 90, 95, 99); anything else is a usage error, exit 2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soakspec.cli import main
from soakspec.judge.summary import summarize
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.report import prepare
from soakspec.report.common import parse_percentiles
from soakspec.report.runsummary import summary_json, summary_lines

US = 1e-6  # the runner writes times and gaps to the microsecond


def _request(draw: st.DrawFn) -> dict:
    """One request's figures, in whole microseconds: ttft, its gaps and whether it completed."""
    ttft = draw(st.integers(1_000, 2_000_000)) * US
    gaps = [g * US for g in draw(st.lists(st.integers(100, 500_000), min_size=0, max_size=12))]
    return {"ttft": ttft, "gaps": gaps, "tail": draw(st.integers(0, 50_000)) * US, "ok": draw(st.booleans() | st.just(True))}


@st.composite
def level_requests(draw: st.DrawFn) -> list[dict]:
    """The figures of the builder's 16 measured requests (small_spec: 2 buckets of 8)."""
    return [_request(draw) for _ in range(16)]


def _apply(b: EvidenceBuilder, figs: list[dict]) -> dict[str, list]:
    """Write `figs` onto the builder's measured requests of backend a (one request each, in
    order); returns the reference samples: ttft, latency and tpot of the completed requests
    (tpot: those with 2 tokens or more) and their gaps pooled."""
    ref: dict[str, list] = {"ttft": [], "latency": [], "tpot": [], "itl": []}
    for r, f in zip(b.measured("a"), figs, strict=True):
        s = r["start"]
        if not f["ok"]:
            b.set_outcome(r, "failed", "HTTP 500")
            continue
        n = len(f["gaps"]) + 1
        lat = f["ttft"] + math.fsum(f["gaps"]) + f["tail"]
        tpot = math.fsum(f["gaps"]) / (n - 1) if n > 1 else None
        r.update({"ttft": f["ttft"], "first_token": s + f["ttft"], "first_byte": s + f["ttft"] / 2, "latency": lat, "end": s + lat,
                  "itl": list(f["gaps"]), "output_tokens": n, "chunks": n, "tpot": tpot})
        ref["ttft"].append(f["ttft"])
        ref["latency"].append(lat)
        ref["itl"] += f["gaps"]
        if tpot is not None:
            ref["tpot"].append(tpot)
    return ref


def _p(vals: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(vals, dtype=np.float64), q))  # linear, soakspec's percentile


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(level_requests())
def test_a_levels_mean_and_p90_are_those_of_its_completed_requests(figs):
    """Property: for any completed/failed mix, results.json's level mean is the exact mean and
    p90 the linear-interpolation p90 of the completed requests' ttft, latency and tpot and of
    their token gaps pooled (ITL); p50/p95/p99 keep their meaning; a metric with no sample is
    null, never a number."""
    b = EvidenceBuilder(small_spec())
    ref = _apply(b, figs)
    (lv,) = summarize(b.build())["backends"][0]["levels"]
    for name, vals in ref.items():
        got = lv[name]
        if not vals:
            assert got is None, (name, got)
            continue
        assert got["count"] == len(vals)
        assert got["mean"] == pytest.approx(math.fsum(vals) / len(vals), rel=1e-12, abs=1e-15), name
        for q in (50, 90, 95, 99):
            assert got[f"p{q}"] == pytest.approx(_p(vals, q), rel=1e-9, abs=1e-12), (name, q)


def test_a_level_without_a_completed_request_has_no_mean():
    b = EvidenceBuilder(small_spec())
    for r in list(b.measured("a")):
        b.set_outcome(r, "failed", "HTTP 500")
    (lv,) = summarize(b.build())["backends"][0]["levels"]
    assert all(lv[m] is None for m in ("ttft", "itl", "tpot", "latency"))
    (row,) = summary_json(summarize(b.build()), "/tmp/x")["levels"]
    assert row["ttft"] == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}


def _figs() -> list[dict]:
    """16 requests, 2 of them failed: TTFT 10, 20, ... ms; 3 gaps each."""
    return [{"ttft": (10 + 10 * i) * 1e-3, "gaps": [0.004, 0.005, 0.006 + i * 1e-3], "tail": 0.001, "ok": i not in (3, 11)}
            for i in range(16)]


@pytest.fixture(scope="module")
def built():
    spec = small_spec()
    b = EvidenceBuilder(spec)
    ref = _apply(b, _figs())
    return spec, b, ref


def test_the_markdown_and_html_tables_show_each_mean_beside_the_chosen_percentiles(built):
    spec, b, ref = built
    inputs = prepare(spec, b.build())
    mean_ttft = math.fsum(ref["ttft"]) / len(ref["ttft"])
    md = inputs.render("md")
    head = next(x for x in md.splitlines() if x.startswith("| Backend / level |"))
    assert "| TTFT mean | TTFT p50 / p95 / p99 |" in head and "| Latency mean | Latency p50 / p95 / p99 |" in head
    row = next(x for x in md.splitlines() if x.startswith("| a · "))
    assert f"| {mean_ttft * 1000:.1f} ms | " in row
    p90 = _p(ref["ttft"], 90)
    md90 = inputs.render("md", ("p50", "p90", "p99"))
    assert "| TTFT p50 / p90 / p99 |" in md90 and "| ITL p50 / p90 / p99 |" in md90
    assert f"{_p(ref['ttft'], 50) * 1000:.1f} ms / {p90 * 1000:.1f} ms / {_p(ref['ttft'], 99) * 1000:.1f} ms" in md90
    html = inputs.render("html", ("p90",))
    assert 0.1 <= p90 < 1  # three significant digits in ms: 147 ms
    assert "<th>TTFT mean</th><th>TTFT p90</th>" in html and f'<td class="num">{p90 * 1000:.0f} ms</td>' in html
    assert "<th>TTFT mean</th><th>TTFT p50 / p95 / p99</th>" in inputs.render("html")


def test_the_run_summary_prints_the_mean_and_the_chosen_percentiles(built):
    _, b, ref = built
    results = summarize(b.build())
    lines = summary_lines(results, "/tmp/x", percentiles=("p50", "p90", "p99"))
    head = next(x for x in lines if "TTFT mean ms" in x)
    assert "TTFT p50/p90/p99 ms" in head and "latency mean ms" in head
    row = lines[lines.index(head) + 1]
    def ms(v: float) -> str:  # the summary's: one decimal below 100 ms
        return f"{v * 1000:.1f}" if v < 0.1 else f"{v * 1000:.0f}"

    assert f"  {ms(math.fsum(ref['ttft']) / len(ref['ttft']))}  " in row
    assert f"  {ms(_p(ref['ttft'], 50))} / {ms(_p(ref['ttft'], 90))} / {ms(_p(ref['ttft'], 99))}  " in row
    assert f"  {ms(math.fsum(ref['itl']) / len(ref['itl']))}  " in row  # ITL's mean: over every gap
    assert any("TTFT p50/p95/p99 ms" in x for x in summary_lines(results, "/tmp/x"))  # the default


@pytest.mark.parametrize("text, want", [("50,90,99", ("p50", "p90", "p99")), ("99, p50,90,50", ("p50", "p90", "p99")),
                                        ("95", ("p95",)), ("90.0", ("p90",))])
def test_percentiles_are_parsed_sorted_and_once(text, want):
    assert parse_percentiles(text) == want


def _cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's usage error
        return int(e.code)


@pytest.mark.parametrize("bad, said", [("0,50", "outside 0 < p < 100"), ("100", "outside 0 < p < 100"), ("-5", "outside"),
                                       ("nan", "outside"), ("50,abc", "'abc' is not a percentile"), ("", "separated by commas"),
                                       ("50,,99", "separated by commas"), ("99.9", "not one of the percentiles results.json stores"),
                                       ("75", "stores (50, 90, 95, 99)")])
def test_a_bad_percentiles_list_is_a_usage_error(built, tmp_path, capsys, bad, said):
    _, b, _ = built
    d = b.write(tmp_path / "ev")
    assert _cli(["report", str(d), "--percentiles", bad]) == 2
    err = capsys.readouterr().err
    assert "--percentiles" in err and said in err, err
    assert _cli(["run", str(tmp_path / "none.soak"), "--percentiles", bad]) == 2  # refused before anything runs
    assert said in capsys.readouterr().err


def test_report_percentiles_chooses_the_markdown_columns(built, tmp_path, capsys):
    _, b, ref = built
    d = b.write(tmp_path / "ev")
    assert _cli(["report", str(d), "--percentiles", "90,50"]) == 0
    out = capsys.readouterr().out
    assert "| TTFT mean | TTFT p50 / p90 |" in out and f"{_p(ref['ttft'], 90) * 1000:.1f} ms" in out
