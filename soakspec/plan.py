"""Spec -> Plan: what a run will do, in order, before anything runs.

`plan(spec)` is pure. For each backend (in spec order, one after another unless the spec
says `parallel = true`) it lists workloads × load levels × buckets with their wall-clock
offsets, the expected request count and the expected wall time.

Time model (the runner implements exactly this):
  - a level runs for `warmup + duration`; warmup requests are recorded but belong to no bucket;
  - buckets are fixed wall-clock windows of `bucket` length from the end of the warmup; the
    last one may be shorter when the duration is not a whole number of buckets;
  - no request starts after the level's end; a request belongs to the bucket in which it
    started, so a level drains for at most one request deadline after its end;
  - after the last level, one clean follow-up request (smallest shape, concurrency 1).

Request counts: open-loop levels expect `rate × duration`. Closed-loop and batch levels
depend on the server's speed: the plan gives the minimum (one request per worker, one batch)
and, when the workload sets `expected_latency`, an estimate of `concurrency × duration /
expected_latency`.
"""

from __future__ import annotations

import dataclasses
import math

from soakspec.lang.spec import Backend, Spec, Workload
from soakspec.units import format_duration


@dataclasses.dataclass(frozen=True)
class Bucket:
    index: int
    start_s: float  # offset from the start of the level's measured part
    length_s: float


@dataclasses.dataclass(frozen=True)
class Level:
    workload: str
    index: int  # position in the workload's level list
    mode: str  # closed | batch | open
    concurrency: int | None
    rate: float | None
    batch_requests: int | None
    warmup_s: float
    duration_s: float
    deadline_s: float
    buckets: tuple[Bucket, ...]
    min_requests: int
    expected_requests: int | None

    @property
    def label(self) -> str:
        if self.mode == "open":
            return f"rate {self.rate:g} rps"
        if self.mode == "batch":
            return f"concurrency {self.concurrency} (batches of {self.batch_requests})"
        return f"concurrency {self.concurrency}"


@dataclasses.dataclass(frozen=True)
class BackendPlan:
    backend: Backend
    levels: tuple[Level, ...]
    follow_up: bool
    follow_up_deadline_s: float
    est_wall_s: float  # load time: warmups + durations (+ follow-up estimate)
    max_wall_s: float  # upper bound: + ready timeout, drains, follow-up deadline, shutdown grace

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def min_requests(self) -> int:
        return sum(lv.min_requests for lv in self.levels)

    @property
    def expected_requests(self) -> int | None:
        vals = [lv.expected_requests for lv in self.levels]
        return None if any(v is None for v in vals) else sum(vals)  # type: ignore[misc]


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: Spec
    backends: tuple[BackendPlan, ...]
    parallel: bool
    time_scale: float = 1.0
    rehearsal: bool = False

    @property
    def est_wall_s(self) -> float:
        vals = [b.est_wall_s for b in self.backends]
        return (max(vals) if self.parallel else sum(vals)) if vals else 0.0

    @property
    def max_wall_s(self) -> float:
        vals = [b.max_wall_s for b in self.backends]
        return (max(vals) if self.parallel else sum(vals)) if vals else 0.0

    @property
    def bucket_count(self) -> int:
        return sum(len(lv.buckets) for b in self.backends for lv in b.levels)

    def __repr__(self) -> str:
        return render_text(self)


def _buckets(duration: float, bucket: float) -> tuple[Bucket, ...]:
    n = max(1, math.ceil(duration / bucket - 1e-9))
    out = []
    for i in range(n):
        start = i * bucket
        out.append(Bucket(i, start, min(bucket, duration - start)))
    return tuple(out)


def _levels(w: Workload, scale: float) -> list[Level]:
    out = []
    duration = w.duration_s * scale
    bucket = w.bucket_s * scale
    warmup = w.warmup_s * scale
    deadline = w.deadline_s * scale
    latency = w.expected_latency_s * scale if w.expected_latency_s else None
    load = w.load
    for i, level in enumerate(load.levels):
        if load.mode == "open":
            expected = int(round(level * duration))
            minimum = expected
            conc, rate = None, float(level)
        else:
            conc, rate = int(level), None
            minimum = load.requests if load.mode == "batch" else conc
            expected = max(minimum, int(conc * duration / latency)) if latency else None
        out.append(
            Level(
                workload=w.name,
                index=i,
                mode=load.mode,
                concurrency=conc,
                rate=rate,
                batch_requests=load.requests,
                warmup_s=warmup,
                duration_s=duration,
                deadline_s=deadline,
                buckets=_buckets(duration, bucket),
                min_requests=minimum,
                expected_requests=expected,
            )
        )
    return out


def plan(spec: Spec, *, time_scale: float = 1.0, rehearse: bool = False, only: tuple[str, ...] = ()) -> Plan:
    """Build the plan. `time_scale` shrinks every duration, bucket and deadline (rehearsals);
    `only` restricts the run to the named backends (names are checked by the caller)."""
    if not 0 < time_scale <= 1:
        raise ValueError("time_scale must be in (0, 1]")
    backends = []
    for b in spec.backends:
        if only and b.name not in only:
            continue
        levels: list[Level] = []
        for w in spec.workloads:
            levels.extend(_levels(w, time_scale))
        follow = any(w.follow_up for w in spec.workloads)
        follow_deadline = min((w.deadline_s for w in spec.workloads), default=0.0) * time_scale
        follow_est = min((w.expected_latency_s or 0.0 for w in spec.workloads), default=0.0) * time_scale if follow else 0.0
        est = sum(lv.warmup_s + lv.duration_s for lv in levels) + follow_est
        ready_timeout = b.ready.timeout_s * (time_scale if rehearse else 1.0) if b.launches else b.ready.timeout_s
        upper = (
            est
            + (ready_timeout if b.launches or b.kind == "url" else 0.0)
            + sum(lv.deadline_s for lv in levels)
            + (follow_deadline if follow else 0.0)
            + (b.shutdown_grace_s if b.launches else 0.0)
        )
        backends.append(BackendPlan(b, tuple(levels), follow, follow_deadline, est, upper))
    return Plan(spec, tuple(backends), spec.header.parallel, time_scale, rehearse)


# ---------------------------------------------------------------- rendering


def render_text(p: Plan) -> str:
    spec = p.spec
    lines = [f"plan for soak '{spec.header.name}'" + (f" ({spec.header.issue})" if spec.header.issue else "")]
    if p.rehearsal or p.time_scale != 1:
        lines.append(f"  rehearsal: {'yes (backends replaced by the simulator)' if p.rehearsal else 'no'}, time scale {p.time_scale:g}")
    n_levels = {len(b.levels) for b in p.backends}
    n_buckets = {len(lv.buckets) for b in p.backends for lv in b.levels}
    shape = f"{len(p.backends)} backend{'s' if len(p.backends) != 1 else ''}"
    if len(n_levels) == 1:
        shape += f" × {n_levels.pop()} levels"
    if len(n_buckets) == 1:
        shape += f" × {n_buckets.pop()} buckets"
    lines.append(f"  shape: {shape} = {p.bucket_count} buckets in all; backends run {'side by side' if p.parallel else 'one after another'}")
    for b in p.backends:
        be = b.backend
        how = {
            "launch": "launch " + " ".join(be.argv),
            "shell": f"shell: {be.shell}",
            "url": f"already running at {be.url}",
            "sim": "embedded simulator",
        }[be.kind]
        rt = be.runtime.label if be.runtime else "(none declared)"
        lines.append(f"  backend '{be.name}': {how}")
        lines.append(f"    runtime boundary: {rt}; traces: {be.traces.source}")
        for lv in b.levels:
            exp = f"~{lv.expected_requests}" if lv.expected_requests is not None else "?"
            warm = f" after {format_duration(lv.warmup_s)} warmup" if lv.warmup_s else ""
            blen = format_duration(lv.buckets[0].length_s)
            lines.append(
                f"    {lv.workload} / {lv.label}: {format_duration(lv.duration_s)}{warm} in "
                f"{len(lv.buckets)} × {blen} buckets; requests ≥ {lv.min_requests}, expected {exp}"
            )
        if b.follow_up:
            lines.append("    then one clean follow-up request")
        exp = b.expected_requests
        lines.append(
            f"    requests: ≥ {b.min_requests}" + (f", expected ~{exp}" if exp is not None else " (set expected_latency for an estimate)")
            + f"; wall time ≈ {format_duration(b.est_wall_s)} (at most {format_duration(b.max_wall_s)} with startup, drains and shutdown)"
        )
    total_exp = [b.expected_requests for b in p.backends]
    exp_text = f", expected ~{sum(total_exp)}" if total_exp and all(v is not None for v in total_exp) else ""  # type: ignore[misc]
    lines.append(
        f"  total: requests ≥ {sum(b.min_requests for b in p.backends)}{exp_text}; "
        f"wall time ≈ {format_duration(p.est_wall_s)} (at most {format_duration(p.max_wall_s)})"
    )
    return "\n".join(lines)


def to_json(p: Plan) -> dict:
    return {
        "schema_version": 1,
        "soak": p.spec.header.name,
        "issue": p.spec.header.issue,
        "spec_sha256": p.spec.sha256,
        "parallel": p.parallel,
        "time_scale": p.time_scale,
        "rehearsal": p.rehearsal,
        "bucket_count": p.bucket_count,
        "min_requests": sum(b.min_requests for b in p.backends),
        "expected_requests": (
            sum(b.expected_requests for b in p.backends)  # type: ignore[misc]
            if all(b.expected_requests is not None for b in p.backends)
            else None
        ),
        "est_wall_s": round(p.est_wall_s, 3),
        "max_wall_s": round(p.max_wall_s, 3),
        "backends": [
            {
                "name": b.name,
                "kind": b.backend.kind,
                "runtime_boundary": b.backend.runtime.label if b.backend.runtime else None,
                "min_requests": b.min_requests,
                "expected_requests": b.expected_requests,
                "est_wall_s": round(b.est_wall_s, 3),
                "max_wall_s": round(b.max_wall_s, 3),
                "follow_up": b.follow_up,
                "levels": [
                    {
                        "workload": lv.workload,
                        "index": lv.index,
                        "mode": lv.mode,
                        "concurrency": lv.concurrency,
                        "rate": lv.rate,
                        "batch_requests": lv.batch_requests,
                        "warmup_s": lv.warmup_s,
                        "duration_s": lv.duration_s,
                        "deadline_s": lv.deadline_s,
                        "min_requests": lv.min_requests,
                        "expected_requests": lv.expected_requests,
                        "buckets": [{"index": bk.index, "start_s": bk.start_s, "length_s": bk.length_s} for bk in lv.buckets],
                    }
                    for lv in b.levels
                ],
            }
            for b in p.backends
        ],
    }
