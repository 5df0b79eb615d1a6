"""One clock per run, whatever the wall clock does meanwhile.

A day-long soak sees the wall clock stepped (an NTP step, a VM resumed from suspend, a manual
`date -s`). Every time a run writes is on its `RunClock` (monotonic, anchored once to the wall
clock), so the times it writes stay comparable with each other -- records, bucket windows,
samples, the manifest's start and end. These tests build a run clock that disagrees with the
wall clock (as it does after a step) and check that nothing the run writes reads the wall clock.
"""

from __future__ import annotations

import json
import time

import trio

from soakspec.evidence.layout import RunLayout
from soakspec.judge.testing import spec_from_text
from soakspec.plan import plan
from soakspec.runner.backend import Deps, sample_telemetry
from soakspec.runner.clock import RunClock
from soakspec.runner.engine import h11_connect
from soakspec.runner.progress import Progress
from soakspec.runner.recorder import BackendRecorder, RunStatus

STEP_S = 3600.0  # the wall clock was stepped forward an hour after the run began

SIM_SPEC = ('soak "g" {}\nbackend "s" {\n  sim {}\n  runtime {\n    label = "x"\n  }\n}\n'
            'workload "w" {\n  load {\n    mode = closed\n    concurrency = [1]\n  }\n  duration = 1m\n  bucket = 1m\n'
            '  deadline = 30s\n}\ngate {\n  require failed == 0\n}\n')


async def test_telemetry_samples_are_on_the_run_clock(tmp_path):
    """telemetry.jsonl's `t` is judged against the bucket windows (rss, gpu_memory per bucket):
    it is the run clock's, not the wall clock's -- after a step the samples would land in the
    wrong bucket, or in none -- and the server CPU percent is over run-clock intervals (a step
    back between two samples made the interval tiny and the percent huge)."""
    (bp,) = plan(spec_from_text(SIM_SPEC)).backends
    layout = RunLayout(tmp_path / "ev")
    rec = BackendRecorder(bp, layout, RunStatus())
    rec.prepare(0, None)
    clock = RunClock(epoch=time.time() - STEP_S)
    deps = Deps(clock, Progress(quiet=True), None, h11_connect(clock), layout)
    before = clock.now()
    with trio.move_on_after(0.3):
        await sample_telemetry(deps, rec, 0.05)
    after = clock.now()
    rows = [json.loads(x) for x in layout.telemetry("s").read_text().splitlines()]
    assert rows
    assert all(before <= r["t"] <= after for r in rows), [r["t"] - before for r in rows]


def test_the_manifests_end_is_on_the_run_clock(tmp_path, monkeypatch):
    """`started_at_epoch` is the run clock's; `ended_at_epoch` must be too: with the wall clock
    stepped an hour forward mid-run the manifest said the run lasted an hour more (a step back:
    that it ended before it began)."""
    from soakspec.runner import engine
    from test_nvml import FakeNvml

    monkeypatch.setattr(engine, "RunClock", lambda: RunClock(epoch=time.time() - STEP_S))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffff")  # no device: the run ends at once, before any load
    text = ('soak "g" {}\ntelemetry {\n  require_gpus = true\n}\nbackend "u" {\n  url = "http://127.0.0.1:9"\n'
            '  runtime {\n    label = "x"\n  }\n}\n'
            'workload "w" {\n  load {\n    mode = closed\n    concurrency = [1]\n  }\n  duration = 1s\n  bucket = 1s\n'
            '  deadline = 1s\n}\ngate {\n  require failed == 0\n}\n')
    result = engine.execute(plan(spec_from_text(text)), engine.RunOptions(out_dir=tmp_path / "run", quiet=True,
                                                                            nvml_module=FakeNvml()))
    assert result.status == "aborted"
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    took = m["ended_at_epoch"] - m["started_at_epoch"]
    assert 0 <= took < 60, took


async def test_with_workers_bucket_lines_and_abort_windows_are_the_levels_own(tmp_path):
    """`--workers`: the level starts when its processes are ready (their start-up takes a
    second), not when the recorder first heard of it. The bucket lines (what `gate --partial`
    judges windows by) and the abort rules' windows must be the level's windows, those its
    records are bucketed by: they were the earlier, provisional ones, a start-up early."""
    from functools import partial

    import httpx

    from soakspec.runner.driver import run_backend
    from soakspec.runner.ids import IdSequence
    from soakspec.runner.prompts import PromptFiles
    from soakspec.sim import server as sim
    from soakspec.sim.config import SimConfig

    text = ('soak "w" {}\nbackend "u" {\n  url = "URL"\n}\n'
            'workload "w" {\n  prompt_words = 4\n  max_tokens = 5\n  load {\n    mode = closed\n    concurrency = [2]\n  }\n'
            '  duration = 1s\n  bucket = 500ms\n  deadline = 2s\n}\n'
            'gate {\n  require failed == 0\n  abort p99(ttft) > 1h per window 400ms\n}\n')
    async with trio.open_nursery() as nursery, httpx.AsyncClient() as http:
        port = await nursery.start(partial(sim.serve, SimConfig(model="default", ttft=0.005, itl=0.001, trace_log=False)))
        (bp,) = plan(spec_from_text(text.replace("URL", f"http://127.0.0.1:{port}"))).backends
        layout = RunLayout(tmp_path / "ev")
        rec = BackendRecorder(bp, layout, RunStatus())
        rec.prepare(0, None)
        clock = RunClock()
        deps = Deps(clock, Progress(quiet=True), http, h11_connect(clock), layout, workers=2, preflight=False)
        seen: list[tuple[float, float]] = []
        from soakspec.runner import abort

        original = abort.AbortWatch.level_started

        def level_started(self, workload, index, label, measure_start, duration_s, bucket_s, **kw):
            seen.append((measure_start, duration_s))
            original(self, workload, index, label, measure_start, duration_s, bucket_s, **kw)

        abort.AbortWatch.level_started = level_started  # type: ignore[method-assign]
        try:
            await run_backend(bp, deps, rec, IdSequence("t-0"), PromptFiles(), 60.0)
        finally:
            abort.AbortWatch.level_started = original  # type: ignore[method-assign]
        rec.close()
        nursery.cancel_scope.cancel()
    (entry,) = rec.levels
    assert entry["completed"] is True
    lines = [json.loads(x) for x in layout.buckets("u").read_text().splitlines()]
    assert [(x["start"], x["end"]) for x in lines] == [(w["start"], w["end"]) for w in entry["buckets"]]
    assert seen[-1] == (entry["measure_start"], 1.0)


def _window_rule(window_s: float):
    from soakspec.plan import AbortRule

    return AbortRule("abort ratio(errors) > 50% per window", "errors", "ratio", None, ">", 0.5, "window", window_s, 1)


def test_an_abort_windows_last_window_is_evaluated_when_the_level_ends():
    """`per window W` over a level whose duration is not a multiple of W: the judge judges the
    last, shorter window; the live abort rule never evaluated it (its windows were counted as
    floor(elapsed / W)), so failures in a level's last minutes never stopped the run."""
    from soakspec.runner.abort import AbortWatch, Row

    fired = []
    watch = AbortWatch("a", [_window_rule(10.0)], on_fire=fired.append)
    watch.level_started("w", 0, "c", 1000.0, 25.0, 5.0)  # windows [0, 10), [10, 20), [20, 25]
    watch.observe([Row(4, 1021.0 + i, "failed", {}) for i in range(3)], now=1024.5)
    watch.bucket_done(4, now=1025.0)  # the level's last bucket ends: so does its last window
    (f,) = fired
    assert (f.index, f.start, f.end, f.requests) == (2, 1020.0, 1025.0, 3)


def test_an_abort_windows_last_window_survives_epoch_float_rounding():
    """A time-scaled level (a rehearsal): 3 windows of 0.1 s in a 0.3 s level starting at an
    epoch time. (m + 0.3) - m is 0.29999995 there, one window short: the last one was skipped."""
    from soakspec.runner.abort import AbortWatch, Row

    m = 1_700_000_013.6863
    stop = m + 0.3
    assert (stop - m) // 0.1 == 2.0  # the float the old count tripped on
    fired = []
    watch = AbortWatch("a", [_window_rule(0.1)], on_fire=fired.append)
    watch.level_started("w", 0, "c", m, 0.3, 0.1)
    watch.observe([Row(2, m + 0.25, "failed", {}), Row(2, m + 0.26, "failed", {})], now=m + 0.28)
    watch.bucket_done(0, now=m + 0.1)
    watch.bucket_done(1, now=m + 0.2)
    watch.bucket_done(2, now=stop)
    (f,) = fired
    assert f.index == 2 and f.requests == 2


def test_a_request_on_a_bucket_edge_is_in_the_bucket_whose_window_holds_it():
    """A request belongs to the bucket in which it started; the level's bucket windows (the
    manifest's, what the judge and the bucket lines cut time by) are m + k·B. The runner took
    floor((t - m) / B), which for an arrival exactly on an edge -- open loop at a constant rate,
    time-scaled buckets -- is one float rounding below k: most edge arrivals went to bucket
    k - 1 while their start lay in window k."""
    import trio.testing

    from test_load_schedule import FakeServer, level_of

    from soakspec.runner.ids import IdSequence
    from soakspec.runner.load import LevelContext, Shapes, drive_level

    level = level_of("mode = open\n rate = [10rps]\n arrival = constant", duration="1s", bucket="100ms")

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=1_700_000_013.6863)
        server = FakeServer(clock, 0.01)
        records = []
        ctx = LevelContext("a", clock, server.connect, Shapes(level.request), records.extend, IdSequence("t"))
        return await drive_level(level, ctx), records

    run, records = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    windows = run.bucket_windows()
    assert len(records) == 10
    for r in records:
        (w,) = [w for w in windows if w["start"] <= r.intended_start < w["end"]]
        assert r.bucket == w["index"], (r.intended_start - run.measure_start, r.bucket, w)
