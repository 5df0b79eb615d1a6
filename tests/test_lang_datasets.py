"""Prompt files in their named formats: what `check` reads, what it rejects (at the data file's
own line), and what the server actually receives (read back from the simulator's traces)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.cli import main
from soakspec.diagnostics import Severity, render_text
from soakspec.exitcodes import ExitCode
from soakspec.lang import load_spec
from soakspec.lang.datasets import DatasetError, parse_dataset
from soakspec.plan import plan
from soakspec.plan import render_text as render_plan
from soakspec.runner.clock import RunClock
from soakspec.runner.h11client import H11Connection
from soakspec.runner.load import LevelContext, Shapes, drive_level
from soakspec.sim import server as sim
from soakspec.sim.config import SimConfig
from specs import one_workload_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "prompts"

SHAREGPT_PRETTY = """\
[
  {
    "id": "a1",
    "conversations": [
      {"from": "human", "value": "first question"},
      {"from": "gpt", "value": "one two three"}
    ]
  },
  {
    "id": "a2",
    "conversations": [
      {"from": "human", "value": "second question"}
    ]
  }
]
"""


def _spec_text(file: str, endpoint: str = "completions", extra: str = "", duration: str = "1s") -> str:
    before = f'endpoint = {endpoint}\n  prompt_file = "{file}"\n  {extra}\n  max_tokens = 4'
    after = f"duration = {duration}\n  deadline = 5s\n  follow_up = false"
    return one_workload_spec(name="datasets", issue="18", before_load=before, load="mode = closed\n    concurrency = [1]", after_load=after)


def _spec(tmp_path: Path, file: str, endpoint: str = "completions", extra: str = "", duration: str = "1s"):
    path = tmp_path / "w.soak"
    path.write_text(_spec_text(file, endpoint, extra, duration))
    return load_spec(path)


# ---------------------------------------------------------------- parsing


def test_a_pretty_printed_sharegpt_array_gives_one_prompt_per_record_not_per_line():
    p = parse_dataset(SHAREGPT_PRETTY, None, chat=False, lengths=False)
    assert p.format == "sharegpt"
    assert p.prompts == ("first question", "second question")


def test_sharegpt_answer_length_is_the_output_length_only_when_asked():
    with pytest.raises(DatasetError) as e:  # the second record has no answer
        parse_dataset(SHAREGPT_PRETTY, None, chat=False, lengths=True)
    assert e.value.line == 9
    first = SHAREGPT_PRETTY.split("  },\n")[0] + "  }\n]\n"
    assert parse_dataset(first, None, chat=False, lengths=True).output_lens == (3,)
    assert parse_dataset(first, None, chat=False, lengths=False).output_lens == (None,)


def test_jsonl_takes_prompt_text_and_messages_and_its_lengths():
    text = (EXAMPLES / "prompts.jsonl").read_text()
    p = parse_dataset(text, None, chat=True, lengths=True)
    assert p.format == "jsonl"
    assert p.prompts[0] == "Summarise the plot of Hamlet in two sentences."
    assert p.prompts[1].startswith("Translate")
    assert p.prompts[2] == (("system", "You answer briefly."), ("user", "What is a KV cache?"))
    assert p.output_lens == (48, 16, 32)


def test_chat_messages_need_the_chat_endpoint():
    with pytest.raises(DatasetError, match="endpoint = chat") as e:
        parse_dataset((EXAMPLES / "prompts.jsonl").read_text(), "jsonl", chat=False, lengths=False)
    assert e.value.line == 3


def test_a_pretty_printed_object_is_not_jsonl():
    with pytest.raises(DatasetError, match="one object per line") as e:
        parse_dataset('\n{\n  "prompt": "x"\n}\n', None, chat=False, lengths=False)
    assert e.value.line == 2


def test_a_json_array_of_prompt_records_is_read_as_jsonl_records():
    p = parse_dataset('[\n  {"prompt": "a b"},\n  {"text": "c"}\n]\n', None, chat=False, lengths=False)
    assert (p.format, p.prompts) == ("jsonl", ("a b", "c"))
    with pytest.raises(DatasetError, match="'prompt', 'text' or 'messages'") as e:
        parse_dataset('[\n  {"prompt": "a b"},\n  {"question": "c"}\n]\n', None, chat=False, lengths=False)
    assert e.value.line == 3


def test_text_that_starts_with_a_brace_is_text_when_declared():
    assert parse_dataset("{not json}\nsecond\n", "text", chat=False, lengths=False).prompts == ("{not json}", "second")


@pytest.mark.parametrize(
    ("text", "line", "fmt", "match"),
    [
        ('[\n  {"conversations": [{"from": "human", "value": "a"}]},\n  {"conversations": {}}\n]', 3, None, "a list of"),
        ('[\n  {"conversations": [{"from": "human", "value": "a"}]},\n  {"turns": []}\n]', 3, None, "a list of"),
        ('[\n  {"conversations": [{"from": "human", "value": "a"}]}\n  {"x": 1}\n]', 3, None, "expected ','"),
        ('[\n  {"conversations": [{"from": "human", "value": "a"}],\n]', 3, None, "not valid JSON"),
        ('{"prompt": "a"}\n{"prompt": 3}\n', 2, None, "non-empty string"),
        ('{"prompt": "a"}\n\n{"question": "b"}\n', 3, None, "needs a 'prompt', 'text' or 'messages'"),
        ('{"prompt": "a"}\n{"prompt": "b"\n', 2, None, "JSONL"),
        ('{"conversations": [{"from": "gpt", "value": "a"}]}\n', 1, None, "no usable ShareGPT record.*human turn"),
        ('{"conversations": [{"from": "human", "value": "a"}]}\n', 1, "jsonl", "prompt_format = sharegpt"),
        ("\n\n", 1, None, "no prompts"),
        ("[]", 1, None, "no prompts"),
    ],
)
def test_malformed_files_fail_at_their_line(text, line, fmt, match):
    with pytest.raises(DatasetError, match=match) as e:
        parse_dataset(text, fmt, chat=False, lengths=False)
    assert e.value.line == line


DEEP = "[" * 100_000  # far past the recursion limit: the json decoder raises RecursionError, not a syntax error


@pytest.mark.parametrize(
    ("text", "line", "match"),
    [
        (DEEP, 1, "too deeply"),
        ('{"prompt": ' + DEEP, 1, "too deeply"),
        ('{"prompt": "a"}\n{"prompt": ' + DEEP, 2, "too deeply"),
        ('[{"prompt": "a"},\n {"prompt": "b", "max_tokens": ' + "9" * 5000 + "}]", 2, "number beyond"),
    ],
    ids=["array", "first-jsonl-line", "later-jsonl-line", "5000-digit-integer"],
)
def test_json_beyond_the_decoders_limits_is_a_malformed_file_at_its_line(text, line, match):
    """Nesting deeper than the decoder recurses, or an integer longer than Python converts, is
    a malformed record at its line, like a syntax error -- not an exception from the decoder."""
    with pytest.raises(DatasetError, match=match) as e:
        parse_dataset(text, None, chat=False, lengths=True)
    assert e.value.line == line


@pytest.mark.parametrize("command", ["check", "plan"])
def test_a_too_deeply_nested_prompt_file_is_a_spec_error_not_an_internal_one(tmp_path, capsys, command):
    """`check` and `plan` of a spec naming such a file: E419 at the file's line, exit 2."""
    (tmp_path / "deep.json").write_text(DEEP + "\n")
    (tmp_path / "w.soak").write_text(_spec_text("deep.json"))
    code = main([command, str(tmp_path / "w.soak")])
    out = capsys.readouterr()
    assert code is ExitCode.USAGE
    assert f"{tmp_path / 'deep.json'}:1:2: E419 prompt file nests arrays or objects too deeply" in out.out + out.err
    assert "internal error" not in out.err


LONE = "a\\ud800b"  # as a JSON file spells it: half of a surrogate pair, which has no UTF-8 form


@pytest.mark.parametrize(
    ("text", "line", "chat", "turns"),
    [
        ('{"prompt": "ok"}\n{"prompt": "' + LONE + '"}\n', 2, False, False),
        ('{"messages": [{"role": "user", "content": "' + LONE + '"}]}\n', 1, True, False),
        ('[\n {"conversations": [{"from": "human", "value": "ok"}]},\n {"conversations": [{"from": "human", "value": "' + LONE + '"}]}\n]', 3, False, False),
        ('{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "' + LONE + '"}]}\n', 1, True, True),
    ],
    ids=["jsonl-prompt", "chat-message", "sharegpt-turn", "multi-turn-history"],
)
def test_a_prompt_with_a_lone_surrogate_is_an_error_at_its_record(text, line, chat, turns):
    """A prompt is sent as UTF-8: a lone surrogate is the record's error in `check`, where a
    run would otherwise fail to encode the request after the servers started. Only what is
    sent counts (the answer turn above is sent as history in multi-turn sessions)."""
    with pytest.raises(DatasetError, match=r"lone UTF-16 surrogate, '\\ud800' at character 2") as e:
        parse_dataset(text, None, chat=chat, lengths=False, turns=turns)
    assert e.value.line == line
    paired = text.replace("\\ud800", "\\ud83d\\ude00")  # a whole pair is one character, and fine
    assert parse_dataset(paired, None, chat=chat, lengths=False, turns=turns).prompts


def test_check_rejects_a_prompt_file_with_a_lone_surrogate_before_anything_runs(tmp_path, capsys):
    (tmp_path / "surr.jsonl").write_text('{"prompt": "ok"}\n{"prompt": "' + LONE + '"}\n')
    (tmp_path / "w.soak").write_text(_spec_text("surr.jsonl"))
    code = main(["check", str(tmp_path / "w.soak")])
    out = capsys.readouterr().out
    assert code is ExitCode.USAGE
    assert f"{tmp_path / 'surr.jsonl'}:2:1: E419 prompt file has a prompt with a lone UTF-16 surrogate" in out


_prompt = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=40).filter(
    lambda p: p.strip() and not p.startswith("\ufeff")  # a leading BOM is the file's, and dropped
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_prompt, min_size=1, max_size=8))
def test_every_format_gives_back_the_prompts_it_was_written_with(prompts):
    """Property: text (prompts that do not start with [ or { declared as text), JSONL and a
    pretty-printed ShareGPT array all read back the same prompts in order."""
    jsonl = "\n".join(json.dumps({"prompt": p}) for p in prompts)
    assert parse_dataset(jsonl, "jsonl", chat=False, lengths=False).prompts == tuple(prompts)
    share = json.dumps([{"conversations": [{"from": "human", "value": p}]} for p in prompts], indent=2)
    assert parse_dataset(share, None, chat=False, lengths=False).prompts == tuple(prompts)
    text = "\n".join(prompts)
    assert parse_dataset(text, "text", chat=False, lengths=False).prompts == tuple(p.rstrip("\r") for p in prompts)


# ---------------------------------------------------------------- check


def test_check_reports_a_malformed_file_at_its_line_and_the_spec_position(tmp_path):
    data = tmp_path / "bad.json"
    data.write_text(SHAREGPT_PRETTY.replace('{"from": "human", "value": "second question"}', '{"from": "human"}'))
    spec, diags, text = _spec(tmp_path, "bad.json")
    assert spec is None
    in_file = [d for d in diags if d.path == str(data)]
    assert len(in_file) == 1 and in_file[0].code == "E419" and in_file[0].span.line == 9
    assert "w.soak:12:" in (in_file[0].hint or "")  # where prompt_file is written
    in_spec = [d for d in diags if d.path.endswith("w.soak") and d.code == "E419"]
    assert len(in_spec) == 1 and in_spec[0].span.line == 12 and in_spec[0].severity is Severity.ERROR
    assert f"{data}:9:" in render_text(diags, {str(tmp_path / 'w.soak'): text})


def test_check_reports_a_missing_file_and_an_unknown_format(tmp_path):
    spec, diags, _ = _spec(tmp_path, "nope.jsonl")
    assert spec is None and any(d.code == "E419" and "no such file" in d.message for d in diags)
    (tmp_path / "p.txt").write_text("a\n")
    spec, diags, _ = _spec(tmp_path, "p.txt", extra="prompt_format = csv")
    assert spec is None and [d.code for d in diags] == ["E109"]


def test_prompt_format_without_a_prompt_file_is_a_contradiction(tmp_path):
    path = tmp_path / "w.soak"
    path.write_text(_spec_text("x")
                    .replace('prompt_file = "x"', "prompt_words = 4\n  prompt_format = text"))  # fmt: skip
    spec, diags, _ = load_spec(path)
    assert spec is None and [d.code for d in diags] == ["E403"]


def test_the_plan_carries_the_prompts_and_records_the_file(tmp_path):
    spec, diags, _ = _spec(tmp_path, str(EXAMPLES / "sharegpt.json"), endpoint="chat", extra="max_tokens_from_file = true")
    assert spec is not None, diags
    p = plan(spec)
    req = p.backends[0].levels[0].request
    assert "w prompts: 2 from " in render_plan(p) and "(sharegpt, sha256 " in render_plan(p)
    assert req.prompts[0] == "What is the capital of Australia?"
    assert req.prompts[1] == (("system", "You are a terse assistant."), ("user", "Name two prime numbers above fifty."))
    assert req.output_lens == (6, 3)
    j = req.to_json()
    assert j["prompt_format"] == "sharegpt" and j["prompt_count"] == 2 and j["max_tokens_from_file"] is True
    assert len(j["prompt_sha256"]) == 64 and "prompts" not in j
    # the runner's shapes use the file's prompts and lengths, in order
    shapes = Shapes(req)
    assert [(s.prompt, s.max_tokens, s.messages is not None) for s in map(shapes.make, range(3))] == [
        ("What is the capital of Australia?", 6, False),
        ("Name two prime numbers above fifty.", 3, True),
        ("What is the capital of Australia?", 6, False),
    ]


# ---------------------------------------------------------------- what the server receives


async def _sent_prompts(tmp_path: Path, file: str, endpoint: str = "completions") -> list[dict]:
    spec, diags, _ = _spec(tmp_path, file, endpoint=endpoint, duration="400ms")
    assert spec is not None, diags
    level = plan(spec).backends[0].levels[0]
    clock = RunClock()
    traces = tmp_path / "traces.jsonl"
    seq = iter(range(10**6))

    def next_id() -> tuple[int, str]:
        i = next(seq)
        return i, f"d-{i:07d}"

    async with trio.open_nursery() as nursery:
        config = SimConfig(model="default", trace_log=False, trace_file=str(traces), ttft=0.002, itl=0.001, seed=1)
        port = await nursery.start(partial(sim.serve, config))
        ctx = LevelContext("sim", clock, partial(H11Connection, "127.0.0.1", port, clock), Shapes(level.request), lambda rs: None, next_id)
        run = await drive_level(level, ctx)
        nursery.cancel_scope.cancel()
    assert run.sent >= 3
    rows = [json.loads(line) for line in traces.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["arrival_index"])


@pytest.mark.parametrize(
    ("name", "endpoint", "expected"),
    [
        ("sharegpt.json", "chat", ["What is the capital of Australia?", "Name two prime numbers above fifty."]),
        ("prompts.jsonl", "chat", ["Summarise the plot of Hamlet in two sentences.",
                                   "Translate 'good morning' into French, German and Spanish.", "What is a KV cache?"]),
        ("prompts.txt", "completions", ["Explain what a soak test measures in one paragraph.", "Write a haiku about a GPU fan.",
                                        "List three causes of tail latency in an inference server."]),
    ],
)  # fmt: skip
async def test_each_format_sends_its_prompts_in_order(tmp_path, name, endpoint, expected):
    """Read back from the simulator's traces: request i carried prompt i mod P, whole."""
    rows = await _sent_prompts(tmp_path, str(EXAMPLES / name), endpoint)
    heads = [r["prompt_head"] for r in rows]
    assert heads[: len(expected)] == [e[:64] for e in expected]
    assert set(heads) == {e[:64] for e in expected}
    if name == "sharegpt.json":  # the system turn travels with its question
        assert [r["messages"] for r in rows[:2]] == [1, 2]


# ---------------------------------------------------------------- multi-turn sessions


def test_multi_turn_needs_chat_closed_loop_and_conversations(tmp_path):
    share = str(EXAMPLES / "sharegpt.json")
    spec, diags, _ = _spec(tmp_path, share, endpoint="completions", extra="multi_turn = true")
    assert spec is None and "endpoint = chat" in diags[0].message
    spec, diags, _ = _spec(tmp_path, str(EXAMPLES / "prompts.txt"), endpoint="chat", extra="multi_turn = true")
    assert spec is None and any(d.code == "E419" and "multi_turn needs conversations" in d.message for d in diags)
    spec, diags, _ = _spec(tmp_path, share, endpoint="chat", extra="multi_turn = true")
    assert spec is not None, diags
    req = plan(spec).backends[0].levels[0].request
    assert req.to_json()["multi_turn_sessions"] == 2
    assert req.conversations[0][2] == ("user", "And its largest city?")


@pytest.mark.parametrize("one_line", [False, True])
async def test_a_session_sends_its_next_turn_with_the_history(tmp_path, one_line):
    """Concurrency 1 is one session: conversation a1 (two user turns), then a2 (system + user),
    then a1 again; each turn carries the turns before it (read back from the simulator). The
    same file written on one line (`json.dumps`) sends the same conversations."""
    data = EXAMPLES / "sharegpt.json"
    if one_line:
        data = tmp_path / "one-line.json"
        data.write_text(json.dumps(json.loads((EXAMPLES / "sharegpt.json").read_text())))
    path = tmp_path / "w.soak"
    path.write_text(_spec_text(str(data), "chat", "multi_turn = true", "400ms"))
    spec, diags, _ = load_spec(path)
    assert spec is not None, diags
    level = plan(spec).backends[0].levels[0]
    clock = RunClock()
    traces = tmp_path / "traces.jsonl"
    seq = iter(range(10**6))

    async with trio.open_nursery() as nursery:
        config = SimConfig(model="default", trace_log=False, trace_file=str(traces), ttft=0.002, itl=0.001, seed=1)
        port = await nursery.start(partial(sim.serve, config))
        ctx = LevelContext("sim", clock, partial(H11Connection, "127.0.0.1", port, clock), Shapes(level.request), lambda rs: None,
                           lambda: (i := next(seq), f"m-{i:07d}"))  # fmt: skip
        await drive_level(level, ctx)
        nursery.cancel_scope.cancel()
    rows = sorted((json.loads(line) for line in traces.read_text().splitlines()), key=lambda r: r["arrival_index"])
    assert len(rows) >= 4
    got = [(r["messages"], r["prompt_head"]) for r in rows[:4]]
    assert got == [
        (1, "What is the capital of Australia?"),
        (3, "And its largest city?"),
        (2, "Name two prime numbers above fifty."),
        (1, "What is the capital of Australia?"),
    ]


@pytest.mark.parametrize("n", [0, 10_000_001, 10**30])
def test_a_prompt_files_output_length_is_bounded_as_max_tokens_is(n):
    """`max_tokens_from_file`: a record's length is a count of one request's tokens, bounded
    as `max_tokens` is (10,000,000), never a pasted 30-digit number that `run` would send."""
    with pytest.raises(DatasetError, match="from 1 to 10,000,000"):
        parse_dataset(json.dumps({"prompt": "hi", "max_tokens": n}) + "\n", "jsonl", chat=False, lengths=True)
    ok = parse_dataset(json.dumps({"prompt": "hi", "max_tokens": 10_000_000}) + "\n", "jsonl", chat=False, lengths=True)
    assert ok.output_lens == (10_000_000,)


# ---------------------------------------------------------------- records, whatever the layout

SHAREGPT_RECORDS = [
    {"id": "a", "conversations": [{"from": "human", "value": "question a"}, {"from": "gpt", "value": "answer a"},
                                  {"from": "human", "value": "follow-up a"}]},
    {"id": "b", "conversations": [{"from": "system", "value": "be terse"}, {"from": "human", "value": "question b"}]},
]  # fmt: skip


def _layouts(records: list) -> dict[str, str]:
    """The same records as JSONL, a pretty-printed JSON array and a JSON array on one line."""
    return {
        "jsonl": "\n".join(json.dumps(r) for r in records) + "\n",
        "indented": json.dumps(records, indent=2),
        "one line": json.dumps(records),
    }


def test_a_one_line_array_keeps_every_record_and_its_conversation():
    """`json.dumps(records)` puts every record on line 1: each keeps its own conversation."""
    p = parse_dataset(json.dumps(SHAREGPT_RECORDS), None, chat=True, lengths=False, turns=True)
    assert p.prompts == ("question a", (("system", "be terse"), ("user", "question b")))
    assert p.conversations == (
        (("user", "question a"), ("assistant", "answer a"), ("user", "follow-up a")),
        (("system", "be terse"), ("user", "question b")),
    )


def test_a_one_line_array_reports_a_bad_record_at_its_column(tmp_path):
    bad = [SHAREGPT_RECORDS[0], {"conversations": [{"from": "human"}]}]
    text = json.dumps(bad)
    with pytest.raises(DatasetError, match="string 'from' and 'value'") as e:
        parse_dataset(text, None, chat=False, lengths=False)
    col = text.index('{"conversations": [{"from": "human"}]}') + 1
    assert (e.value.line, e.value.column) == (1, col)
    (tmp_path / "one.json").write_text(text)
    spec, diags, _ = _spec(tmp_path, "one.json")
    assert spec is None
    [in_file] = [d for d in diags if d.path == str(tmp_path / "one.json")]
    assert (in_file.code, in_file.span.line, in_file.span.column) == ("E419", 1, col)
    # a JSONL record's column is where its object starts
    with pytest.raises(DatasetError) as e:
        parse_dataset('{"prompt": "a"}\n   {"prompt": 3}\n', "jsonl", chat=False, lengths=False)
    assert (e.value.line, e.value.column) == (2, 4)


_turn_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_turn = st.fixed_dictionaries({"from": st.sampled_from(["human", "gpt", "system", "user", "assistant"]), "value": _turn_text})
_sharegpt_record = st.fixed_dictionaries({"conversations": st.lists(_turn, max_size=5)}, optional={"id": _turn_text})


@settings(max_examples=80, deadline=None)
@given(st.lists(_sharegpt_record, min_size=1, max_size=6), st.booleans())
def test_the_same_records_parse_the_same_whatever_the_layout(records, chat):
    """Property: JSONL, an indented array and a one-line array of the same ShareGPT records give
    the same dataset (prompts, lengths, conversations, skipped records) or the same error."""
    results = {}
    for layout, text in _layouts(records).items():
        try:
            p = parse_dataset(text, "sharegpt", chat=chat, lengths=False, turns=True)
            results[layout] = (p.format, p.prompts, p.output_lens, p.conversations, p.skipped)
        except DatasetError as e:
            results[layout] = ("error", e.message.split(" (first at")[0])
    assert results["indented"] == results["jsonl"] == results["one line"], results
    if results["jsonl"][0] == "sharegpt":  # every usable record is kept, in order
        assert len(results["jsonl"][3]) == len(records) - results["jsonl"][4]


# ---------------------------------------------------------------- records with nothing to send

SKIPPABLE = [
    {"id": "starts-with-gpt", "conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"}]},
    {"id": "empty", "conversations": []},
    {"id": "good", "conversations": [{"from": "human", "value": "usable question"}, {"from": "gpt", "value": "one two"}]},
    {"id": "system-only", "conversations": [{"from": "system", "value": "s"}]},
    {"id": "empty-human", "conversations": [{"from": "human", "value": ""}]},
]  # fmt: skip


def test_records_without_a_human_turn_to_send_are_skipped_and_counted():
    for text in _layouts(SKIPPABLE).values():
        p = parse_dataset(text, None, chat=True, lengths=True, turns=True)
        assert (p.format, p.prompts, p.output_lens, p.skipped) == ("sharegpt", ("usable question",), (2,), 4)
        assert p.conversations == ((("user", "usable question"), ("assistant", "one two")),)


def test_a_file_with_no_usable_record_is_still_an_error_at_the_first_record():
    text = json.dumps([SKIPPABLE[0], SKIPPABLE[1]], indent=2)
    with pytest.raises(DatasetError, match="no usable ShareGPT record.*2 records.*human turn") as e:
        parse_dataset(text, None, chat=False, lengths=False)
    assert (e.value.line, e.value.column) == (2, 3)
    with pytest.raises(DatasetError, match="'conversations', a list"):  # malformed records are still errors
        parse_dataset('[{"conversations": "hi"}, ' + json.dumps(SKIPPABLE[2]) + "]", None, chat=False, lengths=False)


def test_check_and_plan_warn_how_many_records_were_skipped(tmp_path):
    data = tmp_path / "sg.json"
    data.write_text(json.dumps(SKIPPABLE, indent=2))
    spec, diags, text = _spec(tmp_path, "sg.json", endpoint="chat", extra="multi_turn = true")
    assert spec is not None, diags
    [w] = [d for d in diags if d.code == "W510"]
    assert w.severity is Severity.WARNING and w.path.endswith("w.soak") and w.span.line == 12
    assert "4 of 5 records" in w.message and f"{data}:2:3" in w.message
    assert "W510" in render_text(diags, {str(tmp_path / "w.soak"): text})
    req = plan(spec).backends[0].levels[0].request
    assert req.prompts == ("usable question",) and req.to_json()["multi_turn_sessions"] == 1
    data.write_text(json.dumps(SKIPPABLE[2:3]))  # nothing skipped: no warning
    spec, diags, _ = _spec(tmp_path, "sg.json", endpoint="chat")
    assert spec is not None and diags == []


def test_a_symlinked_specs_prompt_file_is_the_one_plan_names(tmp_path):
    """A spec reached through a symlink in another folder: `check` read the prompt file beside
    the link while `plan` (and the manifest) named the one beside the spec's real file, with the
    other file's sha256 -- the prompts sent were not the file the plan showed. Relative paths are
    the real spec file's folder's, for prompt files as for every other path the plan resolves."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").mkdir()
    (tmp_path / "real" / "p.txt").write_text("the real folder's prompt\n")
    (tmp_path / "link" / "p.txt").write_text("the link folder's prompt\n")
    (tmp_path / "real" / "w.soak").write_text(_spec_text("p.txt"))
    (tmp_path / "link" / "w.soak").symlink_to(tmp_path / "real" / "w.soak")
    spec, diags, _ = load_spec(tmp_path / "link" / "w.soak")
    assert spec is not None, diags
    req = plan(spec).backends[0].levels[0].request
    assert req.prompt_file == str((tmp_path / "real" / "p.txt").resolve())
    assert req.prompts == ("the real folder's prompt",)


@pytest.mark.parametrize(("raw", "where"), [
    ("naïve café ".encode() + b"\xe9tude\n", (1, 12)),  # 11 characters, 13 bytes, before the bad byte
    (b"first\nok\n\xe2\x82\xac \xff\n", (3, 3)),
    (b"\xef\xbb\xbfab\xff\n", (1, 3)),  # the BOM is not part of the file's text: no column
])
def test_a_non_utf8_prompt_file_is_reported_at_the_character_an_editor_shows(tmp_path, raw, where):
    """The column of the first bad byte counted bytes (a line's earlier é or € two and three
    columns, a BOM three), so `p.txt:1:14` pointed past the byte; a spec's E003 counts characters."""
    from soakspec.lang.datasets import read_dataset

    (tmp_path / "p.txt").write_bytes(raw)
    with pytest.raises(DatasetError, match="not UTF-8") as e:
        read_dataset(str(tmp_path / "p.txt"), None, chat=False, lengths=False)
    assert (e.value.line, e.value.column) == where


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": ""}],
    [{"role": "system", "content": "be brief"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": ""}],
])
@pytest.mark.parametrize("turns", [False, True])
def test_a_messages_record_with_no_non_empty_user_message_is_an_error_at_its_line(messages, turns):
    """`"prompt": ""` is an error and a ShareGPT record with an empty human turn is skipped, but
    a `messages` record whose user message was empty (or absent: a system prompt alone) was
    taken and sent as it was, a request with nothing to answer counted as a prompt."""
    text = '{"messages": [{"role": "user", "content": "fine"}]}\n' + json.dumps({"messages": messages}) + "\n"
    with pytest.raises(DatasetError, match="non-empty 'user' message") as e:
        parse_dataset(text, None, chat=True, lengths=False, turns=turns)
    assert e.value.line == 2


def test_a_text_file_that_starts_with_a_bracket_is_told_how_to_be_read_as_text():
    """Llama-style prompts (`[INST] ... [/INST]`) start with '[', so the file is detected as a
    JSON array: the error said only "is not valid JSON: Expecting value", where a file starting
    with '{' says to set prompt_format = text. Declared, it is text."""
    text = "[INST] Say hello [/INST]\n[INST] Count to three [/INST]\n"
    with pytest.raises(DatasetError, match="is not valid JSON.*prompt_format = text") as e:
        parse_dataset(text, None, chat=False, lengths=False)
    assert (e.value.line, e.value.column) == (1, 2)
    assert parse_dataset(text, "text", chat=False, lengths=False).prompts == ("[INST] Say hello [/INST]", "[INST] Count to three [/INST]")
    with pytest.raises(DatasetError, match="not valid JSON") as e:  # declared JSON: no hint to read it as text
        parse_dataset(text, "jsonl", chat=False, lengths=False)
    assert "prompt_format" not in e.value.message


def test_a_large_pretty_printed_json_array_is_read_in_linear_time():
    """Each record's line was counted from the file's start, so a pretty-printed array (the form
    ShareGPT dumps come in) took quadratic time: 40,000 records (24 MB) kept `check` busy for
    minutes, a 64 MiB file for about an hour. Counted on as the reader goes, 20,000 records
    take a fraction of a second (the bound leaves a wide margin for a loaded machine); every
    record keeps its own line."""
    import time

    recs = [{"conversations": [{"from": "human", "value": f"q{i} " + "word " * 40}, {"from": "gpt", "value": "a " * 40}]}
            for i in range(20_000)]  # fmt: skip
    text = json.dumps(recs, indent=1)
    t = time.perf_counter()
    p = parse_dataset(text, None, chat=False, lengths=False)
    assert time.perf_counter() - t < 4.0
    assert len(p.prompts) == 20_000 and p.prompts[-1].startswith("q19999 ")
    lines = text.split("\n")
    bad = "\n".join(lines[:-1] + ["  ,]"])  # a syntax error on the last line, after every record
    with pytest.raises(DatasetError) as e:
        parse_dataset(bad, None, chat=False, lengths=False)
    assert e.value.line == len(lines)
    recs[-1]["conversations"] = {}  # a bad last record: reported where it starts
    text = json.dumps(recs, indent=1)
    with pytest.raises(DatasetError, match="a list of") as e:
        parse_dataset(text, None, chat=False, lengths=False)
    assert (e.value.line, e.value.column) == (text[: text.rindex("\n {") + 1].count("\n") + 1, 2)
