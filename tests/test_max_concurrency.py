"""`max_concurrency = N` in an open-loop load: vLLM bench serve's `--request-rate R
--max-concurrency N`, k6's constant-arrival-rate `maxVUs`.

At most N of a level's requests are in flight (split over `--workers` processes so that the
shares add up to N); an arrival beyond waits for a slot in arrival order, none dropped. Its
latency and TTFT still run from its intended send time (the wait is what a user behind the cap
would see), and its record's `admitted` says when its slot was freed, so that the wait behind the
declared cap is not judged as the load generator's own schedule lag (client_healthy).
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, strategies as st

from soakspec.evidence.record import Record, RequestRecord, decode_line, schedule_lag
from soakspec.judge import judge
from soakspec.judge.testing import EvidenceBuilder
from soakspec.lang import check, fmt, parse
from soakspec.plan import Level, plan, render_text, to_json
from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence
from soakspec.runner.load import LevelContext, Shapes, drive_level, in_flight_share
from soakspec.runner.workers import processes_for

from runner_support import REPO
from test_clienthealth import _small_spec, _with_client
from test_load_schedule import FakeServer

HEAD = 'soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'


def _spec_text(load: str, extra: str = "duration = 10s\n  bucket = 5s") -> str:
    return HEAD + f'workload "w" {{\n  load {{\n    {load}\n  }}\n  {extra}\n  follow_up = false\n}}\n'


def _checked(load: str, extra: str = "duration = 10s\n  bucket = 5s"):
    return check(parse(_spec_text(load, extra))[0])


def _codes(load: str, extra: str = "duration = 10s\n  bucket = 5s") -> list[str]:
    return [d.code for d in _checked(load, extra)[1]]


# ---------------------------------------------------------------- check and fmt


@pytest.mark.parametrize("load, extra", [
    ("mode = open\n    rate = [10rps, 20rps]\n    max_concurrency = 4", "duration = 10s\n  bucket = 5s"),
    ("mode = open\n    arrival = poisson\n    max_concurrency = 2\n    phases {\n      a { rate = 5rps  duration = 1s }\n"
     "      b { rate = 5rps  ramp_to = 20rps  duration = 1s }\n    }", "bucket = 500ms"),
    ("mode = open\n    rate = [1rps, 9rps]\n    search = bisect\n    rate_step = 4rps\n    max_wall = 60s\n"
     "    max_concurrency = 3", "duration = 10s\n  bucket = 5s"),
])
def test_an_open_loop_takes_max_concurrency_in_every_level_and_phase(load, extra):
    spec, diags = _checked(load, extra)
    assert spec is not None and not [d for d in diags if d.severity.value == "error"], diags
    cap = spec.workloads[0].load.max_concurrency
    levels = plan(spec).backends[0].levels
    assert levels and cap in (2, 3, 4)
    assert all(lv.max_concurrency == cap for lv in levels)


def test_a_replay_takes_max_concurrency(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 8, "output_length": 4}) + "\n" for i in range(20)))
    text = HEAD + f'workload "w" {{\n  load {{\n    mode = replay\n    trace = "{trace}"\n    max_concurrency = 2\n  }}\n}}\n'
    spec, diags = check(parse(text)[0])
    assert spec is not None, diags
    (lv,) = plan(spec).backends[0].levels
    assert lv.max_concurrency == 2 and lv.label.endswith(", max_concurrency 2")


@pytest.mark.parametrize("mode", ["closed", "batch"])
def test_max_concurrency_in_a_closed_or_batch_loop_is_an_error_with_a_hint(mode):
    """A closed loop's requests in flight are its `concurrency`: a cap there is a mistake (a
    vLLM user who wrote --max-concurrency by habit), reported before anything runs."""
    load = f"mode = {mode}\n    concurrency = [4]\n    max_concurrency = 2" + ("\n    requests = 8" if mode == "batch" else "")
    spec, diags = _checked(load)
    (d,) = [d for d in diags if d.code == "E403"]
    assert spec is None and "'max_concurrency' caps an open loop's requests in flight" in d.message
    assert "concurrency = [2]" in d.hint and "mode = open" in d.hint and "--max-concurrency" in d.hint
    assert (d.span.line, d.span.column) == (7, 5)  # at the key


@pytest.mark.parametrize("value, code", [("0", "E204"), ("-1", "E204"), ("2.5", "E104"), ("10rps", "E104"), ("2000000", "E204")])
def test_max_concurrency_is_a_positive_integer(value, code):
    assert _codes(f"mode = open\n    rate = [10rps]\n    max_concurrency = {value}") == [code]


def test_fmt_keeps_max_concurrency():
    text = _spec_text("mode = open\n    rate = [10rps]\n    max_concurrency = 8")
    out = fmt(parse(text)[0])
    assert "max_concurrency = 8" in out
    assert check(parse(out)[0])[0].workloads[0].load.max_concurrency == 8


# ---------------------------------------------------------------- plan


def test_the_plan_prints_the_cap_and_without_one_the_connection_limit():
    capped = plan(_checked("mode = open\n    rate = [10rps]\n    max_concurrency = 2")[0])
    text = render_text(capped)
    assert "w / rate 10 rps, max_concurrency 2: 10s" in text
    assert "w in flight: at most 2 (max_concurrency; later arrivals wait in arrival order" in text
    doc = to_json(capped)
    (lv,) = doc["backends"][0]["levels"]
    assert lv["max_concurrency"] == 2 and lv["label"] == "rate 10 rps, max_concurrency 2"
    manifest_entry = capped.backends[0].levels[0].to_json()
    assert manifest_entry["max_concurrency"] == 2
    uncapped = plan(_checked("mode = open\n    rate = [10rps]")[0])
    assert "w in flight: up to 4096 (the load generator's connection limit" in render_text(uncapped)
    assert "max_concurrency" not in uncapped.backends[0].levels[0].to_json()  # as in evidence from before the key
    closed = render_text(plan(_checked("concurrency = [2]")[0]))
    assert "in flight:" not in closed


@given(cap=st.integers(1, 200), workers=st.integers(1, 40))
def test_the_processes_shares_of_the_cap_add_up_to_it(cap, workers):
    """Each process of a capped open-loop level gets at least one slot, and the shares sum to
    exactly max_concurrency, whatever --workers is (fewer processes when it is below it)."""
    level = plan(_checked(f"mode = open\n    rate = [10rps]\n    max_concurrency = {cap}")[0]).backends[0].levels[0]
    n = processes_for(level, workers)
    assert n == min(cap, workers)
    shares = [in_flight_share(cap, (p, n)) for p in range(n)]
    assert sum(shares) == cap and min(shares) >= 1 and max(shares) - min(shares) <= 1


def test_a_share_of_no_slot_is_refused():
    with pytest.raises(ValueError, match="no slot"):
        in_flight_share(2, (2, 3))


# ---------------------------------------------------------------- the runner, in virtual time


def _level(load: str, duration: str = "5s") -> Level:
    spec, diags = _checked(load, f"duration = {duration}\n  bucket = {duration}\n  deadline = 60s")
    assert spec is not None, diags
    return plan(spec).backends[0].levels[0]


async def _drive_parts(level: Level, latency: float, parts: int):
    """The level driven as `--workers parts` drives it: one `drive_level` per part, from one
    start, against one server (each process's slots are its share of the cap)."""
    clock = RunClock(timer=trio.current_time, epoch=1000.0)
    server = FakeServer(clock, latency)
    records: list[RequestRecord] = []
    t0 = clock.now() + 0.5
    async with trio.open_nursery() as n:
        for p in range(parts):
            ctx = LevelContext("a", clock, server.connect, Shapes(level.request), records.extend, IdSequence(f"t{p}"),
                               t0=t0, part=(p, parts))
            n.start_soon(drive_level, level, ctx)
    return t0, records, server


def _max_in_flight(records) -> int:
    """The most requests whose [start, end) overlap at any instant (from the records alone)."""
    events = sorted([(r.start, 1) for r in records] + [(r.end, -1) for r in records], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


@pytest.mark.parametrize("parts", [1, 2])
def test_arrivals_beyond_the_cap_wait_in_order_and_their_wait_is_latency_not_schedule_lag(parts):
    """4 arrivals a second of 1 s each under max_concurrency = 2: at most 2 in flight (in one
    process, or one slot in each of 2), every arrival sent (none dropped), in arrival order
    within its process; each waited request's record says when its slot was freed
    (`admitted`, the end of the request before it), its latency runs from its intended start
    (it grows with the queue: 5.5 s for the last, not the 1 s it took once sent), and its
    schedule lag -- the load generator's own lateness -- is zero."""
    level = _level("mode = open\n    rate = [4rps]\n    arrival = constant\n    max_concurrency = 2")
    t0, records, server = trio.run(_drive_parts, level, 1.0, parts, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(records) == 20 and max(server.in_flight_at_start) == 2 and _max_in_flight(records) == 2
    by_intent = sorted(records, key=lambda r: r.intended_start)
    sent = [k // 2 + 0.25 * (k % 2) for k in range(20)]  # the k-th waits for the slot arrival k - 2 frees
    assert [r.start - t0 for r in by_intent] == pytest.approx(sent, abs=1e-9)
    for k, r in enumerate(by_intent):
        assert r.latency == pytest.approx(r.end - r.intended_start, abs=1e-9) == pytest.approx(sent[k] + 1 - k / 4, abs=1e-9)
        if k < 2:  # a slot was free: nothing to wait for, any lateness would be the client's own
            assert r.admitted is None
        else:
            assert r.admitted == pytest.approx(r.start, abs=1e-9) and r.admitted > r.intended_start + 0.2
        assert schedule_lag(r.start, r.intended_start, r.admitted) == pytest.approx(0.0, abs=1e-9)
        assert r.freeze().schedule_lag == pytest.approx(0.0, abs=1e-6)
    assert by_intent[-1].latency == pytest.approx(5.5)


def test_without_a_cap_the_connection_limit_is_the_clients_schedule_lag(monkeypatch):
    """The hidden limit (OPEN_LOOP_MAX_CONNECTIONS) is the load generator's own resource: a wait
    for it is not a declared cap, so the record has no `admitted` and the wait is schedule lag."""
    import soakspec.runner.load as load_module

    monkeypatch.setattr(load_module, "OPEN_LOOP_MAX_CONNECTIONS", 2)
    level = _level("mode = open\n    rate = [4rps]\n    arrival = constant")
    _, records, _ = trio.run(_drive_parts, level, 1.0, 1, clock=trio.testing.MockClock(autojump_threshold=0))
    last = max(records, key=lambda r: r.intended_start)
    assert all(r.admitted is None for r in records)
    assert last.freeze().schedule_lag == pytest.approx(4.5, abs=1e-6)


# ---------------------------------------------------------------- the record and the judge


def test_admitted_is_checked_and_old_records_read_without_it():
    base = RequestRecord("r", backend="a", intended_start=10.0, start=12.0, end=13.0, admitted=11.5, error="x").freeze()
    line = json.loads(json.dumps(base.to_json()))
    assert decode_line(json.dumps(line).encode()).admitted == 11.5
    old = {k: v for k, v in line.items() if k != "admitted"}  # a record from before format 5
    rec = decode_line(json.dumps(old).encode())
    assert isinstance(rec, Record) and rec.admitted is None and rec.schedule_lag == 2.0
    assert base.schedule_lag == 0.5 and base.cap_wait == 1.5
    for bad, why in ((9.0, "before the intended start"), (12.5, "after the start")):
        got = Record(**{**{k: getattr(base, k) for k in base.__struct_fields__}, "admitted": bad})
        assert got.broken_rule() == ("/admitted", f"admitted is {why}")


def test_a_wait_behind_the_declared_cap_is_not_the_clients_saturation():
    """Every request of an open loop sent 200 ms after its intended time: without `admitted`
    the load generator fell behind (INCONCLUSIVE, tested in test_clienthealth.py); with it --
    each waited for a slot under the spec's max_concurrency that freed then -- the client kept
    up, and the latency the wait adds is judged as the server's: a FAIL."""
    text = "require p95(latency) < 250ms per bucket"
    spec = _small_spec(text, mode="open", levels="[2rps]\n    max_concurrency = 1")
    v = judge(spec, _with_client(_waited(EvidenceBuilder(spec, scheduled=False)).build(), lag=0.002, cpu=0.2))
    rules = {r.rule: r for r in v.rules}
    assert rules["client_healthy"].status == "pass", rules["client_healthy"].message
    assert rules[text.removeprefix("require ")].status == "fail"
    assert v.outcome == "FAIL"


def _waited(b: EvidenceBuilder, chained: bool = True) -> EvidenceBuilder:
    """Every measured request but the first sent 200 ms late, its record saying it waited for a
    slot then. `chained`: as a cap of 1 makes it -- the request before it held the slot and ended
    then, the slot handed on in the same instant; else nothing was in flight while it waited
    (a slot left idle: not what a runner that keeps to the cap writes)."""
    recs = sorted(b.measured("a"), key=lambda r: r["intended_start"])
    for prev, r in zip(recs, recs[1:]):
        r["admitted"] = r["start"] + 0.2
        for k in ("start", "first_byte", "first_token", "end"):
            if r[k] is not None:
                r[k] += 0.2
        r["latency"] = r["ttft"] = None  # derived from the intended start
        if chained:
            prev["end"], prev["latency"] = r["admitted"], None
    return b


def test_admitted_in_a_level_without_a_cap_cannot_hide_the_clients_lateness():
    """The same records in a level that declares no max_concurrency (an edited record, a broken
    runner): `admitted` made a load generator 200 ms behind its schedule read as healthy, and the
    latency it added FAILed as the server's. Without a declared cap `admitted` does not count:
    client_healthy sees the lag (the latency FAIL is blocked, INCONCLUSIVE), and completed_run
    names the records the runner would not have written."""
    spec = _small_spec("require p95(latency) < 250ms per bucket", mode="open", levels="[2rps]")
    v = judge(spec, _with_client(_waited(EvidenceBuilder(spec, scheduled=False)).build(), lag=0.002, cpu=0.2))
    rules = {r.rule: r for r in v.rules}
    assert rules["client_healthy"].status == "inconclusive" and "schedule lag" in rules["client_healthy"].message
    assert rules["completed_run"].status == "inconclusive"
    assert "carry admitted (a wait for a slot under max_concurrency), but the level declares no max_concurrency" in \
        rules["completed_run"].message
    assert v.outcome == "INCONCLUSIVE"


def test_the_reports_cap_note_counts_only_levels_that_declare_a_cap():
    """The reports' note under the Load generator table ("15 of 16 requests waited for a slot
    under max_concurrency ...") is the results' `cap_*` counts, which the judge makes only for a
    level that declares max_concurrency: records that carry `admitted` in a level without one
    (an edited record, a broken runner) give no note -- the wait is not the declared cap's."""
    from soakspec.judge.summary import summarize
    from soakspec.report.common import cap_notes

    notes = {}
    for levels in ("[2rps]", "[2rps]\n    max_concurrency = 1"):
        spec = _small_spec("require failed == 0", mode="open", levels=levels)
        notes[levels] = cap_notes(summarize(_with_client(_waited(EvidenceBuilder(spec, scheduled=False)).build(), lag=0.002, cpu=0.2), spec))
    assert notes["[2rps]"] == []
    assert [n.split(". ")[0] for n in notes["[2rps]\n    max_concurrency = 1"]] == [
        "a · rate 2 rps, max_concurrency 1: 15 of 16 requests waited for a slot under max_concurrency "
        "(worst bucket's p99 wait 200ms)"]


# ---------------------------------------------------------------- the judge checks the cap from the records


def _cap_rules(spec, b: EvidenceBuilder):
    v = judge(spec, _with_client(b.build(), lag=0.002, cpu=0.2))
    return v, {r.rule: r for r in v.rules}


def test_more_in_flight_than_the_cap_is_inconclusive_never_the_servers_fail():
    """Records of a level under max_concurrency = 1 whose requests overlap (10 s each, one
    every 7.5 s, none waited): the runner sent two at once. The cap excuses waits from schedule
    lag only because the judge proves it from the records: client_healthy is INCONCLUSIVE naming
    the level, the process and the counts, and the latency that load made is not FAILed as the
    server's."""
    text = "require p95(latency) < 250ms per bucket"
    spec = _small_spec(text, mode="open", levels="[2rps]\n    max_concurrency = 1")
    v, rules = _cap_rules(spec, EvidenceBuilder(spec, latency=10.0, scheduled=False))
    health = rules["client_healthy"]
    assert health.status == "inconclusive", health.message
    assert ("rate 2 rps, max_concurrency 1: the load generator did not keep to the declared cap (max_concurrency 1): "
            "the load process had up to 2 requests in flight at once, over its share of 1: 15 requests started with "
            "more than 1 in flight") in health.message
    assert rules[text.removeprefix("require ")].status == "inconclusive"
    assert v.outcome == "INCONCLUSIVE"


def test_errors_under_more_load_than_the_cap_are_not_the_servers_fail():
    """A server that failed requests while the runner sent more than the cap at once was not
    given the load the spec declared: `errors == 0` is INCONCLUSIVE, not FAIL; the same
    failure within the cap FAILs."""
    spec = _small_spec("require errors == 0", mode="open", levels="[2rps]\n    max_concurrency = 1")
    statuses = []
    for latency in (10.0, 1.0):
        b = EvidenceBuilder(spec, latency=latency, scheduled=False)
        b.set_outcome(next(iter(b.measured("a"))), "failed", "HTTP 500", status=500)
        v, rules = _cap_rules(spec, b)
        statuses.append((rules["errors == 0"].status, v.outcome))
        if latency > 1.0:
            message = rules["errors == 0"].message
            assert message.startswith("not judged, the load generator did not keep to the declared cap (backend a, rate 2 rps, "
                                      "max_concurrency 1: the load process had up to 2 requests in flight at once"), message
            assert message.count("did not keep to the declared cap") == 1, message
    assert statuses == [("inconclusive", "INCONCLUSIVE"), ("fail", "FAIL")]


def test_the_cap_is_checked_per_load_process_against_its_share():
    """max_concurrency = 2 over `--workers 2` (one slot each): process 1's records (odd workers)
    overlap while process 2 sends nothing at the time -- never more than 2 in flight in all, but
    2 in one process whose share is 1. Without --workers (one process, 2 slots) the same
    records keep to the cap."""
    spec = _small_spec("require failed == 0", mode="open", levels="[2rps]\n    max_concurrency = 2")
    b = EvidenceBuilder(spec, latency=10.0, scheduled=False)
    for k, r in enumerate(b.measured("a")):
        r["worker"] = 2 * k + 1  # process 2 of 2 would write even ones: all from process 1 (worker % 2 == 1)
    _, rules = _cap_rules(spec, b)
    assert rules["client_healthy"].status == "pass", rules["client_healthy"].message
    b.level("a", 0)["workers"] = 2
    _, rules = _cap_rules(spec, b)
    health = rules["client_healthy"]
    assert health.status == "inconclusive"
    assert ("load process 2 of 2 (records whose worker % 2 is 1) had up to 2 requests in flight at once, over its "
            "share of 1") in health.message


def test_a_failure_discounted_beside_a_level_off_its_cap_is_not_called_saturated():
    """Two capped levels fail errors == 0 per bucket; the first's records show two in flight
    under max_concurrency = 1, the second's keep to it. The second's FAIL stands; the first's is
    discounted, and the level beside it is named for what it was -- off its cap -- not
    "saturated", which client_healthy never said of it."""
    spec = _small_spec("require errors == 0 per bucket", mode="open", levels="[2rps, 3rps]\n    max_concurrency = 1")
    b = EvidenceBuilder(spec, latency=10.0, scheduled=False)
    for r in b.measured("a", 1):
        r["end"] = r["start"] + 0.05
    for level in (0, 1):
        b.set_outcome(next(iter(b.measured("a", level))), "failed", "HTTP 500", status=500)
    _, rules = _cap_rules(spec, b)
    errors = rules["errors == 0 per bucket"]
    assert errors.status == "fail", errors.message
    assert ("1 failing bucket discounted, the load generator did not keep to the declared cap in time with it: "
            "backend a, rate 2 rps, max_concurrency 1, bucket 0") in errors.message, errors.message
    assert errors.message.endswith(" (off its cap: backend a, rate 2 rps, max_concurrency 1)"), errors.message
    assert "saturated" not in errors.message, errors.message


def test_records_that_name_no_process_cannot_prove_a_split_cap():
    """max_concurrency = 2 over `--workers 2`, 3 of the records with no `worker` (the request
    schema allows null; the runner never writes it): no process's share can be proven from
    records whose process is unknown, so client_healthy is INCONCLUSIVE saying so -- not a
    pass that left them out -- and a count FAIL under that load is not judged, said once. One
    process needs no worker: the same records pass."""
    spec = _small_spec("require errors == 0", mode="open", levels="[2rps]\n    max_concurrency = 2")
    b = EvidenceBuilder(spec, scheduled=False)
    for k, r in enumerate(b.measured("a")):
        r["worker"] = None if k < 3 else k
    b.set_outcome(next(iter(b.measured("a"))), "failed", "HTTP 500", status=500)
    _, rules = _cap_rules(spec, b)
    assert rules["client_healthy"].status == "pass", rules["client_healthy"].message
    b.level("a", 0)["workers"] = 2
    v, rules = _cap_rules(spec, b)
    health = rules["client_healthy"]
    assert health.status == "inconclusive", health.message
    assert ("rate 2 rps, max_concurrency 2: the records cannot show that the load generator kept to the declared cap "
            "(max_concurrency 2): 3 records name no worker, so which of the level's 2 load processes (--workers) sent "
            "them is unknown and no process's share of the cap can be checked") in health.message, health.message
    errors = rules["errors == 0"]
    assert errors.status == "inconclusive" and v.outcome == "INCONCLUSIVE"
    assert errors.message.startswith("not judged, the records cannot show that the load generator kept to the declared "
                                     "cap (backend a, rate 2 rps, max_concurrency 2: 3 records name no worker"), errors.message


def test_the_warm_up_holds_the_same_slots():
    """A warm-up request (bucket -1, not measured) still in flight when the first measured one
    starts under max_concurrency = 1: two at once, though the measured records alone never
    overlap -- the warm-up's requests held the level's slots too."""
    spec = _small_spec("require failed == 0", mode="open", levels="[2rps]\n    max_concurrency = 1")
    b = EvidenceBuilder(spec, scheduled=False)
    first = min(b.measured("a"), key=lambda r: r["start"])
    warm = b.request("a", "w", 0, -1, first["start"] - 1.0, conc=None, rate=2.0)
    warm["end"], warm["latency"] = first["start"] + 0.5, None
    b.records["a"].insert(0, warm)
    _, rules = _cap_rules(spec, b)
    assert ("the load process had up to 2 requests in flight at once, over its share of 1: 1 request started with "
            "more than 1 in flight") in rules["client_healthy"].message


def test_a_wait_while_a_slot_was_free_is_inconclusive():
    """Records that say every request waited 200 ms for a slot under max_concurrency = 1 while
    nothing was in flight: the queue was not work-conserving (a slot lost, a smaller cap than
    declared), so the wait the cap would excuse from schedule lag is the load generator's own.
    The same waits behind a request that held the slot until then pass (the test above)."""
    text = "require p95(latency) < 250ms per bucket"
    spec = _small_spec(text, mode="open", levels="[2rps]\n    max_concurrency = 1")
    v, rules = _cap_rules(spec, _waited(EvidenceBuilder(spec, scheduled=False), chained=False))
    health = rules["client_healthy"]
    assert health.status == "inconclusive", health.message
    assert ("did not keep to the declared cap (max_concurrency 1): the load process: 15 of its 15 requests that waited "
            "for a slot waited while fewer than its share of 1 were in flight (a free slot left idle)") in health.message
    assert rules[text.removeprefix("require ")].status == "inconclusive" and v.outcome == "INCONCLUSIVE"


def test_a_wait_within_the_gates_schedule_lag_limit_is_not_held_against_the_queue():
    """A wait no longer than client_schedule_lag (50 ms by default) is not checked: the records
    leave out the moments between a slot's taking and the request's start and between its end
    and the slot's release, the client lateness the gate allows already."""
    spec = _small_spec("require failed == 0", mode="open", levels="[2rps]\n    max_concurrency = 1")
    b = EvidenceBuilder(spec, scheduled=False)
    for r in b.measured("a"):
        r["admitted"] = r["start"] = r["intended_start"] + 0.04
    _, rules = _cap_rules(spec, b)
    assert rules["client_healthy"].status == "pass", rules["client_healthy"].message


def _fifo_records(arrivals, service, lags, cap: int, parts: int, more: int = 0) -> list[dict]:
    """A reference of what a runner that keeps to the cap writes (`load._arrivals`, `Slots`):
    arrival i (intended time `arrivals[i]`, ascending) goes to process i % parts, which holds
    `in_flight_share(cap, ...)` slots (`more`: that many more, or fewer) handed on first come,
    first served. Each request takes its
    slot `lags[i][0]` after it fell due (or the instant a slot is released to it), is sent
    `lags[i][1]` later, runs `service[i]` and releases its slot `lags[i][2]` after its end;
    `admitted` is the release that handed it the slot where it had to wait. Times rounded to
    1 us as on disk."""
    import heapq

    out = []
    for p in range(parts):
        share = in_flight_share(cap, (p, parts)) + more
        free = [0.0] * share  # when each slot is released next, a min-heap
        conns = 0
        for i in range(p, len(arrivals), parts):
            due = arrivals[i] + lags[i][0]
            freed = heapq.heappop(free)
            admitted = freed if freed > due else None
            taken = max(due, freed)
            start = taken + lags[i][1]
            end = start + service[i]
            heapq.heappush(free, end + lags[i][2])
            out.append({"worker": conns * parts + p, "intended_start": round(arrivals[i], 6),
                        "admitted": None if admitted is None else round(admitted, 6), "start": round(start, 6),
                        "end": round(end, 6)})
            conns += 1
    return out


def _check(recs: list[dict], cap: int, parts: int, tol: float = 0.05):
    import numpy as np

    from soakspec.judge.capproof import breaches

    def col(k):
        return np.array([math.nan if r[k] is None else r[k] for r in recs], dtype=np.float64)

    return breaches(np.array([r["worker"] for r in recs], dtype=np.int64), col("intended_start"), col("start"),
                    col("admitted"), col("end"), cap, parts, tol)


@given(st.data())
def test_records_of_a_fifo_cap_never_flag_and_a_slot_more_or_less_does(data):
    """Property: records a first-come-first-served cap writes (`_fifo_records`: any arrivals,
    service times, processes, and client delays of up to 5 ms around each request) never show
    a process over its share nor a wait with a slot free. The same arrivals sent with a slot
    more in every process are flagged over the share whenever they put more in flight at once;
    with a slot fewer (a slot lost), every process that kept a request waiting longer than the
    tolerance is flagged for a wait with a slot free, and none for being over."""
    cap = data.draw(st.integers(1, 6), label="cap")
    parts = data.draw(st.integers(1, cap), label="parts")
    n = data.draw(st.integers(1, 60), label="n")
    gaps = data.draw(st.lists(st.floats(0.0, 0.5), min_size=n, max_size=n), label="gaps")
    arrivals = list(itertools.accumulate(gaps, initial=1000.0))[1:]
    service = data.draw(st.lists(st.floats(0.001, 2.0), min_size=n, max_size=n), label="service")
    lags = data.draw(st.lists(st.tuples(*[st.floats(0.0, 0.005)] * 3), min_size=n, max_size=n), label="lags")
    assert _check(_fifo_records(arrivals, service, lags, cap, parts), cap, parts) == []
    more = _fifo_records(arrivals, service, lags, cap, parts, more=1)
    over = _check(more, cap, parts)
    assert all(b.kind == "over" for b in over)
    assert {b.process for b in over} == {p for p in range(parts) if _max_in_flight_of(more, p, parts) > in_flight_share(cap, (p, parts))}
    if all(in_flight_share(cap, (p, parts)) >= 2 for p in range(parts)):
        less = _fifo_records(arrivals, service, lags, cap, parts, more=-1)
        idle = _check(less, cap, parts)
        assert all(b.kind == "idle" for b in idle)
        waited = {r["worker"] % parts for r in less if r["admitted"] is not None and r["admitted"] - r["intended_start"] > 0.05}
        assert {b.process for b in idle} == waited


def _max_in_flight_of(recs: list[dict], p: int, parts: int) -> int:
    mine = [r for r in recs if r["worker"] % parts == p]
    begin = [r["admitted"] if r["admitted"] is not None else r["start"] for r in mine]
    events = sorted([(b, 1) for b in begin] + [(r["end"], -1) for r in mine])
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def test_records_of_the_runner_keep_to_the_cap():
    """The in-process runner's own records (4 arrivals a second of 1 s each under a cap of 2,
    in 1 and in 2 processes, on a virtual clock: a slot's release and the next holder's
    `admitted` are the same instant) pass both checks."""
    level = _level("mode = open\n    rate = [4rps]\n    arrival = constant\n    max_concurrency = 2")
    for parts in (1, 2):
        _, records, _ = trio.run(_drive_parts, level, 1.0, parts, clock=trio.testing.MockClock(autojump_threshold=0))
        recs = [{k: getattr(r, k) for k in ("worker", "intended_start", "admitted", "start", "end")} for r in records]
        assert sum(r["admitted"] is not None for r in recs) >= 10
        assert _check(recs, 2, parts) == []
        assert [b.kind for b in _check(recs, 1, 1)] == ["over"]  # judged against a cap of 1: two at once


# ---------------------------------------------------------------- a real run against the simulator


def _sim_spec(tmp_path: Path) -> Path:
    """A server of ~150 ms a request behind a cap of 2 (~13 requests/s) offered 30 requests/s
    for 1 s: the arrivals queue behind the cap for up to ~2 s. The client's event-loop and
    schedule-lag limits are lenient for a busy test machine, and still far below the queue."""
    path = tmp_path / "cap.soak"
    path.write_text(textwrap.dedent("""\
        soak "cap" {}
        backend "a" {
          sim {
            ttft = 80ms
            itl = 10ms
          }
        }
        workload "w" {
          prompt_words = 8
          max_tokens = 8
          load {
            mode = open
            rate = [30rps]
            arrival = constant
            max_concurrency = 2
          }
          duration = 1s
          bucket = 500ms
          deadline = 30s
          follow_up = false
        }
        gate {
          client_lag = 500ms
          client_cpu = 100%
          client_schedule_lag = 250ms
          require failed == 0
        }
        """))
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_a_slow_server_behind_a_cap_of_two_is_never_sent_more_and_the_run_is_not_inconclusive(tmp_path, workers):
    spec = _sim_spec(tmp_path)
    out = tmp_path / "ev"
    proc = subprocess.run([sys.executable, "-m", "soakspec", "run", str(spec), "--out", str(out), "--quiet",
                           "--workers", str(workers)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with gzip.open(out / "backends" / "a" / "requests.jsonl.gz", "rt") as fh:
        records = [decode_line(line.encode()) for line in fh]
    load = [r for r in records if r.bucket >= 0]
    assert len(load) == 30 and all(r.outcome.value == "completed" for r in load)
    assert _max_in_flight(load) <= 2  # the total cap, whichever process sent them
    waited = [r for r in load if r.admitted is not None]
    assert len(waited) >= 20  # the queue: most arrivals found no slot free
    for r in load:
        assert r.latency == pytest.approx(r.end - r.intended_start, abs=2e-6)  # the wait is in the latency
    assert max(r.latency for r in load) > 1.0 > 0.5 > max(r.end - r.start for r in load)
    # from the send (bench serve's TTFT): the simulator's own 80 ms, where ttft counts the queue too
    sent = sorted(r.sent_ttft for r in load)
    assert sent[len(sent) // 2] == pytest.approx(0.08, abs=0.04) and sent[-1] < 0.5 < 1.0 < max(r.ttft for r in load)
    # the client itself kept up: its lag is a few ms (the limits are lenient for a busy test
    # machine; read as start - intended_start, the queue's ~2 s made it INCONCLUSIVE)
    assert max(r.schedule_lag for r in load) < 0.25 < 1.0 < max(r.start - r.intended_start for r in load)
    verdict = json.loads((out / "verdict.json").read_text())
    health = next(r for r in verdict["rules"] if r["rule"] == "client_healthy")
    assert health["status"] == "pass" and verdict["exit_code"] == 0, health
    # the judge proved the cap from the records (per process, warm-up included): kept to it
    assert "it kept to max_concurrency in 1 capped level" in health["message"], health
    recs = [{k: getattr(r, k) for k in ("worker", "intended_start", "admitted", "start", "end")} for r in records if r.bucket >= -1]
    assert _check(recs, 2, workers, tol=0.25) == [] and [b.kind for b in _check(recs, 1, 1, tol=0.25)] == ["over"]
    (summary,) = json.loads((out / "results.json").read_text())["backends"][0]["levels"]
    assert summary["sent_ttft"]["p50"] == pytest.approx(0.08, abs=0.04) and summary["ttft"]["p50"] > 0.5
    manifest = json.loads((out / "manifest.json").read_text())
    (lv,) = manifest["backends"][0]["levels"]
    assert lv["max_concurrency"] == 2 and lv.get("workers", 1) == workers
    report = subprocess.run([sys.executable, "-m", "soakspec", "report", str(out), "--format", "md"], cwd=REPO,
                            capture_output=True, text=True, timeout=60).stdout
    assert f"a · rate 30 rps, max_concurrency 2: {len(waited)} of 30 requests waited for a slot under max_concurrency" in report
    if workers == 1:
        html = subprocess.run([sys.executable, "-m", "soakspec", "report", str(out), "--format", "html"], cwd=REPO,
                              capture_output=True, text=True, timeout=60).stdout
        assert f"{len(waited)} of 30 requests waited for a slot under max_concurrency" in html
        # judged with a spec that declares no cap: not the level that ran
        nocap = tmp_path / "nocap.soak"
        nocap.write_text(spec.read_text().replace("    max_concurrency = 2\n", ""))
        gate = subprocess.run([sys.executable, "-m", "soakspec", "gate", str(out), "--spec", str(nocap), "--format", "json"],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        ran = next(r for r in json.loads(gate.stdout)["rules"] if r["rule"] == "completed_run")
        assert ran["status"] != "pass" and "ran with max_concurrency 2 (the spec plans none)" in ran["message"], ran


def test_run_warns_when_the_cap_is_below_workers(capsys):
    """`--workers 4` with max_concurrency = 2: the level runs in 2 processes, one slot each,
    and `soakspec run` says so before it starts, with what to do."""
    from soakspec.commands.run import _warn_capped_workers

    the_plan = plan(_checked("mode = open\n    rate = [10rps, 20rps]\n    max_concurrency = 2")[0])
    _warn_capped_workers(the_plan, 4)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1  # once for the workload, not per level
    assert "max_concurrency = 2, fewer than --workers 4: its levels run in 2 load processes" in err
    assert "hint: pass --workers 2 or fewer" in err
    _warn_capped_workers(the_plan, 2)
    assert capsys.readouterr().err == ""
