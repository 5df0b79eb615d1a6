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

import pytest

from runner_support import manifest, requests_of, run_spec

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

    if a.child:  # a worker in the server's own process group (not daemonized)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    srv = S(("127.0.0.1", a.port), H)
    print(f"listening on 127.0.0.1:{a.port}", flush=True)
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
    from runner_support import new_marker, run_env, wait_no_survivors

    server = _server(tmp_path)
    argv = [PY, server, "--port", "{port}", "--child", "--die-after", "1.0"]
    (tmp_path / "t.soak").write_text(spec({"b0": argv}, grace="10s", follow_up=False))
    marker = new_marker()
    out = tmp_path / "ev"
    proc = subprocess.run([PY, "-c", SUBREAPER_RUN, "run", str(tmp_path / "t.soak"), "--out", str(out), "--quiet"],
                          cwd=tmp_path, env=run_env(marker), capture_output=True, text=True, timeout=120)
    assert wait_no_survivors(marker) == []
    assert proc.returncode == 4, proc.stderr
    m = manifest(out)
    assert "server killed by SIGKILL during the run" in m["incomplete_reason"]
    stopped = m["ended_at_epoch"] - m["aborted_at"]
    assert stopped < 5.0, f"the teardown of a dead server took {stopped:.1f}s (its grace: 10s)"
