"""The evidence, arranged: requests by backend, level and bucket (pure, spec-free).

`index(evidence)` builds one `BackendIndex` per backend of the evidence: its levels as the
manifest lists them (`LevelIndex`), each level's buckets (`Window`, the wall-clock windows
the manifest records) with the measured requests that started in them, in time order; the
requests no listed level owns (orphans); the matched traces; the telemetry samples in time
order. A *measured* request is one with bucket >= 0 (not warm-up -1, not follow-up -2).

This is the one place that reads request rows into the judge's structure: scopes
(`soakspec.judge.scope`), measures (`soakspec.judge.measures`), rules and results.json all
read the index, never the raw rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from soakspec.judge.evidence import BackendEvidence, Evidence

Row = Mapping[str, Any]
FOLLOW_UP_BUCKET = -2  # the clean follow-up request after the last level (warm-up is -1)


def num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer beyond any float: not a measurement
        return None
    return f if math.isfinite(f) else None


def req_time(r: Row) -> float | None:
    """When a request counts as started: its intended start (open loop), else its start."""
    t = num(r.get("intended_start"))
    return t if t is not None else num(r.get("start"))


def error_message(r: Row) -> str:
    """A request's error text, or what its outcome was when it has none."""
    err = r.get("error")
    return err if isinstance(err, str) and err else f"{r.get('outcome')} (no message)"


def order(r: Row) -> tuple:
    t = req_time(r)
    return (t if t is not None else math.inf, str(r.get("request_id")))


@dataclasses.dataclass(frozen=True)
class Window:
    """One bucket (or `per window` slice) of a level: its wall-clock window and its requests."""

    index: int
    start: float | None
    end: float | None
    planned_length_s: float | None
    records: tuple[Row, ...]  # measured requests that started in it, in time order
    planned: bool = True  # listed in the manifest (False: only requests name it)

    @property
    def wall_s(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return max(0.0, self.end - self.start)


@dataclasses.dataclass(frozen=True)
class LevelIndex:
    backend: str
    workload: str
    index: int
    entry: Mapping[str, Any]
    label: str
    buckets: tuple[Window, ...]

    @property
    def records(self) -> tuple[Row, ...]:
        return tuple(r for b in self.buckets for r in b.records)

    @property
    def measure_start(self) -> float | None:
        return num(self.entry.get("measure_start"))

    @property
    def measure_end(self) -> float | None:
        return num(self.entry.get("measure_end"))

    @property
    def key(self) -> tuple[str, int]:
        return (self.workload, self.index)


@dataclasses.dataclass(frozen=True)
class BackendIndex:
    evidence: BackendEvidence
    levels: tuple[LevelIndex, ...]
    orphans: tuple[Row, ...]  # measured requests whose level the manifest does not list
    all_records: tuple[Row, ...]  # every request of the backend (warm-up and follow-up too)
    traced: frozenset[str]  # request ids with a matched trace
    payloads: Mapping[str, tuple[Mapping[str, Any], ...]]  # request id -> matched trace payloads
    samples: tuple[Row, ...]  # telemetry rows in time order
    recorded: Mapping[tuple[Any, Any], int]  # (workload, level) -> requests recorded (warm-up too, no follow-up)

    @property
    def name(self) -> str:
        return self.evidence.name

    @property
    def measured(self) -> tuple[Row, ...]:
        return tuple(sorted([r for lv in self.levels for r in lv.records] + list(self.orphans), key=order))

    @property
    def trace_source(self) -> str:
        ts = self.evidence.entry.get("trace_source")
        return ts if isinstance(ts, str) else "none"


def level_label(entry: Mapping[str, Any], with_workload: bool = False) -> str:
    """`concurrency 8`, `rate 2 rps`, `concurrency 4 (batches of 8)` -- as the plan prints it."""
    mode = entry.get("mode")
    shape = entry.get("shape")
    if isinstance(entry.get("label"), str) and (entry.get("phase") or isinstance(shape, Mapping) and shape.get("kind") == "replay"):
        text = entry["label"]  # a phase (`phase burst, rate 40 rps`) or a replay: the plan's own label
    elif mode == "open":
        rate = num(entry.get("rate"))
        text = f"rate {rate:g} rps" if rate is not None else "rate ?"
    elif mode == "batch":
        text = f"concurrency {entry.get('concurrency')} (batches of {entry.get('batch_requests')})"
    else:
        text = f"concurrency {entry.get('concurrency')}"
    if with_workload:
        return f"{entry.get('workload')} / {text}"
    return text


def _level_entries(be: BackendEvidence) -> list[Mapping[str, Any]]:
    lv = be.entry.get("levels")
    return [e for e in lv if isinstance(e, Mapping)] if isinstance(lv, list) else []



def _records_by_level(be: BackendEvidence, keys: set[tuple[Any, Any]]) -> tuple[dict[tuple[Any, Any], list[Row]], list[Row]]:
    """Measured requests by (workload, level) of a listed level; the rest are orphans."""
    by_level: dict[tuple[Any, Any], list[Row]] = {}
    orphans: list[Row] = []
    for r in be.records:
        if r.get("bucket", -1) < 0:
            continue
        k = (r.get("workload"), r.get("level"))
        if k in keys:
            by_level.setdefault(k, []).append(r)
        else:
            orphans.append(r)
    return by_level, orphans


def _windows(e: Mapping[str, Any], recs: list[Row]) -> tuple[Window, ...]:
    """The level's buckets: those the manifest lists (first listing wins), then any that only
    requests name, in bucket order."""
    by_bucket: dict[int, list[Row]] = {}
    for r in recs:
        by_bucket.setdefault(int(r["bucket"]), []).append(r)
    windows = []
    listed = set()
    for bk in e.get("buckets") or []:
        if not isinstance(bk, Mapping) or not isinstance(bk.get("index"), int):
            continue
        i = bk["index"]
        if i in listed:
            continue
        listed.add(i)
        windows.append(Window(i, num(bk.get("start")), num(bk.get("end")), num(bk.get("planned_length_s")), tuple(by_bucket.get(i, ()))))
    for i in sorted(set(by_bucket) - listed):
        windows.append(Window(i, None, None, None, tuple(by_bucket[i]), planned=False))
    windows.sort(key=lambda w: w.index)
    return tuple(windows)


def _traces(be: BackendEvidence) -> tuple[frozenset[str], dict[str, tuple[Mapping[str, Any], ...]]]:
    """Request ids with a matched trace, and each one's trace payloads."""
    traced: set[str] = set()
    payloads: dict[str, list[Mapping[str, Any]]] = {}
    for t in be.traces:
        rid = t.get("request_id")
        if t.get("matched") is True and isinstance(rid, str):
            traced.add(rid)
            p = t.get("payload", t.get("trace"))
            if isinstance(p, Mapping):
                payloads.setdefault(rid, []).append(p)
    return frozenset(traced), {k: tuple(v) for k, v in payloads.items()}


def index_backend(be: BackendEvidence) -> BackendIndex:
    entries = _level_entries(be)
    workloads = {e.get("workload") for e in entries}
    by_level, orphans = _records_by_level(be, {(e.get("workload"), e.get("index")) for e in entries})
    levels = []
    for e in entries:
        recs = sorted(by_level.get((e.get("workload"), e.get("index")), []), key=order)
        levels.append(
            LevelIndex(be.name, str(e.get("workload")), int(e.get("index", 0)) if isinstance(e.get("index"), int) else 0,
                       e, level_label(e, len(workloads) > 1), _windows(e, recs))
        )
    traced, payloads = _traces(be)
    recorded = Counter((r.get("workload"), r.get("level")) for r in be.records if r.get("bucket") != FOLLOW_UP_BUCKET)
    samples = sorted((s for s in be.telemetry if num(s.get("t")) is not None), key=lambda s: float(s["t"]))
    return BackendIndex(
        be, tuple(levels), tuple(sorted(orphans, key=order)), tuple(sorted(be.records, key=order)),
        traced, payloads, tuple(samples), dict(recorded),
    )


def index(evidence: Evidence) -> tuple[BackendIndex, ...]:
    """One `BackendIndex` per backend of the evidence, in the evidence's order."""
    return tuple(index_backend(b) for b in evidence.backends)
