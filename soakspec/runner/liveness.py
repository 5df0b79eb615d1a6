"""A backend's liveness during the run: is anything still answering at its port?

A launched server that exits is caught by its process watch (`backend.serve_backend`); this
catches what a process watch cannot: an external (`url`) server that is gone, or a launched
one whose process lives on while nothing answers (an engine that died behind its API server).
The rule is the plan's (`plan.Liveness`):

* `Health` is one backend's shared state. The load reports every record to it (`observe`):
  a completed request shows the backend alive; any response byte shows its port open (the
  backoff ends); a connect that failed (refused, unreachable) is a refusal.
  It is also the load's admission gate (`admit`): after a refusal, requests wait
  (`backoff_base_s`, doubling per refusal up to `backoff_max_s`) and only one at a time tries
  again (the scout), so a dead port gets a few connects per second, not thousands. A server
  whose port answers but whose every answer fails (an API server whose engine died: HTTP 500
  to everything; a connection closed without a response; garbage) is backed off the same way
  once FAIL_STREAK requests in a row have failed with none completed among them: a
  closed loop would otherwise send it tens of thousands of requests a second until the
  liveness probe's grace ran out (an audit counted 82,502 in 6 s). Such a streak does not start
  the liveness grace by itself (the probe decides whether the server is dead); the first
  completed request opens the gate.
  An open-loop arrival that falls due while the gate is shut is not sent late (its latency
  would then be the backoff, and its lateness the client's schedule lag): `hold_back` records it
  at once as `disconnected`, "held back: ..." -- the backend's failure, on the record, never
  silently dropped -- unless it is the one that may try (`try_scout`).
  A closed-loop worker waits at the gate instead; the time workers spend there is the
  server's doing, not the client's, so it is tallied (`held_s`: worker-seconds) and each
  client-health sample carries it (`clienthealth.HealthSample.held_s`): the judge tells a
  concurrency the backoff held down from a client that could not keep it up.
* `watch_liveness` probes the readiness request every `interval_s` (not while the load's own
  completions are recent), each attempt bounded by `attempt_timeout_s`. A refusal or a wrong
  answer (e.g. vLLM's /health saying 500 once its engine died, while its API server still
  answers every request with a 500) starts the grace; a passing probe or a completed request
  ends it. `grace_s` of that, or `hang_s` of probes that got nothing back in time, and it raises
  `BackendError("stopped answering ..." / "failing its readiness probe ...")`: the run stops
  that backend's load and aborts (exit 4), the manifest says when and why, and the buckets
  after it are missing. An abort rule may see it first (an open loop's short buckets fill with
  held-back arrivals within a second): when every request of the bucket it fired on found the
  server gone (`abort.server_gone`: refused connects, held back after them, cut in flight),
  the driver ends the run the same way, worded by the same `dead_message` -- a server that is
  gone is a run abort (exit 4) whichever detector sees it, never the gate FAIL (exit 1) of a
  server that answers and fails.

Nothing here sleeps unboundedly outside the caller's cancel scope; no clock but the run's.
"""

from __future__ import annotations

import httpx
import trio

from soakspec.plan import Launch, Liveness
from soakspec.runner.clock import RunClock
from soakspec.runner.httpxclient import send_once_more_if_unanswered
from soakspec.runner.procs import BackendError
from soakspec.runner.protocol import CONNECT_FAILED, HELD_BACK, HELD_REFUSED
from soakspec.runner.records import Outcome, RequestRecord


FAIL_STREAK = 32  # requests in a row the server failed (none completed): back off as after a refused connect


class Health:
    """One backend's liveness state and the load's admission gate (see the module docstring)."""

    def __init__(self, clock: RunClock, liveness: Liveness = Liveness()) -> None:
        self.clock = clock
        self.liveness = liveness
        self.answered_at: float | None = None  # the last sign of life (a passing probe, a completion)
        self.refused_since: float | None = None  # the first refusal or failing probe since then
        self.refusing = False  # the last problem was a refused connect (else: a wrong answer)
        self.last_problem: str | None = None
        self.refusals = 0  # strikes since the last answer: refused connects, or failures past the streak
        self.streak = 0  # answered requests that failed since the last completion
        self.why = ""  # why the gate is shut (the held-back records' error)
        self._until = 0.0  # no request starts before this (run clock), while refusals > 0
        self._scout = False  # a request is trying again
        self._waiting = 0  # closed-loop workers waiting at the gate now
        self._held = 0.0  # worker-seconds they waited there, up to `_held_at` (run clock)
        self._held_at = 0.0
        self._changed = trio.Event()
        self.wake = trio.Event()  # the watcher should look now

    # -- what the load and the probes saw --------------------------------------------------------

    def answered(self, t: float) -> None:
        """A sign of life at `t`: a passing probe or a completed request."""
        if self.answered_at is None or t > self.answered_at:
            self.answered_at = t
        self.refused_since = None
        self.port_open()

    def port_open(self) -> None:
        """Something answered at the port (maybe an error): connects need no backoff."""
        if self.refusals:
            self.refusals = 0
            self._until = 0.0
            self._notify()

    def failing(self, t: float, problem: str, refused: bool) -> None:
        """A failing probe (or a refused connect) at `t`: the grace runs from the first one."""
        if self.refused_since is None:
            self.refused_since = t
        self.last_problem = problem
        self.refusing = refused

    def refused(self, t: float, problem: str) -> None:
        self.failing(t, problem, True)
        self._strike(t, f"{HELD_REFUSED}{self.refusals + 1} connects ({problem})")

    def _strike(self, t: float, why: str) -> None:
        """Shut the gate: the next request waits the doubled backoff, then one tries."""
        lv = self.liveness
        self.refusals += 1
        self.why = why
        delay = min(lv.backoff_max_s, lv.backoff_base_s * 2 ** min(self.refusals - 1, 30))
        self._until = max(self._until, t + delay)
        self.wake.set()

    def observe(self, rec: RequestRecord) -> None:
        """One finished request of the load."""
        t = rec.end if rec.end is not None else self.clock.now()
        err = rec.error or ""
        if rec.outcome is Outcome.COMPLETED:
            self.streak = 0
            self.answered(rec.first_byte if rec.first_byte is not None else t)
        elif rec.outcome is Outcome.DISCONNECTED and rec.first_byte is None and err.startswith(CONNECT_FAILED):
            self.refused(t, err[len(CONNECT_FAILED):])
        elif rec.start is None or err.startswith(HELD_BACK) or rec.outcome is Outcome.TIMEOUT:
            return  # not the server's answer (never sent: the client's limit; held back), or a slow one (`hang_s`)
        else:  # an answer that failed, or the request taken and the connection closed
            self.streak += 1
            if self.streak >= FAIL_STREAK:
                self._strike(t, f"its last {self.streak} requests failed (the last: {err or rec.outcome.value})")
            elif rec.first_byte is not None:
                self.port_open()

    # -- the admission gate ----------------------------------------------------------------------

    async def admit(self) -> bool:
        """Wait until a request may start. True: it is the scout (call `scouted()` after it).
        The wait is tallied in `held_s`."""
        if not self.refusals:
            await trio.lowlevel.checkpoint()
            return False
        self._tally()
        self._waiting += 1
        try:
            while self.refusals:
                if self.clock.now() < self._until:
                    await trio.sleep_until(self.clock.to_trio(self._until))
                    continue
                if not self._scout:
                    self._scout = True
                    return True
                await self._changed.wait()
            await trio.lowlevel.checkpoint()
            return False
        finally:
            self._tally()
            self._waiting -= 1

    def held_s(self) -> float:
        """Worker-seconds the load has waited at the gate so far (those waiting now included)."""
        self._tally()
        return self._held

    def _tally(self) -> None:
        now = self.clock.now()
        if self._waiting:
            self._held += self._waiting * max(0.0, now - self._held_at)
        self._held_at = now

    def try_scout(self) -> bool | None:
        """For an arrival that cannot wait: None when the gate is open (send as usual), True when
        this request may try now as the scout (call `scouted()` after it), False when it is
        held back (`hold_back`)."""
        if not self.refusals:
            return None
        if self.clock.now() < self._until or self._scout:
            return False
        self._scout = True
        return True

    def hold_back(self, rec: RequestRecord) -> None:
        """Fill `rec` (its start set: the time it fell due and was decided) as held back."""
        rec.end = rec.start
        rec.outcome = Outcome.DISCONNECTED
        rec.error = HELD_BACK + (self.why or "the backend is backed off")

    def scouted(self) -> None:
        self._scout = False
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


async def probe_once(http: httpx.AsyncClient, la: Launch, url: str) -> tuple[str, str]:
    """("ok" | "refused" | "wrong" | "hung", what was seen) for one bounded readiness request."""
    p = la.probe
    with trio.move_on_after(la.liveness.attempt_timeout_s):
        try:
            resp = await send_once_more_if_unanswered(http, p.method, url + p.path)  # a connection closed while idle
        except httpx.TimeoutException:
            return "hung", f"{p.method} {p.path}: no answer within {la.liveness.attempt_timeout_s:g}s"
        except httpx.HTTPError as e:  # refused, reset, closed without an answer (sent again once), not HTTP
            return "refused", f"{p.method} {p.path}: {_describe(e)}"
        if resp.status_code == p.status:
            return "ok", f"HTTP {resp.status_code}"
        return "wrong", f"{p.method} {p.path}: HTTP {resp.status_code} (expected {p.status})"
    return "hung", f"{p.method} {p.path}: no answer within {la.liveness.attempt_timeout_s:g}s"


def _describe(e: BaseException) -> str:
    from soakspec.runner.protocol import describe_transport_error

    return describe_transport_error(e)


async def watch_liveness(la: Launch, url: str, health: Health, http: httpx.AsyncClient) -> None:
    """Probe until the backend is dead by the plan's rule; then raise `BackendError`. Runs until
    cancelled (the load is done) otherwise."""
    lv = la.liveness
    clock = health.clock
    hung_since: float | None = None
    while True:
        now = clock.now()
        recent = health.answered_at is not None and now - health.answered_at < lv.interval_s
        if not recent:
            verdict, what = await probe_once(http, la, url)
            t = clock.now()
            if verdict == "ok":
                health.answered(t)
                hung_since = None
            elif verdict == "hung":
                hung_since = t if hung_since is None else hung_since
                health.last_problem = what
            else:
                health.failing(t, what, verdict == "refused")
            if health.refused_since is not None and t - health.refused_since >= lv.grace_s:
                how = "stopped answering" if health.refusing else "failing its readiness probe"
                raise BackendError(la.name, dead_message(how, health.last_problem or what, f"{lv.grace_s:g}s", health))
            if hung_since is not None and t - hung_since >= lv.hang_s:
                raise BackendError(la.name, f"stopped answering: {what} for {lv.hang_s:g}s")
        with trio.move_on_after(lv.interval_s):
            await health.wake.wait()
        health.wake = trio.Event()


def dead_message(how: str, problem: str, for_s: str, health: Health | None) -> str:
    """Why a backend is dead, as the run's reason says it -- worded the same whichever saw it
    first, this watch or an abort rule whose requests all found the server gone
    (`abort.Fired.gone`, `driver.drive_backend`): "stopped answering: connection refused
    (econnrefused) for 5s (no sign of life since 12:00:01.234 UTC)"."""
    return f"{how}: {problem} for {for_s} (no sign of life since {_since(health) if health is not None else 'unknown'})"


def _since(health: Health) -> str:
    if health.answered_at is None:
        return "the run began"
    import datetime as _dt

    return _dt.datetime.fromtimestamp(health.answered_at, _dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3] + " UTC"


__all__ = ["Health", "dead_message", "probe_once", "watch_liveness"]
