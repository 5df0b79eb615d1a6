"""The rows of `soakspec compare`: one per matched (backend, level[, turn]), metric and statistic
(`Row`), each its two values, their change, its interval at the row's confidence and its
verdict, made from the two levels' samples (`soakspec.compare.samples`) with the statistics of
`soakspec.compare.intervals`.

Errors. `ratio(errors)`'s change is the difference `new - base` of the two shares, in
percentage points (a base share of 0, the usual one, has no ratio), and its interval is
Newcombe's hybrid score interval of a difference of two independent proportions (each side's
Wilson interval, combined; Newcombe 1998, method 10) at the row's confidence: no resampling,
and it keeps its coverage at shares of 0 and 1, where the normal approximation does not. Each
measured request is one trial -- divided by the share's design effect where failures come in
bursts (compare/intervals.py, "Independence"): k / d failures of n / d trials.

Statistic: the relative change `new / base - 1` of the row's statistic, with a confidence
interval from a seeded, deterministic bootstrap (percentile interval, `resamples` draws per
side, `random.Random(seed)` derived per row so rows do not depend on each other's order); a
mean over buckets from Fieller's t interval instead (compare/intervals.py, "Means").

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
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any, Literal

from soakspec.judge import stats
from soakspec.judge.index import capped
from soakspec.compare.metrics import BY_NAME, CompareMetric, MAX_TURNS, TURN_METRICS, _q
from soakspec.compare.intervals import DesignEffects, Sorted, _binned_interval, _relative, _seed, effective, mean_ratio_interval, percentile_draws, proportion_difference
from soakspec.compare.samples import LevelSamples, Samples


MIN_BUCKETS = 4


RowVerdict = Literal["regression", "improvement", "no significant change", "insufficient samples", "missing"]


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


def signed_percent(v: float, unit: str = "%") -> str:
    """`v` (a fraction) as a signed percentage to 0.1 -- with more digits where 0.1 would show a
    change that is not 0 as "+0.0" or "-0.0" (an interval "+0.0% .. +4.5%" beside a REGRESSION,
    whose low end is above 0), up to 4 significant digits."""
    x = v * 100
    text = f"{x:+.1f}"
    if x != 0 and float(text) == 0:
        text = f"{x:+.2g}"
    return text + unit


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
    if not cm.per_request_samples and (fb > 1.0 or fn > 1.0):  # requests close in time: compare/intervals.py, "Independence"
        sizes = (effective(eb, fb), effective(en, fn))
        said = (f"interval from the effective {sizes[0]} / {sizes[1]} of {rb} / {rn} requests: requests close in time "
                f"are not independent (design effect {fb:.2g} / {fn:.2g} at p{q:g}, from consecutive requests in start order)")
        note = "; ".join(x for x in (note, said) if x)
    base_row = dict(common, base=b, new=n, n_base=eb, n_new=en, change=change, note=note, **gaps)
    if not len(xb) or not len(xn):
        return Row(**base_row, low=None, high=None, verdict="missing")  # type: ignore[arg-type]
    if eb < need or en < need:
        return Row(**base_row, low=None, high=None, verdict="insufficient samples")  # type: ignore[arg-type]
    if q is None:  # a mean over buckets: Fieller's t interval, no resampling (compare/intervals.py, "Means")
        iv = mean_ratio_interval(xb, xn, row_conf)
        if iv is None:  # the base's mean is not distinguishable from 0: no relative change
            return Row(**base_row, low=None, high=None, verdict="insufficient samples")  # type: ignore[arg-type]
        low, high = iv
    else:
        rng = random.Random(_seed(seed, p.key))
        alpha = 1.0 - row_conf
        if _binned(xb) or _binned(xn):  # each draw's change known within the bins (compare/intervals.py, "Binned gaps")
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
    if fb > 1.0 or fn > 1.0:  # failures in bursts (compare/intervals.py, "Independence"): fewer independent trials
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
