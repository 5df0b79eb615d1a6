"""W517: `check` warns, before anything runs, of an open loop whose buckets expect so few
arrivals that some will hold none. The built-in `min_samples` makes a bucket without a completed
request INCONCLUSIVE, so such a spec's verdict was decided by the spec itself -- and found only
after the whole soak, while `check` said "ok" (2 rps in 500 ms buckets, Poisson seed 1: bucket 1
empty, INCONCLUSIVE, every run)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from soakspec.lang import check, parse
from soakspec.plan import plan
from soakspec.runner.load import level_grid, schedule
from soakspec.windows import holding

from runner_support import REPO

HEAD = 'soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'


def _text(load: str, timing: str) -> str:
    return HEAD + f'workload "w" {{\n  load {{\n    {load}\n  }}\n  {timing}\n  deadline = 60s\n  follow_up = false\n}}\n'


def _w517(load: str, timing: str):
    spec, diags = check(parse(_text(load, timing))[0])
    assert spec is not None, [d.message for d in diags]
    return [d for d in diags if d.code == "W517"]


@pytest.mark.parametrize("load, timing, said", [
    # a Poisson bucket of 500 ms at 2 rps is empty with probability e^-1
    ("mode = open\n    rate = [2rps]\n    arrival = poisson\n    seed = 1", "duration = 4s\n  bucket = 500ms",
     "at 2 rps a 500ms bucket gets no arrival with probability 0.37 (Poisson): 2.9 of the workload's 8 buckets"),
    # a day at one request per 20 s in 60 s buckets: 5 % of 1,440 buckets, about 72, empty
    ("mode = open\n    rate = [0.05rps]\n    arrival = poisson", "duration = 24h\n  bucket = 60s",
     "at 0.05 rps a 60s bucket gets no arrival with probability 0.05 (Poisson): 72 of the workload's 1,440 buckets"),
    # burstier than Poisson: the Poisson figure is a lower bound, said so
    ("mode = open\n    rate = [2rps]\n    burstiness = 0.5", "duration = 4s\n  bucket = 500ms",
     "with probability at least 0.37 (gamma, burstiness 0.5: burstier than Poisson)"),
    # constant arrivals, one a second, in 500 ms buckets: every other one empty, exactly
    ("mode = open\n    rate = [1rps]", "duration = 4s\n  bucket = 500ms",
     "at 1 rps (constant arrivals, one every 1s) 4 of a level's 8 buckets of 500ms get no arrival"),
])
def test_an_open_loop_with_buckets_that_will_be_empty_is_warned_at_check(load, timing, said):
    (d,) = _w517(load, timing)
    assert d.severity == "warning" and said in d.message, d.message
    assert "min_samples INCONCLUSIVE" in d.message and d.span.line == 8 + load.count("\n")  # at the bucket
    assert "set bucket to at least" in (d.hint or "")


@pytest.mark.parametrize("load, timing", [
    ("mode = open\n    rate = [40rps]\n    arrival = poisson", "duration = 10s\n  bucket = 1s"),  # e^-40 a bucket
    ("mode = open\n    rate = [2rps]", "duration = 4s\n  bucket = 500ms"),  # constant: one arrival each
    ("mode = open\n    rate = [2rps]\n    burstiness = 4", "duration = 4s\n  bucket = 1s"),  # more even than Poisson: not estimated
    ("mode = closed\n    concurrency = [1]", "duration = 4s\n  bucket = 100ms"),  # a closed loop sends when it can
    ("mode = open\n    rate = [0.1rps]", "duration = 5s\n  bucket = 1s"),  # W508's: no request expected at all
])
def test_buckets_that_expect_their_arrivals_are_not_warned(load, timing):
    assert _w517(load, timing) == []


def test_check_prints_w517_with_a_caret_and_exits_0(tmp_path):
    path = tmp_path / "low.soak"
    path.write_text(_text("mode = open\n    rate = [2rps]\n    arrival = poisson", "duration = 4s\n  bucket = 500ms"))
    proc = subprocess.run([sys.executable, "-m", "soakspec", "check", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert f"{path}:10:12: W517 at 2 rps a 500ms bucket gets no arrival" in out and "hint: set bucket to at least" in out


_RATES = st.sampled_from([0.2, 0.25, 0.5, 1, 2, 3, 4, 5, 7, 10])
_BUCKETS = st.sampled_from([0.1, 0.2, 0.25, 0.3, 0.5, 0.75, 1, 1.5, 2, 3])


@settings(max_examples=150, deadline=None)
@given(rate=_RATES, bucket=_BUCKETS, n_buckets=st.integers(2, 12), warmup=st.sampled_from([0, 0.3, 0.5, 1, 2]),
       count=st.none() | st.integers(1, 40), t0=st.sampled_from([0.0, 1796638213.623406, 1_700_000_000.0]))
@example(rate=5, bucket=0.2, n_buckets=5, warmup=0, count=None, t0=0.0)  # 3/5 = 0.6 on the edge 3 x 0.2
def test_w517_for_constant_arrivals_is_exactly_the_runners_empty_buckets(rate, bucket, n_buckets, warmup, count, t0):
    """Property: for constant arrivals, `check` warns W517 exactly when the runner's schedule
    (`runner.load.schedule` in the level's grid, a level ended by its count listing buckets up
    to its N-th measured arrival) leaves a measured bucket of a level without an arrival,
    whatever the run clock's start, naming how many. Arrivals on bucket edges are placed by
    exact arithmetic (5 rps in 200 ms buckets: one in each, where the floats' 3/5 = 0.6 fell
    before the edge 3 x 0.2 = 0.6000000000000001), so nothing is "maybe"."""
    duration = round(bucket * n_buckets, 9)
    if rate * duration < 1:  # W508's
        return
    load = f"mode = open\n    rate = [{rate:g}rps]" + (f"\n    requests_per_level = {count}" if count else "")
    timing = f"duration = {duration * 1000:g}ms\n  bucket = {bucket * 1000:g}ms\n  warmup = {warmup * 1000:g}ms"
    spec, diags = check(parse(_text(load, timing))[0])
    assert spec is not None, [d.message for d in diags]
    lv = plan(spec).backends[0].levels[0]
    grid = level_grid(lv, t0)
    m, edges = t0 + lv.warmup_s, list(grid.starts)
    due = [t for t in schedule(lv.shape.rate, "constant", 0, t0, grid.stop, grid=grid) if t >= m]
    if count is not None and len(due) >= count:
        due = due[:count]
        edges = edges[: holding(edges, due[-1]) + 1]  # the buckets up to its last arrival's
    held = {holding(edges, t) for t in due}
    empty = [i for i in range(len(edges)) if i not in held]
    warned = [d for d in diags if d.code == "W517"]
    assert bool(warned) == bool(empty), (empty, [d.message for d in warned])
    if warned:
        assert f" {len(empty)} of a level's {len(edges)} buckets " in warned[0].message, (empty, warned[0].message)
        assert "set bucket to at least" in (warned[0].hint or "")


def test_the_poisson_estimate_is_a_bucket_emptys_probability():
    """The Poisson figure is what the runner's seeded schedule gives over many buckets: 2 rps in
    500 ms buckets leaves e^-1 = 37 % of them empty (4,000 buckets, within 3 %)."""
    bucket, n = 0.5, 4000
    held = {math.floor(t / bucket) for t in schedule(2.0, "poisson", 11, 0.0, bucket * n)}
    assert abs((n - len(held)) / n - math.exp(-1.0)) < 0.03


def test_min_samples_says_an_open_loops_empty_bucket_had_no_arrival():
    """The judge's side: an open-loop bucket with no record at all INCONCLUSIVEs `min_samples` and
    says no arrival of the schedule fell in it (the spec's doing, W517), where before it read
    only "no completed request in the bucket" -- as a bucket of failed requests does, which sent
    the reader looking for the server's failures. A bucket whose requests all failed says
    nothing of arrivals; nor does a closed loop's empty bucket."""
    from soakspec.judge import judge
    from soakspec.judge.testing import EvidenceBuilder, small_spec

    def min_samples(mode: str, fail: bool = False) -> str:
        spec = small_spec(mode=mode, levels="[2rps]" if mode == "open" else "[2]")
        b = EvidenceBuilder(spec)
        if fail:
            for r in b.measured("a", bucket=0):
                b.set_outcome(r, "failed", "x")
        else:
            b.drop_bucket_requests("a", 0, 0)
        (r,) = [r for r in judge(spec, b.build()).rules if r.rule == "min_samples"]
        assert r.status == "inconclusive", r.message
        return r.message

    assert "no completed request in the bucket: it measured nothing (no arrival of the open loop's schedule fell in " \
           "it: lengthen the bucket or raise the rate; see W517)" in min_samples("open")
    assert "no arrival" not in min_samples("open", fail=True)
    assert "no arrival" not in min_samples("closed")
