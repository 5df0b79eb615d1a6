"""`soakspec lint-claims --evidence DIR` on evidence directories as `soakspec run` writes them
(`EvidenceBuilder(...).write(dir)`): per-level counts, and the stored results.json/verdict.json
that lint-claims does not take on trust (it re-judges the evidence, as `gate` and `report` do)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from soakspec import cli
from soakspec.judge.evidence import load_evidence
from soakspec.judge.testing import EvidenceBuilder, small_spec, spec_from_text
from soakspec.report import prepare

BOUNDARY = "\n\n## Claim boundary\n\nSynthetic evidence only.\n"


def _run(tmp_path: Path, spec, build=None) -> tuple[Path, Path]:
    """An evidence directory of `spec` (sim-fast's level 1 with one bucket's requests dropped:
    its count differs from level 0's and from the total) and the spec file."""
    b = EvidenceBuilder(spec)
    if build is not None:
        build(b)
    d = b.write(tmp_path / "run")
    spec_file = tmp_path / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    return d, spec_file


def _drop_one_bucket(b: EvidenceBuilder) -> None:
    b.drop_bucket_requests("sim-fast", 1, 0)


def _lint(tmp_path: Path, capsys, doc: str, d: Path, spec_file: Path) -> tuple[int, list[dict]]:
    p = tmp_path / "PR.md"
    p.write_text(doc)
    code = cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d), "--format", "json"])
    return code, json.loads(capsys.readouterr().out)["diagnostics"]


def _counts(d: Path) -> tuple[int, int, int]:
    """(level 0 completed, level 1 completed, total completed) of sim-fast, from the evidence."""
    be = prepare(spec_from_text(json.loads((d / "manifest.json").read_text())["spec"]["text"]), load_evidence(d)).results
    (b,) = be["backends"]
    return b["levels"][0]["requests"]["completed"], b["levels"][1]["requests"]["completed"], b["requests"]["completed"]


# ---------------------------------------------------------------- 1. a level's figure


def test_a_sentence_naming_a_level_is_compared_with_that_level(tmp_path, capsys):
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec, _drop_one_bucket)
    lv0, lv1, total = _counts(d)
    assert len({lv0, lv1, total}) == 3  # the test means something
    good = (f"# PR\n\nAt concurrency 4, sim-fast completed {lv1} requests.\n"
            f"At concurrency 2, sim-fast completed {lv0} requests.\n"
            f"sim-fast completed {total} requests.\n" + BOUNDARY)
    code, diags = _lint(tmp_path, capsys, good, d, spec_file)
    assert (code, diags) == (0, [])


def test_a_count_right_after_the_level_is_not_taken_for_another_level(tmp_path, capsys):
    """"At concurrency 4, 16 requests completed": 16 is the count, not a second concurrency
    level the workload did not cover."""
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec, _drop_one_bucket)
    _, lv1, _ = _counts(d)
    doc = f"# PR\n\nAt concurrency 4, {lv1} requests completed on sim-fast.\n" + BOUNDARY
    code, diags = _lint(tmp_path, capsys, doc, d, spec_file)
    assert (code, diags) == (0, [])


def test_a_wrong_per_level_number_names_the_level_and_the_total(tmp_path, capsys):
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec, _drop_one_bucket)
    lv0, lv1, total = _counts(d)
    bad = f"# PR\n\nAt concurrency 4, sim-fast completed {lv0} requests.\nsim-fast completed {lv1} requests.\n" + BOUNDARY
    code, diags = _lint(tmp_path, capsys, bad, d, spec_file)
    assert code == 1
    assert [(x["code"], x["line"]) for x in diags] == [("CB201", 3), ("CB201", 4)]
    assert diags[0]["message"] == (f"states completed {lv0} for sim-fast; the evidence records "
                                   f"sim-fast · concurrency 4: {lv1} (sim-fast in total: {total})")
    assert diags[1]["message"] == f"states completed {lv1} for sim-fast; the evidence records sim-fast: {total}"  # no level named


def test_an_open_loop_level_is_named_by_its_rate(tmp_path, capsys):
    spec = small_spec(levels="[2rps, 4rps]", mode="open", backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec, _drop_one_bucket)
    lv0, lv1, total = _counts(d)
    doc = f"# PR\n\nAt 4 rps sim-fast completed {lv1} requests; at rate 2 rps it completed {lv0} requests.\n" + BOUNDARY
    assert _lint(tmp_path, capsys, doc, d, spec_file) == (0, [])


def test_a_per_level_table_row_of_the_report_is_checked_against_its_level(tmp_path, capsys):
    """The md report's per-level table ("sim-fast · concurrency 4") lints clean; a changed
    count in it is a finding on its row."""
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec, _drop_one_bucket)
    lv0, lv1, total = _counts(d)
    md = prepare(spec, load_evidence(d)).render("md")
    assert _lint(tmp_path, capsys, md, d, spec_file)[0] == 0
    rows = [line for line in md.splitlines() if line.startswith("| sim-fast · concurrency 4 |")]
    assert len(rows) == 1
    cells = rows[0].split(" | ")
    assert cells[-5] == str(lv1)  # Completed
    cells[-5] = str(lv1 + 3)
    code, diags = _lint(tmp_path, capsys, md.replace(rows[0], " | ".join(cells)), d, spec_file)
    assert code == 1 and [x["code"] for x in diags] == ["CB201"]
    assert f"sim-fast · concurrency 4: {lv1} (sim-fast in total: {total})" in diags[0]["message"]


# ---------------------------------------------------------------- 2. stored results are not trusted


def _inconclusive(b: EvidenceBuilder) -> None:
    b.with_client(lag=0.5)  # a saturated load generator: client_healthy is INCONCLUSIVE


def test_a_verdict_edited_to_pass_does_not_support_a_pass_claim(tmp_path, capsys):
    spec = small_spec(backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec, _inconclusive)
    doc = json.loads((d / "verdict.json").read_text())
    assert doc["verdict"] == "INCONCLUSIVE"
    claim = "# PR\n\nThe soak passed: gate: PASS.\n" + BOUNDARY
    assert _lint(tmp_path, capsys, claim, d, spec_file)[0] == 1  # unsupported, before any edit
    doc["verdict"], doc["exit_code"] = "PASS", 0  # its rules still INCONCLUSIVE, still bound to the manifest
    (d / "verdict.json").write_text(json.dumps(doc))
    assert cli.main(["verify", str(d)]) == 0  # not hashed: verify cannot tell
    capsys.readouterr()
    code, diags = _lint(tmp_path, capsys, claim, d, spec_file)
    assert code == 1
    by = {x["code"]: x for x in diags}
    assert set(by) == {"CB201", "CB402"}
    assert by["CB201"]["message"] == "states gate PASS for sim-fast; the evidence records sim-fast: inconclusive"
    assert by["CB402"]["severity"] == "warning"
    assert ("verdict.json says PASS (its own rules give INCONCLUSIVE); re-judged from the evidence: INCONCLUSIVE"
            in by["CB402"]["message"])


def test_results_edited_are_not_what_the_document_is_checked_against(tmp_path, capsys):
    spec = small_spec(backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec)
    res = json.loads((d / "results.json").read_text())
    (b,) = res["backends"]
    true = b["requests"]["completed"]
    b["requests"]["completed"] = 5
    b["levels"][0]["requests"]["completed"] = 5
    b["buckets"][0]["qps"] = 999
    (d / "results.json").write_text(json.dumps(res))
    assert cli.main(["verify", str(d)]) == 0
    capsys.readouterr()

    code, diags = _lint(tmp_path, capsys, "# PR\n\nsim-fast completed 5 requests.\n" + BOUNDARY, d, spec_file)
    assert code == 1
    assert [(x["code"], x["line"]) for x in diags] == [("CB402", 1), ("CB201", 3)]
    assert diags[1]["message"] == f"states completed 5 for sim-fast; the evidence records sim-fast: {true}"
    assert f"results.json records completed 5 for sim-fast; re-judged: {true}" in diags[0]["message"]

    code, diags = _lint(tmp_path, capsys, f"# PR\n\nsim-fast completed {true} requests.\n" + BOUNDARY, d, spec_file)
    assert code == 0 and [x["code"] for x in diags] == ["CB402"]  # the document is right; the stored file is not


def test_without_an_embedded_spec_a_verdict_its_rules_contradict_is_not_believed(tmp_path, capsys):
    """Evidence that cannot be re-judged (its manifest embeds no spec): the stored files are
    used, but a verdict.json whose outcome its own rules do not give is named, and its rules
    decide the gate."""
    spec = small_spec(backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec, _inconclusive)
    m = json.loads((d / "manifest.json").read_text())
    del m["spec"]["text"]
    (d / "manifest.json").write_text(json.dumps(m))
    v = json.loads((d / "verdict.json").read_text())
    v["verdict"], v["exit_code"] = "PASS", 0
    (d / "verdict.json").write_text(json.dumps(v))
    code, diags = _lint(tmp_path, capsys, "# PR\n\ngate: PASS.\n" + BOUNDARY, d, spec_file)
    assert code == 1
    by = {x["code"]: x["message"] for x in diags}
    assert by["CB201"] == "states gate PASS for sim-fast; the evidence records sim-fast: inconclusive"
    assert "verdict.json says PASS, but its own rules give INCONCLUSIVE" in by["CB402"]
    assert "results.json is bound to a different manifest" in by["CB402"]  # the manifest was edited too


def test_evidence_that_cannot_be_re_judged_says_so(tmp_path, capsys):
    spec = small_spec(backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec)
    m = json.loads((d / "manifest.json").read_text())
    m["spec"]["text"] = "soak {"  # does not check with this soakspec
    (d / "manifest.json").write_text(json.dumps(m))
    code, diags = _lint(tmp_path, capsys, "# PR\n\nNo numbers.\n" + BOUNDARY, d, spec_file)
    assert code == 0 and [(x["code"], x["severity"]) for x in diags] == [("CB402", "warning")]
    assert "cannot be re-judged (the spec embedded in" in diags[0]["message"]
    assert "the stored results.json and verdict.json are used unverified" in diags[0]["message"]


def test_lint_claims_never_executes_what_the_embedded_spec_names(tmp_path, capsys, monkeypatch):
    """Re-judging reads the evidence (it does re-judge: the edited count is not believed); it
    never runs the backend commands the spec names."""
    marker = tmp_path / "MARKER"
    text = small_spec(backends=("sim-fast",)).canonical_text.replace(
        'url = "http://127.0.0.1:8000"', f'launch = ["/bin/sh", "-c", "touch {marker}; echo {{port}}"]')
    spec = spec_from_text(text)
    d, spec_file = _run(tmp_path, spec)
    res = json.loads((d / "results.json").read_text())
    res["backends"][0]["requests"]["completed"] = 1
    (d / "results.json").write_text(json.dumps(res))

    def refuse(*a, **k):
        raise AssertionError(f"a process was started: {a!r}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse, raising=False)
    code, diags = _lint(tmp_path, capsys, "# PR\n\nsim-fast completed 1 requests.\n" + BOUNDARY, d, spec_file)
    assert code == 1 and [x["code"] for x in diags] == ["CB402", "CB201"]
    assert not marker.exists()



def test_a_run_whose_results_and_verdict_were_deleted_supports_no_pass_claim(tmp_path, capsys):
    """Evidence is judged after the fact as `gate` judges it: without the run's own results.json
    and verdict.json it is incomplete (INCONCLUSIVE), so "gate: PASS" is not supported (the
    re-judgement judged it as the run at its end does, and found PASS)."""
    spec = small_spec(backends=("sim-fast",))
    d, spec_file = _run(tmp_path, spec)
    claim = "# PR\n\nThe soak passed: gate: PASS.\n" + BOUNDARY
    assert _lint(tmp_path, capsys, claim, d, spec_file) == (0, [])
    (d / "verdict.json").unlink()
    (d / "results.json").unlink()
    assert cli.main(["gate", str(d)]) == 3
    capsys.readouterr()
    code, diags = _lint(tmp_path, capsys, claim, d, spec_file)
    assert code == 1 and [x["code"] for x in diags if x["severity"] == "error"] == ["CB201"], diags
