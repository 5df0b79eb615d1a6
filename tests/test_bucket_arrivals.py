"""An open loop's constant arrivals are placed in buckets by exact arithmetic, not by how the run
clock's floats round: at 5 rps in 200 ms buckets, arrival 3 at 3/5 = 0.6 s fell before the
float edge 3 x 0.2 = 0.6000000000000001, so bucket 2 held two arrivals and bucket 3 none -- a
constant-rate level with uneven buckets, and an empty bucket INCONCLUSIVE (min_samples). (At a
run clock of epoch seconds, ~1.8e9, the float step of 2^-22 s mostly hides the rounding; at
smaller clock values -- virtual time, t0 = 55285.96 s: 300 ms buckets at 10 rps held 4 and 2 --
it decided buckets.)"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import trio
import trio.testing
from hypothesis import example, given, settings
from hypothesis import strategies as st

from soakspec.arrivals import Grid, rational
from soakspec.lang import check, parse
from soakspec.plan import Level, plan
from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence
from soakspec.runner.load import LevelContext, Shapes, drive_level, level_grid, schedule
from soakspec.windows import holding

from test_load_schedule import FakeServer


def _level(rate: str, bucket_ms: int, n_buckets: int, warmup_ms: int) -> Level:
    text = ('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
            f'workload "w" {{\n load {{\n mode = open\n rate = [{rate}]\n }}\n duration = {bucket_ms * n_buckets}ms\n'
            f' bucket = {bucket_ms}ms\n warmup = {warmup_ms}ms\n deadline = 30s\n follow_up = false\n}}\n')
    spec, diags = check(parse(text)[0])
    assert spec is not None, [d.message for d in diags]
    return plan(spec).backends[0].levels[0]


_BUCKET_MS = st.sampled_from([100, 200, 250, 300, 400, 500, 750, 1000, 1500, 2000])


@settings(max_examples=200, deadline=None)
@given(bucket_ms=_BUCKET_MS, per_bucket=st.integers(1, 6), n_buckets=st.integers(1, 8),
       warmup_ms=st.sampled_from([0, 100, 300, 500, 1000, 1234]), rpm=st.booleans(),
       t0=st.sampled_from([0.0, 1000.0, 55285.957629296514, 745738.0, 1796638213.623406, 1_700_000_000.1]))
@example(bucket_ms=200, per_bucket=1, n_buckets=5, warmup_ms=0, rpm=False, t0=0.0)  # arrival 3 at 0.6 s
def test_constant_arrivals_fill_every_bucket_with_exactly_rate_times_bucket(bucket_ms, per_bucket, n_buckets,
                                                                           warmup_ms, rpm, t0):
    """Property: constant arrivals at r rps in buckets of b s, r x b a whole number, put exactly
    r x b arrivals in each bucket (the runner's schedule and bucket edges, whatever the run
    clock's start), each arrival in the bucket exact arithmetic on the spec's numbers puts it
    in, and within a microsecond of t0 + i / r."""
    rate = Fraction(per_bucket * 1000, bucket_ms)  # exact, per second
    decimal = (rate * 10**6).denominator == 1  # else written per minute: 1000 / 300 rps is 200 rpm
    text = f"{rate * 60}rpm" if rpm or not decimal else f"{float(rate):g}rps"
    level = _level(text, bucket_ms, n_buckets, warmup_ms)
    grid = level_grid(level, t0)
    times = list(schedule(level.shape.rate, "constant", 0, t0, grid.stop, grid=grid))
    w, b = Fraction(warmup_ms, 1000), Fraction(bucket_ms, 1000)
    end = w + n_buckets * b
    want = [i / rate for i in range(int(end * rate) + 1) if i / rate < end]  # the exact schedule
    assert len(times) == len(want)
    for t, off in zip(times, want):
        exact = -1 if off < w else int((off - w) // b)
        assert holding(grid.starts, t) == exact, (t - t0, off, exact)
        assert abs(t - (t0 + float(off))) < 1e-6
    held = Counter(holding(grid.starts, t) for t in times)
    assert [held[j] for j in range(n_buckets)] == [per_bucket] * n_buckets, held


def test_rational_reads_a_plans_floats_as_the_spec_wrote_them():
    assert rational(0.2) == Fraction(1, 5) and rational(0.1 * 3) == Fraction(3, 10)
    assert rational(200 / 60) == Fraction(10, 3) and rational(44.4) == Fraction(222, 5)
    assert rational(1e-7) == Fraction(1e-7)  # no nearby small fraction: its own value



def _drive(level):
    """`level` driven against a fake server answering in 50 ms, in virtual time: (its run, records)."""

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=0.0)
        server = FakeServer(clock, 0.05)
        records: list = []
        ctx = LevelContext("a", clock, server.connect, Shapes(level.request), records.extend, IdSequence("t"))
        run = await drive_level(level, ctx)
        return run, records

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

def test_five_rps_in_200ms_buckets_sends_one_request_in_each_bucket():
    """The runner itself (virtual time from 0, where the floats' rounding is fine enough to
    show): each of the ten 200 ms buckets of a 5 rps level holds exactly one request, its
    record's bucket that of its intended start."""
    level = _level("5rps", 200, 10, 0)

    run, records = _drive(level)
    assert sorted(Counter(r.bucket for r in records).items()) == [(j, 1) for j in range(10)]
    edges = [w["start"] for w in run.bucket_windows()]
    assert all(holding(edges, r.intended_start) == r.bucket for r in records)


@settings(max_examples=150, deadline=None)
@given(rate=st.sampled_from([0.3, 1.0, 2.5, 3.0, 44.4, 200 / 60, 1e-7 * 3, 997.0]), bucket=st.sampled_from([0.1, 0.2, 0.3, 1.5, 7.0]),
       warmup=st.sampled_from([0.0, 0.3, 1.234]), n_buckets=st.integers(1, 30),
       t0=st.sampled_from([0.0, 55285.957629296514, 1796638213.623406]))
def test_the_whole_number_placement_is_the_fraction_one(rate, bucket, warmup, n_buckets, t0):
    """Property: `Grid.constant_placer` (ticks, for speed) places every arrival as
    `Grid.place` (Fractions) does, and ends where i / rate reaches the level's end."""
    grid = Grid.of(t0, warmup, bucket * n_buckets, bucket, [j * bucket for j in range(n_buckets)])
    place, r = grid.constant_placer(rate), rational(rate)
    for i in range(400):
        t = t0 + i / rate
        want = None if i / r >= grid.end else grid.place(t, i / r)
        assert place(i, t) == want, (i, t)


def test_after_a_counted_warmup_each_bucket_still_holds_rate_times_bucket():
    """A counted warmup (`warmup = N requests`) ends when its requests have: the measured
    schedule starts afresh there, and its constant arrivals fill each bucket exactly too."""
    text = ('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
            'workload "w" {\n load {\n mode = open\n rate = [5rps]\n }\n duration = 2s\n'
            ' bucket = 200ms\n warmup = 3 requests\n deadline = 30s\n follow_up = false\n}\n')
    spec, diags = check(parse(text)[0])
    assert spec is not None, [d.message for d in diags]
    level = plan(spec).backends[0].levels[0]

    run, records = _drive(level)
    held = Counter(r.bucket for r in records)
    assert held[-1] == 3 and [held[j] for j in range(10)] == [1] * 10, sorted(held.items())
