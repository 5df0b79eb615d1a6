"""Backend server processes: launch, readiness, teardown, and the guarantee that none survives.

Each launched backend runs in its own session (process group). Its stdout and stderr go
straight into `server.log` in the evidence directory (the kernel writes; nothing to pump,
nothing to block; plain text while it runs, its older lines moved out compressed at each
bucket's end, and the rest capped and gzipped into server.log.gz by `collect` once the server
is stopped: `evidence.serverlog`). Teardown sends SIGTERM to the whole group,
waits the spec's grace, then SIGKILL.

No server may outlive soakspec, even when soakspec itself is SIGKILLed: a small reaper
process (`python -m soakspec.runner.reaper`) is told each process group over a pipe; when the
pipe closes without a clean "done" (soakspec died), it kills the groups. This covers
grandchildren too (`shell` backends, servers that fork workers).

A process that leaves its group and its parent both (a launcher that daemonizes its server:
`(setsid server &)`, then exits) is found by its environment instead: each launch gets its own
SERVER_MARKER variable, which every descendant inherits, and `stop` -- and the reaper -- end
whatever still carries it once the server's groups are gone (`marked_pids`; an audit found
such a server serving after the run).

PR_SET_PDEATHSIG is deliberately not used: trio starts processes from a worker thread, and
the signal fires when that *thread* exits (trio retires idle threads after ~10 s), which
would kill a healthy server mid-soak.

A descendant that leaves the group *and* scrubs its environment (`setsid`, then
`execve(..., {})`: a daemonizing server, a helper that re-execs itself clean) carries no
marker. For it soakspec makes itself the *child subreaper* of its run (Linux's
PR_SET_CHILD_SUBREAPER, `Orphans`; set for the run, restored after): an orphan anywhere under
a launched server is re-parented to soakspec instead of init, so it stays findable by
parentage (its /proc/PID/stat ppid is soakspec's pid). `stop` ends those too -- SIGTERM, the
grace, SIGKILL -- once no other launched server of the run is still serving (an orphan does
not say which server it came from), and reaps them: a subreaper must `waitpid` its adopted
zombies, and it does so only for the pids it adopted (`os.waitpid(pid, WNOHANG)` on each, never
`waitpid(-1)`, which would steal the exit status of a server, a `--workers` process or the
reaper that trio or subprocess waits for). What soakspec starts itself is registered
(`spawning`) and never taken for an orphan, nor is anything in soakspec's own session (git,
ssh-keygen: every launched server's descendant is in another, since the server starts a
session of its own), nor a child that was already there when the run began. Off Linux, or where
prctl refuses, it is a no-op whose reason the manifest records (`host.child_subreaper`).
A SIGKILLed soakspec cannot stop them itself, and they go to init: so the reaper process is told
each one it adopted (`Reaper.tell_orphans`: when its server is ready, then every
`ORPHAN_SCAN_S`), by pid and start time, and ends those still running when its pipe closes unclean.

Before launching, the port soakspec picked for the server must not already accept connections
(`port_taken`): a server left from an earlier run (a container still publishing the port
answers without any process listening on this host) would answer the readiness probe at once,
while the real server loads, and the run would measure the wrong server. The port itself
comes from the run's `PortAllocator`, which never hands one port to two servers of the run.
And a process that takes the port *after* that check, while the server loads, is caught when
the readiness probe passes: the socket listening on the port must be held by the launched
server's process tree (`port_owner`), else the backend is not ready and the run aborts naming
that process (`ReadinessProbe._answered_by_the_server`: why /proc's "cannot tell" goes on).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import ipaddress
import math
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence

import httpx
import trio

from soakspec.evidence.netpath import is_loopback
from soakspec.evidence.telemetry import process_tree_pids
from soakspec.runner.fdlimit import server_preexec

SERVER_MARKER = "SOAKSPEC_SERVER"  # in each launched server's environment: that launch's own value


def marked_pids(marker: str) -> list[int]:
    """The processes whose environment holds SERVER_MARKER=`marker` (from /proc; [] where there
    is none, or none can be read)."""
    want = f"{SERVER_MARKER}={marker}".encode()
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if want in fh.read().split(b"\0"):
                    out.append(int(name))
        except OSError:  # gone, or not ours to read
            continue
    return out


class _Spawns:
    """The processes soakspec starts itself and waits for (servers, `--workers` processes, the
    reaper): never taken for adopted orphans. `pending`: a start in flight (its pid not known yet)."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.pending = 0


_SPAWNS = _Spawns()


@contextlib.contextmanager
def spawning() -> Iterator[Callable[[int], None]]:
    """Around a start of a process soakspec waits for: `with spawning() as own: p = start(); own(p.pid)`.
    While one is in flight no orphan is looked for (the new child is not registered yet)."""
    _SPAWNS.pending += 1
    try:
        yield _SPAWNS.pids.add
    finally:
        _SPAWNS.pending -= 1


def spawned_ended(pid: int) -> None:
    """A registered process has been waited for: its pid may be reused by another."""
    _SPAWNS.pids.discard(pid)


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PR_GET_CHILD_SUBREAPER = 37


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """/proc/PID/stat after the command: state, ppid, pgrp, session, ... (None: gone, unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks after boot, /proc/PID/stat): with its pid, what names
    it and no later process that reuses the pid (None: gone)."""
    f = _stat_fields(pid)
    try:
        return int(f[19]) if f is not None else None
    except (IndexError, ValueError):
        return None


def _running(pid: int) -> bool:
    f = _stat_fields(pid)
    return f is not None and f[0] not in (b"Z", b"X")


class Orphans:
    """soakspec as its run's child subreaper: the orphans of its servers' trees come to it
    (see the module docstring). `enable()` at the run's start, `disable()` at its end."""

    def __init__(self) -> None:
        self.enabled = False
        self.why_not: str | None = None  # why it is not enabled (off Linux, prctl refused)
        self.serving: set[int] = set()  # launched servers not stopped yet: orphans wait until none is
        self._previous = 0
        self._before: set[int] = set()  # children already there when the run began

    def enable(self) -> None:
        if not sys.platform.startswith("linux"):
            self.why_not = f"not Linux ({sys.platform}): PR_SET_CHILD_SUBREAPER is Linux's"
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            prev = ctypes.c_int(0)
            libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(prev), 0, 0, 0)
            if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                self.why_not = f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
                return
        except (OSError, AttributeError) as e:
            self.why_not = f"prctl is not available: {e}"
            return
        self._previous = prev.value
        self._before = set(self._children())
        self.enabled = True

    def disable(self) -> None:
        """The subreaper flag as it was before the run (an orphan from now on goes to init)."""
        if self.enabled:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, self._previous, 0, 0, 0)
            self.enabled = False

    def to_json(self) -> dict:
        return {"enabled": self.enabled, "reason": self.why_not}

    @staticmethod
    def _children() -> dict[int, list[bytes]]:
        me = str(os.getpid()).encode()
        out = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            return {}
        for name in names:
            if name.isdigit() and (f := _stat_fields(name)) is not None and len(f) > 3 and f[1] == me:
                out[int(name)] = f
        return out

    def adopted(self) -> list[int]:
        """The live orphans soakspec adopted, and their descendants; the adopted that have exited
        are reaped here (`waitpid` of each such pid, never of any other)."""
        if not self.enabled or _SPAWNS.pending:
            return []
        own_session = str(os.getsid(0)).encode()
        live: list[int] = []
        for pid, f in self._children().items():
            if pid in _SPAWNS.pids or pid in self._before or f[3] == own_session:
                continue
            if f[0] in (b"Z", b"X"):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
                continue
            try:
                tree = process_tree_pids(pid)
            except OSError:  # /proc not listed (out of file descriptors): the orphan itself, at least
                tree = [pid]
            live.extend(p for p in tree if p not in live and _running(p))
        return live

    async def stop(self, grace_s: float, kill_wait_s: float) -> list[int]:
        """End every adopted orphan (and what it started): SIGTERM, up to `grace_s`, SIGKILL, up to
        `kill_wait_s`; reaped as they exit. Returns the pids it signalled (sorted)."""
        seen: set[int] = set()

        def signal_new(sig: int) -> bool:
            found = self.adopted()
            for p in found:
                if sig == signal.SIGKILL or p not in seen:
                    _kill(p, sig)
            seen.update(found)
            return bool(found)

        if not signal_new(signal.SIGTERM):
            return []
        with trio.move_on_after(grace_s):
            while signal_new(signal.SIGTERM):
                await trio.sleep(0.05)
        with trio.move_on_after(kill_wait_s):
            while signal_new(signal.SIGKILL):
                await trio.sleep(0.05)
        return sorted(seen)

    def kill_all(self, wait_s: float = 2.0) -> list[int]:
        """What is still adopted when the run ends (a teardown its bound cut short): SIGKILL, and
        reaped within `wait_s`. Blocking: for the run's very end."""
        seen: set[int] = set()
        deadline = time.monotonic() + wait_s
        while found := self.adopted():
            for p in found:
                _kill(p, signal.SIGKILL)
            seen.update(found)
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return sorted(seen)


class BackendError(Exception):
    """A backend could not be started or died: the run aborts (exit 4)."""

    def __init__(self, backend: str, message: str, log_tail: str = "", diagnosis: tuple[str, ...] = ()):
        super().__init__(message)
        self.backend = backend
        self.message = message
        self.log_tail = log_tail
        self.diagnosis = diagnosis  # the log lines that look like the cause (`crash_lines`)

    def __str__(self) -> str:
        return f"backend '{self.backend}': {self.message}"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on `host` now (bind port 0, read it, close): nothing keeps it
    free, and the OS may answer it again to the next ask -- a run asks through its
    `PortAllocator`, which never hands the same port out twice."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


PORT_TRIES = 20  # asks of the OS for a port the run has not handed out yet, before giving up


class PortAllocator:
    """The ports one run hands to its launched servers, each at most once.

    `free_port` closes the socket it bound, so the port is free only until something binds it:
    two asks -- or one ask and a server that has not bound its port yet (a vLLM loads for a
    minute first) -- can get the same answer, and two backends of one run (side by side, or one
    after the other while the first still loads) would be started on one port: the second cannot
    bind, or its readiness is answered by the first. The allocator remembers every port it handed
    out during the run and asks the OS again, at most `tries` times, for one it has not.

    Owned by the run (the engine makes one and passes it down in `backend.Deps`): no module
    state, so two runs in one process (tests) never see each other's ports. `pick` is the OS's
    answer (`free_port`, looked up when the allocator is made); tests give their own.

    It is not the whole guarantee: a port handed out may still be taken by a process outside
    the run. `port_taken` (before launching) and `port_owner` (at readiness) look at that."""

    def __init__(self, pick: Callable[[str], int] | None = None, tries: int = PORT_TRIES) -> None:
        self._pick = pick if pick is not None else free_port
        self.tries = tries
        self._given: set[int] = set()

    def allocate(self, host: str) -> int | None:
        """A port for a server on `host` that this run has not handed out before, remembered as
        handed out; None when the OS answered only such ports `tries` times in a row."""
        for _ in range(self.tries):
            port = self._pick(host)
            if port not in self._given:
                self._given.add(port)
                return port
        return None

    @property
    def handed_out(self) -> frozenset[int]:
        return frozenset(self._given)


def port_taken(host: str, port: int, timeout_s: float = 1.0) -> str | None:
    """Whether `host:port` (a loopback address: the only kind soakspec launches servers on)
    already accepts TCP connections: None when it does not (refused, or not a loopback address,
    which is not looked at), else what listens there, for the message (`listener_of`)."""
    if not is_loopback(host):
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError:  # refused (the usual), unreachable, or no answer within the bound: nothing takes it
        return None
    return listener_of(port)


@dataclasses.dataclass(frozen=True)
class Listening:
    """Who listens on a TCP port, as /proc shows it: `holders`, each (pid, command line) of a
    process holding one of its listening sockets; `sockets`, how many listening sockets /proc
    lists for the port (0: none in this network namespace); `unreadable`, why a socket's process
    could not be found (None when /proc told everything)."""

    sockets: int
    holders: tuple[tuple[int, str], ...]
    unreadable: str | None = None


NO_LISTENER = "no process of this host's network namespace listens there: a forwarded port, a container's?"
NOT_READABLE = "its process is not readable from /proc: another user's?"
# a port forward holds the port (`PORT_FORWARDERS`): recorded as `via` "forward" (evidence/netpath.py);
# evidence from before `via` was read by "port forward" in this text, so keep those words
FORWARDED_REASON = "a container engine's port forward ({name}) listens there: whose container it forwards to /proc does not say"


def _address(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """/proc/net/tcp{,6}'s local address (each 32-bit word in host byte order) as an address."""
    try:
        raw = bytes.fromhex(hexaddr)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def _answers_for(addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None, host: str | None) -> bool:
    """Whether a socket listening on `addr` takes connections made to `host` (None: any)."""
    if host is None or addr is None:
        return True
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_unspecified:  # 0.0.0.0, or :: (which takes IPv4 too unless IPV6_V6ONLY: not shown)
        return True
    if host == "localhost":
        return addr.is_loopback
    try:
        return addr == ipaddress.ip_address(host)
    except ValueError:
        return True


def listening(port: int, host: str | None = None) -> Listening:
    """Best effort, from /proc: the processes listening on TCP `port` (at an address that takes
    connections to `host`; any address when None). A socket's inode from /proc/net/tcp{,6}, then
    the processes whose /proc/PID/fd link to it (a server's forked workers share it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            # local_address is HEX_ADDR:HEX_PORT; st 0A is LISTEN; the socket's inode is field 9
            if len(f) > 9 and f[3] == "0A":
                addr, _, hexport = f[1].rpartition(":")
                if int(hexport, 16) == port and _answers_for(_address(addr), host):
                    inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return Listening(0, ())
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        names = []
    holders = []
    found = set()
    for name in names:
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{name}/fd/{fd}")
                if link not in inodes:
                    continue
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except OSError:
                continue
            found.add(link)
            if not holders or holders[-1][0] != int(name):  # one entry a process, however many sockets it holds
                holders.append((int(name), cmd[:200] or "?"))
    return Listening(len(inodes), tuple(holders), None if found == inodes else NOT_READABLE)


def listener_of(port: int) -> str:
    """Best effort, from /proc: ' (PID 1234: its command line)' of the process listening on TCP
    `port`; what /proc says instead when it cannot tell (another user's process, none in this
    network namespace: a container's published port)."""
    seen = listening(port)
    if not seen.sockets:
        return f" ({NO_LISTENER})"
    if not seen.holders:
        return f" ({NOT_READABLE})"
    pid, cmd = seen.holders[0]
    return f" (PID {pid}: {cmd})"


# A container engine's port forward listens on the host for the container a launched `docker run
# -p` (or podman) starts: started by the engine's daemon, not by the launched server, so /proc
# cannot say whose container it forwards to. Such a listener is "cannot tell", not "another".
PORT_FORWARDERS = ("docker-proxy", "rootlessport", "rootlessport-child", "rootlesskit", "slirp4netns", "pasta",
                   "passt", "conmon")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PortOwner:
    """Whose listening socket a launched server's port is, at readiness (`port_owner`):
    `owner` "server" (the launched server's process tree: `pid` the one holding it), "other"
    (another process: `pid`, `command`), or "unknown" (/proc cannot tell: `reason`). `via`
    says what held the socket, as a fact compare reads (one of `evidence/netpath.py` `VIAS`);
    `reason` says it to a person."""

    owner: str
    via: str
    pid: int | None = None
    command: str | None = None
    reason: str | None = None

    def to_json(self) -> dict:
        """The manifest's `port_listener`: the command line of another process is not kept (it
        may carry that process's secrets; the abort's reason names it, redacted)."""
        return {"owner": self.owner, "via": self.via, "pid": self.pid, "reason": self.reason}


def _ancestors(pid: int, limit: int = 64) -> list[int]:
    """`pid`'s parent, its parent's, ... (from /proc/PID/stat), up to pid 1 or `limit` steps."""
    out = []
    while len(out) < limit:
        f = _stat_fields(pid)
        try:
            pid = int(f[1]) if f is not None else 0
        except (IndexError, ValueError):
            break
        if pid <= 1:
            break
        out.append(pid)
    return out


def _of_server(server: Server, pid: int) -> bool:
    """Whether `pid` is the launched server's: the server itself or a descendant; in its session
    or process group (the server leads both: `start_new_session`); carrying its launch's
    SERVER_MARKER (a daemonized server, out of its tree); or an orphan of the run re-parented to
    soakspec (`Orphans`: a child of soakspec's that soakspec did not start, out of its session)."""
    if pid == server.pid:
        return True
    up = _ancestors(pid)
    if server.pid in up:
        return True
    me = os.getpid()
    if me in up:  # under soakspec: through one of its own spawns (another server) or an adopted orphan
        child = ([pid] + up)[up.index(me)]
        with contextlib.suppress(OSError):
            if child not in _SPAWNS.pids and os.getsid(child) != os.getsid(0):
                return True
    with contextlib.suppress(OSError):
        if server.pgid in (os.getsid(pid), os.getpgid(pid)):
            return True
    return server.marker is not None and pid in marked_pids(server.marker)


def _namespaces(pid: int) -> tuple[str, str] | None:
    """`pid`'s PID and mount namespaces (None: not readable)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid"), os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def port_owner(server: Server, host: str, port: int) -> PortOwner:
    """Whose is the socket listening on `host:port`, which the launched `server` was given (see
    `PortOwner`). "other" as soon as one process holding such a socket is neither the server's
    nor a container engine's port forward (`PORT_FORWARDERS`); "server" when one is the server's
    and none is another's; "unknown" when /proc cannot tell: no such socket in this network
    namespace (a container's published port, a server in a namespace of its own), its process
    not readable (another user's: a server started with sudo), a port forward, a process in
    another PID or mount namespace (a container's server on the host's network: started by the
    container engine, not under the launch), or no /proc."""
    if not os.path.exists("/proc/net/tcp"):
        return PortOwner("unknown", "unreadable", reason="/proc/net/tcp is not readable here (not Linux?): the listener was not checked")
    seen = listening(port, host)
    if not seen.sockets:
        return PortOwner("unknown", "unseen", reason=NO_LISTENER)
    own_ns = _namespaces(os.getpid())
    ours: int | None = None
    unsure: PortOwner | None = None
    for pid, cmd in seen.holders:
        if _of_server(server, pid):
            ours = pid if ours is None else ours
        elif (name := os.path.basename(cmd.split(" ", 1)[0])) in PORT_FORWARDERS:
            unsure = unsure or PortOwner("unknown", "forward", pid, reason=FORWARDED_REASON.format(name=name))
        elif (ns := _namespaces(pid)) is not None and own_ns is not None and ns != own_ns:
            why = (f"PID {pid}, which listens there, runs in another PID or mount namespace (a container's, as "
                   "`docker run --network host` starts): /proc does not say which launch started it")
            unsure = unsure or PortOwner("unknown", "namespace", pid, reason=why)
        else:
            return PortOwner("other", "other", pid, cmd)
    if ours is not None:
        return PortOwner("server", "server", ours)
    if unsure is not None:
        return unsure
    return PortOwner("unknown", "unreadable", reason=seen.unreadable or NOT_READABLE)


def log_tail(path: str | os.PathLike | None, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    """The last lines of a log, decoded leniently (a server may print binary garbage)."""
    if path is None:
        return "(the spec sets log = false: the server's output was not kept)"
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    text = "".join(ch if ch.isprintable() or ch in "\n\t" else "\ufffd" for ch in text)
    return "\n".join(text.splitlines()[-lines:])


# A line that says why a server died: an error, an exception and its traceback, a worker that
# died, a signal, a crash, a Rust server's panic ("thread 'main' panicked at ...", then its
# backtrace note). Request-log noise (access lines, even of a 500) does not count.
_CAUSE = re.compile(
    r"error|exception|traceback|\bdied\b|\bsignal\b|\bsig(?:kill|segv|abrt|term|bus|ill)\b|killed|fatal|"
    r"abort|out of memory|\boom\b|exit code|core dumped|assert|\bpanic|backtrace|segmentation fault|\bcrash",
    re.IGNORECASE,
)
_ACCESS_LOG = re.compile(r'"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) \S+ HTTP/[\d.]+" \d{3}')
CAUSE_LINES = 12


def crash_lines(path: str | os.PathLike | None, max_lines: int = CAUSE_LINES, max_bytes: int = 256 * 1024) -> tuple[str, ...]:
    """The last `max_lines` lines of a log that look like the cause of a crash (error, exception,
    Traceback, "died", signal lines), oldest first, each once; the whole log's end is read
    (at most `max_bytes`), so a cause buried under request-log noise is still found."""
    if path is None:
        return ()
    text = log_tail(path, lines=10**9, max_bytes=max_bytes)
    out: list[str] = []
    for line in text.splitlines():
        line = line.rstrip()
        if line and _CAUSE.search(line) and not _ACCESS_LOG.search(line) and line not in out[-3:]:
            out.append(line[:500])
    return tuple(out[-max_lines:])


def diagnosis_text(err: BackendError) -> str:
    """What the engine shows on stderr: the lines that look like the cause, then the tail."""
    parts = []
    if err.diagnosis:
        parts.append(f"last lines of {err.backend}'s log that look like the cause:\n" + "\n".join(err.diagnosis))
    if err.log_tail:
        parts.append(f"last lines of {err.backend}'s log:\n{err.log_tail}")
    return "\n".join(parts)


class Reaper:
    """Handle on the reaper process. `watch(pgid)` before a group can leak; `close()` at the end.
    `orphans`: the run's child-subreaper state (`Orphans`), which `stop` ends what it adopted with."""

    def __init__(self, orphans: Orphans | None = None) -> None:
        self._proc: subprocess.Popen | None = None
        self.orphans = orphans if orphans is not None else Orphans()
        self._told: set[int] = set()  # the orphans `tell_orphans` has told the reaper process

    def start(self) -> None:
        if self._proc is not None:
            return
        with spawning() as own:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "soakspec.runner.reaper", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to our group must not kill it first
                close_fds=True,
            )
            own(self._proc.pid)

    def _send(self, line: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def watch(self, pgid: int) -> None:
        self._send(f"watch {pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"forget {pgid}")

    def watch_marker(self, marker: str) -> None:
        self._send(f"marker {marker}")

    def tell_orphans(self) -> None:
        """Tell the reaper process each orphan the run has adopted (`Orphans`), with its start
        time: if soakspec dies, they go to init, and only the reaper can still end them."""
        for pid in self.orphans.adopted():
            if pid not in self._told and (start := start_time(pid)) is not None:
                self._told.add(pid)
                self._send(f"pid {pid} {start}")

    def close(self) -> None:
        self.orphans.kill_all()  # what a teardown cut short by its bound left: nothing, normally
        if self._proc is None:
            return
        self._send("done")
        try:
            if self._proc.stdin:
                self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            self._proc.kill()
        spawned_ended(self._proc.pid)
        self._proc = None


@dataclasses.dataclass
class Server:
    """A launched backend process."""

    name: str
    process: trio.Process
    pgid: int
    log_path: str | None
    started_at: float
    exit_status: int | None = None
    stop_signal: str | None = None
    marker: str | None = None  # its SERVER_MARKER value
    orphans_stopped: list[int] = dataclasses.field(default_factory=list)  # adopted orphans its `stop` ended

    def stragglers(self) -> list[int]:
        """Processes of this launch still running outside the server's own process (SERVER_MARKER)."""
        return [p for p in marked_pids(self.marker) if p != self.pid] if self.marker else []

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        rc = self.process.poll()
        if rc is not None and self.exit_status is None:
            self.exit_status = rc
        return rc


def _describe(e: BaseException) -> str:
    from soakspec.runner.protocol import describe_transport_error

    return describe_transport_error(e)


FULL_DISK_BYTES = 64 * 1024  # free space below this on the log's filesystem: a write of the server's log may have failed


def full_disk_note(log_path: str | os.PathLike | None, rc: int | None = None) -> str:
    """For the message of a server that exited: when the filesystem its log is written to (the
    evidence directory's) is full, that its log could not be written -- a server whose print
    fails on ENOSPC exits, and its log tail then cannot say why. Else, when soakspec runs under a
    file-size limit (`ulimit -f`, which the server inherits) and the server was killed by
    SIGXFSZ or its log reached the limit, that limit. "" otherwise."""
    if log_path is None:
        return ""
    try:
        st = os.statvfs(os.path.dirname(os.fspath(log_path)) or ".")
    except OSError:
        return ""
    if st.f_bavail * st.f_frsize < FULL_DISK_BYTES:
        return (f"; the filesystem of its log {os.fspath(log_path)} is full ({st.f_bavail * st.f_frsize} bytes free): "
                "the server could not write its log, which may be why it exited")
    return file_limit_note(log_path, rc)


def file_limit_note(log_path: str | os.PathLike, rc: int | None) -> str:
    """`full_disk_note`'s file-size limit: a limit soakspec runs under (`ulimit -f`) is the
    server's too -- it inherits it, and a write past it kills it with SIGXFSZ or fails with
    EFBIG (a Python server ignores the signal: "OSError: [Errno 27] File too large", then exit
    status 1) -- and a server's death by it was said as "exited with status 1" alone. Said for
    any server that exited unsuccessfully while such a limit is set."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY or rc == 0:
        return ""
    try:
        reached = os.path.getsize(log_path) >= limit
    except OSError:
        reached = False
    certain = rc == -signal.SIGXFSZ or reached
    return (f"; soakspec runs under a file-size limit (ulimit -f) of {limit} bytes, which the server inherits"
            f"{' and its log reached' if reached else ''}: a server that writes a larger file is stopped"
            f"{'' if certain else ', which may be why it exited'} -- raise the limit (ulimit -f unlimited)")


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


async def launch(
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    log_path: str | None,
    reaper: Reaper | None,
    started_at: float,
) -> Server:
    """Start the server; raise BackendError when it cannot even be executed. With
    `log_path` None the server's output is discarded (a spec's `log = false`)."""
    log_fd = os.open(log_path if log_path is not None else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    what = argv[0] if argv else ""
    marker = f"{os.getpid()}-{os.urandom(6).hex()}"
    env = {**env, SERVER_MARKER: marker}
    try:
        try:
            with spawning() as own:
                proc = await trio.lowlevel.open_process(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log_fd,
                    stderr=log_fd,
                    env=dict(env),
                    cwd=cwd,
                    start_new_session=True,
                    preexec_fn=server_preexec(),  # the open-files limit soakspec was started with, not its lifted one
                )
                own(proc.pid)
                if reaper is not None:
                    reaper.orphans.serving.add(proc.pid)
        except FileNotFoundError as e:
            where = f" (cwd {cwd})" if cwd else ""
            raise BackendError(name, f"command not found: {what}{where}") from e
        except PermissionError as e:
            raise BackendError(name, f"cannot execute {what}: permission denied (is it executable?)") from e
        except NotADirectoryError as e:
            raise BackendError(name, f"cannot start: {e}") from e
        except OSError as e:
            raise BackendError(name, f"cannot start: {e.strerror or e}") from e
    finally:
        os.close(log_fd)
    pgid = proc.pid  # start_new_session: the child leads its own group
    if reaper is not None:
        reaper.watch(pgid)
        reaper.watch_marker(marker)
    return Server(name, proc, pgid, log_path, started_at, marker=marker)


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs. A zombie does not: a worker orphaned by its
    server's death (the OOM killer's SIGKILL) dies at SIGTERM and stays a zombie where nothing
    reaps orphans (soakspec as a container's PID 1), and `killpg(pgid, 0)` still finds it --
    `stop` then waited the whole grace for a group that was all dead."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    return _live_member(pgid)


def _live_member(pgid: int) -> bool:
    """Whether /proc shows a process of group `pgid` that is not a zombie (True when /proc
    cannot tell -- unreadable, or another PID namespace's, showing none of the group -- since
    the signal found one)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    seen = False
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after the command: state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid).encode():
            if fields[0] not in (b"Z", b"X"):
                return True
            seen = True
    return not seen  # only zombies: gone; none at all: /proc cannot tell


def _escaped_groups(pid: int, pgid: int) -> set[int]:
    """The process groups, other than `pgid`, of the processes descended from `pid`: a launcher
    that starts its server in a new session or group (`setsid server &`, Ray-style launchers)
    takes it out of the group `stop` signals. Read from /proc (`process_tree_pids`, as telemetry
    finds a server's processes); empty where there is none. Taken before the first signal: once a
    parent dies, its children are reparented and no longer found from `pid`."""
    out = set()
    try:
        tree = process_tree_pids(pid)[1:]
    except OSError:  # /proc not listed (out of file descriptors): the group, the marker and the reaper still stop it
        tree = []
    for p in tree:
        try:
            out.add(os.getpgid(p))
        except OSError:  # gone meanwhile
            continue
    return out - {pgid}


async def stop(server: Server, grace_s: float, kill_wait_s: float, reaper: Reaper | None) -> None:
    """SIGTERM the group, wait up to `grace_s`, then SIGKILL and wait up to `kill_wait_s`. Safe
    to call twice. The caller runs it in a shielded cancel scope bounded by
    `Launch.stop_bound_s`, so that it runs to the end even while the run is being cancelled.

    The groups the server's descendants moved to (`_escaped_groups`, taken before the first
    signal) are signalled only once the server's own group has gone, within the same grace:
    a launcher that stops its server itself on SIGTERM (scrapes it, drains it) does so first,
    and what it leaves running is stopped after it. Then what carries the launch's marker
    (`_stop_stragglers`), and, once no launched server of the run is serving, the orphans the
    run adopted (`Orphans.stop`, listed in `server.orphans_stopped`)."""
    if server.poll() is None:
        server.stop_signal = "SIGTERM"
    escaped = _escaped_groups(server.pid, server.pgid)
    groups = {server.pgid} | escaped
    _killpg(server.pgid, signal.SIGTERM)
    with trio.move_on_after(grace_s):
        await server.process.wait()
        # the leader is gone; give the rest of its group the same grace
        while _group_alive(server.pgid):
            await trio.sleep(0.05)
        for g in escaped:
            _killpg(g, signal.SIGTERM)
        while any(_group_alive(g) for g in escaped):
            await trio.sleep(0.05)
    if server.process.poll() is None or any(_group_alive(g) for g in groups):
        if server.process.poll() is None:
            server.stop_signal = "SIGKILL"
        for g in groups:
            _killpg(g, signal.SIGKILL)
        with trio.move_on_after(kill_wait_s):
            await server.process.wait()
    if server.poll() is not None:
        spawned_ended(server.pid)
    await _stop_stragglers(server, grace_s, kill_wait_s)
    if reaper is not None:
        reaper.forget(server.pgid)
        reaper.orphans.serving.discard(server.pid)
        if not reaper.orphans.serving:  # an orphan does not say whose it is: ended once no server serves
            server.orphans_stopped += await reaper.orphans.stop(grace_s, kill_wait_s)


async def _stop_stragglers(server: Server, grace_s: float, kill_wait_s: float) -> None:
    """What the launch left running outside its groups (a daemonized server): SIGTERM, the
    grace, SIGKILL (the abort names them: `backend.serve_backend`)."""
    left = server.stragglers()
    if not left:
        return
    for p in left:
        _kill(p, signal.SIGTERM)
    with trio.move_on_after(grace_s):
        while server.stragglers():
            await trio.sleep(0.05)
    for p in server.stragglers():
        _kill(p, signal.SIGKILL)
    with trio.move_on_after(kill_wait_s):
        while server.stragglers():
            await trio.sleep(0.05)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ReadinessProbe:
    """Polls a backend's readiness probe until it answers the expected status.

    `wait()` has no bound of its own: the caller applies the plan's `Probe.timeout_s` with
    `trio.move_on_after` and, when it passes, raises `timed_out()` (which says what the last
    attempt saw). Each attempt is bounded by `Probe.attempt_timeout_s`.

    An external server (`server` None) that refuses every connection for `refused_grace_s`
    fails at once (`BackendError`: nothing listens there), not after the full timeout; each
    retry is reported to `on_retry` meanwhile. One that accepts connections but is slow to
    answer, or answers another status (still loading), is waited for until the timeout.
    """

    def __init__(
        self, name: str, url: str, probe, server: Server | None, client: httpx.AsyncClient,
        *, refused_grace_s: float | None = None, on_retry=None, now=None, on_hint=None,
    ) -> None:  # fmt: skip
        self.name = name
        self.url = url
        self.probe = probe
        self.server = server
        self.client = client
        self.last = "no answer yet"
        self.refused_grace_s = refused_grace_s
        self.on_retry = on_retry  # (attempt number, what it saw) -> None
        self._now = now or trio.current_time
        self.attempts = 0
        self.on_hint = on_hint  # (what the probe found elsewhere) -> None, said once
        self.hint: str | None = None  # a launched server found listening on the other loopback
        self.port_owner: PortOwner | None = None  # whose socket answered, once ready (a launched server's)
        self._looked_at = -math.inf

    async def wait(self) -> None:
        p = self.probe
        refused_since: float | None = None
        while True:
            if self.server is not None:
                rc = self.server.poll()
                if rc is not None:
                    log = self.server.log_path
                    why = f"{describe_exit(rc)} before it was ready{full_disk_note(log, rc)}"
                    raise BackendError(self.name, why, log_tail(log), crash_lines(log))
            self.attempts += 1
            refused = False
            seen = ""
            try:
                with trio.move_on_after(p.attempt_timeout_s) as attempt:
                    resp = await self.client.request(p.method, self.url)
                    if resp.status_code == p.status:
                        self._alive_after_answer()
                        self._answered_by_the_server()
                        return
                    self.last = f"HTTP {resp.status_code}"
                if attempt.cancelled_caught:
                    self.last = f"no answer within {p.attempt_timeout_s:g}s"
            except httpx.ConnectError as e:
                self.last = "ConnectError"
                seen = _describe(e)
                refused = True
                if self.server is not None and self.hint is None:
                    self._look_elsewhere()
            except httpx.HTTPError as e:
                self.last = type(e).__name__
            if self.server is None and self.refused_grace_s is not None:
                t = self._now()
                if not refused:
                    refused_since = None
                elif refused_since is None:
                    refused_since = t
                elif t - refused_since >= self.refused_grace_s:
                    raise BackendError(
                        self.name,
                        f"nothing answers at {self.url}: {seen} for {self.refused_grace_s:g}s "
                        f"({self.attempts} attempts); is the server running?",
                    )
                if self.on_retry is not None:
                    self.on_retry(self.attempts, seen or self.last)
            await trio.sleep(p.interval_s)

    def _alive_after_answer(self) -> None:
        """A passing answer counts only while the launched server still runs: one that exited
        meanwhile (a server that found its port taken dies when it tries to bind, maybe after
        loading for a minute) did not give it -- another process did, and the death wins."""
        if self.server is None or (rc := self.server.poll()) is None:
            return
        log = self.server.log_path
        why = (f"{describe_exit(rc)} before it was ready{full_disk_note(log, rc)}; {self.url} was answered by "
               "another process listening on its port, which soakspec did not start")
        raise BackendError(self.name, why, log_tail(log), crash_lines(log))

    def _answered_by_the_server(self) -> None:
        """A passing answer counts only when the launched server's process tree listens on its
        port (`port_owner`): another process that bound the port after the check before
        launching, while the server loaded, answers the probe with the server alive -- and would
        be given the load. Then the backend is not ready: `BackendError` naming that process (the
        caller stops the server). Where /proc cannot tell, the answer counts and `port_owner`
        says why it was not checked (the manifest's `port_listener`): a launched `docker run -p`
        is answered through a port forward that no process of the server's tree holds, and a
        server run as another user (sudo) cannot be looked into -- refusing those would refuse
        launches that work, to catch a race that needs another process to take the port in the
        seconds the server loads."""
        if self.server is None:
            return
        where = urllib.parse.urlsplit(self.url)
        if where.hostname is None or where.port is None:
            return
        self.port_owner = owner = port_owner(self.server, where.hostname, where.port)
        if owner.owner != "other":
            return
        raise BackendError(
            self.name,
            f"{self.url} was answered by another process listening on its port (PID {owner.pid}: {owner.command}), "
            "not the launched server, which is stopped: that process took the port while the server loaded; "
            "no load was sent -- stop it, then run again",
        )

    def _look_elsewhere(self) -> None:
        """A launched server refuses at the probed loopback address: does it listen on the other
        one (`--host localhost` may bind ::1 alone)? Looked at once a second at most; a plain
        connect to the loopback, answered at once."""
        t = self._now()
        if t - self._looked_at < 1.0:
            return
        self._looked_at = t
        where = urllib.parse.urlsplit(self.url)
        other = _OTHER_LOOPBACK.get(where.hostname or "")
        if other is None or where.port is None:
            return
        try:
            with socket.create_connection((other, where.port), timeout=0.2):
                pass
        except OSError:
            return
        shown = f"[{other}]" if ":" in other else other
        self.hint = (f"{shown}:{where.port} accepts connections: the server listens on {other} only, and soakspec "
                     f"probes {where.hostname} (have it listen on {{host}}, or on every address)")
        if self.on_hint is not None:
            self.on_hint(self.hint)

    def timed_out(self) -> BackendError:
        tail = log_tail(self.server.log_path) if self.server is not None else ""
        p = self.probe
        hint = f"; {self.hint}" if self.hint is not None else ""
        return BackendError(self.name, f"not ready after {p.timeout_s:g}s ({p.method} {self.url}: {self.last}){hint}", tail)


_OTHER_LOOPBACK = {"127.0.0.1": "::1", "::1": "127.0.0.1"}
