"""The facts the claim linter consumes: plain frozen values, no I/O, no parser types.

`lint` never sees a `Spec` or an evidence directory. Adapters (`soakspec.claims.adapters`) turn
a checked spec into a `ClaimBoundary` and a `Coverage`, and a retained run into one
`EvidenceFacts` per backend. Tests build these values directly.

Unknown values are `None` (or an empty tuple): a check that needs an unknown value is skipped,
never guessed.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimBoundary:
    """The spec's `claim "…"` and `exclude "…"` lines, in source order."""

    claims: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Coverage:
    """What the workload covered (union over the spec's workloads).

    duration_s is the duration of one level; total_duration_s the sum over every level run one
    after another. Empty `hardware` means the hardware is unknown (not "none").
    """

    concurrency_levels: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()
    duration_s: float = 0.0
    total_duration_s: float = 0.0
    prompt_words: tuple[int, ...] = ()
    prompt_file: str | None = None
    max_tokens: tuple[int, ...] = ()
    backends: tuple[str, ...] = ()
    runtime_boundaries: tuple[str, ...] = ()
    hardware: tuple[str, ...] = ()
    model_ids: tuple[str, ...] = ()
    model_revisions: tuple[str, ...] = ()
    sweep_axis: str | None = None  # a sweep workload: concurrency | rate (`soakspec.claims.sustain`)
    sweep_high: float | None = None  # the highest level the sweep could probe


@dataclasses.dataclass(frozen=True, slots=True)
class LevelFacts:
    """One level of one backend (results.json `backends[].levels[]`), named as the reports name
    it: `label` is the per-level tables' label (`concurrency 4`, `rate 2 rps`, `phase steady,
    concurrency 8`), `offered` their Offered column (`concurrency 4`, `2 req/s (open loop)`).
    `concurrency` / `rate` are the level's load (a rate for an open-loop level).

    `figures` are the level's measured figures (`soakspec.claims.figures`), keyed
    `ttft.p95`, `itl.mean`, `latency.max`, … (seconds), `tok_s` (output tokens/s) and `req_s`
    (completed requests/s): each maps to the values a document may cite for it, the
    results.json value first (then the gate's own measurement at that level, where it
    differs)."""

    label: str
    offered: str = ""
    workload: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    completed: int | None = None
    failed: int | None = None
    timeouts: int | None = None
    buckets: int | None = None
    figures: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict, hash=False)
    # the level's manifest entry declares max_concurrency (`soakspec.judge.index.capped`): a bench
    # block naming it gives bench serve's plain TTFT / E2EL the time from the send
    capped: bool = False
    # a soakspec bench block's "Failed requests" (`report.common.not_completed`: measured requests
    # that did not complete, every kind) and "Benchmark duration (s)" (results.json `wall_s`: the
    # level's measured wall time)
    not_completed: int | None = None
    wall_s: float | None = None
    # its "Peak output token throughput (tok/s)" and "Peak concurrent requests" (results.json
    # `peak_output_tokens_per_s`, `peak_concurrent_requests`: `soakspec.judge.peaks`); None in
    # results from before they were recorded, or where none was counted
    peak_tok_s: int | None = None
    peak_concurrent: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "figures", types.MappingProxyType(dict(self.figures or {})))


def _frozen_map(m: Mapping[str, str] | None) -> Mapping[str, str]:
    return types.MappingProxyType(dict(m or {}))


@dataclasses.dataclass(frozen=True, slots=True)
class EvidenceFacts:
    """One backend of one retained run.

    `report_sha256` is the SHA-256 of this backend's report (what a PR's results table cites);
    `artifact_sha256` maps every other hashed thing the evidence knows (artifact relpaths, model
    fingerprint, server binary, …) to its SHA-256. `gate` is "passed", "failed" or
    "inconclusive". `source` (the evidence directory) only makes messages clearer. `hardware`
(e.g. "2x RTX 5090") is used when the spec's `Coverage.hardware` is unknown.
    """

    backend: str
    completed: int | None = None
    failed: int | None = None
    timeouts: int | None = None
    buckets: int | None = None
    batches: int | None = None
    concurrency_levels: tuple[int, ...] = ()
    duration_s: float | None = None
    commit: str | None = None
    model_revision: str | None = None
    runtime_boundary: str | None = None
    report_sha256: str | None = None
    artifact_sha256: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    spec_sha256: str | None = None
    gate: str | None = None
    source: str | None = None
    hardware: tuple[str, ...] = ()
    # the run's id (manifest.json `run_id`): a soakspec bench block's `Run:` line names it
    run_id: str | None = None
    # a sweep's figures (results.json `figures`): max_sustainable_concurrency / max_sustainable_rate
    # -> the value, None when no level held
    sustainable: Mapping[str, float | None] = dataclasses.field(default_factory=dict, hash=False)
    # the figures that are only a lower bound ("at least X", results.json `sweep[].lower_bound`):
    # the sweep found no level next above X that does not hold
    sustainable_at_least: frozenset[str] = frozenset()
    # per level: a sentence that names a level is compared with that level's figure
    levels: tuple[LevelFacts, ...] = ()
    # the backend's own measured figures over the whole run, keyed as `LevelFacts.figures`: the
    # gate's backend-scope measurements (`mean(itl) = 14.3ms`) and tok_s / req_s over every bucket
    figures: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict, hash=False)
    # where the run's stored results.json / verdict.json disagree with the evidence re-judged (or
    # with themselves): one line each, reported once per evidence directory as CB402
    stored_mismatch: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "artifact_sha256", _frozen_map(self.artifact_sha256))
        object.__setattr__(self, "sustainable", types.MappingProxyType(dict(self.sustainable or {})))
        object.__setattr__(self, "figures", types.MappingProxyType(dict(self.figures or {})))

    def known_hashes(self) -> frozenset[str]:
        """Every 64-hex value this evidence records, lower-cased."""
        values = [self.report_sha256, self.spec_sha256, self.commit, self.model_revision]
        values += list(self.artifact_sha256.values())
        return frozenset(v.lower() for v in values if v)


@dataclasses.dataclass(frozen=True, slots=True)
class ChangeRow:
    """One row of `soakspec compare`'s result (its JSON `rows[]`): a statistic of a metric at
    one (backend, level) of two runs, its change and the confidence interval of that change.

    `change`, `low`, `high` are `new / base - 1` (a relative change), or for a proportion
    (`absolute`: ratio(errors)) the difference `new - base` of two shares. `higher_is_worse`
    is the metric's direction (ttft, itl, tpot, latency, errors: higher is worse; qps and
    throughput: lower is). `verdict` is compare's: regression, improvement, no significant
    change, insufficient samples or missing. `concurrency` / `rate` are the level's load, read
    from its label, so that "at 8 rps" finds the row labelled `rate 8 rps`. `turn` is a
    multi-turn level's row over one user turn's requests (compare has them of TTFT only: p50 and
    p95), None for the level's own rows; `later_turns` marks the row that pools every turn from
    `turn` on (compare's "turn 21+")."""

    backend: str
    label: str
    metric: str  # errors | ttft | itl | tpot | latency | qps | throughput
    stat: str  # p50, p95, p99, mean, ratio, …
    unit: str  # s | /s | tok/s | ratio
    base: float | None
    new: float | None
    change: float | None
    low: float | None
    high: float | None
    verdict: str
    higher_is_worse: bool
    absolute: bool
    row_confidence: float
    new_backend: str = ""
    concurrency: int | None = None
    rate: float | None = None
    turn: int | None = None
    later_turns: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class SweepChangeRow:
    """compare's row for a sweep's own figure (its JSON `sweep[]`, `soakspec.compare.sweep`):
    `figure` max_sustainable_rate | max_sustainable_concurrency, each run's highest probed level
    that holds (`base`, `new`; None: no level held), and compare's `verdict` on the two runs'
    [holds, fails] intervals: regression, improvement, no significant change (within one step of
    the grid), inconclusive.

    `base_failing` / `new_failing` are each run's lowest probed level above its figure that
    fails (JSON `base_sweep` / `new_sweep` `first_failing`): the run's true limit lies in
    [figure, failing]. None where nothing above the figure is known to fail -- a lower bound
    ("at least X": the grid's top, or the next level never probed) or a compare JSON that did not
    record it: the interval is open above (`sweep_changes` checks a claimed size against it)."""

    backend: str
    figure: str
    unit: str  # "rps" or "" (concurrency)
    base: float | None
    new: float | None
    verdict: str
    message: str
    new_backend: str = ""
    base_failing: float | None = None
    new_failing: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ChangeFacts:
    """What `soakspec compare` measured between two runs (`lint --compare`): its rows, and where
    they came from (`base → new` directories, or a compare JSON file) for messages."""

    source: str
    rows: tuple[ChangeRow, ...] = ()
    verdict: str | None = None  # compare's own outcome (PASS / FAIL / INCONCLUSIVE), and why where it is not PASS
    reasons: tuple[str, ...] = ()
    sweeps: tuple[SweepChangeRow, ...] = ()  # the sweep figure's rows (compare's JSON `sweep`)
