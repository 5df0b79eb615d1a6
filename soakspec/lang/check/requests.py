"""What a workload's requests carry besides the load: its prompt file (read and parsed here, so a
malformed file fails `check` at its own line), extra body fields and extra HTTP headers."""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import soakspec.windows as windows
from soakspec.diagnostics import Span
from soakspec.lang import ast as A
from soakspec.lang import spec as S
from soakspec.lang.batches import batch_rate, batch_requests
from soakspec.lang.check.core import Ctx, describe
from soakspec.lang.check.walk import Body
from soakspec.lang.datasets import DatasetError, read_dataset

# Body fields soakspec itself sets: overriding them would make the evidence lie about what was sent.
RESERVED_BODY = {
    "model": "the model block's served_name / id",
    "prompt": "the workload's prompt_words or prompt_file",
    "messages": "the workload's prompt_words or prompt_file",
    "max_tokens": "the workload's max_tokens",
    "stream": "the workload's stream",
    "stream_options": "soakspec (it needs usage in the stream)",
    "request_id": "soakspec (it matches server traces by it)",
    "temperature": "the sampling block",
    "top_p": "the sampling block",
    "top_k": "the sampling block",
    "seed": "the sampling block",
    "ignore_eos": "the workload's ignore_eos",
}
RESERVED_HEADERS = ("host", "content-length", "content-type", "accept", "connection", "transfer-encoding", "x-request-id")
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_HEADER = re.compile(r"(authorization|cookie|token|secret|api[-_]?key|password)", re.I)
MAX_BODY_DEPTH = 8


def data_path(ctx: Ctx, written: str) -> str:
    """A relative data file is relative to the spec's directory, the real file's when the spec
    is reached through a symlink: as `plan.spec_dir` resolves every other path of the spec."""
    if os.path.isabs(written):
        return written
    base = os.path.dirname(os.path.realpath(ctx.path)) if os.path.exists(ctx.path) else os.getcwd()
    return os.path.join(base, written)


def dataset(ctx: Ctx, b: Body, endpoint: str, where: str, name: str = "") -> S.Dataset | None:
    """Read the prompt file once (bounded); every problem is reported in the file, at its line,
    with the spec's `prompt_file` as the place that named it. For a finished run's embedded
    spec (`ctx.data_optional`) see `_run_dataset`."""
    fmt, lengths, turns = b["prompt_format"], b["max_tokens_from_file"], b["multi_turn"]
    if b["prompt_file"] is None:
        for key in ("prompt_format", "max_tokens_from_file", "multi_turn", "prompt_order"):
            if b.has(key) and (key in ("prompt_format", "prompt_order") or b[key]):
                hint = ("generated prompts (prompt_words, prompt_tokens) already differ per request and follow no file's order; "
                        "to send a file's prompts in a seeded random order, set prompt_file too") if key == "prompt_order" else None
                ctx.error("E403", f"'{key}' describes a prompt file; {where} sets no 'prompt_file'", b.got(key).key_span, hint)
        return None
    if b.has("prompt_format") and not b.ok("prompt_format"):
        return None
    got = b.got("prompt_file")
    path = data_path(ctx, got.value)
    read = functools.partial(read_dataset, fmt=fmt, chat=endpoint == "chat", lengths=lengths, turns=turns and endpoint == "chat")
    if ctx.data_optional:
        return _run_dataset(ctx, got, path, read, ctx.data_files.get("prompt", {}).get(name))
    try:
        parsed = read(path)
    except DatasetError as e:
        saved, ctx.path = ctx.path, path
        try:
            ctx.error("E419", f"prompt file {e.message}", Span(e.line, e.column, e.line, e.column + 1),
                      f"named by 'prompt_file' at {saved}:{got.span.line}:{got.span.column}")  # fmt: skip
        finally:
            ctx.path = saved
        ctx.error("E419", f"the prompt file {got.value!r} cannot be used (see {path}:{e.line})", got.span)
        return None
    if parsed.skipped:
        line, column = parsed.first_skipped or (1, 1)
        ctx.warn("W510", f"{parsed.skipped:,} of {parsed.skipped + len(parsed.prompts):,} records in the prompt file {got.value!r} "
                         f"are skipped: no human turn to send (the first at {path}:{line}:{column})", got.span,
                 "a ShareGPT record is sent from its first turn, a non-empty human one after an optional system turn; "
                 "an empty conversation or one that starts with another speaker has none")  # fmt: skip
    return _dataset(path, parsed)


def _dataset(path: str, parsed: Any) -> S.Dataset:
    return S.Dataset(path, parsed.format, parsed.sha256, parsed.prompts, parsed.output_lens, parsed.conversations)


def run_file(path: str, recorded: Any, read: Callable[[str], Any], errors: type[Exception]) -> tuple[Any, str, str]:
    """A data file of a finished run's embedded spec: looked for where the spec names it (from
    here: `path`) and where the manifest recorded it (`recorded`: path and sha256, from
    `evidence.manifest.recorded_data_files`), and taken only when its bytes are the ones the
    run read -- never another file that happens to lie there. Returns `(read(place), place, "")`,
    or `(None, "", why not)` ("is not at X or Y", "at X is not the file the run read (...)").
    `errors`: what `read` raises for a file it cannot use (its `.message` said)."""
    want = recorded.get("sha256") if isinstance(recorded, Mapping) else None
    places = [path] + ([recorded["path"]] if isinstance(recorded, Mapping) and isinstance(recorded.get("path"), str)
                       and recorded["path"] != path else [])
    why = f"is not at {' or '.join(places)}"
    for place in places:
        if not os.path.isfile(place):
            continue
        try:
            parsed = read(place)
        except errors as e:
            why = f"at {place} cannot be read ({getattr(e, 'message', e)})"
            continue
        if want is not None and parsed.sha256 != want:
            why = f"at {place} is not the file the run read (sha256 {parsed.sha256[:12]}, the run's {str(want)[:12]})"
            continue
        return parsed, place, ""
    return None, "", why


def _run_dataset(ctx: Ctx, got: Any, path: str, read: Callable[[str], Any], recorded: Any) -> S.Dataset | None:
    """The prompt file of a finished run's embedded spec, checked to judge its evidence
    (`run_file`). Found nowhere: W513 and no dataset -- the evidence is judged without it (what
    a run sent is in its records; only max_tokens_from_file's bound on a response's tokens is
    then unknown)."""
    parsed, place, why = run_file(path, recorded, read, DatasetError)
    if parsed is not None:
        return _dataset(place, parsed)
    ctx.warn("W513", f"the prompt file {got.value!r} {why}: the run's evidence is judged without it "
                     f"(its records say what was sent; bounds from max_tokens_from_file are unknown)", got.span,
             "pass --spec FILE (the spec beside the file the run read) to judge with it")
    return None


def requests_per_second(load: S.Load, x: float, latency_s: float | None) -> float | None:
    """Requests a second a level of `load` sends at load `x` (a rate, or workers), with requests
    taking `latency_s` each: an open loop its rate; a closed loop its workers over the latency;
    batches of `requests` (else x) from x workers, a batch every ceil(requests / x) latencies.
    None where that needs a latency and there is none. W509 (`gate._planned`) and W511
    (`planned_level_requests`) both count a level's requests by it."""
    if load.mode == "open":
        return x
    if not latency_s or latency_s <= 0:
        return None
    if x <= 0:
        return 0.0
    if load.mode == "batch":
        return batch_rate(x, load.requests or x, latency_s)
    return x / latency_s


def planned_level_requests(w: S.Workload) -> tuple[str, float] | None:
    """(level label, requests) of the level of `w` planned to send the most requests, its
    warmup's included (a request's prompt is its index in its level, warmup included): open
    loop rate x (warmup + duration), a phase its mean rate x its duration; batch the requests
    its batches' waves start in the level at expected_latency (`lang/batches.py`; else one
    batch, at least); closed loop concurrency x (warmup + duration) / `expected_latency`, else its
    concurrency (the first requests at least). A level with `requests_per_level = N` sends its
    warmup's requests and then N (its duration only bounds it), not rate x duration. A counted
    warmup (`warmup = N requests`) is its N, before the level's. None: nothing planned (a
    replay sends no file)."""
    load, length = w.load, w.warmup_s + w.duration_s
    found: list[tuple[str, float]] = []
    if load.replay is not None:
        return None
    lat = w.expected_latency_s

    count = load.requests_per_level

    def n(x: float, span: float, least: float) -> float:  # requests in `span` at load x; `least` without a latency
        rate = requests_per_second(load, x, lat)
        if rate is None:
            return least if count is None else min(least, count)
        if count is None:
            return rate * span
        # a counted level: its warmup's requests, then N measured (fewer where its duration ends it first)
        # (with min_duration: until that has passed too, `windows.counted_span`)
        return rate * w.warmup_s + (rate * windows.counted_span(w.duration_s, rate, count, load.min_duration_s) if rate > 0 else 0.0)

    if load.phases:
        for i, ph in enumerate(load.phases):
            mean = (ph.start + (ph.end if ph.end is not None else ph.start)) / 2
            span = ph.duration_s + (w.warmup_s if i == 0 else 0.0)
            label = f"phase {ph.name} at {mean:g} rps" if load.mode == "open" else f"phase {ph.name} at concurrency {ph.peak:g}"
            found.append((label, n(mean, span, ph.peak)))
    elif load.mode == "open":
        found = [(f"{r:g} rps", n(r, length, r)) for r in load.rates]
    elif load.mode == "batch":  # batches repeat until the level ends: the waves its batches start in it
        found = [(f"concurrency {c}, batches of {load.requests or c}",
                  float(batch_requests(c, load.requests or c, lat, 0.0, length) if lat else load.requests or c))
                 for c in load.concurrency]
    else:
        found = [(f"concurrency {c}", n(c, length, float(c))) for c in load.concurrency]
    warm = w.warmup_requests or 0  # a counted warmup's requests come first (their prompts are 0..N-1)
    return max(((label, k + warm) for label, k in found), key=lambda f: f[1]) if found else None


def repeated_prompts(ctx: Ctx, w: S.Workload, span: Span) -> None:
    """W511: a level that plans more requests than the prompt file holds sends its prompts again
    (they cycle, in order): a server's prefix cache serves a repeat whole, so its TTFT reads lower
    than on prompts it has not seen (`vllm bench serve` warns as it oversamples). Multi-turn
    sessions count the file's user turns: each turn repeats its own history by design, but a
    level with more turns than the file holds runs its conversations again, each turn whole."""
    d = w.dataset
    if d is None or not d.prompts:
        return
    if w.multi_turn and d.conversations and _sessions_share_conversations(ctx, w, span):
        return
    if w.multi_turn and d.conversations:
        have = sum(1 for conv in d.conversations for role, _ in conv if role == "user")
        holds, what, first = f"{have:,} turns in {len(d.conversations):,} conversations", "turns", "conversation"
    else:
        have, first = len(d.prompts), "prompt"
        holds, what = f"{have:,} prompts", "prompts"
    most = planned_level_requests(w)
    if most is None or most[1] <= have:
        return
    label, n = most
    amount = f"about {n:,.0f}" if w.load.mode == "open" or w.expected_latency_s else f"at least {n:,.0f}"
    repeats = "" if w.multi_turn else ", and the manifest records each level's repeats (prompt_repeats)"
    ctx.warn("W511", f"workload '{w.name}' plans {amount} requests in a level ({label}, warmup included) "
                     f"but its prompt file {w.prompt_file!r} holds {holds}: they cycle, each sent about "
                     f"{n / have:,.1f} times, and a server's prefix cache serves the repeats (TTFT reads lower than on unseen prompts)",
             span, f"use a file with more {what}, or fewer requests per level; every level starts again at the file's first {first}"
                   f"{repeats}")  # fmt: skip


def _sessions_share_conversations(ctx: Ctx, w: S.Workload, span: Span) -> bool:
    """W511: more sessions than conversations (a level's concurrency above the file's count):
    from the level's start, session k runs conversation k mod N, so two sessions send the same
    turns side by side -- the second served from the prefix cache the first just filled, or
    both batched as one prefill -- however few requests the level plans."""
    convs = len(w.dataset.conversations) if w.dataset is not None else 0
    sessions = int(max(w.load.levels, default=0))
    if not convs or sessions <= convs:
        return False
    ctx.warn("W511", f"workload '{w.name}' runs up to {sessions:,} multi-turn sessions at once but its prompt file "
                     f"{w.prompt_file!r} holds {convs:,} conversations: each session past the {convs:,}th runs a conversation another "
                     "session is running, sending the same turns at the same time (a server's prefix cache serves the second; "
                     "TTFT reads lower than on unseen turns)",
             span, "use a file with at least as many conversations as sessions, or a lower concurrency")  # fmt: skip
    return True


def unalternating_turns(ctx: Ctx, w: S.Workload, span: Span) -> None:
    """W512: a multi-turn conversation whose turns do not alternate user and assistant (after an
    optional system turn first) is sent as its history is; a chat template that requires
    alternation rejects every turn sent after the break (HTTP 400)."""
    d = w.dataset
    if d is None or not w.multi_turn or not d.conversations:
        return
    bad, first = 0, None
    for k, conv in enumerate(d.conversations, 1):
        turns = conv[1:] if conv and conv[0][0] == "system" else conv
        at = next((i for i, (role, _) in enumerate(turns) if role != ("user", "assistant")[i % 2]), None)
        if at is not None:
            bad += 1
            if first is None:
                prev = f"after '{turns[at - 1][0]}'" if at else "first"
                first = f"conversation {k:,}, turn {at + 1 + len(conv) - len(turns)}: '{turns[at][0]}' {prev}"
    if bad:
        ctx.warn("W512", f"{bad:,} of {len(d.conversations):,} conversations in the prompt file {w.prompt_file!r} do not alternate "
                         f"user and assistant turns (the first: {first}): each is sent as its history is, and a chat template "
                         "that requires alternation (as Llama 2's, Mistral's and Gemma's do) rejects every turn sent after the break (HTTP 400)",
                 span, "vLLM's benchmarks/multi_turn/convert_sharegpt_to_openai.py drops such conversations; "
                       "a template without that rule takes them")  # fmt: skip


def check_multi_turn(ctx: Ctx, b: Body, endpoint: str, load: S.Load, where: str) -> None:
    """Multi-turn sessions are chat conversations driven by closed-loop workers (one session each)."""
    if not b["multi_turn"] or b["prompt_file"] is None:
        return
    span = b.got("multi_turn").key_span
    if endpoint != "chat":
        ctx.error("E403", f"'multi_turn' sends chat conversations; {where} needs endpoint = chat", span)
    if load.mode != "closed":
        ctx.error("E403", f"'multi_turn' sessions need closed-loop load (each worker is one session), not mode = {load.mode}", span)
    if b["max_tokens_from_file"]:
        ctx.error("E403", "'multi_turn' and 'max_tokens_from_file' do not combine (each turn's answer is the file's)", b.got("max_tokens_from_file").key_span)


def body_json(ctx: Ctx, b: Body, where: str) -> str | None:
    blk = b.blocks.get("body")
    if blk is None:
        return None
    obj = _object(ctx, blk, f"the body of {where}", 0)
    for key in obj:
        if key in RESERVED_BODY:
            span = next(s.key_span if isinstance(s, A.Attribute) else s.kind_span
                        for s in blk.body if isinstance(s, A.Attribute | A.Block) and _name(s) == key)  # fmt: skip
            ctx.error("E420", f"body field '{key}' is set by soakspec itself; use {RESERVED_BODY[key]}", span)
    if "n" in obj and not (type(obj["n"]) is int and obj["n"] == 1):
        # the runner fails every such request (runner/protocol.py "One choice a request"): say it now
        span = next(s.key_span if isinstance(s, A.Attribute) else s.kind_span
                    for s in blk.body if isinstance(s, A.Attribute | A.Block) and _name(s) == "n")  # fmt: skip
        ctx.error("E424", f"body field 'n' = {json.dumps(obj['n'])[:20]} asks for several answers a request; "
                          "soakspec measures one answer a request", span,
                  "remove it (the server's default is n = 1); for more load, raise the concurrency or the rate")
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if obj else None


def _name(s: A.Attribute | A.Block) -> str:
    return s.key if isinstance(s, A.Attribute) else s.kind


def _object(ctx: Ctx, blk: A.Block, where: str, depth: int) -> dict[str, object]:
    if depth >= MAX_BODY_DEPTH:
        ctx.error("E204", f"{where} nests more than {MAX_BODY_DEPTH} objects deep", blk.kind_span)
        return {}
    out: dict[str, object] = {}
    for s in blk.body:
        if not isinstance(s, A.Attribute | A.Block):
            ctx.error("E108", f"{where} holds only fields (key = value) and objects (key {{ ... }})", s.span)
            continue
        key = _name(s)
        if key in out:
            ctx.error("E102", f"duplicate field '{key}' in {where}", s.key_span if isinstance(s, A.Attribute) else s.kind_span)
            continue
        if isinstance(s, A.Block):
            if s.label is not None:
                ctx.error("E107", f"object '{key}' takes no name", s.label.span)
            out[key] = _object(ctx, s, f"'{key}' of {where}", depth + 1)
        else:
            value = _json_value(ctx, key, s.value)
            if value is not _BAD:
                out[key] = value
    return out


_BAD = object()


def _json_value(ctx: Ctx, key: str, v: A.Value) -> object:
    if isinstance(v, A.Str | A.Num | A.Bool):
        return v.value
    if isinstance(v, A.Word) and v.name == "null":
        return None
    if isinstance(v, A.List):
        items = [_json_value(ctx, key, i) for i in v.items]
        return _BAD if any(i is _BAD for i in items) else items
    ctx.error("E104", f"body field '{key}' must be a string, number, true/false, null or a list, not {describe(v)}", v.span)
    return _BAD


def headers(ctx: Ctx, b: Body, where: str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """(headers, header_env): plain values, and values read at run time from named env variables."""
    plain = _header_block(ctx, b.blocks.get("headers"), where, env=False)
    env = _header_block(ctx, b.blocks.get("header_env"), where, env=True)
    both = {k.lower() for k, _ in plain} & {k.lower() for k, _ in env}
    for name in sorted(both):
        ctx.error("E403", f"header '{name}' is set both in headers and in header_env", b.blocks["header_env"].kind_span)
    return plain, env


def _header_block(ctx: Ctx, blk: A.Block | None, where: str, env: bool) -> tuple[tuple[str, str], ...]:
    if blk is None:
        return ()
    what = "header_env" if env else "headers"
    if blk.label is not None:
        ctx.error("E107", f"'{what}' takes no name", blk.label.span)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for s in blk.body:
        if not isinstance(s, A.Attribute):
            ctx.error("E108", f"the {what} of {where} holds only Header-Name = \"value\" lines", s.span)
            continue
        if s.key.lower() in seen:
            ctx.error("E102", f"duplicate header '{s.key}' in the {what} of {where}", s.key_span)
            continue
        seen.add(s.key.lower())
        if not _HEADER_NAME.fullmatch(s.key) or s.key.lower() in RESERVED_HEADERS:
            why = "is set by soakspec itself" if s.key.lower() in RESERVED_HEADERS else "is not a valid HTTP header name"
            ctx.error("E420", f"header '{s.key}' {why}", s.key_span)
            continue
        if not isinstance(s.value, A.Str):
            ctx.error("E104", f"header '{s.key}' must be a string, not {describe(s.value)}", s.value.span)
            continue
        value = s.value.value
        if env and not _ENV_NAME.fullmatch(value):
            ctx.error("E411", f"header_env '{s.key}' names an environment variable (the value itself is never written in a spec)", s.value.span)
            continue
        if not env and any(c in value for c in "\r\n\0"):
            ctx.error("E104", f"header '{s.key}' may not contain a line break or NUL", s.value.span)
            continue
        if not env and _SECRET_HEADER.search(s.key):
            ctx.error("E421", f"header '{s.key}' looks like a secret, which a spec never holds",
                      s.key_span, f'put its value in an environment variable and write: header_env {{ {s.key} = "MY_ENV_VAR" }}')  # fmt: skip
            continue
        out.append((s.key, value))
    return tuple(out)
