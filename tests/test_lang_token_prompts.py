"""Token-exact prompts (`prompt_tokens = N`) and their cache regime (`prefix_tokens`).

The server's own usage is the judge: against the simulator (whose `/tokenize` counts exactly as
its usage does) every request reports the asked prompt tokens; a local tokenizer.json with a
BOS token gives prompts that count exactly N with it."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.plan import render_text as render_plan
from soakspec.runner.clock import RunClock
from soakspec.runner.h11client import H11Connection
from soakspec.runner.load import WORDS, LevelContext, Shapes, drive_level
from soakspec.runner.prompts import LocalTokenizer, RunAborted, measure_costs, token_prompt, verify
from soakspec.sim import server as sim
from soakspec.sim.config import SimConfig
from soakspec.sim.protocol import parse_request, tokenize_body
from specs import one_workload_spec

def _spec_text(source: str) -> str:
    after = "duration = 400ms\n  deadline = 5s\n  follow_up = false"
    return one_workload_spec(name="tokens", issue="18", before_load=f"{source}\n  max_tokens = 3", load="mode = closed\n    concurrency = [2]", after_load=after)


def _load(tmp_path: Path, source: str):
    path = tmp_path / "t.soak"
    path.write_text(_spec_text(source))
    return load_spec(path)


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("prompt_tokens = 128\n  prompt_words = 8", "E403"),
        ('prompt_tokens = 128\n  prompt_file = "x.txt"', "E403"),
        ("prefix_tokens = 8", "E403"),
        ('tokenizer = "tokenizer.json"', "E403"),
        ("prompt_tokens = [64, 128]\n  prefix_tokens = 64", "E204"),
        ("prompt_tokens = 0", "E204"),
    ],
)
def test_check_refuses_contradictory_prompt_sources(tmp_path, source, code):
    spec, diags, _ = _load(tmp_path, source)
    assert spec is None and code in [d.code for d in diags], diags


def test_the_plan_states_the_lengths_and_the_cache_regime(tmp_path):
    spec, diags, _ = _load(tmp_path, "prompt_tokens = [128, 32]\n  prefix_tokens = 16")
    assert spec is not None, diags
    j = plan(spec).backends[0].levels[0].request.to_json()
    assert j["prompt_tokens"] == [128, 32] and j["prompt_words"] is None and j["tokenizer"] is None
    assert j["prefix_cache"] == "shared prefix of 16 tokens"
    assert "w prompts: 128, 32 tokens (the server's /tokenize); cache: shared prefix of 16 tokens" in render_plan(plan(spec))
    spec, _, _ = _load(tmp_path, "prompt_tokens = 128")
    assert plan(spec).backends[0].levels[0].request.to_json()["prefix_cache"] == "unique prefix per request"
    spec, _, _ = _load(tmp_path, "prompt_words = 8")
    assert "no prompt sent twice" in plan(spec).backends[0].levels[0].request.to_json()["prefix_cache"]


_texts = st.text(st.sampled_from(["a", "b", " ", "\n", "\t", "é"]), min_size=1, max_size=60).filter(str.strip)


@settings(max_examples=80, deadline=None)
@given(_texts)
def test_the_simulators_tokenize_counts_as_its_usage_does(text):
    """Property: /tokenize's count of a prompt equals the prompt_tokens the simulator's usage reports."""
    cfg = SimConfig(model="m")
    body = json.dumps({"model": "m", "prompt": text, "max_tokens": 1}).encode()
    assert tokenize_body(body, cfg)["count"] == parse_request("completions", body, cfg).prompt_tokens
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 1}).encode()
    assert tokenize_body(chat, cfg)["count"] == parse_request("chat", chat, cfg).prompt_tokens


async def _records(tmp_path: Path, source: str):
    spec, diags, _ = _load(tmp_path, source)
    assert spec is not None, diags
    level = plan(spec).backends[0].levels[0]
    clock = RunClock()
    records: list = []
    traces = tmp_path / "traces.jsonl"
    seq = iter(range(10**6))

    def next_id() -> tuple[int, str]:
        i = next(seq)
        return i, f"t-{i:07d}"

    async with trio.open_nursery() as nursery:
        config = SimConfig(model="default", trace_log=False, trace_file=str(traces), ttft=0.002, itl=0.001, seed=1)
        port = await nursery.start(partial(sim.serve, config))
        shapes = Shapes(level.request)
        await shapes.prepare(f"http://127.0.0.1:{port}")
        ctx = LevelContext("sim", clock, partial(H11Connection, "127.0.0.1", port, clock), shapes, records.extend, next_id)
        await drive_level(level, ctx)
        nursery.cancel_scope.cancel()
    rows = sorted((json.loads(line) for line in traces.read_text().splitlines()), key=lambda r: r["arrival_index"])
    return records, rows, shapes


async def test_every_request_gets_exactly_the_asked_prompt_tokens_by_the_servers_usage(tmp_path):
    records, _, shapes = await _records(tmp_path, "prompt_tokens = [128, 32]")
    assert len(records) >= 6 and all(r.outcome == "completed" for r in records)
    assert {r.prompt_tokens for r in records} == {128, 32}
    # unique prefixes: no two requests start with the same first words
    firsts = [" ".join(shapes.make(i).prompt.split()[:3]) for i in range(len(records))]
    assert len(set(firsts)) == len(firsts)


async def test_a_declared_shared_prefix_is_shared_and_the_rest_differs(tmp_path):
    _, rows, shapes = await _records(tmp_path, "prompt_tokens = 64\n  prefix_tokens = 16")
    assert {r["prompt_tokens"] for r in rows} == {64}
    prompts = [shapes.make(i).prompt.split() for i in range(len(rows))]
    assert len({tuple(p[:16]) for p in prompts}) == 1
    assert len({tuple(p[16:19]) for p in prompts}) == len(prompts)


class _BpeLike:
    """A tokenizer with a BOS, two-token words (those longer than 6 letters) and space-split pre-tokens."""

    async def count(self, text: str, special: bool) -> int:
        await trio.lowlevel.checkpoint()
        return sum(2 if len(w) > 6 else 1 for w in text.split()) + (1 if special else 0)


async def test_costs_skip_multi_token_words_and_count_the_bos():
    tok = _BpeLike()
    costs = await measure_costs(tok, tuple(WORDS))
    assert costs.overhead == 1 and all(len(w) <= 6 for w in costs.words)
    for n in (2, 17, 128):
        await verify(tok, costs, n, 0)
        assert await tok.count(token_prompt(costs, 5, n, 0), True) == n


async def test_a_tokenizer_that_joins_words_is_refused():
    class Joiner:
        async def count(self, text: str, special: bool) -> int:
            await trio.lowlevel.checkpoint()
            return max(1, len(text.split()) // 2) if " " in text.strip() else 1

    with pytest.raises(RunAborted):
        await measure_costs(Joiner(), tuple(WORDS))


async def test_a_local_tokenizer_json_gives_exact_counts(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(WORDS[:200])}}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    local = LocalTokenizer(str(path))
    costs = await measure_costs(local, tuple(WORDS))
    assert costs.overhead == 1
    prompt = token_prompt(costs, 3, 128, 8)
    assert len(tok.encode(prompt).ids) == 128
    await verify(local, costs, 128, 8)


def test_a_missing_tokenizer_file_aborts_with_its_path(tmp_path):
    pytest.importorskip("tokenizers")
    with pytest.raises(RunAborted, match="nope.json"):
        LocalTokenizer(str(tmp_path / "nope.json"))


@pytest.mark.parametrize(("source", "code"), [("prompt_tokens = 128", 0), ("prompt_tokens = 127", 1)])
def test_a_run_gates_on_the_servers_count_of_the_asked_length(tmp_path, source, code):
    """End to end (soakspec run against the simulator): the gate holds the server's usage to 128."""
    text = _spec_text(source)
    text = text.replace("require failed == 0", "require failed == 0\n  require min(prompt_tokens) >= 128\n  require max(prompt_tokens) <= 128")
    path = tmp_path / "g.soak"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "soakspec", "run", str(path), "--out", str(tmp_path / "ev"), "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == code, proc.stdout + proc.stderr


async def test_a_tokenizer_with_few_one_token_words_still_builds_exact_prompts_with_distinct_starts():
    """The real-server lane's tiny BPE counts only 3 of the common words as one token: the
    request index then takes more words, and prompts stay exact and distinct from the start."""
    few = {"time", "way", "day"}

    class Few:
        async def count(self, text: str, special: bool) -> int:
            await trio.lowlevel.checkpoint()
            return sum(1 if w in few else 3 for w in text.split()) + (1 if special else 0)

    costs = await measure_costs(Few(), tuple(WORDS))
    assert sorted(costs.words) == sorted(few) and costs.overhead == 1
    prompts = [token_prompt(costs, i, 128, 0) for i in range(3**6)]
    assert [await Few().count(p, True) for p in prompts[:50]] == [128] * 50
    starts = {tuple(p.split()[:13]) for p in prompts}
    assert len(starts) == len(prompts)  # no two requests share their first tokens


def test_a_run_whose_token_prompts_cannot_be_built_aborts_with_the_reason(tmp_path):
    """Not an internal error: exit 4, the tokenizer's problem on stderr, the evidence marked aborted."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    # one token per letter: no common word is one token
    tok = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}, []))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    path = tmp_path / "t.soak"
    path.write_text(_spec_text('prompt_tokens = 16\n  tokenizer = "tokenizer.json"'))
    proc = subprocess.run([sys.executable, "-m", "soakspec", "run", str(path), "--out", str(tmp_path / "ev")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "counts only 0 of" in proc.stderr and "internal error" not in proc.stderr
    manifest = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    assert manifest["status"] == "aborted" and "prompt_tokens cannot be built" in manifest["incomplete_reason"]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((200, b"<html>tokenizer</html>"), "is not JSON"),
        ((200, b"[1, 2, 3]"), "no integer 'count'"),
        ((200, b'{"count": true}'), "no integer 'count'"),
        ((200, b'{"count": -3}'), "no integer 'count'"),
        ((200, b"[" * 100_000 + b"]" * 100_000), "is not JSON"),
        ((500, b"boom"), "it answered 500"),
        (None, "/tokenize: "),
    ],
)
def test_a_tokenize_answer_that_is_not_a_count_aborts_the_run_saying_so(answer, said):
    """The server's /tokenize answering HTML, a JSON array, `{"count": true}`, JSON nested past
    reading, or not at all stopped the run with an internal error (`r.json().get` on a list, a
    JSONDecodeError, an httpx error): each is now `RunAborted` naming what came back, with the
    local tokenizer as the hint."""
    import httpx
    import trio

    from soakspec.runner.prompts import RunAborted, ServerTokenizer

    def handler(request: httpx.Request) -> httpx.Response:
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(answer[0], content=answer[1])

    async def go() -> int:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await ServerTokenizer("http://127.0.0.1:9/v1", "m", client).count("a b c", True)

    with pytest.raises(RunAborted) as got:
        trio.run(go)
    assert said in str(got.value) and 'tokenizer = "tokenizer.json"' in str(got.value), got.value
