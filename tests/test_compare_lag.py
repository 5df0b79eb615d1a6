"""compare's timing rule that FAILs only because the new run's load generator was later: at an
open-loop level, ttft and latency run from the intended start and hold the client's schedule lag
(within client_schedule_lag: no saturated bucket), so a client later than the base's could carry
a `p50(ttft) regression <= 5%` past its limit with the server unchanged. The same statistic less
the client's own lateness decides, the figure the gate chooses (`performance.lag_figure`): from
the actual send (sent_ttft) without max_concurrency, under it with the level's slot queue
replayed as an on-time client would have driven it (the cap's own wait kept). Where it does not fail the rule is INCONCLUSIVE with the reason, never FAIL (as the
gate, tests/test_lag_blame.py); where it fails too, and at a closed loop, the FAIL stands."""

from __future__ import annotations

import heapq
import random

import pytest

from soakspec.compare import RunSamples, compare, parse_rule
from soakspec.judge import judge
from soakspec.judge.testing import EvidenceBuilder, small_spec, spec_from_text

ALLOWANCE = "client_schedule_lag = 1s"  # a client 160 ms late is not saturated: client_healthy passes
OPEN = small_spec(mode="open", levels="[2rps]", duration="4m", bucket="1m", gate=ALLOWANCE)
CAPPED = small_spec(mode="open", levels="[2rps]\n    max_concurrency = 4", duration="4m", bucket="1m", gate=ALLOWANCE)
CLOSED = small_spec(mode="closed", levels="[4]", duration="4m", bucket="1m", gate=ALLOWANCE)
RULE = "require p50(ttft) regression <= 5%"


def timed(spec, seed: int, *, lag: float, server: float, run_id: str, client: bool = True,
          hold: float = 1.0) -> EvidenceBuilder:
    """400 measured requests, each answered its first token `server` x a lognormal draw (seeded)
    after its send and ending `hold` after that; sent `lag` after its intended start -- under
    max_concurrency after its slot, the level's slots taken first come first served in
    intended-start order as the runner's are (`admitted` where a request waited for one) -- with
    ttft and latency from the intended start, as the runner writes them. `client`: with a
    client.jsonl of a load process that kept up."""
    b = EvidenceBuilder(spec, per_bucket=100, run_id=run_id)
    if client:
        b.with_client()
    rng = random.Random(seed)
    load = spec.workloads[0].load
    cap = load.max_concurrency if load.mode == "open" else None
    free = [float("-inf")] * (cap or 1)  # the slots' free times
    for r in sorted(b.measured("a"), key=lambda r: r["intended_start"]):
        slot = heapq.heappop(free) if cap else float("-inf")
        admitted = max(r["intended_start"], slot)
        if admitted > r["intended_start"]:
            r["admitted"] = admitted
        start = admitted + lag
        s = 0.15 * server * rng.lognormvariate(0.0, 0.2)
        r.update(start=start, first_byte=start + s - 0.005, first_token=start + s, end=start + s + hold,
                 ttft=None, latency=None)
        if cap:
            heapq.heappush(free, start + s + hold)
    return b


def _judged(spec, *, base_lag: float, new_lag: float, server: float = 1.0, rule: str = RULE, client: bool = True,
            new_hold: float = 1.0):
    base = timed(spec, 1, lag=base_lag, server=1.0, run_id="base", client=client).build()
    new = timed(spec, 2, lag=new_lag, server=server, run_id="new", client=client, hold=new_hold).build()
    return compare(base, new, resamples=2000, rules=[parse_rule(rule)])


def test_a_regression_only_the_new_clients_lag_makes_is_inconclusive_with_the_send_figure_and_both_lags():
    c = _judged(OPEN, base_lag=0.002, new_lag=0.16)
    ttft = next(r for r in c.rows if (r.metric, r.stat) == ("ttft", "p50"))
    assert ttft.verdict == "regression" and ttft.low > 0.05  # from the intended start it did regress
    out = c.rules[0]
    assert out.status == "inconclusive", out.message
    assert out.message.startswith("not judged, the regression of p50(ttft) is the load generator's: measured from the "
                                  "actual send (p50(sent_ttft)) it changed "), out.message
    assert "the new run's schedule lag p50 160ms against the base's 2ms" in out.message, out.message
    assert "it measured: a " in out.message and "(limit 5%)" in out.message, out.message
    assert c.outcome == "INCONCLUSIVE"
    assert not [r for r in c.rows if r.metric.startswith("sent_")]  # the check is no row: the family is as it was


def test_latency_is_checked_from_the_send_the_same_way():
    c = _judged(OPEN, base_lag=0.002, new_lag=0.5, rule="require p50(latency) regression <= 5%")
    assert c.rules[0].status == "inconclusive" and "p50(sent_latency)" in c.rules[0].message, c.rules[0].message


def test_a_server_slower_from_the_send_too_still_fails():
    c = _judged(OPEN, base_lag=0.002, new_lag=0.16, server=1.5)
    assert c.rules[0].status == "fail", c.rules[0].message
    assert "load generator" not in c.rules[0].message
    assert c.outcome == "FAIL"


def test_a_capped_regression_only_the_clients_lag_makes_is_inconclusive_as_the_gate_says():
    """Under max_concurrency the figure is the gate's (`lag_figure`): ttft with the slot queue
    replayed on time, the cap's own wait kept. No request waited for one here, so the new run's 160 ms is all the
    client's: INCONCLUSIVE, naming the figure as the gate does -- and the gate, on the same
    evidence under `p50(ttft) < 250ms`, is INCONCLUSIVE too (before, compare FAILed it)."""
    c = _judged(CAPPED, base_lag=0.002, new_lag=0.16)
    out = c.rules[0]
    assert out.status == "inconclusive", out.message
    assert out.message.startswith("not judged, the regression of p50(ttft) is the load generator's: measured less the "
                                  "load generator's own lateness (p50(ttft with the slot queue replayed on time), the wait "
                                  "for a slot under max_concurrency as an on-time load generator would have met it) it "
                                  "changed "), out.message
    assert "the new run's schedule lag p50 160ms against the base's 2ms" in out.message, out.message
    assert c.outcome == "INCONCLUSIVE"
    assert not [r for r in c.rows if "schedule_lag" in r.metric]  # no row of its own: the family is as it was
    lat = _judged(CAPPED, base_lag=0.002, new_lag=0.5, rule="require p50(latency) regression <= 5%").rules[0]
    assert lat.status == "inconclusive" and "p50(latency with the slot queue replayed on time)" in lat.message, lat.message
    spec = small_spec("require p50(ttft) < 250ms per level", mode="open", levels="[2rps]\n    max_concurrency = 4",
                      duration="4m", bucket="1m", gate=ALLOWANCE)
    gate = judge(spec, timed(spec, 2, lag=0.16, server=1.0, run_id="new").build())
    assert next(r for r in gate.rules if r.rule == "p50(ttft) < 250ms per level").status == "inconclusive"


def test_a_capped_levels_longer_wait_for_a_slot_keeps_its_fail():
    """The same lateness, but the new run's server holds each request 2.5 s after its first
    token (1 s in the base): 4 slots then serve 1.5 requests a second of the 2 due, and the cap's
    own queue grows -- what users see, kept in the figure (the send figure would hide it; the
    replayed queue, on time, grows as much), so the figure fails too and the FAIL stands."""
    c = _judged(CAPPED, base_lag=0.002, new_lag=0.16, new_hold=2.5)
    assert c.rules[0].status == "fail", c.rules[0].message
    assert "load generator" not in c.rules[0].message
    assert c.outcome == "FAIL"


def test_a_closed_loop_keeps_its_fail():
    """A closed loop's intended start is its send: nothing there is the schedule's lag to take
    back (the builder's client.jsonl would read this loop's idle workers as saturated: left out,
    a run that did not measure its client)."""
    c = _judged(CLOSED, base_lag=0.002, new_lag=0.16, client=False)
    assert c.rules[0].status == "fail", c.rules[0].message


@pytest.mark.parametrize("spec,figure", [(OPEN, "sent_ttft"), (CAPPED, "ttft with the slot queue replayed on time")],
                         ids=["open", "capped"])
def test_a_base_run_read_up_front_keeps_what_the_check_needs_when_asked(spec, figure):
    """The command reads the base run up front (`keep=False`): with `from_send` it keeps the
    open level's samples of its lag figure (from the send; under a cap, less the client's
    lateness) and lag, and the rule is INCONCLUSIVE as above; without, the FAIL stands, and a
    note says it was not checked."""
    base_ev = timed(spec, 1, lag=0.002, server=1.0, run_id="base").build()
    new_ev = timed(spec, 2, lag=0.16, server=1.0, run_id="new").build()
    rule = [parse_rule(RULE)]
    kept = compare(RunSamples.read(base_ev, dir="base", keep=False, from_send=True), new_ev, resamples=2000, rules=rule)
    assert kept.rules[0].status == "inconclusive" and "against the base's 2ms" in kept.rules[0].message
    assert f"(p50({figure})" in kept.rules[0].message, kept.rules[0].message
    bare = compare(RunSamples.read(base_ev, dir="base", keep=False), new_ev, resamples=2000, rules=rule)
    assert bare.rules[0].status == "fail"
    assert any("was not checked" in n and f"without its {figure} samples" in n for n in bare.notes), bare.notes


@pytest.mark.parametrize("spec", [OPEN, CAPPED], ids=["open", "capped"])
def test_the_command_checks_a_require_rule_from_the_send(tmp_path, capsys, spec):
    """`soakspec compare BASE NEW --require ...` reads the base run up front: it keeps what the
    check needs, and the lag-only regression exits 3 (INCONCLUSIVE), not 1."""
    from soakspec.cli import main

    base = timed(spec, 1, lag=0.002, server=1.0, run_id="base").write(tmp_path / "base")
    new = timed(spec, 2, lag=0.16, server=1.0, run_id="new").write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "2000", "--require", "p50(ttft) regression <= 5%"]) == 3
    assert "is the load generator's" in capsys.readouterr().out


def test_the_command_checks_a_rule_only_the_new_runs_compare_block_holds(tmp_path, capsys):
    """Without --spec the rules are the new run's compare block's, and the base run is read up
    front before the new run is: it keeps what the check needs because the new run's spec is
    read from its manifest first, so a ttft rule the base run's spec does not hold is checked
    too -- exit 3 (INCONCLUSIVE), not a FAIL left unchecked with a note."""
    from soakspec.cli import main

    reviewed = spec_from_text(OPEN.canonical_text + "\ncompare {\n  require regression(p50(ttft)) <= 5%\n}\n")
    base = timed(OPEN, 1, lag=0.002, server=1.0, run_id="base").write(tmp_path / "base")
    new = timed(reviewed, 2, lag=0.16, server=1.0, run_id="new").write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "2000"]) == 3
    out = capsys.readouterr().out
    assert "is the load generator's" in out and "was not checked" not in out, out


def test_a_gate_that_does_not_judge_its_client_keeps_the_fail_as_measured():
    """`client_healthy = false` in the gate: the gate keeps a lag-decided FAIL (judged as
    measured), and so does compare -- it turned the check off for both runs' clients."""
    off = small_spec(mode="open", levels="[2rps]", duration="4m", bucket="1m", gate=ALLOWANCE + "\n  client_healthy = false")
    c = _judged(off, base_lag=0.002, new_lag=0.16)
    assert c.rules[0].status == "fail", c.rules[0].message
    assert "load generator" not in c.rules[0].message


def test_an_unchecked_pair_names_each_sides_own_figure():
    """An uncapped base read up front without its lag figure beside a capped new run: the note
    names what the base lacks -- its own figure, from the send -- not the capped side's."""
    base = timed(OPEN, 1, lag=0.002, server=1.0, run_id="base").build()
    new = timed(CAPPED, 2, lag=0.16, server=1.0, run_id="new").build()
    c = compare(RunSamples.read(base, dir="base", keep=False), new, resamples=2000, rules=[parse_rule(RULE)])
    note = next(n for n in c.notes if "was not checked" in n)
    assert "the base run was read without its sent_ttft samples" in note, note
