"""Before/after with statistics: `compare(base, new) -> Comparison` (pure, deterministic).

    compare(base: Evidence | RunSamples, new: Evidence | RunSamples, *, confidence, rules, resamples,
            seed, allow_rehearsal, workload_change, base_spec, new_spec) -> Comparison
    RunSamples.read(ev, keep=False)        a run's samples read up front (its table can go)
    parse_rule(text) -> CompareRule        `require p99(ttft) regression <= 5%` (command line)
    rules_of(spec) -> tuple[CompareRule]   a spec's `compare { require regression(p99(ttft)) <= 5% }`
    Comparison.to_json() / soakspec.compare.render.render(comparison, fmt)

The package, one way down (each module opens with the part of the design it implements):
    intervals.py   pure numerics: `Sorted`, the percentile bootstrap, Fieller's and Newcombe's
                   intervals, the family-wise confidence, design effects (Resamples, Means,
                   Binned gaps, Confidence, Independence)
    metrics.py     what is compared: `METRICS`, `TURN_METRICS` (Rows, From the send, Turns)
    rules.py       the compare rules: `parse_rule`, `rules_of`
    samples.py     what is read of each run: `RunSamples`, `Side`, `ClientHealth` (Samples)
    matching.py    backends and levels paired, `Unpaired`, what the new run lacks (Matching)
    rows.py        each `Row`: its values, change, interval and verdict (Errors, Statistic,
                   Verdict per row)
    judging.py     the rules over the rows, the client-health and lag checks, abort rises (Rules)
    sweep.py       two sweeps' figures; render.py the outputs
    __init__.py    `compare()` and its `Comparison` (Comparable runs, below); the names in
                   `__all__` are re-exported here

Comparable runs. A rehearsal (`run --rehearse`: every backend replaced by the simulator) or a
time-scaled run (`run --time-scale`: every duration, bucket and deadline shrunk), on either
side, makes the comparison INCONCLUSIVE with the reason, as the gate's `full_scale_run` makes
such a run INCONCLUSIVE: a scaled run never passes a real gate, and a before/after of one says
nothing about the real backends at full duration. The manifest records both (`rehearsal`,
`time_scale`; `Side` carries them). Where the spec in use (`--spec`, else the new run's) sets
`gate { allow_rehearsal = true }` -- the gate's own escape -- two runs scaled alike (both
rehearsals or neither, the same time scale) are compared, with a note; a rehearsal against a
real run never is.

The workload, too: a change of latency between two runs that sent different requests may be
the workload's, not the server's. For each compared workload the requests' shape as the runs
ran it (their embedded specs, whatever `--spec` judges with: `workload_shape`) -- model and
served name, endpoint, stream, the prompt (words, exact token lengths and shared prefix, a
prompt file by its content hash, a replay trace's lengths, multi-turn), max_tokens, ignore_eos,
sampling and extra body fields -- is compared; durations, buckets, deadlines and loads are
not (levels pair by load; a phase whose load changed says so per row). Each difference is
stated (`Comparison.workload_differences`, JSON `workload_differences`) and makes the
comparison INCONCLUSIVE, unless the caller says the change of workload is the point
(`workload_change`, `--allow-workload-change`): then it is a note and the rows and rules
decide. A run whose embedded spec cannot be read leaves a note and nothing compared. A
backend reached by another network path in the two runs (`network_path`: loopback or another
host, its own socket or a port forward) is a note, not a verdict: the path's latency is in every
TTFT and latency row, and a comparison across machines is still a comparison."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from soakspec.compare.intervals import (DEFAULT_RESAMPLES, MIN_TAIL_DRAWS, Sorted, family_confidence, mean_draws,
                                        mean_ratio_interval, min_resamples, percentile_draws, proportion_difference, wilson)
from soakspec.compare.judging import (RuleOutcome, _abort_rises, _client_blocked, _judge_rule, _lag_decided, _missing,
                                      _share)
from soakspec.compare.matching import Unpaired, _lacking, _level_pairs, _load, _pairs, _path_notes, _warmup_notes
from soakspec.compare.metrics import BY_NAME, METRICS, CompareMetric
from soakspec.compare.rows import Row, _Pending, _rows, _turn_pending, signed_percent
from soakspec.compare.rules import CompareRule, RuleError, parse_rule, rules_of
from soakspec.compare.samples import _RAN, RunSamples, Side
from soakspec.compare.sweep import SweepRow, pair_rows
from soakspec.exitcodes import ExitCode
from soakspec.judge.evidence import Evidence
from soakspec.judge.index import capped
from soakspec.judge.workload import workload_differences, workload_shape  # noqa: F401  (workload_shape: read from here too)

SCHEMA_VERSION = 1
Outcome = Literal["PASS", "FAIL", "INCONCLUSIVE"]


@dataclasses.dataclass(frozen=True)
class Comparison:
    base: Side
    new: Side
    confidence: float
    resamples: int  # the draws per side each bootstrap row used (compare/intervals.py, "Resamples")
    seed: int
    rows: tuple[Row, ...]
    rules: tuple[RuleOutcome, ...]
    notes: tuple[str, ...]
    outcome: Outcome
    unpaired: tuple[Unpaired, ...] = ()  # levels with no counterpart of the same load (compare/matching.py)
    reasons: tuple[str, ...] = ()  # what, besides the rules, makes the outcome FAIL or INCONCLUSIVE
    workload_differences: tuple[str, ...] = ()  # per compared workload, how its requests differ (module doc)
    resamples_requested: int | None = None  # what the caller asked for (None: the default), when it was fewer
    sweeps: tuple[SweepRow, ...] = ()  # the sweep figure of each backend pair both runs swept (compare/sweep.py)

    @property
    def exit_code(self) -> ExitCode:
        return {"PASS": ExitCode.OK, "FAIL": ExitCode.GATE_FAILED, "INCONCLUSIVE": ExitCode.INCONCLUSIVE}[self.outcome]

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = {}
        for r in self.rows:
            c[r.verdict] = c.get(r.verdict, 0) + 1
        return c

    def summary(self) -> str:
        c = self.counts()
        parts = [f"{c[k]} {k}" for k in ("regression", "improvement", "no significant change", "insufficient samples", "missing") if c.get(k)]
        text = f"{self.outcome}: {len(self.rows)} rows ({', '.join(parts) or 'none'}) at {self.confidence * 100:g}% confidence"
        for sw in self.sweeps:
            text += f"; {sw.figure} {sw.base.text} → {sw.new.text}: {sw.verdict}"
        if self.unpaired:
            k = len(self.unpaired)
            text += f"; {k} unpaired level{'s' if k != 1 else ''}"
        bad = [r.rule.text() for r in self.rules if r.status not in ("pass", "warn")]
        if bad:
            text += "; rules not passing: " + "; ".join(bad)
        warned = [r.rule.text() for r in self.rules if r.status == "warn"]
        if warned:
            text += f"; {len(warned)} warning{'s' if len(warned) != 1 else ''}: " + "; ".join(warned)
        for r in self.reasons:
            text += "; " + r
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "comparison",
            "verdict": self.outcome,
            "exit_code": int(self.exit_code),
            "summary": self.summary(),
            "confidence": self.confidence,
            "method": {"interval": "bootstrap percentile interval of new/base - 1",
                       "percentiles": "exact order-statistic bootstrap (Beta draws), type-7 interpolation",
                       "means": "Fieller t interval of the ratio of the mean over buckets (Welch df)",
                       "proportions": "Newcombe hybrid score interval of new - base, each side's requests and failures "
                                      "divided by the design effect of their outcomes in start order (batch means)",
                       "resamples": self.resamples,
                       "resamples_requested": self.resamples_requested, "min_tail_draws": MIN_TAIL_DRAWS, "seed": self.seed,
                       "family_wise": "Bonferroni over the rows", "family_rows": len(self.rows),
                       "binned": "itl gaps counted in bins: each draw's percentile at its bins' least and greatest, "
                                 "the interval over the least and greatest changes they allow"},
            "base": self.base.to_json(),
            "new": self.new.to_json(),
            "rows": [r.to_json() for r in self.rows],
            "rules": [r.to_json() for r in self.rules],
            "reasons": list(self.reasons),
            "workload_differences": list(self.workload_differences),
            "notes": list(self.notes),
            "unpaired": [u.to_json() for u in self.unpaired],
            "sweep": [sw.to_json() for sw in self.sweeps],
        }


def _full_scale(sb: Side, sn: Side, allow_rehearsal: bool, notes: list[str]) -> list[str]:
    """Why a rehearsal or a time-scaled run on either side makes the comparison INCONCLUSIVE
    (module doc, "Comparable runs"); a note instead where the spec allows rehearsals and both
    runs were scaled alike."""
    scaled = [(which, s.scaled()) for s, which in ((sb, "base"), (sn, "new")) if s.scaled()]
    if not scaled:
        return []
    said = "; ".join(f"the {which} run is {what}" for which, what in scaled)
    alike = (sb.rehearsal, sb.time_scale, sb.bad_time_scale) == (sn.rehearsal, sn.time_scale, sn.bad_time_scale)
    if allow_rehearsal and alike and not sb.bad_time_scale:
        notes.append(f"{said}: compared as the spec allows rehearsals (allow_rehearsal); "
                     f"{'it says' if len(scaled) == 1 else 'they say'} nothing about the real backends at full duration")
        return []
    why = ("a scaled run never passes a real gate"
           + ("" if alike else "; and the two runs are not scaled alike") if allow_rehearsal else
           "a scaled run never passes a real gate (with gate { allow_rehearsal = true }, two runs scaled alike compare)")
    them = "it says" if len(scaled) == 1 else "they say"
    return [f"{said}: {them} nothing about the real backends at full duration, and {why}"]


def _workload_differences(base_spec: Any, new_spec: Any, workloads: Sequence[str], notes: list[str]) -> list[str]:
    """Each compared workload whose requests differ between the runs: 'workload "w": prompt 16
    words → 512 words; max_tokens 16 → 64'."""
    if base_spec is None or new_spec is None:
        which = " and ".join(w for w, sp in (("base", base_spec), ("new", new_spec)) if sp is None)
        notes.append(f"the {which} run's embedded spec cannot be read: whether the runs sent the same requests is not known")
        return []
    return workload_differences(base_spec, new_spec, workloads)


def compare(base: Evidence | RunSamples, new: Evidence | RunSamples, *, base_dir: str = "base", new_dir: str = "new",
            confidence: float = 0.95, rules: Sequence[CompareRule] = (), resamples: int | None = None,
            seed: int = 0, allow_rehearsal: bool = False, workload_change: bool = False,
            base_spec: Any = None, new_spec: Any = None, judged_with: tuple[Any, Any] | None = None) -> Comparison:
    """Compare two runs' evidence (pure: same inputs, same comparison). `allow_rehearsal`: the
    spec in use says `gate { allow_rehearsal = true }`; `workload_change`: a different workload
    is the point of the comparison (module doc, "Comparable runs"). `base_spec`, `new_spec`: the
    specs the runs ran, where the caller has them (else read from the manifests). `resamples`:
    the bootstrap draws per side, raised to what the rows need (`min_resamples`, a note says
    so); None: DEFAULT_RESAMPLES, or more where the rows need more. `judged_with`: the spec each
    side is judged with (`--spec`, else its own), by which its stored conclusions -- outcomes, a
    server's trace errors, usage that contradicts the stream -- are re-derived as the gate
    re-derives them (`judge.joined.rederived`), so that each row's number is the one results.json
    and the report show; None: the specs the runs ran (a side with none is read as stored).
    Either run may be given already read (`RunSamples.read`: the command reads the base run's
    samples and lets its table go before it reads the new run); `base_dir`, `base_spec` and
    `judged_with`'s first are then those it was read with, and likewise for the new run."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    notes: list[str] = []
    # each side joined as the gate joins it (its records re-derived), every sweep probe kept
    read = [r if isinstance(r, RunSamples) else RunSamples.read(r, dir=d, judge=judged_with[k] if judged_with is not None else _RAN, ran=sp)
            for k, (r, d, sp) in enumerate(((base, base_dir, base_spec), (new, new_dir, new_spec)))]
    sb, sn = read[0].side, read[1].side
    ran = (read[0].ran, read[1].ran)
    health = [r.health for r in read]
    pending: list[_Pending] = []
    unpaired: list[Unpaired] = []
    workloads: list[str] = []
    backend_pairs = _pairs(read[0].backends, read[1].backends, notes)
    _path_notes(backend_pairs, notes)
    for bb, bn in backend_pairs:
        level_pairs, alone = _level_pairs(bb, bn)
        unpaired += alone
        _warmup_notes(bb.name, level_pairs, notes)
        for a, z in level_pairs:
            workloads.append(a.workload)
            note = f"load differs: base {_load(a)}, new {_load(z)}" if _load(a) != _load(z) else None  # a phase's
            for cm in METRICS:
                if cm.capped_only and not (capped(a.entry) and capped(z.entry)):
                    continue  # sent_ttft is ttft where uncapped; a cap on one side only (compare/metrics.py, "From the send")
                wanted = list(cm.stats) + [r.stat for r in rules if r.metric == cm.name and r.stat not in cm.stats]
                for stat in dict.fromkeys(wanted):
                    pending.append(_Pending((bb.name, bn.name, a.workload, a.index, cm.name, stat), a, z, cm, stat, note))
            pending += _turn_pending(bb.name, bn.name, a, z, note, notes)
    m = max(1, len(pending))
    row_conf = family_confidence(confidence, m)
    need = min_resamples(m, confidence)
    asked = resamples
    if resamples is None:
        resamples = max(DEFAULT_RESAMPLES, need)
    elif resamples < need:
        resamples = need
        notes.append(f"resamples raised from {asked} to {need}: a {confidence * 100:g}% family-wise interval over {m} rows "
                     f"leaves {(1 - confidence) / (2 * m) * 100:.3g}% of the draws beyond each end of a row's interval, "
                     f"and each end needs at least {MIN_TAIL_DRAWS} draws to stand on")
    rows = tuple(_rows(pending, confidence, row_conf, resamples, seed))
    judged = all(r.client_judged for r in read)  # `client_healthy = false` in either run's gate: as measured, as the gate
    outcomes = tuple(_judge_rule(r, rows, _client_blocked(r, rows, health),
                                 _lag_decided(r, rows, pending, (confidence, row_conf, resamples, seed), notes, judged))
                     for r in rules)
    req = [o for o in outcomes if o.rule.severity == "require"]
    fails: list[str] = []  # reasons to FAIL besides the rules
    unsure: list[str] = []  # reasons to be INCONCLUSIVE besides the rules
    if not any(r.metric == "errors" for r in rules):  # a rule on ratio(errors) says how much rise matters
        rose = [r for r in rows if r.metric == "errors" and r.verdict == "regression"]
        rose, cut = _abort_rises(rose, pending, row_conf)
        unsure += cut
        if rose:
            fails.append("unsuccessful requests rose significantly: " + "; ".join(
                f"{r.backend} {r.label} {_share(r.base)} → {_share(r.new)} "
                f"({signed_percent(r.low or 0, ' pp')} .. {signed_percent(r.high or 0, ' pp')})" for r in rose))
    unsure += _full_scale(sb, sn, allow_rehearsal, notes) + _missing(rows)
    unsure += _lacking(read[0].backends, backend_pairs, unpaired)
    sweeps, lacks, said = pair_rows({f.backend: f for f in read[0].sweeps}, {f.backend: f for f in read[1].sweeps},
                                    [(bb.name, bn.name) for bb, bn in backend_pairs])
    notes += said
    unsure += lacks
    for sw in sweeps:  # the sweep's own figure (compare/sweep.py): a capacity drop beyond a step is never a pass
        if sw.verdict == "regression":
            fails.append(f"the sustainable load fell: {sw.backend} {sw.message}")
        elif sw.verdict == "inconclusive":
            unsure.append(f"the sweep figures cannot be compared: {sw.backend} {sw.message}")
    differ: list[str] = []
    if workloads:
        differ = _workload_differences(ran[0], ran[1], workloads, notes)
    if differ and workload_change:
        notes.append("the runs sent different requests, compared as asked (--allow-workload-change): " + " / ".join(differ))
    elif differ:
        unsure.append("the runs sent different requests (" + " / ".join(differ) + "): a change of latency may be the "
                      "workload's, not the server's (--allow-workload-change compares them when that is the point)")
    if not (sb.verified and sn.verified) or any(o.status == "fail" for o in req) or fails:
        outcome: Outcome = "FAIL"
    elif not rows or sb.incomplete or sn.incomplete or any(o.status == "inconclusive" for o in req) or unsure:
        outcome = "INCONCLUSIVE"
    else:
        outcome = "PASS"
    for s, which in ((sb, "base"), (sn, "new")):
        if not s.verified:
            notes.append(f"the {which} run's evidence does not verify: " + ("; ".join(s.problems) or "not hash-verified"))
        if s.incomplete:
            notes.append(f"the {which} run is incomplete: " + "; ".join(s.incomplete))
    if not rows:
        notes.append("nothing to compare: no backend and level in common")
    if sb.manifest_sha256 is not None and sb.manifest_sha256 == sn.manifest_sha256:
        notes.append(f"the base and new runs are the same run (manifest sha256 {sb.manifest_sha256[:12]}): every row "
                     "compares it with itself")
    return Comparison(sb, sn, confidence, resamples, seed, rows, outcomes, tuple(notes), outcome, tuple(unpaired),
                      tuple(fails + unsure), tuple(differ), asked if asked is not None and asked < resamples else None,
                      tuple(sweeps))


__all__ = ["BY_NAME", "METRICS", "CompareMetric", "CompareRule", "Comparison", "Row", "RuleError", "RuleOutcome", "RunSamples",
           "SweepRow", "proportion_difference", "wilson",
           "Side", "Sorted", "Unpaired", "compare", "family_confidence", "mean_draws", "mean_ratio_interval", "parse_rule", "percentile_draws", "rules_of"]
