"""What a run records while it runs: one object per backend, no I/O but its writes.

The async parts (the backend server, the load driver) report facts here -- launched, ready,
a level started or ended, records, a bucket end, the follow-up, stopped, failed -- and this
writes them or keeps them for the manifest entry that `collect` builds after the load:

- requests.jsonl.gz is appended per batch; at every bucket end its gzip member is closed and
  fsynced (`GzipJsonlWriter`); within a bucket the compressor is flushed to the file every
  second, so a SIGKILL loses at most about a second of records (a power loss: the open bucket's);
- a bucket's buckets.jsonl line (`soakspec.evidence.buckets`) is written, and fsynced, once
  every request of the bucket has finished: at the first bucket end after its window end +
  the level's deadline + LINE_GRACE_S (each request ends by its deadline), or when the level
  stops. A day-long soak is inspectable while it runs (`soakspec gate --partial`), and a line
  never claims a bucket whose records are not durable.

Everything here is synchronous but the fsyncs (`durable`): they run on a worker thread, so a
disk that takes tens of milliseconds to sync (a network volume, write-back pressure) does
not stall every send of every backend at each bucket end -- schedule lag the client-health
rules would hold against the run. Writes stay on the event loop (they reach the page cache).

A failure is recorded where it happens, before it is raised: `RunStatus` keeps the first one
(its reason becomes the manifest's), so the engine never has to dig it out of an ExceptionGroup.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import trio

from soakspec.evidence.io import EvidenceError, EvidenceWriteError, GzipJsonlWriter, JsonlWriter
from soakspec.evidence.redact import record_redactor
from soakspec.evidence.buckets import BucketTally, bucket_line
from soakspec.evidence.record import Record, decode_lines_lenient, encode_line, encode_lines
from soakspec.evidence.layout import RunLayout
from soakspec.evidence.serverlog import LogCompactor, keep_lines
from soakspec.plan import BackendPlan, Level
from soakspec.runner.load import LevelRun, LiveStats
from soakspec.runner.procs import BackendError, Server
from soakspec.runner.records import Outcome, RequestRecord


LINE_GRACE_S = 1.0  # a bucket's line is written this long after its requests' deadline passed


async def durable(writer: GzipJsonlWriter | JsonlWriter) -> None:
    """`writer.fsync()` on a worker thread (see the module docstring). Not abandoned when the
    caller is cancelled: the writer is never closed while the thread is in it. A caller in a
    cancelled scope that must still sync (a level's end) shields the call."""
    await trio.to_thread.run_sync(writer.fsync)


async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` -- a close that fsyncs, a log copied -- on a worker thread, shielded: it runs
    to its end also when the caller is being cancelled (a run's end, an abort, Ctrl-C)."""
    with trio.CancelScope(shield=True):
        return await trio.to_thread.run_sync(fn, *args)


class RunStatus:
    """How the run ends: complete, or aborted with the first failure's reason (a signal wins)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.failure: BackendError | None = None
        self.signal_name: str | None = None
        self.aborted_at: float | None = None  # when the first failure happened (run clock)
        self.load_ended = False  # every backend's load (levels, follow-up) is over: collection goes on
        self.late_signal: str | None = None  # the first signal after that: the run stays whole, it is not judged

    @property
    def status(self) -> str:
        return "complete" if self.reason is None else "aborted"

    def backend_failed(self, err: BackendError, at: float | None = None) -> BackendError:
        if self.reason is None:
            self.reason, self.failure, self.aborted_at = str(err), err, at
        return err

    def evidence_failed(self, err: EvidenceError) -> EvidenceError:
        if self.reason is None:
            self.reason = f"cannot write evidence: {err}"
        return err

    def collection_failed(self, reason: str) -> None:
        """A backend's evidence could not be finished after the load (`collect`): the run is
        aborted with that reason, unless an earlier failure (the disk filling during the load,
        say) already gave the first one."""
        if self.reason is None:
            self.reason = reason

    def failed_with(self, group: BaseExceptionGroup) -> None:
        """The load ended with these failures. Each recorded its reason where it was raised; one
        that did not (a bug) still aborts the run, under the group's own description."""
        if self.reason is None:
            leaf: BaseException = group
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            # evidence a part of the load could not write (client.jsonl, say) is said as every such failure is
            self.reason = f"cannot write evidence: {leaf}" if isinstance(leaf, EvidenceError) else f"the run failed: {leaf}"

    def interrupted(self, signal_name: str) -> None:
        self.signal_name = signal_name
        self.reason = f"interrupted by {signal_name}"


class BackendRecorder:
    """One backend's evidence as the run goes (see the module docstring)."""

    def __init__(self, bp: BackendPlan, layout: RunLayout, status: RunStatus) -> None:
        self.bp = bp
        self.name = bp.name
        self.status = status
        self.layout = layout
        self.started = False  # prepare() ran: the backend has a manifest entry
        self.writer: GzipJsonlWriter | None = None
        self.bucket_writer: JsonlWriter | None = None
        self.tally = BucketTally()
        self._level: Level | None = None
        self._pending: list[tuple[int, float, float]] = []  # closed buckets whose line waits: (k, start, length)
        self.stats = LiveStats()
        self.levels: list[dict[str, Any]] = []
        self.followup: dict[str, Any] | None = None
        self.argv: list[str] | None = None  # the command as executed
        self.url: str | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.server: Server | None = None
        self.port_listener: dict[str, Any] | None = None  # whose socket answered readiness (procs.PortOwner)
        self.aborted_reason: str | None = None
        self.aborted_at: float | None = None
        self.failure: BackendError | None = None
        self.preflight: list[dict[str, Any]] | None = None  # None: not run (--no-preflight, or never reached)
        self.abort_fired: dict[str, Any] | None = None  # the abort rule that stopped the load (runner/abort.py)
        self.external_log: dict[str, Any] | None = None  # a url backend's log_file as read (runner/logfile.py)
        self.wall_steps: tuple[float, ...] = ()  # the wall-clock steps client.jsonl recorded (trace matching's)
        self.sweep: dict[str, Any] | None = None  # a sweep's probes and result (runner/driver.py)
        self.metrics_scrape: dict[str, Any] | None = None  # what the /metrics scrapes did (runner/scrape.py)
        self.not_sent = 0  # requests the load generator could not send (its own limits: runner/fdlimit.py)
        self.trace_offset = 0
        self.level_offset = 0  # where the current level's records begin in requests.jsonl.gz (a member's first byte)
        self.source_before: dict | None = None
        self._root_id: tuple[int, int] | None = None  # the evidence directory's (st_dev, st_ino) at prepare()
        # server.log kept bounded on disk while the server writes it (a step at each bucket's
        # end: `compact_log`), capped and compressed by `collect` when the run ends (evidence/serverlog.py)
        # (the run's secrets overwritten as lines go into server.log.gz: a server prints its own
        # --api-key, an auth error its token; the byte offsets stay)
        self.log_compactor = LogCompactor(self.server_log, kept_log_lines(bp), mask=record_redactor().log_mask())

    # ------------------------------------------------------------ setup
    def prepare(self, trace_offset: int, source_before: dict | None) -> None:
        self.started = True
        self.trace_offset = trace_offset
        self.source_before = source_before
        # Request lines are not schema-checked as they are written: a full jsonschema pass costs
        # milliseconds per record, more than the request itself. RequestRecord.to_json is tested
        # against the schema, and `verify`/`gate` check every line after the run.
        with self._evidence():
            self._root_id = _identity(self.layout.root)
            self.layout.backend_dir(self.name).mkdir(parents=True, exist_ok=True)
            self.writer = GzipJsonlWriter(self.layout.requests(self.name))
            self.bucket_writer = JsonlWriter(self.layout.buckets(self.name))

    # ------------------------------------------------------------ the server
    def launching(self, argv: list[str], url: str, started_at: float) -> None:
        self.argv, self.url, self.started_at = argv, url, started_at

    def launched(self, server: Server) -> None:
        self.server = server

    def ready(self, at: float, url: str) -> float:
        """Returns the seconds it took (0 for a server that was already running)."""
        self.url = url
        self.ready_at = at
        if self.started_at is None:
            self.started_at = at
        return at - self.started_at

    def failed(self, err: BackendError, at: float | None = None) -> BackendError:
        """The backend failed at `at` (run clock): recorded (the first failure only), then returned to raise."""
        if self.failure is None:
            self.aborted_reason, self.aborted_at, self.failure = err.message, at, err
        return self.status.backend_failed(err, at)

    def preflight_done(self, workload: str, rec: RequestRecord) -> bool:
        """One pre-flight request (kept in the manifest entry, not in requests.jsonl)."""
        passed = rec.outcome is Outcome.COMPLETED
        if self.preflight is None:
            self.preflight = []
        self.preflight.append({"workload": workload, "passed": passed, "record": rec.to_json()})
        return passed

    # ------------------------------------------------------------ the load
    def level_started(self, lv: Level, now: float) -> dict[str, Any]:
        self.stats = LiveStats()
        entry = lv.to_json() | {
            "started_at": now, "measure_start": now + lv.warmup_s, "measure_end": None, "drained_at": None,
            "completed": False, "buckets": [], "sent": 0,
        }  # fmt: skip
        self.levels.append(entry)
        if self.writer is not None:  # a sweep's probe reads back its own records from here (runner/driver.py)
            with self._evidence():
                self.level_offset = self.writer.boundary()
        self.tally = BucketTally()
        self._level = lv
        self._pending = []
        return entry

    async def bucket_closed(self, entry: dict[str, Any], k: int, now: float, reported_until: float = math.inf,
                            length_s: float | None = None) -> None:
        """Bucket `k` of the level of `entry` ended at `now`: its records so far are made durable
        (the gzip member closed and fsynced). Its buckets.jsonl line waits until every request
        of it has finished: `deadline_s` + LINE_GRACE_S after its window (each request ends by
        its deadline, so before `now` - LINE_GRACE_S: each was written before the member
        closed, whatever arrives while the fsync runs); then the line counts them all. Lines
        whose time has come go out now. `reported_until` (`--workers`): every record that ended
        before it has reached this process; a line waits for it too (a load process stalled for
        seconds reports its records late, and a line written without them undercounts).
        `length_s`: the window's length where it is not the plan's (a count-bounded level's last
        bucket, ended with its last request)."""
        assert self._level is not None
        b = self._level.buckets[k]
        self._pending.append((k, entry["measure_start"] + b.start_s, b.length_s if length_s is None else length_s))  # first: a level cancelled meanwhile writes it
        await self.make_durable()
        await self._write_lines(entry, now, lambda start, length: min(now, reported_until) >= start + length + entry["deadline_s"] + LINE_GRACE_S)

    async def compact_log(self) -> None:
        """A step of server.log's compaction (`LogCompactor.step`: what is sure to be head or
        middle moved out, compressed) on a worker thread: awaited after a bucket's line and
        its abort rules, so those never wait for it."""
        await off_loop(self.log_compactor.step)

    async def _write_lines(self, entry: dict[str, Any], now: float | None, due) -> None:
        taken = []
        for item in list(self._pending):
            k, start, length = item
            if due(start, length):
                self._pending.remove(item)
                taken.append((k, start, length, now if now is not None else start + length, self.tally.take(k)))
        if not taken:
            return
        # a bucket's p50/p95 select over every ITL gap it holds (millions in a fast server's
        # bucket): on a worker thread, so the load goes on meanwhile (numpy lets go of the GIL)
        lines = await off_loop(lambda: [bucket_line(entry, *t) for t in taken])
        if self.bucket_writer is not None:
            with self._evidence():
                for line in lines:
                    self.bucket_writer.write(line)
                await durable(self.bucket_writer)

    async def level_stopped(self, entry: dict[str, Any], now: float | None = None) -> None:
        """The level's load ended, finished or not: what was sent is on disk, and the lines of
        its closed buckets still waiting for their requests are written with what came.
        Shielded: it runs also when the level was cancelled (an abort rule, Ctrl-C)."""
        entry["sent"] = self.stats.sent
        self._prompt_repeats(entry)
        with trio.CancelScope(shield=True):
            await self.make_durable()
            await self._write_lines(entry, now, lambda start, length: True)

    def level_finished(self, entry: dict[str, Any], run: LevelRun) -> None:
        entry.update(
            started_at=run.started_at, measure_start=run.measure_start, measure_end=run.measure_end,
            drained_at=run.drained_at, completed=run.completed, buckets=run.bucket_windows(), sent=run.sent,
            mean_in_flight=round(run.mean_in_flight, 3), **run.count_json(),
        )  # fmt: skip
        self._prompt_repeats(entry)

    def _prompt_repeats(self, entry: dict[str, Any]) -> None:
        """A prompt file's level: how many of its requests sent a prompt the level had sent
        before (they cycle; `check`'s W511 warns of it beforehand), so a reader sees how much of
        the level a server's prefix cache could serve whole."""
        t = self._level.request if self._level is not None else None
        if t is not None and t.prompts and not t.conversations:
            entry["prompt_repeats"] = max(0, int(entry.get("sent") or 0) - len(t.prompts))

    def write_records(self, records: Iterable[RequestRecord]) -> None:
        # one write per batch into the open gzip member
        frozen = [rec.freeze() for rec in records]
        add = self.tally.add
        for r in frozen:
            add(r)
        self._write(encode_lines(frozen))

    def write_lines(self, data: bytes) -> list[Record]:
        """Whole request lines made elsewhere (a `--workers` process's `to_line`s), written as
        they came; returns those that decode (what the bucket lines and abort rules count)."""
        recs = decode_lines_lenient(data)
        add = self.tally.add
        for r in recs:
            add(r)
        self._write(data)
        return recs

    def _write(self, data: bytes) -> None:
        assert self.writer is not None
        try:
            self.writer.write_lines(data)
        except EvidenceError as e:
            raise self.status.evidence_failed(e)

    def end_member(self) -> None:
        """End the open gzip member of requests.jsonl.gz: what was written reads back whole."""
        if self.writer is not None:
            with self._evidence():
                self.writer.end_member()

    async def make_durable(self) -> None:
        """`end_member`, then the file fsynced (`durable`). First, at every bucket's end, the
        evidence directory is checked to be the one the run began in: removed or moved, the
        writes into its open files go on succeeding (unlinked, or somewhere else), and the run
        would soak for its planned hours and only fail at the end, writing its final manifest."""
        self.check_root()
        self.end_member()
        if self.writer is not None:
            with self._evidence():
                await durable(self.writer)

    def follow_up_done(self, rec: RequestRecord) -> bool:
        self.write_records([rec])
        passed = str(rec.outcome) == "completed"
        self.followup = {
            "required": True,
            "record": rec.to_json(),
            "passed": passed,
            "reason": None if passed else f"follow-up request {rec.outcome}: {rec.error or 'no detail'}",
            "server_idle": None,
        }
        return passed

    def close(self) -> None:
        """Both writers closed (the second also when the first fails); a failure -- the disk
        refusing the open member's end or the last fsync -- is recorded in the run status (its
        path and errno the run's reason, not an exception group's description)."""
        with self._evidence():
            try:
                if self.writer is not None:
                    self.writer.close()
            finally:
                if self.bucket_writer is not None:
                    self.bucket_writer.close()

    def check_root(self) -> None:
        """EvidenceWriteError (recorded in the run status) when the evidence directory is no
        longer the one prepare() found (removed, moved, replaced)."""
        if self._root_id is None:
            return
        now = _identity(self.layout.root)
        if now != self._root_id:
            gone = OSError(errno.ENOENT, "the evidence directory was removed or moved during the run")
            raise self.status.evidence_failed(EvidenceWriteError(self.layout.root, gone))

    # ------------------------------------------------------------ plumbing
    @contextlib.contextmanager
    def _evidence(self) -> Iterator[None]:
        """An EvidenceError raised inside is recorded in the run status, then propagates."""
        try:
            yield
        except EvidenceError as e:
            raise self.status.evidence_failed(e)

    @property
    def server_log(self) -> Path:
        return self.layout.server_log(self.name)


def _identity(path: Path) -> tuple[int, int] | None:
    """The directory's (st_dev, st_ino); None when it cannot be found."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def kept_log_lines(bp: BackendPlan) -> Callable[[str], bool]:
    """The server.log lines its cap never cuts: the trace lines (when traces come from the log)
    and the runtime banner's."""
    tr, rt = bp.traces, bp.runtime
    return keep_lines(tr.pattern if tr.source == "log" else None, getattr(rt, "log_regex", None) if rt else None)


def encode(r: Record) -> bytes:
    return encode_line(r)


__all__ = ["BackendRecorder", "RunStatus"]
