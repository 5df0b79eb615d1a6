"""A step of the client machine's wall clock during a run is not the server's failure.

The run's times are the run clock's (monotonic, anchored to the wall clock once); a server
stamps its traces by its wall clock. After a step of 10 s every later trace lies 10 s off its
request's window, and a trace window of 5 s called each "outside_window": trace coverage FAILed
for the client machine's clock. The run now records the wall clock less the run clock once a
second (client.jsonl `wall_step_s`), and matching places a trace across a recorded step -- and
only across one that was recorded, by the amount recorded.
"""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from soakspec.cli import main
from soakspec.evidence import schema
from soakspec.evidence.traces import MAX_WALL_STEPS, WallSteps, first_fit, wall_steps
from soakspec.judge import judge
from soakspec.judge.testing import EvidenceBuilder, T0, small_spec
from soakspec.runner.clienthealth import ClientLog, LoopMonitor
from soakspec.runner.clock import RunClock

STEP_AT = T0 + 60.0  # the wall clock stepped as the second bucket began
STEP_S = 10.0
RULE = "trace_coverage >= 100% per bucket"


def test_the_run_clock_measures_the_wall_clocks_step_and_a_virtual_one_none():
    assert abs(RunClock().wall_step()) < 0.05  # the machine's clocks, read a moment apart
    now, stepped = [100.0], [0.0]
    clock = RunClock(timer=lambda: now[0], epoch=T0, wall=lambda: T0 + now[0] - 100.0 + stepped[0])
    assert clock.wall_step() == 0.0
    now[0], stepped[0] = 160.0, -3.25  # stepped back a minute later
    assert clock.wall_step() == -3.25
    assert RunClock(timer=lambda: 5.0, epoch=1000.0).wall_step() is None  # a virtual clock (MockClock)


def test_the_loop_monitor_records_the_step_in_each_window_and_the_log_keeps_the_steps(tmp_path):
    """client.jsonl's rows carry `wall_step_s` (valid under its schema); ClientLog keeps the
    distinct steps, which collect's trace matching reads."""
    log = ClientLog(tmp_path / "client.jsonl")

    async def run():
        clock = RunClock(timer=trio.current_time, epoch=T0,
                         wall=lambda: clock.now() + (STEP_S if trio.current_time() > 2.5 else 0.0) + 2e-6)
        async with trio.open_nursery() as n:
            n.start_soon(LoopMonitor(clock, log.write, backend="a", window_s=1.0).run)
            await trio.sleep(4.5)
            n.cancel_scope.cancel()

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "client.jsonl").read_text().splitlines()]
    assert [r["wall_step_s"] for r in rows] == [2e-6, 2e-6, 10.000002, 10.000002, 10.000002]
    assert all(not schema.validate("client", r) for r in rows)
    assert log.steps.steps() == (10.0,)  # to the millisecond; the microseconds of two reads are no step


def test_steps_are_told_apart_to_the_millisecond_most_often_recorded_first_and_bounded():
    assert wall_steps([None, 0.0, 4e-4, -4e-4, float("nan"), float("inf"), True, "10", 10**400, 1e308, -1e308]) == ()
    assert wall_steps([10.0002, 9.9996, 10.0, -2.0, -2.0, -2.0]) == (-2.0, 10.0)
    acc = WallSteps()
    for k in range(1, 40):
        acc.add(float(k))
    assert len(acc.steps()) == MAX_WALL_STEPS and acc.steps()[0] == 1.0  # ties: the smaller step first


def test_a_trace_fits_its_window_as_stamped_or_across_one_recorded_step():
    w = [(0, (4.0, 7.0))]
    assert first_fit((5.0, 6.0), w) == (0, 0.0)
    assert first_fit((15.0, 16.0), w) == (None, 0.0)
    assert first_fit((15.0, 16.0), w, (3.0, 10.0)) == (0, 10.0)
    assert first_fit((15.0, 26.0), w, (10.0, 20.0)) == (None, 0.0)  # no one step places every time
    assert first_fit((), w) == (0, 0.0) and first_fit((5.0,), [(0, None)]) == (None, 0.0)
    # the steps in their order, a candidate of each (as the judge's vectorized matching takes them):
    # candidate 1 fits across the first step, candidate 0 only across the second
    two = [(0, (14.0, 15.0)), (1, (4.0, 7.0))]
    assert first_fit((15.5,), two, (10.0, 1.0)) == (1, 10.0)


def _stepped_run(record: float | None) -> EvidenceBuilder:
    """A clean run whose server stamped every trace from STEP_AT on STEP_S late; its client
    samples record `record` as the step from then (None: no wall_step_s, as before it was
    measured)."""
    spec = small_spec(f"require {RULE}", mode="open", levels="[2rps]")  # open loop: sparse records are no saturated client
    b = EvidenceBuilder(spec).with_client()
    late = 0
    for row in b.traces["a"]:
        if row["times"][0] >= STEP_AT:
            row["times"] = [t + STEP_S for t in row["times"]]
            row["payload"]["queued"] += STEP_S
            late += 1
    assert 0 < late < len(b.traces["a"])
    for row in b.client["a"]:
        if record is not None:
            row["wall_step_s"] = (record if row["t"] > STEP_AT else 0.0) + 3e-6
    return b


def _coverage(v):
    return next(r for r in v.rules if r.rule == RULE)


def test_traces_stamped_after_a_recorded_step_cover_their_requests():
    b = _stepped_run(STEP_S)
    r = _coverage(judge(b.spec, b.build()))
    assert r.status == "pass", r.message
    assert "matched across a step of the machine's wall clock that client.jsonl records (+10.000 s)" in r.message


@pytest.mark.parametrize("record", [None, 0.0, 4.0, -STEP_S])
def test_without_that_step_on_record_the_late_traces_stay_outside(record):
    """No step recorded, none, or another one: the traces 10 s off are outside their windows,
    as before -- a step is never guessed from the traces themselves."""
    b = _stepped_run(record)
    r = _coverage(judge(b.spec, b.build()))
    assert r.status == "fail" and "matched across" not in r.message, r.message


def test_gate_reads_the_step_from_client_jsonl_on_disk(tmp_path, capsys):
    """Written as `soakspec run` writes evidence (client.jsonl validated by its schema on read)
    and judged by `gate` from the directory: exit 0, the step named in the rule's message."""
    b = _stepped_run(STEP_S)
    ev = b.write(tmp_path / "ev")
    spec_path = tmp_path / "s.soak"
    spec_path.write_text(b.spec.canonical_text)
    assert main(["gate", str(ev), "--spec", str(spec_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (rule,) = [r for r in out["rules"] if r["rule"] == RULE]
    assert rule["status"] == "pass" and "(+10.000 s)" in rule["message"]
    unrecorded = _stepped_run(None).write(tmp_path / "old")
    assert main(["gate", str(unrecorded), "--spec", str(spec_path), "--format", "json"]) == 1


@pytest.mark.parametrize("recorded", [True, False])
def test_a_real_soak_after_a_step_is_traced_across_it(tmp_path, monkeypatch, recorded):
    """A real soak of the simulator (a server subprocess stamping traces by the machine's wall
    clock) whose run clock reads 10 s behind the wall clock -- what a step of +10 s leaves. The
    run records the step and both matchers place every trace across it: the run's own
    traces.jsonl rows and the judge's trace_coverage. With the step not on record (a clock that
    cannot read the wall clock), every trace is outside its window and coverage fails, as
    before."""
    import time

    from runner_support import sim_spec

    from soakspec.evidence import layout
    from soakspec.evidence.io import iter_jsonl
    from soakspec.judge import load_evidence
    from soakspec.lang import load_spec
    from soakspec.plan import plan
    from soakspec.runner import engine

    wall = time.time if recorded else None
    monkeypatch.setattr(engine, "RunClock", lambda: RunClock(epoch=time.time() - STEP_S, wall=wall))
    from soakspec.runner.progress import Progress

    said: list[str] = []
    monkeypatch.setattr(Progress, "log", lambda self, text: said.append(text))
    spec_path = tmp_path / "s.soak"
    spec_path.write_text(sim_spec(sim="ttft = 5ms\n    itl = 1ms", duration="2s", bucket="1s", follow_up=False,
                                  gate="require failed == 0\n  require trace_coverage >= 100% per bucket"))
    spec, diags, _ = load_spec(spec_path)
    assert spec is not None, diags
    out = tmp_path / "run"
    result = engine.execute(plan(spec), engine.RunOptions(out_dir=out, quiet=True))
    assert result.status == "complete", result.reason
    rows = [r for _, r in iter_jsonl(out / layout.BACKENDS / "b0" / layout.TRACES)]
    assert rows
    v = judge(spec, load_evidence(out))
    (cov,) = [r for r in v.rules if r.metric == "trace_coverage"]
    stepped = [t for t in said if "wall clock was stepped" in t]
    if recorded:
        assert stepped == ["[b0] the machine's wall clock was stepped during the load (+10.000 s): the run's times "
                           "stay on its own clock; server traces are matched across the step"], said
        assert all(r["matched"] and r["wall_step_s"] == STEP_S for r in rows), rows[:2]
        assert cov.status == "pass" and "(+10.000 s)" in cov.message, cov.message
    else:
        assert stepped == []
        assert all(not r["matched"] and r["reason"] == "outside_window" for r in rows), rows[:2]
        assert cov.status == "fail", cov.message


def test_a_step_written_into_client_jsonl_afterwards_does_not_cover_the_traces(tmp_path, capsys):
    """An edited record trying to fake it: a run whose traces are 10 s off with no step on
    record, then `wall_step_s: 10` added to its client.jsonl by hand. The file no longer has the
    sha256 the manifest recorded: artifacts_verified fails and the gate does not pass."""
    b = _stepped_run(None)
    ev = b.write(tmp_path / "ev")
    spec_path = tmp_path / "s.soak"
    spec_path.write_text(b.spec.canonical_text)
    client = ev / "client.jsonl"
    rows = [json.loads(x) for x in client.read_text().splitlines()]
    client.write_text("".join(json.dumps({**r, "wall_step_s": STEP_S}) + "\n" for r in rows))
    assert main(["gate", str(ev), "--spec", str(spec_path), "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    by_rule = {r["rule"]: r for r in out["rules"]}
    assert by_rule["artifacts_verified"]["status"] == "fail" and "client.jsonl" in by_rule["artifacts_verified"]["message"]
    assert out["verdict"] != "PASS"
