"""The fixture of the load-generator benchmarks: nginx serving a canned streamed completion, and
CPU/RSS readings of process trees from /proc. Used by `run.py` and `../memory.py`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

TOKENS = 64
CLK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[loadgen {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------
# the canned server


def canned_completion(tokens: int = TOKENS) -> bytes:
    """A vLLM-style streamed completion: `tokens` text events, a usage event, [DONE]."""
    head = '{"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"bench","choices":[{"index":0,'
    events = []
    for i in range(tokens):
        reason = '"length"' if i == tokens - 1 else "null"
        events.append(f'data: {head}"text":" tok{i}","logprobs":null,"finish_reason":{reason},"stop_reason":null}}]}}\n\n')
    usage = f'{{"prompt_tokens":8,"total_tokens":{8 + tokens},"completion_tokens":{tokens}}}'
    events.append(f'data: {{"id":"cmpl-bench","object":"text_completion","created":1700000000,"model":"bench","choices":[],"usage":{usage}}}\n\n')
    events.append("data: [DONE]\n\n")
    return "".join(events).encode()


# What soakspec runs against the canned server: one `url` backend, closed loop (run.py, memory.py).
NGINX_SPEC = """\
soak "{name}" {{
  issue = "8"
}}
model {{
  id = "bench"
}}
backend "nginx" {{
  url = "http://127.0.0.1:{port}"
  runtime {{
    label = "nginx, canned {tokens}-token SSE completion"
  }}
}}
workload "w" {{
  endpoint = completions
  prompt_words = 8
  max_tokens = {tokens}
  ignore_eos = true
  load {{
    mode = closed
    concurrency = [{concurrency}]
  }}
{warmup}  duration = {duration}s
  bucket = {bucket}s
  deadline = 30s
  follow_up = false
}}
gate {{
  require failed == 0
}}
claims {{
  claim "{claim}"
}}
"""


def nginx_spec(name: str, claim: str, port: int, concurrency: str, duration: float, bucket: float,
               warmup: float | None = None) -> str:  # fmt: skip
    warm = "" if warmup is None else f"  warmup = {warmup}s\n"
    return NGINX_SPEC.format(name=name, claim=claim, port=port, tokens=TOKENS, concurrency=concurrency,
                             duration=duration, bucket=bucket, warmup=warm)  # fmt: skip


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(q / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  types {{ text/event-stream sse; application/json json; }}
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    root {dir}/www;
    location = /v1/completions {{
      try_files /completion.sse =404;
      error_page 405 =200 $uri;   # the static handler refuses POST: serve the file anyway
    }}
    location = /v1/models {{
      try_files /models.json =404;
    }}
  }}
}}
"""


def find_tool(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None)


def ensure_tools() -> tuple[str, str]:
    nginx, wrk = find_tool("nginx"), find_tool("wrk")
    if nginx and wrk:
        return nginx, wrk
    if os.geteuid() != 0:
        raise SystemExit("nginx and wrk are needed: apt-get install -y nginx wrk")
    log("installing nginx and wrk (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "install", "-y", "-q", "nginx", "wrk"], check=True, env=env, stdout=subprocess.DEVNULL, timeout=600)
    nginx, wrk = find_tool("nginx"), find_tool("wrk")
    if not (nginx and wrk):
        raise SystemExit("could not install nginx and wrk")
    return nginx, wrk


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(nginx: str, workdir: Path, port: int) -> subprocess.Popen:
    www = workdir / "www"
    www.mkdir(parents=True)
    for d in (workdir.parent, workdir, www):  # nginx's worker runs as an unprivileged user when we are root
        d.chmod(0o755)
    (www / "completion.sse").write_bytes(canned_completion())
    (www / "models.json").write_text(json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}))
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, port=port))
    proc = subprocess.Popen([nginx, "-p", str(workdir), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 15
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, whatever *_proxy says
    while True:
        try:
            with direct.open(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_nginx(proc)
            raise SystemExit(f"nginx did not start: {proc.stderr.read().decode(errors='replace') if proc.stderr else ''}")
        time.sleep(0.1)


def stop_nginx(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # nginx: fast shutdown
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------
# CPU of process trees, sampled


def _cpu(pid: int) -> float | None:
    """CPU seconds of a process, those of the children it reaped included."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in fields[11:15]) / CLK


def _children(pid: int) -> list[int]:
    """The live children of `pid` (of every one of its threads)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
    except OSError:  # gone meanwhile
        pass
    return out


def tree_cpu(root: int) -> float:
    """User+system seconds of `root` and its live descendants (and what they reaped).

    Walks the tree through /proc/<pid>/task/<tid>/children: a few reads, where scanning all of
    /proc every 50 ms took ~6% of a core from the processes being measured."""
    total, todo, seen = 0.0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        s = _cpu(pid)
        if s is not None:
            total += s
            todo.extend(_children(pid))
    return total


class Sampler:
    """Samples the CPU of a few process trees every `interval` s (epoch time stamps)."""

    def __init__(self, roots: dict[str, int], interval: float = 0.05) -> None:
        self.roots = roots
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), {k: tree_cpu(p) for k, p in self.roots.items()}))
            self._stop.wait(interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, key: str, t: float) -> float:
        """CPU seconds of tree `key` at time `t` (linear between samples)."""
        prev = None
        for ts, v in self.samples:
            if ts >= t:
                if prev is None:
                    return v[key]
                t0, v0 = prev
                return v0[key] + (v[key] - v0[key]) * (t - t0) / (ts - t0)
            prev = (ts, v)
        return prev[1][key] if prev else float("nan")



def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
