"""`soakspec lint-claims` on a before/after review document: the reports of two runs of one
backend (the base and the new run of a PR), pasted into one document and checked with
`--evidence BASE NEW`. Each run's figures are that run's: a backend name the two runs share
must not make one run's correct figures read as contradicting the other's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from soakspec import cli
from soakspec.judge.testing import EvidenceBuilder, small_spec


def _ttft(b: EvidenceBuilder, ttft: float) -> None:
    for level in (0, 1):
        for r in b.measured("sim-fast", level=level):
            r["first_token"] = r["start"] + ttft
            r["ttft"] = ttft


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A base run (TTFT 40.87 ms) and a new run (TTFT 61.3 ms) of one spec, and the spec."""
    tmp = tmp_path_factory.mktemp("before-after")
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    dirs = []
    for name, ttft in (("base", 0.04087), ("new", 0.0613)):
        b = EvidenceBuilder(spec)
        _ttft(b, ttft)
        dirs.append(b.write(tmp / name))
    spec_file = tmp / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    return dirs[0], dirs[1], spec_file


def _report(capsys, d: Path) -> str:
    assert cli.main(["report", str(d), "--format", "md"]) == 0
    return capsys.readouterr().out


def _lint(tmp_path: Path, capsys, doc: str, spec_file: Path, *evidence: Path) -> tuple[int, list[str]]:
    p = tmp_path / "PR.md"
    p.write_text(doc)
    code = cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", *map(str, evidence)])
    out = capsys.readouterr().out
    return code, [line.removeprefix(f"{p}:") for line in out.splitlines() if re.match(rf"{re.escape(str(p))}:\d+:\d+: ", line)]


def test_both_runs_reports_pasted_together_are_clean_with_both_evidence(tmp_path, capsys, runs):
    base, new, spec_file = runs
    doc = "# PR\n\n### Before\n\n" + _report(capsys, base) + "\n### After\n\n" + _report(capsys, new)
    for order in ((base, new), (new, base)):
        assert _lint(tmp_path, capsys, doc, spec_file, *order) == (0, []), order


def test_a_figure_neither_run_recorded_is_still_CB201(tmp_path, capsys, runs):
    base, new, spec_file = runs
    doc = "# PR\n\n" + _report(capsys, new).replace("61.3 ms", "55.3 ms", 1)
    code, diags = _lint(tmp_path, capsys, doc, spec_file, base, new)
    assert code == 1
    # the report's first 61.3 ms is the TTFT mean column (the simulator's p50 is the same figure)
    assert any("CB201 states TTFT mean 55.3 ms for sim-fast" in d for d in diags), diags


def test_a_count_summed_across_the_two_runs_is_not_a_total(tmp_path, capsys, runs):
    """Two runs of one backend are not two backends: their counts do not add up to a total (each
    run did 16 requests a level, 32 in all)."""
    base, new, spec_file = runs
    for said in ("sim-fast completed 64 requests.", "At concurrency 2, sim-fast completed 64 requests."):
        doc = f"# PR\n\n{said}\n\n## Claim boundary\n\nSynthetic.\n"
        code, diags = _lint(tmp_path, capsys, doc, spec_file, base, new)
        assert code == 1 and any("CB201 states completed" in d for d in diags), (said, diags)


def test_compare_tables_pasted_with_both_runs_evidence_are_clean_when_a_bucket_is_short(tmp_path, capsys):
    """`soakspec compare`'s mean(qps) and mean(throughput) are the gate's: the mean over the
    level's buckets. A level whose last bucket is short (a duration not a whole number of
    buckets, W505) has a wall-time-weighted rate in the report that differs from it (0.167 req/s
    against 0.18 here); both are figures of the evidence, and neither is a CB201."""
    spec = small_spec(levels="[2]", duration="270s", bucket="1m", backends=("sim-fast",))
    dirs = [EvidenceBuilder(spec, per_bucket=9).write(tmp_path / name) for name in ("base", "new")]
    spec_file = tmp_path / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    assert cli.main(["compare", *map(str, dirs), "--format", "md"]) == 0
    compared = capsys.readouterr().out
    assert "| mean(qps) | 0.18 req/s | 0.18 req/s |" in compared  # (0.15 * 4 + 0.3) / 5 buckets; weighted: 45 / 270 s
    doc = "# PR\n\n" + compared + "\n" + _report(capsys, dirs[1])
    assert _lint(tmp_path, capsys, doc, spec_file, *dirs) == (0, [])
    assert "| mean(throughput) | 11.52 tok/s |" in compared  # (9.6 * 4 + 19.2) / 5; the report's: 10.67
    wrong = doc.replace("| mean(throughput) | 11.52 tok/s |", "| mean(throughput) | 13.52 tok/s |", 1)
    code, diags = _lint(tmp_path, capsys, wrong, spec_file, *dirs)
    assert code == 1 and any("CB201 states output throughput 13.52 tok/s" in d for d in diags), diags


def test_a_request_rate_edited_in_a_pasted_compare_table_is_CB201(tmp_path, capsys, runs):
    """compare writes a level's mean(qps) in req/s, as the report does, so that lint-claims reads it
    as a request rate: an edited one is caught like any figure."""
    base, new, spec_file = runs
    assert cli.main(["compare", str(base), str(new), "--format", "md"]) == 0
    compared = capsys.readouterr().out
    assert "| mean(qps) | 0.13 req/s | 0.13 req/s |" in compared
    assert _lint(tmp_path, capsys, "# PR\n\n" + compared, spec_file, base, new) == (0, [])
    wrong = compared.replace("| mean(qps) | 0.13 req/s |", "| mean(qps) | 0.26 req/s |", 1)
    code, diags = _lint(tmp_path, capsys, "# PR\n\n" + wrong, spec_file, base, new)
    assert code == 1 and any("CB201 states request rate 0.26 req/s" in d for d in diags), diags


def test_a_total_over_two_backends_holds_and_one_over_two_runs_of_them_does_not(tmp_path, capsys):
    """Two backends' counts add up to their total (one run of each, whichever directory each
    came from); the before/after runs of both do not add up to twice it."""
    spec = small_spec(levels="[2, 4]", backends=("sim-fast", "sim-slow"))
    dirs = [EvidenceBuilder(spec).write(tmp_path / name) for name in ("base", "new")]
    spec_file = tmp_path / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    tail = "\n\n## Claim boundary\n\nSynthetic.\n"
    for evidence in (dirs[:1], dirs):
        said = "# PR\n\nsim-fast and sim-slow completed 64 requests." + tail  # 16 a level, 2 levels, 2 backends
        assert _lint(tmp_path, capsys, said, spec_file, *evidence) == (0, []), evidence
        code, diags = _lint(tmp_path, capsys, said.replace("64", "128"), spec_file, *evidence)
        assert code == 1 and any("CB201 states completed 128" in d for d in diags), diags


def test_a_total_over_two_backends_run_apart_holds(tmp_path, capsys):
    """Two backends run apart (a directory each, `run --backend`) still add up to their total."""
    dirs = [EvidenceBuilder(small_spec(levels="[2, 4]", backends=(name,))).write(tmp_path / name)
            for name in ("sim-fast", "sim-slow")]
    spec_file = tmp_path / "spec.soak"
    spec_file.write_text(small_spec(levels="[2, 4]", backends=("sim-fast", "sim-slow")).canonical_text)
    said = "# PR\n\nsim-fast and sim-slow completed {} requests.\n\n## Claim boundary\n\nSynthetic.\n"
    _, diags = _lint(tmp_path, capsys, said.format(64), spec_file, *dirs)
    assert not [d for d in diags if "CB201" in d], diags
    _, diags = _lint(tmp_path, capsys, said.format(63), spec_file, *dirs)
    assert any("CB201 states completed 63" in d for d in diags), diags
