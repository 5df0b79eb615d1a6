"""Plan -> evidence directory: the only stage that does I/O and runs async (trio).

`execute(plan, options)` acts on the plan alone (the runner imports nothing from
`soakspec.lang`). In two phases:

  1. the load, in one cancel scope: each backend (one after another, or side by side when the
     plan says `parallel`) is served (`backend.serve_backend`: launch, readiness probe, watch,
     teardown), driven through its planned levels and the clean follow-up (`driver`), with
     telemetry and progress alongside; everything is recorded as it happens (`recorder`:
     requests.jsonl is appended per request batch and fsynced at every bucket end);
  2. the collection, after that scope has ended (so it is not cancelled, and needs no shield):
     each started backend's runtime boundary, traces and provenance (`collect`), then the
     final manifest.

Aborts (exit 4): a backend that cannot start (its port already answers before it is launched:
`procs.port_taken`), is never ready (its readiness answered by a process that is not the launched
server: `procs.port_owner`), fails its pre-flight request,
dies mid-run or stops answering (its liveness, `runner/liveness.py`); evidence that cannot be
written, during the load or while collecting it after (`collect`: the entry then holds what was
known, `collect.unfinished_entry`); SIGINT, SIGTERM or SIGHUP. Each failure is recorded where it happens (`RunStatus`);
the evidence written so far stays, the manifest is marked `aborted` with the reason and the
time (`aborted_at`), the log lines that look like the cause are shown and kept in the
backend's entry (`crash_diagnosis`), and every server is stopped (SIGTERM, grace, SIGKILL), with
the orphans of their trees the run adopted as its child subreaper (`procs.Orphans`). If soakspec itself is
SIGKILLed, the reaper kills the servers and the manifest still says `running`, which
`verify` and `gate` report as incomplete; so does a final manifest the disk refuses (the
start-of-run one stays whole: it is replaced atomically), the write error and the run's own
reason both said.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import os
import secrets as _secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import trio

from soakspec import heap
from soakspec.evidence import layout as L
from soakspec.evidence import schema as schemas
from soakspec.evidence.io import EvidenceError, RunLock
from soakspec.evidence.manifest import finalize_manifest, new_manifest, write_manifest
from soakspec.evidence.provenance import git_state
from soakspec.evidence.redact import inherited_secret_values, record_redactor, secret_values, use_secrets
from soakspec.evidence.telemetry import NvmlSource
from soakspec.evidence.traces import file_offset
from soakspec.plan import BackendPlan, Plan
from soakspec.runner.backend import Deps
from soakspec.runner.clock import RunClock
from soakspec.runner.collect import collect
from soakspec.runner.driver import run_backend
from soakspec.runner.fdlimit import exhaustion_text, local_errno, raise_open_files_limit
from soakspec.runner.h11client import H11Connection
from soakspec.runner.ids import IdSequence
from soakspec.runner.procs import BackendError, Orphans, PortAllocator, Reaper, diagnosis_text
from soakspec.runner.progress import Progress
from soakspec.runner.prompts import PromptFiles, RunAborted, load_prompts
from soakspec.runner.recorder import BackendRecorder, RunStatus, off_loop

PROBE_HTTP_TIMEOUT = httpx.Timeout(10.0)  # the readiness probes' client (each attempt has its own bound)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    out_dir: Path | None = None  # the evidence directory; default soak-evidence/<run_id>
    run_id: str | None = None
    quiet: bool = False
    argv: tuple[str, ...] = ()
    nvml_module: Any = None  # test seam for telemetry
    workers: int = 1  # load processes per level (`--workers`, see runner/workers.py)
    preflight: bool = True  # `--no-preflight` turns it off (recorded in the manifest)
    sweep_judge: Any = None  # a sweep's per-level judgement (runner.backend.Deps.sweep_judge)


@dataclasses.dataclass(frozen=True)
class RunResult:
    run_dir: Path
    status: str  # complete | aborted | incomplete
    reason: str | None
    late_signal: str | None = None  # a signal after the load ended: the evidence is whole, not to be judged


def make_run_id(name: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{L.safe_name(name)}-{stamp}-{_secrets.token_hex(3)}"


def h11_connect(clock: RunClock):
    """The load's HTTP connection factory: the h11 hot path (runner/h11client.py)."""

    def connect(host: str, port: int, api_key: str | None) -> H11Connection:
        return H11Connection(host, port, clock, api_key=api_key)

    return connect


def run_secrets(plan: Plan) -> set[str]:
    """Secret values the run knows: those written in the spec (env, launch argv, shell command
    lines), the endpoints' API keys (read from the environment), and those of the secret-named
    variables of soakspec's environment that a launched server inherits (`runner/backend.py`
    starts it with os.environ under the spec's env): it may print them too."""
    found = set(plan.spec_secrets)
    found |= {os.environ[name] for name in plan.api_key_envs if os.environ.get(name)}
    for bp in plan.backends:
        if bp.launch.launches:
            found |= inherited_secret_values(os.environ, dict(bp.launch.env))
    return found


@dataclasses.dataclass
class _Backend:
    """One backend's parts for this run."""

    plan: BackendPlan
    recorder: BackendRecorder
    ids: IdSequence


async def _start_backend(b: _Backend, plan: Plan, deps: Deps, prompts: PromptFiles) -> None:
    bp = b.plan
    tr = bp.traces
    # only what the server appends from now on belongs to this run
    offset = file_offset(tr.file) if tr.source == "jsonl" and tr.file else 0
    before = await trio.to_thread.run_sync(git_state, plan.source_repo) if plan.source_repo is not None else None
    b.recorder.prepare(offset, before)
    try:
        await run_backend(bp, deps, b.recorder, b.ids, prompts, plan.telemetry_interval_s)
    finally:
        await off_loop(b.recorder.close)  # its last fsyncs: another backend may still be loading


async def _run_backends(backends: list[_Backend], plan: Plan, deps: Deps) -> None:
    prompts = PromptFiles()
    if plan.parallel:
        async with trio.open_nursery() as n:
            for b in backends:
                n.start_soon(_start_backend, b, plan, deps, prompts)
    else:
        for b in backends:
            await _start_backend(b, plan, deps, prompts)


async def _signals(scope: trio.CancelScope, status: RunStatus, progress: Progress, *,
                   task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The first SIGINT, SIGTERM or SIGHUP cancels the load. Later ones, while the evidence is
    being finished, are said and absorbed: the run is already stopping, and the default action
    then (a second Ctrl-C, a service manager's repeated SIGTERM) killed soakspec with the
    manifest still `running`. One that comes after the load ended (every level and the
    follow-up done, the evidence being collected) cuts nothing: the run stays complete and only
    its judging is skipped (`RunStatus.late_signal`; calling it interrupted FAILed `require
    completed_run` on a soak every level of which ran). The judging after the run can be
    interrupted (commands/run.py); SIGKILL stops anything, leaving evidence `verify` calls
    incomplete."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as sigs:
        task_status.started()
        async for signum in sigs:
            name = signal.Signals(signum).name
            if status.signal_name is None and status.load_ended and status.late_signal is None:
                # the load is over: what it measured is whole, and calling the run interrupted
                # failed a soak every level of which ran (`require completed_run`); the evidence
                # is finished as it is and only the judging after it is skipped (commands/run.py)
                status.late_signal = name
                progress.error(f"soakspec run: {name} after the load ended: finishing its evidence, which is whole, "
                               "then not judging it")
            elif status.signal_name is None and not status.load_ended:
                status.interrupted(name)
                scope.cancel()
            else:
                progress.error(f"soakspec run: {name} again: already stopping; finishing the evidence first (SIGKILL "
                               "would leave it incomplete)")


async def _load(load_scope: trio.CancelScope, backends: list[_Backend], plan: Plan, deps: Deps, status: RunStatus) -> None:
    """Phase 1. A backend or evidence failure ends it (recorded where it happened); a signal cancels it."""
    with load_scope:
        try:
            await _run_backends(backends, plan, deps)
        except* (BackendError, EvidenceError) as group:
            status.failed_with(group)  # keeps the first failure's reason, recorded before it was raised
        except* RunAborted as group:
            # the run cannot go on as planned (e.g. token-exact prompts cannot be built): its reason
            if status.reason is None:
                # when it was caught: the manifest's aborted_at is null only for a signal (a load
                # process killed as it started left it null too)
                status.reason, status.aborted_at = _first_leaf(group).reason, deps.clock.now()
        except* OSError as group:
            # the load generator's own limits (out of file descriptors, ...: runner/fdlimit.py) met
            # somewhere its requests do not record it: the client's failure, said as such
            code = local_errno(group)
            if code is None:
                raise
            if status.reason is None:
                status.reason = f"{exhaustion_text(code)} ({_first_leaf(group)})"
    err = status.failure
    if status.signal_name is not None:
        deps.progress.error(f"soakspec run: {status.reason}; servers stopped, evidence kept")
    elif status.reason is not None:
        deps.progress.error(f"soakspec run: {status.reason}")
        if err is not None and (err.log_tail or err.diagnosis):
            deps.progress.error(diagnosis_text(err))


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    e: BaseException = group
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return e


async def _run(backends: list[_Backend], plan: Plan, deps: Deps, status: RunStatus,
               load_scope: trio.CancelScope) -> list[dict[str, Any]]:
    """Both phases: a signal (`_signals`, watching from `_execute`) cancels the load, not the collection."""
    await _load(load_scope, backends, plan, deps, status)
    status.load_ended = True  # a signal from here on does not cut the run (`_signals`)
    # phase 2: the load's cancel scope has ended, so nothing here is cancelled (and needs no shield);
    # what the load freed (connections, buffers) goes back to the system before collecting and judging
    heap.release()
    return [await trio.to_thread.run_sync(collect, plan, b.recorder, deps.progress) for b in backends if b.recorder.started]


@contextlib.contextmanager
def _reaper(orphans: Orphans) -> Iterator[Reaper]:
    reaper = Reaper(orphans)
    reaper.start()
    try:
        yield reaper
    finally:
        reaper.close()


async def _execute(plan: Plan, options: RunOptions, progress: Progress, layout: L.RunLayout, run_id: str) -> RunStatus:
    """The run, with SIGINT, SIGTERM and SIGHUP watched from its first step to its final
    manifest (`_signals`): the first cancels the load, later ones cannot kill the run before
    its manifest is final (a second SIGTERM while the manifest was fsynced did)."""
    status = RunStatus()
    try:
        async with trio.open_nursery() as guard:
            load_scope = trio.CancelScope()
            await guard.start(_signals, load_scope, status, progress)
            orphans = _adopting(plan)
            try:
                return await _execute_watched(plan, options, progress, layout, run_id, status, load_scope, orphans)
            finally:
                orphans.disable()
                guard.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # the run's own failure, not the watch's: as it was raised
        if len(group.exceptions) == 1:
            e = group.exceptions[0]
            raise e from e.__cause__
        raise


def _adopting(plan: Plan) -> Orphans:
    """The run's child-subreaper state (`procs.Orphans`): enabled when a backend is launched, so
    that the orphans of its servers' trees come to this process and are stopped with them."""
    orphans = Orphans()
    if any(bp.launch.launches for bp in plan.backends):
        orphans.enable()
    else:
        orphans.why_not = "no backend is launched"
    return orphans


INVENTORY_TIMEOUT_S = 30.0  # nvmlInit and the device inventory, at most, before the run goes on without GPUs


async def _gpu_inventory(nvml: NvmlSource) -> dict[str, Any]:
    """The manifest's `gpus`, taken on a worker thread given up after INVENTORY_TIMEOUT_S: on a
    wedged driver nvmlInit itself hangs, and in this thread it would hang the run before it
    began, deaf to Ctrl-C (trio delivers it at a checkpoint, and a C call has none)."""
    with trio.move_on_after(INVENTORY_TIMEOUT_S):
        return await trio.to_thread.run_sync(nvml.gpu_inventory, abandon_on_cancel=True)
    why = f"NVML did not answer within {INVENTORY_TIMEOUT_S:g}s (nvmlInit and the GPU inventory)"
    nvml.stall(why)
    return {"available": False, "reason": why}


async def _execute_watched(plan: Plan, options: RunOptions, progress: Progress, layout: L.RunLayout, run_id: str,
                           status: RunStatus, load_scope: trio.CancelScope, orphans: Orphans) -> RunStatus:
    clock = RunClock()
    nvml = NvmlSource(options.nvml_module) if options.nvml_module is not None else NvmlSource()
    gpus = await _gpu_inventory(nvml)
    secrets = run_secrets(plan)
    # every record this run freezes (its tasks and threads inherit this context; it ends with
    # `trio.run`) quotes the server's text with these redacted (RequestRecord.freeze)
    use_secrets(secrets)
    manifest = new_manifest(
        run_id=run_id, spec_text=plan.spec_text, spec_path=plan.spec_path, rehearsal=plan.rehearsal,
        time_scale=plan.time_scale, started_at=clock.now(), gpus=gpus, command=list(options.argv), secrets=secrets,
        spec_secrets=plan.spec_secrets,
    )  # fmt: skip
    manifest["preflight"] = options.preflight
    if files := plan.prompt_files():
        manifest["spec"]["prompt_files"] = files
    if (nofile := raise_open_files_limit()) is not None:  # soft RLIMIT_NOFILE lifted to the hard limit
        manifest["host"]["open_files_limit"] = nofile
    if plan.only is not None:
        manifest["only"] = list(plan.only)  # a --backend run: the judge expects just these backends
    manifest["host"]["child_subreaper"] = orphans.to_json()
    write_manifest(layout.root, manifest)
    # progress and error output (a server's log tail included) never shows them either
    progress.add_secrets(secrets)
    prefix = "soak-" + _secrets.token_hex(4)
    backends = [_Backend(bp, BackendRecorder(bp, layout, status), IdSequence(f"{prefix}-{i}")) for i, bp in enumerate(plan.backends)]
    entries: list[dict[str, Any]] = []
    try:
        schemas.preload()  # no schema file is opened mid-load, when the load may hold every descriptor
        if plan.require_gpus and not (gpus.get("available") and gpus.get("devices")):
            why = gpus.get("reason") or f"no device matches CUDA_VISIBLE_DEVICES={gpus.get('cuda_visible_devices')!r}"
            status.reason = f"the spec requires GPUs and NVML reports none ({why})"
            progress.error(f"soakspec run: {status.reason}")
        else:
            with _reaper(orphans) as reaper:
                async with httpx.AsyncClient(timeout=PROBE_HTTP_TIMEOUT, trust_env=False) as http:
                    # one allocator for the run: no two of its launched servers are given one port
                    deps = Deps(clock, progress, http, h11_connect(clock), layout, reaper, nvml, options.workers,
                                options.preflight, sweep_judge=options.sweep_judge, ports=PortAllocator())  # fmt: skip
                    entries = await _run(backends, plan, deps, status, load_scope)
    except BaseException as e:  # not foreseen (a bug): the manifest still ends, aborted, saying why
        if status.reason is None:
            leaf = _first_leaf(e) if isinstance(e, BaseExceptionGroup) else e
            status.reason = "interrupted by SIGINT" if isinstance(leaf, KeyboardInterrupt) else f"internal error: {type(leaf).__name__}: {leaf}"
        with contextlib.suppress(Exception):
            entries = entries or [collect(plan, b.recorder, progress) for b in backends if b.recorder.started]
        with contextlib.suppress(Exception):
            _finalize(layout, manifest, backends, entries, status, clock.now(), nvml.stalled)
        raise
    finally:
        nvml.close()
    try:
        _finalize(layout, manifest, backends, entries, status, clock.now(), nvml.stalled)
    except EvidenceError:
        # the disk refused the final manifest: manifest.json is still the start-of-run one (written
        # atomically: never half-written), which `verify` and `gate` read as never finalized; the
        # run's own ending is said here, the write error itself by the caller
        ended = status.status if status.reason is None else f"{status.status}: {status.reason}"
        if layout.manifest.is_file():
            progress.error(f"soakspec run: the final manifest could not be written; {layout.manifest} still says "
                           f"`running` (the run ended {ended})")
        else:  # the directory was removed or moved during the run: no manifest is there to say anything
            progress.error(f"soakspec run: the final manifest could not be written: {layout.root} no longer holds the "
                           f"run's evidence (removed or moved during the run; the run ended {ended})")
        raise
    return status


def _finalize(layout: L.RunLayout, manifest: dict[str, Any], backends: list[_Backend], entries: list[dict[str, Any]],
              status: RunStatus, ended_at: float, gpus_stalled: str | None = None) -> None:  # fmt: skip
    """The final manifest; `ended_at` is the run clock's, as `started_at` (a wall-clock step during
    the run must not move the end away from every other time the run wrote). `gpus_stalled`:
    why GPU telemetry stopped mid-run (`NvmlSource.stall`), kept as `gpus.stalled`."""
    manifest["aborted_at"] = status.aborted_at
    if gpus_stalled is not None and manifest["gpus"].get("available"):
        manifest["gpus"] = {**manifest["gpus"], "stalled": gpus_stalled}
    aborts = [b.recorder.abort_fired for b in backends if b.recorder.abort_fired is not None]
    if status.reason is not None:  # it may quote the server or an exception's text: the run's secrets go
        status.reason = record_redactor().text(status.reason)
    finalize_manifest(layout.root, manifest | {"backends": entries, "aborts": aborts}, status.status, status.reason,
                      ended_at=ended_at)


def execute(plan: Plan, options: RunOptions, progress: Progress | None = None) -> RunResult:
    """Run the plan; returns where the evidence is and how the run ended."""
    progress = progress or Progress(quiet=options.quiet)
    run_id = options.run_id or make_run_id(plan.name)
    layout = L.RunLayout(Path(options.out_dir) if options.out_dir else Path("soak-evidence") / run_id)
    with RunLock(layout.root):
        progress.start()
        try:
            status = trio.run(_execute, plan, options, progress, layout, run_id, restrict_keyboard_interrupt_to_checkpoints=True)
        finally:
            progress.stop()
    return RunResult(layout.root, status.status, status.reason, status.late_signal)


__all__ = ["RunAborted", "RunOptions", "RunResult", "execute", "load_prompts", "make_run_id", "secret_values"]
