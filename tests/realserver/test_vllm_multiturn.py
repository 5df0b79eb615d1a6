"""Multi-turn chat (`multi_turn = true`) against a real vLLM that soakspec launches (CPU build,
tiny model, a plain chat template written here), judged by vLLM's own counts:

- every turn sent completed, and within a conversation each later turn's prompt, as vLLM
  counted it (the record's usage), is exactly the conversation so far through the template --
  the tokenizer's count of it -- so it exceeds the previous turn's by the file's previous
  answer and the new user turn, at least: the history is carried, in order;
- results.json's per-turn `turns` table is the records' (requests, prompt tokens, TTFT);
- `vllm:request_success_total` equals the requests soakspec sent (measured and pre-flight),
  and `vllm:prefix_cache_hits_total` is what vLLM's prefix cache holds for those prompts in
  the order they were sent: turn k + 1 starts with turn k's prompt, so it hits every full
  block of it (vLLM's block size; its prefix caching is on by default in V1, as
  test_vllm_workloads.py proves on a replay) -- computed here block by block from the prompts;
- a `require p95(ttft) < ... per turn` rule is judged on each turn's requests, its observed
  values the table's.

`REALSERVER_KEEP=DIR` keeps a copy of the run's evidence and vLLM's final /metrics there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lane import lenient_client, run_launched, vllm_head

from soakspec.evidence.record import iter_records
from soakspec.judge import stats

pytestmark = pytest.mark.realserver

BLOCK = 32  # vLLM's --block-size: the prefix cache's unit
CONCURRENCY, TURNS = 2, 4
# `think_time` between a conversation's turns bounds what a session sends, whatever the server's
# speed (on the lane's 2 cores a turn of 4 tokens takes 10-20 ms): its TURNS - 1 waits make a
# conversation last THINK_S x 3 at least, so the level's 2 sessions begin at most 2 x 30 s / 0.6
# s = 100 conversations, and no turn is sent twice (a level past the file's last conversation
# runs them again: a resent turn is one the prefix cache holds whole, not its history). At 20 ms
# a turn they get through about 88, at 100 ms about 60: turn 4's p95 needs 45 (90 % confidence)
DURATION_S, THINK_S = 30, 0.2
CONVERSATIONS = 2 * int(DURATION_S / (THINK_S * (TURNS - 1))) + 10
# a plain template: "role: content" lines, then the assistant's cue. vLLM renders it with
# trim_blocks and lstrip_blocks (as transformers does), which leave this one's text as written
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
# words the tiny model's tokenizer was trained on (make_model.py): a few tokens each
WORDS = ("the quick brown fox jumps over a lazy dog soak test server token stream "
         "latency bucket level model request response alpha beta gamma delta").split()


def _text(c: int, t: int, kind: str, n: int) -> str:
    """Conversation c's turn t's text: its numbers first, so no two conversations share a block."""
    return f"{c} {t} {kind} " + " ".join(WORDS[(7 * c + 3 * t + j) % len(WORDS)] for j in range(n))


# ShareGPT: each conversation TURNS user turns (the later, the longer) and the file's answers
SHAREGPT = [{"conversations": [turn for t in range(1, TURNS + 1) for turn in (
    {"from": "human", "value": _text(c, t, "ask", 6 + 4 * t)},
    {"from": "gpt", "value": _text(c, t, "answer", 12)})]} for c in range(1, CONVERSATIONS + 1)]

TTFT_RULE = "require p95(ttft) < 30s per turn"
SPEC = vllm_head("multi-turn chat", f', "--block-size", "{BLOCK}", "--chat-template", "chat.jinja"', name="vllm-multi-turn") + f"""workload "chat" {{
  endpoint = chat
  prompt_file = "conversations.json"
  multi_turn = true
  think_time = {THINK_S * 1000:g}ms
  max_tokens = 4
  sampling = greedy
  ignore_eos = true
  load {{
    mode = closed
    concurrency = [{CONCURRENCY}]
  }}
  warmup = 0s
  duration = {DURATION_S}s
  bucket = 10s
  deadline = 30s
  follow_up = false
}}
gate {{
  confidence = 90%
  require completed_run
  require failed == 0
  {TTFT_RULE}
}}
"""


def _render(messages: list[tuple[str, str]]) -> str:
    """TEMPLATE applied to `messages`, as vLLM renders it."""
    return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"


def _turn_messages(c: int, t: int) -> list[tuple[str, str]]:
    """What turn t of conversation c (both from 1) sends: the file's turns up to its t-th user turn."""
    roles = {"human": "user", "gpt": "assistant"}
    return [(roles[m["from"]], m["value"]) for m in SHAREGPT[c - 1]["conversations"][: 2 * t - 1]]


def _counter(metrics: str, name: str) -> float:
    """A counter's value summed over its label sets, from /metrics text."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def _cache_hits(prompts: list[list[int]]) -> list[int]:
    """The tokens vLLM's prefix cache serves each of `prompts` (token ids, in the order vLLM
    scheduled them): its longest run of full BLOCK-token blocks, from the start, that an earlier
    prompt computed (a block is keyed by every token up to its end), at most one token short of
    the prompt (vLLM computes the last token again: kv_cache_manager.get_computed_blocks). The
    answers' blocks never match a later prompt: the history carries the file's answers."""
    cached: set[tuple[int, ...]] = set()
    hits = []
    for p in prompts:
        n = 0
        while (n + 1) * BLOCK <= len(p) - 1 and tuple(p[: (n + 1) * BLOCK]) in cached:
            n += 1
        hits.append(n * BLOCK)
        cached.update(tuple(p[: (k + 1) * BLOCK]) for k in range(len(p) // BLOCK))
    return hits


def test_multi_turn_sessions_carry_their_history_on_vllm_and_its_counters_agree(lane, tmp_path):
    from tokenizers import Tokenizer

    (tmp_path / "chat.jinja").write_text(TEMPLATE)
    (tmp_path / "conversations.json").write_text(json.dumps(SHAREGPT))
    (tmp_path / "spec.soak").write_text(lenient_client(SPEC))
    proc, out = run_launched(lane, tmp_path, tmp_path / "spec.soak", timeout=600)
    sys.stderr.write(proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tok = Tokenizer.from_file(str(lane / "tiny" / "tokenizer.json"))

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    manifest = json.loads((out / "manifest.json").read_text())
    (entry,) = manifest["backends"]
    preflight = entry.get("preflight") or []
    rows = [dict(r) for _, r in iter_records(out / "backends" / "vllm" / "requests.jsonl.gz")]
    measured = [r for r in rows if r["bucket"] >= 0]
    assert len(measured) == len(rows), "warmup = 0s: every request is measured"

    # every turn sent completed, each a conversation's turn in the file
    assert measured and all(r["outcome"] == "completed" for r in measured), [r for r in measured if r["outcome"] != "completed"][:3]
    assert all(1 <= r["conversation"] <= CONVERSATIONS and 1 <= r["turn"] <= TURNS for r in measured)
    assert all(p["record"]["outcome"] == "completed" for p in preflight)

    # the level did not run past the file (THINK_S): each conversation's turn was sent once
    sent = {(r["conversation"], r["turn"]): r["prompt_tokens"] for r in measured}
    assert len(sent) == len(measured), "a turn was sent twice: the level ran past the file's conversations"
    # vLLM's count of each turn's prompt is the conversation so far through the template (the
    # tokenizer's count of its rendering): the history carried, whole and in order
    prompt_ids = {ct: ids(_render(_turn_messages(*ct))) for ct in sent}
    assert sent == {ct: len(p) for ct, p in prompt_ids.items()}, (sent, {ct: len(p) for ct, p in prompt_ids.items()})
    # so a later turn's prompt exceeds the previous one's by the file's answer to it and the new
    # user turn at least (each counted as the template places it, after "role: ")
    grows = []
    for (c, t), n in sorted(sent.items()):
        if (c, t - 1) in sent:
            answer = SHAREGPT[c - 1]["conversations"][2 * t - 3]["value"]
            user = SHAREGPT[c - 1]["conversations"][2 * t - 2]["value"]
            least = len(ids(" " + answer)) + len(ids(" " + user))
            grows.append((c, t, sent[c, t - 1], n, least))
            assert n - sent[c, t - 1] >= least, (c, t, sent[c, t - 1], n, least)
    assert {t for _, t, *_ in grows} == set(range(2, TURNS + 1)), "every later turn's growth was seen"

    # results.json's turns are the records'
    results = json.loads((out / "results.json").read_text())
    (level,) = results["backends"][0]["levels"]
    table = {t["turn"]: t for t in level["turns"]}
    assert sorted(table) == sorted({r["turn"] for r in measured})
    for k, row in table.items():
        mine = [r for r in measured if r["turn"] == k]
        assert row["requests"]["total"] == row["requests"]["completed"] == len(mine), (k, row["requests"])
        tokens, told = [r["prompt_tokens"] for r in mine], row["prompt_tokens"]
        assert (told["min"], told["max"], told["count"], told["p50"]) == (min(tokens), max(tokens), len(mine), stats.percentile(tokens, 50))
        assert row["ttft"]["p95"] == stats.percentile([r["ttft"] for r in mine], 95), (k, row["ttft"])

    # vLLM's own counters over the whole run (the server launched fresh)
    metrics = (tmp_path / "metrics.txt").read_text()
    success = _counter(metrics, "vllm:request_success_total")
    assert success == len(measured) + len(preflight), (success, len(measured), len(preflight))
    # the prefix cache, request by request in the order they were sent: the pre-flight (the
    # file's first turn) first, then the level's turns by their start (a session sends its next
    # turn after the previous one's answer; two sessions never send the same conversation)
    ordered = sorted(measured, key=lambda r: r["start"])
    order = [prompt_ids[1, 1]] * len(preflight) + [prompt_ids[r["conversation"], r["turn"]] for r in ordered]
    expect = _cache_hits(order)
    hits = _counter(metrics, "vllm:prefix_cache_hits_total")
    queries = _counter(metrics, "vllm:prefix_cache_queries_total")
    assert queries == sum(len(p) for p in order), (queries, sum(len(p) for p in order))
    assert hits == sum(expect), (hits, sum(expect))
    # every hit is a turn's history: turn k + 1 hits each full block of turn k's prompt (which
    # its own starts with), the think time's wait notwithstanding; a first turn hits nothing
    history = [len(prompt_ids[r["conversation"], r["turn"] - 1]) // BLOCK * BLOCK if r["turn"] > 1 else 0 for r in ordered]
    assert expect[len(preflight):] == history and sum(expect[: len(preflight)]) == 0
    by_turn = {k: sum(h for h, r in zip(history, ordered) if r["turn"] == k) for k in sorted(table)}
    assert all(by_turn[k] > 0 for k in by_turn if k > 1), by_turn

    # the per-turn rule: judged on each turn's requests, reported at the worst, the table's p95
    verdict = json.loads((out / "verdict.json").read_text())
    (rule,) = [r for r in verdict["rules"] if r["rule"] == TTFT_RULE.removeprefix("require ")]
    p95 = {k: table[k]["ttft"]["p95"] for k in table}
    worst = max(p95, key=p95.get)
    assert (rule["status"], rule["instances"], rule["failing"]) == ("pass", len(table), 0), rule
    assert (rule["where"]["turn"], rule["observed"], rule["samples"]) == (worst, p95[worst], table[worst]["ttft"]["count"]), rule
    # and at a threshold between the turns' p95s (the same evidence re-judged), exactly the turns
    # at or above it fail, the worst named
    cut = _between(sorted(p95.values()))
    cut_rule_text = f"require p95(ttft) < {cut * 1e6:.0f}us per turn"
    (tmp_path / "cut.soak").write_text((tmp_path / "spec.soak").read_text().replace(TTFT_RULE, cut_rule_text))
    regate = subprocess.run([sys.executable, "-m", "soakspec", "gate", str(out), "--spec", str(tmp_path / "cut.soak"),
                             "--format", "json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert regate.returncode == 1, regate.stdout[-2000:] + regate.stderr[-2000:]
    (cut_rule,) = [r for r in json.loads(regate.stdout)["rules"] if r["scope"] == "turn"]
    above = sorted(k for k in p95 if p95[k] >= cut)
    assert (cut_rule["status"], cut_rule["instances"], cut_rule["failing"]) == ("fail", len(table), len(above)), cut_rule
    assert cut_rule["where"]["turn"] == worst and f"turn {worst}:" in cut_rule["message"], cut_rule

    first = sorted(grows)[0][0]
    sys.stderr.write(
        f"multi-turn chat on vLLM: {len(measured)} turns of {len({r['conversation'] for r in measured})} conversations "
        f"(+{len(preflight)} pre-flight), all completed; vllm:request_success_total {success:g}\n"
        f"prompt_tokens by turn of conversation {first} (vLLM's usage = the template's rendering, tokenized): "
        f"{[sent[first, t] for t in range(1, TURNS + 1) if (first, t) in sent]}; each later turn grew by at least "
        f"the file's answer + the new user turn ({', '.join(f'+{n - p} >= {least}' for c, _, p, n, least in grows if c == first)})\n"
        f"vllm:prefix_cache_hits_total {hits:g} of {queries:g} prompt tokens = the history's full {BLOCK}-token blocks "
        f"({sum(expect)}); by turn {by_turn}\n"
        f"per turn (turn, requests, p95 ttft ms): {[(k, table[k]['requests']['total'], round(p95[k] * 1000, 2)) for k in sorted(table)]}\n"
        f"{rule['rule']}: {rule['status']} -- {rule['message']}\n"
        f"re-judged at {cut * 1e3:.3f}ms: {cut_rule['status']} -- {cut_rule['message']}\n")


def _between(values: list[float]) -> float:
    """A threshold strictly between the widest-apart neighbours of `values` (sorted, in seconds),
    at whole microseconds."""
    gap, lo, hi = max((b - a, a, b) for a, b in zip(values, values[1:]))
    assert gap > 2e-6, f"the turns' p95s are within 2us of each other: {values}"
    return round((lo + hi) / 2 * 1e6) / 1e6
