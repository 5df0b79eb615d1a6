"""The streaming shapes real OpenAI-compatible servers (vLLM, SGLang) send, read by the protocol
layer as a user of the numbers expects: tool calls, several choices, the last event at EOF, a
200 whose body is not a stream."""

from __future__ import annotations

import hashlib
import json

import pytest

from soakspec.runner.protocol import Endpoint, RequestShape
from soakspec.runner.records import ItlSource, Outcome, TokensSource

from test_protocol import DONE, assert_valid_evidence, record_of, run, usage_only

CHAT = RequestShape(Endpoint.CHAT, "m", "what is the weather in Paris?", max_tokens=16)


def _delta(delta: dict, *, finish: str | None = None, ct: int | None = None, index: int = 0) -> bytes:
    obj: dict = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}  # fmt: skip
    if ct is not None:
        obj["usage"] = {"prompt_tokens": 9, "total_tokens": 9 + ct, "completion_tokens": ct}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


# vLLM's tool-call stream (serving_chat with a tool parser): a role chunk, the call's header with
# its name, the arguments in pieces, a finish chunk with finish_reason "tool_calls"
_HEADER = [{"index": 0, "id": "chatcmpl-tool-1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]
_ARGS = ['{"city', '": "Par', 'is"}']


def _tool_stream(usage: str) -> list[tuple[float, bytes]]:
    per = usage == "per-chunk"
    timed = [(0.20, _delta({"role": "assistant", "content": ""}, ct=0 if per else None)),
             (0.30, _delta({"tool_calls": _HEADER}, ct=1 if per else None))]  # fmt: skip
    for i, piece in enumerate(_ARGS):
        timed.append((0.35 + 0.05 * i, _delta({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]},
                                              ct=2 + i if per else None)))  # fmt: skip
    timed.append((0.46, _delta({}, finish="tool_calls", ct=4 if per else None)))
    if usage != "none":
        timed.append((0.46, usage_only(4)))
    return [*timed, (0.47, DONE)]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-parser"])
@pytest.mark.parametrize("usage", ["none", "final", "per-chunk"])
def test_a_tool_call_answer_is_output_text_timed_from_its_first_piece(usage, fast) -> None:
    """An agent workload (`tools` in the body): the model answers with a tool call, its tokens
    streamed as `delta.tool_calls[].function` name and arguments, `content` absent. Without usage
    every such request FAILED '0 completion tokens and no text'; with a final usage it completed
    with no TTFT (left out of every latency figure) and flagged empty_text. The name and the
    arguments are generated text: TTFT at the call's first piece (0.30 s), each piece a token
    event, the text hashed."""
    rec = record_of(_tool_stream(usage), CHAT, fast=fast)
    assert (rec.outcome, rec.error, rec.finish_reason, rec.empty_text) == (Outcome.COMPLETED, None, "tool_calls", False)
    assert (rec.ttft, rec.chunks, rec.output_tokens) == (0.30, 4, 4)
    assert rec.itl == pytest.approx([0.05, 0.05, 0.05])
    assert rec.tpot == pytest.approx(0.05)
    text = "get_weather" + "".join(_ARGS)
    assert (rec.output_chars, rec.output_sha256) == (len(text), hashlib.sha256(text.encode()).hexdigest())
    expected = {"none": TokensSource.COUNTED, "final": TokensSource.USAGE, "per-chunk": TokensSource.USAGE}[usage]
    assert rec.tokens_source is expected
    assert rec.itl_source is {"none": ItlSource.COUNTED, "final": ItlSource.EXACT, "per-chunk": ItlSource.USAGE}[usage]
    assert_valid_evidence(rec)


def test_content_then_a_tool_call_is_one_text() -> None:
    """A model that writes a sentence, then calls a tool (both in one stream): one output text."""
    timed = [(0.2, _delta({"content": "Let me check."})), (0.3, _delta({"tool_calls": _HEADER})),
             (0.4, _delta({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, finish="tool_calls")),
             (0.4, DONE)]  # fmt: skip
    rec = record_of(timed, CHAT)
    assert (rec.outcome, rec.ttft, rec.chunks) == (Outcome.COMPLETED, 0.2, 3)
    assert rec.output_sha256 == hashlib.sha256(b"Let me check.get_weather{}").hexdigest()


def test_a_non_streaming_tool_call_is_output_text() -> None:
    shape = RequestShape(Endpoint.CHAT, "m", "p", max_tokens=16, stream=False)
    body = {"id": "chat-5", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "t", "type": "function",
        "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}}], "usage": {"prompt_tokens": 2, "completion_tokens": 6}}  # fmt: skip
    rec = record_of([(0.4, json.dumps(body).encode())], shape)
    assert (rec.outcome, rec.output_tokens, rec.chunks, rec.empty_text) == (Outcome.COMPLETED, 6, 1, False)
    assert rec.output_sha256 == hashlib.sha256(b'f{"x": 1}').hexdigest()


@pytest.mark.parametrize("calls", ['"f"', '[1]', '[{"function": {"arguments": 5}}]', '[{"function": "f"}]'])
def test_a_tool_call_that_is_not_the_openai_shape_fails_saying_so(calls) -> None:
    bad = b'data: {"id":"x","choices":[{"index":0,"delta":{"tool_calls":' + calls.encode() + b'}}]}\n\n'
    rec = record_of([(0.2, _delta({"content": "a"})), (0.3, bad), (0.3, DONE)], CHAT)
    assert rec.outcome is Outcome.FAILED
    assert rec.error.startswith("malformed response, unexpected JSON shape: ")


# ---------------------------------------------------------------------------------------------
# the last event of a whole body


def _text(t: str, finish: str | None = None) -> bytes:
    return _delta({"content": t}, finish=finish)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-parser"])
@pytest.mark.parametrize("last", [b"data: [DONE]\n", b"data: [DONE]", b"data: [DONE]\r\n", b"data: [DONE]\r",
                                  b"data:[DONE]", b"data: [DO" + b"|NE]\n"])  # fmt: skip
def test_a_done_without_its_blank_line_at_the_bodys_end_completes(last, fast) -> None:
    """A server (or proxy) that ends the body right after `data: [DONE]` -- no blank line, or no
    line end at all -- said the response is complete, and the HTTP framing says nothing is
    missing: every such request FAILED 'stream ended without data: [DONE]' (vLLM's bench serve
    counts it a success). However the reads cut it."""
    reads = [(0.3 + 0.1 * i, piece) for i, piece in enumerate(last.split(b"|"))]
    rec = record_of([(0.2, _text("a")), (0.25, _text("b", finish="stop")), *reads], CHAT, fast=fast)
    assert (rec.outcome, rec.error, rec.chunks, rec.ttft) == (Outcome.COMPLETED, None, 2, 0.2)
    assert rec.latency == pytest.approx(0.3 + 0.1 * (len(reads) - 1))


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-parser"])
def test_a_whole_last_event_without_its_blank_line_is_read(fast) -> None:
    """A last text event at EOF is text that arrived (counted); the stream still lacks [DONE]."""
    rec = record_of([(0.2, _text("a")), (0.3, _text("b", finish="stop")[:-1])], CHAT, fast=fast)
    assert (rec.outcome, rec.error, rec.chunks, rec.finish_reason) == (
        Outcome.FAILED, "stream ended without data: [DONE]", 2, "stop")
    # `data: {...}` and `data: [DONE]` without the blank line between: one event of two data
    # lines, neither JSON nor [DONE] -- the server's bug, not its word that it finished
    rec = record_of([(0.2, _text("a")), (0.3, _text("b")[:-1] + DONE[:-1])], CHAT, fast=fast)
    assert (rec.outcome, rec.error, rec.chunks) == (Outcome.FAILED, "stream ended without data: [DONE]", 1)


@pytest.mark.parametrize("last", [b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"c"', b"data: [DON"])
def test_an_event_cut_short_at_the_bodys_end_is_still_no_done(last) -> None:
    rec = record_of([(0.2, _text("a")), (0.3, last)], CHAT)
    assert (rec.outcome, rec.error, rec.chunks) == (Outcome.FAILED, "stream ended without data: [DONE]", 1)


def test_an_error_event_at_the_bodys_end_is_not_lost() -> None:
    rec = record_of([(0.2, _text("a")), (0.3, b"event: error\ndata: engine dead")], CHAT)
    assert (rec.outcome, rec.error) == (Outcome.FAILED, "error event: engine dead")


# ---------------------------------------------------------------------------------------------
# one choice a request


def _choice(index: int, text: str, ct: int | None, finish: str | None = None) -> bytes:
    obj: dict = {"id": "cmpl-2", "object": "text_completion", "created": 1, "model": "m",
                 "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]}  # fmt: skip
    if ct is not None:
        obj["usage"] = {"prompt_tokens": 3, "total_tokens": 3 + ct, "completion_tokens": ct}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-parser"])
@pytest.mark.parametrize("per_chunk", [True, False])
def test_n_2_is_not_read_as_one_answer_of_twice_the_tokens(per_chunk, fast) -> None:
    """`n = 2` in the body: vLLM streams the two answers' chunks interleaved (index 0, 1), each
    with its own count in continuous usage, and the final usage counts both. Read as one answer
    of 8 tokens the request completed with TPOT 0.057 s where each answer's tokens came 0.1 s
    apart. It now fails, saying why."""
    shape = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=16, extra=(("n", 2),))
    timed = [(1.0 + 0.1 * k + 0.001 * i, _choice(i, "ab"[i], k + 1 if per_chunk else None, "stop" if k == 3 else None))
             for k in range(4) for i in range(2)]  # fmt: skip
    final = (b'data: {"id":"cmpl-2","object":"text_completion","created":1,"model":"m","choices":[],'
             b'"usage":{"prompt_tokens":3,"total_tokens":11,"completion_tokens":8}}\n\n')
    rec = record_of([*timed, (1.4, final), (1.4, DONE)], shape, fast=fast)
    assert (rec.outcome, rec.error) == (Outcome.FAILED, "the response has more than one choice (index 1): soakspec "
                                                        "measures one choice a request (n = 1 in the body)")  # fmt: skip
    assert_valid_evidence(rec)


def test_several_choices_in_one_chunk_fail_too() -> None:
    two = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}\n\n'
    rec = record_of([(0.2, two), (0.3, DONE)], CHAT)
    assert (rec.outcome, rec.error.startswith("the response has more than one choice (index 1)")) == (Outcome.FAILED, True)


def test_a_choice_without_an_index_is_the_one_choice() -> None:
    rec = record_of([(0.2, b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'), (0.3, DONE)], CHAT)
    assert (rec.outcome, rec.chunks) == (Outcome.COMPLETED, 1)


# ---------------------------------------------------------------------------------------------
# a 200 whose body is not a stream


@pytest.mark.parametrize("content_type", [None, "text/event-stream"])
@pytest.mark.parametrize("body", [b'{"object":"error","message":"model overloaded","code":503}',
                                  b'\n  {"error": {"message": "model overloaded"}}', b'[{"error": "model overloaded"}]'])  # fmt: skip
def test_a_200_whose_body_is_a_json_error_says_what_the_server_said(body, content_type) -> None:
    """A server or proxy that answers a stream request with status 200 and a plain JSON error
    body (no Content-Type, or text/event-stream): the request failed 'stream ended without data:
    [DONE]', the server's message lost. It fails naming the body and quoting it."""
    rec = run([(0.2, body[:9]), (0.3, body[9:])], CHAT, content_type=content_type)
    assert rec.outcome is Outcome.FAILED
    assert rec.error == "HTTP 200 with a JSON body, not a server-sent event stream: " + body.decode()
    assert (rec.chunks, rec.first_token) == (0, None)


@pytest.mark.parametrize("lead", [b"\n", b"\r\n", b"\n  \n", b"\xef\xbb\xbf\n"])
def test_a_json_error_after_reads_of_line_breaks_alone_says_what_the_server_said(lead) -> None:
    """The same JSON error body after a first read that held only line breaks (a proxy that
    flushes a newline first): it failed 'stream ended without data: [DONE]' -- the blank line
    had taken the parser past the stream's start, so the JSON was read as unknown SSE fields."""
    body = b'{"error": {"message": "model overloaded"}}'
    rec = run([(0.1, lead), (0.2, body)], CHAT)
    assert rec.outcome is Outcome.FAILED
    assert rec.error == "HTTP 200 with a JSON body, not a server-sent event stream: " + body.decode()


def test_line_breaks_before_a_stream_are_still_a_stream() -> None:
    """Blank lines before the first event change nothing: the stream completes as it would."""
    rec = run([(0.1, b"\n\n"), (0.2, _text("a")), (0.3, DONE)], CHAT)
    assert (rec.outcome, rec.chunks) == (Outcome.COMPLETED, 1)


@pytest.mark.parametrize("reason", ["{}", "5", '["error"]', "true"])
def test_a_finish_reason_that_is_not_a_string_is_a_malformed_response(reason) -> None:
    """It COMPLETED with finish_reason '{}' (or "['error']": a failing reason in a list, passed)."""
    bad = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":' + reason.encode() + b"}]}\n\n"
    rec = record_of([(0.2, bad), (0.3, DONE)], CHAT)
    assert (rec.outcome, rec.finish_reason) == (Outcome.FAILED, None)
    assert rec.error.startswith("malformed response, unexpected JSON shape: ")
