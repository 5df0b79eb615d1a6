"""Audit: a launched server's output and multi-backend runs, as a user running a real vLLM or
SGLang meets them. Real subprocess servers on 127.0.0.1 (a small stdlib server written by each
test), real signals; `run_spec` proves that nothing the run started is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import example, given, settings, strategies as st

from runner_support import manifest, requests_of, run_spec
from soakspec.evidence import serverlog
from soakspec.evidence.redact import Redactor
from test_serverlog import _cap

PY = sys.executable

# A stdlib OpenAI-compatible streaming server. Knobs (argv): --child (start a worker process in
# its own process group, as vLLM's API server starts its engine core), --die-after S (SIGKILL
# itself S seconds after listening: the OOM killer).
SERVER = textwrap.dedent(
    r'''
    import argparse, json, os, signal, socket, subprocess, sys, threading, time
    from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--die-after", type=float, default=None)
    p.add_argument("--child", action="store_true")
    p.add_argument("--bind", default="127.0.0.1")  # where it listens (::1: IPv6 loopback only)
    a = p.parse_args()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *args):
            pass
        def do_GET(self):
            body = b'{"data": [{"id": "m"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            def ev(obj):
                b = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
            for i in range(4):
                ev({"id": "cmpl-1", "object": "text_completion",
                    "choices": [{"index": 0, "text": " t", "finish_reason": "length" if i == 3 else None}]})
                self.wfile.flush()
                time.sleep(0.005)
            ev({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}})
            ev(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    class S(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in a.bind else socket.AF_INET

    if a.child:  # a worker in the server's own process group (not daemonized)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    srv = S((a.bind, a.port), H)
    print(f"listening on {a.bind}:{a.port}", flush=True)
    if a.die_after is not None:
        threading.Timer(a.die_after, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    srv.serve_forever()
    '''
)


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _server(tmp_path: Path) -> str:
    path = tmp_path / "server.py"
    path.write_text(SERVER)
    return str(path)


def spec(backends: dict[str, list[str]], *, parallel: bool = False, duration: str = "3s", grace: str = "2s",
         follow_up: bool = True) -> str:
    """One launched backend per entry (name -> argv)."""
    parts = [f'soak "audit" {{\n  issue = "audit"\n  parallel = {"true" if parallel else "false"}\n}}\n']
    for name, argv in backends.items():
        parts.append(
            f'backend "{name}" {{\n  launch = [{", ".join(_q(a) for a in argv)}]\n'
            f'  ready {{\n    timeout = 10s\n    interval = 100ms\n  }}\n  shutdown_grace = {grace}\n'
            f'  runtime {{\n    label = "x"\n  }}\n}}\n'
        )
    parts.append(textwrap.dedent(f"""\
        workload "w" {{
          prompt_words = 8
          max_tokens = 4
          load {{
            mode = closed
            concurrency = [2]
          }}
          duration = {duration}
          bucket = 1s
          deadline = 3s
          follow_up = {"true" if follow_up else "false"}
        }}
        gate {{
          require failed == 0
        }}
        claims {{
          claim "audit"
        }}
        """))
    return "\n".join(parts)


# ------------------------------------------------------------------ a server killed mid-level


@pytest.mark.slow  # a real soak of ~4 s
def _run_wrapped(tmp_path: Path, wrapper: str, *, timeout: float):
    """`soakspec run t.soak --out ev --quiet` in tmp_path, started by the Python code `wrapper`
    (which runs soakspec with its argv); every process it started gone after. (proc, ev)."""
    from runner_support import new_marker, run_env, wait_no_survivors

    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.run([PY, "-c", wrapper, "run", str(tmp_path / "t.soak"), "--out", str(out), "--quiet"],
                          cwd=tmp_path, env=run_env(marker), capture_output=True, text=True, timeout=timeout)
    assert wait_no_survivors(marker) == []
    return proc, out


def test_an_oom_killed_server_is_not_called_a_daemonizing_launcher(tmp_path):
    """The OOM killer SIGKILLs a server's main process mid-level; its worker (in the server's
    own process group, as vLLM's engine core) is orphaned and still running. The run aborts
    (exit 4) saying the server was killed -- not that its launcher daemonized it and that it
    should be launched in the foreground (it was), and the worker is stopped with the run."""
    server = _server(tmp_path)
    argv = [PY, server, "--port", "{port}", "--child", "--die-after", "1.5"]
    proc, out = run_spec(tmp_path, spec({"b0": argv}, follow_up=False))
    assert proc.returncode == 4, proc.stderr
    assert "backend 'b0': server killed by SIGKILL during the run" in proc.stderr, proc.stderr
    assert "daemonizes" not in proc.stderr and "outside its process group" not in proc.stderr, proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted"
    assert "daemonizes" not in m["incomplete_reason"]
    assert "1 process it started (PID" in m["incomplete_reason"], m["incomplete_reason"]


# soakspec as a container's PID 1 (`docker run IMAGE soakspec run ...`) does not reap the
# processes orphaned under it: PR_SET_CHILD_SUBREAPER makes the run that init, deterministically
SUBREAPER_RUN = ("import ctypes, os, sys; ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0); "
                 "os.execv(sys.executable, [sys.executable, '-m', 'soakspec', *sys.argv[1:]])")


@pytest.mark.slow  # a real soak of ~4 s (~14 s before the fix)
def test_a_killed_servers_orphaned_worker_does_not_hold_the_run_for_the_whole_grace(tmp_path):
    """The server's main process is SIGKILLed mid-level; its worker, orphaned, dies at the
    first SIGTERM -- and stays a zombie where nothing reaps orphans (soakspec as a container's
    PID 1). A zombie is not a running process: the teardown must not wait the whole
    `shutdown_grace` (vLLM specs say 30 s or more) for it, with the dead server's load still
    sending and a parallel backend's load going on, before the run aborts."""
    server = _server(tmp_path)
    argv = [PY, server, "--port", "{port}", "--child", "--die-after", "1.0"]
    (tmp_path / "t.soak").write_text(spec({"b0": argv}, grace="10s", follow_up=False))
    proc, out = _run_wrapped(tmp_path, SUBREAPER_RUN, timeout=120)
    assert proc.returncode == 4, proc.stderr
    m = manifest(out)
    assert "server killed by SIGKILL during the run" in m["incomplete_reason"]
    stopped = m["ended_at_epoch"] - m["aborted_at"]
    assert stopped < 5.0, f"the teardown of a dead server took {stopped:.1f}s (its grace: 10s)"


# ------------------------------------------------------------------ a server's log without newlines

RUSAGE_RUN = ("import resource, subprocess, sys; rc = subprocess.call([sys.executable, '-m', 'soakspec', *sys.argv[1:]]); "
              "print('maxrss_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)")

# prints `n` bytes of binary garbage without a newline (a `\r` progress bar, a binary dump), then serves
NO_NEWLINE = ("import os, sys; n = int(sys.argv[1]); block = bytes(range(256)).replace(b'\\n', b'\\r') * 4096; "
              "[sys.stdout.buffer.write(block[:min(len(block), n - i)]) for i in range(0, n, len(block))]; "
              "sys.stdout.flush(); os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")


@pytest.mark.slow  # a real soak of ~3 s and a 200 MB log
def test_a_log_line_without_newlines_is_capped_in_bounded_memory_and_keeps_its_tail(tmp_path):
    """A server prints 200 MB without a newline (a `\\r`-only progress bar, a binary dump), then
    its `listening` line, and serves. server.log's cap reads the log in pieces of a bounded
    size: soakspec's memory does not grow with the line (it held the whole line, four times
    over: 1.2 GB for 300 MB), and the cap's tail -- the log's last 8 MiB, where a crash says
    why -- is kept, not cut with the line it ends."""
    from runner_support import server_log_bytes

    server = _server(tmp_path)
    argv = [PY, "-c", NO_NEWLINE, str(200 << 20), server, "--port", "{port}"]
    (tmp_path / "t.soak").write_text(spec({"b0": argv}, duration="1s", follow_up=False))
    proc, out = _run_wrapped(tmp_path, RUSAGE_RUN, timeout=180)
    assert proc.returncode in (0, 1, 3), proc.stderr
    maxrss_mb = int(proc.stderr.rsplit("maxrss_kb", 1)[1].split()[0]) / 1024
    assert maxrss_mb < 350, f"soakspec's peak RSS was {maxrss_mb:.0f} MB for a 200 MB log line"
    cut = manifest(out)["backends"][0]["server_log_cut"]
    assert cut is not None and cut["bytes_before"] > 200 << 20
    log = server_log_bytes(out / "backends" / "b0")
    assert b"listening on 127.0.0.1:" in log, "the log's tail was cut with the line it ends"
    assert len(log) < 17 << 20


SECRET = "sk-audit-secret-0123456789"


@settings(max_examples=120, deadline=None)
@given(parts=st.lists(st.one_of(st.just(SECRET), st.text("ab \r\x00", max_size=90), st.just("\n")), max_size=40),
       head=st.integers(0, 400), tail=st.integers(0, 400), grow=st.lists(st.floats(0, 1), max_size=5),
       step=st.integers(1, 200))
@example(parts=[SECRET] * 22, head=320, tail=0, grow=[0.5625], step=1)  # a step stopped inside a secret's line (CI found it)
def test_long_lines_cap_in_pieces_alike_while_the_run_goes_and_at_its_end(tmp_path_factory, parts, head, tail, grow, step):
    """Lines longer than MAX_LINE are capped in pieces: the log capped while the server writes
    (steps at bucket ends) is byte for byte the log capped once at the end, and a secret is
    masked even across a piece's edge (MAX_LINE and MASK_OVERLAP made small here)."""
    text = "".join(parts).encode()
    mask = Redactor([SECRET]).log_mask()
    with mock.patch.object(serverlog, "MAX_LINE", 40), mock.patch.object(serverlog, "MASK_OVERLAP", len(SECRET) + 4):
        stepped, cut, _ = _cap(tmp_path_factory.mktemp("log"), text, head, tail,
                               [int(g * len(text)) for g in grow], step, mask=mask)
        once, once_cut, _ = _cap(tmp_path_factory.mktemp("log"), text, head, tail, (), step, mask=mask)
    assert stepped == once and cut == once_cut
    assert SECRET.encode() not in stepped
    if cut is None:  # nothing cut: the log as masked whole, line by line
        assert stepped == b"".join(mask(raw) for raw in text.splitlines(keepends=True))


# ------------------------------------------------------------------ a server that listens elsewhere


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.slow  # waits out a 3 s readiness timeout
@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_server_listening_on_ipv6_loopback_only_is_said_to_be_there(tmp_path):
    """A server told `--host localhost` may listen on ::1 alone; soakspec probes 127.0.0.1, is
    refused until the readiness timeout (15 minutes in a vLLM spec) and said only 'ConnectError'.
    It now says, as soon as it sees it and in the abort's reason, that [::1]:PORT accepts
    connections: the server listens on the IPv6 loopback only, where soakspec does not probe."""
    server = _server(tmp_path)
    argv = [PY, server, "--port", "{port}", "--bind", "::1"]
    text = spec({"b0": argv}).replace("timeout = 10s", "timeout = 3s")
    proc, out = run_spec(tmp_path, text)
    assert proc.returncode == 4, proc.stderr
    assert "not ready after 3s" in proc.stderr
    m = manifest(out)
    for said in (proc.stderr, m["incomplete_reason"]):
        assert "[::1]:" in said and "listens on ::1 only" in said, said
