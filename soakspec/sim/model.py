"""The simulator's behaviour model: pure, deterministic, no sockets and no trio.

Design
------
* Every random decision about a request comes from `plan_request(config, index, ...)`, where
  `index` is the request's arrival index (0, 1, 2, ... over the inference requests the server
  received). Three independent byte streams, SHAKE-128 of (seed, index, name), feed it: *fault*
  (which fault, where, the 5xx status, trace dropping, early EOS), *text* (one byte picks each
  token among 256 words) and *time* (ITL jitter). No global RNG, no state between requests:
  the same seed and the same request sequence give the same texts, timings and traces, and
  token i's text does not depend on max_tokens or on the fault knobs.
* Faults partition [0, 1): one uniform draw u picks at most one fault, in the order
  error, stream_error, stall, disconnect, omit_done; each happens with exactly its rate.
* Time: a `Timeline` turns a plan into absolute event deadlines on the server's monotonic clock.
  Each deadline is the previous *deadline* plus a delay, never "now" plus a delay, so wake-up
  lateness never accumulates. TTFT = queue wait + (ttft + prefill_per_token x prompt) x drift;
  each later token = itl x drift x (1 + itl_jitter x u) x (1 + slowdown_per_active x others),
  u uniform in [-1, 1] from the time stream and drift = 1 + drift_rate x uptime_minutes.
* Events: the first token is sent alone (so TTFT is exact, as vLLM does with a stream interval);
  later events carry `tokens_per_chunk` tokens each and are due when their last token is.
* `Scheduler`: `slots` running sequences, a FIFO wait queue, 429 when `queue_limit` wait already.
* `PrefixCache`: vLLM's automatic prefix caching over the simulator's own prompt tokens (the
  words, or the ids, that usage counts). A prompt's full blocks of `block_size` tokens are keyed
  by the hash chain of their contents (`block_hashes`: a block's key hashes its parent's key and
  its own tokens, so a block hits only if its whole prefix does), looked up when the request
  gets its slot (vLLM's `get_computed_blocks`): the longest run of cached leading blocks, at
  most `(prompt_tokens - 1) // block_size` of them (vLLM recomputes the last prompt token for its
  logits, so a prompt cached whole still prefills its last block). Those tokens cost no prefill
  time: TTFT = queue wait + (ttft + prefill_per_token x uncached tokens) x drift.
  The cache is a pool of `prefix_cache_blocks` blocks, reference-counted as vLLM's `BlockPool`
  is: a scheduled request holds every full block of its prompt (one more holder of a block it
  found, a new block for one it did not) until it finishes, and a block some running request
  holds is never evicted. A finished request lets go of its blocks last block first (vLLM's
  `KVCacheManager.free` frees them in reverse, so that a prompt's leading blocks are the last
  to go); a block no request holds any more stays cached, at the tail of the free list, and is
  evicted from that list's head -- least recently released first -- only when a request needs
  room for a block the pool does not have (vLLM's `FreeKVCacheBlockQueue`).
  Pool full of held blocks: vLLM would not schedule the request (or would preempt one) until
  blocks are free; the simulator admits by `slots` alone, so the request runs anyway and its
  blocks from the first that finds no room on are computed but not cached (it holds its leading
  blocks that fit; a later prompt finds only those). Its lookup and the counters are as always.
  Simplifications: only a prompt's full blocks take room (no partial block, no decode tokens:
  the simulator has no KV memory beyond the cache), and one block per key -- a block vLLM
  would compute again into a second block with the same hash is shared instead.
  Counters: `queries` += the prompt's tokens and `hits` += its cached tokens, once per request
  when it is scheduled -- vLLM's `vllm:prefix_cache_queries` / `_hits`, which vLLM records at
  admission so that a lookup for a request it does not schedule is not counted.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
import struct
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

from soakspec.sim.config import SimConfig

__all__ = [
    "WORDS",
    "Admission",
    "Counters",
    "Fault",
    "PrefixCache",
    "RequestPlan",
    "Scheduler",
    "Timeline",
    "block_hashes",
    "chunk_sizes",
    "drift_factor",
    "memory_used",
    "plan_request",
    "schedule",
]

# 256 pieces: a token is " " + one of these (so every token is non-empty, and words == tokens),
# except in a request drawn by `empty_text_rate`: its tokens are all "" (special tokens).
WORDS: tuple[str, ...] = tuple(
    """
    the of and to in is was for on that with as by at from his her it an be are were this which
    or had not but have one all their they has been would when who will more no if out so said
    what up its about into than them can only other new some could time these two may then do
    first any my now such like our over man me even most made after also did many before must
    through back years where much your way well down should because each just those people how
    too little state good very make world still own see men work long get here between both life
    being under never day same another know while last might us great old year off come since
    against go came right used take three states himself few house use during without again
    place american around however home small found mrs thought went say part once general high
    upon school every order until system set number united often public program business water
    course power light large early hand city night form give kind turn point far young market
    road river stone cloud green quiet silver window garden letter table engine signal vector
    token kernel tensor batch cache queue slot paper winter summer autumn spring north south
    east west music story field energy matter travel harbor forest meadow valley island bridge
    castle apple orange purple yellow morning evening candle mirror ladder pocket rabbit falcon
    copper marble velvet thunder lantern compass anchor
    """.split()
)
assert len(WORDS) == len(set(WORDS)) == 256


class Fault(enum.StrEnum):
    ERROR = "error"  # HTTP 500/503 before streaming
    STREAM_ERROR = "stream_error"  # 200, some tokens, `data: {"error": ...}`, `data: [DONE]`
    STALL = "stall"  # stop sending, hold the connection until the client leaves
    DISCONNECT = "disconnect"  # close the TCP connection mid-stream
    OMIT_DONE = "omit_done"  # complete, but without `data: [DONE]`


_FAULT_RATES: tuple[tuple[Fault, str], ...] = (
    (Fault.ERROR, "error_rate"),
    (Fault.STREAM_ERROR, "stream_error_rate"),
    (Fault.STALL, "stall_rate"),
    (Fault.DISCONNECT, "disconnect_rate"),
    (Fault.OMIT_DONE, "omit_done_rate"),
)
MID_STREAM_FAULTS = frozenset({Fault.STREAM_ERROR, Fault.STALL, Fault.DISCONNECT})


def _stream_bytes(seed: int, index: int, stream: str, n: int) -> bytes:
    """`n` pseudo-random bytes that depend only on (seed, index, stream): SHAKE-128 of that key."""
    return hashlib.shake_128(f"soakspec-sim:{seed}:{index}:{stream}".encode()).digest(n)


def _uniforms(raw: bytes) -> list[float]:
    """Floats uniform in [0, 1), 8 bytes each."""
    return [x / 2.0**64 for x in struct.unpack(f">{len(raw) // 8}Q", raw)]


def chunk_sizes(n_tokens: int, tokens_per_chunk: int) -> list[int]:
    """Tokens per SSE event: the first token alone, then `tokens_per_chunk` at a time."""
    if n_tokens <= 0:
        return []
    full, rest = divmod(n_tokens - 1, tokens_per_chunk)
    return [1] + [tokens_per_chunk] * full + ([rest] if rest else [])


_PIECES: tuple[str, ...] = tuple(" " + w for w in WORDS)


@dataclasses.dataclass(frozen=True)
class RequestPlan:
    """What will happen to one request, decided at arrival from (seed, index)."""

    index: int
    tokens: tuple[str, ...]  # the output pieces; len(tokens) == completion tokens when it completes
    finish_reason: str  # "length" or "stop"
    jitter: tuple[float, ...]  # u in [-1, 1] per token (entry 0 unused: token 0 is the TTFT); () if unused
    events: tuple[int, ...]  # tokens per SSE event
    event_texts: tuple[str, ...]  # the text of each event
    event_ends: tuple[int, ...]  # completion tokens sent once each event is
    fault: Fault | None
    fault_after_events: int  # mid-stream faults: token events sent before the fault (1..len(events))
    error_status: int  # the status of Fault.ERROR (500 or 503)
    drop_trace: bool

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def plan_request(config: SimConfig, index: int, max_tokens: int, ignore_eos: bool) -> RequestPlan:
    # 56 bytes: the first 48 are what they always were (SHAKE output is a prefix of a longer one)
    u_fault, u_status, u_where, u_drop, u_eos, u_eos_at, u_empty = _uniforms(
        _stream_bytes(config.seed, index, "fault", 56)
    )

    fault: Fault | None = None
    edge = 0.0
    for kind, rate_name in _FAULT_RATES:
        edge += getattr(config, rate_name)
        if u_fault < edge:
            fault = kind
            break

    n = max_tokens
    finish = "length"
    if not ignore_eos and max_tokens > 1 and u_eos < config.eos_rate:
        n = 1 + int(u_eos_at * (max_tokens - 1))  # 1 .. max_tokens-1
        finish = "stop"

    tokens = tuple(map(_PIECES.__getitem__, _stream_bytes(config.seed, index, "text", n)))
    if u_empty < config.empty_text_rate:  # tokens that decode to nothing (special tokens)
        tokens = ("",) * n
    jitter: tuple[float, ...] = ()
    if not config.zero_latency and config.itl_jitter:
        jitter = tuple(2.0 * u - 1.0 for u in _uniforms(_stream_bytes(config.seed, index, "time", 8 * n)))
    k = config.tokens_per_chunk
    events = tuple(chunk_sizes(n, k))
    if k == 1:
        event_texts, event_ends = tokens, tuple(range(1, n + 1))
    else:
        ends = [1 + i * k for i in range(len(events))]
        ends[-1] = n
        starts = [0, *ends[:-1]]
        event_texts = tuple("".join(tokens[a:b]) for a, b in zip(starts, ends))
        event_ends = tuple(ends)
    return RequestPlan(
        index=index,
        tokens=tokens,
        finish_reason=finish,
        jitter=jitter,
        events=events,
        event_texts=event_texts,
        event_ends=event_ends,
        fault=fault,
        fault_after_events=1 + min(int(u_where * len(events)), len(events) - 1) if events else 0,
        error_status=500 if u_status < 0.5 else 503,
        drop_trace=u_drop < config.trace_drop_rate,
    )


def drift_factor(config: SimConfig, uptime: float) -> float:
    return 1.0 + config.drift * max(uptime, 0.0) / 60.0


def first_token_delay(config: SimConfig, prompt_tokens: int, uptime: float) -> float:
    """Time from the slot to the first token; `prompt_tokens` are those to prefill (the cached
    ones left out)."""
    if config.zero_latency:
        return 0.0
    return (config.ttft + config.prefill_per_token * prompt_tokens) * drift_factor(config, uptime)


def token_delay(config: SimConfig, jitter_u: float, others_active: int, uptime: float) -> float:
    if config.zero_latency:
        return 0.0
    return (
        config.itl
        * drift_factor(config, uptime)
        * (1.0 + config.itl_jitter * jitter_u)
        * (1.0 + config.slowdown_per_active * max(others_active, 0))
    )


class Timeline:
    """Absolute deadlines of a plan's events, one event at a time.

    `start` is when the sequence got its slot and `epoch` when the server started, both on the
    same monotonic clock. `next_event(others_active)` returns when the next event is due; the
    number of other active sequences is sampled then (it changes as others come and go).
    """

    def __init__(self, config: SimConfig, plan: RequestPlan, prompt_tokens: int, start: float, epoch: float):
        self.config = config
        self.plan = plan
        self.prompt_tokens = prompt_tokens
        self.deadline = start
        self.epoch = epoch
        self.tokens_done = 0
        self.events_done = 0

    def next_event(self, others_active: int = 0) -> float:
        size = self.plan.events[self.events_done]
        cfg, jitter = self.config, self.plan.jitter
        for _ in range(size):
            uptime = self.deadline - self.epoch
            if self.tokens_done == 0:
                self.deadline += first_token_delay(cfg, self.prompt_tokens, uptime)
            else:
                u = jitter[self.tokens_done] if jitter else 0.0
                self.deadline += token_delay(cfg, u, others_active, uptime)
            self.tokens_done += 1
        self.events_done += 1
        return self.deadline


def schedule(
    config: SimConfig, plan: RequestPlan, prompt_tokens: int, start: float = 0.0, epoch: float = 0.0,
    others_active: int = 0,
) -> list[float]:
    """Every event deadline of `plan` with a constant number of other active sequences."""
    t = Timeline(config, plan, prompt_tokens, start, epoch)
    return [t.next_event(others_active) for _ in plan.events]


def memory_used(config: SimConfig, uptime: float) -> float:
    return config.memory_base + config.memory_growth * max(uptime, 0.0) / 60.0


def block_hashes(tokens: Sequence[str] | Sequence[int], block_size: int) -> tuple[bytes, ...]:
    """The chained keys of the full blocks of `tokens` (a partial last block has none): block i's
    key is BLAKE2b of block i-1's key and the `repr` of block i's tokens (one text per tuple of
    tokens: a word "7" is no token id 7, and no word boundary moves unseen), so equal keys mean
    equal prefixes."""
    parent = b"soakspec-sim-block"
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(repr(tuple(tokens[start:start + block_size])).encode("utf-8", "surrogatepass"))
        parent = h.digest()
        out.append(parent)
    return tuple(out)


class PrefixCache:
    """vLLM's automatic prefix cache, in blocks (see the module's docstring): a pool of at most
    `capacity` block keys, those held by running requests (`held`: key -> its holders) and
    those no request holds (`free`: least recently released first, evicted from there).
    `queries` and `hits` count prompt tokens looked up and prompt tokens found, as vLLM's
    `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`."""

    def __init__(self, capacity: int, block_size: int):
        if capacity < 1 or block_size < 1:
            raise ValueError(f"capacity and block_size must be at least 1, got {capacity}, {block_size}")
        self.capacity = capacity
        self.block_size = block_size
        self.held: dict[bytes, int] = {}  # blocks running requests hold: how many of them
        self.free: collections.OrderedDict[bytes, None] = collections.OrderedDict()  # least recently released first
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self.held) + len(self.free)

    def admit(self, keys: Sequence[bytes], prompt_tokens: int) -> tuple[int, tuple[bytes, ...]]:
        """A prompt of `prompt_tokens` tokens whose full blocks have `keys` is scheduled: count
        the lookup, and return its cached tokens (the longest run of leading blocks cached,
        leaving its last token to compute) and the keys it now holds, to give to `release`
        when it finishes: its leading blocks, up to the first for which no block is free (all
        of them unless the pool is full of blocks running requests hold)."""
        usable = max(prompt_tokens - 1, 0) // self.block_size
        hit = 0
        for key in keys[:usable]:
            if key not in self.held and key not in self.free:
                break
            hit += 1
        held, free = self.held, self.free
        n = 0
        for key in keys:
            if key in held:
                held[key] += 1
            elif key in free:
                del free[key]
                held[key] = 1
            elif len(held) + len(free) < self.capacity:
                held[key] = 1
            elif free:
                free.popitem(last=False)  # evict the least recently released
                held[key] = 1
            else:
                break  # every block is held: this one and those after are not cached
            n += 1
        cached = hit * self.block_size
        self.queries += prompt_tokens
        self.hits += cached
        return cached, tuple(keys[:n])

    def release(self, keys: Sequence[bytes]) -> None:
        """A request that holds `keys` (what `admit` returned) finished: drop its hold, last
        block first; a block no one holds any more joins the free list's tail."""
        held, free = self.held, self.free
        for key in reversed(keys):
            left = held[key] - 1
            if left:
                held[key] = left
            else:
                del held[key]
                free[key] = None


class Admission(enum.Enum):
    RUNNING = "running"
    WAITING = "waiting"
    REJECTED = "rejected"


T = TypeVar("T", bound=Hashable)


class Scheduler(Generic[T]):
    """Decode slots with a FIFO wait queue. Pure bookkeeping: the server wakes whom it admits."""

    def __init__(self, slots: int, queue_limit: int = 0):
        self.slots = slots
        self.queue_limit = queue_limit
        self.running: set[T] = set()
        self.waiting: collections.deque[T] = collections.deque()

    def arrive(self, item: T) -> Admission:
        if len(self.running) < self.slots and not self.waiting:
            self.running.add(item)
            return Admission.RUNNING
        if self.queue_limit and len(self.waiting) >= self.queue_limit:
            return Admission.REJECTED
        self.waiting.append(item)
        return Admission.WAITING

    def withdraw(self, item: T) -> None:
        """A waiting item left (its client went away) before getting a slot."""
        self.waiting.remove(item)

    def release(self, item: T) -> list[T]:
        """A running item finished: free its slot; return the items admitted from the queue."""
        self.running.discard(item)
        admitted = []
        while self.waiting and len(self.running) < self.slots:
            nxt = self.waiting.popleft()
            self.running.add(nxt)
            admitted.append(nxt)
        return admitted


@dataclasses.dataclass
class Counters:
    """Totals for /metrics."""

    success: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # by finish_reason
    failure: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # by terminal reason
    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft: "Histogram" = dataclasses.field(default_factory=lambda: Histogram(TTFT_BUCKETS))  # seconds, arrival -> first token


# vLLM's buckets for vllm:time_to_first_token_seconds (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


@dataclasses.dataclass
class Histogram:
    """A Prometheus histogram: cumulative counts per upper bound (`le`), their sum and count."""

    bounds: tuple[float, ...]
    counts: list[int] = dataclasses.field(default_factory=list)  # per bound, not cumulative
    sum: float = 0.0
    count: int = 0

    def observe(self, v: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1
                break

    def cumulative(self) -> list[tuple[float, int]]:
        """(le, observations <= le) per bound; +Inf is `count`."""
        out, acc = [], 0
        for i, b in enumerate(self.bounds):
            acc += self.counts[i] if self.counts else 0
            out.append((b, acc))
        return out
