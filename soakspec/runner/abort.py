"""Abort rules, evaluated live: the plan's `AbortRule`s over each finished bucket or window.

Pure and synchronous (no trio, nothing from `soakspec.lang` or `soakspec.judge`): the load
driver feeds it the records it already writes (`observe`), tells it when a level starts and
when a bucket ends, and asks it the time (`tick`); the first rule that holds is `fired`, and
`on_fire` is called once (the driver cancels the backend's load with it).

What a bucket or window holds: the requests that started in it (open loop: were scheduled in
it). Windows are fixed, `window_s` long, from the end of the level's warmup, the last one
ending with the level (shorter when the duration is not a multiple of `window_s`: the judge's
windows); warmup requests belong to none. A bucket or window is judged once it has finished --
its time has ended and so has every request that started in it: when the driver has counted
as many records of it as it started (`started`; `--workers`: as far as the load processes
have reported their starts, `started_until`), else when their deadline has passed
(`deadline_s` + SETTLE_S after its end), or when the level's load has drained
(`level_drained`). Judged at its end instead, the fast failures of a bucket whose successes
were still streaming were all it held: one failed request of ten in flight was
"ratio(errors) = 100%". Before that, an outcome rule fires early only when it holds whatever
the requests still in flight turn out to be (a ratio between c/(n+u) and (c+u)/(n+u) for c
of n finished matching, u unfinished).

Values, from `RequestRecord` fields:
  - outcome metrics (requests, completed, failed, timeouts, rejected, disconnected, errors):
    `count` is the number of such requests, `ratio` that over all of the window's requests;
  - distributions (ttft, latency, tpot, output_tokens, prompt_tokens, schedule_lag, sent_ttft,
    sent_latency) over the
    completed requests that have the value: mean, min, max, or the percentile (linear
    interpolation between order statistics, as the judge computes it).
A bucket or window with fewer than the rule's `min_requests` requests (or no value for a
distribution) is not evaluated: an abort never fires on nothing.

A fire says what its requests were (`Fired.outcomes`, from each row's `cause`: "HTTP 500",
"timeout", "connection refused", "held back (connections refused)"): "observed 100% over 42
requests" read the same for a server refusing every connection and one answering every request
with a 500. And it tells them apart (`Fired.gone`, `server_gone`): requests that all found the
server gone are the backend's death, which the driver ends as the liveness watch does (exit 4,
runner/liveness.py), not a gate rule's failure (exit 1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
from collections.abc import Callable, Iterable
from typing import Any

from soakspec import windows
from soakspec.evidence.record import outcomes_text, schedule_lag, sent_since
from soakspec.plan import AbortRule
from soakspec.runner.protocol import CONNECT_FAILED, HELD_BACK, HELD_REFUSED
from soakspec.units import format_as

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
    values: dict[str, float | None]  # ttft, latency, tpot, output_tokens, prompt_tokens, schedule_lag, sent_*
    error: str | None = None  # the record's error, read for `cause` and `gone`

    # `cause` and `gone` are read only when a rule fires (`AbortWatch._evaluate`): worked out
    # then, once a row, not for every failed record the watch is fed (a failing server's many)
    @functools.cached_property
    def _said(self) -> tuple[str, str]:
        return cause_of(self.outcome, self.error)

    @property
    def cause(self) -> str:
        """The outcome in words, as a fired abort names it (`cause_of`)."""
        return self._said[0]

    @property
    def gone(self) -> str:
        """A sign the server is gone, not failing: GONE_REFUSED, GONE_HELD, GONE_CUT, else "" (`cause_of`)."""
        return self._said[1]


GONE_REFUSED = "refused"  # no connection could be made (refused, unreachable)
GONE_HELD = "held"  # an open-loop arrival held back by the backoff after refused connects
GONE_CUT = "cut"  # sent, and its connection broke before the response ended (in flight as the server went)


def cause_of(outcome: str, error: str | None) -> tuple[str, str]:
    """(the outcome in words, its `Row.gone` kind). Words: "completed", "timeout", "HTTP 500",
    a connect that failed as the error says it ("connection refused"), "held back (connections
    refused)" or "held back (requests failing)", a connection that ended as the error says it
    ("connection reset by peer"), else the outcome ("failed")."""
    err = error or ""
    if outcome == "completed":
        return "completed", ""
    if err.startswith(CONNECT_FAILED):
        return _bare(err[len(CONNECT_FAILED):]) or "connect failed", GONE_REFUSED
    if err.startswith(HELD_BACK):
        refused = err[len(HELD_BACK):].startswith(HELD_REFUSED)
        return ("held back (connections refused)", GONE_HELD) if refused else ("held back (requests failing)", "")
    if outcome == "timeout":
        return "timeout", ""
    if (m := re.match(r"HTTP (\d{3})\b", err)) is not None:
        return f"HTTP {m.group(1)}", ""
    if outcome == "disconnected" and err:
        return _bare(err)[:60], GONE_CUT
    return outcome, ""


def _bare(err: str) -> str:
    """An error without its errno's name: "connection refused (econnrefused)" -> "connection refused"."""
    return re.sub(r"\s*\([a-z0-9_]+\)$", "", err.strip())


def row_of(rec: Any) -> Row:
    """A `RequestRecord`'s row (or a written `Record`'s: a `--workers` process's lines, decoded)."""
    start = rec.intended_start if rec.intended_start is not None else rec.start
    lag = schedule_lag(rec.start, rec.intended_start, rec.admitted)  # not the wait behind a declared max_concurrency
    values = {"ttft": rec.ttft, "latency": rec.latency, "tpot": rec.tpot, "output_tokens": float(rec.output_tokens),
              "prompt_tokens": None if rec.prompt_tokens is None else float(rec.prompt_tokens), "schedule_lag": lag,
              "sent_ttft": sent_since(rec.first_token, rec.start), "sent_latency": sent_since(rec.end, rec.start)}  # fmt: skip
    return Row(rec.bucket, start, str(rec.outcome), values, rec.error)


def server_gone(rows: list[Row]) -> bool:
    """Whether these requests (an abort's bucket or window) show a server that is gone rather
    than one that answers and fails: none completed, at least one connect failed, and every
    other one was held back by the backoff after refused connects or had its connection broken
    in flight (reset, closed before the response ended: sent as the server went). A server
    that answers every request with an error (HTTP 500, a timeout) or breaks every connection
    without refusing one is not gone: the gate judges its failures (exit 1)."""
    return bool(rows) and any(r.gone == GONE_REFUSED for r in rows) and all(r.gone for r in rows)


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
    outcomes: tuple[tuple[str, int], ...] = ()  # the requests' outcomes in words (`cause_of`), most first
    gone: bool = False  # the requests show a server that is gone (`server_gone`): the run aborts, exit 4
    refused: str = ""  # the most common failed connect among them, in words ("connection refused")

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule.text, "builtin": self.rule.builtin, "metric": self.rule.metric, "op": self.rule.op,
            "threshold": self.rule.threshold, "observed": self.observed, "requests": self.requests,
            "agg": self.rule.agg, "percentile": self.rule.percentile,
            "backend": self.backend, "workload": self.workload, "level": self.level, "level_label": self.level_label,
            "scope": self.scope, "index": self.index, "start": self.start, "end": self.end, "at": self.at,
            "outcomes": dict(self.outcomes),
        }  # fmt: skip

    def where(self) -> str:
        return f"{self.scope} {self.index} of {self.workload} / {self.level_label}"

    def saw(self) -> str:
        """What its requests were: "42 requests, none completed: 40 connection refused, 2 ..."
        (nothing for a fire recorded without outcomes)."""
        if not self.outcomes:
            return ""
        counts = dict(self.outcomes)
        head = f"{self.requests} requests, none completed" if not counts.get("completed") else f"{self.requests} requests"
        return f"{head}: {outcomes_text(counts)}"

    def describe(self) -> str:
        seen = f"observed {observed_text(self.rule, self.observed)} over {self.requests} requests"
        if self.outcomes:
            seen = self.saw() if self.rule.builtin else f"{seen} ({outcomes_text(dict(self.outcomes))})"
        return f"abort rule '{self.rule.text}' fired on backend '{self.backend}' at {self.where()}: {seen}"


DURATIONS = frozenset({"ttft", "latency", "tpot", "schedule_lag", "sent_ttft", "sent_latency"})  # the metrics `value` reads in seconds


def observed_text(rule: AbortRule, v: float) -> str:
    """An abort rule's value in the rule's own unit, as the judge prints it (`units.format_as`):
    a ratio as a percentage ("100%": a bare 1 read as one request of 37), a time as a
    duration ("1.12s"), a count as a whole number."""
    kind = "ratio" if rule.agg == "ratio" else "duration" if rule.metric in DURATIONS else "count" if rule.agg == "count" else None
    return format_as(v, kind)


SETTLE_S = 1.0  # a bucket's requests have all been recorded this long after their deadline (as its bucket line)


def _certain(op: str, lo: float, hi: float, threshold: float) -> bool:
    """Does `value op threshold` hold for every value in [lo, hi]?"""
    if op == "==":
        return lo == hi == threshold
    if op == "!=":
        return not lo <= threshold <= hi
    return OPS[op](lo, threshold) and OPS[op](hi, threshold)


@dataclasses.dataclass
class _Cell:
    """What is known of one bucket's or window's requests: how many started, and the outcomes
    of those that finished (`""`: not sent, counted by no rule)."""

    started: int = 0
    outcomes: dict[str, int] = dataclasses.field(default_factory=dict)

    def finish(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def unfinished(self) -> int:
        return max(0, self.started - sum(self.outcomes.values()))


class AbortWatch:
    """One backend's abort rules over its current level (see the module docstring)."""

    def __init__(self, backend: str, rules: Iterable[AbortRule], on_fire: Callable[[Fired], None] | None = None) -> None:
        self.backend = backend
        self.rules = tuple(rules)
        self.on_fire = on_fire
        self.fired: Fired | None = None
        self.level_started("", 0, "", 0.0, 0.0, 1.0)
        self._level: tuple[str, int, str, float, float, float] | None = None  # workload, index, label, m, stop, bucket_s

    def level_started(self, workload: str, index: int, label: str, measure_start: float, duration_s: float, bucket_s: float,
                      deadline_s: float = 0.0, starts_known: bool = False, starts_until: float = math.inf) -> None:  # fmt: skip
        """A level begins. `deadline_s`: each request ends by then after its start (0: judge a bucket
        or window at its end); `starts_known`: the driver reports every request it starts
        (`started`), so a bucket or window is judged as soon as all of its requests have finished
        -- those that end by `starts_until` (`--workers`: the starts the load processes have
        reported so far, `started_until`)."""
        self._level = (workload, index, label, measure_start, measure_start + duration_s, bucket_s)
        # each window rule's windows, as the judge cuts them (soakspec.windows): the last may be
        # shorter, and ends at the level's end
        self._starts = {i: windows.starts(measure_start, duration_s, rule.window_s)
                        for i, rule in enumerate(self.rules) if rule.scope == "window" and rule.window_s}
        self._rows: list[Row] = []
        self._done: set[tuple[int, int]] = set()  # (rule index, bucket index) evaluated
        self._next: dict[int, int] = {i: 0 for i, rule in enumerate(self.rules) if rule.scope == "window" and rule.window_s}
        self._wait = deadline_s + SETTLE_S if deadline_s > 0 else 0.0  # after an end, every request of it has ended
        self._known = starts_known
        self._until = starts_until
        self._buckets: dict[int, _Cell] = {}  # bucket -> its requests so far
        self._windows: dict[int, dict[int, _Cell]] = {i: {} for i in self._next}  # window rule -> window -> its requests
        self._ended: list[int] = []  # buckets whose time ended and whose bucket rules wait for their requests
        self._closed: set[int] = set()  # buckets whose bucket rules are all evaluated
        self._drained = False

    def _window_of(self, i: int, t: float) -> int:
        """The window of rule `i` that holds time `t` (as `tick` cuts them: [start, next start),
        the last one holding everything after its start)."""
        return windows.holding(self._starts[i], t)

    def _window_end(self, i: int, j: int) -> float:
        """Where window `j` of rule `i` ends: the next one's start, the last at the level's end."""
        assert self._level is not None
        starts = self._starts[i]
        return starts[j + 1] if j + 1 < len(starts) else self._level[4]

    def started(self, bucket: int, start: float | None) -> None:
        """A request of `bucket` of the current level, counted from `start` (its intended start,
        else its start), was started (sent or not)."""
        if not self._known or not self.rules or self._level is None or bucket < 0:
            return
        self._buckets.setdefault(bucket, _Cell()).started += 1
        if start is not None:
            for i, cells in self._windows.items():
                if (j := self._window_of(i, start)) >= self._next[i]:
                    cells.setdefault(j, _Cell()).started += 1

    def started_until(self, t: float) -> None:
        """Every request started before `t` has been reported (`started`)."""
        self._until = t

    @property
    def watching(self) -> bool:
        """Whether finished records can still fire a rule (`observe` takes none otherwise): the
        caller then need not build their `Row`s."""
        return bool(self.rules) and self.fired is None

    def observe(self, rows: Iterable[Row], now: float, unsent: Iterable[tuple[int, float | None]] = ()) -> None:
        """Records finished; `unsent`: the (bucket, intended start) of requests the load generator
        could not send (no abort rule counts them, and they are not in flight either)."""
        if not self.watching:
            return
        for r in rows:
            if r.bucket >= 0:
                self._rows.append(r)
                self._finished(r.bucket, r.start, r.outcome)
        for b, start in unsent:
            if b >= 0:
                self._finished(b, start, "")
        self.tick(now)

    def _finished(self, bucket: int, start: float | None, outcome: str) -> None:
        if self._level is None:
            return
        self._buckets.setdefault(bucket, _Cell()).finish(outcome)
        if start is not None:
            for i, cells in self._windows.items():
                if (j := self._window_of(i, start)) >= self._next[i]:
                    cells.setdefault(j, _Cell()).finish(outcome)

    def bucket_done(self, k: int, now: float) -> None:
        """Bucket `k` of the level has ended: its `per bucket` rules are judged once its requests
        have (module docstring), then any finished window."""
        if self._level is None or self.fired is not None:
            return
        self._ended.append(k)
        m, stop, blen = self._level[3], self._level[4], self._level[5]
        # the bucket has ended, whatever the float of `now` says: a window ending with it is over
        self.tick(max(now, min(m + (k + 1) * blen, stop)))

    def level_drained(self, now: float) -> None:
        """The level's load has ended and every request it sent has finished: whatever waited for
        its requests is judged now."""
        if self._level is None or self.fired is not None:
            return
        self._drained = True
        self.tick(max(now, self._level[4]))

    def _unfinished(self, cell: _Cell | None, end: float) -> int | None:
        """Requests of a bucket or window ending at `end` still in flight (None: unknown)."""
        if self._drained:
            return 0
        if not self._known or end > self._until:
            return None
        return 0 if cell is None else cell.unfinished()

    @staticmethod
    def _early(rule: AbortRule, cell: _Cell | None, u: int | None) -> bool:
        """An outcome rule that holds whatever the `u` unfinished requests turn out to be."""
        if u is None or cell is None or rule.metric not in OUTCOMES:
            return False
        n = sum(v for o, v in cell.outcomes.items() if o)
        if n < max(1, rule.min_requests):
            return False
        c = sum(v for o, v in cell.outcomes.items() if o and OUTCOMES[rule.metric](o))
        lo, hi = ((c / (n + u), (c + u) / (n + u)) if rule.agg == "ratio" else (float(c), float(c + u)))
        return _certain(rule.op, lo, hi, rule.threshold)

    def _judge_buckets(self, now: float) -> bool:
        """Judge the `per bucket` rules of every ended bucket whose requests have finished (or
        that fire whatever they turn out to be); True when a bucket was closed."""
        assert self._level is not None
        _, _, _, m, stop, blen = self._level
        closed = False
        for k in list(self._ended):
            cell = self._buckets.get(k)
            end = min(m + (k + 1) * blen, stop)
            u = self._unfinished(cell, end)
            settled = u == 0 or now >= end + self._wait
            rows: list[Row] | None = None
            for i, rule in enumerate(self.rules):
                if rule.scope != "bucket" or (i, k) in self._done or self.fired is not None:
                    continue
                if settled or self._early(rule, cell, u):
                    self._done.add((i, k))
                    rows = [r for r in self._rows if r.bucket == k] if rows is None else rows
                    self._evaluate(i, rule, k, rows, m + k * blen, m + (k + 1) * blen, now)
            if self.fired is not None:
                return closed
            if settled:
                self._ended.remove(k)
                self._closed.add(k)
                self._buckets.pop(k, None)
                closed = True
        return closed

    def _prune(self) -> None:
        """Forget the rows no rule will read again (memory stays bounded over a long soak)."""
        assert self._level is not None
        keep_from = min((self._starts[i][j] if j < len(self._starts[i]) else self._level[4] for i, j in self._next.items()),
                        default=math.inf)
        self._rows = [r for r in self._rows if r.bucket not in self._closed or (r.start is not None and r.start >= keep_from)]

    def tick(self, now: float) -> None:
        """Judge what has finished by `now`: ended buckets whose requests have, then every
        `per window` rule on each window that has, once, in order. Called on every batch of
        records: its work is what finished since the last call, not every window of the level
        (a day of 1 s windows is 86,400)."""
        if self._level is None or self.fired is not None:
            return
        changed = self._judge_buckets(now)
        if self.fired is not None:
            return
        for i, j in self._next.items():
            rule = self.rules[i]
            # the judge's windows (judge.scope.window_scopes; level_started)
            starts = self._starts[i]
            n = len(starts)
            cells = self._windows[i]
            while j < n:
                start, end = starts[j], self._window_end(i, j)
                last = j == n - 1
                if now < end:
                    break
                if self.fired is not None:
                    return
                cell = cells.get(j)
                u = self._unfinished(cell, end)
                if u != 0 and now < end + self._wait and not self._early(rule, cell, u):
                    break  # its requests are still in flight; the later windows wait behind it
                self._next[i] = j + 1
                cells.pop(j, None)
                changed = True
                rows = [r for r in self._rows
                        if r.start is not None and start <= r.start and (r.start < end or (last and r.start <= end))]
                self._evaluate(i, rule, j, rows, start, end, now)
                j += 1
        if changed and self.fired is None:
            self._prune()

    def _evaluate(self, i: int, rule: AbortRule, j: int, rows: list[Row], start: float, end: float, now: float) -> None:
        fires, v = holds(rule, rows)
        if not fires or v is None or self._level is None:
            return
        workload, index, label, *_ = self._level
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.cause or r.outcome] = counts.get(r.cause or r.outcome, 0) + 1
        outcomes = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        refused = next((c for c, _ in outcomes if any(r.cause == c and r.gone == GONE_REFUSED for r in rows)), "")
        self.fired = Fired(rule, self.backend, workload, index, label, rule.scope, j, start, end, now, v, len(rows),
                           outcomes, server_gone(rows), refused)
        if self.on_fire is not None:
            self.on_fire(self.fired)


__all__ = ["AbortWatch", "Fired", "Row", "cause_of", "holds", "row_of", "server_gone", "value"]
