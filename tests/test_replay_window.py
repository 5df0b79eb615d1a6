"""A replay without `duration` measures to one mean inter-arrival gap past the trace's last
arrival, never a whole idle bucket: the last bucket is short where the trace ends inside it.
(It was the trace's span rounded up to whole buckets: a trace ending just past a bucket's start
left that bucket almost empty, read as a rate collapse at the end of the run.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from soakspec.lang import load_spec
from soakspec.plan import plan, render_text
from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence
from soakspec.runner.load import LevelContext, Shapes, drive_level
from soakspec.runner.records import Outcome, RequestRecord


def level_of(tmp_path: Path, stamps_ms, extra: str = "bucket = 5s"):
    rows = [{"timestamp": t, "input_length": 4, "output_length": 1} for t in stamps_ms]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r.soak").write_text(
        'soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
        f'workload "w" {{\n  load {{\n    mode = replay\n    trace = "trace.jsonl"\n  }}\n  {extra}\n'
        "  deadline = 30s\n  follow_up = false\n}\n"
    )
    spec, diags, _ = load_spec(tmp_path / "r.soak")
    assert spec is not None, diags
    p = plan(spec)
    return p, p.backends[0].levels[0]


class Server:
    def __init__(self, clock):
        self.clock = clock

    def connect(self):
        return self

    async def send(self, shape, request_id, headers, record: RequestRecord, *, deadline: float) -> None:
        record.start = self.clock.now() if record.start is None else record.start
        await trio.sleep(0.01)
        record.end, record.outcome = self.clock.now(), Outcome.COMPLETED

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def run_virtual(level) -> list[RequestRecord]:
    async def main():
        clock = RunClock(timer=trio.current_time, epoch=1000.0)
        records: list[RequestRecord] = []
        await drive_level(level, LevelContext("a", clock, Server(clock).connect, Shapes(level.request), records.extend, IdSequence("t")))
        return records

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_trace_ending_just_past_a_bucket_start_leaves_no_idle_bucket(tmp_path):
    """51 requests every 100 ms (10 rps for 5 s) in 5 s buckets: the last arrives at 5.0 s. The
    window was 10 s, its second bucket one request in 5 s (0.2 rps for a 10 rps trace); now it
    ends a mean gap (100 ms) past the last arrival: the second bucket is 100 ms with its request."""
    p, lv = level_of(tmp_path, [i * 100 for i in range(51)])
    assert lv.duration_s == pytest.approx(5.1)
    assert [b.length_s for b in lv.buckets] == pytest.approx([5.0, 0.1])
    assert lv.min_requests == 51 and lv.rate == pytest.approx(10.0)  # the trace's rate, not 5.1 rps
    assert "w / replay of 51 requests (trace.jsonl): 5.1s in 2 × 5s buckets" in render_text(p)
    recs = run_virtual(lv)
    assert len(recs) == 51 and sorted(r.bucket for r in recs).count(1) == 1  # every request sent, the last in the short bucket


@pytest.mark.parametrize(
    ("stamps", "extra", "duration", "lengths"),
    [
        ([0, 1000, 2000, 3000], "bucket = 1s", 4.0, [1.0] * 4),  # a gap past the last: a whole bucket, as before
        ([0, 200, 400, 2100], "bucket = 1s", 2.8, [1.0, 1.0, 0.8]),  # a 700 ms mean gap: the last bucket 800 ms
        ([0, 100, 200, 300], "bucket = 1s", 0.4, [0.4]),  # shorter than a bucket: one short bucket
        ([0, 1000, 2000, 3000], "bucket = 500ms\n  warmup = 1s", 2.5, [0.5] * 5),  # after the warmup
        ([0, 0, 0], "bucket = 1s", 1.0, [1.0]),  # one instant: no gap to go by: one whole bucket, as before
        ([500], "bucket = 1s", 1.0, [1.0]),  # one request: one whole bucket, as before
    ],
)
def test_the_window_ends_a_mean_gap_past_the_last_arrival_within_its_bucket(tmp_path, stamps, extra, duration, lengths):
    _, lv = level_of(tmp_path, stamps, extra)
    assert lv.duration_s == pytest.approx(duration)
    assert [b.length_s for b in lv.buckets] == pytest.approx(lengths)
    assert lv.min_requests == sum(1 for t in stamps if t / 1000 >= lv.warmup_s)  # every request measured (its warmup's aside)
    recs = run_virtual(lv)
    assert len(recs) == len(stamps)


def test_duration_still_cuts_the_trace(tmp_path):
    _, lv = level_of(tmp_path, [i * 100 for i in range(51)], "bucket = 5s\n  duration = 10s")
    assert lv.duration_s == 10.0 and len(lv.buckets) == 2
