"""`soakspec run --workers N`: one level's load from N processes, merged into one evidence stream.

Why: one trio loop is one core. Past it, the client's own queueing shows up as latency (and
the requested concurrency is not held), so a fast server needs more than one load process.

Design, per level (the parent is the runner; `python -m soakspec.runner.workers` is a worker):

  1. The parent starts N workers (`processes_for`: every one for an open-loop level -- a rate, a
     ramp, a replay --; at most the concurrency in closed loop; one for a batch level, whose
     barrier spans the whole batch), sends each
     its job over stdin (pickled: level, workload, model, prompts, ids, its part p of N, and the
     run clock's offset), and waits until every one says READY (imports done).
  2. It picks the level's start t0 a moment ahead on the run clock and sends it. Every worker
     builds `RunClock(offset=...)` -- the same clock, since `perf_counter` is the system-wide
     monotonic clock -- and runs the ordinary `drive_level()` for its part with `t0` given, so
     buckets, the warmup edge and the level's end are one set of times for all of them.
     Closed loop: worker w of the level's c runs in process w % N; open loop: every N-th arrival
     of the one seeded schedule, from arrival p.
  3. Workers serialize each record as the runner does (`RequestRecord.to_line`) and stream
     batches of lines back on stdout (every 256 records or 20 ms), with the outcome and TTFT of
     each for the live progress. The parent appends each batch to the one requests.jsonl with one
     write (line-atomic), and runs the bucket clock (fsync and progress at each bucket end).
  4. At the end each worker sends its summary (requests sent, in-flight seconds, drain time) and
     exits; the parent sums them into the level's `LevelRun`. Request indices are interleaved
     (`IdSequence.share`, runner/ids.py), so ids stay unique; a request's prompt (and max_tokens
     from a list) follows its index in the level, as with one process: an open-loop arrival's
     place in the schedule, whichever process sends it; in closed loop the k-th request to start
     in the level, whichever process starts it -- each claims its index as it starts from the
     level's count, 8 bytes in a file the parent creates per level (`ids.SharedCount`, under
     `flock`: a few microseconds a request; its path is in the job). (Each process counting
     p, p + N, ... for itself gave it a fixed subset of a list whose length shares a factor with
     N -- max_tokens = [2, 40] over 2 processes: one sent only 2, the other only 40 -- and the
     faster process sent more of its own: the level's mix was not the spec's.)

Aborts: when the parent is cancelled it closes the workers' stdin; a worker then cancels its
load (in-flight requests are recorded as aborted, as in one process) and flushes its records,
which the parent still writes (bounded by `STOP_GRACE`); then any straggler is killed. Workers
die with the parent: its end of their stdin closes with it, and they stop. (Not PR_SET_PDEATHSIG:
trio starts processes from a worker thread, the signal fires when *that thread* exits, and trio
retires idle threads after 10 s.)
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import struct
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import Any

import trio

from soakspec.evidence.redact import record_redactor, use_secrets
from soakspec import windows
from soakspec.plan import Batch, Level, Liveness, Open
from soakspec.runner.clienthealth import LoopMonitor
from soakspec.runner.clock import RunClock
from soakspec.runner.liveness import Health
from soakspec.runner.h11client import H11Connection
from soakspec.runner.ids import IdSequence, SharedCount
from soakspec.runner.load import (WARMUP_POLL_S, LevelContext, Quota, LevelRun, LiveStats, Shapes, bucket_clock, counts_toward, drive_level,
                                  level_grid, schedule)
from soakspec.runner.procs import spawned_ended, spawning
from soakspec.runner.prompts import RunAborted

READY, START, RECORDS, DONE, ERROR, JOB, HEALTH = range(7)
_HEAD = struct.Struct("<BI")  # message kind, payload length
BATCH = 256  # records waiting that make a message go at once
FLUSH_S = 0.02  # and at least this often
HEARTBEAT_S = 0.25  # a message at least this often, with nothing new: the abort rules learn no request started
STARTUP_TIMEOUT = 60.0  # for the workers to import and say READY
START_MARGIN = 0.1  # t0 = now + this, so that every worker has the start before it comes
STOP_GRACE = 5.0  # after an abort, for the workers to flush their records


class WorkerError(RunAborted):
    """A worker process failed (its traceback is the message) or ended without finishing its
    load (killed: the OOM killer, a stray `kill`). The run aborts with this reason, as any
    `RunAborted` (runner/engine.py): said on stderr and in the manifest, not as soakspec's bug."""


def _how_it_ended(returncode: int | None) -> str:
    if returncode is None:
        return "its output closed"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def processes_for(level: Level, workers: int) -> int:
    """How many processes a level gets (the manifest's `workers` of the level): open loop (a
    constant rate, a ramp, a replay) all of them, at most its `max_concurrency` (each process
    holds a share of the cap's slots, and a process with none could send nothing); closed loop never more than its (peak)
    concurrency; a batch level one, whatever `--workers` says.

    Why one for a batch: its next batch starts once the last request of this one has ended (the
    barrier is the mode), and that barrier spans every process that sends part of the batch.
    Split, each process ran its own share of each batch with no barrier across them: the next
    batch started while the previous one was still running (t29: batches of 4 at c = 2, 25 of
    43 batches began before their predecessor ended; req/s 42.75 against one process's 14.75).
    A cross-process barrier (every process reporting its share's end and waiting for the others'
    before its next batch) would add a round trip between processes to every batch's gap and a
    stalled process would hold all of them; a batch level has at most min(c, requests) requests
    in flight and spends its time waiting at the barrier, so one trio loop is not its limit --
    one process keeps the mode's meaning at no cost that `--workers` was meant to remove."""
    if level.concurrency is None:  # open loop: every N-th arrival of the one schedule (`load._arrivals`)
        cap = level.max_concurrency  # its slots split over the processes (`load.in_flight_share`): one each at least
        return max(1, workers if cap is None else min(workers, cap))
    if isinstance(level.shape, Batch):
        return 1
    return max(1, min(workers, level.concurrency))


def _frame(kind: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(kind, len(payload)) + payload


class _Reader:
    """Length-prefixed messages from a trio receive stream. Cancel-safe (keeps its buffer)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buf = bytearray()

    async def next(self) -> tuple[int, bytes] | None:
        """The next message, or None at the end of the stream."""
        while True:
            if len(self._buf) >= _HEAD.size:
                kind, size = _HEAD.unpack_from(self._buf)
                end = _HEAD.size + size
                if len(self._buf) >= end:
                    payload = bytes(self._buf[_HEAD.size : end])
                    del self._buf[:end]
                    return kind, payload
            data = await self._stream.receive_some(1 << 16)
            if not data:
                if self._buf:
                    raise WorkerError("a worker's output ended mid-message")
                return None
            self._buf += data


# ------------------------------------------------------------------------------------------
# the parent


async def drive_level_workers(
    level: Level, ctx: LevelContext, job: dict[str, Any], workers: int, write_lines: Callable[[bytes], None],
    ids: IdSequence, *, on_health: Callable[[dict], None] | None = None,
) -> tuple[LevelRun, int]:
    """Run `level` from `workers` processes; returns the level's run and the next free request index
    (`ids` continues after every index a worker used).

    `job` holds what a worker needs besides its part: host, port, api_key_env, request (the
    level's template), prompts, backend, headers. Records go to `write_lines`; `ctx.stats` and
    `ctx.on_bucket` work as with `drive_level`. Each worker's client-health samples
    (runner/clienthealth.py, `process` = its part + 1) go to `on_health`.
    """
    n = processes_for(level, workers)
    shares = [ids.share(p, n) for p in range(n)]
    # closed loop: the level's count of requests started, which every process claims its next
    # prompt index from (open loop: an arrival's index is its place in the schedule)
    # (and, a counted warmup's, when the processes together ended it: `load._warmup_end`)
    count = SharedCount.create() if (level.concurrency is not None or level.warmup_requests is not None) and n > 1 else None
    if count is not None:
        job = dict(job, count=count.path)
        count.open()  # the parent's own descriptor: it reads the count of measured requests sent at the end
    taken: int | None = None  # a count-bounded closed loop's measured requests sent, all processes together
    clock = ctx.clock
    stats = ctx.stats
    procs: list[trio.Process] = []
    readers: list[_Reader] = []
    summaries: list[dict | None] = [None] * n
    ended = [False] * n

    until = [-math.inf] * n  # per process: every request it started before this has been reported

    def take(p: int, payload: bytes) -> None:
        lines, outcomes, sent, started, until[p], issued = pickle.loads(payload)
        shares[p].issued = max(shares[p].issued, issued)  # the ids it used: a level cut short has no summary
        if ctx.on_request_start is not None:  # first: a record's start is counted before it finishes (runner/abort.py)
            for bucket, start in started:
                ctx.on_request_start(bucket, start)
        if ctx.on_started_until is not None:
            ctx.on_started_until(min(until))
        write_lines(lines)
        stats.add_batch(outcomes, sent)

    async def pump(p: int, draining: bool = False) -> None:
        reader = readers[p]
        while True:
            msg = await reader.next()
            if msg is None:
                ended[p] = True
                if summaries[p] is None and not draining:
                    with trio.move_on_after(1.0):  # its exit status, for the reason
                        await procs[p].wait()
                    raise WorkerError(f"{_process_name(p, n, procs[p])} ended without finishing "
                                      f"its load ({_how_it_ended(procs[p].returncode)})")
                return
            kind, payload = msg
            if kind == RECORDS:
                take(p, payload)
            elif kind == HEALTH:
                if on_health is not None:
                    for row in pickle.loads(payload):
                        on_health(row)
            elif kind == DONE:
                summaries[p] = pickle.loads(payload)
                until[p] = math.inf  # it starts nothing more
                if ctx.on_started_until is not None:
                    ctx.on_started_until(min(until))
            elif kind == ERROR and not draining:
                raise WorkerError(f"{_process_name(p, n, procs[p])} failed:\n{payload.decode(errors='replace')}")

    try:
        await _spawn(level, job, shares, clock, procs, readers)
        if count is not None:
            count.unlink()  # every worker has it open (READY): no file outlives the level, even a SIGKILLed runner's
        t0 = clock.now() + START_MARGIN
        if ctx.on_start is not None:
            ctx.on_start(t0)
        for proc in procs:
            await proc.stdin.send_all(_frame(START, struct.pack("<d", t0)))  # type: ignore[union-attr]
        run = LevelRun(level, started_at=t0, measure_start=t0 + level.warmup_s)
        closed_count = count if level.concurrency is not None else None  # an open loop's count is its schedule's

        counted = trio.Event()  # a count-bounded level that sent its count ends with its processes
        drained = trio.Event()  # its processes have all ended

        async def buckets() -> None:
            if level.warmup_requests is not None:  # a counted warmup: bucket 0 starts when the processes ended it
                end = await _warmup_ended(count, n, clock, drained)
                if end is None:
                    return  # the processes ended without ending their warmup (cut short): no bucket began
                run.measure_start = end
                if ctx.on_measure_start is not None:
                    ctx.on_measure_start(end)
            await bucket_clock(level, ctx, run.measure_start, counted, _holds(level, run, closed_count, clock), drained)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(buckets)
            async with trio.open_nursery() as pumps:
                for p in range(n):
                    pumps.start_soon(pump, p)
            if closed_count is not None and level.requests_per_level is not None:
                taken = closed_count.value(SharedCount.MEASURED)  # every process has ended: the count is final
            if _count_reached(level, [s for s in summaries if s is not None], taken):
                counted.set()
            drained.set()
    finally:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(STOP_GRACE):
                for proc in procs:
                    with trio.move_on_after(0.5):  # closing stdin tells a worker to stop
                        await proc.stdin.aclose()  # type: ignore[union-attr]
                async with trio.open_nursery() as nursery:
                    for p in range(len(readers)):
                        if not ended[p]:
                            nursery.start_soon(pump, p, True)
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
                spawned_ended(proc.pid)
        # also when the level was cut short (an abort rule ending a sweep's probe, a failure): the
        # next level's ids go on after every id a worker reported using, never reusing one
        ids.continue_after(shares)
        if count is not None:
            count.remove()
    assert all(s is not None for s in summaries)
    _sum_up(run, [s for s in summaries if s is not None], shares, ids, taken)
    return run, ids.end


async def _spawn(level: Level, job: dict[str, Any], shares: list[IdSequence], clock, procs: list, readers: list) -> None:
    """Start one worker per share, send each its job, wait (bounded) until each says READY."""
    n = len(shares)
    for p in range(n):
        with spawning() as own:  # a child soakspec waits for: never taken for an adopted orphan (`procs.Orphans`)
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "soakspec.runner.workers"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
            own(proc.pid)
        procs.append(proc)
        readers.append(_Reader(proc.stdout))  # type: ignore[arg-type]
        # the run's secrets: the worker's records are redacted as the parent's (RequestRecord.freeze)
        part = dict(job, level=level, ids=shares[p], clock_offset=clock.offset, secrets=record_redactor().source)
        await proc.stdin.send_all(_frame(JOB, pickle.dumps(part)))  # type: ignore[union-attr]
    with trio.fail_after(STARTUP_TIMEOUT):
        for p, reader in enumerate(readers):
            msg = await reader.next()
            if msg is None or msg[0] != READY:
                if msg is not None and msg[0] == ERROR:
                    detail = "it failed:\n" + msg[1].decode(errors="replace")
                else:
                    with trio.move_on_after(1.0):  # its exit status, for the reason
                        await procs[p].wait()
                    detail = _how_it_ended(procs[p].returncode) if msg is None else "it sent something other than READY"
                raise WorkerError(f"{_process_name(p, n, procs[p])} did not start: {detail}")


def _process_name(p: int, n: int, proc) -> str:
    """A load process as every message names it: `load process 2 of 4 (--workers, pid 1234)`."""
    return f"load process {p + 1} of {n} (--workers, pid {proc.pid})"


async def _warmup_ended(count: SharedCount | None, parts: int, clock, drained: trio.Event) -> float | None:
    """When the level's processes together ended its counted warmup (the time the last of them
    wrote: `SharedCount.warmup_done`), read every `WARMUP_POLL_S`; None if they all ended
    first (a level cut short in its warmup)."""
    while not drained.is_set():
        end = count.warmup_end(parts) if count is not None else None
        if end is not None:
            return end
        with trio.move_on_after(WARMUP_POLL_S):
            await drained.wait()
    return count.warmup_end(parts) if count is not None else None


def _holds(level: Level, run: LevelRun, count: SharedCount | None, clock: RunClock | None = None) -> Callable[[int], bool] | None:
    """The parent's `bucket_clock` hold of a count-bounded level's last bucket (its window
    ends at the drain): a closed loop's once the processes took all n places (the last one
    started by the bucket's end); an open loop's from or after the bucket of its schedule's
    n-th arrival after the warmup (every process reads the same schedule). None: no count, or
    a closed loop in one process (no shared count: its summary's windows say it all). With a
    min_duration the hold waits for it too (the processes read the one run clock: none takes a
    place past n once it has passed), and an open loop's last arrival is the later of its n-th
    and its last one due before the minimum's end (`Quota.first`, as each process reads it)."""
    n, least = level.requests_per_level, level.min_duration_s
    if n is None:
        return None
    if count is not None:
        return lambda k: (count.value(SharedCount.MEASURED) >= n
                          and (least is None or clock is None or clock.now() >= run.measure_start + least))
    if not isinstance(level.shape, Open):
        return None
    m, stop = run.measure_start, run.measure_start + level.duration_s
    origin = m if level.warmup_requests is not None else run.started_at  # after a counted warmup the schedule starts afresh at m
    grid = level_grid(level, origin)  # as each process places them (`drive_level`)
    times = schedule(level.shape.rate, level.shape.arrival, level.shape.seed, origin, stop, level.shape.burstiness, grid)
    # its last measured arrival, read one at a time (n may be millions: no list of them)
    quota, nth = Quota(n, least_s=least), None
    for nth, _ in quota.first(((t, None) for t in times), m):
        pass
    if not quota.reached or nth is None:  # its duration ends it first: every bucket as planned
        return None
    last = windows.holding(grid.starts, nth)
    return lambda k: k >= last


def _count_reached(level: Level, done: list[dict], taken: int | None) -> bool:
    """Whether a count-bounded level's count ended it, its processes together. A closed loop
    split over processes: the level's shared count (`taken`, `ids.SharedCount.MEASURED`) reached
    `requests_per_level` -- the truth, where a process's own `Quota.reached` is not: one process
    finds every place taken and stops, another then gives a place back (a request it could not
    send) and its duration runs out before it takes it again, so fewer than n were sent though a
    process saw the count reached (the manifest would say `ended_by: count` of a level short of
    it). An open loop: every process reads the same schedule, so each saw its n-th arrival."""
    if level.requests_per_level is None:
        return False
    if taken is not None:
        return taken >= level.requests_per_level
    return any(s.get("count_reached") for s in done)


def _summary(run: LevelRun, issued: int) -> dict:
    """A worker's DONE message: its part of the level's run (`_sum_up` adds the parts up)."""
    return {"sent": run.sent, "busy_s": run.busy_s, "drained_at": run.drained_at,
            "completed": run.completed, "ids": issued, "measured": run.measured,
            "count_reached": run.count_reached, "last_bucket": run.last_bucket, "busy_late_s": run.busy_late_s,
            "warmup_sent": run.warmup_sent}  # fmt: skip


def _sum_up(run: LevelRun, done: list[dict], shares: list[IdSequence], ids: IdSequence, taken: int | None = None) -> None:
    """The level's run from the workers' summaries (`taken`: a count-bounded closed loop's
    shared count of measured requests sent, `_count_reached`); `ids` goes on after every index
    they used."""
    run.completed = all(s["completed"] for s in done)
    run.drained_at = max(s["drained_at"] for s in done)
    # a count-bounded level: each process saw the count reached (open loop: the same schedule's
    # n-th arrival; closed loop: a claim past n) or the duration end it; ended by its count, its
    # measured window ends when its last process drained
    run.measured = sum(s.get("measured", 0) for s in done)
    run.count_reached = _count_reached(run.level, done, taken)
    run.last_bucket = max(s.get("last_bucket", 0) for s in done)
    run.measure_end = run.drain_end(run.measure_start + run.level.duration_s)
    run.sent = sum(s["sent"] for s in done)
    run.warmup_sent = sum(s.get("warmup_sent", 0) for s in done)
    run.busy_s = sum(s["busy_s"] for s in done)
    run.busy_late_s = sum(s.get("busy_late_s", 0.0) for s in done)
    for share, s in zip(shares, done):
        share.issued = s["ids"]
    ids.continue_after(shares)


# ------------------------------------------------------------------------------------------
# a worker


async def _worker(msg_fd: int) -> None:
    out = trio.lowlevel.FdStream(msg_fd)
    reader = _Reader(trio.lowlevel.FdStream(os.dup(0)))
    msg = await reader.next()
    if msg is None or msg[0] != JOB:
        return
    job = pickle.loads(msg[1])
    use_secrets(job.get("secrets", ()))  # this process's records: redacted as the parent's
    try:
        level: Level = job["level"]
        next_id: IdSequence = job["ids"]
        clock = RunClock(offset=job["clock_offset"])
        api_key = os.environ.get(job["api_key_env"]) if job["api_key_env"] else None
        host, port = job["host"], job["port"]
        shapes = Shapes(job["request"], job["prompts"])
        count = SharedCount(job["count"]).open() if job.get("count") else None  # before READY: the parent then removes the file
        if count is not None:
            shapes.claim_conversation = lambda: count.claim(1)  # multi-turn: the level's next conversation
        await shapes.prepare(f"http://{host}:{port}")  # token-exact prompts: this process's own word costs
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the run
        await out.send_all(_frame(ERROR, traceback.format_exc().encode()))
        return
    lines: list[bytes] = []
    outcomes: list[tuple[str, float | None, bool]] = []
    health: list[dict] = []  # this process's client-health samples, sent with the next flush
    stats = LiveStats()
    reported = 0  # requests started, as last reported
    started: list[tuple[int, float | None]] = []  # (bucket, start) of each request started since
    last_sent = -math.inf
    full = trio.Event()

    def sink(records) -> None:
        lines.extend([rec.to_line() for rec in records])
        outcomes.extend([(rec.outcome.value, rec.ttft, counts_toward(rec)) for rec in records])
        if len(lines) >= BATCH:
            full.set()

    async def flush() -> None:
        nonlocal reported, full, last_sent
        if health:
            samples = pickle.dumps(list(health))
            health.clear()
            with trio.CancelScope(shield=True):
                await out.send_all(_frame(HEALTH, samples))
        now = clock.now()  # every request started before now is in `started`
        if not lines and stats.sent == reported and now - last_sent < HEARTBEAT_S:
            return
        payload = pickle.dumps((b"".join(lines), list(outcomes), stats.sent - reported, list(started), now, next_id.issued))
        last_sent = now
        lines.clear()
        outcomes.clear()
        started.clear()
        reported = stats.sent
        full = trio.Event()
        with trio.CancelScope(shield=True):  # a message is never cut
            await out.send_all(_frame(RECORDS, payload))

    async def flusher() -> None:
        while True:
            with trio.move_on_after(FLUSH_S):
                await full.wait()
            await flush()

    await out.send_all(_frame(READY))
    msg = await reader.next()
    if msg is None or msg[0] != START:
        return
    (t0,) = struct.unpack("<d", msg[1])

    def connect() -> H11Connection:
        return H11Connection(host, port, clock, api_key=api_key)

    gate = Health(clock, job.get("liveness", Liveness()))  # this process's connects back off too
    ctx = LevelContext(
        job["backend"], clock, connect, shapes, sink, next_id,
        headers=job["headers"], stats=stats, t0=t0, part=(next_id.part, next_id.parts), health=gate,
        on_request_start=lambda bucket, start: started.append((bucket, start)),
        claim=None if count is None else count.claim,
        shared_count=count,
    )  # fmt: skip
    run: LevelRun | None = None
    try:
        async with trio.open_nursery() as nursery:

            async def watch_parent() -> None:  # stdin closes: stop
                while await reader.next() is not None:
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_parent)
            nursery.start_soon(flusher)
            monitor = LoopMonitor(clock, lambda smp: health.append(smp.to_json()), backend=job["backend"],
                                  process=next_id.part + 1, held=gate.held_s)  # fmt: skip
            nursery.start_soon(monitor.run)
            run = await drive_level(level, ctx)
            nursery.cancel_scope.cancel()
    except Exception:  # noqa: BLE001
        with trio.CancelScope(shield=True):
            await flush()
            await out.send_all(_frame(ERROR, traceback.format_exc().encode()))
        return
    with trio.CancelScope(shield=True):
        await flush()
        if run is not None:
            await out.send_all(_frame(DONE, pickle.dumps(_summary(run, next_id.issued))))


def main() -> int:
    msg_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed by mistake goes to stderr, not into the messages
    try:
        trio.run(_worker, msg_fd)
    except (BrokenPipeError, trio.BrokenResourceError):  # the parent is gone
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
