"""soakspec as its run's child subreaper (`runner/procs.py` `Orphans`): the orphans of a server's
tree come to it and are stopped and reaped, and nothing it waits for itself is touched.

Real processes in this test's own process (made a subreaper for the test, and restored)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import trio

from runner_support import pid_running
from soakspec.runner.procs import Orphans, spawned_ended, spawning

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")

# a child that double-forks: the grandchild leaves the session and scrubs its environment, prints its pid
ESCAPE = (
    "import os, sys, time\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        os.dup2(w, 1)\n"
    "        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)\n"
    "        os.execve(sys.executable, [sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); "
    "time.sleep(60)'], {})\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "os.close(w)\n"
    "print(os.read(r, 64).decode().strip(), flush=True)\n"
)


def _adopted_grandchild() -> int:
    """Run ESCAPE in a session of its own (as a launched server runs) and return the orphan's pid."""
    out = subprocess.run([sys.executable, "-c", ESCAPE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=30,
                         start_new_session=True)  # fmt: skip
    return int(out.stdout.split()[-1])


@pytest.fixture
def orphans():
    o = Orphans()
    o.enable()
    assert o.enabled, o.why_not
    try:
        yield o
    finally:
        o.kill_all()
        o.disable()


def test_an_orphan_that_left_the_session_and_its_environment_is_adopted_stopped_and_reaped(orphans):
    """The grandchild, once its parent exits, is this process's child; `stop` ends it with
    SIGTERM and reaps it (no zombie is left: the pid is gone from /proc)."""
    pid = _adopted_grandchild()
    assert pid_running(pid)
    assert pid in orphans.adopted()
    assert trio.run(orphans.stop, 5.0, 2.0) == [pid]
    assert not os.path.exists(f"/proc/{pid}"), "stopped and reaped, not left a zombie"
    assert orphans.adopted() == []


def test_what_soakspec_waits_for_itself_is_never_taken_for_an_orphan(orphans):
    """A child started under `spawning()` (a server, a `--workers` process: sessions of their
    own), and a child in soakspec's own session (git, ssh-keygen) are not orphans: `stop` neither
    signals them nor reaps them, so the exit status their waiter reads is still theirs."""
    with spawning() as own:
        ours = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.2); sys.exit(7)"],
                                start_new_session=True)  # fmt: skip
        own(ours.pid)
    plain = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.2); sys.exit(5)"])
    try:
        orphan = _adopted_grandchild()
        deadline = time.monotonic() + 10
        while (ours.poll() is None or plain.poll() is None) and time.monotonic() < deadline:
            # their exits leave zombies for their waiters: `adopted` must not reap them
            assert set(orphans.adopted()) == {orphan}
            time.sleep(0.05)
        assert trio.run(orphans.stop, 5.0, 2.0) == [orphan]
        assert ours.wait(timeout=10) == 7 and plain.wait(timeout=10) == 5
    finally:
        spawned_ended(ours.pid)
        for p in (ours, plain):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_no_orphan_is_looked_for_while_a_start_is_in_flight(orphans):
    """The pid of a process being started is not known yet: meanwhile nothing is adopted (the
    start would be taken for an orphan), and the orphan is found once the start is done."""
    pid = _adopted_grandchild()
    with spawning():
        assert orphans.adopted() == []
    assert orphans.adopted() == [pid]
