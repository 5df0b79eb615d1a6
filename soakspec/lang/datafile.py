"""Data files a spec names (prompt datasets, replay traces): read bounded, decoded, hashed.

`check` reads them (reading is fine; it executes nothing). A file is read whole, at most
MAX_FILE_BYTES, and never when it is not a regular file (a FIFO would block `check`).
"""

from __future__ import annotations

import hashlib
import os

MAX_FILE_BYTES = 64 * 1024 * 1024  # `check` reads the whole file; a larger one is a mistake or needs splitting


class DataFileError(Exception):
    """What is wrong with a data file, and where (1-based line and column)."""

    def __init__(self, message: str, line: int = 1, column: int = 1):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


def read_text(path: str, error: type[DataFileError] = DataFileError) -> tuple[str, str]:
    """The file's UTF-8 text and the sha256 of its bytes; raises `error` (no such file, not a
    regular file, too large, unreadable, not UTF-8 -- at the line and column of the first bad byte)."""
    try:
        if not os.path.isfile(path):
            raise error("no such file" if not os.path.exists(path) else "not a regular file")
        if os.path.getsize(path) > MAX_FILE_BYTES:
            raise error(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise error(f"cannot be read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise error("is not UTF-8", line, e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1) from None
    return text, hashlib.sha256(raw).hexdigest()
