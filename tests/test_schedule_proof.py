"""The schedule proof (`judge/schedproof.py`): an open loop's records are exactly its seeded
schedule's arrivals, or the run is INCONCLUSIVE -- the client did not do what it promised,
never the server's FAIL. Levels the manifest does not determine are said to be not proven."""

from __future__ import annotations

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.evidence.record import _round_us
from soakspec.judge import judge, schedproof
from soakspec.judge.testing import EvidenceBuilder, spec_from_text
from soakspec.lang import check, parse
from soakspec.plan import plan
from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence
from soakspec.runner.load import LevelContext, Shapes, drive_level

from test_load_schedule import FakeServer


def _open_spec(load: str, rules: str = "require failed == 0", duration: str = "\n  duration = 1m"):
    return spec_from_text('soak "s" {}\nbackend "a" {\n  url = "http://127.0.0.1:8000"\n}\n'
                          f'workload "w" {{\n  load {{\n    mode = open\n    {load}\n  }}{duration}\n'
                          '  bucket = 20s\n  deadline = 30s\n  follow_up = false\n}\n'
                          f'gate {{\n  {rules}\n}}\n')


POISSON = _open_spec("rate = [2rps, 3rps]\n    arrival = poisson\n    seed = 7")


def _health(v):
    return next(r for r in v.rules if r.rule == "client_healthy")


def _open_records(b: EvidenceBuilder, level: int = 0) -> list[dict]:
    return sorted((r for r in b.records["a"] if r["level"] == level and r["bucket"] != -2), key=lambda r: r["intended_start"])


def test_clean_scheduled_evidence_is_proven_and_says_so():
    v = judge(POISSON, EvidenceBuilder(POISSON).build())
    assert v.outcome == "PASS"
    assert "it sent on its schedule in 2 open-loop levels" in _health(v).message


def test_a_dropped_arrival_is_inconclusive_naming_it():
    b = EvidenceBuilder(POISSON)
    gone = _open_records(b)[7]
    b.records["a"].remove(gone)
    v = judge(POISSON, b.build())
    assert v.outcome == "INCONCLUSIVE"
    assert "the load generator did not send on its schedule: arrival 7 " in _health(v).message
    assert "has no record: dropped" in _health(v).message and "rate 2 rps" in _health(v).message


def test_an_added_record_is_inconclusive_naming_it():
    b = EvidenceBuilder(POISSON)
    recs = _open_records(b)
    extra = dict(recs[3], request_id="run1-a-extra", intended_start=(recs[3]["intended_start"] + recs[4]["intended_start"]) / 2)
    b.records["a"].append(extra)
    v = judge(POISSON, b.build())
    assert v.outcome == "INCONCLUSIVE"
    assert "is no arrival of the schedule: added" in _health(v).message


def test_a_shifted_intended_start_is_inconclusive_with_the_shift():
    b = EvidenceBuilder(POISSON)
    _open_records(b, 1)[5]["intended_start"] += 0.002  # 2 ms late on paper: more than the records' 1 us
    v = judge(POISSON, b.build())
    assert v.outcome == "INCONCLUSIVE"
    msg = _health(v).message
    assert "rate 3 rps" in msg and "arrival 5 was due" in msg and "shifted +2.00" in msg


def test_a_shift_within_the_records_microsecond_is_not_a_mismatch():
    b = EvidenceBuilder(POISSON)
    _open_records(b)[5]["intended_start"] += 1e-6
    assert judge(POISSON, b.build()).outcome == "PASS"


def test_a_wrong_seed_in_the_manifest_is_inconclusive():
    b = EvidenceBuilder(POISSON)
    b.manifest["backends"][0]["levels"][0]["schedule"]["seed"] += 1
    v = judge(POISSON, b.build())
    assert v.outcome == "INCONCLUSIVE" and "did not send on its schedule" in _health(v).message


def test_a_server_fail_beside_a_broken_schedule_is_not_the_servers():
    spec = _open_spec("rate = [2rps]\n    arrival = poisson", "require p95(ttft) < 10ms")
    b = EvidenceBuilder(spec)
    assert judge(spec, b.build()).outcome == "FAIL"  # ttft is 100 ms: the server's FAIL
    b.records["a"].remove(_open_records(b)[2])
    v = judge(spec, b.build())
    assert v.outcome == "INCONCLUSIVE"
    rule = next(r for r in v.rules if "ttft" in r.rule)
    assert rule.status == "inconclusive" and "did not send on its schedule" in rule.message


def test_evidence_without_the_schedule_is_judged_as_it_ran_and_says_not_proven():
    """Older evidence (no `schedule` in the manifest): no proof, said so, no new failure -- even
    with records that no schedule would give."""
    b = EvidenceBuilder(POISSON, scheduled=False)
    assert "schedule" not in b.manifest["backends"][0]["levels"][0]
    v = judge(POISSON, b.build())
    assert v.outcome == "PASS"
    assert "schedule not proven: 2 open-loop levels (the manifest records no schedule" in _health(v).message


def test_a_client_inconclusive_for_another_reason_still_says_which_schedules_are_not_proven():
    """client_healthy INCONCLUSIVE for a saturated load generator said that reason alone: the
    levels whose schedule the proof could not cover ("schedule not proven: ...") were said only
    when it passed, so a reader took the schedules for proven. Both are said -- and so when
    client.jsonl is missing."""
    b = EvidenceBuilder(POISSON, scheduled=False).with_client(lag=0.2)
    msg = _health(judge(POISSON, b.build())).message
    assert "load generator saturated in bucket 0: event-loop lag p99 200 ms (limit 50 ms)" in msg
    assert "schedule not proven: 2 open-loop levels (the manifest records no schedule" in msg


def test_a_missing_client_jsonl_still_says_which_schedules_are_not_proven(tmp_path):
    from soakspec.judge.evidence import load_evidence

    b = EvidenceBuilder(POISSON, scheduled=False).with_client()
    root = b.write(tmp_path / "run")
    (root / "client.jsonl").unlink()
    health = _health(judge(POISSON, load_evidence(root)))
    assert health.status == "inconclusive" and "client.jsonl is missing (the manifest lists it)" in health.message
    assert "schedule not proven: 2 open-loop levels (the manifest records no schedule" in health.message


def test_a_ramp_is_stated_as_not_proven():
    spec = _open_spec("phases {\n      up { rate = 1rps  ramp_to = 3rps  duration = 20s }\n      flat { rate = 2rps  duration = 40s }\n    }", duration="")
    v = judge(spec, EvidenceBuilder(spec).build())
    msg = _health(v).message
    assert v.outcome == "PASS"
    assert "it sent on its schedule in 1 open-loop level" in msg  # the flat phase
    assert "schedule not proven: 1 open-loop level (a ramp's or step's rate varies" in msg


def test_a_level_cut_short_is_not_proven():
    b = EvidenceBuilder(POISSON)
    b.manifest["backends"][0]["levels"][1]["completed"] = False
    assert schedproof.prove(b.manifest["backends"][0]["levels"][1], []).status == "unproven"


def _level(rate: float, arrival: str, seed: int, burst: float, duration_ms: int, bucket_ms: int, warmup: str, count: int | None,
           least_ms: int | None = None):
    burst_line = f"\n burstiness = {burst}" if arrival == "poisson" and burst != 1.0 else ""
    count_line = f"\n requests_per_level = {count}" if count else ""
    if count and least_ms:
        count_line += f"\n min_duration = {min(least_ms, duration_ms)}ms"
    text = ('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
            f'workload "w" {{\n load {{\n mode = open\n rate = [{rate}rps]\n arrival = {arrival}\n seed = {seed}{burst_line}{count_line}\n }}\n'
            f' duration = {duration_ms}ms\n bucket = {bucket_ms}ms\n warmup = {warmup}\n deadline = 30s\n follow_up = false\n}}\n')
    spec, diags = check(parse(text)[0])
    assert spec is not None, [d.message for d in diags]
    return plan(spec).backends[0].levels[0]


def _drive(level, epoch: float):
    async def main():
        clock = RunClock(timer=trio.current_time, epoch=epoch)
        server = FakeServer(clock, 0.05)
        records: list = []
        ctx = LevelContext("a", clock, server.connect, Shapes(level.request), records.extend, IdSequence("t"))
        return await drive_level(level, ctx), records

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=60, deadline=None)
@given(rate=st.sampled_from([0.5, 2.0, 5.0, 7.5, 40.0]), arrival=st.sampled_from(["constant", "poisson"]),
       seed=st.integers(0, 2**31), burst=st.sampled_from([1.0, 0.5, 3.0]),
       duration_ms=st.sampled_from([1000, 2000, 3500]), bucket_ms=st.sampled_from([200, 300, 500, 1000]),
       warmup=st.sampled_from(["0s", "300ms", "1s", "3 requests"]), count=st.sampled_from([None, 5]),
       least_ms=st.sampled_from([None, 200, 900, 2500]), epoch=st.sampled_from([0.0, 1_747_000_000.123456, 1796638213.623406]))
def test_runner_written_records_always_prove(rate, arrival, seed, burst, duration_ms, bucket_ms, warmup, count, least_ms, epoch):
    """Property: what the runner sends (`drive_level`, virtual time) and records -- rounded to
    1 us as written -- proves against its manifest entry (the plan's, and the times the
    recorder writes), for any rate, seed, arrival, burstiness, duration, bucket, warmup, count
    and a count's min_duration (arrivals past the count until it has passed)."""
    level = _level(rate, arrival, seed, burst, duration_ms, bucket_ms, warmup, count, least_ms)
    run, records = _drive(level, epoch)
    entry = level.to_json() | {"started_at": run.started_at, "measure_start": run.measure_start, "completed": run.completed}
    proof = schedproof.prove(entry, [_round_us(r.intended_start) for r in records])
    assert proof.status == "proven", proof.reason
    assert proof.arrivals == len(records)


def test_what_a_bucket_offered_is_its_schedules_arrivals_not_the_nominal_rate():
    """Where the schedule is recorded, a bucket's offered rate -- results.json's per-bucket
    `scheduled_rate`, client_healthy's achieved-vs-offered and the HTML qps chart's dashed
    "offered" line -- is the arrivals the seeded schedule put in it per second, not the
    nominal 2 rps a Poisson schedule only averages."""
    from soakspec.report import prepare

    inp = prepare(POISSON, EvidenceBuilder(POISSON).with_client().build())
    be = inp.results["backends"][0]
    b0 = next(w for w in be["buckets"] if w["level"] == 0 and w["bucket"] == 0)
    due = sum(1 for r in _open_records(EvidenceBuilder(POISSON)) if r["bucket"] == 0)
    assert b0["scheduled_rate"] == due / 20.0 and due != 40  # 2 rps nominal: 40 in a 20 s bucket
    assert b0["client"]["offered"] == b0["scheduled_rate"]
    assert f"offered at 10.0s: {due / 20.0:.2f} req/s" in inp.render("html")
    unscheduled = prepare(POISSON, EvidenceBuilder(POISSON, scheduled=False).with_client().build())
    w = next(w for w in unscheduled.results["backends"][0]["buckets"] if w["level"] == 0 and w["bucket"] == 0)
    assert w["scheduled_rate"] is None and w["client"]["offered"] == 2.0


@pytest.mark.slow
def test_a_real_split_poisson_run_proves_end_to_end(tmp_path):
    """`soakspec run --workers 2` of a gamma schedule with a counted warmup, then `soakspec
    gate`: the runner's own evidence passes, and the verdict says the schedule was proven."""
    import json
    import subprocess

    from runner_support import manifest, new_marker, read_jsonl, run_soakspec, sim_spec, soakspec_cmd, wait_no_survivors

    text = sim_spec(sim="ttft = 10ms\n    itl = 2ms", duration="2s", bucket="500ms", follow_up=False,
                    load="mode = open\n    rate = [40rps]\n    arrival = poisson\n    burstiness = 0.5\n    seed = 11")
    text = text.replace("  duration = 2s", "  duration = 2s\n  warmup = 5 requests")
    spec = tmp_path / "p.soak"
    spec.write_text(text)
    marker = new_marker()
    proc = run_soakspec(["run", str(spec), "--out", str(tmp_path / "run"), "--quiet", "--workers", "2"], marker, tmp_path)
    assert wait_no_survivors(marker) == []
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    gate = subprocess.run(soakspec_cmd("gate", str(tmp_path / "run"), "--format", "json"), capture_output=True, text=True, timeout=120)
    health = next(r for r in json.loads(gate.stdout)["rules"] if r["rule"] == "client_healthy")
    assert "did not send on its schedule" not in health["message"], health["message"]
    level = manifest(tmp_path / "run")["backends"][0]["levels"][0]
    rows = read_jsonl(tmp_path / "run" / "backends" / "b0" / "requests.jsonl.gz")
    assert level["workers"] == 2 and {r["worker"] % 2 for r in rows} == {0, 1}
    assert sum(r["bucket"] == -1 for r in rows) == 5
    proof = schedproof.prove(level, [r["intended_start"] for r in rows])
    assert (proof.status, proof.arrivals) == ("proven", len(rows)), proof.reason
    if health["status"] == "pass":  # (a busy machine may find the client saturated: then it says that first)
        assert "it sent on its schedule in 1 open-loop level" in health["message"], health["message"]


@pytest.mark.parametrize("other, said", [
    ("rate = [2rps, 3rps]\n    arrival = poisson\n    seed = 8", "arrival poisson seed 7 (the spec plans poisson seed 8)"),
    ("rate = [2rps, 3rps]\n    arrival = constant", "arrival poisson seed 7 (the spec plans constant)"),
    ("rate = [2rps, 3rps]\n    arrival = poisson\n    seed = 7\n    burstiness = 0.5",
     "arrival poisson seed 7 (the spec plans poisson seed 7 burstiness 0.5)"),
])
def test_gate_with_a_spec_of_another_schedule_says_the_level_is_not_the_one_that_ran(other, said):
    """`gate --spec` with a spec whose open loop plans another arrival, seed or burstiness than
    the manifest's `schedule`: completed_run names the difference (judged as the spec's level, its
    offered load and latencies would speak of arrivals never sent). Evidence from before the
    manifest recorded `schedule` is not compared: it passes as it did."""
    b = EvidenceBuilder(POISSON)
    spec = _open_spec(other, "require completed_run")
    (ran,) = [r for r in judge(spec, b.build()).rules if r.rule == "completed_run"]
    assert ran.status != "pass" and said in ran.message, ran.message
    old = EvidenceBuilder(POISSON, scheduled=False)
    (ran,) = [r for r in judge(spec, old.build()).rules if r.rule == "completed_run"]
    assert ran.status == "pass", ran.message


@settings(max_examples=200, deadline=None)
@given(rate=st.sampled_from([0.5, 1 / 3, 0.1 * 3, 2.0, 5.0, 7.3, 40.0, 999.9, 3.141592653589793]),
       arrival=st.sampled_from(["constant", "poisson"]), seed=st.integers(0, 2**31), burst=st.sampled_from([1.0, 0.5, 3.0]),
       origin=st.sampled_from([0.0, 1_747_000_000.123456, 1796638213.623406, 1_800_000_000.999999]),
       duration=st.sampled_from([1.0, 3.5, 7.0, 0.3 * 3]), bucket=st.sampled_from([0.2, 0.3, 0.5, 1.0, 2.0]),
       warmup=st.sampled_from([0.0, 0.3, 1.0, 2.5]), warm_n=st.sampled_from([None, 1, 3, 50]),
       count=st.sampled_from([None, 1, 5, 200]), least=st.sampled_from([None, 0.2, 0.9, 2.5]), chunk=st.sampled_from([1, 7, 1 << 20]))
def test_the_vectorised_rebuild_is_the_walk_bit_for_bit(rate, arrival, seed, burst, origin, duration, bucket, warmup, warm_n,
                                                          count, least, chunk):
    """Property: `expected_times` (constant arrivals in numpy, in chunks) is `expected` (the
    runner's generator walked) bit for bit -- not within the proof's microsecond -- for any
    rate (one whose ticks overflow int64 included: walked), origin at epoch scale, bucket,
    timed or counted warmup, count and min_duration (`Quota.first`), across chunk edges."""
    entry = _entry(rate, arrival, seed, burst, origin, duration, bucket, warmup, warm_n, count, least)
    walked = np.fromiter(schedproof.expected(entry), dtype=np.float64)
    old, schedproof.CHUNK = schedproof.CHUNK, chunk
    try:
        built = schedproof.expected_times(entry)
    finally:
        schedproof.CHUNK = old
    assert built.dtype == np.float64 and built.tobytes() == walked.tobytes()


def _entry(rate, arrival, seed, burst, origin, duration, bucket, warmup, warm_n, count, least):
    """A completed open-loop level's manifest entry: its schedule, a timed warmup or a counted
    one of `warm_n` (measured from 0.4 s on), a count and a min_duration where given."""
    entry = {"schedule": {"rate": rate, "arrival": arrival, "seed": seed, "burstiness": burst}, "mode": "open", "completed": True,
             "started_at": origin, "measure_start": origin + (0.4 if warm_n else warmup), "planned_duration_s": duration,
             "bucket_s": bucket, "warmup_s": warmup}
    if warm_n:
        entry["warmup_requests"] = warm_n
    if count:
        entry["requests_per_level"] = count
        if least is not None:
            entry["min_duration_s"] = least
    return entry


def _poisson_entry(rate, seed, origin, duration, bucket, warmup, warm_n, count, least):
    return _entry(rate, "poisson", seed, 1.0, origin, duration, bucket, warmup, warm_n, count, least)


@settings(max_examples=200, deadline=None)
@given(rate=st.sampled_from([0.5, 1 / 3, 2.0, 7.3, 40.0, 999.9, 1000.0, 3.141592653589793]), seed=st.integers(0, 2**63),
       origin=st.sampled_from([0.0, 1_747_000_000.123456, 1796638213.623406, 1_800_000_000.999999]),
       duration=st.sampled_from([1.0, 3.5, 7.0, 0.3 * 3]), bucket=st.sampled_from([0.2, 0.3, 0.5, 1.0, 2.0]),
       warmup=st.sampled_from([0.0, 0.3, 1.0, 2.5]), warm_n=st.sampled_from([None, 1, 3, 50, 700]),
       count=st.sampled_from([None, 1, 5, 200, 3000]), least=st.sampled_from([None, 0.2, 0.9, 2.5]),
       chunk=st.sampled_from([1, 2, 7, 64, 1 << 20]), block=st.sampled_from([1, 5, 1 << 16]))
def test_the_vectorised_poisson_rebuild_is_the_walk_bit_for_bit(rate, seed, origin, duration, bucket, warmup, warm_n, count, least,
                                                                  chunk, block):
    """Property: a Poisson schedule rebuilt in numpy (`_poisson`: Python's MT19937 state in
    numpy, libm's log, the running time as a cumulative sum carried across chunks) is the
    runner's generator walked (`expected`) bit for bit, as one array and chunk by chunk (what
    `prove` reads), for any rate, seed, origin at epoch scale, grid, timed or counted warmup,
    count and min_duration, chunk and log block."""
    entry = _poisson_entry(rate, seed, origin, duration, bucket, warmup, warm_n, count, least)
    walked = np.fromiter(schedproof.expected(entry), dtype=np.float64)
    old = schedproof.CHUNK, schedproof.LOG_BLOCK
    schedproof.CHUNK, schedproof.LOG_BLOCK = chunk, block
    try:
        built = schedproof.expected_times(entry)
        chunks = list(schedproof.arrival_chunks(entry))
    finally:
        schedproof.CHUNK, schedproof.LOG_BLOCK = old
    assert built.dtype == np.float64 and built.tobytes() == walked.tobytes()
    assert all(len(c) <= chunk for c in chunks) and np.concatenate(chunks or [built]).tobytes() == walked.tobytes()


def test_a_poisson_day_is_rebuilt_in_numpy_not_walked(monkeypatch):
    """On this interpreter (CPython's expovariate is -log(1 - random()) / rate) a long Poisson
    schedule is not walked: `_walked` is never reached, and it is still the walk's floats."""
    entry = _poisson_entry(1000.0, 11, 1_747_000_000.123456, 60.0, 10.0, 5.0, 200, None, None)
    walked = np.fromiter(schedproof.expected(entry), dtype=np.float64)

    def no_walk(times):
        raise AssertionError("walked")

    monkeypatch.setattr(schedproof, "_walked", no_walk)
    assert len(walked) > 60_000 and schedproof.expected_times(entry).tobytes() == walked.tobytes()


@pytest.mark.parametrize("from_call", [0, 1, 3])
def test_a_chunk_numpy_gets_wrong_is_walked_instead(monkeypatch, from_call):
    """The guard: where a chunk's first arrivals are not a short walk's (here: numpy's first gap
    a millisecond off from the first, the second or the fourth chunk on), the schedule is walked
    from that chunk, still bit for bit."""
    entry = _poisson_entry(40.0, 5, 1_796_638_213.623406, 20.0, 2.0, 1.0, 3, 500, 0.9)
    walked = np.fromiter(schedproof.expected(entry), dtype=np.float64)
    real, calls = schedproof._gaps, [0]

    def off(mt, rate, n):
        g = real(mt, rate, n)
        calls[0] += 1
        if calls[0] > from_call:
            g[0] += 1e-3
        return g

    assert schedproof._exponential_vectorises()  # cached before the fault: only the chunks' draws are off
    monkeypatch.setattr(schedproof, "_gaps", off)
    monkeypatch.setattr(schedproof, "CHUNK", 64)
    assert schedproof.expected_times(entry).tobytes() == walked.tobytes()
    assert calls[0] > from_call


def test_another_pythons_expovariate_is_walked(monkeypatch):
    """The guard: an interpreter whose `expovariate` is another formula (here: -log(random()),
    which the runner would then send on) is not vectorised: the rebuild is its walk."""
    import math
    import random

    def other(self, lambd):
        return -math.log(self.random() or 1.0) / lambd

    entry = _poisson_entry(7.3, 3, 1_747_000_000.123456, 7.0, 1.0, 1.0, None, None, None)
    schedproof._exponential_vectorises.cache_clear()
    monkeypatch.setattr(random.Random, "expovariate", other)
    try:
        walked = np.fromiter(schedproof.expected(entry), dtype=np.float64)
        assert schedproof.expected_times(entry).tobytes() == walked.tobytes()
        assert not schedproof._exponential_vectorises()
    finally:
        schedproof._exponential_vectorises.cache_clear()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), k=st.integers(0, 400), fault=st.sampled_from(["drop", "add", "shift", "truncate", "extra"]),
       chunk=st.sampled_from([1, 7, 64]))
def test_a_proof_read_chunk_by_chunk_says_what_the_whole_array_says(seed, k, fault, chunk):
    """Property: `prove` reads the arrivals chunk by chunk (never the whole day at once) and
    names the same first mismatch -- arrival, due time, records and arrivals counted -- as read
    in one chunk, wherever the chunk edges fall."""
    entry = _poisson_entry(40.0, seed, 1_747_000_000.123456, 10.0, 1.0, 0.5, None, None, None)
    times = np.rint(np.fromiter(schedproof.expected(entry), dtype=np.float64) * 1e6) / 1e6
    k = min(k, len(times) - 2)
    got = {"drop": lambda: np.delete(times, k), "add": lambda: np.insert(times, k, (times[k] + times[k + 1]) / 2),
           "shift": lambda: np.where(np.arange(len(times)) == k, times + 0.003, times), "truncate": lambda: times[:k],
           "extra": lambda: np.append(times, times[-1] + 0.5)}[fault]()
    whole = schedproof.prove(entry, got)
    old, schedproof.CHUNK = schedproof.CHUNK, chunk
    try:
        chunked = schedproof.prove(entry, got)
    finally:
        schedproof.CHUNK = old
    assert whole.status == "broken" and chunked == whole


def test_a_schedule_whose_window_ends_before_it_starts_holds_no_arrival_and_does_not_crash():
    """Hand-edited evidence (the schema refuses it) with a negative planned duration: the walk
    holds no arrival; the numpy rebuild raised `math domain error` from its chunk sizing."""
    entry = _poisson_entry(40.0, 5, 1_747_000_000.123456, -1.0, 1.0, 0.0, None, None, None)
    assert list(schedproof.expected(entry)) == []
    proof = schedproof.prove(entry, np.empty(0))
    assert proof.status == "proven" and proof.arrivals == 0, proof
