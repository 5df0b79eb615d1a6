"""A url backend's `log_file` (issue 16): its traces and runtime boundary come from the server's
own log, read from the size it had when the backend started, never from its stale lines.

`check` accepts log traces and a runtime `log_pattern` on a url backend exactly when it names
`log_file`; the plan resolves the path against the spec's folder; `runner/logfile.py` copies
what the file gained into server.log; an externally started simulator, whose stdout goes to
that file after stale lines, gives 100% trace coverage and a confirmed boundary."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from soakspec.diagnostics import Severity
from soakspec.evidence.io import read_jsonl
from soakspec.evidence.serverlog import read_log
from soakspec.lang import check, parse
from soakspec.plan import plan
from soakspec.runner.logfile import ExternalLog
from tests.runner_support import new_marker, run_env, soakspec_cmd, wait_no_survivors

PATTERN = r'r"soakspec_sim_trace (?P<json>\{.*\})"'
LOG_BITS = f"""  runtime {{
    label = "simrt 1.2.3"
    log_pattern = r"simrt (?P<version>\\d+\\.\\d+\\.\\d+)"
    version = "1.2.3"
  }}
  traces {{
    source = log
    pattern = {PATTERN}
  }}
"""


def _spec_text(head: str, port: int = 8000, gate: str = "require completed_run") -> str:
    return f"""soak "x" {{ issue = "t" }}
model {{ id = "sim-model" }}
backend "ext" {{
  url = "http://127.0.0.1:{port}"
{head}{LOG_BITS}}}
workload "w" {{
  prompt_words = 8
  max_tokens = 4
  load {{
    mode = closed
    concurrency = [2]
  }}
  duration = 2s
  bucket = 1s
  deadline = 5s
}}
gate {{
  {gate}
}}
claims {{ claim "t" }}
"""


def _check(text: str, path: str | None = None):
    tree, diags = parse(text, path) if path else parse(text)
    assert tree is not None, diags
    spec, more = check(tree)
    return spec, [(d.code, d.span.line, d.span.column) for d in diags + more if d.severity is Severity.ERROR]


def test_log_traces_and_log_pattern_on_a_url_backend_need_its_log_file():
    spec, errors = _check(_spec_text('  log_file = "server.log"\n'))
    assert errors == [] and spec.backends[0].log_file == "server.log"
    _, errors = _check(_spec_text(""))
    assert [e[0] for e in errors] == ["E413", "E413"]  # log_pattern, traces source = log


def test_log_file_on_a_launched_backend_or_empty_is_an_error():
    text = 'soak "x" {}\nbackend "a" {\n  launch = ["./srv", "{port}"]\n  log_file = "x.log"\n}\nworkload "w" {\n  load { concurrency = 1 }\n  duration = 60s\n}\n'
    assert _check(text)[1] == [("E403", 4, 3)]
    _, errors = _check(_spec_text('  log_file = "  "\n'))
    assert errors[0] == ("E205", 5, 14)  # and, having no log, its log readers are E413 again
    assert [e[0] for e in errors[1:]] == ["E413", "E413"]


def test_the_plan_resolves_log_file_against_the_specs_folder(tmp_path):
    path = tmp_path / "s.soak"
    path.write_text(_spec_text('  log_file = "logs/server.log"\n'))
    tree, _ = parse(path.read_text())
    spec, _ = check(tree)
    import dataclasses

    spec = dataclasses.replace(spec, path=str(path))
    la = plan(spec).backends[0].launch
    assert la.log_file == str(tmp_path / "logs" / "server.log")
    assert plan(spec, rehearse=True).backends[0].launch.log_file is None  # a rehearsal's simulator has its own log


def test_external_log_copies_only_what_the_file_gained(tmp_path):
    log = tmp_path / "srv.log"
    log.write_bytes(b"stale 1\nstale 2\n")
    ext = ExternalLog.at_start(str(log))
    assert ext.start_offset == 16
    with log.open("ab") as f:
        f.write(b"fresh\n")
    dest = tmp_path / "server.log"
    info = ext.copy_into(dest)
    assert dest.read_bytes() == b"fresh\n"
    assert (info["start_offset"], info["bytes_read"], info["rotated"], info["error"]) == (16, 6, False, None)
    log.write_bytes(b"new\n")  # rotated: shorter than the offset, read from its start
    info = ext.copy_into(dest)
    assert dest.read_bytes() == b"new\n" and info["rotated"] is True
    missing = ExternalLog.at_start(str(tmp_path / "later.log"))
    assert missing.start_offset == 0
    info = missing.copy_into(tmp_path / "x.log")
    assert info["bytes_read"] == 0 and info["error"] is not None


def test_the_running_servers_banner_from_before_the_run_is_kept_but_no_stale_trace(tmp_path):
    """A long-running server printed its version when it started, before this run: the last
    banner before the offset (the process now running; an older restart's banner is not it)
    goes first into server.log, and nothing else from before the offset does."""
    log = tmp_path / "srv.log"
    old = b"Initializing a V1 LLM engine (v0.31.0)\n"
    new = b"Initializing a V1 LLM engine (v0.32.0)\n"
    log.write_bytes(old + b"Received request cmpl-stale-0: ...\n" + new + b"Received request cmpl-stale2-0: ...\n")
    ext = ExternalLog.at_start(str(log), r"Initializing a V1 LLM engine \(v(?P<version>\d+\.\d+\.\d+)\)")
    assert ext.banner == new and ext.banner_offset == len(old) + len(b"Received request cmpl-stale-0: ...\n")
    with log.open("ab") as f:
        f.write(b"Received request cmpl-fresh-0: ...\n")
    dest = tmp_path / "server.log"
    info = ext.copy_into(dest)
    assert dest.read_bytes() == new + b"Received request cmpl-fresh-0: ...\n"
    assert info["banner"] == {"offset": ext.banner_offset, "bytes": len(new)}
    assert info["bytes_read"] == len(b"Received request cmpl-fresh-0: ...\n")
    # without a runtime pattern nothing from before the offset is kept
    plain = ExternalLog.at_start(str(log))
    assert plain.banner is None
    # a server that (re)started during the run printed its own banner: the old one is not added
    ext = ExternalLog.at_start(str(log), r"Initializing a V1 LLM engine \(v(?P<version>\d+\.\d+\.\d+)\)")
    with log.open("ab") as f:
        f.write(b"Initializing a V1 LLM engine (v0.33.0)\n")
    info = ext.copy_into(dest)
    assert dest.read_bytes() == b"Initializing a V1 LLM engine (v0.33.0)\n" and "banner" not in info


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_external_simulator_logging_to_log_file_gives_full_traces_and_a_confirmed_boundary(tmp_path):
    port = _free_port()
    log = tmp_path / "sim.log"
    stale = b'simrt 9.9.9\nsoakspec_sim_trace {"request_id": "stale-1", "id": "cmpl-stale-1-0"}\n'
    log.write_bytes(stale)
    gate = "require completed_run\n  require trace_coverage >= 100% per bucket\n  require runtime_boundary_specific\n  require failed == 0"
    spec = tmp_path / "ext.soak"
    spec.write_text(_spec_text('  log_file = "sim.log"\n', port, gate))
    out = tmp_path / "ev"
    marker = new_marker()
    run = subprocess.Popen(soakspec_cmd("run", str(spec), "--out", str(out)), cwd=tmp_path, env=run_env(marker),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sim = None
    try:
        for _ in range(300):  # the run has started (and noted the log's size) once its manifest exists
            if (out / "manifest.json").exists():
                break
            time.sleep(0.05)
        time.sleep(0.3)
        with log.open("ab") as f:
            sim = subprocess.Popen([sys.executable, "-m", "soakspec", "sim", "--host", "127.0.0.1", "--port", str(port),
                                    "--model=sim-model", "--ttft=5ms", "--itl=1ms", "--runtime-banner=simrt 1.2.3"],
                                   stdout=f, stderr=subprocess.STDOUT, env=run_env(marker))
        stdout, stderr = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
        if sim is not None:
            sim.terminate()
            sim.wait(timeout=10)
    assert wait_no_survivors(marker) == []
    assert run.returncode == 0, stdout + stderr
    assert "trace_coverage >= 100% per bucket" in stdout and "simrt 1.2.3 (confirmed)" in stdout
    manifest = json.loads((out / "manifest.json").read_text())
    (be,) = manifest["backends"]
    server_log = read_log(out / "backends" / "ext" / "server.log.gz")  # compressed when the run ended
    assert be["log_file"]["path"] == str(log) and be["log_file"]["start_offset"] == len(stale)
    assert be["log_file"]["bytes_read"] == len(server_log) > 0
    assert b"simrt 9.9.9" not in server_log and b"stale-1" not in server_log
    assert be["runtime_boundary"]["status"] == "confirmed" and be["runtime_boundary"]["detected"] == "1.2.3"
    traces, _ = read_jsonl(out / "backends" / "ext" / "traces.jsonl.gz")
    assert traces and not any("stale" in json.dumps(t) for t in traces)
    gate_run = subprocess.run(soakspec_cmd("gate", str(out)), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert gate_run.returncode == 0, gate_run.stdout  # the judge re-matches the traces from server.log: same verdict
