"""Random request lengths (`length_range = 50%`), as `vllm bench serve --dataset-name random
--random-range-ratio 0.5`: each request's prompt length and max_tokens drawn uniformly from
[floor(N(1 - r)), ceil(N(1 + r))] around the asked N, by the request's index in its level and
the load's seed -- the same lengths in every run and whatever `--workers N` splits a level into.

What a user sees: the checker's errors, the plan's line, the lengths on the wire (virtual time,
and the simulator's own usage count), and a run whose responses at the top of the range are
not judged `usage_mismatch`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.judge.rederive import _usage_bounds, usage_problem
from soakspec.judge.workload import workload_differences
from soakspec import lengths
from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.plan import render_text as render_plan
from soakspec.runner.clock import RunClock
from soakspec.runner.h11client import H11Connection
from soakspec.runner.load import WORDS, LevelContext, Shapes, drive_level
from soakspec.sim import server as sim
from soakspec.sim.config import SimConfig
from specs import one_workload_spec
from test_load_prompt_order import _drive_parts

CLOSED = "mode = closed\n    concurrency = [2]"
AFTER = "duration = 400ms\n  deadline = 5s\n  follow_up = false"


def _load(tmp_path: Path, before: str, load: str = CLOSED, after: str = AFTER):
    path = tmp_path / "r.soak"
    path.write_text(one_workload_spec(name="ranges", issue="1", before_load=before, load=load, after_load=after))
    return load_spec(path)


def _codes(diags) -> list[str]:
    return [d.code for d in diags]


# ---------------------------------------------------------------- the range, as vLLM draws it


def test_the_range_is_vllms_floor_and_ceiling_around_the_asked_length():
    assert lengths.bounds(1000, 0.5) == (500, 1500)
    assert lengths.bounds(100, 0.1) == (90, 110)  # not 111, which 100 * 1.1 = 110.00000000000001 would give
    assert lengths.bounds(7, 0.5) == (3, 11)  # floor(3.5), ceil(10.5)
    assert lengths.bounds(1, 0.9) == (1, 2)  # the low end is at least 1
    assert lengths.bounds(64, 0.0) == (64, 64)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10_000_000), percent=st.integers(0, 99), seed=st.integers(0, 2**63 - 1),
       index=st.integers(0, 10**9))  # fmt: skip
def test_every_drawn_length_is_within_its_range_and_the_range_holds_the_asked_length(n, percent, seed, index):
    r = percent / 100
    low, high = lengths.bounds(n, r)
    assert 1 <= low <= n <= high
    for which in (lengths.PROMPT, lengths.OUTPUT):
        got = lengths.draw(n, r, seed, index, which)
        assert low <= got <= high
        assert got == lengths.draw(n, r, seed, index, which)  # a pure function of its inputs


@settings(max_examples=30, deadline=None)
@given(n=st.integers(20, 100_000), percent=st.integers(1, 99), seed=st.integers(0, 2**31))
def test_the_mean_drawn_length_is_near_the_asked_length(n, percent, seed):
    r, draws = percent / 100, 2000
    low, high = lengths.bounds(n, r)
    got = [lengths.draw(n, r, seed, k, lengths.PROMPT) for k in range(draws)]
    sd = (high - low + 1) / 12**0.5
    assert abs(sum(got) / draws - n) <= 5 * sd / draws**0.5 + 1  # the range's middle is n, within rounding
    assert min(got) < n < max(got) or high - low < 2


# ---------------------------------------------------------------- check


@pytest.mark.parametrize(
    ("before", "code", "says"),
    [
        ("prompt_tokens = 100\n  length_range = 100%", "E204", "'length_range' must be less than 100%, not 100%"),
        ("prompt_tokens = 100\n  length_range = 150%", "E204", "less than 100%"),
        ("prompt_tokens = 100\n  length_range = 1.5", "E204", "fraction between 0 and 1"),
        ("prompt_tokens = 100\n  length_range = -10%", "E204", "zero or more"),
        ('prompt_tokens = 100\n  length_range = "50%"', "E104", "'length_range'"),
        ("prompt_tokens = 100\n  length_range = 50ms", "E203", "'length_range' is a ratio"),
        ("prompt_tokens = 9000000\n  length_range = 50%", "E204", "draws prompt_tokens up to 13,500,000"),
        ("prompt_tokens = 100\n  max_tokens = 9000000\n  length_range = 50%", "E204", "draws max_tokens up to 13,500,000"),
        ("prompt_words = 9000000\n  length_range = 50%", "E204", "draws prompt_words up to 13,500,000"),
        ("prompt_tokens = 100\n  prefix_tokens = 50\n  length_range = 50%", "E204",
         "'prefix_tokens' (50) must be less than the shortest prompt length length_range draws (50)"),
        ('prompt_file = "p.txt"\n  length_range = 50%', "E403", "a prompt file's prompts have their own lengths"),
    ],
)
def test_check_refuses_a_range_it_cannot_draw(tmp_path, before, code, says):
    (tmp_path / "p.txt").write_text("one\ntwo\n")
    spec, diags, _ = _load(tmp_path, before)
    assert spec is None, diags
    found = [d for d in diags if d.code == code]
    assert found and any(says in d.message for d in found), diags


def test_the_100_percent_error_says_vllms_range(tmp_path):
    _, diags, _ = _load(tmp_path, "prompt_tokens = 100\n  length_range = 100%")
    (d,) = diags
    assert "--random-range-ratio" in d.hint and "[0, 1)" in d.hint


def test_a_replay_sets_its_own_lengths(tmp_path):
    (tmp_path / "t.jsonl").write_text("".join(f'{{"timestamp": {i * 100}, "input_length": 10, "output_length": 4}}\n' for i in range(3)))
    spec, diags, _ = _load(tmp_path, "length_range = 50%", load='mode = replay\n    trace = "t.jsonl"', after="deadline = 5s")
    assert spec is None
    assert any(d.code == "E403" and "'length_range' does not apply to mode = replay" in d.message for d in diags), diags


def test_vllms_name_for_it_is_pointed_at_the_key(tmp_path):
    spec, diags, _ = _load(tmp_path, "prompt_tokens = 100\n  range_ratio = 0.5")
    assert spec is None and [(d.code, d.hint) for d in diags] == [("E101", "did you mean 'length_range'?")]


def test_a_range_may_be_written_as_a_fraction_as_vllm_takes_it(tmp_path):
    spec, diags, _ = _load(tmp_path, "prompt_tokens = 100\n  length_range = 0.25")
    assert spec is not None, diags
    assert spec.workloads[0].length_range == 0.25


def test_the_loads_seed_seeds_the_lengths_in_every_mode(tmp_path):
    """A closed loop takes `seed` only with a range to seed; an open loop of constant arrivals is
    not told its seed seeds nothing (W514) when it seeds the lengths."""
    spec, diags, _ = _load(tmp_path, "prompt_tokens = 100\n  length_range = 50%", load=CLOSED + "\n    seed = 7")
    assert spec is not None and not diags, diags
    assert spec.workloads[0].load.seed == 7
    spec, diags, _ = _load(tmp_path, "prompt_tokens = 100", load=CLOSED + "\n    seed = 7")
    assert spec is None and "E403" in _codes(diags)
    open_ = "mode = open\n    rate = [4rps]\n    seed = 7"
    assert "W514" in _codes(_load(tmp_path, "prompt_tokens = 100", load=open_)[1])
    assert "W514" not in _codes(_load(tmp_path, "prompt_tokens = 100\n  length_range = 50%", load=open_)[1])


# ---------------------------------------------------------------- plan, manifest, compare


def test_the_plan_states_each_range(tmp_path):
    spec, diags, _ = _load(tmp_path, "prompt_tokens = [100, 1000]\n  max_tokens = [16, 64]\n  length_range = 50%",
                           load=CLOSED + "\n    seed = 7")  # fmt: skip
    assert spec is not None, diags
    text = render_plan(plan(spec))
    assert ("w lengths: each request's prompt 50-150, 500-1500 tokens, max_tokens 8-24, 32-96: drawn uniformly "
            "(±50%, seed 7) by its index in its level, as vllm bench serve --random-range-ratio 0.5") in text
    j = plan(spec).backends[0].levels[0].request.to_json()
    assert (j["length_range"], j["length_seed"], j["prompt_tokens"], j["max_tokens"]) == (0.5, 7, [100, 1000], [16, 64])
    spec, _, _ = _load(tmp_path, "prompt_words = 40\n  length_range = 10%")
    assert "w lengths: each request's prompt 36-44 words, max_tokens 57-71:" in render_plan(plan(spec))
    spec, _, _ = _load(tmp_path, "prompt_tokens = 100")
    assert "lengths:" not in render_plan(plan(spec))


def test_compare_tells_a_ranged_run_from_a_fixed_one(tmp_path):
    fixed, _, _ = _load(tmp_path, "prompt_tokens = 100")
    ranged, _, _ = _load(tmp_path, "prompt_tokens = 100\n  length_range = 50%")
    (diff,) = workload_differences(fixed, ranged, ["w"])
    assert "prompt 100 tokens → 100 tokens, ±50% (seed 0)" in diff and "max_tokens 64 → 64 ±50%" in diff
    reseeded, _, _ = _load(tmp_path, "prompt_tokens = 100\n  length_range = 50%", load=CLOSED + "\n    seed = 3")
    assert workload_differences(ranged, reseeded, ["w"])  # another seed sent other lengths


# ---------------------------------------------------------------- on the wire


def _level(tmp_path, before: str, load: str = CLOSED, duration: str = "2s"):
    spec, diags, _ = _load(tmp_path, before, load=load, after=f"duration = {duration}\n  deadline = 5s\n  follow_up = false")
    assert spec is not None, diags
    (lv,) = plan(spec).backends[0].levels
    return lv


WORD_RANGE = "prompt_words = 40\n  max_tokens = [10, 100]\n  length_range = 50%"


def _words(prompt: str) -> int:
    return len(prompt.split())  # the request id, then n - 1 words


def _index(prompt: str) -> int:
    return WORDS.index(prompt.split()[1])  # a word prompt's second word is WORDS[its index] (fewer than 198 requests here)


@pytest.mark.parametrize("parts", [1, 3])
def test_a_closed_levels_lengths_spread_over_the_range_and_are_the_kth_requests_whatever_the_workers(tmp_path, parts):
    """The lengths sent: every prompt 20-60 words, max_tokens 5-15 or 50-150 by the list's cycle,
    spread over the range; the k-th request to start gets the k-th request's lengths in one
    process and split over three (each slower than the one before), and again in a later run."""
    lv = _level(tmp_path, WORD_RANGE)
    shapes = Shapes(lv.request)
    sent = sorted((t, _index(p), _words(p), m) for run in _drive_parts(lv, parts, first=5, slower=2.0) for t, _, p, m in run)
    assert 40 < len(sent) < len(WORDS)
    for _, k, words, max_tokens in sent:
        assert (words, max_tokens) == (_words(shapes.make(k).prompt), shapes.make(k).max_tokens)
        assert 20 <= words <= 60 and (5 <= max_tokens <= 15 if k % 2 == 0 else 50 <= max_tokens <= 150)
    assert [k for _, k, _, _ in sent] == list(range(len(sent)))
    assert len({w for _, _, w, _ in sent}) > 15 and len({m for _, k, _, m in sent if k % 2}) > 15  # spread, not a few values
    again = Shapes(_level(tmp_path, WORD_RANGE).request)  # another run: the same lengths
    assert [(_words(again.make(k).prompt), again.make(k).max_tokens) for k in range(100)] == [
        (_words(shapes.make(k).prompt), shapes.make(k).max_tokens) for k in range(100)]


@pytest.mark.parametrize("parts", [2, 3])
def test_an_open_levels_lengths_are_the_same_split_over_processes(tmp_path, parts):
    lv = _level(tmp_path, WORD_RANGE, load="mode = open\n    rate = [20rps]\n    arrival = poisson\n    seed = 11")
    (one,) = _drive_parts(lv, 1, first=0)
    split = _drive_parts(lv, parts, first=77)
    assert sorted((t, p, m) for run in split for t, _, p, m in run) == sorted((t, p, m) for t, _, p, m in one)
    assert len({_words(p) for _, _, p, _ in one}) > 10


def test_another_seed_draws_other_lengths_and_no_range_sends_the_asked_ones(tmp_path):
    seeded = Shapes(_level(tmp_path, WORD_RANGE, load=CLOSED + "\n    seed = 1").request)
    default = Shapes(_level(tmp_path, WORD_RANGE).request)
    fixed = Shapes(_level(tmp_path, "prompt_words = 40\n  max_tokens = [10, 100]").request)
    lens = [[(_words(s.make(k).prompt), s.make(k).max_tokens) for k in range(50)] for s in (seeded, default, fixed)]
    assert lens[0] != lens[1]
    assert lens[2] == [(40, [10, 100][k % 2]) for k in range(50)]
    assert (_words(default.make(0, smallest=True).prompt), default.make(0, smallest=True).max_tokens) == (8, 10)  # the asked


async def _sim_records(tmp_path: Path, before: str):
    """One closed level against the simulator in this process: the records (the server's usage)."""
    lv = _level(tmp_path, before, duration="1s")
    clock, records = RunClock(), []
    seq = iter(range(10**6))

    def next_id() -> tuple[int, str]:
        i = next(seq)
        return i, f"t-{i:07d}"

    async with trio.open_nursery() as nursery:
        config = SimConfig(model="default", trace_log=False, ttft=0.002, itl=0.0002, seed=1)
        port = await nursery.start(partial(sim.serve, config))
        shapes = Shapes(lv.request)
        await shapes.prepare(f"http://127.0.0.1:{port}")
        ctx = LevelContext("sim", clock, partial(H11Connection, "127.0.0.1", port, clock), shapes, records.extend, next_id)
        await drive_level(lv, ctx)
        nursery.cancel_scope.cancel()
    return records


async def test_the_servers_usage_counts_the_drawn_token_lengths(tmp_path):
    """Token-exact prompts with a range: the simulator counts each prompt at a length of
    [32, 96] and generates each max_tokens of [8, 24] (ignore_eos), over much of the range."""
    records = await _sim_records(tmp_path, "prompt_tokens = 64\n  max_tokens = 16\n  length_range = 50%")
    assert len(records) >= 20 and all(r.outcome == "completed" for r in records)
    prompts, outputs = Counter(r.prompt_tokens for r in records), Counter(r.output_tokens for r in records)
    assert min(prompts) >= 32 and max(prompts) <= 96 and len(prompts) > 10, prompts
    assert min(outputs) >= 8 and max(outputs) <= 24 and len(outputs) > 5, outputs


def test_the_usage_bound_is_the_top_of_the_largest_max_tokens_range(tmp_path):
    spec, _, _ = _load(tmp_path, "prompt_tokens = 64\n  max_tokens = [16, 40]\n  length_range = 50%")
    assert _usage_bounds(spec) == {"w": (60, True)}
    assert usage_problem({"output_tokens": 60, "chunks": 60}, 60) is None
    assert "61 completion tokens reported at max_tokens = 60" in usage_problem({"output_tokens": 61, "chunks": 61}, 60)


def test_a_run_at_the_top_of_the_range_passes_its_gate_and_the_servers_counts_gate_it(tmp_path):
    """End to end (`soakspec run` against the simulator): responses of up to 24 completion tokens
    are not usage_mismatch (failed == 0 holds), and `require min/max(prompt_tokens)` and
    `max(output_tokens)` gate the range the server counted."""
    text = one_workload_spec(name="ranges", issue="1", before_load="prompt_tokens = 64\n  max_tokens = 16\n  length_range = 50%",
                             load=CLOSED, after_load="duration = 1s\n  deadline = 5s\n  follow_up = false")  # fmt: skip
    gate = ("client_healthy = false\n  require failed == 0\n  require min(prompt_tokens) >= 32\n  require max(prompt_tokens) <= 96\n"
            "  require max(output_tokens) <= 24\n  require max(output_tokens) > 16")
    path = tmp_path / "g.soak"
    path.write_text(text.replace("require failed == 0", gate).replace("sim {}", "sim {\n    ttft = 5ms\n    itl = 1ms\n  }"))
    proc = subprocess.run([sys.executable, "-m", "soakspec", "run", str(path), "--out", str(tmp_path / "ev"), "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_pre_flight_sends_the_asked_lengths_not_the_first_requests_drawn_ones(tmp_path):
    """README (Random lengths): "The pre-flight and follow-up requests send the asked (shortest)
    lengths". End to end: with prompt_words = 40, max_tokens = 16 and length_range = 50%, the
    pre-flight kept in the manifest asked 40 words and 16 tokens, as written -- not request 0's
    draw, which is a length of the range like any other."""
    drawn = (lengths.draw(40, 0.5, 0, 0, lengths.PROMPT), lengths.draw(16, 0.5, 0, 0, lengths.OUTPUT))
    assert drawn != (40, 16)  # request 0 of the level is drawn other lengths: the test tells them apart
    text = one_workload_spec(name="ranges", issue="1", before_load="prompt_words = 40\n  max_tokens = 16\n  length_range = 50%",
                             load=CLOSED, after_load="duration = 500ms\n  deadline = 5s\n  follow_up = false")  # fmt: skip
    path = tmp_path / "p.soak"
    path.write_text(text.replace("sim {}", "sim {\n    ttft = 5ms\n    itl = 1ms\n  }"))
    proc = subprocess.run([sys.executable, "-m", "soakspec", "run", str(path), "--out", str(tmp_path / "ev"), "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((tmp_path / "ev" / "manifest.json").read_text())
    (pre,) = manifest["backends"][0]["preflight"]
    assert (pre["record"]["prompt_tokens"], pre["record"]["output_tokens"]) == (40, 16), pre["record"]
