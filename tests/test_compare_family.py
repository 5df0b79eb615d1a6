"""`soakspec compare`'s family-wise error control (soakspec.compare, "Confidence"): every row of
one invocation is one family of m rows, and each row's interval is a 1 - (1 - confidence) / m
interval (Bonferroni), so two runs drawn from one distribution read "significant" on ANY row at
most 1 - confidence of the time -- not about (1 - confidence) * m rows per comparison, as m
separate 95 % intervals would. The row's verdict, the built-in errors FAIL, the rules and
`lint-claims --compare` (CB501-CB504) all read those same intervals.

Seeded simulations (no timing): each row is computed as `compare` computes it (`_row`), once at
the family's row confidence and once at the uncorrected one (each row at `confidence`: what the
correction is for, and what a reviewer gets without it)."""

from __future__ import annotations

import json
import random
import re
import types
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from soakspec import cli
from soakspec import compare as C
from soakspec.compare import intervals, rows as R
from soakspec.judge.testing import EvidenceBuilder, small_spec

_LV = types.SimpleNamespace(label="concurrency 8", index=0)
SIGNIFICANT = ("regression", "improvement")


def _row(metric: str, stat: str, sides, row_conf: float, resamples: int, seed: int, key: object = 0) -> C.Row:
    """The row `compare` makes of these two sides at this row confidence (`compare._row`)."""
    cm = C.BY_NAME[metric]
    p = types.SimpleNamespace(cm=cm, stat=stat, key=("b", "b", "w", 0, metric, stat, key), base_lv=_LV, new_lv=_LV,
                              note=None, turn=None)
    return R._row(p, 0.95, row_conf, resamples, seed, sides)


def _distribution(xb, xn):
    sb, sn = C.Sorted.of(xb), C.Sorted.of(xn)
    return ((sb, sb.n), (sn, sn.n))


def _family(rng: np.random.Generator, seed: int, row_conf: float, resamples: int, *, errors_new: float = 0.02) -> list[C.Row]:
    """One comparison's 15 rows of two runs of one configuration: p95 of a TTFT sample pair (400
    requests a side, lognormal; each percentile row's own rate is tests/test_compare_stats.py's),
    the mean over 6 buckets of 7 per-bucket figures (5 % noise) and 7 error shares (2 % of 2000
    requests), each its own pair. `errors_new`: the new run's share on the first errors row (a
    real shift in one row)."""
    xb, xn = rng.lognormal(-2.3, 0.35, 400), rng.lognormal(-2.3, 0.35, 400)
    rows = [_row("ttft", "p95", _distribution(xb, xn), row_conf, resamples, seed)]
    for k in range(7):
        mb, mn = 1000 * (1 + 0.05 * rng.standard_normal(6)), 1000 * (1 + 0.05 * rng.standard_normal(6))
        rows.append(_row("throughput", "mean", ((list(mb), 6), (list(mn), 6)), row_conf, resamples, seed, k))
    for k in range(7):
        kb, kn = int(rng.binomial(2000, 0.02)), int(rng.binomial(2000, errors_new if k == 0 else 0.02))
        rows.append(_row("errors", "ratio", ((kb, 2000), (kn, 2000)), row_conf, resamples, seed, k))
    return rows


M = 15
CONFIDENCE = 0.95
FAMILY = C.family_confidence(CONFIDENCE, M)  # what compare gives each of M rows


def test_two_runs_of_one_configuration_read_a_significant_row_at_most_alpha_of_the_time():
    """The fraction of 120 null comparisons (15 rows each) with ANY significant row is about
    alpha = 5 % with the family-wise correction (at most 1 - (1 - 0.05 / 15)^15 = 4.9 % for
    independent rows; allowed 9 %, two binomial standard deviations above; 2.5 % here), where the same
    rows at an uncorrected 95 % each read one in about half of them (1 - 0.95^15 = 54 % were
    they independent and continuous; 56 % here) -- the defect the correction prevents."""
    reps = 120
    corrected = uncorrected = 0
    for t in range(reps):
        fam = _family(np.random.default_rng(1000 + t), t, FAMILY, intervals.min_resamples(M, CONFIDENCE))
        raw = _family(np.random.default_rng(1000 + t), t, C.family_confidence(CONFIDENCE, 1), intervals.min_resamples(1, CONFIDENCE))
        corrected += any(r.verdict in SIGNIFICANT for r in fam)
        uncorrected += any(r.verdict in SIGNIFICANT for r in raw)
        assert all(r.verdict not in ("missing", "insufficient samples") for r in fam)
    assert corrected / reps <= 0.09, corrected
    assert uncorrected / reps >= 0.30, uncorrected


def test_a_real_shift_in_one_row_is_still_found():
    """The correction widens every interval, and a real change must still show: the first
    errors row rises from 2 % to 5 % of 2000 requests (the others and the rest of the family do
    not change) -- it reads "regression" in at least 45 of 50 comparisons (49 here), and the
    other 14 rows read significant in at most 6 (expected at most 5 % of 50, 2.3; 4 here)."""
    reps = 50
    found = others = 0
    for t in range(reps):
        fam = _family(np.random.default_rng(5000 + t), t, FAMILY, intervals.min_resamples(M, CONFIDENCE), errors_new=0.05)
        shifted = fam[8]
        assert (shifted.metric, shifted.stat) == ("errors", "ratio")
        found += shifted.verdict == "regression"
        others += any(r.verdict in SIGNIFICANT for r in fam if r is not shifted)
    assert found >= 45, found
    assert others <= 6, others


# ------------------------------------------------------------------------------ properties

def _pair(kind: str, data_seed: int, factor: float):
    """Two sides of one row whose true change is `factor` (near 1: rows near the edge of
    significance, where a confidence decides)."""
    rng = np.random.default_rng(data_seed)
    if kind == "p90":
        return kind, rng.lognormal(0, 0.5, 120), rng.lognormal(0, 0.5, 120) * factor
    if kind == "mean":
        return kind, list(1000 * (1 + 0.05 * rng.standard_normal(6))), list(1000 * factor * (1 + 0.05 * rng.standard_normal(6)))
    return kind, (int(rng.binomial(1000, 0.05)), 1000), (int(rng.binomial(1000, min(1.0, 0.05 * factor))), 1000)


def _family_rows(pairs, alpha: float, m: int, seed: int) -> list[C.Row]:
    """The rows of these pairs in a family of `m` rows at family-wise `alpha`."""
    conf = C.family_confidence(1 - alpha, m)
    out = []
    for i, (kind, b, n) in enumerate(pairs):
        if kind == "p90":
            out.append(_row("ttft", "p90", _distribution(b, n), conf, 300, seed, i))
        elif kind == "mean":
            out.append(_row("qps", "mean", ((b, len(b)), (n, len(n))), conf, 300, seed, i))
        else:
            out.append(_row("errors", "ratio", (b, n), conf, 300, seed, i))
    return out


def _significant(rows: list[C.Row]) -> set[tuple[int, str]]:
    return {(i, r.verdict) for i, r in enumerate(rows) if r.verdict in SIGNIFICANT}


_rows = st.lists(st.builds(_pair, st.sampled_from(("p90", "mean", "ratio")), st.integers(0, 2**16), st.floats(0.7, 1.5)),
                 min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(_rows, st.floats(0.001, 0.5), st.floats(0.001, 0.5), st.integers(1, 60), st.integers(0, 2**16))
def test_the_corrected_decisions_are_a_subset_of_the_raw_ones_and_monotone_in_alpha(pairs, a1, a2, m, seed):
    """Property: the rows significant after the correction (family of m rows at alpha) are a
    subset of those significant each at alpha alone (m = 1), with the same direction, and a
    smaller alpha never makes a row significant that a larger one did not: one row's intervals
    at two confidences are nested (the same bootstrap draws, Fieller's and Newcombe's intervals
    widen with their quantile), so the correction can only take significance away, never add
    or flip it."""
    lo, hi = sorted((a1, a2))
    raw, wide, wider = _family_rows(pairs, hi, 1, seed), _family_rows(pairs, hi, m, seed), _family_rows(pairs, lo, m, seed)
    assert _significant(wide) <= _significant(raw)
    assert _significant(wider) <= _significant(wide)
    for a, b in zip(wide, wider):  # the reason: one row's intervals are nested
        if a.low is not None and b.low is not None:
            assert b.low <= a.low <= a.high <= b.high


# ------------------------------------------------------------------------------ lint-claims

SPEC = small_spec(duration="4m", bucket="1m", mode="open", levels="[4rps]", backends=("sim",))


def _run(seed: int) -> EvidenceBuilder:
    """A run of the one configuration (TTFT lognormal, 63 gaps a request); seeds 1002 and 1003
    are a pair whose p99(ttft) reads "regression" at an uncorrected 95 % (found by trying pairs:
    2 of 30 null pairs read a row significant uncorrected, none corrected)."""
    b = EvidenceBuilder(SPEC, per_bucket=100, run_id=f"run{seed}", scheduled=False)
    rng = random.Random(seed)
    for r in b.measured("sim", level=0):
        ttft = rng.lognormvariate(-2.3, 0.35)
        gaps = [rng.lognormvariate(-4.0, 0.25) for _ in range(63)]
        r.update(ttft=ttft, first_token=r["start"] + ttft, itl=gaps, tpot=sum(gaps) / 63,
                 latency=ttft + sum(gaps), end=r["start"] + ttft + sum(gaps))
    return b


def _lint(doc_path: Path, spec: Path, compare_json: Path, capsys) -> tuple[int, list[str]]:
    code = cli.main(["lint-claims", str(doc_path), "--spec", str(spec), "--compare", str(compare_json)])
    out = capsys.readouterr()
    return code, re.findall(r": (CB5\d\d) ", out.out + out.err)


def test_a_no_regression_claim_on_a_null_comparison_is_not_flagged(tmp_path, capsys):
    """Two runs of one configuration whose p99 TTFT reads "regression" on an uncorrected 95 %
    interval: `compare` (15 rows, family-wise) reads no significant change anywhere and PASSes,
    and `lint-claims --compare` leaves "No regression in TTFT" alone. The same comparison with
    each row at an uncorrected 95 % (confidence 1 - 0.05 * 15, which compare takes as a function
    argument and the command refuses) flags the honest claim CB504 -- what the correction
    prevents."""
    base, new = _run(1002), _run(1003)
    base_dir, new_dir = base.write(tmp_path / "base"), new.write(tmp_path / "new")
    spec = tmp_path / "spec.soak"
    spec.write_text(SPEC.canonical_text)
    doc = tmp_path / "PR.md"
    doc.write_text("# PR\n\nNo regression in TTFT at rate 4 rps.\n\n## Claim boundary\n\nSynthetic runs.\n")

    fam = tmp_path / "compare.json"
    assert cli.main(["compare", str(base_dir), str(new_dir), "--format", "json", "--out", str(fam)]) == 0
    doc_json = json.loads(fam.read_text())
    rows = doc_json["rows"]
    assert len(rows) == M and {r["row_confidence"] for r in rows} == {FAMILY}
    assert doc_json["method"]["family_rows"] == M and doc_json["method"]["family_wise"] == "Bonferroni over the rows"
    assert not [r for r in rows if r["verdict"] in SIGNIFICANT]
    capsys.readouterr()
    assert _lint(doc, spec, fam, capsys) == (0, [])
    del doc_json["method"]["family_rows"]  # a compare.json written before it: its rows held the corrected intervals
    older = tmp_path / "older.json"
    older.write_text(json.dumps(doc_json))
    assert _lint(doc, spec, older, capsys) == (0, [])

    raw = C.compare(base.build(), new.build(), confidence=1 - 0.05 * M)
    assert {r.row_confidence for r in raw.rows} == {0.95}
    assert [(r.stat, r.metric, r.verdict) for r in raw.rows if r.verdict in SIGNIFICANT] == [("p99", "ttft", "regression")]
    uncorrected = tmp_path / "uncorrected.json"
    uncorrected.write_text(json.dumps(raw.to_json()))
    code, found = _lint(doc, spec, uncorrected, capsys)
    assert code == 1 and found == ["CB504"], found


def test_the_report_names_the_correction_its_family_and_each_rows_confidence(tmp_path):
    """The markdown (and HTML) method line says the verdicts are after the correction, which
    correction, over how many rows, and at what confidence each row's interval is -- a reader
    comparing an interval with another tool's 95 % one must know it is a 99.67 % one."""
    from soakspec.compare.render import render

    c = C.compare(_run(1002).build(), _run(1003).build())
    md = render(c, "md")
    assert ("95% family-wise (Bonferroni over the 15 rows of this comparison: each row's interval is a 99.67% "
            "interval, so every verdict above is after the correction)") in md
    assert "Bonferroni over the 15 rows" in render(c, "html")
