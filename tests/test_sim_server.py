"""The simulator as an HTTP server: real sockets on 127.0.0.1, the server in this process's trio
loop (`nursery.start(serve, config)`), httpx or raw sockets as the client."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
import trio

from soakspec.sim import SimConfig, serve

FAST = {"ttft": 0.002, "itl": 0.001}
MAX_EARLY = 0.002  # the server aims at deadlines and may wake up to 1.5 ms before one


class Sim:
    def __init__(self, port: int, trace_path: Path, client: httpx.AsyncClient):
        self.port = port
        self.trace_path = trace_path
        self.client = client

    def traces(self) -> list[dict[str, Any]]:
        if not self.trace_path.exists():
            return []
        return [json.loads(line) for line in self.trace_path.read_text().splitlines()]

    async def wait_traces(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Traces are written when the server finishes a request, just after the last byte."""
        with trio.fail_after(timeout):
            while len(self.traces()) < n:
                await trio.sleep(0.01)
        return self.traces()

    async def completion(self, **body: Any) -> httpx.Response:
        return await self.client.post("/v1/completions", json={"prompt": "hello world", **body})

    async def stream(self, path: str = "/v1/completions", headers: dict[str, str] | None = None,
                     **body: Any) -> tuple[httpx.Response, list[Any]]:
        """POST with stream=true; return the response and its SSE payloads (JSON, or "[DONE]")."""
        if path.endswith("/completions") and "chat" not in path:
            body.setdefault("prompt", "hello world")
        events: list[Any] = []
        async with self.client.stream("POST", path, json={"stream": True, **body}, headers=headers) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    events.append(data if data == "[DONE]" else json.loads(data))
        return r, events


@asynccontextmanager
async def running(tmp_path: Path, **options: Any) -> AsyncIterator[Sim]:
    trace = tmp_path / f"trace-{uuid.uuid4().hex[:8]}.jsonl"
    config = SimConfig(trace_log=False, trace_file=str(trace), **options)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, config)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                yield Sim(port, trace, client)
        finally:
            nursery.cancel_scope.cancel()


def token_events(events: list[Any]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict) and e.get("choices")]


# ---------------------------------------------------------------------------- OpenAI shapes


async def test_streamed_completion_has_vllm_shape_usage_event_and_done(tmp_path):
    async with running(tmp_path, **FAST) as sim:
        r, events = await sim.stream(headers={"X-Request-Id": "req-1"}, max_tokens=6, ignore_eos=True,
                                     stream_options={"include_usage": True})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["transfer-encoding"] == "chunked"
        assert r.headers["x-request-id"] == "req-1"
        assert events[-1] == "[DONE]"
        usage = events[-2]
        assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 6,
                                                             "total_tokens": 8}
        tokens = token_events(events)
        assert len(tokens) == 6
        for e in tokens:
            assert e["id"] == "cmpl-req-1" and e["object"] == "text_completion" and e["model"] == "sim-model"
            assert isinstance(e["created"], int)
            (choice,) = e["choices"]
            assert choice["index"] == 0 and choice["text"].strip() and choice["logprobs"] is None
            assert e["usage"] is None, "no per-chunk usage unless continuous_usage_stats"
        assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 5 + ["length"]
        (trace,) = await sim.wait_traces(1)
        assert trace["request_id"] == "cmpl-req-1-0" and trace["client_request_id"] == "req-1"


async def test_streamed_chat_starts_with_the_role_and_uses_chatcmpl_ids(tmp_path):
    async with running(tmp_path, **FAST) as sim:
        r, events = await sim.stream(
            "/v1/chat/completions", request_id="body-id", max_tokens=4, ignore_eos=True,
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "say three words"}],
            stream_options={"include_usage": True},
        )
        assert r.status_code == 200
        chunks = token_events(events)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(c["id"] == "chatcmpl-body-id" and c["object"] == "chat.completion.chunk" for c in chunks)
        content = [c["choices"][0]["delta"]["content"] for c in chunks[1:]]
        assert len(content) == 4 and all(t.strip() for t in content)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert events[-2]["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
        assert events[-1] == "[DONE]"
        (trace,) = await sim.wait_traces(1)
        assert trace["request_id"] == "chatcmpl-body-id" and trace["prompt_tokens"] == 5


async def test_non_streaming_responses_for_both_endpoints(tmp_path):
    async with running(tmp_path, **FAST) as sim:
        r = await sim.completion(max_tokens=5, ignore_eos=True)
        assert r.status_code == 200
        body = r.json()
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        assert body["choices"][0]["finish_reason"] == "length"
        assert len(body["choices"][0]["text"].split()) == 5
        assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
        r = await sim.client.post("/v1/chat/completions", json={
            "model": "sim-model", "messages": [{"role": "user", "content": [{"type": "text", "text": "a b c"}]}],
            "max_completion_tokens": 3})
        body = r.json()
        assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert len(body["choices"][0]["message"]["content"].split()) == 3
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


async def test_continuous_usage_counts_tokens_per_chunk_when_chunks_carry_several_tokens(tmp_path):
    async with running(tmp_path, tokens_per_chunk=4, **FAST) as sim:
        _, events = await sim.stream(max_tokens=10, ignore_eos=True,
                                     stream_options={"include_usage": True, "continuous_usage_stats": True})
        chunks = token_events(events)
        assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 5, 9, 10], "first alone, then 4 per event"
        assert all(c["usage"]["prompt_tokens"] == 2 for c in chunks)
        assert [len(c["choices"][0]["text"].split()) for c in chunks] == [1, 4, 4, 1]
        chat = await sim.stream("/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                ignore_eos=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
        assert [c["usage"]["completion_tokens"] for c in token_events(chat[1])] == [0, 1, 3]
        _, alone = await sim.stream(max_tokens=3, stream_options={"continuous_usage_stats": True})
        assert all(e["usage"] is None for e in token_events(alone)), "vLLM needs include_usage too"


async def test_request_id_header_wins_over_body_and_one_is_generated_otherwise(tmp_path):
    async with running(tmp_path, zero_latency=True) as sim:
        r = await sim.client.post("/v1/completions", json={"prompt": "x", "request_id": "from-body"},
                                  headers={"X-Request-Id": "from-header"})
        assert r.json()["id"] == "cmpl-from-header"
        assert (await sim.completion(request_id="from-body")).json()["id"] == "cmpl-from-body"
        generated = (await sim.completion()).json()["id"]
        assert generated.startswith("cmpl-") and len(generated) > 20
        odd = await sim.completion(request_id="línea\nnueva")
        assert odd.json()["id"] == "cmpl-línea\nnueva" and "x-request-id" not in odd.headers, "not header-safe"
        traces = await sim.wait_traces(4)
        assert [t["request_id"] for t in traces] == ["cmpl-from-header-0", "cmpl-from-body-0", generated + "-0",
                                                     "cmpl-línea\nnueva-0"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", b"[1, 2]", 400, None),
        ("/v1/completions", b'{"max_tokens": 4}', 400, "prompt"),
        ("/v1/chat/completions", b'{"prompt": "x"}', 400, "messages"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "messages"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": -1}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 2.5}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": "8"}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "max_tokens": 100000}', 400, "max_tokens"),
        ("/v1/completions", b'{"prompt": "x", "stream_options": {"include_usage": true}}', 400, "stream_options"),
        ("/v1/completions", b'{"prompt": "x", "model": "gpt-4"}', 404, "model"),
    ],
)
async def test_bad_requests_get_an_openai_error_body(tmp_path, path, body, status, param):
    async with running(tmp_path, zero_latency=True) as sim:
        r = await sim.client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status
        err = r.json()
        assert err["object"] == "error" and err["code"] == status and err["param"] == param
        assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError") and err["message"]
        (trace,) = await sim.wait_traces(1)
        assert trace["terminal_reason"] == "rejected" and trace["status"] == status
        assert (await sim.completion(max_tokens=1)).status_code == 200, "the connection and server carry on"


async def test_served_model_name_aliases_are_accepted(tmp_path):
    async with running(tmp_path, model="main", served_model_name=("alias",), zero_latency=True) as sim:
        assert (await sim.completion(model="alias")).status_code == 200
        assert (await sim.completion(model="other")).status_code == 404
        models = (await sim.client.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [(m["id"], m["object"]) for m in models["data"]] == [("main", "model"), ("alias", "model")]


async def test_http_limits_and_unknown_routes(tmp_path):
    async with running(tmp_path, zero_latency=True) as sim:
        r = await sim.client.post("/v1/completions", content=b"x" * (1024 * 1024 + 1))
        assert r.status_code == 413 and r.json()["code"] == 413
        r = await sim.client.get("/v1/completions", headers={"x-big": "y" * 70_000})
        assert r.status_code == 431
        assert (await sim.client.get("/nope")).status_code == 404
        assert (await sim.client.get("/v1/completions")).status_code == 405
        health = await sim.client.get("/health")
        assert health.status_code == 200 and health.content == b""


# ---------------------------------------------------------------------------- connections


def _raw_request(body: dict[str, Any], close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    conn = "Connection: close\r\n" if close else ""
    return (f"POST /v1/completions HTTP/1.1\r\nHost: sim\r\n{conn}Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def _read_responses(sock: socket.socket, n: int) -> list[tuple[h11.Response, bytes]]:
    conn = h11.Connection(h11.CLIENT)
    out = []
    for _ in range(n):
        conn.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
        conn.send(h11.EndOfMessage())
        head, body = None, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(event)
        out.append((head, body))
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            break
        conn.start_next_cycle()
    return out


async def test_keep_alive_serves_many_requests_on_one_connection_and_pipelining(tmp_path):
    async with running(tmp_path, zero_latency=True) as sim:
        def client() -> list[tuple[h11.Response, bytes]]:
            with socket.create_connection(("127.0.0.1", sim.port)) as s:
                got = []
                for _ in range(300):
                    s.sendall(_raw_request({"prompt": "a b", "max_tokens": 3, "stream": True}))
                    got += _read_responses(s, 1)
                s.sendall(_raw_request({"prompt": "a", "max_tokens": 2}) * 2)  # pipelined
                got += _read_responses(s, 2)
                return got

        responses = await trio.to_thread.run_sync(client)
        assert len(responses) == 302
        assert all(head.status_code == 200 for head, _ in responses)
        assert all(body.endswith(b"data: [DONE]\n\n") for _, body in responses[:300])
        assert [json.loads(b)["usage"]["completion_tokens"] for _, b in responses[300:]] == [2, 2]
        assert len(await sim.wait_traces(302)) == 302


async def test_connection_close_and_idle_keep_alive_timeout_end_the_connection(tmp_path):
    async with running(tmp_path, zero_latency=True, keep_alive_timeout=0.2) as sim:
        def client() -> tuple[bytes, float]:
            with socket.create_connection(("127.0.0.1", sim.port)) as s:
                s.sendall(_raw_request({"prompt": "a", "max_tokens": 1}, close=True))
                data = b""
                while chunk := s.recv(65536):
                    data += chunk  # ends: the server closed after the response
            with socket.create_connection(("127.0.0.1", sim.port)) as s:
                s.settimeout(5)
                start = time.monotonic()
                assert s.recv(1) == b"", "an idle connection is closed by the server"
                return data, time.monotonic() - start

        data, idle = await trio.to_thread.run_sync(client)
        assert data.startswith(b"HTTP/1.1 200") and b"connection: close" in data.lower()
        assert 0.15 <= idle < 3


# ---------------------------------------------------------------------------- traces and queueing


async def test_one_trace_per_request_with_ordered_timestamps(tmp_path):
    async with running(tmp_path, ttft=0.02, itl=0.005) as sim:
        await sim.stream(headers={"X-Request-Id": "t1"}, prompt="one two three four", max_tokens=5, ignore_eos=True)
        await sim.completion(max_tokens=2)
        a, b = await sim.wait_traces(2)
        assert a["request_id"] == "cmpl-t1-0" and a["terminal_reason"] == "completed" and a["status"] == 200
        assert a["queued_at"] <= a["scheduled_at"] <= a["first_token_at"] <= a["finished_at"]
        assert a["first_token_at"] - a["scheduled_at"] >= 0.02 - MAX_EARLY
        assert a["finished_at"] - a["scheduled_at"] >= 0.02 + 4 * 0.005 - MAX_EARLY
        assert (a["prompt_tokens"], a["completion_tokens"], a["finish_reason"]) == (4, 5, "length")
        assert (a["active"], a["pending"], a["fault"], a["stream"]) == (0, 0, None, True)
        assert b["stream"] is False and b["arrival_index"] == 1


async def test_requests_beyond_the_slots_wait_in_fifo_order_and_the_wait_shows(tmp_path):
    # Real time (the traces' stamps are wall-clock): q1 and q2 must arrive while q0 runs, so q0
    # runs 0.3 s against arrivals 10 ms apart -- a 50 ms TTFT let a loaded 2-core runner (a CI
    # run beside other work) deliver q1 after q0 had finished, and q1 then took a free slot.
    ttft = 0.3
    async with running(tmp_path, slots=1, ttft=ttft, itl=0.001) as sim:
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(lambda i=i: sim.completion(max_tokens=1, request_id=f"q{i}"))
                await trio.sleep(0.01)  # arrive in order
        traces = {t["client_request_id"]: t for t in await sim.wait_traces(3)}
        q0, q1, q2 = traces["q0"], traces["q1"], traces["q2"]
        assert q0["scheduled_at"] - q0["queued_at"] < 0.01
        assert q1["queued_at"] < q0["finished_at"], "the test's premise: q1 arrived while q0 ran"
        assert q1["scheduled_at"] == q0["finished_at"] and q2["scheduled_at"] == q1["finished_at"], "slot handed on"
        assert q2["queued_at"] < q1["scheduled_at"], "q2 arrived while q0 ran"
        wait = q2["scheduled_at"] - q2["queued_at"]
        assert wait >= ttft - MAX_EARLY, "q2 waited at least for all of q1"
        assert q2["first_token_at"] - q2["queued_at"] >= wait + ttft - MAX_EARLY, "TTFT = queue wait + ttft"
        assert q0["pending"] == 2 and q1["pending"] == 1 and q2["pending"] == 0


async def test_429_when_the_wait_queue_is_full(tmp_path):
    async with running(tmp_path, slots=1, queue_limit=1, ttft=0.1, itl=0.001) as sim:
        statuses: list[int] = []

        async def one(i: int) -> None:
            r = await sim.completion(max_tokens=1, request_id=f"r{i}")
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["code"] == 429 and r.json()["object"] == "error"

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
                await trio.sleep(0.01)
        assert sorted(statuses) == [200, 200, 429, 429]
        rejected = [t for t in await sim.wait_traces(4) if t["terminal_reason"] == "rejected"]
        assert {t["client_request_id"] for t in rejected} == {"r2", "r3"} and {t["status"] for t in rejected} == {429}


async def test_a_client_leaving_while_queued_frees_its_place(tmp_path, autojump_clock):
    # Steps wait for what the server reports, not for fixed sleeps (CI machines are busy);
    # "first" holds the one slot for 3 s, far longer than the steps take. The server schedules
    # on trio's clock, so the test runs in virtual time (pytest-trio's `autojump_clock`, a
    # MockClock(autojump_threshold=0)): the 3 s pass as soon as every task waits.
    async with running(tmp_path, slots=1, ttft=3.0, itl=0.001) as sim:

        async def gauge(name: str) -> float:
            text = (await sim.client.get("/metrics")).text
            return float(next(line for line in text.splitlines()
                              if line.startswith(f'vllm:{name}{{model_name="sim-model"}} ')).rsplit(" ", 1)[1])  # fmt: skip

        async def until(name: str, value: float) -> None:
            with trio.fail_after(10):
                while await gauge(name) != value:
                    await trio.sleep(0.01)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: sim.completion(max_tokens=1, request_id="first"))
            await until("num_requests_running", 1.0)
            async with trio.open_nursery() as queued:
                queued.start_soon(lambda: sim.completion(max_tokens=1, request_id="gone"))
                await until("num_requests_waiting", 1.0)
                queued.cancel_scope.cancel()  # the client leaves while it waits for the slot
            await until("num_requests_waiting", 0.0)
            assert await gauge("num_requests_running") == 1.0  # "first" still has the slot
        gone = next(t for t in await sim.wait_traces(2) if t["client_request_id"] == "gone")
        assert gone["terminal_reason"] == "disconnected" and gone["scheduled_at"] is None


async def test_metrics_exposes_gauges_counters_and_simulated_memory(tmp_path, autojump_clock):
    # simulated memory grows on the server's trio clock: the 0.2 s below pass in virtual time
    async with running(tmp_path, memory_base=8 * 2**30, memory_growth=60 * 2**30, **FAST) as sim:
        await sim.completion(prompt="a b c", max_tokens=4, ignore_eos=True)
        await sim.completion(max_tokens=-1)
        await sim.wait_traces(2)
        text = (await sim.client.get("/metrics")).text
        values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                  for line in text.splitlines() if line and not line.startswith("#")}
        lbl = 'model_name="sim-model"'
        assert values[f'vllm:request_success_total{{finished_reason="length",{lbl}}}'] == 1
        assert values[f'sim_request_failure_total{{reason="rejected",{lbl}}}'] == 1
        assert values[f"vllm:prompt_tokens_total{{{lbl}}}"] == 3
        assert values[f"vllm:generation_tokens_total{{{lbl}}}"] == 4
        assert values[f"vllm:num_requests_running{{{lbl}}}"] == 0
        first = values["sim_gpu_memory_used_bytes"]
        assert 8 * 2**30 <= first < 9 * 2**30
        await trio.sleep(0.2)
        later = float((await sim.client.get("/metrics")).text.split("\nsim_gpu_memory_used_bytes ")[1])
        assert later - first >= 0.15 * 2**30, "grows by memory_growth per minute (1 GiB/s here)"


# ---------------------------------------------------------------------------- faults


async def test_error_rate_replies_500_or_503_before_streaming(tmp_path):
    async with running(tmp_path, error_rate=1.0, **FAST) as sim:
        statuses = set()
        for _ in range(12):
            r = await sim.client.post("/v1/completions", json={"prompt": "x", "stream": True})
            assert r.status_code in (500, 503) and r.json()["object"] == "error" and r.json()["code"] == r.status_code
            statuses.add(r.status_code)
        assert statuses == {500, 503}
        traces = await sim.wait_traces(12)
        assert {(t["terminal_reason"], t["fault"]) for t in traces} == {("error", "error")}


async def test_stream_error_sends_tokens_then_an_error_event_then_done(tmp_path):
    async with running(tmp_path, stream_error_rate=1.0, **FAST) as sim:
        r, events = await sim.stream(max_tokens=20, ignore_eos=True)
        assert r.status_code == 200
        assert events[-1] == "[DONE]"
        err = events[-2]["error"]
        assert err["object"] == "error" and err["code"] == 500 and "EngineCore" in err["message"]
        tokens = token_events(events)
        assert 1 <= len(tokens) <= 20 and all(t["choices"][0]["finish_reason"] is None for t in tokens[:-1])
        full = await sim.completion(max_tokens=20)
        assert full.status_code == 500, "without streaming the failure is an HTTP 500"
        t, _ = await sim.wait_traces(2)
        assert (t["terminal_reason"], t["fault"], t["status"]) == ("error", "stream_error", 200)
        assert t["completion_tokens"] == len(tokens)


async def test_stall_holds_the_stream_until_the_client_gives_up(tmp_path):
    async with running(tmp_path, stall_rate=1.0, **FAST) as sim:
        got: list[str] = []
        with pytest.raises(httpx.ReadTimeout):
            async with sim.client.stream("POST", "/v1/completions", timeout=httpx.Timeout(5, read=0.3),
                                         json={"prompt": "x", "max_tokens": 50, "stream": True}) as r:
                async for line in r.aiter_lines():
                    got.append(line)
        assert not any("[DONE]" in line for line in got)
        (t,) = await sim.wait_traces(1)
        assert (t["terminal_reason"], t["fault"]) == ("disconnected", "stall")
        assert t["completion_tokens"] < 50 and t["finished_at"] - t["queued_at"] >= 0.3


async def test_disconnect_closes_the_connection_mid_stream(tmp_path):
    async with running(tmp_path, disconnect_rate=1.0, **FAST) as sim:
        with pytest.raises(httpx.RemoteProtocolError):
            await sim.stream(max_tokens=40, ignore_eos=True)
        (t,) = await sim.wait_traces(1)
        assert (t["terminal_reason"], t["fault"]) == ("disconnected", "disconnect")
        assert 1 <= t["completion_tokens"] <= 40


async def test_omit_done_finishes_the_stream_without_done(tmp_path):
    async with running(tmp_path, omit_done_rate=1.0, **FAST) as sim:
        r, events = await sim.stream(max_tokens=5, ignore_eos=True, stream_options={"include_usage": True})
        assert "[DONE]" not in events
        assert token_events(events)[-1]["choices"][0]["finish_reason"] == "length"
        assert events[-1]["usage"]["completion_tokens"] == 5
        (t,) = await sim.wait_traces(1)
        assert (t["terminal_reason"], t["fault"]) == ("completed", "omit_done")


async def test_trace_drop_rate_omits_traces_but_not_responses(tmp_path):
    async with running(tmp_path, trace_drop_rate=1.0, zero_latency=True) as sim:
        for _ in range(3):
            assert (await sim.completion(max_tokens=2)).status_code == 200
        await trio.sleep(0.1)
        assert sim.traces() == []
        assert 'vllm:request_success_total{finished_reason="length",model_name="sim-model"} 3.0' in (
            await sim.client.get("/metrics")).text


async def test_eos_stops_early_unless_ignore_eos(tmp_path):
    async with running(tmp_path, eos_rate=1.0, zero_latency=True) as sim:
        r = (await sim.completion(max_tokens=30)).json()
        assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] < 30
        r = (await sim.completion(max_tokens=30, ignore_eos=True)).json()
        assert r["choices"][0]["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 30


# ---------------------------------------------------------------------------- determinism


async def _session(tmp_path: Path, **options: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """The same request sequence against a fresh server: (responses, traces)."""
    out: list[Any] = []
    async with running(tmp_path, **options) as sim:
        for i in range(8):
            if i % 2:
                r, events = await sim.stream("/v1/chat/completions", messages=[{"role": "user", "content": "a b"}],
                                             max_tokens=6, stream_options={"include_usage": True})
                out.append([(e["choices"][0]["delta"].get("content") if isinstance(e, dict) and e.get("choices")
                             else e.get("error") if isinstance(e, dict) else e) for e in events])
            else:
                r = await sim.completion(max_tokens=6)
                out.append((r.status_code, r.json().get("choices")))
        traces = await sim.wait_traces(8)
    return out, traces


async def test_same_seed_same_texts_and_traces(tmp_path):
    opts = dict(seed=42, ttft=0.003, itl=0.001, itl_jitter=0.5, eos_rate=0.5, stream_error_rate=0.3)
    out1, tr1 = await _session(tmp_path, **opts)
    out2, tr2 = await _session(tmp_path, **opts)
    out3, _ = await _session(tmp_path, **{**opts, "seed": 43})
    assert out1 == out2
    assert out1 != out3
    volatile = {"request_id", "client_request_id", "queued_at", "scheduled_at", "first_token_at", "finished_at"}
    assert [{k: v for k, v in t.items() if k not in volatile} for t in tr1] == \
           [{k: v for k, v in t.items() if k not in volatile} for t in tr2]
    assert {t["terminal_reason"] for t in tr1} == {"completed", "error"}, "the sequence exercises both"
    assert {t["finish_reason"] for t in tr1} == {"stop", "length", None}


async def test_token_times_follow_the_seeded_schedule(tmp_path, autojump_clock):
    """Event times measured by a client match the model's schedule for that seed and arrival
    index, jitter included (the jittered gaps range from 1 to 19 ms). Virtual time (trio's
    MockClock): the simulator's sleeps are exact, so what is compared is its schedule, not
    how busy this machine is (real time on a loaded 2-core runner put events 78 ms late)."""
    from soakspec.sim.model import plan_request, schedule

    opts = dict(seed=9, ttft=0.02, itl=0.01, itl_jitter=0.9)
    async with running(tmp_path, **opts) as sim:
        await sim.completion(max_tokens=1)  # arrival index 0; warms the connection
        t0 = trio.current_time()
        times = []
        async with sim.client.stream("POST", "/v1/completions",
                                     json={"prompt": "a", "max_tokens": 30, "ignore_eos": True, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith('data: {"'):
                    times.append(trio.current_time() - t0)
    cfg = SimConfig(**opts)
    expected = schedule(cfg, plan_request(cfg, 1, 30, True), prompt_tokens=1)
    assert len(times) == 30
    offsets = sorted(t - x for t, x in zip(times, expected))  # client-side delay of each event
    errors = sorted(abs(t - x - offsets[15]) for t, x in zip(times, expected))
    spread = sorted(abs((y - x) - 0.01) for x, y in zip(expected, expected[1:]))
    assert spread[len(spread) // 2] > 0.003, "the schedule itself is far from constant"
    assert errors[-1] < 1e-6, "every event leaves on the seeded schedule, jitter included"
    assert offsets[15] >= -MAX_EARLY, "and never ahead of it"


async def test_zero_latency_sends_the_same_bytes_as_timed_streaming(tmp_path):
    async def events(**opts: Any) -> list[Any]:
        async with running(tmp_path, seed=5, tokens_per_chunk=3, **opts) as sim:
            _, ev = await sim.stream(max_tokens=11, ignore_eos=True,
                                     stream_options={"include_usage": True, "continuous_usage_stats": True})
            return [{k: v for k, v in e.items() if k not in ("id", "created")} if isinstance(e, dict) else e
                    for e in ev]

    assert await events(zero_latency=True) == await events(ttft=0.002, itl=0.001)
