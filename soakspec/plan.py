"""Spec -> Plan: everything a run will do, in order, resolved before anything runs.

`plan(spec)` is pure (it reads no file and starts nothing). It is the whole truth the runner
acts on: the runner imports nothing from `soakspec.lang` and never looks at the `Spec`.

For each backend (in spec order, one after another unless the spec says `parallel = true`):
  - its `Launch`: kind, the exact command (argv, or `/bin/sh -c` for a shell backend) with only
    `{port}` and `{url}` left for the runner to fill in once it has a free port, the env the spec
    sets (with `CUDA_VISIBLE_DEVICES` from `gpus`), the working directory, the readiness `Probe`
    (path, status, timeout, interval), the shutdown grace and the SIGKILL wait, log capture;
  - its `TracePlan` (where server traces come from, how ids are matched), its runtime declaration;
  - its levels: workload × load level, each with its `LoadShape` (`Closed`, `Batch` or `Open`),
    its `RequestTemplate` and its buckets with their wall-clock offsets, the expected request
    count and the expected wall time.

A rehearsal (`rehearse=True`) is decided here, once: every backend becomes the embedded
simulator (`Launch.kind == "sim"`), with its output captured and its traces read from its log,
a readiness timeout of at most `REHEARSAL_READY_TIMEOUT_S` and a grace of at most
`REHEARSAL_GRACE_S`; telemetry is sampled at the scaled interval.

Time model (the runner implements exactly this):
  - a level runs for `warmup + duration`; warmup requests are recorded but belong to no bucket;
  - buckets are fixed wall-clock windows of `bucket` length from the end of the warmup; the
    last one may be shorter when the duration is not a whole number of buckets;
  - no request starts after the level's end; a request belongs to the bucket in which it
    started, so a level drains for at most one request deadline after its end;
  - after the last level, one clean follow-up request (the smallest shape of the first workload
    with `follow_up = true`, concurrency 1).

Request counts: open-loop levels expect `rate × duration`: constant arrivals send exactly that
many measured requests (the minimum too); seeded Poisson or gamma arrivals vary around it, so
their minimum is 0 (`_open_minimum`) and the plan prints the expected count with its spread,
three standard deviations either side (`lang.samples.arrival_count_spread`, W515's rule); a
level that ends at its `requests_per_level` N sends N whatever its arrivals (`_reaches_count`),
so the plan says N, and its warmup's estimate (`expected_warmup_requests`). With a
`min_duration` its floor (`min_requests`, in its line, its backend's and the total) is N --
closed or random arrivals alike -- or, constant arrivals, every arrival due before the minimum
where those are more. Closed-loop and batch levels
depend on the server's speed: the plan gives the minimum (one request per worker, one batch)
and, when the workload sets `expected_latency`, an estimate: a closed loop `concurrency ×
duration / expected_latency`; a batch level the requests its batches start in the measured
window, each batch ceil(requests / concurrency) latencies with a barrier after it
(`lang/batches.py`, the runner's `_batch` in fixed latency).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from soakspec.diagnostics import terminal_safe
from soakspec.evidence.redact import redact_argv, redact_env, scrub, secret_values
from soakspec.evidence.runtime import RuntimeDecl as BoundaryDecl
from soakspec import lengths
from soakspec.arrivals import nth_arrival_s
from soakspec.lang import simtrace
from soakspec.lang.batches import batch_requests
from soakspec.lang.replay import sharing
from soakspec.lang.samples import COUNT_SIGMAS, arrival_count_spread
from soakspec.lang.spec import Backend, Spec, Workload
from soakspec.sim.config import sim_argv
from soakspec import windows
from soakspec.units import format_duration

HOST = "127.0.0.1"  # launched servers listen here; the port is picked at launch
PORT, URL = "{port}", "{url}"  # the only fields a planned command still has (filled in at launch)
REHEARSAL_READY_TIMEOUT_S = 60.0  # the simulator is ready in well under a second
REHEARSAL_GRACE_S = 5.0  # and stops at once on SIGTERM
KILL_WAIT_S = 5.0  # after SIGKILL, for the process to be reaped
PROBE_ATTEMPT_MIN_S = 1.0  # one readiness request: max(this, 4 × interval)
# Liveness during the run (see `Liveness`): the readiness request again, every LIVENESS_INTERVAL_S
LIVENESS_INTERVAL_S = 1.0
LIVENESS_GRACE_S = 5.0  # refused connections / failing probes this long: the backend is dead
LIVENESS_ATTEMPT_S = 2.0  # one liveness probe waits at most this long
LIVENESS_HANG_S = 60.0  # probes that get no answer at all (but no refusal) this long: dead too
BACKOFF_BASE_S = 0.05  # after a refused connection the load waits this long, doubling per refusal,
BACKOFF_MAX_S = 1.0  # up to this; one request at a time tries again
TELEMETRY_MIN_INTERVAL_S = 0.5
PROGRESS_INTERVAL_S = 0.25
# An open loop without `max_concurrency`: the load generator's own limit on a level's requests
# in flight (connections; split over --workers processes). An arrival past it waits for a
# connection and is sent late -- the client's limit, charged as its schedule lag (client_healthy)
OPEN_LOOP_MAX_CONNECTIONS = 4096


# ---------------------------------------------------------------- load shapes


@dataclasses.dataclass(frozen=True)
class Closed:
    """`concurrency` workers, each sending its next request as soon as its last one ends."""

    concurrency: int
    # a fixed count: the level sends exactly this many measured requests (after its warmup), then
    # ends once they have finished, its duration the upper bound (`load { requests_per_level }`)
    requests_per_level: int | None = None
    # with a count: it sends until that long has passed from its measured start too (`load {
    # min_duration }`, MLPerf LoadGen's min_duration), time-scaled as the duration is
    min_duration_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Batch:
    """Batches of `requests` at `concurrency`, back to back (the old harness's "leaf")."""

    concurrency: int
    requests: int


@dataclasses.dataclass(frozen=True)
class Open:
    """Requests at `rate` per second on a constant or seeded Poisson schedule."""

    rate: float
    arrival: str  # constant | poisson
    seed: int  # the workload's seed + the level's index
    burstiness: float = 1.0  # poisson: gamma inter-arrival times of this shape (1: exponential), vLLM's --burstiness
    # at most this many requests in flight, later arrivals waiting in order (vLLM's
    # --max-concurrency); None: the load generator's connection limit (runner/load.py)
    max_concurrency: int | None = None
    # a fixed count: the first this many arrivals after the warmup, then the level ends once they
    # have finished, its duration the upper bound (vLLM's --num-prompts; as `Closed`'s)
    requests_per_level: int | None = None
    min_duration_s: float | None = None  # with a count: arrivals go on until this long has passed too (as `Closed`'s)


def _round_half_up(v: float) -> int:
    return int(math.floor(v + 0.5 + 1e-9))


@dataclasses.dataclass(frozen=True)
class ClosedRamp:
    """Closed-loop workers from `start` to `end` over the level's measured duration (a warmup
    before it holds `start`): linearly, or with `steps` in that many equal steps (`steps + 1`
    values, each held for an equal share of the duration). The target at time t is rounded half
    up; a worker above the target finishes its request and stops (a graceful ramp-down, as
    k6's), one below it starts at once."""

    start: int
    end: int
    steps: int = 0

    @property
    def peak(self) -> int:
        return max(self.start, self.end)

    def targets(self, length_s: float) -> tuple[tuple[float, int], ...]:
        """(offset from the ramp's start -- the end of the warmup --, workers) at every change, from (0, start)."""
        a, b = self.start, self.end
        out = [(0.0, a)]
        if self.steps:
            for j in range(1, self.steps + 1):
                out.append((length_s * j / (self.steps + 1), _round_half_up(a + (b - a) * j / self.steps)))
        elif b > a:
            out += [(length_s * (k - 0.5 - a) / (b - a), k) for k in range(a + 1, b + 1)]
        elif b < a:
            out += [(length_s * (a - k - 0.5) / (a - b), k) for k in range(a - 1, b - 1, -1)]
        kept = [out[0]]
        for t, n in out[1:]:
            if n != kept[-1][1]:
                kept.append((t, n))
        return tuple(kept)

    def mean(self, length_s: float) -> float:
        """The time-averaged target (for the plan's request estimate)."""
        return self.mean_between(0.0, length_s, length_s)

    def mean_between(self, a: float, b: float, length_s: float) -> float:
        """The time-averaged target over [a, b) (offsets from the ramp's start, 0 <= a; the end
        held after it): the concurrency a bucket of the ramp offered."""
        if b <= a:
            return float(self.start)
        return (self._integral(b, length_s) - self._integral(a, length_s)) / (b - a)

    def _integral(self, t: float, length_s: float) -> float:
        """The target's integral over [0, t) (t >= 0): worker-seconds."""
        times, areas, counts = _closed_ramp_areas(self, length_s)
        i = max(0, bisect.bisect_right(times, t) - 1)
        return areas[i] + (t - times[i]) * counts[i]


@functools.lru_cache(maxsize=16)
def _closed_ramp_areas(ramp: ClosedRamp, length_s: float) -> tuple[tuple[float, ...], tuple[float, ...], tuple[int, ...]]:
    """A ramp's target changes (times, counts) and the target's integral up to each: made once
    per ramp, so a level's every bucket reads its offer in O(log changes) (a linear ramp from 1
    to 1,000,000 workers changes a million times)."""
    pts = ramp.targets(length_s)
    areas = [0.0]
    for (t0, n), (t1, _) in zip(pts, pts[1:]):
        areas.append(areas[-1] + (t1 - t0) * n)
    return tuple(t for t, _ in pts), tuple(areas), tuple(n for _, n in pts)


@dataclasses.dataclass(frozen=True)
class OpenRamp:
    """Open-loop arrivals whose rate goes from `start` to `end` requests/s over the level's
    measured duration (a warmup before it holds `start`), linearly or in `steps` equal steps.
    Arrivals are a unit-rate process (constant: one per unit; poisson: exponential gaps;
    burstiness != 1: gamma gaps) mapped through the inverse of the cumulative rate (the
    time-rescaling theorem), so every arrival process keeps its meaning at every instantaneous
    rate."""

    start: float
    end: float
    steps: int
    arrival: str  # constant | poisson
    seed: int
    burstiness: float = 1.0
    max_concurrency: int | None = None  # as `Open`'s

    @property
    def peak(self) -> float:
        return max(self.start, self.end)

    def segments(self, length_s: float) -> tuple[tuple[float, float, float, float], ...]:
        """(t0, t1, rate at t0, rate at t1): the rate is linear inside each segment."""
        a, b, s = self.start, self.end, self.steps
        if not s:
            return ((0.0, length_s, a, b),)
        out = []
        for j in range(s + 1):
            v = a + (b - a) * j / s
            out.append((length_s * j / (s + 1), length_s * (j + 1) / (s + 1), v, v))
        return tuple(out)

    def expected(self, length_s: float) -> float:
        """Arrivals expected in the ramp: the integral of the rate."""
        return math.fsum((t1 - t0) * (r0 + r1) / 2 for t0, t1, r0, r1 in self.segments(length_s))

    def cumulative(self, t: float, length_s: float) -> float:
        """Arrivals expected in [0, t): the rate's integral."""
        out = 0.0
        for t0, t1, r0, r1 in self.segments(length_s):
            if t <= t0:
                break
            u = min(t, t1) - t0
            out += r0 * u + (r1 - r0) * u * u / (2 * (t1 - t0))
        return out

    def mean_between(self, a: float, b: float, length_s: float) -> float:
        """The mean rate over [a, b) of the ramp (offsets from its start, 0 <= a < b): the rate
        a bucket of the ramp offered."""
        return (self.cumulative(b, length_s) - self.cumulative(a, length_s)) / (b - a) if b > a else self.start

    def time_of(self, s: float, length_s: float) -> float | None:
        """The offset at which the cumulative rate reaches `s` (None: beyond the level)."""
        for t0, t1, r0, r1 in self.segments(length_s):
            area = (t1 - t0) * (r0 + r1) / 2
            if s < area:
                if abs(r1 - r0) < 1e-12:
                    return t0 + s / r0
                k = (r1 - r0) / (2 * (t1 - t0))  # cumulative: r0 τ + k τ²
                return t0 + (2 * s) / (r0 + math.sqrt(r0 * r0 + 4 * k * s))  # the stable root
            s -= area
        return None


@dataclasses.dataclass(frozen=True)
class Replay:
    """Requests at a trace file's arrival offsets (divided by `speed`), each with its own prompt
    length (input_length words, or tokens with token-exact prompts) and max_tokens (its
    output_length). The trace travels in the plan: the runner never reads the file."""

    source: str  # the trace file (absolute)
    format: str  # mooncake
    sha256: str
    speed: float
    offsets_s: tuple[float, ...] = dataclasses.field(repr=False)
    input_lens: tuple[int, ...] = dataclasses.field(repr=False)
    output_lens: tuple[int, ...] = dataclasses.field(repr=False)
    max_concurrency: int | None = None  # as `Open`'s
    # prefix sharing: per request its trace line's hash_ids (empty: no shared blocks, every
    # prompt unique), and over the requests the level sends (its warmup's too) how many blocks
    # their prompts hold and how many distinct ones (`sharing`); the block size and seed are the
    # template's (`RequestTemplate.hash_block`, `block_seed`), and recorded with the shape (`block`)
    hash_ids: tuple[tuple[int, ...], ...] = dataclasses.field(default=(), repr=False)
    blocks: int = 0
    distinct_blocks: int = 0
    outrun: int = 0  # requests whose hash_ids outrun their input length (ids not sent)
    block: tuple[int, str, int] = (0, "words", 0)  # (hash_block, its unit: words or tokens, the blocks' seed), recorded

    @property
    def repeat_share(self) -> float:
        """The share of the prompts' blocks that repeat an earlier request's: the best-case
        prefix-cache hit rate, by blocks (a server with room for every block, none evicted)."""
        return (self.blocks - self.distinct_blocks) / self.blocks if self.blocks else 0.0

    def count(self, duration_s: float, warmup_s: float = 0.0) -> int:
        """Requests whose (sped-up) arrival falls in a level's measured window: the trace plays
        from the level's start, so its first `warmup_s` are the warmup's."""
        return sum(1 for t in self.offsets_s if warmup_s <= t / self.speed < warmup_s + duration_s)


LoadShape = Closed | Batch | Open | ClosedRamp | OpenRamp | Replay


def _ramp_text(unit: str, a: float, b: float, steps: int) -> str:
    if a == b and not steps:
        return f"{a:g}{unit}"
    how = f" in {steps} steps" if steps else ""
    return f"{a:g}→{b:g}{unit}{how}"


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A search (`search = bisect`) for the highest grid level at which the gate's `require`
    rules hold. Not a load model of its own: the runner probes levels of the ordinary shape
    (`Closed` or `Open` at a grid value, `probe_level`), each a level of the manifest in the
    order they ran, and bisects over `grid` until adjacent grid points pass and fail, or until
    `max_wall_s` leaves no time for the next probe (`soakspec.runner.load.Bisection`)."""

    axis: str  # concurrency | rate
    grid: tuple[int | float, ...]  # ascending; the levels the search may probe
    max_wall_s: float
    probe_s: float = 0.0  # one probe's warmup + duration (0: not known, the wall time not counted in probes)

    @property
    def search_probes(self) -> int:
        """The most probes bisection over the grid can take: low, high, then log2 of the rest."""
        n = len(self.grid)
        return min(n, 2 + max(0, math.ceil(math.log2(max(n - 1, 1)))))

    @property
    def wall_probes(self) -> int | None:
        """The most probes `max_wall_s` lets start: the runner (runner/driver.py `_drive_sweep`)
        starts none that would end after it, counted from the first probe's start, and probes
        run one after another, each at least `probe_s` (its drain and judging come on top): at
        most floor(max_wall / probe_s), at least the one `check` guarantees (E204). None: no
        probe length known."""
        if self.probe_s <= 0:
            return None
        return max(1, math.floor(self.max_wall_s / self.probe_s + 1e-9))

    @property
    def max_probes(self) -> int:
        """The most probes the sweep can run: the search's, at most what the wall time lets start."""
        wall = self.wall_probes
        return self.search_probes if wall is None else min(self.search_probes, wall)

    def label(self) -> str:
        lo, hi = self.grid[0], self.grid[-1]
        unit = " rps" if self.axis == "rate" else ""
        step = self.grid[1] - self.grid[0] if len(self.grid) > 1 else 0
        return f"sweep {self.axis} {lo:g}..{hi:g}{unit} step {step:g}{unit}"


def sweep_grid(low: float, high: float, step: float, integer: bool) -> tuple[int | float, ...]:
    """low, low + step, ... up to high, and high itself (a grid of at most 10,000 points)."""
    n = min(10_000, int(math.floor((high - low) / step + 1e-9)))
    pts = [low + i * step for i in range(n + 1)]
    if pts[-1] < high - 1e-9:
        pts.append(high)
    return tuple(int(round(v)) if integer else round(v, 9) for v in pts)


def probe_level(lv: "Level", grid_index: int, probe: int) -> "Level":
    """The sweep level `lv` as the probe number `probe` runs it: the grid's value at
    `grid_index` in the level's own shape, the probe's number as its index (manifest order)."""
    assert lv.sweep is not None
    value = lv.sweep.grid[grid_index]
    match lv.shape:
        case Open(seed=seed) as base:  # the workload's arrival process (burstiness too), at the grid's rate
            shape: LoadShape = dataclasses.replace(base, rate=float(value), seed=seed + probe)
            expected = _open_count(shape, lv.duration_s, lv.warmup_s)
            minimum = _open_minimum(shape, expected)
        case _:
            shape = Closed(int(value))
            minimum, expected = int(value), None
    return dataclasses.replace(lv, index=probe, shape=shape, min_requests=minimum, expected_requests=expected, sweep=None,
                               sweep_probe=grid_index)


def shape_label(shape: LoadShape) -> str:
    """`concurrency 8`, `rate 2 rps`, `concurrency 4 (batches of 8)`: the one level label; an
    open loop's declared cap after it (`rate 20 rps, max_concurrency 2`)."""
    cap, count, least = max_concurrency(shape), requests_per_level(shape), min_duration(shape)
    return (_shape_label(shape) + (f", max_concurrency {cap}" if cap is not None else "")
            + (f", {count} requests" if count is not None else "")
            + (f", min_duration {format_duration(least)}" if least is not None else ""))


def requests_per_level(shape: LoadShape) -> int | None:
    """A count-bounded level's measured requests (`load { requests_per_level = N }`); None: the
    level runs for its duration."""
    match shape:
        case Open(requests_per_level=n) | Closed(requests_per_level=n):
            return n
    return None


def min_duration(shape: LoadShape) -> float | None:
    """A count-bounded level's least measured time (`load { min_duration }`): it sends until it
    has sent its count *and* this long has passed (LoadGen's min_query_count and min_duration);
    None: it ends at its count (or a timed level)."""
    match shape:
        case Open(min_duration_s=d) | Closed(min_duration_s=d):
            return d
    return None


def max_concurrency(shape: LoadShape) -> int | None:
    """The open loop's declared cap on requests in flight (None: none declared, or not open loop)."""
    match shape:
        case Open(max_concurrency=n) | OpenRamp(max_concurrency=n) | Replay(max_concurrency=n):
            return n
    return None


def _shape_label(shape: LoadShape) -> str:
    match shape:
        case Open(rate=rate, burstiness=b) if b != 1.0:
            return f"rate {rate:g} rps (burstiness {b:g})"
        case Open(rate=rate):
            return f"rate {rate:g} rps"
        case ClosedRamp(start=a, end=b, steps=k):
            return "concurrency " + _ramp_text("", a, b, k)
        case OpenRamp(start=a, end=b, steps=k, burstiness=bu):
            return "rate " + _ramp_text(" rps", a, b, k) + (f" (burstiness {bu:g})" if bu != 1.0 else "")
        case Replay(source=src, speed=sp, offsets_s=offs):
            return f"replay of {len(offs)} requests ({os.path.basename(src)}{f', speed {sp:g}' if sp != 1 else ''})"
        case Batch(concurrency=c, requests=n):
            return f"concurrency {c} (batches of {n})"
        case Closed(concurrency=c):
            return f"concurrency {c}"
    raise TypeError(shape)


# ---------------------------------------------------------------- requests


@dataclasses.dataclass(frozen=True)
class RequestTemplate:
    """What every request of a level looks like; the i-th request cycles prompts and max_tokens."""

    endpoint: str  # completions | chat
    model: str  # the `model` field sent
    stream: bool
    prompt_words: int | None  # generated prompts of this many words (no prompt file)
    prompt_file: str | None  # absolute path: one prompt per line or JSONL
    max_tokens: tuple[int, ...]
    temperature: float
    top_p: float
    top_k: int | None
    seed: int | None
    ignore_eos: bool
    api_key_env: str | None  # the NAME of the variable holding the endpoint's API key
    # The prompt file as `check` read it: its prompts (text, or chat messages as (role, content)
    # pairs) travel in the plan, so the runner never reads or guesses the file.
    prompts: tuple[str | tuple[tuple[str, str], ...], ...] = dataclasses.field(default=(), repr=False)
    output_lens: tuple[int | None, ...] = dataclasses.field(default=(), repr=False)  # per prompt (max_tokens_from_file)
    conversations: tuple[tuple[tuple[str, str], ...], ...] = dataclasses.field(default=(), repr=False)  # multi_turn sessions
    prompt_format: str | None = None  # text | jsonl | sharegpt
    prompt_tokens: tuple[int, ...] = ()  # token-exact prompts (cycling lengths), built by the runner with the tokenizer
    tokenizer: str | None = None  # absolute path of a tokenizer.json; None with prompt_tokens: the server's /tokenize
    prefix_tokens: int = 0  # shared prefix tokens (the cache regime: 0 = unique prefix per request)
    # `prefix_groups` (SGLang's generated-shared-prefix): the shared prefix is one of G distinct
    # prefixes, request i's group `draws.prefix_group(i, G, group_seed)` (each block of G requests from
    # the level's first, a warmup's included, sends every group once, in a seeded order); 1: one
    # prefix shared by every request
    prefix_groups: int = 1
    group_seed: int = 0
    # random lengths (`length_range`, soakspec/lengths.py): the i-th request's prompt length (tokens or
    # words) and max_tokens are drawn from [N(1 - r), N(1 + r)] around its cycled N, by i and the seed
    length_range: float = 0.0
    length_seed: int = 0
    # the prompt file's order (`prompt_order`, soakspec/draws.py): "file", or "shuffled" -- request i
    # sends prompt perm_p(i mod n) of pass p = i // n's permutation seeded by `prompt_seed` (multi-turn:
    # the j-th conversation begun runs conversation perm_p(j mod n))
    prompt_order: str = "file"
    prompt_seed: int = 0
    # multi-turn: seconds a session waits after a turn's answer before its next turn, (low, high)
    # (equal: fixed; None: none), drawn per conversation and turn by `think_seed` (soakspec/draws.py)
    think_time: tuple[float, float] | None = None
    think_seed: int = 0
    # a replay's prefix sharing (`prefix_sharing`, the default): a request's prompt is its trace
    # line's hash_ids' blocks of `hash_block` words (tokens with token-exact prompts), each a
    # function of its id and `block_seed` (runner/prompts.py); 0: no shared blocks
    hash_block: int = 0
    block_seed: int = 0
    prompt_sha256: str | None = None  # of the prompt file's bytes
    body_json: str | None = None  # extra body fields (a JSON object), merged into every request
    headers: tuple[tuple[str, str], ...] = ()  # extra HTTP headers
    header_env: tuple[tuple[str, str], ...] = ()  # (header, env variable NAME): the value is read at run time, never recorded

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("prompts", "output_lens", "conversations", "body_json", "header_env"):
            del out[key]
        if not self.hash_block:  # absent without shared blocks, as in evidence from before them
            del out["hash_block"], out["block_seed"]
        if self.prefix_groups == 1:  # absent with one shared prefix, as in evidence from before prefix groups
            del out["prefix_groups"], out["group_seed"]
        return out | {
            "max_tokens": list(self.max_tokens),
            "prompt_tokens": list(self.prompt_tokens) or None,
            "prefix_cache": _prefix_policy(self),
            "prompt_count": len(self.prompts) if self.prompts else None,
            "max_tokens_from_file": bool(self.output_lens),
            "multi_turn_sessions": len(self.conversations) if self.conversations else None,
            "body": json.loads(self.body_json) if self.body_json else {},
            "headers": dict(self.headers),
            "header_env": {h: {"env": name} for h, name in self.header_env},
        }


@dataclasses.dataclass(frozen=True)
class Bucket:
    index: int
    start_s: float  # offset from the start of the level's measured part
    length_s: float


@dataclasses.dataclass(frozen=True)
class Level:
    workload: str  # the workload's name
    index: int  # position in the workload's level list
    shape: LoadShape
    request: RequestTemplate
    warmup_s: float
    duration_s: float
    deadline_s: float
    buckets: tuple[Bucket, ...]
    min_requests: int
    expected_requests: int | None
    phase: str | None = None  # the workload's named phase this level is (`load { phases { ... } }`)
    sweep: Sweep | None = None  # a sweep: the runner probes levels of this shape (see Sweep)
    sweep_probe: int | None = None  # a probe of a sweep: its grid index
    # the requests its warmup is expected to send (recorded, in no bucket): an open loop's rate ×
    # warmup, a closed loop's concurrency × warmup / expected_latency; None: not estimated
    expected_warmup_requests: int | None = None
    # a count-bounded level's expected load time, its warmup's included: its N at the planned rate
    # (or concurrency and expected_latency, or `cap_rps`); None: timed, or unknown
    expected_load_s: float | None = None
    # an open loop's `max_concurrency` over the workload's `expected_latency`: the requests a second
    # its cap lets the server finish (Little's law); None: no cap, or no expected_latency
    cap_rps: float | None = None
    # `warmup = N requests`: the level first sends N warmup requests (closed loop: its workers take
    # them from one count; open loop: its schedule's first N arrivals) and its measured window
    # starts once all have finished; `warmup_s` is then 0. None: the warmup is `warmup_s`
    warmup_requests: int | None = None
    # how long a counted warmup is expected to take: N / rate, or ceil(N / concurrency) rounds of
    # expected_latency; None: a timed warmup, or no estimate (a closed loop without expected_latency)
    expected_warmup_s: float | None = None

    @property
    def warmup_bound_s(self) -> float:
        """The longest the level's warmup runs: `warmup_s`, or with a count of N requests its
        wall bound, so a dead or hung server cannot hold the level in its warmup -- no warmup
        request starts after it, and each one is bounded by its `deadline_s`: a closed loop's
        ceil(N / concurrency) rounds of the deadline; an open loop's N arrivals at its rate, then
        ceil(N / max_concurrency) rounds of the deadline (one round without a cap)."""
        return self.warmup_s if self.warmup_requests is None else _warmup_bound_s(self.shape, self.warmup_requests, self.deadline_s)

    @property
    def mode(self) -> str:
        match self.shape:
            case Open() | OpenRamp() | Replay():
                return "open"
            case Batch():
                return "batch"
        return "closed"

    @property
    def concurrency(self) -> int | None:
        """Workers (a ramp's: its peak); None for open-loop levels."""
        match self.shape:
            case Open() | OpenRamp() | Replay():
                return None
            case ClosedRamp():
                return self.shape.peak
        return self.shape.concurrency

    @property
    def rate(self) -> float | None:
        """Requests/s offered (a ramp's: its peak; a replay's: its mean over the level)."""
        match self.shape:
            case Open():
                return self.shape.rate
            case OpenRamp():
                return self.shape.peak
            case Replay():
                return max(self.shape.count(self.duration_s, self.warmup_s), 1) / self.duration_s if self.duration_s > 0 else None
        return None

    @property
    def batch_requests(self) -> int | None:
        return self.shape.requests if isinstance(self.shape, Batch) else None

    @property
    def max_concurrency(self) -> int | None:
        """An open loop's declared cap on requests in flight (`load { max_concurrency = N }`)."""
        return max_concurrency(self.shape)

    @property
    def requests_per_level(self) -> int | None:
        """A count-bounded level's measured requests: it ends once they have finished, or at its
        duration (the bound) if that comes first (`load { requests_per_level = N }`)."""
        return requests_per_level(self.shape)

    @property
    def min_duration_s(self) -> float | None:
        """A count-bounded level's least measured time: it sends until its count is sent and this
        long has passed, its duration still the bound (`load { min_duration }`)."""
        return min_duration(self.shape)

    @property
    def label(self) -> str:
        if self.phase is not None:
            return f"phase {self.phase}, {shape_label(self.shape)}"
        return shape_label(self.shape)

    @property
    def bucket_s(self) -> float:
        return self.buckets[0].length_s

    def to_json(self) -> dict[str, Any]:
        """The level's entry in the manifest (the runner adds what happened: times, buckets, sent).
        A phase, a ramp or a replay adds its `phase` name and its `shape` (as the plan's JSON)."""
        out = {
            "workload": self.workload, "index": self.index, "label": self.label, "mode": self.mode,
            "concurrency": self.concurrency, "rate": self.rate, "batch_requests": self.batch_requests,
            "planned_duration_s": self.duration_s, "bucket_s": self.bucket_s, "warmup_s": self.warmup_s,
            "deadline_s": self.deadline_s,
        }  # fmt: skip
        if self.max_concurrency is not None:  # absent without one, as in evidence from before it existed
            out["max_concurrency"] = self.max_concurrency
        if self.requests_per_level is not None:  # absent for a timed level, as in evidence from before the key
            out["requests_per_level"] = self.requests_per_level
        if self.min_duration_s is not None:  # absent without one, as in evidence from before the key
            out["min_duration_s"] = self.min_duration_s
        if self.warmup_requests is not None:  # absent for a timed warmup, as in evidence from before the key
            out["warmup_requests"] = self.warmup_requests
        if self.phase is not None or not isinstance(self.shape, (Closed, Batch, Open)):
            out |= {"phase": self.phase, "shape": _shape_json(self.shape)}
        if isinstance(self.shape, Open):  # what the judge rebuilds the sent schedule from (judge/schedproof.py); absent before it
            out["schedule"] = {"rate": self.shape.rate, "arrival": self.shape.arrival, "seed": self.shape.seed,
                               "burstiness": self.shape.burstiness}
        t = self.request
        if t.prompts and t.prompt_order != "file":  # which prompt each index sent (soakspec/draws.py)
            out |= {"prompt_order": t.prompt_order, "prompt_seed": t.prompt_seed}
        if t.prefix_groups > 1:  # which prefix each index sent (soakspec/draws.py `prefix_group`); absent with one
            out |= {"prefix_tokens": t.prefix_tokens, "prefix_groups": t.prefix_groups, "group_seed": t.group_seed}
        if t.think_time is not None:  # what the judge leaves out of the offered concurrency (validity `thinking`)
            out |= {"think_time": list(t.think_time), "think_seed": t.think_seed}
        return out


# ---------------------------------------------------------------- backends


@dataclasses.dataclass(frozen=True)
class Probe:
    """The readiness probe: `method path` until it answers `status`, every `interval_s`, for at
    most `timeout_s`; one attempt waits at most `attempt_timeout_s`."""

    method: str
    path: str
    status: int
    timeout_s: float
    interval_s: float

    @property
    def attempt_timeout_s(self) -> float:
        return max(PROBE_ATTEMPT_MIN_S, self.interval_s * 4)


@dataclasses.dataclass(frozen=True)
class Liveness:
    """A backend's liveness during the run, launched or external (`runner/liveness.py`).

    The readiness request (its method, path and status) is sent again every `interval_s`
    (skipped while the load's own responses show the server answering), each attempt bounded by
    `attempt_timeout_s`. Refused connections or wrong answers -- from those probes or the load's
    own connects -- for `grace_s` without a single answer in between: the backend is dead, its
    load stops and the run aborts (exit 4). Probes that only get no answer in time (a server
    busy, not gone) count as dead only after `hang_s`. Meanwhile the load backs off: after a
    refused connect it waits `backoff_base_s`, doubling per refusal up to `backoff_max_s`, and
    only one request at a time tries again.
    """

    interval_s: float = LIVENESS_INTERVAL_S
    grace_s: float = LIVENESS_GRACE_S
    attempt_timeout_s: float = LIVENESS_ATTEMPT_S
    hang_s: float = LIVENESS_HANG_S
    backoff_base_s: float = BACKOFF_BASE_S
    backoff_max_s: float = BACKOFF_MAX_S

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Launch:
    """How a backend is started (or reached) and stopped. `argv` holds `{port}`/`{url}` where the
    runner puts the port it picked; `url` backends are not launched."""

    name: str
    kind: str  # launch | shell | sim | url ("sim" for every backend of a rehearsal)
    argv: tuple[str, ...] | None  # the exact command (shell backends: /bin/sh -c LINE)
    url: str | None  # url backends: where the server already runs
    env: tuple[tuple[str, str], ...]  # what the spec sets (+ CUDA_VISIBLE_DEVICES); os.environ under it
    cwd: str | None
    probe: Probe
    shutdown_grace_s: float  # SIGTERM, then at most this long before SIGKILL
    kill_wait_s: float  # after SIGKILL, at most this long for the process to be reaped
    capture_log: bool
    host: str = HOST
    liveness: Liveness = Liveness()
    log_file: str | None = None  # url: the server's log file (absolute), read from its size at the backend's start

    @property
    def launches(self) -> bool:
        return self.kind != "url"

    @property
    def shell(self) -> bool:
        return self.kind == "shell"

    @property
    def stop_bound_s(self) -> float:
        """The longest a teardown takes (its shielded cancel scope's bound)."""
        return self.shutdown_grace_s + self.kill_wait_s + 1.0

    def base_url(self, port: int | None) -> str:
        if not self.launches:
            return (self.url or "").rstrip("/")
        return f"http://{self.host}:{port}"

    def command(self, port: int) -> list[str]:
        """The argv the runner executes once it has a port."""
        url = self.base_url(port)
        return [a.replace(PORT, str(port)).replace(URL, url) for a in self.argv or ()]

    def to_json(self, secrets: Iterable[str] = ()) -> dict[str, Any]:
        """As the plan prints it: secrets redacted the way the manifest redacts them (`secrets`:
        the spec's secret values, wherever else in argv and env they appear)."""
        return {
            "kind": self.kind,
            "argv": redact_argv(list(self.argv), secrets) if self.argv is not None else None,
            "url": scrub(self.url) if self.url else self.url,
            "env": redact_env(dict(self.env), secrets),
            "cwd": self.cwd,
            "capture_log": self.capture_log,
            "log_file": self.log_file,
        }


@dataclasses.dataclass(frozen=True)
class TracePlan:
    """Where a backend's server traces come from and how they match request ids."""

    source: str  # none | log | jsonl
    pattern: str | None  # log: regex with a `json` or `id` group
    file: str | None  # jsonl: absolute path of the server's trace file
    id_field: str
    id_forms: tuple[str, ...]
    window_s: float  # a trace matches a request within this many seconds

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"id_forms": list(self.id_forms)}


# The server's Prometheus families kept in metrics.jsonl besides those a rule names (README,
# "Server metrics"): vLLM's and SGLang's queue, cache, token and latency metrics, and the
# standard process collector's CPU and memory. Everything else a scrape returns is dropped,
# so the file stays bounded whatever the server exposes.
DEFAULT_SERVER_METRICS = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_swapped",
    "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
    "sglang:gen_throughput", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
    "sglang:num_requests_total", "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
    "sglang:time_per_output_token_seconds", "sglang:e2e_request_latency_seconds",
    "process_cpu_seconds_total", "process_resident_memory_bytes",
)
DEFAULT_SCRAPE_INTERVAL_S = 5.0  # metrics {} without `every`: this, or a quarter of the shortest bucket
MIN_DEFAULT_SCRAPE_INTERVAL_S = 0.5
MAX_SCRAPE_BYTES = 8 * 2**20  # a /metrics answer larger than this is a failed scrape
LAST_SCRAPE_SLACK_S = 2.0  # the last scrape's wait beyond its timeout: parsing and writing its line


@dataclasses.dataclass(frozen=True)
class MetricsScrape:
    """The server's Prometheus endpoint, scraped during the load (`runner/scrape.py`): GET
    `path` every `interval_s`, each attempt bounded by `timeout_s`, the families in `families`
    kept (summed over their label sets) in backends/<name>/metrics.jsonl. `declared`: the spec
    wrote the block, so a failing scrape fails `metrics_scraped`; otherwise a 404 means "not
    available" and the scrape stops."""

    path: str
    interval_s: float
    timeout_s: float
    declared: bool
    families: tuple[str, ...]
    max_bytes: int = MAX_SCRAPE_BYTES

    @property
    def last_wait_s(self) -> float:
        """How long the driver waits, once the load has ended, for the scrape after it before the
        server is stopped: one scrape's timeout and its parsing and writing (part of `max_wall_s`)."""
        return self.timeout_s + LAST_SCRAPE_SLACK_S

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"families": list(self.families)}


def _metrics_scrape(spec: Spec, b: Backend, time_scale: float) -> MetricsScrape | None:
    m = b.metrics
    if not m.enabled:
        return None
    named = [f for r in spec.gate.rules if r.backend in (None, b.name) for f in (r.expr.server, r.expr.over) if f]
    families = tuple(dict.fromkeys([*named, *DEFAULT_SERVER_METRICS]))
    if m.interval_s is not None:  # a duration like any other: --time-scale shrinks it (as the buckets it samples)
        interval = m.interval_s * time_scale
    else:  # at least three scrapes inside every bucket
        shortest = min((w.bucket_s * time_scale for w in spec.workloads), default=DEFAULT_SCRAPE_INTERVAL_S * 4)
        interval = max(MIN_DEFAULT_SCRAPE_INTERVAL_S, min(DEFAULT_SCRAPE_INTERVAL_S, shortest / 4))
    return MetricsScrape(m.path, max(0.1, interval), m.timeout_s, m.declared, families)


# The built-in abort (on unless the gate says `abort_default = false`): a whole bucket of
# at least this many requests in which not one completed.
DEFAULT_ABORT_MIN_REQUESTS = 10
DEFAULT_ABORT_TEXT = f"abort ratio(errors) >= 100% per bucket (built in: every request of a bucket of at least {DEFAULT_ABORT_MIN_REQUESTS} unsuccessful)"


@dataclasses.dataclass(frozen=True)
class AbortRule:
    """An abort rule as the runner evaluates it (`runner/abort.py`) on each finished bucket or
    window of this backend: `agg(metric) op threshold`, over the requests that started in it, once
    they have finished. `agg` is count or ratio (outcome metrics: the share of the window's requests)
    or mean, min, max, p (with `percentile`) over the completed requests' values."""

    text: str  # as written (or DEFAULT_ABORT_TEXT)
    metric: str
    agg: str  # count | ratio | mean | min | max | p
    percentile: float | None
    op: str
    threshold: float  # base units
    scope: str  # bucket | window
    window_s: float | None  # window: its length (time-scaled like the buckets)
    min_requests: int = 1  # fewer requests in the bucket/window: not evaluated
    builtin: bool = False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BackendPlan:
    backend: Backend  # the checked spec's backend (for the judge; the runner reads `launch`)
    levels: tuple[Level, ...]
    follow_up: bool
    follow_up_deadline_s: float
    est_wall_s: float  # load time: warmups + durations (+ follow-up estimate)
    max_wall_s: float  # upper bound: + ready timeout, drains, follow-up deadline, shutdown
    launch: Launch
    traces: TracePlan
    runtime: BoundaryDecl | None
    follow_up_request: RequestTemplate
    follow_up_workload: str
    aborts: tuple[AbortRule, ...] = ()  # evaluated live; the first that fires stops the load
    metrics: MetricsScrape | None = None  # the server's /metrics, scraped during the load (None: off)
    # where a level ends at its count (`wall_ends_at_count`): the load time expected with each such
    # level's `expected_load_s` (then `est_wall_s` is only the bound); None: no estimate, or no count
    count_est_wall_s: float | None = None

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def wall_ends_at_count(self) -> bool:
        """A level of it ends at its `requests_per_level`: `est_wall_s` (warmup + duration) is
        then its upper bound, not its estimate -- but for an open loop's queue behind its
        `max_concurrency`, which may drain past it (`_count_load_s`; `max_wall_s` holds it)."""
        return any(lv.requests_per_level is not None for lv in self.levels)

    @property
    def min_requests(self) -> int:
        return sum(lv.min_requests for lv in self.levels)

    @property
    def expected_requests(self) -> int | None:
        vals = [lv.expected_requests for lv in self.levels]
        return None if any(v is None for v in vals) else sum(vals)  # type: ignore[misc]

    def timeouts(self) -> dict[str, float | None]:
        """Every bound the runner applies to this backend (also in its manifest entry)."""
        la = self.launch
        return {
            "ready_timeout_s": la.probe.timeout_s,
            "ready_interval_s": la.probe.interval_s,
            "ready_attempt_timeout_s": la.probe.attempt_timeout_s,
            "shutdown_grace_s": la.shutdown_grace_s if la.launches else None,
            "kill_wait_s": la.kill_wait_s if la.launches else None,
            "follow_up_deadline_s": self.follow_up_deadline_s if self.follow_up else None,
            **{f"liveness_{k}": v for k, v in la.liveness.to_json().items()},
        }


@dataclasses.dataclass(frozen=True)
class ModelRef:
    id: str | None
    revision: str | None
    path: str | None  # absolute


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: Spec
    backends: tuple[BackendPlan, ...]
    parallel: bool
    time_scale: float = 1.0
    rehearsal: bool = False
    # what the runner needs beyond the backends, resolved (the runner never reads `spec`)
    name: str = ""
    spec_text: str = ""
    spec_path: str | None = None
    model: ModelRef = ModelRef(None, None, None)
    source_repo: str | None = None  # absolute
    telemetry_interval_s: float = 5.0
    require_gpus: bool = False
    only: tuple[str, ...] | None = None  # the backends run, when not all of the spec's
    spec_secrets: frozenset[str] = frozenset()  # secret values written in the spec
    api_key_envs: tuple[str, ...] = ()  # variables holding API keys (their values are secrets too)

    def prompt_files(self) -> dict[str, dict[str, Any]]:
        """Per workload with a prompt file, the file the run reads: its absolute path, format and
        sha256 (the manifest's spec `prompt_files`: what a later `gate` or `report` of the
        evidence checks a prompt file it finds against, `lang.check.requests.dataset`)."""
        out: dict[str, dict[str, Any]] = {}
        for b in self.backends:
            for lv in b.levels:
                r = lv.request
                if r.prompt_file is not None and r.prompt_sha256 is not None:
                    out.setdefault(lv.workload, {"path": r.prompt_file, "format": r.prompt_format, "sha256": r.prompt_sha256})
        return out

    @property
    def est_wall_s(self) -> float:
        vals = [b.est_wall_s for b in self.backends]
        return (max(vals) if self.parallel else sum(vals)) if vals else 0.0

    @property
    def max_wall_s(self) -> float:
        vals = [b.max_wall_s for b in self.backends]
        return (max(vals) if self.parallel else sum(vals)) if vals else 0.0

    @property
    def wall_ends_at_count(self) -> bool:
        """A level ends at its count: `est_wall_s` is an upper bound (`BackendPlan`'s)."""
        return any(b.wall_ends_at_count for b in self.backends)

    @property
    def count_est_wall_s(self) -> float | None:
        """`est_wall_s` with each counted level's expected load time; None: no level is counted,
        or one has no estimate."""
        if not self.wall_ends_at_count:
            return None
        vals = [b.count_est_wall_s if b.wall_ends_at_count else b.est_wall_s for b in self.backends]
        if None in vals:
            return None
        return max(vals) if self.parallel else sum(vals)  # type: ignore[arg-type,type-var]  # (a counted level: a backend)

    @property
    def bucket_count(self) -> int:
        """Every level's buckets; a sweep's: those of its most probes (each probe is a level)."""
        return sum(len(lv.buckets) * _runs(lv) for b in self.backends for lv in b.levels)

    def __repr__(self) -> str:
        return render_text(self)


# ---------------------------------------------------------------- building


def _buckets(duration: float, bucket: float) -> tuple[Bucket, ...]:
    return tuple(Bucket(i, i * bucket, length) for i, length in enumerate(windows.lengths(duration, bucket)))


def _request(w: Workload, model: str, spec_dir: Path, api_key_env: str | None) -> RequestTemplate:
    s = w.sampling
    return RequestTemplate(
        endpoint=w.endpoint, model=model, stream=w.stream, prompt_words=w.prompt_words,
        prompt_file=_abspath(spec_dir, w.prompt_file), max_tokens=tuple(w.max_tokens),
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed, ignore_eos=w.ignore_eos,
        api_key_env=api_key_env, body_json=w.body_json, headers=w.headers, header_env=w.header_env,
        length_range=w.length_range, length_seed=w.load.seed if w.length_range else 0,
        **_order_and_think(w),
        **_prompt_source(w, spec_dir),
    )  # fmt: skip


def _order_and_think(w: Workload) -> dict[str, Any]:
    """The prompt file's order and a multi-turn session's think time, each with the load's seed
    where it draws (0 where nothing is drawn, so that a seed that seeds nothing changes no template)."""
    think = (w.think_time[0], w.think_time[-1]) if w.think_time and w.multi_turn else None
    shuffled = w.prompt_order == "shuffled" and w.prompt_file is not None
    return {"prompt_order": "shuffled" if shuffled else "file", "prompt_seed": w.load.seed if shuffled else 0,
            "think_time": think, "think_seed": w.load.seed if think is not None and think[1] > think[0] else 0}


def order_label(t: RequestTemplate) -> str:
    """The prompt file's order in words, for the plan: `in file order` or the shuffle and its seed."""
    if t.prompt_order != "shuffled":
        return "in file order, cycling"
    what = "conversations" if t.conversations else "prompts"
    return (f"shuffled (seed {t.prompt_seed}): each pass over the file sends every one of its {what} once, "
            "in a new seeded order (the same in every level, run, backend and --workers split)")


def think_line(t: RequestTemplate) -> str:
    """A multi-turn session's think time in words, for the plan."""
    low, high = t.think_time or (0.0, 0.0)
    how = (f"{format_duration(low)}" if high <= low else
           f"{format_duration(low)}-{format_duration(high)} (drawn uniformly per conversation and turn, seed {t.think_seed})")
    return (f"after a turn's answer each session waits {how} before its next turn (not between conversations); "
            "no latency includes it, and a thinking session is not offered concurrency (client health)")


def prompt_label(t: RequestTemplate) -> str:
    """What the prompts are, in a line: `128, 32 tokens (the server's /tokenize)`, `2 from ... (sharegpt)`."""
    if t.prompt_tokens:
        how = f"tokenizer {t.tokenizer}" if t.tokenizer else "the server's /tokenize"
        return f"{', '.join(map(str, t.prompt_tokens))} tokens ({how})"
    if t.prompts:
        lens = ", output lengths from the file" if t.output_lens else ""
        lens += f", {len(t.conversations)} multi-turn conversations" if t.conversations else ""
        return f"{len(t.prompts)} from {t.prompt_file} ({t.prompt_format}, sha256 {(t.prompt_sha256 or '')[:12]}){lens}"
    return f"{t.prompt_words} words"


def length_label(t: RequestTemplate) -> str:
    """Random lengths in a line: `each request's prompt 50-150 tokens, max_tokens 32-96: drawn
    uniformly (±50%, seed 7) by its index in its level, as vllm bench serve --random-range-ratio 0.5`."""
    def spans(lens: tuple[int, ...]) -> str:
        return ", ".join("{}-{}".format(*lengths.bounds(n, t.length_range)) for n in lens)
    prompt = f"{spans(t.prompt_tokens)} tokens" if t.prompt_tokens else f"{spans((t.prompt_words or 1,))} words"
    return (f"each request's prompt {prompt}, max_tokens {spans(t.max_tokens)}: drawn uniformly "
            f"({lengths.label(t.length_range)}, seed {t.length_seed}) by its index in its level, "
            f"as vllm bench serve --random-range-ratio {t.length_range:g}")


def _prefix_policy(t: RequestTemplate) -> str:
    """The cache regime the prompts measure, stated in the evidence."""
    if t.hash_block:
        unit = "tokens" if t.prompt_tokens else "words"
        return (f"the trace's hash_ids: each names a block of {t.hash_block} {unit} (seed {t.block_seed}), the same in every request, "
                "level and run that lists it; after its blocks a request's own content")
    if t.prompt_tokens:
        if t.prefix_tokens and t.prefix_groups > 1:
            return (f"prefix: {t.prefix_groups} groups of {t.prefix_tokens} tokens (groups part at their first token; at their "
                    f"first few with a tokenizer of fewer than {t.prefix_groups} one-token words), each request's group by "
                    f"its index in its level (seed {t.group_seed}: each block of {t.prefix_groups} requests from the level's "
                    "first, a warmup's included, sends every group once, in a seeded order)")
        return f"shared prefix of {t.prefix_tokens} tokens" if t.prefix_tokens else "unique prefix per request"
    if t.conversations:
        first = f"same first conversation of its seeded order (seed {t.prompt_seed})" if t.prompt_order == "shuffled" else "file's first conversation"
        return ("multi-turn sessions: each turn repeats its conversation's history (the file's answers), so the cache holds "
                f"the previous turn's prompt; every level starts again at the {first}, and a level past the "
                "file's last runs them again: such a turn is resent whole, one the server's prefix cache may hold")
    if t.prompts and t.prompt_order == "shuffled":
        return (f"the prompt file's {len(t.prompts)} prompts in a seeded order (seed {t.prompt_seed}), the same in every level, "
                f"a new order each pass: a request after the first {len(t.prompts)}, or in a later level, resends a prompt the "
                "server's prefix cache may hold")
    if t.prompts:
        return (f"the prompt file's {len(t.prompts)} prompts in order from the first in every level, cycling: a request after "
                f"the first {len(t.prompts)}, or in a later level, resends a prompt the server's prefix cache may hold")
    return "word prompts, each starting with its request id (no prompt sent twice; consecutive requests share later words)"


def sharing_label(shape: Replay) -> str:
    """`1,234 blocks, 310 distinct: 75% repeat an earlier request's` (the plan, the report)."""
    return (f"{shape.blocks:,} prompt blocks, {shape.distinct_blocks:,} distinct: {shape.repeat_share:.0%} repeat an earlier "
            "request's (the best-case prefix-cache hit rate)")


def _replay_sharing_line(t: RequestTemplate, shapes: list) -> str:
    if not t.hash_block:
        return "word prompts, each starting with its request id (no prompt sent twice)" if not t.prompt_tokens else _prefix_policy(t)
    shape = next(s for s in shapes if isinstance(s, Replay))
    line = f"{_prefix_policy(t)}; {sharing_label(shape)}"
    if shape.outrun:
        line += (f"; {shape.outrun:,} request(s) list more hash_ids than their input_length fills at {t.hash_block} a block (the "
                 "later ids are not sent: was the trace made with smaller blocks? set hash_block)")
    return line


def _prompt_source(w: Workload, base: Path) -> dict[str, Any]:
    rp = w.load.replay
    shared = {"hash_block": rp.hash_block, "block_seed": w.load.seed} if rp is not None and rp.hash_ids else {}
    if rp is not None and rp.tokens:  # each request's own length; the shortest and longest are verified at the start
        return {"prompt_tokens": tuple(sorted({min(rp.input_lens), max(rp.input_lens)})), "tokenizer": _abspath(base, w.tokenizer), **shared}
    if shared:
        return shared
    if w.prompt_tokens:
        groups = w.prefix_groups if w.prefix_tokens else 1
        return {"prompt_tokens": w.prompt_tokens, "tokenizer": _abspath(base, w.tokenizer), "prefix_tokens": w.prefix_tokens,
                "prefix_groups": groups, "group_seed": w.load.seed if groups > 1 else 0}
    d = w.dataset
    if d is None:
        return {}
    lens = d.output_lens if w.max_tokens_from_file and all(n is not None for n in d.output_lens) else ()
    convs = d.conversations if w.multi_turn else ()
    return {"prompts": d.prompts, "output_lens": lens, "conversations": convs, "prompt_format": d.format, "prompt_sha256": d.sha256}


def _shape(w: Workload, i: int, level: int | float, scale: float = 1.0) -> LoadShape:
    load = w.load
    least = load.min_duration_s * scale if load.min_duration_s is not None and load.requests_per_level is not None else None
    if load.mode == "open":
        return Open(float(level), load.arrival, load.seed + i, load.burstiness, load.max_concurrency, load.requests_per_level, least)
    if load.mode == "batch":
        return Batch(int(level), int(load.requests or level))
    return Closed(int(level), load.requests_per_level, least)


def _phase_levels(w: Workload, scale: float, request: RequestTemplate) -> list[Level]:
    """One level per named phase, in order: its own shape and duration, the workload's bucket
    (at most the phase's duration), the workload's warmup before the first phase only."""
    out = []
    latency = w.expected_latency_s * scale if w.expected_latency_s else None
    for i, ph in enumerate(w.load.phases):
        duration = ph.duration_s * scale
        warmup = w.warmup_s * scale if i == 0 else 0.0
        shape: LoadShape
        if w.load.mode == "open":
            if ph.end is None:
                shape = Open(ph.start, ph.arrival, ph.seed, ph.burstiness, w.load.max_concurrency)
                expected = _open_count(shape, duration, warmup)
                minimum = _open_minimum(shape, expected)
            else:
                shape = OpenRamp(ph.start, ph.end, ph.steps, ph.arrival, ph.seed, ph.burstiness, w.load.max_concurrency)
                # the ramp spans the measured duration (the warmup holds its start): the rate's integral
                expected = _ramp_count(shape, warmup, duration)
                minimum = _open_minimum(shape, expected)
        else:
            if ph.end is None:
                shape = Closed(int(ph.start))
                minimum, mean = int(ph.start), ph.start
            else:
                shape = ClosedRamp(int(ph.start), int(ph.end), ph.steps)
                minimum, mean = shape.peak, shape.mean(duration)
            expected = max(minimum, int(mean * duration / latency)) if latency else None
        out.append(
            Level(
                workload=w.name, index=i, shape=shape, request=request, warmup_s=warmup, duration_s=duration,
                deadline_s=w.deadline_s * scale, buckets=_buckets(duration, min(w.bucket_s * scale, duration)),
                min_requests=minimum, expected_requests=expected, phase=ph.name,
            )
        )  # fmt: skip
    return out


def _constant_count(held: float, total: float) -> int:
    """Measured arrivals of a constant-arrival process: the integers of the unit process in
    [held, held + total), `held` the arrivals of the warmup before them, `total` the measured
    duration's integral of the rate."""
    return max(0, math.ceil(held + total - 1e-9) - math.ceil(held - 1e-9))


def _ramp_count(shape: OpenRamp, warmup: float, duration: float) -> int:
    """Measured arrivals of a ramp (soakspec/arrivals.py `ramp_schedule`; the warmup holds its start
    rate); Poisson arrivals the integral, rounded."""
    total = shape.expected(duration)
    if shape.arrival == "constant":
        return _constant_count(shape.start * warmup, total)
    return max(0, int(round(total)))


def _warmup_count(shape: LoadShape, warmup: float, latency: float | None) -> int | None:
    """The requests a level's warmup is expected to send: an open loop's arrivals before the
    measured window (constant: exactly; Poisson: the rate's integral, rounded), a closed loop's
    concurrency × warmup / expected_latency; None where no estimate exists (a closed loop without
    expected_latency) or the shape is not a plain open or closed loop."""
    match shape:
        case Open():
            return _open_count(shape, warmup)  # the arrivals in [0, warmup)
        case Closed(concurrency=c):
            return 0 if warmup <= 0 else (int(c * warmup / latency) if latency else None)
    return None


def _cap_rps(shape: LoadShape, latency: float | None) -> float | None:
    """The requests a second an open loop's `max_concurrency` C lets through at the workload's
    `expected_latency` L: C / L (Little's law, C always in flight); None without both."""
    cap = max_concurrency(shape)
    return cap / latency if cap is not None and latency else None


def _warmup_bound_s(shape: LoadShape, n: int, deadline: float) -> float:
    """A counted warmup's wall bound (`Level.warmup_bound_s`), which the plan prints and the
    runner stops the warmup at: a closed loop's ceil(N / concurrency) rounds of the deadline; an
    open loop's N arrivals -- N / rate, or where its seeded Poisson or gamma schedule's N-th
    arrival is due later, that time (`arrivals.nth_arrival_s`: it lands about sqrt(N) / rate
    either side of N / rate; 10 rps, seed 3: the 100th at 12.0 s, so a bound from N / rate sent
    83) -- then ceil(N / max_concurrency) rounds of the deadline (one without a cap)."""
    if isinstance(shape, Open):
        arrivals = max(n / shape.rate, nth_arrival_s(shape.rate, shape.arrival, shape.seed, n, shape.burstiness))
        return arrivals + math.ceil(n / (shape.max_concurrency or n)) * deadline
    return math.ceil(n / (shape.concurrency if isinstance(shape, Closed) else 1)) * deadline


def _capped_s(shape: Open, n: float, latency: float | None) -> float | None:
    """How long `max_concurrency` C takes to serve n requests, C at a time, ceil(n / C) rounds of
    the workload's expected_latency L -- where it cannot keep up with the rate (`_cap_rps` <
    rate); None where it keeps up, or the spec gives no L to tell."""
    served = _cap_rps(shape, latency)
    if served is None or served >= shape.rate:
        return None
    assert latency is not None and shape.max_concurrency is not None  # a cap_rps has both
    return math.ceil(n / shape.max_concurrency) * latency


def _counted_warmup_s(shape: LoadShape, n: int | None, latency: float | None, deadline: float) -> float | None:
    """How long a warmup of n requests (`warmup = N requests`) is expected to take: its arrivals
    at the planned rate (N / rate) -- an open loop whose `max_concurrency` C cannot keep up with
    it at the workload's expected_latency L (`_cap_rps` < rate, as `_count_load_s` and `_pace`
    read it) serves them C at a time, so max(N / rate, ceil(N / C) x L) -- or a closed loop's
    ceil(N / concurrency) rounds of expected_latency; at most its bound (an expected_latency past
    the deadline: each request times out at the deadline). None: no count, or no estimate."""
    match shape:
        case _ if n is None:
            return None
        case Open():
            capped = _capped_s(shape, n, latency)
            t = n / shape.rate if capped is None else max(n / shape.rate, capped)
            return min(t, _warmup_bound_s(shape, n, deadline))
        case Closed(concurrency=c) if latency:
            return min(math.ceil(n / c) * latency, _warmup_bound_s(shape, n, deadline))
    return None


def _count_load_s(shape: LoadShape, warmup: float, duration: float, latency: float | None, deadline: float) -> float | None:
    """How long a count-bounded level is expected to load: its warmup, then its N requests at the
    planned rate (N / rate) or, for a closed loop with expected_latency, ceil(N / concurrency)
    rounds of it -- at most warmup + duration, the bound (README: a level's wall time is warmup +
    duration; a counted one's only at most that). None: a timed level, or no estimate.

    An open loop whose `max_concurrency` C cannot keep up with its rate at the workload's
    `expected_latency` L (rate > C / L, `_cap_rps`) sends its arrivals on schedule but serves them
    C at a time, in arrival order, the warmup's first: its measured ones end after ceil((warmup
    arrivals + N) / C) rounds of L -- past warmup + duration, when the queue drains after it (the
    runner serves queued arrivals after the duration's end) -- but no later than its last
    measured arrival's intended time plus the deadline, which runs from that time (a queue that
    long ends in timeouts)."""
    match shape:
        case Open(requests_per_level=int(n)):
            # the last measured arrival's intended time (with min_duration: that long, at least)
            sent = warmup + windows.counted_span(duration, shape.rate, n, shape.min_duration_s)
            queued = _open_count(shape, warmup) + min(max(n, _least_count(shape, warmup, latency)), _open_count(shape, duration, warmup))
            capped = _capped_s(shape, queued, latency)
            return sent if capped is None else min(max(sent, capped), sent + deadline)
        case Closed(requests_per_level=int(n), concurrency=c) if latency:
            return warmup + min(duration, max(math.ceil(n / c) * latency, shape.min_duration_s or 0.0))
    return None


def _least_count(shape: "Open | Closed", warmup: float, latency: float | None) -> int:
    """The measured requests a counted level's `min_duration` alone sends (0 without one): an
    open loop's arrivals in it, a closed loop's concurrency × min_duration / expected_latency
    (0 without a latency: its count is then the estimate)."""
    least = shape.min_duration_s
    if least is None:
        return 0
    if isinstance(shape, Open):
        return _open_count(shape, least, warmup)
    return int(shape.concurrency * least / latency) if latency else 0


def _open_minimum(shape: "Open | OpenRamp", expected: int) -> int:
    """The fewest measured requests an open level can send: constant arrivals send exactly
    `expected`; Poisson (or gamma) arrivals, seeded, may send fewer -- 5 rps for 5 s with seed 0
    sends 18 -- so they promise none."""
    return expected if shape.arrival == "constant" else 0


def _open_count(shape: Open, duration: float, warmup: float = 0.0) -> int:
    """Measured arrivals of an open level (runner/load.py `_open`): constant arrivals are sent at
    i / rate from the level's start, the warmup's included, so the measured ones are the i with
    warmup <= i / rate < warmup + duration; Poisson arrivals the rate's integral, rounded."""
    if shape.arrival == "constant":
        return _constant_count(shape.rate * warmup, shape.rate * duration)
    return int(round(shape.rate * duration))


def _replay_levels(w: Workload, scale: float, request: RequestTemplate) -> list[Level]:
    """A replayed trace is one open-loop level: its arrivals (time-scaled with the run), its lengths."""
    rp = w.load.replay
    assert rp is not None
    duration, warmup = w.duration_s * scale, w.warmup_s * scale
    blocks, distinct, outrun = sharing(rp.offsets_s, rp.input_lens, rp.hash_ids, rp.hash_block, rp.speed / scale, warmup + duration)
    shape = Replay(rp.path, rp.format, rp.sha256, rp.speed / scale, rp.offsets_s, rp.input_lens, rp.output_lens,
                   w.load.max_concurrency, rp.hash_ids, blocks, distinct, outrun, (rp.hash_block, "tokens" if rp.tokens else "words", w.load.seed))
    n = shape.count(duration, warmup)
    return [Level(workload=w.name, index=0, shape=shape, request=request, warmup_s=warmup, duration_s=duration,
                  deadline_s=w.deadline_s * scale, buckets=_buckets(duration, min(w.bucket_s * scale, duration)),
                  min_requests=n, expected_requests=n)]  # fmt: skip


def _levels(w: Workload, scale: float, request: RequestTemplate) -> list[Level]:
    if w.load.phases:
        return _phase_levels(w, scale, request)
    if w.load.replay is not None:
        return _replay_levels(w, scale, request)
    out = []
    duration = w.duration_s * scale
    latency = w.expected_latency_s * scale if w.expected_latency_s else None
    if w.load.search is not None:
        return [_sweep_level(w, scale, request)]
    for i, level in enumerate(w.load.levels):
        shape = _shape(w, i, level, scale)
        match shape:
            case Open():
                expected = _open_count(shape, duration, w.warmup_s * scale)
                minimum = _open_minimum(shape, expected)
            case Batch(concurrency=c, requests=minimum):
                # the waves of its batches that start in the measured window (lang/batches.py); at
                # least the one batch its minimum promises
                warmup = w.warmup_s * scale
                expected = max(minimum, batch_requests(c, minimum, latency, warmup, warmup + duration)) if latency else None
            case Closed(concurrency=c as minimum):
                expected = max(minimum, int(c * duration / latency)) if latency else None
        warm_s = _counted_warmup_s(shape, w.warmup_requests, latency, w.deadline_s * scale)
        count = shape.requests_per_level if isinstance(shape, (Open, Closed)) else None
        if count is not None:  # at most the count -- or what its min_duration sends -- before the duration's bound ends the level
            most = max(count, _least_count(shape, w.warmup_s * scale, latency))
            minimum = min(minimum, most if isinstance(shape, Open) and shape.arrival == "constant" else count)
            expected = min(expected, most) if expected is not None else count  # (closed: with expected_latency)
        lv = Level(
            workload=w.name, index=i, shape=shape, request=request, warmup_s=w.warmup_s * scale,
            duration_s=duration, deadline_s=w.deadline_s * scale, buckets=_buckets(duration, w.bucket_s * scale),
            min_requests=minimum, expected_requests=expected,
            expected_warmup_requests=w.warmup_requests or _warmup_count(shape, w.warmup_s * scale, latency),
            expected_load_s=_count_load_s(shape, w.warmup_s * scale + (warm_s or 0.0), duration, latency, w.deadline_s * scale),
            cap_rps=_cap_rps(shape, latency), warmup_requests=w.warmup_requests, expected_warmup_s=warm_s,
        )  # fmt: skip
        if count is not None and _reaches_count(lv):
            # a level the plan expects to reach its count sends at least its N, whatever its arrivals
            # (a Poisson count's floor is not 0, a closed loop's not one a worker) -- constant
            # arrivals every one due before its min_duration, if more: the floor its line says too
            lv = dataclasses.replace(lv, min_requests=max(count, minimum))
        out.append(lv)
    return out


def workload_sweep(w: Workload, scale: float = 1.0) -> Sweep:
    """The search of a sweep workload (`search = bisect`): its axis, grid and wall-time bound."""
    load = w.load
    low, high = (load.levels + (load.levels[0],))[:2] if load.levels else (1, 1)
    if load.mode == "open":
        step = load.rate_step or (float(high) - float(low)) / 16 or 1.0
        grid = sweep_grid(float(low), float(high), step, integer=False)
    else:
        grid = sweep_grid(int(low), int(high), max(1, load.step), integer=True)
    return Sweep("rate" if load.mode == "open" else "concurrency", grid, (load.max_wall_s or w.duration_s) * scale,
                 (w.warmup_s + w.duration_s) * scale)


def _sweep_level(w: Workload, scale: float, request: RequestTemplate) -> Level:
    """A sweep workload plans one level: its shape at the grid's low end, and the search."""
    duration = w.duration_s * scale
    sweep = workload_sweep(w, scale)
    grid = sweep.grid
    shape = _shape(w, 0, grid[0])
    lv = Level(workload=w.name, index=0, shape=shape, request=request, warmup_s=w.warmup_s * scale, duration_s=duration,
               deadline_s=w.deadline_s * scale, buckets=_buckets(duration, w.bucket_s * scale), min_requests=0,
               expected_requests=None, sweep=sweep)  # fmt: skip
    # the first probe, the grid's lowest level, always runs (max_wall holds one probe, E204):
    # at least its requests; how many more depends on the levels the search probes
    return dataclasses.replace(lv, min_requests=probe_level(lv, 0, 0).min_requests)


def _abspath(base: Path, path: str | None) -> str | None:
    if path is None:
        return None
    return path if os.path.isabs(path) else str(base / path)


def spec_dir(spec: Spec) -> Path:
    """Relative paths in a spec are relative to its file's directory (or the current one)."""
    return Path(spec.path).resolve().parent if spec.path and os.path.exists(spec.path) else Path.cwd()


def runtime_banner(backend: Backend) -> str | None:
    """In a rehearsal, the simulator prints a log line the declared pattern recognises, so that
    the boundary machinery is exercised: the regex's literal prefix + the version."""
    rt = backend.runtime
    if rt is None or rt.log_pattern is None or rt.version is None:
        return None
    prefix = re.split(r"(?<!\\)[(\[]", rt.log_pattern, maxsplit=1)[0]
    prefix = re.sub(r"\\(.)", r"\1", prefix).lstrip("^")
    banner = prefix + rt.version
    return banner if re.search(rt.log_pattern, banner) else None


def _sim_command(b: Backend, model: str, rehearse: bool) -> tuple[str, ...]:
    opts = dict(b.sim)
    if rehearse and "runtime_banner" not in opts:
        banner = runtime_banner(b)
        if banner:
            opts["runtime_banner"] = banner
    opts.setdefault("model", model)
    return (sys.executable, "-m", "soakspec", "sim", "--host", HOST, "--port", PORT, *sim_argv(opts))


def _launch(spec: Spec, b: Backend, base: Path, rehearse: bool) -> Launch:
    kind = "sim" if rehearse else b.kind
    m = spec.model
    fields = {"port": PORT, "host": HOST, "url": URL, "model_path": m.path or "", "model_id": m.id or "",
              "model_revision": m.revision or "", "backend": b.name}  # fmt: skip
    if kind == "sim":
        argv: tuple[str, ...] | None = _sim_command(b, m.request_name, rehearse)
    elif kind == "launch":
        argv = tuple(a.format(**fields) for a in b.argv)
    elif kind == "shell":
        quoted = {k: v if v in (PORT, URL) else shlex.quote(v) for k, v in fields.items()}
        argv = ("/bin/sh", "-c", (b.shell or "").format(**quoted))
    else:
        argv = None
    env = dict(b.env)
    if b.gpus and kind != "url":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, b.gpus))
    cwd = None
    if kind in ("launch", "shell"):
        cwd = str((base / b.cwd).resolve()) if b.cwd is not None and not os.path.isabs(b.cwd) else (b.cwd or str(base))
    r = b.ready
    timeout = min(r.timeout_s, REHEARSAL_READY_TIMEOUT_S) if rehearse else r.timeout_s
    grace = min(b.shutdown_grace_s, REHEARSAL_GRACE_S) if rehearse else b.shutdown_grace_s
    return Launch(
        name=b.name, kind=kind, argv=argv, url=b.url if kind == "url" else None, env=tuple(env.items()), cwd=cwd,
        probe=Probe(r.method, r.path, r.status, timeout, r.interval_s), shutdown_grace_s=grace,
        kill_wait_s=KILL_WAIT_S, capture_log=b.capture_log or rehearse,
        log_file=_abspath(base, b.log_file) if kind == "url" else None,
    )  # fmt: skip


def _traces(spec: Spec, b: Backend, base: Path, rehearse: bool) -> TracePlan:
    t = b.traces
    window = spec.gate.trace_window_s
    if rehearse or b.kind == "sim":
        return TracePlan("log", simtrace.TRACE_PATTERN, None, t.id_field, simtrace.ID_FORMS, window)
    return TracePlan(t.source, t.pattern, _abspath(base, t.file) if t.source == "jsonl" else None, t.id_field, t.id_forms, window)


def _runtime(b: Backend) -> BoundaryDecl | None:
    rt = b.runtime
    if rt is None:
        return None
    return BoundaryDecl(label=rt.label, log_regex=rt.log_pattern, expected_version=rt.version,
                        required_env=tuple((n, None) for n in rt.require_env))  # fmt: skip


def _aborts(spec: Spec, b: Backend, time_scale: float) -> tuple[AbortRule, ...]:
    out = []
    for r in spec.gate.aborts:
        if r.backend is not None and r.backend != b.name or r.op is None or r.threshold is None:
            continue
        agg = "p" if r.expr.percentile is not None else (r.expr.agg or "count")
        window = r.window_s * time_scale if r.window_s is not None else None
        out.append(AbortRule(r.text, r.expr.metric, agg, r.expr.percentile, r.op, r.threshold, r.scope, window))
    if spec.gate.abort_default:
        out.append(AbortRule(DEFAULT_ABORT_TEXT, "errors", "ratio", None, ">=", 1.0, "bucket", None,
                             min_requests=DEFAULT_ABORT_MIN_REQUESTS, builtin=True))
    return tuple(out)


def _runs(lv: Level) -> int:
    """How many manifest levels the planned level becomes: a sweep's at most its most probes."""
    return lv.sweep.max_probes if lv.sweep is not None else 1


def _level_warmup_s(lv: Level) -> float:
    """A level's warmup time in the plan's estimate: `warmup_s`; a counted warmup's expected time
    (`expected_warmup_s`), else -- a closed loop without expected_latency -- its bound."""
    if lv.warmup_requests is None:
        return lv.warmup_s
    return lv.expected_warmup_s if lv.expected_warmup_s is not None else lv.warmup_bound_s


def _level_load_s(lv: Level) -> float:
    """A level's load time; a sweep's: its probes, at most its wall-time bound."""
    one = _level_warmup_s(lv) + lv.duration_s
    return one if lv.sweep is None else min(lv.sweep.max_probes * one, lv.sweep.max_wall_s)


def _backend_plan(spec: Spec, b: Backend, base: Path, time_scale: float, rehearse: bool) -> BackendPlan:
    model = spec.model.request_name
    levels: list[Level] = []
    for w in spec.workloads:
        levels.extend(_levels(w, time_scale, _request(w, model, base, b.api_key_env)))
    follow = any(w.follow_up for w in spec.workloads)
    follow_deadline = min((w.deadline_s for w in spec.workloads), default=0.0) * time_scale
    follow_est = min((w.expected_latency_s or 0.0 for w in spec.workloads), default=0.0) * time_scale if follow else 0.0
    est = sum(_level_load_s(lv) for lv in levels) + follow_est
    counted = [lv.expected_load_s for lv in levels if lv.requests_per_level is not None]
    count_est = (sum(lv.expected_load_s if lv.expected_load_s is not None else _level_load_s(lv) for lv in levels) + follow_est
                 if counted and None not in counted else None)  # fmt: skip
    launch = _launch(spec, b, base, rehearse)
    metrics = _metrics_scrape(spec, b, time_scale)
    upper = (
        est
        + launch.probe.timeout_s
        + sum(lv.deadline_s * (lv.sweep.max_probes if lv.sweep is not None else 1) for lv in levels)
        + sum(w.deadline_s for w in spec.workloads) * time_scale  # the pre-flight: one request per workload, before any level
        + sum(lv.warmup_bound_s - _level_warmup_s(lv) for lv in levels)  # a counted warmup: its bound, not its estimate
        + (follow_deadline if follow else 0.0)
        + (launch.shutdown_grace_s if launch.launches else 0.0)
        + (metrics.last_wait_s if metrics is not None else 0.0)  # the scrape after the load (runner/scrape.py)
    )
    # the follow-up is sent in the shape of the first workload that asks for one (follow_up = true)
    first = next((w for w in spec.workloads if w.follow_up), spec.workloads[0])
    return BackendPlan(
        b, tuple(levels), follow, follow_deadline, est, upper, launch, _traces(spec, b, base, rehearse), _runtime(b),
        _request(first, model, base, b.api_key_env), first.name, _aborts(spec, b, time_scale), metrics, count_est,
    )


def plan(spec: Spec, *, time_scale: float = 1.0, rehearse: bool = False, only: tuple[str, ...] = ()) -> Plan:
    """Build the plan. `time_scale` shrinks every duration, bucket and deadline (rehearsals);
    `rehearse` replaces every backend by the simulator; `only` restricts the run to the named
    backends (names are checked by the caller)."""
    if not 0 < time_scale <= 1:
        raise ValueError("time_scale must be in (0, 1]")
    base = spec_dir(spec)
    backends = tuple(_backend_plan(spec, b, base, time_scale, rehearse) for b in spec.backends if not only or b.name in only)
    found: set[str] = set()
    for b in spec.backends:
        found |= secret_values(dict(b.env), [*b.argv, *([b.shell] if b.shell else [])])
    interval = spec.telemetry.interval_s * time_scale  # shrunk with the buckets: every bucket keeps its samples
    ran = tuple(bp.name for bp in backends)
    m = spec.model
    return Plan(
        spec, backends, spec.header.parallel, time_scale, rehearse,
        name=spec.header.name, spec_text=spec.canonical_text, spec_path=spec.path,
        model=ModelRef(m.id, m.revision, _abspath(base, m.path)), source_repo=_source_repo(spec, base),
        telemetry_interval_s=max(TELEMETRY_MIN_INTERVAL_S, interval), require_gpus=spec.telemetry.require_gpus,
        only=ran if ran != tuple(b.name for b in spec.backends) else None, spec_secrets=frozenset(found),
        api_key_envs=tuple(sorted({b.api_key_env for b in spec.backends if b.api_key_env}
                                  | {name for w in spec.workloads for _, name in w.header_env})),
    )  # fmt: skip


def _source_repo(spec: Spec, base: Path) -> str | None:
    repo = spec.source.repo
    if repo is None:
        return None
    return repo if os.path.isabs(repo) else str((base / repo).resolve())


# ---------------------------------------------------------------- rendering


def _how(la: Launch, rehearsal: bool, secrets: Iterable[str] = ()) -> str:
    if la.kind == "url":
        return f"already running at {scrub(la.url or '')}"
    if la.kind == "sim":
        return "embedded simulator" + (" (rehearsal)" if rehearsal else "")
    argv = redact_argv(list(la.argv or ()), secrets)
    return f"shell: {argv[-1]}" if la.kind == "shell" else "launch " + " ".join(argv)


def render_text(p: Plan) -> str:
    spec = p.spec
    lines = [f"plan for soak '{spec.header.name}'" + (f" ({spec.header.issue})" if spec.header.issue else "")]
    if p.rehearsal or p.time_scale != 1:
        lines.append(f"  rehearsal: {'yes (backends replaced by the simulator)' if p.rehearsal else 'no'}, time scale {p.time_scale:g}")
    n_levels = {sum(_runs(lv) for lv in b.levels) for b in p.backends}
    n_buckets = {len(lv.buckets) for b in p.backends for lv in b.levels}
    swept = any(lv.sweep is not None for b in p.backends for lv in b.levels)  # a sweep runs at most max_probes levels
    most = "at most " if swept else ""
    shape = f"{len(p.backends)} backend{'s' if len(p.backends) != 1 else ''}"
    if len(n_levels) == 1:
        shape += f" × {most}{n_levels.pop()} levels" + (" (sweep probes)" if swept else "")
    if len(n_buckets) == 1:
        shape += f" × {n_buckets.pop()} buckets"
    lines.append(f"  shape: {shape} = {most}{p.bucket_count} buckets in all; backends run {'side by side' if p.parallel else 'one after another'}")
    for b in p.backends:
        lines.extend(_render_backend(b, p.rehearsal, p.spec_secrets, _defaulted_deadlines(spec)))
    total_exp = [b.expected_requests for b in p.backends]
    exp = sum(total_exp) if total_exp and all(v is not None for v in total_exp) else None  # type: ignore[misc]
    every = [lv for b in p.backends for lv in b.levels]
    counted = _counted_requests(every)
    lines.append(
        (f"  total: requests: {counted} measured (each level its requests_per_level); " if counted is not None else
         f"  total: requests {_expected_text(sum(b.min_requests for b in p.backends), exp, every)}; ")
        + _wall_text(p.est_wall_s, p.max_wall_s, p.count_est_wall_s, every, "")
    )
    return terminal_safe("\n".join(lines))  # names and texts are the spec's own: shown, never obeyed by the terminal


def _expected_text(floor: int, exp: int | None, levels: Iterable[Level]) -> str:
    """`≥ 8, expected ~40`; where random arrivals make the count (`_random_range`), the expected
    count with their spread -- `~600 expected (random arrivals, ± 3 sd: 527-673)`, the floor only
    where it says something (`≥ 15, expected ~615 (...)`); `≥ 8` with no estimate."""
    if exp is None:
        return f"≥ {floor}"
    rng = _random_range(levels)
    if rng is None:
        return f"≥ {floor}, expected ~{exp}"
    return (f"≥ {floor}, expected ~{exp}" if floor else f"~{exp} expected") + f" (random arrivals, ± {COUNT_SIGMAS:g} sd: {rng[0]}-{rng[1]})"


_AT_RATE, _AT_LATENCY = "at the planned rate", "at the workload's expected_latency"


def _pace(lv: Level) -> str:
    """What a counted level's `expected_load_s` assumes: the planned rate (an open loop), the
    workload's expected_latency (a closed one), or -- an open loop under `max_concurrency` -- the
    cap's pace where the expected_latency says it cannot keep up with the rate (`cap_rps`), and
    without an expected_latency that the server keeps up."""
    cap = lv.max_concurrency
    if lv.mode != "open":
        return _AT_LATENCY
    if cap is None or (lv.cap_rps is not None and lv.rate is not None and lv.cap_rps >= lv.rate):
        return _AT_RATE
    if lv.cap_rps is None:
        return f"{_AT_RATE}, if the server keeps up with it under max_concurrency {cap} -- set expected_latency to check"
    return f"at the {lv.cap_rps:.3g} rps that max_concurrency {cap} serves at the workload's expected_latency"


def _wall_text(est: float, most: float, count_est: float | None, levels: Iterable[Level], with_: str) -> str:
    """`wall time ≈ 30s (at most 25m52s ...)`; where a level ends at its count, warmup + duration
    is only its bound (README "A fixed count per level"): `wall time ≤ 30s (ends at its count:
    about 17s at the planned rate; ...)`, or `wall time at most 30s (...)` with no estimate. A
    capped open loop whose queue drains past warmup + duration (`_count_load_s`) is no bound of
    it: `wall time ≈ 1m2s (ends at its count: at the 2 rps that max_concurrency 2 serves ...)`."""
    upper = f"at most {format_duration(most)}{with_}"
    counts = [lv for lv in levels if lv.requests_per_level is not None]
    if not counts:
        return f"wall time ≈ {format_duration(est)} ({upper})"
    ends = "ends at its count" if len(counts) == 1 else "its counted levels end at their counts"
    if any(lv.min_duration_s is not None for lv in counts):  # and their min_durations (the later of the two)
        ends += " or min_duration, the later" if len(counts) == 1 else " or min_durations, the later"
    if count_est is None:
        return f"wall time at most {format_duration(est)} ({ends}, how soon depends on the server; {upper})"
    paces = list(dict.fromkeys(_pace(lv) for lv in counts))
    pace = "at the planned rates and expected_latency" if set(paces) == {_AT_RATE, _AT_LATENCY} else " and ".join(paces)
    if count_est > est + 1e-9:
        return (f"wall time ≈ {format_duration(count_est)} ({ends}: {pace}, its queue draining past warmup + duration, "
                f"{format_duration(est)}; {upper})")
    return f"wall time ≤ {format_duration(est)} ({ends}: about {format_duration(count_est)} {pace}; {upper})"


def _defaulted_deadlines(spec: Spec) -> frozenset[str]:
    """The workloads whose request deadline is `Workload`'s default (the plan says so: a default
    client timeout is what turns slow requests into timeouts unseen)."""
    default = next(f.default for f in dataclasses.fields(Workload) if f.name == "deadline_s")
    return frozenset(w.name for w in spec.workloads if w.deadline_s == default)


def _render_backend(b: BackendPlan, rehearsal: bool, secrets: Iterable[str] = (), defaulted: frozenset[str] = frozenset()) -> list[str]:
    la = b.launch
    rt = b.runtime.label if b.runtime else "(none declared)"
    pr = la.probe
    ready = f"ready when {pr.method} {scrub(pr.path)} answers {pr.status} (every {format_duration(pr.interval_s)}, at most {format_duration(pr.timeout_s)})"
    stop = f"; stop: SIGTERM, {format_duration(la.shutdown_grace_s)} grace, SIGKILL" if la.launches else ""
    lv_ = la.liveness
    alive = (f"    alive while {pr.method} {scrub(pr.path)} answers (every {format_duration(lv_.interval_s)}); "
             f"dead after {format_duration(lv_.grace_s)} of refusals, or {format_duration(lv_.hang_s)} of probes answered "
             "by nothing (a hung server): the run aborts (exit 4; sooner when an abort rule fires on a bucket whose "
             "requests all found it gone: refused, held back after refusals, cut in flight)")  # fmt: skip
    lines = [
        f"  backend '{b.name}': {_how(la, rehearsal, secrets)}",
        f"    runtime boundary: {rt}; traces: {b.traces.source}",
        f"    {ready}{stop}",
        alive,
    ]
    names = ", ".join(f"'{n}'" for n in dict.fromkeys(lv.workload for lv in b.levels))
    several = len({lv.workload for lv in b.levels}) > 1
    lines.append(f"    before the first level: one pre-flight request of {'each workload' if several else 'workload'} {names}, "
                 "which must complete (--no-preflight skips it)")
    for lv in b.levels:
        if lv.sweep is not None:
            lines.append(_render_sweep(lv))
            continue
        warm = f" after {format_duration(lv.warmup_s)} warmup" if lv.warmup_s else ""
        if lv.warmup_requests is not None:
            warm = f" after its warmup ({_warmup_text(lv)})"
        lines.append(
            f"    {lv.workload} / {lv.label}: {_timing_text(lv)}{warm} in "
            f"{len(lv.buckets)} × {format_duration(lv.bucket_s)} buckets; {_level_requests_text(lv)}{_short_text(lv)}"
        )
    replayed = {lv.workload for lv in b.levels if isinstance(lv.shape, Replay)}
    for name, t in {lv.workload: lv.request for lv in b.levels}.items():
        if name in replayed:
            unit = f"tokens ({'tokenizer ' + t.tokenizer if t.tokenizer else 'the server' + chr(39) + 's /tokenize'})" if t.prompt_tokens else "words"
            lines.append(f"    {name} prompts: each the trace's input_length in {unit}, max_tokens its output_length")
            lines.append(f"    {name} cache: {_replay_sharing_line(t, [lv.shape for lv in b.levels if lv.workload == name])}")
            continue
        lines.append(f"    {name} prompts: {prompt_label(t)}; cache: {_prefix_policy(t)}")
        if t.prompts:
            lines.append(f"    {name} order: {order_label(t)}")
        if t.think_time is not None:
            lines.append(f"    {name} think time: {think_line(t)}")
        if t.length_range:
            lines.append(f"    {name} lengths: {length_label(t)}")
    for name, lv in {lv.workload: lv for lv in b.levels}.items():  # the deadline every measured request runs under
        lines.append(f"    {name} deadline: {format_duration(lv.deadline_s)} a request, from its intended start"
                     f"{' (the default)' if name in defaulted else ''}; past it, a timeout (an error; a censored sample in time rules)")
    lines.extend(_phase_lines(b))
    lines.extend(_in_flight_lines(b))
    if b.follow_up:
        lines.append(f"    then one clean follow-up request of workload '{b.follow_up_workload}' (its smallest shape, concurrency 1; "
                     f"deadline {format_duration(b.follow_up_deadline_s)})")
    swept = any(lv.sweep is not None for lv in b.levels)  # a sweep's abort rule ends that probe only (runner/driver.py)
    for a in b.aborts:
        lines.append(f"    ends the sweep's probe (it does not hold; the search goes on below it) when: {a.text}" if swept
                     else f"    stops its load when: {a.text}")  # fmt: skip
    if b.metrics is not None:
        how = "declared: a failed scrape fails metrics_scraped" if b.metrics.declared else "default: a 404 means not available"
        lines.append(f"    server metrics: GET {scrub(b.metrics.path)} every {format_duration(b.metrics.interval_s)} "
                     f"(at most {format_duration(b.metrics.timeout_s)} each; {how})")
        if named := [f for f in b.metrics.families if f not in DEFAULT_SERVER_METRICS]:  # a rule's, both of a ratio(...)'s
            lines.append(f"      and keeps, for the gate's rules, {', '.join(named)} (beside the default families)")
    exp = b.expected_requests
    unknown = (" (a sweep: how many more depends on the levels it probes)" if any(lv.sweep is not None for lv in b.levels)
               else " (set expected_latency for an estimate)")  # fmt: skip
    counted = _counted_requests(b.levels)
    lines.append(
        (f"    requests: {counted} measured (each level its requests_per_level)" if counted is not None else
         f"    requests: {_expected_text(b.min_requests, exp, b.levels)}" + ("" if exp is not None else unknown))
        + "; " + _wall_text(b.est_wall_s, b.max_wall_s, b.count_est_wall_s, b.levels, " with startup, drains and shutdown")
    )
    return lines


def _phase_lines(b: BackendPlan) -> list[str]:
    """`w phases: ramp 10s → steady 20s → burst 10s → recovery 20s` for each workload with phases."""
    by: dict[str, list[Level]] = {}
    for lv in b.levels:
        if lv.phase is not None:
            by.setdefault(lv.workload, []).append(lv)
    return [f"    {name} phases: " + " → ".join(f"{lv.phase} {format_duration(lv.duration_s)}" for lv in lvs) for name, lvs in by.items()]
def _in_flight_lines(b: BackendPlan) -> list[str]:
    """What bounds each open-loop workload's requests in flight: its `max_concurrency`, or the
    load generator's own connection limit."""
    out = []
    for name, lv in {lv.workload: lv for lv in b.levels if lv.mode == "open"}.items():
        cap = lv.max_concurrency
        if cap is not None:
            out.append(f"    {name} in flight: at most {cap} (max_concurrency; later arrivals wait in arrival order, "
                       "their wait counted in latency and TTFT, which run from the intended send time)")
        else:
            out.append(f"    {name} in flight: up to {OPEN_LOOP_MAX_CONNECTIONS} (the load generator's connection limit; an "
                       "arrival past it is sent late, judged as the client's schedule lag: set max_concurrency to cap it)")
    return out


def _timing_text(lv: Level) -> str:
    """`30s`, or a count-bounded level's `100 requests (then it ends once they finish), at most
    30s` -- with what the bound leaves of the count where the plan expects fewer."""
    n, least = lv.requests_per_level, lv.min_duration_s
    if n is None:
        return format_duration(lv.duration_s)
    if least is not None:
        return (f"at least {n} measured requests for at least {format_duration(least)} (it ends once both hold and its "
                f"requests have finished), at most {format_duration(lv.duration_s)}")
    return f"{n} measured requests (it ends once they have finished), at most {format_duration(lv.duration_s)}"


def _random_mean(lv: Level) -> float | None:
    """The mean of a level's measured arrivals where they are random (seeded Poisson or gamma: an
    open rate or ramp whose `arrival` is not constant): the rate's integral over the duration;
    None where the count is not a random arrival count."""
    match lv.shape:
        case Open(arrival=a) if a != "constant":
            return lv.shape.rate * lv.duration_s
        case OpenRamp(arrival=a) if a != "constant":
            return lv.shape.expected(lv.duration_s)
    return None


def _reaches_count(lv: Level) -> bool:
    """A count-bounded level the plan expects to send its whole count (its duration, the bound,
    not ending it first): what ends it is its count, so its measured requests are N -- random
    arrivals too, whose count over a timed level would vary, where the rate × duration is more
    than `arrival_count_spread` above N (W515's measure of luck, from the other side: a count
    that bad luck could miss is not promised)."""
    n, exp = lv.requests_per_level, lv.expected_requests
    if n is None or exp is None or exp < n:
        return False
    mean = _random_mean(lv)
    return mean is None or mean - arrival_count_spread(mean, lv.shape.burstiness) >= n  # type: ignore[union-attr]


def _random_range(levels: Iterable[Level]) -> tuple[int, int] | None:
    """(low, high): the expected measured requests of `levels` less and plus the spread of their
    timed levels' random arrival counts (`arrival_count_spread`, the count's variance mean /
    burstiness; the levels' seeds differ, so their variances add); None where no timed level's
    count is random, or a level has no estimate. A counted level contributes its N (or the
    plan's estimate) without a spread."""
    levels = list(levels)
    exps = [lv.expected_requests for lv in levels]
    if not levels or None in exps:
        return None
    var = 0.0
    for lv in levels:
        mean = _random_mean(lv)
        if mean is not None and lv.requests_per_level is None:
            var += mean / lv.shape.burstiness  # type: ignore[union-attr]
    if not var:
        return None
    spread, exp = arrival_count_spread(var), sum(exps)  # type: ignore[arg-type]
    return max(0, _round_half_up(exp - spread)), _round_half_up(exp + spread)


def _counted_requests(levels: Iterable[Level]) -> int | None:
    """The measured requests of levels that all end at their count (`_reaches_count`); None
    where any is timed or expected to be ended by its duration (the plan gives a floor and an
    estimate instead)."""
    levels = list(levels)
    if not levels or not all(_reaches_count(lv) and lv.min_duration_s is None for lv in levels):
        return None  # (a min_duration makes the count a floor: the plan gives it and an estimate)
    return sum(lv.requests_per_level or 0 for lv in levels)


def _warmup_text(lv: Level) -> str:
    """`warmup: 20 requests (bucket 0 starts once they have finished; ~5s at the planned rate,
    at most 10m)`: a counted warmup's N, its estimate where one exists -- at the pace it assumes,
    as the level's count estimate says it (`_pace`) -- and its wall bound."""
    est = f"~{format_duration(lv.expected_warmup_s)} {_pace(lv)}, " if lv.expected_warmup_s is not None else ""
    return (f"warmup: {lv.warmup_requests} requests, bucket 0 starts once they have finished; {est}"
            f"at most {format_duration(lv.warmup_bound_s)}")


def _level_requests_text(lv: Level) -> str:
    """`requests ≥ 8, expected ~40`; a timed level of random arrivals `requests ~600 expected
    (random arrivals, ± 3 sd: 527-673)`; or a level that ends at its count: `requests: 500
    measured, ~20 in the warmup` -- N, not a floor, for random arrivals too (README "A fixed
    count per level"); the warmup's requests are recorded in no bucket."""
    if _reaches_count(lv) and lv.min_duration_s is not None:  # the count is a floor: its min_duration may send more
        return (f"requests ≥ {lv.min_requests} measured, expected ~{lv.expected_requests} "
                f"(it runs for at least {format_duration(lv.min_duration_s)})")
    if _reaches_count(lv):
        warm = lv.expected_warmup_requests
        return f"requests: {lv.requests_per_level} measured" + (f", ~{warm} in the warmup" if lv.warmup_s and warm is not None else
                                                                f", {warm} in the warmup" if lv.warmup_requests else "")
    n = lv.requests_per_level
    if n is None and _random_range([lv]) is not None:  # a timed level's random count: its spread
        return f"requests {_expected_text(lv.min_requests, lv.expected_requests, [lv])}"
    exp = f"~{lv.expected_requests}" if lv.expected_requests is not None else "?"
    if isinstance(lv.shape, (Open, OpenRamp)) and lv.shape.arrival != "constant":
        exp += (" (random arrivals: the seeded count varies around it)" if n is None or lv.expected_requests != n else
                f" (random arrivals: the duration may end it before its {n})")
    return f"requests ≥ {lv.min_requests}, expected {exp}"


def _short_text(lv: Level) -> str:
    """A count-bounded level whose duration ends it before its count, as planned (an open loop's
    rate × duration below it, a closed loop's concurrency × duration / expected_latency): said on
    its plan line, so it is no surprise in the report."""
    n, exp = lv.requests_per_level, lv.expected_requests
    if n is None or exp is None or exp >= n:
        return ""
    pace = "at this rate" if lv.mode == "open" else "at the workload's expected_latency"
    return f" -- {pace} the duration ends it first, after ~{exp} of {n} (the report will say so: not complete)"


def _render_sweep(lv: Level) -> str:
    sw = lv.sweep
    assert sw is not None
    wall = format_duration(sw.max_wall_s)
    bound = (f"no probe starts that would end after {wall}, which cuts the search's {sw.search_probes} short"
             if sw.max_probes < sw.search_probes else f"no probe starts that would end after {wall}")
    return (f"    {lv.workload} / {sw.label()}: bisection over {len(sw.grid)} levels, at most {sw.max_probes} probes of "
            f"{format_duration(lv.warmup_s + lv.duration_s)} each ({format_duration(lv.duration_s)} in "
            f"{len(lv.buckets)} × {format_duration(lv.bucket_s)} buckets); {bound}; "
            f"result: the highest level where every require rule holds")


def sweep_json(sw: Sweep | None) -> dict[str, Any] | None:
    if sw is None:
        return None
    return {"axis": sw.axis, "low": sw.grid[0], "high": sw.grid[-1], "levels": len(sw.grid), "grid": list(sw.grid),
            "max_probes": sw.max_probes, "search_probes": sw.search_probes, "max_wall_s": sw.max_wall_s, "search": "bisect"}


def _shape_json(shape: LoadShape) -> dict[str, Any]:
    match shape:
        case Open():
            kind = "open"
        case Batch():
            kind = "batch"
        case ClosedRamp():
            kind = "closed_ramp"
        case OpenRamp():
            kind = "open_ramp"
        case Replay():
            return {"kind": "replay", "source": shape.source, "format": shape.format, "sha256": shape.sha256,
                    "speed": shape.speed, "requests": len(shape.offsets_s),
                    "span_s": shape.offsets_s[-1] / shape.speed if shape.offsets_s else 0.0} | _cap_json(shape) | _sharing_json(shape)  # fmt: skip
        case _:
            kind = "closed"
    count, least = requests_per_level(shape), min_duration(shape)
    skip = ("max_concurrency", "requests_per_level", "min_duration_s")  # absent where unset, as in older evidence
    return {"kind": kind, **{k: v for k, v in dataclasses.asdict(shape).items() if k not in skip},
            **_cap_json(shape), **({} if count is None else {"requests_per_level": count}),
            **({} if least is None else {"min_duration_s": least})}


def _sharing_json(shape: Replay) -> dict[str, Any]:
    """A replay's shared blocks (`prefix_sharing`): absent without them, as in the shapes of
    evidence from before them."""
    if not shape.hash_ids:
        return {}
    size, unit, seed = shape.block
    return {"prefix_blocks": {"block": size, "unit": unit, "seed": seed, "blocks": shape.blocks, "distinct": shape.distinct_blocks,
                              "repeat_share": shape.repeat_share, "requests_outrun": shape.outrun}}


def _cap_json(shape: LoadShape) -> dict[str, int]:
    """`max_concurrency` where the spec declared one; absent otherwise, as in the shapes of
    evidence from before it existed (a level's shape is compared with the re-planned one's)."""
    cap = max_concurrency(shape)
    return {} if cap is None else {"max_concurrency": cap}


MAX_RAMP_LEVEL, MAX_RAMP_STEPS = 1_000_000, 1000  # lang/check/workload.py's MAX_LOAD_LEVEL and a phase's `steps`


def ramp_of(shape: Any) -> "ClosedRamp | OpenRamp | None":
    """The ramp a level's `shape` (the manifest's JSON, `_shape_json`) describes; None for any
    other shape, or one that is not a well-formed ramp."""
    if not isinstance(shape, dict) or shape.get("kind") not in ("closed_ramp", "open_ramp"):
        return None
    try:
        a, b, steps = float(shape["start"]), float(shape["end"]), int(shape.get("steps") or 0)
        if not (0 < a <= MAX_RAMP_LEVEL and 0 < b <= MAX_RAMP_LEVEL and 0 <= steps <= MAX_RAMP_STEPS):
            return None  # past what `check` lets a spec say (an edited manifest): no ramp to read
        if shape["kind"] == "closed_ramp":
            return ClosedRamp(int(shape["start"]), int(shape["end"]), int(shape.get("steps") or 0))
        cap = shape.get("max_concurrency")
        return OpenRamp(float(shape["start"]), float(shape["end"]), int(shape.get("steps") or 0), str(shape.get("arrival")),
                        int(shape.get("seed") or 0), float(shape.get("burstiness") or 1.0),
                        cap if type(cap) is int and 0 < cap <= MAX_RAMP_LEVEL else None)
    except (KeyError, TypeError, ValueError):
        return None


def shape_identity(shape: Any) -> Any:
    """A level's `shape` as the manifest's JSON holds it (`_shape_json`), less what depends on
    where the spec was read from: a replay's trace is its content (sha256, format, speed,
    requests, span), not its `source` path -- two runs of one trace from two folders or two
    machines ran the same level (validity's level check and compare's pairing both read it so)."""
    if isinstance(shape, dict) and shape.get("kind") == "replay":
        return {k: v for k, v in shape.items() if k != "source"}
    return shape


def _range_json(levels: Iterable[Level]) -> list[int] | None:
    """`expected_requests_range`: [low, high] of `_random_range` (three standard deviations of
    the timed levels' random arrival counts about `expected_requests`), null where no count is random."""
    rng = _random_range(levels)
    return list(rng) if rng is not None else None


def _level_json(lv: Level) -> dict[str, Any]:
    return {
        "workload": lv.workload, "index": lv.index, "label": lv.label, "mode": lv.mode, "concurrency": lv.concurrency,
        "rate": lv.rate, "batch_requests": lv.batch_requests, "max_concurrency": lv.max_concurrency,
        "requests_per_level": lv.requests_per_level, "min_duration_s": lv.min_duration_s, "shape": _shape_json(lv.shape),
        "warmup_s": lv.warmup_s, "duration_s": lv.duration_s, "bucket_s": lv.bucket_s, "deadline_s": lv.deadline_s,
        "min_requests": lv.min_requests, "expected_requests": lv.expected_requests,
        "expected_warmup_requests": lv.expected_warmup_requests, "expected_load_s": lv.expected_load_s,
        "expected_requests_range": _range_json([lv]), "cap_rps": lv.cap_rps,
        "warmup_requests": lv.warmup_requests, "expected_warmup_s": lv.expected_warmup_s,
        "request": lv.request.to_json(),
        "buckets": [{"index": bk.index, "start_s": bk.start_s, "length_s": bk.length_s} for bk in lv.buckets],
    } | ({"sweep": sweep_json(lv.sweep)} if lv.sweep is not None else {})  # fmt: skip


def _backend_json(b: BackendPlan, secrets: Iterable[str] = ()) -> dict[str, Any]:
    la = b.launch
    return {
        "name": b.name,
        "kind": b.backend.kind,
        "runtime_boundary": b.runtime.label if b.runtime else None,
        "launch": la.to_json(secrets),
        "ready": {"method": la.probe.method, "path": scrub(la.probe.path), "status": la.probe.status},
        "timeouts": b.timeouts(),
        "traces": b.traces.to_json(),
        "min_requests": b.min_requests,
        "expected_requests": b.expected_requests,
        "expected_requests_range": _range_json(b.levels),
        "est_wall_s": round(b.est_wall_s, 3),
        "max_wall_s": round(b.max_wall_s, 3),
        "wall_ends_at_count": b.wall_ends_at_count,  # then est_wall_s is the bound; est_count_wall_s the estimate
        "est_count_wall_s": None if b.count_est_wall_s is None else round(b.count_est_wall_s, 3),
        "follow_up": b.follow_up,
        "follow_up_request": b.follow_up_request.to_json() if b.follow_up else None,
        "levels": [_level_json(lv) for lv in b.levels],
        "aborts": [a.to_json() for a in b.aborts],
        "metrics": b.metrics.to_json() | {"path": scrub(b.metrics.path)} if b.metrics is not None else None,
    }


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
        "expected_requests_range": _range_json([lv for b in p.backends for lv in b.levels]),
        "est_wall_s": round(p.est_wall_s, 3),
        "max_wall_s": round(p.max_wall_s, 3),
        "wall_ends_at_count": p.wall_ends_at_count,
        "est_count_wall_s": None if p.count_est_wall_s is None else round(p.count_est_wall_s, 3),
        "telemetry_interval_s": p.telemetry_interval_s,
        "progress_interval_s": PROGRESS_INTERVAL_S,
        "backends": [_backend_json(b, p.spec_secrets) for b in p.backends],
    }
