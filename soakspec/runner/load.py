"""Load models: closed loop, batch ("leaf") and open loop, with wall-clock buckets.

One `drive_level()` call runs one planned level against one server and returns what
happened (`LevelRun`). The time model is the plan's (see `soakspec.plan`):

  - the level starts at `t0`; requests that start before `t0 + warmup` are warmup (bucket -1)
    (a counted warmup: its N requests, and m is when they have finished -- see below);
  - bucket k covers [m + k·B, m + (k+1)·B) with m = t0 + warmup; a request belongs to the
    bucket in which it *started* (open loop: in which it was *scheduled*; constant arrivals
    placed in exact arithmetic, `soakspec.arrivals`, so one on an edge starts its bucket);
  - no request starts at or after `m + duration`; in-flight requests then drain (each is
    bounded by its own absolute deadline).

Closed loop: c workers, each with its own kept-alive connection, sends its next request as
soon as its last one ends: no barrier, so concurrency stays at c between requests.
Batch: batches of N requests at concurrency c, back to back (the original harness's "leaf"
semantics, kept for reproducing old evidence); a batch stops launching at the level's end.
Open loop: send times from a constant or seeded Poisson schedule (gamma with `burstiness`; the
schedules are pure functions in `soakspec.arrivals`, re-exported here);
latency and TTFT count from the *intended* send time, and the lag behind the schedule is
recorded.
Ramps and steps (a workload's phases): closed-loop workers started and stopped on the target's
schedule (`ClosedRamp.targets`), open-loop arrivals of a varying rate (`OpenRamp.time_of`). A
ramp spans exactly the measured window [m, m + duration); a warmup before it holds the ramp's
starting value (the first phase's warmup measures nothing of the ramp).
Replay: a trace's arrival offsets, each request with its own prompt and output length; open
loop, so its lag behind the trace is recorded like any open-loop schedule lag. With the trace's
`hash_ids` (prefix sharing, the default) a prompt is built per request from its ids' blocks
(`shared_prompt_words`, `prompts.token_shared_prompt`: a block is a function of its id and the
load's seed, kept in a small per-process cache), never all prompts up front.
A fixed count (`Level.requests_per_level`, n; open and closed loops): the level sends exactly
n measured requests and ends once they have finished, `m + duration` staying its bound (`Quota`).
Closed loop: a worker takes one of the n (from the level's shared count with `--workers`) before
each request that starts at or after m, and stops once none is left (a request it could not send
gives its place back: the n are sent ones, `counts_toward`); open loop: the schedule's first n
arrivals at or after m. The warmup's requests are not counted. Ended by its count, the
level's measured window is [m, its last measured request's end] (its drain, `LevelRun.drain_end`),
its buckets those up to the one its last measured request was due in, that one ending at the
drain: shorter than planned if the level drained within it, longer if not (an open loop's
arrivals queued behind max_concurrency are served after their bucket's nominal end, even after
`m + duration`: the long last bucket holds that work, so a per-level server rule's scrapes cover
it). Ended by its duration first, it runs to `m + duration` as any level. A timed level's window
is its declared duration: its in-flight requests -- and a capped open loop's queued arrivals --
drain after it, in no scope of the level (a per-level server counter misses their work).
With a min_duration (`Level.min_duration_s`, D: MLPerf LoadGen's min_duration beside its
min_query_count) a counted level sends until it has sent n *and* D has passed since m (`Quota.until`):
closed loop, its workers go on taking places past n until m + D on the run clock (every --workers
process reads the same clock and m, so they stop at one instant); open loop, it follows its
schedule to the last arrival due before m + D. Then it ends as above, once its requests have
finished (`LevelRun.ended_by`: min_duration where it sent past n, count where n came last).

A counted warmup (`Level.warmup_requests`, N; open and closed loops: `WARMUPS`): the level first
sends N warmup requests -- closed loop: its workers take each from a `Quota` (the level's shared
count's WARMUP slot with --workers, so exactly N in all) before making its prompt; open loop:
the schedule's first N arrivals from t0 -- none started after the warmup's wall bound
(`Level.warmup_bound_s`: rounds of the deadline), all of them bucket -1, and waits for them to
finish (vLLM waits for its --num-warmups). m is then that time (`_warmup_end`: with --workers,
when the last process ended its part, so every process and the parent cut the same buckets),
told to `LevelContext.on_measure_start`, and the level runs as above from m: a closed loop's
workers start afresh, an open loop's schedule starts afresh at m, its arrival i the level's
request N + i (`_after_warmup`).

Prompts: the k-th request of a level (k from 0, warmup included) gets `Shapes.make(k)`, whatever
the backend sent before, so with a fixed seed every level of every backend sends the same prompt
sequence; request ids stay the backend's own (unique) sequence. Open loop: k is the arrival's
position in the schedule. Closed loop and batch: k counts the requests in the order they start;
with `--workers N` the count is the level's, shared by its processes (`LevelContext.claim`, a
`SharedCount`): the k-th request to start in the level gets k whichever process starts it, so
the mix of prompts and max_tokens is one process's. (It was `j·N + p` for process p's j-th: with
a list whose length shares a factor with N each process sent a fixed subset of it, and the faster
process more of its own.) A prompt file's prompt k is `k mod n`, or with `prompt_order = shuffled`
its place in pass k // n's seeded permutation (`Shapes._position`, soakspec/draws.py): a
function of k alone, so the split changes nothing.
Think time (multi-turn `think_time`): a session's turn after its conversation's first waits its
think time once the turn is made and before the request starts (`_one`), so the wait is in no
latency and the request belongs to the bucket it starts in; a wait that would end past the
level's stop ends there and sends nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Protocol

import httpx
import trio

from soakspec import windows
from soakspec.arrivals import CountedArrivals, Grid, level_grid, ramp_schedule, replay_schedule, schedule, unit_arrivals  # noqa: F401  (read from here too)
from soakspec import draws, lengths
from soakspec.shares import in_flight_share
from soakspec.evidence.record import CANCELLED_BY_ABORT  # noqa: F401  (read from here too)
from soakspec.plan import OPEN_LOOP_MAX_CONNECTIONS, Batch, Closed, ClosedRamp, Level, Open, OpenRamp, Replay, RequestTemplate
from soakspec.runner.clock import RunClock
from soakspec.runner.ids import SharedCount
from soakspec.runner.prompts import (LocalTokenizer, RunAborted, ServerTokenizer, TokenCosts, measure_costs, shared_words, token_prompt,
                                     token_shared_prompt, verify, verify_blocks)
from soakspec.runner.protocol import REQUEST_ID, Endpoint, RequestShape, Sampling
from soakspec.runner.records import Outcome, RequestRecord

if TYPE_CHECKING:
    from soakspec.runner.liveness import Health

TOKENIZE_TIMEOUT_S = 30.0  # one /tokenize request while token-exact prompts are prepared
PREPARE_TIMEOUT_S = 120.0  # all of them (a few hundred requests; milliseconds each on a local server)
_COSTS: dict[tuple[str, str], TokenCosts] = {}  # (tokenizer file or server URL, model) -> word costs, per process
SHAPE_CACHE = 4096  # request shapes kept per workload (each shares its prompt string)
# and characters of generated word prompts kept: each of the 198 shapes of `prompt_words =
# 1000000` holds a 6 MB prompt (1.2 GB in all, per load process); past this they are rebuilt
SHAPE_CACHE_CHARS = 64 * 1024 * 1024
CLOSE_S = 1.0  # closing a connection (shielded) takes at most this long
# a worker whose request could not be sent (the load generator out of file descriptors, ...:
# runner/fdlimit.py) waits this long before its next one, instead of failing in a hot loop
NOT_SENT_PAUSE_S = 0.1

# A fixed vocabulary: prompts are `prompt_words` consecutive words starting at the request's
# index in its level, so they are deterministic and need no tokenizer (as in the original harness).
WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city community name president team minute idea kid body information back "
    "parent face others level office door health person art war history party result change "
    "morning reason research girl guy moment air teacher force education foot boy age policy "
    "process music market sense nation plan college interest death experience effect use class "
    "control care field development role effort rate heart drug show leader light voice wife "
    "police mind price report decision son view relationship town road arm difference value "
    "building action model season society tax director position player record paper space ground "
    "form event official matter center couple site project activity star table need court oil "
    "situation cost industry figure street image phone data picture practice piece land product "
    "doctor wall patient worker news test movie north love support technology step baby computer"
).split()
VOCABULARY = tuple(WORDS)


def prompt_words(index: int, n: int) -> str:
    """The `index`-th word prompt of `n` words: the request's own id (`protocol.REQUEST_ID`,
    spliced in by `build_body`), then n - 1 consecutive words of WORDS from `index`. The words
    alone repeat every len(WORDS) requests -- a server's prefix cache then served every prompt
    after the first 198 whole (vLLM's is on by default) -- so each prompt starts with its id:
    no two requests of a run send the same prompt, and the shapes (and their body templates)
    are still made once per `index % len(WORDS)`."""
    if n <= 0:
        return ""
    w = len(WORDS)
    return " ".join([REQUEST_ID, *(WORDS[(index + i) % w] for i in range(n - 1))])


def shared_prompt_words(index: int, n: int, hash_ids: tuple[int, ...], block: int, seed: int) -> str:
    """A replayed request's word prompt of `n` words from its trace line's `hash_ids`: their blocks
    of `block` words (runner/prompts.py `block_words`: the same words wherever an id is listed),
    cut to `n`, then -- where `n` is longer than the blocks -- the request's own `prompt_words`
    (its request id first), so nothing after the shared blocks is shared."""
    out = shared_words(VOCABULARY, seed, hash_ids, block, n)
    if len(out) < n:
        out.append(prompt_words(index, n - len(out)))
    return " ".join(out)


class Connection(Protocol):
    """Sends one request and fills its record. `record.start` set by the caller is the request's
    start (the load loop's one clock read for it); None, the connection stamps it."""

    async def send(self, shape: RequestShape, request_id: str, headers, record: RequestRecord, *, deadline: float) -> None: ...

    async def aclose(self) -> None: ...


@dataclasses.dataclass
class Shapes:
    """Makes the request shape of the i-th request of a level (from the plan's template); `i`
    is the request's index in its level (`drive_level`), not its request id's number.

    Shapes repeat (prompt i mod P, max_tokens i mod M): up to `SHAPE_CACHE` of them are made
    once and shared, which also lets the client reuse each one's body template.
    """

    template: RequestTemplate
    prompts: tuple[str | tuple[tuple[str, str], ...], ...] = ()  # the template's prompt file's (the plan carries them)
    _cache: dict[tuple[int, ...], RequestShape] = dataclasses.field(default_factory=dict, init=False, repr=False)
    _extra: tuple[tuple[str, object], ...] = dataclasses.field(default=(), init=False, repr=False)
    _costs: TokenCosts | None = dataclasses.field(default=None, init=False, repr=False)
    _made: int = dataclasses.field(default=0, init=False, repr=False)  # characters of the word prompts in _cache
    _sessions: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict, init=False, repr=False)  # worker -> (conversation, next turn)
    _conv_counter: int = dataclasses.field(default=0, init=False, repr=False)
    # --workers, closed loop: the level's count of conversations begun, shared by its processes
    # (`ids.SharedCount.claim(1)`): a session's next conversation is the level's next, whichever
    # process begins it
    claim_conversation: Callable[[], int] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.template.prompts:
            self.prompts = self.template.prompts
        if self.template.body_json:
            self._extra = tuple(json.loads(self.template.body_json).items())

    async def prepare(self, base_url: str) -> None:
        """Token-exact prompts need the tokenizer's word costs: measured once per tokenizer
        (a local file, or the server's /tokenize) and confirmed on the level's first prompts."""
        w = self.template
        if not w.prompt_tokens or self._costs is not None:
            return
        key = (w.tokenizer or base_url, w.model)
        with trio.move_on_after(PREPARE_TIMEOUT_S) as scope:
            async with httpx.AsyncClient(timeout=TOKENIZE_TIMEOUT_S) as client:
                tok = LocalTokenizer(w.tokenizer) if w.tokenizer else ServerTokenizer(base_url, w.model, client)
                costs = _COSTS.get(key)
                if costs is None:
                    costs = _COSTS[key] = await measure_costs(tok, tuple(WORDS))
                for n in sorted({m for n in w.prompt_tokens for m in lengths.bounds(n, w.length_range)}):  # a range: its ends
                    await verify(tok, costs, n, w.prefix_tokens, w.prefix_groups)
                if w.hash_block:  # a replay's shared blocks: their boundaries too
                    await verify_blocks(tok, costs, w.hash_block, w.block_seed)
            self._costs = costs
        if scope.cancelled_caught:
            raise RunAborted(f"the tokenizer did not measure the prompt words within {PREPARE_TIMEOUT_S:g}s")

    def make(self, index: int, smallest: bool = False, worker: int | None = None,
             lengths: tuple | None = None, part: tuple[int, int] = (0, 1), salt: str = "",
             asked: bool = False) -> RequestShape:
        """`part`: this process's (p, N) of the level (`LevelContext.part`), which multi-turn
        sessions split the conversations by; `salt`: the level's (`drive_level`), which a
        token-exact prompt spells after its index so that no other level, sweep probe or run
        sends it (a word prompt starts with its request id instead). `lengths`: a replayed
        request's (input length, output length[, hash_ids]). `asked`: the lengths as the
        workload asks them, never drawn from its `length_range` (the pre-flight's: README,
        Random lengths)."""
        w = self.template
        if lengths is not None and not smallest:  # a replayed request: its own input (words or tokens) and output length
            ids = lengths[2] if len(lengths) > 2 and w.hash_block else ()  # its shared blocks (prefix_sharing)
            if w.prompt_tokens:
                if self._costs is None:
                    raise RunAborted("token-exact prompts were not prepared (Shapes.prepare)")
                if ids:
                    return self._shape(token_shared_prompt(self._costs, index, lengths[0], ids, w.hash_block, w.block_seed, salt), lengths[1])
                return self._shape(token_prompt(self._costs, index, lengths[0], 0, salt=salt), lengths[1])
            if ids:
                return self._shape(shared_prompt_words(index, lengths[0], ids, w.hash_block, w.block_seed), lengths[1])
            return self._shape(prompt_words(index, lengths[0]), lengths[1])
        if w.prompt_tokens:
            return self._token_shape(index, smallest, salt, asked)
        if w.conversations and worker is not None and not smallest:
            return self._session_turn(index, worker, part)
        if w.conversations:  # the pre-flight and the follow-up: a session's first turn, not a record whole
            first = w.conversations[0]
            turn = first[: next(i for i, (role, _) in enumerate(first) if role == "user") + 1]
            return self._shape(turn, min(w.max_tokens) if smallest else w.max_tokens[index % len(w.max_tokens)])
        if smallest:
            max_tokens = min(w.output_lens or w.max_tokens)
            prompt = self.prompts[0] if self.prompts else prompt_words(0, min(w.prompt_words or 1, 8))
            return self._shape(prompt, max_tokens)
        at = self._position(index) if self.prompts else index  # the file's prompt this request sends (prompt_order)
        # with output lengths from the file, the prompt's own; a max_tokens list cycles by the request
        lens, k = (w.output_lens, at) if w.output_lens else (w.max_tokens, index)
        words, max_tokens = self._drawn(index, w.prompt_words or 1, lens[k % len(lens)], asked)
        key = (at % (len(self.prompts) or len(WORDS)), k % len(lens), words, max_tokens)
        shape = self._cache.get(key)
        if shape is None:
            prompt = self.prompts[at] if self.prompts else prompt_words(index, words)
            shape = self._shape(prompt, max_tokens)
            made = 0 if self.prompts else len(prompt)  # a file's prompt is the plan's own string: no more memory
            if len(self._cache) < SHAPE_CACHE and self._made + made <= SHAPE_CACHE_CHARS:
                self._cache[key] = shape
                self._made += made
        return shape

    def _position(self, index: int) -> int:
        """The position in the prompt file of the prompt request `index` of a level sends: `index
        mod n` in file order, or its place in the seeded permutation of its pass over the file
        (`prompt_order = shuffled`, soakspec/draws.py): a function of the index alone, so the k-th
        request of a level sends the same prompt whichever --workers process starts it."""
        n = len(self.prompts)
        if self.template.prompt_order == "shuffled":
            return draws.shuffled(index, n, self.template.prompt_seed)
        return index % n

    def _conversation(self, j: int) -> int:
        """The file's conversation (from 0) the level's j-th conversation begun runs: `j mod n`
        in file order, or pass j // n's seeded permutation of them (`prompt_order = shuffled`)."""
        n = len(self.template.conversations)
        if self.template.prompt_order == "shuffled":
            return draws.shuffled(j, n, self.template.prompt_seed)
        return j % n

    def think_s(self, shape: RequestShape) -> float:
        """The seconds a session waits before sending `shape`, a multi-turn turn (0 for a first
        turn, or without `think_time`): drawn per conversation and turn (soakspec/draws.py)."""
        t = self.template.think_time
        if t is None or shape.turn is None or shape.conversation is None:
            return 0.0
        return draws.think_s(t[0], t[1], self.template.think_seed, shape.conversation, shape.turn)

    def _session_turn(self, index: int, worker: int, part: tuple[int, int]) -> RequestShape:
        """Multi-turn chat: worker `worker` is one session at a time; its next request is the
        next user turn of its conversation with everything before it as history (the file's own
        answers: a closed-loop worker sends it only after the previous turn's answer arrived).
        After a conversation's last turn the worker takes the next conversation: with `--workers
        N`, the level's next, claimed from its shared count (`claim_conversation`), so no two
        processes run the same one and the file's conversations are taken in turn whichever
        process is faster (each numbering j·N + p for itself gave it a fixed subset of a file
        whose length shares a factor with N, and the faster process more of its own). The
        turn advances when it is made, whatever its outcome: a failed turn's successor is sent
        with the file's answer in its place (README, Multi-turn chat)."""
        w, convs = self.template, self.template.conversations
        conv, turn = self._sessions.get(worker) or (self._conversation(self._next_conv(part)), 0)
        turns = convs[conv]
        users = [i for i, (role, _) in enumerate(turns) if role == "user"]
        if turn >= len(users):
            conv, turn = self._conversation(self._next_conv(part)), 0
            turns = convs[conv]
            users = [i for i, (role, _) in enumerate(turns) if role == "user"]
        self._sessions[worker] = (conv, turn + 1)
        history = turns[: users[turn] + 1]
        shape = self._shape(history, w.max_tokens[index % len(w.max_tokens)])
        return dataclasses.replace(shape, conversation=conv + 1, turn=turn + 1)

    def _next_conv(self, part: tuple[int, int]) -> int:
        if self.claim_conversation is not None:
            return self.claim_conversation()
        if part[1] > 1:  # each process's own numbering would give it a fixed subset of the file
            raise ValueError("multi-turn sessions split over processes need the level's shared count (claim_conversation)")
        n = self._conv_counter
        self._conv_counter += 1
        return n

    def _token_shape(self, index: int, smallest: bool, salt: str = "", asked: bool = False) -> RequestShape:
        w = self.template
        if self._costs is None:
            raise RunAborted("token-exact prompts were not prepared (Shapes.prepare)")
        if smallest:
            n, max_tokens = min(w.prompt_tokens), min(w.max_tokens)
        else:
            n, max_tokens = self._drawn(index, w.prompt_tokens[index % len(w.prompt_tokens)], w.max_tokens[index % len(w.max_tokens)], asked)
        # with prefix groups, the request's group by its index (the pre-flight's and follow-up's too:
        # index 0's, a group a level's first requests send anyway)
        group = draws.prefix_group(index, w.prefix_groups, w.group_seed) if w.prefix_groups > 1 else 0
        return self._shape(token_prompt(self._costs, index, n, w.prefix_tokens, salt=salt, group=group, groups=w.prefix_groups), max_tokens)

    def _drawn(self, index: int, n: int, max_tokens: int, asked: bool = False) -> tuple[int, int]:
        """The prompt length and max_tokens of request `index` asked `n` and `max_tokens`: with
        `length_range`, each drawn around them by the index and the level's seed (soakspec/lengths.py),
        so the k-th request of a level gets the same lengths in every run and every --workers
        process; the pre-flight (`asked`) and follow-up (`smallest`) send the asked lengths."""
        w = self.template
        if not w.length_range or asked:
            return n, max_tokens
        return (lengths.draw(n, w.length_range, w.length_seed, index, lengths.PROMPT),
                lengths.draw(max_tokens, w.length_range, w.length_seed, index, lengths.OUTPUT))

    @property
    def model(self) -> str:
        return self.template.model

    def headers(self, environ: Mapping[str, str] = os.environ) -> tuple[tuple[str, str], ...]:
        """The workload's extra headers, with `header_env` values read from the environment now
        (an unset variable sends no header; the plan records only its name)."""
        w = self.template
        return w.headers + tuple((h, environ[name]) for h, name in w.header_env if environ.get(name))

    def _shape(self, prompt: str | tuple[tuple[str, str], ...], max_tokens: int) -> RequestShape:
        w = self.template
        messages = prompt if isinstance(prompt, tuple) else None
        return RequestShape(
            endpoint=Endpoint(w.endpoint),
            model=w.model,
            prompt=prompt if isinstance(prompt, str) else prompt[-1][1],
            max_tokens=max_tokens,
            sampling=Sampling(temperature=w.temperature, top_p=w.top_p, top_k=w.top_k, seed=w.seed),
            ignore_eos=w.ignore_eos,
            stream=w.stream,
            extra=self._extra,
            messages=messages,
        )


def counts_toward(rec: RequestRecord) -> bool:
    """Whether a record is one of a count-bounded level's `requests_per_level`: a measured request
    (bucket >= 0) that was sent (it has a start). A request the load generator could not send
    (its own limit, runner/fdlimit.py: `start` None) reached no server and is not one of them --
    a closed loop sends another in its place (`Quota.give_back`), an open loop's fixed schedule
    does not (its count is its first n arrivals), so the level is short of its count and the
    judge says so (judge/index.py `count_sent` reads the same rule from the records). A request
    held back at a refusing backend's gate (runner/liveness.py) has its start: the server's
    failure, counted as any failed request is (vLLM's --num-prompts counts failures too)."""
    return rec.bucket >= 0 and rec.start is not None


class LiveStats:
    """Cheap counters for progress display; bounded memory whatever the run length."""

    def __init__(self) -> None:
        self.sent = 0
        self.done = 0
        self.outcomes: dict[str, int] = {}
        self.ttfts: deque[float] = deque(maxlen=512)
        self.in_flight = 0
        # measured requests (bucket >= 0) finished that were sent (a start): what a count-bounded
        # level counts toward its requests_per_level (`counts_toward`), shown as "k/N requests"
        self.measured = 0

    def started(self) -> None:
        self.sent += 1
        self.in_flight += 1

    def finished(self, rec: RequestRecord) -> None:
        """`add_batch([(outcome, ttft)], 0)` for one record, without the list (once per request)."""
        self.in_flight -= 1
        self.done += 1
        outcome = str(rec.outcome)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.measured += counts_toward(rec)
        ttft = rec.ttft
        if ttft is not None:
            self.ttfts.append(ttft)

    def add_batch(self, outcomes: list[tuple[str, float | None, bool]], sent: int) -> None:
        """`sent` more requests started and these (outcome, TTFT, `counts_toward`) finished (e.g.
        a `--workers` process's batch)."""
        self.sent += sent
        self.in_flight += sent - len(outcomes)
        self.done += len(outcomes)
        for outcome, ttft, counted in outcomes:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            self.measured += counted
            if ttft is not None:
                self.ttfts.append(ttft)

    @property
    def failed(self) -> int:
        return self.done - self.outcomes.get("completed", 0)

    def ttft_p50(self) -> float | None:
        if not self.ttfts:
            return None
        xs = sorted(self.ttfts)
        return xs[len(xs) // 2]


@dataclasses.dataclass
class LevelRun:
    level: Level
    started_at: float
    measure_start: float
    measure_end: float | None = None
    drained_at: float | None = None
    completed: bool = False
    sent: int = 0
    busy_s: float = 0.0  # the sum of every request's [start, end] overlap with [measure_start, nominal end)
    busy_late_s: float = 0.0  # ... with [nominal end, ...): in the window of a level whose count ended it past its nominal end
    measured: int = 0  # requests sent in the measured window (bucket >= 0, `counts_toward`): a count-bounded level's sent
    count_reached: bool = False  # a count-bounded level ended by its count (not by its duration)
    last_bucket: int = 0  # the bucket of its last measured request (a level ended by its count lists up to it)
    warmup_sent: int = 0  # a counted warmup's requests sent (`Level.warmup_requests`; --workers: this process's)

    def drain_end(self, stop: float) -> float:
        """The measured window's end: ended by its count, its drain (`drained_at`, read once its
        last request had ended: before or after `stop`, the level's nominal end -- an open loop's
        arrivals queued behind max_concurrency are served after it), else `stop`. The drain, not
        the last record's `end` itself: windows are half-open, [start, end), and a window that
        ended at that instant would leave the last completion out of its req/s and tok/s
        (`judge.measures.delivered`). A timed level's in-flight (and queued) requests drain
        after its window, in no scope of it."""
        if not self.count_reached:
            return stop
        return max(self.measure_start, self.drained_at if self.drained_at is not None else stop)

    @property
    def mean_in_flight(self) -> float:
        """Mean requests in flight over the measured window (exact: the in-flight count's
        integral over the window, divided by its length)."""
        length, busy = self.level.duration_s, self.busy_s
        if self.measure_end is not None and self.count_reached:  # ended by its count: the window it measured
            length = self.measure_end - self.measure_start
            busy += self.busy_late_s  # its drain past the nominal end is in it
        return busy / length if length > 0 else 0.0

    def bucket_windows(self) -> list[dict]:
        """Every planned bucket's window; a count-bounded level that ended by its count lists
        them up to the one its last measured request was due in (none after it, where nothing
        was due), that one ending at the level's drain (`measure_end`, its last measured
        request's end): shorter than planned if the level drained within it, longer if not --
        an open loop's requests queued behind its max_concurrency (or a slow server's last
        request) are served after their bucket's nominal end, and the long last bucket holds
        that work, so every scope that reads the level's window (a per-level server rule's
        scrapes, throughput, in-flight) sees it. A request belongs to the bucket it was due in
        (open-loop semantics: its wait is in its latency), so no empty bucket follows."""
        out = []
        end = self.measure_end if self.count_reached and self.measure_end is not None else None
        for b in self.level.buckets:
            start = self.measure_start + b.start_s
            if end is not None and b.index > self.last_bucket:
                break
            stop = start + b.length_s if end is None or b.index < self.last_bucket else max(end, start)
            out.append({"index": b.index, "start": start, "end": stop, "planned_length_s": b.length_s})
        return out

    def all_started(self, quota: Quota | None, now: float) -> bool:
        """Whether a count-bounded level (one process) has started all its measured requests:
        no measured request is due after its last bucket so far (`bucket_clock` holds that
        bucket open for the drain) -- with a min_duration, once that has passed too."""
        return quota is not None and quota.shared is None and quota.done(now)

    def count_json(self) -> dict:
        """A count-bounded level's manifest fields: its measured requests sent (`measured_sent`,
        of its `requests_per_level`) and what ended it (`ended_by`: count, or duration -- the
        bound came first and it is not complete); {} for a timed level."""
        if self.level.requests_per_level is None:
            return self.warmup_json()
        return self.warmup_json() | {"measured_sent": self.measured, "ended_by": self.ended_by}

    @property
    def ended_by(self) -> str:
        """What ended a count-bounded level: `count` (its N sent, its min_duration, if any, passed
        by then), `min_duration` (it sent its N first and went on until its min_duration had
        passed: more than N sent, as only a min_duration sends past N) or `duration` (the bound
        came first: not complete). One rule the judge reads from the records too."""
        if not self.count_reached:
            return "duration"
        n = self.level.requests_per_level
        return "min_duration" if n is not None and self.level.min_duration_s is not None and self.measured > n else "count"


    def warmup_json(self) -> dict:
        """A counted warmup's manifest field: its requests sent (`warmup_sent`, of its
        `warmup_requests`: fewer where its bound ended it); {} for a timed warmup."""
        return {} if self.level.warmup_requests is None else {"warmup_sent": self.warmup_sent}


_PAST_ANY_COUNT = 2**62  # a shared count's limit past any count: a min_duration's places past n


class Quota:
    """A count-bounded level's measured requests (`Level.requests_per_level`, n): n sent ones
    (`counts_toward`). Closed loop: `take()` before each measured request -- from the level's
    shared count with --workers (`ids.SharedCount.take`, `LevelContext.shared_count`), so the
    processes send exactly n in all -- and False once n were taken: the worker stops;
    `give_back()` after a request the load generator could not send, so the worker that took it
    takes it again and sends another in its place (the count is of requests sent, as the
    judge's `count_sent` reads it from the records). Open loop: `first(due, measure)`, the
    schedule's arrivals up to its n-th at or after `measure` (every process reads the same
    schedule, so the n are split like any arrivals); a fixed schedule sends no extra arrival
    for one not sent, so such a level is short of its count. `reached`: the count ended the
    level.

    A min_duration (`Level.min_duration_s`, LoadGen's min_duration beside its min_query_count):
    `until`, the measured start plus it (set by `drive_level` once the start is known). The level
    goes on past n while the run clock is before it -- closed loop: `take(now)` grants a place
    past n (the shared count moves on past n too, so it counts every request the processes sent)
    until then, and every process reads the one run clock, so all stop taking at the same
    instant; open loop: `first` sends the schedule's arrivals due before it, whatever the count.
    It ends once both hold (n sent, `until` passed)."""

    def __init__(self, n: int, shared: SharedCount | None = None, slot: int = SharedCount.MEASURED,
                 least_s: float | None = None) -> None:
        self.n = n
        self.shared = shared
        self.slot = slot  # the shared count's slot: MEASURED, or WARMUP for a counted warmup's N
        self.taken = 0
        self.reached = False
        self.least_s = least_s  # the min_duration: `until` is the measured start plus it
        self.until: float | None = None

    def take(self, now: float | None = None) -> bool:
        if self.reached:
            return False
        ok = self.shared.take(self.slot, self.n) if self.shared is not None else self.taken < self.n
        if not ok and self.until is not None and now is not None and now < self.until:
            # its count is sent, its min_duration not passed: one more, counted past n
            ok = self.shared.take(self.slot, _PAST_ANY_COUNT) if self.shared is not None else True
        if not ok:
            self.reached = True
            return False
        self.taken += 1
        return True

    def done(self, now: float) -> bool:
        """Whether no more measured request will start (one process): its count ended it, or it
        took n and its min_duration (if any) has passed."""
        return self.reached or (self.taken >= self.n and (self.until is None or now >= self.until))

    def give_back(self) -> None:
        self.taken -= 1
        self.reached = False  # the place is free again: this worker takes it (the others may have stopped)
        if self.shared is not None:
            self.shared.give_back(self.slot)

    def first(self, due, measure: float):
        """The arrivals of `due` (tuples, their time first) a counted level sends from the
        measured window's start `measure` (`arrivals.CountedArrivals`: up to its n-th -- with a
        min_duration, every one due before `measure + least_s` too)."""
        cut = CountedArrivals(self.n, measure, self.least_s)
        self.until = cut.until
        yield from cut.cut(due, itemgetter(0))
        self.reached = self.reached or cut.reached


@dataclasses.dataclass
class LevelContext:
    backend: str
    clock: RunClock
    connect: Callable[[], Connection]
    shapes: Shapes
    sink: Callable[[list[RequestRecord]], None]  # finished records, a batch at a time
    next_id: Callable[[], tuple[int, str]]  # (global request index, request id)
    headers: tuple[tuple[str, str], ...] = ()
    stats: LiveStats = dataclasses.field(default_factory=LiveStats)
    on_bucket: Callable[[int], Awaitable[None]] | None = None  # awaited at each bucket's end
    # `--workers`: the level's start on the shared run clock, and this process's part (p, n) of
    # the load: closed/batch workers w with w % n == p, open loop every n-th arrival from p
    t0: float | None = None
    part: tuple[int, int] = (0, 1)
    # the backend's liveness (runner/liveness.py): every record is reported to it, and after a
    # refused connect requests wait at its gate (backoff, one at a time) instead of hammering
    health: Health | None = None
    # told the level's start t0 once it is fixed (`--workers`: when the processes are ready, a
    # start-up after the level was announced): bucket lines and abort windows are cut from it
    on_start: Callable[[float], None] | None = None
    # told the bucket of every request this process starts (the abort rules: runner/abort.py)
    on_request_start: Callable[[int, float | None], None] | None = None  # (bucket, intended start or start)
    on_started_until: Callable[[float], None] | None = None  # --workers: every start before this was reported
    # --workers, closed loop: the level's count of requests started, shared by its processes
    # (`ids.SharedCount.claim`): each request claims its prompt index as it starts
    claim: Callable[[], int] | None = None
    # --workers, a count-bounded closed loop: the level's measured requests sent, shared by its
    # processes (`ids.SharedCount.take`): each takes a place before it starts (`Quota.take`)
    shared_count: SharedCount | None = None
    # a count-bounded level's measured requests (`Quota`): set by `drive_level` from the level
    quota: Quota | None = None
    # the level's buckets from its start (`level_grid`): set by `drive_level`; an open loop's
    # constant arrivals are placed in them exactly (`arrivals.schedule`)
    grid: Grid | None = None
    # told when a counted warmup ended: the measured window's start (bucket 0), known only then
    on_measure_start: Callable[[float], None] | None = None


async def drive_level(level: Level, ctx: LevelContext) -> LevelRun:
    clock = ctx.clock
    if ctx.t0 is None:
        t0 = clock.now()
    else:
        t0 = ctx.t0
        await trio.sleep_until(clock.to_trio(t0))
    if ctx.on_start is not None:
        ctx.on_start(t0)
    if level.requests_per_level is not None:  # an open loop's count is its schedule's: no shared count
        ctx = dataclasses.replace(ctx, quota=Quota(level.requests_per_level, ctx.shared_count if level.mode == "closed" else None,
                                                   least_s=level.min_duration_s))
    quota = ctx.quota
    # a counted warmup (`Level.warmup_requests`): its N requests first, every one in no bucket,
    # none started after the warmup's bound; the measured window starts once they have finished
    warm_quota = Quota(level.warmup_requests, ctx.shared_count, SharedCount.WARMUP) if level.warmup_requests is not None else None
    warming = warm_quota is not None
    m = t0 + level.warmup_s if not warming else math.inf
    run = LevelRun(level, started_at=t0, measure_start=m)
    stop = m + level.duration_s if not warming else t0 + level.warmup_bound_s
    if quota is not None and quota.least_s is not None and not warming:  # a min_duration from the measured start
        quota.until = m + quota.least_s

    # the bucket windows' starts (`LevelRun.bucket_windows`), and where constant arrivals fall
    # (after a counted warmup: from its end, when that is known)
    grid = level_grid(level, t0) if not warming else None
    ctx = dataclasses.replace(ctx, grid=grid)
    edges = list(grid.starts) if grid is not None else [m + b.start_s for b in level.buckets]

    def bucket_of(t: float) -> int:
        return windows.holding(edges, t)  # -1: warm-up

    pending = _PendingRecords(ctx.sink)

    health = ctx.health

    parts = ctx.part[1]
    issued = 0  # requests this process started in the level (one process: the prompt index of the next one)
    # the level's salt: its first request's id (unique per level, sweep probe, backend, run and
    # --workers process), spelled by each token-exact prompt after its index (`Shapes.make`)
    salt = ""

    def prompt_index(seq: int | None) -> int:
        """The request's index in the level: `seq` (an open-loop arrival's position in the
        schedule) or, closed loop and batch, the count of the level's requests started before it
        -- split over processes, the level's shared count (`ctx.claim`)."""
        nonlocal issued
        if seq is not None:
            k = seq
        elif ctx.claim is not None:
            k = ctx.claim()
        elif parts > 1:  # this process's own count would give every process the prompts 0, 1, ...
            raise ValueError("a closed loop split over processes needs the level's shared count (LevelContext.claim)")
        else:
            k = issued
        issued += 1
        return k

    async def one(conn: Connection, worker: int, intended: float | None, lengths: tuple | None = None,
                  seq: int | None = None, admitted: float | None = None) -> bool:
        """Send (or hold back) one request; False: a count-bounded closed loop has sent its count
        (or, in a counted warmup, the warmup its N), the worker stops."""
        counting = warm_quota if warming else quota
        if counting is not None and counting.reached and intended is None:
            return False
        scout: bool | None = False
        if health is not None and health.refusals:
            if intended is not None:  # an open-loop arrival is due now: it tries as the scout or is held back
                scout = health.try_scout()
                if scout is False:
                    await _one(conn, worker, intended, lengths, seq, held=True, admitted=admitted)
                    return True
            else:  # a closed-loop worker waits at the gate
                scout = await health.admit()
                if clock.now() >= stop:  # the level ended while the backend refused: nothing to send
                    if scout:
                        health.scouted()
                    return True
        try:
            rec = await _one(conn, worker, intended, lengths, seq, admitted=admitted)
        finally:
            if scout:
                health.scouted()  # type: ignore[union-attr]
        if rec is None:  # the level ended (or sent its count) before it could start: its loop ends
            return not (counting is not None and counting.reached)
        if rec.start is None:  # not sent: the client's own limit, not the server's (NOT_SENT_PAUSE_S)
            if counting is warm_quota and warm_quota is not None and intended is None:
                warm_quota.give_back()  # not one of the warmup's N: this worker sends another in its place
            elif quota is not None and intended is None and rec.bucket >= 0:
                quota.give_back()  # not one of the count: this worker sends another in its place
            await trio.sleep_until(clock.to_trio(min(clock.now() + NOT_SENT_PAUSE_S, stop)))
        return True

    async def _one(conn: Connection, worker: int, intended: float | None, lengths: tuple | None = None,
                   seq: int | None = None, held: bool = False, admitted: float | None = None) -> RequestRecord | None:
        """Send one request and record it (`admitted`: when its slot under the level's
        max_concurrency was freed, if it waited for one); `held`: record it held back by the backend's gate
        (`Health.hold_back`: on the record as the backend's failure, nothing sent). None: a
        closed-loop (or batch) request whose start fell at or after the level's stop -- its
        worker saw the clock before the stop, then made the request: nothing sent or recorded."""
        nonlocal salt
        warm = warming  # a counted warmup's request (its `stop` is the warmup's bound, not the level's)
        if warm and intended is None and warm_quota is not None and not warm_quota.take():
            return None  # a counted warmup's closed loop has started its N (taken before its prompt: the measured go on from N)
        _, rid = ctx.next_id()  # the id: unique in the backend; the prompt: the request's place in the level
        salt = salt or rid
        # (a held-back arrival sends nothing: no prompt; open loop, its place is `seq` either way)
        shape = None if held else ctx.shapes.make(prompt_index(seq), worker=worker, lengths=lengths, part=ctx.part, salt=salt)
        think = ctx.shapes.think_s(shape) if shape is not None and intended is None else 0.0
        if think > 0:  # a multi-turn session's think time before its next turn: before the request's start, in no latency
            await trio.sleep_until(clock.to_trio(min(clock.now() + think, stop)))
        # one clock read is the request's start and (closed loop) its bucket's time: two reads
        # put a request whose process was preempted between them in one bucket, its start in the next
        now = clock.now()
        if intended is None and now >= stop:
            # the worker's `clock.now() < stop` was read before this request was made: the start
            # is this read, and a level's requests start before its stop (its last bucket's end)
            if warm and warm_quota is not None:
                warm_quota.give_back()  # the warmup's bound came first: not one of its N
            return None
        if intended is None and quota is not None and now >= m and not quota.take(now):
            return None  # a count-bounded closed loop has started its count of measured requests
        start_ref = intended if intended is not None else now
        rec = RequestRecord(
            request_id=rid,
            backend=ctx.backend,
            workload=level.workload,
            level=level.index,
            concurrency=level.concurrency,
            rate=level.rate,
            bucket=bucket_of(start_ref),
            worker=worker,
            intended_start=intended,
            admitted=admitted,
            start=now,
            conversation=None if shape is None else shape.conversation,
            turn=None if shape is None else shape.turn,
        )
        ctx.stats.started()
        if rec.bucket >= 0:
            run.measured += 1
            run.last_bucket = max(run.last_bucket, rec.bucket)
        if ctx.on_request_start is not None:
            ctx.on_request_start(rec.bucket, start_ref)
        if held:
            health.hold_back(rec)  # type: ignore[union-attr]
            ctx.stats.finished(rec)
            pending.add(rec)
            return rec
        run.sent += 1
        run.warmup_sent += warm
        try:
            await conn.send(shape, rid, ctx.headers, rec, deadline=start_ref + level.deadline_s)
        finally:
            if rec.end is None:  # cancelled mid-request (the run is aborting): say so, keep the record valid
                rec.end = clock.now()
                rec.outcome = Outcome.DISCONNECTED
                rec.error = CANCELLED_BY_ABORT
            if rec.start is not None and rec.end > m and rec.start < stop:
                run.busy_s += min(rec.end, stop) - max(rec.start, m)
            if rec.start is not None and rec.end > stop and not warm:  # a count-bounded level's drain may run past `stop`
                run.busy_late_s += rec.end - max(rec.start, stop)
            if rec.start is None and warm:
                run.warmup_sent -= 1  # not sent: not one of a counted warmup's requests
            if rec.start is None and rec.bucket >= 0:
                run.measured -= 1  # not sent: not one of a count-bounded level's measured requests (`counts_toward`)
            ctx.stats.finished(rec)
            pending.add(rec)
            if health is not None:
                health.observe(rec)
        return rec

    load, start = one, t0
    reached = False
    try:
        async with trio.open_nursery() as background:
            background.start_soon(pending.writer)
            if warm_quota is not None:  # the counted warmup, then the measured window from its end
                await WARMUPS[type(level.shape)](level.shape, ctx, one, stop, t0, warm_quota)
                m = await _warmup_end(ctx, clock.now(), stop + level.deadline_s)  # its last request ends by then
                warming, stop, start = False, m + level.duration_s, m
                grid = level_grid(level, m)
                ctx = dataclasses.replace(ctx, grid=grid)
                edges[:] = grid.starts
                run.measure_start = m
                if quota is not None and quota.least_s is not None:  # its min_duration runs from bucket 0
                    quota.until = m + quota.least_s
                if ctx.on_measure_start is not None:
                    ctx.on_measure_start(m)
                load = _after_warmup(one, level.warmup_requests) if level.mode == "open" else one
            ended, drained = trio.Event(), trio.Event()
            async with trio.open_nursery() as outer:
                outer.start_soon(bucket_clock, level, ctx, m, ended,
                                 lambda k: run.all_started(quota, clock.now()) and run.last_bucket <= k, drained)
                await LOAD_MODELS[type(level.shape)](level.shape, ctx, load, stop, start, m)
                # The load functions return only after `stop`, with every request drained; an
                # abort arrives as cancellation instead. The bucket clock ends with the last bucket
                # -- or, a count-bounded level that sent its count, now: its last request has ended.
                # Its count ended it where it sent its n and its min_duration passed (`Quota.done`),
                # whether or not a worker then asked for another: the bound, reached at the same
                # instant as the minimum (or while the last requests ran), ends a worker's loop
                # before it asks -- the --workers parent reads the shared count the same way
                # (`workers._count_reached`), so one process and several record the same end
                reached = quota is not None and quota.done(clock.now())
                if reached:
                    ended.set()
                drained.set()
            background.cancel_scope.cancel()
    finally:
        pending.write()  # also when aborting: every request sent has its record
    run.drained_at = clock.now()
    run.count_reached = reached
    run.measure_end = run.drain_end(stop)
    run.completed = True
    return run


WARMUP_POLL_S = 0.002  # --workers: how often a process that ended its warmup reads whether the others have
# --workers: past its last warmup request's deadline and CLOSE_S, how long a process waits more for
# the others to end theirs (a process slowed by a loaded machine) before it fails the level
WARMUP_MARGIN_S = 10.0


class WarmupDisagreed(RunAborted):
    """--workers: the level's processes did not all end a counted warmup by its bound, so no end
    every process (and the parent) would cut the same buckets from exists: the run aborts."""


async def _warmup_end(ctx: LevelContext, now: float, bound: float) -> float:
    """When a counted warmup ended: `now` in one process; with --workers, when the last of the
    level's processes ended its part (`SharedCount.warmup_done`: the one that ends last writes
    the time, every other waits for it), so that all of them -- and the parent
    (`workers._warmup_ended`, which waits for it as long as the processes run) -- cut the same
    buckets. A process never takes its own `now` instead: `bound` is the latest any warmup
    request can end (the warmup's wall bound, after which none starts, plus one deadline) and
    each process's warmup returns at most CLOSE_S after it (closing its connections), so one
    waits until bound + CLOSE_S + WARMUP_MARGIN_S; a process not done by then (stalled, or gone)
    is `WarmupDisagreed` -- a run aborted (exit 4), never buckets cut from another start."""
    shared, parts = ctx.shared_count, ctx.part[1]
    if shared is None or parts <= 1:
        return now
    end = shared.warmup_done(parts, now)
    while end is None:
        if ctx.clock.now() > bound + CLOSE_S + WARMUP_MARGIN_S:
            raise WarmupDisagreed(f"the level's {parts} load processes (--workers) did not all end its counted warmup within "
                                  f"{CLOSE_S + WARMUP_MARGIN_S:g}s of its last request's deadline: no warmup end they agree on")
        await trio.sleep(WARMUP_POLL_S)
        end = shared.warmup_end(parts)
    return end


def _after_warmup(one, n: int):
    """An open loop's measured arrivals after a counted warmup: its schedule starts afresh at the
    warmup's end, and arrival i is the level's request n + i (the warmup's were 0..n-1), so no
    prompt of the warmup is sent again."""

    async def measured(conn, worker, intended, lengths=None, seq=None, admitted=None) -> bool:
        return await one(conn, worker, intended, lengths, None if seq is None else seq + n, admitted)

    return measured


class _PendingRecords:
    """Finished records go to the sink from a task of their own, at the loop's next turn: writing
    one (JSON, a write) is the largest cost between a worker's request and its next, and the
    worker sends the next one first (a closed loop keeps its concurrency while records flush)."""

    def __init__(self, sink: Callable[[list[RequestRecord]], None]) -> None:
        self.sink = sink
        self.records: list[RequestRecord] = []
        self.wake = trio.Event()

    def add(self, rec: RequestRecord) -> None:
        self.records.append(rec)
        self.wake.set()

    def write(self) -> None:
        if self.records:
            batch = self.records.copy()
            self.records.clear()
            self.sink(batch)

    async def writer(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            self.write()


async def bucket_clock(level: Level, ctx: LevelContext, measure_start: float, ended: trio.Event | None = None,
                       holds: Callable[[int], bool] | None = None, drained: trio.Event | None = None) -> None:
    """Awaits `ctx.on_bucket(i)` at each bucket's end on the run clock; returns once `ended` is
    set (a count-bounded level that sent its count: the bucket it ended in is not closed here,
    as a level cut short leaves its last one -- never cancelled inside `on_bucket`). `holds(i)`:
    bucket i is that level's last (all its measured requests have started, none due after i),
    so its nominal end does not close it -- it ends at the drain (`LevelRun.bucket_windows`)
    and the driver closes it then, with that length. It waits for `drained` (set once the
    level's load has returned, whatever ended it): a level its duration ended after all (a
    closed loop's n-th request started, the bound came before it asked for another) closes
    its buckets then, as planned."""
    for b in level.buckets:
        at = ctx.clock.to_trio(measure_start + b.start_s + b.length_s)
        if ended is None:
            await trio.sleep_until(at)
        else:
            with trio.move_on_at(at):
                await ended.wait()
            if not ended.is_set() and holds is not None and drained is not None and holds(b.index):
                await drained.wait()
            if ended.is_set():
                return
        if ctx.on_bucket is not None:
            await ctx.on_bucket(b.index)


async def _closed(shape: Closed, ctx: LevelContext, one, stop: float, start: float, measure: float) -> None:
    clock = ctx.clock

    async def worker(w: int) -> None:
        conn = ctx.connect()
        try:
            while clock.now() < stop:
                if not await one(conn, w, None):  # a count-bounded level has started its count
                    break
        finally:
            with trio.move_on_after(CLOSE_S, shield=True):
                await conn.aclose()

    p, parts = ctx.part
    async with trio.open_nursery() as n:
        for w in range(p, shape.concurrency, parts):
            n.start_soon(worker, w)


async def _batch(shape: Batch, ctx: LevelContext, one, stop: float, start: float, measure: float) -> None:
    clock = ctx.clock
    c, requests = shape.concurrency, shape.requests
    if ctx.part[1] > 1:  # each process's share of a batch would end on its own: no barrier (workers.processes_for)
        raise ValueError("a batch level runs in one process: its barrier spans the whole batch")
    conns = {w: ctx.connect() for w in range(c)}
    try:
        while clock.now() < stop:
            queue = list(range(requests))

            async def worker(w: int) -> None:
                while queue and clock.now() < stop:
                    queue.pop()
                    await one(conns[w], w, None)

            async with trio.open_nursery() as n:
                for w in range(min(c, len(queue))):
                    n.start_soon(worker, w)
    finally:
        with trio.move_on_after(CLOSE_S, shield=True):
            for conn in conns.values():
                await conn.aclose()


async def _open(shape: Open, ctx: LevelContext, one, stop: float, start: float, measure: float) -> None:
    times = schedule(shape.rate, shape.arrival, shape.seed, start, stop, shape.burstiness, ctx.grid)
    due = ((t, None) for t in times)
    if ctx.quota is not None:  # a count-bounded level: its first n arrivals after the warmup
        due = ctx.quota.first(due, measure)
    await _arrivals(ctx, one, due, shape.max_concurrency)


class Slots:
    """At most `n` requests in flight; the arrivals beyond wait in arrival order (FIFO), none
    dropped. A slot freed while some wait is handed to the first of them, and `acquire` returns
    when it was freed (the run clock's read at `release`): a request that waited behind a
    declared cap was due then, not at its intended time (`Record.admitted`). A request that
    found a slot free gets None: any lateness of its own is the load generator's."""

    def __init__(self, n: int, clock: RunClock) -> None:
        self.free = n
        self.clock = clock
        self.waiting: deque[list] = deque()  # [event, freed at]

    async def acquire(self) -> float | None:
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return None
        ticket: list = [trio.Event(), None]
        self.waiting.append(ticket)
        try:
            await ticket[0].wait()
        except BaseException:
            if ticket[1] is None:  # still waiting: leave the queue
                self.waiting.remove(ticket)
            else:  # handed a slot as it was cancelled: pass it on
                self.release()
            raise
        return ticket[1]

    def release(self) -> None:
        if self.waiting:
            ticket = self.waiting.popleft()
            ticket[1] = self.clock.now()
            ticket[0].set()
        else:
            self.free += 1


async def _arrivals(ctx: LevelContext, one, due, cap: int | None = None) -> None:
    """Send a request at each intended time of `due` ((time, lengths or None), in time order) on
    a pool of kept-alive connections, every `parts`-th from this process's `p`; return when they
    have drained. Arrival i gets the level's prompt i (whichever process sends it).

    In flight at once: this process's share of `cap` (the spec's `max_concurrency`), an arrival
    beyond it waiting for a slot in arrival order, its record's `admitted` the time the slot was
    freed -- the wait is the user's declared cap, in the request's latency but not the client's
    schedule lag. Without a cap, the share of OPEN_LOOP_MAX_CONNECTIONS: a wait for one of those
    is the load generator's own limit, so no `admitted`: it is schedule lag (client_healthy)."""
    clock = ctx.clock
    idle: list[tuple[int, Connection]] = []
    p, parts = ctx.part
    share = in_flight_share(cap, ctx.part) if cap is not None else max(1, len(range(p, OPEN_LOOP_MAX_CONNECTIONS, parts)))
    slots = Slots(share, clock)
    opened: list[Connection] = []

    async def fire(seq: int, intended: float, lengths: tuple | None) -> None:
        freed = await slots.acquire()
        try:
            if idle:
                idx, conn = idle.pop()
            else:
                idx, conn = len(opened) * parts + p, ctx.connect()
                opened.append(conn)
            try:
                await one(conn, idx, intended, lengths, seq, freed if cap is not None else None)
            finally:
                idle.append((idx, conn))
        finally:
            slots.release()

    try:
        async with trio.open_nursery() as n:
            for i, (t, lengths) in enumerate(due):
                if i % parts == p:
                    await trio.sleep_until(clock.to_trio(t))
                    n.start_soon(fire, i, t, lengths)
    finally:
        with trio.move_on_after(CLOSE_S, shield=True):
            for conn in opened:
                await conn.aclose()


async def _warm_closed(shape: Closed, ctx: LevelContext, one, stop: float, start: float, quota: Quota) -> None:
    """A closed loop's counted warmup: its workers send until they have taken the warmup's N
    (`one` takes each from `quota`; --workers: from the level's shared count), none after `stop`
    (the warmup's bound), and it returns once their requests have finished."""
    await _closed(shape, ctx, one, stop, start, math.inf)


async def _warm_open(shape: Open, ctx: LevelContext, one, stop: float, start: float, quota: Quota) -> None:
    """An open loop's counted warmup: the schedule's first N arrivals from the level's start (every
    --workers process reads the same schedule, so the N are split as arrivals are), sent and
    finished (each bounded by its deadline; none is due after the warmup's bound)."""
    times = schedule(shape.rate, shape.arrival, shape.seed, start, stop, shape.burstiness)
    await _arrivals(ctx, one, quota.first(((t, None) for t in times), start), shape.max_concurrency)


async def _open_ramp(shape: OpenRamp, ctx: LevelContext, one, stop: float, start: float, measure: float) -> None:
    await _arrivals(ctx, one, ((t, None) for t in ramp_schedule(shape, start, stop, measure - start)), shape.max_concurrency)


async def _replay(shape: Replay, ctx: LevelContext, one, stop: float, start: float, measure: float) -> None:
    await _arrivals(ctx, one, replay_schedule(shape, start, stop), shape.max_concurrency)


async def _closed_ramp(shape: ClosedRamp, ctx: LevelContext, one, stop: float, start: float, measure: float) -> None:
    """Workers 0..target-1 run, the target following `shape.targets` over the measured window
    [measure, stop) and held at `shape.start` in the warmup [start, measure): a new worker starts
    at once, one above the target stops after its current request."""
    clock = ctx.clock
    p, parts = ctx.part
    target = shape.start
    running: set[int] = set()

    async def worker(w: int) -> None:
        conn = ctx.connect()
        try:
            while clock.now() < stop and w < target:
                await one(conn, w, None)
        finally:
            running.discard(w)
            with trio.move_on_after(CLOSE_S, shield=True):
                await conn.aclose()

    async with trio.open_nursery() as n:
        for j, (offset, k) in enumerate(shape.targets(stop - measure)):
            at = start if j == 0 else measure + offset  # the first target from the level's start
            if at >= stop:
                break
            await trio.sleep_until(clock.to_trio(at))
            target = k
            for w in range(p, k, parts):
                if w not in running:
                    running.add(w)
                    n.start_soon(worker, w)


# One load model per plan load shape (soakspec.plan.LoadShape): `(shape, ctx, one, stop, start,
# measure)` runs the level's requests through `one` from `start` (the level's start, warmup
# included) until `stop`, a ramp over [measure, stop), and returns when they have drained.
LOAD_MODELS = {Closed: _closed, Batch: _batch, Open: _open, ClosedRamp: _closed_ramp, OpenRamp: _open_ramp, Replay: _replay}
# A counted warmup (`warmup = N requests`), per load shape that takes one (check refuses the others)
WARMUPS = {Closed: _warm_closed, Open: _warm_open}


__all__ = ["Bisection", "LevelContext", "LevelRun", "LiveStats", "Quota", "Shapes", "Slots", "drive_level", "in_flight_share",
           "level_grid", "prompt_words", "ramp_schedule", "replay_schedule", "schedule", "shared_prompt_words", "unit_arrivals"]


# ---------------------------------------------------------------- sweeps (plan.Sweep)


@dataclasses.dataclass
class Bisection:
    """The search of a sweep over a grid of `n` ascending levels, assuming that a level passing
    means every lower one passes (a server that is not monotone still ends at a passing level
    next to a failing one, not necessarily the highest). Probe order: the lowest level (if it
    fails there is no answer), the highest (if it passes it is the answer), then the midpoint of
    the highest known pass and the lowest known fail until they are adjacent: at most
    2 + ceil(log2(n - 1)) probes, and the answer is within one grid step of the true boundary."""

    n: int
    good: int | None = None  # the highest grid index known to pass
    bad: int | None = None  # the lowest grid index known to fail

    def next(self) -> int | None:
        """The grid index to probe next; None when the search is settled."""
        if self.good is None:
            return None if self.bad == 0 else 0
        if self.bad is None:
            return None if self.good == self.n - 1 else self.n - 1
        return None if self.bad - self.good <= 1 else (self.good + self.bad) // 2

    def record(self, index: int, passed: bool) -> None:
        if passed:
            self.good = index if self.good is None else max(self.good, index)
        else:
            self.bad = index if self.bad is None else min(self.bad, index)
