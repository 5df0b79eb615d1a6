"""A timing FAIL that the load generator's own schedule lag decided is INCONCLUSIVE, never the
server's (README "Client health": "the schedule lag within its allowance").

Seen on a real vLLM sweep: an open-loop probe at 12 rps FAILed `p50(ttft) < 250ms` at 304 ms
while the client sent each request 159 ms late (p50; within the lane's client_schedule_lag of
1 s, so no bucket was saturated) and the server's own first tokens all came within 250 ms of
the send. TTFT from the intended start is right to hold the lateness (coordinated omission),
but when the lateness is what carries it over the threshold the verdict must not blame the
server. A figure the server fails from the send too and a closed loop keep their FAIL. At a
capped level (max_concurrency) the level's slot queue is replayed as an on-time client would
have driven it (a late client holds its slot late, so the recorded queue holds its lateness
too): the wait the user's declared cap itself makes stays in the figure; a FAIL that queue
carries stands."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from soakspec.judge import judge
from soakspec.judge.testing import EvidenceBuilder, small_spec

RULE = "p50(ttft) < 250ms per level"
ALLOWANCE = "client_schedule_lag = 1s"  # the lane's: a client 160 ms late is not saturated


def _spec(rule: str = RULE, *, mode: str = "open", levels: str = "[2rps]", gate: str = ALLOWANCE):
    return small_spec(f"require {rule}", mode=mode, levels=levels, gate=gate)


def _timed(b: EvidenceBuilder, *, lag: float, ttft: float, level: int | None = None) -> EvidenceBuilder:
    """Every measured request sent `lag` after its intended start and answered its first token
    `ttft` after the send (its end 1 s after the first token); ttft and latency from the intended
    start, as the runner writes them."""
    for r in b.measured("a", level):
        i = r["intended_start"]
        start = i + lag
        r.update(start=start, first_byte=start + ttft - 0.01, first_token=start + ttft, end=start + ttft + 1.0,
                 ttft=lag + ttft, latency=lag + ttft + 1.0)
    return b


def _rule(v, text: str = RULE):
    return next(r for r in v.rules if r.rule == text)


def test_a_fail_the_clients_schedule_lag_decides_is_inconclusive_naming_both_figures_and_the_lag():
    spec = _spec()
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    ttft = _rule(v)
    health = _rule(v, "client_healthy")
    assert health.status == "pass", health.message  # 160 ms late is within the allowance: no saturated bucket
    assert ttft.status == "inconclusive", ttft.message
    assert ttft.message.startswith("not judged, the load generator's own schedule lag decided it: backend a, rate 2 rps: "), ttft.message
    assert "p50(ttft) = 305ms fails < 250ms" in ttft.message, ttft.message
    assert "measured from the actual send (p50(sent_ttft)) it is 145ms" in ttft.message, ttft.message
    assert "schedule lag (p50(schedule_lag) = 160ms) decides it" in ttft.message, ttft.message
    assert v.outcome == "INCONCLUSIVE"


def test_latency_is_judged_the_same_way():
    rule = "p50(latency) < 1.25s per level"
    spec = _spec(rule)
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    assert _rule(v, rule).status == "inconclusive" and "p50(sent_latency)" in _rule(v, rule).message
    assert v.outcome == "INCONCLUSIVE"


def test_a_server_slow_from_the_send_too_still_fails():
    spec = _spec()
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.3).build())
    ttft = _rule(v)
    assert ttft.status == "fail", ttft.message
    assert "schedule lag" not in ttft.message and "not judged" not in ttft.message
    assert v.outcome == "FAIL"


def test_the_fail_stands_on_the_level_the_server_failed_and_names_the_one_the_lag_decided():
    spec = _spec(levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    _timed(b, lag=0.2, ttft=0.145, level=0)  # the worst level, but the lag's
    _timed(b, lag=0.0, ttft=0.3, level=1)  # the server's own
    v = judge(spec, b.build())
    ttft = _rule(v)
    assert ttft.status == "fail", ttft.message
    assert ttft.message.startswith("backend a, rate 4 rps: p50(ttft) = 300ms"), ttft.message
    assert "1 failing level discounted, the load generator's own schedule lag decided it: backend a, rate 2 rps" in ttft.message
    assert ttft.failing == 1 and ttft.where.level == 1
    assert v.outcome == "FAIL"


def test_a_capped_levels_wait_for_a_slot_is_the_users_and_its_fail_stands():
    """Under max_concurrency the time from the intended start holds the wait for a slot under
    the declared cap (what users see), not only the client's lateness: the FAIL stands."""
    spec = _spec(levels="[2rps]\n    max_concurrency = 1", gate="")
    b = EvidenceBuilder(spec, scheduled=False).with_client()
    recs = sorted(b.measured("a"), key=lambda r: r["intended_start"])
    for prev, r in zip(recs, recs[1:]):  # each waited 200 ms for the slot the one before held
        r["admitted"] = r["start"] + 0.2
        for k in ("start", "first_byte", "first_token", "end"):
            r[k] += 0.2
        r["latency"] = r["ttft"] = None  # derived from the intended start
        prev["end"], prev["latency"] = r["admitted"], None
    v = judge(spec, b.build())
    assert _rule(v, "client_healthy").status == "pass", _rule(v, "client_healthy").message
    ttft = _rule(v)
    assert ttft.status == "fail", ttft.message  # p50(ttft) 300 ms, p50(sent_ttft) 100 ms: the cap's wait
    assert v.outcome == "FAIL"


def _fifo(rows: list[dict], *, cap: int, late, ttft, service, workers: int = 1, spacing: float | None = 0.5) -> list[dict]:
    """`rows` (one level's, warm-up included) driven as the runner drives an open loop under
    `max_concurrency = cap` split over `workers` processes (`runner/load.py` `_arrivals`,
    `Slots`): arrival k (in intended-start order; re-spaced `spacing` apart inside its bucket
    where given) is process k % workers's, its `worker` k % workers; each process admits its
    arrivals FIFO into its share of the cap, a waiting one `admitted` when a slot frees; the
    client sends it `late` after it could go (its slot, or its intended start) and holds the
    slot until its end; the server answers its first token `ttft` and ends `service` after the
    send. `late`, `ttft`, `service`: a number, or a function of the arrival's index. ttft and
    latency from the intended start, derived as the runner's reader derives them."""
    from soakspec.shares import in_flight_share

    val = lambda v, k: v(k) if callable(v) else v  # noqa: E731
    rows = sorted(rows, key=lambda r: r["intended_start"])
    if spacing is not None:
        by_bucket: dict[int, list[dict]] = {}
        for r in rows:
            by_bucket.setdefault(r["bucket"], []).append(r)
        for rs in by_bucket.values():
            t0 = rs[0]["intended_start"]
            for k, r in enumerate(rs):
                r["intended_start"] = t0 + k * spacing
        rows.sort(key=lambda r: r["intended_start"])
    parts = max(1, min(workers, cap))
    free = [[-1e18] * in_flight_share(cap, (p, parts)) for p in range(parts)]
    for k, r in enumerate(rows):
        p, i = k % parts, r["intended_start"]
        slot = min(free[p])
        free[p].remove(slot)
        adm = slot if slot > i else None
        start = (adm if adm is not None else i) + val(late, k)
        r.update(worker=p, admitted=adm, start=start, first_byte=start + val(ttft, k) - 0.01, first_token=start + val(ttft, k),
                 end=start + val(service, k), ttft=None, latency=None)
        free[p].append(r["end"])
    return rows


def _queued(spec, *, late, ttft=0.145, service=0.47, cap: int = 1, workers: int = 1, spacing: float = 0.5,
            per_bucket: int = 40) -> EvidenceBuilder:
    """Backend a's level 0 of `spec` (an open loop under max_concurrency `cap`) driven by `_fifo`."""
    b = EvidenceBuilder(spec, scheduled=False, per_bucket=per_bucket).with_client()
    if workers > 1:
        b.entry("a")["levels"][0]["workers"] = workers
    _fifo([r for r in b.records["a"] if r.get("level") == 0 and r.get("bucket", -2) >= -1], cap=cap, late=late, ttft=ttft,
          service=service, workers=workers, spacing=spacing)
    return b


ONE_SLOT = "[2rps]\n    max_concurrency = 1"


def test_client_lateness_that_builds_the_caps_queue_is_the_clients_not_the_servers():
    """The reviewer's case: 2 rps under max_concurrency 1, the server answering its first token
    145 ms and ending 470 ms after the send. Sent on time there is never a queue: p50(ttft) =
    145 ms, a PASS. A client 45 ms late after each slot (within the default 50 ms allowance:
    client_healthy passes) also holds each slot 45 ms longer, so the slot is held 515 ms a
    request at 500 ms arrivals: the queue grows from the client's lateness alone and p50(ttft)
    is 483 ms. `ttft - schedule_lag` kept that queue (it is in `admitted`) and FAILed the
    server; the queue replayed as an on-time client would have driven it has no wait."""
    spec = _spec(levels=ONE_SLOT, gate="")
    on_time = judge(spec, _queued(spec, late=0.0).build())
    assert _rule(on_time).status == "pass", _rule(on_time).message
    v = judge(spec, _queued(spec, late=0.045).build())
    assert _rule(v, "client_healthy").status == "pass", _rule(v, "client_healthy").message
    ttft = _rule(v)
    assert ttft.status == "inconclusive", ttft.message
    assert ttft.message.startswith("not judged, the load generator's own schedule lag decided it: backend a, "), ttft.message
    assert ("p50(ttft) = 483ms fails < 250ms, but measured less the load generator's own lateness (p50(ttft with the slot "
            "queue replayed on time), the wait for a slot under max_concurrency as an on-time load generator would have met "
            "it) it is 145ms: the load generator's own schedule lag (p50(schedule_lag) = 45ms after each slot, and the queue that lateness built) decides it") in ttft.message, ttft.message
    assert v.outcome == "INCONCLUSIVE"
    rule = "p50(latency) < 600ms per level"
    spec = _spec(rule, levels=ONE_SLOT, gate="")
    lat = _rule(judge(spec, _queued(spec, late=0.045).build()), rule)
    assert lat.status == "inconclusive" and "p50(latency with the slot queue replayed on time)" in lat.message, lat.message


def test_a_queue_the_cap_itself_builds_keeps_its_fail():
    """The server ends each request 520 ms after the send at 500 ms arrivals under max_concurrency
    1: the cap's own queue grows with an on-time client too, and the wait behind the user's
    declared cap is what users see. Replayed on time the figure still fails: the FAIL stands,
    late client or not (and the send figure, 145 ms, would have hidden it)."""
    spec = _spec(levels=ONE_SLOT)
    for late in (0.0, 0.045):
        v = judge(spec, _queued(spec, late=late, service=0.52).build())
        ttft = _rule(v)
        assert ttft.status == "fail", ttft.message
        assert "schedule lag" not in ttft.message and "not judged" not in ttft.message
        assert v.outcome == "FAIL"


@pytest.mark.parametrize(("workers", "service", "status"), [(1, 0.47, "inconclusive"), (1, 0.52, "fail"),
                                                             (2, 0.47, "inconclusive"), (2, 0.52, "fail")])
def test_a_share_of_several_slots_and_a_level_split_over_processes_are_replayed(workers, service, status):
    """max_concurrency 2 at 4 rps: one process with both slots (its arrivals 250 ms apart), or
    two processes (`workers 2`) with one slot each (each one's arrivals 500 ms apart). The client
    45 ms late after each slot builds a queue from its lateness alone where the server ends in
    470 ms (INCONCLUSIVE); where it ends in 520 ms the cap's own queue fails on time too (FAIL)."""
    spec = _spec(levels="[4rps]\n    max_concurrency = 2", gate="")
    on_time = judge(spec, _queued(spec, late=0.0, service=service, cap=2, workers=workers, spacing=0.25).build())
    assert _rule(on_time).status == ("pass" if status == "inconclusive" else "fail"), _rule(on_time).message
    v = judge(spec, _queued(spec, late=0.045, service=service, cap=2, workers=workers, spacing=0.25).build())
    assert _rule(v, "client_healthy").status == "pass", _rule(v, "client_healthy").message
    assert _rule(v).status == status, _rule(v).message
    if status == "inconclusive":
        assert "(p50(ttft with the slot queue replayed on time), " in _rule(v).message, _rule(v).message
        assert "would have met it) it is 145ms: " in _rule(v).message, _rule(v).message


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cap=st.integers(1, 3), slow=st.floats(0.3, 0.6), lag=st.floats(0.0, 0.5))
def test_schedule_lag_never_turns_a_capped_servers_pass_into_a_fail(seed, cap, slow, lag):
    """Per-request service times and first tokens (the server's), per-request lateness (the
    client's, within its allowance), a FIFO cap of `cap` slots at 2 rps driven as the runner
    drives it (`_fifo`): a server and cap that PASS with the client on time are never FAILed for
    the client's lateness -- however much of the queue the lateness built."""
    import random

    rng = random.Random(seed)
    n = 200
    service = [rng.uniform(0.05, slow * cap) for _ in range(n)]
    first = [rng.uniform(0.01, min(0.2, s)) for s in service]
    late = [rng.uniform(0.0, lag) for _ in range(n)]
    spec = _spec(levels=f"[2rps]\n    max_concurrency = {cap}")
    mk = lambda late_of: _queued(spec, late=late_of, ttft=first.__getitem__, service=service.__getitem__, cap=cap)  # noqa: E731
    on_time = judge(spec, mk(0.0).build())
    assume(_rule(on_time).status == "pass")
    late_v = judge(spec, mk(late.__getitem__).build())
    assert _rule(late_v).status != "fail", _rule(late_v).message
    assert late_v.outcome != "FAIL"


def _gains(rows: list[tuple], *, cap: int = 1, parts: int = 1):
    """capreplay.gains over (worker, intended, start, end, server_ended) rows."""
    import numpy as np

    from soakspec.judge.capreplay import gains

    w, i, s, e, srv = (np.array(c) for c in zip(*rows))
    return gains(w.astype(np.int64), i.astype(float), s.astype(float), e.astype(float), srv.astype(bool), cap, parts).tolist()


def test_a_request_the_client_cut_short_holds_its_slot_until_its_end_in_the_replay():
    """A timed-out request's deadline counts from its intended start: it ends at 5 s however
    late it was sent, and its service time is only known to exceed end - start. Replayed, it
    holds its slot until its end (not 4.9 s from its replayed admit at 0), so the next request,
    due at 1 s and sent 100 ms after the slot freed at 5 s, gains those 100 ms, not 200."""
    assert _gains([(0, 0.0, 0.1, 5.0, False), (0, 1.0, 5.1, 5.6, True)]) == pytest.approx([0.1, 0.1])
    assert _gains([(0, 0.0, 0.1, 5.0, True), (0, 1.0, 5.1, 5.6, True)]) == pytest.approx([0.1, 0.2])  # the server's 4.9 s


def test_a_request_whose_slot_time_is_unknown_stops_its_processs_replay():
    """Never sent (no start): how long it held its slot no record shows, so neither it nor any
    later request of its process is replayed (gain 0: the figure as measured); the other
    process's queue is replayed still. A record of no process where the level is split: none."""
    rows = [(0, 0.0, 0.1, 0.5, True), (1, 0.0, 0.1, 0.5, True), (0, 1.0, float("nan"), 1.2, False),
            (1, 1.0, 1.1, 1.5, True), (0, 2.0, 2.1, 2.5, True)]
    assert _gains(rows, cap=2, parts=2) == pytest.approx([0.1, 0.1, 0.0, 0.1, 0.0])
    assert _gains([(-1, *r[1:]) if k == 1 else r for k, r in enumerate(rows)], cap=2, parts=2) == [0.0] * 5


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 3), st.floats(0, 2), st.booleans()), min_size=1, max_size=30))
def test_the_vectorised_one_slot_replay_is_the_fifo_queue(reqs):
    """One slot: the vectorised recursion admits each request where a FIFO queue of holds (the
    server's end - start from the admit, or until its end where the client cut it) would."""
    rows = [(0, i, i + late, i + late + hold, srv) for i, late, hold, srv in sorted(reqs)]
    free = -1e18
    for (_, i, start, end, srv), g in zip(rows, _gains(rows)):
        admit = max(i, free)
        free = admit + (end - start) if srv else max(end, admit + end - start)
        assert g == pytest.approx(start - admit, abs=1e-9)


def _naive_fifo(rows: list[tuple], cap: int, parts: int) -> list[float]:
    """The runner's slot queue, written out: per process (worker % parts, its share of the cap),
    requests in intended-start order (ties as given) each admitted at max(intended, the first
    slot free), holding it end - start (the server's) or until its end at least (the client's
    cut); a request with no start or end, and every later one of its process, not replayed."""
    import heapq

    from soakspec.shares import in_flight_share

    parts = max(1, min(parts, cap))
    out = [0.0] * len(rows)
    for p in range(parts):
        free = [-1e18] * in_flight_share(cap, (p, parts))
        for k in sorted((k for k, r in enumerate(rows) if r[0] % parts == p), key=lambda k: rows[k][1]):
            _, i, s, e, srv = rows[k]
            if math.isnan(s) or math.isnan(e) or e < s:
                break
            a = max(i, heapq.heappop(free))
            heapq.heappush(free, a + (e - s) if srv else max(a + e - s, e))
            out[k] = s - a
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.floats(0, 10), st.floats(0, 3), st.floats(0, 2), st.booleans(),
                          st.integers(0, 30)), min_size=1, max_size=40),
       st.integers(1, 4), st.integers(1, 3), st.sampled_from([1, 2, 3, 7]))
def test_the_replay_a_chunk_at_a_time_is_the_fifo_queue(reqs, cap, parts, chunk):
    """The replay read a few requests at a time (the running max, the hold sum and the slots'
    heap carried from chunk to chunk) gives what the whole queue written out does -- any order
    of intended starts, several processes and slots, an unknown hold in a later chunk -- and the
    same numbers as one chunk of the whole level, bit for bit."""
    from soakspec.judge import capreplay

    rows = [(w, i, math.nan if gone == 0 else i + late, i + late + h, srv) for w, i, late, h, srv, gone in reqs]
    whole = _gains(rows, cap=cap, parts=parts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(capreplay, "CHUNK", chunk)
        got = _gains(rows, cap=cap, parts=parts)
    assert got == whole
    assert got == pytest.approx(_naive_fifo(rows, cap, parts), abs=1e-9)


def test_a_replays_gain_is_read_for_a_selection_of_rows_and_for_a_row_of_no_table():
    """`SlotReplay.col` takes a boolean selection as it takes row numbers (one gain a selected
    row); a row of no table (a dict) at a capped level is not replayed (gain 0: the figure as
    measured), elsewhere its gain is its schedule lag, as the column form's."""
    import numpy as np

    from soakspec.judge.capreplay import SlotReplay
    from soakspec.judge.performance import _replay_gain

    t = object()
    rep = SlotReplay(((t, np.array([1, 3]), np.array([0.25, 0.5])),))
    assert rep.col(t, np.array([False, True, True, True])).tolist()[::2] == [0.25, 0.5]
    assert np.isnan(rep.col(t, np.array([False, True, True, True]))[1])

    class Level:
        workload, index = "w", 0

    gain = _replay_gain([Level()])
    assert gain({"workload": "w", "level": 0, "start": 2.0, "intended_start": 1.5}) == 0.0
    assert gain({"workload": "w", "level": 1, "start": 2.0, "intended_start": 1.5}) == pytest.approx(0.5)


def test_a_closed_loop_is_unchanged():
    spec = _spec(mode="closed", levels="[2]", gate="")
    b = EvidenceBuilder(spec)  # (no client samples: the builder's closed loop is sparser than its concurrency)
    for r in b.measured("a"):
        r.update(first_token=r["start"] + 0.3, ttft=0.3, first_byte=r["start"] + 0.29)
    v = judge(spec, b.build())
    assert _rule(v).status == "fail" and v.outcome == "FAIL"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ttft=st.floats(0.01, 0.24), lag=st.floats(0.0, 2.0))
def test_schedule_lag_never_turns_a_servers_pass_into_a_fail(ttft, lag):
    """Whatever the load generator's lateness, a server whose first tokens all came in time from
    the send is never FAILed for it: the run is PASS where the lag leaves it under the threshold,
    INCONCLUSIVE where the lag decides it (or saturates the client)."""
    spec = _spec()
    on_time = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.0, ttft=ttft).build())
    assert _rule(on_time).status == "pass"
    late = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=lag, ttft=ttft).build())
    assert _rule(late).status != "fail", _rule(late).message
    assert late.outcome != "FAIL"


def test_a_sweep_probe_the_lag_decided_neither_holds_nor_fails():
    """The finding itself: the runner's own judgement of an open-loop probe (`probe_judge`),
    its client healthy within the allowance, sent 160 ms late: INCONCLUSIVE, not the server's
    failure at that rate."""
    from soakspec.judge.sweep import probe_judge
    from soakspec.judge.testing import client_rows, spec_from_text

    head = ('soak "s" {}\nbackend "b0" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "host-staged"\n  }\n}\n'
            'workload "w0" {\n  load {\n    mode = open\n    rate = [2rps, 3rps]\n    %s  }\n  duration = 1m\n  bucket = 20s\n'
            '  deadline = 30s\n  follow_up = false\n}\n' f"gate {{\n  {ALLOWANCE}\n  require {RULE}\n}}\n")
    spec = spec_from_text(head % "rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7\n")
    b = EvidenceBuilder(spec_from_text(head % "seed = 7\n"), per_bucket=40)
    lv1 = b.manifest["backends"][0]["levels"][1]
    b.client["b0"] = client_rows("b0", lv1["started_at"], lv1["drained_at"] + 1.0)
    for r in b.records["b0"]:
        if r["level"] == 1 and r["bucket"] >= 0:
            start = r["intended_start"] + 0.16
            r.update(start=start, first_byte=start + 0.1, first_token=start + 0.145, end=start + 1.145, ttft=0.305, latency=1.305)
    ev = b.build()
    rows = [dict(r) for r in ev.backends[0].records if r.get("level") == 1]
    holds, why = probe_judge(spec)("b0", dict(ev.backends[0].entry["levels"][1]), rows, b.client["b0"])
    assert not holds
    assert why.startswith(f"INCONCLUSIVE: {RULE}: INCONCLUSIVE — not judged, the load generator's own schedule lag decided it"), why


@pytest.mark.parametrize("service", [0.47, 0.52], ids=["the lag decided it", "the cap's queue carries it"])
def test_a_capped_sweep_probe_the_lag_decided_neither_holds_nor_fails(service):
    """The same probe under max_concurrency 1, its arrivals 500 ms apart, the client 45 ms late
    after each slot. The server ending 470 ms after the send: the queue is the client's
    lateness alone (replayed on time there is none: 145 ms), INCONCLUSIVE; ending 520 ms after
    it, the cap's own queue carries the figure over on time too: the server's (and its cap's)
    fail."""
    from soakspec.judge.sweep import probe_judge
    from soakspec.judge.testing import client_rows, spec_from_text

    head = ('soak "s" {}\nbackend "b0" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "host-staged"\n  }\n}\n'
            'workload "w0" {\n  load {\n    mode = open\n    rate = [2rps, 3rps]\n    max_concurrency = 1\n    %s  }\n'
            '  duration = 1m\n  bucket = 20s\n  deadline = 30s\n  follow_up = false\n}\n' f"gate {{\n  {ALLOWANCE}\n  require {RULE}\n}}\n")
    spec = spec_from_text(head % "rate_step = 1rps\n    search = bisect\n    max_wall = 1h\n    seed = 7\n")
    b = EvidenceBuilder(spec_from_text(head % "seed = 7\n"), per_bucket=40, scheduled=False)
    lv1 = b.manifest["backends"][0]["levels"][1]
    b.client["b0"] = client_rows("b0", lv1["started_at"], lv1["drained_at"] + 1.0)
    _fifo([r for r in b.records["b0"] if r["level"] == 1 and r["bucket"] >= -1], cap=1, late=0.045, ttft=0.145,
          service=service, spacing=None)
    ev = b.build()
    rows = [dict(r) for r in ev.backends[0].records if r.get("level") == 1]
    holds, why = probe_judge(spec)("b0", dict(ev.backends[0].entry["levels"][1]), rows, b.client["b0"])
    assert not holds
    if service == 0.52:
        assert why.startswith(f"{RULE}: FAIL"), why
        return
    assert why.startswith(f"INCONCLUSIVE: {RULE}: INCONCLUSIVE — not judged, the load generator's own schedule lag decided it"), why
    assert "(p50(ttft with the slot queue replayed on time), " in why and "would have met it) it is 145ms: " in why, why


def test_client_healthy_false_judges_the_times_as_measured():
    spec = _spec(gate="client_healthy = false")
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    assert _rule(v).status == "fail" and v.outcome == "FAIL"


def _saturated_and_lagged():
    """Level 0 (2 rps) fails p50(ttft) beside a saturated bucket; level 1 (4 rps) fails only by
    the client's 200 ms schedule lag."""
    from soakspec.judge.testing import client_rows

    spec = _spec(levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    w = next(x for x in b.level("a", 0)["buckets"] if x["index"] == 1)  # level 0's bucket 1: event-loop lag 300 ms
    b.client["a"] = [client_rows("a", r["start"], r["t"], lag=0.3)[0] if w["start"] <= (r["start"] + r["t"]) / 2 < w["end"]
                     else r for r in b.client["a"]]
    _timed(b, lag=0.0, ttft=0.3, level=0)
    _timed(b, lag=0.2, ttft=0.145, level=1)
    return judge(spec, b.build())


def test_one_level_beside_a_saturated_bucket_and_one_the_lag_decided_is_inconclusive():
    """Both failing levels are the client's, for two reasons: neither is the server's FAIL."""
    v = _saturated_and_lagged()
    ttft = _rule(v)
    assert ttft.status == "inconclusive", ttft.message
    assert ttft.message.startswith("not judged, the load generator was saturated (backend a, rate 2 rps, bucket 1"), ttft.message
    assert v.outcome == "INCONCLUSIVE"


def test_a_mixed_inconclusive_names_both_causes():
    """The INCONCLUSIVE named the saturated bucket only: the 4 rps level, which the schedule
    lag decided, read as if it too were beside the saturation (or as the server's figure). Both
    causes are said, the lag-decided level with its figures."""
    msg = _rule(_saturated_and_lagged()).message
    assert ("; 1 failing level discounted, the load generator's own schedule lag decided it: backend a, rate 4 rps: "
            "p50(ttft) = 345ms fails < 250ms, but measured from the actual send (p50(sent_ttft)) it is 145ms") in msg, msg
    assert msg.index("saturated") < msg.index("schedule lag decided it") < msg.index("; it measured: "), msg


def test_a_send_figure_that_cannot_be_judged_is_said_so_not_that_it_does_not_fail():
    """Few requests at p99: the send figure is INCONCLUSIVE (too few samples), the ttft figure
    FAILs only by the lag. The message said "it does not fail (... needs N more)" -- read as a
    contradiction by a reviewer; it says the server's own figure cannot be judged."""
    rule = "p99(ttft) < 250ms per level"
    spec = _spec(rule)
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    r = _rule(v, rule)
    assert r.status == "inconclusive", r.message
    assert "measured from the actual send (p99(sent_ttft)) it cannot be judged (" in r.message, r.message
    assert "it does not fail" not in r.message


def _abort(b: EvidenceBuilder, rule: str = "abort p95(ttft) > 300ms per bucket", observed: float = 0.305) -> dict:
    """The runner's manifest entry for `rule` fired on bucket 0 of backend a's level 0."""
    lv = b.entry("a")["levels"][0]
    w = lv["buckets"][0]
    metric = rule.split("(")[1].split(")")[0]
    threshold = float(rule.rsplit(" ", 3)[1].removesuffix("ms")) / 1000
    return {"rule": rule, "builtin": False, "metric": metric, "op": ">", "threshold": threshold, "observed": observed,
            "agg": "p", "percentile": 95.0, "requests": 20, "backend": "a", "workload": lv["workload"], "level": 0,
            "level_label": "rate 2 rps", "scope": "bucket", "index": 0, "start": w["start"], "end": w["end"], "at": w["end"] + 1}


def _abort_result(v):
    return next(r for r in v.rules if r.metric == "abort_fired")


def test_an_abort_the_schedule_lag_alone_fired_is_not_judged_a_failure():
    """`abort p95(ttft) > 300ms per bucket` fired at 305 ms on a client sending 160 ms late
    (within its client_schedule_lag: no saturated bucket) to a server answering in 145 ms: the
    abort still stopped the load (the runner's), but the gate does not FAIL the server for it."""
    spec = _spec("failed == 0")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145)
    b.manifest["aborts"] = [_abort(b)]
    v = judge(spec, b.build())
    r = _abort_result(v)
    assert _rule(v, "client_healthy").status == "pass"
    assert r.status == "inconclusive", r.message
    assert ("not judged a failure: the load generator's own schedule lag decided it (from the send it is 145ms: "
            "p95(sent_ttft) over the same requests does not fire > 300ms; p95(schedule_lag) = 160ms)") in r.message, r.message
    assert v.outcome == "INCONCLUSIVE"


def test_an_abort_written_before_the_entry_held_its_aggregate_is_read_from_its_rule():
    spec = _spec("failed == 0")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145)
    old = {k: v for k, v in _abort(b, "abort p95(latency) > 1200ms per bucket", 1.305).items() if k not in ("agg", "percentile")}
    b.manifest["aborts"] = [old]
    r = _abort_result(judge(spec, b.build()))
    assert r.status == "inconclusive" and "p95(sent_latency)" in r.message, r.message


def test_an_abort_the_servers_own_times_fired_still_fails():
    spec = _spec("failed == 0")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.3)  # 300 ms from the send: over 250 ms
    b.manifest["aborts"] = [_abort(b, "abort p95(ttft) > 250ms per bucket", 0.46)]
    v = judge(spec, b.build())
    r = _abort_result(v)
    assert r.status == "fail" and "schedule lag" not in r.message, r.message
    assert v.outcome == "FAIL"
    off = _spec("failed == 0", gate=f"{ALLOWANCE}\n  client_healthy = false")  # the client's checks off: as measured
    b = _timed(EvidenceBuilder(off).with_client(), lag=0.16, ttft=0.145)
    b.manifest["aborts"] = [_abort(b)]
    assert _abort_result(judge(off, b.build())).status == "fail"


@pytest.mark.parametrize("service", [0.47, 0.52], ids=["the lag fired it", "the cap's queue fired it"])
def test_an_abort_at_a_capped_level_fails_where_the_caps_own_queue_carries_it(service):
    """Under max_concurrency the time from the intended start holds the wait for a slot under
    the user's declared cap (what users waited) -- and, with the cap full, the queue a late
    client's lateness built. `abort p95(ttft) > 300ms` fired on a client 45 ms late after each
    slot: where the queue replayed on time fires too (the server ends 520 ms after the send at
    arrivals 500 ms apart: the cap's own queue), the FAIL stands; where only the lateness built
    the queue (470 ms), it is not judged a failure, and says what the figure is."""
    spec = _spec("failed == 0", levels=ONE_SLOT)
    b = _queued(spec, late=0.045, service=service)
    b.manifest["aborts"] = [_abort(b, observed=0.7)]
    v = judge(spec, b.build())
    r = _abort_result(v)
    if service == 0.52:
        assert r.status == "fail" and "schedule lag" not in r.message, r.message
        assert v.outcome == "FAIL"
        return
    assert r.status == "inconclusive", r.message
    assert ("not judged a failure: the load generator's own schedule lag decided it (less the load generator's own lateness, "
            "the wait for a slot under max_concurrency as an on-time load generator would have met it, it is 145ms: "
            "p95(ttft with the slot queue replayed on time) over the same requests does not fire > 300ms; "
            "p95(schedule_lag) = 45ms after each slot, and the queue that lateness built)") in r.message, r.message
    assert v.outcome == "INCONCLUSIVE"


def test_a_run_cut_by_an_abort_the_lag_decided_is_not_failed_for_being_cut():
    spec = _spec("completed_run\n  require failed == 0", levels="[2rps, 4rps]")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145)
    b.manifest["aborts"] = [_abort(b)]
    lv = b.entry("a")["levels"][0]
    lv["completed"] = False
    b.entry("a")["levels"] = [lv]
    b.records["a"] = [r for r in b.records["a"] if r["level"] == 0]
    v = judge(spec, b.build())
    cut = _rule(v, "completed_run")
    assert cut.status == "inconclusive" and "its schedule lag decided it" in cut.message, cut.message


def test_a_warn_the_schedule_lag_decided_stays_warn_and_says_so():
    spec = small_spec(f"warn {RULE}\n  require failed == 0", mode="open", levels="[2rps]", gate=ALLOWANCE)
    v = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.145).build())
    w = _rule(v)
    assert w.status == "warn", w.message
    assert ("1 warning level not the server's own time, the load generator's own schedule lag decided it: backend a, "
            "rate 2 rps: p50(ttft) = 305ms fails < 250ms, but measured from the actual send (p50(sent_ttft)) it is 145ms") in w.message, w.message
    assert v.outcome == "PASS"  # a warn never decides the verdict
    slow = judge(spec, _timed(EvidenceBuilder(spec).with_client(), lag=0.16, ttft=0.3).build())
    assert _rule(slow).status == "warn" and "schedule lag" not in _rule(slow).message


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ttft=st.floats(0.05, 0.6), lag=st.floats(0.0, 0.5))
def test_an_ttft_abort_is_the_servers_failure_exactly_when_its_figure_from_the_send_fires_too(ttft, lag):
    """Whatever the lateness (within the allowance) and the server's time: an abort that fired
    stays a FAIL where the server's own time from the send is over its threshold, and is never
    one where only the lateness carried it over."""
    assume(abs(ttft - 0.3) > 1e-6 and abs(lag + ttft - 0.3) > 1e-6)  # not on the threshold: the stamps' rounding decides there
    spec = _spec("failed == 0")
    b = _timed(EvidenceBuilder(spec).with_client(), lag=lag, ttft=ttft)
    b.manifest["aborts"] = [_abort(b, "abort p95(ttft) > 300ms per bucket", lag + ttft)]
    r = _abort_result(judge(spec, b.build()))
    lag_alone = ttft <= 0.3 < lag + ttft
    assert r.status == ("inconclusive" if lag_alone else "fail"), r.message
