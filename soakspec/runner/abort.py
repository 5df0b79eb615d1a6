"""Abort rules, evaluated live: the plan's `AbortRule`s over each finished bucket or window.

Pure and synchronous (no trio, nothing from `soakspec.lang` or `soakspec.judge`): the load
driver feeds it the records it already writes (`observe`), tells it when a level starts and
when a bucket ends, and asks it the time (`tick`); the first rule that holds is `fired`, and
`on_fire` is called once (the driver cancels the backend's load with it).

What a bucket or window holds: the requests that started in it (open loop: were scheduled in
it) and have finished when it is evaluated -- at the bucket's end (`per bucket`), or at the
first record or bucket end at or after the window's end (`per window`). Windows are fixed,
`window_s` long, from the end of the level's warmup, the last one ending with the level
(shorter when the duration is not a multiple of `window_s`: the judge's windows); warmup
requests belong to none.

Values, from `RequestRecord` fields:
  - outcome metrics (requests, completed, failed, timeouts, rejected, disconnected, errors):
    `count` is the number of such requests, `ratio` that over all of the window's requests;
  - distributions (ttft, latency, tpot, output_tokens, prompt_tokens, schedule_lag) over the
    completed requests that have the value: mean, min, max, or the percentile (linear
    interpolation between order statistics, as the judge computes it).
A bucket or window with fewer than the rule's `min_requests` requests (or no value for a
distribution) is not evaluated: an abort never fires on nothing.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Iterable
from typing import Any

from soakspec.plan import AbortRule

OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}  # fmt: skip

OUTCOMES: dict[str, Callable[[str], bool]] = {
    "requests": lambda o: True,
    "completed": lambda o: o == "completed",
    "failed": lambda o: o == "failed",
    "timeouts": lambda o: o == "timeout",
    "rejected": lambda o: o == "rejected",
    "disconnected": lambda o: o == "disconnected",
    "errors": lambda o: o != "completed",
}


@dataclasses.dataclass(frozen=True)
class Row:
    """What an abort rule reads of one finished request."""

    bucket: int  # evidence.record.WARMUP_BUCKET: warm-up
    start: float | None  # the intended start (open loop) or the start
    outcome: str
    values: dict[str, float | None]  # ttft, latency, tpot, output_tokens, prompt_tokens, schedule_lag


def row_of(rec: Any) -> Row:
    """A `RequestRecord`'s row (or a written `Record`'s: a `--workers` process's lines, decoded)."""
    start = rec.intended_start if rec.intended_start is not None else rec.start
    lag = rec.start - rec.intended_start if rec.start is not None and rec.intended_start is not None else None
    values = {"ttft": rec.ttft, "latency": rec.latency, "tpot": rec.tpot, "output_tokens": float(rec.output_tokens),
              "prompt_tokens": None if rec.prompt_tokens is None else float(rec.prompt_tokens), "schedule_lag": lag}  # fmt: skip
    return Row(rec.bucket, start, str(rec.outcome), values)


def value(rule: AbortRule, rows: list[Row]) -> float | None:
    """The rule's value over these rows; None when it cannot be evaluated (too few requests)."""
    if len(rows) < max(1, rule.min_requests):
        return None
    if rule.metric in OUTCOMES:
        n = sum(1 for r in rows if OUTCOMES[rule.metric](r.outcome))
        return n / len(rows) if rule.agg == "ratio" else float(n)
    xs = sorted(v for r in rows if r.outcome == "completed" and (v := r.values.get(rule.metric)) is not None)
    if not xs:
        return None
    if rule.agg == "mean":
        return sum(xs) / len(xs)
    if rule.agg == "min":
        return xs[0]
    if rule.agg == "max":
        return xs[-1]
    q = rule.percentile if rule.percentile is not None else 50.0
    pos = q / 100 * (len(xs) - 1)  # linear interpolation between order statistics, as the judge does
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def holds(rule: AbortRule, rows: list[Row]) -> tuple[bool, float | None]:
    """(fires, observed value)."""
    v = value(rule, rows)
    return (v is not None and OPS[rule.op](v, rule.threshold)), v


@dataclasses.dataclass(frozen=True)
class Fired:
    """The abort that stopped a backend's load (the manifest's `aborts` entry)."""

    rule: AbortRule
    backend: str
    workload: str
    level: int
    level_label: str
    scope: str  # bucket | window
    index: int  # the bucket's or window's index in the level
    start: float
    end: float
    at: float  # when it fired (run clock, epoch seconds)
    observed: float
    requests: int

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule.text, "builtin": self.rule.builtin, "metric": self.rule.metric, "op": self.rule.op,
            "threshold": self.rule.threshold, "observed": self.observed, "requests": self.requests,
            "backend": self.backend, "workload": self.workload, "level": self.level, "level_label": self.level_label,
            "scope": self.scope, "index": self.index, "start": self.start, "end": self.end, "at": self.at,
        }  # fmt: skip

    def describe(self) -> str:
        where = f"{self.scope} {self.index} of {self.workload} / {self.level_label}"
        return f"abort rule '{self.rule.text}' fired on backend '{self.backend}' at {where}: observed {self.observed:.6g} over {self.requests} requests"


class AbortWatch:
    """One backend's abort rules over its current level (see the module docstring)."""

    def __init__(self, backend: str, rules: Iterable[AbortRule], on_fire: Callable[[Fired], None] | None = None) -> None:
        self.backend = backend
        self.rules = tuple(rules)
        self.on_fire = on_fire
        self.fired: Fired | None = None
        self._level: tuple[str, int, str, float, float, float] | None = None  # workload, index, label, m, stop, bucket_s
        self._rows: list[Row] = []
        self._done: set[tuple[int, int]] = set()  # (rule index, bucket index) evaluated
        self._next: dict[int, int] = {}  # per `per window` rule: its first window not evaluated yet

    def level_started(self, workload: str, index: int, label: str, measure_start: float, duration_s: float, bucket_s: float) -> None:
        self._level = (workload, index, label, measure_start, measure_start + duration_s, bucket_s)
        self._rows = []
        self._done = set()
        self._next = {i: 0 for i, rule in enumerate(self.rules) if rule.scope == "window" and rule.window_s}

    def observe(self, rows: Iterable[Row], now: float) -> None:
        if not self.rules or self.fired is not None:
            return
        self._rows.extend(r for r in rows if r.bucket >= 0)
        self.tick(now)

    def bucket_done(self, k: int, now: float) -> None:
        """Bucket `k` of the level has ended: its `per bucket` rules, then any finished window."""
        if self._level is None or self.fired is not None:
            return
        workload, index, label, m, _, blen = self._level
        rows = [r for r in self._rows if r.bucket == k]
        for i, rule in enumerate(self.rules):
            if rule.scope == "bucket" and self.fired is None and (i, k) not in self._done:
                self._done.add((i, k))
                self._evaluate(i, rule, k, rows, m + k * blen, m + (k + 1) * blen, now)
        # the bucket has ended, whatever the float of `now` says: a window ending with it is over
        self.tick(max(now, min(m + (k + 1) * blen, self._level[4])))
        self._prune(k)

    def _prune(self, k: int) -> None:
        """Forget the rows no rule will read again (memory stays bounded over a long soak)."""
        assert self._level is not None
        m = self._level[3]
        keep_from = min((m + j * self.rules[i].window_s for i, j in self._next.items()), default=math.inf)
        self._rows = [r for r in self._rows if r.bucket > k or (r.start is not None and r.start >= keep_from)]

    def tick(self, now: float) -> None:
        """Evaluate every `per window` rule on each window that has ended by `now`, once, in
        order. Called on every batch of records: its work is the windows that ended since the
        last call, not every window of the level (a day of 1 s windows is 86,400)."""
        if self._level is None or self.fired is not None:
            return
        _, _, _, m, stop, _ = self._level
        for i, j in self._next.items():
            rule = self.rules[i]
            w = rule.window_s
            # the judge's windows (judge.scope.window_scopes): the last one may be shorter, and
            # ends at the level's end, not one float rounding of (stop - m) / w before it
            n = max(1, math.ceil((stop - m) / w - 1e-9))
            while j < n:
                start = m + j * w
                end = min(stop, start + w)
                last = j == n - 1
                if now < end:
                    break
                if self.fired is not None:
                    return
                self._next[i] = j + 1
                rows = [r for r in self._rows
                        if r.start is not None and start <= r.start and (r.start < end or (last and r.start <= end))]
                self._evaluate(i, rule, j, rows, start, end, now)
                j += 1

    def _evaluate(self, i: int, rule: AbortRule, j: int, rows: list[Row], start: float, end: float, now: float) -> None:
        fires, v = holds(rule, rows)
        if not fires or v is None or self._level is None:
            return
        workload, index, label, *_ = self._level
        self.fired = Fired(rule, self.backend, workload, index, label, rule.scope, j, start, end, now, v, len(rows))
        if self.on_fire is not None:
            self.on_fire(self.fired)


__all__ = ["AbortWatch", "Fired", "Row", "holds", "row_of", "value"]
