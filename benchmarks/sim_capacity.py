"""Capacity of the embedded simulator: completions/s and tokens/s at concurrency 64.

Starts `python -m soakspec sim --zero-latency` on loopback as a subprocess, then drives it with
64 keep-alive connections, each sending streaming 64-token completions (`ignore_eos`) one after
another, until `--requests` have completed or `--max-seconds` have passed. The load comes from
`--clients` worker processes using raw sockets (a prebuilt request, a response is complete at
the chunked terminator), so the client is much cheaper per request than the server. Every
response is checked: status 200, exactly 64 token events, `data: [DONE]`. Then SIGTERM stops the
server and its exit code is checked.

    python benchmarks/sim_capacity.py                  # 20,000 requests or 30 s, traces on
    python benchmarks/sim_capacity.py --no-trace-log   # the same without trace lines
    python benchmarks/sim_capacity.py --prompt-words 100   # every prompt the same 100 words:
                                                           # 6 whole blocks the prefix cache hits
    python benchmarks/sim_capacity.py --no-prefix-caching  # the simulator's prefix cache off

The default prompt (9 words) holds no whole block of 16, so the prefix cache (on by default)
hashes nothing and holds nothing; `--prompt-words` makes it work on every request.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time

TERMINATOR = b"0\r\n\r\n"


PROMPT = "the quick brown fox jumps over the lazy dog"


def _request(tokens: int, prompt_words: int) -> bytes:
    prompt = " ".join(f"w{i}" for i in range(prompt_words)) if prompt_words else PROMPT
    body = json.dumps({
        "model": "sim-model",
        "prompt": prompt,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def _client(port: int, connections: int, quota: int, deadline: float, tokens: int, prompt_words: int,
            out: mp.Queue) -> None:
    """One worker process: `connections` sockets, closed-loop, until `quota` or `deadline`."""
    request = _request(tokens, prompt_words)
    sel = selectors.DefaultSelector()
    bufs: dict[socket.socket, bytearray] = {}
    started = done = bad = 0

    def send(sock: socket.socket) -> None:
        nonlocal started
        started += 1
        bufs[sock] = bytearray()
        sock.sendall(request)

    for _ in range(connections):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sel.register(s, selectors.EVENT_READ)
        send(s)
    open_socks = connections
    while open_socks:
        for key, _ in sel.select(timeout=1.0):
            sock = key.fileobj
            data = sock.recv(1 << 18)  # type: ignore[union-attr]
            if not data:
                raise SystemExit("the simulator closed a connection")
            buf = bufs[sock]  # type: ignore[index]
            buf += data
            if not buf.endswith(TERMINATOR):
                continue
            ok = buf.startswith(b"HTTP/1.1 200") and buf.count(b'"text":') == tokens and b"data: [DONE]" in buf
            done += ok
            bad += not ok
            if started < quota and time.monotonic() < deadline:
                send(sock)  # type: ignore[arg-type]
            else:
                sel.unregister(sock)
                sock.close()  # type: ignore[union-attr]
                open_socks -= 1
        if time.monotonic() > deadline + 10:
            raise SystemExit("responses stopped arriving")
    out.put((done, bad))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=2, help="client worker processes")
    ap.add_argument("--no-trace-log", action="store_true", help="start the simulator with --no-trace-log")
    ap.add_argument("--prompt-words", type=int, default=0,
                    help="send a prompt of this many distinct words, the same every request (default: a 9-word one)")
    ap.add_argument("--no-prefix-caching", action="store_true", help="start the simulator with --no-enable-prefix-caching")
    args = ap.parse_args()

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        cmd = [
            sys.executable, "-m", "soakspec", "sim", "--zero-latency", "--port", "0", "--port-file", port_file,
            "--slots", str(args.concurrency),
        ]
        if args.no_trace_log:
            cmd.append("--no-trace-log")
        if args.no_prefix_caching:
            cmd.append("--no-enable-prefix-caching")
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            line = server.stderr.readline()  # type: ignore[union-attr]
            if "listening on" not in line:
                raise SystemExit(f"the simulator did not start: {line.strip()}")
            port = int(open(port_file).read())
            out: mp.Queue = mp.Queue()
            per = [args.concurrency // args.clients + (i < args.concurrency % args.clients)
                   for i in range(args.clients)]
            quota = [args.requests * n // args.concurrency for n in per]
            t0 = time.monotonic()
            deadline = t0 + args.max_seconds
            cpu0 = _cpu_seconds(server.pid)
            workers = [mp.Process(target=_client, args=(port, n, q, deadline, args.tokens, args.prompt_words, out))
                       for n, q in zip(per, quota) if n]
            for w in workers:
                w.start()
            results = [out.get(timeout=args.max_seconds + 30) for _ in workers]
            elapsed = time.monotonic() - t0
            cpu = _cpu_seconds(server.pid) - cpu0
            for w in workers:
                w.join(timeout=5)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                code = server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                code = server.wait()
    done = sum(r[0] for r in results)
    bad = sum(r[1] for r in results)
    print(f"simulator capacity, --zero-latency, concurrency {args.concurrency}, {args.tokens}-token streamed "
          f"completions, traces {'off' if args.no_trace_log else 'on (stdout)'}, "
          f"prompt {args.prompt_words or len(PROMPT.split())} words, "
          f"prefix cache {'off' if args.no_prefix_caching else 'on'}")
    print(f"  completed      {done} in {elapsed:.2f} s ({bad} bad responses)")
    print(f"  completions/s  {done / elapsed:,.0f}")
    print(f"  tokens/s       {done * args.tokens / elapsed:,.0f}")
    print(f"  server CPU     {cpu:.1f} s = {cpu / elapsed:.0%} of one core "
          f"-> {done / cpu:,.0f} completions and {done * args.tokens / cpu:,.0f} tokens per server CPU-second")
    print(f"  machine        {os.cpu_count()} CPUs, load average {load0:.2f} before / {os.getloadavg()[0]:.2f} after")
    print(f"  server exit    {code} after SIGTERM")
    return 0 if bad == 0 and code == 0 and done > 0 else 1


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


if __name__ == "__main__":
    sys.exit(main())
