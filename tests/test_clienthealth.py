"""#17: a load generator that proves its own numbers.

One clock per record, coalescing counted, TPOT for every request with >= 2 tokens, usage that
goes down flagged, and the client's own health recorded (client.jsonl) and judged by default
(`client_healthy`): a starved client makes the run INCONCLUSIVE, never FAIL on timing rules.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.evidence import layout
from soakspec.judge import judge
from soakspec.judge.evidence import load_evidence
from soakspec.judge.stats import percentile
from soakspec.judge.testing import EvidenceBuilder
from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.runner import driver
from soakspec.runner.clienthealth import LoopMonitor, weighted_percentile
from soakspec.runner.clock import RunClock
from soakspec.runner.engine import RunOptions, execute
from soakspec.runner.h11client import H11Connection
from soakspec.runner.httpxclient import HttpxClient
from soakspec.runner.protocol import Endpoint, RequestShape, StreamAccumulator
from soakspec.runner.records import Outcome, RequestRecord
from soakspec.sim.config import SimConfig
from soakspec.sim.server import serve as sim_serve

from runner_support import sim_spec

# ------------------------------------------------------------------ the record: TPOT, coalescing


def _event(text: str, ct: int, finish: str | None = None) -> bytes:
    obj = {"id": "c", "object": "text_completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
           "usage": {"prompt_tokens": 2, "total_tokens": 2 + ct, "completion_tokens": ct}}  # fmt: skip
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SHAPE = RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=64)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 4), min_size=1, max_size=12),  # tokens per event
    cuts=st.lists(st.integers(0, 10_000), max_size=20),  # where reads split the byte stream
    gaps=st.lists(st.floats(0.0, 0.05), min_size=40, max_size=40),  # time between reads
    usage=st.booleans(),
)
def test_tpot_is_defined_for_any_read_pattern(tokens, cuts, gaps, usage):
    """For any interleaving of reads (events split across reads and merged into one), every
    request with >= 2 tokens and tokens after its first event has a TPOT, equal to (last token
    - first token) / (n - k1) from the read times (k1: the first event's tokens; 0 when the
    later events shared its read), the mean of its ITL gaps, which add up to the same span: one
    gap per token after the first event's, `coalesced` of them not independent. A request whose
    first event carried every token has no TPOT."""
    body, cum = b"", 0
    ends = []  # byte offset where each event ends, and its tokens
    for i, k in enumerate(tokens):
        cum += k
        ev = _event("x" * k, cum if usage else 0, "length" if i == len(tokens) - 1 else None)
        if not usage:
            ev = ev.replace(b',"usage":{"prompt_tokens":2,"total_tokens":2,"completion_tokens":0}', b"")
        body += ev
        ends.append(len(body))
    body += b"data: [DONE]\n\n"
    bounds = sorted({c % (len(body) + 1) for c in cuts} | {len(body)})
    acc = StreamAccumulator(SHAPE)
    acc.on_response(200, "text/event-stream")
    t, start, read_time = 1.0, 0, []
    for j, b in enumerate(bounds):
        if b > start:
            t += gaps[j % len(gaps)]
            acc.on_body(body[start:b], t)
            read_time.append((b, t))
            start = b
    acc.on_end(t)
    rec = RequestRecord("r", intended_start=0.0, start=0.0)
    acc.finish(rec, t + 0.5)
    assert rec.outcome is Outcome.COMPLETED, rec.error
    n = cum if usage else len(tokens)
    assert rec.output_tokens == n

    def arrival(offset: int) -> float:  # the time of the read that completed the byte at `offset`
        return next(rt for b, rt in read_time if b >= offset)

    first, last = arrival(ends[0]), arrival(ends[-1])
    k1 = tokens[0] if usage else 1
    if n >= 2 and n > k1:
        assert rec.tpot is not None and rec.tpot == pytest.approx((last - first) / (n - k1), abs=1e-9)
        assert rec.tpot == pytest.approx(sum(rec.itl) / len(rec.itl), abs=1e-9)
    else:
        assert rec.tpot is None
    assert sum(rec.itl) == pytest.approx(last - first, abs=1e-9)
    assert len(rec.itl) == n - k1
    assert 0 <= rec.coalesced <= len(rec.itl)
    # one clock: the request ends at its last bytes' arrival, the client's delay is apart
    assert rec.end == t and rec.client_delay == pytest.approx(0.5)


def test_a_chunk_of_k_tokens_gives_k_gaps_of_which_k_minus_1_are_coalesced():
    acc = StreamAccumulator(SHAPE)
    acc.on_response(200, "text/event-stream")
    acc.on_body(_event("a", 1), 1.0)
    acc.on_body(_event("bcde", 5), 1.04)  # one chunk of 4 tokens, 40 ms later
    acc.on_body(_event("f", 6) + _event("g", 7, "length") + b"data: [DONE]\n\n", 1.05)  # two events in one read
    acc.on_end(1.05)
    rec = RequestRecord("r", intended_start=0.0, start=0.0)
    acc.finish(rec, 1.2)
    assert rec.itl == pytest.approx([0.01] * 4 + [0.01, 0.0])
    assert rec.coalesced == 3 + 1  # three shares of the chunk's gap, and the event that shared a read
    assert rec.tpot == pytest.approx(0.05 / 6)


def test_usage_that_goes_down_is_flagged():
    acc = StreamAccumulator(SHAPE)
    acc.on_response(200, "text/event-stream")
    acc.on_body(_event("a", 1) + _event("b", 3) + _event("c", 2) + _event("d", 4, "length") + b"data: [DONE]\n\n", 1.0)
    acc.on_end(1.0)
    rec = RequestRecord("r", intended_start=0.0, start=0.0)
    acc.finish(rec, 1.0)
    assert rec.usage_decreased is True
    ok = StreamAccumulator(SHAPE)
    ok.on_response(200, "text/event-stream")
    ok.on_body(_event("a", 1) + _event("b", 3) + _event("d", 4, "length") + b"data: [DONE]\n\n", 1.0)
    ok.on_end(1.0)
    rec2 = RequestRecord("r2", intended_start=0.0, start=0.0)
    ok.finish(rec2, 1.0)
    assert rec2.usage_decreased is False


# ------------------------------------------------------------------ against the simulator


async def _sim_records(nursery, n: int, *, client: str = "h11", clock: RunClock | None = None, **options) -> list[RequestRecord]:
    port = await nursery.start(partial(sim_serve, SimConfig(model="sim", trace_log=False, seed=3, **options)))
    clock = clock or RunClock()
    async with httpx.AsyncClient() as http:
        conn = H11Connection("127.0.0.1", port, clock) if client == "h11" else HttpxClient(http, f"http://127.0.0.1:{port}", clock)
        out = []
        shape = RequestShape(Endpoint.COMPLETIONS, "sim", "one two three", max_tokens=21)
        for i in range(n):
            rec = RequestRecord(f"r{i}")
            await conn.send(shape, f"r{i}", (), rec, deadline=clock.now() + 10)
            assert rec.outcome is Outcome.COMPLETED, rec.error
            out.append(rec)
        if client == "h11":
            await conn.aclose()
    return out


async def test_one_event_per_token_at_10ms_gives_10ms_gaps_none_coalesced(nursery, autojump_clock):
    """The simulator sends one event per token 10 ms apart (virtual time: exact): every ITL
    gap is 10 ms and none is coalesced; TPOT is the same 10 ms."""
    recs = await _sim_records(nursery, 3, client="httpx", clock=RunClock(timer=trio.current_time), ttft=0.005, itl=0.010)
    gaps = [g for r in recs for g in r.itl]
    assert len(gaps) == 3 * 20 and sum(r.coalesced for r in recs) == 0
    assert gaps == pytest.approx([0.010] * 60, abs=1e-6)
    assert all(r.tpot == pytest.approx(0.010, abs=1e-6) for r in recs)


async def test_four_tokens_per_chunk_are_four_gaps_three_of_them_coalesced(nursery, autojump_clock):
    """tokens_per_chunk = 4: the gaps are per token (each chunk's 40 ms over its 4 tokens), and
    the shares that are not independent samples are counted: 3 of every 4."""
    (rec,) = await _sim_records(nursery, 1, client="httpx", clock=RunClock(timer=trio.current_time),
                                ttft=0.005, itl=0.010, tokens_per_chunk=4)  # fmt: skip
    assert (rec.output_tokens, rec.chunks, len(rec.itl)) == (21, 6, 20)  # the first token alone, then 5 x 4
    assert rec.itl == pytest.approx([0.010] * 20, abs=1e-6)
    assert rec.coalesced == 5 * 3


@pytest.mark.slow  # real time on a shared machine: a loaded one coalesces (the simulator writes due events together)
async def test_kernel_stamps_unstarved_10ms_itl_within_1ms_and_not_coalesced(nursery):
    """The hot-path client (kernel receive stamps) against the simulator at 10 ms ITL, one
    event per token: with the client's loop unstarved (healthy by the default client_lag), coalesced
    is ~0 and ITL p50 is within 1 ms of 10 ms. Up to six tries (about a second each): the
    precondition is an idle loop, which a busy machine does not always give (three tries on
    a 2-core machine with three busy loops beside it never got one)."""
    seen = []
    for _ in range(6):
        samples = []
        async with trio.open_nursery() as n:
            n.start_soon(LoopMonitor(RunClock(), samples.append, window_s=10.0).run)
            recs = await _sim_records(nursery, 4, ttft=0.005, itl=0.010)
            n.cancel_scope.cancel()
        gaps = [g for r in recs for g in r.itl]
        frac, p50 = sum(r.coalesced for r in recs) / len(gaps), percentile(gaps, 50)
        seen.append((frac, p50, max(s.lag_p99 for s in samples)))
        if max(s.lag_p99 for s in samples) <= 0.05:  # healthy by the gate's default (client_lag = 50ms)
            assert frac <= 0.05 and abs(p50 - 0.010) <= 0.001, seen
            return
    pytest.fail(f"the loop was never unstarved (coalesced, ITL p50, lag p99): {seen}")


# ------------------------------------------------------------------ the loop monitor


def test_weighted_percentile_weighs_time_not_wakeups():
    """One 200 ms stall among 160 on-time 5 ms ticks: the loop was late a fifth of the time."""
    lags = [0.0] * 160 + [0.2]
    weights = [0.005 + x for x in lags]
    assert weighted_percentile(lags, weights, 99.0) == 0.2
    assert weighted_percentile(lags, weights, 50.0) == 0.0


def test_the_loop_monitor_measures_injected_blocking():
    """A task blocks the loop for 120 ms at known times; the monitor's recorded lag matches
    each block within a few ms (its tick, 5 ms, is the resolution)."""
    samples, blocked = [], []

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(LoopMonitor(RunClock(), samples.append, window_s=0.3).run)
            for _ in range(2):
                await trio.sleep(0.25)
                t0 = time.perf_counter()
                time.sleep(0.12)
                blocked.append(time.perf_counter() - t0)
            await trio.sleep(0.1)
            n.cancel_scope.cancel()

    trio.run(main)
    worst = sorted((s.lag_max for s in samples), reverse=True)[:2]
    assert len(worst) == 2
    for lag, block in zip(worst, sorted(blocked, reverse=True)):
        assert block - 0.007 <= lag <= block + 0.005
    assert any(s.lag_p99 >= 0.1 for s in samples)  # time-weighted: the stall dominates its window
    assert all(s.cpu is not None and s.wakeups > 0 for s in samples)


# ------------------------------------------------------------------ a starved client, end to end


STARVED_GATE = "require failed == 0\n  require p95(ttft) < 1ms per level\n  require mean(itl) < 50ms"


def test_a_starved_client_is_inconclusive_naming_client_health_never_fail(tmp_path, monkeypatch):
    """The runner's loop is blocked for 150 ms every 300 ms (a task in its own loop) while the
    simulator serves 20 ms TTFT: the verdict is INCONCLUSIVE naming the load generator, the
    TTFT rule that would FAIL (p95 < 1 ms) is INCONCLUSIVE, and the recorded event-loop lag
    matches the injected blocking within a few ms."""
    blocked: list[float] = []
    drive = driver.drive_backend

    async def starved(*args, **kw):
        async def hog():
            while True:
                await trio.sleep(0.15)
                t0 = time.perf_counter()
                time.sleep(0.15)
                blocked.append(time.perf_counter() - t0)

        async with trio.open_nursery() as n:
            n.start_soon(hog)
            await drive(*args, **kw)
            n.cancel_scope.cancel()

    monkeypatch.setattr(driver, "drive_backend", starved)
    spec_path = tmp_path / "s.soak"
    spec_path.write_text(sim_spec(gate=STARVED_GATE, follow_up=False))
    spec, diags, _ = load_spec(spec_path)
    assert spec is not None, diags
    out = tmp_path / "run"
    result = execute(plan(spec), RunOptions(out_dir=out, quiet=True))
    assert result.status == "complete", result.reason
    v = judge(spec, load_evidence(out))
    rules = {r.rule: r for r in v.rules}
    assert v.outcome == "INCONCLUSIVE", [(r.rule, r.status, r.message) for r in v.rules]
    health = rules["client_healthy"]
    assert health.status == "inconclusive" and "load generator saturated in bucket" in health.message
    assert "event-loop lag p99" in health.message
    assert rules["p95(ttft) < 1ms per level"].status == "inconclusive"
    assert "load generator was saturated" in rules["p95(ttft) < 1ms per level"].message
    assert all(r.status != "fail" for r in v.rules)
    rows = [json.loads(line) for line in (out / layout.CLIENT).read_text().splitlines()]
    assert rows and {r["backend"] for r in rows} == {"b0"}
    # every stalled wake-up the monitor kept (a lag over 10 ms) is one injected block: the worst
    # never less than the worst block (nothing under-reported), and the typical one within a
    # few ms of the typical block. Not each one: the test runs in pytest's own process, late in
    # a long session, where a garbage collection of its heap or a busy CPU can stall the loop
    # once more, and the monitor rightly reports that too (CI once saw 213 ms for 150 ms blocks)
    stalls = sorted(x for r in rows for x in r["stalls"])
    assert len(stalls) >= 3 and max(blocked) - 0.007 <= stalls[-1]
    assert abs(stalls[len(stalls) // 2] - sorted(blocked)[len(blocked) // 2]) <= 0.01, (stalls, blocked)


def test_the_judge_reads_client_health_per_bucket_and_the_gate_can_turn_it_off():
    """A bucket whose client samples show a saturated loop is INCONCLUSIVE with the reason; a
    latency FAIL beside it is INCONCLUSIVE; `client_healthy = false` turns the check off and the
    FAIL stands."""
    text = ("require failed == 0\nrequire p95(latency) < 1ms per bucket")
    spec = _small_spec(text, mode="open", levels="[2rps]")  # (closed loop also checks achieved concurrency: the builder's is sparse)
    ev = _with_client(EvidenceBuilder(spec).build(), lag=0.18, cpu=0.99)
    v = judge(spec, ev)
    rules = {r.rule: r for r in v.rules}
    assert v.outcome == "INCONCLUSIVE"
    msg = rules["client_healthy"].message
    assert "load generator saturated in bucket 0: event-loop lag p99 180 ms (limit 50 ms), client CPU 99 % of a core" in msg
    assert rules["p95(latency) < 1ms per bucket"].status == "inconclusive"
    healthy = judge(spec, _with_client(EvidenceBuilder(spec).build(), lag=0.002, cpu=0.2))
    assert {r.rule: r.status for r in healthy.rules}["client_healthy"] == "pass"
    assert healthy.outcome == "FAIL"
    off = _small_spec(text + "\nclient_healthy = false", mode="open", levels="[2rps]")
    v_off = judge(off, _with_client(EvidenceBuilder(off).build(), lag=0.18, cpu=0.99))
    assert v_off.outcome == "FAIL" and "client_healthy = false" in {r.rule: r for r in v_off.rules}["client_healthy"].message
    lenient = _small_spec(text + "\nclient_lag = 500ms\nclient_cpu = 100%", mode="open", levels="[2rps]")
    v_len = judge(lenient, _with_client(EvidenceBuilder(lenient).build(), lag=0.18, cpu=0.99))
    assert {r.rule: r.status for r in v_len.rules}["client_healthy"] == "pass"


def test_a_goodput_fail_beside_a_saturated_client_is_inconclusive_and_a_count_rule_fail_stands():
    """goodput(ttft < ...) counts requests by their TTFT, which a saturated client inflates:
    its FAIL is INCONCLUSIVE like the TTFT rule's. A goodput on output tokens alone is the
    server's figure and its FAIL stands."""
    text = "require goodput(ttft < 1ms) >= 90% per bucket\nrequire p95(ttft) < 1ms per bucket"
    spec = _small_spec(text, mode="open", levels="[2rps]")
    v = judge(spec, _with_client(EvidenceBuilder(spec).build(), lag=0.18, cpu=0.99))
    rules = {r.rule: r for r in v.rules}
    assert rules["goodput(ttft < 1ms) >= 90% per bucket"].status == "inconclusive", rules
    assert "load generator was saturated" in rules["goodput(ttft < 1ms) >= 90% per bucket"].message
    assert v.outcome == "INCONCLUSIVE"
    healthy = judge(spec, _with_client(EvidenceBuilder(spec).build(), lag=0.002, cpu=0.2))
    assert {r.rule: r.status for r in healthy.rules}["goodput(ttft < 1ms) >= 90% per bucket"] == "fail"
    tokens = _small_spec("require goodput(output_tokens >= 1000) >= 90% per bucket", mode="open", levels="[2rps]")
    v_tok = judge(tokens, _with_client(EvidenceBuilder(tokens).build(), lag=0.18, cpu=0.99))
    assert {r.rule: r.status for r in v_tok.rules}["goodput(output_tokens >= 1000) >= 90% per bucket"] == "fail"


def test_a_concurrency_the_backends_backoff_held_down_is_not_the_clients_saturation():
    """Closed loop at concurrency 2: the builder's records keep far fewer than 2 in flight. With
    samples saying nothing held the workers, that is the client falling short (INCONCLUSIVE,
    "achieved concurrency"); with samples saying the workers waited at the backend's backoff gate
    (the server refused or failed), the shortfall is the server's and the client kept up. Held
    for only part of the shortfall, it is still the client's, and the message says how many waited."""
    spec = _small_spec("require failed == 0")

    def health(held_per_s: float | None, outage: bool = True):
        b = EvidenceBuilder(spec)
        if outage:  # the server refused a scout in every bucket: the backoff gate was shut
            for r in b.records["a"]:
                if r["bucket"] >= 0 and int(r["request_id"].rsplit("-", 1)[-1]) % 4 == 0:
                    b.set_outcome(r, "disconnected", "connect failed: connection refused", status=None)
        ev = _with_client(b.build(), lag=0.002, cpu=0.2, held_s=held_per_s)
        return {r.rule: r for r in judge(spec, ev).rules}["client_healthy"]

    untallied, none, all_held, some = health(None), health(0.0), health(2.0), health(0.05)
    for h in (untallied, none, some):
        assert h.status == "inconclusive" and "achieved concurrency" in h.message, h.message
    assert "waited at the backend's backoff" not in none.message
    assert "0.05 more waited at the backend's backoff" in some.message, some.message
    assert all_held.status == "pass", all_held.message
    # worst input: client samples edited to claim held workers where the server failed nothing
    # (no refused or failed request near the bucket) do not hide the client's shortfall
    forged = health(2.0, outage=False)
    assert forged.status == "inconclusive" and "achieved concurrency" in forged.message, forged.message


def test_the_loop_monitor_samples_the_gates_held_time_per_window():
    """Each sample carries the worker-seconds held at the backend's gate in its own window: the
    samples add up to the tally, and a window without holding says 0."""
    samples, tally = [], [0.0]

    async def main():
        async with trio.open_nursery() as n:
            n.start_soon(LoopMonitor(RunClock(timer=trio.current_time, epoch=0.0), samples.append, window_s=1.0,
                                     held=lambda: tally[0]).run)
            await trio.sleep(1.5)
            tally[0] = 3.0  # three workers held for a second, in the second window
            await trio.sleep(2.0)
            n.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    held = [s.held_s for s in samples]
    assert held[0] == 0.0 and sum(held) == 3.0 and held.count(3.0) == 1, held
    assert all(s.to_json()["held_s"] == s.held_s for s in samples)
    plain = []

    async def unheld():
        async with trio.open_nursery() as n:
            n.start_soon(LoopMonitor(RunClock(timer=trio.current_time, epoch=0.0), plain.append, window_s=1.0).run)
            await trio.sleep(1.5)
            n.cancel_scope.cancel()

    trio.run(unheld, clock=trio.testing.MockClock(autojump_threshold=0))
    assert plain and all(s.held_s is None for s in plain)


def _small_spec(gate_lines: str, **kw):
    from soakspec.judge.testing import small_spec

    return small_spec(gate_lines, **kw)


def _with_client(ev, *, lag: float, cpu: float, held_s: float | None = None):
    """The evidence with one client sample per second of every level's buckets (`held_s`: each
    sample's worker-seconds held at the backend's gate; None: the key absent, as before it was tallied)."""
    import dataclasses

    backends = []
    for be in ev.backends:
        rows = []
        for lv in be.entry["levels"]:
            for b in lv["buckets"]:
                t = b["start"]
                while t < b["end"]:
                    rows.append({"schema_version": 1, "start": t, "t": t + 1.0, "backend": be.name, "process": 0, "wakeups": 150,
                                 "lag_p50": 0.001, "lag_p99": lag, "lag_max": lag, "cpu": cpu, "host_cpu": 1.0,
                                 **({} if held_s is None else {"held_s": held_s})})  # fmt: skip
                    t += 1.0
        backends.append(dataclasses.replace(be, client=tuple(rows)))
    return dataclasses.replace(ev, backends=tuple(backends))


def test_usage_going_down_is_a_usage_mismatch():
    """A completed record flagged `usage_decreased` counts as usage_mismatch (judge/rederive.py)."""
    import dataclasses

    spec = _small_spec("require usage_mismatch == 0")
    ev = EvidenceBuilder(spec).build()
    be = ev.backends[0]
    recs = list(be.records)
    recs[3] = dict(recs[3], usage_decreased=True)
    ev = dataclasses.replace(ev, backends=(dataclasses.replace(be, records=tuple(recs)), *ev.backends[1:]))
    v = judge(spec, ev)
    r = {x.rule: x for x in v.rules}["usage_mismatch == 0"]
    assert r.status == "fail" and "1 usage-mismatched request" in r.message


MISBEHAVING = Path(__file__).resolve().parent / "misbehaving" / "server.py"


def test_a_server_whose_usage_goes_down_fails_usage_mismatch(tmp_path):
    """End to end against a misbehaving server (cumulative usage 1, 2, 1, 4): every request is
    recorded `usage_decreased` and the gate's `usage_mismatch == 0` FAILs."""
    import sys

    from runner_support import read_jsonl, run_spec

    launch = (f'launch = ["{sys.executable}", "{MISBEHAVING}", "--port", "{{port}}", "--mode", "usage-down"]\n'
              '  ready {\n    timeout = 10s\n    interval = 100ms\n  }')  # fmt: skip
    text = sim_spec(gate="require usage_mismatch == 0", duration="1s", follow_up=False)
    block = "sim {\n    ttft = 20ms\n    itl = 5ms\n  }"
    assert block in text
    proc, out = run_spec(tmp_path, text.replace(block, launch), "--format", "json")
    rows = read_jsonl(out / "backends" / "b0" / "requests.jsonl.gz")
    assert rows and all(r["usage_decreased"] is True for r in rows if r["outcome"] == "completed")
    rules = {r["rule"]: r for r in json.loads(proc.stdout)["rules"]}
    assert rules["usage_mismatch == 0"]["status"] == "fail", proc.stdout


# ------------------------------------------------------------------ W509


def _w509(load: str, rule: str, backend: str = "sim { ttft = 20ms  itl = 10ms }", duration: str = "  duration = 20s\n") -> list[str]:
    """`check`'s W509 messages for one workload (`load`, 10 s buckets, `duration` its line: ""
    for phases, whose durations are theirs) on one backend, and one gate rule."""
    from soakspec.lang import check, parse

    text = (f'soak "x" {{ issue = "1" }}\nbackend "b" {{ {backend} }}\nworkload "w" {{\n  endpoint = completions\n'
            f'  prompt_words = 4\n  max_tokens = 10\n  load {{ {load} }}\n{duration}  bucket = 10s\n}}\n'
            f'gate {{\n  confidence = 95%\n  {rule}\n}}\n')  # fmt: skip
    tree, diags = parse(text)
    _, more = check(tree)
    assert not [d for d in diags + more if d.code.startswith("E")], diags + more
    return [d.message for d in diags + more if d.code == "W509"]


def test_check_warns_when_a_percentile_rule_cannot_get_its_samples():
    """`check` says before anything runs that p95 per bucket needs 59 samples at 95 % and the
    plan gives about 30 (3 rps x 10 s); a closed loop against a simulator is estimated from its
    latency; enough samples, or a real server with no latency hint, give no warning."""
    (msg,) = _w509("mode = open  rate = 3rps", "require p95(ttft) < 1s per bucket")
    assert msg.startswith("p95(ttft) per bucket needs 59 samples at 95% confidence; about 30 per bucket are planned")
    assert _w509("mode = open  rate = 10rps", "require p95(ttft) < 1s per bucket") == []
    assert _w509("mode = open  rate = 3rps", "require p95(ttft) < 1s per level") == []  # 60 per level
    # closed loop at c=1 against a 110 ms simulator: ~91 per bucket, short of p99's 299
    (msg,) = _w509("mode = closed  concurrency = 1", "require p99(latency) < 1s per bucket")
    assert "needs 299 samples" in msg and "about 91 per bucket" in msg
    assert _w509("mode = closed  concurrency = 1", "require p99(latency) < 1s per bucket", 'url = "http://127.0.0.1:1"') == []
    # a `>` rule is decided by the samples below T: p99(x) > T needs p1's sample size (the judge's), not p99's
    assert _w509("mode = closed  concurrency = 1", "require p99(output_tokens) > 4 per bucket") == []
    (msg,) = _w509("mode = closed  concurrency = 1", "require p1(output_tokens) >= 4 per bucket")
    assert "needs 299 samples" in msg


def test_w509_says_a_short_rule_can_never_pass_not_that_it_cannot_fail():
    """W509 said a percentile rule over too few planned samples "can only be INCONCLUSIVE", but the
    judge FAILs it where enough samples violate the threshold to be sure (LoadGen's early
    stopping works both ways): p99(ttft) < 21ms over 100 requests whose p99 was 22.4ms FAILed
    (exit 1) the run `check` had said could not. The warning says what holds: it can never PASS."""
    from soakspec.judge import judge
    from soakspec.judge.testing import EvidenceBuilder, small_spec

    (msg,) = _w509("mode = open  rate = 3rps", "require p95(ttft) < 1s per bucket")
    assert "can only be INCONCLUSIVE" not in msg
    assert msg.endswith("the rule can never PASS (at best INCONCLUSIVE; it FAILs where enough samples violate the "
                        "threshold to be sure)"), msg
    spec = small_spec("require p99(ttft) <= 1s per level")  # 16 requests a level, p99 needs 299
    b = EvidenceBuilder(spec)
    for rec in list(b.measured("a"))[:8]:
        rec["ttft"], rec["first_token"] = 5.0, rec["intended_start"] + 5.0
    (r,) = [r for r in judge(spec, b.build()).rules if r.rule == "p99(ttft) <= 1s per level"]
    assert r.status == "fail" and "enough samples violate the threshold" in r.message  # what the warning now allows


def test_w509_warns_when_random_arrivals_leave_some_bucket_short():
    """A bucket expecting 60 Poisson arrivals holds fewer than p95's 59 with probability 0.4, and
    the rule is INCONCLUSIVE in it however the server did: `check` said "ok" and a 4 s run at
    60 rps in 1 s buckets (seed 5) came back INCONCLUSIVE in 3 of its 4 buckets ("from only 48
    requests; needs 11 more"). W509 now says so before anything runs; constant arrivals (their
    count does not vary), a mean well above the need and an exact requests_per_level are not
    warned."""
    (msg,) = _w509("mode = open  rate = 6rps  arrival = poisson", "require p95(ttft) < 1s per bucket")
    assert msg.startswith("p95(ttft) per bucket needs 59 samples at 95% confidence; about 60 per bucket are planned "
                          "(workload 'w' at 6 rps), but Poisson arrivals vary (±7.7 a bucket): some bucket falls short "
                          "with probability 68%"), msg
    assert "can never PASS" in msg
    (msg,) = _w509("mode = open  rate = 6rps  burstiness = 0.5", "require p95(ttft) < 1s per bucket")
    assert "but gamma (burstiness 0.5) arrivals vary (±11 a bucket)" in msg, msg
    (msg,) = _w509("mode = open  rate = 3.5rps  arrival = poisson", "require p95(ttft) < 1s per level")
    assert "about 70 per level" in msg and "some level falls short" in msg, msg
    assert _w509("mode = open  rate = 6rps", "require p95(ttft) < 1s per bucket") == []  # constant: 60 in every bucket
    assert _w509("mode = open  rate = 12rps  arrival = poisson", "require p95(ttft) < 1s per bucket") == []  # 120: 7 sd over
    assert _w509("mode = open  rate = 20rps  arrival = poisson  requests_per_level = 60",
                 "require p95(ttft) < 1s per level") == []  # a count is exact


def test_w509s_short_count_probability_is_the_runners_schedule():
    """The probability W509 states is what the runner's seeded Poisson schedule gives: of 4,000
    one-second buckets at 60 rps, the share holding fewer than 59 arrivals (within 3 %)."""
    from soakspec.lang.samples import arrival_count_at_most as _count_below
    from soakspec.runner.load import schedule

    n = 4000
    counts = [0] * n
    for t in schedule(60.0, "poisson", 3, 0.0, float(n)):
        counts[int(t)] += 1
    short = sum(c < 59 for c in counts) / n
    assert abs(short - _count_below(58, 60.0, 1.0)) < 0.03, (short, _count_below(58, 60.0, 1.0))


def test_check_counts_a_phase_and_a_batch_as_they_send():
    """W509 counted a phased load at each phase's starting load held for the workload's whole
    duration (a ramp from 1 rps: 10 a bucket, and 40 a level where the phase plans 120), and a
    batch as a closed loop. A phase is a level of its own duration, its buckets counted at its
    lowest load (a linear ramp's first bucket: its low end plus half a bucket's climb); batches
    of 3 from 2 workers send 3 requests every 2 latencies, not 2 every latency."""
    ramp = "mode = open  phases { up { rate = 1rps  ramp_to = 11rps  duration = 20s }  flat { rate = 10rps  duration = 20s } }"
    # the ramp's first 10 s bucket: 1 + 10 x (10 / 20) / 2 = 3.5 rps, 35 requests; the hold: 100
    (msg,) = _w509(ramp, "require p95(ttft) < 1s per bucket", duration="")
    assert "about 35 per bucket are planned (workload 'w' at phase up)" in msg, msg
    assert _w509(ramp, "require p95(ttft) < 1s per level", duration="") == []  # 6 rps over 20 s: 120
    # 110 ms a request; batches of 3 from 2 workers: 3 / (2 x 0.11 s) = 13.6 rps, 136 a bucket
    (msg,) = _w509("mode = batch  concurrency = 2  requests = 3", "require p99(latency) < 1s per bucket")
    assert "needs 299 samples" in msg and "about 136 per bucket" in msg, msg
    assert _w509("mode = batch  concurrency = 2  requests = 3", "require p95(latency) < 1s per bucket") == []


def test_check_warns_when_a_pooled_percentile_rule_cannot_get_its_samples():
    """A rule with no `per` (per backend) or `per run` pools every level, and was not estimated:
    `require p99.9(ttft) < 1s` on a ~100-request soak passed `check` silently and then could
    only be INCONCLUSIVE ("needs 2194 more"). 3 rps for 20 s plans 60; p99.9 at 95 % needs 2995;
    p95 (59) is enough pooled. A level whose count is not estimated (a real server in a closed
    loop, no latency hint) leaves the pooled total unknown: no warning."""
    (msg,) = _w509("mode = open  rate = 3rps", "require p99.9(ttft) < 1s")
    assert msg.startswith("p99.9(ttft) per backend needs 2995 samples at 95% confidence; about 60 per backend are planned "
                          "(every level of every workload on backend 'b')"), msg
    (msg,) = _w509("mode = open  rate = [3rps, 5rps]", "require p99.9(ttft) < 1s per run")
    assert "about 160 per run are planned (every level of every workload and backend)" in msg, msg
    assert _w509("mode = open  rate = 3rps", "require p95(ttft) < 1s") == []
    assert _w509("mode = closed  concurrency = 1", "require p99.9(ttft) < 1s", 'url = "http://127.0.0.1:1"') == []


@pytest.mark.slow  # a real --workers soak, ~5 s
def test_every_load_process_records_its_own_health(tmp_path):
    """`--workers 2`: client.jsonl has the parent's samples (process 0) and each worker's
    (1 and 2), every one with its lag and CPU, and the judge reads them per bucket."""
    from runner_support import run_spec

    proc, out = run_spec(tmp_path, sim_spec(load="mode = closed\n    concurrency = [4]", follow_up=False), "--workers", "2")
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (out / layout.CLIENT).read_text().splitlines()]
    assert {r["process"] for r in rows} == {0, 1, 2}
    assert all(r["backend"] == "b0" and r["wakeups"] > 0 and r["cpu"] is not None for r in rows)
    results = json.loads((out / "results.json").read_text())
    clients = [w["client"] for w in results["backends"][0]["buckets"]]
    assert all(c["samples"] > 0 and c["processes"] == 3 for c in clients)


def test_reports_show_coalescing_exclusions_and_the_client_beside_the_server(tmp_path):
    """ITL states its coalesced gaps, TPOT says how many requests it leaves out and why, the
    load generator's health is a table (md, html) and a chart per backend (html); the md still
    lints clean against its evidence."""
    from soakspec.cli import main
    from soakspec.judge.testing import small_spec

    spec = small_spec("require failed == 0")
    b = EvidenceBuilder(spec)
    (name,) = list(b.records)
    measured = [r for r in b.records[name] if r["bucket"] >= 0 and r["outcome"] == "completed"]
    measured[0].update(output_tokens=1, chunks=1, tpot=None, itl=[])
    measured[1]["coalesced"] = 3
    lv = b.manifest["backends"][0]["levels"][0]
    b.client[name] = [{"schema_version": 1, "start": w["start"], "t": w["start"] + 1.0, "backend": name, "process": 0, "wakeups": 150, "lag_p50": 0.001,
                       "lag_p99": 0.004, "lag_max": 0.02, "cpu": 0.3, "host_cpu": 0.5, "tick_s": 0.005, "stall_s": 0.01,
                       "weight_s": 1.0, "stalls": [0.02]} for w in lv["buckets"]]  # fmt: skip
    ev = b.write(tmp_path / "ev")
    spec_path = tmp_path / "s.soak"
    spec_path.write_text(spec.canonical_text)
    md = tmp_path / "pr.md"
    assert main(["report", str(ev), "--spec", str(spec_path), "--format", "md", "--out", str(md)]) == 0
    text = md.read_text()
    assert "(3 of " in text and " gaps coalesced)" in text
    assert "TPOT leaves out 1 completed request of a · concurrency 2: fewer than 2 tokens (1)" in text
    # pooled: the one 20 ms stall covers 2.5 % of each 1 s window, so it is the p99
    assert "### Load generator" in text and "| a · concurrency 2 | 20.0 ms | 30 % | 50 % | - | 0.133 / 2 |" in text
    assert main(["lint-claims", str(md), "--spec", str(spec_path), "--evidence", str(ev)]) == 0
    html = tmp_path / "r.html"
    assert main(["report", str(ev), "--spec", str(spec_path), "--format", "html", "--out", str(html)]) == 0
    page = html.read_text()
    assert '<svg class="chart" data-backend="a" data-metric="client"' in page and "<h2>Load generator</h2>" in page


def test_a_bucket_whose_client_samples_were_removed_is_not_healthy(tmp_path):
    """Edited evidence: client.jsonl's lines for one bucket deleted (the manifest's hashes
    recomputed). The run measured its client elsewhere, so that bucket's health is unknown:
    client_healthy is INCONCLUSIVE naming it, never PASS."""
    import shutil

    from soakspec.evidence.io import read_json
    from soakspec.evidence.manifest import write_manifest
    from soakspec.evidence.verify import finalize_artifacts
    from soakspec.judge.evidence import load_evidence
    from soakspec.judge.joined import join
    from soakspec.judge.judge import judge_run
    from soakspec.lang import load_spec

    from runner_support import run_spec

    text = sim_spec(duration="3s", bucket="1s", follow_up=False)
    proc, out = run_spec(tmp_path, text, "--format", "json")
    rows = [json.loads(x) for x in (out / "client.jsonl").read_text().splitlines() if x.strip()]
    m = read_json(out / "manifest.json")
    lv = m["backends"][0]["levels"][0]
    first = lv["buckets"][0]
    kept = [r for r in rows if not (r["start"] < first["end"] and r["t"] > first["start"])]  # every sample of bucket 0
    assert rows and len(kept) < len(rows)
    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    (edited / "client.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    m["artifacts"] = finalize_artifacts(edited)
    write_manifest(edited, m)
    spec, _, _ = load_spec(str(tmp_path / "t.soak"))
    v = judge_run(join(spec, load_evidence(edited)))
    (health,) = [r for r in v.rules if r.rule == "client_healthy"]
    assert health.status == "inconclusive" and "no client-health sample in bucket 0" in health.message, health.message


def test_an_open_loop_sent_late_by_its_client_is_inconclusive_naming_the_schedule_lag():
    """vLLM #54101, GuideLLM #487: arrivals that waited in the client (a connection cap, a busy
    loop) before they were sent. Their latency already counts from the intended time (the
    runner's `test_an_arrival_that_waits_for_a_client_connection_is_charged_from_its_intended_time`);
    the judge must also say that the offered load was not applied: with a healthy-looking event
    loop and CPU, a bucket whose requests were sent 200 ms late is INCONCLUSIVE naming the schedule
    lag, and a latency FAIL beside it is INCONCLUSIVE, never blamed on the server."""
    text = "require p95(latency) < 1ms per bucket"
    spec = _small_spec(text, mode="open", levels="[2rps]")
    b = EvidenceBuilder(spec)
    for r in b.measured("a"):  # each sent 200 ms after its intended time, and answered as before
        for k in ("start", "first_byte", "first_token", "end"):
            if r[k] is not None:
                r[k] += 0.2
    v = judge(spec, _with_client(b.build(), lag=0.002, cpu=0.2))
    rules = {r.rule: r for r in v.rules}
    assert rules["client_healthy"].status == "inconclusive"
    assert "schedule lag p99 200 ms (limit 50 ms)" in rules["client_healthy"].message
    assert rules[text.removeprefix("require ")].status == "inconclusive"
    assert v.outcome == "INCONCLUSIVE"
    on_time = judge(spec, _with_client(EvidenceBuilder(spec).build(), lag=0.002, cpu=0.2))
    assert {r.rule: r.status for r in on_time.rules}["client_healthy"] == "pass" and on_time.outcome == "FAIL"


def _ramp_records(b: EvidenceBuilder, ramp, latency: float) -> None:
    """Replace the builder's sparse records of level 0 with what a closed-loop ramp that kept up
    sends: worker k starts when the ramp's target reaches k + 1 and sends back to back, each
    request `latency` long, until the level's end (a worker above a lowered target stops)."""
    name = "a"
    entry = b.manifest["backends"][0]["levels"][0]
    ms, length = entry["measure_start"], entry["planned_duration_s"]
    targets = ramp.targets(length) + ((length, 0),)
    edges = [bk["start"] for bk in entry["buckets"]]
    b.latency = latency
    kept = [r for r in b.records[name] if not (r["level"] == 0 and r["bucket"] >= 0)]
    for w in range(ramp.peak):
        t = None
        for (t0, n), (t1, _) in zip(targets, targets[1:]):
            if n > w and t is None:
                t = ms + t0
            if n <= w and t is not None:  # lowered below it: stops after its request
                break
        while t is not None and t + latency <= ms + length and (n > w or t < ms + t1):
            bucket = max(i for i, e in enumerate(edges) if e <= t)
            r = b.request(name, "w", 0, bucket, t, conc=ramp.peak, rate=None)
            r["worker"] = w
            kept.append(r)
            t += latency
    b.records[name] = kept


@pytest.mark.parametrize("phase", ["concurrency = 1  ramp_to = 8", "concurrency = 8  ramp_to = 1",
                                   "concurrency = 2  ramp_to = 8  steps = 3"])
def test_a_closed_ramp_that_kept_its_targets_is_a_healthy_client(phase):
    """A closed-loop ramp (a phase's `ramp_to`, k6's ramping VUs) offers its target in each bucket,
    not its peak: a load generator that kept every target (each worker busy from the moment the
    ramp reaches it) is healthy, and the reports say what each bucket offered. Held against the
    peak, every bucket before it read as a client that fell short: the run was INCONCLUSIVE."""
    from soakspec.judge.joined import join
    from soakspec.judge.testing import spec_from_text
    from soakspec.judge.validity import client_rows
    from soakspec.plan import ClosedRamp

    spec = spec_from_text(
        'soak "ramp" {}\nbackend "a" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "host-staged"\n  }\n}\n'
        f'workload "w" {{\n  load {{\n    mode = closed\n    phases {{\n      up {{ {phase}  duration = 8s }}\n    }}\n  }}\n'
        "  bucket = 1s\n  deadline = 30s\n  follow_up = false\n}\ngate {\n  require failed == 0\n}\n"
    )
    b = EvidenceBuilder(spec)
    shape = b.manifest["backends"][0]["levels"][0]["shape"]
    ramp = ClosedRamp(shape["start"], shape["end"], shape["steps"])
    _ramp_records(b, ramp, latency=0.125)
    ev = _with_client(b.build(), lag=0.002, cpu=0.2)
    health = {r.rule: r for r in judge(spec, ev).rules}["client_healthy"]
    assert health.status == "pass", health.message
    # each bucket offered the ramp's mean target over it (1 -> 8 over 8 s: about 1.4 workers in
    # the first second), never the level's `concurrency`, which is the ramp's peak
    bi = join(spec, ev).judged[0]
    rows = client_rows(bi, bi.levels[0])
    offered = [row["offered"] for row in rows]
    assert offered == pytest.approx([ramp.mean_between(k, k + 1, 8.0) for k in range(8)])
    assert min(offered) < 0.5 * ramp.peak
    assert all(row["achieved"] >= 0.75 * row["offered"] for row in rows), [(r["achieved"], r["offered"]) for r in rows]


def _closed_loop_records(b: EvidenceBuilder, backend: str, latency: float, workers: int) -> None:
    """Replace the builder's sparse records of `backend`'s first level by a closed loop's: each
    of `workers` sends its next request as its last one ends, every request `latency` long."""
    lv = b.entry(backend)["levels"][0]
    m, stop = lv["measure_start"], lv["measure_end"]
    edges = [(bk["index"], bk["start"], bk["end"]) for bk in lv["buckets"]]
    rows = []
    for _ in range(workers):
        s = m
        while s < stop:
            bucket = next(i for i, a, e in edges if a <= s < e)
            r = b.request(backend, lv["workload"], lv["index"], bucket, s, conc=workers, rate=None)
            rows.append(r | {"end": s + latency, "latency": latency})
            s += latency
    b.records[backend] = rows
    lv["sent"] = len(rows)


@pytest.mark.parametrize("on_disk", [False, True])
def test_requests_longer_than_a_bucket_keep_a_closed_loops_concurrency(tmp_path, on_disk):
    """A closed loop at concurrency 4 whose requests each last 2.5 buckets keeps 4 in flight all
    along: a healthy load generator. Its achieved concurrency counts every request running in a
    bucket, not only those that started in it or the bucket before (requests of bucket 0 still
    running in bucket 2 were left out: "achieved concurrency 2 of 4 offered", INCONCLUSIVE)."""
    spec = _small_spec("require failed == 0", levels="[4]", duration="5m", bucket="1m", follow_up=False)
    b = EvidenceBuilder(spec)
    _closed_loop_records(b, "a", latency=150.0, workers=4)
    ev = load_evidence(b.write(tmp_path / "ev")) if on_disk else b.build()
    health = {r.rule: r for r in judge(spec, _with_client(ev, lag=0.002, cpu=0.2)).rules}["client_healthy"]
    assert health.status == "pass", health.message
    # and buckets where the workers really sent nothing more are still the client's shortfall
    b2 = EvidenceBuilder(spec)
    _closed_loop_records(b2, "a", latency=150.0, workers=4)
    b2.records["a"] = [r for r in b2.records["a"] if r["start"] == b2.entry("a")["levels"][0]["measure_start"]]
    ev2 = load_evidence(b2.write(tmp_path / "ev2")) if on_disk else b2.build()
    idle = {r.rule: r for r in judge(spec, _with_client(ev2, lag=0.002, cpu=0.2)).rules}["client_healthy"]
    assert idle.status == "inconclusive" and "bucket 2: achieved concurrency 2 of 4 offered" in idle.message, idle.message


def test_a_closed_ramp_is_judged_against_what_each_bucket_offered(tmp_path):
    """A closed-loop phase ramping from 1 to 8 workers whose load generator kept every target:
    each bucket is held to the ramp's workers over that bucket (~1.9 in the first of four), not
    to its peak of 8 -- every closed ramp read "achieved concurrency 1.84 of 8 offered" and its
    run was INCONCLUSIVE. The report's "Achieved / offered" is one bucket's pair."""
    from soakspec.judge.testing import spec_from_text
    from soakspec.report import prepare

    spec = spec_from_text(
        'soak "r" {}\nbackend "a" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "host-staged"\n  }\n}\n'
        'workload "w" {\n  load {\n    mode = closed\n    phases {\n      up { concurrency = 1  ramp_to = 8  duration = 4m }\n'
        '    }\n  }\n  bucket = 1m\n  deadline = 30s\n  follow_up = false\n}\ngate {\n  require failed == 0\n}\n')
    b = EvidenceBuilder(spec)
    lv = b.entry("a")["levels"][0]
    m, stop = lv["measure_start"], lv["measure_end"]
    edges = [(bk["index"], bk["start"], bk["end"]) for bk in lv["buckets"]]
    rows = []
    for at, k in spec_ramp_targets(240.0):  # worker k - 1 starts when the target reaches k
        s = m + at
        while s < stop:
            bucket = next(i for i, a, e in edges if a <= s < e)
            rows.append(b.request("a", "w", 0, bucket, s, conc=8, rate=None) | {"end": s + 2.0, "latency": 2.0})
            s += 2.0
    b.records["a"] = rows
    lv["sent"] = len(rows)
    ev = _with_client(b.build(), lag=0.002, cpu=0.2)
    health = {r.rule: r for r in judge(spec, ev).rules}["client_healthy"]
    assert health.status == "pass", health.message
    md = prepare(spec, ev).render("md")
    client = md[md.index("### Load generator"):]
    row = next(line for line in client.splitlines() if line.startswith("| a · phase up"))
    achieved, offered = (float(x) for x in row.split("|")[6].split("/"))
    assert offered < 7.5 and achieved == pytest.approx(offered, rel=0.05), row  # one bucket's own pair, not 1.9 / 8


def spec_ramp_targets(length_s: float):
    from soakspec.plan import ClosedRamp

    pts = ClosedRamp(1, 8).targets(length_s)
    prev = 0
    for at, k in pts:
        for _ in range(prev, k):
            yield at, k
        prev = k


def test_client_cpu_is_the_event_loops_own_not_the_processs_worker_threads():
    """The CPU that says a load process is saturated is its event loop's: a trio loop runs on one
    thread. Worker threads of the same process (fsyncs, a bucket's percentiles, server.log's
    compression, which let go of the GIL) use other cores and do not make the loop late; with
    the process's CPU (all threads) an idle loop beside a busy compressor read ~100 % of a core
    and the run was INCONCLUSIVE as a saturated load generator."""
    import threading
    import zlib

    samples = []
    spun = []
    stop = threading.Event()

    def spin() -> None:  # a worker thread's CPU-bound work outside the GIL
        data = bytes(range(256)) * 4096
        t0 = time.thread_time()
        while not stop.is_set():
            zlib.compress(data, 6)
        spun.append(time.thread_time() - t0)

    async def main() -> None:
        monitor = LoopMonitor(RunClock(), samples.append, window_s=0.6)
        async with trio.open_nursery() as n:
            n.start_soon(monitor.run)
            await trio.sleep(0.8)
            n.cancel_scope.cancel()

    thread = threading.Thread(target=spin)
    t0 = time.perf_counter()
    thread.start()
    try:
        trio.run(main)
    finally:
        stop.set()
        thread.join()
    wall = time.perf_counter() - t0
    share = spun[0] / wall  # of a core, what the worker thread took
    assert share > 0.05, share  # the thread did run
    assert samples and all(s.cpu is not None and s.cpu < 0.5 * share for s in samples), ([s.cpu for s in samples], share)


def test_timeouts_beside_a_saturated_client_are_inconclusive_not_the_servers_fail():
    """A timeout is a latency past the deadline, on the client's clock from the intended start:
    an open loop 29.5 s behind its schedule (a saturated load generator) leaves its requests half
    a second of a 30 s deadline. `require timeouts == 0` FAILed the server beside client_healthy
    INCONCLUSIVE (while `p95(latency)` was INCONCLUSIVE); it is INCONCLUSIVE too, saying why.
    A healthy client sent on time and the server kept the requests 30 s: they FAIL."""
    counts = ("errors == 0", "ratio(completed) >= 99%", "goodput(output_tokens >= 1) >= 99%")
    spec = _small_spec("require timeouts == 0\nrequire p95(latency) < 2s\n" + "\n".join(f"require {c}" for c in counts),
                       mode="open", levels="[2rps]")

    def verdict(lag: float, cpu: float, late: float):
        b = EvidenceBuilder(spec, scheduled=False)  # records per_bucket apart: not the schedule's
        for r in b.records["a"][::4]:
            b.set_outcome(r, "timeout", "deadline passed")
            r.update(start=r["intended_start"] + late, end=r["intended_start"] + 30.0, latency=None, first_token=None,
                     ttft=None, tpot=None, itl=[], output_tokens=0, chunks=0)
        return judge(spec, _with_client(b.build(), lag=lag, cpu=cpu))

    v = verdict(0.3, 0.99, 29.5)
    rules = {r.rule: r for r in v.rules}
    assert rules["client_healthy"].status == "inconclusive"
    assert rules["timeouts == 0"].status == "inconclusive", rules["timeouts == 0"].message
    assert "load generator was saturated" in rules["timeouts == 0"].message
    assert "4 timed-out requests" in rules["timeouts == 0"].message  # what it measured, still said
    assert "2 requests timed out in it" in rules["client_healthy"].message  # bucket 0 of 2
    for c in counts:  # the counts that hold those timeouts: not the server's alone either
        assert rules[c].status == "inconclusive", rules[c].message
        assert "requests timed out while the load generator was saturated" in rules[c].message, rules[c].message
    assert v.outcome == "INCONCLUSIVE"
    healthy = {r.rule: r for r in verdict(0.002, 0.2, 0.001).rules}
    for c in ("timeouts == 0", *counts):
        assert healthy[c].status == "fail", healthy[c].message


# ---------------------------------------------- a saturated bucket blocks only the FAILs beside it
#
# `client_blocks`: a timing rule's FAIL is INCONCLUSIVE only where the instance that failed
# overlaps, on the run clock, a bucket in which the load generator was saturated -- whichever
# backend that bucket was of (backends running at once share the client). A FAIL elsewhere in
# the run is the server's and stands.


def _saturate(b: EvidenceBuilder, backend: str, level: int, bucket: int, lag: float = 0.3) -> None:
    """The builder's client samples (`with_client()`) whose window lies in that bucket (its
    midpoint: `ClientSamples.within`) become those of a load generator `lag` late at p99."""
    from soakspec.judge.testing import client_rows

    w = next(x for x in b.level(backend, level)["buckets"] if x["index"] == bucket)
    b.client[backend] = [client_rows(backend, r["start"], r["t"], lag=lag)[0] if w["start"] <= (r["start"] + r["t"]) / 2 < w["end"]
                         else r for r in b.client[backend]]


def _slow_ttft(b: EvidenceBuilder, backend: str, level: int, ttft: float = 2.0) -> None:
    """Every measured request of that level answered its first token `ttft` after it started."""
    for r in b.measured(backend, level):
        r.update(first_token=r["start"] + ttft, ttft=ttft, first_byte=r["start"] + ttft - 0.01, end=r["start"] + ttft + 1.0,
                 latency=ttft + 1.0)


def _rules(v):
    return {r.rule: r for r in v.rules}


def test_a_fail_in_a_level_the_saturated_bucket_is_not_in_stands():
    """The client was saturated in bucket 1 of level 0 only; level 1, minutes later, has a real
    TTFT of 2 s. `p95(ttft) < 1s per level` FAILs on level 1 and the run FAILs (exit 1): the
    saturated bucket cannot have made a failure it does not overlap. client_healthy is still
    INCONCLUSIVE, naming the bucket."""
    from soakspec.exitcodes import ExitCode

    spec = _small_spec("require p95(ttft) < 1s per level", mode="open", levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    _saturate(b, "a", 0, 1)
    _slow_ttft(b, "a", 1)
    v = judge(spec, b.build())
    rules = _rules(v)
    assert rules["client_healthy"].status == "inconclusive" and "saturated in bucket 1" in rules["client_healthy"].message
    ttft = rules["p95(ttft) < 1s per level"]
    assert ttft.status == "fail", ttft.message
    assert ttft.message.startswith("backend a, rate 4 rps"), ttft.message
    assert "not judged" not in ttft.message and "discounted" not in ttft.message
    assert v.outcome == "FAIL" and v.exit_code == ExitCode.GATE_FAILED == 1


def test_a_rule_failing_beside_and_apart_from_a_saturated_bucket_fails_naming_what_it_discounted():
    """Both levels measure a TTFT of 2 s; the client was saturated in level 0's bucket 1. Level
    0's failure may be the client's lag, level 1's cannot: the rule FAILs on level 1, counts
    one failing level, and says level 0's failure was discounted and beside which bucket."""
    spec = _small_spec("require p95(ttft) < 1s per level", mode="open", levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    _saturate(b, "a", 0, 1)
    _slow_ttft(b, "a", 0, ttft=3.0)  # the worst level is the discounted one
    _slow_ttft(b, "a", 1)
    v = judge(spec, b.build())
    ttft = _rules(v)["p95(ttft) < 1s per level"]
    assert ttft.status == "fail", ttft.message
    assert ttft.message.startswith("backend a, rate 4 rps: p95(ttft) = 2s"), ttft.message
    assert "discounted" in ttft.message and "backend a, rate 2 rps" in ttft.message, ttft.message
    assert "bucket 1" in ttft.message, ttft.message  # the saturated bucket it overlaps
    assert ttft.failing == 1 and [d.where.level for d in ttft.details] == [1]
    assert ttft.where.level == 1 and ttft.observed == pytest.approx(2.0)
    assert v.outcome == "FAIL"


def test_a_fail_in_the_saturated_buckets_level_is_inconclusive_naming_that_bucket():
    """The client was saturated in level 0's bucket 0 and level 1's bucket 1; only level 1 has
    a TTFT over the limit. Its FAIL overlaps a saturated bucket: INCONCLUSIVE as before, and the
    message names the bucket it overlaps (level 1's), not the other level's."""
    spec = _small_spec("require p95(ttft) < 1s per level", mode="open", levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    _saturate(b, "a", 0, 0)
    _saturate(b, "a", 1, 1)
    _slow_ttft(b, "a", 1)
    v = judge(spec, b.build())
    ttft = _rules(v)["p95(ttft) < 1s per level"]
    assert ttft.status == "inconclusive", ttft.message
    assert ttft.message.startswith("not judged, the load generator was saturated (backend a, rate 4 rps, bucket 1 ["), ttft.message
    assert "2 rps" not in ttft.message.split("; it measured:")[0], ttft.message
    assert "it measured: backend a, rate 4 rps: p95(ttft) = 2s" in ttft.message, ttft.message
    assert v.outcome == "INCONCLUSIVE"


def test_a_bucket_without_a_completed_request_beside_a_saturated_client_is_not_a_coverage_fail():
    """An open loop the load generator could not keep (3,000 req/s from one process: schedule
    lag 6 s) sent its arrivals past their 5 s deadline, every one of bucket 1's timed out, and
    `require bucket_coverage` FAILed the run (exit 1) on "no completed request (of 9000
    measured) in the bucket" -- the client's lag, not the server's, and it hid every
    performance rule as not evaluated. A bucket that measured nothing beside a saturated
    client is INCONCLUSIVE, as a timing FAIL there is; apart from one it still FAILs."""
    spec = _small_spec("require bucket_coverage\n  require p95(ttft) < 5s per level", mode="open", levels="[2rps, 4rps]")

    def timed_out(b: EvidenceBuilder) -> EvidenceBuilder:
        for r in b.measured("a", 0, 1):
            b.set_outcome(r, "timeout", "deadline passed before the response finished")
        return b

    b = timed_out(EvidenceBuilder(spec).with_client())
    _saturate(b, "a", 0, 1)
    v = judge(spec, b.build())
    cov = _rules(v)["bucket_coverage"]
    assert cov.status == "inconclusive", cov.message
    assert "load generator was saturated" in cov.message and "bucket 1" in cov.message, cov.message
    assert _rules(v)["p95(ttft) < 5s per level"].status != "not_evaluated"  # no FAIL hides the performance rules
    assert v.outcome == "INCONCLUSIVE"

    apart = timed_out(EvidenceBuilder(spec).with_client())
    _saturate(apart, "a", 1, 1)  # saturated minutes later, in the other level
    v = judge(spec, apart.build())
    assert _rules(v)["bucket_coverage"].status == "fail" and v.outcome == "FAIL"


def test_a_per_run_fail_covers_the_whole_run_and_a_saturated_bucket_in_it_blocks_it():
    """A per-run rule's instance spans every bucket: the saturated bucket of level 0 overlaps it,
    so `p95(ttft) < 1s` (per run) is INCONCLUSIVE, although the slow requests are level 1's;
    the per-level rule on the same figures FAILs on level 1 -- and the run FAILs."""
    spec = _small_spec("require p95(ttft) < 1s\nrequire p95(ttft) < 1s per level", mode="open", levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    _saturate(b, "a", 0, 1)
    _slow_ttft(b, "a", 1)
    v = judge(spec, b.build())
    rules = _rules(v)
    run_rule = rules["p95(ttft) < 1s"]
    assert run_rule.status == "inconclusive", run_rule.message
    assert run_rule.message.startswith("not judged, the load generator was saturated (backend a, rate 2 rps, bucket 1 ["), run_rule.message
    assert rules["p95(ttft) < 1s per level"].status == "fail", rules["p95(ttft) < 1s per level"].message
    assert v.outcome == "FAIL"


def test_a_saturated_bucket_of_one_backend_blocks_only_that_backends_time():
    """Two backends one after the other: the client was saturated in a bucket of backend a.
    `per backend`, a's failure overlaps it (its span holds every bucket of a) and is discounted;
    b's, later, stands: FAIL on b. A per-run rule `on "b"` spans b's buckets only: it FAILs;
    one on a is INCONCLUSIVE."""
    rules = 'require p95(ttft) < 1s per backend\nrequire p95(ttft) < 1s on "b"\nrequire p95(ttft) < 1s on "a"'
    spec = _small_spec(rules, mode="open", levels="[2rps]", backends=("a", "b"))
    b = EvidenceBuilder(spec).with_client()
    _saturate(b, "a", 0, 1)
    _slow_ttft(b, "a", 0)
    _slow_ttft(b, "b", 0)
    v = judge(spec, b.build())
    ttft = _rules(v)["p95(ttft) < 1s per backend"]
    assert ttft.status == "fail", ttft.message
    assert ttft.message.startswith("backend b"), ttft.message
    assert "discounted" in ttft.message and "backend a" in ttft.message, ttft.message
    on = {r.rule: r for r in v.rules if r.rule.startswith("p95(ttft) < 1s on")}
    assert [r.status for r in on.values()] == ["fail", "inconclusive"], {k: r.message for k, r in on.items()}
    assert v.outcome == "FAIL"


def _run_beside(b: EvidenceBuilder, backend: str, other: str) -> None:
    """Move `backend`'s whole evidence back in time so that it ran beside `other` (their first
    levels start together), as backends run at once sharing one load generator."""
    dt = b.entry(backend)["levels"][0]["started_at"] - b.entry(other)["levels"][0]["started_at"]
    for lv in b.entry(backend)["levels"]:
        for k in ("started_at", "measure_start", "measure_end", "drained_at"):
            lv[k] -= dt
        for w in lv["buckets"]:
            w["start"] -= dt
            w["end"] -= dt
    for r in b.records[backend]:
        for k in ("intended_start", "start", "first_byte", "first_token", "end"):
            if r.get(k) is not None:
                r[k] -= dt
    fu = b.followups[backend].get("record")
    if fu is not None:
        for k in ("intended_start", "start", "first_byte", "first_token", "end"):
            if fu.get(k) is not None:
                fu[k] -= dt
    for t in b.traces[backend]:
        t["times"] = [x - dt for x in t["times"]]
        t["payload"]["queued"] -= dt
    for s in b.telemetry[backend]:
        s["t"] -= dt
    for c in b.client[backend]:
        c["start"] = round(c["start"] - dt, 6)
        c["t"] = round(c["t"] - dt, 6)


def test_backends_running_at_once_share_the_client_a_saturated_bucket_of_one_blocks_the_other():
    """Backends a and b ran at the same time; the client was saturated in a's bucket 1. b's TTFT
    FAIL per bucket in that same minute may be the shared client's lag (INCONCLUSIVE); b's
    FAIL in bucket 0, before it, stands. Overlap is by time, not by backend name."""
    spec = _small_spec("require p95(ttft) < 1s per bucket", mode="open", levels="[2rps]", backends=("a", "b"))
    b = EvidenceBuilder(spec).with_client()
    _run_beside(b, "b", "a")
    _saturate(b, "a", 0, 1)
    for r in b.measured("b", 0, 1):
        r.update(first_token=r["start"] + 2.0, ttft=2.0)
    v = judge(spec, b.build())
    rules = _rules(v)
    assert rules["completed_run"].status == "pass", rules["completed_run"].message  # moved whole: a run as it ran
    ttft = rules["p95(ttft) < 1s per bucket"]
    assert ttft.status == "inconclusive", ttft.message
    assert "backend a, rate 2 rps, bucket 1" in ttft.message and "it measured: backend b, rate 2 rps, bucket 1" in ttft.message, ttft.message
    # the same slow minute of b in its bucket 0, beside a's healthy bucket 0: the server's FAIL
    b2 = EvidenceBuilder(spec).with_client()
    _run_beside(b2, "b", "a")
    _saturate(b2, "a", 0, 1)
    for r in b2.measured("b", 0, 0):
        r.update(first_token=r["start"] + 2.0, ttft=2.0)
    v2 = judge(spec, b2.build())
    ttft2 = _rules(v2)["p95(ttft) < 1s per bucket"]
    assert ttft2.status == "fail" and ttft2.message.startswith("backend b, rate 2 rps, bucket 0"), ttft2.message
    assert v2.outcome == "FAIL"


def test_errors_apart_from_the_bucket_where_requests_timed_out_beside_a_saturated_client_fail():
    """Requests timed out in level 0's bucket 0 while the client was saturated: `errors == 0
    per level` may not blame level 0's errors on the server (INCONCLUSIVE before, for every
    level). Level 1's HTTP 500s, minutes later, are the server's: the rule FAILs on level 1 and
    says level 0's count was discounted."""
    spec = _small_spec("require errors == 0 per level", mode="open", levels="[2rps, 4rps]")
    b = EvidenceBuilder(spec).with_client()
    _saturate(b, "a", 0, 0)
    for r in list(b.measured("a", 0, 0))[::4]:
        b.set_outcome(r, "timeout", "deadline passed")
    for r in list(b.measured("a", 1, 1))[::4]:
        b.set_outcome(r, "failed", "HTTP 500: boom", status=500)
    v = judge(spec, b.build())
    rules = _rules(v)
    assert "timed out in it" in rules["client_healthy"].message
    errors = rules["errors == 0 per level"]
    assert errors.status == "fail", errors.message
    assert "4 rps" in errors.message.split(";")[0] and "discounted" in errors.message, errors.message
    assert v.outcome == "FAIL"


def test_a_timing_abort_beside_another_backends_saturated_bucket_is_inconclusive_and_apart_from_it_fails():
    """Backends a and b ran at once; the client was saturated in a's bucket 1. An `abort
    p95(ttft) > 500ms per bucket` that fired on b's bucket 1 fired on figures the shared
    client's lag was in: INCONCLUSIVE, naming a's bucket (it only looked at b's own buckets
    before, and FAILed). Fired on b's bucket 0, before the client fell behind: a FAIL."""
    spec = _small_spec("require failed == 0", mode="open", levels="[2rps]", backends=("a", "b"))

    def abort_on(bucket: int):
        b = EvidenceBuilder(spec).with_client()
        _run_beside(b, "b", "a")
        _saturate(b, "a", 0, 1)
        w = b.level("b", 0)["buckets"][bucket]
        b.manifest["aborts"] = [{"rule": "abort p95(ttft) > 500ms per bucket", "builtin": False, "metric": "ttft", "op": ">",
                                 "threshold": 0.5, "observed": 1.1, "requests": 40, "backend": "b", "workload": "w",
                                 "level": 0, "level_label": "rate 2 rps", "scope": "bucket", "index": bucket,
                                 "start": w["start"], "end": w["end"], "at": w["end"] + 1.0}]  # fmt: skip
        v = judge(spec, b.build())
        (r,) = [r for r in v.rules if r.metric == "abort_fired"]
        return v, r

    v, r = abort_on(1)
    assert r.status == "inconclusive", r.message
    assert "load generator was saturated in bucket 1 of backend a, rate 2 rps" in r.message, r.message
    assert v.outcome == "INCONCLUSIVE"
    v, r = abort_on(0)
    assert r.status == "fail" and "saturated" not in r.message, r.message


def test_a_failure_past_the_ten_listed_still_stands_when_only_it_is_apart_from_the_saturated_buckets():
    """Twelve one-minute buckets all fail `p95(ttft) < 1s per bucket`; the client was saturated
    in the first eleven. The verdict lists ten failing instances, but the one that decides is
    the twelfth: it overlaps no saturated bucket, so the rule FAILs on it (every failing
    instance is weighed, not only those listed), discounting the other eleven."""
    spec = _small_spec("require p95(ttft) < 1s per bucket", mode="open", levels="[2rps]", duration="12m")
    b = EvidenceBuilder(spec).with_client()
    for k in range(11):
        _saturate(b, "a", 0, k)
    _slow_ttft(b, "a", 0)
    v = judge(spec, b.build())
    ttft = _rules(v)["p95(ttft) < 1s per bucket"]
    assert ttft.status == "fail", ttft.message
    assert ttft.message.startswith("backend a, rate 2 rps, bucket 11 ["), ttft.message
    assert "11 failing buckets discounted" in ttft.message and "... and 6 more" in ttft.message, ttft.message
    assert ttft.failing == 1 and v.outcome == "FAIL"
