"""The checked spec: what `check` produces from a `SoakFile` and every later stage consumes.

All values are in base units (seconds, bytes, fractions, requests/second), every reference
is resolved, and the spec is immutable. `Spec.canonical_text` is `fmt` of the tree it came
from without its comments and `Spec.sha256` its hash: evidence records it so a later gate can
tell stale evidence, and editing a comment does not make evidence stale.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from soakspec.diagnostics import NO_SPAN, Span

BackendKind = Literal["launch", "shell", "url", "sim"]
Endpoint = Literal["completions", "chat"]
LoadMode = Literal["closed", "batch", "open", "replay"]
Severity = Literal["require", "warn", "abort"]  # abort: evaluated live by the runner (Gate.aborts)
ScopeKind = Literal["run", "backend", "level", "bucket", "window", "phase", "turn"]


def _span() -> Span:
    return dataclasses.field(default=NO_SPAN, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Header:
    name: str
    issue: str | None = None
    description: str | None = None
    parallel: bool = False


@dataclasses.dataclass(frozen=True)
class Model:
    id: str | None = None
    revision: str | None = None
    path: str | None = None
    served_name: str | None = None  # the `model` field sent in requests; defaults to id

    @property
    def request_name(self) -> str:
        return self.served_name or self.id or "default"


@dataclasses.dataclass(frozen=True)
class Source:
    repo: str | None = None  # path of the repository whose commit is recorded
    # A tree with uncommitted changes (before or after the run) fails provenance_consistent
    # unless the spec allows it; the evidence then records that it did.
    allow_dirty: bool = False


@dataclasses.dataclass(frozen=True)
class Telemetry:
    interval_s: float = 5.0
    require_gpus: bool = False


@dataclasses.dataclass(frozen=True)
class Ready:
    method: str = "GET"
    path: str = "/v1/models"
    status: int = 200
    timeout_s: float = 600.0
    interval_s: float = 0.5


@dataclasses.dataclass(frozen=True)
class ServerMetrics:
    """`metrics { path = "/metrics"  every = 5s }`: the server's Prometheus endpoint, scraped
    during the run into backends/<name>/metrics.jsonl. On by default for launched, sim and url
    backends; a default scrape that finds no endpoint (404) is recorded as "not available",
    while a declared one (`declared`: the spec wrote the block) that fails fails the
    `metrics_scraped` evidence check. `enabled = false` turns the scrape off."""

    path: str = "/metrics"
    interval_s: float | None = None  # None: 5 s, or a quarter of the shortest bucket when that is shorter (plan.py)
    # one scrape waits at most this long: Prometheus's default scrape_timeout. A loaded CPU vLLM
    # on 2 cores took up to 2.04 s to answer its ~100 kB /metrics (the real-server lane), so the
    # old 2 s recorded the server's own slowness as a failed scrape. Longer than the interval is
    # allowed (Prometheus refuses it): a slow scrape skips the slots it outlasts (runner/scrape.py)
    timeout_s: float = 10.0
    enabled: bool = True
    declared: bool = False


@dataclasses.dataclass(frozen=True)
class RuntimeDecl:
    """A declared runtime boundary and how to confirm it from what the run observes."""

    label: str
    log_pattern: str | None = None  # regex; group `version` (or group 1) is the version
    version: str | None = None  # expected version
    require_env: tuple[str, ...] = ()  # env names that must be set in the launched env


@dataclasses.dataclass(frozen=True)
class Traces:
    source: Literal["none", "log", "jsonl"] = "none"
    pattern: str | None = None  # log: regex with a `json` group (payload) or an `id` group
    file: str | None = None  # jsonl: path of the server's trace file
    id_field: str = "request_id"
    id_forms: tuple[str, ...] = ("{id}", "cmpl-{id}", "cmpl-{id}-0", "chatcmpl-{id}")


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    kind: BackendKind
    argv: tuple[str, ...] = ()  # launch: argv template ({port}, {host}, {model_path}, ...)
    shell: str | None = None
    url: str | None = None
    sim: tuple[tuple[str, object], ...] = ()  # simulator options in base units
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    ready: Ready = Ready()
    shutdown_grace_s: float = 10.0
    gpus: tuple[int, ...] = ()
    capture_log: bool = True
    api_key_env: str | None = None
    runtime: RuntimeDecl | None = None
    traces: Traces = Traces()
    log_file: str | None = None  # url: the running server's log (read from its size at the run's start)
    metrics: ServerMetrics = ServerMetrics()  # the server's Prometheus endpoint (scraped during the run)
    span: Span = _span()

    @property
    def launches(self) -> bool:
        return self.kind != "url"


@dataclasses.dataclass(frozen=True)
class Sampling:
    greedy: bool = True
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class Load:
    mode: LoadMode
    concurrency: tuple[int, ...] = ()  # closed and batch
    requests: int | None = None  # batch: requests per batch
    rates: tuple[float, ...] = ()  # open: requests/second
    arrival: Literal["constant", "poisson"] = "constant"
    seed: int = 0
    burstiness: float = 1.0  # open, poisson: gamma inter-arrivals of this shape (1 = Poisson), as vLLM's --burstiness
    # open loop (rates, phases, a sweep, a replay): at most this many of a level's requests in
    # flight, arrivals beyond it waiting in order (vLLM bench serve's --max-concurrency); None:
    # the load generator's own connection limit (runner/load.py OPEN_LOOP_MAX_CONNECTIONS)
    max_concurrency: int | None = None
    # open or closed loop: each level sends exactly this many measured requests (after its
    # warmup) and ends once they have finished, its `duration` the upper bound on its measured
    # time (vLLM bench serve's --num-prompts, GuideLLM's --max-requests, k6's iterations); None:
    # the level runs for its duration. Not batch mode's `requests` (the size of one batch)
    requests_per_level: int | None = None
    # with `requests_per_level`: the level also runs at least this long from its measured start
    # (MLPerf LoadGen's min_duration beside its min_query_count): it ends once both hold -- N sent
    # and this long passed -- its `duration` still the bound; None: it ends at its count
    min_duration_s: float | None = None
    phases: tuple[Phase, ...] = ()  # named phases in sequence: each one is a level (its own shape and duration)
    replay: Replay | None = None  # mode = replay: a timestamped trace's arrivals and lengths
    # a sweep (`search = bisect`): the levels are the [low, high] bounds of a grid of `step`
    # workers (or `rate_step` requests/s), searched for the highest level the gate's rules hold at
    search: Literal["bisect"] | None = None
    step: int = 1
    rate_step: float | None = None  # None: (high - low) / 16
    max_wall_s: float | None = None  # the search's wall-time bound (required with search)

    @property
    def levels(self) -> tuple[int | float, ...]:
        if self.phases:
            return tuple(p.peak for p in self.phases)
        if self.replay is not None:
            return (len(self.replay.offsets_s),)
        return self.rates if self.mode == "open" else self.concurrency


@dataclasses.dataclass(frozen=True)
class Phase:
    """One named phase of a workload's load (`load { phases { NAME { ... } } }`): hold at `start`,
    ramp linearly from `start` to `end` over its duration, or (with `steps`) step from `start` to
    `end` in that many equal steps. Concurrency (closed) or requests/second (open)."""

    name: str
    duration_s: float
    start: float
    end: float | None = None  # ramp_to
    steps: int = 0  # 0: a linear ramp (when `end` is set)
    arrival: Literal["constant", "poisson"] = "constant"
    burstiness: float = 1.0
    seed: int = 0
    span: Span = _span()

    @property
    def peak(self) -> float:
        return max(self.start, self.end if self.end is not None else self.start)


@dataclasses.dataclass(frozen=True)
class Replay:
    """A timestamped trace file as `check` read it (`soakspec.lang.replay`): per request, its
    arrival offset from the first one (seconds) and its input and output lengths."""

    path: str  # absolute
    format: str  # mooncake
    sha256: str
    offsets_s: tuple[float, ...] = dataclasses.field(repr=False)
    input_lens: tuple[int, ...] = dataclasses.field(repr=False)
    output_lens: tuple[int, ...] = dataclasses.field(repr=False)
    speed: float = 1.0  # offsets are divided by this
    tokens: bool = False  # input lengths are token-exact prompts (the model's tokenizer), not words
    # per request its trace line's hash_ids, the prompt's shared blocks (empty: prefix_sharing =
    # false, or a trace without them: every prompt unique); each block is `hash_block` words or tokens
    hash_ids: tuple[tuple[int, ...], ...] = dataclasses.field(default=(), repr=False)
    hash_block: int = 512


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A prompt file as `check` read it (`soakspec.lang.datasets`): the plan carries its prompts,
    so the runner never re-reads (or re-guesses) the file."""

    path: str  # absolute
    format: str  # text | jsonl | sharegpt
    sha256: str  # of the file's bytes, recorded in the evidence
    prompts: tuple[str | tuple[tuple[str, str], ...], ...] = dataclasses.field(repr=False)  # text or chat messages
    output_lens: tuple[int | None, ...] = dataclasses.field(default=(), repr=False)  # max_tokens_from_file
    conversations: tuple[tuple[tuple[str, str], ...], ...] = dataclasses.field(default=(), repr=False)  # multi_turn


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    endpoint: Endpoint = "completions"
    stream: bool = True
    prompt_words: int | None = 64
    prompt_file: str | None = None
    prompt_tokens: tuple[int, ...] = ()  # token-exact prompts of these lengths (cycling), by the model's tokenizer
    tokenizer: str | None = None  # a local tokenizer.json for prompt_tokens; None: the server's /tokenize
    prefix_tokens: int = 0  # prompt_tokens: a prefix of this many tokens shared by every request; 0: unique prefixes
    # prefix_tokens in G groups (SGLang's generated-shared-prefix): G distinct prefixes, each request
    # starting with its group's, drawn by its index and the load's seed (soakspec/draws.py `prefix_group`)
    prefix_groups: int = 1
    prompt_format: str | None = None  # text | jsonl | sharegpt; None: detected (see lang.datasets)
    max_tokens_from_file: bool = False  # per-prompt output lengths from the prompt file
    multi_turn: bool = False  # chat sessions: each closed-loop worker sends a conversation's turns in order, with its history
    # the prompt file's order: "file" (in order, cycling) or "shuffled" (a seeded permutation of
    # its prompts, or multi-turn conversations, each pass over the file; soakspec/draws.py),
    # seeded by the load's seed
    prompt_order: str = "file"
    # multi-turn: the seconds a session waits after a turn's answer before its next turn, as
    # written: () none, (t,) fixed, (low, high) uniform, drawn per conversation and turn by the
    # load's seed (soakspec/draws.py)
    think_time: tuple[float, ...] = ()
    dataset: Dataset | None = dataclasses.field(default=None, compare=False)
    max_tokens: tuple[int, ...] = (64,)
    # random lengths, as vLLM's --random-range-ratio: each request's generated prompt length and
    # max_tokens drawn from [N(1 - r), N(1 + r)] by its index in its level and the load's seed
    # (soakspec/lengths.py); 0: every request the asked length
    length_range: float = 0.0
    sampling: Sampling = Sampling()
    ignore_eos: bool = True
    load: Load = Load("closed", (1,))
    duration_s: float = 60.0
    bucket_s: float = 60.0
    warmup_s: float = 0.0
    # `warmup = N requests` (vLLM bench serve's --num-warmups): each level first sends N warmup
    # requests -- closed loop: its workers take them from one count (shared by --workers
    # processes, exactly N in all); open loop: its schedule's first N arrivals -- and its measured
    # bucket 0 starts once all N have finished (each bounded by `deadline_s`, so a dead server
    # cannot hold the warmup). None: the warmup is `warmup_s` (0.0 with a count). Open and closed
    # loops only: batch, phases, replays, sweeps and multi-turn are E403.
    warmup_requests: int | None = None
    deadline_s: float = 300.0
    follow_up: bool = True
    expected_latency_s: float | None = None  # planning hint only
    body_json: str | None = None  # extra JSON body fields (an object, canonical text); never soakspec's own
    headers: tuple[tuple[str, str], ...] = ()  # extra HTTP headers (no secrets: those come from header_env)
    header_env: tuple[tuple[str, str], ...] = ()  # (header, NAME of the env variable holding its value)
    span: Span = _span()

    @property
    def buckets_per_level(self) -> int:
        return max(1, math.ceil(self.duration_s / self.bucket_s - 1e-9))


@dataclasses.dataclass(frozen=True)
class Slo:
    """One condition a request must meet to count as goodput: `ttft < 500ms` (base units)."""

    metric: str
    op: str
    threshold: float
    threshold_text: str = ""


@dataclasses.dataclass(frozen=True)
class Expr:
    """A resolved rule expression: `agg(metric)`, optionally wrapped in drift/slope."""

    metric: str
    agg: str | None = None  # count | ratio | rate | min | max | mean | pNN | None (bare)
    percentile: float | None = None
    wrapper: Literal["drift", "slope"] | None = None
    text: str = ""
    slo: tuple[Slo, ...] = ()  # goodput(...): the conditions (metric "goodput", agg ratio | rate)
    server: str | None = None  # metric "server": the Prometheus family named, server("vllm:num_requests_waiting")
    # ratio(server("a_total"), server("b_total")) (agg "ratio"): the denominator's family, `server`
    # the numerator's -- the ratio of the two counters' increases over the scope
    over: str | None = None


@dataclasses.dataclass(frozen=True)
class Rule:
    severity: Severity
    klass: Literal["validity", "evidence", "performance"]
    expr: Expr
    op: str | None
    threshold: float | None  # base units
    threshold_text: str | None
    scope: ScopeKind
    window_s: float | None = None
    backend: str | None = None
    text: str = ""
    span: Span = _span()


@dataclasses.dataclass(frozen=True)
class Gate:
    rules: tuple[Rule, ...] = ()
    confidence: float = 0.95
    min_samples: int = 1
    allow_rehearsal: bool = False
    trace_window_s: float = 5.0
    # `abort EXPR OP VALUE per bucket|window D`: evaluated by the runner on each finished
    # bucket/window; one that fires stops the run's load and the gate FAILs naming it
    aborts: tuple[Rule, ...] = ()
    abort_default: bool = True  # the built-in abort: every request of a bucket unsuccessful
    # the built-in `client_healthy` (judge/validity.py): a bucket whose load generator was
    # saturated makes the run INCONCLUSIVE, never PASS, never FAIL on timing rules
    client_healthy: bool = True
    client_lag: float = 0.05  # event-loop lag p99 over a bucket (time-weighted) above it
    client_cpu: float = 0.95  # a load process's CPU over a bucket, fraction of one core, at or above it
    client_schedule_lag: float = 0.05  # open loop: p99 of start - intended_start above it
    client_concurrency: float = 0.75  # closed loop: achieved mean in-flight / offered below it


@dataclasses.dataclass(frozen=True)
class ClaimBoundary:
    claims: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class CompareRequirement:
    """One `compare { require regression(p99(ttft)) <= 5% }` rule (checked by lang/check/compare.py)."""

    severity: Severity
    stat: str  # p99, p50, ..., mean, or ratio (errors: a share of the requests)
    metric: str  # one soakspec.compare compares
    op: str  # <= or <
    threshold: float  # a fraction: 5% -> 0.05
    text: str = ""
    span: Span = _span()


@dataclasses.dataclass(frozen=True)
class Compare:
    """`compare { ... }`: what `soakspec compare` gates a before/after with."""

    confidence: float = 0.95
    rules: tuple[CompareRequirement, ...] = ()


@dataclasses.dataclass(frozen=True)
class Spec:
    header: Header
    model: Model
    source: Source
    telemetry: Telemetry
    backends: tuple[Backend, ...]
    workloads: tuple[Workload, ...]
    gate: Gate
    claims: ClaimBoundary
    canonical_text: str
    sha256: str
    path: str | None = None
    compare: Compare = Compare()

    def backend(self, name: str) -> Backend:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)
