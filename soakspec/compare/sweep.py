"""The sweep's own figure in a comparison: the highest load each run sustained, and whether it moved.

    figures(spec, evidence) -> tuple[SweepFigure, ...]   each backend's sweep, re-judged (judge/sweep.py)
    sweep_row(base, new, backend, new_backend) -> SweepRow

Two sweeps compare probe by probe only at the loads both probed (`soakspec.compare.matching`);
the figure the sweep exists for -- `max_sustainable_rate` / `max_sustainable_concurrency`, the
highest probed level that holds -- had no row, so a before/after whose new server sustained 20
rps where the old one sustained 24 compared as PASS on its per-request rows. This is that row.

What a bisection knows. Its answer is a grid level X that holds next to a level F above it that
does not (`judge.sweep`): the boundary lies somewhere in [X, F], known only to within the grid's
step, and each probe's verdict is the gate's own test at the gate's confidence (no interval is
added here: the row is exactly as sure as the probes' judgements). So each run's figure is the
interval [X, F] -- X unknown (below the lowest level) when no level held, F unknown when X is
only a lower bound ("at least X": the grid's highest level, or the next level never probed).

The verdict compares the two intervals, not the two numbers:
    regression               the new run's first failing level is below the base's highest
                             holding one (F_new < X_base): the new server is known to sustain
                             less, by more than one step -- a change of one step (24 -> 23 at
                             step 1: [23, 24] against [24, 25]) is within what the searches can
                             resolve and is not significant
    improvement              the mirror (F_base < X_new)
    no significant change    neither, and no regression beyond a step is hidden by what a run
                             did not find out (an improvement a run's lower bound cannot show is
                             said in the message, and is no reason to doubt the new run)
    inconclusive             a probe of either run was INCONCLUSIVE (too few samples, cut short
                             by an interrupt: bisection went on below it as if it failed, so the
                             figure may be low), no probe ran, the runs swept different axes, or
                             the new run's figure is only a lower bound ("at least 16") below the
                             base's, or it held no level at all while the base held one: a
                             regression beyond a step is possible and not shown

`soakspec.compare.compare` adds one row per backend pair whose runs both swept: a regression
FAILs the comparison (as a significant rise of errors does: a capacity drop is never a pass,
whatever the per-request rows at the loads both probed say), an inconclusive row makes it
INCONCLUSIVE, and a base run's sweep with no sweep in the new run is what the new run lacks.
The row is not one of the bootstrap family (it has no interval at a confidence of its own) and
no `--require` rule names it: the rule syntax is `STAT(METRIC) regression <= N%` of a sampled
statistic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

from soakspec.judge.evidence import Evidence
from soakspec.judge.sweep import figure_name, rejudge, sweep_workload, value_text
from soakspec.plan import workload_sweep

SweepVerdict = Literal["regression", "improvement", "no significant change", "inconclusive"]
_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class SweepFigure:
    """One backend's sweep as the gate re-judges it (`judge.sweep.SweepResult`), with what its
    bisection knows: the highest level that holds, the lowest above it that does not."""

    backend: str
    workload: str
    axis: str  # concurrency | rate
    result: float | None  # the highest probed level that holds; None: none held
    failing: float | None  # the lowest probed level above `result` (any, when None held) that fails
    step: float  # the grid's step
    lower_bound: str | None  # why `result` is only "at least" (judge.sweep)
    unsure: tuple[float, ...]  # the levels of its INCONCLUSIVE probes
    probes: int
    text: str  # the figure as the verdict states it ("at least 16 rps (...)", "none (...)")

    @property
    def unit(self) -> str:
        return " rps" if self.axis == "rate" else ""

    def to_json(self) -> dict[str, Any]:
        return {"result": self.result, "first_failing": self.failing, "step": self.step, "lower_bound": self.lower_bound,
                "inconclusive_probes": list(self.unsure), "probes": self.probes, "text": self.text}


def figures(spec: Any, evidence: Evidence) -> tuple[SweepFigure, ...]:
    """Each backend's sweep of `evidence`, re-judged with `spec` as the gate re-judges it; ()
    when `spec` has no sweep (or is not known)."""
    wl = sweep_workload(spec) if spec is not None else None
    if wl is None:
        return ()
    results = rejudge(spec, evidence)  # the figures only: not `narrow`'s one-level spec and evidence
    grid = workload_sweep(wl).grid
    step = float(grid[1]) - float(grid[0]) if len(grid) > 1 else 0.0
    out = []
    for r in results:
        values = [(float(p["value"]), p.get("status")) for p in r.probes]
        above = [v for v, st in values if st == "fail" and (r.result is None or v > r.result + _EPS)]
        out.append(SweepFigure(
            r.backend, r.workload, r.axis, None if r.result is None else float(r.result),
            # a lower bound has no failing level next above it: nothing above is known
            min(above) if above and r.lower_bound is None else None, step, r.lower_bound,
            tuple(sorted(v for v, st in values if st == "inconclusive")), len(values),
            value_text(r.result, r.lower_bound, r.probes, " rps" if r.axis == "rate" else "")))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """The sweep figure of one backend pair, both runs (module doc)."""

    backend: str
    new_backend: str
    workload: str
    figure: str  # max_sustainable_rate | max_sustainable_concurrency
    unit: str  # " rps" or ""
    base: SweepFigure
    new: SweepFigure
    change: float | None  # new - base, in the figure's unit (None where either has no number)
    relative: float | None  # new / base - 1
    verdict: SweepVerdict
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "new_backend": self.new_backend, "workload": self.workload, "metric": self.figure,
                "unit": self.unit.strip() or None, "base": self.base.result, "new": self.new.result, "change": self.change,
                "relative_change": self.relative, "verdict": self.verdict, "message": self.message,
                "base_sweep": self.base.to_json(), "new_sweep": self.new.to_json()}


def _v(x: float, unit: str) -> str:
    return f"{x:g}{unit}"


def _known(f: SweepFigure, unit: str) -> str:
    """What the bisection knows of one run: "holds 24 rps, 25 rps fails"."""
    if f.result is None:
        return f"holds no level ({_v(f.failing, unit)} fails)" if f.failing is not None else "holds no level"
    if f.failing is None:
        return f"holds {_v(f.result, unit)}, nothing above it shown to fail"
    return f"holds {_v(f.result, unit)}, {_v(f.failing, unit)} fails"


def sweep_row(b: SweepFigure, n: SweepFigure, backend: str, new_backend: str) -> SweepRow:
    """The row and its verdict (module doc): the two runs' [holds, fails] intervals compared."""
    unit = b.unit
    change = n.result - b.result if b.result is not None and n.result is not None else None
    relative = (n.result / b.result - 1.0) if change is not None and b.result else None
    if relative is not None and not math.isfinite(relative):
        relative = None

    def row(verdict: SweepVerdict, message: str) -> SweepRow:
        return SweepRow(backend, new_backend, b.workload, figure_name(b.axis), unit, b, n, change, relative, verdict, message)

    if b.axis != n.axis:
        return row("inconclusive", f"the base run sweeps {b.axis}, the new run {n.axis}: the figures are not of one load")
    unsure = [f"the {which} run's probe at {', '.join(_v(v, unit) for v in f.unsure)} could not be judged (INCONCLUSIVE)"
              for which, f in (("base", b), ("new", n)) if f.unsure]
    if unsure:
        return row("inconclusive", "; ".join(unsure) + ": the search went on below it as if it failed, so the figure may be "
                   "low; lengthen the probes")
    empty = [which for which, f in (("base", b), ("new", n)) if not f.probes]
    if empty:
        return row("inconclusive", f"no probe ran in the {' and '.join(empty)} run")
    step = max(b.step, n.step)
    known = f"base {_known(b, unit)}; new {_known(n, unit)}"
    if n.failing is not None and b.result is not None and n.failing < b.result - _EPS:
        return row("regression", f"{known}: the new run sustains less, by more than one step ({_v(step, unit)})")
    if b.failing is not None and n.result is not None and b.failing < n.result - _EPS:
        return row("improvement", f"{known}: the new run sustains more, by more than one step ({_v(step, unit)})")
    if b.result is not None and (n.result is None or (n.failing is None and n.result + n.step < b.result - _EPS)):
        why = ("it holds no level, where the base run holds one" if n.result is None else
               f"its figure is only a lower bound ({n.lower_bound}), below the base's")
        return row("inconclusive", f"{known}: a regression beyond one step cannot be excluded in the new run: {why}")
    note = ""
    if n.result is not None and (b.result is None or (b.failing is None and b.result + b.step < n.result - _EPS)):
        note = "; an improvement cannot be shown: the base run's figure " + (
            "is none" if b.result is None else f"is only a lower bound ({b.lower_bound})")
    if b.result is None and n.result is None:
        return row("no significant change", f"{known}: neither run holds a level, nothing to compare")
    return row("no significant change", f"{known}: within one step ({_v(step, unit)}), what a bisection resolves{note}")


def pair_rows(base: Mapping[str, SweepFigure], new: Mapping[str, SweepFigure],
              pairs: list[tuple[str, str]]) -> tuple[list[SweepRow], list[str], list[str]]:
    """(rows, reasons to be INCONCLUSIVE, notes) for the paired backends (base name, new name):
    a row where both runs swept; the base's sweep without the new's is what the new run lacks."""
    rows, unsure, notes = [], [], []
    for bn, nn in pairs:
        b, n = base.get(bn), new.get(nn)
        if b is not None and n is not None:
            rows.append(sweep_row(b, n, bn, nn))
        elif b is not None:
            unsure.append(f"the new run has no sweep figure where the base run's sweep found {figure_name(b.axis)} = {b.text} "
                          f"(backend {bn!r}): a capacity not measured is never a pass")
        elif n is not None:
            notes.append(f"only the new run sweeps backend {nn!r} ({figure_name(n.axis)} = {n.text}): no sweep figure to compare")
    return rows, unsure, notes


__all__ = ["SweepFigure", "SweepRow", "figures", "pair_rows", "sweep_row"]
