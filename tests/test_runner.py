"""`soakspec run` for real: the simulator as a real server process, real sockets, real signals.

Every test marks its runner's environment so that any process the run started (servers,
the reaper) can be found afterwards: no test may leave one behind.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner_support import (
    REPO,
    manifest,
    new_marker,
    read_jsonl,
    requests_of,
    run_env,
    run_soakspec,
    run_spec,
    sim_spec,
    soakspec_cmd,
    wait_no_survivors,
)


def _write(tmp_path: Path, text: str, name: str = "t.soak") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------ lifecycle


@pytest.mark.slow
def test_demo_spec_runs_end_to_end_and_leaves_no_server(tmp_path):
    """The README's quick start: servers start, progress shows, evidence is written, the
    verdict is a pass -- or, on a machine whose CPUs other work takes (#17), INCONCLUSIVE for
    the load generator's health alone, never FAIL -- and no server outlives the run."""
    marker = new_marker()
    out = tmp_path / "ev"
    proc = run_soakspec(["run", str(REPO / "specs" / "demo.soak"), "--out", str(out)], marker, tmp_path, timeout=240)
    assert wait_no_survivors(marker) == []
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    if proc.returncode == 3:
        verdict = json.loads((out / "verdict.json").read_text())
        undecided = {r["rule"] for r in verdict["rules"] if r["severity"] == "require" and r["status"] != "pass"}
        assert undecided <= {"client_healthy", "p95(ttft) < 1s per level", "mean(itl) < 50ms"}, verdict
        assert "client_healthy" in undecided
    assert "ready after" in proc.stderr and "bucket 0 done (1 of 2)" in proc.stderr  # plain progress lines
    m = manifest(out)
    assert m["status"] == "complete"
    assert [b["name"] for b in m["backends"]] == ["sim-fast", "sim-slow"]
    for b in m["backends"]:
        assert b["exit_status"] is not None, "the server was stopped and reaped"
        for f in ("requests.jsonl.gz", "buckets.jsonl", "traces.jsonl.gz", "telemetry.jsonl", "followup.json", "server.log.gz"):
            assert (out / "backends" / b["safe_name"] / f).is_file()
    assert m["backends"][0]["runtime_boundary"]["status"] == "confirmed"


def test_backend_crash_mid_run_aborts_with_partial_evidence(tmp_path):
    """A server that dies mid-run stops the run cleanly: exit 4, the exit status and the log
    tail on stderr, the evidence so far kept and marked aborted."""
    spec = sim_spec(sim="ttft = 10ms\n    itl = 2ms\n    crash_after_requests = 12", duration="5s")
    proc, out = run_spec(tmp_path, spec)
    assert proc.returncode == 4, proc.stderr
    assert "exited with status 3" in proc.stderr
    assert "last lines of b0's log" in proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted"
    assert "b0" in m["incomplete_reason"]
    rows = requests_of(out)
    completed = [r for r in rows if r["outcome"] == "completed"]
    assert len(completed) >= 10, "records written before the crash are kept"
    assert any(r["outcome"] != "completed" for r in rows), "requests cut by the crash are recorded"
    first_failure = min(r["end"] for r in rows if r["outcome"] != "completed")
    assert max(r["end"] for r in rows) - first_failure < 1.0, "the run stops as soon as the server dies"


def test_command_not_found_aborts_before_load(tmp_path):
    spec = sim_spec().replace("sim {\n    ttft = 20ms\n    itl = 5ms\n  }", 'launch = ["./no-such-server", "--port", "{port}"]')
    proc, out = run_spec(tmp_path, spec)
    assert proc.returncode == 4
    assert "command not found: ./no-such-server" in proc.stderr
    assert manifest(out)["status"] == "aborted"


@pytest.mark.slow
def test_never_ready_aborts_after_the_probe_timeout(tmp_path):
    extra = "  ready {\n    path = \"/nope\"\n    timeout = 4s\n  }\n"
    proc, out = run_spec(tmp_path, sim_spec(extra_backend=extra))
    assert proc.returncode == 4
    assert "not ready after 4s" in proc.stderr and "HTTP 404" in proc.stderr


def _start_runner(tmp_path: Path, spec_text: str, marker: str):
    spec = _write(tmp_path, spec_text)
    out = tmp_path / "ev"
    proc = subprocess.Popen(
        soakspec_cmd("run", str(spec), "--out", str(out), "--quiet"),
        cwd=tmp_path,
        env=run_env(marker),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    req = out / "backends" / "b0" / "requests.jsonl.gz"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if req.exists() and req.stat().st_size > 0:
            break
        if proc.poll() is not None:
            raise AssertionError(f"runner exited early: {proc.communicate()}")
        time.sleep(0.05)
    else:
        proc.kill()
        raise AssertionError("no request was recorded within 30 s")
    return proc, out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_mid_bucket_tears_down_and_keeps_evidence(tmp_path, sig):
    marker = new_marker()
    proc, out = _start_runner(tmp_path, sim_spec(duration="30s", bucket="10s"), marker)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert wait_no_survivors(marker) == []
    assert proc.returncode == 4, err
    m = manifest(out)
    assert m["status"] == "aborted"
    assert m["incomplete_reason"] == f"interrupted by {sig.name}"
    assert len(requests_of(out)) > 0
    assert m["backends"][0]["stop_signal"] == "SIGTERM"


def test_ctrl_c_pressed_again_and_again_still_exits_4_and_says_what_is_left(tmp_path):
    """Ctrl-C held down (a SIGINT every 20 ms until soakspec has gone): the first stops the
    load, later ones while the evidence is finished are absorbed, and those after the run
    ended (while it says where the evidence is, judges, exits) must not kill soakspec by
    SIGINT either: it exited -2 (a shell's 130), or said the aborted run's evidence "is
    complete"."""
    marker = new_marker()
    proc, out = _start_runner(tmp_path, sim_spec(duration="30s", bucket="10s"), marker)
    time.sleep(0.3)
    sent = 0
    while proc.poll() is None and sent < 1000:
        proc.send_signal(signal.SIGINT)
        sent += 1
        time.sleep(0.02)
    _, err = proc.communicate(timeout=30)
    assert wait_no_survivors(marker) == []
    assert proc.returncode == 4, (proc.returncode, err)
    assert manifest(out)["status"] == "aborted"
    assert "is complete" not in err, err


@pytest.mark.slow
def test_sigkill_of_the_runner_kills_the_servers_too(tmp_path):
    """Even SIGKILL of soakspec leaves no server behind (the reaper), and the evidence
    directory stays readable, its manifest still saying `running`."""
    marker = new_marker()
    proc, out = _start_runner(tmp_path, sim_spec(duration="30s", bucket="10s"), marker)
    proc.kill()
    proc.communicate(timeout=10)
    assert wait_no_survivors(marker, timeout=10) == []
    assert manifest(out)["status"] == "running"
    assert len(requests_of(out)) >= 1


def test_sigkill_reaches_the_grandchildren_of_a_shell_backend(tmp_path):
    """A `shell` backend whose server is a grandchild (sh -> python) still dies with us."""
    spec = sim_spec(duration="30s", bucket="10s").replace(
        "sim {\n    ttft = 20ms\n    itl = 5ms\n  }",
        f'shell = "{sys.executable} -m soakspec sim --port {{port}} --ttft 20ms --model default & wait"',
    )
    marker = new_marker()
    proc, out = _start_runner(tmp_path, spec, marker)
    proc.kill()
    proc.communicate(timeout=10)
    assert wait_no_survivors(marker, timeout=10) == []


def test_a_server_started_in_a_new_session_is_stopped_with_its_launcher(tmp_path):
    """A launcher that starts its server in a session of its own (`setsid server & wait`, as
    Ray-style launchers do) takes it out of the process group the runner signals: the runner
    stops it too, at the end of a normal run."""
    setsid = ("import os, sys; os.setsid(); os.execv(sys.executable, [sys.executable, '-m', 'soakspec', 'sim', "
              "'--port', sys.argv[1], '--ttft', '20ms', '--model', 'default'])")
    spec = sim_spec(duration="1s", bucket="1s").replace(
        "sim {\n    ttft = 20ms\n    itl = 5ms\n  }",
        f'shell = "{sys.executable} -c \\"{setsid}\\" {{port}} & wait"',
    )
    marker = new_marker()
    path = _write(tmp_path, spec)
    run = run_soakspec(["run", str(path), "--out", str(tmp_path / "ev"), "--quiet"], marker, tmp_path)
    assert run.returncode in (0, 1, 3), run.stdout + run.stderr
    assert manifest(tmp_path / "ev")["status"] == "complete"
    assert wait_no_survivors(marker) == []


def test_two_runs_into_one_evidence_directory_are_refused(tmp_path):
    spec = _write(tmp_path, sim_spec(duration="1s", bucket="1s"))
    marker = new_marker()
    first = run_soakspec(["run", str(spec), "--out", str(tmp_path / "ev"), "--quiet"], marker, tmp_path)
    second = run_soakspec(["run", str(spec), "--out", str(tmp_path / "ev"), "--quiet"], marker, tmp_path)
    assert first.returncode in (0, 1, 3), first.stderr
    assert second.returncode == 2  # a usage error: nothing ran (issue 19; was 4)
    assert second.stdout == ""
    assert "ev" in second.stderr and ("in use" in second.stderr or "already" in second.stderr)
    assert wait_no_survivors(marker) == []


# ------------------------------------------------------------------ measurement


@pytest.mark.slow
@pytest.mark.parametrize("tokens_per_chunk", [1, 4])
def test_measured_ttft_and_itl_match_the_injected_values(tmp_path, tokens_per_chunk):
    """At low load the simulator's injected TTFT (50 ms) and ITL (10 ms) are what soakspec
    measures (p50: TTFT from 2 ms under to 3 ms over, ITL within ±2 ms), and with k tokens per
    SSE event ITL is still per token.

    A shared machine only ever adds delay (a process waiting for a CPU), never removes it, so
    the measurement is repeated up to three times and the best round must be within those
    bounds; every round must still count tokens exactly."""
    spec = sim_spec(
        sim=f"ttft = 50ms\n    itl = 10ms\n    tokens_per_chunk = {tokens_per_chunk}",
        load="mode = closed\n    concurrency = [1]",
        max_tokens=17,
        duration="2s",
        bucket="2s",
    )
    rounds = []
    for attempt in range(3):
        work = tmp_path / f"round{attempt}"
        work.mkdir()
        proc, out = run_spec(work, spec)
        rows = [r for r in requests_of(out) if r["bucket"] >= 0]
        assert len(rows) >= 8, proc.stderr
        assert all(r["outcome"] == "completed" for r in rows)
        assert all(r["output_tokens"] == 17 and r["tokens_source"] == "usage" for r in rows)
        assert all(len(r["itl"]) == 16 for r in rows), "one ITL gap per token after the first"
        if tokens_per_chunk > 1:
            assert all(r["chunks"] < r["output_tokens"] for r in rows)
        ttft = statistics.median(r["ttft"] for r in rows)
        itl = statistics.median(g for r in rows for g in r["itl"])
        # TTFT holds the request's own path (sent, parsed by the simulator, its first event
        # read): ~1.2 ms on an idle 2-vCPU VM, 2.0-2.3 ms in one CI run -- time the server side
        # really took, never less than the injected delay: up to 3 ms over it, 2 under
        if -0.002 <= ttft - 0.050 <= 0.003 and abs(itl - 0.010) <= 0.002:
            return
        rounds.append((round(ttft * 1000, 2), round(itl * 1000, 2)))
    pytest.fail(f"median TTFT/ITL in ms per round: {rounds}; injected 50/10")


@pytest.mark.slow
def test_each_fault_gives_its_outcome_class(tmp_path):
    """In-stream error after HTTP 200 -> failed; missing [DONE] -> failed; a stalled stream
    -> timeout at the deadline; HTTP 500 -> failed; a cut connection -> disconnected."""
    faults = {
        "b0": ("stream_error_rate = 1", "failed"),
        "b1": ("omit_done_rate = 1", "failed"),
        "b2": ("stall_rate = 1", "timeout"),
        "b3": ("error_rate = 1", "failed"),
        "b4": ("disconnect_rate = 1", "disconnected"),
    }
    # every request fails by design: the built-in abort is off, so each keeps its own outcome
    text = sim_spec(backends=5, duration="1s", bucket="1s", deadline="1s", follow_up=False,
                    load="mode = closed\n    concurrency = [1]", gate="require failed == 0\n  abort_default = false")  # fmt: skip
    for name, (knob, _) in faults.items():
        text = text.replace(f'backend "{name}" {{\n  sim {{\n', f'backend "{name}" {{\n  sim {{\n    {knob}\n', 1)
    proc, out = run_spec(tmp_path, text, "--no-preflight")  # every request faults, by design
    assert proc.returncode != 4, proc.stderr
    for name, (knob, outcome) in faults.items():
        rows = [r for r in requests_of(out, name) if r["bucket"] >= 0]
        assert rows, name
        assert {r["outcome"] for r in rows} == {outcome}, (knob, {r["outcome"] for r in rows}, rows[0]["error"])
    for r in requests_of(out, "b2"):
        assert 0.95 <= r["latency"] <= 1.5, "a stall ends at the request's deadline"
    assert any("error" in (r["error"] or "").lower() for r in requests_of(out, "b0"))
    assert any("[DONE]" in (r["error"] or "") for r in requests_of(out, "b1"))


@pytest.mark.slow
def test_buckets_follow_wall_time_and_closed_loop_holds_concurrency(tmp_path):
    spec = sim_spec(sim="ttft = 15ms\n    itl = 3ms", load="mode = closed\n    concurrency = [4]", duration="3s", bucket="1s")
    proc, out = run_spec(tmp_path, spec)
    level = manifest(out)["backends"][0]["levels"][0]
    m0, deadline = level["measure_start"], level["deadline_s"]
    stop = m0 + level["planned_duration_s"]
    assert [round(b["end"] - b["start"], 6) for b in level["buckets"]] == [1.0, 1.0, 1.0]
    rows = [r for r in requests_of(out) if r["bucket"] >= 0]
    for r in rows:
        assert r["start"] < stop, "no request starts after the level's end"
        assert r["bucket"] == min(int((r["start"] - m0) // 1.0), 2)
        assert r["end"] <= r["start"] + deadline + 0.5
    # requests in flight, sampled every 5 ms over the measured window (edges excluded); a
    # worker holds its slot until it has processed the response: `end` is the last bytes'
    # arrival (one clock per record), `client_delay` the client's processing after it
    samples = []
    t = m0 + 0.1
    while t < stop - 0.1:
        samples.append(sum(1 for r in rows if r["start"] <= t < r["end"] + (r["client_delay"] or 0.0)))
        t += 0.005
    assert min(samples) >= 3, "concurrency never drops between requests"
    assert statistics.mean(samples) >= 3.9


@pytest.mark.slow
def test_open_loop_counts_latency_from_the_intended_send_time(tmp_path):
    spec = sim_spec(load="mode = open\n    rate = 20rps", duration="2s", bucket="1s")
    proc, out = run_spec(tmp_path, spec)
    rows = sorted((r for r in requests_of(out) if r["bucket"] >= 0), key=lambda r: r["intended_start"])
    assert 38 <= len(rows) <= 41
    gaps = [b["intended_start"] - a["intended_start"] for a, b in zip(rows, rows[1:])]
    # 50 ms apart to the evidence's resolution: each stamp is rounded to 1 µs on disk (two
    # neighbours can round apart by one µs when the schedule's start falls near half a µs) and
    # an epoch stamp is a float64 only to ~0.24 µs -- a gap of 0.050001144 was seen
    assert all(abs(g - 0.05) <= 1.5e-6 for g in gaps), "constant-rate schedule"
    for r in rows:
        assert r["start"] >= r["intended_start"]
        assert r["ttft"] == pytest.approx(r["first_token"] - r["intended_start"], abs=2e-6)


def test_batch_mode_runs_batches_of_n_back_to_back(tmp_path):
    spec = sim_spec(sim="ttft = 30ms\n    itl = 5ms", load="mode = batch\n    concurrency = [2]\n    requests = 4", duration="1s", bucket="1s")
    proc, out = run_spec(tmp_path, spec)
    rows = [r for r in requests_of(out) if r["bucket"] >= 0]
    assert rows and all(r["outcome"] == "completed" for r in rows)
    assert {r["worker"] for r in rows} == {0, 1}
    assert len(rows) % 4 == 0 or rows[-1]["start"] >= manifest(out)["backends"][0]["levels"][0]["measure_end"] - 0.5


@pytest.mark.slow
def test_rehearsal_of_the_dsv2lite_spec_completes_and_is_marked(tmp_path):
    """`soakspec run --rehearse --time-scale 0.1 specs/dsv2lite.soak` completes in under two
    minutes on this machine, is marked as a rehearsal, and its NCCL boundary is confirmed from
    the simulator's log line."""
    marker = new_marker()
    out = tmp_path / "ev"
    t0 = time.monotonic()
    proc = run_soakspec(
        ["run", "--rehearse", "--time-scale", "0.1", str(REPO / "specs" / "dsv2lite.soak"), "--out", str(out), "--quiet"],
        marker, tmp_path, timeout=180,
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert wait_no_survivors(marker) == []
    assert elapsed < 120, elapsed
    m = manifest(out)
    assert m["status"] == "complete", proc.stderr
    assert m["rehearsal"] is True and m["time_scale"] == 0.1
    nccl = next(b for b in m["backends"] if b["name"] == "nccl")
    assert nccl["runtime_boundary"]["status"] == "confirmed"
    assert nccl["env"]["NCCL_IB_DISABLE"] == "1"
    # a rehearsal never passes a real gate
    assert proc.returncode != 0
    assert json.loads((out / "manifest.json").read_text())["spec"]["sha256"]


@pytest.mark.slow
def test_jsonl_trace_file_only_counts_what_this_run_appended(tmp_path):
    """A server's trace file that outlives runs: the second run reads only the lines appended
    after it started, so traces of the first run are neither matched nor even listed."""
    backend = (
        f'launch = ["{sys.executable}", "-m", "soakspec", "sim", "--port", "{{port}}", '
        '"--trace-file", "server-traces.jsonl", "--no-trace-log", "--ttft", "5ms", "--itl", "1ms", "--model", "default"]\n'
        '  traces {\n    source = jsonl\n    file = "server-traces.jsonl"\n'
        '    id_forms = ["cmpl-{id}-0"]\n  }\n'
    )
    text = sim_spec(duration="1s", bucket="1s").replace("sim {\n    ttft = 20ms\n    itl = 5ms\n  }", backend)
    spec = _write(tmp_path, text)
    marker = new_marker()
    counts = []
    for run in ("ev1", "ev2"):
        proc = run_soakspec(["run", str(spec), "--out", str(tmp_path / run), "--quiet"], marker, tmp_path)
        assert proc.returncode in (0, 3), proc.stderr
        requests = read_jsonl(tmp_path / run / "backends" / "b0" / "requests.jsonl.gz")
        traces = read_jsonl(tmp_path / run / "backends" / "b0" / "traces.jsonl.gz")
        assert len(traces) == len(requests), "one trace per request of this run, none from before"
        assert all(t["matched"] for t in traces)
        counts.append(len(requests))
    preflights = 2  # one pre-flight request per run: traced by the server, kept out of requests and traces
    assert len(read_jsonl(tmp_path / "server-traces.jsonl")) == sum(counts) + preflights
    assert wait_no_survivors(marker) == []


def test_a_spec_that_requires_gpus_stops_before_load_without_them(tmp_path):
    """No GPU here (NVML absent is a normal, recorded state): a spec that requires GPUs stops
    before any server starts, says why, and records NVML's absence in the manifest."""
    text = sim_spec().replace('soak "t" {\n  issue = "test"\n}\n', 'soak "t" {\n  issue = "test"\n}\ntelemetry {\n  require_gpus = true\n}\n')
    proc, out = run_spec(tmp_path, text)
    assert proc.returncode == 4, proc.stderr
    assert "requires GPUs" in proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and m["gpus"]["available"] is False and m["gpus"]["reason"]
    assert not list((out / "backends" / "b0").glob("server.log*")), "no server was started"


@pytest.mark.slow
def test_servers_outlive_trios_idle_worker_threads(tmp_path):
    """Regression: servers were started with PR_SET_PDEATHSIG from one of trio's worker
    threads, and a thread that sat idle for 10 s exited and took the server with it. With
    telemetry sampled once an hour nothing keeps that thread busy through a 13 s level."""
    text = sim_spec(duration="13s", bucket="13s", load="mode = closed\n    concurrency = [1]")
    text = text.replace('soak "t" {\n  issue = "test"\n}\n', 'soak "t" {\n  issue = "test"\n}\ntelemetry {\n  interval = 1h\n}\n')
    assert "interval = 1h" in text, "the spec's header changed: the regression is not exercised"
    proc, out = run_spec(tmp_path, text)
    assert proc.returncode != 4, proc.stderr
    assert manifest(out)["status"] == "complete"
    assert all(r["outcome"] == "completed" for r in requests_of(out))
