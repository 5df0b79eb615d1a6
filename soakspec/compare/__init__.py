"""Before/after with statistics: `compare(base, new) -> Comparison` (pure, deterministic).

    compare(base: Evidence | RunSamples, new: Evidence | RunSamples, *, confidence, rules, resamples,
            seed, allow_rehearsal, workload_change, base_spec, new_spec) -> Comparison
    RunSamples.read(ev, keep=False)        a run's samples read up front (its table can go)
    parse_rule(text) -> CompareRule        `require p99(ttft) regression <= 5%` (command line)
    rules_of(spec) -> tuple[CompareRule]   a spec's `compare { require regression(p99(ttft)) <= 5% }`
    Comparison.to_json() / soakspec.compare.render.render(comparison, fmt)

Errors. `ratio(errors)`'s change is the difference `new - base` of the two shares, in
percentage points (a base share of 0, the usual one, has no ratio), and its interval is
Newcombe's hybrid score interval of a difference of two independent proportions (each side's
Wilson interval, combined; Newcombe 1998, method 10) at the row's confidence: no resampling,
and it keeps its coverage at shares of 0 and 1, where the normal approximation does not. Each
measured request is one trial -- divided by the share's design effect where failures come in
bursts ("Independence"): k / d failures of n / d trials.

Statistic: the relative change `new / base - 1` of the row's statistic, with a confidence
interval from a seeded, deterministic bootstrap (percentile interval, `resamples` draws per
side, `random.Random(seed)` derived per row so rows do not depend on each other's order); a
mean over buckets from Fieller's t interval instead ("Means" below).

Verdict per row (direction: for errors and the durations higher is worse; for qps and
throughput lower is worse):
    regression               the whole interval is on the worse side of 0
    improvement              the whole interval is on the better side of 0
    no significant change    the interval contains 0
    insufficient samples     either side has fewer samples than the statistic needs:
                             `min_samples_for_percentile(q, confidence)` for a percentile
                             (59 for p95, 299 for p99 at 95 %), MIN_BUCKETS buckets for a mean
    missing                  the metric has no value on a side (no completed request; for
                             errors, no measured request). A row with a value on one side
                             only makes the comparison INCONCLUSIVE, rules or none: missing
                             data is never a pass (`Comparison.reasons` lists the rows). A row
                             neither run has a value for (a metric the workload does not
                             produce) decides nothing; a rule that asks for it is inconclusive

Rules (`require|warn STAT(METRIC) regression <= N%`): over every matched row of that metric
and statistic, `regression` is the change towards worse (positive = worse). A row passes when
its interval's upper end is at most N %, fails when its lower end is above N %, and is
inconclusive otherwise (the samples cannot tell) or with insufficient samples; a rule on a
timing figure (ttft, itl, tpot, latency, qps, throughput) whose row fails at a level where
either run's load generator did not keep up (a bucket of it the gate's client_healthy finds
saturated; every level where it cannot say which: no client.jsonl, requests never sent) is
inconclusive there, as the gate makes a FAIL that overlaps such a bucket: the change may be the
client's own lag. A failing row of a level where both kept up still FAILs the rule -- except a
ttft or latency row of an open-loop level without max_concurrency in both runs whose same
statistic from the actual send (sent_ttft, sent_latency) does not fail the limit: the new run's
client was later, the server was not slower, and the rule is INCONCLUSIVE there (`_lag_decided`). The rule takes
the worst row; a `warn` rule that fails is WARN (status "warn", as `gate` writes it) and
never changes the outcome. `ratio(errors) regression <= 1%` bounds the rise of the share of
unsuccessful requests in percentage points. Without a rule on ratio(errors), a significant rise
(an errors row whose verdict is regression) FAILs the comparison by itself: more failures is
never a pass, whatever the completed requests' latencies say (`Comparison.reasons` says which
level) -- except a rise only by the requests a run's runner cancelled in flight when it was
interrupted (disconnected, "the run was aborted before the response finished": the interrupt's,
not the server's), which makes the comparison INCONCLUSIVE (that run is incomplete). A rule on
ratio(errors) -- `warn` too -- replaces that built-in: it is how a reviewer says how much rise
matters. Outcome: FAIL when a `require` rule fails, a run's evidence does
not verify or errors rose (above); INCONCLUSIVE when a require rule is inconclusive, a run is
incomplete, a row has data on one side only, the new run lacks a backend or (not a sweep's)
level the base run measured, or nothing could be matched; else PASS. Without rules the comparison only reports
(PASS = both runs verified, errors did not rise).

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
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, Literal


from soakspec.evidence.record import CANCELLED_BY_ABORT
from soakspec.exitcodes import ExitCode
from soakspec.judge import stats
from soakspec.judge.common import Kind, fold, format_value
from soakspec.judge.evidence import Evidence
from soakspec.judge.index import capped
from soakspec.compare.sweep import SweepRow, pair_rows
from soakspec.judge.workload import ran_spec, workload_differences, workload_shape  # noqa: F401  (workload_shape: read from here too)
from soakspec.compare.intervals import DEFAULT_RESAMPLES, MIN_TAIL_DRAWS, Sorted, percentile_draws, mean_ratio_interval, mean_draws, _seed, _relative, DesignEffects, effective, _binned_interval, wilson, proportion_difference, family_confidence, min_resamples
from soakspec.compare.metrics import CompareMetric, METRICS, BY_NAME, TURN_METRICS, MAX_TURNS, _q
from soakspec.compare.rules import CompareRule, RuleError, parse_rule, rules_of
from soakspec.compare.samples import Side, Samples, _RAN, _LevelSamples, LevelSamples, RunSamples, _open_uncapped, LAG_P50, ClientHealth
from soakspec.compare.matching import Unpaired, _pairs, _path_notes, _warmup_notes, _lacking, _load, _level_pairs

SCHEMA_VERSION = 1
MIN_BUCKETS = 4
Outcome = Literal["PASS", "FAIL", "INCONCLUSIVE"]
RowVerdict = Literal["regression", "improvement", "no significant change", "insufficient samples", "missing"]


# ------------------------------------------------------------------------------ rules


# ------------------------------------------------------------------------------ bootstrap


# ------------------------------------------------------------------------------ the comparison


@dataclasses.dataclass(frozen=True)
class Row:
    backend: str  # the base's backend name (the new one's in new_backend when renamed)
    new_backend: str
    workload: str
    level: int
    label: str
    metric: str
    stat: str
    unit: str
    base: float | None
    new: float | None
    n_base: int  # the samples the sample-size rule and the interval rest on (itl: effective requests; a percentile's
    #              interval resamples fewer where requests close in time are not independent: the note says how many)
    n_new: int
    need: int
    change: float | None  # new / base - 1; a proportion's (`absolute`): new - base
    low: float | None  # interval of the change
    high: float | None
    row_confidence: float
    verdict: RowVerdict
    note: str | None = None
    new_level: int | None = None  # the new run's index of the paired level (`level` is the base's)
    gaps_base: int | None = None  # itl: the inter-token gaps the statistic is computed over (None for other metrics)
    gaps_new: int | None = None
    turn: int | None = None  # a multi-turn level's row over one user turn's requests (MAX_TURNS + 1: every later turn)

    @property
    def where(self) -> str:
        """The level, and the turn of a per-turn row: `concurrency 4 · turn 2`."""
        if self.turn is None:
            return self.label
        return f"{self.label} · turn {self.turn}" + ("+" if self.turn > MAX_TURNS else "")

    @property
    def higher_is_worse(self) -> bool:
        return BY_NAME[self.metric].higher_is_worse

    @property
    def absolute(self) -> bool:
        """The change and its interval are a difference of shares (percentage points), not a
        relative change: a share of 0 in the base (the usual share of errors) has no ratio."""
        return BY_NAME[self.metric].kind == "proportion"

    def regression_interval(self) -> tuple[float, float] | None:
        """The interval of the change towards worse (positive = worse)."""
        if self.low is None or self.high is None:
            return None
        return (self.low, self.high) if self.higher_is_worse else (-self.high, -self.low)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "new_backend": self.new_backend, "workload": self.workload, "level": self.level,
            "label": self.label, "metric": self.metric, "stat": self.stat, "unit": self.unit,
            "base": self.base, "new": self.new, "n_base": self.n_base, "n_new": self.n_new, "samples_needed": self.need,
            "change": self.change, "change_kind": "difference" if self.absolute else "relative", "ci_low": self.low, "ci_high": self.high, "row_confidence": self.row_confidence,
            "verdict": self.verdict, "note": self.note, "new_level": self.new_level,
            "gaps_base": self.gaps_base, "gaps_new": self.gaps_new, "turn": self.turn,
        }


@dataclasses.dataclass(frozen=True)
class RuleOutcome:
    rule: CompareRule
    status: Literal["pass", "fail", "inconclusive", "warn"]  # warn: a warn rule that does not hold
    message: str
    rows: tuple[int, ...]  # indexes into Comparison.rows

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule.text(), "severity": self.rule.severity, "status": self.status, "message": self.message,
                "rows": list(self.rows)}


@dataclasses.dataclass(frozen=True)
class Comparison:
    base: Side
    new: Side
    confidence: float
    resamples: int  # the draws per side each bootstrap row used (module doc, "Resamples")
    seed: int
    rows: tuple[Row, ...]
    rules: tuple[RuleOutcome, ...]
    notes: tuple[str, ...]
    outcome: Outcome
    unpaired: tuple[Unpaired, ...] = ()  # levels with no counterpart of the same load (module doc)
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


def signed_percent(v: float, unit: str = "%") -> str:
    """`v` (a fraction) as a signed percentage to 0.1 -- with more digits where 0.1 would show a
    change that is not 0 as "+0.0" or "-0.0" (an interval "+0.0% .. +4.5%" beside a REGRESSION,
    whose low end is above 0), up to 4 significant digits."""
    x = v * 100
    text = f"{x:+.1f}"
    if x != 0 and float(text) == 0:
        text = f"{x:+.2g}"
    return text + unit


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


@dataclasses.dataclass(frozen=True)
class _Pending:
    key: tuple[Any, ...]  # (backend, new backend, workload, level, metric, stat[, turn]): the row's seed
    base_lv: LevelSamples
    new_lv: LevelSamples
    cm: CompareMetric
    stat: str
    note: str | None
    turn: int | None = None

    def sides(self) -> tuple[Samples, Samples]:
        if self.turn is None:
            return self.base_lv.samples[self.cm.name], self.new_lv.samples[self.cm.name]
        return self.base_lv.turns[self.turn][self.cm.name], self.new_lv.turns[self.turn][self.cm.name]


def _row(p: _Pending, confidence: float, row_conf: float, resamples: int, seed: int,
         sides: tuple[Samples, Samples] | None = None) -> Row:
    cm, stat = p.cm, p.stat
    backend, new_backend, workload, level = p.key[0], p.key[1], p.key[2], p.key[3]
    label = p.base_lv.label
    q = _q(stat)
    need = stats.min_samples_for_percentile(q, confidence) if q is not None else MIN_BUCKETS
    common = dict(backend=backend, new_backend=new_backend, workload=workload, level=level, label=label,
                  metric=cm.name, stat=stat, unit=cm.unit, need=need, row_confidence=row_conf, new_level=p.new_lv.index,
                  turn=p.turn)
    if sides is None:
        sides = p.sides()
    if cm.kind == "proportion":
        return _proportion_row(common, sides, row_conf, p.note)
    (xb, eb), (xn, en) = (s[:2] for s in sides)
    rb, rn = (s[2] if len(s) > 2 else s[1] for s in sides)  # itl: the requests, eb / en their effective number
    fb, fn = ((s[3] if len(s) > 3 else DesignEffects.NONE).at(q) if q is not None else 1.0 for s in sides)

    def point(xs: Any) -> float | None:
        if not len(xs):
            return None
        return xs.percentile(q) if q is not None else stats.mean(xs)

    b, n = point(xb), point(xn)
    change = _relative(n, b) if b is not None and n is not None else None
    note = p.note
    gaps: dict[str, int | None] = dict(gaps_base=None, gaps_new=None)
    if cm.per_request_samples:  # n counts requests, the statistic is over their gaps
        gaps = dict(gaps_base=len(xb), gaps_new=len(xn))
        if (eb, en) != (rb, rn):  # requests of unequal lengths
            said = (f"interval from the effective {eb} / {en} of {rb} / {rn} requests ({len(xb)} / {len(xn)} gaps): one "
                    "request's gaps are not independent, and a long request's many gaps count as one request's worth")
        else:
            said = f"interval from {eb} / {en} requests ({len(xb)} / {len(xn)} gaps): one request's gaps are not independent"
        if (eb, en) != (len(xb), len(xn)):
            note = "; ".join(x for x in (note, said) if x)
    sizes = (eb, en)  # the resamples' sizes: an m-out-of-n bootstrap where the draws are not independent
    if not cm.per_request_samples and (fb > 1.0 or fn > 1.0):  # requests close in time: module doc, "Independence"
        sizes = (effective(eb, fb), effective(en, fn))
        said = (f"interval from the effective {sizes[0]} / {sizes[1]} of {rb} / {rn} requests: requests close in time "
                f"are not independent (design effect {fb:.2g} / {fn:.2g} at p{q:g}, from consecutive requests in start order)")
        note = "; ".join(x for x in (note, said) if x)
    base_row = dict(common, base=b, new=n, n_base=eb, n_new=en, change=change, note=note, **gaps)
    if not len(xb) or not len(xn):
        return Row(**base_row, low=None, high=None, verdict="missing")  # type: ignore[arg-type]
    if eb < need or en < need:
        return Row(**base_row, low=None, high=None, verdict="insufficient samples")  # type: ignore[arg-type]
    if q is None:  # a mean over buckets: Fieller's t interval, no resampling (module doc, "Means")
        iv = mean_ratio_interval(xb, xn, row_conf)
        if iv is None:  # the base's mean is not distinguishable from 0: no relative change
            return Row(**base_row, low=None, high=None, verdict="insufficient samples")  # type: ignore[arg-type]
        low, high = iv
    else:
        rng = random.Random(_seed(seed, p.key))
        alpha = 1.0 - row_conf
        if _binned(xb) or _binned(xn):  # each draw's change known within the bins (module doc, "Binned gaps")
            iv = _binned_interval(xb, xn, q, rng, resamples, sizes, alpha)
            if iv is None:
                return Row(**base_row, low=None, high=None, verdict="insufficient samples")  # type: ignore[arg-type]
            low, high = iv
            base_row["note"] = "; ".join(x for x in (base_row["note"], BINNED_NOTE) if x)
        else:
            db, dn = percentile_draws(xb, q, rng, resamples, sizes[0]), percentile_draws(xn, q, rng, resamples, sizes[1])
            rel = [v for x, y in zip(db, dn) if (v := _relative(y, x)) is not None]
            if len(rel) < resamples * (1 - alpha / 2):  # a base statistic of 0 too often: no relative change
                return Row(**base_row, low=None, high=None, verdict="insufficient samples")  # type: ignore[arg-type]
            lo_, hi_ = stats.percentile(rel, 100 * alpha / 2), stats.percentile(rel, 100 * (1 - alpha / 2))
            assert lo_ is not None and hi_ is not None
            low, high = lo_, hi_
    if low > 0:
        verdict: RowVerdict = "regression" if cm.higher_is_worse else "improvement"
    elif high < 0:
        verdict = "improvement" if cm.higher_is_worse else "regression"
    else:
        verdict = "no significant change"
    return Row(**base_row, low=low, high=high, verdict=verdict)  # type: ignore[arg-type]


BINNED_NOTE = ("gaps counted in bins (a real server's spread, at most 0.2 % of a gap wide): the figures are bin "
               "midpoints, and the interval holds every change the bins allow")


def _binned(xs: Any) -> bool:
    return isinstance(xs, Sorted) and xs.binned


def _proportion_row(common: dict[str, Any], sides: tuple[Samples, Samples], row_conf: float, note: str | None) -> Row:
    """A share's row (`errors`): the difference new - base in percentage points, with
    Newcombe's interval at the row's (Bonferroni) confidence; `regression` when the whole
    interval is above 0. A side with no measured request is `missing`."""
    (kb, nb, fb), (kn, nn, fn) = ((*s[:2], s[2] if len(s) > 2 else 1.0) for s in sides)
    b = kb / nb if nb else None
    n = kn / nn if nn else None
    if fb > 1.0 or fn > 1.0:  # failures in bursts (module doc, "Independence"): fewer independent trials
        said = (f"interval from the effective {effective(nb, fb)} / {effective(nn, fn)} of {nb} / {nn} requests: "
                f"failures come in bursts (design effect {fb:.2g} / {fn:.2g}, from consecutive requests' outcomes in start order)")
        note = "; ".join(x for x in (note, said) if x)
    row = dict(common, need=1, base=b, new=n, n_base=nb, n_new=nn, note=note)
    if not nb or not nn:
        return Row(**row, change=None, low=None, high=None, verdict="missing")  # type: ignore[arg-type]
    _, low, high = proportion_difference(kb / fb, nb / fb, kn / fn, nn / fn, row_conf)
    change = n - b  # type: ignore[operator]
    verdict: RowVerdict = "regression" if low > 0 else "improvement" if high < 0 else "no significant change"
    return Row(**row, change=change, low=low, high=high, verdict=verdict)  # type: ignore[arg-type]


def _rows(pending: Sequence[_Pending], confidence: float, row_conf: float, resamples: int, seed: int) -> list[Row]:
    """The rows, each (level pair, metric)'s samples computed once for all its statistics
    (they are consecutive in `pending`) and dropped before the next's."""
    out: list[Row] = []
    last: tuple[Any, ...] | None = None
    sides: tuple[Samples, Samples] | None = None
    for p in pending:
        key = (id(p.base_lv), id(p.new_lv), p.key[:5], p.turn)
        if key != last:
            sides = None  # the previous samples go before these are computed (a run read with keep=True)
            sides = p.sides()
            last = key
        out.append(_row(p, confidence, row_conf, resamples, seed, sides))
    return out


def _turn_pending(backend: str, new_backend: str, a: LevelSamples, z: LevelSamples, note: str | None,
                  notes: list[str]) -> list[_Pending]:
    """A multi-turn level pair's rows per user turn (`TURN_METRICS`), for the turns both runs
    sent; a turn only one run reached is said in `notes` (how deep a level's sessions got
    depends on its length and the server's speed: not missing data)."""
    both = [k for k in a.turns if k in z.turns]
    only = [(k, "base") for k in a.turns if k not in z.turns] + [(k, "new") for k in z.turns if k not in a.turns]
    if only:
        said = ", ".join(f"turn {k}{'+' if k > MAX_TURNS else ''} only in the {side} run" for k, side in sorted(only))
        notes.append(f"{backend} {a.label}: {said} (not compared)")
    metrics = [(cm, stats_) for cm, stats_ in TURN_METRICS if not cm.capped_only or (capped(a.entry) and capped(z.entry))]
    return [_Pending((backend, new_backend, a.workload, a.index, cm.name, stat, k), a, z, cm, stat, note, turn=k)
            for k in both for cm, stats_ in metrics for stat in stats_]


def _fails(rule: CompareRule, r: Row) -> bool:
    """Whether `r` fails `rule`'s limit: its regression's lower end is past it."""
    iv = r.regression_interval()
    return iv is not None and (iv[0] > rule.threshold if rule.op == "<=" else iv[0] >= rule.threshold)


def _judge_rule(rule: CompareRule, rows: Sequence[Row], blocked: Mapping[int, str] | None = None,
                lagged: Mapping[int, str] | None = None) -> RuleOutcome:
    """The rule over its rows (the worst decides); a row in `blocked` (`_client_blocked`) or
    `lagged` (`_lag_decided`) that would FAIL is INCONCLUSIVE instead, saying why: the rule
    FAILs on the other rows' failures."""
    mine = [i for i, r in enumerate(rows) if r.metric == rule.metric and r.stat == rule.stat and r.turn is None]
    if not mine:
        if BY_NAME[rule.metric].capped_only:
            return RuleOutcome(rule, "inconclusive", f"no matched level declares max_concurrency: {rule.metric} rows are a "
                               "capped level's (elsewhere it is ttft or latency, which the rule can name)", ())
        return RuleOutcome(rule, "inconclusive", "no matched level to compare", ())
    worst: tuple[int, str, str] | None = None  # (row, status, message)
    worst_key: tuple[int, float] | None = None  # (rank of its status, its regression's upper end): the largest
    rank = {"pass": 0, "inconclusive": 1, "fail": 2}
    for i in mine:
        r = rows[i]
        where = f"{r.backend} {r.where}"
        iv = r.regression_interval()
        t = rule.threshold
        if iv is None and r.verdict == "missing":
            st, msg = "inconclusive", f"{where}: {_no_data(r)} (n={r.n_base}/{r.n_new})"
        elif iv is None:
            st, msg = "inconclusive", f"{where}: {r.verdict} (n={r.n_base}/{r.n_new}, needs {r.need})"
        else:
            lo, hi = iv
            ok = hi <= t if rule.op == "<=" else hi < t
            bad = lo > t if rule.op == "<=" else lo >= t
            st = "pass" if ok else "fail" if bad else "inconclusive"
            u = " pp" if r.absolute else "%"  # ratio(errors): points
            msg = f"{where}: regression {signed_percent(lo, u)} .. {signed_percent(hi, u)} (limit {t * 100:g}{u})"
            if st == "fail" and blocked and i in blocked:
                st, msg = "inconclusive", f"not judged, the load generator was saturated {blocked[i]}; it measured: {msg}"
            elif st == "fail" and lagged and i in lagged:
                st, msg = "inconclusive", f"not judged, {lagged[i]}; it measured: {msg}"
        key = (rank[st], iv[1] if iv is not None else -math.inf)  # of one status, the row nearest (or furthest past) the limit
        if worst_key is None or key > worst_key:
            worst, worst_key = (i, st, msg), key
    assert worst is not None
    status = fold(rule.severity, (worst[1],))  # the gate's folding: a warn rule that fails is WARN
    return RuleOutcome(rule, status, worst[2], tuple(mine))  # type: ignore[arg-type]


def _no_data(r: Row) -> str:
    """Which run a missing row has no value from."""
    if r.base is None and r.new is None:
        return "neither run has data"
    return f"the {'new' if r.new is None else 'base'} run has no data"


def _missing(rows: Sequence[Row]) -> list[str]:
    """Why rows with a value on one side only make the comparison INCONCLUSIVE (module doc)."""
    out = []
    for side in ("new", "base"):
        gone = [r for r in rows if r.verdict == "missing" and (r.new if side == "new" else r.base) is None
                and (r.base if side == "new" else r.new) is not None]
        if gone:
            where: dict[str, list[str]] = {}
            for r in gone:
                where.setdefault(f"{r.backend} {r.where}", []).append(f"{r.stat}({r.metric})")
            listed = "; ".join(f"{w}: {', '.join(ms)}" for w, ms in where.items())
            out.append(f"the {side} run has no data for {len(gone)} row{'s' if len(gone) != 1 else ''} the "
                       f"{'base' if side == 'new' else 'new'} run has ({listed}): missing data is never a pass")
    return out


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
                    continue  # sent_ttft is ttft where uncapped; a cap on one side only (module doc, "From the send")
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
                                 _lag_decided(r, rows, pending, (confidence, row_conf, resamples, seed), notes) if judged else {})
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


def _client_blocked(rule: CompareRule, rows: Sequence[Row], health: Sequence[ClientHealth | None]) -> dict[int, str]:
    """The rows of a rule on a timing figure whose level either run's load generator did not
    keep up in (`ClientHealth.covers`), with why: such a row's FAIL may be the client's own lag,
    not the server's, and is INCONCLUSIVE, as the gate's `client_blocks` makes a timing FAIL
    that overlaps a saturated bucket. A row of a level where both kept up is judged as it is."""
    from soakspec.judge.validity import CLIENT_SENSITIVE

    if rule.metric not in CLIENT_SENSITIVE or not any(health):
        return {}
    out: dict[int, str] = {}
    for i, r in enumerate(rows):
        if r.metric != rule.metric or r.stat != rule.stat or r.turn is not None:
            continue
        why = [f"in the {side} run ({h.why})" for side, h, (b, lv) in
               zip(("base", "new"), health, ((r.backend, r.level), (r.new_backend, r.new_level)))
               if h is not None and h.covers(b, r.workload, lv)]
        if why:
            out[i] = "; ".join(why)
    return out


def _lag_decided(rule: CompareRule, rows: Sequence[Row], pending: Sequence[_Pending],
                 how: tuple[float, float, int, int], notes: list[str]) -> dict[int, str]:
    """The rows of a rule on ttft or latency that fail it at an open-loop level without
    max_concurrency in both runs where the same statistic from the actual send (sent_ttft,
    sent_latency: `judge.performance.FROM_SEND`) does not fail the same limit, with why: the
    regression is the new run's load generator being later (its schedule lag, within
    client_schedule_lag: no saturated bucket, else `_client_blocked` has the row), not the
    server, and is INCONCLUSIVE, never a FAIL -- as the gate's `performance._lag_decided` makes
    such an instance. Where the send figure fails too the FAIL stands (the server's own time);
    a capped level's difference is the wait for a slot, which users see, and a closed loop has
    none: both judged as measured. The send row is made only for a failing row, by `_row` with
    the same statistic, interval method, row confidence and seed scheme as the level's sent_*
    rows where capped (`how`: confidence, row confidence, resamples, seed). It is not one more
    comparison of the family (m, `family_confidence`): it cannot make a FAIL, only take one
    back, so it adds no false FAIL for the correction to bound -- and counting it would widen
    every row of a comparison by rows it does not show. A run read up front without its sent
    samples (`RunSamples.read(keep=False)` without `from_send`) is not checked: a note says the
    FAIL stands unchecked. `rows[i]` is `pending[i]`'s row."""
    from soakspec.judge.performance import FROM_SEND

    if rule.metric not in FROM_SEND:
        return {}
    sent = BY_NAME[FROM_SEND[rule.metric]]
    confidence, row_conf, resamples, seed = how
    out: dict[int, str] = {}
    for i, r in enumerate(rows):
        p = pending[i]
        if r.metric != rule.metric or r.stat != rule.stat or r.turn is not None or not _fails(rule, r) \
                or not (_open_uncapped(p.base_lv.entry) and _open_uncapped(p.new_lv.entry)):
            continue
        if not all(isinstance(lv.samples, _LevelSamples) or sent.name in lv.samples for lv in (p.base_lv, p.new_lv)):
            notes.append(f"{r.backend} {r.where}: {rule.stat}({rule.metric}) was not checked from the actual send "
                         f"(the base run was read without its {sent.name} samples): its FAIL may be the load generator's lag")
            continue
        s = _row(dataclasses.replace(p, key=(*p.key[:4], sent.name, p.stat), cm=sent), confidence, row_conf, resamples, seed)
        if _fails(rule, s):
            continue
        out[i] = _lag_said(rule, s, p)
    return out


def _lag_said(rule: CompareRule, s: Row, p: _Pending) -> str:
    """Why a failing row is the load generator's (`_lag_decided`): the send row's change and
    interval, and each run's schedule lag p50."""
    figure = f"{rule.stat}({s.metric})"
    iv = s.regression_interval()
    if iv is not None and s.change is not None:
        send = f"from the actual send {figure} changed {signed_percent(s.change)} [{signed_percent(iv[0])}, {signed_percent(iv[1])}]"
    else:
        send = f"from the actual send {figure} cannot be judged ({s.verdict}, n={s.n_base}/{s.n_new}, needs {s.need})"
    lag = [_lag_of(lv) for lv in (p.new_lv, p.base_lv)]
    shown = ["unknown" if v is None else format_value(v, Kind.DURATION) for v in lag]
    return (f"the regression of {rule.stat}({rule.metric}) is the load generator's: {send}; the new run's schedule lag "
            f"p50 {shown[0]} against the base's {shown[1]}")


def _lag_of(lv: LevelSamples) -> float | None:
    """A level's schedule lag p50: from its table, or as read up front (`_read_up_front`)."""
    if isinstance(lv.samples, _LevelSamples):
        return lv.samples.lag_p50()
    v: Any = lv.samples.get(LAG_P50)
    return v


def _abort_rises(rose: Sequence[Row], pending: Sequence[_Pending], row_conf: float) -> tuple[list[Row], list[str]]:
    """Of the errors rows whose share rose significantly, those that still rise without the
    requests an aborted run's runner cancelled itself, and why each of the others makes the
    comparison INCONCLUSIVE instead: a run interrupted mid-level (Ctrl-C) records its requests
    in flight as disconnected -- the gate's errors, the row's share -- but that rise is the
    interrupt's, not the server's (the run is incomplete)."""
    by_key = {(p.key[0], p.key[2], p.key[3]): p for p in pending if p.cm.name == "errors"}
    still, why = [], []
    for r in rose:
        p = by_key.get((r.backend, r.workload, r.level))
        cb, cn = (p.base_lv.cancelled_by_abort, p.new_lv.cancelled_by_abort) if p is not None else (0, 0)
        if not (cb or cn):
            still.append(r)
            continue
        kb, nb = round((r.base or 0) * r.n_base), r.n_base
        kn, nn = round((r.new or 0) * r.n_new), r.n_new
        fb, fn = (s[2] if len(s) > 2 else 1.0 for s in p.sides())  # the row's design effects (failures in bursts)
        if nb - cb > 0 and nn - cn > 0 and proportion_difference((kb - cb) / fb, (nb - cb) / fb, (kn - cn) / fn, (nn - cn) / fn,
                                                                 row_conf)[1] > 0:
            still.append(r)  # a rise beyond what the interrupt cancelled
            continue
        why.append(f"{r.backend} {r.label}: unsuccessful requests {_share(r.base)} → {_share(r.new)}, a rise only by the "
                   f"{cb + cn} requests an interrupted run's runner cancelled in flight (\"{CANCELLED_BY_ABORT}\"), not "
                   "failures of the server: that run is incomplete")
    return still, why


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


__all__ = ["BY_NAME", "METRICS", "CompareMetric", "CompareRule", "Comparison", "Row", "RuleError", "RuleOutcome", "RunSamples",
           "SweepRow", "proportion_difference", "wilson",
           "Side", "Sorted", "Unpaired", "compare", "family_confidence", "mean_draws", "mean_ratio_interval", "parse_rule", "percentile_draws", "rules_of"]
