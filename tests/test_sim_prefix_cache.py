"""The simulator's automatic prefix cache (vLLM's): whole blocks of the simulator's own prompt
tokens, keyed by their hash chain, LRU-bounded; cached tokens cost no prefill time; exposed as
vLLM's `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` and, with
`enable_prompt_tokens_details`, usage's `prompt_tokens_details.cached_tokens`. The cache alone
(pure), then the simulator as a real server on 127.0.0.1, then a real `soakspec run` replaying a
Mooncake trace whose `hash_ids` share prefixes (slow lane)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.plan import DEFAULT_SERVER_METRICS, MetricsScrape

from runner_support import REPO
from soakspec.runner.scrape import scrape_row
from soakspec.sim import SimConfig, serve
from soakspec.sim.model import PrefixCache, block_hashes, first_token_delay

B = 4  # a small block, so prompts stay readable


def words(*blocks: str) -> list[str]:
    """A prompt of whole blocks: each letter a block of B words (`a` -> a0 a1 a2 a3)."""
    return [f"{b}{i}" for b in blocks for i in range(B)]


def admit(cache: PrefixCache, tokens: list) -> int:
    return cache.admit(block_hashes(tokens, cache.block_size), len(tokens))


# ---------------------------------------------------------------------------- the cache alone


def test_a_block_hits_only_if_its_whole_prefix_does():
    """Blocks b and c were cached after a; after x they are other blocks (their prefix differs),
    so a prompt x b c d finds nothing, while a b y hits a and b, and stops at y."""
    cache = PrefixCache(capacity=100, block_size=B)
    assert admit(cache, words("a", "b", "c", "d")) == 0
    assert admit(cache, words("x", "b", "c", "d")) == 0
    assert admit(cache, words("a", "b", "y", "d")) == 2 * B
    assert admit(cache, words("a", "b", "c", "d") + ["tail"]) == 4 * B  # the partial block after is prefilled
    assert (cache.queries, cache.hits) == (4 * 4 * B + 1, 6 * B)


def test_the_last_prompt_token_is_always_prefilled():
    """vLLM recomputes the last prompt token for its logits: a prompt cached whole still
    prefills its last block (a prompt of exactly 3 blocks hits 2 of them)."""
    cache = PrefixCache(capacity=100, block_size=B)
    admit(cache, words("a", "b", "c"))
    assert admit(cache, words("a", "b", "c")) == 2 * B
    assert admit(cache, words("a", "b", "c") + ["z"]) == 3 * B


def test_the_cache_holds_at_most_its_capacity_and_evicts_the_least_recently_used():
    cache = PrefixCache(capacity=4, block_size=B)
    admit(cache, words("a", "b"))
    admit(cache, words("c", "d"))  # 4 blocks: full
    admit(cache, words("a") + ["t"])  # a is used again: now the most recent
    admit(cache, words("e"))  # one too many: the least recently used (b) goes
    assert len(cache) == 4
    assert admit(cache, words("a", "b") + ["t"]) == B  # a still there, b evicted
    assert admit(cache, words("c", "d") + ["t"]) == B  # c stays; d was the least recently used when b came back


def test_a_prompt_longer_than_the_cache_keeps_its_leading_blocks():
    """Blocks are touched last block first (vLLM frees a request's blocks in reverse order):
    a prompt of more blocks than the cache holds leaves its first ones cached, which a later
    prompt sharing them finds."""
    cache = PrefixCache(capacity=2, block_size=B)
    admit(cache, words("a", "b", "c", "d"))
    assert len(cache) == 2
    assert admit(cache, words("a", "b", "z")) == 2 * B


def test_blocks_of_other_tokens_never_share_a_key():
    """A word "7" is no token id 7, and words that differ only in where one ends (a word may
    hold any character but whitespace) are other tokens."""
    assert not set(block_hashes([str(i) for i in range(8)], B)) & set(block_hashes(list(range(8)), B))
    assert block_hashes(["a\x00b", "c"], 2) != block_hashes(["a", "b\x00c"], 2)


prompts = st.lists(st.lists(st.sampled_from("abc"), max_size=6).map(lambda bs: words(*bs)), min_size=1, max_size=12)


@given(prompts, st.integers(1, 8), st.lists(st.integers(0, 2 * B), min_size=12, max_size=12))
@settings(max_examples=200, deadline=None)
def test_the_cache_agrees_with_a_model_keyed_by_whole_prefixes(seq, capacity, tails):
    """Against a simple model that keys each block by the whole prefix it ends (what the hash
    chain stands for) with the same LRU order: the same hits, request by request; hits never
    exceed queries, a request's hit is whole blocks short of its last token, and the cache
    never holds more than its capacity."""
    cache = PrefixCache(capacity=capacity, block_size=B)
    model: list[tuple[str, ...]] = []  # least recent first
    for tokens, tail in zip(seq, tails):
        tokens = tokens + [f"t{i}" for i in range(tail)]
        full = [tuple(tokens[: (i + 1) * B]) for i in range(len(tokens) // B)]
        usable = max(len(tokens) - 1, 0) // B
        expect = 0
        for key in full[:usable]:
            if key not in model:
                break
            expect += B
        for key in reversed(full):
            if key in model:
                model.remove(key)
            model.append(key)
        del model[: max(0, len(model) - capacity)]
        got = admit(cache, tokens)
        assert got == expect
        assert got % B == 0 and got <= max(len(tokens) - 1, 0)
        assert cache.hits <= cache.queries and len(cache) <= capacity


@given(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8), st.integers(0, B - 1), st.integers(2, 5))
@settings(max_examples=100, deadline=None)
def test_a_repeated_prompt_hits_all_its_full_blocks_while_the_cache_holds_them(blocks, tail, times):
    """The same prompt again and again: every later time, every full block short of the last
    token hits, as long as the cache holds the prompt's blocks."""
    tokens = words(*blocks) + ["z"] * tail
    cache = PrefixCache(capacity=len(tokens) // B, block_size=B)
    assert admit(cache, tokens) == 0
    for _ in range(times - 1):
        assert admit(cache, tokens) == (len(tokens) - 1) // B * B


@given(st.lists(st.integers(1, 40), min_size=1, max_size=10), st.integers(1, 64))
@settings(max_examples=100, deadline=None)
def test_prompts_that_share_nothing_prefill_exactly_as_without_a_cache(lengths, block):
    """Prompts with no block in common (each its own words) hit nothing: each one's time to
    first token is what it was before the simulator had a cache."""
    cfg = SimConfig(ttft=0.05, prefill_per_token=0.001)
    cache = PrefixCache(capacity=1000, block_size=block)
    for i, n in enumerate(lengths):
        tokens = [f"r{i}w{j}" for j in range(n)]
        cached = admit(cache, tokens)
        assert cached == 0
        assert first_token_delay(cfg, n - cached, 0.0) == first_token_delay(cfg, n, 0.0)


def test_the_options_are_validated_and_have_vllm_like_defaults():
    cfg = SimConfig()
    assert (cfg.enable_prefix_caching, cfg.block_size, cfg.enable_prompt_tokens_details) == (True, 16, False)
    assert cfg.prefix_cache_blocks >= 1024
    for bad in ({"block_size": 0}, {"prefix_cache_blocks": 0}):
        with pytest.raises(ValueError):
            SimConfig(**bad)
    assert SimConfig.from_options({"enable_prefix_caching": False, "block_size": 32}).block_size == 32


@pytest.mark.parametrize("option", ["block_size", "prefix_cache_blocks"])
def test_a_spec_with_no_blocks_is_refused_by_check_before_anything_runs(tmp_path, option):
    """`sim { block_size = 0 }` passed `check` and the simulator refused it only once launched."""
    from soakspec.lang import load_spec

    path = tmp_path / "s.soak"
    path.write_text(f'soak "t" {{}}\nbackend "b" {{\n  sim {{\n    {option} = 0\n  }}\n}}\n'
                    'workload "w" {\n  load {\n    concurrency = [1]\n  }\n  duration = 2s\n}\n')
    spec, diags, _ = load_spec(path)
    assert spec is None and [(d.code, d.span.line) for d in diags if d.severity == "error"] == [("E204", 4)], diags
    assert option in str(diags[0].message)
    # as the user reads it: path:line:col, the caret under the 0, and what to write instead
    proc = subprocess.run([sys.executable, "-m", "soakspec", "check", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    col = 4 + len(option) + 3 + 1
    assert proc.returncode == 2 and f"s.soak:4:{col}: E204 '{option}' must be more than zero, not 0" in proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert f"\n      {option} = 0\n" + " " * (col + 1) + "^\n  hint: " in out, out
    assert "set enable_prefix_caching = false" in out, out


# ---------------------------------------------------------------------------- the simulator as a server


PROMPT = " ".join(f"w{i}" for i in range(100))  # 100 words: 6 full blocks of 16 and 4 words
SLOW_PREFILL = {"ttft": 0.002, "itl": 0.001, "prefill_per_token": 0.002}  # 100 uncached words: 200 ms


async def _metrics(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("vllm:prefix_cache_")}


async def _timed(client: httpx.AsyncClient, prompt: str = PROMPT, **body) -> tuple[float, dict]:
    t0 = trio.current_time()
    r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, **body})
    assert r.status_code == 200, r.text
    return trio.current_time() - t0, r.json()


async def _serving(nursery, **options) -> httpx.AsyncClient:
    options.setdefault("trace_log", False)
    port = await nursery.start(serve, SimConfig(**options))
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10)


async def test_a_repeated_prompt_hits_in_metrics_and_its_ttft_falls_with_the_cached_fraction(tmp_path):
    """The same 100-word prompt twice: the second finds 96 words cached (6 blocks of 16; the
    last token is always prefilled), so /metrics counts 200 queried and 96 hit tokens, its
    trace says so, and its time to first token loses 96 x prefill_per_token (~200 ms -> ~10 ms)."""
    traces = tmp_path / "traces.jsonl"
    async with trio.open_nursery() as nursery:
        async with await _serving(nursery, trace_file=str(traces), **SLOW_PREFILL) as client:
            assert await _metrics(client) == {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
            cold, first = await _timed(client)
            warm, second = await _timed(client)
            assert await _metrics(client) == {"vllm:prefix_cache_queries_total": 200.0,
                                              "vllm:prefix_cache_hits_total": 96.0}
            with trio.fail_after(5):  # a trace is written just after its response's last byte
                while not traces.exists() or len(traces.read_text().splitlines()) < 2:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert cold >= 0.2 and warm < 0.1, (cold, warm)
    assert [json.loads(line)["cached_tokens"] for line in traces.read_text().splitlines()] == [0, 96]
    assert "prompt_tokens_details" not in first["usage"] and "prompt_tokens_details" not in second["usage"]


async def test_prefix_caching_off_counts_nothing_and_times_every_prompt_whole():
    async with trio.open_nursery() as nursery:
        async with await _serving(nursery, enable_prefix_caching=False, **SLOW_PREFILL) as client:
            await _timed(client)
            warm, _ = await _timed(client)
            assert await _metrics(client) == {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
        nursery.cancel_scope.cancel()
    assert warm >= 0.2


async def test_usage_reports_cached_tokens_only_with_prompt_tokens_details_and_only_when_some_were():
    """As vLLM with --enable-prompt-tokens-details: `usage.prompt_tokens_details.cached_tokens`
    in a full response and in a stream's usage chunk, left out when nothing was cached."""
    async with trio.open_nursery() as nursery:
        async with await _serving(nursery, enable_prompt_tokens_details=True, ttft=0.001, itl=0.001) as client:
            _, cold = await _timed(client)
            _, warm = await _timed(client)
            usage = None
            async with client.stream("POST", "/v1/completions", json={
                "prompt": PROMPT, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True},
            }) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"usage":{' in line:
                        usage = json.loads(line[len("data: "):])["usage"]
            chat = (await client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1})).json()
        nursery.cancel_scope.cancel()
    assert "prompt_tokens_details" not in cold["usage"]
    assert warm["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}
    assert usage is not None and usage["prompt_tokens_details"] == {"cached_tokens": 96}
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 96}  # chat counts the same words


async def test_a_conversation_finds_its_earlier_turns_cached():
    """Chat counts the words of every message in order, so a turn that repeats the
    conversation so far and adds to it finds the earlier turns' whole blocks."""
    turn = [{"role": "user", "content": " ".join(f"q{i}" for i in range(40))}]
    async with trio.open_nursery() as nursery:
        async with await _serving(nursery, enable_prompt_tokens_details=True, ttft=0.001, itl=0.001) as client:
            first = (await client.post("/v1/chat/completions", json={"messages": turn, "max_tokens": 1})).json()
            turn += [{"role": "assistant", "content": "a b c"}, {"role": "user", "content": "and then"}]
            second = (await client.post("/v1/chat/completions", json={"messages": turn, "max_tokens": 1})).json()
        nursery.cancel_scope.cancel()
    assert "prompt_tokens_details" not in first["usage"]
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}  # 2 whole blocks of the first 40 words


async def test_soakspecs_scrape_reads_the_prefix_cache_counters():
    """The runner's own scrape (`scrape_row` with the default families) keeps both counters."""
    scrape = MetricsScrape("/metrics", 1.0, 5.0, True, DEFAULT_SERVER_METRICS)
    async with trio.open_nursery() as nursery:
        async with await _serving(nursery, ttft=0.001, itl=0.001) as client:
            for _ in range(3):
                await _timed(client)
            row = await scrape_row(client, str(client.base_url).rstrip("/"), scrape, trio.current_time)
        nursery.cancel_scope.cancel()
    assert row["ok"], row
    f = row["families"]
    assert (f["vllm:prefix_cache_queries_total"]["type"], f["vllm:prefix_cache_queries_total"]["value"]) == ("counter", 300.0)
    assert (f["vllm:prefix_cache_hits_total"]["type"], f["vllm:prefix_cache_hits_total"]["value"]) == ("counter", 192.0)


# ---------------------------------------------------------------------------- a real replay


REPLAY_SPEC = """\
soak "t" {{
  issue = "test"
}}
backend "b0" {{
  sim {{
    ttft = 5ms
    itl = 1ms
    prefill_per_token = 1ms
  }}
  runtime {{
    label = "host-staged"
  }}
  metrics {{
    every = 250ms
  }}
}}
workload "w" {{
  load {{
    mode = replay
    trace = "trace.jsonl"
    hash_block = 16
    prefix_sharing = {sharing}
  }}
  bucket = 1s
  deadline = 5s
  follow_up = false
}}
gate {{
  require failed == 0
  require server("vllm:prefix_cache_hits_total") > 0
  require server("vllm:prefix_cache_queries_total") > 0
}}
claims {{
  claim "test"
}}
"""


@pytest.mark.slow
def test_a_replay_that_shares_prefixes_hits_the_simulators_cache_and_its_ttft_falls(tmp_path):
    """The same Mooncake trace replayed twice against the simulator: with `prefix_sharing` its
    requests send their shared `hash_ids` blocks (16 words, the simulator's block), which the
    simulator serves from its cache -- the scraped `vllm:prefix_cache_hits_total` grows, the
    rule on it passes, and the client's TTFT is lower than the same trace with
    `prefix_sharing = false`, whose unique prompts hit nothing and fail the rule (exit 1)."""
    from runner_support import read_jsonl, requests_of, run_spec

    rows = [{"timestamp": i * 60, "input_length": 128, "output_length": 2, "hash_ids": [i % 2, 10, 11, 12, 13, 14, 15, 16]}
            for i in range(16)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ttft, hits, codes, rules = {}, {}, {}, {}
    for sharing in ("true", "false"):
        (tmp_path / sharing).mkdir()
        (tmp_path / sharing / "trace.jsonl").write_text((tmp_path / "trace.jsonl").read_text())
        proc, out = run_spec(tmp_path / sharing, REPLAY_SPEC.format(sharing=sharing))
        codes[sharing] = proc.returncode
        recs = [r for r in requests_of(out) if r["bucket"] >= 0]
        assert len(recs) == 16 and all(r["ttft"] is not None for r in recs), proc.stderr[-2000:]
        ttft[sharing] = statistics.median(r["ttft"] for r in recs)
        scrapes = [r for r in read_jsonl(out / "backends" / "b0" / "metrics.jsonl") if r["ok"]]
        hits[sharing] = scrapes[-1]["families"]["vllm:prefix_cache_hits_total"]["value"]
        verdict = json.loads((out / "verdict.json").read_text())
        rules[sharing] = {r["rule"]: (r["status"], r["observed"]) for r in verdict["rules"] if r["metric"] == "server"}
    assert codes == {"true": 0, "false": 1}, (codes, rules)
    # sharing: all but the first two requests find their 7 whole shared blocks (112 words) cached
    assert hits == {"true": 14 * 112, "false": 0}
    assert ttft["true"] < ttft["false"] - 0.05, ttft  # ~112 ms of prefill not spent
    hit_rule, query_rule = 'server("vllm:prefix_cache_hits_total") > 0', 'server("vllm:prefix_cache_queries_total") > 0'
    assert rules["true"] == {hit_rule: ("pass", 14 * 112), query_rule: ("pass", 16 * 128)}, rules
    assert rules["false"] == {hit_rule: ("fail", 0), query_rule: ("pass", 16 * 128)}, rules
