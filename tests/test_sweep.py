"""A sweep judged by the gate (`search = bisect`): the search, the checker, the plan, the judge,
and a real sweep against the simulator with a known capacity.

What a user relies on: bisection finds the highest grid level that holds next to one that does
not; `plan` shows the bounds; the gate re-judges every probe and reports
`max_sustainable_concurrency` (or `_rate`), PASSes at the found level although probes above
it fail, FAILs with "none" when even the lowest level fails, and says when the wall-time bound
ended the search.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner_support import manifest, run_spec, sim_spec
from soakspec.judge import judge
from soakspec.judge.summary import summarize_run
from soakspec.judge.joined import join
from soakspec.judge.testing import EvidenceBuilder, spec_from_text
from soakspec.lang.check import check
from soakspec.lang.parser import parse
from soakspec.plan import Sweep, plan, render_text, sweep_grid, to_json
from soakspec.runner.load import Bisection


@given(st.integers(1, 300), st.data())
def test_bisection_finds_the_boundary_within_its_probe_bound(n, data):
    """Over a monotone predicate (levels 0..t hold), the search ends with good == t (None when
    t < 0), probes each level at most once, and needs at most Sweep.max_probes probes."""
    t = data.draw(st.integers(-1, n - 1))
    search, probed = Bisection(n), []
    while (i := search.next()) is not None:
        assert i not in probed
        probed.append(i)
        search.record(i, i <= t)
    assert search.good == (t if t >= 0 else None)
    assert len(probed) <= Sweep("concurrency", tuple(range(n)), 1.0).max_probes


def test_sweep_grid_includes_both_bounds():
    assert sweep_grid(1, 10, 4, integer=True) == (1, 5, 9, 10)
    assert sweep_grid(0.5, 2.0, 0.5, integer=False) == (0.5, 1.0, 1.5, 2.0)


def _sweep_spec(load: str = "concurrency = [1, 12]\n    search = bisect\n    max_wall = 1h", *, workloads: int = 1,
                backends: int = 1, rule: str = "require p90(ttft) < 200ms per level") -> str:
    parts = ['soak "s" {}\n']
    for b in range(backends):
        parts.append(f'backend "b{b}" {{\n  url = "http://127.0.0.1:8000"\n  runtime {{\n    label = "host-staged"\n  }}\n}}\n')
    for w in range(workloads):
        parts.append(f'workload "w{w}" {{\n  load {{\n    mode = closed\n    {load}\n  }}\n  duration = 10m\n  bucket = 5m\n'
                     '  deadline = 30s\n  follow_up = false\n}\n')
    parts.append(f"gate {{\n  {rule}\n}}\n")
    return "".join(parts)


def _codes(text: str) -> list[str]:
    tree, errs = parse(text)
    assert tree is not None, errs
    _, diags = check(tree, "<t>")
    return [d.code for d in diags if d.code.startswith("E")]


@pytest.mark.parametrize("text, code", [
    (_sweep_spec("concurrency = [1, 12]\n    step = 2"), "E403"),  # step without search
    (_sweep_spec("concurrency = [1, 4, 8]\n    search = bisect\n    max_wall = 1h"), "E204"),  # bounds are [low, high]
    (_sweep_spec("concurrency = [8, 2]\n    search = bisect\n    max_wall = 1h"), "E204"),
    (_sweep_spec("concurrency = [1, 12]\n    search = bisect"), "E103"),  # the wall-time bound is required
    (_sweep_spec(workloads=2), "E403"),
    (_sweep_spec(backends=2), "E403"),
    (_sweep_spec("concurrency = [1, 12]\n    search = bisect\n    max_wall = 1h\n    rate_step = 1rps"), "E403"),
])
def test_checker_rejects_a_sweep_it_cannot_run(text, code):
    assert code in _codes(text)


def test_a_wall_time_bound_shorter_than_one_probe_is_refused_before_anything_runs():
    """`max_wall = 1s` with 1.5 s probes ran no probe at all, then the gate FAILed the sweep with
    "none (even the lowest level does not hold)" although nothing was measured: the bound
    must hold one probe (warmup + duration), and `check` says so."""
    load = "concurrency = [1, 12]\n    search = bisect\n    max_wall = {}"
    assert "E204" in _codes(_sweep_spec(load.format("9m")))  # 10m probes
    assert "E204" in _codes(_sweep_spec(load.format("10m")).replace("duration = 10m", "duration = 10m\n  warmup = 1m"))
    assert _codes(_sweep_spec(load.format("10m"))) == []  # exactly one probe fits


def test_a_valid_sweep_checks_clean():
    assert _codes(_sweep_spec()) == []


def test_plan_shows_the_search_bounds():
    spec = spec_from_text(_sweep_spec("concurrency = [1, 12]\n    search = bisect\n    step = 1\n    max_wall = 1h"))
    p = plan(spec)
    text = render_text(p)
    assert "sweep concurrency 1..12 step 1" in text and "bisection over 12 levels" in text
    assert f"at most {p.backends[0].levels[0].sweep.max_probes} probes" in text and "no probe starts that would end after 1h" in text
    (lv,) = to_json(p)["backends"][0]["levels"]
    assert lv["sweep"]["grid"] == list(range(1, 13)) and lv["sweep"]["max_wall_s"] == 3600.0


# ------------------------------------------------------------------------------ the judge

PROBES = [1, 12, 6, 3, 4, 5]  # the order bisection probes a 1..12 grid with capacity 4


def _evidence_of_probes(slow_above: int | None, *, bounded: bool = False):
    """What a sweep of PROBES leaves: one manifest level per probe, in run order, requests
    slow (ttft 0.5s) at every level above `slow_above`."""
    plain = spec_from_text(_sweep_spec(f"concurrency = {PROBES}").replace("w0", "w0"))
    b = EvidenceBuilder(plain, per_bucket=40)
    for i, c in enumerate(PROBES):
        if slow_above is None or c > slow_above:
            for r in b.measured("b0", level=i):
                r["ttft"] = 0.5
    b.entry("b0")["sweep"] = {"probes": [{"level": i, "value": c, "passed": slow_above is not None and c <= slow_above}
                                         for i, c in enumerate(PROBES)], "bounded_by_wall_time": bounded}
    return b.build()


def test_the_gate_passes_at_the_found_level_and_reports_the_figure():
    spec = spec_from_text(_sweep_spec())
    run = join(spec, _evidence_of_probes(4))
    (sw,) = run.sweep
    assert sw.result == 4 and sw.found_level == PROBES.index(4) and not sw.bounded and not sw.disagrees
    assert [p["passed"] for p in sw.probes] == [c <= 4 for c in PROBES]
    v = judge(spec, _evidence_of_probes(4))
    assert v.outcome == "PASS", [r.text() for r in v.rules]
    (rule,) = [r for r in v.rules if r.metric == "max_sustainable_concurrency"]
    assert rule.status == "pass" and rule.observed == 4
    assert summarize_run(run)["figures"] == {"max_sustainable_concurrency": 4}


SIM_BACKEND = ('url = "http://127.0.0.1:8000"', "sim {\n    slots = 4\n  }")


def _probed_run(probes_spec) -> EvidenceBuilder:
    """A sweep's evidence over PROBES (one level each): ttft 500 ms above concurrency 4, so the
    probes up to 4 pass and the figure is 4."""
    b = EvidenceBuilder(probes_spec, per_bucket=40)
    for i, c in enumerate(PROBES):
        if c > 4:
            for r in b.measured("b0", level=i):  # on disk ttft is derived from the times
                r["first_token"] = r["start"] + 0.5
                r["end"] = max(r["end"], r["first_token"] + 0.01)
    b.entry("b0")["sweep"] = {"probes": [{"level": i, "value": c, "passed": c <= 4} for i, c in enumerate(PROBES)],
                              "bounded_by_wall_time": False}
    return b


@pytest.mark.parametrize("sim", [False, True], ids=["url", "sim, traces in server.log"])
def test_evidence_read_from_disk_is_narrowed_to_each_probe_as_in_memory(tmp_path, sim):
    """`load_evidence` keeps a backend's requests as columns, not rows, and of a backend whose
    traces come from its log, the stored trace rows stay on disk: the sweep's per-probe
    narrowing reads them from the table and finds the same figure and probe verdicts."""
    from soakspec.judge.evidence import load_evidence

    def text(*args, **kw):
        t = _sweep_spec(*args, **kw)
        return t.replace(*SIM_BACKEND) if sim else t

    rule = "require p90(ttft) < 200ms per level" + ("\n  require trace_coverage >= 90%" if sim else "")
    spec = spec_from_text(text(rule=rule))
    b = _probed_run(spec_from_text(text(f"concurrency = {PROBES}", rule=rule)))
    root = b.write(tmp_path / "run")
    ev = load_evidence(root)
    assert not ev.backends[0].records  # columns only, as a real run is read
    (sw,) = join(spec, ev).sweep
    assert sw.result == 4 and [p["passed"] for p in sw.probes] == [c <= 4 for c in PROBES]
    v = judge(spec, load_evidence(root))
    assert v.outcome == "PASS", [r.text() for r in v.rules]
    assert [r.status for r in v.rules if r.metric == "trace_coverage"] == (["pass"] if sim else [])


def test_a_probe_that_did_not_run_its_full_duration_never_holds():
    """The judge re-judges from the evidence: a level cut short (an abort rule) does not hold,
    whatever its records say and whatever the runner recorded; the figure drops to the next."""
    spec = spec_from_text(_sweep_spec())
    ev = _evidence_of_probes(4)
    entry = ev.backends[0].entry
    (lv4,) = [e for e in entry["levels"] if e["concurrency"] == 4]
    lv4["completed"] = False
    lv4["stopped_by"] = {"rule": "abort ratio(errors) > 50% per bucket"}
    (sw,) = join(spec, ev).sweep
    assert sw.result == 3 and sw.disagrees
    assert "stopped by abort ratio(errors)" in next(p["why"] for p in sw.probes if p["value"] == 4)


def test_a_probe_an_abort_rule_fired_on_after_it_drained_does_not_hold():
    """An abort rule judges a bucket once its requests have finished, so it may fire as the
    probe drains, on a probe that ran its full duration: the runner counts it as not holding,
    and so does the judge (it does not say it holds and disagree)."""
    spec = spec_from_text(_sweep_spec())
    ev = _evidence_of_probes(4)
    (lv4,) = [e for e in ev.backends[0].entry["levels"] if e["concurrency"] == 4]
    lv4["stopped_by"] = {"rule": "abort ratio(errors) > 50% per bucket"}
    for p in ev.backends[0].entry["sweep"]["probes"]:
        p["passed"] = p["passed"] and p["value"] != 4
    (sw,) = join(spec, ev).sweep
    assert lv4["completed"] is True and sw.result == 3 and not sw.disagrees
    assert "fired on it" in next(p["why"] for p in sw.probes if p["value"] == 4)


def test_when_even_the_lowest_level_fails_the_gate_fails_with_none():
    spec = spec_from_text(_sweep_spec())
    v = judge(spec, _evidence_of_probes(None))
    assert v.outcome == "FAIL"
    (rule,) = [r for r in v.rules if r.metric == "max_sustainable_concurrency"]
    assert rule.status == "fail" and "none" in rule.message


def test_a_sweep_whose_lowest_level_was_never_judged_is_inconclusive_not_fail():
    """No probe ran (the wall-time bound left no room), or the lowest was cut short by an
    interrupt rather than an abort rule: nothing says the lowest level does not hold, so the
    sweep is INCONCLUSIVE -- not FAIL with "even the lowest level does not hold"."""
    spec = spec_from_text(_sweep_spec())
    ev = _evidence_of_probes(4, bounded=True)
    entry = ev.backends[0].entry
    entry["levels"], entry["sweep"]["probes"] = [], []
    (rule,) = [r for r in judge(spec, ev).rules if r.metric == "max_sustainable_concurrency"]
    assert rule.status == "inconclusive" and "no probe ran" in rule.message, rule.message
    ev = _evidence_of_probes(4)
    ev.backends[0].entry["levels"][0]["completed"] = False  # Ctrl-C during the first probe (concurrency 1)
    ev.backends[0].entry["sweep"]["probes"] = ev.backends[0].entry["sweep"]["probes"][:1]
    ev.backends[0].entry["levels"][1:] = []
    (rule,) = [r for r in judge(spec, ev).rules if r.metric == "max_sustainable_concurrency"]
    assert rule.status == "inconclusive" and "could not be judged" in rule.message, rule.message
    (sw,) = join(spec, ev).sweep
    assert sw.probes[0]["passed"] is False and sw.probes[0]["status"] == "inconclusive"


def test_a_search_ended_by_the_wall_time_bound_says_so():
    spec = spec_from_text(_sweep_spec())
    v = judge(spec, _evidence_of_probes(4, bounded=True))
    (rule,) = [r for r in v.rules if r.metric == "max_sustainable_concurrency"]
    assert rule.status == "pass" and "bounded by max wall time" in rule.message


# ------------------------------------------------------------------------------ a real sweep

SIM = "slots = 4\n    ttft = 20ms\n    itl = 10ms"  # capacity: 4 requests at once, ~90 ms each
LOAD = "mode = closed\n    concurrency = [1, 12]\n    search = bisect\n    max_wall = {wall}"


@pytest.mark.slow
def test_a_sweep_against_the_simulator_finds_its_capacity_within_one_step(tmp_path):
    """Beyond 4 slots requests queue for a whole ~90 ms service time, so p90(ttft) < 60ms holds
    exactly up to concurrency 4: the analytic answer. The sweep finds it within one step, lists
    every probe as a manifest level in the order it ran, and the gate passes at it."""
    text = sim_spec(sim=SIM, load=LOAD.format(wall="60s"), duration="3s", bucket="3s", deadline="10s",
                    gate="require p90(ttft) < 60ms per level")
    proc, out = run_spec(tmp_path, text, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = manifest(out)
    (be,) = m["backends"]
    probes = be["sweep"]["probes"]
    assert [lv["concurrency"] for lv in be["levels"]] == [p["value"] for p in probes]  # listed as they ran
    assert [lv["index"] for lv in be["levels"]] == list(range(len(probes)))
    results = json.loads((out / "results.json").read_text())
    found = results["figures"]["max_sustainable_concurrency"]
    assert abs(found - 4) <= 1
    assert be["sweep"]["result"] == found and not be["sweep"]["bounded_by_wall_time"]


@pytest.mark.slow
def test_a_sweep_stops_within_its_wall_time_bound(tmp_path):
    """With room for two 3 s probes only, the search stops before the third: the result is the
    best holding level so far, marked bounded; the load time stays within the bound."""
    text = sim_spec(sim=SIM, load=LOAD.format(wall="7s"), duration="3s", bucket="3s", deadline="10s",
                    gate="require p90(ttft) < 60ms per level", follow_up=False)
    proc, out = run_spec(tmp_path, text, timeout=120)
    (be,) = manifest(out)["backends"]
    sw = be["sweep"]
    assert sw["bounded_by_wall_time"] and len(sw["probes"]) == 2 and sw["wall_s"] <= 7.0
    assert sw["result"] == 1  # 1 holds, 12 does not; no time for 6
    assert be["levels"][-1]["drained_at"] - be["levels"][0]["started_at"] <= 7.0
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["sweep"][0]["bounded_by_wall_time"] is True


# ------------------------------------------------------------------------------ lint-claims


def _lint(doc: str, evidence=(), spec_text: str | None = None):
    from soakspec.claims.adapters import coverage_from_spec
    from soakspec.claims.engine import lint
    from soakspec.claims.facts import ClaimBoundary

    spec = spec_from_text(spec_text or _sweep_spec())
    text = doc + "\n\n## Claim Boundary\n\n- claim: a sweep\n"
    return [(d.code, d.message) for d in lint(text, "pr.md", ClaimBoundary(claims=("a sweep",)), coverage_from_spec(spec), evidence)]


def test_lint_claims_checks_a_sustain_claim_against_the_figure():
    from soakspec.claims.facts import EvidenceFacts

    ev = (EvidenceFacts(backend="b0", sustainable={"max_sustainable_concurrency": 4.0}),)
    assert _lint("The server sustains concurrency 4.", ev) == []
    assert _lint("The server sustains 3 concurrent requests.", ev) == []  # below the figure: it held there too
    (over,) = [d for d in _lint("The server sustains concurrency 8.", ev) if d[0] == "CB201"]
    assert "max_sustainable_concurrency is 4" in over[1]
    assert [d[0] for d in _lint("The max sustainable concurrency is 5.", ev)] == ["CB201"]
    assert _lint("It does not sustain concurrency 8.", ev) == []  # negated: not a claim
    none = (EvidenceFacts(backend="b0", sustainable={"max_sustainable_concurrency": None}),)
    assert [d[0] for d in _lint("The server sustains concurrency 1.", none)] == ["CB201"]


def test_lint_claims_without_evidence_knows_the_sweeps_range():
    """No evidence: a sustain claim above the sweep's highest level is scope creep; a grid level
    inside it is covered (the sweep may probe any of them)."""
    assert _lint("The server sustains concurrency 7.") == []
    codes = [d[0] for d in _lint("The server sustains concurrency 64.")]
    assert "CB301" in codes
    rate_spec = _sweep_spec("rate = [1rps, 20rps]\n    search = bisect\n    rate_step = 1rps\n    max_wall = 1h").replace(
        "mode = closed", "mode = open")
    assert _lint("It sustains 12 req/s.", spec_text=rate_spec) == []
    assert "CB301" in [d[0] for d in _lint("It sustains 30 req/s.", spec_text=rate_spec)]


def test_the_figure_reaches_lint_claims_from_an_evidence_directory(tmp_path):
    """lint-claims reads a retained run's figure by re-judging it with the spec its manifest
    embeds (as `gate` and `report` do); a figure edited into results.json is not believed."""
    from soakspec.claims.adapters import load_evidence_facts

    spec = spec_from_text(_sweep_spec())
    b = _probed_run(spec_from_text(_sweep_spec(f"concurrency = {PROBES}")))
    b.manifest["spec"] = {"path": spec.path, "text": spec.canonical_text, "sha256": spec.sha256}  # the run's sweep spec
    out = b.write(tmp_path / "ev")
    results = json.loads((out / "results.json").read_text())
    results["figures"] = {"max_sustainable_concurrency": 6}
    (out / "results.json").write_text(json.dumps(results))
    (ev,) = load_evidence_facts(out)
    assert ev.sustainable == {"max_sustainable_concurrency": 4.0}
    assert any("sweep figures" in m for m in ev.stored_mismatch)


# ------------------------------------------------------------------------------ the runner's loop, in virtual time


class _Clock:
    def now(self) -> float:
        import trio

        return trio.current_time()


class _Progress:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, line: str) -> None:
        self.lines.append(line)


class _Rec:
    def __init__(self) -> None:
        self.levels: list[dict] = []
        self.sweep: dict | None = None

    def end_member(self) -> None:
        pass


class _Fired:
    gone = False  # a server that answers (runner/abort.py `Fired.gone`): the probe does not hold, the run goes on

    def describe(self) -> str:
        return "abort rule 'ratio(errors) > 50% per bucket'"

    def to_json(self) -> dict:
        return {"rule": "abort ratio(errors) > 50% per bucket"}


def _run_sweep(monkeypatch, capacity: int, max_wall: str, high: int = 12, abort_above: int | None = None,
               judged_on: list[str] | None = None, client=None, samples: list | None = None):
    """The driver's sweep loop with its levels faked: each probe takes its planned warmup +
    duration of virtual time; the judge holds a level iff its concurrency <= capacity; above
    `abort_above` an abort rule fires a minute into the probe."""
    import dataclasses
    import threading

    import trio
    import trio.testing

    from soakspec.runner import driver

    judged_on = [] if judged_on is None else judged_on
    from soakspec.runner.backend import Deps

    spec = spec_from_text(_sweep_spec(f"concurrency = [1, {high}]\n    search = bisect\n    max_wall = {max_wall}"))
    bp = plan(spec).backends[0]
    (lv,) = bp.levels
    rec = _Rec()

    async def fake_level(bp_, probe, deps, rec_, ids, shapes, connect, where, watch, health, client=None):
        rec_.levels.append(probe.to_json() | {"started_at": trio.current_time(), "completed": False})
        if client is not None:  # a client-health sample a second into the probe, as the loop monitor writes
            from soakspec.judge.testing import client_rows

            client.write_json(client_rows("b0", trio.current_time(), trio.current_time() + 1.0, lag=0.001 * probe.concurrency)[0])
        if abort_above is not None and probe.concurrency > abort_above:
            await trio.sleep(60)
            watch.fired = _Fired()
            watch.on_fire(watch.fired)
            await trio.sleep_forever()
        await trio.sleep(probe.warmup_s + probe.duration_s)
        rec_.levels[-1].update(drained_at=trio.current_time(), completed=True)

    monkeypatch.setattr(driver, "_drive_level", fake_level)
    monkeypatch.setattr(driver, "_level_rows", lambda rec_, probe: [])
    loop_thread = threading.get_ident()

    def judge_one(name, entry, rows, client=()):
        judged_on.append("the event loop" if threading.get_ident() == loop_thread else "a worker thread")
        if samples is not None:
            samples.append((entry["concurrency"], [r["lag_p99"] for r in client]))
        return entry["concurrency"] <= capacity, "fake"

    deps = dataclasses.replace(Deps(_Clock(), _Progress(), None, None, None), sweep_judge=judge_one)  # type: ignore[arg-type]
    from soakspec.runner.abort import AbortWatch

    watch = AbortWatch("b0", ())
    trio.run(driver._drive_sweep, bp, lv, deps, rec, None, None, None, None, watch, None, client,
             clock=trio.testing.MockClock(autojump_threshold=0))
    assert watch.fired is None  # re-armed: a probe's abort is not the run's
    return lv, rec


@pytest.mark.parametrize("capacity", [0, 1, 4, 7, 12])
def test_the_runners_sweep_finds_the_capacity_in_virtual_time(monkeypatch, capacity):
    lv, rec = _run_sweep(monkeypatch, capacity, "2h")
    sw = rec.sweep
    assert sw["result"] == (capacity or None) and not sw["bounded_by_wall_time"]
    assert [e["index"] for e in rec.levels] == list(range(len(rec.levels)))  # manifest order = run order
    assert [e["concurrency"] for e in rec.levels] == [p["value"] for p in sw["probes"]]
    assert len(rec.levels) <= lv.sweep.max_probes


def test_the_runners_sweep_judges_each_probe_off_the_event_loop(monkeypatch):
    """Judged on the event loop, a probe's judging (reading its records back, the rules) stalled
    the loop 20-90 ms between probes; the client health monitor counted it into the next probe's
    first bucket and a sweep against the simulator ended INCONCLUSIVE for a saturated client."""
    judged_on: list[str] = []
    _run_sweep(monkeypatch, 4, "2h", judged_on=judged_on)
    assert judged_on and set(judged_on) == {"a worker thread"}, judged_on


def test_the_runners_sweep_judges_each_probe_on_its_own_client_samples(monkeypatch, tmp_path):
    """The runner's judgement of a probe gets the load generator's samples written while that
    probe ran -- no earlier probe's -- so a saturated client there does not count as holding."""
    from soakspec.runner.clienthealth import ClientLog

    log, samples = ClientLog(tmp_path / "client.jsonl"), []
    _run_sweep(monkeypatch, 4, "2h", client=log, samples=samples)
    log.close()
    assert samples and all(lags == [0.001 * c] for c, lags in samples), samples


def test_the_runners_sweep_stops_within_its_wall_time_bound(monkeypatch):
    """10-minute probes and a 25-minute bound: two probes fit, the third would end past it."""
    lv, rec = _run_sweep(monkeypatch, 4, "25m")
    sw = rec.sweep
    assert [p["value"] for p in sw["probes"]] == [1, 12] and sw["bounded_by_wall_time"] and sw["result"] == 1
    assert rec.levels[-1]["drained_at"] - rec.levels[0]["started_at"] <= lv.sweep.max_wall_s


def test_an_open_loop_sweep_probes_open_levels_of_its_grid():
    from soakspec.plan import Open, probe_level

    text = _sweep_spec("rate = [2rps, 10rps]\n    rate_step = 2rps\n    search = bisect\n    max_wall = 1h\n    seed = 7").replace(
        "mode = closed", "mode = open")
    (lv,) = plan(spec_from_text(text)).backends[0].levels
    assert lv.sweep.axis == "rate" and lv.sweep.grid == (2.0, 4.0, 6.0, 8.0, 10.0)
    p = probe_level(lv, 3, 2)
    assert p.shape == Open(8.0, "constant", 9) and p.index == 2 and p.sweep is None and p.label == "rate 8 rps"
    assert p.min_requests == round(8.0 * lv.duration_s)


def test_an_open_loop_sweeps_probes_keep_its_burstiness_and_count_its_constant_arrivals():
    """Every probe offers the workload's own arrival process: `burstiness = 0.25` made the plan's
    level (and its label) gamma arrivals, but each probe was built without it and ran Poisson
    arrivals, so the sweep measured a smoother load than the spec asked for. A constant-arrival
    probe's count is the arrivals its duration holds (1.5 rps for 3 s: 5, at 0, 2/3, ... 8/3 s)."""
    from soakspec.plan import Open, probe_level

    text = _sweep_spec("rate = [1rps, 4rps]\n    rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7\n"
                       "    arrival = poisson\n    burstiness = 0.25").replace("mode = closed", "mode = open")
    (lv,) = plan(spec_from_text(text)).backends[0].levels
    assert lv.shape.burstiness == 0.25
    p = probe_level(lv, 2, 1)
    assert p.shape == Open(3.0, "poisson", 8, 0.25) and p.label == "rate 3 rps (burstiness 0.25)"
    text = _sweep_spec("rate = [1.5rps, 3rps]\n    rate_step = 1.5rps\n    search = bisect\n    max_wall = 1h").replace(
        "mode = closed", "mode = open").replace("duration = 10m", "duration = 3s").replace("bucket = 5m", "bucket = 1s")
    (lv,) = plan(spec_from_text(text)).backends[0].levels
    p = probe_level(lv, 0, 0)
    assert p.shape == Open(1.5, "constant", 0) and p.min_requests == p.expected_requests == 5


def test_an_abort_rule_ends_only_the_probe_and_the_search_goes_on(monkeypatch):
    """A probe beyond what the server can take trips an abort rule: that probe does not hold
    (its entry says what stopped it) and the search continues below it."""
    lv, rec = _run_sweep(monkeypatch, 4, "2h", abort_above=6)
    sw = rec.sweep
    assert sw["result"] == 4
    stopped = [e for e in rec.levels if "stopped_by" in e]
    assert [e["concurrency"] for e in stopped] == [12]  # probes 1, 12 (stopped), 6, 3, 4, 5
    assert all(not p["passed"] and p["why"].startswith("stopped by") for p in sw["probes"] if p["value"] > 6)


def test_a_run_without_a_sweep_does_not_load_the_judge_before_its_load(tmp_path):
    """The sweep's per-probe judge is made before the load; a spec without a sweep must not
    import the judge (and numpy) for it, or the runner carries them through the whole load."""
    import subprocess
    import sys
    import textwrap

    spec = tmp_path / "s.soak"
    spec.write_text(sim_spec())
    code = textwrap.dedent(f"""
        import argparse, sys
        from soakspec.commands.run import _sweep_judge
        from soakspec.lang import load_spec
        spec, diags, _ = load_spec({str(spec)!r})
        assert spec is not None, diags
        assert _sweep_judge(spec, argparse.Namespace(time_scale=1.0, rehearse=False)) is None
        print(sorted(m for m in sys.modules if m.startswith("soakspec.judge") or m == "numpy"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_probes_records_are_read_back_from_where_the_probe_began(tmp_path, monkeypatch):
    """Each probe is judged from its own records. Read from the file's start, the k-th probe
    re-read every earlier probe's records: a sweep's judging grew with the square of its probes
    (at a high rate, minutes of the sweep's wall time bound spent re-reading). Over a sweep each
    byte of requests.jsonl.gz is read back once, and each probe gets its records, all of them --
    a probe that wrote none (its first or its last) gets none, not an earlier probe's."""
    from soakspec.evidence import io as evio
    from soakspec.evidence.layout import RunLayout
    from soakspec.evidence.record import iter_records
    from soakspec.plan import probe_level
    from soakspec.runner import driver
    from soakspec.runner.recorder import BackendRecorder, RunStatus
    from soakspec.runner.records import RequestRecord

    read: list[int] = []
    hashed_reads = evio._hashed_reads

    def counted(fh, hasher, tick=None):
        for chunk in hashed_reads(fh, hasher, tick):
            read.append(len(chunk))
            yield chunk

    monkeypatch.setattr(evio, "_hashed_reads", counted)
    (bp,) = plan(spec_from_text(_sweep_spec())).backends
    (lv,) = bp.levels
    rec = BackendRecorder(bp, RunLayout(tmp_path / "ev"), RunStatus())
    rec.prepare(0, None)
    sizes = [0, 50, 100, 0, 150, 200, 0]
    for k, (grid_index, n) in enumerate(zip([3, 5, 4, 6, 0, 1, 2], sizes)):
        probe = probe_level(lv, grid_index, k)
        rec.level_started(probe, 100.0 * k)
        rec.write_records(RequestRecord(f"p{k}-{i}", backend=bp.name, workload=probe.workload, level=probe.index, start=100.0 * k + i,
                                        end=100.0 * k + i + 0.5, error="refused") for i in range(n))  # fmt: skip
        rec.end_member()
        rows = driver._level_rows(rec, probe)
        assert [r["request_id"] for r in rows] == [f"p{k}-{i}" for i in range(n)]
    rec.writer.close()
    path = rec.layout.requests(bp.name)
    assert sum(read) == path.stat().st_size  # each byte once, not 1 + 2 + 3 + 4 probes' worth
    assert sum(1 for _ in iter_records(path)) == sum(sizes)  # one file of gzip members, read whole


@pytest.mark.parametrize("max_wall", ["10m", "19m", "20m", "25m", "30m", "39m", "40m", "50m", "1h", "2h"])
@pytest.mark.parametrize("capacity", [0, 4, 11])
def test_the_runners_sweep_runs_at_most_the_probes_the_plan_says(monkeypatch, max_wall, capacity):
    """10-minute probes back to back (no drain or judging time: the most the wall time lets
    start): the runner never runs more probes than plan's `max_probes`, and when the wall time
    ends the search it has run exactly floor(max_wall / probe) of them -- the plan's bound, met."""
    lv, rec = _run_sweep(monkeypatch, capacity, max_wall)
    sw, n = rec.sweep, len(rec.levels)
    assert n <= lv.sweep.max_probes
    if sw["bounded_by_wall_time"]:
        assert n == lv.sweep.max_probes == int(lv.sweep.max_wall_s // (lv.warmup_s + lv.duration_s))


def _open_sweep(shift_level: int | None = None):
    """An open sweep of two probes, 2 and 3 rps (both hold: the figure is 3, found at level 1),
    its records one per arrival of each probe's schedule; `shift_level`: that probe's first
    arrival recorded 5 ms late (the client did not send on its schedule)."""
    sweep = _sweep_spec("rate = [2rps, 3rps]\n    rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7").replace(
        "mode = closed", "mode = open").replace("duration = 10m", "duration = 1m").replace("bucket = 5m", "bucket = 20s")
    plain = spec_from_text(sweep.replace("rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    ", ""))
    b = EvidenceBuilder(plain, per_bucket=40)
    if shift_level is not None:
        first = min((r for r in b.records["b0"] if r["level"] == shift_level), key=lambda r: r["intended_start"])
        first["intended_start"] += 0.005
    b.entry("b0")["sweep"] = {"probes": [{"level": 0, "value": 2.0, "passed": True}, {"level": 1, "value": 3.0, "passed": True}],
                              "bounded_by_wall_time": False}
    return spec_from_text(sweep), b.build()


def test_every_probe_of_an_open_sweep_is_proven_on_its_schedule():
    """A reviewer's sweep of 2 open-loop probes read "it sent on its schedule in 1 open-loop
    level": the gate judges the run as its found level, so the other probe's schedule -- on
    which the figure rests as much (a probe above it that does not hold) -- was never proven,
    and nothing said so. Every probe is proven, and counted."""
    spec, ev = _open_sweep()
    v = judge(spec, ev)
    (health,) = [r for r in v.rules if r.rule == "client_healthy"]
    assert health.status == "pass" and "it sent on its schedule in 2 open-loop levels (of the sweep's 2 probes)" in health.message
    assert [p["schedule"] for p in join(spec, ev).sweep[0].probes] == ["proven", "proven"]


def test_a_probe_off_its_schedule_neither_holds_nor_fails():
    """The probe below the found level sent off its schedule: its load was not the one
    declared, so it is INCONCLUSIVE in the search (not a hold, not the server's fail), and the
    run's client_healthy says so."""
    spec, ev = _open_sweep(shift_level=0)
    run = join(spec, ev)
    low, high = run.sweep[0].probes
    assert low["status"] == "inconclusive" and "did not send on its schedule" in low["why"] and low["schedule"] == "broken"
    assert high["passed"] and run.sweep[0].result == 3.0
    (health,) = [r for r in judge(spec, ev).rules if r.rule == "client_healthy"]
    assert health.status == "inconclusive" and "did not send on its schedule in the sweep's probe at 2 rps" in health.message


def _saturated_sweep(*, slow: bool):
    """`_open_sweep` (probes 2 and 3 rps) with client.jsonl: the load generator healthy through
    the 2 rps probe and saturated (event-loop lag p99 200 ms) through the 3 rps one, whose
    requests are slow (ttft 500 ms, over the rule's 200 ms) when `slow`."""
    from soakspec.judge.testing import client_rows

    sweep = _sweep_spec("rate = [2rps, 3rps]\n    rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7").replace(
        "mode = closed", "mode = open").replace("duration = 10m", "duration = 1m").replace("bucket = 5m", "bucket = 20s")
    plain = spec_from_text(sweep.replace("rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    ", ""))
    b = EvidenceBuilder(plain, per_bucket=40)
    lv0, lv1 = b.manifest["backends"][0]["levels"]
    b.client["b0"] = client_rows("b0", lv0["started_at"], lv1["started_at"]) + client_rows("b0", lv1["started_at"], lv1["drained_at"] + 1.0, lag=0.2)
    if slow:
        for r in b.records["b0"]:
            if r["level"] == 1 and r.get("first_token") is not None:
                r["first_token"] = r["start"] + 0.5
                r["ttft"] = 0.5
                r["end"] = max(r["end"], r["first_token"] + 0.01)
    b.entry("b0")["sweep"] = {"probes": [{"level": 0, "value": 2.0, "passed": True}, {"level": 1, "value": 3.0, "passed": not slow}],
                              "bounded_by_wall_time": False}
    return spec_from_text(sweep), b


@pytest.mark.parametrize("slow", [True, False], ids=["its requests slow", "its requests fast"])
def test_a_probe_whose_load_generator_was_saturated_neither_holds_nor_fails(slow):
    """The 3 rps probe ran with its load generator saturated. Judged on the found level alone,
    its slow requests read as the server failing at 3 rps (a PASS, "max_sustainable_rate =
    2 rps", the limit found) -- or, fast, it held (the figure 3 rps rested on a load the client
    could not apply). It is INCONCLUSIVE in the search: the figure is only a lower bound, and
    client_healthy names the probe and why; the verdict is INCONCLUSIVE, not a PASS."""
    spec, b = _saturated_sweep(slow=slow)
    ev = b.build()
    low, high = join(spec, ev).sweep[0].probes
    assert low["status"] == "pass" and high["status"] == "inconclusive"
    assert "load generator saturated" in high["why"] and "event-loop lag p99 200 ms (limit 50 ms)" in high["client"]
    v = judge(spec, ev)
    rules = {r.rule: r for r in v.rules}
    assert v.outcome == "INCONCLUSIVE"
    health = rules["client_healthy"]
    assert health.status == "inconclusive"
    assert "the sweep's probe at 3 rps is INCONCLUSIVE in the search" in health.message
    assert "event-loop lag p99 200 ms (limit 50 ms)" in health.message
    (sweep,) = [r for r in v.rules if r.metric == "max_sustainable_rate"]
    assert ("max_sustainable_rate = at least 2 rps (the next level, 3 rps, could not be judged (INCONCLUSIVE: the load "
            "generator was not healthy, see client_healthy))") in sweep.message


def test_two_saturated_probes_count_their_problems_once():
    """Probes at 3 and 4 rps both ran with the load generator saturated, in each of their 3
    buckets. client_healthy read "...busy (and 2 more) (and 1 more)": the first probe's other
    buckets, then the run's other probe, two counts side by side that a reader could not tell
    apart. The probe's own count is folded in front, the run's said once."""
    from soakspec.judge.testing import client_rows

    sweep = _sweep_spec("rate = [2rps, 4rps]\n    rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7").replace(
        "mode = closed", "mode = open").replace("duration = 10m", "duration = 1m").replace("bucket = 5m", "bucket = 20s")
    plain = spec_from_text(sweep.replace("rate = [2rps, 4rps]\n    rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    ",
                                         "rate = [2rps, 3rps, 4rps]\n    "))
    b = EvidenceBuilder(plain, per_bucket=40)
    lv0, lv1, lv2 = b.manifest["backends"][0]["levels"]
    b.client["b0"] = client_rows("b0", lv0["started_at"], lv1["started_at"]) + client_rows("b0", lv1["started_at"], lv2["drained_at"] + 1.0, lag=0.2)
    b.entry("b0")["sweep"] = {"probes": [{"level": i, "value": float(i + 2), "passed": True} for i in range(3)], "bounded_by_wall_time": False}
    (health,) = [r for r in judge(spec_from_text(sweep), b.build()).rules if r.rule == "client_healthy"]
    assert health.status == "inconclusive"
    assert health.message.count("more)") == 1, health.message
    assert health.message.startswith("the sweep's probe at 3 rps is INCONCLUSIVE in the search on 3 problems, the first: backend b0, "), health.message
    assert health.message.endswith("event-loop lag p99 200 ms (limit 50 ms), machine CPU 30 % busy (and 1 more)"), health.message


def test_the_runners_own_judgement_of_a_probe_runs_the_gates_per_probe_checks():
    """The runner decides its next probe from its own judgement (`probe_judge`): a probe off
    its schedule, or with its load generator saturated, does not hold there either -- it said
    "holds" (or, slow, "does not hold" as the server's failure), and the gate's note read only
    "the runner's own judgement differs"."""
    from soakspec.judge.sweep import probe_judge

    spec, ev = _open_sweep(shift_level=1)
    b_rows = [dict(r) for r in ev.backends[0].records if r.get("level") == 1]
    entry = ev.backends[0].entry["levels"][1]
    holds, why = probe_judge(spec)("b0", dict(entry), b_rows, [])
    assert not holds and why.startswith("INCONCLUSIVE: the load generator did not send on its schedule")

    spec, b = _saturated_sweep(slow=False)
    ev = b.build()
    rows = [dict(r) for r in ev.backends[0].records if r.get("level") == 1]
    entry = dict(ev.backends[0].entry["levels"][1])
    samples = [r for r in b.client["b0"] if r["t"] > entry["started_at"]]
    holds, why = probe_judge(spec)("b0", entry, rows, samples)
    assert not holds and why.startswith("INCONCLUSIVE: client_healthy:") and "event-loop lag p99 200 ms" in why
    assert probe_judge(spec)("b0", entry, rows, []) == (True, "all 1 performance rules pass")  # no sample: not judged


def test_a_probe_a_timing_abort_stopped_on_a_saturated_client_is_not_the_servers_failure():
    """An abort rule on ttft fired in the 3 rps probe while the load generator was saturated:
    the values it fired on hold the client's lag (as the gate's abort_fired judges a run's
    abort), so the probe is INCONCLUSIVE in the search -- not the server failing at 3 rps."""
    spec, b = _saturated_sweep(slow=True)
    lv1 = b.manifest["backends"][0]["levels"][1]
    w = lv1["buckets"][0]
    lv1["stopped_by"] = {"rule": "abort p90(ttft) > 300ms per bucket", "metric": "ttft", "backend": "b0", "workload": "w0",
                         "level": 1, "scope": "bucket", "index": 0, "start": w["start"], "end": w["end"]}
    b.entry("b0")["sweep"]["probes"][1]["passed"] = False
    (sw,) = join(spec, b.build()).sweep
    high = sw.probes[1]
    assert high["status"] == "inconclusive" and not high["passed"]
    assert "fired on it; not judged a failure: the load generator was saturated in bucket 0 (" in high["why"], high["why"]  # its own, not "of" another level
    assert sw.result == 2.0 and sw.lower_bound is not None


@pytest.mark.parametrize("server_ms", [145, 350], ids=["the lag fired it", "the server fired it"])
def test_a_probe_a_timing_abort_stopped_on_the_clients_schedule_lag_alone_is_not_the_servers_failure(server_ms):
    """The 3 rps probe's load generator kept up (no saturated bucket) but sent each request
    160 ms late, within its client_schedule_lag; `abort p90(ttft) > 300ms per bucket` fired
    at 305 ms on a server answering in 145 ms from the send. The probe is INCONCLUSIVE in the
    search, not the server failing at 3 rps; where the server's own 350 ms fired it, it fails."""
    from soakspec.judge.testing import client_rows

    spec, b = _saturated_sweep(slow=False)
    lv0, lv1 = b.manifest["backends"][0]["levels"]
    b.client["b0"] = client_rows("b0", lv0["started_at"], lv1["drained_at"] + 1.0)  # healthy throughout
    for r in b.records["b0"]:
        if r["level"] == 1 and r.get("first_token") is not None:
            start = r["intended_start"] + 0.16
            r.update(start=start, first_byte=start + server_ms / 1000 - 0.01, first_token=start + server_ms / 1000,
                     end=start + server_ms / 1000 + 0.5, ttft=0.16 + server_ms / 1000, latency=0.66 + server_ms / 1000)
    sweep = _sweep_spec("rate = [2rps, 3rps]\n    rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7",
                        rule="require p90(ttft) < 200ms per level\n  client_schedule_lag = 1s")  # 160 ms late: not saturated
    spec = spec_from_text(sweep.replace("mode = closed", "mode = open").replace("duration = 10m", "duration = 1m")
                          .replace("bucket = 5m", "bucket = 20s"))
    w = lv1["buckets"][0]
    lv1["stopped_by"] = {"rule": "abort p90(ttft) > 300ms per bucket", "metric": "ttft", "op": ">", "threshold": 0.3,
                         "agg": "p", "percentile": 90.0, "observed": 0.16 + server_ms / 1000, "backend": "b0",
                         "workload": "w0", "level": 1, "scope": "bucket", "index": 0, "start": w["start"], "end": w["end"]}
    b.entry("b0")["sweep"]["probes"][1]["passed"] = False
    (sw,) = join(spec, b.build()).sweep
    high = sw.probes[1]
    assert not high["passed"]
    if server_ms == 145:
        assert high["status"] == "inconclusive", high["why"]
        assert ("fired on it; not judged a failure: the load generator's own schedule lag decided it (from the send it is "
                "145ms: p90(sent_ttft) over the same requests does not fire > 300ms") in high["why"], high["why"]
    else:
        assert high["status"] == "fail" and "schedule lag" not in high["why"], high["why"]
