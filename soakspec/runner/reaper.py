"""The reaper: kills the backend process groups of a soakspec run that died without cleaning up.

Started by the runner with a pipe on stdin. Commands, one per line: `watch PGID`,
`forget PGID`, `marker VALUE` (a launch's SERVER_MARKER: what carries it escaped its group),
`pid PID START` (an orphan the runner adopted as its child subreaper, with its start time: it
carries neither a group nor a marker of the run), `done`. When stdin closes before `done` (the
runner was SIGKILLed, or crashed), every watched group, every process with a watched marker and
every told orphan still running under that start time gets SIGTERM, then SIGKILL two seconds later. The reaper
runs in its own session so a Ctrl-C aimed at the runner's terminal does not kill it first.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _kill(ids: set[int], sig: int, send=os.killpg) -> None:
    """`send(id, sig)` to each: process groups (os.killpg) or processes (os.kill)."""
    for i in ids:
        try:
            send(i, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(groups: set[int]) -> set[int]:
    out = set()
    for pgid in groups:
        try:
            os.killpg(pgid, 0)
            out.add(pgid)
        except ProcessLookupError:
            pass
        except PermissionError:
            out.add(pgid)
    return out


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: set[int] = set()
    markers: set[str] = set()
    orphans: dict[int, int] = {}  # pid -> start time
    clean = False
    for raw in sys.stdin.buffer:
        parts = raw.decode("ascii", "replace").split()
        if not parts:
            continue
        if parts[0] == "done":
            clean = True
            break
        if len(parts) == 2 and parts[0] == "marker":
            markers.add(parts[1])
            continue
        if len(parts) == 3 and parts[0] == "pid" and parts[1].isdigit() and parts[2].isdigit():
            orphans[int(parts[1])] = int(parts[2])
            continue
        if len(parts) == 2 and parts[1].isdigit():
            if parts[0] == "watch":
                groups.add(int(parts[1]))
            elif parts[0] == "forget":
                groups.discard(int(parts[1]))
    if clean:
        return 0
    from soakspec.runner.procs import marked_pids, start_time

    def marked() -> set[int]:
        """The processes with a watched marker, and the told orphans still running (the same start
        time: not a later process that reuses the pid)."""
        return {p for m in markers for p in marked_pids(m)} | {p for p, t in orphans.items() if start_time(p) == t}

    _kill(groups, signal.SIGTERM)
    _kill(marked(), signal.SIGTERM, os.kill)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and (_alive(groups) or marked()):
        time.sleep(0.05)
    _kill(_alive(groups), signal.SIGKILL)
    _kill(marked(), signal.SIGKILL, os.kill)
    return 0


if __name__ == "__main__":
    sys.exit(main())
