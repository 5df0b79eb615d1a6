"""Token-exact prompts against a real vLLM: `prompt_tokens = 128` is 128 by vLLM's own usage,
and a replayed trace's `input_lengths = tokens` each request's input_length.

The prompts are built with the model's tokenizer.json (the `tokenizers` extra) and sent to a
vLLM that soakspec launches. vLLM's usage.prompt_tokens, recorded per request, is the judge:
completions get exactly 128 for every request; chat gets 128 plus the tokens the chat
template wraps around the user message -- one constant for every request, stated here. The
replay builds its prompts with vLLM's own /tokenize (no `tokenizer`), and with `ignore_eos`
each request's output is its trace line's output_length.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lane import lenient_client

from soakspec.evidence.record import iter_records

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.realserver

_SPEC = """
soak "vllm-token-prompts" {
  issue = "real-server lane: token-exact prompts"
}
model {
  id = "tiny"
  path = "models/tiny"
}
backend "vllm" {
  launch = ["vllm", "serve", "{model_path}", "--served-model-name", "{model_id}",
            "--host", "{host}", "--port", "{port}", "--max-model-len", "1024",
            "--dtype", "bfloat16", "--chat-template", "vllm-chat-template.jinja"]
  env {
    VLLM_TARGET_DEVICE = "cpu"
    VLLM_CPU_KVCACHE_SPACE = "1"
  }
  ready {
    path = "/v1/models"
    timeout = 5m
  }
  shutdown_grace = 30s
}
{workloads}gate {
  require completed_run
  require failed == 0
}
"""
WORKLOAD = """workload "{endpoint}" {{
  endpoint = {endpoint}
  prompt_tokens = 128
  tokenizer = "models/tiny/tokenizer.json"
  max_tokens = 8
  ignore_eos = true
  load {{
    mode = closed
    concurrency = [2]
  }}
  duration = 10s
  bucket = 10s
  deadline = 60s
}}
"""
# a Mooncake trace: 12 requests over 2.2 s, inputs of 5 to 300 tokens, outputs of 1 to 9
TRACE = [{"timestamp": 200 * i, "input_length": [5, 64, 300, 17][i % 4], "output_length": [1, 9, 4][i % 3]}
         for i in range(12)]
REPLAY = """workload "replay" {
  endpoint = completions
  ignore_eos = true
  load {
    mode = replay
    trace = "trace.jsonl"
    input_lengths = tokens
  }
  warmup = 0s
  bucket = 1s
  deadline = 60s
}
"""
SPEC = _SPEC.replace("{workloads}", "".join(WORKLOAD.format(endpoint=e) for e in ("completions", "chat")) + REPLAY)


def _records(run_dir: Path):
    return [r for _, r in iter_records(run_dir / "backends" / "vllm" / "requests.jsonl.gz") if r.measured]


def test_prompt_tokens_128_is_exactly_128_by_vllms_own_usage(lane, tmp_path):
    (tmp_path / "spec.soak").write_text(lenient_client(SPEC))
    shutil.copy(REPO / "specs" / "vllm-chat-template.jinja", tmp_path)
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TRACE))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(lane / "tiny")
    env = dict(os.environ, PATH=f"{lane / 'V' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        [sys.executable, "-m", "soakspec", "run", str(tmp_path / "spec.soak"), "--out", str(tmp_path / "ev"),
         "--format", "json"],
        capture_output=True, text=True, timeout=900, env=env,
    )
    sys.stderr.write(proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _records(tmp_path / "ev")
    by_workload: dict[str, list[int]] = {}
    for r in rows:
        assert r["outcome"] == "completed", r
        by_workload.setdefault(r["workload"], []).append(r["prompt_tokens"])
    completions, chat = by_workload["completions"], by_workload["chat"]
    sys.stderr.write(f"completions: {len(completions)} requests, prompt_tokens by vLLM's usage: {sorted(set(completions))}\n")
    sys.stderr.write(f"chat: {len(chat)} requests, prompt_tokens by vLLM's usage: {sorted(set(chat))} "
                     f"(128 + {chat[0] - 128} chat-template tokens)\n")
    assert len(completions) >= 10 and set(completions) == {128}
    # the chat template adds the same wrapper tokens to every request, on top of the 128 asked for
    assert len(chat) >= 10 and len(set(chat)) == 1 and chat[0] > 128
    replayed = sorted((r["prompt_tokens"], r["output_tokens"]) for r in rows if r["workload"] == "replay")
    sys.stderr.write(f"replay: (prompt_tokens, output_tokens) by vLLM's usage {replayed}\n")
    assert replayed == sorted((t["input_length"], t["output_length"]) for t in TRACE)
