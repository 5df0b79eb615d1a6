"""`soakspec lint-claims --evidence DIR` never reads a change as a figure ("p50 TTFT is 25 ms
less", "throughput rose by 40 tok/s": not the run's TTFT or throughput), and reads each spelling
of a time unit as soakspec's units module does (`soakspec.claims.figures`, `soakspec.units`).

Evidence as `soakspec run` writes it (`EvidenceBuilder`): sim-fast at concurrency 2 (TTFT 100 ms)
and 4 (TTFT 40.87 ms), 8.53 tok/s.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soakspec import cli
from soakspec.claims import ClaimBoundary, Coverage, lint
from soakspec.claims import figures
from soakspec.claims.adapters import load_evidence_facts
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


# ---------------------------------------------------------------- 1. a change is not a figure

CHANGES = [
    "The p50 TTFT is 25 ms less than before.",
    "p99 latency is 40 ms longer than on main.",
    "p50 TTFT is 25 ms shorter.",
    "p50 TTFT is 25 ms (20%) lower than before.",
    "p50 TTFT is 25 ms, or 20%, lower.",
    "p50 TTFT is 25 ms **lower**.",
    "p50 TTFT: 25 ms speedup.",
    "p50 TTFT is 25 ms down.",
    "Mean ITL is 3 ms quicker.",
    "Throughput rose by 40 tok/s.",
    "Throughput is up 40 tok/s.",
    "Throughput improved by ~40 tok/s.",
    "Throughput grew by more than 40 tok/s.",
    "An improvement of 40 tok/s in throughput.",
    "QPS rose by 2 req/s.",
    "Throughput is 40 tok/s (5%) higher.",
]


def test_a_change_is_never_read_as_the_runs_figure(tmp_path, capsys, run):
    """Each sentence states how much a figure changed, not the figure: no CB201, though 25 ms,
    40 tok/s and 2 req/s are no figure of the run."""
    assert _cb201(tmp_path, capsys, run, CHANGES) == []


def test_the_figure_itself_is_still_checked(tmp_path, capsys, run):
    """The same values stated as figures, and new figures after a direction ("fell to", "above"),
    are still read: CB201 on each."""
    figures_ = ["The p50 TTFT is 25 ms.", "p99 latency is 40 ms.", "Throughput was 40 tok/s.", "Throughput dropped to 40 tok/s.",
                "QPS rose above 2 req/s.", "p50 TTFT is 25 ms or less."]  # fmt: skip
    assert _cb201(tmp_path, capsys, run, figures_) == [3, 5, 7, 9, 11, 13]


# ---------------------------------------------------------------- 1b. a change from a baseline; a change by its two figures

def _stated(tmp_path: Path, capsys, run, lines: list[str]) -> list[tuple[int, str]]:
    """(line, the figure it states) of each CB201 of `soakspec lint-claims PR.md --evidence DIR`."""
    d, spec_file = run
    p = tmp_path / "PR.md"
    p.write_text("# PR\n\n" + "\n\n".join(lines) + BOUNDARY)
    cli.main(["lint-claims", str(p), "--spec", str(spec_file), "--evidence", str(d)])
    out = capsys.readouterr().out
    return [(int(m.group(1)), m.group(2)) for m in re.finditer(rf"^{re.escape(str(p))}:(\d+):\d+: CB201 states (.+?) for ", out, re.M)]


def test_a_value_below_or_above_a_baseline_is_a_change_not_the_runs_figure(tmp_path, capsys, run):
    """"25 ms below baseline" says how far the run is from the base, as "25 ms less than
    before" does: no CB201, though no figure of the run is 25 ms or 30 tok/s. Below / over
    anything else -- the run, load -- is still the run's figure."""
    changes = ["p95 TTFT is 25 ms below baseline.", "p95 TTFT is 25 ms under the baseline.", "p50 TTFT is 25 ms (20%) below main.",
               "Throughput is 30 tok/s above the base run.", "p99 latency is 40 ms over the previous build."]  # fmt: skip
    assert _cb201(tmp_path, capsys, run, changes) == []
    assert _cb201(tmp_path, capsys, run, ["p95 TTFT was 25 ms over the run.", "p95 TTFT was 25 ms under load."]) == [3, 5]


def test_the_first_figure_of_a_from_to_change_is_the_bases_and_the_second_is_checked(tmp_path, capsys, run):
    """"went from 30 ms to 40 ms" (or "30 ms → 40 ms") states 40 ms as this run's figure and 30
    ms as the base's: the base's is never checked against this run; the new one is (the run
    records TTFT 40.87 ms at concurrency 4, 8.53 tok/s)."""
    right = ["At concurrency 4, TTFT p50 went from 30 ms to 40.9 ms.", "p50 TTFT: 30 ms → 41 ms at concurrency 4.",
             "At concurrency 4, p50 TTFT rose 36%, from 30 ms to 41 ms.", "Throughput went from 30 tok/s to 8.53 tok/s.",
             "Throughput: 30 tok/s → 8.5 tok/s.", "Throughput improved from ~30 tok/s to 8.53 tok/s."]  # fmt: skip
    assert _stated(tmp_path, capsys, run, right) == []
    wrong = ["TTFT p50 went from 30 ms to 60 ms.", "p50 TTFT: 41 ms → 60 ms.", "Throughput went from 8.53 tok/s to 40 tok/s.",
             "Throughput: 8.53 tok/s -> 40 tok/s."]  # fmt: skip
    assert _stated(tmp_path, capsys, run, wrong) == [(3, "TTFT p50 60 ms"), (5, "TTFT p50 60 ms"), (7, "output throughput 40 tok/s"),
                                                     (9, "output throughput 40 tok/s")]  # fmt: skip


# ---------------------------------------------------------------- 2. one reading of a unit

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


# ---------------------------------------------------------------- properties

@pytest.fixture(scope="module")
def facts(run):
    return load_evidence_facts(run[0])


_AFTER = ["lower", "higher", "less", "more", "shorter", "longer", "faster", "slower", "better", "worse", "quicker", "down",
          "improvement", "regression", "reduction", "increase", "decrease", "speedup", "slowdown", "drop"]  # fmt: skip
_BEFORE = ["fell by", "rose by", "dropped", "improved by", "regressed by", "increased by", "went down", "is down", "is up", "grew",
           "decreased by about", "rose by more than"]  # fmt: skip
_SEP = [" ", " (12%) ", ", or 12%, ", " **", " _"]


_FROM_TO = ["went from {x} to {y}", "improved from {x} to {y}", "fell 12%, from {x} to {y}", "rose from about {x} to {y}",
            ": {x} → {y}", "is {x} -> {y}", "changed from {x} to {y}"]  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.integers(1, 5000), decimals=st.integers(0, 2), unit=st.sampled_from(["ms", "µs", "s", "tok/s"]),
       form=st.sampled_from(_FROM_TO))
def test_the_base_of_a_from_to_change_is_never_read_as_the_runs_figure(facts, value, decimals, unit, form):
    """In "X went from A to B" (or "A → B") A is the base run's figure, whatever its value and
    unit: with B the run's own (TTFT p95 40.87 ms at concurrency 4, 8.53 tok/s) there is no
    CB201."""
    a = f"{value / 10 ** decimals:.{decimals}f} {unit}"
    metric, b = ("Throughput", "8.53 tok/s") if unit == "tok/s" else ("At concurrency 4, p95 TTFT", "40.87 ms")
    text = f"{metric} {form.format(x=a, y=b)}.".replace(" :", ":")
    doc = "# PR\n\n" + text + BOUNDARY
    diags = [d for d in lint(doc, "PR.md", ClaimBoundary(), Coverage(concurrency_levels=(2, 4)), facts) if d.code == "CB201"]
    assert diags == [], (text, diags)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.integers(1, 5000), decimals=st.integers(0, 2), unit=st.sampled_from(["ms", "µs", "s", "tok/s", "req/s"]),
       after=st.sampled_from(_AFTER), before=st.sampled_from(_BEFORE), sep=st.sampled_from(_SEP), form=st.integers(0, 2))
def test_a_change_sentence_is_never_read_as_a_figure(facts, value, decimals, unit, after, before, sep, form):
    """A quantity with a direction word (the one vocabulary `changes` reads claims of change with)
    just after it ("25 ms lower", "40 tok/s (12%) higher") or just before it ("fell by 25 ms",
    "rose by 40 tok/s") is a change, whatever its value: never CB201."""
    v = f"{value / 10 ** decimals:.{decimals}f} {unit}"
    metric = {"tok/s": "Throughput", "req/s": "QPS"}.get(unit, "At concurrency 4, p95 TTFT")
    close = sep.strip() if sep.strip() in ("**", "_") else ""
    text = [f"{metric} is {v}{sep}{after}{close} than before.", f"{metric} {before} {v}.", f"{metric} {before} {v} at concurrency 4."][form]
    doc = "# PR\n\n" + text + BOUNDARY
    diags = [d for d in lint(doc, "PR.md", ClaimBoundary(), Coverage(concurrency_levels=(2, 4)), facts) if d.code == "CB201"]
    assert diags == [], (text, diags)


# ---------------------------------------------------------------- levels and "total" beside a rate


def test_max_or_peak_before_a_level_goes_with_the_level(tmp_path, capsys, run):
    """"At max concurrency 4, ... 30.5 req/s" names the level, not a peak rate: the words "max" /
    "peak" left behind when the level was read past made the figure look qualified, and a wrong
    rate went unchecked."""
    lines = ["At max concurrency 4, sim-fast achieved 30.5 req/s.",
             "At peak concurrency 4, sim-fast produced 999.9 tok/s."]
    assert _cb201(tmp_path, capsys, run, lines) == [3, 5]


def test_total_that_does_not_qualify_the_rate_is_not_total_throughput(tmp_path, capsys, run):
    """"In total, output throughput was 8.5 tok/s" and "Total: output throughput was 8.5 tok/s"
    state output throughput (8.53 tok/s): they were read as total throughput, a false CB201. A
    wrong output figure so written is still CB201."""
    ok = ["In total, output throughput across the run was 8.5 tok/s.", "Total: output throughput was 8.5 tok/s."]
    assert _cb201(tmp_path, capsys, run, ok) == []
    assert _cb201(tmp_path, capsys, run, ["In total, output throughput was 443.2 tok/s."]) == [3]
