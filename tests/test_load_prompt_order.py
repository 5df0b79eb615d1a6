"""The same seed gives the same prompts: the k-th request of a level gets the level's prompt k
(`Shapes.make(k)`), whatever the backend sent before it (an earlier closed-loop level's count
varies run to run) and on every backend of a spec; request ids stay the backend's own unique
sequence. With `--workers N` (each process a part p of N of the level) an open-loop arrival still
gets its place in the schedule, and a closed loop's k-th request to start gets prompt k whichever
process starts it (the level's shared count, `ids.SharedCount`).
Driven in virtual time (`trio.testing.MockClock`, tests/test_load_shapes.py's fake server).
"""

from __future__ import annotations

from collections import Counter

import pytest
import trio
import trio.testing

from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence, SharedCount
from soakspec.runner.load import WORDS, LevelContext, Shapes, drive_level
from soakspec.runner.records import RequestRecord
from test_load_shapes import Server, levels_of

OPEN = "mode = open\n rate = [20rps]\n arrival = poisson\n seed = 11"
CLOSED = "mode = closed\n concurrency = [3]"
PROMPTS = " prompt_words = 4\n max_tokens = [5, 6, 7]"


def level(load: str, duration: str = "2s", warmup: str = "500ms"):
    (lv,) = levels_of(load, extra=f"bucket = 1s\n duration = {duration}\n warmup = {warmup}\n{PROMPTS}")
    return lv


def drive_levels(levels, ids: IdSequence, latency: float = 0.05):
    """Drive `levels` one after another on one backend (one id sequence), as the runner does;
    per level: [(offset of the intended or actual start from the level's start, request id,
    prompt, max_tokens)] in send order."""

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=1000.0)
        out = []
        for lv in levels:
            server = Server(clock, latency)
            records: list[RequestRecord] = []
            run = await drive_level(lv, LevelContext("a", clock, server.connect, Shapes(lv.request), records.extend, ids))
            out.append(_sent(records, server, run.started_at))
        return out

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _sent(records, server, t0: float):
    # the fake server appends each shape as `send` is called, in the order the records were made
    by_send = sorted(records, key=lambda r: (r.start, r.request_id))
    assert len(by_send) == len(server.shapes)
    starts = [s for s, _ in server.starts]
    assert starts == sorted(starts)
    return [(round((r.intended_start if r.intended_start is not None else r.start) - t0, 9), r.request_id, s.prompt, s.max_tokens)
            for r, s in zip(by_send, server.shapes)]


def test_an_open_level_sends_the_same_prompts_whatever_the_backend_sent_before():
    """A closed-loop level before an open-loop one (its count depends on the server's speed): the
    open level's k-th arrival gets the same prompt and max_tokens as when it runs first, on a
    fast and a slow backend alike; the arrival times are the seed's; the ids go on after the
    backend's earlier requests, unique."""
    alone = drive_levels([level(OPEN)], IdSequence("b0"))[0]
    fast = drive_levels([level(CLOSED), level(OPEN)], IdSequence("b0"), latency=0.03)
    slow = drive_levels([level(CLOSED), level(OPEN)], IdSequence("b1"), latency=0.07)
    assert len(fast[0]) != len(slow[0])  # the closed-loop levels sent different counts
    want = [(t, p, m) for t, _, p, m in alone]
    for run in (fast, slow):
        got = [(t, p, m) for t, _, p, m in run[1]]
        assert got == want
    assert [m for *_, m in want][:6] == [5, 6, 7, 5, 6, 7]  # the level's own cycle, from its first request
    ids = [i for run in (fast, slow) for lv in run for _, i, _, _ in lv]
    assert len(set(ids)) == len(ids)
    assert fast[1][0][1] == f"b0-{len(fast[0]):07d}"  # the backend's sequence continues


def test_a_closed_level_sends_its_kth_request_with_the_kth_prompt():
    """Closed loop: the requests of a level, in the order they start, get the level's prompts
    0, 1, 2, ... whatever the backend's id sequence had reached."""
    fresh = drive_levels([level(CLOSED)], IdSequence("x"))[0]
    later = drive_levels([level(OPEN), level(CLOSED)], IdSequence("x"))[1]
    shapes = Shapes(level(CLOSED).request)
    for run in (fresh, later):
        assert [(p, m) for _, _, p, m in run] == [(shapes.make(k).prompt, shapes.make(k).max_tokens) for k in range(len(run))]
    assert later[0][1] != fresh[0][1]  # ids differ: the backend's own sequence


def test_workers_take_a_multi_turn_files_conversations_in_turn_whatever_their_speed(tmp_path):
    """Two conversations and `--workers 2`, one process three times slower: each process
    numbered its conversations j·2 + p for itself, so process 0 only ever ran conversation 1 and
    process 1 conversation 2, and the faster one's made most of the level. Claimed from the
    level's count, the sessions begin the file's conversations in turn (1, 2, 1, 2, ... as claimed):
    as many of each, and each process runs both."""
    lv = _multi_turn_level(tmp_path, conversations=2, duration="4s", concurrency=2)
    split = _drive_parts(lv, 2, first=0, latency=0.05, slower=3.0)
    begun = [p.split(" ")[0] for _, _, p, _ in sorted(x for run in split for x in run) if p.endswith("q1")]
    assert len(begun) > 10
    assert abs(begun.count("c0") - begun.count("c1")) <= 1, (begun.count("c0"), begun.count("c1"))
    for run in split:  # each process ran both conversations
        assert {p.split(" ")[0] for _, _, p, _ in run} == {"c0", "c1"}


def _multi_turn_level(tmp_path, conversations: int, duration: str, concurrency: int):
    """The one level of a multi-turn chat workload over a ShareGPT file of `conversations`
    two-turn conversations ("c<i> q1", an answer, "c<i> q2"), closed loop at `concurrency`."""
    import json

    from soakspec.lang import load_spec
    from soakspec.plan import plan
    from specs import one_workload_spec

    convs = [{"conversations": [{"from": "human", "value": f"c{i} q1"}, {"from": "gpt", "value": "a"},
                                {"from": "human", "value": f"c{i} q2"}]} for i in range(conversations)]  # fmt: skip
    (tmp_path / "sg.json").write_text(json.dumps(convs))
    before = 'endpoint = chat\n  prompt_file = "sg.json"\n  multi_turn = true\n  max_tokens = 4'
    after = f"duration = {duration}\n  bucket = 1s\n  deadline = 5s\n  follow_up = false"
    (tmp_path / "w.soak").write_text(one_workload_spec(name="mt", issue="1", before_load=before,
                                                       load=f"mode = closed\n    concurrency = [{concurrency}]", after_load=after))  # fmt: skip
    spec, diags, _ = load_spec(tmp_path / "w.soak")
    assert spec is not None, diags
    (lv,) = plan(spec).backends[0].levels
    return lv


def _drive_parts(lv, parts: int, first: int, latency: float = 0.05, slower: float = 1.0):
    """The level split over `parts` processes as `--workers` splits it (runner/workers.py): one
    shared start, process p gets `part=(p, parts)`, the id sequence's share p (the backend's
    sequence at `first`) and, closed loop, the level's shared count (one file, each process its
    own `SharedCount` on it). Process p's requests take `latency · slower**p`."""

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=1000.0)
        ids = IdSequence("w", first=first)
        shares = [ids.share(p, parts) for p in range(parts)]
        count = SharedCount.create() if lv.concurrency is not None and parts > 1 else None
        t0 = clock.now() + 0.1
        got: list[list] = [[] for _ in range(parts)]

        async def part(p: int) -> None:
            server = Server(clock, latency * slower**p)
            records: list[RequestRecord] = []
            mine = None if count is None else SharedCount(count.path)
            claim = None if mine is None else mine.claim
            shapes = Shapes(lv.request, claim_conversation=None if mine is None else (lambda: mine.claim(1)))
            ctx = LevelContext("a", clock, server.connect, shapes, records.extend, shares[p], t0=t0,
                               part=(p, parts), claim=claim)  # fmt: skip
            await drive_level(lv, ctx)
            got[p] = _sent(records, server, t0)

        try:
            async with trio.open_nursery() as n:
                for p in range(parts):
                    n.start_soon(part, p)
        finally:
            if count is not None:
                count.remove()
        return got

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("parts", [2, 3])
def test_workers_split_an_open_level_without_changing_its_prompts(parts):
    lv = level(OPEN)
    (one,) = _drive_parts(lv, 1, first=0)
    split = _drive_parts(lv, parts, first=123)  # after 123 requests of earlier levels
    assert sorted((t, p, m) for run in split for t, _, p, m in run) == sorted((t, p, m) for t, _, p, m in one)
    assert all(run for run in split)  # every process sent its share
    ids = [i for run in split for _, i, _, _ in run]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("parts", [2, 3])
def test_a_closed_level_split_over_processes_sends_its_kth_request_with_the_kth_prompt(parts):
    """Closed loop over `parts` processes, each slower than the one before: the level's requests,
    in the order they start across all processes, get the level's prompts and max_tokens 0, 1,
    2, ... as with one process. Each process counted for itself (p, p + N, ...): with
    max_tokens = [5, 6, 7] over 3 processes each sent one value only, and the fastest's most."""
    lv = level(CLOSED)
    shapes = Shapes(lv.request)
    split = _drive_parts(lv, parts, first=41, slower=2.0)
    assert all(split), "every process sent"
    index = {shapes.make(k).prompt: k for k in range(len(WORDS))}  # a word prompt names its index (mod 198)
    sent = sorted((t, index[pr], i, mt) for run in split for t, i, pr, mt in run)
    assert len(sent) < len(WORDS)
    # the prompts 0 .. K-1, each once, in the order the requests started (simultaneous ones in any order)
    assert [k for _, k, _, _ in sent] == list(range(len(sent)))
    assert [mt for *_, mt in sent] == [shapes.make(k).max_tokens for k in range(len(sent))]
    for run in split:  # each process sends from the whole list, not a fixed part of it
        assert len({mt for *_, mt in run}) > 1
    mix = Counter(mt for *_, mt in sent)
    assert max(mix.values()) - min(mix.values()) <= 1, mix
    ids = [i for _, _, i, _ in sent]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_no_word_prompt_is_sent_twice_and_each_starts_with_its_request_id(endpoint):
    """The vocabulary repeats every len(WORDS) requests, so its words alone made request k and
    k + 198 the same prompt -- a prefix cache (vLLM's is on by default) served all but the
    first 198 of a level whole, and every level again. The body each request sends starts its
    prompt with its own id: 600 requests, 600 prompts, and the shapes are still made once."""
    import json

    from soakspec.runner.load import WORDS, prompt_words
    from soakspec.runner.protocol import build_body

    extra = f"bucket = 1s\n duration = 2s\n prompt_words = 4\n endpoint = {endpoint}"
    (lv,) = levels_of("mode = closed\n concurrency = [1]", extra=extra)
    shapes = Shapes(lv.request)
    prompts = []
    for k in range(600):
        body = json.loads(build_body(shapes.make(k), f"soak-5ca1ab1e-0-{k:07d}"))
        text = body["prompt"] if endpoint == "completions" else body["messages"][-1]["content"]
        assert text.split(" ")[0] == body["request_id"] == f"soak-5ca1ab1e-0-{k:07d}"
        prompts.append(text)
    assert len(set(prompts)) == 600
    assert prompts[0].split(" ")[1:] == prompts[len(WORDS)].split(" ")[1:] == prompt_words(0, 4).split(" ")[1:]
    assert shapes.make(0) is shapes.make(len(WORDS))  # one shape (and one body template) per index mod len(WORDS)


def test_workers_split_multi_turn_sessions_over_distinct_conversations(tmp_path):
    """`multi_turn = true` with `--workers 2`: each process numbered its conversations from 0,
    so both ran conversations 0 and 1 at once (the same prompts twice, a prefix cache's gift)
    and conversations 2 and 3 never ran. Split, the sessions start on the conversations one
    process starts: each exactly once, every turn sent after its own conversation's earlier ones."""
    lv = _multi_turn_level(tmp_path, conversations=8, duration="1s", concurrency=4)
    (one,) = _drive_parts(lv, 1, first=0, latency=0.3)
    split = _drive_parts(lv, 2, first=0, latency=0.3)
    for runs in ([one], split):
        firsts = [p for run in runs for _, _, p, _ in run if p.endswith("q1")]
        assert sorted(firsts) == sorted(set(firsts))  # no conversation started twice
        for run in runs:
            sent = [p for _, _, p, _ in run]
            assert all(sent.index(p.replace("q2", "q1")) < sent.index(p) for p in sent if p.endswith("q2"))
    assert sorted(p for run in split for _, _, p, _ in run) == sorted(p for _, _, p, _ in one)  # the same 4 sessions' turns
