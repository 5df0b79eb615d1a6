"""What a user of vLLM's multi-turn benchmark (benchmarks/multi_turn) expects of `multi_turn =
true` sessions, where soakspec did otherwise: a conversation file shorter than a level's
turns cycles, and every level starts again at its first conversation, so the server's prefix
cache serves whole turns it has answered before -- while `check` stayed silent (W511 was
skipped for multi-turn) and the plan called the cache regime 'as in production'."""

from __future__ import annotations

import json
from pathlib import Path

from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.plan import render_text as render_plan
from specs import one_workload_spec


def _write(tmp_path: Path, conversations: int, load: str, extra: str = "") -> Path:
    convs = [{"conversations": [{"from": "human", "value": f"c{i} q1"}, {"from": "gpt", "value": f"c{i} a1"},
                                {"from": "human", "value": f"c{i} q2"}, {"from": "gpt", "value": f"c{i} a2"}]}
             for i in range(conversations)]  # fmt: skip
    (tmp_path / "sg.json").write_text(json.dumps(convs))
    before = f'endpoint = chat\n  prompt_file = "sg.json"\n  multi_turn = true\n  max_tokens = 4\n  {extra}'
    text = one_workload_spec(name="mt", issue="1", before_load=before, load=load,
                             after_load="duration = 1s\n  deadline = 5s\n  follow_up = false")  # fmt: skip
    path = tmp_path / "w.soak"
    path.write_text(text)
    return path


def test_a_conversation_file_shorter_than_a_levels_turns_warns_w511(tmp_path):
    """2 conversations of 2 turns (4 turns in all) at concurrency 2 with an expected latency
    of 100 ms: about 20 turns a level, each of the file's sent about 5 times -- all but the
    first pass whole repeats a prefix cache serves. `check` said nothing."""
    spec, diags, _ = load_spec(_write(tmp_path, 2, "mode = closed\n    concurrency = [2]", "expected_latency = 100ms"))
    assert spec is not None, diags
    [w] = [d for d in diags if d.code == "W511"]
    assert "about 20 requests in a level" in w.message
    assert "4 turns in 2 conversations" in w.message and "5.0 times" in w.message and "prefix cache" in w.message
    spec, diags, _ = load_spec(_write(tmp_path, 10, "mode = closed\n    concurrency = [2]", "expected_latency = 100ms"))
    assert spec is not None and not [d for d in diags if d.code == "W511"]  # 20 turns in the file: no repeat planned



def test_more_sessions_than_conversations_warns_w511(tmp_path):
    """8 sessions over a file of 7 conversations: session 8 begins conversation 1 beside session 1
    and sends its turns at the same time, each the second time a prefix cache sees it (a run
    against the embedded simulator sent 17 such pairs in 5 s). `check` said nothing: the level
    plans 8 requests at least, fewer than the file's 14 turns. At 7 sessions none is shared."""
    spec, diags, _ = load_spec(_write(tmp_path, 7, "mode = closed\n    concurrency = [2, 8]"))
    assert spec is not None, diags
    [w] = [d for d in diags if d.code == "W511"]
    assert "up to 8 multi-turn sessions" in w.message and "7 conversations" in w.message, w.message
    assert "at the same time" in w.message and "prefix cache" in w.message
    spec, diags, _ = load_spec(_write(tmp_path, 7, "mode = closed\n    concurrency = [7]"))
    assert spec is not None and not [d for d in diags if d.code == "W511"]

def test_the_plan_says_every_level_starts_again_at_the_first_conversation(tmp_path):
    """The plan and the manifest's `prefix_cache` told a warm cache 'as in production'; a later
    level resends the first level's turns whole (each level starts at conversation 0)."""
    spec, diags, _ = load_spec(_write(tmp_path, 50, "mode = closed\n    concurrency = [1, 2]"))
    assert spec is not None, diags
    p = plan(spec)
    said = p.backends[0].levels[1].request.to_json()["prefix_cache"]
    assert "as in production" not in said
    assert "every level starts again at the file's first conversation" in said
    assert "every level starts again at the file's first conversation" in render_plan(p)


def _write_convs(tmp_path: Path, convs: list[list[tuple[str, str]]]) -> Path:
    data = [{"conversations": [{"from": f, "value": v} for f, v in c]} for c in convs]
    (tmp_path / "sg.json").write_text(json.dumps(data))
    before = 'endpoint = chat\n  prompt_file = "sg.json"\n  multi_turn = true\n  max_tokens = 4'
    text = one_workload_spec(name="mt", issue="1", before_load=before, load="mode = closed\n    concurrency = [1]",
                             after_load="duration = 1s\n  deadline = 5s\n  follow_up = false")  # fmt: skip
    (tmp_path / "w.soak").write_text(text)
    return tmp_path / "w.soak"


def test_conversations_that_do_not_alternate_user_and_assistant_warn(tmp_path):
    """Real ShareGPT dumps hold conversations with two answers or two questions in a row (vLLM's
    convert_sharegpt_to_openai.py drops them): sent as history, a chat template that requires
    alternation rejects every later turn of the conversation (HTTP 400), and `check` said
    nothing. A system turn first is no break."""
    ok = [("system", "s"), ("human", "q1"), ("gpt", "a1"), ("human", "q2")]
    two_answers = [("human", "q1"), ("gpt", "a1"), ("gpt", "a1 more"), ("human", "q2")]
    two_questions = [("human", "q1"), ("human", "q1 again"), ("gpt", "a")]
    spec, diags, _ = load_spec(_write_convs(tmp_path, [ok, two_answers, two_questions]))
    assert spec is not None, diags
    [w] = [d for d in diags if d.code == "W512"]
    assert "2 of 3 conversations" in w.message and "conversation 2" in w.message and "turn 3" in w.message
    assert "alternat" in w.message and "400" in w.message
    spec, diags, _ = load_spec(_write_convs(tmp_path, [ok, ok[1:]]))
    assert spec is not None and not [d for d in diags if d.code == "W512"]


def test_the_pre_flight_and_follow_up_send_a_sessions_first_turn_not_a_whole_conversation(tmp_path):
    """A `messages` file (what vLLM's convert_sharegpt_to_openai.py writes) holds each
    conversation whole, answers included; the pre-flight request (`Shapes.make(0)`) and the
    follow-up (`smallest`) sent the first record whole -- every turn and the last answer, a
    request no session sends -- so a conversation longer than the model's context aborted the
    run before its first level (HTTP 400), though each session's first turn fits."""
    from soakspec.runner.load import Shapes

    big = " ".join(["word"] * 50)
    convs = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"c{i} q1"}, {"role": "assistant", "content": big},
                                          {"role": "user", "content": f"c{i} q2"}, {"role": "assistant", "content": big}]}
             for i in range(2)]  # fmt: skip
    (tmp_path / "conv.json").write_text(json.dumps(convs, indent=2))
    before = 'endpoint = chat\n  prompt_file = "conv.json"\n  multi_turn = true\n  max_tokens = 4'
    (tmp_path / "w.soak").write_text(one_workload_spec(name="mt", issue="1", before_load=before, load="mode = closed\n    concurrency = [1]",
                                                       after_load="duration = 1s\n  deadline = 5s\n  follow_up = false"))  # fmt: skip
    spec, diags, _ = load_spec(tmp_path / "w.soak")
    assert spec is not None, diags
    shapes = Shapes(plan(spec).backends[0].levels[0].request)
    first = (("user", "c0 q1"),)
    assert shapes.make(0).messages == first and shapes.make(0, smallest=True).messages == first
    assert shapes.make(0, worker=0).messages == first  # what the first session sends
