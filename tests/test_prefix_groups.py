"""Prefix groups (`prefix_groups = G` beside `prefix_tokens = S`): SGLang's `bench_serving
--dataset-name generated-shared-prefix`, G system prompts of S tokens, each request starting with
its group's. Checked before anything runs, stated by the plan and the manifest, drawn per request
index by the load's seed, and -- against the simulator's reference-counted prefix cache -- shared
within a group and never between groups."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec import draws
from soakspec.judge.workload import workload_shape
from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.plan import render_text as render_plan
from soakspec.report.common import workload_line
from soakspec.runner.load import WORDS
from soakspec.runner.prompts import TokenCosts, prefix_words, token_prompt
from specs import one_workload_spec


def _spec_text(source: str, load: str = "mode = closed\n    concurrency = [2]") -> str:
    after = "duration = 400ms\n  deadline = 5s\n  follow_up = false"
    return one_workload_spec(name="gsp", issue="39", before_load=f"{source}\n  max_tokens = 3", load=load, after_load=after)


def _load(tmp_path: Path, source: str, load: str = "mode = closed\n    concurrency = [2]"):
    path = tmp_path / "t.soak"
    path.write_text(_spec_text(source, load))
    return load_spec(path)


@pytest.mark.parametrize(
    ("source", "code", "words"),
    [
        ("prompt_tokens = 128\n  prefix_groups = 4", "E403", "sets no 'prefix_tokens'"),
        ("prompt_tokens = 128\n  prefix_tokens = 0\n  prefix_groups = 4", "E403", "sets no 'prefix_tokens'"),
        ("prompt_tokens = 128\n  prefix_tokens = 32\n  prefix_groups = 0", "E204", "more than zero"),
        ("prompt_tokens = 128\n  prefix_tokens = 5\n  prefix_groups = 64", "E204", "too short to keep 64 prefix groups apart"),
    ],
)
def test_check_refuses_groups_without_a_prefix_to_split_or_too_short_to_tell_apart(tmp_path, source, code, words):
    spec, diags, _ = _load(tmp_path, source)
    assert spec is None
    (d,) = [d for d in diags if d.code == code]
    assert words in d.message, d
    if code == "E403":  # the hint says how to write SGLang's workload
        assert "prefix_tokens = S  prefix_groups = 4" in d.hint


def test_the_plan_and_the_manifest_state_the_groups_and_one_group_is_as_before(tmp_path):
    spec, diags, _ = _load(tmp_path, "prompt_tokens = 128\n  prefix_tokens = 32\n  prefix_groups = 4",
                           "mode = closed\n    concurrency = [2]\n    seed = 7")
    assert spec is not None, diags
    j = plan(spec).backends[0].levels[0].request.to_json()
    assert (j["prefix_tokens"], j["prefix_groups"], j["group_seed"]) == (32, 4, 7)
    assert j["prefix_cache"].startswith("prefix: 4 groups of 32 tokens")
    assert "cache: prefix: 4 groups of 32 tokens (groups part at their first token" in render_plan(plan(spec))
    assert "seed 7: each block of 4 requests from the level's first, a warmup's included, sends every group once" in render_plan(plan(spec))
    # the report's workload line names them (with the seed that drew each request's group)
    assert "prompt_tokens=128, prefix_tokens=32, prefix_groups=4(seed=7), " in workload_line(spec.workloads[0])
    # compare tells a grouped run from a single-prefix one
    grouped = workload_shape(spec, "w")["prompt"]
    spec1, _, _ = _load(tmp_path, "prompt_tokens = 128\n  prefix_tokens = 32")
    assert workload_shape(spec1, "w")["prompt"] == "128 tokens (32 shared)" != grouped
    # one group: the manifest's template has no new keys (as evidence from before prefix groups)
    j1 = plan(spec1).backends[0].levels[0].request.to_json()
    assert "prefix_groups" not in j1 and "group_seed" not in j1 and j1["prefix_cache"] == "shared prefix of 32 tokens"


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**63 - 1), st.integers(0, 20))
def test_every_pass_of_g_requests_sends_every_group_once(groups, seed, p):
    """Property: requests p*G .. p*G + G - 1 of a level are in G different groups (each group
    sent equally often, as SGLang's groups x prompts-per-group shuffled once), and the draw is a
    function of the index and seed alone (every --workers process draws the same)."""
    got = [draws.prefix_group(p * groups + j, groups, seed) for j in range(groups)]
    assert sorted(got) == list(range(groups))
    assert got == [draws.prefix_group(p * groups + j, groups, seed) for j in range(groups)]


_COSTS = TokenCosts(tuple(WORDS[:50]), 1)  # 50 one-token words and a BOS


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 3000), st.integers(1, 64), st.integers(0, 10**6))
def test_group_prefixes_differ_and_a_groups_requests_share_it_exactly(groups, extra, index):
    """Property: a group's prefix is the same in every request of it, and two groups' prefixes
    differ -- at their first token when there are at most V (here 50) groups."""
    prefix = draws.digits(groups, 2) + extra  # what check lets through
    n = prefix + 1 + 40
    g = draws.prefix_group(index, groups, 3)
    other = (g + 1 + index % (groups - 1)) % groups
    a = token_prompt(_COSTS, index, n, prefix, salt="s", group=g, groups=groups).split()
    b = token_prompt(_COSTS, index + 1, n, prefix, salt="t", group=g, groups=groups).split()
    c = token_prompt(_COSTS, index, n, prefix, salt="s", group=other, groups=groups).split()
    assert len(a) == len(b) == len(c) == n - 1  # the BOS is the n-th token
    assert a[:prefix] == b[:prefix] == prefix_words(_COSTS, prefix, 0, g, groups) and a[prefix:] != b[prefix:]
    k = draws.digits(groups, len(_COSTS.words))
    assert a[:k] != c[:k]
    if groups <= len(_COSTS.words):
        assert a[0] != c[0]


def test_one_group_sends_the_prefix_it_always_sent():
    import random

    rng = random.Random("prefix-0")  # the shared prefix before prefix groups existed
    assert prefix_words(_COSTS, 20) == [_COSTS.words[rng.randrange(50)] for _ in range(20)]
    assert token_prompt(_COSTS, 5, 40, 20, salt="x") == token_prompt(_COSTS, 5, 40, 20, salt="x", group=0, groups=1)


GSP_SPEC = """\
soak "gsp" {
  issue = "39"
}
backend "b0" {
  sim {
    ttft = 1ms
    itl = 1ms
  }
  runtime {
    label = "host-staged"
  }
}
workload "w" {
  prompt_tokens = 64
  prefix_tokens = 32
  prefix_groups = 4
  max_tokens = 2
  load {
    mode = closed
    concurrency = [1]
    requests_per_level = 16
    seed = 5
  }
  duration = 60s
  deadline = 5s
  follow_up = false
}
gate {
  require failed == 0
}
claims {
  claim "test"
}
"""


@pytest.mark.slow
def test_the_simulators_prefix_cache_hits_within_a_group_and_never_across_groups(tmp_path):
    """SGLang's generated-shared-prefix against the simulator (block_size 16, so a 32-token
    prefix is 2 full blocks; one request at a time, so each finds what the ones before cached):
    4 distinct prefixes reach the server; the first request of each group finds nothing cached
    (no group shares a block with another) and every later one finds exactly its group's 32
    tokens (and nothing of its own after them)."""
    from runner_support import requests_of, run_spec

    proc, out = run_spec(tmp_path, GSP_SPEC)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len([r for r in requests_of(out) if r["outcome"] == "completed"]) == 16
    (level,) = json.loads((out / "manifest.json").read_text())["backends"][0]["levels"]
    assert (level["prefix_tokens"], level["prefix_groups"], level["group_seed"]) == (32, 4, 5)
    # the simulator's own trace of each request (server.log): its prompt's head and the tokens it found cached
    with gzip.open(out / "backends" / "b0" / "server.log.gz", "rt") as fh:
        rows = [json.loads(line.split("soakspec_sim_trace ", 1)[1]) for line in fh if "soakspec_sim_trace " in line]
    rows.sort(key=lambda r: r["arrival_index"])
    assert len(rows) == 17 and {r["prompt_tokens"] for r in rows} == {64}  # the pre-flight and 16 measured
    _each_groups_first_finds_nothing_cached(rows)
    # two measured requests start alike exactly when the seeded draw put them in one group
    measured = {int(r["client_request_id"].rsplit("-", 1)[1]): r["prompt_head"].split()[0] for r in rows[1:]}
    assert sorted(measured) == list(range(16))
    drawn = {k: draws.prefix_group(k, 4, 5) for k in measured}
    assert all((measured[a] == measured[b]) == (drawn[a] == drawn[b]) for a in measured for b in measured)


def _each_groups_first_finds_nothing_cached(rows: list[dict]) -> set[str]:
    """In the server's order: the first request of each of the 4 groups finds nothing cached,
    every later one exactly its group's 32 tokens; the groups seen (a group's index is its
    prompt's first word: 4 groups, one word)."""
    seen: set[str] = set()
    cached = []
    for r in rows:
        group = r["prompt_head"].split()[0]
        cached.append((group in seen, r["cached_tokens"]))
        seen.add(group)
    assert len(seen) == 4
    assert {c for again, c in cached if not again} == {0} and {c for again, c in cached if again} == {32}
    return seen


def _sim_traces(out: Path) -> list[dict]:
    """The simulator's own trace of each request (server.log), in the order the server
    scheduled them (when its prompt met the prefix cache)."""
    with gzip.open(out / "backends" / "b0" / "server.log.gz", "rt") as fh:
        rows = [json.loads(line.split("soakspec_sim_trace ", 1)[1]) for line in fh if "soakspec_sim_trace " in line]
    return sorted(rows, key=lambda r: (r["scheduled_at"], r["arrival_index"]))


@pytest.mark.slow
def test_two_processes_send_every_group_and_each_groups_later_requests_hit_its_prefix(tmp_path):
    """`--workers 2`: the level's 16 requests split between two load processes (one worker
    each), which number them from one level-wide count. Each request's group is drawn from that
    level-wide index -- not a process's own count, which would send each process's first
    requests to the same prompts -- so the 16 send 16 distinct prompts, every group 4 times
    (4 blocks of G, as the seeded draw over indexes 0..15 puts them), and against the
    simulator's prefix cache the first request of each group the server scheduled finds nothing
    cached and every later one its group's 32 tokens, as with one process. (A request's id is
    not its prompt index under --workers: ids and prompts are two counts, runner/load.py.)"""
    from runner_support import requests_of, run_spec

    proc, out = run_spec(tmp_path, GSP_SPEC.replace("concurrency = [1]", "concurrency = [2]"), "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = requests_of(out)
    assert len([r for r in records if r["outcome"] == "completed"]) == 16 and {r["worker"] for r in records} == {0, 1}
    (level,) = json.loads((out / "manifest.json").read_text())["backends"][0]["levels"]
    assert (level["workers"], level["prefix_tokens"], level["prefix_groups"], level["group_seed"]) == (2, 32, 4, 5)
    rows = _sim_traces(out)
    assert len(rows) == 17 and {r["prompt_tokens"] for r in rows} == {64}  # the pre-flight and 16 measured
    seen = _each_groups_first_finds_nothing_cached(rows)
    # the level-wide indexes 0..15, each sent once: 16 distinct prompts (two requests of one
    # index would send one prompt, and find more than the prefix cached), their groups the
    # draw's over 0..15 -- the pre-flight sends index 0's group, which names that group's word
    measured = [r for r in rows if "preflight" not in r["client_request_id"]]
    assert len({r["prompt_sha256"] for r in measured}) == 16
    assert "preflight" in rows[0]["client_request_id"]
    sent = [r["prompt_head"].split()[0] for r in measured]
    drawn = [draws.prefix_group(k, 4, 5) for k in range(16)]
    assert sorted(sent.count(g) for g in seen) == sorted(drawn.count(g) for g in range(4)) == [4, 4, 4, 4]


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 12), st.integers(0, 2**31), st.integers(0, 60), st.integers(1, 80))
def test_blocks_from_the_levels_first_request_send_every_group_once_and_any_window_is_within_two(groups, seed, start, length):
    """What the plan and README promise, exactly: requests kG .. kG + G - 1 of a level (its
    warmup's included) send every group once; a window starting anywhere -- the measured window
    after a warmup of N requests, G not dividing N -- sends each group within 2 times of every
    other (a partial block at each end), not necessarily every group once per G requests."""
    k = start // groups
    block = [draws.prefix_group(i, groups, seed) for i in range(k * groups, (k + 1) * groups)]
    assert sorted(block) == list(range(groups))
    window = [draws.prefix_group(i, groups, seed) for i in range(start, start + length)]
    counts = [window.count(g) for g in range(groups)]
    assert max(counts) - min(counts) <= 2


def test_g_consecutive_requests_after_an_unaligned_warmup_need_not_send_every_group():
    """The claim the docs no longer make: after a warmup of 3 requests with 4 groups, some 4
    consecutive measured requests repeat a group (seed 0 shows it within the first blocks)."""
    assert any(len({draws.prefix_group(i, 4, 0) for i in range(s, s + 4)}) < 4 for s in range(3, 40, 4))
