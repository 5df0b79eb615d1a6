"""One backend during a run: its server, its telemetry, its progress ticker.

`serve_backend(launch, deps, recorder)` is started with `await nursery.start(...)`: it launches
the server (or reaches an already running one), polls the readiness probe for at most the
plan's `Probe.timeout_s`, reports the base URL with `task_status.started(url)`, and then
watches the backend until cancelled: a server process that exits during the run, or a backend
(launched or `url`) that stops answering by the plan's `Liveness` rule (`runner/liveness.py`),
raises `BackendError` -- with the log lines that look like the cause (`procs.crash_lines`) --
and the run aborts. When it is cancelled (the load is done, or the run aborts) it stops the
server -- SIGTERM, the plan's grace, SIGKILL -- in a shielded cancel scope bounded by
`Launch.stop_bound_s`.

The server is stopped only once its load has stopped (`load_stopped`, set by the driver when
its load has unwound; waited for at most `LOAD_STOP_BOUND_S`): an interrupt cancels both at
once, and `--workers` processes learn of it only when their stdin closes, a moment later. A
server stopped first closes their in-flight requests ("connection closed before the response
finished": a server failure in the evidence) and refuses the ones they send next, where the
interrupt, not the server, ended them ("the run was aborted before the response finished").
A server that fails by itself (it exits, or its liveness watch finds it dead) is stopped at
once: its load is cancelled only after that.

A `url` backend that refuses every connection fails readiness after the liveness grace with a
clear line (each retry shown on stderr), not after the full readiness timeout in silence.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable

import httpx
import trio

from soakspec.evidence.io import EvidenceError, JsonlWriter
from soakspec.evidence.layout import RunLayout
from soakspec.evidence.redact import redact_argv
from soakspec.evidence.telemetry import CpuMeter, NvmlSource, telemetry_record
from soakspec.plan import PROGRESS_INTERVAL_S, Launch
from soakspec.runner.clock import RunClock
from soakspec.runner.liveness import Health, watch_liveness
from soakspec.runner.load import Connection
from soakspec.runner.procs import (
    BackendError,
    PortAllocator,
    ReadinessProbe,
    Reaper,
    crash_lines,
    describe_exit,
    full_disk_note,
    launch,
    log_tail,
    port_taken,
    stop,
)
from soakspec.runner.progress import Progress
from soakspec.runner.recorder import BackendRecorder, durable, off_loop
from soakspec.runner.workers import STOP_GRACE

# how long a cancelled backend's server waits for its load to stop before it is stopped anyway:
# the load's own bound (`--workers` processes get STOP_GRACE to flush; one process ends at once)
LOAD_STOP_BOUND_S = STOP_GRACE + 1.0

ConnectionFactory = Callable[[str, int, "str | None"], Connection]  # (host, port, api key) -> connection


@dataclasses.dataclass(frozen=True)
class Deps:
    """What the run's parts share, passed in explicitly (tests pass their own)."""

    clock: RunClock
    progress: Progress
    http: httpx.AsyncClient  # readiness probes
    connect: ConnectionFactory  # the load's HTTP connections
    layout: RunLayout
    reaper: Reaper | None = None
    nvml: NvmlSource | None = None
    workers: int = 1  # load processes per level (`--workers`)
    preflight: bool = True  # one request of each workload's shape must complete before any level
    # a sweep's per-level judgement, from the command layer (the runner never imports the judge):
    # (backend, the probe's manifest level entry, its request rows, its client.jsonl samples)
    # -> (the level holds, why); the gate's per-probe checks (judge/sweep.py `judge_level`)
    sweep_judge: "Callable[[str, dict, list[dict], list[dict]], tuple[bool, str]] | None" = None
    # the ports the run's launched servers are given, each one once (the engine makes one a run;
    # a Deps made without one -- a test's -- has its own)
    ports: PortAllocator = dataclasses.field(default_factory=PortAllocator)


async def serve_backend(
    la: Launch,
    deps: Deps,
    rec: BackendRecorder,
    health: Health | None = None,
    *,
    load_stopped: trio.Event | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start the backend, report its URL once ready, watch it, stop it (see the module docstring)."""
    if not la.launches:
        url = la.base_url(None)
        await _until_ready(la, url, None, deps, rec)
        task_status.started(url)
        if health is not None:
            await _watch(la, url, None, health, deps, rec)
        return
    port = deps.ports.allocate(la.host)
    if port is None:
        why = (f"no port for its server: the OS answered only ports this run had already handed out, "
               f"{deps.ports.tries} times in a row; nothing was launched")
        raise rec.failed(BackendError(la.name, why), deps.clock.now())
    url = la.base_url(port)
    argv = la.command(port)
    env = {**os.environ, **dict(la.env)}
    env.setdefault("PYTHONUNBUFFERED", "1")
    started = deps.clock.now()
    rec.launching(argv, url, started)
    if (holder := port_taken(la.host, port)) is not None:
        raise rec.failed(BackendError(la.name, _port_taken_message(la, port, holder)), deps.clock.now())
    deps.progress.log(f"[{la.name}] starting: {' '.join(redact_argv(argv))}")
    log = str(rec.server_log) if la.capture_log else None
    try:
        server = await launch(la.name, argv, env, la.cwd, log, deps.reaper, started)
    except BackendError as e:
        rec.failed(e, deps.clock.now())
        raise
    rec.launched(server)
    started = False
    try:
        await _until_ready(la, url, server, deps, rec)
        if deps.reaper is not None:
            deps.reaper.tell_orphans()  # what the server's start left behind, before any load
        task_status.started(url)
        started = True
        async with trio.open_nursery() as watchers:
            if health is not None:
                watchers.start_soon(_watch, la, url, server, health, deps, rec, watchers.cancel_scope)
            if deps.reaper is not None:
                watchers.start_soon(_tell_orphans, deps.reaper)
            rc = await server.process.wait()
            watchers.cancel_scope.cancel()
        if rec.aborted_reason is not None:  # the liveness watch found it dead first
            assert rec.failure is not None
            raise rec.failure
        server.poll()
        why = f"server {describe_exit(rc)} during the run" + _left_behind(server) + full_disk_note(server.log_path, rc)
        raise rec.failed(BackendError(la.name, why, log_tail(server.log_path), crash_lines(server.log_path)),
                         deps.clock.now())
    finally:
        # cancelled from outside (-inf: the load ends or the run aborts), not failing by itself
        if started and load_stopped is not None and trio.current_effective_deadline() == -math.inf:
            with trio.move_on_after(LOAD_STOP_BOUND_S, shield=True):
                await load_stopped.wait()  # its in-flight requests end as the interrupt's, not the server's
        with trio.move_on_after(la.stop_bound_s, shield=True):
            await stop(server, la.shutdown_grace_s, la.kill_wait_s, deps.reaper)
        if server.orphans_stopped:
            pids = ", ".join(map(str, server.orphans_stopped[:5]))
            deps.progress.error(f"[{la.name}] stopped {len(server.orphans_stopped)} process(es) left running outside its "
                                f"server's process group and tree (PID {pids}), found as orphans soakspec adopted")


ORPHAN_SCAN_S = 2.0  # how often the reaper process is told the orphans the run has adopted


async def _tell_orphans(reaper: Reaper) -> None:
    """Every ORPHAN_SCAN_S while the server runs: the reaper process learns each orphan the run
    adopted (`procs.Orphans`), so that a SIGKILLed soakspec leaves none of them running."""
    while True:
        await trio.sleep(ORPHAN_SCAN_S)
        reaper.tell_orphans()


def _port_taken_message(la: Launch, port: int, holder: str) -> str:
    """Why a backend is not launched: its port already answers (`procs.port_taken`)."""
    shown = f"[{la.host}]" if ":" in la.host else la.host
    return (f"{shown}:{port}, the port soakspec picked for it, already accepts connections{holder}; nothing was "
            "launched: a server left from an earlier run (or another run's) would answer the readiness probe "
            "and the load in place of this one -- stop it, then run again")


def _left_behind(server) -> str:
    """What a server that ended mid-run left running, for the abort's reason. Its own workers,
    still in its process group (a main process SIGKILLed by the OOM killer orphans vLLM's engine
    core), are said as such; only processes that left the group -- a launcher that daemonized its
    server, which exits while the server serves on -- are the unsupported launch."""
    left = server.stragglers()
    if not left:
        return ""

    def in_group(pid: int) -> bool:
        try:
            return os.getpgid(pid) == server.pgid
        except OSError:  # gone meanwhile
            return True

    outside = sorted(p for p in left if not in_group(p))
    if outside:
        return (f", leaving {len(outside)} of its processes running outside its process group (PID "
                f"{', '.join(map(str, outside[:5]))}): a launcher that daemonizes its server is not supported, "
                "launch the server in the foreground; they are stopped with the run")
    ours = sorted(left)
    n = len(ours)
    return (f"; {n} process{'es' if n > 1 else ''} it started (PID {', '.join(map(str, ours[:5]))}) "
            f"{'were' if n > 1 else 'was'} still running, stopped with the run")


async def _watch(la: Launch, url: str, server, health: Health, deps: Deps, rec: BackendRecorder,
                 scope: trio.CancelScope | None = None) -> None:  # fmt: skip
    """The liveness watch; when it finds the backend dead, record it (with the log's cause
    lines, for a launched server) and raise, or cancel `scope` (the process watch) so that
    `serve_backend` raises it outside its nursery."""
    try:
        await watch_liveness(la, url, health, deps.http)
    except BackendError as e:
        if server is not None:
            e = BackendError(e.backend, e.message, log_tail(server.log_path), crash_lines(server.log_path))
        deps.progress.error(f"[{la.name}] {e.message}: stopping its load")
        rec.failed(e, deps.clock.now())
        if scope is None:
            raise e from None
        scope.cancel()


async def _until_ready(la: Launch, url: str, server, deps: Deps, rec: BackendRecorder) -> None:
    shown = [0.0]

    def on_retry(attempt: int, seen: str) -> None:  # a url backend: say why we are still waiting
        t = trio.current_time()
        if t - shown[0] >= 1.0:
            shown[0] = t
            deps.progress.error(f"[{la.name}] {la.probe.method} {url + la.probe.path}: {seen}; retrying (attempt {attempt})")

    def on_hint(hint: str) -> None:  # a launched server listening where it is not probed: said at once
        deps.progress.error(f"[{la.name}] {url + la.probe.path} refuses connections, but {hint}")

    probe = ReadinessProbe(la.name, url + la.probe.path, la.probe, server, deps.http,
                           refused_grace_s=la.liveness.grace_s, on_retry=on_retry, on_hint=on_hint)  # fmt: skip
    try:
        with trio.move_on_after(la.probe.timeout_s) as scope:
            await probe.wait()
    except BackendError as e:
        rec.failed(e, deps.clock.now())
        raise
    if scope.cancelled_caught:
        raise rec.failed(probe.timed_out(), deps.clock.now())
    if (owner := probe.port_owner) is not None:
        rec.port_listener = owner.to_json()
        if owner.owner == "unknown":
            deps.progress.log(f"[{la.name}] which process answers at {url} was not checked ({owner.reason}): "
                              "the run goes on, and the manifest's port_listener says why")
    took = rec.ready(deps.clock.now(), url)
    deps.progress.log(f"[{la.name}] ready after {took:.1f}s at {url}")


SAMPLE_TIMEOUT_S = 10.0  # a telemetry sample not taken by then is given up (NVML hung: `NvmlSource.stall`)


async def sample_telemetry(deps: Deps, rec: BackendRecorder, interval_s: float) -> None:
    """GPU and server-process samples (RSS, CPU) every `interval_s` into telemetry.jsonl, each fsynced.

    A sample is taken on a worker thread that is abandoned when it has not returned within
    SAMPLE_TIMEOUT_S, or when the run ends: NVML's calls hang on a wedged driver or a GPU fallen
    off the bus, and the thread cannot be interrupted. NVML is then `stall`ed for the rest of
    the run (every later call would queue behind the hung one) and sampling goes on without
    GPUs: the samples' `gpus` unknown, the manifest's `gpus.stalled` saying why."""
    pid = rec.server.pid if rec.server is not None else None
    nvml = _server_gpus(deps.nvml, rec.bp.launch)
    cpu = CpuMeter()
    try:
        w = JsonlWriter(deps.layout.telemetry(rec.name), schema="telemetry")
        try:
            while True:
                # the run clock's time (read here: the thread cannot read a test's trio clock), as
                # every time of the run: the judge places samples in the bucket windows by it
                t = deps.clock.now()
                sample = None
                with trio.move_on_after(SAMPLE_TIMEOUT_S):
                    sample = await trio.to_thread.run_sync(telemetry_record, nvml, pid, t, cpu, abandon_on_cancel=True)
                if sample is not None:
                    w.write(sample)
                    await durable(w)
                else:
                    if nvml is not None and nvml.stalled is None:
                        why = f"NVML did not answer within {SAMPLE_TIMEOUT_S:g}s (backend '{rec.name}''s telemetry sample)"
                        nvml.stall(why)
                        deps.progress.log(f"[{rec.name}] {why}: GPU telemetry stops for the rest of the run; "
                                          "the server's RSS and CPU are still sampled")
                    cpu = CpuMeter()  # the abandoned thread may still return into the old one
                await trio.sleep(interval_s)
        finally:
            await off_loop(w.close)
    except EvidenceError as e:
        raise rec.status.evidence_failed(e)


def _server_gpus(nvml: NvmlSource | None, la: Launch) -> NvmlSource | None:
    """The GPUs a launched server sees: its own CUDA_VISIBLE_DEVICES (the spec's `gpus` or
    `env`) when the spec sets one, else soakspec's (which the server inherits); a url
    backend's server was not started with either, so it is sampled as soakspec sees the GPUs."""
    env = dict(la.env)
    if nvml is None or not la.launches or "CUDA_VISIBLE_DEVICES" not in env:
        return nvml
    return nvml.restricted(env["CUDA_VISIBLE_DEVICES"])


async def tick_progress(progress: Progress, rec: BackendRecorder) -> None:
    while True:
        progress.tick(rec.stats)
        await trio.sleep(PROGRESS_INTERVAL_S)


__all__ = ["ConnectionFactory", "Deps", "sample_telemetry", "serve_backend", "tick_progress"]
