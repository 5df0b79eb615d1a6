"""`soakspec lint-claims --evidence DIR` reads each spelling of a time unit as soakspec's units
module does (`soakspec.claims.figures`, `soakspec.units`).

Evidence as `soakspec run` writes it (`EvidenceBuilder`): sim-fast at concurrency 2 (TTFT 100 ms)
and 4 (TTFT 40.87 ms), 8.53 tok/s.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from soakspec import cli
from soakspec.claims import figures
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.units import prose_quantity

BOUNDARY = "\n\n## Claim boundary\n\nSynthetic evidence only.\n"
TTFT_C4 = 0.04087


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("figure-changes")
    spec = small_spec(levels="[2, 4]", backends=("sim-fast",))
    b = EvidenceBuilder(spec)
    for r in b.measured("sim-fast", level=1):
        r["first_token"] = r["start"] + TTFT_C4
        r["ttft"] = TTFT_C4
    d = b.write(tmp / "run")
    spec_file = tmp / "spec.soak"
    spec_file.write_text(spec.canonical_text)
    return d, spec_file


def _cb201(tmp_path: Path, capsys, run, lines: list[str]) -> list[int]:
    """The lines `soakspec lint-claims PR.md --evidence DIR` finds CB201 on (one paragraph a line:
    3, 5, 7, ...)."""
    d, spec_file = run
    p = tmp_path / "PR.md"
    p.write_text("# PR\n\n" + "\n\n".join(lines) + BOUNDARY)
    cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)])
    out = capsys.readouterr().out
    return [int(m.group(1)) for m in re.finditer(rf"^{re.escape(str(p))}:(\d+):\d+: CB201 ", out, re.M)]


# ---------------------------------------------------------------- one reading of a unit

SPELLINGS = {"µs": 1e-6, "μs": 1e-6, "us": 1e-6, "usec": 1e-6, "microseconds": 1e-6, "ms": 1e-3, "msec": 1e-3,
             "milliseconds": 1e-3, "s": 1.0, "sec": 1.0, "seconds": 1.0, "min": 60.0, "mins": 60.0, "minutes": 60.0}


def test_figures_and_the_units_module_read_each_time_unit_alike():
    """Every spelling of a time unit `figures` reads converts as `units.prose_quantity` converts
    it (the module `.soak` quantities and claims of change use), and each of µs / μs (micro sign,
    Greek mu) / us, ms, s, min reads as its unit in both."""
    for word in figures.TIME_UNIT_WORDS:
        assert figures.seconds_per(word) == prose_quantity(1.0, word)[1], word  # type: ignore[index]
        assert re.fullmatch(figures._TIME_UNIT, word, re.I), word
    for word, seconds in SPELLINGS.items():
        assert word in figures.TIME_UNIT_WORDS
        assert figures.seconds_per(word) == seconds == prose_quantity(1.0, word)[1], word  # type: ignore[index]


@pytest.mark.parametrize(("written", "seconds"), [("40870 µs", 1e-6), ("40870 μs", 1e-6), ("40870 us", 1e-6), ("40870 microseconds", 1e-6),
                                                  ("40.87 milliseconds", 1e-3), ("0.04087 s", 1.0), ("0.000681 min", 60.0)])  # fmt: skip
def test_a_figure_in_any_time_unit_spelling_is_read_at_that_unit(tmp_path, capsys, run, written, seconds):
    """The run's p95 TTFT at concurrency 4 (40.87 ms) written in each unit holds; twice it is CB201."""
    n, unit = written.split(" ")
    twice = f"{float(n) * 2:.{len(n.split('.')[1]) if '.' in n else 0}f} {unit}"
    lines = [f"At concurrency 4, p95 TTFT was {written}.", f"At concurrency 4, p95 TTFT was {twice}."]
    assert _cb201(tmp_path, capsys, run, lines) == [5]
