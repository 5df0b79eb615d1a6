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


def _lint_cli(tmp_path: Path, capsys, c, body: str) -> tuple[Path, int, str]:
    """`soakspec lint-claims PR.md --spec s.soak --compare compare.json` as a user runs it, on
    compare's own JSON of `c` and a review whose body (after "# Perf") is `body`: the review's
    path, the exit code and what it printed."""
    out = tmp_path / "compare.json"
    out.write_text(json.dumps(c.to_json()))
    pr = tmp_path / "PR.md"
    pr.write_text(f"# Perf\n\n{body}\n\n## Claim boundary\n\nSynthetic.\n")
    spec = tmp_path / "s.soak"
    spec.write_text(SWEEP)
    code = cli.main(["lint-claims", str(pr), "--spec", str(spec), "--compare", str(out)])
    return pr, code, capsys.readouterr().out


def test_the_cli_checks_a_capacity_claim_against_two_sweep_runs(tmp_path: Path, capsys):
    """End to end: 24 rps before, 20 after (compare FAILs on the sweep row); the review says
    capacity rose from 20 to 24 rps -- backwards -- and lint-claims says so, with compare's figures."""
    c = _compare(sweep_run(24, 1), sweep_run(20, 2))
    pr, code, text = _lint_cli(tmp_path, capsys, c, "Capacity rose from 20 to 24 rps.\n\nThe sweep found 20 rps, down from 24.")
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


# ---------------------------------------------------------------- a stated size of the change

def _grid_doc(verdict: str, base: float, new: float, base_fails: float | None, new_fails: float | None) -> dict:
    """A Sweep row as compare writes it, with what each search knows (`base_sweep` /
    `new_sweep` `first_failing`: the level next above the figure that failed; None: none did)."""
    doc = _doc(verdict, base, new)
    doc["sweep"][0]["base_sweep"] = {"result": base, "first_failing": base_fails, "step": 4}
    doc["sweep"][0]["new_sweep"] = {"result": new, "first_failing": new_fails, "step": 4}
    return doc


def _findings(text: str, doc: dict) -> list[tuple[str, str]]:
    facts = adapters.change_facts(doc, "compare.json")
    return [(d.code, d.message) for d in lint(text, "PR.md", ClaimBoundary(), Coverage(), changes=facts) if d.code.startswith("CB5")]


# 20 rps (24 fails) -> 28 rps (32 fails): the true change lies in [28/24 - 1, 32/20 - 1] = [+16.7%, +60%],
# [28 - 24, 32 - 20] = [+4, +12] rps
@pytest.mark.parametrize("true, inflated, interval", [
    ("Capacity rose 40%.", "Capacity rose 70%.", "+16.7% .. +60.0%"),
    ("Capacity rose 20%.", "Capacity rose 10%.", "+16.7% .. +60.0%"),  # understated beyond the grid, too
    ("The max sustainable rate rose by 8 rps.", "The max sustainable rate rose by 20 rps.", "+4 rps .. +12 rps"),
    ("Capacity is up 4 rps.", "Capacity is up 16 rps.", "+4 rps .. +12 rps"),
    ("The new build has a 40% higher capacity.", "The new build has a 90% higher capacity.", "+16.7% .. +60.0%"),
    ("The max sustainable rate rose 1.4x.", "The max sustainable rate rose 3x.", "+16.7% .. +60.0%"),
    ("Capacity rose from 20 to 28 rps (+40%).", "Capacity rose from 20 to 28 rps (+90%).", "+16.7% .. +60.0%"),
])
def test_a_stated_size_is_held_against_the_changes_both_searches_allow(true, inflated, interval):
    """Each figure of a bisection is known only to within its grid's step: the base's true limit
    lies in [20, 24] rps, the new's in [28, 32]. A size in the changes those allow passes; one
    outside is CB502, naming the interval (before, no size was read: "capacity rose 70%" over a
    two-step move linted clean)."""
    doc = _grid_doc("improvement", 20, 28, 24, 32)
    assert _findings(true, doc) == []
    ((code, message),) = _findings(inflated, doc)
    assert code == "CB502" and f"outside the change the two searches allow ({interval}" in message, message


def test_a_regressions_stated_size_and_a_hedged_one():
    """A fall is sized the same way (28 [32] -> 20 [24]: -37.5% .. -14.3%); a hedge widens a round
    number as for any row ("~40%" holds 35..45%) and "at least" bounds it below only."""
    fall = _grid_doc("regression", 28, 20, 32, 24)
    assert _findings("Capacity fell 20%.", fall) == [] and _findings("Capacity regressed by 8 rps.", fall) == []
    ((code, message),) = _findings("Capacity fell 50%.", fall)
    assert code == "CB502" and "-37.5% .. -14.3%" in message, message
    rise = _grid_doc("improvement", 20, 28, 24, 32)
    assert _findings("Capacity rose ~65%.", rise) != []  # "65" is precise to its last digit: 64.5..65.5%
    assert _findings("Capacity rose ~60%.", rise) == []  # a round 60: 55..65%, meets +60%
    assert _findings("Capacity rose at least 50%.", rise) == []
    for hedged in ("Capacity rose about 70%.", "Capacity rose at least 70%."):  # 65..75%; 69.5% and up
        ((code, message),) = _findings(hedged, rise)
        assert code == "CB502" and "+16.7% .. +60.0%" in message, message


def test_a_search_that_found_nothing_failing_above_its_figure_is_open_above():
    """The new run held the grid's top (28 rps, "at least"): nothing above it failed, so any rise
    of at least +16.7% is allowed -- "rose 500%" is not flagged, a rise smaller than the grid
    allows is, and the message says the interval has no upper bound. A compare JSON that
    records neither search's failing level (before it was written) bounds nothing: no size is
    flagged."""
    top = _grid_doc("improvement", 20, 28, 24, None)
    assert _findings("Capacity rose 500%.", top) == []
    ((code, message),) = _findings("Capacity rose 10%.", top)
    assert code == "CB502" and "+16.7% .. no upper bound" in message, message
    assert _findings("Capacity rose 10%.", _doc("improvement", 20, 28)) == []


def test_a_size_of_a_row_with_no_level_held_or_of_a_listed_figure_is_not_read():
    """Precision over recall: a run that held no level has no figure to size a change by, and
    a size after a list of metrics ("the max sustainable rate and p50 TTFT rose 90%") is not
    said to be the figure's. The size beside another thing's number is not read either."""
    none_held = _grid_doc("improvement", None, 28, 4, 32)
    assert _findings("Capacity rose 900%.", none_held) == []
    rise = _grid_doc("improvement", 20, 28, 24, 32)
    assert [c for c, _ in _findings("The max sustainable rate and p50 TTFT rose 90%.", rise) if c == "CB502"] == []
    assert _findings("Capacity rose with p99 TTFT under 5%.", rise) == []
    assert [c for c, _ in _findings("Capacity rose 90%.", rise)] == ["CB502"]  # the same row, sized: read


def test_the_cli_holds_a_capacity_rise_against_the_grid_of_two_sweep_runs(tmp_path: Path, capsys):
    """End to end, as a user runs it: 20 rps (21 fails) before, 24 rps (25 fails) after, step 1 --
    the true rise lies in [24/21 - 1, 25/20 - 1] = [+14.3%, +25%]. "rose 20%" is clean; "rose
    50%" is CB502 naming that interval, through compare's own JSON."""
    c = _compare(sweep_run(20, 1), sweep_run(24, 2))
    assert c.sweeps[0].verdict == "improvement"
    pr, code, text = _lint_cli(tmp_path, capsys, c, "Capacity rose 20%.\n\nThe max sustainable rate rose 50%.")
    assert code == 1, text
    assert f"{pr}:5:5: CB502 states max_sustainable_rate rose 50%; 50% is outside" in text and "+14.3% .. +25.0%" in text, text
    assert "^" + "~" * 28 + "\n" in text, text  # the caret covers "max sustainable rate rose 50%", its size too
    assert f"{pr}:3:" not in text, text


@settings(max_examples=60, deadline=None)
@given(base=st.integers(1, 200), step=st.integers(1, 8), k=st.integers(2, 12), top=st.booleans(),
       fall=st.booleans(), name=st.sampled_from(["Capacity", "The max sustainable rate", "The saturation point"]))
def test_the_rows_own_change_is_never_flagged_and_one_beyond_the_grid_is(base, step, k, top, fall, name):
    """Property: a review that states the Sweep row's own change -- its percentage to a tenth, or
    its difference in rps -- lints clean whatever the grid (the figures' own change always lies
    between the level each run held and the next that failed), and a percentage 10 points past
    the widest change the grid allows is CB502 (unless the search that bounds it is open above:
    a fall of up to 100% is then allowed)."""
    lo, hi = base, base + k * step  # a change of k steps, k >= 2: beyond one step, so decided
    b, n = (hi, lo) if fall else (lo, hi)
    # `top`: the run that bounds the widest change found nothing failing above its figure (a rise:
    # the new run held the grid's top; a fall: the base run did) -- that end is open
    doc = _grid_doc("regression" if fall else "improvement", b, n, None if top and fall else b + step,
                    None if top and not fall else n + step)
    word = "fell" if fall else "rose"
    assert _findings(f"{name} {word} {abs(n / b - 1) * 100:.1f}%.", doc) == []
    assert _findings(f"{name} {word} by {abs(n - b)} rps.", doc) == []
    widest = (1 - n / (b + step)) * 100 if fall else ((n + step) / b - 1) * 100
    flagged = [c for c, _ in _findings(f"{name} {word} {min(widest + 10, 99.9) if fall else widest + 10:.1f}%.", doc)]
    assert flagged == ([] if top else ["CB502"])


def test_a_size_in_rps_against_a_row_with_neither_failing_level_is_not_checked():
    """A compare JSON whose sweep row records no first failing level on either side (written
    before compare recorded it, or by hand) leaves every size possible: "by 8 rps" is not held
    against it -- and is no internal error."""
    assert _findings("Capacity rose by 8 rps.", _doc("improvement", 20, 28)) == []


@pytest.mark.parametrize("text", ["Capacity rose 2 rps per GPU.", "Capacity rose 0.5 rps a user.",
                                  "The max sustainable rate rose 10% per step."])
def test_a_size_per_unit_is_not_the_figures_change(text):
    """"2 rps per GPU" sizes something per unit, not the figure's whole change (20 -> 28 rps
    allows +4 .. +12 rps): not read, so no CB502 -- while the same size of the whole change is."""
    doc = _grid_doc("improvement", 20, 28, 24, 32)
    assert _findings(text, doc) == []
    assert _findings(text.replace(" per GPU", "").replace(" a user", "").replace(" per step", ""), doc)
