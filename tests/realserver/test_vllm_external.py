"""An externally started vLLM (a `url` backend): pre-flight and liveness against the real thing.

One vLLM (CPU build, tiny model, started here without a chat template) serves two runs:

1. a chat workload: vLLM answers every chat request 400 ("default chat template is no longer
   allowed"); the run stops before the first level (exit 4) with vLLM's message on stderr,
   after fewer than 10 requests;
2. a completions soak that reads vLLM's log file (`log_file`): traces 100 % per bucket and the
   runtime boundary confirmed from that log, and the run's output tokens equal the delta of
   vLLM's own `vllm:generation_tokens_total`;
3. a completions soak; the test SIGKILLs vLLM's engine process mid-run: exit 4 within
   seconds, the manifest `aborted` with the reason and the time, fewer than 100
   connection-refused records, and the gate never PASSes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lane import lenient_client

from soakspec.evidence.record import iter_records

from soakspec.runner.procs import free_port

from test_vllm import check_server_metrics

pytestmark = pytest.mark.realserver

SPEC = """\
soak "vllm-url" {{
  issue = "16"
}}
model {{
  id = "tiny"
}}
backend "vllm" {{
  url = "http://127.0.0.1:{port}"
  ready {{
    path = "/health"
    status = 200
    timeout = 30s
  }}
  runtime {{
    label = "host-staged"
  }}
}}
workload "w" {{
  endpoint = {endpoint}
  prompt_words = 8
  max_tokens = 16
  ignore_eos = true
  load {{
    mode = closed
    concurrency = [2]
  }}
  duration = 90s
  bucket = 10s
  deadline = 30s
  follow_up = false
}}
gate {{
  require completed_run
  require failed == 0
}}
claims {{
  claim "test"
}}
"""


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


@pytest.fixture(scope="module")
def vllm(lane, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1")
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(lane / "V" / "bin" / "vllm"), "serve", str(lane / "tiny"), "--served-model-name", "tiny",
             "--max-model-len", "1024", "--dtype", "bfloat16", "--enable-log-requests",
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("vLLM did not start:\n" + log.read_text()[-3000:])
            time.sleep(1)
        yield port, proc, log
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def _run(tmp_path: Path, text: str) -> tuple[subprocess.CompletedProcess, Path, float]:
    spec = tmp_path / "t.soak"
    spec.write_text(lenient_client(text))
    out = tmp_path / "ev"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "soakspec", "run", str(spec), "--out", str(out), "--quiet",
                             "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    return proc, out, t0


def test_a_chat_workload_without_a_chat_template_stops_before_the_soak(vllm, tmp_path):
    port, _, log = vllm
    proc, out, t0 = _run(tmp_path, SPEC.format(port=port, endpoint="chat"))
    stdout, stderr = proc.communicate(timeout=120)
    sys.stderr.write(stderr[-3000:])
    assert proc.returncode == 4, stderr
    assert time.monotonic() - t0 < 60
    assert "pre-flight request of workload 'w' rejected: HTTP 400" in stderr
    assert "chat template" in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "aborted"
    assert manifest["backends"][0]["levels"] == []
    assert log.read_text().count("/v1/chat/completions") < 10


URL_LOG_SPEC = """\
soak "vllm-url-log" {{
  issue = "16"
}}
model {{
  id = "tiny"
}}
backend "vllm" {{
  url = "http://127.0.0.1:{port}"
  log_file = "{log}"
  ready {{
    path = "/health"
    status = 200
    timeout = 30s
  }}
  runtime {{
    label = "vLLM 0.32.0 V1 engine, CPU build"
    log_pattern = r"Initializing a V1 LLM engine \\(v(?P<version>\\d+\\.\\d+\\.\\d+)\\)"
    version = "0.32.0"
  }}
  traces {{
    source = log
    pattern = r"Received request (?P<id>\\S+?):"
    id_forms = ["cmpl-{{id}}-0", "chatcmpl-{{id}}", "cmpl-{{id}}", "{{id}}"]
  }}
  metrics {{
    path = "/metrics"
    every = 2s
  }}
}}
workload "w" {{
  endpoint = completions
  prompt_words = 8
  max_tokens = 16
  ignore_eos = true
  load {{
    mode = closed
    concurrency = [2]
  }}
  duration = 20s
  bucket = 10s
  deadline = 30s
  follow_up = true
}}
gate {{
  require completed_run
  require failed == 0
  require trace_coverage >= 100% per bucket
  require runtime_boundary_specific
  require follow_up
  {server_rule}
}}
claims {{
  claim "test"
}}
"""


def _generation_tokens(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total{"))


def test_a_url_backend_reads_traces_and_its_runtime_from_the_servers_log_file_and_counts_every_token(vllm, tmp_path):
    """`log_file` on a url backend: traces 100% per bucket and the runtime boundary confirmed
    from vLLM's own log (read from where it stood when the run started), and the run's output
    tokens (pre-flight, measured, follow-up) equal the delta of vLLM's own
    vllm:generation_tokens_total over the run."""
    port, _, log = vllm
    before = _generation_tokens(port)
    proc, out, _ = _run(tmp_path, URL_LOG_SPEC.format(port=port, log=log, server_rule=URL_SERVER_RULE))
    stdout, stderr = proc.communicate(timeout=300)
    sys.stderr.write(stderr[-3000:])
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    after = _generation_tokens(port)
    verdict = json.loads(stdout)
    rules = {r["rule"]: r for r in verdict["rules"]}
    assert rules["trace_coverage >= 100% per bucket"]["status"] == "pass"
    assert "(confirmed)" in rules["runtime_boundary_specific"]["message"]
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["backends"][0]
    rows = [dict(r) for _, r in iter_records(out / "backends" / "vllm" / "requests.jsonl.gz")]
    followup = json.loads((out / "backends" / "vllm" / "followup.json").read_text())
    # requests.jsonl.gz holds the warmup, measured and follow-up requests (bucket -2); the
    # pre-flight requests are kept in the manifest only
    ids = {r["request_id"] for r in rows}
    assert (followup.get("record") or {}).get("request_id") in ids
    ours = sum(r["output_tokens"] or 0 for r in rows)
    ours += sum((p.get("record") or {}).get("output_tokens") or 0 for p in entry.get("preflight") or [])
    sys.stderr.write(f"soakspec counted {ours} output tokens; vLLM's counter moved by {after - before}\n")
    assert ours == after - before
    # #19: a url backend's declared /metrics, scraped every 2 s: in every bucket, every scrape
    # succeeded (metrics_scraped), the rule on vllm:num_requests_running evaluated, and charted
    assert rules["metrics_scraped"]["status"] == "pass", rules["metrics_scraped"]
    check_server_metrics(out, verdict, URL_SERVER_RULE)


URL_SERVER_RULE = 'require max(server("vllm:num_requests_running")) <= 2 per bucket'


def test_killing_the_engine_mid_run_aborts_within_seconds(vllm, tmp_path):
    port, server, _ = vllm
    proc, out, _ = _run(tmp_path, SPEC.format(port=port, endpoint="completions"))
    req = out / "backends" / "vllm" / "requests.jsonl.gz"
    deadline = time.monotonic() + 120
    while not (req.exists() and req.stat().st_size > 2000) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    engines = _children(server.pid)
    assert engines, "vLLM's engine process was not found"
    for pid in engines:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    stdout, stderr = proc.communicate(timeout=120)
    took = time.monotonic() - killed
    sys.stderr.write(stderr[-3000:])
    assert proc.returncode == 4, stderr
    assert took < 30, took
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "aborted" and "stopped answering" in manifest["incomplete_reason"]
    assert manifest["aborted_at"] is not None
    rows = [dict(r) for _, r in iter_records(req)]
    refused = [r for r in rows if (r["error"] or "").startswith("connect failed")]
    assert len(refused) < 100, len(refused)
    verdict = json.loads(stdout)
    assert verdict["verdict"] != "PASS"
