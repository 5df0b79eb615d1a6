"""A url backend's own log file (`log_file`): what it gains during the run becomes server.log.

`ExternalLog.at_start(path)` notes the file's size when the backend starts (before readiness),
so that lines already in it -- an earlier run's traces, an old banner -- are never read. After
the backend's load, `copy_into(server_log)` copies the bytes from that offset on into the
backend's server.log artifact (bounded: at most `MAX_BYTES`), which the runtime boundary, the
log traces and the judge's re-derivation then read like a launched server's captured log. A
file that shrank below the offset (rotated or truncated) is read from its start, and says so.

Synchronous and small: no trio, nothing from `soakspec.lang`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

MAX_BYTES = 1 << 30  # copied from the log at most (1 GiB); the rest is counted as not copied
CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class ExternalLog:
    path: str
    start_offset: int  # the file's size at the backend's start (0 when it did not exist)

    @classmethod
    def at_start(cls, path: str) -> ExternalLog:
        try:
            return cls(path, os.stat(path).st_size)
        except OSError:
            return cls(path, 0)

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
                with open(dest, "wb") as f:
                    left = MAX_BYTES
                    while left > 0 and (chunk := src.read(min(CHUNK, left))):
                        f.write(chunk)
                        left -= len(chunk)
                        out["bytes_read"] += len(chunk)
                    f.flush()
                    os.fsync(f.fileno())
                out["bytes_not_copied"] = max(0, os.fstat(src.fileno()).st_size - start - out["bytes_read"])
        except OSError as e:
            out["error"] = f"{type(e).__name__}: {e}"
        return out


__all__ = ["ExternalLog", "MAX_BYTES"]
