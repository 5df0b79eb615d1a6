"""The columnar judge (records as typed columns, `soakspec.judge.table`) gives the figures and
the verdict a naive reference gives: every record a dict in memory, every figure a plain loop
over them (written here, from the documented definitions: a request's outcome derived from its
raw fields, ttft = the field else first_token - intended start, ITL = the gaps of completed
requests whose ITL is not estimated and whose usage agrees with the stream, qps = the backend's
completed requests (any bucket but the follow-up's, warm-up included) that had started and whose
end lies in [bucket start, bucket end), per second of the bucket's wall time -- what the server
delivered, not what started --, throughput = the output tokens of those same requests / wall,
in-flight = the time integral of the backend's requests in flight / wall, percentiles by
`stats.percentile` over a sorted list).

Generated evidence has failures of every kind, contradicted usage, estimated ITL, ITL that is
not whole microseconds (the table's float64 mode), values of the wrong type (rows read
through their views), missing intended starts and shuffled file order; requests that finish
late (in a later bucket, or after their level's last bucket), warm-up requests that end in
bucket 0 and a follow-up request moved into a bucket (which qps and throughput leave out)."""

from __future__ import annotations

import math
import struct
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from soakspec.judge import stats
from soakspec.judge.evidence import request_problem
from soakspec.judge.joined import join
from soakspec.judge.judge import judge_run
from soakspec.judge.rederive import _relabel
from soakspec.judge.summary import summarize_run
from soakspec.judge.table import build_table
from soakspec.judge.testing import EvidenceBuilder, small_spec

RULES = "require failed == 0\nrequire p95(ttft) < {t}\nrequire p99(itl) < {u}\nrequire p50(latency) < {lat}"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _start(r):
    t = _num(r.get("intended_start"))
    return t if t is not None else _num(r.get("start"))


def _ttft(r):
    v = _num(r.get("ttft"))
    if v is None and _num(r.get("first_token")) is not None and _start(r) is not None:
        v = _num(r.get("first_token")) - _start(r)
    return v


def _latency(r):
    v = _num(r.get("latency"))
    if v is None and _num(r.get("end")) is not None and _start(r) is not None:
        v = _num(r.get("end")) - _start(r)
    return v


def _tpot(r):
    return None if r.get("usage_mismatch") or r.get("itl_source") == "estimated" else _num(r.get("tpot"))


def _gaps(r):
    if r.get("itl_source") == "estimated" or r.get("usage_mismatch"):
        return []
    g = r.get("itl")
    return [v for x in g if (v := _num(x)) is not None] if isinstance(g, list) else []


def _stall(r):
    first, end, tpot, n = _num(r.get("first_token")), _num(r.get("end")), _num(r.get("tpot")), _num(r.get("output_tokens"))
    last = first + (tpot + 1e-6) * (n - 1) if tpot is not None and n is not None and n >= 2 else first
    return max(0.0, end - last)


def _dist(vals):
    if not vals:
        return None
    return {"count": len(vals), "p50": stats.percentile(vals, 50), "p90": stats.percentile(vals, 90), "p95": stats.percentile(vals, 95),
            "p99": stats.percentile(vals, 99), "mean": math.fsum(vals) / len(vals), "min": min(vals), "max": max(vals)}


def naive_buckets(spec, be) -> list[dict[str, Any]]:
    """Per bucket of the manifest, the reference figures."""
    rows = [dict(r) for r in be.records if request_problem(r) is None]
    levels = be.entry["levels"]
    deadline = {(lv["workload"], lv["index"]): lv.get("deadline_s") for lv in levels}
    wl = {w.name: w for w in spec.workloads}
    relabeled = []
    for r in rows:
        w = wl.get(str(r.get("workload")))
        bounds = (max(w.max_tokens), w.stream) if w else (None, True)
        relabeled.append(_relabel(r, deadline.get((r.get("workload"), r.get("level"))), min(w.max_tokens) if w else None,
                                  None, bounds)[0])
    out = []
    for lv in levels:
        for bk in lv["buckets"]:
            recs = [r for r in relabeled if r.get("workload") == lv["workload"] and r.get("level") == lv["index"]
                    and r["bucket"] == bk["index"]]
            done = [r for r in recs if r.get("outcome") == "completed"]
            wall = bk["end"] - bk["start"]
            c = Counter(r.get("outcome") for r in recs)
            parts = []
            for r in relabeled:
                s, e = _num(r.get("start")), _num(r.get("end"))
                if s is None:
                    continue
                e = s if e is None else e
                lo, hi = max(s, bk["start"]), min(e, bk["end"])
                if hi > lo:
                    parts.append(hi - lo)
            # what the server delivered in the bucket: completions that ended in it, wherever they started
            served = []
            for r in relabeled:
                s, e = _num(r.get("start")), _num(r.get("end"))
                if (r.get("outcome") == "completed" and r.get("bucket") != -2 and s is not None and e is not None
                        and bk["start"] <= e < bk["end"] and s < bk["end"]):
                    served.append(r)
            tokens = [float(_num(r.get("chunks" if r.get("usage_mismatch") else "output_tokens")) or 0.0) for r in served]
            out.append({
                "requests": {"total": len(recs), **{k: c[k] for k in ("completed", "failed", "timeout", "rejected", "disconnected")}},
                "ttft": _dist([v for r in done if (v := _ttft(r)) is not None]),
                "latency": _dist([v for r in done if (v := _latency(r)) is not None]),
                "tpot": _dist([v for r in done if (v := _tpot(r)) is not None]),
                "itl": _dist([g for r in done for g in _gaps(r)]),
                "qps": len(served) / wall,
                "output_tokens_per_s": math.fsum(tokens) / wall,
                "in_flight": math.fsum(parts) / wall,
            })
    return out


def naive_status(run, vals: list[float], q: float, threshold: float, bounds: list[tuple[float, float]] = (),
                 units: int | None = None) -> str:
    """pNN(x) < T over the run: the overage rule of `soakspec.judge.stats`. `bounds`: censored
    samples, each only known to lie in (low, high) (a timeout: beyond its time to the deadline,
    high inf; a request with untimed tokens: between its first byte and its end): the rule is
    decided where it is the same with each at its low and at its high bound. `units`: the
    requests the values come from, when a request gives many (ITL gaps): the sample-size rule
    counts them, and the overages are counted as if there were only that many samples."""
    conf = run.gate.confidence
    need = max(stats.min_samples_for_percentile(q, conf), run.gate.min_samples)
    low, high = list(vals) + [lo for lo, _ in bounds], list(vals) + [hi for _, hi in bounds]
    n = len(low)
    if units is not None and units < n:
        gaps = n

        def scaled(k: int, for_pass: bool) -> int:
            return -(-k * units // gaps) if for_pass else k * units // gaps
    else:
        units = n

        def scaled(k: int, for_pass: bool) -> int:
            return k
    p_low, p_high = stats.percentile(low, q), stats.percentile(high, q)
    if bounds and (p_low < threshold) != (p_high < threshold):
        return "inconclusive"
    certain = scaled(sum(1 for v in low if v >= threshold), False)
    n = units
    if p_low >= threshold:
        if n < need:
            return "fail" if stats.exceeds_with_confidence(certain, n, q, conf) else "short"
        return "fail"
    if n < need:
        return "short"
    over = scaled(sum(1 for v in high if v >= threshold), True)
    allowed = stats.max_overages(n, q, conf)
    if allowed is not None and over <= allowed:
        return "pass"
    return "fail" if stats.exceeds_with_confidence(certain, n, q, conf) else "inconclusive"


def _mutate(rng: random.Random, r: dict[str, Any], b: EvidenceBuilder) -> None:
    k = rng.randrange(15)
    if k == 0:
        b.set_outcome(r, "failed", "engine died", status=500)
    elif k == 1:
        b.set_outcome(r, "rejected", "busy", status=429)
    elif k == 2:
        b.set_outcome(r, "disconnected", "connection reset", status=None)
    elif k == 3:
        r["outcome"] = None  # no stored label: the judge derives it
    elif k == 4:
        r["output_tokens"] = r["chunks"] + 2000  # usage contradicts the stream
    elif k == 5:
        r["itl_source"] = "estimated"
    elif k == 6:
        r["itl"] = [rng.random() * 0.01 for _ in r["itl"]]  # not whole microseconds
    elif k == 7:
        r["ttft"] = None  # from first_token - intended start
        r["intended_start"] = None if rng.random() < 0.5 else r["start"] - 0.003  # a late start
    elif k == 8:
        r["ttft"] = rng.choice([0.05, 0.2, 0.5, 2.0])
    elif k == 9:
        r["latency"] = "slow"  # a value of the wrong type: read through the row's view
    elif k == 10:
        r["end"] = r["start"] + 40.0  # past the 30 s deadline: timed out
    elif k == 11:
        r["error"] = "partial"  # status 200 with an error: failed
    elif k == 12:
        r["first_token"] = None
    elif k == 13:
        r["itl"] = [0.001, "x"]  # an ITL list with a non-number
    else:  # a slow completion within the deadline: it ends in a later bucket, or after the level's last
        r["end"] = r["start"] + rng.uniform(0.5, 29.0)
        r["latency"] = r["end"] - r["start"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), per_bucket=st.integers(3, 40), share=st.floats(0.0, 0.6),
       t=st.sampled_from([0.15, 0.3, 1.0]), u=st.sampled_from([0.01, 0.02, 0.05]), chunk=st.sampled_from([3, 17, 1 << 16]))
def test_columnar_judge_equals_naive_reference(seed, per_bucket, share, t, u, chunk):
    """The columnar judge gives the naive reference's figures and verdict (see the module doc),
    at any chunk size its scans take (selections, cell counts, sums over a scope)."""
    import unittest.mock

    from soakspec.judge import table

    with unittest.mock.patch.object(table, "SCAN_CHUNK", chunk):
        _judge_equals_naive(seed, per_bucket, share, t, u)


def _judge_equals_naive(seed, per_bucket, share, t, u):
    rng = random.Random(seed)
    spec = small_spec(RULES.format(t=f"{int(t * 1000)}ms", u=f"{int(u * 1000)}ms", lat="2s"), levels="[2, 4]")
    b = EvidenceBuilder(spec, per_bucket=per_bucket, latency=rng.choice([0.5, 1.0]))
    for name, recs in b.records.items():
        for r in recs:
            if r["bucket"] >= 0 and rng.random() < share:
                _mutate(rng, r, b)
        for lv in b.entry(name)["levels"]:  # warm-up requests, some still running when bucket 0 opens
            for _ in range(rng.randrange(3)):
                recs.append(b.request(name, lv["workload"], lv["index"], -1, lv["measure_start"] - rng.uniform(0.1, 2.0),
                                      conc=lv.get("concurrency"), rate=None))
        if rng.random() < 0.5:  # the follow-up moved into a bucket: never counted as delivered there
            fu = next(r for r in recs if r["bucket"] == -2)
            bk = rng.choice(b.entry(name)["levels"])["buckets"][0]
            fu["intended_start"] = fu["start"] = bk["start"] + 1.0
            fu["first_byte"], fu["first_token"], fu["end"] = fu["start"] + 0.05, fu["start"] + 0.1, fu["start"] + b.latency
        rng.shuffle(recs)
    ev = b.build()
    run = join(spec, ev)
    # the backend's measured requests: its levels' and orphans' rows in the judge's order
    # (kept from all_records' order, not sorted again), as sorting them gives them
    import numpy as np

    from soakspec.judge.table import ordered

    bk = run.judged[0]
    rows = [idx for lv in bk.levels for _, idx in lv.records.parts] + [idx for _, idx in bk.orphans.parts]
    assert bk.measured.parts[0][1].tolist() == ordered(bk.table, np.concatenate(rows)).tolist()
    results = summarize_run(run)
    got = results["backends"][0]["buckets"]
    want = naive_buckets(spec, ev.backends[0])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key, value in w.items():
            assert g[key] == value, (key, g["bucket"], g[key], value)

    # the verdict of each performance rule, from the same plain loops over the whole run
    verdict = judge_run(run)
    by_rule = {r.rule: r for r in verdict.rules}
    every = [dict(row) for bk in [run.judged[0]] for row in bk.measured]
    done = [r for r in every if r.get("outcome") == "completed"]
    failed = sum(1 for r in every if r.get("outcome") == "failed")
    assert (by_rule["failed == 0"].status == "pass") == (failed == 0)
    # a timed-out request counts in a ttft rule: with the ttft it measured, else censored at its time to the deadline
    timed = [r for r in every if r.get("outcome") == "timeout"]
    ttfts = [v for r in done + timed if (v := _ttft(r)) is not None]
    censored = [(v, math.inf) for r in timed if _ttft(r) is None and (v := _latency(r)) is not None]
    # a completed request without a first token: its ttft lies between its first byte and its end
    censored += [(fb - _start(r) if (fb := _num(r.get("first_byte"))) is not None and _start(r) is not None else 0.0, v)
                 for r in done if _num(r.get("first_token")) is None and _ttft(r) is None and (v := _latency(r)) is not None]
    # a request that timed out after its first token stalled: one more ITL gap, at least the time
    # from the latest its last token can have come (first token + (tpot + 1 µs) x (tokens - 1)) to its end
    stalls = [(_stall(r), math.inf) for r in timed if _num(r.get("first_token")) is not None and _num(r.get("end")) is not None]
    # itl's claim rests on requests: those giving gaps, and each stalled one
    itl_units = sum(1 for r in done if _gaps(r)) + len(stalls)
    for text, q, vals, bounds, thr, units in (("p95(ttft) < ", 95.0, ttfts, censored, t, None),
                                              ("p99(itl) < ", 99.0, [x for r in done for x in _gaps(r)], stalls, u, itl_units)):
        rule = next(r for name, r in by_rule.items() if name.startswith(text))
        want_status = naive_status(run, vals, q, thr, bounds, units)
        if want_status == "short":
            assert rule.status != "pass"
        else:
            assert rule.status == want_status, (text, rule.status, want_status)


def test_table_views_read_as_the_rows_did():
    """A record read back through the table answers every field as the row did (the one
    dropped field aside), including values that do not fit their column."""
    spec = small_spec()
    b = EvidenceBuilder(spec)
    rows = [r for recs in b.records.values() for r in recs]
    rows[0]["latency"] = "slow"
    rows[1]["itl"] = [0.001, "x"]
    rows[2]["itl"] = [0.0012345678]
    rows[3]["custom"] = {"a": 1}
    rows[4]["output_chars"] = 2**40  # beyond an int32 column
    rows[5]["status"] = 200.0  # a float where an int belongs
    t = build_table(rows)
    for i, r in enumerate(rows):
        v = t.rec(i)
        for k, val in r.items():
            if k == "output_sha256":
                continue
            got = v.get(k)
            if isinstance(val, list):
                assert list(got) == val, (k, got, val)
            elif isinstance(val, float) and k == "status":
                assert got == val and type(got) is float
            else:
                assert got == val and type(got) in (type(val), float) or (val is None and got is None), (k, got, val)


def test_unusable_rows_are_counted_with_bounded_examples(tmp_path):
    """A requests.jsonl full of unusable rows keeps the first MAX_PROBLEMS as examples and
    counts the rest: the verdict names the total."""
    from soakspec.judge.evidence import MAX_PROBLEMS, load_evidence

    import gzip
    import json

    from soakspec.evidence.io import read_json
    from soakspec.evidence.manifest import write_manifest
    from soakspec.evidence.verify import finalize_artifacts

    spec = small_spec()
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    with gzip.open(root / "backends" / "a" / "requests.jsonl.gz", "at") as f:  # one more gzip member
        f.writelines(json.dumps({"bucket": 0, "outcome": "completed"}) + "\n" for _ in range(MAX_PROBLEMS + 50))
    m = read_json(root / "manifest.json")
    m["artifacts"] = finalize_artifacts(root)
    write_manifest(root, m)
    ev = load_evidence(root)
    be = ev.backends[0]
    assert len(be.problems) == MAX_PROBLEMS and be.problem_count == MAX_PROBLEMS + 50
    from soakspec.judge.validity import completed_run_problems

    text = "\n".join(i.message for i in completed_run_problems(join(spec, ev)))
    assert f"... and {MAX_PROBLEMS + 50 - 5} more unusable rows" in text
    assert judge_run(join(spec, ev)).outcome != "PASS"


@settings(max_examples=200, deadline=None)
@given(xs=st.lists(st.sampled_from([0.0, 1e-6, 0.000999, 0.001, 0.001001, 0.0125, 0.5, 3.0, -0.002]), min_size=1, max_size=300),
       q=st.sampled_from([0.0, 1.0, 50.0, 95.0, 99.0, 99.9, 100.0]), t=st.sampled_from([0.001, 0.0125, 1.0]))
def test_counted_gaps_equal_the_gaps_written_out(xs, q, t):
    """Gaps held as distinct values and counts (`stats.Counted`, what the judge keeps of a long
    soak's ITL) give exactly the percentile, mean, min, max and threshold counts of the list."""
    import numpy as np

    u, c = np.unique(np.asarray(xs), return_counts=True)
    counted = stats.Counted(u, c)
    assert counted.percentile(q) == stats.percentile(xs, q)
    assert counted.mean() == stats.mean(xs)
    assert (counted.min(), counted.max()) == (min(xs), max(xs))
    assert counted.count(">", t) == sum(1 for x in xs if x > t)
    assert counted.count("<=", t) == sum(1 for x in xs if x <= t)


def test_records_read_from_disk_fill_the_columns_with_no_extras(tmp_path):
    """What a run writes decodes as the evidence layer's record type (its outcome and sources are
    StrEnums): every value lands in its typed column -- none is set aside per request in
    `extras`, which every computation would then read through the slow per-request view."""
    from soakspec.judge.evidence import load_evidence

    root = EvidenceBuilder(small_spec()).write(tmp_path / "run")
    ev = load_evidence(root)
    for be in ev.backends:
        t = be.requests
        assert len(t) > 0 and dict(t.extras) == {}
        assert {t.rec(i)["outcome"] for i in range(len(t))} <= {"completed", "failed", "timeout", "rejected", "disconnected"}


_row_values = st.fixed_dictionaries({
    "outcome": st.sampled_from(["completed", "completed", "failed"]),
    "usage_mismatch": st.sampled_from([None, False, True]),
    "tpot": st.none() | st.floats(0, 0.1),
    "output_tokens": st.none() | st.integers(0, 4) | st.just(True),
    "itl_source": st.sampled_from(["usage", "estimated", "exact"]),
    "itl": st.none() | st.lists(st.sampled_from([0.001, 0.002, 0.0]), max_size=4),
    "coalesced": st.none() | st.integers(-1, 6),
    "first_token": st.none() | st.just(1.7e9 + 0.25),  # none: a completed request's token times unknown
    "start": st.none() | st.just(1.7e9),  # none: no send time (sent_ttft, sent_latency leave it out)
    "end": st.none() | st.just(1.7e9 + 0.5),
})


@settings(max_examples=300, deadline=None)
@given(st.lists(_row_values, max_size=25), st.sampled_from([1, 2, 3, 7, 1 << 16]))
def test_gap_shares_and_exclusions_over_columns_equal_the_row_loop(values, chunk):
    """results.json's coalesced-gap counts and its TTFT/TPOT/ITL (and sent_*) exclusions, computed over the
    table's columns a chunk of rows at a time (any chunk size), are the row-by-row answers
    (reasons in the same order)."""
    import unittest.mock

    from soakspec.judge import table

    with unittest.mock.patch.object(table, "SCAN_CHUNK", chunk):
        _check_shares_and_exclusions(values)


def _check_shares_and_exclusions(values):
    import numpy as np

    from soakspec.judge.measures import gap_share
    from soakspec.judge.summary import excluded
    from soakspec.judge.table import Rows

    rows = [{"request_id": f"r{k}", "bucket": 0, **v} for k, v in enumerate(values)]
    t = build_table(rows)
    sel = Rows.of(t, np.arange(len(rows), dtype=np.int64))
    views = [t.rec(i) for i in range(len(rows))]
    assert gap_share(sel) == gap_share(views)
    for sent in (False, True):
        got, want = excluded(sel, sent=sent), excluded(views, sent=sent)
        assert got == want and [list(d) for d in got.values()] == [list(d) for d in want.values()]


_stamp = st.one_of(st.none(), st.floats(1.7e9, 1.7e9 + 100, allow_nan=False).map(lambda x: round(x, 6)))
_held = st.one_of(st.none(), st.floats(0, 5, allow_nan=False))


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({"intended_start": _stamp, "start": _stamp, "first_token": _stamp, "end": _stamp,
                                            "ttft": _held, "latency": _held}), min_size=1, max_size=40),
       chunk=st.integers(1, 9), picks=st.lists(st.integers(0, 10**6), max_size=60), lo=st.integers(0, 40),
       width=st.integers(0, 40), data=st.data())
def test_derived_durations_a_chunk_at_a_time_equal_the_rows(rows, chunk, picks, lo, width, data):
    """ttft and latency over any rows of a table (an index array in any order, or a slice),
    computed SCAN_CHUNK rows at a time, equal each row's own definition: the record's value,
    else first_token (end) - intended start (else start); and sent_ttft, sent_latency (from the
    send: first_token, end - start) equal theirs."""
    import unittest.mock

    from soakspec.judge import table as T

    with unittest.mock.patch.object(T, "SCAN_CHUNK", chunk):
        _check_derived(rows, picks, lo, width, data)


def _check_derived(rows, picks, lo, width, data):
    from soakspec.judge import table as T

    recs = [{"request_id": f"r{i}", "bucket": 0, "outcome": "completed", **{k: v for k, v in r.items() if v is not None}}
            for i, r in enumerate(rows)]
    t = build_table(recs)
    n = len(recs)
    idx = T.np.array([p % n for p in picks], dtype=data.draw(st.sampled_from([T.np.int32, T.np.int64])))
    for sel in (idx, slice(min(lo, n), min(lo + width, n)), slice(None), slice(min(lo, n), None, 2)):
        want = [recs[i] for i in (range(n)[sel] if isinstance(sel, slice) else idx.tolist())]
        from soakspec.judge.measures import sent_latency, sent_ttft

        for got, ref in ((t.ttft(sel), _ttft), (t.latency(sel), _latency), (sent_ttft.col(t, sel), sent_ttft.row),
                         (sent_latency.col(t, sel), sent_latency.row)):
            expect = [ref(r) for r in want]
            assert len(got) == len(expect)
            assert [None if math.isnan(g) else g for g in got.tolist()] == expect


# an open loop's intended start: absent (a closed loop), at the start, or some lag before or
# after it (a hand-edited one), or far from it
_lag = st.one_of(st.none(), st.just(0.0), st.floats(-3, 30, allow_nan=False).map(lambda x: round(x, 6)),
                 st.floats(-1e6, 1e6, allow_nan=False))


def _span_index(t, I, how):
    """The backend's SpanIndex, over the join's order (as `BackendIndex.spans` takes it) or its own."""
    return I.SpanIndex(t, I.ordered(t) if how == "join" else None)


@settings(max_examples=150, deadline=None)
@given(spans=st.lists(st.tuples(_stamp, _stamp, _lag), min_size=1, max_size=60), fence=st.integers(1, 6),
       chunk=st.sampled_from([1, 3, 1 << 16]), how=st.sampled_from(["join", "own"]),
       windows=st.lists(st.tuples(st.floats(1.7e9 - 5, 1.7e9 + 105), st.floats(0.001, 60)), min_size=1, max_size=5))
def test_in_flight_over_the_request_order_equals_the_row_loop(spans, fence, chunk, how, windows):
    """in_flight over any window, from the requests in the judge's order (by intended start,
    which an open loop's schedule lag sets apart from the start; a fence of every FENCE-th,
    any fence), is the row loop's exact integral: requests without a start left out, an
    absent end counted as the start."""
    import unittest.mock

    from soakspec.judge import index as I, table
    from soakspec.judge.measures import in_flight, in_flight_spans

    recs = [{"request_id": f"r{k}", "bucket": 0, "outcome": "completed", **({"start": s} if s is not None else {}),
             **({"intended_start": round(s - lag, 6)} if s is not None and lag is not None else {}),
             **({"end": e} if e is not None else {})} for k, (s, e, lag) in enumerate(spans)]
    t = build_table(recs)
    bi = unittest.mock.Mock(table=t)
    with unittest.mock.patch.object(I.SpanIndex, "FENCE", fence), unittest.mock.patch.object(table, "SCAN_CHUNK", chunk):
        bi.spans = _span_index(t, I, how)
        for lo, width in windows:
            assert in_flight_spans(bi, lo, lo + width) == in_flight(recs, lo, lo + width)


def test_in_flight_and_delivered_when_start_minus_intended_start_is_beyond_a_float():
    """Times near +-1e308 (hand-edited evidence: the table holds any finite time) whose lag
    overflows: every request is looked at, none dropped -- the row loop's figures."""
    from unittest import mock

    from soakspec.judge import index as I
    from soakspec.judge.measures import delivered, delivered_spans, in_flight, in_flight_spans

    recs = [{"request_id": "a", "bucket": 0, "outcome": "completed", "output_tokens": 3, "start": 1e308, "intended_start": -1e308,
             "end": 1.5e308},
            {"request_id": "b", "bucket": 0, "outcome": "completed", "output_tokens": 5, "start": -1e308, "intended_start": 1e308,
             "end": -0.5e308},
            {"request_id": "c", "bucket": 0, "outcome": "completed", "output_tokens": 7, "start": 10.0, "end": 20.0}]
    t = build_table(recs)
    sp = I.SpanIndex(t, I.ordered(t))
    assert (sp.lag_min, sp.lag_max) == (-math.inf, math.inf)
    bi = mock.Mock(table=t, spans=sp)
    for lo, hi in ((1e308, 1.6e308), (-1e308, -0.4e308), (0.0, 30.0), (-1.7e308, 1.7e308)):
        assert in_flight_spans(bi, lo, hi) == in_flight(recs, lo, hi)
        assert delivered_spans(bi, lo, hi) == delivered(recs, lo, hi)
        assert delivered_spans(bi, lo, hi)[0] > 0


@settings(max_examples=150, deadline=None)
@given(spans=st.lists(st.tuples(_stamp, _stamp, st.sampled_from([0, 1, -1, -2]), st.sampled_from(["completed", "failed"]),
                                st.one_of(st.none(), st.integers(0, 64), st.just(2.5)), st.booleans(), _lag),
                      min_size=1, max_size=60),
       fence=st.integers(1, 6), chunk=st.sampled_from([1, 3, 1 << 16]), how=st.sampled_from(["join", "own"]),
       windows=st.lists(st.tuples(st.floats(1.7e9 - 5, 1.7e9 + 105), st.floats(0.001, 60)), min_size=1, max_size=5))
def test_delivered_over_the_request_order_equals_the_row_loop(spans, fence, chunk, how, windows):
    """What the server delivered in a window (qps, throughput), from the requests in the
    judge's order (an open loop's by intended start), a chunk of them at a time, is the row
    loop's: completed requests but the follow-up, with a start, whose end lies in the window,
    and their tokens (chunks where usage contradicts the stream; a count of the wrong type
    read through the row's view)."""
    import unittest.mock

    from soakspec.judge import index as I, table
    import types

    from soakspec.judge.measures import _delivered_total, delivered, delivered_spans

    recs = [{"request_id": f"r{k}", "bucket": b, "outcome": o, "output_tokens": n, "chunks": 3,
             **({"prompt_tokens": 10 + k} if k % 7 else {}),  # some with no prompt count: no total
             **({"usage_mismatch": "contradicted"} if bad else {}),
             **({"intended_start": round(s - lag, 6)} if s is not None and lag is not None else {}),
             **({"start": s} if s is not None else {}), **({"end": e} if e is not None else {})}
            for k, (s, e, b, o, n, bad, lag) in enumerate(spans)]
    t = build_table(recs)
    bi = unittest.mock.Mock(table=t)
    with unittest.mock.patch.object(I.SpanIndex, "FENCE", fence), unittest.mock.patch.object(table, "SCAN_CHUNK", chunk):
        bi.spans = _span_index(t, I, how)
        rows_bi = unittest.mock.Mock(table=None, all_records=recs)
        for lo, width in windows:
            assert delivered_spans(bi, lo, lo + width) == delivered(recs, lo, lo + width)
            w = types.SimpleNamespace(start=lo, end=lo + width)  # total_throughput's tokens: both ways alike
            got, want = _delivered_total(bi, w), _delivered_total(rows_bi, w)
            assert got == want or (math.isnan(got) and math.isnan(want))
        for s, e, *_ in spans:  # a window that starts or ends exactly at a request's end
            if e is not None:
                assert delivered_spans(bi, e, e + 1.0) == delivered(recs, e, e + 1.0)
                assert delivered_spans(bi, e - 1.0, e) == delivered(recs, e - 1.0, e)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 40), chunk=st.sampled_from([1, 3, 1 << 16]), data=st.data())
def test_a_scopes_rows_kept_from_the_order_are_the_rows_the_test_holds_for(n, chunk, data):
    """A level's rows taken from the backend's order (and a scope's completed requests from
    its rows) are those the test holds for, in order, whatever the chunks: the same array
    when every row is kept, a view of it (nothing more held) exactly when they are one
    unbroken stretch of it, a copy otherwise."""
    import unittest.mock

    import numpy as np

    from soakspec.judge import table
    from soakspec.judge.table import kept as _kept

    rows = np.array(data.draw(st.permutations(range(n))), dtype=np.int32)
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    mask = data.draw(st.one_of(st.just([a <= k < b for k in range(n)]), st.lists(st.booleans(), min_size=n, max_size=n)))
    keep = np.zeros(n, dtype=bool)
    keep[rows] = mask  # the test is on the row number: row rows[k] is kept when mask[k]
    with unittest.mock.patch.object(table, "SCAN_CHUNK", chunk):
        got = _kept(rows, lambda part: keep[part])
    assert got.tolist() == rows[np.array(mask, dtype=bool)].tolist()
    pos = np.flatnonzero(mask)
    unbroken = len(pos) > 0 and pos[-1] - pos[0] + 1 == len(pos)
    if len(pos) == n:
        assert got is rows
    else:
        assert (got.base is rows) == unbroken


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 50), cuts=st.lists(st.integers(0, 50), max_size=8), data=st.data())
def test_a_levels_rows_joined_from_its_buckets_equal_their_concatenation(n, cuts, data):
    """A level's rows are its buckets' rows end to end: a view of the array they were cut from
    when they are its consecutive slices, a concatenation otherwise -- the same rows either way."""
    import numpy as np

    from soakspec.judge.index import _joined

    base = np.array(data.draw(st.permutations(range(n))), dtype=np.int32)
    edges = sorted({0, n, *(c % (n + 1) for c in cuts)})
    parts = [base[a:b] for a, b in zip(edges, edges[1:]) if b > a]
    parts = data.draw(st.one_of(st.just(parts), st.permutations(parts), st.just(parts[:1] + parts[2:] if len(parts) > 2 else parts)))
    got = _joined(parts)
    assert got.tolist() == np.concatenate(parts).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a1", "b0", "c2", "zz", "a1 "]), st.sampled_from([None, 1.0, 2.0, 2.5, 1e30, 0.0, -0.0, -3.5]),
                          st.sampled_from([None, None, 0.5, 2.0])), max_size=200), st.sampled_from([1, 2, 3, 5, 64, 1 << 16]))
def test_every_row_in_the_judges_order_is_the_order_of_all_the_row_numbers(rows, chunk):
    """`ordered(table)` (every row, dealt a chunk at a time into ranges of time, each range
    sorted on its own) gives exactly `ordered(table, all row numbers)` and the reference
    order: by request time (intended start, else start; absent last), ties by request id, as
    4-byte row numbers."""
    import numpy as np

    from soakspec.judge import table as table_mod
    from soakspec.judge.table import ordered

    t = build_table([{"request_id": rid, "bucket": 0, **({"start": s} if s is not None else {}),
                      **({"intended_start": i} if i is not None else {})} for rid, s, i in rows])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(table_mod, "SCAN_CHUNK", chunk)
        got = ordered(t)
        assert got.dtype == np.int32 and got.tolist() == ordered(t, np.arange(t.n, dtype=np.int64)).tolist()
    when = [i if i is not None else s if s is not None else math.inf for _, s, i in rows]
    assert [rows[k][0] for k in got.tolist()] == [rows[k][0] for k in sorted(range(len(rows)), key=lambda k: (when[k], rows[k][0]))]


@settings(max_examples=300, deadline=None)
@given(buckets=st.lists(st.integers(-2, 5), max_size=40), grouped=st.booleans(), step=st.sampled_from([1, 2, 3, 7, 1 << 16]))
def test_a_levels_rows_grouped_by_bucket_are_a_stable_sort_by_bucket(buckets, grouped, step):
    """A level's rows (in time order) grouped by bucket: ascending buckets, each group in the
    rows' order -- views of the rows when their buckets never go down (compared a slice at a
    time), a stable sort otherwise; the same groups either way."""
    import unittest.mock

    import numpy as np

    from soakspec.judge import index as I, table

    bk = sorted(buckets) if grouped else buckets
    t = build_table([{"request_id": f"r{k}", "bucket": b} for k, b in enumerate(bk)])
    idx = np.arange(len(bk), dtype=np.int32)
    with unittest.mock.patch.object(table, "SCAN_CHUNK", step):
        got = I._by_bucket(t, idx)
    want: dict[int, list[int]] = {}
    for r in sorted(range(len(bk)), key=lambda r: bk[r]):
        want.setdefault(bk[r], []).append(r)
    assert list(got) == sorted(want) and {k: v.tolist() for k, v in got.items()} == want


_any_time = st.one_of(
    _stamp, st.floats(1.7e9 - 3000, 1.7e9 + 3000, allow_nan=False).map(lambda x: round(x, 6)),  # whole µs, near or far
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, -0.0, 5e-324, 1e300, 0.000001, 2147.483647, 2147.483648]),
    st.floats(0, 5, allow_nan=False).map(lambda x: round(x, 6)))


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({k: _any_time for k in ("start", "end", "intended_start", "first_token", "first_byte",
                                                                   "tpot", "client_delay")}), min_size=1, max_size=30),
       chunk=st.integers(1, 9), picks=st.lists(st.integers(0, 10**6), max_size=40), data=st.data())
def test_time_columns_held_in_microseconds_read_back_bit_for_bit(rows, chunk, picks, data):
    """A float column held in 4 bytes a request (`MicroColumn`: whole microseconds after the
    request's start, or alone) reads back every value exactly as recorded -- by row, slice,
    index array or mask, bits compared (-0.0 stays -0.0, an absent value None) -- whatever the
    values: whole microseconds within or beyond 35 minutes of the start, an absent start,
    values that are not whole microseconds (the column then stays float64)."""
    import unittest.mock

    import numpy as np

    from soakspec.judge import table as T

    recs = [{"request_id": f"r{i}", "bucket": 0, "outcome": "completed", **{k: v for k, v in r.items() if v is not None}}
            for i, r in enumerate(rows)]
    with unittest.mock.patch.object(T, "SCAN_CHUNK", chunk):
        t = build_table(recs)
    n = len(recs)
    idx = np.array([p % n for p in picks], dtype=np.int64)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    bits = lambda xs: [None if x is None or x != x else struct.pack("<d", x) for x in xs]
    for k in rows[0]:
        col = [r.get(k) for r in recs]
        assert bits([t.value(i, k) for i in range(n)]) == bits(col), k
        assert bits([float(t.f[k][-1])]) == bits(col[-1:]), k  # a row counted from the end
        for sel in (slice(None), slice(1, None, 2), idx, mask):
            want = [col[i] for i in (range(n)[sel] if isinstance(sel, slice) else np.arange(n)[sel].tolist())]
            assert bits(t.f[k][sel].tolist()) == bits(want), (k, sel)
    held = t.f["end"]
    ends = [r.get("end") for r in recs]
    if all(e is None or (e == round(e, 6) and s is not None and abs(e - s) < 2000 and math.copysign(1.0, e) > 0)
           for e, s in zip(ends, (r.get("start") for r in recs))):  # (-0.0 reads back as 0.0 after any start: float64)
        assert isinstance(held, T.MicroColumn) or held.strides == (0,)  # whole µs near the start: 4 bytes a request


def test_the_runners_times_are_held_in_4_bytes_a_request():
    """A table of records as the runner writes them holds each time but the start (end,
    first_token, tpot ...) in whole microseconds, 4 bytes a request, and the judge's figures
    are the ones the float64 columns give; a closed loop's intended start stays the start."""
    import numpy as np

    from soakspec.judge import table as T

    base = 1.7e9
    recs = [{"request_id": f"r{i}", "bucket": i // 10, "outcome": "completed", "start": round(base + i * 0.01, 6),
             "first_token": round(base + i * 0.01 + 0.0123 + i * 1e-6, 6), "end": round(base + i * 0.01 + 0.5 + i * 3e-6, 6),
             "tpot": round(0.0071 + i * 1e-6, 6), "itl": [0.001] * 3} for i in range(100)]
    t = build_table(recs)
    for k in ("end", "first_token", "tpot"):
        assert isinstance(t.f[k], T.MicroColumn) and t.f[k].us.dtype == np.int32, k
    closed = build_table([{**r, "intended_start": r["start"]} for r in recs])
    assert closed.f["intended_start"] is closed.f["start"]  # a closed loop's: the start itself, nothing held, nothing made when read
    assert t.ttft(slice(None)).tolist() == [r["first_token"] - r["start"] for r in recs]
    assert t.latency(slice(None)).tolist() == [r["end"] - r["start"] for r in recs]


def test_an_open_loops_intended_start_is_held_in_4_bytes_while_loading_and_after():
    """An open loop's intended start is its start for the first requests (no schedule lag), then
    differs: from the first that differs it is held as microseconds after the start while the
    table loads (not a float64 copy of the start until finish: 8 bytes a request at 10^7
    requests more while loading), and reads back exactly."""
    import numpy as np

    from soakspec.judge import table as T

    base = 1.7e9
    recs = [{"request_id": f"r{i}", "bucket": 0, "outcome": "completed", "start": round(base + i * 0.01 + (i >= 50) * i * 1e-6, 6),
             "intended_start": round(base + i * 0.01, 6), "end": round(base + i * 0.01 + 0.5, 6)} for i in range(100)]
    for rows_at_a_time in (False, True):
        b = T.TableBuilder()
        if rows_at_a_time:
            for r in recs:
                b.add(r)
        else:
            b.extend(recs)
        own = b.f["intended_start"].own
        assert isinstance(own, T._MicroCol) and own.fl is None and len(own.us) == 100, own
        t = b.finish()
        assert isinstance(t.f["intended_start"], T.MicroColumn) and t.f["intended_start"].us.dtype == np.int32
        assert t.f["intended_start"][:].tolist() == [r["intended_start"] for r in recs]


_edge_floats = st.sampled_from([0.0, -0.0, 1.0, -1.0, math.nan, math.inf, 1e-300, 1.7e9 + 0.123456])


@given(st.lists(_edge_floats, max_size=40), st.data(), st.integers(min_value=1, max_value=7))
def test_columns_compared_a_chunk_at_a_time_compare_as_whole_columns(a, data, chunk):
    """`same_values` (which makes two equal columns one, `share_equal`) compares a chunk at a
    time, so that it never copies two whole columns: it answers as the whole-column comparison
    does -- NaN equal to NaN, -0.0 apart from 0.0 -- wherever the difference falls."""
    import numpy as np

    from soakspec.judge.table import same_values

    b = list(a)
    for k in data.draw(st.lists(st.integers(min_value=0, max_value=max(len(a) - 1, 0)), max_size=2)) if a else []:
        b[k] = data.draw(_edge_floats)
    x, y = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
    whole = all(math.copysign(1, p) == math.copysign(1, q) and (p == q or (p != p and q != q)) for p, q in zip(a, b))
    assert same_values(x, y, chunk=chunk) == whole
    i, j = np.arange(len(a), dtype=np.int32), np.arange(len(b), dtype=np.int32)
    if b:
        j[data.draw(st.integers(min_value=0, max_value=len(b) - 1))] += data.draw(st.integers(min_value=0, max_value=1))
    assert same_values(i, j, chunk=chunk) == bool(np.array_equal(i, j))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({"tpot": st.one_of(st.none(), st.floats(0, 1, allow_nan=False)),
                                            "usage_mismatch": st.sampled_from([None, False, True])}), min_size=1, max_size=30),
       chunk=st.integers(1, 7), picks=st.lists(st.integers(0, 10**6), max_size=40), lo=st.integers(0, 30))
def test_a_count_based_value_a_chunk_at_a_time_equals_the_rows(rows, chunk, picks, lo):
    """tpot (and output_tokens) over any rows, filled SCAN_CHUNK rows at a time: the row's
    value where its usage agrees with its stream, else none -- each row's own definition."""
    import unittest.mock

    from soakspec.judge import table as T

    recs = [{"request_id": f"r{i}", "bucket": 0, "outcome": "completed", **{k: v for k, v in r.items() if v is not None}}
            for i, r in enumerate(rows)]
    t = build_table(recs)
    n = len(recs)
    idx = T.np.array([p % n for p in picks], dtype=T.np.int64)
    with unittest.mock.patch.object(T, "SCAN_CHUNK", chunk):
        for sel in (idx, slice(min(lo, n), None), slice(None)):
            want = [recs[i] for i in (range(n)[sel] if isinstance(sel, slice) else idx.tolist())]
            got = t.counted_number("tpot", sel)
            expect = [r.get("tpot") if not r.get("usage_mismatch") else None for r in want]
            assert [None if math.isnan(g) else g for g in got.tolist()] == expect


def test_requests_recorded_per_level_count_rows_with_extras_and_never_the_follow_up():
    """`completed_run` compares each level's recorded requests with those sent: rows kept with
    extras (a key outside the columns) count in their level wherever they lie, and the
    follow-up request counts in none, whether or not it has extras."""
    from soakspec.judge.index import recorded

    b = EvidenceBuilder(small_spec(levels="[2, 4]"), per_bucket=10)
    recs = b.records["a"]
    for k, r in enumerate(recs):
        if k % 3 == 0 or r["bucket"] < -1:  # the follow-up (bucket -2) among them
            r["mystery"] = {"x": k}
    t = b.build().backends[0].requests
    assert len(t.odd_rows) > 2 and (t.i["bucket"][t.odd_rows] < -1).any()  # the cases under test
    want = Counter((r["workload"], r["level"]) for r in recs if r["bucket"] >= -1)
    assert recorded(t) == dict(want) == {("w", 0): 20, ("w", 1): 20}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), swaps=st.integers(0, 3), warmup=st.integers(0, 3))
def test_one_levels_measured_requests_are_its_own_selection_when_already_in_order(seed, swaps, warmup):
    """A backend of one level: its measured requests are the level's selection itself (no copy,
    one memo) when the level's rows, bucket after bucket, are already in the judge's order; when
    a late start put a request of an earlier bucket after one of a later bucket (its rows
    regrouped by bucket), a selection of their own in the judge's order. Either way, the rows
    sorting them gives."""
    import numpy as np

    from soakspec.judge.table import ordered

    rng = random.Random(seed)
    spec = small_spec("require failed == 0", levels="[2]", bucket="30s")
    b = EvidenceBuilder(spec, per_bucket=5)
    recs = b.records["a"]
    lv = b.entry("a")["levels"][0]
    for _ in range(warmup):
        recs.append(b.request("a", lv["workload"], lv["index"], -1, lv["measure_start"] - rng.uniform(0.1, 2.0),
                              conc=lv.get("concurrency"), rate=None))
    measured = [r for r in recs if r["bucket"] >= 0]
    for _ in range(swaps):  # a request sent later than a request of the next bucket (its bucket kept)
        x, y = rng.sample(measured, 2)
        if x["bucket"] != y["bucket"]:
            for k in ("intended_start", "start", "first_byte", "first_token", "end"):
                x[k], y[k] = y[k], x[k]
    rng.shuffle(recs)
    bk = join(spec, b.build()).judged[0]
    (level,) = bk.levels
    rows = np.concatenate([idx for _, idx in level.records.parts])
    want = ordered(bk.table, rows).tolist()
    assert bk.measured.parts[0][1].tolist() == want
    assert (bk.measured is level.records) == (rows.tolist() == want)


_EDGES = [-129, -128, 127, 128, -32769, -32768, 32767, 32768, -2, -1, 0, 2**31 - 1, -(2**31) + 1]


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-(2**31) + 1, 2**31 - 1), st.integers(-200, 200), st.sampled_from(_EDGES)),
                       min_size=1, max_size=40),
       key=st.sampled_from(["bucket", "worker", "output_tokens", "status"]))
def test_integer_columns_held_narrow_read_as_they_were(values, key):
    """An int column is held in int8 or int16 when its values (none absent) all
    fit (a bucket, a load worker, a real server's token counts: 1 or 2 bytes a request, not
    4); every way the judge reads it -- a request's value, the column as numbers, comparisons
    with a value or with MISSING, sums -- gives what the int32 column gave."""
    import numpy as np

    from soakspec.judge.table import MISSING

    t = build_table([{"request_id": f"r{k}", **({key: v} if v is not None else {})} for k, v in enumerate(values)])
    col = t.i[key]
    present = [v for v in values if v is not None]
    lo, hi = min(present, default=0), max(present, default=0)
    if col.strides != (0,):  # (one repeated value: one value held)
        want = (np.int32 if None in values else np.int8 if -128 <= lo and hi <= 127
                else np.int16 if -32768 <= lo and hi <= 32767 else np.int32)
        assert col.dtype == want
    n = len(values)
    assert [t.value(k, key) for k in range(n)] == values
    got = t.number(key, np.arange(n))
    assert [None if x != x else x for x in got.tolist()] == [None if v is None else float(v) for v in values]
    for x in (-1, 0, 1, 127, 128, -129, 32768, MISSING):
        assert (col == x).tolist() == [(v if v is not None else MISSING) == x for v in values]
        assert (col >= x).tolist() == [(v if v is not None else MISSING) >= x for v in values]
    assert int(col[col != MISSING].astype(np.int64).sum()) == sum(present)
    assert int(col[col != MISSING].sum()) == sum(present)  # numpy sums small integers in its platform integer
