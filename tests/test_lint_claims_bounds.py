"""`lint-claims` does work linear in the document (issue 15: a 5 MB one-line document ran past
120 s). The quadratic part was the polarity of each phrase scanning its whole sentence -- and a
one-line document with no full stop is one sentence -- so every phrase costs the document's
length. Now a clause reaches at most `CLAUSE_REACH` characters each side of its phrase."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from soakspec.claims import adapters, polarity
from soakspec.claims.engine import lint
from soakspec.claims.polarity import CLAUSE_REACH, Polarity

DATA = Path(__file__).parent / "data" / "claims"
SMALL = str(DATA / "small.soak")
PHRASES = "it is production-ready at concurrency 64 with p99 ttft 1.5 s for 48 hours and "


def _one_line(size: int) -> str:
    return (PHRASES * (size // len(PHRASES) + 1))[:size]


def test_each_phrase_looks_at_a_bounded_clause(monkeypatch):
    """Counting, not timing: every string the clause rules scan is at most CLAUSE_REACH long,
    however long the sentence, so the work per phrase is bounded."""
    seen: list[int] = []
    for name in ("_clause_prefix", "_clause_suffix", "_negated_prefix"):
        real = getattr(polarity, name)

        def spy(text, _real=real):
            seen.append(len(text))
            return _real(text)

        monkeypatch.setattr(polarity, name, spy)
    boundary, coverage, sha, _ = adapters.load_boundary_and_coverage(SMALL)
    doc = _one_line(200_000)
    diags = lint(doc, "PR.md", boundary, coverage, [], sha)
    assert len(seen) > 1000 and diags  # many phrases were judged, and found
    assert max(seen) <= CLAUSE_REACH


def test_the_clause_bound_keeps_near_cues_and_drops_far_ones():
    near = "we do not claim it is production-ready"
    i = near.index("production-ready")
    assert polarity.polarity(near, i, i + 16) is Polarity.NEGATED
    far = "we do not claim " + "x " * CLAUSE_REACH + "production-ready"
    j = far.index("production-ready")
    assert polarity.polarity(far, j, j + 16) is Polarity.ASSERTED
    assert polarity.polarity(far + " ?", j, j + 16) is Polarity.QUESTION


@pytest.mark.slow
def test_a_one_megabyte_one_line_document_is_linted_through_the_cli(tmp_path):
    """Generous bound, not a timing assertion: before the fix this took over an hour."""
    doc = tmp_path / "PR.md"
    doc.write_text(_one_line(1_000_000))
    r = subprocess.run(
        [sys.executable, "-m", "soakspec", "lint-claims", str(doc), "--spec", SMALL, "--format", "json"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert '"CB301"' in r.stdout and "Traceback" not in r.stderr


# ------------------------------------------------------------------ hostile files


def _lint(capsys, *args: str) -> tuple[int, str]:
    from soakspec.cli import main

    code = main(["lint-claims", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in out + err
    return code, out + err


def test_dev_zero_as_document_or_spec_is_a_usage_error_not_a_memory_error(tmp_path, capsys):
    doc = tmp_path / "PR.md"
    doc.write_text("Claim boundary: no production readiness.\n")
    code, out = _lint(capsys, "/dev/zero", "--spec", SMALL)
    assert code == 2 and "larger than 10 MB" in out
    code, out = _lint(capsys, str(doc), "--spec", "/dev/zero")
    assert code == 2 and "spec /dev/zero is larger than 1 MB" in out


def test_a_fifo_nobody_writes_to_is_refused_after_a_bounded_wait(tmp_path, capsys, monkeypatch):
    import os

    from soakspec.lang import parser

    monkeypatch.setattr(parser, "FIFO_WAIT_S", 0.3)
    fifo = tmp_path / "PR.md"
    os.mkfifo(fifo)
    code, out = _lint(capsys, str(fifo), "--spec", SMALL)
    assert code == 2 and "nothing was written to the pipe" in out


def test_a_spec_given_as_a_pipe_is_read_once(tmp_path):
    """`--spec <(cat small.soak)`: the spec is read once, so a pipe works."""
    doc = tmp_path / "PR.md"
    doc.write_text("Claim boundary: no production readiness.\n")
    r = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m soakspec lint-claims "{doc}" --spec <(cat "{SMALL}")'],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode in (0, 1), r.stderr
    assert "cannot read" not in r.stderr and "invalid spec" not in r.stderr
