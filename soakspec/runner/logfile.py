"""A url backend's own log file (`log_file`): what it gains during the run becomes server.log.

`ExternalLog.at_start(path)` notes the file's size when the backend starts (before readiness),
so that lines already in it -- an earlier run's traces, an old banner -- are never read. After
the backend's load, `copy_into(server_log)` copies the bytes from that offset on into the
backend's server.log artifact (bounded: at most `MAX_BYTES`), which the runtime boundary, the
log traces and the judge's re-derivation then read like a launched server's captured log (and
which `collect` caps and gzips into server.log.gz like it, `evidence.serverlog.LogCompactor`). A
file that shrank below the offset (rotated or truncated) is read from its start, and says so.

One line from before the offset is kept: the runtime banner. A long-running server printed its
version line (`Initializing a V1 LLM engine (v0.32.0)`) when it started, long before this run,
so with a runtime `log_pattern`, when nothing the run's part of the log holds matches it, the
LAST line before the offset that does -- the banner of the server process now running -- is
written first into server.log (its offset recorded as `banner.offset`). A server that started
(or restarted) during the run printed its own banner after the offset, and an older one is not
added. Traces are never taken from before the offset.

A failure to write server.log (the evidence disk full, EIO) is not the server's log being
unreadable: `copy_into` raises `LogCopyRefused` (an `EvidenceWriteError`, carrying the entry as
far as it got), and the run aborts on it as on any evidence it cannot write -- never a
`complete` run whose server.log silently lacks what the server logged.

Synchronous and small: no trio, nothing from `soakspec.lang`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from soakspec.evidence.io import EvidenceWriteError

MAX_BYTES = 1 << 30  # copied from the log at most (1 GiB); the rest is counted as not copied
CHUNK = 1 << 20
BANNER_SCAN_BYTES = 64 << 20  # how far before the offset the runtime banner is looked for


@dataclasses.dataclass(frozen=True)
class ExternalLog:
    path: str
    start_offset: int  # the file's size at the backend's start (0 when it did not exist)
    banner: bytes | None = None  # the last line before the offset matching the runtime pattern
    banner_offset: int | None = None
    banner_pattern: str | None = None

    @classmethod
    def at_start(cls, path: str, banner_pattern: str | None = None) -> ExternalLog:
        try:
            size = os.stat(path).st_size
        except OSError:
            return cls(path, 0)
        banner, where = _last_match(path, size, banner_pattern) if banner_pattern else (None, None)
        return cls(path, size, banner, where, banner_pattern)

    def copy_into(self, dest: Path) -> dict[str, Any]:
        """Copy what the file gained into `dest`; the manifest's `log_file` entry."""
        out: dict[str, Any] = {"path": self.path, "start_offset": self.start_offset, "bytes_read": 0,
                               "rotated": False, "bytes_not_copied": 0, "error": None}  # fmt: skip
        try:
            with open(self.path, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                start = self.start_offset
                if size < start:
                    out["rotated"], start = True, 0
                src.seek(start)
                out["read_from"] = start
                with _writing(dest):
                    f = open(dest, "wb")  # noqa: SIM115 - closed below, its failure said as a write's
                try:
                    left = MAX_BYTES
                    while left > 0 and (chunk := src.read(min(CHUNK, left))):
                        with _writing(dest):
                            f.write(chunk)
                        left -= len(chunk)
                        out["bytes_read"] += len(chunk)
                    with _writing(dest):
                        f.flush()
                        os.fsync(f.fileno())
                finally:
                    with _writing(dest):
                        f.close()
                out["bytes_not_copied"] = max(0, os.fstat(src.fileno()).st_size - start - out["bytes_read"])
            if self.banner is not None and not _has_match(dest, self.banner_pattern):
                with _writing(dest):
                    _prepend(dest, self.banner.rstrip(b"\n") + b"\n")
                out["banner"] = {"offset": self.banner_offset, "bytes": len(self.banner)}
        except _Refused as e:
            out["error"] = f"cannot write {dest}: {type(e.error).__name__}: {e.error}"
            raise LogCopyRefused(dest, e.error, out) from e.error
        except OSError as e:
            out["error"] = f"{type(e).__name__}: {e}"
        return out


class LogCopyRefused(EvidenceWriteError):
    """server.log could not be written (see the module docstring); `entry` is the manifest's
    `log_file` entry as far as the copy got, its `error` saying so."""

    def __init__(self, path: Path, err: OSError, entry: dict[str, Any]) -> None:
        super().__init__(path, err)
        self.entry = entry


class _Refused(Exception):
    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _writing:
    """An OSError inside is the write of `dest` failing (`_Refused`), not the source's read."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> bool:
        if isinstance(err, OSError):
            raise _Refused(err) from err
        return False


def _has_match(path: Path, pattern: str | None) -> bool:
    """Whether a line of `path` matches `pattern` (streamed, line by line)."""
    if not pattern:
        return False
    rx = re.compile(pattern.encode())
    with open(path, "rb") as f:
        return any(rx.search(line) for line in f)


def _prepend(path: Path, line: bytes) -> None:
    """Rewrite `path` with `line` first (through a temporary file, renamed over it)."""
    tmp = Path(str(path) + ".tmp")
    try:
        with open(tmp, "wb") as out, open(path, "rb") as src:
            out.write(line)
            while chunk := src.read(CHUNK):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # server.log as copied stays; no stray file in the evidence
        raise


def _last_match(path: str, size: int, pattern: str) -> tuple[bytes | None, int | None]:
    """The last line before `size` (within BANNER_SCAN_BYTES of it) that matches `pattern`."""
    try:
        rx = re.compile(pattern.encode())
    except (re.error, UnicodeEncodeError):
        return None, None
    start = max(0, size - BANNER_SCAN_BYTES)
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return None, None
    found: tuple[bytes | None, int | None] = (None, None)
    pos = start
    for line in data.splitlines(keepends=True):
        if rx.search(line):
            found = (line, pos)
        pos += len(line)
    return found


__all__ = ["ExternalLog", "MAX_BYTES"]
