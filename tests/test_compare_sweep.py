"""`soakspec compare` of two sweeps compares the sweep's own figure, the highest load that held.

A before/after sweep that found 24 rps, then 20 rps, compared as PASS on the per-request rows
of the loads both probed: a capacity regression went unseen. The figure now has its row (JSON
`sweep`), decided on what each bisection knows -- the highest level that holds and the lowest
above it that fails, a step apart -- so a change within one step is not significant, a drop
beyond it FAILs the comparison, and an INCONCLUSIVE probe in either run makes it INCONCLUSIVE.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from soakspec.cli import main
from soakspec.compare import compare
from soakspec.compare.render import render
from soakspec.compare.sweep import SweepFigure, sweep_row
from soakspec.judge.testing import EvidenceBuilder, spec_from_text
from soakspec.runner.load import Bisection

GRID = list(range(1, 33))  # rate = [1rps, 32rps], rate_step = 1rps


def _text(load: str) -> str:
    return ('soak "s" {}\nbackend "b0" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "host-staged"\n  }\n}\n'
            f'workload "w0" {{\n  load {{\n    mode = open\n    {load}\n  }}\n  duration = 2m\n  bucket = 1m\n'
            '  deadline = 30s\n  follow_up = false\n}\n'
            'gate {\n  require p90(ttft) < 200ms per level\n}\n')


SWEEP = _text("rate = [1rps, 32rps]\n    rate_step = 1rps\n    search = bisect\n    max_wall = 2h")


def bisect_probes(capacity: int, grid=GRID) -> list[tuple[int, bool]]:
    """The probes bisection takes over `grid` against a server that holds up to `capacity`."""
    b, out = Bisection(len(grid)), []
    while (i := b.next()) is not None:
        out.append((grid[i], grid[i] <= capacity))
        b.record(i, grid[i] <= capacity)
    return out


def sweep_run(capacity: int, seed: int, *, unsure: int | None = None, grid=GRID) -> EvidenceBuilder:
    """What an open-loop sweep leaves against a server that holds up to `capacity` rps: one level
    per probe, in run order, TTFT 500 ms above the capacity (p90 < 200 ms fails there), and the
    runner's account. `unsure`: that probe's level kept 5 requests (p90 needs 29: too few to
    judge, INCONCLUSIVE), and the runner went on below it as if it failed."""
    probes = bisect_probes(capacity, grid)
    if unsure is not None:  # the search as the runner ran it: the unsure level did not hold
        b, probes = Bisection(len(grid)), []
        while (i := b.next()) is not None:
            held = grid[i] <= capacity and grid[i] != unsure
            probes.append((grid[i], held))
            b.record(i, held)
    plain = spec_from_text(_text(f"rate = [{', '.join(f'{v}rps' for v, _ in probes)}]"))
    b = EvidenceBuilder(plain, per_bucket=20, run_id=f"run{seed}")
    for i, (v, held) in enumerate(probes):
        for r in b.measured("b0", level=i):
            r["first_token"] = r["start"] + (0.05 if v <= capacity else 0.5)  # on disk ttft comes from the times
            r["ttft"] = r["first_token"] - r["start"]
            r["end"] = max(r["end"], r["first_token"] + 0.01)
        if v == unsure:
            gone = {id(r) for r in list(b.measured("b0", level=i))[5:]}
            b.records["b0"] = [r for r in b.records["b0"] if id(r) not in gone]
    b.entry("b0")["sweep"] = {"probes": [{"level": i, "value": v, "passed": held} for i, (v, held) in enumerate(probes)],
                              "bounded_by_wall_time": False}
    return b


def _compare(base: EvidenceBuilder, new: EvidenceBuilder, **kw):
    spec = spec_from_text(SWEEP)
    return compare(base.build(), new.build(), base_spec=spec, new_spec=spec, resamples=200, **kw)


def test_a_capacity_drop_beyond_a_step_fails_the_comparison():
    """24 rps before, 20 after: the per-request rows at the loads both probed see the same
    server below its capacity, and the comparison was PASS. The sweep row says 24 → 20, a
    regression (20's next level, 21, fails below 24), and FAILs it."""
    c = _compare(sweep_run(24, 1), sweep_run(20, 2))
    (sw,) = c.sweeps
    assert (sw.figure, sw.base.result, sw.new.result, sw.change) == ("max_sustainable_rate", 24, 20, -4)
    assert sw.verdict == "regression" and "holds 24 rps, 25 rps fails" in sw.message and "21 rps fails" in sw.message
    assert c.outcome == "FAIL" and c.exit_code == 1
    assert any("sustainable load fell" in r and "holds 24 rps" in r for r in c.reasons), c.reasons
    assert "max_sustainable_rate 24 rps → 20 rps: regression" in c.summary()
    doc = c.to_json()
    (j,) = doc["sweep"]
    assert (j["metric"], j["base"], j["new"], j["verdict"], j["unit"]) == ("max_sustainable_rate", 24, 20, "regression", "rps")
    assert j["base_sweep"]["first_failing"] == 25 and j["base_sweep"]["step"] == 1
    md = render(c, "md")
    assert "### Sweep" in md and "REGRESSION" in md.split("### Sweep")[1].split("### Per level")[0]
    page = render(c, "html")
    assert '<table id="sweep">' in page and '<tr class="regression"><td>b0</td><td>max_sustainable_rate</td>' in page


def test_a_change_within_one_step_is_not_significant_and_a_rise_is_an_improvement():
    same = _compare(sweep_run(24, 1), sweep_run(23, 2))
    (sw,) = same.sweeps
    assert sw.verdict == "no significant change" and "within one step" in sw.message, sw.message
    assert same.outcome == "PASS", same.summary()
    up = _compare(sweep_run(20, 1), sweep_run(24, 2))
    assert up.sweeps[0].verdict == "improvement" and up.outcome == "PASS"


def test_an_inconclusive_probe_in_either_run_makes_the_row_and_the_comparison_inconclusive():
    """The new run's probe at 24 rps had too few requests to judge: bisection went on below it
    as if it failed and found 23 -- within a step of 24, but the figure may be low for want of
    data: INCONCLUSIVE, naming the probe, not a pass."""
    c = _compare(sweep_run(24, 1), sweep_run(30, 2, unsure=24))
    (sw,) = c.sweeps
    assert sw.new.unsure == (24,) and sw.verdict == "inconclusive", sw
    assert "new run's probe at 24 rps could not be judged" in sw.message
    assert c.outcome == "INCONCLUSIVE" and c.exit_code == 3, c.summary()
    # the sweep row alone: every per-level row has data on both sides (few at 24 rps: insufficient samples)
    assert not any(r.verdict == "missing" for r in c.rows)
    assert [r for r in c.reasons if "sweep figures cannot be compared" in r] == list(c.reasons), c.reasons


def test_the_cli_compares_two_sweep_directories_and_json_carries_the_row(tmp_path, capsys):
    spec = tmp_path / "sweep.soak"
    spec.write_text(SWEEP)
    base = sweep_run(24, 1).write(tmp_path / "base")
    new = sweep_run(20, 2).write(tmp_path / "new")
    code = main(["compare", str(base), str(new), "--spec", str(spec), "--format", "json", "--resamples", "200"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdict"] == "FAIL", doc["summary"]
    (j,) = doc["sweep"]
    assert (j["base"], j["new"], j["verdict"]) == (24, 20, "regression")
    assert "max_sustainable_rate 24 rps → 20 rps: regression" in doc["summary"]


def _fig(result, failing, *, step=1.0, lower=None, unsure=()):
    return SweepFigure("b", "w", "rate", result, failing, step, lower, tuple(unsure), 5, f"{result}")


@pytest.mark.parametrize("base, new, verdict", [
    (_fig(24, 25), _fig(20, 21), "regression"),
    (_fig(24, 25), _fig(23, 24), "no significant change"),  # one step: [23, 24] against [24, 25]
    (_fig(24, 26, step=2), _fig(22, 24, step=2), "no significant change"),
    (_fig(24, 26, step=2), _fig(20, 22, step=2), "regression"),
    (_fig(32, None, lower="top"), _fig(32, None, lower="top"), "no significant change"),  # both hold the whole grid
    (_fig(32, None, lower="top"), _fig(20, 21), "regression"),
    (_fig(24, 25), _fig(16, None, lower="next not probed"), "inconclusive"),  # a drop can hide above 16
    (_fig(24, 25), _fig(24, None, lower="next not probed"), "no significant change"),
    (_fig(16, None, lower="next not probed"), _fig(24, 25), "no significant change"),  # a rise it cannot show
    (_fig(None, 1), _fig(None, 1), "no significant change"),  # neither holds its lowest level
    (_fig(24, 25), _fig(None, 1), "regression"),
    (_fig(1, 2), _fig(None, 1), "inconclusive"),  # holds 1 against holds nothing: below 1 is unknown
    (_fig(24, 25, unsure=[28]), _fig(24, 25), "inconclusive"),
])
def test_the_sweep_row_compares_what_each_bisection_knows(base, new, verdict):
    assert sweep_row(base, new, "b", "b").verdict == verdict


@settings(max_examples=60, deadline=None)
@given(cb=st.integers(1, 40), cn=st.integers(1, 40))
def test_the_row_calls_a_regression_exactly_beyond_one_step(cb, cn):
    """Two full bisections of 1..32 against servers of capacity cb and cn (beyond 32: the grid's
    top): a regression exactly when the new one's first failing level is below the base's
    figure -- more than one step lower -- and never a regression when it rose."""
    def fig(c):
        probes = bisect_probes(c)
        held = [v for v, ok in probes if ok]
        fails = [v for v, ok in probes if not ok and (not held or v > max(held))]
        top = bool(held) and max(held) == GRID[-1]
        return _fig(max(held) if held else None, None if top else min(fails), lower="top" if top else None)

    row = sweep_row(fig(cb), fig(cn), "b", "b")
    b, n = min(cb, 32), min(cn, 32)
    assert (row.verdict == "regression") == (n + 1 < b), (cb, cn, row)
    assert (row.verdict == "improvement") == (b + 1 < n), (cb, cn, row)
