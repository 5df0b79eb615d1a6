"""The engine's parts, in-process: the simulator served in the test's own nursery, the backend
served with `nursery.start(serve_backend, ...)`, the load driven, the evidence collected.

Also the structure the engine promises: the runner imports nothing from `soakspec.lang` (it
acts on the plan alone), no function-local imports, no function over 80 lines; and a
rehearsal's manifest carries exactly the plan's timings.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import threading
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from soakspec.evidence.layout import RunLayout
from soakspec.evidence.schema import validate
from soakspec.lang import load_spec
from soakspec.plan import plan, to_json
from soakspec.runner.backend import Deps, serve_backend
from soakspec.runner.clock import RunClock
from soakspec.runner.collect import collect
from soakspec.runner.driver import run_backend
from soakspec.runner.engine import RunOptions, _Backend, _run, _start_backend, execute, h11_connect
from soakspec.runner.ids import IdSequence
from soakspec.runner.procs import BackendError
from soakspec.runner.progress import Progress
from soakspec.runner.prompts import PromptFiles
from soakspec.runner.recorder import BackendRecorder, RunStatus
from soakspec.sim import server as sim
from soakspec.sim.config import SimConfig

RUNNER = Path(__file__).resolve().parents[1] / "soakspec" / "runner"
ENGINE_PARTS = ("engine.py", "backend.py", "driver.py", "collect.py", "recorder.py", "ids.py", "prompts.py")

SPEC = """\
soak "inproc" {{
  issue = "13"
}}
backend "u" {{
  url = "{url}"
  ready {{
    timeout = {ready}
    interval = 100ms
  }}
}}
workload "w" {{
  prompt_words = 4
  max_tokens = 5
  load {{
    mode = closed
    concurrency = [2]
  }}
  duration = {duration}
  bucket = 250ms
  deadline = 5s
  follow_up = true
}}
gate {{
  require failed == 0
}}
claims {{
  claim "test"
}}
"""


def _imports(path: Path) -> list[tuple[str, ast.AST]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((a.name, node) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, node))
    return out


@pytest.mark.parametrize("path", sorted(RUNNER.glob("*.py")), ids=lambda p: p.name)
def test_the_runner_never_imports_lang(path):
    """The runner acts on the plan alone: nothing in it imports `soakspec.lang`."""
    bad = [name for name, _ in _imports(path) if name == "soakspec.lang" or name.startswith("soakspec.lang.")]
    assert bad == [], f"{path.name} imports {bad}"


@pytest.mark.parametrize("name", ENGINE_PARTS)
def test_engine_parts_are_small_and_import_at_the_top(name):
    tree = ast.parse((RUNNER / name).read_text())
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert fn.end_lineno - fn.lineno + 1 <= 80, f"{name}: {fn.name} has {fn.end_lineno - fn.lineno + 1} lines"
            local = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert local == [], f"{name}: {fn.name} imports inside the function"


def _spec(tmp_path: Path, url: str, *, ready: str = "5s", duration: str = "500ms"):
    path = tmp_path / "inproc.soak"
    path.write_text(SPEC.format(url=url, ready=ready, duration=duration))
    spec, diags, _ = load_spec(path)
    assert spec is not None, diags
    return spec


def _parts(tmp_path: Path, bp, http, clock: RunClock):
    status = RunStatus()
    layout = RunLayout(tmp_path / "ev")
    rec = BackendRecorder(bp, layout, status)
    deps = Deps(clock, Progress(quiet=True), http, h11_connect(clock), layout)
    return status, rec, deps


async def test_a_backend_served_and_driven_in_process(tmp_path):
    """serve_backend reports the URL once ready; the driver runs the planned level and the
    follow-up; the recorder's level entry is the plan's `Level.to_json()` plus what happened;
    collection matches the simulator's traces and builds the manifest entry with the plan's timeouts."""
    async with trio.open_nursery() as nursery, httpx.AsyncClient() as http:
        port = await nursery.start(partial(sim.serve, SimConfig(model="default", ttft=0.005, itl=0.001)))
        p = plan(_spec(tmp_path, f"http://127.0.0.1:{port}"))
        (bp,) = p.backends
        clock = RunClock()
        status, rec, deps = _parts(tmp_path, bp, http, clock)
        rec.prepare(0, None)
        await run_backend(bp, deps, rec, IdSequence("t-0"), PromptFiles(), p.telemetry_interval_s)
        rec.close()
        nursery.cancel_scope.cancel()
    assert status.reason is None
    (entry,) = rec.levels
    (lv,) = bp.levels
    assert {k: entry[k] for k in lv.to_json()} == lv.to_json()
    assert entry["completed"] is True and entry["sent"] > 4
    assert [w["planned_length_s"] for w in entry["buckets"]] == [b.length_s for b in lv.buckets]
    assert rec.followup is not None and rec.followup["passed"] is True
    lines = gzip.decompress((tmp_path / "ev" / "backends" / "u" / "requests.jsonl.gz").read_bytes()).decode().splitlines()
    ids = [json.loads(x)["request_id"] for x in lines]
    assert sorted(ids) == [f"t-0-{i:07d}" for i in range(len(ids))]  # one sequence, no gaps, no repeats
    assert len(lines) == entry["sent"] + 1  # every level request and the follow-up
    assert rec.ready_at is not None and rec.url == f"http://127.0.0.1:{port}"
    # the simulator's traces are not in a log here (the backend is a url): collection still completes
    doc = collect(p, rec, Progress(quiet=True))
    assert doc["timeouts"] == bp.timeouts() and doc["kind"] == "url" and doc["levels"] == rec.levels


async def test_every_fsync_of_a_run_is_made_off_the_event_loop(tmp_path, monkeypatch):
    """Bucket ends, a level's end, telemetry samples and every file's close fsync on a worker
    thread, so a disk slow to sync (a network volume) never holds up the sends: the event
    loop's thread makes no fsync at all, and each evidence file was synced. So are a bucket
    line's figures computed (p50/p95 over every ITL gap of the bucket: seconds of CPU for a
    fast server's bucket)."""
    from soakspec.evidence.buckets import BucketValues

    loop_thread = threading.current_thread()
    on_loop: list[str] = []
    elsewhere: list[str] = []
    real_fsync = os.fsync
    real_figures = BucketValues.figures

    def fsync(fd: int) -> None:
        (on_loop if threading.current_thread() is loop_thread else elsewhere).append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)

    def figures(self):
        (on_loop if threading.current_thread() is loop_thread else elsewhere).append("bucket figures")
        return real_figures(self)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(BucketValues, "figures", figures)
    async with trio.open_nursery() as nursery, httpx.AsyncClient() as http:
        port = await nursery.start(partial(sim.serve, SimConfig(model="default", ttft=0.005, itl=0.001)))
        p = plan(_spec(tmp_path, f"http://127.0.0.1:{port}"))
        (bp,) = p.backends
        status, rec, deps = _parts(tmp_path, bp, http, RunClock())
        await _start_backend(_Backend(bp, rec, IdSequence("t-0")), p, deps, PromptFiles())
        nursery.cancel_scope.cancel()
    assert status.reason is None and rec.levels[0]["completed"] is True
    assert on_loop == []
    assert {"requests.jsonl.gz", "buckets.jsonl", "telemetry.jsonl", "client.jsonl"} <= set(elsewhere), elsewhere
    assert elsewhere.count("requests.jsonl.gz") >= 3  # each of the two bucket ends, the level's end, the close
    assert elsewhere.count("bucket figures") == 2  # one line a bucket


async def test_a_backend_that_is_never_ready_fails_after_the_planned_timeout(tmp_path, autojump_clock):
    """Virtual time: the probe polls a port that accepts connections but never answers (a
    server slow to come up) until the plan's readiness timeout, and the failure is recorded
    (with its reason) before it is raised."""
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        s.listen(64)  # the kernel accepts connections; nothing ever answers
        port = s.getsockname()[1]
        p = plan(_spec(tmp_path, f"http://127.0.0.1:{port}", ready="10m"))
        (bp,) = p.backends
        async with httpx.AsyncClient() as http:
            status, rec, deps = _parts(tmp_path, bp, http, RunClock(timer=trio.current_time))
            t0 = trio.current_time()
            with pytest.RaisesGroup(pytest.RaisesExc(BackendError, match=r"not ready after 600s")):
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve_backend, bp.launch, deps, rec)
            assert trio.current_time() - t0 == pytest.approx(600.0, abs=1.0)
    assert status.reason is not None and "not ready after 600s" in status.reason
    assert rec.aborted_reason is not None and rec.aborted_reason.startswith("not ready after 600s")


async def test_a_url_backend_that_refuses_connections_fails_readiness_at_once(tmp_path, autojump_clock):
    """Issue 16: nothing listens at a `url` backend's port. Readiness does not wait its 10
    minutes in silence: every retry is shown on stderr, and after the liveness grace (5 s) of
    refused connections it fails with a line that says so."""
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        p = plan(_spec(tmp_path, f"http://127.0.0.1:{port}", ready="10m"))
        (bp,) = p.backends
        async with httpx.AsyncClient() as http:
            status, rec, deps = _parts(tmp_path, bp, http, RunClock(timer=trio.current_time))
            shown: list[str] = []
            deps.progress.error = shown.append  # type: ignore[method-assign]
            t0 = trio.current_time()
            with pytest.RaisesGroup(pytest.RaisesExc(BackendError, match=r"nothing answers at http://127\.0\.0\.1:\d+/v1/models: connection refused \(econnrefused\) for 5s")):
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve_backend, bp.launch, deps, rec)
            assert trio.current_time() - t0 == pytest.approx(5.0, abs=1.0)
    assert len(shown) >= 4 and all("connection refused (econnrefused); retrying (attempt" in line for line in shown)
    assert rec.aborted_reason is not None and rec.aborted_reason.startswith("nothing answers at")


def test_a_rehearsal_records_the_plans_timings(tmp_path):
    """`run --rehearse --time-scale`: the manifest's level timings (warmup, duration, deadline,
    bucket lengths), readiness timeout and grace are the plan's, and the launched command is
    the plan's with the port filled in."""
    spec = _spec(tmp_path, "http://127.0.0.1:9", duration="4s")
    p = plan(spec, rehearse=True, time_scale=0.25)
    result = execute(p, RunOptions(out_dir=tmp_path / "run", quiet=True))
    assert result.status == "complete", result.reason
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert validate("manifest", manifest) == []
    planned = to_json(p)["backends"][0]
    (b,) = manifest["backends"]
    assert b["kind"] == "sim" == planned["launch"]["kind"]
    assert b["timeouts"] == planned["timeouts"]
    assert planned["timeouts"]["ready_timeout_s"] == 5.0 and planned["timeouts"]["shutdown_grace_s"] == 5.0
    port = b["url"].rsplit(":", 1)[1]
    assert b["argv"] == [a.replace("{port}", port) for a in planned["launch"]["argv"]]
    for got, want in zip(b["levels"], planned["levels"], strict=True):
        assert (got["warmup_s"], got["planned_duration_s"], got["deadline_s"], got["bucket_s"]) == (
            want["warmup_s"], want["duration_s"], want["deadline_s"], want["bucket_s"])  # fmt: skip
        assert [w["planned_length_s"] for w in got["buckets"]] == [bk["length_s"] for bk in want["buckets"]]
        assert got["label"] == want["label"]
        assert got["measure_end"] - got["measure_start"] == pytest.approx(want["duration_s"])
    assert p.backends[0].levels[0].duration_s == 1.0


PARALLEL = """\
soak "par" {{
  issue = "13"
  parallel = true
}}
backend "slow" {{
  url = "http://127.0.0.1:{port}"
  ready {{
    timeout = 10m
  }}
}}
backend "fast" {{
  url = "http://127.0.0.1:{port}"
  ready {{
    timeout = 10s
  }}
}}
workload "w" {{
  load {{
    concurrency = 1
  }}
  duration = 1m
  bucket = 1m
}}
gate {{
  require failed == 0
}}
claims {{
  claim "test"
}}
"""


async def test_the_first_failure_ends_the_load_and_is_the_reason(tmp_path, autojump_clock):
    """Side by side, the backend that fails first (never ready within its 10 s) aborts the run:
    its reason is the run's, the other backend's wait is cancelled, and both backends that
    started still get a manifest entry, collected after the load."""
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        s.listen(64)  # accepts, never answers: both backends wait for their readiness timeout
        path = tmp_path / "par.soak"
        path.write_text(PARALLEL.format(port=s.getsockname()[1]))
        spec, diags, _ = load_spec(path)
        assert spec is not None, diags
        p = plan(spec)
        async with httpx.AsyncClient() as http:
            clock = RunClock(timer=trio.current_time)
            layout = RunLayout(tmp_path / "ev")
            status = RunStatus()
            deps = Deps(clock, Progress(quiet=True), http, h11_connect(clock), layout)
            backends = [_Backend(bp, BackendRecorder(bp, layout, status), IdSequence(f"t-{i}")) for i, bp in enumerate(p.backends)]
            t0 = clock.now()
            entries = await _run(backends, p, deps, status, trio.CancelScope())
            took = clock.now() - t0
    assert status.aborted_at is not None and status.aborted_at - t0 == pytest.approx(10.0, abs=1.0)
    # 'slow' (10 min to be ready) was cancelled, not waited for. How soon after 10 s the run
    # ends is not a property here: while a worker thread closes the files, MockClock's autojump
    # skips ahead to the cleanup's own bounded waits (real time spends a millisecond there).
    assert took < 600
    assert status.status == "aborted" and status.reason is not None
    assert status.reason.startswith("backend 'fast': not ready after 10s")
    assert [e["name"] for e in entries] == ["slow", "fast"]
    assert [e["aborted_reason"] for e in entries] == [None, status.failure.message]
    assert all(e["levels"] == [] for e in entries)
