"""The pure protocol layer: request bodies, the SSE parser, token/ITL accounting, outcomes."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from soakspec.runner.clock import RunClock
from soakspec.runner.protocol import (
    Endpoint,
    Limits,
    RequestShape,
    Sampling,
    SSEError,
    SSEEvent,
    SSEParser,
    StreamAccumulator,
    build_body,
    describe_transport_error,
)
from soakspec.runner.records import RECORD_KEYS, ItlSource, Outcome, RequestRecord, TokensSource
from soakspec.evidence.record import MAX_TOKENS_PER_CHUNK, unpack_gaps

COMPLETIONS = RequestShape(Endpoint.COMPLETIONS, "m", "hello world", max_tokens=8)
CHAT = RequestShape(Endpoint.CHAT, "m", "hello world", max_tokens=8)


# ---------------------------------------------------------------------------------------------
# request bodies


def test_completions_body_greedy() -> None:
    body = json.loads(build_body(COMPLETIONS, "r-1"))
    assert body == {
        "model": "m",
        "prompt": "hello world",
        "max_tokens": 8,
        "temperature": 0.0,
        "top_p": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": False,
        "request_id": "r-1",
    }
    assert COMPLETIONS.path == "/v1/completions"


def test_chat_body_sampled_with_extra_fields() -> None:
    shape = RequestShape(
        Endpoint.CHAT,
        "m",
        "hi",
        max_tokens=4,
        sampling=Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=7),
        ignore_eos=True,
        stream=False,
        extra=(("min_tokens", 4), ("temperature", 0.5)),
    )
    body = json.loads(build_body(shape, "r-2"))
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert "prompt" not in body and "stream_options" not in body
    assert (body["top_k"], body["seed"], body["ignore_eos"], body["stream"]) == (40, 7, True, False)
    assert (body["min_tokens"], body["temperature"]) == (4, 0.5)  # extra fields win
    assert shape.path == "/v1/chat/completions"
    assert not shape.sampling.greedy and Sampling().greedy


# ---------------------------------------------------------------------------------------------
# SSE parser


def parse(*chunks: bytes) -> list[SSEEvent]:
    p = SSEParser()
    return [e for c in chunks for e in p.feed(c)]


def test_sse_basic_fields() -> None:
    stream = (
        b": comment\n"
        b"data: one\n\n"
        b"event: error\ndata: {\"x\": 1}\n\n"
        b"data:  two spaces\ndata:no space\ndata\n\n"
        b"id: 5\nretry: 10\ndata: [DONE]\n\n"
        b"event: error\n\n"
        b"data: unterminated\n"
    )
    assert parse(stream) == [
        SSEEvent("message", b"one"),
        SSEEvent("error", b'{"x": 1}'),
        SSEEvent("message", b" two spaces\nno space\n"),
        SSEEvent("message", b"[DONE]"),
        SSEEvent("error", b""),
    ]


def test_sse_line_endings() -> None:
    want = [SSEEvent("message", b"a"), SSEEvent("message", b"b")]
    assert parse(b"data: a\r\n\r\ndata: b\r\n\r\n") == want
    assert parse(b"data: a\r\rdata: b\r\r") == want
    assert parse(b"data: a\r", b"\n\r", b"\ndata: b\r\n", b"\r\n") == want


def test_sse_a_leading_bom_is_dropped_however_the_reads_cut_it() -> None:
    """WHATWG: one UTF-8 BOM at the very start of the stream is dropped. It made the first line
    `\ufeffdata: ...`, a field no one knows, and the first event was lost."""
    bom = b"\xef\xbb\xbf"
    stream = bom + b"data: one\n\ndata: two\n\n"
    want = [SSEEvent("message", b"one"), SSEEvent("message", b"two")]
    for cut in range(len(stream) + 1):
        assert parse(stream[:cut], stream[cut:]) == want, cut
    assert parse(b"\xef", b"\xbb", b"\xbf", b"data: one\n\ndata: two\n\n") == want
    # only one, only at the start
    assert parse(bom + bom + b"data: x\n\n") == []  # the second is the first line's start
    assert parse(b"data: one\n\n" + bom + b"data: two\n\n") == [SSEEvent("message", b"one")]
    assert parse(b"\xef\xbbdata: x\n\n") == []  # not a BOM: kept, and the line is no field


@pytest.mark.parametrize("fast", [True, False])
def test_a_stream_that_starts_with_a_bom_keeps_its_first_event(fast) -> None:
    """A server that writes a BOM before its first event: that event's token is counted and
    timed (TTFT at its arrival), on the fast path as on the general parser's."""
    first = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,' \
            b'"text":"a","logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}\n\n'
    for reads in ([b"\xef\xbb\xbf" + first], [b"\xef\xbb", b"\xbf" + first]):
        acc = StreamAccumulator(COMPLETIONS)
        if not fast:
            acc._fast = None
        acc.on_response(200, "text/event-stream")
        for i, data in enumerate(reads):
            assert acc.on_body(data, 1.0 + 0.1 * i)
        t = 1.0 + 0.1 * (len(reads) - 1)
        assert acc.on_body(chunk("b", ct=2), 1.5) and acc.on_body(DONE, 1.5)
        acc.on_end(1.5)
        rec = RequestRecord("r", intended_start=0.0, start=0.0)
        acc.finish(rec, 2.0)
        assert (rec.outcome, rec.chunks, rec.output_tokens, rec.ttft) == (Outcome.COMPLETED, 2, 2, t)
        assert rec.output_sha256 == hashlib.sha256(b"ab").hexdigest()


def test_sse_event_too_large() -> None:
    p = SSEParser(max_event_bytes=100)
    p.feed(b"data: " + b"x" * 90)
    with pytest.raises(SSEError, match="too large"):
        p.feed(b"x" * 20)
    p = SSEParser(max_event_bytes=100)
    with pytest.raises(SSEError, match="too large"):
        p.feed(b"data: " + b"x" * 60 + b"\ndata: " + b"x" * 60 + b"\n")
    assert SSEParser(max_event_bytes=100).feed(b": " + b"c" * 200 + b"\n") == []  # comments are not kept


def test_events_before_an_oversized_one_are_kept() -> None:
    """An event complete before the one that is too large, in the same read, still counts."""
    p = SSEParser(max_event_bytes=100)
    with pytest.raises(SSEError, match="too large") as exc:
        p.feed(b"data: a\n\ndata: " + b"x" * 120)
    assert exc.value.events == [SSEEvent("message", b"a")]
    rec = run([(1.0, chunk("a") + b"data: " + b"x" * 600)], limits=Limits(max_event_bytes=500))
    assert (rec.outcome, rec.error, rec.chunks) == (Outcome.FAILED, "SSE event too large", 1)


_text = st.binary(max_size=20).filter(lambda b: b"\r" not in b and b"\n" not in b)
_field_event = st.tuples(
    st.one_of(st.none(), st.sampled_from(["error", "message", "ping"])),
    st.lists(_text, min_size=1, max_size=3),
    st.booleans(),  # a comment line before it
)


@given(
    events=st.lists(_field_event, max_size=6),
    newline=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_sse_any_split_yields_the_same_events(events, newline, cuts) -> None:
    """Property: rendering events to bytes and feeding them in any split parses back the events."""
    out = b""
    want = []
    for name, lines, comment in events:
        if comment:
            out += b": note" + newline
        if name is not None:
            out += b"event: " + name.encode() + newline
        for line in lines:
            out += b"data: " + line + newline
        out += newline
        want.append(SSEEvent(name or "message", b"\n".join(lines)))
    bounds = sorted({c % (len(out) + 1) for c in cuts})
    pieces = [out[a:b] for a, b in zip([0, *bounds], [*bounds, len(out)])]
    assert parse(*pieces) == want
    assert parse(out) == want


# ---------------------------------------------------------------------------------------------
# accumulator helpers


def chunk(
    text: str | None = None, *, ct: int | None = None, finish: str | None = None, chat: bool = False, **kw: object
) -> bytes:
    choice: dict = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {} if text is None else {"content": text}
    else:
        choice["text"] = text if text is not None else ""
    obj: dict = {"id": "cmpl-1", "object": "x", "choices": [choice], **kw}
    if ct is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": ct, "total_tokens": 3 + ct}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def usage_only(ct: int) -> bytes:
    obj = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": ct}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def run(
    timed: list[tuple[float, bytes]],
    shape: RequestShape = COMPLETIONS,
    *,
    status: int = 200,
    content_type: str | None = "text/event-stream",
    end: bool = True,
    limits: Limits = Limits(),
) -> RequestRecord:
    """Feed (time, body bytes) pairs to an accumulator, as a client would; return the record."""
    acc = StreamAccumulator(shape, limits)
    rec = RequestRecord("r", intended_start=0.0, start=0.0)
    acc.on_response(status, content_type)
    for t, data in timed:
        if not acc.on_body(data, t):
            end = False
            break
    if end:
        acc.on_end(timed[-1][0] if timed else 0.0)
    acc.finish(rec, 10.0)
    return rec


# ---------------------------------------------------------------------------------------------
# tokens and inter-token latency


def test_continuous_usage_k_tokens_per_chunk() -> None:
    shape = RequestShape(Endpoint.COMPLETIONS, "m", "hello world", max_tokens=12)
    rec = run([(1.0, chunk("abcd", ct=4)), (1.2, chunk("efgh", ct=8)), (1.3, chunk("ijkl", ct=12, finish="length")),
               (1.3, usage_only(12)), (1.3, DONE)], shape)  # fmt: skip
    assert rec.outcome is Outcome.COMPLETED and rec.error is None
    assert (rec.output_tokens, rec.chunks, rec.prompt_tokens) == (12, 3, 3)
    assert (rec.tokens_source, rec.itl_source) == (TokensSource.USAGE, ItlSource.USAGE)
    # one clock: the request ends at its last bytes' arrival; the client's own delay is apart
    assert rec.ttft == 1.0 and rec.latency == 1.3 and rec.client_delay == pytest.approx(8.7)
    assert rec.itl == pytest.approx([0.05] * 4 + [0.025] * 4)
    assert sum(rec.itl) == pytest.approx(0.3)
    assert rec.tpot == pytest.approx(0.3 / 8)  # the mean gap: the first chunk's 4 tokens add none
    assert rec.output_sha256 == hashlib.sha256(b"abcdefghijkl").hexdigest()
    assert (rec.output_chars, rec.finish_reason, rec.server_id) == (12, "length", "cmpl-1")


def test_latency_ends_at_done_and_the_per_token_figures_at_the_last_token() -> None:
    """Decided (tokenomics PR #16 moved its latency to the last content token, as AIPerf's): a
    request's latency ends at its last bytes, `[DONE]` -- a client does not know the answer is
    whole before it, so a server that holds `[DONE]` back 0.5 s after its last token is 0.5 s
    slower to its users -- while TTFT, ITL and TPOT are the tokens' own: the wait for `[DONE]`
    is no gap between tokens."""
    rec = run([(1.0, chunk("ab", ct=1)), (1.1, chunk("c", ct=2)), (1.3, chunk("d", ct=3, finish="stop")),
               (1.3, usage_only(3)), (1.8, DONE)])  # fmt: skip
    assert rec.outcome is Outcome.COMPLETED
    assert rec.latency == pytest.approx(1.8) and rec.ttft == pytest.approx(1.0)
    assert rec.itl == pytest.approx([0.1, 0.2]) and rec.tpot == pytest.approx(0.15)


def test_continuous_usage_tokens_without_text() -> None:
    """With usage on every chunk, a text-less chunk whose count rose is a token arrival of its
    own, before the first text as after it: TTFT is the first token's (0.5 s, whose text
    came later or never), not the first text's; the text-less EOS token is one too."""
    rec = run([(0.5, chunk(None, ct=1)), (1.0, chunk("ab", ct=2)), (1.1, chunk("c", ct=3)),
               (1.3, chunk(None, ct=4, finish="stop")), (1.3, usage_only(4)), (1.3, DONE)])  # fmt: skip
    assert rec.outcome is Outcome.COMPLETED
    assert (rec.output_tokens, rec.chunks, rec.itl_source) == (4, 2, ItlSource.USAGE)
    assert rec.ttft == 0.5
    assert rec.itl == pytest.approx([0.5, 0.1, 0.2])
    assert rec.tpot == pytest.approx(0.8 / 3)  # the first token event delivered 1 token


def test_a_reasoning_field_the_reader_does_not_know_is_not_charged_to_ttft() -> None:
    """A server that streams its thinking in a field soakspec does not read (`delta.thinking`)
    with usage on every chunk: the count rises from the first thought, so TTFT ends there --
    not at the answer's first text, seconds later -- and every thought is an ITL gap."""
    shape = RequestShape(Endpoint.CHAT, "m", "p", max_tokens=64)
    thought = lambda ct: ('data: {"id":"c","choices":[{"index":0,"delta":{"thinking":"hm"},"finish_reason":null}],'  # noqa: E731
                          f'"usage":{{"prompt_tokens":2,"completion_tokens":{ct},"total_tokens":{2 + ct}}}}}\n\n').encode()
    answer = ('data: {"id":"c","choices":[{"index":0,"delta":{"content":"yes"},"finish_reason":"stop"}],'
              '"usage":{"prompt_tokens":2,"completion_tokens":6,"total_tokens":8}}\n\n').encode()
    rec = run([(0.2, thought(1)), (0.3, thought(2)), (0.4, thought(3)), (0.5, thought(4)), (0.6, thought(5)),
               (3.0, answer), (3.0, DONE)], shape)  # fmt: skip
    assert rec.outcome is Outcome.COMPLETED and rec.output_tokens == 6
    assert rec.ttft == pytest.approx(0.2)
    assert rec.itl == pytest.approx([0.1] * 4 + [2.4])


def test_a_first_text_below_a_count_seen_before_it_is_usage_decreased() -> None:
    rec = run([(0.5, chunk(None, ct=3)), (1.0, chunk("ab", ct=2)), (1.1, chunk("c", ct=4, finish="length")), (1.2, DONE)])
    assert rec.usage_decreased is True


def test_final_usage_equal_to_chunks_is_exact() -> None:
    rec = run([(1.0, chunk("a")), (1.1, chunk("b")), (1.3, chunk("c", finish="length")), (1.3, usage_only(3)),
               (1.3, DONE)])  # fmt: skip
    assert (rec.output_tokens, rec.tokens_source, rec.itl_source) == (3, TokensSource.USAGE, ItlSource.EXACT)
    assert rec.itl == pytest.approx([0.1, 0.2])
    assert rec.tpot == pytest.approx(0.15)


def test_final_usage_spread_evenly_is_estimated() -> None:
    rec = run([(1.0, chunk("a")), (1.1, chunk("b")), (1.2, chunk("c")), (1.2, usage_only(7)), (1.2, DONE)])
    assert (rec.output_tokens, rec.itl_source) == (7, ItlSource.ESTIMATED)
    # 7 tokens over 3 chunks: 2, 2, 3 -- the first chunk's 2 add no gap
    assert rec.itl == pytest.approx([0.05] * 2 + [0.1 / 3] * 3)
    assert rec.tpot == pytest.approx(0.2 / 5)  # the mean of the 5 gaps


@pytest.mark.parametrize(("final", "source", "itl"), [
    (3, ItlSource.EXACT, [0.1, 0.2]),
    (7, ItlSource.ESTIMATED, [0.05] * 2 + [0.2 / 3] * 3),
])  # fmt: skip
def test_a_zero_count_on_every_text_chunk_is_no_usage_per_chunk(final, source, itl) -> None:
    """A server that sends `usage.completion_tokens: 0` on every text chunk and the real count
    only in its final usage chunk: a text chunk with 0 tokens contradicts its text, so the usage
    is not per chunk and the final-usage rule applies (N == chunks: exact; else estimated). Read
    as per-chunk usage, the last event carried all N tokens: ITL was one whole-stream gap
    (itl_source "usage"), and max(itl) failed."""
    shape = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=8)
    rec = run([(1.0, chunk("a", ct=0)), (1.1, chunk("b", ct=0)), (1.3, chunk("c", ct=0, finish="length")),
               (1.3, usage_only(final)), (1.3, DONE)], shape)  # fmt: skip
    assert (rec.outcome, rec.output_tokens, rec.chunks) == (Outcome.COMPLETED, final, 3)
    assert (rec.tokens_source, rec.itl_source) == (TokensSource.USAGE, source)
    assert rec.ttft == 1.0 and rec.itl == pytest.approx(itl) and not rec.usage_decreased
    assert rec.tpot == pytest.approx(0.3 / (final - (final // 3)))


def test_no_usage_counts_chunks() -> None:
    rec = run([(1.0, chunk("a")), (1.5, chunk("b")), (1.5, DONE)])
    assert (rec.output_tokens, rec.tokens_source, rec.itl_source) == (2, TokensSource.COUNTED, ItlSource.COUNTED)
    assert rec.prompt_tokens is None
    assert rec.itl == pytest.approx([0.5])


def test_chat_role_chunk_is_not_the_first_token() -> None:
    role = b'data: {"id":"chat-9","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    rec = run([(0.2, role), (0.7, chunk("hi", ct=1, chat=True)),
               (0.9, chunk(" there", ct=2, chat=True, finish="length")), (0.9, DONE)], CHAT)  # fmt: skip
    assert rec.outcome is Outcome.COMPLETED
    assert (rec.ttft, rec.chunks, rec.output_tokens, rec.server_id) == (0.7, 2, 2, "chat-9")
    assert rec.output_sha256 == hashlib.sha256(b"hi there").hexdigest()


def _chat_event(delta: dict, *, finish: str | None = None, ct: int | None = None) -> bytes:
    obj: dict = {"id": "chat-3", "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    if ct is not None:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": ct, "total_tokens": 3 + ct}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


TOOL_CALL = [{"index": 0, "id": "call-1", "type": "function", "function": {"name": "f", "arguments": ""}}]


@pytest.mark.parametrize("role", [{"role": "assistant"}, {"role": "assistant", "content": None},
                                  {"role": "assistant", "content": ""}])  # fmt: skip
def test_deltas_without_text_streamed_without_usage_have_no_ttft_not_the_streams_end(role) -> None:
    """A chat answer whose deltas carry no text (no `content`; tool_calls deltas without a name or
    arguments), with usage only in the final chunk: when its 12 tokens arrived is unknown, so no
    TTFT (excluded, saying why) -- never the final usage event's time, the end of the stream,
    which was reported as its TTFT. (A tool call's name and arguments are text:
    tests/test_protocol_shapes.py.)"""
    from soakspec.judge.rederive import derive_outcome

    header = [{"index": 0, "id": "call-1", "type": "function"}]
    empty = [{"index": 0, "function": {"arguments": ""}}]
    rec = run([(0.2, _chat_event(role)), (0.3, _chat_event({"tool_calls": header})),
               *[(0.4 + 0.1 * i, _chat_event({"tool_calls": empty})) for i in range(3)],
               (0.8, _chat_event({}, finish="tool_calls")), (0.9, usage_only(12)), (0.9, DONE)], CHAT)  # fmt: skip
    assert (rec.outcome, rec.output_tokens, rec.chunks, rec.finish_reason) == (Outcome.COMPLETED, 12, 0, "tool_calls")
    assert (rec.first_token, rec.ttft, rec.tpot, rec.itl) == (None, None, None, [])
    assert rec.empty_text
    assert derive_outcome(rec.to_json(), max_tokens=8) == ("completed", ())
    assert_valid_evidence(rec)


def test_a_tool_call_with_usage_on_every_chunk_is_timed_by_it() -> None:
    """The same with continuous usage: the events whose usage rose are the token arrivals."""
    rec = run([(0.2, _chat_event({"role": "assistant"}, ct=0)), (0.3, _chat_event({"tool_calls": TOOL_CALL}, ct=2)),
               (0.5, _chat_event({"tool_calls": TOOL_CALL}, ct=4)), (0.5, usage_only(4)), (0.5, DONE)], CHAT)  # fmt: skip
    assert (rec.outcome, rec.output_tokens, rec.ttft, rec.itl) == (Outcome.COMPLETED, 4, 0.3, pytest.approx([0.1, 0.1]))


def test_a_vllm_chat_stream_is_read_as_always() -> None:
    """vLLM's chat stream: a role-only first chunk (content ""), text chunks, the finish chunk and
    a usage chunk with empty choices -- TTFT at the first text, one token a chunk."""
    for usage in (False, True):
        timed = [(0.2, _chat_event({"role": "assistant", "content": ""}, ct=0 if usage else None))]
        timed += [(0.5 + 0.1 * i, _chat_event({"content": w}, ct=i + 1 if usage else None)) for i, w in enumerate(["a", " b", " c"])]
        timed += [(0.8, _chat_event({"content": ""}, finish="stop", ct=3 if usage else None)), (0.8, usage_only(3)), (0.8, DONE)]
        rec = run(timed, CHAT)
        assert (rec.outcome, rec.ttft, rec.output_tokens, rec.chunks) == (Outcome.COMPLETED, 0.5, 3, 3)
        assert rec.itl == pytest.approx([0.1, 0.1]) and rec.itl_source == (ItlSource.USAGE if usage else ItlSource.EXACT)


def test_non_streaming_json_body() -> None:
    shape = RequestShape(Endpoint.CHAT, "m", "p", max_tokens=5, stream=False)
    body = {"id": "chat-2", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
            "finish_reason": "length"}], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}  # fmt: skip
    raw = json.dumps(body).encode()
    rec = run([(0.4, raw[:10]), (0.6, raw[10:])], shape, content_type="application/json")
    assert rec.outcome is Outcome.COMPLETED
    assert (rec.ttft, rec.output_tokens, rec.chunks, rec.tpot, rec.itl) == (0.4, 5, 1, None, [])
    assert (rec.tokens_source, rec.finish_reason, rec.server_id) == (TokensSource.USAGE, "length", "chat-2")


# ---------------------------------------------------------------------------------------------
# outcome classification


@pytest.mark.parametrize(
    ("timed", "error"),
    [
        ([(1.0, chunk("a")), (1.1, b'data: {"error": {"message": "boom", "code": 500}}\n\n'), (1.1, DONE)],
         "error event: boom"),
        ([(1.0, chunk("a")), (1.1, b'data: {"object": "error", "message": "old style"}\n\n'), (1.1, DONE)],
         "error event: old style"),
        ([(1.0, chunk("a")), (1.1, b"event: error\ndata: overloaded\n\n"), (1.1, DONE)], "error event: overloaded"),
        ([(1.0, chunk("a", finish="error")), (1.1, DONE)], "finish_reason: error"),
        ([(1.0, chunk("a", ct=1)), (1.1, chunk("b", ct=2, finish="abort")), (1.1, usage_only(2)), (1.2, DONE)],
         "finish_reason: abort"),
        ([(1.0, chunk("a")), (1.1, chunk("b"))], "stream ended without data: [DONE]"),
        ([(1.0, chunk("", finish="length")), (1.1, DONE)], "0 completion tokens and no text"),
        ([(1.0, chunk("", ct=0)), (1.0, chunk("", ct=0, finish="length")), (1.1, DONE)],
         "0 completion tokens and no text"),
        ([(1.0, b"data: {not json\n\n"), (1.0, chunk("a")), (1.1, DONE)], "malformed JSON in the response: {not json"),
        ([(1.0, b"data: [1, 2]\n\n"), (1.0, chunk("a")), (1.1, DONE)], "malformed response, not a JSON object: [1, 2]"),
        ([(1.0, chunk("a")), (1.1, usage_only(0)), (1.1, DONE)], "usage says 0 completion tokens for 1 text chunks"),
        ([(1.0, b'data: {"choices": ["x"]}\n\n'), (1.0, chunk("a")), (1.1, DONE)],
         'malformed response, unexpected JSON shape: {"choices": ["x"]}'),
        ([(1.0, b'data: {"choices": [{"text": 5}]}\n\n'), (1.0, chunk("a")), (1.1, DONE)],
         'malformed response, unexpected JSON shape: {"choices": [{"text": 5}]}'),
        ([(1.0, chunk("a")), (1.0, b'data: {"usage": {"completion_tokens": "7"}}\n\n'), (1.1, DONE)],
         'malformed response, unexpected JSON shape: {"usage": {"completion_tokens": "7"}}'),
    ],
    ids=["error-key", "error-object", "error-event", "finish-error", "finish-abort", "no-done", "no-text", "no-text-zero-usage", "bad-json",
         "not-object", "zero-tokens", "choice-not-object", "text-not-string", "usage-not-int"],  # fmt: skip
)  # fmt: skip
def test_failures_after_http_200(timed, error) -> None:
    rec = run(timed)
    assert (rec.outcome, rec.error, rec.status) == (Outcome.FAILED, error, 200)


def test_first_error_wins_and_is_truncated() -> None:
    long = "x" * 2000
    rec = run([(1.0, b"event: error\ndata: " + long.encode() + b"\n\n"), (1.1, b'data: {"error": "second"}\n\n')])
    assert rec.outcome is Outcome.FAILED
    assert rec.error == ("error event: " + long)[:500]


@pytest.mark.parametrize(("status", "outcome"), [(429, Outcome.REJECTED), (400, Outcome.REJECTED),
                                                   (500, Outcome.FAILED), (302, Outcome.FAILED)])  # fmt: skip
def test_http_status(status, outcome) -> None:
    rec = run([(0.1, b'{"error": "too many"}')], status=status, content_type="application/json")
    assert (rec.outcome, rec.status, rec.error) == (outcome, status, f'HTTP {status}: {{"error": "too many"}}')
    assert rec.first_token is None and rec.output_sha256 is None


def test_wrong_content_type() -> None:
    rec = run([(0.1, b'{"choices": []}')], content_type="application/json")
    assert rec.outcome is Outcome.FAILED
    assert rec.error == "unexpected content-type 'application/json' for a stream: {\"choices\": []}"


@pytest.mark.parametrize("coding", ["gzip", "br", "GZIP", "identity, gzip"])
def test_an_encoded_body_fails_naming_its_encoding(coding) -> None:
    """A 200 in a content-encoding soakspec did not ask for (it sends accept-encoding: identity)
    fails saying so, not as "stream ended without data: [DONE]"; its bytes are not parsed."""
    acc = StreamAccumulator(COMPLETIONS)
    acc.on_response(200, "text/event-stream", coding)
    assert acc.on_body(b"\x1f\x8b\x08\x00" + b"\x00" * 40, 1.0)
    acc.on_end(1.1)
    rec = RequestRecord("r", intended_start=0.0, start=0.0)
    acc.finish(rec, 1.2)
    assert (rec.outcome, rec.status, rec.chunks) == (Outcome.FAILED, 200, 0)
    assert rec.error == (f"response body in content-encoding {coding!r}, which soakspec does not decode "
                         "(it asks for accept-encoding: identity)")  # fmt: skip
    for plain in (None, "identity", " Identity ", ""):
        acc = StreamAccumulator(COMPLETIONS)
        acc.on_response(200, "text/event-stream", plain)
        assert acc.outcome is None


def test_event_too_large_stops_reading() -> None:
    rec = run([(1.0, chunk("a")), (1.1, b"data: " + b"x" * 300), (1.2, b"x" * 300)], limits=Limits(max_event_bytes=500))
    assert (rec.outcome, rec.error) == (Outcome.FAILED, "SSE event too large")
    assert rec.chunks == 1


def test_response_too_large_stops_reading() -> None:
    rec = run([(1.0, chunk("a"))] * 10, limits=Limits(max_response_bytes=500))
    assert rec.outcome is Outcome.FAILED and rec.error.startswith("response too large")


def test_transport_failures() -> None:
    acc = StreamAccumulator(COMPLETIONS)
    acc.on_response(200, "text/event-stream")
    acc.on_body(chunk("a"), 0.2)
    acc.connection_closed()
    acc.fail(Outcome.TIMEOUT, "later")
    rec = RequestRecord("r", intended_start=0.0)
    acc.finish(rec, 1.0)
    assert (rec.outcome, rec.chunks) == (Outcome.DISCONNECTED, 1)
    assert rec.error == "connection closed before the response finished"
    acc = StreamAccumulator(COMPLETIONS)
    acc.connection_closed()
    acc.finish(rec, 1.0)
    assert (rec.outcome, rec.error, rec.status) == (Outcome.DISCONNECTED, "connection closed before the response", None)


def test_describe_transport_error_finds_the_root_oserror() -> None:
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError as inner:
            raise trio.BrokenResourceError from inner
    except trio.BrokenResourceError as exc:
        assert describe_transport_error(exc) == "connection reset by peer (econnreset)"
    group = OSError("all attempts failed")
    group.__cause__ = ExceptionGroup("x", [ConnectionRefusedError(111, "Connection refused")])
    assert describe_transport_error(group) == "connection refused (econnrefused)"
    assert describe_transport_error(RuntimeError("odd")) == "RuntimeError: odd"


# ---------------------------------------------------------------------------------------------
# the server's counts: a usage that is no count, a chunk that claims more than a chunk can carry


def assert_valid_evidence(rec: RequestRecord) -> None:
    """What `verify` accepts: the line decodes, keeps its cross-field rules, matches the schema."""
    import dataclasses

    from soakspec.evidence import schema
    from soakspec.evidence.record import decode_line

    rec = dataclasses.replace(rec, backend="b", workload="w")  # what the runner fills in around the protocol
    decode_line(rec.to_line())
    assert schema.validate("request", rec.to_json()) == []


def _usage_event(text: str | None, usage: dict) -> bytes:
    obj: dict = {"id": "cmpl-1", "choices": [] if text is None else [{"index": 0, "text": text}], "usage": usage}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@pytest.mark.parametrize(
    ("timed", "error"),
    [
        ([(1.0, chunk("a", ct=1)), (1.1, chunk("b", ct=-5)), (1.2, chunk("c", ct=3)), (1.2, DONE)],
         "malformed response: usage.completion_tokens is -5"),
        ([(1.0, chunk("a")), (1.1, chunk("b")), (1.1, usage_only(-5)), (1.2, DONE)],
         "malformed response: usage.completion_tokens is -5"),
        ([(1.0, _usage_event("a", {"prompt_tokens": -1, "completion_tokens": 1})), (1.1, DONE)],
         "malformed response: usage.prompt_tokens is -1"),
        ([(1.0, chunk("a", ct=1)), (1.1, usage_only(2**63)), (1.1, DONE)],
         "malformed response: usage.completion_tokens is 9223372036854775808"),
        ([(1.0, chunk("a", ct=1)), (1.1, usage_only(-(10**40))), (1.1, DONE)],
         "malformed response: usage.completion_tokens is -a 41-digit number"),
    ],
    ids=["negative-continuous", "negative-final", "negative-prompt", "beyond-int64", "huge-negative"],
)  # fmt: skip
def test_a_usage_that_is_no_count_fails_the_request_and_the_record_stays_valid(timed, error) -> None:
    """A negative (or out-of-range) usage count is the server's bug: the request fails with a
    message that says so, and its record is valid evidence -- `-5` recorded as output_tokens
    made every such record fail `verify` (V104), as if the evidence had been tampered with."""
    rec = run(timed)
    assert (rec.outcome, rec.error) == (Outcome.FAILED, error)
    assert rec.output_tokens >= 0 and (rec.prompt_tokens is None or rec.prompt_tokens >= 0)
    assert_valid_evidence(rec)


def test_a_non_streaming_negative_usage_fails_too() -> None:
    shape = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=5, stream=False)
    body = {"id": "c", "choices": [{"index": 0, "text": "hello", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": -5}}  # fmt: skip
    rec = run([(0.4, json.dumps(body).encode())], shape, content_type="application/json")
    assert (rec.outcome, rec.error) == (Outcome.FAILED, "malformed response: usage.completion_tokens is -5")
    assert_valid_evidence(rec)


def test_a_server_that_streams_32_tokens_a_chunk_is_measured_per_token() -> None:
    """SGLang `--stream-interval 32` (and vLLM's) send 32 tokens a chunk, with cumulative usage on
    each. That is a legitimate stream: within max_tokens = 64, each chunk's gap is split over its
    32 tokens and the judge accepts the count. With a fixed bound of 16 tokens a chunk the judge
    flagged it usage_mismatch ("64 completion tokens reported for 2 text chunks (more than 16 a
    chunk)") -- throughput counted 2 chunks for 64 tokens, TPOT and ITL were left out -- and the
    runner recorded one gap for 32 tokens."""
    from soakspec.judge.rederive import usage_problem

    shape = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=64, ignore_eos=True)
    rec = run([(1.0, chunk("a" * 32, ct=32)), (1.32, chunk("b" * 32, ct=64, finish="length")),
               (1.32, usage_only(64)), (1.32, DONE)], shape)  # fmt: skip
    assert (rec.outcome, rec.output_tokens, rec.chunks, rec.itl_source) == (Outcome.COMPLETED, 64, 2, ItlSource.USAGE)
    assert rec.itl == pytest.approx([0.01] * 32) and rec.tpot == pytest.approx(0.01)
    assert rec.coalesced == 31  # one chunk's gap split 32 ways: one measurement
    assert usage_problem(rec.to_json(), 64) is None
    assert usage_problem(rec.to_json(), 64, False) is None
    assert_valid_evidence(rec)


@pytest.mark.parametrize("claim", [8, 100_000, 10**12])
def test_a_chunk_that_takes_the_count_past_max_tokens_adds_one_gap(claim) -> None:
    """Continuous usage says the middle chunk carried `claim` tokens, past the request's
    max_tokens = 8 (no response has more: the server's bug). The claim does not split the chunk's
    gap: it adds one gap, its whole gap (10^12 once ran the runner out of memory, 10^5 cost the
    client enough to cut throughput 40x). The record keeps the claimed output_tokens and its
    chunks, and the judge flags it, with or without ignore_eos."""
    from soakspec.judge.rederive import usage_problem

    rec = run([(1.0, chunk("a", ct=1)), (1.1, chunk("b", ct=1 + claim)), (1.3, chunk("c", ct=2 + claim)), (1.3, DONE)])
    assert COMPLETIONS.max_tokens == 8 and not COMPLETIONS.ignore_eos
    assert (rec.outcome, rec.output_tokens, rec.chunks, rec.itl_source) == (Outcome.COMPLETED, 2 + claim, 3, ItlSource.USAGE)
    assert rec.itl == pytest.approx([0.1, 0.2]) and rec.coalesced == 0
    assert_valid_evidence(rec)
    assert usage_problem(rec.to_json(), 8) == f"{2 + claim} completion tokens reported at max_tokens = 8 (no response has more)"


@pytest.mark.parametrize("claim", [MAX_TOKENS_PER_CHUNK + 1, 100_000, 10**12])
def test_without_max_tokens_a_chunk_claiming_more_than_the_fixed_bound_adds_one_gap(claim) -> None:
    """A request without a max_tokens (0) has no bound of its own: the fixed bound per chunk
    stands in, in the runner's split as in the judge's flag (for a request whose workload it
    cannot tie to a max_tokens)."""
    from soakspec.judge.rederive import usage_problem

    shape = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=0)
    rec = run([(1.0, chunk("a", ct=1)), (1.1, chunk("b", ct=1 + claim)), (1.3, chunk("c", ct=2 + claim)), (1.3, DONE)],
              shape)  # fmt: skip
    assert (rec.outcome, rec.output_tokens, rec.chunks) == (Outcome.COMPLETED, 2 + claim, 3)
    assert rec.itl == pytest.approx([0.1, 0.2]) and rec.coalesced == 0
    flagged = usage_problem(rec.to_json(), None)
    assert (flagged is not None) == (2 + claim > 3 * MAX_TOKENS_PER_CHUNK), flagged
    if flagged:
        assert flagged.startswith(f"{2 + claim} completion tokens reported for 3 text chunks (more than 16 a chunk")


def test_a_final_usage_spread_beyond_the_bound_adds_one_gap_per_chunk() -> None:
    rec = run([(1.0, chunk("a")), (1.1, chunk("b")), (1.25, chunk("c")), (1.25, usage_only(10**12)), (1.3, DONE)])
    assert (rec.outcome, rec.output_tokens, rec.itl_source) == (Outcome.COMPLETED, 10**12, ItlSource.ESTIMATED)
    assert rec.itl == pytest.approx([0.1, 0.15])


def test_a_chunk_within_max_tokens_is_split_and_one_past_it_is_not() -> None:
    k = 40  # more than the fixed bound: only max_tokens bounds a chunk
    shape = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=1 + k)
    rec = run([(1.0, chunk("a", ct=1)), (1.4, chunk("b", ct=1 + k)), (1.4, DONE)], shape)
    assert rec.itl == pytest.approx([0.4 / k] * k) and rec.coalesced == k - 1
    shape = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=k)
    rec = run([(1.0, chunk("a", ct=1)), (1.4, chunk("b", ct=1 + k)), (1.4, DONE)], shape)
    assert rec.itl == pytest.approx([0.4]) and rec.coalesced == 0


def test_a_usage_that_rises_and_falls_splits_at_most_max_tokens_gaps() -> None:
    """A count that goes up and down again (a server bug, `usage_decreased`) cannot make the
    runner split more than max_tokens gaps: the tokens split are counted as they go, not read
    off the cumulative count."""
    timed = [(1.0, chunk("a", ct=1))]
    for i in range(50):
        timed += [(1.1 + 0.01 * i, chunk("b", ct=8)), (1.1 + 0.01 * i, chunk("c", ct=1))]
    rec = run(timed + [(2.0, DONE)])
    assert rec.usage_decreased and len(rec.itl) <= COMPLETIONS.max_tokens + 100


def test_the_runner_and_the_judge_share_the_bound() -> None:
    from soakspec.evidence import record
    from soakspec.judge import rederive
    from soakspec.runner import protocol

    assert rederive.MAX_TOKENS_PER_CHUNK is record.MAX_TOKENS_PER_CHUNK is protocol.MAX_TOKENS_PER_CHUNK
    assert rederive.usage_bound is record.usage_bound is protocol.usage_bound
    assert (record.usage_bound(64), record.usage_bound(0), record.usage_bound(None)) == (64, None, None)


# any sign and size, but nothing between 10^5 and 2^40: a runner that expands claims per token
# must fail at once (no list of 2^40 gaps can be allocated), not fill the machine's memory
_COUNT = st.one_of(
    st.none(), st.integers(-3, 40), st.integers(2**40, 10**30), st.integers(-(10**30), -1),
    st.sampled_from([10**5, 10**12, 2**63 - 1, 2**63, -(2**63)]),
)  # fmt: skip


@given(st.lists(st.tuples(st.sampled_from([None, "", "a", "bc"]), _COUNT), max_size=12), _COUNT)
def test_any_usage_sequence_gives_a_valid_record_with_bounded_work(events, final) -> None:
    """Property: whatever counts the server reports (any size, either sign, per chunk or at the
    end, with or without text), the accumulator never raises, the record is valid evidence, the
    work is bounded -- at most max_tokens split ITL gaps and one gap per other event, within the
    test's deadline -- and a count that is not one fails the request, saying so."""
    timed: list[tuple[float, bytes]] = []
    for i, (text, ct) in enumerate(events):
        if text is None and ct is None:
            continue
        timed.append((1.0 + 0.01 * i, usage_only(ct) if text is None else chunk(text, ct=ct)))  # type: ignore[arg-type]
    if final is not None:
        timed.append((1.2, usage_only(final)))
    timed.append((1.2, DONE))
    rec = run(timed)
    assert_valid_evidence(rec)
    assert len(rec.itl) <= COMPLETIONS.max_tokens + len(timed)
    bad = [ct for _, ct in [*events, (None, final)] if ct is not None and not 0 <= ct < 2**63]
    if bad:
        assert rec.outcome is Outcome.FAILED and rec.error.startswith("malformed response: usage."), rec.error


# ---------------------------------------------------------------------------------------------
# records and the clock


def test_record_json_schema_round_trip() -> None:
    rec = run([(1.0, chunk("abcd", ct=4)), (1.2, chunk("efgh", ct=8)), (1.2, DONE)])
    rec.backend, rec.workload, rec.level, rec.concurrency, rec.bucket, rec.worker = "b", "w", 1, 8, -1, 3
    d = rec.to_json()
    assert tuple(d) == RECORD_KEYS
    assert json.loads(json.dumps(d)) == d
    assert list(unpack_gaps(d["itl_us"])) == [50000] * 4 and rec.freeze().ttft == 1.0 and d["outcome"] == "completed"
    back = RequestRecord.from_json(d)
    assert back.to_json() == d
    with pytest.raises(ValueError, match="missing"):
        RequestRecord.from_json({k: v for k, v in d.items() if k != "end"})


def test_run_clock_is_epoch_and_monotonic() -> None:
    clock = RunClock()
    a, b = clock.now(), clock.now()
    assert a <= b and abs(a - time.time()) < 0.1
    assert RunClock(lambda: 5.0, epoch=100.0).now() == 100.0


async def test_run_clock_to_trio() -> None:
    clock = RunClock()
    assert clock.to_trio(clock.now() + 2.0) == pytest.approx(trio.current_time() + 2.0, abs=0.01)
    assert clock.to_trio(float("inf")) == float("inf")


# ---------------------------------------------------------------------------------------------
# the server's own word (issue 16): completion tokens without text


def test_tokens_that_decode_to_empty_text_complete_and_are_flagged() -> None:
    """HTTP 200, `finish_reason: length`, usage rising to 3, `[DONE]`, no error -- but every
    token's text is empty (a real model's special tokens). The server says it completed: the
    record is COMPLETED with `empty_text`, 3 tokens, TTFT at the first token event and ITL
    from the events whose usage rose."""
    rec = run([(1.0, chunk("", ct=1)), (1.2, chunk("", ct=2)), (1.5, chunk("", ct=3, finish="length")),
               (1.5, usage_only(3)), (1.6, DONE)])  # fmt: skip
    assert (rec.outcome, rec.error, rec.empty_text) == (Outcome.COMPLETED, None, True)
    assert (rec.output_tokens, rec.chunks, rec.output_chars, rec.output_sha256) == (3, 0, 0, None)
    assert rec.ttft == pytest.approx(1.0) and rec.first_token == pytest.approx(1.0)
    assert rec.itl == pytest.approx([0.2, 0.3]) and rec.tpot == pytest.approx(0.25)
    assert rec.to_json()["empty_text"] is True


def test_empty_text_with_only_a_final_usage_completes_without_token_times() -> None:
    """No per-event usage: the tokens came in the empty-text chunks, when is unknown. The request
    is completed (the server's `[DONE]` and usage decide), but TTFT and TPOT are not measured --
    not the final usage event's time (an upper bound), not 0."""
    rec = run([(1.0, chunk("")), (1.2, chunk("", finish="length")), (1.4, usage_only(2)), (1.5, DONE)])
    assert (rec.outcome, rec.empty_text, rec.output_tokens) == (Outcome.COMPLETED, True, 2)
    assert (rec.first_token, rec.ttft, rec.itl, rec.tpot) == (None, None, [], None)


def test_a_stream_with_text_is_never_flagged_empty_and_its_ttft_is_its_first_token() -> None:
    """A token event without text before the first text (usage 1): the record is not
    `empty_text`, and TTFT is that first token's arrival (usage on every chunk says it came then)."""
    rec = run([(1.0, chunk("", ct=1)), (1.2, chunk("a", ct=2)), (1.3, chunk("b", ct=3, finish="length")), (1.4, DONE)])
    assert (rec.outcome, rec.empty_text, rec.output_tokens) == (Outcome.COMPLETED, False, 3)
    assert rec.ttft == pytest.approx(1.0) and rec.itl == pytest.approx([0.2, 0.1])


def test_an_empty_text_stream_that_fails_is_not_flagged() -> None:
    rec = run([(1.0, chunk("", ct=1)), (1.2, b'data: {"error": {"message": "engine died"}}\n\n'), (1.3, DONE)])
    assert (rec.outcome, rec.error, rec.empty_text) == (Outcome.FAILED, "error event: engine died", False)


def test_non_streaming_empty_content_with_usage_completes() -> None:
    shape = RequestShape(Endpoint.CHAT, "m", "p", max_tokens=5, stream=False)
    body = {"id": "chat-3", "choices": [{"index": 0, "message": {"role": "assistant", "content": ""},
            "finish_reason": "length"}], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}  # fmt: skip
    rec = run([(0.4, json.dumps(body).encode())], shape, content_type="application/json")
    assert (rec.outcome, rec.empty_text, rec.output_tokens, rec.ttft) == (Outcome.COMPLETED, True, 5, 0.4)


# ---------------------------------------------------------------------------------------------
# the measurement audit: reasoning tokens, a first chunk of several tokens, untimed tokens


def vllm(text: str | None = None, *, ct: int | None = None, finish: str | None = None, delta: dict | None = None) -> bytes:
    """One event in vLLM's compact byte layout (the one the fast path reads): a chat chunk when
    `delta` is given, a completions chunk when `text` is, else a usage-only chunk (`choices: []`)."""
    chat = delta is not None
    obj: dict = {"id": "chatcmpl-1" if chat else "cmpl-1", "object": "chat.completion.chunk" if chat else "text_completion",
                 "created": 1, "model": "m", "choices": []}  # fmt: skip
    if chat or text is not None:
        body = {"delta": delta} if chat else {"text": text}
        obj["choices"] = [{"index": 0, **body, "logprobs": None, "finish_reason": finish}]
    if ct is not None:
        obj["usage"] = {"prompt_tokens": 3, "total_tokens": 3 + ct, "completion_tokens": ct}
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def record_of(timed: list[tuple[float, bytes]], shape: RequestShape = COMPLETIONS, *, fast: bool = True) -> RequestRecord:
    """`run`, through the fast path (`fast`) or through SSEParser + json only."""
    acc = StreamAccumulator(shape)
    if not fast:
        acc._fast = None
    acc.on_response(200, "text/event-stream")
    for t, data in timed:
        assert acc.on_body(data, t)
    acc.on_end(timed[-1][0])
    rec = RequestRecord("r", intended_start=0.0, start=0.0)
    acc.finish(rec, 10.0)
    return rec


def _thought(field: str, text: str) -> dict:
    if field == "both":  # vLLM keeps the two in sync (reasoning_content is the deprecated name)
        return {"reasoning": text, "reasoning_content": text}
    return {field: text}


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-parser"])
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "both"])
def test_reasoning_tokens_are_output_tokens(field, fast) -> None:
    """GuideLLM #737: a reasoning model's first tokens come in `delta.reasoning_content` (vLLM's
    reasoning parsers; newer vLLM `delta.reasoning`, or both with the same text). They are output
    tokens: TTFT ends at the first of them (201 ms, not the first content token's 352 ms), each
    chunk is a token event of its own (its ITL gap is not folded into the first content chunk),
    and the record's text is the reasoning then the content."""
    shape = RequestShape(Endpoint.CHAT, "m", "p", max_tokens=5)
    timed = [(0.150, vllm(delta={"role": "assistant", "content": ""}, ct=0)),
             (0.201, vllm(delta=_thought(field, "Let"), ct=1)), (0.251, vllm(delta=_thought(field, " me"), ct=2)),
             (0.301, vllm(delta=_thought(field, " think"), ct=3)), (0.352, vllm(delta={"content": "Hi"}, ct=4)),
             (0.402, vllm(delta={"content": "!"}, ct=5, finish="length")), (0.402, vllm(ct=5)), (0.403, DONE)]  # fmt: skip
    rec = record_of(timed, shape, fast=fast)
    assert (rec.outcome, rec.error, rec.empty_text) == (Outcome.COMPLETED, None, False)
    assert (rec.output_tokens, rec.chunks, rec.itl_source) == (5, 5, ItlSource.USAGE)
    assert rec.ttft == pytest.approx(0.201)
    assert rec.itl == pytest.approx([0.05, 0.05, 0.051, 0.05])
    assert rec.tpot == pytest.approx(0.201 / 4)
    assert (rec.output_chars, rec.output_sha256) == (15, hashlib.sha256(b"Let me thinkHi!").hexdigest())


def test_a_reasoning_only_answer_is_text() -> None:
    """max_tokens reached while the model still reasons, no usage at all: the reasoning chunks are
    the counted tokens, and the answer is not empty (nor a failure for having no content)."""
    shape = RequestShape(Endpoint.CHAT, "m", "p", max_tokens=3)
    rec = record_of([(0.2, vllm(delta={"reasoning_content": "Hmm"})), (0.25, vllm(delta={"reasoning_content": ","})),
                     (0.3, vllm(delta={"reasoning_content": " so"}, finish="length")), (0.3, DONE)], shape)  # fmt: skip
    assert (rec.outcome, rec.error, rec.empty_text) == (Outcome.COMPLETED, None, False)
    assert (rec.output_tokens, rec.tokens_source, rec.chunks, rec.ttft) == (3, TokensSource.COUNTED, 3, 0.2)
    assert rec.itl == pytest.approx([0.05, 0.05]) and rec.output_sha256 == hashlib.sha256(b"Hmm, so").hexdigest()


def test_non_streaming_reasoning_is_output_text() -> None:
    shape = RequestShape(Endpoint.CHAT, "m", "p", max_tokens=5, stream=False)
    body = {"id": "chat-4", "choices": [{"index": 0, "message": {"role": "assistant", "content": None,
            "reasoning_content": "Let me"}, "finish_reason": "length"}], "usage": {"prompt_tokens": 2, "completion_tokens": 5}}  # fmt: skip
    rec = run([(0.4, json.dumps(body).encode())], shape, content_type="application/json")
    assert (rec.outcome, rec.empty_text, rec.output_chars, rec.chunks) == (Outcome.COMPLETED, False, 6, 1)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-parser"])
def test_tpot_leaves_out_the_tokens_of_the_first_chunk(fast) -> None:
    """AIPerf PR #1279: 3 tokens at 200 ms, then 1 every 50 ms to 550 ms (10 tokens). TPOT is
    (last - first) / (tokens - k1) = 350 / 7 = 50 ms, the mean of the ITL gaps -- not
    350 / 9 = 38.9 ms, deflated by the first chunk's tokens that add no gap."""
    timed = [(0.2, vllm("abc", ct=3))]
    timed += [(round(0.2 + 0.05 * i, 3), vllm(c, ct=3 + i, finish="length" if i == 7 else None)) for i, c in enumerate("defghij", 1)]
    timed += [(0.55, vllm(ct=10)), (0.55, DONE)]
    rec = record_of(timed, fast=fast)
    assert (rec.outcome, rec.output_tokens, rec.chunks, rec.ttft) == (Outcome.COMPLETED, 10, 8, 0.2)
    assert rec.itl == pytest.approx([0.05] * 7)
    assert rec.tpot == pytest.approx(0.05) and rec.tpot == pytest.approx(sum(rec.itl) / len(rec.itl))


@pytest.mark.parametrize("usage", ["continuous", "final only"])
def test_no_tpot_when_the_first_chunk_carried_every_token(usage) -> None:
    """All 10 tokens in the first chunk (per the server's usage): there is no time per token
    after the first event to measure -- TPOT is none (the judge says why it leaves the request
    out), not 0."""
    rec = record_of([(0.2, vllm("abcdefghij", ct=10 if usage == "continuous" else None, finish="length")),
                     (0.2, vllm(ct=10)), (0.21, DONE)])  # fmt: skip
    assert (rec.outcome, rec.output_tokens, rec.chunks, rec.ttft) == (Outcome.COMPLETED, 10, 1, 0.2)
    assert (rec.itl, rec.tpot) == ([], None)


def test_tpot_is_0_when_later_chunks_shared_the_first_ones_read() -> None:
    """Later chunks that one client read brought together with the first are still token events
    of their own: TPOT 0 (not none, so the fastest requests are not left out), every gap coalesced."""
    data = vllm("abc", ct=3) + b"".join(vllm(c, ct=3 + i) for i, c in enumerate("defghij", 1)) + vllm(ct=10) + DONE
    rec = record_of([(0.2, data)])
    assert (rec.output_tokens, rec.tpot, rec.itl, rec.coalesced) == (10, 0.0, [0.0] * 7, 7)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-parser"])
@pytest.mark.parametrize("reads", ["a read per event", "one read"])
@pytest.mark.parametrize("usage_in", ["a usage-only event", "the last chunk"])
def test_tokens_without_text_or_per_chunk_usage_have_no_ttft_or_tpot(fast, reads, usage_in) -> None:
    """Six chunks of empty text carry the tokens from 200 to 450 ms; only the last event has
    usage (10). When the tokens arrived is unknown: the request is completed (`[DONE]` and the
    server's usage decide), with no TTFT -- not the usage event's 462 ms, an upper bound charged
    to the server -- and no TPOT (not 0.0, which would pass any TPOT bound on missing data)."""
    assert protocol_fast_layout(vllm(""))
    timed = [(round(0.2 + 0.05 * i, 3), vllm("", finish="length" if i == 5 else None)) for i in range(6)]
    if usage_in == "the last chunk":
        timed[-1] = (0.462, vllm("", ct=10, finish="length"))
    else:
        timed.append((0.462, vllm(ct=10)))
    timed.append((0.47, DONE))
    if reads == "one read":
        timed = [(0.47, b"".join(d for _, d in timed))]
    rec = record_of(timed, fast=fast)
    assert (rec.outcome, rec.error, rec.empty_text, rec.output_tokens) == (Outcome.COMPLETED, None, True, 10)
    assert (rec.first_token, rec.ttft, rec.tpot, rec.itl) == (None, None, None, [])


def protocol_fast_layout(event: bytes) -> bool:
    from soakspec.runner.protocol import _FAST_CHAT, _FAST_COMPLETIONS

    return bool(_FAST_COMPLETIONS.match(event) or _FAST_CHAT.match(event))


@pytest.mark.parametrize("status", [600, 777, 999, 42])
def test_a_status_beyond_http_is_the_servers_malformed_response(status) -> None:
    """h11 accepts any three digits as a status; a record holds an HTTP status code (100-599),
    so a server sending 777 is a failed request that says so, and its record stays valid
    evidence (it made `verify` call the evidence tampered)."""
    acc = StreamAccumulator(COMPLETIONS)
    acc.on_response(status, "text/plain")
    acc.on_body(b"odd", 0.2)
    rec = RequestRecord("r", intended_start=0.0)
    acc.finish(rec, 1.0)
    assert (rec.outcome, rec.status) == (Outcome.FAILED, None)
    assert rec.error == f"malformed response: HTTP status {status} is not a status code: odd"  # and the body
    assert_valid_evidence(rec)


def test_a_lone_surrogate_in_the_servers_text_is_escaped_and_the_record_is_written() -> None:
    """A hostile or buggy server's JSON may hold half a character ("\\ud800"): json decodes it
    to a lone surrogate, which no UTF-8 line can hold -- writing the record raised
    UnicodeEncodeError. It is kept as the escape, in every field of its text."""
    err = run([(1.0, chunk("a")), (1.0, b'data: {"error": {"message": "boom \\ud800"}}\n\n'), (1.1, DONE)])
    fin = run([(1.0, b'data: {"id": "x\\udc80", "choices": [{"index": 0, "text": "a", "finish_reason": "len\\ud800"}]}\n\n'),
               (1.1, DONE)])
    lines = [json.loads(rec.to_line()) for rec in (err, fin)]  # written, as every record is, frozen
    assert lines[0]["outcome"] == "failed" and lines[0]["error"] == "error event: boom \\ud800"
    assert (lines[1]["finish_reason"], lines[1]["server_id"]) == ("len\\ud800", "x\\udc80")


@pytest.mark.parametrize("where", ["an event", "the last event, without its blank line", "a non-streaming body"])
def test_json_nested_too_deeply_fails_the_request_not_the_run(where) -> None:
    """A body of 100,000 nested arrays is valid JSON within the event size limit, but json's
    decoder raises RecursionError, not ValueError: it escaped the accumulator and the whole run
    stopped ("internal error"). It is the request's failure, saying why."""
    deep = b"[" * 100_000 + b"]" * 100_000
    if where == "a non-streaming body":
        rec = run([(1.0, deep)], RequestShape(Endpoint.COMPLETIONS, "m", "p", 8, stream=False), content_type="application/json")
    else:
        rec = run([(1.0, chunk("a")), (1.1, b"data: " + deep + (b"\n\n" + DONE if where == "an event" else b""))])
    assert rec.outcome is Outcome.FAILED and rec.error.startswith("malformed response, JSON nested too deeply: [[["), rec.error
    assert_valid_evidence(rec)


def test_json_just_shallow_enough_to_read_fails_the_request_at_every_depth() -> None:
    """Near json's nesting limit, a document is read but cannot be written back into the
    failure's message from one call deeper (json.dumps raised RecursionError: the run stopped).
    At every depth the request fails, saying why, whatever the payload's shape: an unexpected
    one, an error object, an error message."""
    def deeper(n: int, f):
        return f() if n == 0 else deeper(n - 1, f)

    for d in range(850, 1000):
        nest = b"[" * d + b"]" * d
        for body in (b'{"choices": 5, "x": %s}' % nest, b'{"error": %s}' % nest, b'{"error": {"message": %s}}' % nest):
            for extra in (0, 10, 20, 30, 40):
                rec = deeper(extra, lambda: run([(1.0, b"data: " + body + b"\n\n" + DONE)]))
                assert rec.outcome is Outcome.FAILED and rec.error, (d, body[:30], rec.error)


@pytest.mark.parametrize("endpoint", [Endpoint.COMPLETIONS, Endpoint.CHAT])
def test_a_character_split_into_two_surrogate_escapes_is_two_tokens_of_text(endpoint) -> None:
    """A server (a UTF-16 one: JavaScript, .NET, Java) may stream one character past U+FFFF as
    its two surrogate halves, each in its own chunk ("\ud83d", then "\ude00"): valid JSON, but
    each chunk's text is a lone surrogate, which the output hash could not encode -- the
    accumulator raised UnicodeEncodeError and the whole run stopped ("internal error:
    ExceptionGroup"). Each half is a token event; the output counts and hashes them as sent."""
    shape = RequestShape(endpoint, "m", "p", max_tokens=16)
    chat = endpoint is Endpoint.CHAT
    hi, lo = (b'data: {"id": "x", "choices": [{"index": 0, ' + (b'"delta": {"content": "%s"}' if chat else b'"text": "%s"')
              % half + b', "finish_reason": %s}]}\n\n' % fin for half, fin in ((b"\\ud83d", b"null"), (b"\\ude00", b'"stop"')))
    rec = run([(1.0, chunk("a", chat=chat)), (1.1, hi), (1.2, lo), (1.3, DONE)], shape)
    assert (rec.outcome, rec.error, rec.output_tokens, rec.chunks, rec.output_chars) == (Outcome.COMPLETED, None, 3, 3, 3)
    assert rec.itl == pytest.approx([0.1, 0.1])
    assert json.loads(rec.to_line())["output_sha256"] == rec.output_sha256  # written, as every record is


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-parser"])
@pytest.mark.parametrize("endpoint", [Endpoint.COMPLETIONS, Endpoint.CHAT])
@pytest.mark.parametrize("reads", ["a read per event", "one read"])
def test_the_final_count_in_a_chunk_of_empty_text_is_the_output_length(fast, endpoint, reads) -> None:
    """SGLang #24254: SGLang streams its final `usage` in a chunk whose text is "" (with the
    finish_reason), after text chunks without usage. A reader that takes usage only from chunks
    with text kept output_len at max_tokens (16) for every request that stopped early. The
    record's output_tokens is the server's 3, its ITL one gap per token."""
    shape = RequestShape(endpoint, "m", "p", max_tokens=16)
    chat = endpoint is Endpoint.CHAT
    ev = (lambda text, **kw: vllm(delta={"content": text}, **kw)) if chat else vllm
    timed = [(0.2, ev("a")), (0.25, ev("b")), (0.3, ev("c")), (0.31, ev("", ct=3, finish="stop")), (0.32, DONE)]
    if reads == "one read":
        timed = [(0.32, b"".join(d for _, d in timed))]
    rec = record_of(timed, shape, fast=fast)
    assert (rec.outcome, rec.error, rec.finish_reason) == (Outcome.COMPLETED, None, "stop")
    assert (rec.output_tokens, rec.tokens_source, rec.itl_source, rec.chunks) == (3, TokensSource.USAGE, ItlSource.EXACT, 3)
    assert len(rec.itl) == 2 and not rec.usage_decreased
