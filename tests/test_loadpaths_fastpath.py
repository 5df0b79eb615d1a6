"""The hot path's shortcuts change nothing: each is checked against the general code it bypasses.

- `StreamAccumulator._fast_events` (one regex split for events in vLLM's byte layout) against
  `SSEParser` + `json` on the same bytes, cut anywhere, including layouts it must refuse;
- `parse_head` (plain response heads) against h11;
- the hand-made request bytes against h11's serialization, and the body template against
  building each body in full.
"""

from __future__ import annotations

import json
from typing import Any

import h11
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from soakspec.runner import protocol
from soakspec.runner.clock import RunClock
from soakspec.runner.h11client import USER_AGENT, H11Connection, _awaiting_response, parse_head
from soakspec.runner.protocol import Endpoint, Limits, RequestShape, Sampling, StreamAccumulator, build_body
from soakspec.evidence.record import unpack_gaps
from soakspec.runner.records import RequestRecord

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# SSE streams: mostly the fast layout, with every kind of deviation mixed in

texts = st.one_of(
    st.sampled_from(["", " the", " a", "é", " 東京", "x" * 40]),
    st.text(max_size=6),  # quotes, backslashes, control characters: escaped, so not fast
)
reasons = st.sampled_from([None, None, None, "length", "stop", "error", "abort"])


def _j(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


@st.composite
def fast_head(draw, chat: bool) -> str:
    """What every event of one stream starts with."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    return f'{{"id":{_j(draw(st.sampled_from(["cmpl-1", "", "chatcmpl-é"])))},"object":"{obj}","created":{draw(st.integers(0, 2**40))},"model":"m",'


@st.composite
def fast_layout(draw, chat: bool, usages=("none", "null", "cum", "cum"), head: str | None = None):
    """An event in the fast layout, as a function of its text: everything else drawn once."""
    head = draw(fast_head(chat)) if head is None else head
    if draw(st.integers(0, 5)) == 0:
        choices = lambda text: '"choices":[]'  # noqa: E731
    else:
        if chat:
            body = draw(st.sampled_from([
                '"delta":{{"content":{}}}', '"delta":{{"role":"assistant","content":{}}}',
                '"delta":{{}}', '"delta":{{"role":"assistant"}}', '"delta":{{"content":null}}',
                # a reasoning model's thinking (vLLM's reasoning parsers): output text, as content
                '"delta":{{"reasoning_content":{}}}', '"delta":{{"reasoning":{}}}',
                '"delta":{{"reasoning":{0},"reasoning_content":{0}}}', '"delta":{{"content":null,"reasoning":{}}}',
                '"delta":{{"role":"assistant","content":"","reasoning_content":{}}}',
            ]))  # fmt: skip
        else:
            body = '"text":{}'
        reason = draw(reasons)
        stop = draw(st.sampled_from([
            "", ',"stop_reason":null', ',"stop_reason":7', ',"stop_reason":"</s>"',
            # vLLM 0.32's layout, and what the fast path must refuse: ids that are not null
            ',"stop_reason":null,"prompt_token_ids":null,"token_ids":null', ',"stop_reason":7,"token_ids":null',
            ',"stop_reason":null,"prompt_token_ids":null', ',"stop_reason":null,"token_ids":[5,6]',
            ',"token_ids":null,"prompt_token_ids":null',
        ]))  # fmt: skip
        choices = lambda text: f'"choices":[{{"index":0,{body.format(_j(text))},"logprobs":null,"finish_reason":{_j(reason)}{stop}}}]'  # noqa: E731
    usage = draw(st.sampled_from(usages))
    tail = ""
    if usage == "null":
        tail = ',"usage":null'
    elif usage == "cum":
        ct = draw(st.integers(0, 70))
        tail = f',"usage":{{"prompt_tokens":{draw(st.integers(0, 9))},"total_tokens":{ct + 3},"completion_tokens":{ct}}}'
    return lambda text: ("data: " + head + choices(text) + tail + "}\n\n").encode()


@st.composite
def fast_event(draw, chat: bool) -> bytes:
    return draw(fast_layout(chat))(draw(texts))


@st.composite
def fast_run(draw, chat: bool) -> bytes:
    """Events alike but for their text, as in a stream's middle (the bulk lane of the fast path),
    maybe ending like a stream does: an event of the same stream, with a finish_reason or usage."""
    head = draw(fast_head(chat))
    layout = draw(fast_layout(chat, usages=("none", "none", "null", "cum"), head=head))
    events = [layout(text) for text in draw(st.lists(texts, min_size=2, max_size=8))]
    for _ in range(draw(st.integers(0, 2))):
        events.append(draw(fast_layout(chat, head=head))(draw(texts)))
    return b"".join(events)


@st.composite
def odd_event(draw) -> bytes:
    """Events the fast path must leave to the general parser."""
    return draw(st.sampled_from([
        b'data: {"id": "cmpl-1", "choices": [{"index": 0, "text": " spaced"}]}\n\n',
        b'data: {"choices":[{"text":" reordered","index":0}],"id":"x"}\n\n',
        b'data: {"id":"x","object":"text_completion","created":0123,"model":"m","choices":[]}\n\n',  # leading 0
        b'data: {"id":"x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":"\xff\xfe","logprobs":null,"finish_reason":null}]}\n\n',  # not UTF-8
        b'data: {"error":{"message":"engine died","code":500}}\n\n',
        b"event: error\ndata: boom\n\n",
        b": keep-alive comment\n\n",
        b'data: {"id":"x","choices":[{"index":0,"text":" crlf"}]}\r\n\r\n',
        b'data: {"id":"x",\n\n',  # malformed
        b"data: [DONE]\n\n",
        b'data: {"id":"x","choices":[{"index":0,"text":" multi"}],\ndata: "usage":null}\n\n',
    ]))  # fmt: skip


@st.composite
def stream(draw, chat: bool) -> tuple[bytes, list[int]]:
    events = draw(st.lists(st.one_of(fast_event(chat), fast_run(chat), fast_run(chat), odd_event()), max_size=14))
    if draw(st.booleans()):
        events.append(b"data: [DONE]\n\n")
        events += draw(st.lists(fast_event(chat), max_size=2))  # after [DONE]: ignored
    data = b"".join(events)
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=6))))
    return data, cuts


def _accumulate(data: bytes, cuts: list[int], shape: RequestShape, limits: Limits, fast: bool, ended: bool):
    acc = StreamAccumulator(shape, limits)
    if not fast:
        acc._fast = None  # everything goes through SSEParser
    acc.on_response(200, "text/event-stream")
    t = 100.0
    kept = True
    for a, b in zip([0, *cuts], [*cuts, len(data)]):
        t += 0.01
        if b > a and not (kept := acc.on_body(data[a:b], t)):
            break
    if ended and kept:
        acc.on_end(t)
    rec = RequestRecord("r", intended_start=99.0, start=99.0)
    acc.finish(rec, t + 0.01)
    return kept, rec.to_json()


def _ev(text: str | None, ct: int) -> bytes:
    choices = "[]" if text is None else '[{"index":0,"text":%s,"logprobs":null,"finish_reason":null}]' % _j(text)
    return ('data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":%s,'
            '"usage":{"prompt_tokens":1,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (choices, ct + 1, ct)).encode()


# usage rises on a usage-only chunk, then falls back to 0 on the next (an audit found the general
# parser missed the fall to 0 that the fast path flags: `usage_decreased` hung on the reads)
USAGE_BACK_TO_NONE = _ev("q", 0) + _ev(None, 1) + _ev(None, 0) + _ev("bb", 2) + b"data: [DONE]\n\n"


@SETTINGS
@given(st.booleans().flatmap(lambda chat: st.tuples(st.just(chat), stream(chat))), st.booleans(),
       st.sampled_from([protocol.DEFAULT_LIMITS, Limits(max_event_bytes=200, max_response_bytes=1500)]))  # fmt: skip
@example((False, (USAGE_BACK_TO_NONE, [])), True, protocol.DEFAULT_LIMITS)
@example((False, (USAGE_BACK_TO_NONE, [len(_ev("q", 0)), len(_ev("q", 0) + _ev(None, 1))])), True, protocol.DEFAULT_LIMITS)
def test_fast_events_equal_the_general_parser(case, ended, limits) -> None:
    """For any byte stream cut anywhere: the same record, and reading stops at the same point."""
    chat, (data, cuts) = case
    shape = RequestShape(Endpoint.CHAT if chat else Endpoint.COMPLETIONS, "m", "p", max_tokens=16)
    assert _accumulate(data, cuts, shape, limits, True, ended) == _accumulate(data, cuts, shape, limits, False, ended)


def test_the_fast_path_takes_vllm_and_simulator_events() -> None:
    """It is not vacuous: a vLLM-layout stream is read without the general parser."""
    events = [
        b'data: {"id":"cmpl-7","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
        b'"text":" t%d","logprobs":null,"finish_reason":null,"stop_reason":null}],'
        b'"usage":{"prompt_tokens":3,"total_tokens":%d,"completion_tokens":%d}}\n\n' % (i, i + 4, i + 1)
        for i in range(5)
    ]
    data = b"".join(events) + b"data: [DONE]\n\n"
    acc = StreamAccumulator(RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=5))
    acc.on_response(200, "text/event-stream")
    assert acc._fast_events(data, 1.0) == len(data)
    assert (acc.chunks, acc._usage, acc.done, acc.server_id) == (5, 5, True, "cmpl-7")


VLLM_032_EVENT = (
    b'data: {"id":"cmpl-9a87260aedde1d55","object":"text_completion","created":1796135242,"model":"tiny",'
    b'"choices":[{"index":0,"text":" request","logprobs":null,"finish_reason":null,"stop_reason":null,'
    b'"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}\n\n'
)


def _vllm_032_stream(n: int, finish: str) -> tuple[list[bytes], bytes, RequestShape, StreamAccumulator]:
    """n vLLM 0.32 events (usage 1..n, the last with `finish`), and them with [DONE] read by the
    fast path of a fresh accumulator (which must take every byte)."""
    events = [VLLM_032_EVENT.replace(b'"completion_tokens":1', b'"completion_tokens":%d' % (i + 1))
              .replace(b'"total_tokens":4', b'"total_tokens":%d' % (i + 4)) for i in range(n)]  # fmt: skip
    events[-1] = events[-1].replace(b'"finish_reason":null', b'"finish_reason":"%s"' % finish.encode())
    data = b"".join(events) + b"data: [DONE]\n\n"
    shape = RequestShape(Endpoint.COMPLETIONS, "tiny", "p", max_tokens=6)
    acc = StreamAccumulator(shape)
    acc.on_response(200, "text/event-stream")
    assert acc._fast_events(data, 1.0) == len(data)
    return events, data, shape, acc


def test_the_fast_path_takes_vllm_032_events() -> None:
    """vLLM 0.32 (continuous usage) writes `prompt_token_ids`/`token_ids` after `stop_reason`:
    its events are read by the fast path, with the same record as the general parser."""
    assert protocol._FAST_COMPLETIONS.match(VLLM_032_EVENT) is not None
    _, data, shape, acc = _vllm_032_stream(6, "length")
    assert (acc.chunks, acc._usage, acc.done, acc.finish_reason, acc.server_id) == (
        6, 6, True, "length", "cmpl-9a87260aedde1d55")  # fmt: skip
    assert _accumulate(data, [], shape, protocol.DEFAULT_LIMITS, True, True) == \
        _accumulate(data, [], shape, protocol.DEFAULT_LIMITS, False, True)  # fmt: skip


def test_the_fast_path_fails_an_aborted_request() -> None:
    """vLLM's stream for a request its engine dropped (finish_reason "abort"), read by the fast
    path: failed, as the general parser says, whatever the reason's place in the read."""
    events, data, shape, acc = _vllm_032_stream(3, "abort")
    assert (acc.outcome, acc.error, acc.finish_reason) == ("failed", "finish_reason: abort", "abort")
    for cuts in ([], [len(events[0])], [len(events[0]) + len(events[1])]):
        fast = _accumulate(data, cuts, shape, protocol.DEFAULT_LIMITS, True, True)
        assert fast == _accumulate(data, cuts, shape, protocol.DEFAULT_LIMITS, False, True)
        assert (fast[1]["outcome"], fast[1]["error"]) == ("failed", "finish_reason: abort")


def test_the_fast_path_reads_a_zero_count_on_text_chunks_as_no_usage_per_chunk() -> None:
    """`completion_tokens: 0` on every text chunk, the real count at the end: not usage per chunk
    (protocol.py, "Tokens"), on the fast path as on the general one."""
    events = [VLLM_032_EVENT.replace(b'"completion_tokens":1', b'"completion_tokens":0') for _ in range(4)]
    data = b"".join(events) + _ev(None, 4) + b"data: [DONE]\n\n"
    shape = RequestShape(Endpoint.COMPLETIONS, "tiny", "p", max_tokens=6)
    for cuts in ([], [len(events[0])], [len(events[0]) * 2 + 5]):
        fast = _accumulate(data, cuts, shape, protocol.DEFAULT_LIMITS, True, True)
        assert fast == _accumulate(data, cuts, shape, protocol.DEFAULT_LIMITS, False, True)
        assert (fast[1]["output_tokens"], fast[1]["itl_source"], len(unpack_gaps(fast[1]["itl_us"]))) == (4, "exact", 3)


def test_a_role_only_chunk_without_usage_is_read_alike_on_both_paths() -> None:
    """A role-only delta without usage (no `content`) and a final usage: on the fast path as on
    the general one, no first token -- the role chunk is a choice without text, where an empty
    `choices` is none. A tool call's arguments (left to the general parser) are output text:
    its chunk is the first token, on both paths."""
    head = '{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    role = ('data: ' + head + '[{"index":0,"delta":{"role":"assistant"},"logprobs":null,"finish_reason":null}]}\n\n').encode()
    tool = ('data: ' + head + '[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]},'
            '"logprobs":null,"finish_reason":null}]}\n\n').encode()  # fmt: skip
    empty = ('data: ' + head + '[]}\n\n').encode()
    final = ('data: ' + head + '[],"usage":{"prompt_tokens":1,"total_tokens":6,"completion_tokens":5}}\n\n').encode()
    shape = RequestShape(Endpoint.CHAT, "m", "p", max_tokens=8)
    for data, timed in ((role + tool + final, True), (empty + tool + final, True), (role + empty + final, False),
                        (empty + final, True)):  # fmt: skip
        data += b"data: [DONE]\n\n"
        for cuts in ([], [len(role)]):
            fast = _accumulate(data, cuts, shape, protocol.DEFAULT_LIMITS, True, True)
            assert fast == _accumulate(data, cuts, shape, protocol.DEFAULT_LIMITS, False, True)
            assert fast[1]["outcome"] == "completed"
            assert (fast[1]["first_token"] is not None) == timed


class _Spy:
    """A fast-path pattern that notes how many bytes its `split` was given."""

    def __init__(self, pattern) -> None:
        self.pattern, self.split_sizes = pattern, []

    def match(self, data):
        return self.pattern.match(data)

    def split(self, data):
        self.split_sizes.append(len(data))
        return self.pattern.split(data)


def test_a_streams_middle_is_taken_in_bulk() -> None:
    """vLLM's usual stream (usage only at the end): the events that differ only in their text are
    cut out without the regex, which reads just the last events -- and the record is the same."""
    head = b'data: {"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":"'
    events = [head + b' t%d","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n' % i for i in range(40)]
    events.append(head + b' end","logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n')
    events.append(b'data: {"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[],'
                  b'"usage":{"prompt_tokens":3,"total_tokens":44,"completion_tokens":41}}\n\n')  # fmt: skip
    data = b"".join(events) + b"data: [DONE]\n\n"
    shape = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=41)
    acc = StreamAccumulator(shape)
    acc.on_response(200, "text/event-stream")
    spy = acc._fast = _Spy(acc._fast)
    assert acc._fast_events(data, 1.0) == len(data)
    assert spy.split_sizes and max(spy.split_sizes) < len(events[-1]) * 4  # only the last events
    assert (acc.chunks, acc._usage, acc.done, acc.finish_reason) == (41, 41, True, "length")
    assert _accumulate(data, [], shape, protocol.DEFAULT_LIMITS, True, True) == \
        _accumulate(data, [], shape, protocol.DEFAULT_LIMITS, False, True)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# response heads

header_names = st.sampled_from([b"Content-Type", b"content-length", b"Transfer-Encoding", b"Connection", b"X-A",
                                b"Bad Name", b"", b"Server"])  # fmt: skip
header_values = st.sampled_from([b"text/event-stream", b"12", b"chunked", b"CHUNKED", b"gzip", b"close", b"keep-alive",
                                 b"", b" padded ", b"a\tb", b"1, 1", b"x\x00y", b"caf\xc3\xa9", b"-3", b"0012"])  # fmt: skip


@st.composite
def heads(draw) -> bytes:
    status = draw(st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 204", b"HTTP/1.1 429 Too Many",
                                   b"HTTP/1.1 100 Continue", b"HTTP/2.0 200 OK", b"HTTP/1.1 200 \xe9t\xe9", b"HTTP/1.1 20 X"]))  # fmt: skip
    lines = [status]
    for name, value in draw(st.lists(st.tuples(header_names, header_values), max_size=5)):
        sep = draw(st.sampled_from([b": ", b":", b" : ", b":\t"]))
        lines.append(name + sep + value)
    if draw(st.integers(0, 6)) == 0:
        lines.insert(1, b" folded")
    eol = draw(st.sampled_from([b"\r\n", b"\r\n", b"\n"]))
    return eol.join(lines) + eol + eol + draw(st.sampled_from([b"", b"body", b"data: x\n\n"]))


@st.composite
def plain_heads(draw) -> bytes:
    """Heads `parse_head` should take: HTTP/1.x, CRLF, valid names and values, framing at most once."""
    status = draw(st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 204", b"HTTP/1.1 429 Too Many"]))
    names = [b"Content-Type", b"Server", b"Connection", b"X-A", b"Cache-Control"]
    values = [b"text/event-stream", b"nginx", b"keep-alive", b"close", b"a\tb", b"caf\xc3\xa9", b"no-cache, private"]
    lines = [status] + [name + draw(st.sampled_from([b": ", b":", b":\t"])) + draw(st.sampled_from(values))
                        for name in draw(st.lists(st.sampled_from(names), max_size=4))]  # fmt: skip
    framing = draw(st.sampled_from([b"", b"Content-Length: 12", b"content-length: 0", b"Transfer-Encoding: chunked"]))
    if framing:
        lines.insert(draw(st.integers(1, len(lines))), framing)
    return b"\r\n".join(lines) + b"\r\n\r\n" + draw(st.sampled_from([b"", b"body", b"data: x\n\n"]))


@SETTINGS
@given(st.one_of(plain_heads(), heads()))
def test_parse_head_agrees_with_h11(data: bytes) -> None:
    """Whatever `parse_head` accepts, h11 accepts alike: same status, version, headers and body start."""
    head = parse_head(data)
    if head is None:
        return
    status, version, headers, end = head
    conn = _awaiting_response()
    conn.receive_data(data)
    event = conn.next_event()
    assert type(event) is h11.Response
    assert (event.status_code, event.http_version, list(event.headers)) == (status, version, headers)
    assert conn.trailing_data[0] == data[end:]


def test_parse_head_takes_a_plain_head() -> None:
    data = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/event-stream\r\nContent-Length: 4\r\n\r\nbody"
    assert parse_head(data) == (200, b"1.1", [(b"server", b"nginx"), (b"content-type", b"text/event-stream"),
                                              (b"content-length", b"4")], len(data) - 4)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# requests


def test_request_bytes_are_what_h11_writes() -> None:
    for api_key in (None, "sk-test"):
        conn = H11Connection("127.0.0.1", 8000, RunClock(), api_key=api_key)
        for shape in (RequestShape(Endpoint.COMPLETIONS, "m", "a b", 8),
                      RequestShape(Endpoint.CHAT, "m", "é", 8, Sampling(0.5, 0.9, 4, 1), stream=False)):  # fmt: skip
            for rid in ("soak-1a2b-0-0000001", "other"):
                body = build_body(shape, rid)
                headers = [(b"host", b"127.0.0.1:8000"), (b"user-agent", USER_AGENT), (b"content-type", b"application/json"),
                           (b"accept-encoding", b"identity")]  # fmt: skip
                if api_key:
                    headers.append((b"authorization", b"Bearer " + api_key.encode()))
                headers += [(b"accept", b"text/event-stream" if shape.stream else b"application/json"),
                            (b"x-request-id", rid.encode()), (b"content-length", b"%d" % len(body))]  # fmt: skip
                h = h11.Connection(h11.CLIENT)
                expected = h.send(h11.Request(method=b"POST", target=shape.path.encode(), headers=headers)) + body
                assert conn._request(shape, rid, ()) == expected


@SETTINGS
@given(st.text(max_size=30), st.text(max_size=12), st.sampled_from([(), (("request_id", "x"),), (("n", [1, 2]),)]),
       st.booleans())  # fmt: skip
def test_body_template_equals_the_full_body(prompt: str, rid: str, extra, chat: bool) -> None:
    shape = RequestShape(Endpoint.CHAT if chat else Endpoint.COMPLETIONS, "m", prompt, 8, extra=extra)
    assert build_body(shape, rid) == protocol._build_body(shape, rid)
    assert build_body(shape, rid) == protocol._build_body(shape, rid)  # cached the second time
