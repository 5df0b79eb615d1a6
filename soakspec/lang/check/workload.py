"""`workload "name" { ... }`: the requests, their sampling, the load shape and the timing."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from soakspec.lang import ast as A
from soakspec.lang import spec as S
from soakspec.lang.check import requests
import soakspec.draws as draws
import soakspec.windows as windows
from soakspec.arrivals import constant_counts, constant_nth, rational
from soakspec.diagnostics import Span
import soakspec.lengths as L
from soakspec.lang import replay as R
from soakspec.lang.check.core import Ctx, Key, RequestCount, Table
from soakspec.lang.check.requests import data_path
from soakspec.lang.check.walk import Body, sub, walk
from soakspec.lang.datasets import FORMATS
from soakspec.lang.fmt import value_text
from soakspec.lang.samples import arrival_count_spread
from soakspec.units import Dimension, format_duration

MAX_BUCKETS_PER_LEVEL = 10_000  # the plan lists every bucket; a 1 ms bucket over 24 h would never finish
MAX_LEVEL_REQUESTS = 1_000_000_000  # requests_per_level: a count, bounded in time by the duration anyway
MAX_LOAD_LEVEL = 1_000_000  # with MAX_DURATION_S, keeps the plan's request estimates finite
MAX_TOTAL_LOAD_S = 30 * 86400.0  # the whole run's planned load time; a longer soak is a typo
# Counts per request. The load generator builds every prompt in memory (a word or a token is a
# few bytes of text), so an unbounded count passed `check` and then ran out of memory in `run`.
# 10 million -- the bound a replayed trace's lengths already had -- is past the longest context
# window served today (1-2M tokens on most long-context models, 10M at the very most; about a
# word a token), and a prompt that long is still some 60 MB of text.
MAX_TOKENS = R.MAX_LENGTH  # prompt_tokens, prefix_tokens, max_tokens (and a prompt file's max_tokens)
# prefix_groups: SGLang's generated-shared-prefix defaults to 64 groups; a million is past any level
# whose groups are each sent more than once (and keeps a group's index to 20 words in base 2)
MAX_PREFIX_GROUPS = 1_000_000
MAX_PROMPT_WORDS = R.MAX_LENGTH  # generated prompt words
_TOKENS_WHY = "no model's context window is that long: is there an extra digit?"
MAX_BATCH_REQUESTS = 1_000_000_000  # mode = batch: requests per level; a billion is days of back-to-back batches
MAX_SEED = 2**63 - 1  # a seed fits a signed 64-bit integer: what servers (vLLM's `seed`) and JSON readers take
MAX_THINK_S = 3600.0  # think_time: an hour between a session's turns
MAX_TOP_K = 10_000_000  # top_k past every vocabulary (the largest are ~260k tokens) is the same as no top_k
_WORKERS_WHY = f"more than {MAX_LOAD_LEVEL:,} workers is past what one load generator can drive"
_SEED_WHY = "a seed is a signed 64-bit integer (2^63 - 1 at most)"

WORKLOAD = Table(
    cls=S.Workload,
    keys=(
        Key("endpoint", "word", "endpoint", choices=("completions", "chat")),
        Key("stream", "bool", "stream"),
        Key("prompt_words", "int", "prompt_words", minimum=1, maximum=MAX_PROMPT_WORDS, default=None,  # 64 when no prompt_file
            why="no model's context window holds a prompt that long: is there an extra digit?"),
        Key("prompt_file", "str", "prompt_file"),
        Key("prompt_tokens", "ints", "prompt_tokens", minimum=1, maximum=MAX_TOKENS, why=_TOKENS_WHY),
        Key("tokenizer", "str", "tokenizer"),
        Key("prefix_tokens", "int", "prefix_tokens", minimum=0, maximum=MAX_TOKENS, why=_TOKENS_WHY),
        Key("prefix_groups", "int", "prefix_groups", minimum=1, maximum=MAX_PREFIX_GROUPS,
            why="more groups than a level's requests share nothing: is there an extra digit?"),
        Key("prompt_format", "word", "prompt_format", choices=FORMATS),
        Key("max_tokens_from_file", "bool", "max_tokens_from_file"),
        Key("multi_turn", "bool", "multi_turn"),
        Key("prompt_order", "word", "prompt_order", choices=("file", "shuffled")),
        Key("think_time", "quantities", "think_time", Dimension.DURATION, allow_zero=True, maximum=MAX_THINK_S,
            why="a session that waits over an hour between turns sends almost nothing: is the unit right?"),
        Key("max_tokens", "ints", "max_tokens", minimum=1, maximum=MAX_TOKENS, why=_TOKENS_WHY),
        Key("length_range", "quantity", "length_range", Dimension.RATIO, allow_zero=True),  # below 100%: _length_range()
        Key("sampling", "word", choices=("greedy",)),
        Key("ignore_eos", "bool", "ignore_eos"),
        Key("duration", "quantity", "duration_s", Dimension.DURATION, default=None),  # required unless phases or a replay set it
        Key("bucket", "quantity", "bucket_s", Dimension.DURATION, default=None),  # the duration
        Key("warmup", "duration_or_count", "warmup_s", Dimension.DURATION, allow_zero=True),  # or `N requests`: _warmup_count()
        Key("deadline", "quantity", "deadline_s", Dimension.DURATION),
        Key("follow_up", "bool", "follow_up"),
        Key("expected_latency", "quantity", "expected_latency_s", Dimension.DURATION),
    ),
    blocks=("load", "sampling", "body", "headers", "header_env"),
)
WORKLOAD_KEYS = tuple(k.name for k in WORKLOAD.keys)

_ARRIVAL_HINT = "{0} is an arrival process, not a mode: write mode = open and arrival = {0}"
LOAD = Table(
    cls=S.Load,
    keys=(
        Key("mode", "word", "mode", choices=("closed", "batch", "open", "replay"), default="closed",
            hints=tuple((w, _ARRIVAL_HINT.format(w)) for w in ("poisson", "constant"))),
        Key("concurrency", "ints", "concurrency", minimum=1, maximum=MAX_LOAD_LEVEL, why=_WORKERS_WHY),
        Key("requests", "int", "requests", minimum=1, maximum=MAX_BATCH_REQUESTS,
            why="a billion requests a level is days of back-to-back batches: is there an extra digit?"),
        Key("rate", "quantities", "rates", Dimension.RATE),
        Key("arrival", "word", "arrival", choices=("constant", "poisson")),
        Key("seed", "int", "seed", minimum=0, maximum=MAX_SEED, why=_SEED_WHY),
        Key("burstiness", "number", "burstiness", minimum=0.01, maximum=100.0),
        Key("max_concurrency", "int", "max_concurrency", minimum=1, maximum=MAX_LOAD_LEVEL,
            why="more than a million requests in flight is past what one load generator can hold open"),
        Key("requests_per_level", "int", "requests_per_level", minimum=1, maximum=MAX_LEVEL_REQUESTS,
            why="more than a billion requests a level is days of load: is there an extra digit?",
            low="a level sends at least one request; to run each level for its duration instead, remove requests_per_level"),
        Key("min_duration", "quantity", "min_duration_s", Dimension.DURATION),  # with requests_per_level: _min_duration()
        Key("trace", "str"),
        Key("trace_format", "word", choices=R.FORMATS, default="mooncake"),
        Key("speed", "number", minimum=0.001, maximum=1000.0, default=1.0),
        Key("input_lengths", "word", choices=("words", "tokens"), default="words"),
        Key("prefix_sharing", "bool", default=True),
        Key("hash_block", "int", minimum=1, maximum=R.MAX_LENGTH,
            why="a block longer than the longest request a trace may hold (10,000,000 tokens) is no block"),
        Key("search", "word", "search", choices=("bisect",)),
        Key("step", "int", "step", minimum=1, maximum=MAX_LOAD_LEVEL, why=_WORKERS_WHY),
        Key("rate_step", "quantity", "rate_step", Dimension.RATE),
        Key("max_wall", "quantity", "max_wall_s", Dimension.DURATION),
    ),
    blocks=("phases",),
)  # fmt: skip
_CLOSED_ONLY = ("concurrency", "requests")
_OPEN_ONLY = ("rate", "arrival", "seed", "burstiness")
_REPLAY_ONLY = ("trace", "trace_format", "speed", "input_lengths", "prefix_sharing", "hash_block")

_DURATION = Key("duration", "quantity", None, Dimension.DURATION, required=True)
_STEPS = Key("steps", "int", minimum=1, maximum=1000, default=0)
CLOSED_PHASE = Table(keys=(
    _DURATION,
    Key("concurrency", "int", minimum=1, maximum=MAX_LOAD_LEVEL, required=True),
    Key("ramp_to", "int", minimum=1, maximum=MAX_LOAD_LEVEL),
    _STEPS,
))  # fmt: skip
OPEN_PHASE = Table(keys=(
    _DURATION,
    Key("rate", "quantity", None, Dimension.RATE, required=True),
    Key("ramp_to", "quantity", None, Dimension.RATE),
    _STEPS,
    Key("arrival", "word", choices=("constant", "poisson")),
    Key("burstiness", "number", minimum=0.01, maximum=100.0),
    Key("seed", "int", minimum=0, maximum=MAX_SEED, why=_SEED_WHY),
))  # fmt: skip

SAMPLING = Table(
    cls=S.Sampling,
    keys=(
        Key("temperature", "number", "temperature", minimum=0.0, maximum=10.0, default=1.0),  # a block samples
        Key("top_k", "int", "top_k", minimum=1, maximum=MAX_TOP_K, why="a top_k past every model's vocabulary is no top_k: leave it out"),
        Key("top_p", "number", "top_p", minimum=0.0, maximum=1.0),
        Key("seed", "int", "seed", minimum=0, maximum=MAX_SEED, why=_SEED_WHY),
    ),
)  # fmt: skip


def workload(ctx: Ctx, blk: A.Block) -> S.Workload | None:
    where = f"workload '{blk.label.value}'"
    b = walk(ctx, blk, WORKLOAD, where)
    fields = b.fields()
    fields["prompt_words"] = _prompt_words(ctx, b, where)
    fields["length_range"] = _length_range(ctx, b, fields["prompt_words"], where)
    fields["sampling"] = _sampling(ctx, b, where)
    fields["think_time"] = _think_time(ctx, b, where)
    # what the load's seed seeds beside random arrivals: drawn lengths, a shuffled prompt order, drawn think times
    # (and each request's prefix group)
    seeded = (fields["length_range"] > 0 or fields["prompt_order"] == "shuffled" or len(set(fields["think_time"])) > 1
              or fields["prefix_groups"] > 1)
    fields["load"] = _load(ctx, b, where, blk.label.value, ranged=seeded)
    fields["warmup_s"], fields["warmup_requests"] = _warmup_count(ctx, b, fields["load"])
    _check_timing(ctx, b, fields["load"])
    _shaped_duration(ctx, b, fields, where)
    fields["dataset"] = requests.dataset(ctx, b, fields["endpoint"], where, blk.label.value)
    requests.check_multi_turn(ctx, b, fields["endpoint"], fields["load"], where)
    fields["body_json"] = requests.body_json(ctx, b, where)
    fields["headers"], fields["header_env"] = requests.headers(ctx, b, where)
    if fields["duration_s"] is None:
        return None
    if fields["bucket_s"] is None:
        fields["bucket_s"] = fields["duration_s"]
    w = S.Workload(name=blk.label.value, span=blk.kind_span, **fields)
    if w.dataset is not None and b.ok("prompt_file"):
        requests.repeated_prompts(ctx, w, b.got("prompt_file").span)  # W511
        requests.unalternating_turns(ctx, w, b.got("prompt_file").span)  # W512
    return w


def _warmup_count(ctx: Ctx, b: Body, load: S.Load) -> tuple[float, int | None]:
    """(warmup_s, warmup_requests): `warmup = 10s` a duration, `warmup = 20 requests` a count
    (vLLM bench serve's --num-warmups) -- per level, as `requests_per_level` is. The count is
    for the levels of an open or closed loop, which send its N requests before the measured
    window and wait for them to finish; where the warmup is bound to time it has no meaning:
    E403 with what to write instead -- batch mode (it sends whole batches), a replay (its warmup
    is the trace's first seconds), phases (their warmup holds the first phase's start for a
    time), a sweep (`max_wall` holds whole probes of warmup + duration), multi-turn sessions (a
    conversation's turns would be cut wherever the count fell)."""
    warm = b["warmup"] if b.ok("warmup") else None
    if not isinstance(warm, RequestCount):
        return (warm if warm is not None else S.Workload.warmup_s), None
    n = warm.n
    why: tuple[str, str] | None = None
    timed = "write the warmup as a duration (warmup = 10s)"
    if load.mode == "batch":
        why = ("mode = batch warms up with whole batches for a duration",
               f"{timed}, or for {n} warmup requests at a fixed concurrency use mode = closed  concurrency = [...]")
    elif load.mode == "replay":
        why = ("a replay's warmup is the trace's first seconds (the trace plays from the level's start)", timed)
    elif load.phases:
        why = ("phases hold the first phase's starting load through a warmup of a given time", timed)
    elif load.search is not None:
        why = ("a sweep's max_wall holds whole probes of warmup + duration", f"{timed}, or list the levels with concurrency = [...] / rate = [...]")
    elif b.ok("multi_turn") and b["multi_turn"]:
        why = ("a multi-turn session's conversations would be cut wherever the count fell",
               f"{timed}, or drop multi_turn for a warmup of {n} requests")
    if why is not None:
        ctx.error("E403", f"a warmup of {n} requests is for an open or closed loop's levels; {why[0]}", b.got("warmup").span, why[1])
        return S.Workload.warmup_s, None
    return 0.0, n


def _warmup_seconds(b: Body) -> float:
    """The workload's timed warmup in seconds, as written: 0 for none and for a count
    (`warmup = N requests`, whose time is its requests')."""
    warm = b["warmup"]
    return 0.0 if warm is None or isinstance(warm, RequestCount) else warm


_SOURCES = ("prompt_words", "prompt_file", "prompt_tokens")


def _prompt_words(ctx: Ctx, b: Body, where: str) -> int | None:
    """One prompt source: generated words (the default, 64), a file, or token-exact prompts."""
    given = [k for k in _SOURCES if b.has(k)]
    for key in given[1:]:
        ctx.error("E403", f"{where} sets both '{given[0]}' and '{key}': a workload has one prompt source", b.got(key).key_span)
    for key in ("tokenizer", "prefix_tokens"):
        if key == "tokenizer" and _load_word(b, "input_lengths") == "tokens":
            continue  # a replay's token-exact input lengths use it
        if b.has(key) and not b.has("prompt_tokens"):
            ctx.error("E403", f"'{key}' belongs to token-exact prompts; {where} sets no 'prompt_tokens'", b.got(key).key_span)
    ratio = b["length_range"] if b.ok("length_range") and b["length_range"] < 1 else 0.0
    if b.ok("prefix_tokens") and b.ok("prompt_tokens") and b["prefix_tokens"] >= L.smallest(b["prompt_tokens"], ratio):
        shortest = (f"the shortest prompt_tokens ({min(b['prompt_tokens'])})" if not ratio else
                    f"the shortest prompt length length_range draws ({L.smallest(b['prompt_tokens'], ratio)})")
        ctx.error("E204", f"'prefix_tokens' ({b['prefix_tokens']}) must be less than {shortest}: each request needs tokens of its own",
                  b.got("prefix_tokens").span)  # fmt: skip
    _prefix_groups(ctx, b, where)
    if not given:
        return S.Workload.prompt_words
    return b["prompt_words"]


def _prefix_groups(ctx: Ctx, b: Body, where: str) -> None:
    """`prefix_groups = G` splits `prefix_tokens` into G prefixes: without a shared prefix it has
    nothing to split (E403, with what to write). Each group's prefix begins with its index spelled
    in one-token words (runner/prompts.py `group_words`): in base 2, the fewest any usable
    tokenizer has, G needs ceil(log2 G) of them (at least 1: `draws.digits(G, 2)`, as the runner
    counts them), so a shorter prefix could not keep every group
    apart (E204); a tokenizer that counts most of the 198 vocabulary words as one token spells
    that many groups in one word."""
    if not b.has("prefix_groups"):
        return
    got = b.got("prefix_groups")
    if not b.has("prefix_tokens") or (b.ok("prefix_tokens") and b["prefix_tokens"] == 0):
        n = b["prefix_groups"] if b.ok("prefix_groups") else "G"
        ctx.error("E403", f"'prefix_groups' splits the shared prefix into groups; {where} sets no 'prefix_tokens'", got.key_span,
                  f"as SGLang's --gsp-system-prompt-len S --gsp-num-groups {n}: prompt_tokens = ...  prefix_tokens = S  prefix_groups = {n}")
        return
    if b.ok("prefix_groups") and b.ok("prefix_tokens") and b["prefix_tokens"] < (need := draws.digits(b["prefix_groups"], 2)):
        ctx.error("E204", f"'prefix_tokens' ({b['prefix_tokens']}) is too short to keep {b['prefix_groups']} prefix groups apart: "
                  f"each group's prefix starts with its index, {need} tokens with any tokenizer", b.got("prefix_tokens").span,
                  f"prefix_tokens = {need} or more, or fewer groups")


def _think_time(ctx: Ctx, b: Body, where: str) -> tuple[float, ...]:
    """`think_time = 2s` (fixed) or `[1s, 5s]` (uniform between, drawn per conversation and
    turn by the load's seed): the wait between a multi-turn session's turns. Anything but a
    multi-turn workload sends its next request without one (E403)."""
    if not b.ok("think_time"):
        return ()
    got, think = b.got("think_time"), b["think_time"]
    if len(think) > 2 or (len(think) == 2 and think[0] > think[1]):
        ctx.error("E204", f"'think_time' is one duration or a range [low, high], not {value_text(got.node)}", got.span,
                  "think_time = 2s waits 2 s between turns; think_time = [1s, 5s] draws each wait uniformly between 1 s and 5 s")
        return ()
    if not b["multi_turn"]:
        ctx.error("E403", f"'think_time' waits between a multi-turn session's turns; {where} is not multi-turn", got.key_span,
                  "set multi_turn = true (endpoint = chat, closed-loop load, a ShareGPT or messages prompt_file); a closed loop "
                  "of single requests sends the next at once by design, and an open loop sends at its arrival times")
        return ()
    return tuple(think)


def _length_range(ctx: Ctx, b: Body, words: int | None, where: str) -> float:
    """`length_range = 50%`: random lengths as vLLM's `--random-range-ratio 0.5`, in [0, 1) as
    vLLM takes it. It varies what the workload generates -- a prompt of `prompt_tokens` (or
    `prompt_words`) and `max_tokens` -- so a prompt file (its prompts have their lengths;
    `max_tokens_from_file`, `multi_turn` read one) or a replayed trace (each request's lengths are
    the trace's; reported with the other keys a replay sets, `_shaped_duration`) leaves it
    nothing to vary. Every drawn length stays within the bounds `prompt_tokens`, `prompt_words`
    and `max_tokens` have, and at least 1."""
    if not b.ok("length_range"):
        return 0.0
    got, ratio = b.got("length_range"), b["length_range"]
    if ratio >= 1:
        ctx.error("E204", f"'length_range' must be less than 100%, not {value_text(got.node)}", got.span,
                  "each length is drawn from [N(1 - r), N(1 + r)], as vLLM's --random-range-ratio (in [0, 1)); "
                  "at 100% a request would be drawn a length of 0")
        return 0.0
    if b.has("prompt_file") and _load_word(b, "mode") != "replay":
        ctx.error("E403", f"'length_range' varies the lengths {where} generates (prompt_tokens or prompt_words, and max_tokens); "
                          "a prompt file's prompts have their own lengths", got.key_span,
                  "for random token lengths set prompt_tokens (vLLM's --dataset-name random) in place of prompt_file")  # fmt: skip
        return 0.0
    for key, lens, maximum in (("prompt_tokens", b["prompt_tokens"] if b.ok("prompt_tokens") else (), MAX_TOKENS),
                               ("prompt_words", (words,) if words and not b.has("prompt_tokens") else (), MAX_PROMPT_WORDS),
                               ("max_tokens", b["max_tokens"] if b.ok("max_tokens") else S.Workload.max_tokens, MAX_TOKENS)):
        if lens and L.largest(lens, ratio) > maximum:
            ctx.error("E204", f"length_range {value_text(got.node)} draws {key} up to {L.largest(lens, ratio):,}, "
                              f"more than the {maximum:,} {key} may be", got.span, _TOKENS_WHY)  # fmt: skip
            return 0.0
    return ratio


def _load_word(b: Body, key: str) -> str | None:
    """The word the workload's load block gives `key` (`mode = replay`, `input_lengths =
    tokens`), read before the load is checked; None where it gives none."""
    blk = b.blocks.get("load")
    if blk is None:
        return None
    return next((s.value.name for s in blk.body if isinstance(s, A.Attribute) and s.key == key and isinstance(s.value, A.Word)),
                None)


def _sampling(ctx: Ctx, b: Body, where: str) -> S.Sampling:
    if b.has("sampling") and "sampling" in b.blocks:
        ctx.error("E403", "'sampling' is either a word (greedy) or a block, not both", b.blocks["sampling"].kind_span)
    sb = sub(ctx, b, "sampling", SAMPLING, f"the sampling of {where}")
    if sb is None:
        return S.Sampling()
    if sb.ok("top_p") and sb["top_p"] == 0:
        ctx.error("E204", "'top_p' must be more than 0", sb.got("top_p").span)
    return S.Sampling(greedy=sb["temperature"] == 0, **sb.fields())


def _load(ctx: Ctx, b: Body, where: str, name: str = "", ranged: bool = False) -> S.Load:
    """`ranged`: the workload draws something the load's `seed` seeds in every mode -- random
    lengths (`length_range`), a shuffled prompt order (`prompt_order = shuffled`) or think
    times from a range (`think_time = [low, high]`): a closed or batch load may set it too, and
    an open load of constant arrivals is not warned that it seeds nothing (W514)."""
    lb = sub(ctx, b, "load", LOAD, f"the load of {where}")
    load = _load_shape(ctx, b, lb, where, name, ranged)
    ranged_seed = ranged and lb is not None and lb.ok("seed") and load.mode != "replay"
    load = dataclasses.replace(load, seed=lb["seed"]) if ranged_seed else load  # type: ignore[index]
    return _counted(ctx, b, lb, _capped(ctx, lb, load)) if lb is not None else load


def _counted(ctx: Ctx, b: Body, lb: Body, load: S.Load) -> S.Load:
    """`requests_per_level = N`: each level of an open or closed loop sends exactly N measured
    requests (the warmup's are not counted) and ends once they have finished, its `duration` the
    upper bound (vLLM's --num-prompts, GuideLLM's --max-requests, k6's iterations). Where a level
    is not a fixed load held until done it has no meaning: E403 with what to write instead --
    batch mode (its `requests` is one batch's size), phases and a replay (their time *is* the
    shape), a sweep (each probe is judged over its duration), multi-turn sessions (a
    conversation's turns would be cut wherever the count fell)."""
    if lb.has("mode") and not lb.ok("mode"):
        return load
    if not lb.has("requests_per_level"):
        if lb.has("min_duration"):
            ctx.error("E403", "'min_duration' is the least time a counted level runs (with requests_per_level); "
                              "a level without a count already runs for its duration", lb.got("min_duration").key_span,
                      "add requests_per_level = N (the level then sends at least N requests for at least min_duration, "
                      "as LoadGen's min_query_count and min_duration), or remove min_duration")
        return load
    got = lb.got("requests_per_level")
    n = lb["requests_per_level"] if lb.ok("requests_per_level") else "N"
    why: tuple[str, str] | None = None
    if load.mode == "batch":
        why = ("mode = batch sends batches of 'requests' until the duration ends",
               f"'requests' is the size of one batch; for {n} requests per level at a fixed concurrency write "
               f"mode = closed  concurrency = [...]  requests_per_level = {n}")
    elif load.mode == "replay":
        why = ("a replay sends its trace's requests at the trace's times",
               "cut the trace with the workload's duration; requests_per_level is for mode = open or closed")
    elif load.phases:
        why = ("phases are a load shape over time, each phase held for its duration",
               f"drop the phases and write the levels as concurrency = [...] or rate = [...] with requests_per_level = {n}")
    elif load.search is not None:
        why = ("a sweep judges each probe over its duration",
               "remove requests_per_level from the sweep, or list the levels with concurrency = [...] / rate = [...]")
    elif b.ok("multi_turn") and b["multi_turn"]:
        why = ("a multi-turn session's conversations would be cut wherever the count fell",
               "drop multi_turn for a fixed count, or let the level run for its duration")
    if why is not None:
        ctx.error("E403", f"'requests_per_level' fixes the requests of an open or closed loop's level; {why[0]}",
                  got.key_span, why[1])
        return load
    if not lb.ok("requests_per_level"):
        return load
    _short_count(ctx, b, lb, load, lb["requests_per_level"])
    return dataclasses.replace(load, requests_per_level=lb["requests_per_level"], min_duration_s=_min_duration(ctx, b, lb))


def _min_duration(ctx: Ctx, b: Body, lb: Body) -> float | None:
    """`min_duration = D` beside `requests_per_level = N` (MLPerf LoadGen's min_duration beside its
    min_query_count): the level sends until it has sent N measured requests *and* D has passed
    since its measured start (bucket 0: after a warmup, timed or counted), then ends once its
    requests have finished; its `duration` stays the bound. E425: a D above the duration could
    never hold -- the bound would end every level first, none complete. W518: a D shorter than
    one bucket guarantees no whole bucket, so it rarely changes what the level measures."""
    if not lb.ok("min_duration"):
        return None
    got, d = lb.got("min_duration"), lb["min_duration"]
    if b.ok("duration") and d > b["duration"] + 1e-9:
        dg = b.got("duration")
        ctx.error("E425", f"min_duration {value_text(got.node)} is longer than the level's duration {value_text(dg.node)}, "
                          "its bound: the bound would end every level first, none complete", got.span,
                  f"set duration (the bound) to at least {value_text(got.node)}, or shorten min_duration")
        return d
    bucket = b["bucket"] if b.ok("bucket") else None
    if bucket is not None and d < bucket - 1e-9:
        ctx.warn("W518", f"min_duration {value_text(got.node)} is shorter than a bucket ({value_text(b.got('bucket').node)}): "
                         "it guarantees no whole bucket, so a level that sends its count first ends inside its first bucket anyway",
                 got.span, "set min_duration to a whole number of buckets (LoadGen's 600 s minimum is ten 60 s buckets), or remove it")
    return d


def _short_count(ctx: Ctx, b: Body, lb: Body, load: S.Load, n: int) -> None:
    """W515: an open loop's level whose rate × duration is clearly below its `requests_per_level`
    -- its duration (the bound) ends it first, not complete (at 4 rps for 60 s it sends about
    240 of its 1000), as the run would show only after it. "Clearly": constant arrivals send at
    most ceil(rate × duration), so the warning holds when that is below N; random (Poisson or
    gamma) arrivals' count varies around rate × duration, so it warns only where N is more than
    `arrival_count_spread` (three standard deviations) above the mean -- a count that luck could
    reach is not called short; `plan` promises N by the same rule from the other side.
    A closed loop's count depends on the server's latency, unknown before the run: never warned
    (`plan` prints its estimate where the workload gives `expected_latency`)."""
    if load.mode != "open" or not load.rates or not b.ok("duration"):
        return
    d = b["duration"]

    def short(rate: float) -> bool:
        mean = rate * d
        if load.arrival == "constant":
            return math.ceil(mean - 1e-9) < n
        return mean + arrival_count_spread(mean, load.burstiness) < n

    shorts = sorted(r for r in set(load.rates) if short(r))
    if not shorts:
        return
    rate, dg = shorts[0], b.got("duration")
    levels = "a level" if len(load.rates) == 1 else ("every level" if len(shorts) == len(set(load.rates)) else
                                                      f"{len(shorts)} of its {len(set(load.rates))} levels")
    more = "" if load.arrival == "constant" else " (a little more: a random count varies)"
    ctx.warn("W515", f"at {rate:g} rps for {value_text(dg.node)} a level sends about {round(rate * d):,} of its {n:,} "
                     f"requests_per_level: the duration ends {levels} first, not complete", lb.got("requests_per_level").span,
             f"{n:,} requests at {rate:g} rps take {format_duration(n / rate)}: set duration (the bound) to at least "
             f"that{more} or lower requests_per_level")


def _capped(ctx: Ctx, lb: Body, load: S.Load) -> S.Load:
    """`max_concurrency = N`: at most N of an open loop's requests in flight (a rate, its phases,
    a sweep's probes, a replay), arrivals beyond waiting in order: vLLM bench serve's
    `--request-rate R --max-concurrency N`, k6's `maxVUs`. A closed or batch loop's requests in
    flight are its `concurrency` already: there it is E403, with that hint."""
    if not lb.has("max_concurrency") or (lb.has("mode") and not lb.ok("mode")):
        return load
    mode = lb["mode"]
    if mode in ("open", "replay"):
        return dataclasses.replace(load, max_concurrency=lb["max_concurrency"]) if lb.ok("max_concurrency") else load
    got = lb.got("max_concurrency")
    n = lb["max_concurrency"] if lb.ok("max_concurrency") else "N"
    ctx.error("E403", f"'max_concurrency' caps an open loop's requests in flight; a {mode} loop has exactly its "
                      "'concurrency' in flight", got.key_span,
              f"for {n} workers write concurrency = [{n}]; for arrivals at a rate with at most {n} in flight, "
              f"mode = open  rate = [...]  max_concurrency = {n} (vLLM's --request-rate with --max-concurrency)")
    return load


def _load_shape(ctx: Ctx, b: Body, lb: Body | None, where: str, name: str, ranged: bool) -> S.Load:
    if lb is None:
        if "load" not in b.suggested:  # else `lod { ... }` was reported as unknown already
            ctx.error("E103", f"{where} needs a load block: load {{ mode = closed  concurrency = [4, 8] }}", b.span)
        return S.Load("closed", (1,))
    if lb.has("mode") and not lb.ok("mode"):
        return S.Load("closed", (1,))  # the mode is wrong (reported): what else belongs is unknown
    mode = lb["mode"]
    if mode != "replay":
        _misplaced(ctx, lb, _REPLAY_ONLY, "belongs to mode = replay (a trace file's arrivals)")
    if "phases" in lb.blocks:
        return _phased(ctx, lb, mode, where, ranged)
    if mode == "replay":
        return _replay(ctx, lb, where, name)
    if mode == "open":
        _misplaced(ctx, lb, _CLOSED_ONLY, "belongs to closed-loop load; open-loop load sets 'rate'")
        lb.require("rate")
        arrival, burst = _arrival(ctx, lb, lb["arrival"])
        if arrival in (None, "constant") and not ranged:  # constant: the default
            _unseeded(ctx, lb)
        load = S.Load("open", (), None, lb["rate"] or (1.0,), arrival, lb["seed"], burstiness=burst)
        load = _search(ctx, lb, load, b)
    else:
        _misplaced(ctx, lb, tuple(k for k in _OPEN_ONLY if not (ranged and k == "seed")), "belongs to open-loop load (mode = open)")
        lb.require("concurrency")
        if mode == "batch":
            lb.require("requests")
        elif lb.has("requests"):
            ctx.error("E403", "'requests' sets the batch size of mode = batch; closed-loop load runs for the duration",
                      lb.got("requests").key_span, "for a fixed count of requests per level write requests_per_level = N")
        load = S.Load(mode, lb["concurrency"] or (1,), lb["requests"])
        load = _search(ctx, lb, load, b)
    _check_levels(ctx, lb, load)
    return load


def _unseeded(ctx: Ctx, b: Body) -> None:
    """W514: `seed` seeds random arrivals (Poisson, gamma) only; where every arrival it could
    seed is constant (i / rate, the default) it changes nothing -- a user who meant the server's
    sampling seed (`sampling { seed }`), or who expected Poisson arrivals as vLLM's `bench serve`
    sends at a rate, would otherwise believe them seeded."""
    if b.has("seed"):
        ctx.warn("W514", "'seed' seeds random arrivals (poisson, burstiness); with arrival = constant it changes nothing",
                 b.got("seed").key_span, "the server's sampling seed is sampling { seed = N }; for random arrivals set arrival = poisson")


def _arrival(ctx: Ctx, b: Body, arrival: str, default: float = 1.0) -> tuple[str, float]:
    """`burstiness` shapes random arrivals (gamma inter-arrival times; 1 is Poisson): it implies
    `arrival = poisson`, and contradicts `arrival = constant`. Without it: `default`."""
    if not b.ok("burstiness"):
        return arrival, default
    burstiness = b["burstiness"]
    if b.has("arrival") and arrival != "poisson":
        ctx.error("E403", "'burstiness' shapes random arrivals (gamma inter-arrival times); it needs arrival = poisson, not constant",
                  b.got("burstiness").key_span)
    return "poisson", burstiness


def _phased(ctx: Ctx, lb: Body, mode: str, where: str, ranged: bool = False) -> S.Load:
    """`phases { NAME { ... } ... }`: named phases in sequence, each one level with its own
    shape and duration (closed: concurrency; open: rate). Arrival settings of the load block are
    each phase's defaults."""
    blk = lb.blocks["phases"]
    if mode not in ("closed", "open"):
        ctx.error("E403", f"phases shape closed-loop (concurrency) or open-loop (rate) load, not mode = {mode}", blk.kind_span)
        return S.Load("closed", (1,))
    for key in ("concurrency", "rate", "requests"):
        if lb.has(key):
            ctx.error("E403", f"'{key}' is set per phase when the load has phases", lb.got(key).key_span)
    table = OPEN_PHASE if mode == "open" else CLOSED_PHASE
    arrival, burst = _arrival(ctx, lb, lb["arrival"]) if mode == "open" else ("constant", 1.0)
    random_phase = False  # a phase of random arrivals (that the load's seed, their default, can seed)
    phases: list[S.Phase] = []
    seen: dict[str, Span] = {}
    for stmt in blk.body:
        if not isinstance(stmt, A.Block):
            ctx.error("E108", "a phases block holds named phases: NAME { duration = 10s  ... }", getattr(stmt, "key_span", None) or stmt.span)
            continue
        if stmt.label is not None:
            ctx.error("E107", f"a phase is named by its block: {stmt.kind} {{ ... }}, not {stmt.kind} \"...\" {{ ... }}", stmt.label.span)
        if stmt.kind in seen:
            ctx.error("E106", f"phase '{stmt.kind}' is defined twice (first on line {seen[stmt.kind].line})", stmt.kind_span)
            continue
        seen[stmt.kind] = stmt.kind_span
        pb = walk(ctx, stmt, table, f"phase '{stmt.kind}' of {where}")
        start = pb["rate"] if mode == "open" else pb["concurrency"]
        if pb.has("steps") and not pb.has("ramp_to"):
            ctx.error("E403", "'steps' steps from the phase's start to its 'ramp_to'; set ramp_to", pb.got("steps").key_span)
        p_arrival, p_burst = arrival, burst
        if mode == "open":
            p_arrival = pb["arrival"] or arrival
            if pb.has("burstiness"):
                p_arrival, p_burst = _arrival(ctx, pb, p_arrival)
            elif p_arrival == "constant":
                p_burst = 1.0
        seed = pb["seed"] if mode == "open" and pb["seed"] is not None else lb["seed"]
        if mode == "open" and p_arrival in (None, "constant"):
            _unseeded(ctx, pb)
        else:
            random_phase = True
        if pb["duration"] is None or start is None:
            continue
        phases.append(S.Phase(stmt.kind, pb["duration"], float(start), float(pb["ramp_to"]) if pb["ramp_to"] is not None else None,
                              pb["steps"] or 0, p_arrival, p_burst, seed + len(phases), stmt.kind_span))  # fmt: skip
    if mode == "open" and seen and not random_phase and not ranged:
        _unseeded(ctx, lb)
    if not phases and not seen:
        ctx.error("E205", "the phases block is empty: name at least one phase, e.g. steady { duration = 60s  ... }", blk.kind_span)
    # every value the phases offer (holds, ramp ends, steps): what the run covered, for lint-claims' scope
    values = sorted({v for p in phases for v in _phase_values(p)})
    if mode == "open":
        return S.Load(mode, (), None, tuple(values), arrival, lb["seed"], burstiness=burst, phases=tuple(phases))  # type: ignore[arg-type]
    return S.Load(mode, tuple(sorted({int(round(v)) for v in values})), None, (), phases=tuple(phases))  # type: ignore[arg-type]


def _phase_values(p: S.Phase) -> tuple[float, ...]:
    if p.end is None:
        return (p.start,)
    if p.steps:
        return tuple(p.start + (p.end - p.start) * j / p.steps for j in range(p.steps + 1))
    return (p.start, p.end)


def _replay(ctx: Ctx, lb: Body, where: str, name: str = "") -> S.Load:
    """`mode = replay  trace = "file.jsonl"`: the trace is read now, and every problem reported
    at its line in the file (and at the spec's `trace`). A finished run's embedded spec
    (`ctx.data_optional`) takes the file the run replayed, found where the spec names it or
    where the manifest recorded it (`requests.run_file`); found nowhere, it is still E423: the
    run's levels (their arrivals, span and buckets) are planned from it."""
    _misplaced(ctx, lb, _CLOSED_ONLY + tuple(k for k in _OPEN_ONLY if k != "seed"),
               "does not apply to mode = replay (the trace sets arrivals and lengths)")
    if not lb.require("trace", f"the load of {where} (mode = replay) needs 'trace', a timestamped trace file") or not lb.ok("trace"):
        return S.Load("replay")
    got = lb.got("trace")
    path = data_path(ctx, got.value)
    if ctx.data_optional:
        tf, path, why = requests.run_file(path, ctx.data_files.get("trace", {}).get(name),
                                          lambda p: R.read_trace(p, lb["trace_format"]), R.TraceFileError)
        if tf is None:
            ctx.error("E423", f"the trace file {got.value!r} the run replayed {why}: its levels cannot be planned without it",
                      got.span, "pass --spec FILE (the spec beside the trace file the run replayed)")
            return S.Load("replay")
    else:
        tf = _trace_file(ctx, got, path, lb["trace_format"])
        if tf is None:
            return S.Load("replay")
    # prefix sharing (the default): each request's prompt is built from its hash_ids' blocks, a
    # block's content a function of its id and the load's `seed` (runner/prompts.py `block_words`)
    hashes = tf.hash_ids if lb["prefix_sharing"] and any(tf.hash_ids) else ()
    if not hashes:
        _unshared(ctx, lb, "prefix_sharing = false builds every prompt of its own" if not lb["prefix_sharing"]
                  else f"the trace {got.value!r} lists no hash_ids")
    rp = S.Replay(path, tf.format, tf.sha256, tf.offsets_s, tf.input_lens, tf.output_lens, lb["speed"], lb["input_lengths"] == "tokens",
                  hashes, lb["hash_block"] or R.MOONCAKE_BLOCK)
    return S.Load("replay", seed=lb["seed"] or 0, replay=rp)


def _unshared(ctx: Ctx, lb: Body, why: str) -> None:
    """W516: a replay's `hash_block` (the size of the block a hash id names) and `seed` (what a
    block's words are drawn from) shape only the shared prefix blocks built from the trace's
    hash_ids; a replay without them -- `prefix_sharing = false`, or a trace that lists no
    hash_ids -- sends prompts of their input_length with no block in them, so either key changes
    nothing, and a reader of the spec would believe the prompts share prefixes of that size."""
    for key, what in (("hash_block", "sizes the shared prefix blocks"), ("seed", "seeds the shared prefix blocks' words")):
        if lb.has(key):
            ctx.warn("W516", f"'{key}' {what} a replay builds from its trace's hash_ids; {why}, so it changes nothing",
                     lb.got(key).key_span,
                     "remove it, or replay a trace with hash_ids (Mooncake's) and prefix_sharing = true (the default) to share prefixes")


def _trace_file(ctx: Ctx, got: Any, path: str, fmt: str) -> R.TraceFile | None:
    """The trace file a spec names, read; else None and E423 at its line in the file (and at the
    spec's `trace`)."""
    try:
        return R.read_trace(path, fmt)
    except R.TraceFileError as e:
        saved, ctx.path = ctx.path, path
        try:
            ctx.error("E423", f"trace file {e.message}", Span(e.line, e.column, e.line, e.column + 1),
                      f"named by 'trace' at {saved}:{got.span.line}:{got.span.column}")  # fmt: skip
        finally:
            ctx.path = saved
        ctx.error("E423", f"the trace file {got.value!r} cannot be used (see {path}:{e.line})", got.span)
        return None


def _shaped_duration(ctx: Ctx, b: Body, fields: dict, where: str) -> None:
    """Phases and replays set the workload's duration (the phases' sum; the trace's span after
    the warmup, unless `duration` cuts it short); every other workload needs `duration`."""
    load: S.Load = fields["load"]
    if load.phases:
        if b.has("duration"):
            ctx.error("E403", "a workload with phases takes each phase's duration; remove 'duration'", b.got("duration").key_span)
        fields["duration_s"] = math.fsum(p.duration_s for p in load.phases)
        if b.ok("bucket") and b["bucket"] and max(p.duration_s for p in load.phases) / b["bucket"] > MAX_BUCKETS_PER_LEVEL:
            ctx.error("E204", f"bucket cuts a phase into more than {MAX_BUCKETS_PER_LEVEL} buckets", b.got("bucket").span)
        return
    if load.mode == "replay":
        # prompt_words too: a replayed request's prompt is its trace line's input_length in words
        # (runner/load.py `Shapes.make`); the number would only have sized the pre-flight's prompt
        for key in ("prompt_words", "prompt_file", "prompt_tokens", "max_tokens", "max_tokens_from_file", "multi_turn", "length_range"):
            if b.has(key):
                ctx.error("E403", f"'{key}' does not apply to mode = replay: the trace sets each request's input and output length",
                          b.got(key).key_span)
        if load.replay is None:
            return
        outs = load.replay.output_lens
        fields["max_tokens"] = tuple(sorted({min(outs), max(outs)}))  # the bounds the judge checks usage against
        # the trace plays from the level's start, so a warmup is its first seconds (their requests are warmup)
        warmup, span = fields["warmup_s"] or 0.0, load.replay.offsets_s[-1] / load.replay.speed + R.REPLAY_TAIL_S
        if warmup >= span:
            ctx.error("E403", f"warmup ({format_duration(warmup)}) covers the whole replayed trace ({format_duration(span)}): "
                              "the trace plays from the warmup's start, so no request of it would be measured",
                      b.got("warmup").key_span)  # fmt: skip
            return
        if fields["duration_s"] is None:  # the rest of the trace, to one mean gap past its last arrival
            bucket = b["bucket"] if b.ok("bucket") else None
            fields["duration_s"] = R.replay_rest(load.replay.offsets_s, load.replay.speed, warmup, bucket)
        if b.ok("bucket") and fields["duration_s"] / b["bucket"] > MAX_BUCKETS_PER_LEVEL and not b.has("duration"):
            ctx.error("E204", f"bucket cuts the replayed trace ({format_duration(fields['duration_s'])}) into more than "
                              f"{MAX_BUCKETS_PER_LEVEL} buckets", b.got("bucket").span)  # fmt: skip
        return
    phased = any(isinstance(s, A.Block) and s.kind == "phases" for s in getattr(b.blocks.get("load"), "body", ()))
    if fields["duration_s"] is None and not b.has("duration") and "duration" not in b.suggested and not phased:  # phases: reported there
        ctx.error("E103", f"{where} needs 'duration'", b.span)




_SWEEP_ONLY = ("step", "rate_step", "max_wall")


def _search(ctx: Ctx, lb: Body, load: S.Load, b: Body) -> S.Load:
    """A sweep (`search = bisect`): the level list is its [low, high] bounds; closed loop steps
    by `step` workers, open loop by `rate_step`; `max_wall` bounds the search's wall time, and
    must hold one probe (warmup + duration of the workload `b`): no probe starts that would end
    after it, so a shorter bound would run nothing."""
    if lb["search"] is None:
        for key in _SWEEP_ONLY:
            if lb.has(key):
                ctx.error("E403", f"'{key}' belongs to a sweep: add search = bisect", lb.got(key).key_span)
        return load
    key = "rate" if load.mode == "open" else "concurrency"
    if load.mode == "batch":
        ctx.error("E403", "a sweep searches closed-loop concurrency or open-loop rate, not batches", lb.got("search").key_span)
        return load
    if load.mode == "open" and lb.has("step"):
        ctx.error("E403", "an open-loop sweep steps by rate_step (a rate, e.g. 0.5rps)", lb.got("step").key_span)
    if load.mode != "open" and lb.has("rate_step"):
        ctx.error("E403", "a closed-loop sweep steps by step (workers)", lb.got("rate_step").key_span)
    levels = load.levels
    if lb.ok(key) and (len(levels) != 2 or levels[0] >= levels[1]):
        ctx.error("E204", f"a sweep's '{key}' is its bounds [low, high] with low < high, e.g. {key} = "
                  + ("[1rps, 20rps]" if key == "rate" else "[1, 32]"), lb.got(key).span)
    lb.require("max_wall")
    one = _warmup_seconds(b) + (b["duration"] or 0.0)  # a count is E403 in a sweep (`_warmup_count`)
    if lb.ok("max_wall") and lb["max_wall"] is not None and lb["max_wall"] + 1e-9 < one:
        ctx.error("E204", f"max_wall ({value_text(lb.got('max_wall').node)}) is shorter than one probe (warmup + duration = "
                  f"{one:g}s): no probe would start, and the sweep would measure nothing", lb.got("max_wall").span,
                  "raise max_wall to at least warmup + duration (a bisection takes a few probes)")
    return dataclasses.replace(load, search=lb["search"], step=lb["step"], rate_step=lb["rate_step"], max_wall_s=lb["max_wall"])


def _misplaced(ctx: Ctx, lb: Body, keys: tuple[str, ...], why: str) -> None:
    for key in keys:
        if lb.has(key):
            ctx.error("E403", f"'{key}' {why}", lb.got(key).key_span)


def _check_levels(ctx: Ctx, lb: Body, load: S.Load) -> None:
    levels = load.levels
    key = "rate" if load.mode == "open" else "concurrency"
    if len(set(levels)) != len(levels):
        ctx.warn("W504", "the same load level is listed twice", _repeated_level(lb, key, levels))
    if levels and max(levels) > MAX_LOAD_LEVEL and lb.ok(key):
        what = "requests/s" if load.mode == "open" else "workers"
        ctx.error("E204", f"'{key}' is more than {MAX_LOAD_LEVEL:,} {what}", lb.got(key).span)


def _repeated_level(lb: Body, key: str, levels: tuple[int | float, ...]) -> Span:
    """Where a level list first repeats itself: the item equal to an earlier one (`[4, 8, 4]`:
    the second 4; `[1rps, 60rpm]` compares the converted rates), else the load block."""
    node = lb.got(key).node if lb.ok(key) else None
    if isinstance(node, A.List) and len(node.items) == len(levels):
        seen: set[int | float] = set()
        for item, level in zip(node.items, levels):
            if level in seen:
                return item.span
            seen.add(level)
    return lb.span


def _check_timing(ctx: Ctx, b: Body, load: S.Load) -> None:
    duration, bucket = b["duration"], b["bucket"]
    if duration is not None and load.mode == "open" and load.rates and min(load.rates) * duration < 1:
        d = b.got("duration")
        ctx.warn("W508", f"at {min(load.rates):g} rps for {value_text(d.node)} a level expects fewer than one request", d.span)
    if duration is None or bucket is None:
        return
    bg, dg = b.got("bucket"), b.got("duration")
    if bucket > duration + 1e-9:
        ctx.error(
            "E401",
            f"bucket ({value_text(bg.node)}) is longer than the duration ({value_text(dg.node)}); a level would have no complete bucket",
            bg.span,
        )
        return
    ratio = duration / bucket
    if ratio > MAX_BUCKETS_PER_LEVEL:
        n = math.ceil(ratio - 1e-9)
        ctx.error("E204", f"bucket ({value_text(bg.node)}) cuts each level into {n} buckets; at most {MAX_BUCKETS_PER_LEVEL} are allowed", bg.span)
    elif abs(ratio - round(ratio)) > 1e-6:
        ctx.warn("W505", "the duration is not a whole number of buckets; the last bucket of each level will be short", bg.span)
    else:
        _empty_buckets(ctx, b, load, duration, bucket)


EMPTY_BUCKET_RISK = 0.01  # W517: warn where a workload's buckets are this likely to hold an empty one


def _constant_empty(rate: float, warmup: float, duration: float, bucket: float, n_req: int | None,
                    least_s: float | None = None) -> tuple[int, int]:
    """(empty buckets, buckets) of a constant-arrival level, exactly as the runner places them
    (`arrivals.constant_counts`: arrival i at i / rate after the level's start, bucket j from
    warmup + j x bucket, decided in exact arithmetic, not by the run clock's floats). A level
    ended by its count lists buckets up to the one holding its N-th measured arrival, which
    ends at the drain: none after it, and that one is not empty. With `min_duration` (`least_s`)
    it sends on until that has passed too: its last arrival is the later of the two."""
    n = windows.count(duration, bucket)
    counts = constant_counts(rate, warmup, duration, bucket, n)
    if n_req is not None:
        nth = constant_nth(rate, warmup, n_req) - rational(warmup)  # after the warmup
        if least_s is not None and nth < rational(least_s):  # the last arrival before the minimum's end
            r = rational(rate)  # arrivals before it: those at (ceil(warmup r) + k) / r < warmup + least_s
            before = math.ceil((rational(warmup) + rational(least_s)) * r) - math.ceil(rational(warmup) * r)
            nth = max(nth, constant_nth(rate, warmup, before) - rational(warmup))
        if nth < rational(duration):
            counts = counts[: min(math.floor(nth / rational(bucket)), n - 1) + 1]
    return sum(1 for c in counts if c == 0), len(counts)


def _empty_buckets(ctx: Ctx, b: Body, load: S.Load, duration: float, bucket: float) -> None:
    """W517: an open loop whose buckets expect so few arrivals that some will hold none. A bucket
    without a completed request measured nothing, and the built-in `min_samples` makes the run
    INCONCLUSIVE for it (judge/validity.py `_level_samples`): a verdict the spec decided before
    anything ran, found only after the whole soak (0.05 rps in 60 s buckets: 5 % of a day's 1,440
    buckets empty). Constant arrivals are counted exactly; Poisson ones estimated, a bucket of
    length L at rate r empty with probability exp(-r L), the workload warned where some bucket of
    its levels is empty with probability EMPTY_BUCKET_RISK or more (the seed then fixes which).
    Gamma arrivals burstier than Poisson (`burstiness` < 1) leave more buckets empty than that
    (a lower bound, said so); more even ones (> 1) fewer, not estimated. A level with
    `requests_per_level` lists buckets up to its N-th arrival (about N / rate). Phases, ramps,
    a replay and a sweep are not estimated; W508 covers a level that expects no request at all."""
    if load.mode != "open" or load.phases or load.replay is not None or load.search is not None or not load.rates:
        return
    poisson = load.arrival == "poisson"
    if (poisson and load.burstiness > 1.0) or min(load.rates) * duration < 1:
        return
    warmup = _warmup_seconds(b)  # a counted warmup's: 0, the measured schedule starts afresh at its end
    n_req, least_s = load.requests_per_level, load.min_duration_s
    none_empty, expected, buckets, worst = 1.0, 0.0, 0, None
    for rate in sorted(set(load.rates)):
        span = windows.counted_span(duration, rate, n_req, least_s)
        if poisson:
            lengths = windows.lengths(span, bucket)
            for length in lengths:
                p = math.exp(-rate * length)
                none_empty *= 1.0 - p
                expected += p
            buckets += len(lengths)
        else:
            empty, n = _constant_empty(rate, warmup, duration, bucket, n_req, least_s)
            if empty and worst is None:
                worst = (rate, empty, n)
    bg = b.got("bucket")
    if not poisson:
        if worst is None:
            return
        rate, empty, n = worst
        ctx.warn("W517", f"at {rate:g} rps (constant arrivals, one every {format_duration(1 / rate)}) {empty} of a level's "
                         f"{n} buckets of {value_text(bg.node)} get no arrival: a bucket with no completed request leaves "
                         "min_samples INCONCLUSIVE", bg.span,
                 f"set bucket to at least {format_duration(1 / rate)} (an arrival in each), or raise the rate")
        return
    risk = 1.0 - none_empty
    if risk < EMPTY_BUCKET_RISK:
        return
    rate = min(load.rates)
    p = math.exp(-rate * bucket)
    least = "at least " if load.burstiness < 1.0 else ""
    what = "Poisson" if load.burstiness == 1.0 else f"gamma, burstiness {load.burstiness:g}: burstier than Poisson"
    # a bucket long enough that, over as many buckets as now, one is empty with under 1 % probability
    enough = math.log(100.0 * max(buckets, 1)) / rate
    ctx.warn("W517", f"at {rate:g} rps a {value_text(bg.node)} bucket gets no arrival with probability {least}{p:.2g} "
                     f"({what}): {least}{expected:.2g} of the workload's {buckets:,} buckets are expected empty (some "
                     f"bucket with probability {least}{risk:.0%}), and a bucket with no completed request leaves "
                     "min_samples INCONCLUSIVE (the seed decides which)", bg.span,
             f"set bucket to at least {format_duration(enough)}, raise the rate, or use arrival = constant "
             f"(a bucket longer than {format_duration(1 / rate)} then always holds one)")


def load_time_s(w: S.Workload) -> float:
    """The planned load time of one workload on one backend: every level's warmup + duration
    (phases: their durations and one warmup, before the first)."""
    if w.load.phases:
        return w.warmup_s + w.duration_s
    """The planned load time of one workload on one backend: every level's warmup + duration."""
    if w.load.search is not None and w.load.max_wall_s is not None:
        return w.load.max_wall_s  # a sweep probes levels until its wall-time bound at most
    return len(w.load.levels) * (w.warmup_s + w.duration_s)


def check_total_load(ctx: Ctx, workloads: list[S.Workload], n_backends: int, parallel: bool) -> None:
    """The run's planned load time (what `plan` calls the wall time without startup and drains):
    every backend runs every workload, one after another unless `parallel = true`. Above
    MAX_TOTAL_LOAD_S it is an error, reported at the workload that contributes most."""
    if not workloads or n_backends == 0:
        return
    sweeps = [w for w in workloads if w.load.search is not None]
    if sweeps and len(workloads) > 1:  # the search's verdict is one level's; other workloads would need their own
        ctx.error("E403", f"workload '{sweeps[0].name}' is a sweep: a spec with a sweep has that one workload", sweeps[0].span)
    elif sweeps and n_backends > 1:  # each backend would find its own level; judge them one spec each
        ctx.error("E403", f"workload '{sweeps[0].name}' is a sweep: a spec with a sweep has one backend", sweeps[0].span)
    per_backend = sum(load_time_s(w) for w in workloads)
    total = per_backend * (1 if parallel else n_backends)
    if total <= MAX_TOTAL_LOAD_S:
        return
    worst = max(workloads, key=load_time_s)
    times = "" if parallel or n_backends == 1 else f" × {n_backends} backends one after another"
    ctx.error(
        "E418",
        f"the spec plans {format_duration(total)} of load in all ({format_duration(per_backend)} per backend{times}); "
        f"at most {MAX_TOTAL_LOAD_S / 86400:g} days ({format_duration(MAX_TOTAL_LOAD_S)}) are allowed",
        worst.span,
        f"workload '{worst.name}' alone plans {format_duration(load_time_s(worst))} per backend "
        f"({len(worst.load.levels)} levels × {format_duration(worst.warmup_s + worst.duration_s)}); "
        "shorten the duration, drop levels, or split the soak into several specs",
    )
