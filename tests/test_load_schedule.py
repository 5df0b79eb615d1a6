"""The load models' time model in virtual time: `drive_level` under `trio.testing.MockClock`.

A fake connection "serves" each request in a fixed virtual latency, so the schedule, the
bucket edges, the closed loop's concurrency and the level's end are exact -- no sockets, no
real waiting, no timing tolerance. (tests/test_loadpaths.py runs whole levels over real sockets.)
"""

from __future__ import annotations

import math
import typing

import pytest
import trio
import trio.testing
from hypothesis import example, given, settings, strategies as st

from soakspec.lang import check, parse
from soakspec.plan import Level, LoadShape, plan
from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence
from soakspec.runner.load import LOAD_MODELS, LevelContext, Shapes, drive_level, schedule
from soakspec.runner.records import Outcome, RequestRecord


def level_of(load: str, *, duration: str = "10s", bucket: str = "2s", warmup: str = "0s", deadline: str = "30s") -> Level:
    text = (
        'soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
        f'workload "w" {{\n load {{\n {load}\n }}\n duration = {duration}\n bucket = {bucket}\n'
        f" warmup = {warmup}\n deadline = {deadline}\n follow_up = false\n}}\n"
    )
    spec, diags = check(parse(text)[0])
    assert spec is not None, diags
    return plan(spec).backends[0].levels[0]


class FakeServer:
    """Counts requests in flight; each takes `latency` seconds of virtual time."""

    def __init__(self, clock: RunClock, latency: float) -> None:
        self.clock = clock
        self.latency = latency
        self.in_flight = 0
        self.in_flight_at_start: list[int] = []

    def connect(self) -> FakeConnection:
        return FakeConnection(self)


class FakeConnection:
    def __init__(self, server: FakeServer) -> None:
        self.server = server

    async def send(self, shape, request_id, headers, record: RequestRecord, *, deadline: float) -> None:
        srv = self.server
        if record.start is None:  # as the real clients do (`load.Connection`): else the caller's
            record.start = srv.clock.now()
        srv.in_flight += 1
        srv.in_flight_at_start.append(srv.in_flight)
        try:
            await trio.sleep(srv.latency)
        finally:
            srv.in_flight -= 1
        record.end = srv.clock.now()
        record.outcome = Outcome.COMPLETED

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def drive(level: Level, latency: float):
    clock = RunClock(timer=trio.current_time, epoch=1000.0)
    server = FakeServer(clock, latency)
    records: list[RequestRecord] = []
    bucket_ends: list[tuple[int, float]] = []

    async def on_bucket(k: int) -> None:
        bucket_ends.append((k, clock.now()))

    ctx = LevelContext(
        "a", clock, server.connect, Shapes(level.request), records.extend, IdSequence("t"),
        on_bucket=on_bucket,
    )  # fmt: skip
    run = await drive_level(level, ctx)
    return run, records, bucket_ends, server


def run_virtual(level: Level, latency: float):
    return trio.run(drive, level, latency, clock=trio.testing.MockClock(autojump_threshold=0))


def test_open_loop_sends_on_the_planned_schedule():
    """Constant arrival: request i is due at start + i/rate, exactly rate × duration of them,
    each in the bucket of its intended start; none starts at or after the level's end."""
    level = level_of("mode = open\n rate = [4rps]\n arrival = constant")
    run, records, _, _ = run_virtual(level, latency=0.3)
    assert len(records) == level.min_requests == 40
    intended = sorted(r.intended_start - run.started_at for r in records)
    assert intended == pytest.approx([i / 4 for i in range(40)], abs=1e-9)
    assert all(r.start == pytest.approx(r.intended_start, abs=1e-9) for r in records)  # no lag behind the schedule
    for r in records:
        assert r.bucket == int((r.intended_start - run.measure_start) // 2.0)
    end = run.measure_start + level.duration_s
    assert max(r.start for r in records) < end


def test_poisson_schedule_is_seeded_by_the_plan():
    level = level_of("mode = open\n rate = [3rps]\n arrival = poisson\n seed = 7")
    run, records, _, _ = run_virtual(level, latency=0.1)
    want = list(schedule(3.0, "poisson", level.shape.seed, run.started_at, run.started_at + level.duration_s))
    assert sorted(r.intended_start for r in records) == pytest.approx(want, abs=1e-9)


def test_closed_loop_keeps_exactly_c_in_flight():
    """c workers, no barrier: c requests are in flight from the start to the level's end, so the
    measured in-flight mean is c; nobody starts a request after the end, and they all drain."""
    level = level_of("concurrency = [3]", duration="10s", bucket="5s")
    run, records, _, server = run_virtual(level, latency=0.7)
    assert max(server.in_flight_at_start) == 3
    assert server.in_flight_at_start[3:] == [3] * (len(records) - 3)  # each start refills to c
    assert run.mean_in_flight == pytest.approx(3.0, abs=1e-9)
    end = run.measure_start + level.duration_s
    assert all(r.start < end for r in records)
    assert len(records) == 3 * math.ceil(10 / 0.7)
    assert run.drained_at == pytest.approx(max(r.end for r in records), abs=1e-9)


def test_a_closed_loop_request_is_in_the_bucket_its_start_is_in_however_slow_its_prompt():
    """Closed loop: a request's bucket and its start are one clock read. Making each prompt
    takes 0.3 s here (virtual time: `MockClock.jump`, as a process preempted there would), so
    a bucket read before the prompt and a start read after it straddled bucket edges."""
    level = level_of("concurrency = [1]", duration="4s", bucket="1s")
    mock = trio.testing.MockClock(autojump_threshold=0)

    class SlowShapes(Shapes):
        def make(self, *args, **kw):
            mock.jump(0.3)
            return super().make(*args, **kw)

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=1000.0)
        server = FakeServer(clock, 0.15)  # a cycle of 0.45 s: prompts end across edges
        records: list[RequestRecord] = []
        ctx = LevelContext("a", clock, server.connect, SlowShapes(level.request), records.extend,
                           IdSequence("t"))  # fmt: skip
        return await drive_level(level, ctx), records

    run, records = trio.run(main, clock=mock)
    assert len(records) >= 6
    for r in records:
        assert r.bucket == min(int((r.start - run.measure_start) // 1.0), 3), (r.bucket, r.start - run.measure_start)


def test_bucket_ends_fire_at_the_planned_edges_after_the_warmup():
    level = level_of("concurrency = [1]", duration="5s", bucket="2s", warmup="1s")
    run, records, bucket_ends, _ = run_virtual(level, latency=0.25)
    m = run.measure_start
    assert m == pytest.approx(run.started_at + 1.0)
    assert bucket_ends == [(0, pytest.approx(m + 2.0)), (1, pytest.approx(m + 4.0)), (2, pytest.approx(m + 5.0))]
    assert [w["end"] - w["start"] for w in run.bucket_windows()] == pytest.approx([2.0, 2.0, 1.0])
    assert {r.bucket for r in records if r.start < m} == {-1}  # warmup requests belong to no bucket
    assert {r.bucket for r in records if r.start >= m} == {0, 1, 2}


def test_batches_of_n_run_back_to_back():
    """Batches of 6 at concurrency 2 with 1 s requests: 3 rounds of 2 per batch, batch after batch,
    and the last batch stops launching at the level's end."""
    level = level_of("mode = batch\n concurrency = [2]\n requests = 6", duration="10s", bucket="5s")
    run, records, _, server = run_virtual(level, latency=1.0)
    starts = sorted(r.start - run.started_at for r in records)
    assert starts == pytest.approx([float(k) for k in range(10) for _ in range(2)])
    assert max(server.in_flight_at_start) == 2


@settings(max_examples=25, deadline=None)
@given(
    rate=st.sampled_from(["1rps", "2rps", "5rps", "30rpm"]),
    duration=st.integers(4, 13),
    bucket=st.integers(1, 4),
    latency=st.floats(0.01, 3.0),
)
@example(rate="30rpm", duration=9, bucket=1, latency=1.0)  # 4.5 planned: the schedule sends 5 (0, 2, ..., 8 s)
def test_open_loop_counts_and_buckets_follow_the_plan(rate, duration, bucket, latency):
    """For any constant rate, duration and bucket: rate × duration requests, every planned bucket
    gets exactly the requests scheduled in its window, and latency does not change the schedule."""
    level = level_of(f"mode = open\n rate = [{rate}]\n arrival = constant", duration=f"{duration}s", bucket=f"{bucket}s")
    run, records, bucket_ends, _ = run_virtual(level, latency=latency)
    assert len(records) == level.min_requests
    assert [k for k, _ in bucket_ends] == [b.index for b in level.buckets]
    for b in level.buckets:
        lo, hi = run.measure_start + b.start_s, run.measure_start + b.start_s + b.length_s
        assert sum(1 for r in records if r.bucket == b.index) == sum(1 for r in records if lo <= r.intended_start < hi)


def test_every_planned_load_shape_has_a_load_model():
    """A load shape is declared once in the plan (`LoadShape`) and driven by one function here."""
    assert set(LOAD_MODELS) == set(typing.get_args(LoadShape))


class OutageServer(FakeServer):
    """Refuses connections (connect failed, nothing sent) or answers HTTP 500 at once from
    `down` to `up` seconds after `t0`; else serves like FakeServer."""

    def __init__(self, clock: RunClock, latency: float, down: float, up: float, how: str) -> None:
        super().__init__(clock, latency)
        self.down, self.up, self.how = down, up, how
        self.t0: float | None = None
        self.attempts_in_outage = 0

    def connect(self) -> FakeConnection:
        return OutageConnection(self)


class OutageConnection(FakeConnection):
    async def send(self, shape, request_id, headers, record: RequestRecord, *, deadline: float) -> None:
        srv = self.server
        now = srv.clock.now()
        if srv.t0 is None:
            srv.t0 = now
        if srv.down <= now - srv.t0 < srv.up:
            srv.attempts_in_outage += 1
            await trio.sleep(0.001)
            record.end = srv.clock.now()
            if srv.how == "refuse":
                record.outcome, record.error = Outcome.DISCONNECTED, "connect failed: connection refused (econnrefused)"
            else:
                record.first_byte, record.status = record.end, 500
                record.outcome, record.error = Outcome.FAILED, "HTTP 500: engine died"
            return
        await super().send(shape, request_id, headers, record, deadline=deadline)


def _drive_outage(load: str, how: str, down: float, up: float, duration: str = "10s"):
    from soakspec.runner.liveness import Health

    level = level_of(load, duration=duration)

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=1000.0)
        server = OutageServer(clock, 0.05, down, up, how)
        records: list[RequestRecord] = []
        ctx = LevelContext("a", clock, server.connect, Shapes(level.request), records.extend, IdSequence("t"),
                           health=Health(clock))  # fmt: skip
        run = await drive_level(level, ctx)
        server.stats = ctx.stats  # what the progress display counted
        server.held_s = ctx.health.held_s()  # worker-seconds held at the backoff gate
        return run, records, server

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("how", ["refuse", "http500"])
@pytest.mark.parametrize("up", [6.0, 11.0])  # the server comes back mid-level, or only after the level
def test_an_open_loop_arrival_during_an_outage_is_on_the_record_never_dropped_or_sent_late(how, up):
    """Open loop at 20 rps for 10 s; the server refuses connections (or answers HTTP 500 to
    everything) from 3 s on. Every one of the 200 arrivals has a record (an audit found the
    arrivals still waiting at the backoff gate when the level ended had none), each at its
    intended time: one held back by the gate is `disconnected` "held back: ..." at once, never
    sent late (its lateness would read as the client's schedule lag); the server gets a few
    tries a second while it fails, not every arrival."""
    run, records, server = _drive_outage("mode = open\n rate = [20rps]\n arrival = constant", how, 3.0, up)
    assert len(records) == 200
    assert all(r.start == pytest.approx(r.intended_start, abs=1e-6) for r in records)  # nothing late
    assert (server.stats.in_flight, server.stats.done) == (0, 200)  # held-back ones counted as started and ended
    held = [r for r in records if (r.error or "").startswith("held back: ")]
    assert held and all(r.outcome is Outcome.DISCONNECTED and r.first_byte is None and r.end == r.start for r in held)
    outage = [r for r in records if 3.0 <= r.intended_start - run.started_at < min(up, 10.0)]
    assert all(r.outcome is not Outcome.COMPLETED for r in outage)  # every arrival in it is the server's failure
    if how == "http500":
        assert "its last" in held[0].error and "HTTP 500: engine died" in held[0].error
    else:
        assert "refused" in held[0].error
    # tries during the outage: the streak (http500) or the first refusal, then about one a second
    assert server.attempts_in_outage <= (40 if how == "http500" else 8) + 2 * (min(up, 10.0) - 3.0), server.attempts_in_outage
    if up < 10.0:  # back: the arrivals after it are served again
        assert all(r.outcome is Outcome.COMPLETED for r in records if r.intended_start - run.started_at >= up + 1.5)


def test_a_closed_loop_against_a_server_that_fails_everything_backs_off():
    """Concurrency 8 against a server answering HTTP 500 at once from 2 s to 8 s: without the
    streak backoff each worker resent at once, thousands of requests (an audit counted 82,502 in
    6 s against a real one); with it the streak, then about one try a second."""
    run, records, server = _drive_outage("concurrency = [8]", "http500", 2.0, 8.0)
    assert server.attempts_in_outage <= 40 + 8 + 2 * 6, server.attempts_in_outage
    late = [r for r in records if r.start - run.started_at >= 9.0]
    assert late and all(r.outcome is Outcome.COMPLETED for r in late)  # the first completion opened the gate
    # the workers' wait at the gate is tallied (the judge does not read it as the client's
    # shortfall): about 7 of the 8 workers (one scouts) for most of the 6 s outage
    held = server.held_s
    assert 7 * 3.0 <= held <= 8 * 6.5, held


def test_an_arrival_that_waits_for_a_client_connection_is_charged_from_its_intended_time(monkeypatch):
    """vLLM #54101 (coordinated omission): an arrival that waits at a client-side limit before it
    is sent must not start its clock when the wait ends. With the open loop's connection cap at 2
    and 4 arrivals a second of 1 s each, arrivals queue in the client: every record's latency is
    its end minus its *intended* start (so it grows with the queue, 1 s to ~5.5 s here), and the
    wait is on the record as schedule lag (start - intended), which `client_healthy` judges."""
    import soakspec.runner.load as load_module

    monkeypatch.setattr(load_module, "OPEN_LOOP_MAX_CONNECTIONS", 2)
    level = level_of("mode = open\n rate = [4rps]\n arrival = constant", duration="5s", bucket="5s")
    run, records, _, server = run_virtual(level, latency=1.0)
    assert max(server.in_flight_at_start) == 2 and len(records) == 20
    for r in records:
        assert r.latency == pytest.approx(r.end - r.intended_start, abs=1e-9)
        assert r.start - r.intended_start >= -1e-9
    by_intent = sorted(records, key=lambda r: r.intended_start)
    # 2 connections, 4 arrivals a second: the k-th (from 0) is sent when the connection that
    # served arrival k - 2 is free again, at k // 2 s (+ 0.25 s for an odd k), and ends 1 s later
    sent = [k // 2 + 0.25 * (k % 2) for k in range(20)]
    assert [r.start - run.started_at for r in by_intent] == pytest.approx(sent, abs=1e-9)
    assert [r.latency for r in by_intent] == pytest.approx([s + 1 - k / 4 for k, s in enumerate(sent)], abs=1e-9)
    assert by_intent[-1].latency == pytest.approx(5.5)  # not the 1 s it took once sent


def _batch_level(c: int, n: int, duration: float, warmup: float, latency: float) -> Level:
    text = (
        'soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
        f'workload "w" {{\n load {{\n mode = batch\n concurrency = [{c}]\n requests = {n}\n }}\n'
        f" duration = {duration}s\n bucket = {duration}s\n warmup = {warmup}s\n expected_latency = {latency}s\n"
        " deadline = 30s\n follow_up = false\n}\n"
    )
    spec, diags = check(parse(text)[0])
    assert spec is not None, diags
    return plan(spec).backends[0].levels[0]


@settings(max_examples=40, deadline=None)
@given(
    c=st.integers(1, 6),
    n=st.integers(1, 13),
    duration=st.integers(1, 12),
    warmup=st.sampled_from([0, 1, 2]),
    latency=st.sampled_from([0.3, 0.7, 1.0, 1.5, 2.5]),
)
@example(c=8, n=2, duration=10, warmup=0, latency=1.0)  # the audit's: ~80 planned, 20 sent
@example(c=4, n=10, duration=10, warmup=0, latency=1.0)  # ~40 planned, 34 sent (batches of waves 4, 4, 2)
def test_a_batch_levels_expected_requests_are_what_its_batches_send(c, n, duration, warmup, latency):
    """With every request taking the workload's `expected_latency`, the plan expects the measured
    requests `_batch` sends: `requests` at a time from c workers, a barrier after each batch, no
    request started at or after the level's end (at least the one batch its minimum promises)."""
    level = _batch_level(c, n, duration, warmup, latency)
    _, records, _, _ = run_virtual(level, latency=latency)
    measured = sum(1 for r in records if r.bucket >= 0)
    assert level.expected_requests == max(level.min_requests, measured)
