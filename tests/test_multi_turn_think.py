"""`think_time` between a multi-turn session's turns, as real users, k6 scripts' `sleep()` and
vLLM's multi-turn benchmark wait: after turn k's answer the session waits before it sends turn
k + 1 (not between conversations).

What a user sees: turns of one session separated by at least the think time (from the records'
end and start), no latency that includes it, a fixed or a seeded range of waits drawn per
conversation and turn, the checker's errors, the plan's line, and a real run on the simulator
whose client health passes -- a thinking session is not a request the client failed to keep in
flight (judge/validity.py leaves the thinking sessions out of the offered concurrency)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner_support import new_marker, read_jsonl, run_soakspec, run_spec
from soakspec import draws
from soakspec.lang import fmt, load_spec, parse
from soakspec.plan import plan
from soakspec.plan import render_text as render_plan
from soakspec.report.common import workload_line
from specs import one_workload_spec
from test_load_shapes import run_virtual

CONVS, TURNS = 4, 3


def _write(tmp_path: Path, think: str, load: str = "mode = closed\n    concurrency = [2]",
           after: str = "duration = 3s\n  bucket = 1s\n  deadline = 5s\n  follow_up = false", multi: bool = True) -> Path:
    convs = [{"conversations": [m for t in range(1, TURNS + 1) for m in
                                ({"from": "human", "value": f"c{i} q{t}"}, {"from": "gpt", "value": "an answer"})]}
             for i in range(CONVS)]  # fmt: skip
    (tmp_path / "sg.json").write_text(json.dumps(convs))
    before = 'endpoint = chat\n  prompt_file = "sg.json"\n  max_tokens = 4' + ("\n  multi_turn = true" if multi else "")
    before += f"\n  think_time = {think}" if think else ""
    path = tmp_path / "t.soak"
    path.write_text(one_workload_spec(name="think", issue="1", before_load=before, load=load, after_load=after))
    return path


def _level(tmp_path: Path, think: str, **kw):
    spec, diags, _ = load_spec(_write(tmp_path, think, **kw))
    assert spec is not None, diags
    (lv,) = plan(spec).backends[0].levels
    return lv


def _sessions(records):
    """Per worker, its records in start order."""
    out: dict[int, list] = {}
    for r in sorted(records, key=lambda r: r.start):
        out.setdefault(r.worker, []).append(r)
    return out


# ---------------------------------------------------------------- in virtual time


def test_a_sessions_next_turn_waits_the_think_time_and_no_latency_includes_it(tmp_path):
    lv = _level(tmp_path, "500ms")
    _, records, server = run_virtual(lv, latency=0.05)
    assert all(r.end - r.start == pytest.approx(0.05) for r in records)  # the server's time alone
    waits = firsts = 0
    for mine in _sessions(records).values():
        for a, b in zip(mine, mine[1:]):
            if b.turn == 1:  # a new conversation starts at once
                assert b.conversation != a.conversation or a.turn == TURNS
                assert b.start - a.end < 0.01
                firsts += 1
            else:
                assert (b.conversation, b.turn) == (a.conversation, a.turn + 1)
                assert b.start - a.end >= 0.5 - 1e-9
                waits += 1
    assert waits >= 4 and firsts >= 1
    # never more in flight than sessions; fewer while they think
    assert max(n for _, n in server.starts) <= 2


def test_a_range_of_think_times_is_drawn_per_conversation_and_turn_from_the_seed(tmp_path):
    lv = _level(tmp_path, "[200ms, 900ms]", load="mode = closed\n    concurrency = [2]\n    seed = 4")
    assert lv.request.think_time == (0.2, 0.9) and lv.request.think_seed == 4
    _, records, _ = run_virtual(lv, latency=0.05)
    gaps = []
    for mine in _sessions(records).values():
        for a, b in zip(mine, mine[1:]):
            if b.turn > 1:
                want = draws.think_s(0.2, 0.9, 4, b.conversation, b.turn)
                assert 0.2 <= want <= 0.9
                assert b.start - a.end == pytest.approx(want, abs=1e-6)
                gaps.append(want)
    assert len(set(gaps)) > 1  # drawn, not one fixed wait
    _, again, _ = run_virtual(lv, latency=0.05)  # the same waits in another run
    assert sorted((r.start, r.conversation, r.turn) for r in again) == sorted((r.start, r.conversation, r.turn) for r in records)


def test_a_think_time_past_the_levels_end_sends_nothing_after_it(tmp_path):
    lv = _level(tmp_path, "10s", after="duration = 2s\n  bucket = 1s\n  deadline = 5s\n  follow_up = false")
    run, records, _ = run_virtual(lv, latency=0.05)
    assert {r.turn for r in records} == {1}  # each session's first turn, then a wait past the end
    assert run.drained_at - run.measure_end < 0.01  # the level ends on time: no session sleeps past it


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**63 - 1), st.lists(st.tuples(st.integers(1, 10**9), st.integers(2, 10**6)), min_size=1, max_size=20))
def test_the_judges_vectorized_draw_is_the_runners(seed, pairs):
    """The judge re-derives each turn's think time over columns; it equals the runner's draw."""
    conv, turn = np.array([c for c, _ in pairs]), np.array([t for _, t in pairs])
    assert draws.think_fraction_array(seed, conv, turn).tolist() == [draws.think_fraction(seed, c, t) for c, t in pairs]


# ---------------------------------------------------------------- check, fmt, plan, report


@pytest.mark.parametrize("think, multi, code, says", [
    ("2s", False, "E403", "'think_time' waits between a multi-turn session's turns"),
    ("[5s, 1s]", True, "E204", "one duration or a range [low, high]"),
    ("[1s, 2s, 3s]", True, "E204", "one duration or a range [low, high]"),
    ("2h", True, "E204", "'think_time' must be at most"),
])  # fmt: skip
def test_check_refuses_a_think_time_it_cannot_apply(tmp_path, think, multi, code, says):
    spec, diags, _ = load_spec(_write(tmp_path, think, multi=multi))
    assert spec is None
    found = [d for d in diags if d.code == code]
    assert found and says in found[0].message, diags
    if code == "E403":
        assert "multi_turn = true" in found[0].hint


def test_think_time_keeps_its_text_through_fmt(tmp_path):
    for think in ("2s", "[1s, 5s]", "[250ms, 1.5s]"):
        text = _write(tmp_path, think).read_text()
        tree, diags = parse(text)
        assert not diags
        assert f"think_time = {think}" in fmt(tree) and parse(fmt(tree))[0] == tree


def test_the_plan_the_manifest_and_the_report_state_the_think_time(tmp_path):
    spec, diags, _ = load_spec(_write(tmp_path, "[1s, 5s]", load="mode = closed\n    concurrency = [2]\n    seed = 3"))
    assert spec is not None, diags
    text = render_plan(plan(spec))
    assert "w think time: after a turn's answer each session waits 1s-5s (drawn uniformly per conversation and turn, seed 3)" in text
    entry = plan(spec).backends[0].levels[0].to_json()
    assert (entry["think_time"], entry["think_seed"]) == ([1.0, 5.0], 3)
    assert "think_time=1s-5s(seed=3)" in workload_line(spec.workloads[0])
    spec, _, _ = load_spec(_write(tmp_path, "2s"))
    assert "think_time=2s" in workload_line(spec.workloads[0]) and "seed" not in workload_line(spec.workloads[0])
    spec, _, _ = load_spec(_write(tmp_path, ""))
    assert "think time" not in render_plan(plan(spec)) and "think_time" not in plan(spec).backends[0].levels[0].to_json()


# ---------------------------------------------------------------- a real run on the simulator


def test_a_run_with_think_time_passes_client_health_and_keeps_it_out_of_every_latency(tmp_path):
    """Two sessions, 400 ms between turns, ~80 ms a turn on the simulator: most of the time a
    session is thinking, so the requests in flight are well under the two sessions -- read as
    the client's saturation before, INCONCLUSIVE. The thinking sessions are not offered: the
    gate passes, client health included."""
    text = _write(tmp_path, "400ms").read_text()
    proc, out = run_spec(tmp_path, text)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [r for r in read_jsonl(out / "backends" / "sim" / "requests.jsonl.gz") if r["bucket"] >= 0]
    waited = 0
    for w in {r["worker"] for r in rows}:
        mine = sorted((r for r in rows if r["worker"] == w), key=lambda r: r["start"])
        for a, b in zip(mine, mine[1:]):
            if b["turn"] > 1:
                assert b["start"] - a["end"] >= 0.4
                waited += 1
    assert waited >= 4
    assert max(r["end"] - r["start"] for r in rows) < 0.4  # no latency holds a think time
    verdict = json.loads((out / "verdict.json").read_text())
    (health,) = [r for r in verdict["rules"] if r["rule"] == "client_healthy"]
    assert health["status"] == "pass", health
    buckets = json.loads((out / "results.json").read_text())["backends"][0]["buckets"]
    clients = [b["client"] for b in buckets if b.get("client")]
    assert clients and all(c["thinking"] > 0 for c in clients)
    for c in clients:
        assert c["offered"] == pytest.approx(2 - c["thinking"])
        assert c["achieved"] < 0.75 * 2  # against both sessions it would read as a saturated client
    # the think time the judge leaves out of the offer is the one the judging spec plans: a
    # manifest whose think time the spec does not plan (edited, or another spec) is another level
    other = tmp_path / "other"
    other.mkdir()
    no_think = _write(other, "")
    proc = run_soakspec(["gate", str(out), "--spec", str(no_think)], new_marker(), tmp_path)
    assert proc.returncode == 3, proc.stdout
    assert 'think_time [0.4, 0.4] seed 0 (the spec plans none seed 0)' in proc.stdout, proc.stdout
