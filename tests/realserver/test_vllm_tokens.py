"""Token-exact prompts against a real vLLM: `prompt_tokens = 128` is 128 by vLLM's own usage.

The prompts are built with the model's tokenizer.json (the `tokenizers` extra) and sent to a
vLLM that soakspec launches. vLLM's usage.prompt_tokens, recorded per request, is the judge:
completions get exactly 128 for every request; chat gets 128 plus the tokens the chat
template wraps around the user message -- one constant for every request, stated here.
"""

from __future__ import annotations

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
SPEC = _SPEC.replace("{workloads}", "".join(WORKLOAD.format(endpoint=e) for e in ("completions", "chat")))


def _records(run_dir: Path):
    return [r for _, r in iter_records(run_dir / "backends" / "vllm" / "requests.jsonl.gz") if r.measured]


def test_prompt_tokens_128_is_exactly_128_by_vllms_own_usage(lane, tmp_path):
    (tmp_path / "spec.soak").write_text(lenient_client(SPEC))
    shutil.copy(REPO / "specs" / "vllm-chat-template.jinja", tmp_path)
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
