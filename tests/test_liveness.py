"""A backend's liveness during the run, pre-flight, and crash diagnosis (issue 16).

Real processes and sockets for the run-level cases: a backend that stops answering mid-run --
a launched server whose port goes dead while its process lives on, and an external (`url`)
simulator whose process group the test SIGKILLs -- must abort the run (exit 4) within seconds,
with the reason and the time in the manifest, the buckets after it missing, and fewer than 100
connection-refused records (the load backs off). The admission gate itself is tested in
virtual time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from runner_support import (manifest, new_marker, requests_of, run_env, run_spec, server_log_bytes, sim_spec, soakspec_cmd,
                            wait_no_survivors)
from soakspec.evidence.io import iter_jsonl
from soakspec.plan import Liveness
from soakspec.runner.clock import RunClock
from soakspec.runner.liveness import Health
from soakspec.runner.procs import crash_lines, free_port
from soakspec.runner.records import Outcome, RequestRecord
from test_faults import NO_ABORT, SIM_BLOCK, launch_spec, misbehaving

PY = sys.executable


def _refused(clock: RunClock) -> RequestRecord:
    rec = RequestRecord("r", outcome=Outcome.DISCONNECTED, error="connect failed: connection refused (econnrefused)")
    rec.start = rec.end = clock.now()
    return rec


def _answered(clock: RunClock) -> RequestRecord:
    rec = RequestRecord("r", outcome=Outcome.COMPLETED)
    rec.start = rec.first_byte = rec.end = clock.now()
    return rec


# ------------------------------------------------------------------ the admission gate (virtual time)


async def test_after_a_refusal_requests_back_off_and_one_at_a_time_tries_again(autojump_clock) -> None:
    """Property of the gate: while the backend refuses, at most one request is in flight (the
    scout), each after the backoff (doubling from 50 ms up to 1 s); the first answer opens the
    gate for everyone."""
    clock = RunClock(timer=trio.current_time)
    health = Health(clock, Liveness(backoff_base_s=0.05, backoff_max_s=1.0))
    starts: list[float] = []
    answer_after = 6  # the server comes back after this many refused attempts

    async def worker() -> None:
        for _ in range(3):
            scout = await health.admit() if health.refusals else False
            starts.append(trio.current_time())
            await trio.sleep(0.001)
            health.observe(_answered(clock) if len(starts) > answer_after else _refused(clock))
            if scout:
                health.scouted()

    health.observe(_refused(clock))  # the first refusal
    async with trio.open_nursery() as n:
        for _ in range(8):
            n.start_soon(worker)
    refused_starts = starts[: answer_after + 1]
    gaps = [b - a for a, b in zip(refused_starts, refused_starts[1:])]
    assert health.refusals == 0
    assert all(g >= 0.05 - 1e-9 for g in gaps), gaps  # never hammering
    assert gaps == sorted(gaps) and max(gaps) <= 1.0 + 0.01  # doubling, capped
    assert len(starts) == 24  # every request ran once the server answered again


async def test_the_gate_is_open_while_the_backend_answers(autojump_clock) -> None:
    clock = RunClock(timer=trio.current_time)
    health = Health(clock)
    health.observe(_answered(clock))
    t0 = trio.current_time()
    assert await health.admit() is False
    assert trio.current_time() == t0


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


# ------------------------------------------------------------------ one probe


async def test_a_probe_on_a_connection_the_server_closed_while_idle_is_sent_again_once() -> None:
    """A liveness probe on a kept-alive connection the server closes as the probe is sent (its
    keep-alive timeout racing the probe interval) is not a refused connect -- the server never
    saw it: a GET goes again once on a new connection, as the /metrics scrape's does. A server
    that drops every request is asked twice a probe and refuses; a POST probe is sent once."""
    import functools

    import httpx

    from runner_support import drops_every_request, keep_alive_once
    from soakspec.plan import Launch, Probe
    from soakspec.runner.liveness import probe_once

    def launch(method: str) -> Launch:
        return Launch("b", "url", None, "http://127.0.0.1", (), None, Probe(method, "/health", 200, 10.0, 0.5), 5.0, 5.0, False)

    seen = {"requests": 0}
    async with trio.open_nursery() as nursery:
        (good,) = await nursery.start(functools.partial(trio.serve_tcp, keep_alive_once(seen, b"ok"), 0, host="127.0.0.1"))
        (bad,) = await nursery.start(functools.partial(trio.serve_tcp, drops_every_request(seen), 0, host="127.0.0.1"))
        with trio.fail_after(20):
            async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
                url = f"http://127.0.0.1:{good.socket.getsockname()[1]}"
                probes = [await probe_once(http, launch("GET"), url) for _ in range(3)]
                assert seen["requests"] == 5  # the first; then each later one dropped once, then sent again
                dead_url = f"http://127.0.0.1:{bad.socket.getsockname()[1]}"
                seen["requests"] = 0
                dead = await probe_once(http, launch("GET"), dead_url)
                assert seen["requests"] == 2
                seen["requests"] = 0
                posted = await probe_once(http, launch("POST"), dead_url)
                assert seen["requests"] == 1  # not idempotent: never sent twice
        nursery.cancel_scope.cancel()
    assert probes == [("ok", "HTTP 200")] * 3, probes
    assert dead[0] == "refused" and "disconnected" in dead[1].lower(), dead
    assert posted[0] == "refused", posted


# ------------------------------------------------------------------ a backend that dies mid-run


def _assert_aborted_for_liveness(proc, out: Path, took: float) -> None:
    assert proc.returncode == 4, proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted"
    assert "stopped answering" in m["incomplete_reason"], m["incomplete_reason"]
    assert "connection refused" in m["incomplete_reason"], m["incomplete_reason"]
    (b,) = m["backends"]
    assert b["aborted_reason"] is not None and b["aborted_at"] is not None and m["aborted_at"] == b["aborted_at"]
    (lv,) = b["levels"]
    assert lv["completed"] is False  # the level's later buckets are missing: the gate can never PASS
    rows = requests_of(out)
    refused = [r for r in rows if (r["error"] or "").startswith("connect failed")]
    assert len(refused) < 100, len(refused)
    assert any(r["outcome"] == "completed" for r in rows)
    assert all(r["start"] <= b["aborted_at"] for r in rows)
    assert took < 25, took  # seconds after the death, not the level's 60 s


# waits out the 5 s liveness grace of real server processes: the slow lane
@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_launched_backend_whose_port_goes_dead_aborts_the_run(tmp_path, workers):
    """The process lives on, its port refuses connections (an API server whose engine died): the
    liveness watch aborts after its 5 s grace; the load backs off meanwhile (in each `--workers`
    process too)."""
    spec = launch_spec(misbehaving("ok", "--stop-answering-after", "1.5"), load="mode = closed\n    concurrency = [8]",
                       duration="60s", bucket="2s", follow_up=False)  # fmt: skip
    t0 = time.monotonic()
    proc, out = run_spec(tmp_path, spec, "--workers", workers)
    _assert_aborted_for_liveness(proc, out, time.monotonic() - t0 - 1.5)
    assert "engine died" in server_log_bytes(out / "backends" / "b0").decode()


# waits out the 5 s liveness grace of real server processes: the slow lane
@pytest.mark.slow
def test_a_backend_that_answers_only_errors_fails_its_probe_and_aborts(tmp_path):
    """An API server that stays up after its engine died: every request -- and the readiness
    probe -- is an HTTP 500. Those 500s are answers, not signs of life: after the grace of a
    failing probe the run aborts, saying the probe failed."""
    # the built-in abort (every request of a bucket unsuccessful) would stop it first: off here,
    # so that the liveness probe is what ends the run
    spec = launch_spec(misbehaving("ok", "--fail-after", "1.5"), load="mode = closed\n    concurrency = [2]",
                       duration="60s", bucket="2s", follow_up=False, gate=NO_ABORT)  # fmt: skip
    t0 = time.monotonic()
    proc, out = run_spec(tmp_path, spec)
    assert proc.returncode == 4, proc.stderr
    assert time.monotonic() - t0 < 25
    m = manifest(out)
    assert m["status"] == "aborted"
    assert "failing its readiness probe: GET /v1/models: HTTP 500 (expected 200) for 5s" in m["incomplete_reason"]
    rows = requests_of(out)
    assert {"completed", "failed"} <= {r["outcome"] for r in rows}
    assert {r["error"] for r in rows if r["outcome"] == "failed"} == {
        "HTTP 500: " + '{"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause."}}'}
    # the load backed off once FAIL_STREAK requests in a row had failed: a few tries a second
    # through the 5 s grace, not a closed loop resending each 500 at once (thousands)
    assert sum(r["outcome"] == "failed" for r in rows) < 100
    assert all(r["start"] <= m["aborted_at"] + 1.0 for r in rows)  # the load stopped with the abort
    # the worker not scouting waited at the backoff gate, and the client samples say so: the
    # concurrency the server's failures held down is not read as the client's saturation
    samples = [json.loads(line) for line in (out / "client.jsonl").read_text().splitlines()]
    assert sum(r["held_s"] for r in samples) > 1.0, samples
    verdict = json.loads((out / "verdict.json").read_text())
    (health,) = [r for r in verdict["rules"] if r["rule"] == "client_healthy"]
    assert "achieved concurrency" not in json.dumps(health), health


CLOSED_8 = "mode = closed\n    concurrency = [8]"
OPEN_200 = "mode = open\n    rate = [200rps]"


# waits out the 5 s liveness grace of real server processes: the slow lane
@pytest.mark.slow
@pytest.mark.parametrize("load", [CLOSED_8, OPEN_200], ids=["closed", "open"])
def test_an_external_backend_killed_mid_run_aborts_the_run(tmp_path, load):
    """A `url` backend: a simulator the test started itself, SIGKILLed (its process group) once
    requests flow. Exit 4 within seconds, aborted with the reason and time, < 100 refused records.
    Whatever the load mode: an open loop's 1 s buckets fill with held-back arrivals, so the
    built-in abort ("a whole bucket, none completed") sees the death before the liveness
    watch's 5 s grace -- and ended the run as a gate FAIL (exit 1) whose message never said the
    connections were refused. A server that is gone aborts the run (exit 4) with the same
    reason whichever saw it, and is not sent to once it is known dead."""
    port = free_port()
    port_file = tmp_path / "port"
    sim = subprocess.Popen(
        [PY, "-m", "soakspec", "sim", "--port", str(port), "--port-file", str(port_file), "--model", "default",
         "--ttft", "20ms", "--itl", "5ms"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert port_file.exists(), "the simulator did not start"
        text = sim_spec(load=load, duration="60s", bucket="2s" if load == CLOSED_8 else "1s", follow_up=False)
        text = text.replace(SIM_BLOCK, f'url = "http://127.0.0.1:{port}"', 1)
        spec = tmp_path / "t.soak"
        spec.write_text(text)
        out = tmp_path / "ev"
        marker = new_marker()
        runner = subprocess.Popen(soakspec_cmd("run", str(spec), "--out", str(out), "--quiet"), cwd=tmp_path,
                                  env=run_env(marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        req = out / "backends" / "b0" / "requests.jsonl.gz"
        deadline = time.monotonic() + 30
        while not (req.exists() and req.stat().st_size > 2000) and time.monotonic() < deadline:
            assert runner.poll() is None, runner.communicate()
            time.sleep(0.05)
        os.killpg(sim.pid, signal.SIGKILL)
        killed, killed_at = time.monotonic(), time.time()
        _, err = runner.communicate(timeout=60)
        took = time.monotonic() - killed
        assert wait_no_survivors(marker) == []
    finally:
        if sim.poll() is None:
            os.killpg(sim.pid, signal.SIGKILL)
        sim.wait(timeout=10)
    runner.stderr = err  # type: ignore[misc]
    _assert_aborted_for_liveness(runner, out, took)
    assert "[b0] stopped answering" in err and "stopping its load" in err
    m = manifest(out)
    assert m["aborts"] == [], m["aborts"]  # the backend's death, not a gate rule's failure
    assert re.search(r"^backend 'b0': stopped answering: (GET /v1/models: )?connection refused \(econnrefused\) for "
                     r"[0-9.]+s \(no sign of life since \d\d:\d\d:\d\d\.\d{3} UTC\)", m["incomplete_reason"]), m["incomplete_reason"]
    if load == OPEN_200:  # the built-in abort saw it first, and says what its bucket's requests were
        assert "; the built-in abort saw it first, at bucket " in m["incomplete_reason"], m["incomplete_reason"]
        assert re.search(r"\d+ requests, none completed: \d+ held back \(connections refused\)", m["incomplete_reason"])
    # a dead server is not hammered: once it refused, arrivals were held back, few were sent
    sent_after = [r for r in requests_of(out) if r["start"] > killed_at + 0.2 and not (r["error"] or "").startswith("held back")]
    assert len(sent_after) < 40, len(sent_after)


# waits for the liveness abort of a real server process: the slow lane
@pytest.mark.slow
@pytest.mark.parametrize("load", ["mode = closed\n    concurrency = [64]", OPEN_200], ids=["closed", "open"])
def test_a_port_closed_after_the_preflight_aborts_the_run_in_either_load_mode(tmp_path, load):
    """The server answers the pre-flight request and its port closes at once (the process lives
    on): every request of the level is refused. A closed loop's 64 workers all connect at the
    level's start, an open loop's arrivals are held back after the first refusals: either way
    bucket 0 is a whole bucket, none completed, and the built-in abort fired there -- a gate FAIL
    (exit 1) whose message said nothing of refused connections, where the liveness watch (its
    5 s grace not yet run) would have called the server dead. A server that is gone is a run
    abort (exit 4), the same reason whichever detector saw it, and is not hammered meanwhile."""
    spec = launch_spec(misbehaving("ok", "--stop-answering-after-requests", "1"), load=load, duration="60s", bucket="1s",
                       follow_up=False)  # fmt: skip
    t0 = time.monotonic()
    proc, out = run_spec(tmp_path, spec)
    assert proc.returncode == 4, proc.stderr
    assert time.monotonic() - t0 < 25
    m = manifest(out)
    assert m["status"] == "aborted" and m["aborts"] == [], m["aborts"]
    reason = m["incomplete_reason"]
    assert re.match(r"backend 'b0': stopped answering: (GET /v1/models: )?connection refused \(econnrefused\) for [0-9.]+s "
                    r"\(no sign of life since (the run began|\d\d:\d\d:\d\d\.\d{3} UTC)\)", reason), reason
    assert "none completed" in reason and "connection refused" in reason.split("none completed")[-1], reason
    assert "engine died" in server_log_bytes(out / "backends" / "b0").decode()
    rows = requests_of(out)
    assert rows and not any(r["outcome"] == "completed" for r in rows)
    sent = [r for r in rows if not (r["error"] or "").startswith("held back")]
    assert len(sent) < 100, len(sent)  # the first connects of each worker, then a scout a few times a second
    assert all(r["start"] <= m["aborted_at"] for r in rows)


# ------------------------------------------------------------------ pre-flight


CHAT_WORKLOAD = "  endpoint = chat\n"


def _chat(spec_text: str) -> str:
    return spec_text.replace('workload "w" {\n', 'workload "w" {\n' + CHAT_WORKLOAD, 1)


def test_a_chat_workload_the_server_refuses_stops_before_the_soak(tmp_path):
    """vLLM without a chat template answers every chat request 400: the pre-flight request
    fails, the run stops before the first level (exit 4) with the server's own message on
    stderr, and fewer than 10 requests were sent."""
    spec = _chat(launch_spec(misbehaving("ok", "--chat-template-error"), duration="30s", bucket="10s"))
    t0 = time.monotonic()
    proc, out = run_spec(tmp_path, spec)
    assert proc.returncode == 4, proc.stderr
    assert time.monotonic() - t0 < 20
    assert "pre-flight request of workload 'w' rejected: HTTP 400" in proc.stderr
    assert "default chat template is no longer allowed" in proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and m["preflight"] is True
    (b,) = m["backends"]
    assert b["levels"] == [] and requests_of(out) == []
    (pf,) = b["preflight"]
    assert pf["workload"] == "w" and pf["passed"] is False and pf["record"]["status"] == 400
    log = server_log_bytes(out / "backends" / "b0").decode()
    assert log.count("chat request refused") < 10


def test_no_preflight_skips_it_and_says_so(tmp_path):
    """`--no-preflight`: the same refusing server gets its soak (every request rejected, the run
    completes) and the manifest records that no pre-flight ran."""
    # every request is rejected on purpose: the built-in abort is off so that each keeps its outcome
    spec = _chat(launch_spec(misbehaving("ok", "--chat-template-error"), duration="1s", bucket="1s", gate=NO_ABORT))
    proc, out = run_spec(tmp_path, spec, "--no-preflight")
    assert proc.returncode != 4, proc.stderr
    m = manifest(out)
    assert m["status"] == "complete" and m["preflight"] is False
    assert m["backends"][0]["preflight"] is None
    rows = requests_of(out)
    assert rows and {r["outcome"] for r in rows} == {"rejected"}


def test_a_passing_preflight_is_recorded_and_stays_out_of_the_requests(tmp_path):
    proc, out = run_spec(tmp_path, sim_spec(duration="1s", bucket="1s", follow_up=False))
    assert proc.returncode in (0, 3), proc.stderr
    (b,) = manifest(out)["backends"]
    (pf,) = b["preflight"]
    assert pf["passed"] is True and pf["record"]["outcome"] == "completed"
    ids = {r["request_id"] for r in requests_of(out)}
    assert pf["record"]["request_id"] not in ids
    traces = [row for _, row in iter_jsonl(out / "backends" / "b0" / "traces.jsonl.gz")]
    assert len(traces) == len(ids), "the pre-flight's trace is not listed as an unmatched trace"


# ------------------------------------------------------------------ crash diagnosis


def test_crash_lines_find_the_cause_under_request_log_noise(tmp_path):
    """vLLM's worker death buried under request-log lines (access lines of 500s included): the
    cause lines are found, in order, and the noise is not among them."""
    log = tmp_path / "server.log"
    noise = [f'INFO:     127.0.0.1:4{i:04d} - "POST /v1/completions HTTP/1.1" 200 OK' for i in range(400)]
    cause = [
        "ERROR 12-01 10:00:00 [core.py:1] EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        "RuntimeError: Worker proc VllmWorker-0 died unexpectedly (exit code: -9)",
    ]
    tail = [f'INFO:     127.0.0.1:5{i:04d} - "POST /v1/completions HTTP/1.1" 500 Internal Server Error' for i in range(100)]
    log.write_text("\n".join(noise[:200] + cause + noise[200:] + tail) + "\n")
    found = crash_lines(log)
    assert found == tuple(cause)


@pytest.mark.parametrize("cause", [
    "thread 'main' panicked at src/scheduler.rs:212:37:",  # a Rust server (pegainfer, TGI's router)
    "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
    "Segmentation fault",  # the shell's word for SIGSEGV when it does not dump core
    "soakspec-sim: simulated crash: 2s after listening (--crash-after)",
])  # fmt: skip
def test_crash_lines_find_a_panic_a_segfault_and_a_crash(tmp_path, cause):
    """A Rust server's panic (its last words: "thread 'main' panicked at ...", then the
    backtrace note), a segfault said as "Segmentation fault", or "crash" under
    the server's trace lines: none was a cause line, so the manifest's crash_diagnosis was empty
    and stderr showed only the 40-line tail, which trace or access lines can fill before it."""
    log = tmp_path / "server.log"
    noise = [f'INFO:     127.0.0.1:4{i:04d} - "POST /v1/completions HTTP/1.1" 200 OK' for i in range(100)]
    log.write_text("\n".join(noise + [cause] + noise) + "\n")
    assert crash_lines(log) == (cause,)


def test_a_crash_shows_the_cause_first_and_records_it(tmp_path):
    """The server dies after printing its cause and then 60 lines of noise: stderr shows the
    cause lines (before the 40-line tail, which no longer holds them), and the manifest keeps
    them."""
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, sys, threading, time\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent / 'misbehaving')!r})\n"
        "import server\n"
        "def die():\n"
        "    time.sleep(1.0)\n"
        "    print('RuntimeError: Worker proc VllmWorker-0 died unexpectedly (exit code: -9)', flush=True)\n"
        "    for i in range(60):\n"
        "        print(f'INFO: request {i} finished', flush=True)\n"
        "    os._exit(1)\n"
        "threading.Thread(target=die, daemon=True).start()\n"
        "sys.exit(server.main())\n"
    )
    spec = launch_spec([PY, str(script), "--port", "{port}", "--mode", "ok"], duration="30s", bucket="10s", follow_up=False)
    proc, out = run_spec(tmp_path, spec)
    assert proc.returncode == 4, proc.stderr
    head, _, tail = proc.stderr.partition("last lines of b0's log:")
    assert "look like the cause:\nRuntimeError: Worker proc VllmWorker-0 died unexpectedly (exit code: -9)" in head
    assert "died unexpectedly" not in tail
    (b,) = manifest(out)["backends"]
    assert "RuntimeError: Worker proc VllmWorker-0 died unexpectedly (exit code: -9)" in b["crash_diagnosis"]
