"""client_healthy at soak scale: its per-bucket figures come from the table's columns
(judge/validity.py `client_bucket`, vectorized), and a run that measured its client but has
no samples is never a pass.

The reference below is the record-by-record definition (every request read through its view),
written here once; the columnar judge must give the same row, figure for figure, for any
records -- including values a column cannot hold (kept as the row had them).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soakspec.evidence import layout
from soakspec.evidence.manifest import write_manifest
from soakspec.evidence.verify import finalize_artifacts
from soakspec.judge.evidence import load_evidence
from soakspec.judge.index import num
from soakspec.judge.joined import join
from soakspec.judge.judge import judge_run
from soakspec.judge.measures import in_flight
from soakspec.judge.stats import percentile
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.judge.clientsamples import SAMPLE_SPAN_S, build_client, samples_of
from soakspec.judge.validity import client_bucket

# ------------------------------------------------ the client's samples, row by row (the definition)


def _t(s) -> float:
    t = s.get("t")
    return t if type(t) in (int, float) else float("-inf")


def pooled_lag_p99(samples) -> float | None:
    """The time-weighted p99 of event-loop lag pooled over client.jsonl rows, row by row."""
    rows = [s for s in samples if type(s.get("weight_s")) in (int, float) and type(s.get("lag_p99")) in (int, float)]
    total = sum(s["weight_s"] for s in rows)
    if not rows or total <= 0:
        return None
    stalls = sorted(((s.get("tick_s") or 0.0, x) for s in rows for x in (s.get("stalls") or ()) if type(x) in (int, float)),
                    key=lambda p: -p[1])  # fmt: skip
    acc = 0.0
    for tick, lag in stalls:
        acc += tick + lag
        if acc > 0.01 * total:
            return float(lag)
    return max(min(s["lag_p99"], s.get("stall_s") or s["lag_p99"]) for s in rows)


def samples_in(rows, start: float, end: float) -> list:
    """The rows (sorted by `t`) whose window's midpoint lies in [start, end)."""
    out = []
    for s in itertools.islice(rows, bisect.bisect_left(rows, start, key=_t), None):
        t, st = s["t"], s.get("start")
        if t > end + SAMPLE_SPAN_S:
            break
        if type(st) in (int, float) and start <= (st + t) / 2 < end:
            out.append(s)
    return out


def mean_cpu_by_process(samples: list) -> dict[int, float]:
    acc: dict[int, list[float]] = {}
    for s in samples:
        cpu, start, t = s.get("cpu"), s.get("start"), s.get("t")
        if type(cpu) in (int, float) and type(start) in (int, float) and type(t) in (int, float) and t > start:
            acc.setdefault(int(s.get("process") or 0), []).append((cpu, t - start))
    return {p: sum(c * w for c, w in xs) / sum(w for _, w in xs) for p, xs in acc.items()}


def covered(samples, start: float, end: float) -> bool:
    return any(type(s.get("start")) in (int, float) and s["start"] < end and s["t"] > start
               for s in itertools.islice(samples, bisect.bisect_right(samples, start, key=_t), None))


def reference_bucket(client_rows, lv, w, prev=None, all_records=()):
    """client_bucket's row, one request at a time (the definition the columns must meet), from
    the backend's client.jsonl rows as they were written; a closed loop's achieved concurrency
    over `all_records`, the backend's every request the judge holds, row by row (one longer
    than a bucket runs on through the buckets after the one it started in)."""
    if w.start is None or w.end is None or w.end <= w.start:
        return None
    inside = samples_in(sorted(client_rows, key=lambda r: r["t"]), w.start, w.end)
    pooled = pooled_lag_p99(inside)
    lag99 = [pooled] if pooled is not None else [s["lag_p99"] for s in inside if type(s.get("lag_p99")) in (int, float)]
    lagmax = [s["lag_max"] for s in inside if type(s.get("lag_max")) in (int, float)]
    hosts = [s["host_cpu"] for s in inside if type(s.get("host_cpu")) in (int, float)]
    cpus = mean_cpu_by_process(inside)
    recs = list(w.records)
    capped = type(lv.entry.get("max_concurrency")) is int
    # the load generator's lateness: from the slot's time where a request waited behind the level's
    # declared max_concurrency (a level without one: `admitted` does not count)
    lags = [s - (a if capped and (a := num(r.get("admitted"))) is not None else i) for r in recs
            if (s := num(r.get("start"))) is not None and (i := num(r.get("intended_start"))) is not None]
    waits = [a - i if (a := num(r.get("admitted"))) is not None and (i := num(r.get("intended_start"))) is not None else None
             for r in recs]
    mode, conc, rate = lv.entry.get("mode"), lv.entry.get("concurrency"), lv.entry.get("rate")
    wall = w.end - w.start
    offered = achieved = held = None
    if mode == "closed" and isinstance(conc, int) and conc > 0:
        near = list(prev.records if prev is not None else ()) + recs
        offered, achieved = float(conc), in_flight(all_records, w.start, w.end)
        held_s = [h for s in inside if type(h := s.get("held_s")) in (int, float) and 0 <= h < math.inf]
        failed = any(r.get("outcome") != "completed" and num(r.get("start")) is not None for r in near)
        held = (min(offered, math.fsum(held_s) / wall) if failed else 0.0) if held_s else None
    elif mode == "open" and type(rate) in (int, float) and rate > 0:
        # a recorded schedule: the arrivals it put in the bucket (one record each) per second
        offered = len(recs) / wall if isinstance(lv.entry.get("schedule"), dict) and wall else float(rate)
        achieved = sum(1 for r in recs if (s := num(r.get("start"))) is not None and w.start <= s < w.end) / wall
    delays = [d for r in recs if (d := num(r.get("client_delay"))) is not None]
    gaps = coal = 0
    for r in recs:
        if r.get("outcome") != "completed":
            continue
        itl = r.get("itl")
        gaps += len(itl) if itl is not None else 0
        c = r.get("coalesced")
        coal += c if type(c) is int else 0
    return {
        "bucket": w.index, "start": w.start, "end": w.end, "samples": len(inside), "mode": mode,
        "lag_p99": max(lag99) if lag99 else None, "lag_max": max(lagmax) if lagmax else None,
        "cpu": max(cpus.values()) if cpus else None, "processes": len(cpus),
        "host_cpu": sum(hosts) / len(hosts) if hosts else None,
        "schedule_lag_p99": percentile(lags, 99.0) if mode == "open" and lags else None,
        "offered": offered, "achieved": achieved, "held": held, "thinking": None,
        "coalesced": coal / gaps if gaps else None, "coalesced_gaps": coal, "gaps": gaps,
        "client_delay_p99": percentile(delays, 99.0) if delays else None,
        "cap_requests": len(recs) if capped else None,
        "cap_waited": sum(v is not None for v in waits) if capped else None,
        "cap_wait_p99": percentile([0.0 if v is None else v for v in waits], 99.0) if capped and recs else None,
    }  # fmt: skip


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(
        (x is None and y is None) or (x == y and type(x) is type(y)) or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
        for x, y in ((a[k], b[k]) for k in a))


ODD = st.one_of(st.none(), st.booleans(), st.just("x"), st.integers(-(2**40), 2**40))
TIME = st.one_of(st.floats(-5.0, 70.0, allow_nan=False), ODD)


@st.composite
def _edit(draw):
    """What one request's fields become (None: left as the builder made it)."""
    return {
        "start": draw(st.one_of(st.none(), TIME)), "intended_start": draw(st.one_of(st.none(), TIME)),
        "admitted": draw(st.one_of(st.none(), TIME)),
        "end": draw(st.one_of(st.none(), TIME)), "client_delay": draw(st.one_of(st.none(), st.floats(0, 0.1), ODD)),
        "coalesced": draw(st.one_of(st.none(), st.integers(0, 5), st.integers(2**31, 2**62), st.just(True))),
        "itl": draw(st.one_of(st.none(), st.lists(st.floats(0.0, 0.05), max_size=6), st.just("abc"))),
        "outcome": draw(st.one_of(st.none(), st.sampled_from(["completed", "failed"]))),
        "absent": draw(st.lists(st.sampled_from(["start", "intended_start", "admitted", "end", "client_delay", "coalesced", "itl"]),
                                max_size=2)),
    }


HELD = st.one_of(st.none(), st.floats(0.0, 4.0), st.integers(0, 3), st.just(math.inf), st.just(-1.0), st.just(True))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["open", "capped", "closed"]), edits=st.lists(_edit(), min_size=1, max_size=24),
       lag=st.floats(0.001, 0.2), held=st.lists(HELD, min_size=1, max_size=5))
def test_columnar_client_rows_equal_the_record_by_record_definition(mode, edits, lag, held):
    """For any records (numbers a column holds, and values it keeps aside: booleans, strings,
    integers beyond 32 bits, a string for ITL) and any held time in the samples, the
    vectorized row equals the reference (an open loop under max_concurrency: `capped`, whose
    records may say when their slot was freed, `admitted`)."""
    levels = {"open": "[2rps]", "capped": "[2rps]\n    max_concurrency = 2", "closed": "[2]"}[mode]
    spec = small_spec(mode="closed" if mode == "closed" else "open", levels=levels, duration="2m", bucket="1m")
    b = EvidenceBuilder(spec, per_bucket=6).with_client(lag=lag)
    name = spec.backends[0].name
    for i, row in enumerate(b.client[name]):
        if (h := held[i % len(held)]) is not None:
            row["held_s"] = h
    measured = [r for r in b.records[name] if r["bucket"] >= 0]
    bases = [r["start"] for r in measured]
    for k, e in enumerate(edits):
        r, base = measured[k % len(measured)], bases[k % len(measured)]
        for k in ("start", "intended_start", "admitted", "end"):
            v = e[k]
            if v is not None:
                r[k] = base + v if type(v) is float else v
        for k in ("client_delay", "coalesced", "itl", "outcome"):
            if e[k] is not None:
                r[k] = e[k]
        for k in e["absent"]:
            r[k] = None
    run = join(spec, b.build())
    compared = 0
    for bi in run.judged:
        for lv in bi.levels:
            prev = None
            for w in lv.buckets:
                got, want = client_bucket(bi, lv, w, prev), reference_bucket(b.client[bi.name], lv, w, prev, list(bi.all_records))
                assert _same(got, want), (got, want)
                compared += 1
                prev = w
    assert compared


# client.jsonl rows as a run might leave them, and as a hand or a bug might: numbers, integers,
# booleans, strings and nulls in every field the judge reads; fields absent
NUMBER = st.one_of(st.floats(0.0, 0.2), st.integers(0, 3))
FIELD = st.one_of(NUMBER, st.none(), st.booleans(), st.just("x"))


@st.composite
def _client_row(draw):
    start = draw(st.floats(0.0, 100.0))
    row = {"backend": draw(st.sampled_from(["a", "b"])), "t": start + draw(st.sampled_from([0.0, 0.5, 1.0, 1.0, 30.0])),
           "start": draw(st.one_of(st.just(start), FIELD)), "process": draw(st.one_of(st.integers(0, 2), st.none())),
           "stalls": draw(st.one_of(st.just([]), st.lists(st.one_of(st.floats(0.0, 0.5), st.integers(0, 1), st.just("x")), max_size=4),
                                    st.none()))}
    for f in ("weight_s", "lag_p99", "lag_max", "cpu", "host_cpu", "held_s"):
        row[f] = draw(FIELD)
    for f in ("tick_s", "stall_s"):  # the runner's own constants; zero, absent or null read as none
        row[f] = draw(st.one_of(st.floats(0.001, 0.05), st.just(0), st.none()))
    for f in draw(st.lists(st.sampled_from(sorted(row.keys() - {"backend", "t"})), max_size=3, unique=True)):
        del row[f]
    return row


def _close(a, b) -> bool:
    """Equal values; the columns hold an integer as a float (1 == 1.0)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b and (a is None) == (b is None)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_client_row(), max_size=30), start=st.floats(-10.0, 120.0), length=st.sampled_from([0.5, 1.0, 10.0, 60.0, 200.0]))
def test_the_samples_as_columns_give_what_the_rows_give(rows, start, length):
    """For any client.jsonl rows, in any order, each backend's columns give the bucket's samples,
    the pooled lag p99, the other lags, the CPU per process and the coverage that the rows,
    read one by one, give."""
    end = start + length
    by = build_client(rows)
    assert set(by) == {r["backend"] for r in rows}
    for name, cs in by.items():
        mine = sorted((r for r in rows if r["backend"] == name), key=lambda r: r["t"])
        assert len(cs) == len(mine) and samples_of(mine).cols["t"].tolist() == cs.cols["t"].tolist()
        inside = samples_in(mine, start, end)
        idx = cs.within(start, end)
        assert [mine[i] for i in idx] == inside  # ties in `t` keep file order, as a stable sort
        assert _close(cs.pooled_lag_p99(idx), pooled_lag_p99(inside))
        for f in ("lag_p99", "lag_max", "host_cpu", "held_s"):
            assert _close(cs.values(f, idx), [s[f] for s in inside if type(s.get(f)) in (int, float)])
        assert _close(cs.mean_cpu_by_process(idx), mean_cpu_by_process(inside))
        assert cs.covered(start, end) == covered(mine, start, end)


def test_a_number_beyond_any_float_is_no_number_not_a_crash():
    """JSON integers have no bound: a time beyond a float drops its sample, a value or stall
    beyond one is none (the judge never stops on an OverflowError)."""
    big = 10**400
    rows = [{"backend": "a", "t": big, "start": 0.0, "weight_s": 1.0, "lag_p99": 0.002},
            {"backend": "a", "t": 2.0, "start": 1.0, "weight_s": 1.0, "lag_p99": big, "lag_max": big, "cpu": big,
             "stalls": [big, 0.5]}]
    cs = build_client(rows)["a"]
    assert len(cs) == 1
    idx = cs.within(0.0, 10.0)
    assert idx == [0] and cs.values("lag_max", idx) == [] and cs.mean_cpu_by_process(idx) == {}
    assert cs.pooled_lag_p99(idx) is None  # no usable lag p99: not a number


def test_a_days_samples_take_columns_not_rows():
    """A day of one sample a second is ~100 bytes a sample as columns (the rows were ~2.3 KB)."""
    row = {"schema_version": 1, "backend": "a", "process": 0, "wakeups": 150, "lag_p50": 0.001, "lag_p99": 0.002,
           "lag_max": 0.003, "cpu": 0.2, "host_cpu": 0.3, "tick_s": 0.005, "stall_s": 0.01, "weight_s": 1.0, "stalls": [0.02]}
    cs = build_client(dict(row, start=float(i), t=i + 1.0) for i in range(86_400))["a"]
    held = sum(a.nbytes for a in cs.cols.values()) + cs.process.nbytes + cs.stall_off.nbytes + cs.stalls.nbytes
    assert len(cs) == 86_400 and held <= 110 * 86_400
    assert cs.pooled_lag_p99(cs.within(100.0, 160.0)) == 0.02  # a stall each second of 1 s: 2.5 % of the time


# ------------------------------------------------------------------ missing data is never a pass


def _health(run_dir, spec):
    v = judge_run(join(spec, load_evidence(run_dir)))
    (h,) = [r for r in v.rules if r.rule == "client_healthy"]
    return h


def _open_spec():
    return small_spec(mode="open", levels="[2rps]")  # (closed loop also checks achieved concurrency: the builder's is sparse)


def test_a_run_that_measured_its_client_but_has_no_samples_is_inconclusive_naming_the_file(tmp_path):
    """client.jsonl listed in the manifest but empty, or listed and deleted: INCONCLUSIVE, and
    the message names client.jsonl. With its samples the same run passes."""
    spec = _open_spec()
    good = EvidenceBuilder(spec).with_client().write(tmp_path / "good")
    assert _health(good, spec).status == "pass"

    empty = tmp_path / "empty"
    shutil.copytree(good, empty)
    (empty / layout.CLIENT).write_text("")
    m = json.loads((empty / "manifest.json").read_text())
    m["artifacts"] = finalize_artifacts(empty)
    write_manifest(empty, m)
    h = _health(empty, spec)
    assert h.status == "inconclusive" and "client.jsonl has no client-health samples" in h.message, h.message

    gone = tmp_path / "gone"
    shutil.copytree(good, gone)
    (gone / layout.CLIENT).unlink()  # the manifest still lists it
    h = _health(gone, spec)
    assert h.status == "inconclusive" and "client.jsonl is missing (the manifest lists it)" in h.message, h.message


def test_a_backend_without_samples_beside_one_with_them_is_inconclusive():
    """Two backends, samples for one: the run measured its client, so the other's buckets are
    unknown (INCONCLUSIVE naming the bucket), never healthy."""
    spec = small_spec(mode="open", levels="[2rps]", backends=("a", "b"))
    b = EvidenceBuilder(spec).with_client()
    b.client.pop("b")
    h = next(r for r in judge_run(join(spec, b.build())).rules if r.rule == "client_healthy")
    assert h.status == "inconclusive" and "backend b" in h.message and "no client-health sample in bucket 0" in h.message, h.message


def test_evidence_from_before_client_health_is_not_judged_and_says_so(tmp_path):
    """No client.jsonl, none listed, no sample: a run recorded before soakspec measured its
    load generator. client_healthy is not judged (like `client_healthy = false`) and says why;
    the verdict stands on the other rules."""
    spec = _open_spec()
    old = EvidenceBuilder(spec).write(tmp_path / "old")  # no client rows: no client.jsonl
    assert not (old / layout.CLIENT).exists()
    h = _health(old, spec)
    assert h.status == "pass" and h.message.startswith("not judged: the evidence has no client.jsonl"), h.message


def test_a_bucket_shorter_than_a_sample_is_judged_by_the_sample_around_it():
    """Buckets of half a second, samples of a second: a bucket holding no sample's midpoint is
    covered by the sample around it (healthy); drop the sample around buckets 2 and 3 and they
    are INCONCLUSIVE, named."""
    spec = small_spec(mode="open", levels="[4rps]", duration="6s", bucket="500ms")
    b = EvidenceBuilder(spec, per_bucket=2).with_client()
    run = join(spec, b.build())
    h = next(r for r in judge_run(run).rules if r.rule == "client_healthy")
    assert h.status == "pass" and "kept up" in h.message, h.message
    name = spec.backends[0].name
    lv = b.manifest["backends"][0]["levels"][0]
    third = lv["buckets"][3]
    b.client[name] = [r for r in b.client[name] if not (r["start"] < third["end"] and r["t"] > third["start"])]
    h = next(r for r in judge_run(join(spec, b.build())).rules if r.rule == "client_healthy")
    assert h.status == "inconclusive" and "no client-health sample in bucket 2" in h.message and "(and 1 more)" in h.message, h.message
    assert [i.where.bucket for i in h.details] == [2, 3]

