"""The simulator's HTTP/1.1 server: trio for concurrency, h11 for the protocol.

Design
------
* One trio task per connection; one h11 `Connection` per socket; keep-alive until the client
  closes, sends `Connection: close`, or stays idle past `keep_alive_timeout` (uvicorn, which vLLM
  runs on, closes idle connections after 5 s). Streams use chunked transfer encoding.
* Bounded: request heads above `MAX_HEADER_BYTES` get 431, bodies above `MAX_BODY_BYTES` 413,
  a stalled body read gives up after `BODY_READ_TIMEOUT`; pipelined bytes buffered while a
  response is being produced are capped.
* While a request is being served a watcher task reads the socket: end-of-file means the client
  went away, and the request is cancelled (queued or streaming), its slot freed and its trace
  written with terminal_reason "disconnected" -- the way vLLM aborts a request whose client left.
* The behaviour comes from `model` (plan, timeline, scheduler) and the bytes from `protocol`;
  this module only moves them and keeps time: each event is written at its absolute deadline
  (`trio.sleep_until`); events already due are coalesced into one write.
* Traces: one JSON object per finished inference request (`soakspec_sim_trace {json}` on stdout,
  flushed per line, and/or a JSONL `trace_file`). `request_id` is the server form: `cmpl-<id>-0`
  for completions (vLLM's per-choice engine id), `chatcmpl-<id>` for chat; `client_request_id`
  is the bare id (X-Request-Id header, else the body's `request_id`, else a generated uuid).
  Times are `time.time()` floats; `active`/`pending` count the *other* running/waiting requests
  at the moment this one finished. terminal_reason: completed | rejected (4xx) | error (5xx, or an
  in-stream error) | disconnected (the connection ended early: client left, or the disconnect
  fault) | cancelled (the server shut down). `cached_tokens`: the prompt tokens the prefix cache
  held when it was scheduled (0 when it was not, or caching is off).
"""

from __future__ import annotations

import http
import json
import os
import socket
import struct
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from typing import IO, Any

import h11
import trio

from soakspec.lang.simtrace import TRACE_PREFIX
from soakspec.sim.config import SimConfig
from soakspec.sim.model import (
    MID_STREAM_FAULTS,
    Admission,
    Counters,
    Fault,
    PrefixCache,
    RequestPlan,
    Scheduler,
    Timeline,
    block_hashes,
    memory_used,
    plan_request,
)
from soakspec.sim.protocol import (
    DONE,
    ENGINE_DEAD_MESSAGE,
    ApiError,
    InferenceRequest,
    StreamRenderer,
    error_body,
    full_response,
    models_body,
    parse_request,
    render_metrics,
    tokenize_body,
)

__all__ = ["CRASH_EXIT_CODE", "TRACE_PREFIX", "serve"]

MAX_BODY_BYTES = 1 << 20
MAX_HEADER_BYTES = 64 * 1024
READ_SIZE = 64 * 1024
BODY_READ_TIMEOUT = 60.0
PIPELINE_BUFFER_CAP = 64 * 1024
MAX_COALESCED_EVENTS = 256  # events due at once (a late wake-up) are written together, this many at most
CRASH_EXIT_CODE = 3
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}


def _crash(reason: str) -> None:
    """Die the way a crashed server does: no cleanup, open streams cut mid-body."""
    try:
        sys.stdout.flush()
        sys.stderr.write(f"soakspec-sim: simulated crash: {reason}\n")
        sys.stderr.flush()
    finally:
        os._exit(CRASH_EXIT_CODE)


class TraceWriter:
    def __init__(self, config: SimConfig):
        self.log = config.trace_log
        self.file: IO[str] | None = None
        if config.trace_file:
            self.file = open(config.trace_file, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        if self.log:
            try:
                sys.stdout.write(TRACE_PREFIX + line + "\n")
                sys.stdout.flush()
            except (OSError, ValueError) as e:  # the log reader went away: keep serving, say so once
                self.log = False
                sys.stderr.write(f"soakspec-sim: trace log disabled: stdout failed: {e}\n")
        if self.file is not None:
            self.file.write(line + "\n")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


MAX_WAKE_LEAD = 0.0015


class _Waker:
    """`sleep_until` aimed at the deadline itself. An event loop wakes late (epoll rounds its
    timeout up to whole milliseconds, then the OS scheduler adds its own delay), so this learns
    the typical lateness (a moving average of samples capped at 1.5 ms) and asks to be woken that
    much earlier: the median event then leaves at its deadline instead of ~1 ms after it.
    Deadlines stay absolute, so neither the lead nor any lateness accumulates over a stream.
    (What no event loop can remove is the wait for a CPU on an overloaded machine.)"""

    def __init__(self) -> None:
        self.lead = 0.0

    async def sleep_until(self, deadline: float) -> None:
        target = deadline - self.lead
        await trio.sleep_until(target)
        late = min(max(trio.current_time() - target, 0.0), MAX_WAKE_LEAD)  # a stall of the loop is no lesson
        self.lead = 0.95 * self.lead + 0.05 * late


class _Request:
    """Mutable state of one inference request, turned into its trace when it finishes."""

    __slots__ = (
        "index", "endpoint", "client_id", "response_id", "trace_id", "stream", "queued_at", "scheduled_at",
        "scheduled_mono", "arrived_mono", "first_token_at", "prompt_tokens", "completion_tokens", "max_tokens",
        "finish_reason", "terminal", "status", "fault", "state", "ready", "client_gone", "prompt",
        "blocks", "cached_tokens", "held",
    )

    def __init__(self, index: int, endpoint: str, arrived_mono: float, arrived_wall: float):
        self.index = index
        self.endpoint = endpoint
        self.arrived_mono = arrived_mono
        self.client_id = ""
        self.response_id = ""
        self.trace_id = ""
        self.stream: bool | None = None
        self.queued_at = arrived_wall
        self.scheduled_at: float | None = None
        self.scheduled_mono = 0.0
        self.first_token_at: float | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens = 0
        self.max_tokens: int | None = None
        self.finish_reason: str | None = None
        self.terminal: str | None = None
        self.status: int | None = None
        self.fault: str | None = None
        self.state: Admission | None = None
        self.ready = trio.Event()
        self.client_gone = False
        self.prompt: dict[str, Any] = {}  # prompt_head, prompt_sha256, messages (once parsed)
        self.blocks: tuple[bytes, ...] | None = None  # the prompt's block keys (prefix caching on)
        self.cached_tokens = 0  # prompt tokens the prefix cache held when it was scheduled
        self.held: tuple[bytes, ...] = ()  # the prefix-cache blocks it holds while it runs


# Linux's SO_TIMESTAMPNS (not exported by the socket module): the kernel stamps each received
# segment, so a request's arrival time excludes the event loop's wake-up and parsing delays.
_SO_TIMESTAMPNS = 35 if sys.platform == "linux" else None


class _Io:
    """One connection: the socket, its h11 state, and whether it must close after this exchange."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.must_close = False
        self.pending: list[Any] = []  # h11 events to send with the next write (a deferred response head)
        self.arrival_wall: float | None = None  # kernel receive time of the current request's first bytes
        self.timestamps = False
        if _SO_TIMESTAMPNS is not None:
            try:
                stream.socket.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.timestamps = True
            except OSError:
                pass

    async def receive(self, stamp: bool) -> bytes:
        """Read from the socket. With `stamp`, bytes that may begin a request: keep the kernel's
        receive time of the first such read until `arrival()` takes it."""
        if not (stamp and self.timestamps) or self.arrival_wall is not None:
            return await self.stream.receive_some(READ_SIZE)
        try:
            data, ancdata, _flags, _addr = await self.stream.socket.recvmsg(READ_SIZE, 64)
        except OSError as e:
            raise trio.BrokenResourceError(str(e)) from e
        for level, kind, raw in ancdata:
            if data and level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= 16:
                sec, nsec = struct.unpack("qq", raw[:16])
                self.arrival_wall = sec + nsec * 1e-9
        return data

    def arrival(self) -> tuple[float, float]:
        """(monotonic, wall) time the current request arrived: its first bytes' kernel timestamp."""
        mono, wall = trio.current_time(), time.time()
        stamp, self.arrival_wall = self.arrival_wall, None
        if stamp is not None and 0.0 <= wall - stamp < 1.0:
            return mono - (wall - stamp), stamp
        return mono, wall

    async def next_event(self, timeout: float, stamp: bool = False) -> Any:
        """The next h11 event, or None if nothing arrived within `timeout`."""
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = None
            with trio.move_on_after(timeout):
                data = await self.receive(stamp)
            if data is None:
                return None
            self.conn.receive_data(data)

    async def send(self, *events: Any) -> None:
        if self.pending:
            events = (*self.pending, *events)
            self.pending.clear()
        if events:
            await self.stream.send_all(b"".join(self.conn.send(e) or b"" for e in events))

    def next_cycle(self) -> bool:
        if self.must_close or self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
            return False
        self.conn.start_next_cycle()
        return True


def _id_header(client_id: str) -> list[tuple[str, str]]:
    """Echo the request id (as vLLM does with --enable-request-id-headers) when it is header-safe;
    a body `request_id` may hold anything."""
    return [("x-request-id", client_id)] if client_id.isascii() and client_id.isprintable() else []


def _response(status: int, headers: list[tuple[str, str]]) -> h11.Response:
    return h11.Response(
        status_code=status,
        headers=[("server", "soakspec-sim"), *headers],
        reason=http.HTTPStatus(status).phrase.encode(),
    )


async def _send_body(io: _Io, status: int, body: bytes, content_type: str, headers: Sequence[tuple[str, str]] = (),
                     close: bool = False) -> None:
    hdrs = [("content-type", content_type), ("content-length", str(len(body))), *headers]
    if close:
        hdrs.append(("connection", "close"))
        io.must_close = True
    events: list[Any] = [_response(status, hdrs)]
    if body:
        events.append(h11.Data(data=body))
    events.append(h11.EndOfMessage())
    await io.send(*events)


async def _send_json(io: _Io, status: int, obj: object, headers: Sequence[tuple[str, str]] = (),
                     close: bool = False) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    await _send_body(io, status, body, "application/json", headers, close)


class _Server:
    def __init__(self, config: SimConfig, trace: TraceWriter):
        self.cfg = config
        self.trace = trace
        self.sched: Scheduler[_Request] = Scheduler(config.slots, config.queue_limit)
        self.counters = Counters()
        self.arrivals = 0
        self.epoch = trio.current_time()
        self.started_wall = int(time.time())
        self.waker = _Waker()
        self.cache = PrefixCache(config.prefix_cache_blocks, config.block_size) if config.enable_prefix_caching else None

    # -- connections ---------------------------------------------------------------------------

    async def handle(self, stream: trio.SocketStream) -> None:
        io = _Io(stream)
        try:
            while await self._exchange(io):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:  # noqa: BLE001 - one bad connection must not stop the server
            sys.stderr.write("soakspec-sim: internal error on a connection:\n" + traceback.format_exc())
            sys.stderr.flush()
        finally:
            await trio.aclose_forcefully(stream)

    async def _exchange(self, io: _Io) -> bool:
        """Serve one request; return whether the connection stays open for another."""
        try:
            event = await io.next_event(self.cfg.keep_alive_timeout, stamp=True)
            if event is None or isinstance(event, h11.ConnectionClosed):
                return False
            assert isinstance(event, h11.Request)
            arrived = io.arrival()
            if len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers) > MAX_HEADER_BYTES:
                msg = f"request head larger than {MAX_HEADER_BYTES} bytes"
                await _send_json(io, 431, error_body(431, msg), close=True)
                return False
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
                await self._too_large(io)
                return False
            body = bytearray()
            while True:
                part = await io.next_event(BODY_READ_TIMEOUT)
                if part is None or isinstance(part, h11.ConnectionClosed):
                    return False
                if isinstance(part, h11.EndOfMessage):
                    break
                body += part.data
                if len(body) > MAX_BODY_BYTES:
                    await self._too_large(io)
                    return False
        except h11.RemoteProtocolError as e:
            if io.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                status = e.error_status_hint
                await _send_json(io, status, error_body(status, f"bad HTTP request: {e}"), close=True)
            return False

        path = event.target.decode("latin-1").split("?", 1)[0]
        method = event.method.decode("latin-1")
        if path in ENDPOINTS:
            if method != "POST":
                await _send_json(io, 405, {"detail": "Method Not Allowed"})
            else:
                await self._inference(io, ENDPOINTS[path], headers, bytes(body), arrived)
        elif path == "/tokenize":
            await self._tokenize(io, method, bytes(body))
        elif path in ("/health", "/metrics", "/v1/models"):
            if method != "GET":
                await _send_json(io, 405, {"detail": "Method Not Allowed"})
            elif path == "/health":
                await _send_body(io, 200, b"", "application/json")
            elif path == "/metrics" and not self.cfg.metrics:
                await _send_json(io, 404, {"detail": "Not Found"})
            elif path == "/metrics":
                await _send_body(io, 200, self._metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                await _send_json(io, 200, models_body(self.cfg, self.started_wall))
        else:
            await _send_json(io, 404, {"detail": "Not Found"})
        return io.next_cycle()

    async def _tokenize(self, io: _Io, method: str, body: bytes) -> None:
        if method != "POST":
            await _send_json(io, 405, {"detail": "Method Not Allowed"})
            return
        try:
            await _send_json(io, 200, tokenize_body(body, self.cfg))
        except ApiError as e:
            await _send_json(io, e.status, e.body())

    async def _too_large(self, io: _Io) -> None:
        msg = f"request body larger than {MAX_BODY_BYTES} bytes"
        await _send_json(io, 413, error_body(413, msg), close=True)

    def _metrics(self) -> str:
        c = self.counters
        return render_metrics(
            self.cfg.model, len(self.sched.running), len(self.sched.waiting), c.success, c.failure,
            c.prompt_tokens, c.generation_tokens, memory_used(self.cfg, trio.current_time() - self.epoch),
            slots=self.cfg.slots, ttft=c.ttft,
            prefix_cache=(self.cache.queries, self.cache.hits) if self.cache is not None else (0, 0),
        )

    # -- inference -----------------------------------------------------------------------------

    async def _inference(
        self, io: _Io, endpoint: str, headers: dict[str, str], body: bytes, arrived: tuple[float, float]
    ) -> None:
        cfg = self.cfg
        index = self.arrivals
        self.arrivals += 1
        if cfg.crash_after_requests is not None and index >= cfg.crash_after_requests:
            _crash(f"request {index + 1} arrived (--crash-after-requests {cfg.crash_after_requests})")
        st = _Request(index, endpoint, *arrived)
        plan: RequestPlan | None = None
        header_id = headers.get("x-request-id") or None
        self._set_ids(st, header_id or uuid.uuid4().hex)
        try:
            try:
                req = parse_request(endpoint, body, cfg)
            except ApiError as e:
                st.status, st.terminal = e.status, "rejected"
                await _send_json(io, e.status, e.body(), _id_header(st.client_id))
                return
            self._set_ids(st, header_id or req.request_id or st.client_id)
            st.stream, st.prompt_tokens, st.max_tokens = req.stream, req.prompt_tokens, req.max_tokens
            st.prompt = {"prompt_head": req.prompt_head, "prompt_sha256": req.prompt_sha256, "messages": req.messages}
            plan = plan_request(cfg, index, req.max_tokens, req.ignore_eos)
            if self.cache is not None:
                st.blocks = block_hashes(req.prompt_units, cfg.block_size)
            st.fault = plan.fault.value if plan.fault else None
            id_header = _id_header(st.client_id)
            if plan.fault is Fault.ERROR:
                status = plan.error_status
                st.status, st.terminal = status, "error"
                message = "simulated engine failure" if status == 500 else "simulated overload: service unavailable"
                await _send_json(io, status, error_body(status, message), id_header)
                return
            st.state = self.sched.arrive(st)
            if st.state is Admission.REJECTED:
                st.status, st.terminal = 429, "rejected"
                msg = f"the wait queue is full ({cfg.queue_limit} requests waiting)"
                await _send_json(io, 429, error_body(429, msg), id_header)
                return
            if st.state is Admission.RUNNING:  # a free slot: scheduled the moment it arrived
                self._mark_scheduled(st, st.arrived_mono, st.queued_at)
            await self._serve_admitted(io, st, req, plan, id_header)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            st.client_gone = True
            io.must_close = True
        finally:
            self._settle(st, plan)

    def _set_ids(self, st: _Request, client_id: str) -> None:
        st.client_id = client_id
        if st.endpoint == "chat":
            st.response_id = st.trace_id = f"chatcmpl-{client_id}"
        else:
            st.response_id = f"cmpl-{client_id}"
            st.trace_id = st.response_id + "-0"

    def _mark_scheduled(self, st: _Request, mono: float | None = None, wall: float | None = None) -> None:
        """`st` has its slot: its prompt meets the prefix cache now (vLLM looks a request up when
        it schedules it), so what an earlier-scheduled request cached is found; it holds its
        blocks until `_settle`."""
        if self.cache is not None and st.blocks is not None and st.prompt_tokens:
            st.cached_tokens, st.held = self.cache.admit(st.blocks, st.prompt_tokens)
        st.state = Admission.RUNNING
        st.scheduled_mono = trio.current_time() if mono is None else mono
        st.scheduled_at = time.time() if wall is None else wall
        st.ready.set()

    async def _serve_admitted(self, io: _Io, st: _Request, req: InferenceRequest, plan: RequestPlan,
                              id_header: Sequence[tuple[str, str]]) -> None:
        """Wait for a slot and generate, while a watcher notices if the client goes away."""
        if req.stream:  # the head goes with the first event, or before any wait
            st.status = 200
            io.pending.append(_response(200, [
                ("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache"), *id_header,
            ]))

        async def generate() -> None:
            try:
                if not st.ready.is_set():
                    await io.send()
                    await st.ready.wait()
                if req.stream:
                    await self._stream(io, st, req, plan)
                else:
                    await self._full(io, st, req, plan, id_header)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                st.client_gone = True

        if self.cfg.zero_latency and st.ready.is_set() and plan.fault is not Fault.STALL:
            await generate()  # nothing to wait for: no one to watch
        else:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_client, io, st, nursery.cancel_scope)
                try:
                    await generate()
                finally:
                    nursery.cancel_scope.cancel()
        if st.client_gone:
            io.must_close = True

    async def _watch_client(self, io: _Io, st: _Request, scope: trio.CancelScope) -> None:
        try:
            while True:
                data = await io.receive(stamp=True)
                if not data:
                    break
                io.conn.receive_data(data)  # the next request, pipelined: keep it for the next cycle
                if len(io.conn.trailing_data[0]) > PIPELINE_BUFFER_CAP:
                    return  # stop reading rather than buffer without bound
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        st.client_gone = True
        scope.cancel()

    def _cached_shown(self, st: _Request) -> int:
        """The cached tokens usage reports: vLLM's only with --enable-prompt-tokens-details."""
        return st.cached_tokens if self.cfg.enable_prompt_tokens_details else 0

    def _others(self) -> int:
        return len(self.sched.running) - 1

    async def _stream(self, io: _Io, st: _Request, req: InferenceRequest, plan: RequestPlan) -> None:
        cfg = self.cfg
        renderer = StreamRenderer(req, st.response_id, cfg.model)
        n_events = len(plan.events)
        fault = plan.fault if plan.fault in MID_STREAM_FAULTS else None
        stop = plan.fault_after_events if fault is not None else n_events  # token events to send
        buf: list[bytes] = []
        rendered = 0  # token events rendered into buf (or already sent)

        def render(upto: int) -> None:
            nonlocal rendered
            if rendered == 0 and renderer.chat:
                buf.append(renderer.role_event())
            final = plan.finish_reason if upto == n_events else None
            buf.append(renderer.token_events(plan.event_texts[rendered:upto], plan.event_ends[rendered:upto], final))
            rendered = upto

        async def flush(end: bool = False) -> None:
            if rendered and st.first_token_at is None:
                st.first_token_at = time.time()
            events: list[Any] = [h11.Data(data=b"".join(buf))] if buf else []
            if end:
                events.append(h11.EndOfMessage())
            buf.clear()
            await io.send(*events)
            st.completion_tokens = plan.event_ends[rendered - 1] if rendered else 0

        if cfg.zero_latency:
            render(stop)
        else:
            timeline = Timeline(cfg, plan, req.prompt_tokens - st.cached_tokens, st.scheduled_mono, self.epoch)
            for ev in range(stop):
                deadline = timeline.next_event(self._others())
                if deadline > trio.current_time() or len(buf) >= MAX_COALESCED_EVENTS:
                    await flush()  # what is due goes out before waiting
                    await self.waker.sleep_until(deadline)
                render(ev + 1)

        if fault is Fault.STREAM_ERROR:
            buf += [StreamRenderer.error_event(), DONE]
            await flush(end=True)
            st.terminal = "error"
        elif fault is Fault.DISCONNECT:
            await flush()
            st.terminal = "disconnected"
            io.must_close = True
        elif fault is Fault.STALL:
            await flush()
            await trio.sleep_forever()  # until the client leaves (or the server stops)
        else:
            if req.include_usage:
                buf.append(renderer.usage_event(rendered and plan.event_ends[rendered - 1], self._cached_shown(st)))
            if plan.fault is not Fault.OMIT_DONE:
                buf.append(DONE)
            await flush(end=True)
            st.terminal, st.finish_reason = "completed", plan.finish_reason

    async def _full(self, io: _Io, st: _Request, req: InferenceRequest, plan: RequestPlan,
                    id_header: Sequence[tuple[str, str]]) -> None:
        cfg = self.cfg
        timeline = Timeline(cfg, plan, req.prompt_tokens - st.cached_tokens, st.scheduled_mono, self.epoch)
        fault = plan.fault if plan.fault in MID_STREAM_FAULTS else None
        n_events = len(plan.events)
        for ev in range(n_events + 1):
            if fault is not None and ev == plan.fault_after_events:
                if fault is Fault.STREAM_ERROR:
                    st.status, st.terminal = 500, "error"
                    await _send_json(io, 500, error_body(500, ENGINE_DEAD_MESSAGE), id_header)
                elif fault is Fault.DISCONNECT:
                    st.terminal = "disconnected"
                    io.must_close = True
                else:
                    await trio.sleep_forever()
                return
            if ev == n_events:
                break
            deadline = timeline.next_event(self._others())
            if not cfg.zero_latency and deadline > trio.current_time():
                await self.waker.sleep_until(deadline)
            if ev == 0:
                st.first_token_at = time.time()
            st.completion_tokens += plan.events[ev]
        body = full_response(req, st.response_id, cfg.model, plan.text, len(plan.tokens), plan.finish_reason,
                             cached_tokens=self._cached_shown(st))
        st.status = 200
        await _send_json(io, 200, body, id_header)
        st.terminal, st.finish_reason = "completed", plan.finish_reason

    def _settle(self, st: _Request, plan: RequestPlan | None) -> None:
        """The request is over, whatever happened: free its place, count it, trace it."""
        sched = self.sched
        now_mono, now_wall = trio.current_time(), time.time()  # its slot passes on at this instant
        active, pending = len(sched.running), len(sched.waiting)
        if st.state is Admission.RUNNING:
            active -= 1
            if self.cache is not None and st.held:  # before the next are scheduled, as vLLM frees
                self.cache.release(st.held)  # a finished request's blocks before its next step
                st.held = ()
            for admitted in sched.release(st):
                self._mark_scheduled(admitted, now_mono, now_wall)
        elif st.state is Admission.WAITING:
            pending -= 1
            sched.withdraw(st)
        terminal = st.terminal or ("disconnected" if st.client_gone else "cancelled")
        c = self.counters
        if terminal == "completed":
            c.success[st.finish_reason or "length"] += 1
        else:
            c.failure[terminal] += 1
        if st.scheduled_at is not None and st.prompt_tokens:
            c.prompt_tokens += st.prompt_tokens
        c.generation_tokens += st.completion_tokens
        if st.first_token_at is not None:
            c.ttft.observe(max(0.0, st.first_token_at - st.queued_at))
        if plan is not None and plan.drop_trace:
            return
        self.trace.write({
            "request_id": st.trace_id,
            "client_request_id": st.client_id,
            "endpoint": st.endpoint,
            "arrival_index": st.index,
            "stream": st.stream,
            "queued_at": st.queued_at,
            "scheduled_at": st.scheduled_at,
            "first_token_at": st.first_token_at,
            "finished_at": now_wall,
            "prompt_tokens": st.prompt_tokens,
            "completion_tokens": st.completion_tokens,
            "max_tokens": st.max_tokens,
            "finish_reason": st.finish_reason,
            "terminal_reason": terminal,
            "status": st.status,
            "fault": st.fault,
            "active": active,
            "pending": pending,
            "cached_tokens": st.cached_tokens,
            **st.prompt,
        })


async def _crash_later(delay: float) -> None:
    await trio.sleep(delay)
    _crash(f"{delay:g}s after listening (--crash-after)")


async def serve(config: SimConfig, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the simulator until cancelled. `task_status.started(port)` once it is listening."""
    if config.startup_delay > 0:
        await trio.sleep(config.startup_delay)
    trace = TraceWriter(config)
    try:
        listeners = await trio.open_tcp_listeners(config.port, host=config.host)
        server = _Server(config, trace)
        async with trio.open_nursery() as nursery:
            if config.crash_after is not None:
                nursery.start_soon(_crash_later, config.crash_after)
            await nursery.start(trio.serve_listeners, server.handle, listeners)
            task_status.started(listeners[0].socket.getsockname()[1])
    finally:
        trace.close()
