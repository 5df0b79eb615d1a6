"""`load { requests_per_level = N  min_duration = D }`: MLPerf LoadGen's min_query_count and
min_duration -- a counted level sends until it has sent at least N measured requests *and* D has
passed since its measured start, its `duration` still the bound. Checked (all errors at once,
with carets and hints), formatted, planned (max(N / rate, D)), run in virtual time (open and
closed loops, one process and two sharing the level's count and the run clock) and recorded
(`ended_by`: count, min_duration or duration)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from soakspec.diagnostics import render_one
from soakspec.lang import check, fmt, parse
from soakspec.plan import plan, render_text, to_json

from test_requests_per_level import _drive_parts, _level, _measured, _spec_text

def _mock():
    return trio.testing.MockClock(autojump_threshold=0)


# ---------------------------------------------------------------- check and fmt


def test_every_min_duration_mistake_is_reported_at_once_with_a_caret_and_a_hint():
    """One spec, three workloads: min_duration without a count (E403), one above the level's
    bound (E425) and one under a bucket (W518) -- all reported in one pass, each at its own
    line and column with a caret and a hint."""
    text = ('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
            'workload "none" {\n  load {\n    mode = closed\n    concurrency = [2]\n    min_duration = 20s\n  }\n'
            '  duration = 60s\n  bucket = 30s\n}\n'
            'workload "long" {\n  load {\n    mode = open\n    rate = [10rps]\n    requests_per_level = 50\n'
            '    min_duration = 2m\n  }\n  duration = 60s\n  bucket = 30s\n}\n'
            'workload "short" {\n  load {\n    mode = closed\n    concurrency = [2]\n    requests_per_level = 10\n'
            '    min_duration = 10s\n  }\n  duration = 60s\n  bucket = 30s\n}\n')
    spec, diags = check(parse(text)[0])
    assert spec is None
    got = sorted((d.code, d.span.line, d.span.column) for d in diags if "min_duration" in d.message)
    assert got == [("E403", 7, 5), ("E425", 17, 20), ("W518", 27, 20)], [(d.code, d.message) for d in diags]
    for d in diags:
        if "min_duration" in d.message:
            assert d.hint and "^" in render_one(d, text)


def test_fmt_keeps_min_duration():
    text = _spec_text("mode = open\n    rate = [10rps]\n    requests_per_level = 25\n    min_duration = 1m",
                      "duration = 2m\n  bucket = 30s\n  deadline = 60s")
    out = fmt(parse(text)[0])
    assert "min_duration = 1m" in out and fmt(parse(out)[0]) == out
    spec, _ = check(parse(out)[0])
    assert spec.workloads[0].load.min_duration_s == 60.0


# ---------------------------------------------------------------- plan


@pytest.mark.parametrize("load, extra, requests, load_s", [
    # open, 10 rps: 100 requests take 10 s, the 60 s minimum sends ~600
    ("mode = open\n    rate = [10rps]\n    arrival = constant\n    requests_per_level = 100\n    min_duration = 60s",
     "duration = 120s\n  bucket = 30s", 600, 60.0),
    # open, the count comes last: 1000 at 10 rps take 100 s, past the 60 s minimum
    ("mode = open\n    rate = [10rps]\n    arrival = constant\n    requests_per_level = 1000\n    min_duration = 60s",
     "duration = 120s\n  bucket = 30s", 1000, 100.0),
    # closed, 4 workers at 1 s: 100 requests take 25 s, the 60 s minimum sends ~240
    ("mode = closed\n    concurrency = [4]\n    requests_per_level = 100\n    min_duration = 60s",
     "duration = 120s\n  bucket = 30s\n  expected_latency = 1s", 240, 60.0),
])
def test_the_plan_estimates_a_level_by_the_later_of_its_count_and_its_min_duration(load, extra, requests, load_s):
    lv = _level(load, extra)
    assert lv.min_duration_s == 60.0 and lv.expected_requests == requests
    assert lv.expected_load_s == pytest.approx(load_s)
    assert lv.to_json()["min_duration_s"] == 60.0 and "min_duration 1m" in lv.label
    spec, _ = check(parse(_spec_text(load, extra))[0])
    assert "for at least 1m" in render_text(plan(spec))
    assert to_json(plan(spec))["backends"][0]["levels"][0]["min_duration_s"] == 60.0


def test_a_counted_warmup_comes_before_the_min_duration():
    """`warmup = 8 requests` at concurrency 4 and 1 s a request: ~2 s of warmup, then the level's
    minimum of 60 s from bucket 0 (the warmup is not in it, as LoadGen's is not): ~62 s of load."""
    lv = _level("mode = closed\n    concurrency = [4]\n    requests_per_level = 100\n    min_duration = 60s",
                "duration = 120s\n  bucket = 30s\n  warmup = 8 requests\n  expected_latency = 1s")
    assert lv.expected_warmup_s == pytest.approx(2.0) and lv.expected_load_s == pytest.approx(62.0)


def test_a_time_scaled_rehearsal_scales_the_min_duration():
    spec, _ = check(parse(_spec_text("mode = closed\n    concurrency = [2]\n    requests_per_level = 10\n    min_duration = 60s",
                                     "duration = 120s\n  bucket = 30s"))[0])
    assert plan(spec, time_scale=0.1, rehearse=True).backends[0].levels[0].min_duration_s == pytest.approx(6.0)


# ---------------------------------------------------------------- the runner, in virtual time

CLOSED = "mode = closed\n    concurrency = [3]\n    requests_per_level = 25\n    min_duration = {d}"
OPEN = "mode = open\n    rate = [10rps]\n    arrival = constant\n    requests_per_level = 25\n    min_duration = {d}"
TIMING = "duration = 10s\n  bucket = 1s\n  warmup = 1s\n  deadline = 60s"


@pytest.mark.parametrize("parts", [1, 2])
def test_a_closed_loop_whose_count_comes_first_runs_to_its_min_duration(parts):
    """3 workers, 0.3 s a request: 25 requests take 2.5 s, but the 5 s minimum keeps the workers
    going -- 50 measured requests, every one started before 5 s into the measured window (with
    two processes too: they read one run clock, so none takes a place after it), and the level
    ends when the last has ended: `ended_by: min_duration`."""
    level = _level(CLOSED.format(d="5s"), TIMING)
    t0, records, runs = trio.run(_drive_parts, level, 0.3, parts, clock=_mock())
    measured = _measured(records)
    m = t0 + 1.0
    n = len(measured)  # 3 workers × the rounds of 0.3 s that start before the minimum's end
    assert 45 <= n <= 51 and sum(r.measured for r in runs) == n
    assert m + 5 - 0.3 <= max(r.start for r in measured) < m + 5 <= max(r.end for r in measured)
    assert max(r.measure_end for r in runs) == pytest.approx(max(r.end for r in measured))
    summed = runs[0] if parts == 1 else _summed(level, t0, runs, n)
    assert summed.count_json() == {"measured_sent": n, "ended_by": "min_duration"}


@pytest.mark.parametrize("parts", [1, 2])
def test_a_closed_loop_whose_min_duration_comes_first_ends_at_its_count(parts):
    """The same level with a 1 s minimum: its 25 requests take 2.5 s, past the minimum, so it
    sends exactly 25 and ends by its count."""
    level = _level(CLOSED.format(d="1s"), TIMING)
    t0, records, runs = trio.run(_drive_parts, level, 0.3, parts, clock=_mock())
    assert len(_measured(records)) == 25
    summed = runs[0] if parts == 1 else _summed(level, t0, runs, 25)
    assert summed.count_json() == {"measured_sent": 25, "ended_by": "count"}


@pytest.mark.parametrize("parts", [1, 2])
def test_an_open_loop_whose_count_comes_first_follows_its_schedule_to_its_min_duration(parts):
    """10 rps of constant arrivals, 25 asked, a 5 s minimum: the schedule goes on past the 25th
    arrival (2.4 s) to every arrival due before 5 s -- 50 measured, intended at 1.0 .. 5.9 s from
    the level's start -- none at or after the minimum's end, and the level ends at the last one's
    end (with two processes splitting the arrivals, the same 50)."""
    level = _level(OPEN.format(d="5s"), TIMING)
    t0, records, runs = trio.run(_drive_parts, level, 0.2, parts, clock=_mock())
    measured = sorted(_measured(records), key=lambda r: r.intended_start)
    assert [r.intended_start - t0 for r in measured] == pytest.approx([1 + k / 10 for k in range(50)], abs=1e-9)
    assert all(r.count_reached for r in runs)
    assert max(r.measure_end for r in runs) == pytest.approx(t0 + 5.9 + 0.2, abs=1e-9)
    summed = runs[0] if parts == 1 else _summed(level, t0, runs, 50)
    assert summed.count_json() == {"measured_sent": 50, "ended_by": "min_duration"}


def test_an_open_loop_whose_min_duration_comes_first_ends_at_its_count():
    level = _level(OPEN.format(d="1s"), TIMING)
    t0, records, (run,) = trio.run(_drive_parts, level, 0.2, 1, clock=_mock())
    assert len(_measured(records)) == 25
    assert run.count_json() == {"measured_sent": 25, "ended_by": "count"}
    assert run.measure_end == pytest.approx(t0 + 3.4 + 0.2, abs=1e-9)


def test_the_duration_still_bounds_a_level_with_a_min_duration():
    """One worker, 1 s a request, 100 asked, a 3 s minimum and a 3 s bound: the bound ends it
    with 3 sent, not complete."""
    level = _level("mode = closed\n    concurrency = [1]\n    requests_per_level = 100\n    min_duration = 3s",
                   "duration = 3s\n  bucket = 1s\n  deadline = 60s")
    t0, records, (run,) = trio.run(_drive_parts, level, 1.0, 1, clock=_mock())
    assert len(_measured(records)) == 3
    assert run.count_json() == {"measured_sent": 3, "ended_by": "duration"}


def test_the_parents_bucket_hold_waits_for_the_min_duration():
    """--workers: the parent holds a counted level's last bucket open for the drain only once no
    process will start another request -- with a min_duration, the bucket its minimum ends in,
    not the one its n-th request started in (an open loop: read from the schedule)."""
    from soakspec.runner import workers
    from soakspec.runner.load import LevelRun

    level = _level(OPEN.format(d="5s"), TIMING)
    run = LevelRun(level, started_at=0.0, measure_start=1.0)
    holds = workers._holds(level, run, None)
    assert holds is not None and not holds(3) and holds(4)  # the last arrival, at 5.9 s: bucket 4 of the measured window


def _summed(level, t0, runs, taken):
    """The level's run as the --workers parent adds its processes' summaries up."""
    from soakspec.runner import workers
    from soakspec.runner.ids import IdSequence
    from soakspec.runner.load import LevelRun

    run = LevelRun(level, started_at=t0, measure_start=t0 + level.warmup_s)
    shares = [IdSequence("t").share(p, 2) for p in range(2)]
    workers._sum_up(run, [workers._summary(r, 0) for r in runs], shares, IdSequence("t"),
                    taken if level.concurrency is not None else None)
    return run


# ---------------------------------------------------------------- evidence, judge, report, compare


def _judged(least: str, per_bucket: int = 8):
    """A closed loop asked for 10 requests with a min_duration, as the test builder records it:
    `per_bucket` measured requests in each of its two 5 s buckets (its min_duration, 10 s, kept it
    sending past its count)."""
    from soakspec.judge.judge import judge
    from soakspec.judge.testing import EvidenceBuilder, spec_from_text

    spec = spec_from_text('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
                          'workload "w" {\n  load {\n    mode = closed\n    concurrency = [2]\n    requests_per_level = 10\n'
                          f'{least}  }}\n  duration = 10s\n  bucket = 5s\n  follow_up = false\n}}\n'
                          'gate {\n  require completed_run\n  require duration_coverage\n}\n')
    b = EvidenceBuilder(spec, per_bucket=per_bucket)
    return judge(spec, b.build()), b


def test_a_level_its_min_duration_ended_is_complete_and_its_extra_requests_are_no_problem():
    """16 of at least 10 requests over its 10 s min_duration: complete -- completed_run and
    duration_coverage pass, and results.json's level says `ended_by: min_duration` with the
    minimum. The same 16 in a level without a min_duration are more than it asked: not valid."""
    v, b = _judged("    min_duration = 10s\n")
    assert b.level("a", 0)["ended_by"] == "min_duration" and b.level("a", 0)["min_duration_s"] == 10.0
    status = {r.rule: (r.status, r.message) for r in v.rules}
    assert {s for s, _ in status.values()} == {"pass"}, status
    v2, _ = _judged("")
    (ran,) = [r for r in v2.rules if r.rule == "completed_run"]
    assert ran.status != "pass" and "more than the level's requests_per_level of 10" in ran.message


def test_the_report_row_and_results_say_the_min_duration_ended_the_level(tmp_path):
    """results.json's level `requests_per_level` carries `ended_by: min_duration` and the
    minimum; the report's row says so: "16 requests (at least 10; ended by its min_duration, 10s)"."""
    import json

    import subprocess
    import sys

    from runner_support import REPO

    v, b = _judged("    min_duration = 10s\n")
    run = b.write(tmp_path / "ev")
    results = json.loads((run / "results.json").read_text())
    (lv,) = [lv for bk in results["backends"] for lv in bk["levels"]]
    assert lv["requests_per_level"] == {"asked": 10, "sent": 16, "ended_by": "min_duration", "min_duration_s": 10.0}
    md = subprocess.run([sys.executable, "-m", "soakspec", "report", str(run), "--format", "md"], cwd=REPO,
                        capture_output=True, text=True, timeout=60).stdout
    assert "concurrency 2, 16 requests (at least 10; ended by its min_duration, 10s) |" in md, md[-2000:]


def test_compare_pairs_a_min_duration_level_only_with_one_of_the_same_minimum():
    from soakspec.compare.matching import _identity

    class Lv:
        workload = "w"

        def __init__(self, entry):
            self.entry = entry

    base = {"mode": "closed", "concurrency": 2, "rate": None, "batch_requests": None, "shape": None, "requests_per_level": 10}
    assert _identity(Lv(base)) != _identity(Lv(base | {"min_duration_s": 60.0}))
    assert _identity(Lv(base | {"min_duration_s": 60.0})) != _identity(Lv(base | {"min_duration_s": 30.0}))
    assert _identity(Lv(base | {"min_duration_s": 60.0})) == _identity(Lv(base | {"min_duration_s": 60.0}))


def test_the_evidence_builder_writes_a_min_duration_level_that_verifies(tmp_path):
    """`build_evidence_dir(count=, min_duration_s=)` leaves a schema-valid run whose level says
    what the runner says: 3 sent of 2 asked under a min_duration, ended by it."""
    import json

    from soakspec.evidence import schema
    from soakspec.evidence.testing import build_evidence_dir

    m = build_evidence_dir(tmp_path / "ev", backends=("a",), requests_per_backend=3, count=2, min_duration_s=60.0)
    (lv,) = m["backends"][0]["levels"]
    assert (lv["requests_per_level"], lv["min_duration_s"], lv["measured_sent"], lv["ended_by"]) == (2, 60.0, 3, "min_duration")
    assert schema.errors_for("manifest", json.loads((tmp_path / "ev" / "manifest.json").read_text())) == []


def test_gate_with_a_spec_of_another_min_duration_says_the_level_is_not_the_one_that_ran():
    """Evidence of a level with a 10 s min_duration, judged with a spec that plans 5 s (`gate
    --spec`): completed_run names the difference -- the level did not run as the spec plans."""
    from soakspec.judge.judge import judge
    from soakspec.judge.testing import spec_from_text

    v, b = _judged("    min_duration = 10s\n")
    other = spec_from_text('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
                           'workload "w" {\n  load {\n    mode = closed\n    concurrency = [2]\n    requests_per_level = 10\n'
                           '    min_duration = 5s\n  }\n  duration = 10s\n  bucket = 5s\n  follow_up = false\n}\n'
                           'gate {\n  require completed_run\n}\n')
    (ran,) = [r for r in judge(other, b.build()).rules if r.rule == "completed_run"]
    assert ran.status != "pass" and "min_duration 10s (the spec plans 5s)" in ran.message, ran.message


def test_a_real_run_with_workers_ends_at_its_min_duration_every_process_agreeing(tmp_path):
    """`soakspec run --workers 2` against the simulator: a closed loop of 3, 10 requests asked, a
    1500 ms minimum (the ~60 ms server sends the 10 long before it): no measured request of either
    process starts after the minimum's end, the level sent more than 10, the manifest says
    `ended_by: min_duration` with the minimum, and the gate holds it complete."""
    import json

    from test_requests_per_level import _level_entry, _records, _run, _sim_spec

    out = tmp_path / "ev"
    spec = _sim_spec(tmp_path, "mode = closed\nconcurrency = [3]\nrequests_per_level = 10\nmin_duration = 1500ms",
                     duration="10s")
    proc = _run(spec, out, 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lv = _level_entry(out)
    measured = [r for r in _records(out) if r.bucket >= 0]
    assert (lv["min_duration_s"], lv["ended_by"], lv["measured_sent"]) == (1.5, "min_duration", len(measured))
    assert len(measured) > 10 and {r.worker % 2 for r in measured} == {0, 1}  # both processes sent
    assert max(r.start for r in measured) < lv["measure_start"] + 1.5 <= lv["measure_end"]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["exit_code"] == 0, verdict["rules"]


def test_progress_says_the_minimum_and_that_it_ended_the_level():
    """Plain progress lines: the level's first line says "at least 25 measured requests for at
    least 5s", its last "51/25 requests; ended by its min_duration (its count sent first)" --
    every request it sent, not the count's 25/25."""
    import io

    from soakspec.runner.load import LiveStats
    from soakspec.runner.progress import Progress

    buf = io.StringIO()
    p = Progress(stream=buf)
    p.level_started("a", "w / concurrency 3, 25 requests, min_duration 5s", 11.0, 1.0, 10, 1.0, 25, 5.0)
    stats = LiveStats()
    stats.measured = 31  # past its count, its minimum not passed: the bucket's line counts on
    p.bucket_done("a", "w / concurrency 3, 25 requests, min_duration 5s", 2, 10, stats)
    stats.measured = 51
    p.level_ended("a", "w / concurrency 3, 25 requests, min_duration 5s", stats, True, "min_duration")
    text = buf.getvalue()
    assert "at least 25 measured requests for at least 5s, at most 11s" in text, text
    assert "bucket 2 done; 31/25 requests;" in text, text
    assert "51/25 requests; ended by its min_duration (its count sent first)" in text, text


def test_the_judges_level_label_is_the_plans():
    """The label the judge and the reports rebuild from a manifest entry (`index.level_label`) is
    the plan's, min_duration included."""
    from soakspec.judge.index import level_label

    lv = _level(CLOSED.format(d="5s"), TIMING)
    assert level_label(lv.to_json()) == lv.label == "concurrency 3, 25 requests, min_duration 5s"


def test_a_level_that_stopped_at_its_count_before_its_min_duration_is_not_complete():
    """Evidence whose level sent exactly its 10 and ended 5 s into its window though its
    min_duration is 10 s (a runner that ignored the minimum): completed_run says it stopped short,
    never a pass. The same level ending at 10 s is complete."""
    from soakspec.judge.judge import judge
    from soakspec.judge.testing import EvidenceBuilder, spec_from_text

    spec = spec_from_text('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
                          'workload "w" {\n  load {\n    mode = closed\n    concurrency = [2]\n    requests_per_level = 10\n'
                          '    min_duration = 10s\n  }\n  duration = 10s\n  bucket = 5s\n  follow_up = false\n}\n'
                          'gate {\n  require completed_run\n}\n')
    b = EvidenceBuilder(spec, per_bucket=5)
    (ok,) = [r for r in judge(spec, b.build()).rules if r.rule == "completed_run"]
    assert ok.status == "pass", ok.message
    b = EvidenceBuilder(spec, per_bucket=10)
    b.drop_bucket_requests("a", 0, 1)
    lv = b.level("a", 0)
    first = lv["buckets"][0]
    lv.update(buckets=[first], measure_end=first["end"], drained_at=first["end"], measured_sent=10, ended_by="count")
    (short,) = [r for r in judge(spec, b.build()).rules if r.rule == "completed_run"]
    assert short.status != "pass" and "before its min_duration (10s), with its 10 requests sent" in short.message, short.message


def _open_sim_spec(tmp_path, arrival: str):
    """An open loop at 20 rps asked for 40 with a 2 s minimum (N = rate x D), 1 s buckets after a
    1 s warmup, against a ~10 ms simulator: its last scheduled arrival before the minimum ends is
    served before it, so the level drains inside its min_duration."""
    path = tmp_path / "open.soak"
    path.write_text('soak "count" {}\nbackend "a" {\n  sim {\n    ttft = 2ms\n    itl = 1ms\n  }\n}\n'
                    'workload "w" {\n  prompt_words = 8\n  max_tokens = 4\n  load {\n    mode = open\n    rate = [20rps]\n'
                    f'    {arrival}\n    requests_per_level = 40\n    min_duration = 2s\n  }}\n  warmup = 1s\n  duration = 5s\n'
                    '  bucket = 1s\n  deadline = 30s\n  follow_up = false\n}\n'
                    'gate {\n  require failed == 0\n  require duration_coverage\n  require completed_run\n}\n')
    return path


@pytest.mark.slow
@pytest.mark.parametrize("arrival, last", [
    # constant: 40 arrivals in [m, m + 2s), the 41st due exactly at m + 2s -- not sent
    ("arrival = constant", 1.95),
    # Poisson and gamma seeds whose schedule holds exactly 40 arrivals in [m, m + 2s) (P ~ 4%)
    ("arrival = poisson\n    seed = 120", 1.93),
    ("arrival = poisson\n    seed = 55\n    burstiness = 0.5", 1.822),
])
def test_an_open_loop_whose_schedule_holds_exactly_n_before_its_min_duration_is_complete(tmp_path, arrival, last):
    """The schedule's 40 arrivals due before m + D are every one the level sends (the next is due
    at or after it), so it ends with exactly 40, drained before its minimum's end: complete as
    the schedule has it -- the gate passes, not "ended before its min_duration"."""
    import json

    from test_requests_per_level import _level_entry, _records, _run

    out = tmp_path / "ev"
    proc = _run(_open_sim_spec(tmp_path, arrival), out)
    lv = _level_entry(out)
    measured = sorted(r.intended_start - lv["measure_start"] for r in _records(out) if r.bucket >= 0)
    assert len(measured) == 40 and measured[-1] == pytest.approx(last, abs=1e-3)
    assert lv["measure_end"] - lv["measure_start"] < 2.0, lv  # drained inside its minimum
    verdict = json.loads((out / "verdict.json").read_text())
    assert proc.returncode == 0, [r for r in verdict["rules"] if r["status"] != "pass"]


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("load, extra, latency, sent", [
    # min_duration = duration: the workers take places past 10 until 3 s, then the bound (the
    # same instant) ends their loop before they ask for another -- the minimum ended it
    ("mode = closed\n    concurrency = [2]\n    requests_per_level = 10\n    min_duration = 3s",
     "duration = 3s\n  bucket = 1s\n  deadline = 60s", 0.05, 120),
    # 0.9 s a request: 2 at 0, 2 more at 0.9 (before the 1 s minimum), ending at 1.8 s, past the
    # 1.5 s bound: its count and its minimum both held, so they ended it, not the bound
    ("mode = closed\n    concurrency = [2]\n    requests_per_level = 2\n    min_duration = 1s",
     "duration = 1500ms\n  bucket = 500ms\n  deadline = 60s", 0.9, 4),
])
def test_a_closed_loop_whose_bound_comes_after_its_minimum_records_the_minimum_ended_it(load, extra, latency, sent, parts):
    """One process and two agree: `ended_by: min_duration` with every request sent, the measured
    window ending at the drain (the last request's end), never `duration` (not complete) for a
    level that sent its count and ran its minimum."""
    level = _level(load, extra)
    t0, records, runs = trio.run(_drive_parts, level, latency, parts, clock=_mock())
    measured = _measured(records)
    assert len(measured) == sent
    summed = runs[0] if parts == 1 else _summed(level, t0, runs, sent)
    assert summed.count_json() == {"measured_sent": sent, "ended_by": "min_duration"}
    assert summed.measure_end == pytest.approx(max(r.end for r in measured))
    assert summed.bucket_windows()[-1]["end"] == pytest.approx(summed.measure_end)


@pytest.mark.parametrize("load, extra, floor", [
    # Poisson: at least its 40 (the count), not 0 -- 90 expected over its 3 s minimum
    ("mode = open\n    rate = [30rps]\n    arrival = poisson\n    requests_per_level = 40\n    min_duration = 3s",
     "duration = 10s\n  bucket = 1s", 40),
    # constant: every arrival due before 3 s -- 90, more than its 40
    ("mode = open\n    rate = [30rps]\n    arrival = constant\n    requests_per_level = 40\n    min_duration = 3s",
     "duration = 10s\n  bucket = 1s", 90),
    # closed: its 40, not one a worker
    ("mode = closed\n    concurrency = [4]\n    requests_per_level = 40\n    min_duration = 3s",
     "duration = 10s\n  bucket = 1s", 40),
])
def test_the_plans_floor_of_a_counted_level_with_a_minimum_is_the_same_everywhere(load, extra, floor):
    """A counted level the plan expects to reach its count sends at least its N (constant
    arrivals: every one due before its minimum, if more): the level's line, the backend's and
    the total's `requests: ≥ ...` and the JSON's min_requests all say the same floor."""
    spec, _ = check(parse(_spec_text(load, extra))[0])
    p = plan(spec)
    assert p.backends[0].levels[0].min_requests == floor
    j = to_json(p)
    assert j["min_requests"] == j["backends"][0]["min_requests"] == j["backends"][0]["levels"][0]["min_requests"] == floor
    text = render_text(p)
    assert f"requests ≥ {floor} measured" in text and f"requests: ≥ {floor}," in text and f"total: requests ≥ {floor}," in text, text


def test_the_judge_rebuilds_the_schedule_to_tell_a_complete_open_loop_from_one_stopped_short():
    """Evidence of an open loop at 2 rps asked for 20 with a 10 s minimum, drained 9.6 s into its
    window with exactly 20 sent: its schedule's 21st arrival is due at 10 s, so it sent every
    arrival it was to send -- complete. With a 12 s minimum the schedule holds 24 before it, so
    the same 20 stopped short: not complete."""
    from soakspec.judge.judge import judge
    from soakspec.judge.testing import EvidenceBuilder, spec_from_text

    def ran(least: str):
        spec = spec_from_text('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
                              'workload "w" {\n  load {\n    mode = open\n    rate = [2rps]\n    arrival = constant\n'
                              f'    requests_per_level = 20\n    min_duration = {least}\n  }}\n  duration = 20s\n  bucket = 5s\n'
                              '  follow_up = false\n}\ngate {\n  require completed_run\n}\n')
        b = EvidenceBuilder(spec, latency=0.1)
        lv = b.level("a", 0)
        ms = lv["measure_start"]
        kept = [r for r in b.records["a"] if r["bucket"] < 0 or r["intended_start"] < ms + 9.6]
        b.records["a"][:] = kept
        lv.update(buckets=lv["buckets"][:2], measure_end=ms + 9.6, drained_at=ms + 9.6, measured_sent=20, ended_by="count",
                  sent=len(kept))
        lv["buckets"][-1]["end"] = ms + 9.6
        (rule,) = [r for r in judge(spec, b.build()).rules if r.rule == "completed_run"]
        return rule

    ok = ran("10s")
    assert ok.status == "pass", ok.message
    short = ran("12s")
    assert short.status != "pass" and "before its min_duration (12s), with its 20 requests sent" in short.message, short.message
