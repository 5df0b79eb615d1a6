"""The OpenAI-compatible request protocol, without I/O: bodies, SSE parsing, metrics, outcomes.

Both HTTP clients (`h11client`, `httpxclient`) only move bytes and report transport events;
everything that decides what a response *means* lives here, once, so the two clients produce
identical records for identical server behaviour:

    build_body(shape, request_id) -> bytes            the request
    StreamAccumulator(shape)                           one per request
        .on_response(status, content_type, encoding)   the response head arrived
        .on_body(data, t) -> keep_reading              body bytes (SSE parsed incrementally)
        .on_end(t)                                     the body is complete
        .fail(outcome, message)                        a transport failure or the deadline
        .connection_closed()                           the peer closed the connection early
        .finish(record, end)                           classify and fill the RequestRecord

Measurement rules (the record's contract):

* TTFT ends at the first token: the first event carrying non-empty text (`choices[0].text`,
  chat `choices[0].delta.content`) -- or, with usage on every chunk, an earlier event whose
  `usage.completion_tokens` rose (a token that decoded to no text, reasoning in a field this
  reader does not know): the server's count says a token arrived then. Role-only and empty
  chunks whose count did not rise do not count. A reasoning model's
  thinking is output text: a chat chunk's text is its `delta.reasoning` (else
  `delta.reasoning_content`: servers that send both send the same text, counted once) followed
  by its `delta.content`, then the `function.name` and `function.arguments` of its
  `delta.tool_calls` (a tool call's tokens are the model's output, streamed there instead of in
  `content`; vLLM's and SGLang's tool parsers), so a reasoning or tool-call chunk is a token
  event like any other (TTFT, ITL, `chunks`), and `output_chars`, `output_sha256` and
  `empty_text` cover that text too (the tokens the server's usage counts); a non-streaming
  `message` is read the same way. A response without
  any text but with completion tokens (see "Outcomes") has its TTFT at its first token event:
  the first event whose `usage.completion_tokens` is >= 1 -- if the usage is per chunk. When a
  chunk of empty text came without usage, the tokens' arrival times are unknown (the count only
  says how many came by the event that reports it): no first token, no ITL, no TPOT (none, which
  the judge leaves out with the reason), never the usage event's time (an upper bound) nor 0.
  A choice whose text is absent (chat `delta` without `content` or with `content: null`, as in
  a role-only chunk or a `tool_calls` delta without a name or arguments; a completion choice
  without `text`) is such a chunk of empty text: a stream of them with usage only in its final
  usage chunk has no TTFT (excluded, saying why), not the stream's end. A chunk without any choice (a
  usage-only chunk, `choices: []`) carries no text at all and says nothing of that.
* Tokens, not chunks. With cumulative `usage.completion_tokens` on every text chunk
  (`continuous_usage_stats`), a chunk's tokens are the delta (`itl_source = "usage"`), and a
  text-less chunk that raises the count is a token arrival of its own, before the first text
  chunk (then the first token, see TTFT) or after it (e.g. the EOS token with
  `finish_reason: stop`); a count that a later chunk's goes below is `usage_decreased`.
  A text chunk whose cumulative count is 0 contradicts its own text (a server that puts
  `completion_tokens: 0` on every chunk and the real count only in its final usage): its usage
  is not per chunk, and the stream is read as one without continuous usage -- never as one
  chunk of all N tokens, which collapsed its ITL into one whole-stream gap.
  Otherwise, with only a final usage of N tokens over C text chunks: one token per chunk when
  N == C (`"exact"`), else N spread evenly over the chunks (`"estimated"`). Without any usage,
  every text chunk is one token (`tokens_source = itl_source = "counted"`).
* ITL: a chunk carrying k tokens, arriving `gap` after the previous token-bearing chunk, adds k
  gaps of gap/k; the first chunk's tokens add none. So `sum(itl) == last_token - first_token` and
  `len(itl) == output_tokens - tokens_in_first_chunk`, with one exception: a chunk is split only
  within the bound on a response's tokens (evidence/record.py `usage_bound`, the same bound the
  judge flags `usage_mismatch` by). That bound is the request's max_tokens: no response has
  more completion tokens, however many the server puts in one chunk (SGLang's and vLLM's
  `--stream-interval 32` send 32 a chunk: such a chunk is split into 32 gaps). A chunk that
  takes the tokens counted so far (the first chunk's k1 and every later chunk's k, as split)
  past max_tokens is not split -- it adds one gap, its whole gap, as a chunk without usage
  would; so is every chunk after it. Only a request without a max_tokens (<= 0) falls back to a
  fixed bound per chunk: a chunk of k > `MAX_TOKENS_PER_CHUNK` adds one gap. A count past the
  bound is not one the judge computes ITL from (it flags the request `usage_mismatch`: more
  than max_tokens, or without one more than the fixed bound per text chunk, and then pools
  none of its gaps), so the record keeps each such chunk's one real measurement, the work is
  bounded whatever the server claims -- at most max_tokens split gaps plus one a chunk (a usage
  of 10^12 once expanded to 10^12 gaps), the work a legitimate response of max_tokens costs --
  and `output_tokens` still says the claimed count, for the judge to flag. `sum(itl)` is
  unchanged.
  TPOT = (last token - first token) / (N - k1), k1 the tokens of the first token event (chunk;
  per the usage when present), for every request with N >= 2 tokens and N > k1: the mean of its
  ITL gaps (but for the exception above), so a first chunk of several tokens does not deflate it
  (AIPerf PR #1279: an `N - 1` denominator does). When the first chunk carried all N > 1 tokens,
  TPOT is none (the judge leaves the request out, saying why). Whatever the read pattern: chunks
  after the first are token events even when one read brought them with it, so a request whose
  tokens all arrived in one read has TPOT 0 (not none), and the fastest requests are not left
  out of TPOT (a selection bias towards slow ones). A non-streaming response has no token times:
  no ITL, no TPOT.
* Coalescing is counted, not hidden: `coalesced` is the number of the request's ITL gaps that
  are not independent samples -- a token whose arrival stamp equals the previous token's (the
  same read: a gap of 0), and the k - 1 shares of a chunk's gap split over its k tokens (all k
  when that chunk came in the previous token's read). A chunk of k tokens still adds k gaps.
* `usage_decreased`: a cumulative usage.completion_tokens below one seen earlier in the same
  stream (a server bug; the judge counts the request as usage_mismatch).
* One clock per record. Every time of a request is on the run clock (`clock.RunClock`), and
  every *arrival* is the same kind of stamp: `first_byte`, each token event and `end` are the
  arrival time of the bytes that carried them (`on_body(data, t)`, `on_end(t)`: the h11 client
  passes the kernel's receive stamp of the read, SO_TIMESTAMPNS converted to the run clock; the
  httpx reference client, which has no kernel stamps, its own `now()` at the read). `start` is
  the run clock when the client begins the request (before connecting and sending: nothing is
  processed in between). So a whole response ends at the arrival of its last bytes, not when
  the client got round to processing them, and `latency - ttft` is the server's time between
  the first token and the last bytes. The processing delay after that is the client's, recorded
  apart as `client_delay` (`finish`'s `end` minus the last bytes' stamp); a request that did not
  end with a whole response (a failure, the deadline) ends when the client saw it end.
  Why kernel stamps: a busy client reads late, and a user-space stamp at the read charges that
  lateness to the server (38-81 % of ITL samples were 0 ms and TTFT p95 grew 17x on a loaded
  machine); the kernel stamps when the bytes arrived, however late the loop reads them.
* One choice a request. The record measures one answer: a chunk with a choice whose `index` is
  not 0, or with several choices (a body with `n` > 1: vLLM and SGLang interleave the choices'
  chunks, each its own index, and count every choice's tokens in the final usage -- read as one
  answer, its TPOT was the real one over n), fails the request, saying so ("the response has
  more than one choice (index 1)"). A choice without `index` is choice 0.
* Outcomes: see `records.Outcome`. The first failure wins, outcome and message. The server's
  own word decides completion: a 200 that ends with `[DONE]` (a stream), carries no error
  event or payload and no failing finish_reason -- "error", or "abort" (vLLM's and SGLang's
  reason for a request the engine dropped: its text is cut short), `FAILED_FINISH_REASONS` in
  evidence/record.py, shared with the judge -- and shows >= 1 completion token (its usage,
  or its counted text events) is COMPLETED even when its tokens decode to empty text (special
  tokens, partial UTF-8): such a record has `empty_text = true`, and its tokens, ITL and TPOT
  come from the events whose usage rose (textless token events). 0 completion tokens is a
  failure ("0 completion tokens and no text"; "usage says 0 completion tokens for N text
  chunks"). Messages say what happened: "HTTP 500: <the server's body>", "error event: <its
  text>", "finish_reason: error", "finish_reason: abort", "HTTP 200 with a JSON body, not a server-sent event
  stream: <the body>" (a stream request answered by a plain JSON document, an error as a rule),
  never a generic label. A usage count that is not one -- a
  `usage.completion_tokens` or `usage.prompt_tokens` below 0 or above `MAX_USAGE` -- fails
  the request ("malformed response: usage.completion_tokens is -5") and is not used: it is the
  server's bug, and recording it would make valid evidence fail its schema (`verify`).
  Decided, not overlooked: a stream that ends without `[DONE]` fails ("stream ended without
  data: [DONE]") even when a chunk carried a finish_reason -- `[DONE]` is the server's word that
  the response is whole (vLLM and SGLang always send it; a usage chunk may follow the finish
  chunk), and the record keeps the finish_reason it saw; a `[DONE]` without any finish_reason
  completes (the server said so). A usage count must be a JSON integer: `3.0` or `"3"` fails as
  a malformed response (the OpenAI schema's integer; the records hold integers). Events named
  other than `message` are ignored, but `event: error`, which fails the request whatever its
  data; `logprobs` and other per-choice fields are not read.
  Both clients ask for the body as sent (`accept-encoding: identity`); a 200 that still comes
  with a Content-Encoding other than identity (gzip, br, ...) fails, naming it ("response body
  in content-encoding 'gzip', which soakspec does not decode ..."), rather than as a stream
  without `[DONE]`: its bytes are read to the end and dropped, never parsed as events.
  The server's text (error bodies and events, finish_reason, its id) is redacted of the run's
  secrets when the record is frozen (`RequestRecord.freeze`, evidence/redact.py).
* Every request that reached the server is on the record: a request whose bytes were sent on
  a connection that then closed or reset without a (complete) response is `disconnected`
  (`CLOSED_BEFORE_RESPONSE` / `CLOSED_MID_RESPONSE`) and is never resent by a client; a
  kept-alive connection closed by the server while idle is found before sending and replaced
  (`h11client`'s docstring), so an idle close is never counted against the server. A connect
  that fails is `disconnected` with `CONNECT_FAILED` ("connect failed: ...").
* The stream is read by the WHATWG rules for server-sent events (`SSEParser`), both paths
  alike: one UTF-8 byte order mark before the first line is dropped (it used to cost the
  stream its first event), CR, LF and CRLF end lines, comments are skipped. One deviation: a
  whole body's last event is taken without the blank line that would end it (`data: [DONE]`
  then EOF completes the request; `SSEParser.close`).
* Memory is bounded: one SSE event or line at most `Limits.max_event_bytes` (else failed, stop
  reading), the whole response at most `Limits.max_response_bytes`; the text itself is never
  kept, only a running SHA-256 and its length in characters.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import hashlib
import json
import json.encoder
import json.scanner
import os
import operator
import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from soakspec.evidence.record import FAILED_FINISH_REASONS, HELD_BACK, MAX_TOKENS_PER_CHUNK, usage_bound
from soakspec.runner.records import ERROR_LIMIT, ItlSource, Outcome, RequestRecord, TokensSource

# --------------------------------------------------------------------------------------------
# Requests


class Endpoint(enum.StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"


ENDPOINT_PATHS: Mapping[Endpoint, str] = {
    Endpoint.COMPLETIONS: "/v1/completions",
    Endpoint.CHAT: "/v1/chat/completions",
}

STREAM_OPTIONS: Mapping[str, bool] = {"include_usage": True, "continuous_usage_stats": True}


@dataclasses.dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters. The default is greedy decoding.

    Greedy is `temperature 0, top_p 1.0` with `top_k` omitted from the body: temperature 0 is
    already argmax everywhere, and omitting top_k (rather than vLLM's `-1`) keeps the body
    valid for servers that reject or mean something else by a negative top_k.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = Sampling()


@dataclasses.dataclass(frozen=True, slots=True)
class RequestShape:
    """What one request asks for; shared by every request of a workload.

    `extra` holds additional body fields as (name, value) pairs (kept hashable); they are
    merged last, so they can override any generated field.
    """

    endpoint: Endpoint
    model: str
    prompt: str
    max_tokens: int
    sampling: Sampling = GREEDY
    ignore_eos: bool = False
    stream: bool = True
    extra: tuple[tuple[str, Any], ...] = ()
    messages: tuple[tuple[str, str], ...] | None = None  # chat: the whole conversation (else one user turn of `prompt`)
    # multi-turn chat: the prompt file's conversation (from 1) and which of its user turns this
    # is (from 1), written into the request's record; None for any other request
    conversation: int | None = None
    turn: int | None = None

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]


# Bodies of one shape differ only in the request id: each shape's body is encoded once around a
# placeholder id, and the id is spliced in (the JSON encoder encodes a string the same anywhere,
# and inside a longer string as its own characters). REQUEST_ID in a prompt is that placeholder
# too: a word prompt starts with its request's id (`load.prompt_words`), so no two requests send
# the same prompt, at no cost per request.
REQUEST_ID = "\x00soakspec-request-id\x00"
_RID_JSON = json.encoder.encode_basestring(REQUEST_ID)[1:-1].encode()  # without its quotes
_TEMPLATES_MAX = 4096
# and at most this many bytes of bodies: token-exact prompts are a new shape per request, so
# 4096 bodies of a 128k-token prompt (~0.7 MB each, and each holding its shape's prompt as
# much again) held gigabytes that were never sent again
_TEMPLATES_BYTES = 64 * 1024 * 1024
_templates: dict[int, tuple[RequestShape, list[bytes]]] = {}  # by id(shape); holds the shape
_held = [0]  # bytes of the bodies in _templates


def build_body(shape: RequestShape, request_id: str) -> bytes:
    """The JSON request body (compact, UTF-8), with `request_id` wherever REQUEST_ID is."""
    t = _templates.get(id(shape))
    if t is None or t[0] is not shape:
        t = (shape, _build_body(shape, REQUEST_ID).split(_RID_JSON))
        size = sum(map(len, t[1]))
        if len(_templates) >= _TEMPLATES_MAX or _held[0] + size > _TEMPLATES_BYTES:
            _templates.clear()
            _held[0] = 0
        if size <= _TEMPLATES_BYTES // 4:  # one body past a quarter of the bound is built each time, not kept
            _templates[id(shape)] = t
            _held[0] += size
    parts = t[1]
    return parts[0] if len(parts) == 1 else json.encoder.encode_basestring(request_id)[1:-1].encode().join(parts)


def _build_body(shape: RequestShape, request_id: str) -> bytes:
    s = shape.sampling
    body: dict[str, Any] = {"model": shape.model}
    if shape.endpoint is Endpoint.CHAT:
        turns = shape.messages or (("user", shape.prompt),)
        body["messages"] = [{"role": role, "content": content} for role, content in turns]
    else:
        body["prompt"] = shape.prompt
    body["max_tokens"] = shape.max_tokens
    body["temperature"] = s.temperature
    body["top_p"] = s.top_p
    if s.top_k is not None:
        body["top_k"] = s.top_k
    body["stream"] = shape.stream
    if shape.stream:
        body["stream_options"] = STREAM_OPTIONS
    body["ignore_eos"] = shape.ignore_eos
    body["request_id"] = request_id
    if s.seed is not None:
        body["seed"] = s.seed
    body.update(shape.extra)
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


# --------------------------------------------------------------------------------------------
# Limits


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Memory bounds for one response. A non-streaming body counts as one event."""

    max_event_bytes: int = 1 << 20
    max_response_bytes: int = 64 << 20


DEFAULT_LIMITS = Limits()

# --------------------------------------------------------------------------------------------
# Server-sent events


class SSEError(ValueError):
    """The byte stream cannot be parsed as server-sent events within the limits.

    `events` are the events the same bytes completed before the error: they were received whole.
    """

    def __init__(self, message: str, events: list[SSEEvent] | None = None) -> None:
        super().__init__(message)
        self.events = events or []


class SSEEvent(NamedTuple):
    event: str  # the `event:` field; "message" when absent
    data: bytes  # the `data:` lines joined with b"\n"


_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark


class SSEParser:
    """Incremental server-sent-events parser (WHATWG rules) over arbitrary chunk boundaries.

    One UTF-8 byte order mark at the very start of the stream is dropped (the standard's
    decoding step; `skip_bom`), wherever the reads cut it. Lines end with LF, CRLF or CR; `:`
    lines are comments; multi-line `data:` fields are joined
    with LF; an event is dispatched at a blank line; an unterminated event at the end of the
    stream is dropped (but see `close`). `id:` and `retry:` are ignored (we never reconnect a stream). One
    deviation: an `event:` line without data still dispatches (with empty data), so that an
    `event: error` is never lost.
    Raises SSEError when a line or an event exceeds `max_event_bytes`.
    """

    __slots__ = ("_tail", "_data", "_size", "_event", "_after_cr", "_max", "_head")

    def __init__(self, max_event_bytes: int = DEFAULT_LIMITS.max_event_bytes) -> None:
        self._tail = b""  # an incomplete line
        self._data: list[bytes] = []  # data lines of the current event
        self._size = 0  # bytes in _data
        self._event: str | None = None
        self._after_cr = False  # the last chunk ended with CR: a leading LF belongs to it
        self._max = max_event_bytes
        self._head: bytes | None = b""  # the stream's first bytes while they may be a BOM; None: past them

    def skip_bom(self, chunk: bytes) -> bytes:
        """`chunk` without the stream's leading BOM, for a reader that takes the stream's bytes
        before `feed` does (`StreamAccumulator`'s fast path): call it on every chunk, first. Past
        the stream's first bytes it returns `chunk` itself; bytes that may yet be a BOM's start
        are held back (b"")."""
        head = self._head
        if head is None or not chunk:
            return chunk
        chunk = head + chunk if head else chunk
        if len(chunk) < 3 and _BOM.startswith(chunk):
            self._head = chunk
            return b""
        self._head = None
        return chunk[3:] if chunk.startswith(_BOM) else chunk

    @property
    def at_start(self) -> bool:
        """Still within the bytes a leading BOM could take (`skip_bom` has more to do)."""
        return self._head is not None

    @property
    def idle(self) -> bool:
        """Between events: no partial line, no pending data or event name."""
        return not (self._tail or self._data or self._after_cr or self._head) and self._event is None

    def close(self) -> list[SSEEvent]:
        """The whole body has arrived: the event its last bytes left open, if it is whole -- a
        `data: [DONE]` (or a JSON payload, or an `event:`) without the blank line that ends it, or
        without even its line end. WHATWG drops such an event (an EventSource reconnects and may
        have lost its rest); soakspec never reconnects, the HTTP framing says nothing is missing,
        and a server's final `[DONE]` is its word that the response completed (vLLM's `bench
        serve` reads it too). Data that is not whole (a JSON payload cut short) is still dropped:
        the stream then ended without `[DONE]`, as it did."""
        try:
            events = self.feed(b"\n\n")  # ends the last line (a CR's LF is taken as such), then the event
        except SSEError:
            return []
        return [e for e in events if e.event != "message" or e.data == b"[DONE]" or _whole_json(e.data)]

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume the next bytes of the stream; return the events they complete."""
        if self.at_start:
            chunk = self.skip_bom(chunk)
        if not chunk:
            return []
        if self._after_cr:
            self._after_cr = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._after_cr = chunk[-1] == 0x0D
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in chunk:
            self._tail += chunk
            if len(self._tail) > self._max:
                raise SSEError("SSE event too large")
            return []
        lines = (self._tail + chunk if self._tail else chunk).split(b"\n")
        self._tail = lines.pop()
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:
                if data or self._event is not None:
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    events.append(SSEEvent(self._event or "message", payload))
                    data.clear()
                    self._size = 0
                    self._event = None
                continue
            if line.startswith(b"data: "):  # the common case, without partition()
                name, value = b"data", line[6:]
            elif line[0] == 0x3A:  # ":" comment
                continue
            else:
                name, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
            if name == b"data":
                self._size += len(value)
                if self._size > self._max:
                    raise SSEError("SSE event too large", events)
                data.append(value)
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
        if len(self._tail) > self._max:
            raise SSEError("SSE event too large", events)
        return events


def _whole_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    except RecursionError:  # whole, but nested too deeply to read: `_parse_json` says so
        return True
    return True


# --------------------------------------------------------------------------------------------
# Transport errors, described the same way whichever client saw them


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception behind it, each once, breadth first: an exception group's
    members, then causes and contexts (where a library wraps the OSError that says what
    happened)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)


def describe_transport_error(exc: BaseException) -> str:
    """A stable, library-independent description of a network error (its root OSError)."""
    for e in exception_chain(exc):
        if isinstance(e, OSError) and e.errno is not None:
            name = errno.errorcode.get(e.errno)
            if name is None:  # e.g. a resolver error (socket.gaierror)
                return (e.strerror or str(e)).lower()
            return f"{os.strerror(e.errno)} ({name})".lower()
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


CONNECT_FAILED = "connect failed: "  # a record's error when no connection could be made
HELD_REFUSED = "the backend refused its last "  # ... because connects were refused (liveness.Health.refused)
CLOSED_BEFORE_RESPONSE = "connection closed before the response"
CLOSED_MID_RESPONSE = "connection closed before the response finished"
DEADLINE_PASSED = "deadline passed before the response finished"

# --------------------------------------------------------------------------------------------
# The fast path: events in the byte layout vLLM (and the simulator) write
#
# Almost every event of a stream is `data: {"id":...,"choices":[{"index":0,"text":"..."...}]...}`
# in one fixed key order, compact, without escapes. vLLM 0.32 adds `"prompt_token_ids":null,
# "token_ids":null` after `stop_reason` (each optional here; any other value is left to json). One regex (one match per event) reads the
# fields the metrics need (id, text, finish_reason, usage) without building the JSON object. `json.loads`
# and the dict lookups per event were over half the load generator's CPU for a 64-token stream;
# one `re.split` per socket read (all its events at once) was under a fifth, ~90 us for 12 KB
# (the regex engine walks every byte). A stream's middle -- events alike but for their text --
# is now cut out by one `bytes.split` and checked with one comparison, and the regex reads only
# what differs (the first and last events): ~40 us (benchmarks/loadgen).
#
# Exactness: the patterns accept only bytes that are a valid JSON object (strings without
# escapes or control characters, integers without sign or leading zeros, fixed keys, no
# duplicates) whose decoded fields are the captured bytes; UTF-8 is checked. Anything else --
# other key orders, whitespace, escapes, logprobs, an error -- is left to `SSEParser` and
# `json`, so records are identical whichever path read an event.

_J_STR = rb'[^"\\\x00-\x1f]*'
_J_INT = rb"(?:0|[1-9][0-9]{0,17})"
_FAST_HEAD = (
    rb'data: (?:(\[DONE\])|\{"id":"(' + _J_STR + rb')","object":"(?:text_completion|chat\.completion\.chunk)",'
    rb'"created":' + _J_INT + rb',"model":"' + _J_STR + rb'","choices":(?:\[\]|\[\{"index":0,'
)
_FAST_TAIL = (
    rb',"logprobs":null,"finish_reason":(?:null|"(' + _J_STR + rb')")'
    rb'(?:,"stop_reason":(?:null|' + _J_INT + rb'|"' + _J_STR + rb'"))?'
    rb'(?:,"prompt_token_ids":null)?(?:,"token_ids":null)?\}\])'
    rb'(?:,"usage":(?:null|\{"prompt_tokens":(' + _J_INT + rb'),"total_tokens":' + _J_INT
    + rb',"completion_tokens":(' + _J_INT + rb')\}))?\})\n\n'
)
# groups: 1 [DONE], 2 id, 3 text, 4 finish_reason, 5 prompt_tokens, 6 completion_tokens
_FAST_COMPLETIONS = re.compile(_FAST_HEAD + rb'"text":"(' + _J_STR + rb')"' + _FAST_TAIL)
_FAST_CHAT = re.compile(
    _FAST_HEAD + rb'"delta":(?:\{(?:"role":"assistant",)?"content":(?:null|"(' + _J_STR + rb')")\}|\{(?:"role":"assistant")?\})'
    + _FAST_TAIL
)
_BAD_TEXT = re.compile(rb'["\\\x00-\x1f]')  # what a text captured by `_J_STR` cannot hold
_FAILED_REASONS = tuple(r.encode() for r in FAILED_FINISH_REASONS)  # as the fast path captures them
_NEEDLE = 24

# --------------------------------------------------------------------------------------------
# The accumulator


class _Body(enum.Enum):
    NONE = 0  # no response head yet
    SSE = 1  # streaming 200: parse events
    JSON = 2  # non-streaming 200: buffer one JSON document
    ERROR = 3  # an error response: keep a snippet for the message
    DISCARD = 4  # a body that cannot be read (content-encoding): read to its end, keep nothing


_scan_once = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed: a class


def _loads(data: bytes) -> Any:
    """`json.loads` at half the cost for the common case: one scan of the decoded text.

    Anything unusual (leading or trailing whitespace, an error) goes through `json.loads`,
    which gives the same result or the same exception as always.
    """
    text = data.decode()
    try:
        obj, end = _scan_once(text, 0)
    except StopIteration:
        return json.loads(text)
    return obj if end == len(text) else json.loads(text)


def _error_text(err: Any) -> str:
    if isinstance(err, Mapping):
        msg = err.get("message")
        if msg is not None:
            return msg if isinstance(msg, str) else _shown(msg)
    return err if isinstance(err, str) else _shown(err, sort_keys=True)


def _shown(obj: Any, **kw: Any) -> str:
    """`obj` as JSON text for a message. A document nested nearly as deeply as json could read
    is one level too deep to write back from a deeper call: that is said, never raised (a
    RecursionError here stopped the whole run)."""
    try:
        return json.dumps(obj, **kw)
    except RecursionError:
        return "(JSON nested too deeply to show)"


def _snippet(data: bytes | bytearray) -> str:
    return bytes(data[:ERROR_LIMIT]).decode("utf-8", "replace")


# The largest usage count taken (a signed 64-bit integer, what JSON readers and the judge's
# columns hold); a negative or larger one is the server's bug, reported as such ("Outcomes").
MAX_USAGE = 2**63 - 1


def _identity(content_encoding: str) -> bool:
    """A Content-Encoding value that leaves the body as sent ("identity", or none named)."""
    return all(c.strip().lower() in ("", "identity") for c in content_encoding.split(","))


def _tool_call_text(calls: Any) -> str:
    """The text of a chat message's (or delta's) `tool_calls`: each call's `function.name` and
    `function.arguments`, in order -- tokens the model generated, as `content` is. Raises
    TypeError when they are not the OpenAI shape."""
    if type(calls) is not list:
        raise TypeError("tool_calls")
    out = []
    for call in calls:
        fn = call.get("function")  # AttributeError: not an object
        if fn is None:
            continue
        for key in ("name", "arguments"):
            value = fn.get(key)
            if value is not None:
                if type(value) is not str:
                    raise TypeError("tool_calls")
                out.append(value)
    return "".join(out)


def _bad_count(field: str, value: int) -> str:
    shown = str(value) if -(10**30) < value < 10**30 else f"{'-' if value < 0 else ''}a {len(str(abs(value)))}-digit number"
    return f"malformed response: usage.{field} is {shown}"


class StreamAccumulator:
    """Turns one response into record fields. One per request; see the module docstring."""

    __slots__ = (
        "_shape", "_limits", "_parser", "_chat", "_body_mode", "_body", "_body_start", "_received",
        "status", "outcome", "error", "first_token", "server_id", "finish_reason",
        "prompt_tokens", "chunks", "done", "ended",
        "_usage", "_times", "_cum", "_textless", "_continuous", "_hash", "_chars", "_fast",
        "_lead_times", "_lead_cum", "_end", "_down", "_bare", "_begun",
    )  # fmt: skip

    def __init__(self, shape: RequestShape, limits: Limits = DEFAULT_LIMITS) -> None:
        self._shape = shape
        self._limits = limits
        self._parser: SSEParser | None = None
        self._chat = shape.endpoint is Endpoint.CHAT
        self._fast: re.Pattern[bytes] | None = _FAST_CHAT if self._chat else _FAST_COMPLETIONS
        self._body_mode = _Body.NONE
        self._body = bytearray()  # JSON body, or the start of an error body
        self._body_start: float | None = None  # when the first body byte arrived
        self._received = 0
        self._begun = False  # a byte of the stream other than its BOM and leading blank lines seen
        self.status: int | None = None
        self.outcome: Outcome | None = None  # set by the first failure
        self.error: str | None = None
        self.first_token: float | None = None
        self.server_id: str | None = None
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.chunks = 0
        self.done = False  # saw data: [DONE]
        self.ended = False  # the body was complete
        self._usage: int | None = None  # the last usage.completion_tokens seen
        # token-bearing points: arrival time and cumulative completion tokens (-1: unknown)
        self._times: list[float] = []
        self._cum: list[int] = []
        self._textless: list[int] = []  # indices of points that carried tokens but no text
        self._continuous = True  # every text chunk so far carried usage.completion_tokens
        # token arrivals (usage rose) before any text: the points of a response with no text at all
        self._lead_times: list[float] = []
        self._lead_cum: list[int] = []
        self._hash = hashlib.sha256()
        self._chars = 0
        self._end: float | None = None  # the arrival stamp of the last bytes (a whole body)
        self._down = False  # a usage.completion_tokens below one seen before (see `finish`)
        # a chunk with empty text and no usage.completion_tokens: usage is not per chunk, so the
        # arrival times of tokens that no text carried are unknown (see `finish`)
        self._bare = False

    # -- transport events ---------------------------------------------------------------------

    def fail(self, outcome: Outcome, message: str) -> None:
        """Record a failure; only the first one counts."""
        if self.outcome is None:
            self.outcome = outcome
            self.error = message

    def connection_closed(self) -> None:
        """The peer closed the connection before the response was complete."""
        self.fail(Outcome.DISCONNECTED, CLOSED_BEFORE_RESPONSE if self.status is None else CLOSED_MID_RESPONSE)

    def on_response(self, status: int, content_type: str | None, content_encoding: str | None = None) -> None:
        """The response head arrived. `content_encoding`: its Content-Encoding (several headers
        joined with ", "), None without one."""
        if not 100 <= status <= 599:  # h11 takes any 3 digits; a record holds an HTTP status code
            self._body_mode = _Body.ERROR
            self.fail(Outcome.FAILED, f"malformed response: HTTP status {status} is not a status code")
            return
        self.status = status
        if status == 200 and content_encoding is not None and not _identity(content_encoding):
            self._body_mode = _Body.DISCARD  # see "Outcomes": the bytes are not the events
            self.fail(Outcome.FAILED, f"response body in content-encoding {content_encoding!r}, which soakspec does not "
                                      "decode (it asks for accept-encoding: identity)")
            return
        if status == 200:
            if not self._shape.stream:
                self._body_mode = _Body.JSON
            elif content_type is None or content_type.strip().lower().startswith("text/event-stream"):
                self._body_mode = _Body.SSE
                self._parser = SSEParser(self._limits.max_event_bytes)
            else:
                self._body_mode = _Body.ERROR
                self.fail(Outcome.FAILED, f"unexpected content-type {content_type!r} for a stream")
        else:
            self._body_mode = _Body.ERROR
            self.fail(Outcome.REJECTED if 400 <= status < 500 else Outcome.FAILED, f"HTTP {status}")

    def on_body(self, data: bytes, t: float) -> bool:
        """Consume body bytes received at `t`. False: stop reading and drop the connection."""
        self._received += len(data)
        if self._received > self._limits.max_response_bytes:
            self.fail(Outcome.FAILED, f"response too large (over {self._limits.max_response_bytes} bytes)")
            return False
        mode = self._body_mode
        if mode is _Body.SSE:
            parser: SSEParser = self._parser  # type: ignore[assignment]
            if not self._begun:  # the stream's start: without its BOM, if it has one
                if parser.at_start:
                    data = parser.skip_bom(data)
                if not data.strip():
                    # nothing but line breaks or spaces so far (no event in them: dropped);
                    # whether a JSON document follows is for the next read to say
                    return True
                self._begun = True
                if data.lstrip()[:1] in (b"{", b"["):
                    # a JSON document, not events (a server or proxy that answers an error as a
                    # plain body with status 200): say what it said, not "no [DONE]"
                    self._body_mode = _Body.ERROR
                    self.fail(Outcome.FAILED, "HTTP 200 with a JSON body, not a server-sent event stream")
                    self._body += data[:ERROR_LIMIT]
                    return True
            if not parser.idle:
                # A read that starts mid-event: the parser finishes that event, up to the first
                # LF LF (always an event's end: a line's end, then an empty line), and the fast
                # path may take the rest.
                q = data.find(b"\n\n") + 2
                if 1 < q < len(data):
                    if not self._feed(parser, data[:q], t):
                        return False
                    data = data[q:]
            if parser.idle:
                pos = self._fast_events(data, t)
                if pos:
                    if pos == len(data):
                        return True
                    data = data[pos:]
            return self._feed(parser, data, t)
        elif mode is _Body.DISCARD:
            return True
        elif mode is _Body.JSON:
            if self._body_start is None:
                self._body_start = t  # non-streaming: TTFT is the first byte of the body
            if len(self._body) + len(data) > self._limits.max_event_bytes:
                self.fail(Outcome.FAILED, "response body too large")
                return False
            self._body += data
        elif len(self._body) < ERROR_LIMIT:
            self._body += data[: ERROR_LIMIT - len(self._body)]
        return True

    def _feed(self, parser: SSEParser, data: bytes, t: float) -> bool:
        """Stream bytes through the general parser. False: the stream is broken."""
        try:
            events = parser.feed(data)
        except SSEError as exc:
            for event in exc.events:  # complete before the error
                self.on_event(event, t)
            self.fail(Outcome.FAILED, str(exc))
            return False
        for event in events:
            self.on_event(event, t)
        return True

    def on_end(self, t: float) -> None:
        """The body is complete (end of message); `t` is the arrival stamp of its last bytes,
        which becomes the record's `end` (see "One clock")."""
        self.ended = True
        self._end = t
        if self._body_mode is _Body.JSON:
            obj = self._parse_json(bytes(self._body))
            self._body = bytearray()
            if obj is not None:
                self._take(obj, t if self._body_start is None else self._body_start, "message")
        elif self._body_mode is _Body.SSE and self._parser is not None and not self._parser.idle:
            for event in self._parser.close():
                self.on_event(event, t)

    # -- events -------------------------------------------------------------------------------

    def _fast_events(self, data: bytes, t: float) -> int:
        """Take the events at the start of `data` if they are in the fast layout (see
        `_FAST_HEAD`); return how many bytes they span (0: none taken, `SSEParser` reads it all).
        The same effect as `SSEParser.feed` + `on_event` on those events.

        The first event is matched alone. If it carries text and no usage, the events after it
        that repeat it byte for byte but for the text (a stream's middle: same id, no
        finish_reason) are cut out by one `bytes.split` on what lies between two texts; a text
        there is valid if it has no quote, backslash or control character, so each of those
        events matches the pattern exactly as the first did. What follows them -- the last
        events, or all of them when the first does not qualify -- is read by one `re.split` (in
        C) that finds every event and its fields; those events must follow each other, and what
        follows the last one (part of an event, or an event of another layout) is left to the
        parser. Every event of a read arrived at `t`.
        """
        pattern = self._fast
        if pattern is None:
            return 0
        m = pattern.match(data)
        if m is None:
            return 0
        run: list[bytes] = []  # the texts of the first event and its repeats (no usage)
        tail = 0  # where the events for the regex split begin
        s3 = m.start(3)
        if s3 > 0 and m.group(6) is None:
            e3, e = m.end(3), m.end()
            pre = data[:s3]
            if data.startswith(pre, e):
                # Between two texts lies sep: this event's end and the next one's start. Split on
                # its first _NEEDLE bytes (bytes.split is fastest with a short needle: with 100 or
                # more CPython switches to a two-way search, several times slower), cut `rest` off
                # each piece, and check in one comparison that the bytes are exactly
                # sep text sep text ... text (the texts valid), and that an event end follows.
                sep = data[e3:e] + pre
                needle, rest = sep[:_NEEDLE], sep[_NEEDLE:]
                pieces = data.split(needle)  # [pre + text 0, rest + text 1, ..., the rest]
                if len(pieces) > 2 and len(pieces[0]) == e3:
                    texts = pieces[1:-1]
                    if rest:
                        texts = list(map(operator.itemgetter(slice(len(rest), None)), texts))
                    end_k = len(data) - len(pieces[-1]) - len(needle)  # where the last text ends
                    if not rest or data[e3 + len(needle) : end_k] == rest + sep.join(texts):
                        if not data.startswith(sep[: e - e3], end_k):  # the last text's event is another
                            end_k -= len(texts.pop()) + len(sep)
                        if _BAD_TEXT.search(b"".join(texts)) is None:
                            run = [m.group(3), *texts]
                            tail = end_k + e - e3  # the event after the last text
        parts = pattern.split(data[tail:] if tail else data)  # [sep, 6 groups, sep, ..., the rest]
        n = len(parts) // 7
        if n and not any(parts[0 : 7 * n : 7]):
            end = len(data) - len(parts[-1])
        elif run:
            n, end = 0, tail
        else:
            return 0
        if end > self._limits.max_event_bytes:  # so that no event of them is too large
            return 0
        ascii_ = data.isascii()
        if not ascii_:
            try:
                data[:end].decode()
            except UnicodeDecodeError:
                return 0
        if self.done:
            return end
        stop = 7 * n
        done = False
        if n:
            dones = parts[1:stop:7]
            if b"[DONE]" in dones:
                stop = 7 * dones.index(b"[DONE]")
                done = True
            if not self._bare and (None, None) in zip(parts[3:stop:7], parts[6:stop:7]):
                # an event without text and without usage: a choice without text (a role-only
                # or `content: null` delta: usage not per chunk, `_bare`) or no choice at all
                # (nothing), which the groups do not tell apart -- the general parser does
                # (rare: once `_bare` is set, or with usage on every event, never again)
                return 0
        self.done = done
        if not run and not stop:
            return end
        if self.server_id is None:
            self.server_id = m.group(2).decode()  # the first event is not [DONE]: it has an id
        texts = parts[3:stop:7]
        cts = parts[6:stop:7]
        j = len(texts)
        for i in range(j - 1, -1, -1):  # the last usage seen (never in the run)
            if cts[i] is not None:
                self.prompt_tokens = int(parts[7 * i + 5])
                self._usage = int(cts[i])
                break
        reasons = parts[4:stop:7]
        if run:
            reasons.insert(0, m.group(4))  # the run's one finish_reason, before the rest's
        for i in range(len(reasons) - 1, -1, -1):  # the last finish_reason seen
            if reasons[i] is not None:
                self.finish_reason = reasons[i].decode()
                for r in reasons:  # the first failing one, as `_fields` meets them
                    if r in _FAILED_REASONS:
                        self.fail(Outcome.FAILED, "finish_reason: " + r.decode())
                        break
                break
        if not self._bare and (b"" in run or (b"" in texts and any(
                x == b"" and ct is None for x, ct in zip(texts, cts)))):  # fmt: skip
            self._bare = True  # a chunk with empty text and no usage (as `_take`)
        cums = self._cum
        k = len(cums)
        tokens = len(run) - run.count(b"")  # text events in the run: no usage, so -1 each
        if tokens:
            cums.extend([-1] * tokens)
            self._continuous = False
        continuous = self._continuous
        for text, ct in zip(texts, cts):
            if text:
                tokens += 1
                if ct is None:
                    cums.append(-1)
                    continuous = False
                else:
                    cums.append(int(ct))
                    if ct == b"0":  # 0 tokens for a text: usage is not per chunk (as `_take`)
                        continuous = False
            elif ct is not None and continuous:
                cum = int(ct)
                if cum > 0 and cums and cum > cums[-1]:
                    self._textless.append(len(cums))
                    cums.append(cum)
                elif cum > 0 and not cums:
                    self._lead(cum, t)
                elif cums and cum < cums[-1]:
                    self._down = True
        self._continuous = continuous
        if len(cums) > k:
            self._times.extend([t] * (len(cums) - k))
        if tokens:
            if self.first_token is None:
                self.first_token = t
            self.chunks += tokens
            joined = b"".join(run) + b"".join([x for x in texts if x])
            self._hash.update(joined)
            self._chars += len(joined) if ascii_ else len(joined.decode())
        return end

    def on_event(self, event: SSEEvent, t: float) -> None:
        """One SSE event received at `t` (the hot path: one json.loads, nothing else that grows)."""
        data = event.data
        if event.event != "message":
            if event.event == "error":
                self.fail(Outcome.FAILED, "error event: " + _snippet(data))
            return
        if self.done:
            return
        if data == b"[DONE]":
            self.done = True
            return
        obj = self._parse_json(data)
        if obj is not None:
            self._take(obj, t, "delta")

    def _parse_json(self, data: bytes) -> dict[str, Any] | None:
        try:
            obj = _loads(data)
        except ValueError:
            self.fail(Outcome.FAILED, "malformed JSON in the response: " + _snippet(data))
            return None
        except RecursionError:  # a hostile body ([[[[...) is the request's failure, not the run's
            self.fail(Outcome.FAILED, "malformed response, JSON nested too deeply: " + _snippet(data))
            return None
        if type(obj) is not dict:
            self.fail(Outcome.FAILED, "malformed response, not a JSON object: " + _snippet(data))
            return None
        return obj

    def _take(self, obj: dict[str, Any], t: float, chat_key: str) -> None:
        """One parsed payload (a stream chunk, or a whole non-streaming response)."""
        err = obj.get("error")
        if err is not None or obj.get("object") == "error":
            what = "error event: " if chat_key == "delta" else "error in response: "
            self.fail(Outcome.FAILED, what + _error_text(obj if err is None else err))
            return
        try:
            text, cum = self._fields(obj, chat_key)
        except (AttributeError, TypeError, IndexError, KeyError):
            self.fail(Outcome.FAILED, "malformed response, unexpected JSON shape: " + _shown(obj)[:ERROR_LIMIT])
            return
        if text:
            if self.first_token is None:
                self.first_token = t
            self.chunks += 1
            # surrogatepass: a JSON escape may be half a character ("\ud83d", a UTF-16 server
            # streaming a character past U+FFFF as its two halves): hashed as sent, never raising
            self._hash.update(text.encode("utf-8", "surrogatepass"))
            self._chars += len(text)
            self._times.append(t)
            self._cum.append(cum)
            if cum <= 0:  # no usage, or 0 tokens for a text: usage is not per chunk ("Tokens")
                self._continuous = False
        elif cum > 0 and self._continuous:
            if not self._cum:
                self._lead(cum, t)
            elif cum > self._cum[-1]:
                self._textless.append(len(self._times))
                self._times.append(t)
                self._cum.append(cum)
            elif cum < self._cum[-1]:
                self._down = True
        elif cum == 0 and self._continuous and self._cum and self._cum[-1] > 0:
            self._down = True  # back to none (as `_fast_events` reads it)
        elif text == "" and cum < 0:
            self._bare = True

    def _lead(self, cum: int, t: float) -> None:
        """A token arrival before any text (usage rose to `cum` at `t`)."""
        if not self._lead_cum or cum > self._lead_cum[-1]:
            self._lead_times.append(t)
            self._lead_cum.append(cum)
        elif cum < self._lead_cum[-1]:
            self._down = True

    def _fields(self, obj: dict[str, Any], chat_key: str) -> tuple[str | None, int]:
        """(text, cumulative completion tokens or -1); notes id, usage and finish_reason.

        Raises TypeError & co. when the payload does not have the OpenAI shape.
        """
        if self.server_id is None:
            sid = obj.get("id")
            if sid is not None:
                self.server_id = str(sid)
        cum = -1
        usage = obj.get("usage")
        if usage:
            pt = usage.get("prompt_tokens")
            if pt is not None:
                if type(pt) is not int:
                    raise TypeError("prompt_tokens")
                if 0 <= pt <= MAX_USAGE:
                    self.prompt_tokens = pt
                else:
                    self.fail(Outcome.FAILED, _bad_count("prompt_tokens", pt))
            ct = usage.get("completion_tokens")
            if ct is not None:
                if type(ct) is not int:
                    raise TypeError("completion_tokens")
                if 0 <= ct <= MAX_USAGE:
                    self._usage = cum = ct
                else:  # not a count: the request fails, and the value is not used (cum stays unknown)
                    self.fail(Outcome.FAILED, _bad_count("completion_tokens", ct))
        text = None
        choices = obj.get("choices")
        if choices:
            c0 = choices[0]
            if len(choices) > 1 or c0.get("index", 0) != 0:
                other = c0 if c0.get("index", 0) != 0 else choices[1]
                index = other.get("index") if type(other) is dict else None
                self.fail(Outcome.FAILED, f"the response has more than one choice (index {_shown(index)[:20]}): "
                                          "soakspec measures one choice a request (n = 1 in the body)")
            if self._chat:
                msg = c0.get(chat_key)
                if msg:
                    text = msg.get("content")
                    # reasoning text is output text (module docstring): `reasoning` (newer vLLM),
                    # else `reasoning_content`; a server that sends both sends the same text
                    thought = msg.get("reasoning") or msg.get("reasoning_content")
                    if thought:
                        if type(thought) is not str or (text is not None and type(text) is not str):
                            raise TypeError("reasoning")
                        text = thought + text if text else thought
                    calls = msg.get("tool_calls")
                    if calls:  # a tool call's name and arguments are output text too (module docstring)
                        called = _tool_call_text(calls)
                        if called:
                            if text is not None and type(text) is not str:
                                raise TypeError("text")
                            text = text + called if text else called
            else:
                text = c0.get("text")
            if text is None:
                # a choice without text (a role-only delta, `content: null`, an empty tool call
                # delta) is a chunk of empty text: without usage, its tokens' arrival is unknown (`_bare`)
                text = ""
            elif type(text) is not str:
                raise TypeError("text")
            reason = c0.get("finish_reason")
            if reason is not None:
                if type(reason) is not str:  # OpenAI's finish_reason is a string or null
                    raise TypeError("finish_reason")
                self.finish_reason = reason
                if reason in FAILED_FINISH_REASONS:
                    self.fail(Outcome.FAILED, f"finish_reason: {reason}")
        return text, cum

    # -- the result ---------------------------------------------------------------------------

    def finish(self, record: RequestRecord, end: float) -> None:
        """Classify the request and write every measured field of `record`.

        `end` is the client's clock when it finished with the request (`now()`). A request whose
        body arrived whole ends at its last bytes' arrival stamp (`on_end`), and `end` minus that
        is its `client_delay`; any other (a failure, the deadline) ends at `end` itself."""
        shape = self._shape
        if self.outcome is None:
            if not self.ended:
                self.connection_closed()
            elif shape.stream and not self.done:
                self.fail(Outcome.FAILED, "stream ended without data: [DONE]")
        if not self._cum and self._lead_cum and self._continuous and not self._bare:
            # no text at all, but the usage rose: those events are the token arrivals -- unless
            # usage is not per chunk (a chunk of empty text came without it): then the tokens'
            # arrival times are unknown, and TTFT, ITL and TPOT are not measured (never the
            # usage event's time, an upper bound charged to the server)
            self._times, self._cum = self._lead_times, self._lead_cum
            if self.first_token is None:
                self.first_token = self._lead_times[0]
        elif self._cum and self._lead_cum and self._continuous and not self._bare:
            # usage on every chunk rose before the first text: those events are the first token
            # arrivals (a token that decoded to no text, a reasoning field this reader does not
            # know), as a text-less rise after it is one; TTFT ends at the first of them
            lead = [(lt, lc) for lt, lc in zip(self._lead_times, self._lead_cum) if lc <= self._cum[0]]
            if len(lead) < len(self._lead_cum):
                self._down = True  # a count the first text chunk's went below
            if lead:
                k = len(lead)
                self._textless = [*range(k), *(i + k for i in self._textless)]
                self._times = [lt for lt, _ in lead] + self._times
                self._cum = [lc for _, lc in lead] + self._cum
                self.first_token = lead[0][0]
        tokens_source, itl_source, n, per_point = self._tokens()
        if self.outcome is None and shape.max_tokens > 0 and n == 0:
            if self.chunks == 0:
                self.fail(Outcome.FAILED, "0 completion tokens and no text")
            else:
                self.fail(Outcome.FAILED, f"usage says 0 completion tokens for {self.chunks} text chunks")
        error = self.error
        if error is not None and self._body_mode is _Body.ERROR and self._body:
            error = f"{error}: {_snippet(self._body)}"

        itl: list[float] = []
        tpot = None
        coalesced = 0
        times = self._times
        if times and per_point is None:  # one token per point: the gaps between them
            first, last = times[0], times[-1]
            itl = list(map(operator.sub, times[1:], times))  # times[i + 1] - times[i], in C
            coalesced = itl.count(0.0)  # a token in the same read (same stamp) as the one before
        elif times:
            assert per_point is not None
            first = last = times[0]
            cap = usage_bound(shape.max_tokens)
            counted = max(per_point[0], 0)  # the tokens given their times so far (see "ITL")
            for i in range(1, len(times)):
                k = per_point[i]
                if k > 0:
                    t = times[i]
                    counted += k
                    if k == 1 or (counted > cap if cap is not None else k > MAX_TOKENS_PER_CHUNK):
                        # one gap; a count past the bound on the response's tokens is not split (see "ITL")
                        itl.append(t - last)
                        coalesced += t == last
                    else:
                        itl.extend([(t - last) / k] * k)
                        # one chunk's gap split k ways is one measurement: k - 1 of its gaps are
                        # not independent; all k when it shared the previous token's read
                        coalesced += k if t == last else k - 1
                    last = t
        # TPOT is the mean of the ITL gaps: over the tokens after the first token event's k1 (a
        # first chunk of several tokens must not deflate it); none when that event had them all.
        # Whatever the read pattern: 0 when the later events all came in the first one's read.
        k1 = per_point[0] if per_point else 1
        if times and n > 1 and n > k1 and shape.stream:
            tpot = (last - first) / (n - k1)

        if self.ended and self._end is not None:
            record.end = self._end if self._end <= end else end
            record.client_delay = end - record.end
        else:
            record.end = end
            record.client_delay = None
        record.status = self.status
        record.outcome = self.outcome or Outcome.COMPLETED
        record.error = None if error is None else error[:ERROR_LIMIT]
        record.first_token = self.first_token
        record.finish_reason = self.finish_reason
        record.server_id = self.server_id
        record.prompt_tokens = self.prompt_tokens
        record.output_tokens = n
        record.tokens_source = tokens_source
        record.itl_source = itl_source
        record.chunks = self.chunks
        record.tpot = tpot
        record.itl = itl
        record.output_sha256 = self._hash.hexdigest() if self.chunks else None
        record.output_chars = self._chars
        record.empty_text = record.outcome is Outcome.COMPLETED and self._chars == 0 and n > 0
        record.coalesced = coalesced
        record.usage_decreased = self._usage_went_down()

    def _usage_went_down(self) -> bool:
        """Some cumulative usage.completion_tokens was below one seen before it in the stream."""
        if self._down:
            return True
        cum = self._cum
        if not self._continuous:
            cum = [c for c in cum if c >= 0]
        if cum and not all(map(operator.le, cum, cum[1:])):
            return True
        top = max(cum[-1] if cum else -1, self._lead_cum[-1] if self._lead_cum else -1)
        return self._usage is not None and top > self._usage

    def _tokens(self) -> tuple[TokensSource, ItlSource, int, list[int] | None]:
        """(tokens_source, itl_source, output tokens, tokens per point or None: one each) by the
        module's rules."""
        cum = self._cum
        if cum and self._continuous:
            per_point = [cum[0]] + [cum[i] - cum[i - 1] for i in range(1, len(cum))]
            n = max(cum[-1], self._usage or 0)
            return TokensSource.USAGE, ItlSource.USAGE, n, per_point
        if self._textless:  # usage stopped being continuous: keep the text chunks only
            drop = set(self._textless)
            self._times = [x for i, x in enumerate(self._times) if i not in drop]
        c = len(self._times)
        if self._usage is not None:
            n = self._usage
            if n == c:
                return TokensSource.USAGE, ItlSource.EXACT, n, None
            per_point = [(i + 1) * n // c - i * n // c for i in range(c)] if c else []
            return TokensSource.USAGE, ItlSource.ESTIMATED, n, per_point
        return TokensSource.COUNTED, ItlSource.COUNTED, c, None
