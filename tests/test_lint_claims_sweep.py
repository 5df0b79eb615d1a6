"""`lint-claims --compare` of two sweeps checks what a review says of the sweep's own figure
("max sustainable rate is unchanged", "capacity rose from 20 to 24 rps", "the sweep found 24
rps, up from 20") against compare's sweep row (its JSON `sweep`: base, new, verdict), with the
codes of every other claim of change (CB501-CB505; `soakspec.claims.sweep_changes`).

Before, such sentences were not read at all: a review claiming a capacity rise over a
comparison that FAILed on a capacity drop linted clean."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from soakspec import cli
from soakspec.claims import ClaimBoundary, Coverage, adapters, lint
from soakspec.compare import SCHEMA_VERSION
from tests.test_compare_sweep import SWEEP, _compare, sweep_run


def _doc(verdict: str, base: float | None = 20, new: float | None = 24, *, backend: str = "b0", sweep: bool = True) -> dict:
    rows = [{"backend": backend, "new_backend": backend, "workload": "w0", "metric": "max_sustainable_rate", "unit": "rps",
             "base": base, "new": new, "change": None if base is None or new is None else new - base, "relative_change": None,
             "verdict": verdict, "message": "base holds 20 rps, 21 rps fails; new holds 24 rps, 25 rps fails"}]
    return {"kind": "comparison", "schema_version": SCHEMA_VERSION, "rows": [], "sweep": rows if sweep else []}


def _codes(text: str, doc: dict) -> list[str]:
    facts = adapters.change_facts(doc, "compare.json")
    return [d.code for d in lint(text, "PR.md", ClaimBoundary(), Coverage(), changes=facts) if d.code.startswith("CB5")]


@pytest.mark.parametrize("text, verdict, expect", [
    # a claimed rise where compare measured a fall, and the mirror
    ("Capacity rose from 24 to 20 rps.", "regression", ["CB501"]),
    ("The max sustainable rate improved.", "regression", ["CB501"]),
    ("The sweep found 20 rps, down from 24.", "improvement", ["CB501"]),
    # a claimed change within one step of the grid, or of an inconclusive row: unsupported (CB503)
    ("Capacity rose from 20 to 24 rps.", "no significant change", ["CB503"]),
    ("The maximum sustainable rate increased.", "inconclusive", ["CB503"]),
    # "unchanged" of a regression; of a row compare could not decide (a warning)
    ("The max sustainable rate is unchanged.", "regression", ["CB504"]),
    ("There is no regression in max sustainable rate.", "regression", ["CB504"]),
    ("The max sustainable rate is unchanged.", "inconclusive", ["CB505"]),
    # stated figures that are not compare's
    ("Capacity rose from 20 to 26 rps.", "improvement", ["CB502"]),
    ("The sweep found 28 rps, up from 20.", "improvement", ["CB502"]),
    ("The saturation point rose from 18 → 24 rps.", "improvement", ["CB502"]),
    # borne out: clean
    ("Capacity rose from 20 to 24 rps.", "improvement", []),
    ("The sweep found 24 rps, up from 20.", "improvement", []),
    ("The max sustainable rate is unchanged.", "no significant change", []),
    ("The max sustainable rate is unchanged.", "improvement", []),  # understates: not flagged
    ("The saturation point moved up: max sustainable rate rose.", "improvement", []),
])
def test_claims_about_the_sweep_figure_are_checked_against_its_row(text, verdict, expect):
    assert _codes(text, _doc(verdict)) == expect


@pytest.mark.parametrize("text", [
    "KV cache capacity rose from 20 to 24 GB.",  # another resource's capacity
    "TTFT rose in capacity tests.",  # another metric's claim (no such row: CB505 of TTFT, not of the sweep)
    "The server ran at capacity and nothing rose.",
    "Capacity may rise with the new scheduler.",  # hedged
    "Capacity did not rise.",  # negated: not a claim of a rise
    "The gate requires max sustainable rate >= 20 rps.",  # a rule
    "Capacity rose past the threshold we warn on.",  # a rule's words, as every claim of change reads them
    "The max sustainable rate rose, within run-to-run variation.",  # noise
    "We warn when capacity falls below 20 rps.",  # a rule's condition
    "Capacity fell short of the 24 rps target.",  # the rule's number
    "Capacity rose above the SLO.",  # the direction is the rule's
    "We increased capacity planning effort.",  # another noun's direction
    "Capacity planning rose to the top of the list.",
])
def test_what_does_not_name_the_sweep_figure_or_does_not_claim_a_change_is_not_read(text):
    assert [c for c in _codes(text, _doc("regression")) if c != "CB505" or "TTFT" not in text] == []


@pytest.mark.parametrize("text", [
    "Capacity rose from 20 to 24 rps with every rule passing.",
    "Under the same rules, the max sustainable rate rose.",
    "Capacity rose from 20 to 24 rps and no threshold warned.",
])
def test_a_rules_word_that_does_not_govern_the_figure_does_not_hide_the_claim(text):
    """Capacity is defined by rules, so claims of it name them: a rule's word that governs no
    number and no direction leaves the claim read (it skipped every such clause: a rise claimed
    over a regression linted clean)."""
    assert _codes(text, _doc("regression")) == ["CB501"]


def test_a_named_figure_without_a_sweep_row_is_a_warning_and_capacity_says_nothing():
    """Missing data is never a pass: "max sustainable rate rose" over a comparison with no sweep
    row is CB505; "capacity rose" there may be a review's word for something else, and is not read."""
    assert _codes("The max sustainable rate rose.", _doc("improvement", sweep=False)) == ["CB505"]
    assert _codes("Capacity rose.", _doc("improvement", sweep=False)) == []


def test_max_sustainable_request_rate_is_the_sweep_figure_not_qps():
    """"request rate" alone is compare's QPS row; as the sweep's figure it is checked once, as the figure."""
    assert _codes("The max sustainable request rate fell.", _doc("improvement")) == ["CB501"]


def test_a_claim_naming_the_other_axis_has_no_row():
    """"max sustainable concurrency" of a rate sweep: compare has no such row (a warning naming
    the row it has), never the rate's row read for it."""
    facts = adapters.change_facts(_doc("improvement"), "compare.json")
    (d,) = [d for d in lint("The new build raised the max sustainable concurrency from 8 to 12.", "PR.md", ClaimBoundary(),
                            Coverage(), changes=facts) if d.code.startswith("CB5")]
    assert d.code == "CB505" and "its sweep rows: max_sustainable_rate" in d.message, d.message


def test_no_regression_in_capacity_of_a_regression_and_a_malformed_sweep_row():
    assert _codes("There is no regression in capacity.", _doc("regression")) == ["CB504"]
    doc = _doc("regression")
    doc["sweep"][0]["verdict"] = "fine"
    with pytest.raises(adapters.AdapterError, match=r"sweep\[0\]: unknown sweep verdict"):
        adapters.change_facts(doc, "compare.json")
    del doc["sweep"]  # a comparison of runs that did not sweep: no rows, no error
    assert adapters.change_facts(doc, "compare.json").sweeps == ()


def test_a_backend_named_selects_its_row():
    doc = _doc("regression")
    doc["sweep"].append({**doc["sweep"][0], "backend": "b1", "new_backend": "b1", "verdict": "improvement"})
    assert _codes("On b1, capacity rose.", doc) == []
    assert _codes("On b0, capacity rose.", doc) == ["CB501"]


def test_the_cli_checks_a_capacity_claim_against_two_sweep_runs(tmp_path: Path, capsys):
    """End to end: 24 rps before, 20 after (compare FAILs on the sweep row); the review says
    capacity rose from 20 to 24 rps -- backwards -- and lint-claims says so, with compare's figures."""
    c = _compare(sweep_run(24, 1), sweep_run(20, 2))
    out = tmp_path / "compare.json"
    out.write_text(json.dumps(c.to_json()))
    pr = tmp_path / "PR.md"
    pr.write_text("# Perf\n\nCapacity rose from 20 to 24 rps.\n\nThe sweep found 20 rps, down from 24.\n\n## Claim boundary\n\nSynthetic.\n")
    spec = tmp_path / "s.soak"
    spec.write_text(SWEEP)
    code = cli.main(["lint-claims", str(pr), "--spec", str(spec), "--compare", str(out)])
    text = capsys.readouterr().out
    assert code == 1, text
    assert f"{pr}:3:1: CB501" in text and "24 rps → 20 rps (regression" in text, text
    assert f"{pr}:5:" not in text, text  # borne out: 24 → 20, a regression


_WORDS = {"improvement": "rose", "regression": "fell", "no significant change": "is unchanged"}


@settings(max_examples=60, deadline=None)
@given(base=st.integers(1, 500), new=st.integers(1, 500), verdict=st.sampled_from(sorted(_WORDS)),
       name=st.sampled_from(["Capacity", "The max sustainable rate", "The saturation point", "Maximum sustainable load"]))
def test_a_claim_rendered_from_the_row_is_clean_and_its_opposite_is_not(base, new, verdict, name):
    """Property: a review that says what the Sweep row says -- its direction, and for a change its
    two figures -- lints clean, whatever the figures; the opposite direction is CB501 (a change
    claimed of no significant change: CB503; "unchanged" of a regression: CB504)."""
    figures = "" if verdict == "no significant change" else f" from {base} to {new} rps"
    row = _doc(verdict, base, new)
    assert _codes(f"{name} {_WORDS[verdict]}{figures}.", row) == []
    opposite = {"improvement": ("fell", "CB501"), "regression": ("rose", "CB501"), "no significant change": ("rose", "CB503")}
    word, code = opposite[verdict]
    assert _codes(f"{name} {word}.", row) == [code]
    if verdict == "regression":
        assert _codes(f"{name} is unchanged.", row) == ["CB504"]


def _compare_row(metric: str, stat: str, unit: str, base: float, new: float, verdict: str) -> dict:
    change = new / base - 1
    return {"backend": "b0", "new_backend": "b0", "label": "rate 8 rps", "metric": metric, "stat": stat, "unit": unit,
            "base": base, "new": new, "change": change, "change_kind": "ratio", "ci_low": change - 0.02, "ci_high": change + 0.02,
            "row_confidence": 0.99, "verdict": verdict, "turn": None}


@pytest.mark.parametrize("sentence", [
    "The max sustainable request rate and p50 TTFT fell.",
    "p50 TTFT and the max sustainable request rate fell.",
])
def test_the_sweep_figure_listed_with_a_metric_is_read_as_the_figure_and_never_as_qps(tmp_path: Path, capsys, sentence):
    """"request rate" inside the sweep figure's name is not compare's QPS row: listed with p50
    TTFT under one direction, the sentence claims the figure fell (CB501: compare measured it
    rise) and p50 TTFT fell (borne out), and nothing of QPS -- whose row, a rise, would otherwise
    make a second, false CB501. Through `lint-claims --compare compare.json`, as a user runs it."""
    doc = _doc("improvement")  # 20 → 24 rps
    doc["rows"] = [_compare_row("ttft", "p50", "s", 0.100, 0.080, "improvement"),
                   _compare_row("qps", "mean", "/s", 8.0, 8.8, "improvement")]
    out = tmp_path / "compare.json"
    out.write_text(json.dumps(doc))
    pr = tmp_path / "PR.md"
    pr.write_text(f"# Perf\n\n{sentence}\n\n## Claim boundary\n\nSynthetic.\n")
    spec = tmp_path / "s.soak"
    spec.write_text(SWEEP)
    code = cli.main(["lint-claims", str(pr), "--spec", str(spec), "--compare", str(out)])
    found = [line for line in capsys.readouterr().out.splitlines() if re.search(r": CB5\d\d ", line)]
    assert code == 1
    assert len(found) == 1 and f"{pr}:3:" in found[0] and " CB501 states max_sustainable_rate fell" in found[0], found


@pytest.mark.parametrize("text", [
    "The SLO on capacity was lowered to 18 rps.",
    "The budget for max sustainable rate dropped to 18 rps.",
    "The target capacity fell to 18 rps.",
])
def test_a_change_to_a_rule_on_capacity_is_not_a_claim_of_capacity(text):
    """A rule's word that governs the figure's name ("the SLO on capacity", "the target
    capacity") makes the sentence about the rule: its change is no claim that capacity changed
    (each was a false CB501 over an improvement)."""
    assert _codes(text, _doc("improvement")) == []
