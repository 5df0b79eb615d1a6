"""The load generator's own resources: its open-file limit, and requests it could not send.

A closed-loop level at concurrency C holds C sockets at once, beside the evidence files, the
server's pipes and Python's own. When the process runs out of file descriptors (EMFILE: its
`ulimit -n`; ENFILE: the system's), of kernel buffers (ENOBUFS, ENOMEM) or of local ports
(EADDRNOTAVAIL), a connect fails *here*, before a byte reached the server. Such a request is
the client's failure, never the server's:

- its record is `disconnected` with no `start` (the record's "never sent") and an error that
  starts with NOT_SENT and says which limit was hit and how to raise it;
- the backend's liveness does not count it as a refused connect (it says nothing about the
  port), the abort rules do not see it, and the judge's `client_healthy` makes the run
  INCONCLUSIVE naming it (judge/validity.py), so that no rule FAILs the server for it.

`raise_open_files_limit()` lifts the soft RLIMIT_NOFILE to the hard limit when `soakspec
run` starts (what k6 and locust users expect); a low hard limit is still handled as above.
The lift is the load generator's own: a server soakspec launches starts with the soft limit
soakspec itself was started with (`server_preexec`, run in the child before its exec), as it
would run without soakspec, and the manifest records that limit (`servers_soft`).
"""

from __future__ import annotations

import errno

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None  # type: ignore[assignment]

from soakspec.runner.protocol import exception_chain

NOT_SENT = "not sent: "  # a record's error when the load generator could not send the request

# errno -> what ran out (the load generator's, not the server's)
LOCAL_EXHAUSTION: dict[int, str] = {
    errno.EMFILE: "file descriptors",
    errno.ENFILE: "file descriptors (the system's table)",
    errno.ENOBUFS: "kernel buffer space",
    errno.ENOMEM: "kernel memory",
    errno.EADDRNOTAVAIL: "local ports",
}


def open_files_limit() -> tuple[int, int] | None:
    """(soft, hard) RLIMIT_NOFILE of this process (None: not known here); RLIM_INFINITY is -1."""
    if resource is None:
        return None
    try:
        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):  # pragma: no cover
        return None


_ORIGINAL: list[tuple[int, int]] = []  # the (soft, hard) limit before this process lifted it


def raise_open_files_limit() -> dict | None:
    """Lift the soft RLIMIT_NOFILE to the hard one. Returns {"soft", "hard", "raised_from",
    "servers_soft"} (raised_from: the soft limit before, None when it was not changed;
    servers_soft: the soft limit a launched server starts with), None when unknown."""
    lim = open_files_limit()
    if lim is None:
        return None
    soft, hard = lim
    raised_from = None
    if soft != hard and resource is not None:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            raised_from, soft = soft, hard
            _ORIGINAL[:] = [lim]
        except (OSError, ValueError):  # e.g. a hard limit above what the kernel allows (macOS)
            pass
    return {"soft": soft, "hard": hard, "raised_from": raised_from, "servers_soft": soft if raised_from is None else raised_from}


def server_preexec():
    """A launched server's `preexec_fn` (None when nothing was lifted): it puts back, in the
    child before its exec, the soft RLIMIT_NOFILE this process had before it lifted its own, so
    the server runs with the limit it would have without soakspec (a server that needs more,
    vLLM among them, lifts its own)."""
    if not _ORIGINAL or resource is None:
        return None
    limits = _ORIGINAL[0]

    def restore() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)

    return restore


def local_errno(exc: BaseException) -> int | None:
    """The errno of a local-resource exhaustion in `exc`'s chain (causes, contexts, exception
    groups) when every error in it with an errno is one, else None: a connect that tried two
    addresses (`localhost`: ::1 then 127.0.0.1) and met EADDRNOTAVAIL on one and ECONNREFUSED on
    the other reached a server that is not there -- the server's failure, not the client's."""
    codes = {e.errno for e in exception_chain(exc) if isinstance(e, OSError) and e.errno is not None}
    local = [c for c in codes if c in LOCAL_EXHAUSTION]
    return min(local) if local and len(local) == len(codes) else None


def exhaustion_text(code: int) -> str:
    """What ran out and what to do, for a record's error and the run's reason."""
    name = errno.errorcode.get(code, str(code)).lower()
    what = LOCAL_EXHAUSTION.get(code, "a local resource")
    text = f"the load generator ran out of {what} ({name})"
    if code in (errno.EMFILE, errno.ENFILE):
        lim = open_files_limit()
        if lim is not None:
            soft, hard = ("unlimited" if v == -1 else str(v) for v in lim)
            text += f"; its open-files limit is {soft} (hard {hard})"
        text += ": raise `ulimit -n` (and the hard limit) or lower the concurrency"
    elif code == errno.EADDRNOTAVAIL:
        text += ": widen net.ipv4.ip_local_port_range or lower the concurrency"
    return text


def not_sent_error(exc: BaseException) -> str | None:
    """The record's error for a request whose connect failed with `exc`, when that failure is
    the load generator's own (see the module docstring); None when it is not."""
    code = local_errno(exc)
    return None if code is None else NOT_SENT + exhaustion_text(code)


__all__ = ["LOCAL_EXHAUSTION", "NOT_SENT", "exhaustion_text", "local_errno", "not_sent_error", "open_files_limit",
           "raise_open_files_limit", "server_preexec"]
