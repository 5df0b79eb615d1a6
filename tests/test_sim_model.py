"""The simulator's behaviour model without sockets: plans, timing, the slot scheduler."""

from __future__ import annotations

import collections
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.sim.config import SimConfig
from soakspec.sim.model import (
    WORDS,
    Admission,
    Fault,
    Scheduler,
    chunk_sizes,
    drift_factor,
    memory_used,
    plan_request,
    schedule,
)


def test_same_seed_and_arrival_index_give_the_same_plan():
    cfg = SimConfig(seed=7, itl_jitter=0.3, stream_error_rate=0.5)
    assert plan_request(cfg, 3, 32, False) == plan_request(cfg, 3, 32, False)
    assert plan_request(cfg, 3, 32, False).tokens != plan_request(cfg, 4, 32, False).tokens
    assert plan_request(cfg, 3, 32, False).tokens != plan_request(SimConfig(seed=8), 3, 32, False).tokens


def test_tokens_are_non_empty_words_and_do_not_depend_on_length_or_faults():
    plain = plan_request(SimConfig(seed=1), 9, 40, True)
    assert len(plain.tokens) == 40
    assert all(t.startswith(" ") and t[1:] in WORDS for t in plain.tokens)
    faulty = plan_request(SimConfig(seed=1, error_rate=0.5, disconnect_rate=0.5, itl_jitter=0.2), 9, 10, True)
    assert faulty.tokens == plain.tokens[:10]
    assert len(set(plain.tokens)) > 20, "varied text"


def test_empty_text_rate_empties_the_text_but_keeps_the_tokens():
    """`empty_text_rate`: that fraction of requests emit their tokens (same count, same events)
    with empty text; the others are exactly what they were without the knob."""
    cfg = SimConfig(seed=1, empty_text_rate=0.5)
    plans = [plan_request(cfg, i, 12, True) for i in range(400)]
    empty = [p for p in plans if p.text == ""]
    assert 150 < len(empty) < 250
    for p in plans:
        base = plan_request(SimConfig(seed=1), p.index, 12, True)
        assert len(p.tokens) == 12 and p.events == base.events and p.event_ends == base.event_ends
        assert p.tokens == base.tokens or set(p.tokens) == {""}
        assert p.fault == base.fault and p.drop_trace == base.drop_trace  # the other draws are unchanged


def test_eos_stops_early_only_without_ignore_eos():
    cfg = SimConfig(eos_rate=1.0)
    for i in range(50):
        stop = plan_request(cfg, i, 20, ignore_eos=False)
        assert stop.finish_reason == "stop" and 1 <= len(stop.tokens) < 20
        full = plan_request(cfg, i, 20, ignore_eos=True)
        assert full.finish_reason == "length" and len(full.tokens) == 20
    assert plan_request(SimConfig(eos_rate=0.0), 0, 20, False).finish_reason == "length"


def test_fault_rates_are_the_per_request_probabilities():
    rates = {"error_rate": 0.1, "stream_error_rate": 0.2, "stall_rate": 0.05, "disconnect_rate": 0.1,
             "omit_done_rate": 0.15, "trace_drop_rate": 0.3}
    cfg = SimConfig(seed=3, **rates)
    n = 5000
    plans = [plan_request(cfg, i, 8, True) for i in range(n)]
    counts = collections.Counter(p.fault for p in plans)
    for fault, name in [(Fault.ERROR, "error_rate"), (Fault.STREAM_ERROR, "stream_error_rate"),
                        (Fault.STALL, "stall_rate"), (Fault.DISCONNECT, "disconnect_rate"),
                        (Fault.OMIT_DONE, "omit_done_rate")]:
        assert counts[fault] / n == pytest.approx(rates[name], abs=0.02), fault
    assert counts[None] / n == pytest.approx(0.4, abs=0.02)
    assert sum(p.drop_trace for p in plans) / n == pytest.approx(0.3, abs=0.02)
    statuses = collections.Counter(p.error_status for p in plans)
    assert set(statuses) == {500, 503} and min(statuses.values()) > n * 0.4
    assert all(1 <= p.fault_after_events <= len(p.events) for p in plans)
    assert {p.fault_after_events for p in plans} == set(range(1, 9)), "mid-stream faults hit every position"


@given(st.integers(1, 300), st.integers(1, 16))
def test_events_carry_the_first_token_alone_then_k_at_a_time(n, k):
    sizes = chunk_sizes(n, k)
    assert sum(sizes) == n and sizes[0] == 1 and all(1 <= s <= k for s in sizes)
    assert all(s == k for s in sizes[1:-1])
    plan = plan_request(SimConfig(tokens_per_chunk=k), 0, n, True)
    assert list(plan.events) == sizes
    assert "".join(plan.event_texts) == plan.text
    assert list(plan.event_ends) == [sum(sizes[: i + 1]) for i in range(len(sizes))]


def test_ttft_and_itl_follow_the_configuration():
    cfg = SimConfig(ttft=0.05, prefill_per_token=0.001, itl=0.01)
    plan = plan_request(cfg, 0, 5, True)
    times = schedule(cfg, plan, prompt_tokens=20, start=100.0, epoch=100.0)
    assert times[0] == pytest.approx(100.0 + 0.05 + 0.02)
    assert [round(b - a, 9) for a, b in zip(times, times[1:])] == [0.01] * 4


def test_deadlines_are_absolute_so_they_do_not_depend_on_when_they_are_asked_for():
    cfg = SimConfig(ttft=0.05, itl=0.01, itl_jitter=0.5, tokens_per_chunk=3)
    plan = plan_request(cfg, 11, 30, True)
    a = schedule(cfg, plan, 5, start=0.0)
    b = schedule(cfg, plan, 5, start=1000.0, epoch=1000.0)
    assert b == pytest.approx([t + 1000.0 for t in a])


def test_itl_jitter_stays_within_its_bounds_and_averages_out():
    cfg = SimConfig(ttft=0.0, itl=0.01, itl_jitter=0.4)
    gaps = []
    for i in range(40):
        times = schedule(cfg, plan_request(cfg, i, 50, True), 1)
        gaps += [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.006 - 1e-12 and max(gaps) <= 0.014 + 1e-12
    assert statistics.mean(gaps) == pytest.approx(0.01, rel=0.03)
    assert statistics.pstdev(gaps) > 0.001


def test_slowdown_per_active_sequence_and_drift_stretch_the_itl():
    cfg = SimConfig(ttft=0.0, itl=0.01, slowdown_per_active=0.1)
    plan = plan_request(cfg, 0, 3, True)
    alone = schedule(cfg, plan, 1, others_active=0)
    busy = schedule(cfg, plan, 1, others_active=5)
    assert busy[2] - busy[1] == pytest.approx(0.015)
    assert alone[2] - alone[1] == pytest.approx(0.010)
    drifting = SimConfig(ttft=0.05, itl=0.01, drift=0.5)  # +50% per minute of uptime
    plan = plan_request(drifting, 0, 3, True)
    fresh = schedule(drifting, plan, 1, start=0.0, epoch=0.0)
    later = schedule(drifting, plan, 1, start=120.0, epoch=0.0)  # two minutes of uptime: x2
    assert later[0] - 120.0 == pytest.approx(2 * fresh[0], rel=1e-3)
    assert later[2] - later[1] == pytest.approx(2 * (fresh[2] - fresh[1]), rel=1e-3)
    assert drift_factor(drifting, 60.0) == pytest.approx(1.5)


def test_zero_latency_makes_every_event_due_at_once():
    cfg = SimConfig(zero_latency=True, ttft=1.0, itl=1.0)
    assert schedule(cfg, plan_request(cfg, 0, 10, True), 5, start=3.0) == [3.0] * 10


def test_memory_gauge_grows_per_minute():
    cfg = SimConfig(memory_base=10 * 2**30, memory_growth=2**30)
    assert memory_used(cfg, 0) == 10 * 2**30
    assert memory_used(cfg, 90) == pytest.approx(11.5 * 2**30)


def test_scheduler_fifo_queue_and_limit():
    s: Scheduler[str] = Scheduler(slots=2, queue_limit=2)
    assert [s.arrive(x) for x in "abcde"] == [Admission.RUNNING, Admission.RUNNING, Admission.WAITING,
                                              Admission.WAITING, Admission.REJECTED]
    assert s.release("b") == ["c"]
    s.withdraw("d")
    assert s.arrive("f") is Admission.WAITING
    assert s.release("a") == ["f"]
    assert s.release("c") == [] and s.running == {"f"}


@settings(max_examples=200)
@given(st.integers(1, 4), st.integers(0, 3),
       st.lists(st.tuples(st.sampled_from("arw"), st.integers(0, 30)), max_size=60))
def test_scheduler_matches_a_simple_model(slots, limit, ops):
    """Against a list-based model: never more than `slots` running, at most `limit` waiting,
    nobody waits while a slot is free, and waiters get slots in arrival order."""
    s: Scheduler[int] = Scheduler(slots, limit)
    running: set[int] = set()
    waiting: list[int] = []
    seen: set[int] = set()
    for op, x in ops:
        if op == "a" and x not in seen:
            seen.add(x)
            got = s.arrive(x)
            if len(running) < slots and not waiting:
                running.add(x)
                assert got is Admission.RUNNING
            elif limit and len(waiting) >= limit:
                assert got is Admission.REJECTED
            else:
                waiting.append(x)
                assert got is Admission.WAITING
        elif op == "r" and x in running:
            running.discard(x)
            admitted = waiting[: slots - len(running)]
            del waiting[: len(admitted)]
            running.update(admitted)
            assert s.release(x) == admitted
        elif op == "w" and x in waiting:
            waiting.remove(x)
            s.withdraw(x)
        assert s.running == running and list(s.waiting) == waiting
        assert len(running) <= slots and (not waiting or len(running) == slots)
