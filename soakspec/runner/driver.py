"""The load driver: the pre-flight, a backend's planned levels one after another, then the
clean follow-up.

`drive_backend` sends nothing the plan does not say: each level's shape, request template,
buckets and deadlines come from its `Level`; records go to the backend's recorder.

Pre-flight (unless `--no-preflight`): before any level, one request of each workload's shape
must complete: its template's body (model, endpoint, chat or completion, headers, extra fields)
with the prompt `Shapes.make(0, asked=True)` makes -- a word or token-exact prompt of its first
length and max_tokens as asked, never ones `length_range` draws (README, Random lengths; the
prompt the pre-flight's own, salted with its request id, so no two pre-flights and no level send
the same token prompt and none is served from the prefix cache), a file's first prompt, a session's first
turn. For a replay that is *not* trace line 0: a token prompt of the template's length. Line 0's
real body would build its `hash_ids` blocks, which later trace requests share, so the pre-flight
would put them in the server's prefix cache before the level and raise the level's measured hit
rate (its first requests would hit blocks that in the trace's own order are cold); the body's
shape is what the pre-flight checks, and that is the same. A 4xx/5xx, an error event or a
malformed stream stops the run before the soak (`BackendError`, exit 4) with the server's own
words ("HTTP 400: ... default chat template is no longer allowed ..."). Those requests are kept
in the backend's manifest entry (`preflight`), not in requests.jsonl: they measure nothing.

The backend's `Health` (runner/liveness.py) is shared by its liveness watch and its load: a
dead backend's load stops (the watch raises), and refused connects back off meanwhile.
"""

from __future__ import annotations

import functools
import math
import os
import re
import sys
from typing import NoReturn

import trio

from soakspec.plan import BackendPlan, Level, RequestTemplate, probe_level
from soakspec.runner.abort import AbortWatch, Fired, row_of
from soakspec.runner.backend import Deps, sample_telemetry, serve_backend, tick_progress
from soakspec.runner.clienthealth import ClientLog, LoopMonitor
from soakspec.runner.ids import IdSequence
from soakspec.runner.liveness import Health, dead_message
from soakspec.runner.logfile import ExternalLog, LogCopyRefused
from soakspec.runner.procs import BackendError
from soakspec.runner.load import CLOSE_S, Bisection, LevelContext, LevelRun, Shapes, drive_level
from soakspec.runner.prompts import PromptFiles
from soakspec.runner.recorder import BackendRecorder, off_loop
from soakspec.evidence.record import FOLLOW_UP_BUCKET, iter_records
from soakspec.runner.scrape import LastScrape, scrape_metrics
from soakspec.runner.records import RequestRecord
from soakspec.runner.workers import drive_level_workers, processes_for
from soakspec.units import format_duration


async def run_backend(bp: BackendPlan, deps: Deps, rec: BackendRecorder, ids: IdSequence, prompts: PromptFiles, telemetry_interval_s: float) -> None:
    """Serve the backend, drive its load with telemetry and progress alongside, stop it. A url
    backend's `log_file` is read from its size now: what it gains becomes the backend's server.log."""
    health = Health(deps.clock, bp.launch.liveness)
    banner = bp.runtime.log_regex if bp.runtime is not None else None
    log = ExternalLog.at_start(bp.launch.log_file, banner) if bp.launch.log_file else None
    client = ClientLog(deps.layout.client)  # the load generator's own health, every run (clienthealth.py)
    load_stopped = trio.Event()  # the server is stopped after its load (runner/backend.py)
    try:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(serve_backend, bp.launch, deps, rec, health, load_stopped=load_stopped))
            nursery.start_soon(sample_telemetry, deps, rec, telemetry_interval_s)
            last = LastScrape()
            if bp.metrics is not None:
                nursery.start_soon(scrape_metrics, bp.metrics, url, deps, rec, last)
            nursery.start_soon(tick_progress, deps.progress, rec)
            nursery.start_soon(LoopMonitor(deps.clock, client.write, backend=bp.name, held=health.held_s).run)
            try:
                await drive_backend(bp, url, deps, rec, ids, prompts, health, client)
                if bp.metrics is not None:
                    await last.after_load(bp.metrics)  # a scrape after the last bucket, the server still up
            finally:
                load_stopped.set()  # its requests are recorded and its workers have stopped
            nursery.cancel_scope.cancel()
    finally:
        failing = sys.exc_info()[1]  # the load's own failure or cancellation, if any
        await off_loop(client.close)
        rec.wall_steps = client.steps.steps()  # collect's trace matching places traces across them
        if rec.wall_steps:
            steps = ", ".join(f"{d:+.3f} s" for d in rec.wall_steps)
            deps.progress.log(f"[{bp.name}] the machine's wall clock was stepped during the load ({steps}): "
                              "the run's times stay on its own clock; server traces are matched across the step")
        if log is not None:
            try:
                rec.external_log = await off_loop(log.copy_into, rec.server_log)
            except LogCopyRefused as e:  # server.log could not be written: the run's evidence is incomplete
                rec.external_log = e.entry
                rec.status.evidence_failed(e)
                if failing is None:  # the load ended as planned: the run aborts on this
                    raise


async def drive_backend(
    bp: BackendPlan, url: str, deps: Deps, rec: BackendRecorder, ids: IdSequence, prompts: PromptFiles,
    health: Health | None = None, client: ClientLog | None = None,
) -> None:  # fmt: skip
    host, port = host_port(url)

    def connector(template: RequestTemplate):
        api_key = os.environ.get(template.api_key_env) if template.api_key_env else None
        return lambda: deps.connect(host, port, api_key)

    if deps.preflight:
        await preflight(bp, url, deps, rec, ids, prompts, connector)
    # an abort rule that fires cancels the rest of the load: no later level, no follow-up
    watch = AbortWatch(bp.name, bp.aborts)
    with trio.CancelScope() as load:
        watch.on_fire = lambda _fired: load.cancel()
        for lv in bp.levels:
            shapes = Shapes(lv.request, prompts(lv.request.prompt_file))
            await shapes.prepare(url)
            if lv.sweep is not None:
                await _drive_sweep(bp, lv, deps, rec, ids, shapes, connector(lv.request), (host, port), watch, health, client)
                continue
            await _drive_level(bp, lv, deps, rec, ids, shapes, connector(lv.request), (host, port), watch, health, client)
    if watch.fired is not None:
        if watch.fired.gone:
            _server_gone(bp.name, watch.fired, deps, rec, health)
        rec.abort_fired = watch.fired.to_json()
        deps.progress.error(f"soakspec run: {watch.fired.describe()}; the rest of the load is not run")
        return
    if bp.follow_up:
        fu = bp.follow_up_request
        fu_shapes = Shapes(fu, prompts(fu.prompt_file))
        await fu_shapes.prepare(url)
        await follow_up(bp, deps, rec, ids, fu_shapes, connector(fu))


def _server_gone(name: str, fired: Fired, deps: Deps, rec: BackendRecorder, health: Health | None) -> NoReturn:
    """An abort rule fired on requests that all found the server gone (`abort.server_gone`):
    the liveness watch's verdict, seen first -- an open loop's short bucket fills with
    held-back arrivals before the watch's 5 s grace. The run aborts (exit 4) as the watch
    aborts it, its reason worded the same (`liveness.dead_message`) and saying which rule
    saw it; no `aborts` entry: it is the backend's death, not a gate rule's failure."""
    problem = health.last_problem if health is not None and health.refusing and health.last_problem else fired.refused
    since = health.refused_since if health is not None and health.refused_since is not None else fired.start
    seen = "the built-in abort" if fired.rule.builtin else f"abort rule '{fired.rule.text}'"
    why = (dead_message("stopped answering", problem, f"{max(0.0, fired.at - since):.1f}s", health)
           + f"; {seen} saw it first, at {fired.where()}: {fired.saw()}")
    deps.progress.error(f"[{name}] {why}: stopping its load")
    raise rec.failed(BackendError(name, why), deps.clock.now())


PREFLIGHT_LEVEL = -3  # the records' level and bucket (they are kept in the manifest entry only)


async def preflight(bp: BackendPlan, url: str, deps: Deps, rec: BackendRecorder, ids: IdSequence, prompts: PromptFiles,
                    connector) -> None:  # fmt: skip
    """One request of each workload's shape must complete before any level (module docstring)."""
    seen: set[str] = set()
    for lv in bp.levels:
        if lv.workload in seen:
            continue
        seen.add(lv.workload)
        shapes = Shapes(lv.request, prompts(lv.request.prompt_file))
        await shapes.prepare(url)
        rid = f"{ids.prefix}-preflight-{len(seen)}"  # not of the load's sequence: requests.jsonl has no gap
        record = RequestRecord(request_id=rid, backend=bp.name, workload=lv.workload, level=PREFLIGHT_LEVEL,
                               concurrency=1, bucket=PREFLIGHT_LEVEL)  # fmt: skip
        conn = connector(lv.request)()
        try:
            # salted with its own id: an unsalted token prompt 0 was the same in every workload's
            # pre-flight of that length, the second served from the prefix cache (module docstring)
            await conn.send(shapes.make(0, salt=rid, asked=True), rid, shapes.headers(), record, deadline=deps.clock.now() + lv.deadline_s)
        finally:
            with trio.move_on_after(CLOSE_S, shield=True):
                await conn.aclose()
        if not rec.preflight_done(lv.workload, record):
            what = record.error or str(record.outcome)
            raise rec.failed(
                BackendError(bp.name, f"pre-flight request of workload '{lv.workload}' {record.outcome}: {what}"),
                deps.clock.now(),
            )
        deps.progress.log(f"[{bp.name}] pre-flight '{lv.workload}': completed ({record.output_tokens} tokens)")


async def _drive_level(bp, lv: Level, deps: Deps, rec: BackendRecorder, ids: IdSequence, shapes: Shapes, connect, where,
                       watch: AbortWatch, health: Health | None = None, client: ClientLog | None = None) -> LevelRun:  # fmt: skip
    progress = deps.progress
    nb = len(lv.buckets)
    entry = rec.level_started(lv, deps.clock.now())
    stats = rec.stats
    # the watch is told of every request started (--workers: as the load processes report them),
    # so a bucket is judged once its requests have finished (runner/abort.py)
    starts = {"deadline_s": lv.deadline_s, "starts_known": True, "starts_until": -math.inf if deps.workers > 1 else math.inf}
    watch.level_started(lv.workload, lv.index, lv.label, entry["measure_start"], lv.duration_s, lv.bucket_s, **starts)

    def on_start(t0: float) -> None:  # the level's own start (`--workers`: after their start-up), not the time above
        entry.update(started_at=t0, measure_start=t0 + lv.warmup_s if lv.warmup_requests is None else None)  # a counted warmup: at its end
        progress.level_begins(t0 - deps.clock.now())
        watch.level_started(lv.workload, lv.index, lv.label, t0 + lv.warmup_s, lv.duration_s, lv.bucket_s, **starts)

    # --workers: every record that ended before this has reached the parent (each process reports
    # at least every `workers.HEARTBEAT_S`); a bucket's line waits for it, not only for the clock
    reported = {"until": -math.inf if deps.workers > 1 else math.inf}

    def started_until(t: float) -> None:
        reported["until"] = t
        watch.started_until(t)

    closed: set[int] = set()

    async def on_bucket(k: int) -> None:
        closed.add(k)
        # requests durable; bucket lines whose requests all ended (and, --workers, were all reported)
        await rec.bucket_closed(entry, k, deps.clock.now(), reported_until=reported["until"])
        progress.bucket_done(bp.name, lv.label, k, nb, stats)
        watch.bucket_done(k, deps.clock.now())
        await rec.compact_log()  # last: the bucket's line, progress and abort rules never wait for it

    def observe(records) -> None:
        # a request the load generator could not send (out of file descriptors, ...: runner/fdlimit.py)
        # says nothing about the server: no abort rule sees it; the first is said at once
        sent = [r for r in records if r.start is not None]
        if len(sent) < len(records) and not rec.not_sent:
            first = next(r for r in records if r.start is None)
            progress.error(f"soakspec run: [{bp.name}] {lv.label}: {first.error}; the run will be INCONCLUSIVE (client_healthy)")
        rec.not_sent += len(records) - len(sent)
        if watch.watching:  # a Row a record only where a rule can still fire (the per-record path)
            watch.observe([row_of(r) for r in sent], deps.clock.now(), [(r.bucket, r.intended_start) for r in records if r.start is None])

    def write_records(records: list[RequestRecord]) -> None:
        rec.write_records(records)
        observe(records)

    def write_lines(data: bytes) -> None:  # a --workers process's records
        observe(rec.write_lines(data))  # decoded once, for the bucket lines and the abort rules alike

    ctx = LevelContext(bp.name, deps.clock, connect, shapes, write_records, ids, shapes.headers(), stats=stats,
                       on_bucket=on_bucket, health=health, on_start=on_start, on_measure_start=_measure_started(bp.name, lv, entry, progress, watch, starts),
                       on_request_start=watch.started, on_started_until=started_until)  # fmt: skip
    _progress_started(progress, bp.name, lv)
    run: LevelRun | None = None
    try:
        if deps.workers > 1:
            entry["workers"] = processes_for(lv, deps.workers)  # a batch level: 1, its barrier spans the batch
            host, port = where
            job = {"host": host, "port": port, "api_key_env": lv.request.api_key_env, "request": lv.request,
                   "prompts": shapes.prompts, "backend": bp.name, "headers": ctx.headers,
                   "liveness": bp.launch.liveness}  # fmt: skip
            run, _ = await drive_level_workers(lv, ctx, job, deps.workers, write_lines, ids,
                                               on_health=client.write_json if client is not None else None)
        else:
            run = await drive_level(lv, ctx)
        if run.count_reached:  # ended with its last request: the buckets its clock did not close get their lines
            for w in run.bucket_windows():
                if w["index"] not in closed:
                    await rec.bucket_closed(entry, w["index"], deps.clock.now(), length_s=w["end"] - w["start"])
        watch.level_drained(deps.clock.now())  # every request of the level has finished: what waited for them is judged
        progress.level_ended(bp.name, lv.label, stats, run.count_reached, run.ended_by)
    finally:
        if run is None or watch.fired is not None:  # cut short: an abort rule, Ctrl-C, a dead backend, a failure
            _cut_short(entry, lv, deps.clock.now())
        await rec.level_stopped(entry, deps.clock.now())
    rec.level_finished(entry, run)
    return run


async def _drive_sweep(bp, lv: Level, deps: Deps, rec: BackendRecorder, ids: IdSequence, shapes: Shapes, connect, where,
                       watch: AbortWatch, health: Health | None = None, client: ClientLog | None = None) -> None:  # fmt: skip
    """A sweep (plan.Sweep): probe levels chosen by bisection, each an ordinary level of the
    manifest in the order it ran, judged by `deps.sweep_judge` from its own records; stop when
    the search is settled or the next probe would end past the wall-time bound. The search and
    its result go to the backend's manifest entry (`sweep`); the gate re-judges every probe."""
    sw = lv.sweep
    assert sw is not None
    search = Bisection(len(sw.grid))
    start = deps.clock.now()
    probes: list[dict] = []
    bounded = False
    try:
        while (i := search.next()) is not None:
            probe = probe_level(lv, i, len(probes))
            if deps.clock.now() - start + probe.warmup_s + probe.duration_s > sw.max_wall_s:
                bounded = True
                break
            if client is not None:
                client.keep()  # the probe's client samples, for its judgement
            stopped = await _drive_probe(bp, probe, deps, rec, ids, shapes, connect, where, watch, health, client)
            entry = rec.levels[-1]
            if stopped is not None:  # an abort rule ended this probe: it does not hold; the search goes on
                passed, why = False, f"stopped by {stopped.describe()}"
            elif deps.sweep_judge is None:
                passed, why = entry.get("completed") is True, "no judge supplied: a completed level counts as holding"
            else:
                passed, why = await _judge_probe(deps.sweep_judge, bp.name, entry, rec, probe, client)
            search.record(i, passed)
            probes.append({"probe": len(probes), "level": probe.index, "grid_index": i, "value": sw.grid[i], "passed": passed, "why": why})
            deps.progress.log(f"[{bp.name}] sweep: {sw.axis} {sw.grid[i]:g} {'holds' if passed else 'does not hold'} ({why})")
    finally:  # also when an abort rule or an interrupt cut the search short: what it found so far
        found = sw.grid[search.good] if search.good is not None else None
        rec.sweep = {"workload": lv.workload, "axis": sw.axis, "grid": list(sw.grid), "max_wall_s": sw.max_wall_s,
                     "probes": probes, "result": found, "bounded_by_wall_time": bounded,
                     "wall_s": round(deps.clock.now() - start, 3)}  # fmt: skip


async def _drive_probe(bp, probe: Level, deps: Deps, rec: BackendRecorder, ids: IdSequence, shapes: Shapes, connect, where,
                       watch: AbortWatch, health: Health | None, client: ClientLog | None = None):  # fmt: skip
    """One probe of a sweep. An abort rule that fires ends this probe only (a sweep expects
    levels the server cannot take): returned, and the watch re-armed for the next probe."""
    outer = watch.on_fire
    with trio.CancelScope() as scope:
        watch.on_fire = lambda _fired: scope.cancel()
        try:
            await _drive_level(bp, probe, deps, rec, ids, shapes, connect, where, watch, health, client)
        finally:
            watch.on_fire = outer
    fired, watch.fired = watch.fired, None
    if fired is not None and fired.gone:  # not a probe the server cannot take: the server is gone
        _server_gone(bp.name, fired, deps, rec, health)
    if fired is not None:
        rec.levels[-1]["stopped_by"] = fired.to_json()
        deps.progress.log(f"[{bp.name}] sweep: {fired.describe()}; this probe does not hold")
    return fired


async def _judge_probe(sweep_judge, name: str, entry: dict, rec: BackendRecorder, probe: Level,
                       client: ClientLog | None = None) -> tuple[bool, str]:
    """`sweep_judge` of the probe's records and its client samples (the gate's per-probe checks:
    the schedule proof and the load generator's health, with the rules), on a worker thread.
    A probe whose client was saturated, or off its schedule, does not hold here (INCONCLUSIVE,
    said in its `why`): the search cannot take it for holding, and the gate's re-judgement says
    it neither held nor failed. Judged on the event loop (as
    it was), reading the requests file back and judging stalled the loop 20-90 ms between
    probes; the client's health monitor counted that stall into the next probe's first bucket
    and a sweep against the simulator ended INCONCLUSIVE ("event-loop lag p99 92 ms"): the
    judge's own work taken for a saturated load generator. Nothing is in flight meanwhile (the
    probe has drained); the thread is abandoned on cancel (Ctrl-C does not wait for it)."""
    rec.end_member()  # the probe's records read back whole
    snapshot = dict(entry)
    samples = client.kept() if client is not None else []
    return await trio.to_thread.run_sync(lambda: sweep_judge(name, snapshot, _level_rows(rec, probe), samples), abandon_on_cancel=True)


def _level_rows(rec: BackendRecorder, lv: Level) -> list[dict]:
    """The probe's records as written (its gzip member ended by the caller), read from where
    the probe began (`rec.level_offset`): reading the whole file back, the k-th probe re-read
    every earlier probe's records, a sweep's judging growing with the square of its probes."""
    path = rec.layout.requests(rec.name)
    return [dict(r) for _, r in iter_records(path, start=rec.level_offset) if r.workload == lv.workload and r.level == lv.index]


def _progress_started(progress, backend: str, lv: Level) -> None:
    """The level's progress bar and first line; a counted warmup is shown as "warmup" until it
    has ended (`Progress.warmup_ended`), however long that takes."""
    warmup = lv.warmup_s if lv.warmup_requests is None else math.inf
    progress.level_started(backend, f"{lv.workload} / {lv.label}", lv.warmup_s + lv.duration_s, lv.bucket_s, len(lv.buckets), warmup,
                           lv.requests_per_level, lv.min_duration_s)  # fmt: skip


def _measure_started(backend: str, lv: Level, entry: dict, progress, watch: AbortWatch, starts: dict):
    """What a level does when its counted warmup has ended (`LevelContext.on_measure_start`): its
    measured window starts there -- the manifest's `measure_start`, the abort rules' bucket 0 --
    not at its start + warmup_s, and progress says how long the warmup took."""

    def on_measure_start(m: float) -> None:
        entry.update(measure_start=m)
        progress.log(f"[{backend}] {lv.workload} / {lv.label}: warmup of {lv.warmup_requests} requests finished after "
                     f"{format_duration(max(0.0, m - entry['started_at']))}; measuring")
        progress.warmup_ended()
        watch.level_started(lv.workload, lv.index, lv.label, m, lv.duration_s, lv.bucket_s, **starts)

    return on_measure_start


def _cut_short(entry: dict, lv: Level, at: float) -> None:
    """A level cut short at `at` (an abort rule fired, Ctrl-C or another signal, the backend
    died, the run failed) keeps what it measured: it stays `completed = false`, lists the
    bucket windows that had begun by then (its requests name them; the judge reports the
    later ones as not run), the last of them ending at `at` (its `planned_length_s` is the
    plan's), and `measure_end` is `at`, so the level's wall time is the time it measured.
    `at` is when the level ended, after its in-flight requests drained -- not when an abort
    rule fired: a load process (--workers) may still send after the rule fired, into a bucket
    that begins after it, and every bucket a request names must be listed."""
    if entry["measure_start"] is None:  # cut short in its counted warmup: its measured window never began, no bucket is listed
        entry["measure_start"] = at
    m = entry["measure_start"]
    end = max(m, min(at, m + lv.duration_s))
    entry["buckets"] = [{"index": b.index, "start": m + b.start_s, "end": min(m + b.start_s + b.length_s, end), "planned_length_s": b.length_s}
                        for b in lv.buckets if m + b.start_s < end]
    entry["measure_end"], entry["drained_at"] = end, at


async def follow_up(bp: BackendPlan, deps: Deps, rec: BackendRecorder, ids: IdSequence, shapes: Shapes, connect) -> None:
    """One request of the smallest shape at concurrency 1, after the last level."""
    _, rid = ids()
    record = RequestRecord(request_id=rid, backend=bp.name, workload=bp.follow_up_workload, level=-1, concurrency=1,
                           bucket=FOLLOW_UP_BUCKET)
    conn = connect()
    try:
        await conn.send(shapes.make(0, smallest=True), rid, shapes.headers(), record, deadline=deps.clock.now() + bp.follow_up_deadline_s)
    finally:
        with trio.move_on_after(CLOSE_S, shield=True):
            await conn.aclose()
    passed = rec.follow_up_done(record)
    deps.progress.log(f"[{bp.name}] clean follow-up: {'passed' if passed else 'FAILED'}")


def host_port(url: str) -> tuple[str, int]:
    m = re.match(r"https?://(\[[^\]]+\]|[^/:]+)(?::(\d+))?", url)
    if m is None:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = m.group(1).strip("[]")
    port = int(m.group(2) or (443 if url.startswith("https") else 80))
    return host, port


__all__ = ["drive_backend", "follow_up", "host_port", "run_backend"]
