"""specs/vllm.soak against a real vLLM that soakspec launches (CPU build, tiny model)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lane import lenient_client, run_launched

from soakspec.evidence.record import iter_records

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.realserver


# #19: a rule on the server's own /metrics (scraped by default: specs/vllm.soak declares no
# metrics block), judged per bucket
SERVER_RULE = 'require max(server("vllm:num_requests_running")) <= 4 per bucket'
# a quantile of vLLM's own TTFT histogram, judged on the bucket it falls in: a threshold at one
# of vLLM's bucket bounds (10 s) is decided, never left to the interpolation
HISTOGRAM_RULE = 'warn p50(server("vllm:time_to_first_token_seconds")) < 10s'
# The chat workload as multi-turn sessions (`multi_turn = true`): each turn sends its
# conversation so far through vLLM's chat template; its records carry conversation and turn,
# and a rule is judged per turn
CHAT_WORDS = '  endpoint = chat\n  prompt_words = 16\n'
MULTI_TURN = '  endpoint = chat\n  prompt_file = "conversations.json"\n  multi_turn = true\n'
TURN_RULE = "require failed == 0 per turn"
CONVERSATIONS = [{"conversations": [turn for t in range(1, 4) for turn in (
    {"from": "human", "value": f"conversation {c} question {t}: what follows {t * c}?"},
    {"from": "gpt", "value": f"{t * c + 1} follows {t * c}, in conversation {c}."})]} for c in range(1, 5)]


def _run_spec(lane: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    for f in ("vllm.soak", "vllm-chat-template.jinja"):
        shutil.copy(REPO / "specs" / f, tmp_path / f)
    text = (tmp_path / "vllm.soak").read_text()
    anchor = "  warn drift(p95(itl)) <= 20% per level\n"
    assert text.count(anchor) == 1, "specs/vllm.soak's gate changed"
    assert text.count(CHAT_WORDS) == 1, "specs/vllm.soak's chat workload changed"
    text = text.replace(CHAT_WORDS, MULTI_TURN)
    (tmp_path / "conversations.json").write_text(json.dumps(CONVERSATIONS))
    (tmp_path / "vllm.soak").write_text(lenient_client(text.replace(anchor, anchor + f"  {SERVER_RULE}\n  {HISTOGRAM_RULE}\n  {TURN_RULE}\n")))
    return run_launched(lane, tmp_path, tmp_path / "vllm.soak", timeout=900)


def check_server_metrics(out: Path, verdict: dict, rule_text: str, backend: str = "vllm") -> None:
    """#19 on a real vLLM: /metrics scraped in every bucket (its token counter rising across each),
    the rule on vllm:num_requests_running evaluated on the scraped values, the HTML report's chart
    of it with a point per bucket and the rule's threshold line."""
    manifest = json.loads((out / "manifest.json").read_text())
    (entry,) = [b for b in manifest["backends"] if b["name"] == backend]
    assert entry["metrics"]["status"] == "scraped" and entry["metrics"]["failed"] == 0, entry["metrics"]
    scrapes = [json.loads(line) for line in (out / "backends" / backend / "metrics.jsonl").read_text().splitlines() if line]
    assert scrapes and all(s["ok"] for s in scrapes)
    buckets = [bk for lv in entry["levels"] for bk in lv["buckets"]]
    per_bucket = [[s for s in scrapes if bk["start"] <= s["t"] < bk["end"]] for bk in buckets]
    assert all(per_bucket), [len(p) for p in per_bucket]
    running = [s["families"]["vllm:num_requests_running"]["value"] for p in per_bucket for s in p]
    # the gauge is whatever the server holds at the instant of a scrape (on a tiny CPU model, often
    # between two requests); its generation-token counter must rise across every bucket
    tokens = [(s["t"], s["families"]["vllm:generation_tokens_total"]["value"]) for s in scrapes]
    rises = []
    for bk in buckets:
        before = [v for t, v in tokens if t <= bk["start"]] or [v for t, v in tokens if t >= bk["start"]][:1]
        after = [v for t, v in tokens if t >= bk["end"]][:1] or [v for t, v in tokens if t < bk["end"]][-1:]
        rises.append(after[0] - before[-1])
    sys.stderr.write(f"{len(scrapes)} scrapes of /metrics, {[len(p) for p in per_bucket]} per bucket; "
                     f"vllm:num_requests_running seen {min(running):g}..{max(running):g}; "
                     f"vllm:generation_tokens_total rose by {rises} across the buckets\n")
    assert all(r > 0 for r in rises), rises
    (rule,) = [r for r in verdict["rules"] if r["rule"] == rule_text.removeprefix("require ")]
    sys.stderr.write(f"{rule['rule']}: {rule['status']} -- {rule['message']}\n")
    assert rule["status"] == "pass" and rule["observed"] == max(running), rule  # evaluated on what was scraped
    html = subprocess.run([sys.executable, "-m", "soakspec", "report", str(out), "--format", "html"],
                          capture_output=True, text=True, timeout=300)
    assert html.returncode == 0, html.stderr
    chart = re.search(rf'<svg class="chart" data-backend="{backend}" data-metric="server:vllm:num_requests_running".*?</svg>',
                      html.stdout, re.S)
    assert chart is not None
    assert chart.group(0).count("<circle") == 2 * len(buckets)  # mean and max, one point per bucket
    assert 'class="threshold"' in chart.group(0)  # the rule's threshold line
    assert 'data-metric="cpu"' in html.stdout


def check_multi_turn(out: Path, rows: list[dict], verdict: dict) -> None:
    """The chat workload's sessions on a real vLLM: every measured chat record names its
    conversation and turn; within a conversation vLLM counts more prompt tokens the later the
    turn (its history, through the chat template); results.json has the level's turns; the
    per-turn rule is judged on each turn."""
    chat = [r for r in rows if r["workload"] == "chat" and r["bucket"] >= 0]
    assert chat and all(1 <= r["conversation"] <= len(CONVERSATIONS) and 1 <= r["turn"] <= 3 for r in chat)
    assert all(r["conversation"] is None and r["turn"] is None for r in rows if r["workload"] == "completions")
    tokens = {(r["conversation"], r["turn"]): r["prompt_tokens"] for r in chat if r["outcome"] == "completed"}
    grows = [(c, t) for (c, t) in tokens if (c, t + 1) in tokens]
    assert grows and all(tokens[c, t] < tokens[c, t + 1] for c, t in grows), tokens
    results = json.loads((out / "results.json").read_text())
    (level,) = [lv for lv in results["backends"][0]["levels"] if lv["workload"] == "chat"]
    turns = level["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and sum(t["requests"]["total"] for t in turns) == len(chat)
    (rule,) = [r for r in verdict["rules"] if r["rule"] == TURN_RULE.removeprefix("require ")]
    sys.stderr.write(f"multi-turn chat: {len(chat)} turns sent; prompt tokens by (conversation, turn) {dict(sorted(tokens.items()))}; "
                     f"{rule['rule']}: {rule['status']} -- {rule['message']}\n")
    assert rule["status"] == "pass" and "all 3 turns pass" in rule["message"], rule


def _generation_tokens(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("vllm:generation_tokens_total{"))


def test_a_launched_vllm_soak_passes_with_full_traces_and_a_confirmed_runtime(lane, tmp_path):
    proc, out = _run_spec(lane, tmp_path)
    sys.stderr.write(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    verdict = json.loads(proc.stdout)
    rules = {r["metric"]: r for r in verdict["rules"]}
    assert verdict["verdict"] == "PASS"
    assert rules["trace_coverage"]["status"] == "pass"
    assert "(confirmed)" in rules["runtime_boundary_specific"]["message"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    # every token soakspec counted (pre-flight, measured, follow-up) is one vLLM generated
    rows = [dict(r) for _, r in iter_records(out / "backends" / "vllm" / "requests.jsonl.gz")]
    ours = sum(r["output_tokens"] or 0 for r in rows)
    ours += sum((p.get("record") or {}).get("output_tokens") or 0 for p in manifest["backends"][0].get("preflight") or [])
    theirs = _generation_tokens((tmp_path / "metrics.txt").read_text())
    sys.stderr.write(f"soakspec counted {ours} output tokens; vLLM's vllm:generation_tokens_total is {theirs}\n")
    assert ours == theirs
    check_server_metrics(out, verdict, SERVER_RULE)
    (hist,) = [r for r in verdict["rules"] if r["rule"] == HISTOGRAM_RULE.split(" ", 1)[1]]
    sys.stderr.write(f"vLLM's TTFT histogram: {hist['status']} -- {hist['message']}\n")
    assert hist["status"] == "pass", hist
    check_multi_turn(out, rows, verdict)
    # no server process is left behind
    assert subprocess.run(["pgrep", "-f", str(tmp_path / "models")], capture_output=True).returncode == 1
