"""`soakspec lint-claims DOC --compare BASE NEW` (or `--compare compare.json`): a before/after
review's claims of change ("p99 TTFT fell 12% at 8 rps", "throughput improved 1.3x", "ITL is
unchanged") checked against what `soakspec compare` measured between the two runs
(`soakspec.claims.changes`, CB501-CB505).

The two runs are written by the test (`EvidenceBuilder`): the new run's TTFT is 0.8x the base's
and it completed 130 requests a bucket where the base completed 100, so compare finds p50/p95
TTFT and throughput/QPS improved, ITL and TPOT unchanged, p99 TTFT not significantly changed
(its interval is wide), and no errors on either side. Its rows, at rate 4 rps:
p50(ttft) -24.4% (-30.9% .. -17.5%), p95(ttft) -20.0%, p99(ttft) -20.4% (-55.5% .. +0.6%),
mean(throughput) +30.2% (+25.6% .. +34.9%); at rate 8 rps p50(ttft) -17.0% (-25.5% .. -8.6%)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from soakspec import cli
from soakspec.claims import ClaimBoundary, Coverage, adapters, lint
from soakspec.judge.testing import EvidenceBuilder, small_spec

SPEC = small_spec(duration="4m", bucket="1m", mode="open", levels="[4rps, 8rps]", backends=("sim",))


def _run(seed: int, ttft_factor: float, per_bucket: int) -> EvidenceBuilder:
    b = EvidenceBuilder(SPEC, per_bucket=per_bucket, run_id=f"run{seed}", scheduled=False)
    rng = random.Random(seed)
    for level in (0, 1):
        for r in b.measured("sim", level=level):
            ttft = rng.lognormvariate(-2.3, 0.35) * ttft_factor
            gaps = [rng.lognormvariate(-4.0, 0.25) for _ in range(63)]
            r.update(ttft=ttft, first_token=r["start"] + ttft, itl=gaps, tpot=sum(gaps) / 63,
                     latency=ttft + sum(gaps), end=r["start"] + ttft + sum(gaps))
    return b


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("changes")
    out = {"base": _run(1, 1.0, 100).write(tmp / "base"), "new": _run(2, 0.8, 130).write(tmp / "new")}
    out["spec"] = tmp / "spec.soak"
    out["spec"].write_text(SPEC.canonical_text)
    out["json"] = tmp / "compare.json"
    assert cli.main(["compare", str(out["base"]), str(out["new"]), "--format", "json", "--out", str(out["json"])]) == 0
    return out


def _lint(tmp_path: Path, capsys, doc: str, runs: dict[str, Path], *compare: str) -> tuple[int, list[tuple[int, str]], str]:
    """(exit code, [(line, code)] of the CB5xx findings, the whole output: stdout, then stderr)."""
    p = tmp_path / "PR.md"
    p.write_text(doc + "\n## Claim boundary\n\nSynthetic runs.\n")
    code = cli.main(["lint-claims", str(p), "--spec", str(runs["spec"]), "--compare", *compare])
    cap = capsys.readouterr()
    out = cap.out + cap.err
    found = [(int(m.group(1)), m.group(2)) for m in re.finditer(rf"^{re.escape(str(p))}:(\d+):\d+: (CB5\d\d) ", out, re.M)]
    return code, found, out


def _both(runs: dict[str, Path]) -> list[tuple[str, ...]]:
    """The two forms of --compare: the directories (compared here) and compare's JSON."""
    return [(str(runs["base"]), str(runs["new"])), (str(runs["json"]),)]


CORRECT = """# PR: faster prefill

At 4 rps, p50 TTFT fell 24%.
p50 TTFT improved from 101 ms to 77 ms at 4 rps.
The p50 TTFT at rate 8 rps dropped by about 17%.
Throughput improved 1.3x.
Output throughput rose 30% at 8 rps, and QPS increased 30% too.
ITL is unchanged.
There is no regression in p95 latency.
We saw no TTFT regression.
p50 TTFT fell 20%.
The new scheduler makes p50 TTFT 1.3x faster at 4 rps.
"""


def test_claims_that_compare_bears_out_are_clean(tmp_path, capsys, runs):
    for form in _both(runs):
        code, found, out = _lint(tmp_path, capsys, CORRECT, runs, *form)
        assert (code, found) == (0, []), out


WRONG = """# PR: faster prefill

p50 TTFT rose 10% at 4 rps.
At 8 rps, p50 TTFT fell 40%.
p50 ITL improved 5%.
p99 TTFT fell 20% at 8 rps.
Mean TTFT fell 10%.
At 16 rps, p50 TTFT fell 24%.
Goodput rose 20%.
Throughput fell 30% at 4 rps.
p50 TTFT regressed at 4 rps.
p50 TTFT is 2x faster at 4 rps.
p95 and p99 TTFT fell 10% at 4 rps.
"""


def test_each_claim_compare_does_not_bear_out_is_flagged_on_its_line(tmp_path, capsys, runs):
    expected = [
        (3, "CB501"),  # rose: compare measured -24.4%
        (4, "CB502"),  # -40% is outside -25.5% .. -8.6%
        (5, "CB503"),  # ITL: the interval holds 0
        (6, "CB503"),  # p99 TTFT: -55.5% .. +0.6%, not significant
        (7, "CB505"),  # compare has no mean(ttft) row
        (8, "CB505"),  # nor a 16 rps level
        (9, "CB505"),  # nor goodput
        (10, "CB501"),  # throughput rose 30%
        (11, "CB501"),  # TTFT improved: lower is better
        (12, "CB502"),  # 2x faster is -50%
        (13, "CB503"),  # p95 fell (fine), p99 did not significantly
    ]
    for form in _both(runs):
        code, found, out = _lint(tmp_path, capsys, WRONG, runs, *form)
        assert code == 1 and found == expected, out


def test_a_message_states_the_interval_and_points_at_the_claim(tmp_path, capsys, runs):
    code, found, out = _lint(tmp_path, capsys, "# PR\n\nAt 8 rps, p50 TTFT fell 40%.\n", runs, *_both(runs)[0])
    p = tmp_path / "PR.md"
    assert f"{p}:3:11: CB502 states p50 TTFT fell 40% at rate 8 rps; 40% is outside compare's interval: " \
           "sim · rate 8 rps: p50(ttft) 97.7 ms → 81.0 ms, -17.0% (-25.5% .. -8.6%, improvement)" in out
    assert "  At 8 rps, p50 TTFT fell 40%.\n            ^~~~~~~~~~~~~~~~~\n  hint: " in out
    # a claim compare has no row for is a warning: it alone does not fail the document
    code, found, out = _lint(tmp_path, capsys, "# PR\n\nGoodput rose 20%.\n", runs, *_both(runs)[1])
    assert code == 0 and found == [(3, "CB505")] and "[warning]" in out


def test_unchanged_or_no_regression_where_compare_measured_a_regression_is_CB504(tmp_path, capsys, runs):
    """The same runs the other way round (new as base): TTFT regressed, ITL did not change."""
    doc = ("# PR\n\nThere is no regression in p50 TTFT.\nTTFT is unchanged at 4 rps.\nITL is unchanged.\n"
           "p50 TTFT did not regress at rate 8 rps.\nThroughput is the same.\nWe did not see any regression in ITL or TPOT.\n"
           "No regressions in ITL, TPOT or TTFT.\n")
    code, found, out = _lint(tmp_path, capsys, doc, runs, str(runs["new"]), str(runs["base"]))
    assert code == 1 and found == [(3, "CB504"), (4, "CB504"), (6, "CB504"), (7, "CB504"), (9, "CB504")], out
    assert "of TTFT" in next(line for line in out.splitlines() if ":9:" in line)
    assert "compare measured a significant regression: sim · rate 4 rps: p50(ttft) 76.6 ms → 101.3 ms" in out


NOT_CLAIMS = """# PR

The gate requires p99(ttft) regression <= 5%.
`p50 TTFT fell 40%` is what the old dashboard said.
TTFT may improve further with continuous batching.
p50 TTFT did not improve at 4 rps.
We do not claim that throughput doubled.
p99 TTFT fell 20% (not significant).
Does p50 ITL improve 5% at 8 rps?
Lower is better for TTFT.
p99 ITL rose 3%, within noise.
p50 ITL regressed slightly at 8 rps, within run-to-run variation.
Latency increases with concurrency, as expected.
TTFT goes up as the prompt grows.

> p50 TTFT rose 10% at 4 rps.

| Metric | Change |
|---|---|
| p50 TTFT rose 10% | +10% |

## p50 TTFT rose 10% at 4 rps

## Non-goals

- p50 ITL improved 5%.
"""


def test_what_is_not_a_claim_of_change_is_not_flagged(tmp_path, capsys, runs):
    code, found, out = _lint(tmp_path, capsys, NOT_CLAIMS, runs, *_both(runs)[1])
    assert found == [], out


def test_compare_markdown_pasted_into_the_review_is_clean(tmp_path, capsys, runs):
    assert cli.main(["compare", str(runs["base"]), str(runs["new"]), "--format", "md"]) == 0
    table = capsys.readouterr().out
    code, found, out = _lint(tmp_path, capsys, "# PR\n\n" + table, runs, *_both(runs)[1])
    assert found == [], out


def test_without_compare_claims_of_change_are_not_checked(tmp_path, capsys, runs):
    p = tmp_path / "PR.md"
    p.write_text(WRONG + "\n## Claim boundary\n\nSynthetic runs.\n")
    cli.main(["lint-claims", str(p), "--spec", str(runs["spec"])])
    assert "CB5" not in capsys.readouterr().out


@pytest.mark.parametrize("payload, says", [
    ({"kind": "report", "schema_version": 1, "rows": []}, "not a comparison"),
    ({"kind": "comparison", "schema_version": 99, "rows": []}, "schema_version 99"),
    ({"kind": "comparison", "schema_version": 1}, "no `rows` list"),
    ({"kind": "comparison", "schema_version": 1, "rows": [{"backend": "sim", "metric": "ttft"}]}, "rows[0]: no `label`"),
    ("not json", "not JSON"),
])
def test_a_comparison_file_of_another_kind_or_version_is_a_usage_error(tmp_path, capsys, runs, payload, says):
    f = tmp_path / "c.json"
    f.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    code, found, out = _lint(tmp_path, capsys, "# PR\n\nTTFT fell 10%.\n", runs, str(f))
    assert code == 2 and says in out, out


def test_compare_takes_two_directories_or_one_file(tmp_path, capsys, runs):
    code, _, out = _lint(tmp_path, capsys, "# PR\n", runs, str(runs["base"]))
    assert code == 2 and "two evidence directories" in out, out


def test_the_document_may_follow_the_directories_or_the_file(tmp_path, capsys, runs):
    p = tmp_path / "PR.md"
    p.write_text("# PR\n\np50 TTFT rose 10% at 4 rps.\n\n## Claim boundary\n\nSynthetic runs.\n")
    for compare in _both(runs):
        code = cli.main(["lint-claims", "--spec", str(runs["spec"]), "--compare", *compare, str(p)])
        assert code == 1 and f"{p}:3:1: CB501" in capsys.readouterr().out


# ---------------------------------------------------------------- property

NAMES = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "latency": "e2e latency", "qps": "QPS", "throughput": "throughput",
         "errors": "error rate"}


def _shown(v: float, unit: str) -> str:
    if unit == "s":
        return f"{v * 1000:.1f} ms"
    if unit == "ratio":
        return f"{v * 100:.1f}%"
    return f"{v:.2f} {'req/s' if unit == '/s' else unit}"


@pytest.fixture(scope="module")
def rows(runs):
    return adapters.read_change_facts(runs["json"], runs["json"].read_text())


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_claim_rendered_from_compares_own_row_never_flags(rows, data):
    """Property: a sentence that states a row's own change -- its direction in any of the words
    read (the figure's fell/rose, or improved/regressed by the metric's better side), its size as
    a percentage, as from base to new, or not at all, and "unchanged" / "no regression" where the
    row is no significant change -- at the row's level, is never a CB5xx finding (for a row
    whose point change lies in its interval, as compare's do here)."""
    r = data.draw(st.sampled_from([r for r in rows.rows if r.low is not None and r.low <= r.change <= r.high]))
    what = f"{r.stat} {NAMES[r.metric]}" if r.stat.startswith("p") else NAMES[r.metric]
    where = data.draw(st.sampled_from([f"At {r.label}, {what}", f"{what} at {r.label}"]))
    if r.verdict == "no significant change" or (r.verdict == "improvement" and data.draw(st.booleans())):
        text = data.draw(st.sampled_from([f"{where} is unchanged.", f"There is no regression in {what} at {r.label}.",
                                          f"{where} did not regress."]))
    else:
        down = r.change < 0
        good = down == r.higher_is_worse
        word = data.draw(st.sampled_from((["fell", "dropped", "decreased"] if down else ["rose", "increased", "grew"])
                                         + (["improved"] if good else ["regressed"])))
        size = data.draw(st.sampled_from(["", f" {abs(r.change) * 100:.1f}%" if not r.absolute else f" {abs(r.change) * 100:.1f} pp",
                                          f" from {_shown(r.base, r.unit)} to {_shown(r.new, r.unit)}"]))
        text = f"{where} {word}{size}."
    diags = lint(f"# PR\n\n{text}\n", "PR.md", ClaimBoundary(), Coverage(), changes=rows)
    assert [d for d in diags if d.code.startswith("CB5")] == [], (text, r)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_claim_against_a_significant_rows_direction_is_CB501(rows, data):
    """Property: stating the opposite of a row compare found significant -- "fell" for a rise,
    "improved" for a regression, at the row's level -- is CB501, whatever the words and size."""
    r = data.draw(st.sampled_from([r for r in rows.rows if r.verdict in ("regression", "improvement")]))
    what = f"{r.stat} {NAMES[r.metric]}" if r.stat.startswith("p") else NAMES[r.metric]
    down = r.change > 0  # the opposite of what was measured
    good = down == r.higher_is_worse
    word = data.draw(st.sampled_from((["fell", "dropped"] if down else ["rose", "increased"]) + (["improved"] if good else ["regressed"])))
    size = data.draw(st.sampled_from(["", " 5%", " 1.2x"]))
    text = f"At {r.label}, {what} {word}{size}."
    diags = lint(f"# PR\n\n{text}\n", "PR.md", ClaimBoundary(), Coverage(), changes=rows)
    assert [d.code for d in diags if d.code.startswith("CB5")] == ["CB501"], (text, r)


def test_the_clause_reader_splits_two_claims_and_keeps_a_list_together():
    from soakspec.claims.changes import claims_in

    got = [(c.metric, c.stats, c.direction, [m.text for m in c.magnitudes])
           for c in claims_in("p95 and p99 TTFT fell 10% at 8 rps, and throughput rose 1.3x.")]
    assert got == [("ttft", ("p95",), "down", ["10%"]), ("ttft", ("p99",), "down", ["10%"]),
                   ("throughput", (), "up", ["1.3x"])]
    # a list of metrics is each claimed; a direction speaks of the metrics next to it
    assert [(c.metric, c.direction) for c in claims_in("No regressions in TTFT, ITL or latency.")] == \
        [("ttft", "same"), ("itl", "same"), ("latency", "same")]
    # the list forms `sweep_changes` reads (change_common.LIST_JOIN): a serial ", or", an article
    for text in ("No regressions in TTFT, ITL, or latency.", "No regressions in TTFT, ITL and the latency."):
        assert [(c.metric, c.direction) for c in claims_in(text)] == [("ttft", "same"), ("itl", "same"), ("latency", "same")], text
    assert [(c.metric, [m.text for m in c.magnitudes]) for c in claims_in("TTFT fell 12%, from 410 ms to 360 ms, ITL too.")] == \
        [("ttft", ["from 410 ms to 360 ms", "12%"])]
    assert claims_in("TTFT goes as the prompt grows.") == claims_in("Latency increases with concurrency.") == []


# ---------------------------------------------------------------- rows made by hand

def _row(metric: str, stat: str, label: str, change: float | None, low: float | None, high: float | None, verdict: str,
         backend: str = "vllm", base: float | None = 0.1):
    from soakspec.claims import ChangeRow

    absolute = metric == "errors"
    new = None if change is None or base is None else base + change if absolute else base * (1 + change)
    rate = re.search(r"rate (\d+) rps", label)
    return ChangeRow(backend, label, metric, stat, "ratio" if absolute else "s", base, new, change, low, high, verdict,
                     metric not in ("qps", "throughput"), absolute, 0.9967, backend, rate=float(rate.group(1)) if rate else None)


def _codes(text: str, *rows) -> list[str]:
    from soakspec.claims import ChangeFacts

    diags = lint(f"# PR\n\n{text}\n", "PR.md", ClaimBoundary(), Coverage(), changes=ChangeFacts("c.json", tuple(rows)))
    return [d.code for d in diags if d.code.startswith("CB5")]


def test_unchanged_where_compare_could_not_tell_is_a_warning_and_a_change_is_CB503():
    """Missing data is never a pass: "no regression" of a row compare had too few samples for is
    not silently accepted (CB505), and a claimed change there outruns the evidence (CB503)."""
    thin = _row("ttft", "p99", "rate 8 rps", -0.2, None, None, "insufficient samples")
    fine = _row("ttft", "p99", "rate 4 rps", 0.01, -0.05, 0.07, "no significant change")
    assert _codes("There is no regression in p99 TTFT.", thin, fine) == ["CB505"]
    assert _codes("There is no regression in p99 TTFT at 4 rps.", thin, fine) == []
    assert _codes("p99 TTFT fell 20% at 8 rps.", thin, fine) == ["CB503"]


def test_errors_change_in_points_and_from_a_share_to_another():
    rose = _row("errors", "ratio", "rate 4 rps", 0.03, 0.01, 0.05, "regression", base=0.005)
    assert _codes("The error rate rose 3 pp at 4 rps.", rose) == []
    assert _codes("The error rate rose 8 pp at 4 rps.", rose) == ["CB502"]
    assert _codes("Errors rose from 0.5% to 3.5% at 4 rps.", rose) == []
    assert _codes("The error rate fell at 4 rps.", rose) == ["CB501"]
    assert _codes("Failures rose 600% at 4 rps.", rose) == []  # relative or points? only the direction is checked
    assert _codes("There is no regression in the error rate.", rose) == ["CB504"]


def test_a_named_backend_takes_its_own_rows():
    a = _row("ttft", "p50", "rate 4 rps", -0.2, -0.3, -0.1, "improvement", backend="vllm")
    b = _row("ttft", "p50", "rate 4 rps", 0.2, 0.1, 0.3, "regression", backend="sglang")
    assert _codes("On vllm, p50 TTFT fell 20%.", a, b) == []
    assert _codes("On sglang, p50 TTFT fell 20%.", a, b) == ["CB501"]
    assert _codes("p50 TTFT fell 20%.", a, b) == []  # no backend named: one of them shows it
    assert _codes("There is no regression in p50 TTFT.", a, b) == ["CB504"]  # "no regression" is of every row


def test_every_claims_code_is_registered_and_in_the_readme_table():
    """One registry: every CB code the claims package reports is declared in
    `soakspec.claims.CODES`, and each declared code has a row in README's "Linting claims" table."""
    import pathlib

    import soakspec
    from soakspec.claims import CODES

    root = pathlib.Path(soakspec.__file__).resolve().parent
    used = {c for p in (root / "claims").glob("*.py") if p.name != "__init__.py" for c in re.findall(r"\"(CB\d{3})\"", p.read_text())}
    assert used and used <= set(CODES), used - set(CODES)
    readme = (root.parent / "README.md").read_text()
    table = set(re.findall(r"^\| (CB\d{3})(?: / (CB\d{3}))? \|", readme, re.M))
    listed = {c for pair in table for c in pair if c}
    assert set(CODES) <= listed, set(CODES) - listed


def test_a_comparison_that_did_not_pass_is_said_on_stderr(tmp_path, capsys, runs):
    """The rows are still what compare measured; the reader is told why compare itself did not pass."""
    doc = json.loads(runs["json"].read_text())
    doc |= {"verdict": "FAIL", "reasons": ["unsuccessful requests rose significantly: sim rate 4 rps 0.0% → 3.0%"]}
    f = tmp_path / "failed.json"
    f.write_text(json.dumps(doc))
    code, found, out = _lint(tmp_path, capsys, "# PR\n\nAt 4 rps, p50 TTFT fell 24%.\n", runs, str(f))
    assert code == 0 and found == []
    assert f"soakspec lint-claims: note: the comparison ({f}) is FAIL: unsuccessful requests rose significantly" in out
