"""`warmup = N requests`: a warmup by request count (vLLM bench serve's --num-warmups), per level,
beside the warmup by duration (`warmup = 10s`). Parsed and formatted (`20 requests`, the word
after a space), checked (N >= 1; open and closed loops only -- batch, a replay, phases, a sweep
and multi-turn are E403 with what to write instead), planned and printed ("warmup: 20
requests"); the runner sends exactly N warmup requests -- closed loop: its workers take them
from one count, shared by --workers processes; open loop: its schedule's first N arrivals --
and the measured window (bucket 0) starts once all N have finished, none of them in a measured
bucket; each is bounded by the level's deadline, so a hung server cannot hold the warmup; the
manifest records `warmup_requests` and `warmup_sent`, and `gate --spec` with another warmup
says the level is not the one that ran."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
import trio
import trio.testing

from soakspec.evidence.record import RequestRecord
from soakspec.lang import check, fmt, parse
from soakspec.plan import Level, plan, render_text, to_json
from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence, SharedCount
from soakspec.runner.load import LevelContext, LevelRun, Shapes, drive_level
from soakspec.runner.records import Outcome

from runner_support import REPO, requests_of, run_spec
from test_load_schedule import FakeServer

HEAD = 'soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
TIMING = "duration = 10s\n  bucket = 1s\n  deadline = 60s"


def _spec_text(load: str, extra: str = TIMING, warmup: str = "20 requests") -> str:
    return HEAD + f'workload "w" {{\n  load {{\n    {load}\n  }}\n  warmup = {warmup}\n  {extra}\n  follow_up = false\n}}\n'


def _checked(load: str, extra: str = TIMING, warmup: str = "20 requests"):
    return check(parse(_spec_text(load, extra, warmup))[0])


def _level(load: str, extra: str = TIMING, warmup: str = "20 requests") -> Level:
    spec, diags = _checked(load, extra, warmup)
    assert spec is not None, [d.message for d in diags]
    return plan(spec).backends[0].levels[0]


def _errors(diags):
    return [d for d in diags if d.severity == "error"]


# ---------------------------------------------------------------- parse and fmt


def test_a_count_is_written_with_its_word_after_a_space_and_fmt_keeps_it():
    text = _spec_text("concurrency = [2]")
    tree, diags = parse(text)
    assert tree is not None and not diags
    assert "  warmup = 20 requests\n" in fmt(tree)
    assert fmt(parse(fmt(tree))[0]) == fmt(tree)
    # `20requests` is the same value, written the canonical way
    same, _ = parse(text.replace("20 requests", "20requests"))
    assert same == tree and "warmup = 20 requests" in fmt(same)
    one, _ = parse(text.replace("20 requests", "1 request"))
    assert "warmup = 1 request\n" in fmt(one)


def test_requests_after_a_number_is_still_a_key_where_a_value_follows_it():
    """`concurrency = 4  requests = 8` (batch mode's batch size on the next line) stays two
    attributes: `requests` is a count's word only where no `=` follows it."""
    text = HEAD + 'workload "w" {\n  load {\n    mode = batch\n    concurrency = 4\n    requests = 8\n  }\n  duration = 10s\n}\n'
    spec, diags = check(parse(text)[0])
    assert spec is not None and not _errors(diags), diags
    assert spec.workloads[0].load.requests == 8 and spec.workloads[0].warmup_requests is None


def test_a_parse_error_after_a_number_does_not_offer_the_count_word():
    """`[1 2]` expects ',' or ']': the count's word is valid after any number, but it is never
    what a list or a line is missing, so the message does not list it."""
    _, diags = parse('w {\n  x = [1 2]\n}\n')
    (d,) = diags
    assert d.message == "unexpected '2' (expected ',', ']')", d.message


# ---------------------------------------------------------------- check


@pytest.mark.parametrize("load", ["mode = closed\n    concurrency = [2, 4]", "mode = open\n    rate = [10rps]\n    requests_per_level = 50"])
def test_open_and_closed_loops_take_a_warmup_count(load):
    spec, diags = _checked(load)
    assert spec is not None and not _errors(diags), diags
    w = spec.workloads[0]
    assert (w.warmup_requests, w.warmup_s) == (20, 0.0)
    assert {lv.warmup_requests for lv in plan(spec).backends[0].levels} == {20}


def test_a_timed_warmup_is_unchanged():
    spec, _ = _checked("concurrency = [2]", warmup="10s")
    assert (spec.workloads[0].warmup_requests, spec.workloads[0].warmup_s) == (None, 10.0)
    lv = plan(spec).backends[0].levels[0]
    assert "warmup_requests" not in lv.to_json()  # the manifest as before the key


@pytest.mark.parametrize("warmup, code, said, hint", [
    ("0 requests", "E204", "'warmup' must be at least 1 request, not 0 requests", "remove 'warmup'"),
    ("-3 requests", "E204", "at least 1 request", "remove 'warmup'"),
    ("2.5 requests", "E104", "'warmup' counts whole requests, not 2.5 requests", None),
    ("20", "E201", "'warmup' needs a unit: a duration (20s) or a count of requests (20 requests)", "warmup = 20 requests"),
    ("2000000000 requests", "E204", "must be at most", "extra digit"),
])
def test_a_bad_count_is_an_error_with_a_hint(warmup, code, said, hint):
    spec, diags = _checked("concurrency = [2]", warmup=warmup)
    assert spec is None
    (d,) = _errors(diags)
    assert d.code == code and said in d.message, d.message
    if hint is not None:
        assert hint in (d.hint or ""), d.hint


@pytest.mark.parametrize("load, extra, said, hint", [
    ("mode = batch\n    concurrency = [2]\n    requests = 8", TIMING, "mode = batch warms up with whole batches", "mode = closed"),
    ("mode = closed\n    phases {\n      a { concurrency = 2  duration = 1s }\n    }", "bucket = 1s", "phases hold", "warmup = 10s"),
    ("mode = open\n    rate = [1rps, 9rps]\n    search = bisect\n    max_wall = 1h", TIMING, "a sweep's max_wall", "warmup = 10s"),
    ("mode = closed\n    concurrency = [2]", TIMING + '\n  multi_turn = true\n  prompt_file = "p.jsonl"', "multi-turn", "drop multi_turn"),
])
def test_a_count_where_the_warmup_is_bound_to_time_is_e403_with_a_hint(load, extra, said, hint):
    diags = _checked(load, extra)[1]
    (d,) = [d for d in diags if d.code == "E403" and "warmup" in d.message]
    assert d.message.startswith("a warmup of 20 requests is for an open or closed loop's levels") and said in d.message, d.message
    assert hint in (d.hint or ""), d.hint


def test_a_replay_with_a_warmup_count_is_e403(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i * 100, "input_length": 8, "output_length": 4}) + "\n" for i in range(20)))
    text = HEAD + f'workload "w" {{\n  load {{\n    mode = replay\n    trace = "{trace}"\n  }}\n  warmup = 5 requests\n  follow_up = false\n}}\n'
    _, diags = check(parse(text)[0], path=str(tmp_path / "t.soak"))
    (d,) = [d for d in diags if d.code == "E403" and "warmup" in d.message]
    assert "a replay's warmup is the trace's first seconds" in d.message and "warmup = 10s" in (d.hint or "")


# ---------------------------------------------------------------- plan


def test_plan_prints_the_count_and_its_bound_and_records_it_in_json():
    spec, _ = _checked("mode = closed\n    concurrency = [4]", TIMING.replace("60s", "30s"))
    p = plan(spec)
    text = render_text(p)
    assert "warmup: 20 requests, bucket 0 starts once they have finished; at most 2m30s" in text, text
    (lv,) = to_json(p)["backends"][0]["levels"]
    assert lv["warmup_requests"] == 20 and lv["warmup_s"] == 0.0 and lv["expected_warmup_requests"] == 20
    assert p.backends[0].levels[0].to_json()["warmup_requests"] == 20  # the manifest's level


def test_plan_estimates_an_open_loops_warmup_from_its_rate():
    lv = _level("mode = open\n    rate = [10rps]")
    assert lv.expected_warmup_s == pytest.approx(2.0)
    assert lv.warmup_bound_s == pytest.approx(2.0 + 60.0)  # its arrivals, then one round of the deadline without a cap


# ---------------------------------------------------------------- the runner, in virtual time


class _Shapes(Shapes):
    """Shapes that note each prompt index asked for (a level's k-th request gets prompt k)."""

    def make(self, index, *args, **kwargs):
        self.seen.append(index)
        return super().make(index, *args, **kwargs)


class HungServer(FakeServer):
    """A server that accepts every request and never answers: each ends at its deadline."""

    def connect(self):
        srv = self

        class Conn:
            async def send(self, shape, request_id, headers, record: RequestRecord, *, deadline: float) -> None:
                await trio.sleep_until(srv.clock.to_trio(deadline))
                record.end, record.outcome = srv.clock.now(), Outcome.TIMEOUT

            async def aclose(self) -> None:
                await trio.lowlevel.checkpoint()

        return Conn()


async def _drive_parts(level: Level, latency: float, parts: int, server_cls=FakeServer):
    """The level driven as `--workers parts` drives it: one `drive_level` per part from one start,
    against one server, sharing the level's count file (`ids.SharedCount`) as the processes do."""
    clock = RunClock(timer=trio.current_time, epoch=1000.0)
    server = server_cls(clock, latency)
    records: list[RequestRecord] = []
    runs: list[LevelRun] = []
    shapes: list[_Shapes] = []
    t0 = clock.now() + 0.5
    count = SharedCount.create()
    try:
        async def one_part(p: int) -> None:
            shared = count if parts > 1 else None
            sh = _Shapes(level.request)
            sh.seen = []
            shapes.append(sh)
            ctx = LevelContext("a", clock, server.connect, sh, records.extend, IdSequence(f"t{p}"), t0=t0, part=(p, parts),
                               claim=count.claim if shared is not None and level.concurrency is not None else None,
                               shared_count=shared)  # fmt: skip
            runs.append(await drive_level(level, ctx))

        async with trio.open_nursery() as n:
            for p in range(parts):
                n.start_soon(one_part, p)
    finally:
        count.remove()
    return t0, records, runs, sorted(i for sh in shapes for i in sh.seen)


def _run(level, latency, parts, server_cls=FakeServer):
    return trio.run(_drive_parts, level, latency, parts, server_cls, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.mark.parametrize("parts", [1, 2])
def test_a_closed_loop_sends_exactly_its_warmup_count_then_measures_from_their_end(parts):
    """3 workers, 0.3 s a request, 7 warmup requests: exactly 7 requests are warmup (bucket -1),
    with two processes too (they take from the level's one count); bucket 0 starts when the last
    of them ended (every process agrees on it), and no measured request starts before it."""
    level = _level("mode = closed\n    concurrency = [3]", "duration = 2s\n  bucket = 1s\n  deadline = 60s", "7 requests")
    t0, records, runs, prompts = _run(level, 0.3, parts)
    warm = [r for r in records if r.bucket < 0]
    measured = [r for r in records if r.bucket >= 0]
    assert len(warm) == 7 and sum(r.warmup_sent for r in runs) == 7
    m = max(r.end for r in warm)
    assert m == pytest.approx(t0 + 0.9)  # ceil(7 / 3) rounds of 0.3 s
    assert {r.measure_start for r in runs} == {m}
    assert measured and min(r.start for r in measured) >= m
    assert runs[0].bucket_windows()[0]["start"] == m
    # the warmup's prompts 0..6, then the measured ones from 7: none twice (a worker that stops at the
    # level's end has made its next request's prompt, never sent)
    assert prompts[:len(records)] == list(range(len(records))) and len(set(prompts)) == len(prompts)
    assert all(r.count_json() == {"warmup_sent": r.warmup_sent} for r in runs)


@pytest.mark.parametrize("parts", [1, 2])
def test_an_open_loop_sends_its_schedules_first_n_arrivals_then_starts_its_schedule_afresh(parts):
    """10 rps, 5 warmup requests of 0.2 s: the warmup is arrivals 0..4 (0.4 s, ended at 0.6 s);
    the measured schedule then starts at the warmup's end, its first arrival there, its prompts
    after the warmup's; exactly 10 measured requests (requests_per_level), none of them warmup."""
    level = _level("mode = open\n    rate = [10rps]\n    requests_per_level = 10", "duration = 5s\n  bucket = 1s\n  deadline = 60s",
                   "5 requests")
    t0, records, runs, prompts = _run(level, 0.2, parts)
    warm = sorted((r for r in records if r.bucket < 0), key=lambda r: r.intended_start)
    measured = sorted((r for r in records if r.bucket >= 0), key=lambda r: r.intended_start)
    assert [r.intended_start - t0 for r in warm] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    m = t0 + 0.6
    assert [r.measure_start for r in runs] == pytest.approx([m] * parts)
    assert len(measured) == 10 and measured[0].intended_start == pytest.approx(m)
    assert [r.intended_start - m for r in measured] == pytest.approx([i / 10 for i in range(10)])
    assert prompts == list(range(15))
    assert all(r.count_reached for r in runs)


def test_a_hung_server_cannot_hold_the_warmup_past_its_deadlines():
    """A server that never answers: each warmup request ends at its deadline (2 s), so 4 warmup
    requests at concurrency 2 end after two rounds, 4 s, and the measured window runs after it --
    the level ends, it does not hang in its warmup."""
    level = _level("mode = closed\n    concurrency = [2]", "duration = 2s\n  bucket = 1s\n  deadline = 2s", "4 requests")
    assert level.warmup_bound_s == pytest.approx(4.0)
    t0, records, runs, _ = _run(level, 0.0, 1, HungServer)
    warm = [r for r in records if r.bucket < 0]
    assert len(warm) == 4 and all(r.outcome is Outcome.TIMEOUT for r in warm)
    (run,) = runs
    assert run.measure_start == pytest.approx(t0 + 4.0) and run.completed
    assert math.isfinite(run.drained_at)


# ---------------------------------------------------------------- a real run on the embedded simulator

SIM_SPEC = textwrap.dedent("""\
    soak "t" { issue = "#1" }
    backend "b0" {
      sim {
        ttft = 20ms
        itl = 5ms
      }
    }
    workload "w" {
      load {
        mode = closed
        concurrency = [3]
        requests_per_level = 12
      }
      warmup = 7 requests
      max_tokens = 4
      duration = 10s
      bucket = 1s
      deadline = 10s
      follow_up = false
    }
    gate {
      require failed == 0
      require completed_run
    }
    """)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_run_on_the_simulator_records_exactly_its_warmup_requests_outside_the_buckets(tmp_path, workers):
    proc, out = run_spec(tmp_path, SIM_SPEC, "--workers", workers)
    assert proc.returncode == 0, proc.stderr
    (lv,) = json.loads((out / "manifest.json").read_text())["backends"][0]["levels"]
    assert (lv["warmup_requests"], lv["warmup_sent"], lv["warmup_s"]) == (7, 7, 0.0)
    assert (lv["measured_sent"], lv["ended_by"]) == (12, "count")
    rows = [r for r in requests_of(out) if r["workload"] == "w"]
    warm = [r for r in rows if r["bucket"] < 0]
    measured = [r for r in rows if r["bucket"] >= 0]
    assert len(warm) == 7 and len(measured) == 12
    assert max(r["end"] for r in warm) <= lv["measure_start"] <= min(r["start"] for r in measured)
    assert lv["buckets"][0]["start"] == lv["measure_start"]
    gate = subprocess.run([sys.executable, "-m", "soakspec", "gate", str(out), "--format", "json"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)  # fmt: skip
    assert gate.returncode == 0, gate.stdout + gate.stderr
    report = subprocess.run([sys.executable, "-m", "soakspec", "report", str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "warmup=7 requests per level" in report.stdout, report.stdout
    # the spec judged with another warmup is not the level that ran
    other = tmp_path / "other.soak"
    other.write_text(SIM_SPEC.replace("warmup = 7 requests", "warmup = 1s"))
    gate = subprocess.run([sys.executable, "-m", "soakspec", "gate", str(out), "--spec", str(other)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)  # fmt: skip
    assert gate.returncode != 0
    assert "a warmup of 7 requests (the spec plans a duration)" in gate.stdout, gate.stdout


def test_the_tty_bar_says_warmup_until_a_counted_warmup_has_ended():
    """On a TTY the level's line reads "warmup" however long its N warmup requests take (not
    "bucket 1/10" from the level's start), and its buckets count from the warmup's end."""
    import io
    import time

    from soakspec.runner.driver import _progress_started
    from soakspec.runner.load import LiveStats
    from soakspec.runner.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    level = _level("mode = closed\n    concurrency = [2]", "duration = 10s\n  bucket = 1s\n  deadline = 60s", "20 requests")
    stream = Tty()
    prog = Progress(stream=stream)
    prog.start()
    assert prog._rich is not None
    _progress_started(prog, "a", level)
    prog._state["t0"] = time.monotonic() - 5.0  # 5 s into the warmup
    prog.tick(LiveStats())
    assert prog._rich.tasks[-1].fields["stats"].startswith("warmup · ")
    prog.warmup_ended()
    prog.tick(LiveStats())
    assert prog._rich.tasks[-1].fields["stats"].startswith("bucket 0 (1 of 10) · ")
    prog.stop()


def test_a_level_cut_short_in_its_counted_warmup_lists_no_bucket():
    """An abort (or Ctrl-C, a dead backend) during a counted warmup: its measured window never
    began -- the manifest's level lists no bucket, its window empty at the time it ended, where
    a timed level's window would have been cut from its start + warmup_s."""
    from soakspec.runner.driver import _cut_short

    level = _level("mode = closed\n    concurrency = [2]", "duration = 10s\n  bucket = 1s\n  deadline = 60s", "20 requests")
    entry = {"started_at": 100.0, "measure_start": None}  # as `on_start` leaves a counted warmup's level
    _cut_short(entry, level, 103.5)
    assert entry["buckets"] == [] and entry["measure_start"] == entry["measure_end"] == entry["drained_at"] == 103.5


def test_a_poisson_warmup_sends_all_n_where_its_nth_arrival_is_late():
    """10 rps Poisson, seed 3: the 100th arrival is due at 12.0 s, past 100 / 10 s plus the 0.5 s
    deadline -- a bound from N / rate sent 83 warmup requests and said nothing. The bound is from
    the seeded schedule's own 100th arrival (the plan's and the runner's one function)."""
    level = _level("mode = open\n    rate = [10rps]\n    arrival = poisson\n    seed = 3",
                   "duration = 2s\n  bucket = 1s\n  deadline = 500ms", "100 requests")
    assert level.warmup_bound_s == pytest.approx(12.001246544091172 + 0.5)
    t0, records, runs, _ = _run(level, 0.05, 1)
    assert len([r for r in records if r.bucket < 0]) == 100 and runs[0].warmup_sent == 100


def test_a_warmup_that_sent_fewer_than_n_is_said_in_the_verdict(tmp_path):
    """A counted warmup its bound ended early (`warmup_sent` < `warmup_requests`) is never
    silent: the verdict's notes (and so `gate` and the report) say so; the verdict stays what the
    measured window decides (the warmup's requests are in no bucket)."""
    import dataclasses
    import copy

    from soakspec.judge import judge, load_evidence, render_text as verdict_text

    proc, out = run_spec(tmp_path, SIM_SPEC)
    assert proc.returncode == 0, proc.stderr
    ev = load_evidence(out)
    spec, _ = check(parse(SIM_SPEC)[0])
    assert not [n for n in judge(spec, ev).notes if "warmup" in n]
    manifest = copy.deepcopy(dict(ev.manifest))
    manifest["backends"][0]["levels"][0]["warmup_sent"] = 5
    verdict = judge(spec, dataclasses.replace(ev, manifest=manifest))
    said = "backend b0 workload w level 0: its warmup sent 5 of its 7 requests"
    assert any(said in n for n in verdict.notes), verdict.notes
    assert said in verdict_text(verdict) and verdict.outcome == "PASS"
    assert any(said in n and "measured after 5" in n for n in verdict.notes), verdict.notes
    # a level that ended within its warmup (an abort, a dead server) measured nothing: not "after 5"
    manifest["backends"][0]["levels"][0]["measure_start"] = None
    notes = judge(spec, dataclasses.replace(ev, manifest=manifest)).notes
    assert any(said in n and "ended within its warmup, nothing measured" in n for n in notes), notes


def _two_processes_end_their_warmups(first: float, second: float | None, bound: float):
    """Two --workers processes of one level (one count file) ending their counted warmup parts at
    `first` and `second` (None: never), each as `drive_level` does (`load._warmup_end`): the
    warmup end each then cuts its buckets from, or the error it fails with."""
    import types

    from soakspec.runner.load import _warmup_end

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=0.0)
        count = SharedCount.create()
        got: dict[int, object] = {}
        try:
            async def part(p: int, at: float | None) -> None:
                if at is None:
                    return
                await trio.sleep_until(clock.to_trio(at))
                ctx = types.SimpleNamespace(shared_count=count, part=(p, 2), clock=clock)
                try:
                    got[p] = await _warmup_end(ctx, clock.now(), bound)
                except Exception as e:  # noqa: BLE001 - the test reads it
                    got[p] = e

            async with trio.open_nursery() as n:
                n.start_soon(part, 0, first)
                n.start_soon(part, 1, second)
        finally:
            count.remove()
        return got

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_workers_cut_buckets_from_one_warmup_end_when_the_last_closes_late():
    """With --workers a process whose warmup ended first waits for the last one's end: the last
    warmup request may end at its deadline, at the bound, and closing its connection takes up to
    CLOSE_S more -- a process that gave up a second after the bound and took its own time cut its
    buckets from another start than the others and the parent."""
    got = _two_processes_end_their_warmups(9.0, 11.8, bound=10.0)
    assert got == {0: 11.8, 1: 11.8}


def test_workers_whose_warmups_never_agree_fail_the_level():
    from soakspec.runner.load import WarmupDisagreed

    got = _two_processes_end_their_warmups(9.0, None, bound=10.0)
    assert isinstance(got[0], WarmupDisagreed) and "did not all end its counted warmup" in str(got[0])


def test_a_capped_open_loops_warmup_estimate_is_the_caps_pace():
    """10 rps under max_concurrency 2 at expected_latency 1 s serves 2 rps: 20 warmup requests take
    ceil(20 / 2) rounds of 1 s = 10 s, not 20 / 10 = 2 s, and the plan says which pace it assumes
    (as the level's count estimate does)."""
    spec, _ = _checked("mode = open\n    rate = [10rps]\n    max_concurrency = 2", TIMING + "\n  expected_latency = 1s")
    p = plan(spec)
    assert p.backends[0].levels[0].expected_warmup_s == pytest.approx(10.0)
    assert "~10s at the 2 rps that max_concurrency 2 serves at the workload's expected_latency, at most" in render_text(p)
    # uncapped (or a cap that keeps up): N / rate, at the planned rate
    fast, _ = _checked("mode = open\n    rate = [10rps]\n    max_concurrency = 50", TIMING + "\n  expected_latency = 1s")
    assert plan(fast).backends[0].levels[0].expected_warmup_s == pytest.approx(2.0)
    assert "~2s at the planned rate, at most" in render_text(plan(fast))


def test_a_warmup_of_millions_is_bounded_without_walking_its_schedule(monkeypatch):
    """`plan` must not walk a billion seeded arrivals: past WALKED_ARRIVALS the n-th arrival's
    time is bounded by 8 standard deviations above n / rate -- never below what the walk gives
    (checked here with the threshold lowered, over many seeds and burstiness)."""
    import math

    from soakspec import arrivals as A

    monkeypatch.setattr(A, "WALKED_ARRIVALS", 2000)
    A.nth_arrival_s.cache_clear()
    try:
        for seed in range(40):
            for b in (1.0, 0.25, 4.0):
                walked = A.nth_arrival_s(5.0, "poisson", seed, 2000, b)
                bound = A.nth_arrival_s(5.0, "poisson", seed, 2001, b)
                assert walked < bound == (2001 + 8 * math.sqrt(2001 / b)) / 5.0, (seed, b, walked, bound)
        # a billion is answered by the formula, not by walking a billion arrivals
        assert A.nth_arrival_s(10.0, "poisson", 1, 10**9) == (10**9 + 8 * math.sqrt(10**9)) / 10.0
    finally:
        A.nth_arrival_s.cache_clear()


@pytest.mark.parametrize("edit", ["fewer", "more"])
def test_warmup_records_that_disagree_with_warmup_sent_fail_completed_run(tmp_path, edit):
    """Evidence edited (and re-sealed) so that a counted warmup's records (bucket -1) no longer
    match the manifest's `warmup_sent` -- two of its 7 records removed, or one more added --
    with `sent` edited to match, so only the warmup's own count disagrees. The short-warmup note
    trusts `warmup_sent`, so such evidence is never a silent PASS: completed_run fails naming
    the level and both counts, as records against `sent` do. Under --workers 2 `warmup_sent` is
    the processes' sum, and the unedited run passes."""
    import gzip
    import shutil

    from soakspec.evidence.io import read_json
    from soakspec.evidence.manifest import write_manifest
    from soakspec.evidence.testing import edit_requests
    from soakspec.evidence.verify import finalize_artifacts
    from soakspec.judge import judge, load_evidence

    proc, out = run_spec(tmp_path, SIM_SPEC, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    spec, _ = check(parse(SIM_SPEC)[0])
    assert judge(spec, load_evidence(out)).outcome == "PASS"
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    req = edited / "backends" / "b0" / "requests.jsonl.gz"
    warm = [ln for ln in gzip.decompress(req.read_bytes()).decode().splitlines() if json.loads(ln)["bucket"] == -1]
    assert len(warm) == 7
    if edit == "fewer":
        edit_requests(req, lambda t: "".join(ln + "\n" for ln in t.splitlines() if ln not in warm[:2]))
        have = 5
    else:
        copy = json.loads(warm[0])
        copy["request_id"] += "-copy"
        edit_requests(req, lambda t: t + json.dumps(copy) + "\n")
        have = 8
    m = read_json(edited / "manifest.json")
    lv = m["backends"][0]["levels"][0]
    lv["sent"] += have - 7
    m["artifacts"] = finalize_artifacts(edited)
    write_manifest(edited, m)
    verdict = judge(spec, load_evidence(edited))
    assert verdict.outcome != "PASS"
    (done,) = [r for r in verdict.rules if r.rule == "completed_run"]
    said = f"its counted warmup recorded {have} sent requests, but the manifest says it sent 7 (warmup_sent)"
    assert done.status == "fail" and done.message.startswith(f"backend b0, concurrency 3, 12 requests: {said}"), done.message
    assert [r.rule for r in verdict.rules if r.status == "fail"] == ["completed_run"]  # nothing else in the edit is wrong
