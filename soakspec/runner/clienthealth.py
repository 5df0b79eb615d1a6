"""The load generator's own health, measured in every run: `client.jsonl` at the run root.

A client that cannot keep up reports its own lag as the server's latency (every peer tool has
shipped that bug). So each load process measures itself, cheaply, all the time, and the judge's
built-in `client_healthy` (judge/validity.py) reads it per bucket:

* Event-loop lag: `LoopMonitor.run` is a trio task that sleeps `TICK_S` at a time and records
  how late it woke (its own wake-up delay, on trio's clock). A loop that is busy -- parsing,
  writing records, or starved of CPU by other work on the machine -- wakes it late, by as much
  as any other task (a socket read, a send) is held up. Lag percentiles are *time-weighted*:
  each wake-up weighs the time it covers (tick plus lag), so one 200 ms stall in a second of
  5 ms ticks is p99 = 200 ms -- the loop was that late for a fifth of the second -- where a count
  of wake-ups would call it one late sample in 160. Per window a sample keeps the window's p50,
  p99 and max, the total weight (`weight_s`) and every stall longer than `STALL_S` (`stalls`:
  none in a healthy loop), so that the judge can pool a bucket's p99 exactly from its windows
  (judge/clientsamples.py `ClientSamples.pooled_lag_p99`) instead of averaging percentiles.
* CPU: the event loop's own CPU time (its thread's, `time.thread_time`: the monitor runs on
  it) over the window's wall time, as a fraction of one core (a trio loop is one core: near
  1.0 means saturated). Not the process's: its worker threads (fsyncs, a bucket's
  percentiles, server.log's compression) let go of the GIL and use other cores, and a busy
  compressor beside an idle loop read ~100 % -- a healthy client judged saturated. A thread
  that holds the GIL makes the loop late instead, which its lag shows.
  With `--workers N` every worker process runs its own monitor and sends its samples to the
  parent (`process` = 1..N; the parent is 0), so the process tree's CPU is on the record per
  process. Servers soakspec launches are not the client and are not counted.
* Held at the backend's gate: `held_s`, the worker-seconds this process's closed-loop workers
  waited at the backend's backoff gate in the window (`liveness.Health.held_s`): the server
  refused or failed, so fewer requests were in flight -- the judge does not read that lower
  concurrency as the client's saturation. 0 while the gate is open; null where no gate was
  given (a monitor without a backend's load).
* The machine: `host_cpu`, the busy fraction of all CPUs over the window (/proc/stat; null
  where unreadable) -- the context for a starved client (another process took the CPU).
* The wall clock: `wall_step_s`, the machine's wall clock less the run clock at the window's
  end (`RunClock.wall_step`): ~0 until the wall clock is stepped, then the step. Servers stamp
  their traces by the wall clock, so trace matching places a trace across a step recorded
  here (`soakspec.evidence.traces.wall_steps`) instead of finding it outside its request's
  window -- a step of the client's clock is not the server's failure. Null: not measured.

Schedule lag (open loop), achieved vs offered concurrency (closed loop) and the coalesced
fraction of ITL samples come from the request records themselves; the judge computes them per
bucket beside these samples, and reports show them together.

Cost: one wake-up per `TICK_S` (~200/s, a few microseconds each) and one line per `WINDOW_S`:
well under 1 % of one core (benchmarks/loadgen measures it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import trio

from soakspec.evidence.io import JsonlWriter
from soakspec.evidence.traces import WallSteps
from soakspec.runner.clock import RunClock

TICK_S = 0.005  # the monitor's sleep: the resolution of the lag it measures
STALL_S = 0.01  # wake-ups later than this are kept one by one (`stalls`)
WINDOW_S = 1.0  # one sample (line of client.jsonl) per window
MAIN_PROCESS = 0  # `process` of the runner itself; --workers processes are 1..N


def weighted_percentile(values: list[float], weights: list[float], q: float) -> float | None:
    """The smallest value v such that values <= v carry at least q % of the total weight."""
    if not values:
        return None
    pairs = sorted(zip(values, weights))
    total = math.fsum(weights)
    want = total * q / 100.0
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= want - 1e-12:
            return v
    return pairs[-1][0]


def _host_busy() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat), or None."""
    try:
        with open("/proc/stat", "rb") as f:
            parts = f.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != b"cpu":
        return None
    vals = [float(x) for x in parts[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)  # idle + iowait
    return sum(vals[:8]) - idle, sum(vals[:8])


@dataclasses.dataclass(frozen=True, slots=True)
class HealthSample:
    """One window of one load process: a line of client.jsonl."""

    start: float  # run clock
    t: float  # the window's end
    backend: str
    process: int
    wakeups: int
    lag_p50: float
    lag_p99: float
    lag_max: float
    cpu: float | None  # fraction of one core
    host_cpu: float | None  # fraction of the machine's CPUs busy
    tick_s: float = TICK_S
    weight_s: float = 0.0  # the wake-ups' total weight (tick + lag each)
    stalls: tuple[float, ...] = ()  # the lags above STALL_S
    held_s: float | None = None  # worker-seconds held at the backend's backoff gate (None: not tallied)
    wall_step_s: float | None = None  # the wall clock less the run clock at `t` (None: not measured)

    def to_json(self) -> dict[str, Any]:
        r = lambda v: None if v is None else round(v, 6)  # noqa: E731
        return {"schema_version": 1, "start": r(self.start), "t": r(self.t), "backend": self.backend, "process": self.process,
                "wakeups": self.wakeups, "lag_p50": r(self.lag_p50), "lag_p99": r(self.lag_p99),
                "lag_max": r(self.lag_max), "cpu": r(self.cpu), "host_cpu": r(self.host_cpu), "tick_s": self.tick_s, "stall_s": STALL_S,
                "weight_s": r(self.weight_s), "stalls": [round(x, 6) for x in self.stalls], "held_s": r(self.held_s),
                "wall_step_s": r(self.wall_step_s)}  # fmt: skip


class LoopMonitor:
    """Measures this process's event-loop lag and CPU; hands each window's `HealthSample` to
    `sink`. Run it in the load's nursery (`nursery.start_soon(monitor.run)`); cancelling it
    emits the partial window first."""

    def __init__(self, clock: RunClock, sink: Callable[[HealthSample], None], *, backend: str = "",
                 process: int = MAIN_PROCESS, tick_s: float = TICK_S, window_s: float = WINDOW_S,
                 held: Callable[[], float] | None = None,
                 cpu_time: Callable[[], float] = time.thread_time, wall: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        self._clock = clock
        self._sink = sink
        self._backend = backend
        self._process = process
        self._tick = tick_s
        self._window = window_s
        self._cpu_time = cpu_time
        self._wall = wall
        self._held = held  # the backend gate's running tally of worker-seconds held (`Health.held_s`)
        self._held0 = 0.0  # that tally at the window's start

    async def run(self) -> None:
        tick = self._tick
        now = trio.current_time
        lags: list[float] = []
        start = self._clock.now()
        cpu0, wall0, host0 = self._cpu_time(), self._wall(), _host_busy()
        self._held0 = self._held() if self._held is not None else 0.0
        try:
            while True:
                deadline = now() + tick
                window_end = start + self._window
                while True:
                    await trio.sleep_until(deadline)
                    woke = now()
                    lags.append(max(0.0, woke - deadline))
                    deadline = woke + tick
                    if self._clock.now() >= window_end:
                        break
                cpu0, wall0, host0 = self._emit(lags, start, cpu0, wall0, host0)
                lags = []
                start = self._clock.now()
        finally:
            if lags:
                with trio.CancelScope(shield=True):
                    self._emit(lags, start, cpu0, wall0, host0)

    def _emit(self, lags: list[float], start: float, cpu0: float, wall0: float, host0) -> tuple[float, float, Any]:
        cpu1, wall1, host1 = self._cpu_time(), self._wall(), _host_busy()
        elapsed = wall1 - wall0
        cpu = (cpu1 - cpu0) / elapsed if elapsed > 0 else None
        host = None
        if host0 is not None and host1 is not None and host1[1] > host0[1]:
            host = min(1.0, max(0.0, (host1[0] - host0[0]) / (host1[1] - host0[1])))
        weights = [self._tick + x for x in lags]
        stalls = tuple(x for x in lags if x > STALL_S)
        held = None
        if self._held is not None:
            h = self._held()
            held, self._held0 = max(0.0, h - self._held0), h
        sample = HealthSample(
            start=start, t=self._clock.now(), backend=self._backend, process=self._process, wakeups=len(lags),
            lag_p50=weighted_percentile(lags, weights, 50.0) or 0.0, lag_p99=weighted_percentile(lags, weights, 99.0) or 0.0,
            lag_max=max(lags), cpu=None if cpu is None else max(0.0, cpu), host_cpu=host,
            tick_s=self._tick, weight_s=math.fsum(weights), stalls=stalls, held_s=held,
            wall_step_s=self._clock.wall_step(),
        )  # fmt: skip
        self._sink(sample)
        return cpu1, wall1, host1


class ClientLog:
    """client.jsonl: one line per sample, line-atomic appends (several backends' monitors may
    share it: each line names its backend and process). Not fsynced per line -- an fsync on the
    loop would be lag of its own; the file is fsynced when closed."""

    def __init__(self, path) -> None:
        self._writer = JsonlWriter(path, schema="client")  # evidence/schemas/client.schema.json
        self.steps = WallSteps()  # the wall-clock steps its samples recorded: trace matching's
        self._kept: list[dict[str, Any]] | None = None  # `keep`: the rows written since, for a sweep's probe

    def write(self, sample: HealthSample) -> None:
        self.write_json(sample.to_json())

    def write_json(self, row: dict[str, Any]) -> None:
        self.steps.add(row.get("wall_step_s"))
        self._writer.write(row)
        if self._kept is not None:
            self._kept.append(row)

    def keep(self) -> None:
        """From now on, also hold the rows written (until the next `keep`): a sweep's probe is
        judged by the runner on its own samples (judge/sweep.py `probe_judge`), and reading
        client.jsonl back would re-read every earlier probe's. About one row a second per load
        process, over one probe."""
        self._kept = []

    def kept(self) -> list[dict[str, Any]]:
        """The rows written since `keep` (none before it)."""
        return list(self._kept or ())

    def close(self) -> None:
        self._writer.close()


__all__ = ["ClientLog", "MAIN_PROCESS", "STALL_S", "TICK_S", "WINDOW_S", "HealthSample", "LoopMonitor", "weighted_percentile"]
