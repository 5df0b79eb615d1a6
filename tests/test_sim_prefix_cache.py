"""The simulator's automatic prefix cache (vLLM's): whole blocks of the simulator's own prompt
tokens, keyed by their hash chain, in a reference-counted pool (a running request's blocks are
never evicted; free ones go least recently released first); cached tokens cost no prefill
time; exposed as vLLM's `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`
and, with `enable_prompt_tokens_details`, usage's `prompt_tokens_details.cached_tokens`. The cache alone
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
    """One request that runs alone: scheduled, then finished before the next comes."""
    cached, held = start(cache, tokens)
    cache.release(held)
    return cached


def start(cache: PrefixCache, tokens: list) -> tuple[int, tuple[bytes, ...]]:
    """A request scheduled that keeps running: its cached tokens and the blocks it holds."""
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


def test_a_running_requests_blocks_are_never_evicted_however_others_churn_the_cache():
    """vLLM reference-counts its blocks: one a running request holds is not on the free list,
    so no other request's blocks can push it out. Twenty prompts of other blocks pass through
    a pool of 4 while a request holding 2 runs; the same prompt then finds both."""
    cache = PrefixCache(capacity=4, block_size=B)
    cached, held = start(cache, words("a", "b") + ["t"])
    assert (cached, len(held)) == (0, 2)
    for i in range(20):
        admit(cache, words(f"x{i}", f"y{i}") + ["t"])
        assert len(cache) == 4
    assert admit(cache, words("a", "b") + ["t"]) == 2 * B
    cache.release(held)
    assert len(cache.held) == 0 and len(cache) == 4


def test_a_block_two_running_requests_hold_stays_until_both_let_go():
    """A block one request found is held by both; the first to finish does not free it."""
    cache = PrefixCache(capacity=2, block_size=B)
    _, first = start(cache, words("a") + ["t"])
    cached, second = start(cache, words("a") + ["u"])
    assert cached == B and second == first and cache.held == {first[0]: 2}
    cache.release(first)
    for i in range(5):
        admit(cache, words(f"x{i}") + ["t"])
    assert admit(cache, words("a") + ["v"]) == B
    cache.release(second)  # no one holds it now: two new blocks later, it is gone
    admit(cache, words("y") + ["t"])
    admit(cache, words("z") + ["t"])
    assert admit(cache, words("a") + ["v"]) == 0


def test_blocks_are_evicted_in_the_order_their_requests_let_go_of_them():
    """Hits after release as vLLM's: a finished request's blocks stay cached, and the free list
    is in order of release, not of arrival -- A came first but finished last, so B's blocks go
    first (B's last block before its first), and A's prompt still hits whole."""
    cache = PrefixCache(capacity=4, block_size=B)
    _, a = start(cache, words("a1", "a2") + ["t"])
    _, b = start(cache, words("b1", "b2") + ["t"])
    cache.release(b)
    cache.release(a)
    assert admit(cache, words("x") + ["t"]) == 0  # takes b2's block
    assert admit(cache, words("a1", "a2") + ["t"]) == 2 * B
    assert admit(cache, words("b1") + ["t"]) == B  # b1 is still there
    assert admit(cache, words("y", "z") + ["t"]) == 0  # the least recently released: x, then a2
    assert admit(cache, words("a1", "a2") + ["t"]) == B


def test_a_pool_full_of_held_blocks_leaves_the_rest_of_a_prompt_uncached():
    """The simulator's choice where vLLM would keep a request waiting: it runs, holds the
    leading blocks that find room, and the rest are computed but not cached. Its lookup and
    the counters are as always."""
    cache = PrefixCache(capacity=5, block_size=B)
    _, a = start(cache, words("a", "b") + ["t"])
    _, b = start(cache, words("c", "d") + ["t"])
    cached, c = start(cache, words("e", "f", "g") + ["t"])
    assert (cached, len(c), len(cache)) == (0, 1, 5)  # e found the last free block; f and g none
    assert start(cache, words("e", "f", "g") + ["t"]) == (B, c)  # while all three run: e only
    assert (cache.queries, cache.hits) == (2 * (2 * B + 1) + 2 * (3 * B + 1), B)
    for held in (a, b, c, c):
        cache.release(held)
    assert len(cache.held) == 0 and len(cache) == 5


class PoolModel:
    """vLLM's `BlockPool` in miniature, the reference for `PrefixCache`: `capacity` numbered
    blocks, each with a key (here the whole prefix its block ends, what the hash chain stands
    for) or none, and a reference count; a free queue of block numbers, all of them at first.
    A request touches the blocks it finds (out of the queue if no one held them) and takes new
    ones from the queue's head, dropping the key a block had; a finished request's blocks go
    to the tail, last block first, when no one holds them any more."""

    def __init__(self, capacity: int):
        self.key: list[tuple | None] = [None] * capacity
        self.refs = [0] * capacity
        self.queue = list(range(capacity))
        self.cached: dict[tuple, int] = {}

    def admit(self, prefixes: list[tuple], usable: int) -> tuple[int, list[int]]:
        hit = 0
        for p in prefixes[:usable]:
            if p not in self.cached:
                break
            hit += 1
        blocks = []
        for p in prefixes:
            if p in self.cached:
                block = self.cached[p]
                if self.refs[block] == 0:
                    self.queue.remove(block)
            elif self.queue:
                block = self.queue.pop(0)
                if self.key[block] is not None:
                    del self.cached[self.key[block]]
                self.key[block] = p
                self.cached[p] = block
            else:
                break
            self.refs[block] += 1
            blocks.append(block)
        return hit, blocks

    def free(self, blocks: list[int]) -> None:
        for block in reversed(blocks):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.queue.append(block)


pool_prompts = st.tuples(st.lists(st.sampled_from("abcd"), max_size=5), st.integers(0, 2 * B))
pool_ops = st.lists(st.one_of(st.tuples(st.just("start"), pool_prompts), st.tuples(st.just("finish"), st.integers(0, 99))),
                    max_size=40)


@given(pool_ops, st.integers(1, 8))
@settings(max_examples=300, deadline=None)
def test_the_cache_agrees_with_a_reference_counted_pool_on_requests_that_overlap(ops, capacity):
    """Requests start and finish in any order, several running at once: request by request
    the same cached tokens and the same blocks held as the pool model's; after every step the
    same blocks cached and the same free list, in the same order; no block a running request
    holds is ever evicted; hits never exceed queries."""
    cache = PrefixCache(capacity=capacity, block_size=B)
    model = PoolModel(capacity)
    key_of: dict[tuple, bytes] = {}
    running: list[tuple[list[tuple], tuple[bytes, ...], list[int]]] = []
    queries = hits = 0
    for op, arg in ops:
        if op == "start":
            blocks, tail = arg
            tokens = words(*blocks) + [f"t{i}" for i in range(tail)]
            prefixes = [tuple(tokens[: (i + 1) * B]) for i in range(len(tokens) // B)]
            key_of.update(zip(prefixes, block_hashes(tokens, B)))
            hit, model_blocks = model.admit(prefixes, max(len(tokens) - 1, 0) // B)
            cached, held = start(cache, tokens)
            assert cached == hit * B
            assert held == tuple(key_of[p] for p in prefixes[: len(model_blocks)])
            queries, hits = queries + len(tokens), hits + cached
            running.append((prefixes, held, model_blocks))
        elif running:
            _, held, model_blocks = running.pop(arg % len(running))
            cache.release(held)
            model.free(model_blocks)
        assert set(cache.held) | set(cache.free) == {key_of[p] for p in model.cached}
        assert list(cache.free) == [key_of[model.key[b]] for b in model.queue if model.key[b] is not None]
        for _, held, _ in running:
            assert all(key in cache.held for key in held)
        assert len(cache) <= capacity and (cache.queries, cache.hits) == (queries, hits) and hits <= queries


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


def _blocks_of(name: str, n: int) -> str:
    """A prompt of `n` whole blocks of 16 words of its own, and one word more."""
    return " ".join(f"{name}{i}" for i in range(16 * n + 1))


async def _cached(client: httpx.AsyncClient, prompt: str) -> int:
    usage = (await _timed(client, prompt))[1]["usage"]
    return usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)


async def _run_long(client: httpx.AsyncClient, prompt: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Stream 200 tokens of `prompt`; started once its first token came (it has its slot)."""
    async with client.stream("POST", "/v1/completions", json={
        "prompt": prompt, "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
        started = False
        async for line in r.aiter_lines():
            if line.startswith("data: {") and not started:
                task_status.started()
                started = True


LONG = {"ttft": 0.001, "itl": 0.01, "enable_prompt_tokens_details": True}  # 200 tokens: 2 s (virtual)


async def test_a_streaming_requests_blocks_stay_cached_while_others_churn_the_cache(autojump_clock):
    """A pool of 8 blocks; a request of 4 blocks streams, and meanwhile ten prompts of 4 other
    blocks each come and go (40 blocks through the 4 left). The same prompt as the running
    one, sent while it runs, finds all 4 of its blocks: vLLM never evicts a block a running
    request holds (before, the churn pushed them out and it found none). Virtual time (trio's
    MockClock): the running request's 2 s pass only as the server waits."""
    async with trio.open_nursery() as nursery:
        async with await _serving(nursery, prefix_cache_blocks=8, **LONG) as client:
            async with trio.open_nursery() as load:
                await load.start(_run_long, client, _blocks_of("a", 4))
                for i in range(10):
                    assert await _cached(client, _blocks_of(f"x{i}_", 4)) == 0
                assert await _cached(client, _blocks_of("a", 4)) == 64
            assert await _metrics(client) == {"vllm:prefix_cache_queries_total": 12 * 65.0,
                                              "vllm:prefix_cache_hits_total": 64.0}
        nursery.cancel_scope.cancel()


async def test_a_finished_requests_blocks_are_evicted_in_the_order_it_let_go_of_them(autojump_clock):
    """A pool of 4 blocks. A (2 blocks) streams for 2 s; B (2 other blocks) comes after it and
    finishes first. Two prompts of one new block each then take the two blocks let go of
    longest ago -- B's, not A's, though A came first -- so A's prompt still finds both its
    blocks, and B's none (its first block went too: it was let go of before any of A's)."""
    async with trio.open_nursery() as nursery:
        async with await _serving(nursery, prefix_cache_blocks=4, **LONG) as client:
            async with trio.open_nursery() as load:
                await load.start(_run_long, client, _blocks_of("a", 2))
                assert await _cached(client, _blocks_of("b", 2)) == 0
            for name in ("x", "y"):
                assert await _cached(client, _blocks_of(name, 1)) == 0
            assert await _cached(client, _blocks_of("a", 2)) == 32
            assert await _cached(client, _blocks_of("b", 2)) == 0
        nursery.cancel_scope.cancel()


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
