"""How `soakspec compare` decides over its rows: each rule's outcome (`RuleOutcome`), with a FAIL
taken back where a run's load generator did not keep up (`_client_blocked`) or the change is its
schedule lag (`_lag_decided`), the rows with data on one side only (`_missing`), and a rise of
errors that is only an interrupted run's own cancellations (`_abort_rises`).

Rules (`require|warn STAT(METRIC) regression <= N%`): over every matched row of that metric
and statistic, `regression` is the change towards worse (positive = worse). A row passes when
its interval's upper end is at most N %, fails when its lower end is above N %, and is
inconclusive otherwise (the samples cannot tell) or with insufficient samples; a rule on a
timing figure (ttft, itl, tpot, latency, qps, throughput) whose row fails at a level where
either run's load generator did not keep up (a bucket of it the gate's client_healthy finds
saturated; every level where it cannot say which: no client.jsonl, requests never sent) is
inconclusive there, as the gate makes a FAIL that overlaps such a bucket: the change may be the
client's own lag. A failing row of a level where both kept up still FAILs the rule -- except a
ttft or latency row of an open-loop level in both runs whose same statistic less the load
generator's own lateness (the gate's figure, `performance.lag_figure`: from the actual send,
sent_ttft / sent_latency, without max_concurrency; under it, with the slot queue replayed on
time, the cap's own wait kept) does not fail the limit: the new run's client was later, the server was not slower,
and the rule is INCONCLUSIVE there (`_lag_decided`). The rule takes
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
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from soakspec.evidence.record import CANCELLED_BY_ABORT
from soakspec.judge.common import Kind, fold, format_value
from soakspec.compare.metrics import BY_NAME
from soakspec.compare.samples import ClientHealth, LAG_P50, LevelSamples, _LevelSamples, figure_samples
from soakspec.compare.rules import CompareRule
from soakspec.compare.rows import Row, _Pending, _row, signed_percent
from soakspec.compare.intervals import proportion_difference


@dataclasses.dataclass(frozen=True)
class RuleOutcome:
    rule: CompareRule
    status: Literal["pass", "fail", "inconclusive", "warn"]  # warn: a warn rule that does not hold
    message: str
    rows: tuple[int, ...]  # indexes into Comparison.rows

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule.text(), "severity": self.rule.severity, "status": self.status, "message": self.message,
                "rows": list(self.rows)}


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
    """Why rows with a value on one side only make the comparison INCONCLUSIVE (compare/rows.py, "Verdict per row")."""
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
                 how: tuple[float, float, int, int], notes: list[str], judged: bool) -> dict[int, str]:
    """The rows of a rule on ttft or latency that fail it at an open-loop level in both runs
    where the same statistic less the load generator's own lateness does not fail the same
    limit, with why: the regression is the new run's load generator being later (its schedule
    lag, within client_schedule_lag: no saturated bucket, else `_client_blocked` has the row),
    not the server, and is INCONCLUSIVE, never a FAIL -- as the gate's
    `performance._lag_decided` makes such an instance. The figure is the gate's own choice,
    `performance.lag_figure`, asked of the level pair, so that the two cannot drift: where
    neither level declares max_concurrency the time from the actual send (sent_ttft,
    sent_latency); where one does, the time with the level's slot queue replayed as an on-time
    client would have driven it (`judge/capreplay.py`: the wait for a slot under the user's
    cap, which users see, kept -- a FAIL the cap's own queue carries stands, as the gate's).
    Each side is measured with its own level's figure (an uncapped level's from the send is the
    replayed one's, value for value: nothing to replay), under the pair's name. A closed loop (its intended
    start is its send) and runs whose gates do not judge their client (`judged`: either says
    `client_healthy = false`) are judged as measured; so is a pair where only one level is an
    open loop. Where the figure fails too the FAIL stands (the server's own time). The figure's
    row is made only for a failing row, by `_row` with the same statistic, interval method, row
    confidence and seed scheme as every row (`how`: confidence, row confidence, resamples,
    seed). It is not one more comparison of the family (m, `family_confidence`): it cannot make
    a FAIL, only take one back, so it adds no false FAIL for the correction to bound -- and
    counting it would widen every row of a comparison by rows it does not show. A run read up
    front without the figure's samples (`RunSamples.read(keep=False)` without `from_send`) is
    not checked: a note says the FAIL stands unchecked. `rows[i]` is `pending[i]`'s row."""
    from soakspec.judge.performance import FROM_SEND, lag_figure

    if rule.metric not in FROM_SEND:
        return {}
    confidence, row_conf, resamples, seed = how
    out: dict[int, str] = {}
    for i, r in enumerate(rows):
        p = pending[i]
        if r.metric != rule.metric or r.stat != rule.stat or r.turn is not None or not _fails(rule, r):
            continue
        lvs = (p.base_lv, p.new_lv)
        held = [_level(lv) for lv in lvs]
        fig = lag_figure(judged, rule.metric, held)
        own = [lag_figure(judged, rule.metric, [lv]) for lv in held]
        if fig is None or own[0] is None or own[1] is None:
            continue  # each level an open loop, or judged as measured
        # each side measured with its own level's figure: where a level is not capped its figure
        # from the send is the replayed one's value for value (nothing to replay), so a capped
        # level beside an uncapped one compares the same figure under the pair's name
        sides = (figure_samples(lvs[0], own[0]), figure_samples(lvs[1], own[1]))
        if sides[0] is None or sides[1] is None:
            lacking = " and ".join(f"{w} run was read without its {f.name}" for w, x, f in zip(("base", "new"), sides, own)
                                   if x is None and f is not None)
            notes.append(f"{r.backend} {r.where}: {rule.stat}({rule.metric}) was not checked {fig.measured} (the "
                         f"{lacking} samples): its FAIL may be the load generator's lag")
            continue
        s = _row(dataclasses.replace(p, key=(*p.key[:4], fig.name, p.stat), cm=BY_NAME[fig.metric]), confidence, row_conf,
                 resamples, seed, (sides[0], sides[1]))
        if _fails(rule, s):
            continue
        out[i] = _lag_said(rule, s, p, fig)
    return out


def _level(lv: LevelSamples) -> Any:
    """What `lag_figure` reads of a compared level: its index where the run's table is held (the
    figure is measured over it: a capped level's slot queue is replayed from its records), else
    the compared level itself (its manifest entry and place: the figure's choice and name; its
    samples were read up front by that name)."""
    return lv.samples.lv if isinstance(lv.samples, _LevelSamples) else lv


def _lag_said(rule: CompareRule, s: Row, p: _Pending, fig: Any) -> str:
    """Why a failing row is the load generator's (`_lag_decided`): its figure less the client's
    lateness (`LagFigure`: named as the gate names it), that row's change and interval, and
    each run's schedule lag p50."""
    figure = f"measured {fig.measured} ({fig.text(rule.metric, f'{rule.stat}({rule.metric})')}{fig.keeps})"
    iv = s.regression_interval()
    if iv is not None and s.change is not None:
        send = f"{figure} it changed {signed_percent(s.change)} [{signed_percent(iv[0])}, {signed_percent(iv[1])}]"
    else:
        send = f"{figure} it cannot be judged ({s.verdict}, n={s.n_base}/{s.n_new}, needs {s.need})"
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
