"""`soakspec run --workers N` for real: worker processes against the simulator as a real server.

The contract: the same evidence as one process -- one requests.jsonl of the same schema and the
same totals (an open-loop schedule is split exactly), buckets on the one shared run clock, the
level's in-flight mean -- and no worker outlives the run, even an aborted one.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections import Counter
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from runner_support import manifest, new_marker, read_jsonl, run_env, run_soakspec, sim_spec, soakspec_cmd, wait_no_survivors
from soakspec.evidence.layout import RunLayout
from soakspec.lang import load_spec
from soakspec.plan import Batch, Bucket, Closed, Level, Open, OpenRamp, Replay, RequestTemplate, plan
from soakspec.evidence.record import READ_KEYS
from soakspec.runner import backend
from soakspec.runner.backend import Deps, serve_backend
from soakspec.runner.clock import RunClock
from soakspec.runner.engine import h11_connect
from soakspec.runner.procs import BackendError
from soakspec.runner.progress import Progress
from soakspec.runner.recorder import BackendRecorder, RunStatus
from soakspec.judge import schedproof
from soakspec.runner.load import CANCELLED_BY_ABORT
from soakspec.runner.workers import processes_for

OPEN = sim_spec(sim="ttft = 10ms\n    itl = 2ms", load="mode = open\n    rate = [30rps]\n    arrival = constant",
                duration="2s", bucket="1s", follow_up=False)  # fmt: skip
CLOSED = sim_spec(sim="ttft = 15ms\n    itl = 3ms\n    slots = 16", load="mode = closed\n    concurrency = [5]",
                  duration="2s", bucket="500ms")  # fmt: skip
LONG = sim_spec(sim="ttft = 20ms\n    itl = 5ms", load="mode = closed\n    concurrency = [4]", duration="30s", bucket="10s")


def _run(tmp_path: Path, spec_text: str, workers: int, name: str):
    spec = tmp_path / f"{name}.soak"
    spec.write_text(spec_text)
    out = tmp_path / name
    marker = new_marker()
    proc = run_soakspec(["run", str(spec), "--out", str(out), "--quiet", "--workers", str(workers)], marker, tmp_path)
    assert wait_no_survivors(marker) == [], "a worker or server outlived the run"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, manifest(out)["backends"][0]["levels"][0], read_jsonl(out / "backends" / "b0" / "requests.jsonl.gz")


def _verify(out: Path, code: int = 0) -> None:
    """`soakspec verify`: every artifact intact, every record valid (3: intact, run incomplete)."""
    proc = subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stdout + proc.stderr


@pytest.mark.slow
def test_two_workers_give_the_same_records_as_one(tmp_path):
    """Open loop, constant rate: exactly rate x duration requests either way, in the same buckets,
    with the same outcomes and keys; the schedule is the one schedule, split between processes."""
    runs = {w: _run(tmp_path, OPEN, w, f"w{w}") for w in (1, 2)}
    summary = {}
    for w, (out, level, rows) in runs.items():
        _verify(out)
        assert all(sorted(r) == sorted(READ_KEYS) for r in rows)  # the record type's keys, read as a dict
        assert len({r["request_id"] for r in rows}) == len(rows), "ids are unique"
        assert level["sent"] == len(rows)
        offsets = sorted(round(r["intended_start"] - level["started_at"], 6) for r in rows)
        summary[w] = (len(rows), Counter(r["bucket"] for r in rows), Counter(r["outcome"] for r in rows), offsets)
        assert 0 < level["mean_in_flight"] < 5
        # what the runner wrote is its schedule's arrivals, however the processes split them
        proof = schedproof.prove(level, [r["intended_start"] for r in rows if r["bucket"] != -2])
        assert (proof.status, proof.arrivals) == ("proven", 60), proof.reason
    assert summary[1][:3] == summary[2][:3] == (60, Counter({0: 30, 1: 30}), Counter({"completed": 60}))
    # the same schedule (epoch floats near 1.7e9 carry ~2e-7 s of rounding)
    assert len(summary[1][3]) == len(summary[2][3])
    assert all(abs(a - b) < 1e-5 for a, b in zip(summary[1][3], summary[2][3]))
    _, level2, rows2 = runs[2]
    assert level2["workers"] == 2
    assert {r["worker"] % 2 for r in rows2} == {0, 1}, "both processes sent requests"


@pytest.mark.slow
def test_buckets_follow_the_shared_clock_and_in_flight_is_exact(tmp_path):
    """Closed loop, c = 5 over two processes (3 + 2 workers): every record's bucket is where its
    start falls on the level's clock, whichever process sent it; `mean_in_flight` is the exact
    integral of the records' [start, end] over the measured window."""
    out, level, rows = _run(tmp_path, CLOSED, 2, "closed")
    _verify(out)
    m0, stop = level["measure_start"], level["measure_end"]
    assert {r["worker"] for r in rows if r["bucket"] >= 0} == {0, 1, 2, 3, 4}
    for r in rows:
        if r["bucket"] == -2:  # the follow-up
            continue
        assert r["start"] < stop
        expected = -1 if r["start"] < m0 else min(int((r["start"] - m0) // 0.5), 3)
        assert r["bucket"] == expected, r
    busy = sum(max(0.0, min(r["end"], stop) - max(r["start"], m0)) for r in rows if r["bucket"] != -2)
    assert level["mean_in_flight"] == pytest.approx(busy / (stop - m0), abs=1e-3)
    assert level["mean_in_flight"] > 4.0, "five workers keep about five requests in flight"


# closed loop, max_tokens of two very different lengths: a list whose length shares a factor with
# the process count, and a process that sends the short ones runs faster than one sending the long
MIX = sim_spec(sim="ttft = 20ms\n    itl = 5ms\n    slots = 64", load="mode = closed\n    concurrency = [2]",
               duration="3s", bucket="1s", deadline="10s", max_tokens="[2, 40]", follow_up=False)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.slow
def test_two_processes_keep_a_closed_loop_s_max_tokens_mix(tmp_path):
    """Closed loop, concurrency 2, `max_tokens = [2, 40]`, `--workers 2`: the k-th request to
    start gets max_tokens[k % 2] whichever process starts it, so the level sends half of each,
    as one process does (the server's trace of each request agrees). Each process counted its
    own p, p + 2, ...: process 0 sent only 2, process 1 only 40, and the fast one sent most --
    2:40 was 154:19 in 4 s (one process: 34:34), the run's req/s tripled and tok/s fell."""
    import json

    from runner_support import server_log_bytes

    out, level, rows = _run(tmp_path, MIX, 2, "mix")
    assert level["workers"] == 2
    rows = [r for r in rows if r["bucket"] != -2]
    assert rows and all(r["outcome"] == "completed" for r in rows)
    mix = Counter(r["output_tokens"] for r in rows)
    assert set(mix) == {2, 40} and abs(mix[2] - mix[40]) <= 2, mix  # the processes' last claims may go unsent
    for p in (0, 1):  # each process sends both lengths, not a fixed one
        assert {r["output_tokens"] for r in rows if r["worker"] % 2 == p} == {2, 40}
    prefix = "soakspec_sim_trace "
    traces = [json.loads(line[len(prefix):]) for line in server_log_bytes(out / "backends" / "b0").decode().splitlines()
              if line.startswith(prefix)]  # fmt: skip
    asked = {t["client_request_id"]: t["max_tokens"] for t in traces}
    assert Counter(asked[r["request_id"]] for r in rows) == mix  # what the server was asked for


BATCH = sim_spec(sim="ttft = 20ms\n    itl = 5ms\n    slots = 64", load="mode = batch\n    concurrency = [2]\n    requests = 4",
                 duration="3s", bucket="1s", deadline="10s", max_tokens="[2, 40]", follow_up=False)  # type: ignore[arg-type]  # fmt: skip


@pytest.mark.slow
def test_a_batch_level_keeps_its_barrier_with_workers(tmp_path):
    """Batches of 4 at concurrency 2 with `--workers 2`: every batch's requests start after the
    last request of the batch before has ended, as with one process (the level runs in one; the
    manifest says so). Split, each process ran its own 2 of each batch: the next batch started
    while the other process's requests still ran (25 of 43 batches in 4 s; req/s 42.75 against
    14.75)."""
    out, level, rows = _run(tmp_path, BATCH, 2, "batch")
    rows = sorted((r for r in rows if r["bucket"] != -2), key=lambda r: r["start"])
    assert len(rows) >= 8 and all(r["outcome"] == "completed" for r in rows)
    batches = [rows[i : i + 4] for i in range(0, len(rows), 4)]
    late = [i for i, (b, nxt) in enumerate(zip(batches, batches[1:])) if min(r["start"] for r in nxt) < max(r["end"] for r in b)]
    assert late == [], f"{len(late)} of {len(batches)} batches started before the one before had ended"
    assert max(sum(1 for x in rows if x["start"] <= r["start"] < x["end"]) for r in rows) <= 2
    assert Counter(r["output_tokens"] for r in rows[: len(rows) // 4 * 4]) == {2: len(rows) // 4 * 2, 40: len(rows) // 4 * 2}
    assert level["workers"] == 1  # the manifest says how many processes the level used


def _start(tmp_path: Path, spec_text: str, workers: int, marker: str):
    spec = tmp_path / "run.soak"
    spec.write_text(spec_text)
    out = tmp_path / "ev"
    proc = subprocess.Popen(
        soakspec_cmd("run", str(spec), "--out", str(out), "--quiet", "--workers", str(workers)),
        cwd=tmp_path, env=run_env(marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    req = out / "backends" / "b0" / "requests.jsonl.gz"
    deadline = time.monotonic() + 60
    while not (req.exists() and req.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no record within 60 s"
        time.sleep(0.05)
    return proc, out


# requests of ~0.4 s: some are surely in flight when the signal's stop reaches the workers
SLOW_REQUESTS = LONG.replace("itl = 5ms", "itl = 50ms")


def test_an_interrupted_run_with_workers_keeps_their_records_and_leaves_no_process(tmp_path):
    assert SLOW_REQUESTS != LONG
    marker = new_marker()
    proc, out = _start(tmp_path, SLOW_REQUESTS, 2, marker)
    req = out / "backends" / "b0" / "requests.jsonl.gz"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert wait_no_survivors(marker, timeout=10) == []
    assert proc.returncode == 4, err
    m = manifest(out)
    assert m["status"] == "aborted"
    rows = read_jsonl(req)
    assert rows and {r["worker"] % 2 for r in rows} == {0, 1}
    errors = sorted({str(r["error"]) for r in rows})
    assert any(r["error"] == CANCELLED_BY_ABORT for r in rows), f"in-flight ones too: {errors}"
    # the interrupt ended them, not the server: it is stopped only once the workers have stopped
    # (stopped first, it closed their connections -- "connection closed before the response
    # finished", a server failure in the evidence -- and refused the requests sent after)
    assert {r["error"] for r in rows if r["outcome"] != "completed"} == {CANCELLED_BY_ABORT}, errors
    assert m["backends"][0]["levels"][0]["sent"] == len(rows)
    _verify(out, 3)


async def _served(tmp_path: Path, load_stopped: trio.Event, task_status=trio.TASK_STATUS_IGNORED):
    """A launched simulator served by `serve_backend` (as `run_backend` does), in a scope the
    caller cancels as an interrupt does; reports (its Server, that scope)."""
    path = tmp_path / "t.soak"
    path.write_text(sim_spec())
    spec, diags, _ = load_spec(path)
    assert spec is not None, diags
    (bp,) = plan(spec).backends
    layout = RunLayout(tmp_path / "ev")
    rec = BackendRecorder(bp, layout, RunStatus())
    rec.prepare(0, None)
    clock = RunClock()
    async with httpx.AsyncClient() as http:
        deps = Deps(clock, Progress(quiet=True), http, h11_connect(clock), layout)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(serve_backend, bp.launch, deps, rec, load_stopped=load_stopped))
                task_status.started((rec.server, scope))
    rec.close()


async def test_an_interrupted_backend_stops_its_server_only_once_its_load_has_stopped(tmp_path):
    """The race behind the interrupted run above: an interrupt cancels the server's task and the
    load's at once; the server is stopped only after the load has (a --workers load learns of the
    interrupt a moment later, and its in-flight requests are the interrupt's, not the server's)."""
    load_stopped = trio.Event()
    async with trio.open_nursery() as nursery:
        server, scope = await nursery.start(_served, tmp_path, load_stopped)
        scope.cancel()  # the interrupt
        await trio.testing.wait_all_tasks_blocked()
        assert server.stop_signal is None and server.poll() is None, "stopped while its load was still stopping"
        load_stopped.set()
    assert server.stop_signal == "SIGTERM" and server.poll() is not None


async def test_a_server_that_dies_by_itself_is_not_kept_waiting_for_its_load(tmp_path, monkeypatch):
    """A server that exits during the run fails the backend at once (its load is cancelled after
    that): its teardown does not wait for a load that is still running."""
    monkeypatch.setattr(backend, "LOAD_STOP_BOUND_S", 1e6)
    load_stopped = trio.Event()  # the load never stops by itself
    waited: list[bool] = []

    async def end_a_wait() -> None:  # the wait is shielded: only its event ends it
        await trio.sleep(30)
        waited.append(True)
        load_stopped.set()

    with pytest.RaisesGroup(pytest.RaisesExc(BackendError, match="server killed by SIGKILL during the run"), flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            server, _ = await nursery.start(_served, tmp_path, load_stopped)
            nursery.start_soon(end_a_wait)
            os.kill(server.pid, signal.SIGKILL)
    assert waited == [], "the dead server's teardown waited for its load"


@pytest.mark.slow
def test_sigkill_of_the_runner_ends_its_workers(tmp_path):
    """Workers notice that the runner is gone (their stdin closes) and exit."""
    marker = new_marker()
    proc, out = _start(tmp_path, LONG, 2, marker)
    proc.kill()
    proc.communicate(timeout=10)
    assert wait_no_survivors(marker, timeout=15) == []


@pytest.mark.slow
async def test_workers_are_not_tied_to_the_thread_that_started_them(tmp_path, monkeypatch):
    """trio starts processes from a worker thread and retires idle threads (after 10 s; 0.2 s
    here): the workers must not die with that thread, as PR_SET_PDEATHSIG would make them."""
    import trio

    from soakspec.lang import load_spec
    from soakspec.plan import plan
    from soakspec.runner.clock import RunClock
    from soakspec.runner.ids import IdSequence
    from soakspec.runner.load import LevelContext, Shapes
    from soakspec.runner.workers import drive_level_workers
    from soakspec.sim.config import SimConfig
    from soakspec.sim.server import serve

    monkeypatch.setattr(trio._core._thread_cache, "IDLE_TIMEOUT", 0.2)
    path = tmp_path / "t.soak"
    path.write_text(sim_spec(sim="ttft = 5ms", load="mode = closed\n    concurrency = [4]", duration="2s", bucket="1s"))
    spec, diags, _ = load_spec(path)
    assert spec is not None, diags
    level = plan(spec).backends[0].levels[0]
    clock = RunClock()
    lines: list[bytes] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, SimConfig(model="sim", trace_log=False, ttft=0.005, itl=0.001))
        ids = IdSequence("t-0")
        ctx = LevelContext("b0", clock, None, Shapes(dataclasses.replace(level.request, model="sim")), None, ids)  # type: ignore[arg-type]
        job = {"host": "127.0.0.1", "port": port, "api_key_env": None, "request": dataclasses.replace(level.request, model="sim"),
               "prompts": (), "backend": "b0", "headers": ()}  # fmt: skip
        run, next_index = await drive_level_workers(level, ctx, job, 2, lines.append, ids)
        nursery.cancel_scope.cancel()
    records = b"".join(lines).count(b"\n")
    assert run.completed and run.sent == records == ctx.stats.done > 0
    assert next_index >= records


def test_processes_per_level() -> None:
    request = RequestTemplate("completions", "sim", True, 8, None, (8,), 0.0, 1.0, None, None, True, None)

    def level(shape) -> Level:
        return Level("w", 0, shape, request, 0.0, 1.0, 1.0, (Bucket(0, 0.0, 1.0),), 1, None)

    assert processes_for(level(Closed(8)), 2) == 2
    assert processes_for(level(Closed(1)), 4) == 1
    assert processes_for(level(Batch(3, 6)), 4) == 1  # a batch's barrier spans the batch: one process
    assert processes_for(level(Open(10.0, "constant", 0)), 3) == 3


def test_open_loop_ramps_and_replays_are_split_too() -> None:
    """An open-loop ramp (a phase with `ramp_to`) and a trace replay are open loop: `--workers N`
    splits their arrivals over N processes, as a constant rate's (they ran in one process)."""
    request = RequestTemplate("completions", "sim", True, 8, None, (8,), 0.0, 1.0, None, None, True, None)

    def level(shape) -> Level:
        return Level("w", 0, shape, request, 0.0, 1.0, 1.0, (Bucket(0, 0.0, 1.0),), 1, None)

    assert processes_for(level(OpenRamp(10.0, 40.0, 0, "poisson", 0)), 3) == 3
    replay = Replay("t.jsonl", "mooncake", "0" * 64, 1.0, (0.0, 0.1, 0.2), (8, 8, 8), (4, 4, 4))
    assert processes_for(level(replay), 3) == 3


def test_a_batch_level_runs_in_one_process_whatever_the_workers() -> None:
    """A batch level's next batch starts once the last request of this one has ended: the barrier
    spans the whole batch, so the level runs in one process (split, each process ran its own
    share of each batch and no barrier held across them). Nor does a process idle: one with no
    share of a batch looped on empty batches at full CPU (client_healthy: INCONCLUSIVE)."""
    request = RequestTemplate("completions", "sim", True, 8, None, (8,), 0.0, 1.0, None, None, True, None)
    for shape in (Batch(4, 2), Batch(2, 4), Batch(8, 64)):
        lv = Level("w", 0, shape, request, 0.0, 1.0, 1.0, (Bucket(0, 0.0, 1.0),), 1, None)
        assert processes_for(lv, 4) == 1


async def test_a_level_cut_short_leaves_the_ids_after_every_one_its_workers_used(tmp_path, monkeypatch):
    """A `--workers` level cut short (an abort rule ending a sweep's probe) has no worker
    summaries; the backend's id sequence must still go on after every id its workers used. It
    did not move: the next probe's workers issued the same ids again (duplicate request ids in
    requests.jsonl). The closed loop's shared count (`ids.SharedCount`, a temp file) is gone
    once the workers are sending: a runner SIGKILLed mid-level leaves no file behind."""
    import json
    import tempfile

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    from soakspec.runner.ids import IdSequence
    from soakspec.runner.load import LevelContext, Shapes
    from soakspec.runner.workers import drive_level_workers
    from soakspec.sim.config import SimConfig
    from soakspec.sim.server import serve

    path = tmp_path / "t.soak"
    path.write_text(sim_spec(sim="ttft = 5ms", load="mode = closed\n    concurrency = [4]", duration="20s", bucket="1s"))
    spec, diags, _ = load_spec(path)
    assert spec is not None, diags
    level = plan(spec).backends[0].levels[0]
    request = dataclasses.replace(level.request, model="sim")
    clock = RunClock()
    lines: list[bytes] = []
    ids = IdSequence("t-0")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve, SimConfig(model="sim", trace_log=False, ttft=0.005, itl=0.001))
        ctx = LevelContext("b0", clock, None, Shapes(request), None, ids)  # type: ignore[arg-type]
        job = {"host": "127.0.0.1", "port": port, "api_key_env": None, "request": request, "prompts": (), "backend": "b0",
               "headers": ()}  # fmt: skip
        with trio.CancelScope() as cut:  # the level's 20 s cut short once both workers sent, as a fired abort rule does

            async def abort_rule() -> None:
                while len({json.loads(line)["worker"] % 2 for line in b"".join(lines).splitlines()}) < 2:
                    await trio.sleep(0.05)
                assert list(temp.iterdir()) == [], "the level's count file outlived the workers' start"
                cut.cancel()

            nursery.start_soon(abort_rule)
            await drive_level_workers(level, ctx, job, 2, lines.append, ids)
        assert cut.cancelled_caught
        nursery.cancel_scope.cancel()
    used = [int(json.loads(line)["request_id"].rsplit("-", 1)[1]) for line in b"".join(lines).splitlines()]
    assert used, "the workers sent requests before the cut"
    assert ids()[0] > max(used), "the next level's first id is one a worker already used"


def test_a_killed_worker_aborts_the_run_with_its_reason(tmp_path):
    """A load process killed mid-level (the OOM killer, a stray `kill -9`): the run stops at once
    with that reason on stderr and in the manifest (exit 4, evidence intact but incomplete, no
    process left) -- not "internal error: ExceptionGroup ... (this is a bug)"."""
    from runner_support import processes_with_marker

    marker = new_marker()
    proc, out = _start(tmp_path, LONG, 2, marker)
    workers = [pid for pid in processes_with_marker(marker) if b"soakspec.runner.workers" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(workers) == 2, workers
    os.kill(workers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert wait_no_survivors(marker, timeout=10) == []
    assert proc.returncode == 4, err
    assert "internal error" not in err and "killed by SIGKILL" in err, err
    m = manifest(out)
    assert m["status"] == "aborted" and "ended without finishing its load (killed by SIGKILL)" in m["incomplete_reason"]
    assert m["backends"][0]["levels"][0]["completed"] is False
    _verify(out, 3)


@pytest.mark.slow
def test_a_bucket_line_waits_for_a_stalled_worker_s_records(tmp_path):
    """A load process stalled for seconds (SIGSTOP here; a starved or swapping process) reports
    its records late. Each buckets.jsonl line must still count every record of its bucket: the
    line was written on the clock alone (its window end + deadline + 1 s), and bucket 2 said 102
    requests where requests.jsonl held 106."""
    from runner_support import processes_with_marker

    spec = sim_spec(sim="ttft = 10ms\n    itl = 2ms", load="mode = closed\n    concurrency = [4]", duration="5s",
                    bucket="500ms", deadline="1s", max_tokens=4, follow_up=False)  # fmt: skip
    marker = new_marker()
    proc, out = _start(tmp_path, spec, 2, marker)
    workers = [pid for pid in processes_with_marker(marker) if b"soakspec.runner.workers" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(workers) == 2, workers
    time.sleep(0.5)
    os.kill(workers[0], signal.SIGSTOP)
    time.sleep(2.5)
    os.kill(workers[0], signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    assert wait_no_survivors(marker, timeout=10) == []
    assert proc.returncode in (0, 3), err  # 3: the stalled process is a saturated client (INCONCLUSIVE)
    records = Counter(r["bucket"] for r in read_jsonl(out / "backends" / "b0" / "requests.jsonl.gz"))
    lines = {b["bucket"]: b["requests"]["total"] for b in read_jsonl(out / "backends" / "b0" / "buckets.jsonl")}
    assert lines == {k: n for k, n in records.items() if k >= 0}


@pytest.mark.slow
def test_the_countdown_of_a_workers_level_runs_from_its_start_not_from_the_workers_start_up(tmp_path, monkeypatch, capsys):
    """`--workers N`: the level starts once its load processes are up (a second or more on a busy
    machine), but the progress line's countdown ran from before they were started, so "x left in
    level" after bucket 1 of a 3 s level said 0.4 s where 2 s were left (here the start-up held
    1.5 s)."""
    import re

    from soakspec.cli import main
    from soakspec.runner import workers

    spawn = workers._spawn

    async def slow_spawn(*args, **kwargs):
        await spawn(*args, **kwargs)
        await trio.sleep(1.5)

    monkeypatch.setattr(workers, "_spawn", slow_spawn)
    (tmp_path / "t.soak").write_text(sim_spec(duration="3s", bucket="1s", follow_up=False))
    code = main(["run", str(tmp_path / "t.soak"), "--out", str(tmp_path / "ev"), "--workers", "2"])
    err = capsys.readouterr().err
    assert code == 0, err
    left = re.search(r"bucket 0 done \(1 of 3\); .*; ([\d.]+)(ms|s) left in level", err)
    assert left, err
    seconds = float(left[1]) / (1000 if left[2] == "ms" else 1)
    assert 1.7 <= seconds <= 2.1, err
