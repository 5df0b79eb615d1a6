"""Data files a spec names (prompt datasets, replay traces): read bounded, decoded, hashed.

`check` reads them (reading is fine; it executes nothing). A file is read whole, at most
MAX_FILE_BYTES, and never when it is not a regular file (a FIFO would block `check`).
"""

from __future__ import annotations

import hashlib
import os

MAX_FILE_BYTES = 64 * 1024 * 1024  # `check` reads the whole file; a larger one is a mistake or needs splitting


# What Python's json decoder raises, besides JSONDecodeError, for a text whose syntax is fine: a
# RecursionError when arrays or objects nest deeper than the interpreter's recursion limit
# (`[[[[...`, 100,000 deep, is a few hundred KB), a ValueError for an integer of more digits
# than `sys.get_int_max_str_digits()`. Each is a malformed data file, never a bug in `check`.
BEYOND_DECODER = (RecursionError, ValueError)


def beyond_decoder(e: Exception) -> str:
    """Why the decoder refused a JSON value (one of `BEYOND_DECODER`), for a diagnostic."""
    if isinstance(e, RecursionError):
        return "nests arrays or objects too deeply for the JSON decoder"
    return f"holds a number beyond the JSON decoder's limits ({str(e)[:120]})"


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
    except UnicodeDecodeError as e:  # at the character an editor shows: a BOM and multi-byte characters are one column or none
        line_start = raw.rfind(b"\n", 0, e.start) + 1
        before = raw[line_start : e.start].decode("utf-8", "replace").removeprefix("\ufeff" if line_start == 0 else "")
        raise error(f"is not UTF-8 (byte 0x{raw[e.start]:02x})", raw.count(b"\n", 0, e.start) + 1, len(before) + 1) from None
    return text, hashlib.sha256(raw).hexdigest()
