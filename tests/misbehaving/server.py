"""A deliberately misbehaving OpenAI-compatible HTTP server for the fault-matrix tests.

Plain Python (stdlib only, one thread per connection), loopback only. Launched as a `launch`
backend: `python server.py --port {port} --mode MODE [flags]`. Every GET answers 200 (the
readiness probe); every POST answers a streamed completion shaped by `--mode`:

  ok              a correct chunked SSE stream: 4 text events, usage, `data: [DONE]`
  malformed-json  an SSE event whose data is not JSON
  huge-line       `data: ` followed by 10 MB without a newline (a client must stay bounded)
  slow            the whole response, status line included, at one byte per second
  reset           two events, then a TCP reset (SO_LINGER 0)
  http10          an HTTP/1.0 response without Content-Length: the body ends at close
  wrong-ctype     a correct stream labelled `application/json`
  chunked-edge    chunk extensions, one-byte chunks, upper-case hex sizes and a trailer
  error-event     HTTP 200, one token, then `data: {"error": ...}` and `[DONE]`
  no-done         a correct stream, properly terminated, without `data: [DONE]`
  die-mid-stream  two events, then the whole process exits with status 1
  zero-tokens     HTTP 200, events with empty text and usage 0, `finish_reason: length`, [DONE]
  usage-down      a correct stream whose cumulative usage goes 1, 2, 1, 4 (it went down)
  drop-second     keep-alive: on each connection the first request is answered (a correct
                  stream), the second is read and the connection closed without a response
  idle-close      keep-alive: every request answered; a connection idle for `--idle-close`
                  seconds (default 0.3) is closed by the server, as uvicorn does after 5 s
  leak-secrets    quotes its env values named LEAK_* (secret names, e.g. LEAK_TOKEN), the
                  request's `Authorization` header and a credential nobody told soakspec of in
                  what it answers, by turns (`LEAKS`): an HTTP 500 body, a JSON error event, an
                  `event: error`, a 500 body that puts a secret across soakspec's 500-character
                  error limit, and a correct stream whose response id is a secret. It never
                  prints them.

Process-level flags: `--ignore-sigterm` (only SIGKILL stops it), `--garbage` (write binary
garbage to stdout at start and per request), `--exit-before-ready` (print a line, exit 1 before
listening), `--crash-at-start` (raise an exception before listening), `--stop-answering-after S`
(S seconds after listening, close the listening socket and every connection but stay alive:
the port refuses connections while the process lives on, like an API server whose engine died),
`--chat-template-error` (every chat request is a 400 with vLLM's "no chat template" message),
`--fail-after S` (S seconds after listening every request, the readiness GET included, is an
HTTP 500: an API server that stays up after its engine died), `--stop-answering-after-requests N`
(as `--stop-answering-after`, once N completion requests have been answered: N = 1 is a port
that closes right after soakspec's pre-flight request, before any level).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import socket
import struct
import sys
import threading
import time

GARBAGE = bytes(range(256)) + b"\x1b[2J\x1b[31m\xff\xfe\xc3\x28\x00\x07\x08\r" + os.urandom(64)


def event(text: str | None = None, *, finish: str | None = None, usage: int | None = None) -> bytes:
    obj: dict = {"id": "cmpl-mis", "object": "text_completion", "choices": [{"index": 0, "text": text or "", "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = {"prompt_tokens": 8, "completion_tokens": usage, "total_tokens": 8 + usage}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


TOKENS = [event("a"), event(" b"), event(" c"), event(" d", finish="length", usage=4)]
DONE = b"data: [DONE]\n\n"
STREAM = b"".join(TOKENS) + DONE


def chunk(data: bytes, ext: str = "") -> bytes:
    return b"%X%s\r\n%s\r\n" % (len(data), ext.encode(), data)


def head(status: str = "200 OK", ctype: str = "text/event-stream", version: str = "HTTP/1.1", chunked: bool = True) -> bytes:
    lines = [f"{version} {status}", f"Content-Type: {ctype}", "Connection: close"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


REQUEST = threading.local()
LEAKS = itertools.count()  # `leak-secrets`: which way the next request's answer leaks
UNKNOWN_CREDENTIAL = "hf_serverOwnTokenNobodyToldSoakspec0123"  # caught by its pattern alone


def leaked() -> str:
    """What `leak-secrets` quotes: its env values named LEAK_* (the test gives them secret
    names), the request's Authorization header and a credential of its own."""
    env = "; ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("LEAK_"))
    auth = [line for line in REQUEST.head.decode("latin-1").split("\r\n") if line.lower().startswith("authorization:")]
    return f"engine misconfigured ({env}); request {'; '.join(auth)}; cache {UNKNOWN_CREDENTIAL}"


def leak(conn: socket.socket) -> None:
    n = next(LEAKS) % 5
    text = leaked()
    if n == 0:  # an HTTP 500 whose JSON body quotes them
        body = json.dumps({"error": {"message": text, "type": "server_error"}}).encode()
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    elif n == 1:  # a JSON error event after a token
        err = b"data: " + json.dumps({"error": {"message": text}}).encode() + b"\n\n"
        conn.sendall(head() + chunk(TOKENS[0] + err + DONE) + b"0\r\n\r\n")
    elif n == 2:  # an `event: error`
        conn.sendall(head() + chunk(TOKENS[0] + b"event: error\ndata: " + text.encode() + b"\n\n" + DONE) + b"0\r\n\r\n")
    elif n == 3:  # a plain-text 500 whose secret starts at the 490th character: the error limit cuts it
        secret = next((v for k, v in sorted(os.environ.items()) if k.startswith("LEAK_")), "none")
        body = ("x" * 480 + secret + " was rejected").encode()
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    else:  # a correct stream whose response id is the Authorization header's token
        token = text.split("Bearer ", 1)[1].split(";", 1)[0] if "Bearer " in text else "none"
        stream = STREAM.replace(b'"cmpl-mis"', json.dumps("cmpl-" + token).encode())
        conn.sendall(head() + chunk(stream) + b"0\r\n\r\n")


def read_request(conn: socket.socket) -> tuple[str, bytes] | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    raw_head, _, body = buf.partition(b"\r\n\r\n")
    REQUEST.head = raw_head  # this thread's request head (`leak-secrets` quotes it)
    lines = raw_head.decode("latin-1").split("\r\n")
    method = lines[0].split(" ", 1)[0]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(body) < length:
        data = conn.recv(65536)
        if not data:
            return None
        body += data
    return method, body


def respond(conn: socket.socket, mode: str) -> None:
    send = conn.sendall
    if mode == "ok":
        send(head() + chunk(STREAM) + b"0\r\n\r\n")
    elif mode == "malformed-json":
        send(head() + chunk(TOKENS[0] + b'data: {"choices": [{"text": "x",\n\n' + DONE) + b"0\r\n\r\n")
    elif mode == "huge-line":
        send(head(chunked=False) + b"data: ")
        piece = b"x" * 65536
        for _ in range(10 * 16):  # 10 MiB, no newline
            send(piece)
        send(b"\n\n" + DONE)
    elif mode == "slow":
        for b in head(chunked=False) + STREAM:
            send(bytes([b]))
            time.sleep(1.0)
    elif mode == "reset":
        send(head(chunked=False) + TOKENS[0] + TOKENS[1])
        time.sleep(0.05)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    elif mode == "http10":
        send(head(version="HTTP/1.0", chunked=False).replace(b"Connection: close\r\n", b"") + STREAM)
    elif mode == "wrong-ctype":
        send(head(ctype="application/json") + chunk(STREAM) + b"0\r\n\r\n")
    elif mode == "chunked-edge":
        out = head()
        out += chunk(TOKENS[0], ';name="value";flag')
        out += b"".join(chunk(bytes([b])) for b in TOKENS[1])  # one-byte chunks
        out += b"%x ; ext\r\n%s\r\n" % (len(TOKENS[2]), TOKENS[2])  # lower-case hex, BWS
        out += chunk(TOKENS[3] + DONE, ";last")
        out += b"0;end=1\r\nX-Trailer: yes\r\n\r\n"
        send(out)
    elif mode == "error-event":
        err = b'data: {"error": {"message": "out of KV cache blocks", "type": "server_error"}}\n\n'
        send(head() + chunk(TOKENS[0] + err + DONE) + b"0\r\n\r\n")
    elif mode == "no-done":
        send(head() + chunk(b"".join(TOKENS)) + b"0\r\n\r\n")
    elif mode == "zero-tokens":
        send(head() + chunk(event(None, usage=0) + event(None, finish="length", usage=0) + DONE) + b"0\r\n\r\n")
    elif mode == "usage-down":
        down = event("a", usage=1) + event(" b", usage=2) + event(" c", usage=1) + event(" d", finish="length", usage=4)
        send(head() + chunk(down + DONE) + b"0\r\n\r\n")
    elif mode == "die-mid-stream":
        send(head() + chunk(TOKENS[0] + TOKENS[1]))
        time.sleep(0.05)
        print("dying mid-stream", flush=True)
        os._exit(1)
    elif mode == "leak-secrets":
        leak(conn)
    else:  # pragma: no cover
        raise SystemExit(f"unknown mode {mode}")


KEEP_ALIVE_MODES = ("drop-second", "idle-close")
OPEN: set = set()  # accepted connections (closed by --stop-answering-after)
CHAT_TEMPLATE_ERROR = False
FAIL_AT: float | None = None  # --fail-after: from then on, every answer is a 500
STOP_AFTER: list = []  # --stop-answering-after-requests: [N, the listening socket, answered so far, a lock]
ENGINE_DEAD = b'{"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause."}}'
CHAT_TEMPLATE_MESSAGE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
    "template if the tokenizer does not define one."
)


def stop_answering(srv: socket.socket, after: float) -> None:
    time.sleep(after)
    print(f"engine died: the port stops answering after {after} s (the process lives on)", flush=True)
    srv.shutdown(socket.SHUT_RDWR)
    srv.close()
    for conn in list(OPEN):
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def keep_alive_response() -> bytes:
    """A correct stream with Content-Length and without `Connection: close`."""
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
            % (len(STREAM), STREAM))


def serve_kept_alive(conn: socket.socket, mode: str, idle_close: float) -> None:
    """One kept-alive connection of the `drop-second`/`idle-close` modes."""
    n = 0
    while True:
        conn.settimeout(idle_close if mode == "idle-close" else None)
        try:
            req = read_request(conn)
        except socket.timeout:  # idle too long: close it, as uvicorn's timeout_keep_alive does
            print(f"closing a connection idle for {idle_close} s after {n} requests", flush=True)
            return
        if req is None:
            return
        conn.settimeout(None)
        n += 1
        method, _ = req
        if method == "GET":
            body = b'{"object": "list", "data": []}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            continue
        if mode == "drop-second" and n % 2 == 0:
            print(f"dropping request {n} of a kept-alive connection", flush=True)
            return  # the request was read; close without a byte of response
        conn.sendall(keep_alive_response())


def serve_one(conn: socket.socket, mode: str, garbage: bool, idle_close: float = 0.3) -> None:
    try:
        if mode in KEEP_ALIVE_MODES:
            serve_kept_alive(conn, mode, idle_close)
            return
        req = read_request(conn)
        if req is None:
            return
        if FAIL_AT is not None and time.monotonic() >= FAIL_AT:
            conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(ENGINE_DEAD), ENGINE_DEAD))
            return
        method, _ = req
        if method == "GET":
            body = b'{"object": "list", "data": [{"id": "sim-model", "object": "model"}]}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            return
        if garbage:
            sys.stdout.buffer.write(GARBAGE + b"\n")
            sys.stdout.buffer.flush()
        if CHAT_TEMPLATE_ERROR and b'"messages"' in req[1]:
            body = json.dumps({"object": "error", "message": CHAT_TEMPLATE_MESSAGE, "type": "BadRequestError",
                               "param": None, "code": 400}).encode()
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            print("chat request refused: no chat template", flush=True)
            return
        respond(conn, mode)
        if STOP_AFTER:
            with STOP_AFTER[3]:
                STOP_AFTER[2] += 1
                if STOP_AFTER[2] == STOP_AFTER[0]:
                    stop_answering(STOP_AFTER[1], 0.0)
    except OSError:
        pass
    finally:
        try:
            conn.close()
        except OSError:
            pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", default="ok")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--garbage", action="store_true")
    p.add_argument("--exit-before-ready", action="store_true")
    p.add_argument("--crash-at-start", action="store_true")
    p.add_argument("--idle-close", type=float, default=0.3)
    p.add_argument("--stop-answering-after", type=float, default=None)
    p.add_argument("--stop-answering-after-requests", type=int, default=None)
    p.add_argument("--chat-template-error", action="store_true")
    p.add_argument("--fail-after", type=float, default=None)
    args = p.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.garbage:
        sys.stdout.buffer.write(b"starting\n" + GARBAGE + b"\n")
        sys.stdout.buffer.flush()
    if args.crash_at_start:
        raise RuntimeError("misbehaving server: crash at start")
    if args.exit_before_ready:
        print("misbehaving server: giving up before listening", flush=True)
        return 1
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", args.port))
    srv.listen(128)
    print(f"misbehaving server ({args.mode}) listening on 127.0.0.1:{args.port}", flush=True)
    if args.stop_answering_after is not None:
        threading.Thread(target=stop_answering, args=(srv, args.stop_answering_after), daemon=True).start()
    if args.stop_answering_after_requests is not None:
        STOP_AFTER.extend([args.stop_answering_after_requests, srv, 0, threading.Lock()])
    global CHAT_TEMPLATE_ERROR, FAIL_AT
    CHAT_TEMPLATE_ERROR = args.chat_template_error
    if args.fail_after is not None:
        FAIL_AT = time.monotonic() + args.fail_after
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:  # the listening socket was closed: live on, answering nothing
            while True:
                time.sleep(3600)
        OPEN.add(conn)
        threading.Thread(target=serve_one, args=(conn, args.mode, args.garbage, args.idle_close), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
