"""`soakspec lint-claims --evidence DIR` on the performance figures a document states (latency
percentiles and means, output tokens/s, requests/s), against evidence as `soakspec run` writes it
(`EvidenceBuilder(..., scheduled=False).write(dir)`): CB201 where the evidence contradicts a figure, at the
precision the document writes it (`soakspec.claims.figures`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soakspec import cli
from soakspec.claims import ClaimBoundary, Coverage, lint
from soakspec.claims.adapters import load_evidence_facts
from soakspec.judge.evidence import load_evidence
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.report import prepare

BOUNDARY = "\n\n## Claim boundary\n\nSynthetic evidence only.\n"
TTFT_C4 = 0.04087  # level 1 (concurrency 4) answers faster than level 0 (TTFT 100 ms)


def _faster_level(b: EvidenceBuilder) -> None:
    for r in b.measured("sim-fast", level=1):
        r["first_token"] = r["start"] + TTFT_C4
        r["ttft"] = TTFT_C4


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    """Evidence of sim-fast at concurrency 2 and 4 (TTFT 100 ms and 40.87 ms), and its spec."""
    tmp = tmp_path_factory.mktemp("figures")
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    b = EvidenceBuilder(spec, scheduled=False)
    _faster_level(b)
    d = b.write(tmp / "run")
    spec_file = tmp / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    return d, spec_file


@pytest.fixture(scope="module")
def results(run) -> dict:
    """results.json as re-judged (what lint-claims compares with)."""
    d, _ = run
    (b,) = json.loads((d / "results.json").read_text())["backends"]
    return b


def _lint(tmp_path: Path, capsys, doc: str, run: tuple[Path, Path]) -> tuple[int, list[str]]:
    """Exit code and the diagnostics a user sees: `PR.md:line:col: CODE message` lines."""
    d, spec_file = run
    p = tmp_path / "PR.md"
    p.write_text(doc)
    code = cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)])
    out = capsys.readouterr().out
    return code, [line.removeprefix(f"{p}:") for line in out.splitlines() if re.match(rf"{re.escape(str(p))}:\d+:\d+: ", line)]


# ---------------------------------------------------------------- 1. the audit's figures


def test_figures_the_evidence_contradicts_are_CB201(tmp_path, capsys, run):
    doc = ("# PR\n\n"
           "The p95 TTFT of 55 ms held.\n"
           "sim-fast generated 900 tok/s.\n"
           "It served 80 req/s.\n"
           "Mean ITL 30 ms.\n"
           "TPOT p99 = 12 ms.\n" + BOUNDARY)  # fmt: skip
    code, diags = _lint(tmp_path, capsys, doc, run)
    assert code == 1
    both = "sim-fast · concurrency 2: {}; sim-fast · concurrency 4: {}"
    assert diags == [
        "3:17: CB201 states TTFT p95 55 ms for sim-fast; the evidence records " + both.format("100.0 ms", "40.9 ms"),
        "4:20: CB201 states output throughput 900 tok/s for sim-fast; the evidence records "
        + both.format("8.53 tok/s", "8.53 tok/s") + "; sim-fast over the run: 8.53 tok/s",
        "5:11: CB201 states request rate 80 req/s for sim-fast; the evidence records "
        + both.format("0.133 req/s", "0.133 req/s") + "; sim-fast over the run: 0.133 req/s",
        "6:10: CB201 states ITL mean 30 ms for sim-fast; the evidence records " + both.format("14.3 ms", "14.3 ms"),
        "7:12: CB201 states TPOT p99 12 ms for sim-fast; the evidence records " + both.format("14.3 ms", "14.3 ms"),
    ]


def test_a_figure_after_a_bold_label_is_checked(tmp_path, capsys, run):
    """'**p95 TTFT:** 55 ms' is a PR's usual way to state a figure; the emphasis joins it."""
    doc = "# PR\n\n**p95 TTFT:** 55 ms\n\n- **TTFT p95**: 55 ms\n\n**p95 TTFT:** 41 ms at concurrency 4.\n" + BOUNDARY
    code, diags = _lint(tmp_path, capsys, doc, run)
    assert code == 1
    assert [d.split(" states")[0] for d in diags] == ["3:15: CB201", "5:17: CB201"], diags


def test_figures_copied_from_the_evidence_are_clean(tmp_path, capsys, run, results):
    lv0, lv1 = results["levels"]
    doc = ("# PR\n\n"
           "At concurrency 4, p95 TTFT was 41 ms; at concurrency 2 it was 100 ms.\n"
           "TTFT p95 (concurrency 4): 40.9 ms, or 40.87 ms, or 0.041 s.\n"
           f"Mean ITL {lv0['itl']['mean'] * 1000:.1f} ms, TPOT p99 = {lv0['tpot']['p99'] * 1000:.2f} ms, "
           f"p50 latency {lv0['latency']['p50']:.1f} s.\n"
           "sim-fast generated 8.5 tok/s and served 0.13 req/s (about 0.1 req/s).\n"
           "A 41 ms p95 TTFT at concurrency 4. TTFT p50/p95/p99 of 100/100/100 ms at concurrency 2.\n"
           "The gate measured p95(ttft) = 100ms at concurrency 2.\n" + BOUNDARY)  # fmt: skip
    assert _lint(tmp_path, capsys, doc, run) == (0, [])


# ---------------------------------------------------------------- 2. precision


@pytest.mark.parametrize(("stated", "holds"), [
    ("41 ms", True), ("40.9 ms", True), ("40.87 ms", True), ("0.04 s", True), ("0.041 s", True),
    ("40 ms", False), ("42 ms", False), ("40.8 ms", False), ("40.85 ms", False), ("0.042 s", False), ("0.1 s", False),
    ("~40 ms", True), ("about 40 ms", True), ("~50 ms", False),
    ("40870 µs", True), ("40871 µs", False), ("40869 us", False),
])  # fmt: skip
def test_a_figure_holds_within_half_a_unit_of_its_last_digit(tmp_path, capsys, run, stated, holds):
    doc = f"# PR\n\nAt concurrency 4, p95 TTFT was {stated}.\n" + BOUNDARY
    code, diags = _lint(tmp_path, capsys, doc, run)
    recorded = 0.04086995  # what the records give (a difference of two epoch timestamps)
    assert (code == 0) == holds, (diags, recorded)
    if not holds:
        (d,) = diags
        assert d.startswith("3:") and " CB201 states TTFT p95 " in d and "sim-fast · concurrency 4: " in d


# ---------------------------------------------------------------- 3. scope


def test_a_sentence_naming_a_level_is_compared_with_that_level(tmp_path, capsys, run):
    doc = "# PR\n\nAt concurrency 2, p95 TTFT was 41 ms.\nsim-fast · concurrency 4: p95 TTFT 100 ms.\n" + BOUNDARY
    code, diags = _lint(tmp_path, capsys, doc, run)
    assert code == 1
    assert diags == [
        "3:32: CB201 states TTFT p95 41 ms for sim-fast; the evidence records sim-fast · concurrency 2: 100.0 ms",
        "4:36: CB201 states TTFT p95 100 ms for sim-fast; the evidence records sim-fast · concurrency 4: 40.9 ms",
    ]
    # naming no level: either level's figure
    assert _lint(tmp_path, capsys, "# PR\n\np95 TTFT was 41 ms. p95 TTFT was 100 ms.\n" + BOUNDARY, run) == (0, [])


def test_the_gates_backend_figure_is_the_run_figure(tmp_path, capsys):
    """A rule at backend scope measures over the whole run (`mean(itl) = 14.3ms`): a sentence
    naming no level may cite it."""
    spec = small_spec("require failed == 0\n  require p99(ttft) < 1s", levels="[2, 4]", backends=("sim-fast",))
    b = EvidenceBuilder(spec, scheduled=False)
    _faster_level(b)
    d = b.write(tmp_path / "run")
    spec_file = tmp_path / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    verdict = json.loads((d / "verdict.json").read_text())
    (rule,) = [r for r in verdict["rules"] if r["rule"].startswith("p99(ttft)")]
    assert rule["observed_text"] == "p99(ttft) = 100ms"  # over both levels
    facts = {ev.backend: ev for ev in load_evidence_facts(d)}
    assert facts["sim-fast"].figures["ttft.p99"] == (pytest.approx(rule["observed"]),)
    code, diags = _lint(tmp_path, capsys, "# PR\n\np99 TTFT was 60 ms.\n" + BOUNDARY, (d, spec_file))
    assert code == 1
    assert diags == ["3:14: CB201 states TTFT p99 60 ms for sim-fast; the evidence records sim-fast · concurrency 2: 100.0 ms; "
                     "sim-fast · concurrency 4: 40.9 ms; sim-fast over the run: 100.0 ms"]


# ---------------------------------------------------------------- 4. rules, quotes, bounds, absent figures


def test_rule_thresholds_quotes_and_unasserted_figures_are_never_flagged(tmp_path, capsys, run):
    doc = ("# PR\n\n"
           "The gate requires p95(ttft) < 5ms per level.\n"
           "`require p99(tpot) <= 1ms` and `p95(ttft) < 5ms` are rules; so is goodput(ttft < 5ms and tpot < 1ms) >= 90%.\n"
           "The SLO is a p95 TTFT of 5 ms. The threshold for mean ITL is 2 ms.\n"
           "Multi-turn sessions keep a TTFT p95 of 5 ms per turn.\n"
           "The gate fails if throughput drops below 1000 tok/s.\n"
           "We do not claim a p95 TTFT of 5 ms. p95 TTFT may reach 5 ms later. Was p99 TTFT 5 ms?\n"
           "At 2 rps the open loop was not tested; rate 7 req/s was not covered.\n"
           "TTFT improved by 5 ms; p95 TTFT dropped +3 ms.\n\n"
           "```\np95 TTFT of 55 ms, 900 tok/s\n```\n\n"
           "> p95 TTFT of 55 ms, 900 tok/s\n\n"
           "## Non-goals\n\n- a p95 TTFT of 5 ms\n" + BOUNDARY)  # fmt: skip
    code, diags = _lint(tmp_path, capsys, doc, run)
    assert not [x for x in diags if "CB201" in x], diags


def test_bounds_are_checked_against_the_figure(tmp_path, capsys, run):
    ok = ("# PR\n\nAt concurrency 4, p95 TTFT stayed below 50 ms. p99 latency was under 2 s. "
          "sim-fast served at least 0.1 req/s and more than 8 tok/s.\n" + BOUNDARY)  # fmt: skip
    assert _lint(tmp_path, capsys, ok, run) == (0, [])
    bad = "# PR\n\nAt concurrency 2, p95 TTFT stayed below 50 ms.\nIt served at least 400 tok/s.\nTTFT was under 30 ms.\n" + BOUNDARY
    code, diags = _lint(tmp_path, capsys, bad, run)
    assert code == 1
    assert diags == [
        "3:41: CB201 states TTFT p95 at most 50 ms for sim-fast; the evidence records sim-fast · concurrency 2: 100.0 ms",
        "4:20: CB201 states output throughput at least 400 tok/s for sim-fast; the evidence records sim-fast · concurrency 2: "
        "8.53 tok/s; sim-fast · concurrency 4: 8.53 tok/s; sim-fast over the run: 8.53 tok/s",
        # no aggregate: every request (the max); either level's would do, neither does
        "5:16: CB201 states TTFT at most 30 ms for sim-fast; the evidence records sim-fast · concurrency 2: 100.0 ms to 100.0 ms; "
        "sim-fast · concurrency 4: 40.9 ms to 40.9 ms",
    ]


def test_a_figure_the_evidence_does_not_record_is_not_flagged(tmp_path, capsys, run):
    doc = "# PR\n\np75 TTFT was 5 ms and p99.9 ITL 1 ms; prefill ran at 90000 tok/s, 3 tok/s per user.\n" + BOUNDARY
    assert _lint(tmp_path, capsys, doc, run) == (0, [])


def test_a_p90_figure_is_checked_now_that_results_json_records_p90(tmp_path, capsys, run):
    """results.json stores p90 (GuideLLM's figure) beside p50/p95/p99: a p90 a document
    states is held to it, as the others are."""
    code, diags = _lint(tmp_path, capsys, "# PR\n\np90 TTFT was 5 ms.\n" + BOUNDARY, run)
    assert code == 1 and len(diags) == 1 and "CB201 states TTFT p90" in diags[0], diags


# ---------------------------------------------------------------- 5. tables


def test_the_reports_per_level_table_is_clean_and_an_edited_figure_is_found(tmp_path, capsys, run):
    d, spec_file = run
    md = prepare(_spec(spec_file), load_evidence(d)).render("md")
    assert _lint(tmp_path, capsys, md, run) == (0, [])
    (row,) = [line for line in md.splitlines() if line.startswith("| sim-fast · concurrency 4 |")]
    assert "| 40.9 ms / 40.9 ms / 40.9 ms |" in row  # TTFT p50 / p95 / p99
    edited = row.replace("| 40.9 ms / 40.9 ms / 40.9 ms |", "| 40.9 ms / 30.9 ms / 40.9 ms |").replace("| 8.5 |", "| 85.0 |")
    code, diags = _lint(tmp_path, capsys, md.replace(row, edited), run)
    assert code == 1
    assert [re.sub(r"^\d+:\d+: ", "", x) for x in diags] == [
        "CB201 states output throughput 85.0 tok/s for sim-fast; the evidence records sim-fast · concurrency 4: 8.53 tok/s; "
        "sim-fast over the run: 8.53 tok/s",
        "CB201 states TTFT p95 30.9 ms for sim-fast; the evidence records sim-fast · concurrency 4: 40.87 ms",
    ]


def test_a_pr_table_with_figure_columns(tmp_path, capsys, run):
    doc = ("# PR\n\n| Backend | Level | p95 TTFT (ms) | Output tok/s | Offered |\n|---|---|---|---|---|\n"
           "| sim-fast | concurrency 4 | 41 | 8.5 | 2 req/s |\n| sim-fast | concurrency 2 | 41 | 8.5 | 9 req/s |\n\n"
           "| Metric | Value |\n|---|---|\n| p95 TTFT | 55 ms |\n" + BOUNDARY)  # fmt: skip
    code, diags = _lint(tmp_path, capsys, doc, run)
    assert code == 1
    assert diags == [
        "6:30: CB201 states TTFT p95 41 ms for sim-fast; the evidence records sim-fast · concurrency 2: 100.0 ms",
        "10:14: CB201 states TTFT p95 55 ms for sim-fast; the evidence records sim-fast · concurrency 2: 100.0 ms; "
        "sim-fast · concurrency 4: 40.9 ms",
    ]


def test_a_figure_row_for_a_backend_the_evidence_did_not_run_is_CB301_not_another_backends_figure(tmp_path, capsys, run):
    """A hand-written row "| vllm | 41 |" reports a backend that never ran: CB301 on its name, and its
    figures are not compared with sim-fast's (they are not sim-fast's). A row summing the backends
    ("combined") is no backend of its own."""
    doc = ("# PR\n\n| Backend | p95 TTFT (ms) |\n|---|---|\n| sim-fast | 41 |\n| vllm | 30.0 |\n| combined | 41 |\n\n"
           "| Backend | Level | p95 TTFT (ms) |\n|---|---|---|\n| vllm | concurrency 2 | 41 |\n| sim-fast | concurrency 2 | 41 |\n"
           + BOUNDARY)  # fmt: skip
    code, diags = _lint(tmp_path, capsys, doc, run)
    assert code == 1
    assert diags == [
        '6:3: CB301 reports results for backend "vllm", which the evidence does not record (backends: sim-fast)',
        '11:3: CB301 reports results for backend "vllm", which the evidence does not record (backends: sim-fast)',
        "12:30: CB201 states TTFT p95 41 ms for sim-fast; the evidence records sim-fast · concurrency 2: 100.0 ms",
    ]


def test_a_column_header_giving_its_unit_as_a_bare_word_is_read(tmp_path, capsys, run):
    """`soakspec run`'s summary heads its latency columns "TTFT p50/p95/p99 ms": the bare unit is the
    column's, as "(ms)" is -- a contradicted cell under it is CB201, a copied one is clean."""
    doc = ("# PR\n\n| backend | level | TTFT p50/p95/p99 ms |\n|---|---|---|\n"
           "| sim-fast | concurrency 4 | 40.9 / 30.9 / 40.9 |\n| sim-fast | concurrency 2 | 100.0 / 100.0 / 100.0 |\n\n"
           "| backend | TTFT p95 ms |\n|---|---|\n| sim-fast | 55 |\n" + BOUNDARY)  # fmt: skip
    code, diags = _lint(tmp_path, capsys, doc, run)
    assert code == 1
    assert diags == [
        "5:37: CB201 states TTFT p95 30.9 ms for sim-fast; the evidence records sim-fast · concurrency 4: 40.87 ms",
        "10:14: CB201 states TTFT p95 55 ms for sim-fast; the evidence records sim-fast · concurrency 2: 100.0 ms; "
        "sim-fast · concurrency 4: 40.9 ms",
    ]


# ---------------------------------------------------------------- 6. stored results are not trusted


def test_an_edited_results_json_figure_is_CB402_and_not_what_the_document_is_checked_against(tmp_path, capsys):
    spec = small_spec(backends=("sim-fast",))
    d = EvidenceBuilder(spec, scheduled=False).write(tmp_path / "run")
    spec_file = tmp_path / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    res = json.loads((d / "results.json").read_text())
    res["backends"][0]["levels"][0]["ttft"]["p95"] = 0.055
    (d / "results.json").write_text(json.dumps(res))
    code, diags = _lint(tmp_path, capsys, "# PR\n\np95 TTFT of 55 ms.\n" + BOUNDARY, (d, spec_file))
    assert code == 1
    assert [x.split(" ", 2)[1] for x in diags] == ["CB402", "CB201"]
    assert "results.json records ttft.p95 0.055 s for sim-fast · concurrency 2; re-judged: 0.0999999 s" in diags[0]  # the records' timestamps


def _spec(spec_file: Path):
    from soakspec.judge.testing import spec_from_text

    return spec_from_text(spec_file.read_text())


# ---------------------------------------------------------------- 7. properties

_FORMS = ["At concurrency 4, p95 TTFT was {v}.", "TTFT p95 at concurrency 4 = {v}.", "At concurrency 4 the p95 TTFT came in at {v}.",
          "A {v} p95 TTFT at concurrency 4."]  # fmt: skip


def _render(x: float, decimals: int) -> str:
    return f"{x:.{decimals}f}"


@pytest.fixture(scope="module")
def facts(run):
    d, _ = run
    return load_evidence_facts(d)


# how much the figure changed, written after it: `soakspec.claims.direction`'s words, never the figure
_CHANGES = [None, "{v} lower", "{v} (12%) higher", "{v} less", "{v} longer", "{v} **faster**", "{v} improvement", "{v} down"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(decimals=st.integers(0, 5), unit=st.sampled_from(["ms", "s", "µs", "min"]), form=st.sampled_from(_FORMS),
       off=st.sampled_from([0, 2, 3, -2, 7]), change=st.sampled_from(_CHANGES))  # fmt: skip
def test_a_figure_at_any_precision_holds_iff_it_rounds_from_the_evidence(facts, decimals, unit, form, off, change):
    """Rendered from the evidence at any precision, a figure is never flagged; moved by two or
    more units of its last digit, it always is -- unless the sentence says it is a change ("{v}
    lower", "{v} (12%) higher"): then it is never flagged, whatever the value."""
    (lv,) = [lv for lv in facts[0].levels if lv.label == "concurrency 4"]
    (x,) = lv.figures["ttft.p95"]
    scaled = x * {"ms": 1e3, "s": 1.0, "µs": 1e6, "min": 1 / 60}[unit]
    value = round(scaled, decimals) + off * 10.0**-decimals
    if value < 0:
        return
    stated = f"{_render(value, decimals)} {unit}"
    doc = "# PR\n\n" + form.format(v=change.format(v=stated) if change else stated) + BOUNDARY
    diags = [d for d in lint(doc, "PR.md", ClaimBoundary(), Coverage(concurrency_levels=(2, 4)), facts) if d.code == "CB201"]
    assert bool(diags) == (off != 0 and change is None), (doc, x, diags)


# ---------------------------------------------------------------- 8. from the send; total throughput


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> tuple[Path, Path]:
    """An open loop under max_concurrency = 1 whose requests but the first waited 200 ms for a
    slot: TTFT from the intended start 300 ms, from the send (sent_ttft) 100 ms; prompts of 100
    tokens and more, so its total tokens/s (prompt + output, 22.87) is not its output tokens/s (8.53)."""
    from test_max_concurrency import _waited

    tmp = tmp_path_factory.mktemp("capped")
    spec = small_spec(mode="open", levels="[2rps]\n    max_concurrency = 1", backends=("a",))
    b = _waited(EvidenceBuilder(spec, scheduled=False))
    for k, r in enumerate(b.measured("a")):
        r["prompt_tokens"] = 100 + k
    d = b.write(tmp / "run")
    spec_file = tmp / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    return d, spec_file


def test_a_figure_from_the_send_is_checked_against_sent_ttft_not_ttft(tmp_path, capsys, capped):
    """"sent TTFT p50 was 100 ms" is bench serve's TTFT, the server's: it holds against the
    level's sent_ttft (100 ms), not its TTFT from the intended start (300 ms, the wait for a slot
    counted), and "sent TTFT p50 was 300 ms" is CB201 though TTFT p50 is 300 ms."""
    ok = ("# PR\n\nsent TTFT p50 was 100 ms, TTFT p50 was 300 ms. p99 sent latency of 7.67 s.\n"
          "The gate measured p95(sent_ttft) = 100ms.\n" + BOUNDARY)  # fmt: skip
    assert _lint(tmp_path, capsys, ok, capped) == (0, [])
    code, diags = _lint(tmp_path, capsys, "# PR\n\nsent TTFT p50 was 300 ms. p99 sent_latency of 7.5 s.\n" + BOUNDARY, capped)
    assert code == 1
    assert [re.sub(r"^\d+:\d+: CB201 states (.*?) for a; the evidence records .*: ", r"\1: ", x) for x in diags] == [
        "sent TTFT p50 300 ms: 100.0 ms", "sent latency p99 7.5 s: 7.67 s"], diags


def test_total_throughput_is_checked_against_the_runs_total_tokens_per_second(tmp_path, capsys, capped):
    """"total throughput was 5000 tok/s" (prompt + output tokens/s, bench serve's "total token
    throughput") is checked against results.json's total_tokens_per_s, with the precision rules of
    output throughput; it was not read at all. Output throughput stays output's."""
    ok = "# PR\n\nTotal throughput was 22.9 tok/s and output throughput 8.5 tok/s; about 23 total tok/s.\n" + BOUNDARY
    assert _lint(tmp_path, capsys, ok, capped) == (0, [])
    code, diags = _lint(tmp_path, capsys, "# PR\n\nTotal throughput was 5000 tok/s. We saw 22.8 total tok/s.\n" + BOUNDARY, capped)
    assert code == 1
    assert [re.sub(r"^\d+:\d+: CB201 states (.*?) for a; .*over the run: ", r"\1: ", x) for x in diags] == [
        "total throughput 5000 tok/s: 22.9 tok/s", "total throughput 22.8 tok/s: 22.87 tok/s"], diags


def test_total_before_a_colon_or_a_verb_still_states_total_throughput(tmp_path, capsys, capped):
    """"Total: 22.9 tok/s.", "Throughput (total): 22.9 tok/s.", "The total was 22.9 tok/s." state
    total throughput (22.87 tok/s) correctly: they were read as output throughput (8.53), a false
    CB201. "total" is dropped only where an output word follows it ("In total, output ...")."""
    ok = "# PR\n\nTotal: 22.9 tok/s.\n\nThroughput (total): 22.9 tok/s.\n\nThe total was 22.9 tok/s.\n" + BOUNDARY
    assert _lint(tmp_path, capsys, ok, capped) == (0, [])
    code, diags = _lint(tmp_path, capsys, "# PR\n\nTotal: 8.5 tok/s.\n\nIn total, output was 22.9 tok/s.\n" + BOUNDARY, capped)
    assert code == 1
    assert [re.sub(r"^\d+:\d+: CB201 states (.*?) for a;.*", r"\1", x) for x in diags] == [
        "total throughput 8.5 tok/s", "output throughput 22.9 tok/s"], diags


def test_the_reports_total_tok_s_column_is_checked(tmp_path, capsys, capped):
    """The per-level table's "Total tok/s" beside "Output tok/s": copied it is clean, edited it is CB201."""
    d, spec_file = capped
    md = prepare(_spec(spec_file), load_evidence(d)).render("md")
    assert _lint(tmp_path, capsys, md, capped) == (0, [])
    header = next(line for line in md.splitlines() if "| Total tok/s |" in line)
    col = [c.strip() for c in header.split("|")].index("Total tok/s")
    (row,) = [line for line in md.splitlines() if line.startswith("| a · ")]
    cells = row.split("|")
    assert cells[col].strip() == "22.9", row
    cells[col] = " 229.0 "
    code, diags = _lint(tmp_path, capsys, md.replace(row, "|".join(cells)), capped)
    assert code == 1
    assert [re.sub(r"^\d+:\d+: ", "", x).split(";")[0] for x in diags] == ["CB201 states total throughput 229.0 tok/s for a"], diags


def test_a_results_json_from_before_the_figures_from_the_send_is_not_called_edited(tmp_path, capsys, capped):
    """results.json gained a capped level's sent_ttft / sent_latency and the buckets'
    total_tokens_per_s later than the rest: a results.json without any of them was written
    before, not edited (no CB402), and the document is still checked against the evidence
    re-judged. One that has them with another value was edited: CB402."""
    import shutil

    d, spec_file = capped
    for edit, expect in (("older", ["CB201"]), ("edited", ["CB402", "CB201"])):
        old = shutil.copytree(d, tmp_path / edit)
        res = json.loads((old / "results.json").read_text())
        (be,) = res["backends"]
        if edit == "older":
            for lv in be["levels"]:
                del lv["sent_ttft"], lv["sent_latency"]
            for w in be["buckets"]:
                del w["total_tokens_per_s"]
        else:
            be["levels"][0]["sent_ttft"]["p50"] = 0.3
        (old / "results.json").write_text(json.dumps(res))
        code, diags = _lint(tmp_path, capsys, "# PR\n\nsent TTFT p50 was 300 ms.\n" + BOUNDARY, (old, spec_file))
        assert [x.split(" ", 2)[1] for x in diags] == expect, diags
        assert "states sent TTFT p50 300 ms" in diags[-1], diags
        if edit == "edited":
            assert "results.json records sent_ttft.p50 0.3 s for a · " in diags[0], diags


def test_a_level_between_a_throughputs_qualifier_and_its_value_does_not_hide_the_qualifier(tmp_path, capsys, capped):
    """"Total throughput at 2 rps was 22.9 tok/s" is the total, "Prefill throughput at 2 rps
    was 9000 tok/s" no figure of the evidence: the level's digits between the qualifier and the
    value made both read as output throughput, two false CB201s."""
    doc = ("# PR\n\nTotal throughput at 2 rps was 22.9 tok/s. Prefill throughput at 2 rps was 9000 tok/s.\n"
           "Peak QPS at rate 2 rps was 30.\n" + BOUNDARY)  # fmt: skip
    assert _lint(tmp_path, capsys, doc, capped) == (0, [])
    code, diags = _lint(tmp_path, capsys, "# PR\n\nTotal throughput at 2 rps was 8.5 tok/s.\n" + BOUNDARY, capped)
    assert code == 1 and [x.split(";")[0] for x in diags] == ["3:31: CB201 states total throughput 8.5 tok/s for a"], diags


@pytest.fixture(scope="module")
def capped_facts(capped):
    d, _ = capped
    return load_evidence_facts(d)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(agg=st.sampled_from(["p50", "p95", "p99", "mean"]), metric=st.sampled_from(["ttft", "latency"]),
       form=st.sampled_from(["sent {m} {a} was {v}.", "{a} sent {m} of {v}.", "sent_{m} {a} = {v}."]),
       decimals=st.integers(0, 3), which=st.sampled_from(["sent", "plain"]))  # fmt: skip
def test_a_figure_from_the_send_holds_iff_it_is_the_sent_figure(capped_facts, agg, metric, form, decimals, which):
    """Property: however "sent" is written beside the metric, a figure rendered from the capped
    level's sent_ttft / sent_latency holds and one rendered from its ttft / latency (200 ms more:
    the wait for a slot) is CB201."""
    (lv,) = capped_facts[0].levels
    (x,) = lv.figures[f"{'sent_' if which == 'sent' else ''}{metric}.{agg}"]
    doc = "# PR\n\n" + form.format(m="TTFT" if metric == "ttft" else "latency", a=agg, v=f"{x * 1000:.{decimals}f} ms") + BOUNDARY
    diags = [d for d in lint(doc, "PR.md", ClaimBoundary(), Coverage(), capped_facts) if d.code == "CB201"]
    assert bool(diags) == (which == "plain"), (doc, diags)


def test_a_results_json_from_before_p90_is_not_called_edited(tmp_path, capsys, capped):
    """results.json's distributions gained p90 later than p50/p95/p99: one without a p90 key was
    written before, not edited (it gave CB402 "records ttft.p90 nothing" four times a level).
    One whose p90 is present and differs was edited: CB402."""
    import shutil

    d, spec_file = capped
    for edit, expect in (("older", []), ("edited", ["CB402"])):
        old = shutil.copytree(d, tmp_path / edit)
        res = json.loads((old / "results.json").read_text())
        (be,) = res["backends"]
        dists = [x for part in ("levels", "buckets") for lv in be.get(part) or () for x in lv.values()
                 if isinstance(x, dict) and "p90" in x] + [x for x in be.values() if isinstance(x, dict) and "p90" in x]
        assert dists, be.keys()
        for x in dists:
            if edit == "older":
                del x["p90"]
        if edit == "edited":
            be["levels"][0]["ttft"]["p90"] = 9.0
        (old / "results.json").write_text(json.dumps(res))
        code, diags = _lint(tmp_path, capsys, "# PR\n\nsent TTFT p50 was 100 ms.\n" + BOUNDARY, (old, spec_file))
        assert [x.split(" ", 2)[1] for x in diags] == expect, diags
        if edit == "edited":
            assert "results.json records ttft.p90 9 s for a · " in diags[0], diags


def test_one_p90_deleted_from_a_results_json_that_has_others_is_an_edit(tmp_path, capsys, capped):
    """A missing p90 is an older results.json only where none of its distributions has one: a
    single p90 deleted from a file that stores the others was taken for an older file and
    passed; it is an edit (CB402)."""
    import shutil

    d, spec_file = capped
    old = shutil.copytree(d, tmp_path / "one-gone")
    res = json.loads((old / "results.json").read_text())
    (be,) = res["backends"]
    assert "p90" in be["levels"][0]["latency"]
    del be["levels"][0]["ttft"]["p90"]
    (old / "results.json").write_text(json.dumps(res))
    code, diags = _lint(tmp_path, capsys, "# PR\n\nsent TTFT p50 was 100 ms.\n" + BOUNDARY, (old, spec_file))
    assert [x.split(" ", 2)[1] for x in diags] == ["CB402"], diags
    assert "results.json records ttft.p90 nothing for a · " in diags[0], diags
