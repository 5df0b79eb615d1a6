"""A ramping first phase after a warmup: the warmup holds the phase's starting value and the ramp
spans exactly the phase's measured duration, so the measured window starts at the declared value.
The plan's expected count is what the runner sends in the measured window. Driven in virtual time
(`trio.testing.MockClock`, tests/test_load_shapes.py's fake server): exact, no sockets.
"""

from __future__ import annotations

from collections import Counter

import pytest

from soakspec.plan import plan, render_text
from soakspec.runner.load import ramp_schedule
from test_load_shapes import levels_of, run_virtual, spec_of


def _open_ramp(load: str, warmup: str, bucket: str = "1s"):
    (lv,) = levels_of(load, extra=f"bucket = {bucket}\n warmup = {warmup}")
    return lv


RAMP_10_90 = "mode = open\n arrival = constant\n phases { r { rate = 10rps  ramp_to = 90rps  duration = 4s } }"


def test_open_ramp_after_warmup_starts_measuring_at_its_declared_rate():
    """warmup 1s, then 10 → 90 rps over 4 s (constant arrivals): the warmup sends at 10 rps, and the
    measured buckets get the integral of 10 + 20t over each second: 20, 40, 60, 80 (200 in all),
    as the plan says -- not a ramp stretched over the 5 s (bucket 0 at 26 rps, 232 requests)."""
    lv = _open_ramp(RAMP_10_90, "1s")
    assert (lv.warmup_s, lv.duration_s) == (1.0, 4.0)
    assert lv.expected_requests == lv.min_requests == 200
    run, records, _ = run_virtual(lv, latency=0.05)
    per_bucket = Counter(r.bucket for r in records)
    assert [per_bucket[k] for k in (-1, 0, 1, 2, 3)] == [10, 20, 40, 60, 80]
    warm = sorted(r.intended_start - run.started_at for r in records if r.bucket == -1)
    assert warm == pytest.approx([k / 10 for k in range(10)], abs=1e-9)  # held at the phase's 10 rps
    measured = sorted(r.intended_start - run.measure_start for r in records if r.bucket >= 0)
    assert len(measured) == lv.expected_requests
    assert measured[0] == pytest.approx(0.0, abs=1e-9)  # the arrivals run on across the warmup's end
    # at 10 rps when measuring starts: the next arrival is where 10t + 10t² (the rate's integral) reaches 1
    assert measured[1] - measured[0] == pytest.approx((-10 + 140**0.5) / 20, abs=1e-9)
    assert max(measured) < 4.0


def test_the_measured_schedule_of_a_ramp_is_its_schedule_without_warmup():
    """The warmup only adds arrivals before the ramp: with a whole number of warmup arrivals, the
    measured arrivals (relative to the end of the warmup) are exactly those of the phase run with
    no warmup."""
    with_warmup = _open_ramp(RAMP_10_90, "1s")
    without = _open_ramp(RAMP_10_90, "0s")
    run_w, rec_w, _ = run_virtual(with_warmup, latency=0.05)
    run_0, rec_0, _ = run_virtual(without, latency=0.05)
    a = sorted(r.intended_start - run_w.measure_start for r in rec_w if r.bucket >= 0)
    b = sorted(r.intended_start - run_0.measure_start for r in rec_0)
    assert a == pytest.approx(b, abs=1e-9)
    assert Counter(r.bucket for r in rec_w if r.bucket >= 0) == Counter(r.bucket for r in rec_0)


@pytest.mark.parametrize(
    ("phase", "warmup"),
    [
        ("r { rate = 10rps  ramp_to = 90rps  duration = 4s }", "1s"),
        ("r { rate = 3rps  ramp_to = 7rps  duration = 3s }", "500ms"),  # 1.5 warmup arrivals
        ("r { rate = 20rps  ramp_to = 5rps  duration = 2s }", "250ms"),  # ramping down
        ("s { rate = 5rps  ramp_to = 20rps  steps = 3  duration = 4s }", "1s"),  # stairs: 5, 10, 15, 20
    ],
)
def test_plan_expected_count_of_a_ramp_after_warmup_is_what_the_runner_measures(phase, warmup):
    lv = _open_ramp(f"mode = open\n arrival = constant\n phases {{ {phase} }}", warmup)
    run, records, _ = run_virtual(lv, latency=0.01)
    assert sum(1 for r in records if r.bucket >= 0) == lv.expected_requests
    start_rate = lv.shape.start
    warm = sorted(r.intended_start - run.started_at for r in records if r.bucket == -1)
    assert warm == pytest.approx([k / start_rate for k in range(len(warm))], abs=1e-9)
    assert len(warm) == len([k for k in range(100) if k / start_rate < lv.warmup_s - 1e-9])


def test_stairs_after_warmup_hold_each_step_for_a_share_of_the_measured_duration():
    """5 → 20 rps in 3 steps over 4 s after a 1 s warmup: the warmup at 5 rps, then 5, 10, 15, 20
    rps for one second each -- the buckets are the steps."""
    lv = _open_ramp("mode = open\n arrival = constant\n phases { s { rate = 5rps  ramp_to = 20rps  steps = 3  duration = 4s } }", "1s")
    _, records, _ = run_virtual(lv, latency=0.01)
    per_bucket = Counter(r.bucket for r in records)
    assert [per_bucket[k] for k in (-1, 0, 1, 2, 3)] == [5, 5, 10, 15, 20]
    assert lv.expected_requests == 50


def test_poisson_ramp_after_warmup_plans_the_integral_over_the_duration():
    """Poisson arrivals: the plan expects the rate's integral over the measured duration only
    (200), and the schedule's warmup part runs at the starting rate."""
    lv = _open_ramp("mode = open\n arrival = poisson\n seed = 5\n phases { r { rate = 10rps  ramp_to = 90rps  duration = 4s } }", "1s")
    assert lv.expected_requests == 200
    # a long warmup: its arrivals come at the held 10 rps; the ramp still spans only the duration
    times = list(ramp_schedule(lv.shape, 0.0, 204.0, warmup=200.0))
    warm = [t for t in times if t < 200.0]
    assert len(warm) == pytest.approx(2000, rel=0.1)
    measured = [t for t in times if t >= 200.0]
    assert len(measured) == pytest.approx(200, rel=0.25)
    assert sum(1 for t in measured if t < 201.0) < sum(1 for t in measured if t >= 203.0)  # still ramping up


def test_soakspec_plan_text_shows_the_measured_expectation():
    spec, diags = spec_of(RAMP_10_90, extra="bucket = 1s\n warmup = 1s")
    assert spec is not None, diags
    text = render_text(plan(spec))
    assert "expected ~200" in text and "expected ~232" not in text


def test_closed_ramp_holds_its_start_through_the_warmup_and_ramps_over_the_duration():
    """concurrency 2 → 10 over 4 s after a 1 s warmup: 2 in flight through the warmup, at most 3
    in the first measured half second (the target reaches 3 at 0.25 s), the measured mean in flight
    is the ramp's own mean, 6 (not 6.75), and the plan's estimate uses that mean."""
    (lv,) = levels_of(
        "mode = closed\n phases { up { concurrency = 2  ramp_to = 10  duration = 4s } }",
        extra="bucket = 500ms\n warmup = 1s\n expected_latency = 100ms",
    )
    run, records, server = run_virtual(lv, latency=0.1)
    warm = [n for t, n in server.starts if t < run.measure_start]
    assert warm and max(warm) == 2
    first = [n for t, n in server.starts if run.measure_start <= t < run.measure_start + 0.5]
    assert first and max(first) == 3
    last = [n for t, n in server.starts if t >= run.measure_start + 4.0 - 0.5]
    assert max(last) == 10
    assert run.mean_in_flight == pytest.approx(6.0, abs=0.05)
    assert lv.shape.mean(lv.duration_s) == pytest.approx(6.0)
    assert lv.expected_requests == int(6.0 * 4.0 / 0.1)


@pytest.mark.parametrize(
    ("load", "warmup"),
    [
        ("mode = open\n arrival = constant\n rate = [3rps]", "500ms"),  # 1.5 warmup arrivals: the old plan said 9, not 8
        ("mode = open\n arrival = constant\n rate = [2.5rps]", "1s"),
        ("mode = open\n arrival = constant\n phases { h { rate = 3rps  duration = 3s } }", "500ms"),
    ],
)
def test_plan_expected_count_of_a_steady_open_level_after_warmup_is_what_the_runner_measures(load, warmup):
    """Constant arrivals are sent at i / rate from the level's start, warmup included: the
    measured ones are those at or after the warmup's end, which a fractional rate x warmup
    shifts (the plan counted ceil(rate x duration) as if arrivals restarted at the warmup's end)."""
    extra = f"bucket = 1s\n warmup = {warmup}" + ("" if "phases" in load else "\n duration = 3s")
    (lv,) = levels_of(load, extra=extra)
    _, records, _ = run_virtual(lv, latency=0.01)
    assert sum(1 for r in records if r.bucket >= 0) == lv.expected_requests
