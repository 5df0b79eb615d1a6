"""`prompt_order = shuffled`: a prompt file's prompts sent in a seeded random order, as `vllm
bench serve` samples its ShareGPT prompts, instead of the file's order (a file sorted by length
or topic made a workload that drifts over the run, which a soak's drift rules then blame on the
server).

What a user sees: request i of a level sends prompt perm_p(i mod n) of pass p's seeded
permutation -- every prompt once a pass, a new order each pass, the same in every run and
whatever `--workers N` splits the level into; multi-turn sessions begin the file's conversations
in that order; the checker's error without a prompt file; the plan's, the manifest's and the
report's line; and compare telling a shuffled run from a file-order one."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec import draws
from soakspec.judge.workload import workload_differences
from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.plan import render_text as render_plan
from soakspec.report.common import workload_line
from soakspec.runner.load import Shapes
from specs import one_workload_spec
from test_load_prompt_order import _drive_parts

N = 12
CLOSED = "mode = closed\n    concurrency = [3]"
AFTER = "duration = 2s\n  bucket = 1s\n  deadline = 5s\n  follow_up = false"


def _load(tmp_path: Path, before: str, load: str = CLOSED, after: str = AFTER):
    (tmp_path / "p.txt").write_text("".join(f"prompt {i}\n" for i in range(N)))
    path = tmp_path / "o.soak"
    path.write_text(one_workload_spec(name="order", issue="1", before_load=before, load=load, after_load=after))
    return load_spec(path)


def _level(tmp_path: Path, before: str, load: str = CLOSED):
    spec, diags, _ = _load(tmp_path, before, load)
    assert spec is not None, diags
    (lv,) = plan(spec).backends[0].levels
    return lv


SHUFFLED = 'prompt_file = "p.txt"\n  prompt_order = shuffled\n  max_tokens = 4'


# ---------------------------------------------------------------- the permutation


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**63 - 1), st.integers(0, 50))
def test_each_pass_over_the_file_is_a_permutation_of_it(n, seed, p):
    """For any file size, seed and pass: the pass's n requests send each of the n prompts exactly once."""
    got = [draws.shuffled(p * n + i, n, seed) for i in range(n)]
    assert sorted(got) == list(range(n))


def test_passes_and_seeds_draw_other_orders_and_a_seed_draws_the_same_one_again():
    n = 1000
    first = [draws.shuffled(i, n, 7) for i in range(n)]
    assert first != list(range(n))  # not the file's order
    assert first == [draws.shuffled(i, n, 7) for i in range(n)]  # the same seed, the same order
    assert first != [draws.shuffled(n + i, n, 7) for i in range(n)]  # the next pass: another order
    assert first != [draws.shuffled(i, n, 8) for i in range(n)]  # another seed: another order
    # a file sorted by length would no longer send its short prompts first: the first tenth of a
    # pass draws from the whole file
    assert max(first[: n // 10]) > n // 2 and min(first[: n // 10]) < n // 10


# ---------------------------------------------------------------- on the wire


def test_a_shuffled_level_sends_every_prompt_once_a_pass_in_the_seeds_order(tmp_path):
    lv = _level(tmp_path, SHUFFLED, load=CLOSED + "\n    seed = 5")
    (one,) = _drive_parts(lv, 1, first=0)
    sent = [int(p.split()[1]) for _, _, p, _ in sorted(one)]
    assert len(sent) > 2 * N
    assert sent[:N] != list(range(N))  # not the file's order
    for p in range(len(sent) // N):
        assert sorted(sent[p * N:(p + 1) * N]) == list(range(N))  # every prompt once a pass
    assert sent[:N] != sent[N:2 * N]  # each pass its own order
    assert sent == [draws.shuffled(k, N, 5) for k in range(len(sent))]


@pytest.mark.parametrize("parts", [2, 3])
def test_a_shuffled_levels_kth_request_sends_the_same_prompt_whatever_the_workers(tmp_path, parts):
    lv = _level(tmp_path, SHUFFLED, load=CLOSED + "\n    seed = 5")
    shapes = Shapes(lv.request)
    split = _drive_parts(lv, parts, first=17, slower=2.0)
    assert all(split)
    sent = sorted((t, p) for run in split for t, _, p, _ in run)
    # in the order they started, the level's requests sent prompts perm(0), perm(1), ... as one process does
    want = [shapes.make(k).prompt for k in range(len(sent))]
    assert Counter(p for _, p in sent) == Counter(want)
    assert {p for run in split for _, _, p, _ in run} == {f"prompt {i}" for i in range(N)}


def test_file_order_is_the_default_and_unchanged(tmp_path):
    lv = _level(tmp_path, 'prompt_file = "p.txt"\n  max_tokens = 4')
    (one,) = _drive_parts(lv, 1, first=0)
    sent = [int(p.split()[1]) for _, _, p, _ in sorted(one)]
    assert sent == [k % N for k in range(len(sent))]


def test_output_lengths_from_the_file_follow_their_prompt_when_shuffled(tmp_path):
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}", "max_tokens": i + 1}) + "\n" for i in range(N)))
    lv = _level(tmp_path, 'prompt_file = "p.jsonl"\n  prompt_order = shuffled\n  max_tokens_from_file = true')
    shapes = Shapes(lv.request)
    for k in range(3 * N):
        s = shapes.make(k)
        assert s.max_tokens == int(s.prompt[1:]) + 1


def test_multi_turn_sessions_begin_the_files_conversations_in_the_shuffled_order(tmp_path):
    convs = [{"conversations": [{"from": "human", "value": f"c{i} q1"}, {"from": "gpt", "value": "a"},
                                {"from": "human", "value": f"c{i} q2"}]} for i in range(6)]  # fmt: skip
    (tmp_path / "sg.json").write_text(json.dumps(convs))
    before = 'endpoint = chat\n  prompt_file = "sg.json"\n  multi_turn = true\n  prompt_order = shuffled\n  max_tokens = 4'
    lv = _level(tmp_path, before, load="mode = closed\n    concurrency = [1]\n    seed = 9")
    shapes = Shapes(lv.request)
    begun = [s.conversation for k in range(24) if (s := shapes.make(k, worker=0)).turn == 1]
    assert begun == [draws.shuffled(j, 6, 9) + 1 for j in range(12)]
    assert begun[:6] != [1, 2, 3, 4, 5, 6] and sorted(begun[:6]) == [1, 2, 3, 4, 5, 6]
    # the record's conversation names the file's conversation it sent
    s = Shapes(lv.request).make(0, worker=0)
    assert s.prompt == f"c{s.conversation - 1} q1"


# ---------------------------------------------------------------- check, plan, manifest, report, compare


def test_prompt_order_without_a_prompt_file_is_an_error_with_a_hint(tmp_path):
    spec, diags, _ = _load(tmp_path, "prompt_words = 8\n  prompt_order = shuffled")
    assert spec is None
    (d,) = [d for d in diags if d.code == "E403"]
    assert "'prompt_order' describes a prompt file" in d.message and "prompt_file" in d.hint


def test_the_loads_seed_seeds_the_order_in_a_closed_loop_too(tmp_path):
    spec, diags, _ = _load(tmp_path, SHUFFLED, load=CLOSED + "\n    seed = 7")
    assert spec is not None and not [d for d in diags if d.code.startswith("E")], diags
    assert spec.workloads[0].load.seed == 7
    spec, diags, _ = _load(tmp_path, 'prompt_file = "p.txt"', load=CLOSED + "\n    seed = 7")
    assert spec is None and any(d.code == "E403" for d in diags)  # file order: nothing for the seed to seed
    open_ = "mode = open\n    rate = [4rps]\n    seed = 7"
    assert "W514" not in [d.code for d in _load(tmp_path, SHUFFLED, load=open_)[1]]


def test_the_plan_the_manifest_and_the_report_state_the_order_and_seed(tmp_path):
    spec, diags, _ = _load(tmp_path, SHUFFLED, load=CLOSED + "\n    seed = 7")
    assert spec is not None, diags
    p = plan(spec)
    text = render_plan(p)
    assert "w order: shuffled (seed 7): each pass over the file sends every one of its prompts once" in text
    (lv,) = p.backends[0].levels
    assert (lv.request.to_json()["prompt_order"], lv.request.to_json()["prompt_seed"]) == ("shuffled", 7)
    entry = lv.to_json()  # the level's manifest entry
    assert (entry["prompt_order"], entry["prompt_seed"]) == ("shuffled", 7)
    assert "prompt_order=shuffled(seed=7)" in workload_line(spec.workloads[0])
    spec, _, _ = _load(tmp_path, 'prompt_file = "p.txt"')
    assert "w order: in file order" in render_plan(plan(spec)) and "prompt_order" not in plan(spec).backends[0].levels[0].to_json()
    assert "prompt_order" not in workload_line(spec.workloads[0])


def test_compare_tells_a_shuffled_run_from_a_file_order_one(tmp_path):
    in_order, _, _ = _load(tmp_path, 'prompt_file = "p.txt"\n  max_tokens = 4')
    shuffled, _, _ = _load(tmp_path, SHUFFLED)
    (diff,) = workload_differences(in_order, shuffled, ["w"])
    assert "shuffled (seed 0)" in diff
    reseeded, _, _ = _load(tmp_path, SHUFFLED, load=CLOSED + "\n    seed = 3")
    assert workload_differences(shuffled, reseeded, ["w"])  # another seed sent other prompts at each index
