"""server.log with a size cap: the head and the tail are kept, the middle is cut, and the cut is
recorded -- but no trace line (nor runtime banner line) is ever cut.

A day-long soak of a chatty server writes gigabytes of log. When the run ends, `cap_server_log`
streams the file once and rewrites it (atomically) as

    the first HEAD_BYTES of the log (whole lines),
    every line of the cut middle that `keep(line)` wants: the trace lines the runner and the
    judge match requests with, and the lines the runtime boundary is detected from,
    one line `CUT_MARKER ...` saying how many bytes and lines were cut,
    the last TAIL_BYTES of the log (whole lines: the end is where a crash says why).

The cut is recorded in the backend's manifest entry (`server_log_cut`: the original size, the
byte range cut, lines cut, lines kept from it). A log within HEAD_BYTES + TAIL_BYTES is left as
it is. Traces are never lost to the cap, so the log is bounded by the cap plus the traces
(which are evidence). The cap is applied when the run ends, not while it runs.

Then `compress_server_log` gzips what is left into `server.log.gz` (one gzip member; a
simulator's trace line, ~475 bytes, takes ~28 bytes there) and removes `server.log`: the server
writes plain text while it runs, and a run killed before it ended leaves that `server.log`.
Every reader takes either (`layout.server_log_file`: the `.gz` wins when both exist -- it is
only renamed into place once whole; `open_log` reads plain or gzip by its magic bytes). Byte
offsets (a trace row's `offset`, the manifest's `server_log_offset`, the cut's record) are
offsets in the uncompressed log, whichever file holds it.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

HEAD_BYTES = 8 << 20
TAIL_BYTES = 8 << 20
CUT_MARKER = "[soakspec: server.log cut]"


def keep_lines(*patterns: str | None, markers: tuple[str, ...] = ()) -> Callable[[str], bool]:
    """A `keep` predicate: a line matching any regex of `patterns` or holding any of `markers`."""
    rxs = [re.compile(p) for p in patterns if p]
    marks = tuple(m for m in markers if m)
    return lambda line: any(r.search(line) for r in rxs) or any(m in line for m in marks)


def cap_server_log(path: os.PathLike | str, keep: Callable[[str], bool], *, head: int = HEAD_BYTES,
                   tail: int = TAIL_BYTES) -> dict[str, Any] | None:
    """Cap `path` (see the module docstring); returns the cut's record, or None when nothing was cut."""
    path = Path(path)
    size = path.stat().st_size
    if size <= head + tail:
        return None
    tail_from = size - tail
    tmp = path.with_name(f".{path.name}.cap-{os.getpid()}-{secrets.token_hex(4)}")
    pos = 0
    cut_from = cut_to = None
    cut_bytes = cut_lines = kept = 0
    with open(path, "rb") as src, open(tmp, "wb") as out:
        for raw in src:
            start, pos = pos, pos + len(raw)
            if pos <= head or start >= tail_from and cut_from is not None:
                if start >= tail_from and cut_from is not None and cut_to is None:
                    cut_to = start
                    out.write(_marker(cut_bytes, cut_lines, kept, cut_from, start))
                out.write(raw)
                continue
            if start >= tail_from and cut_from is None:  # no line ended inside the head: nothing to cut
                out.write(raw)
                continue
            if cut_from is None:
                cut_from = start
            if keep(raw.decode("utf-8", "replace")):
                out.write(raw)
                kept += 1
            else:
                cut_bytes += len(raw)
                cut_lines += 1
        if cut_from is not None and cut_to is None:  # the middle ran to the end (a last line without newline)
            cut_to = pos
            out.write(_marker(cut_bytes, cut_lines, kept, cut_from, pos))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return {"bytes_before": size, "head_bytes": head, "tail_bytes": tail, "cut_from": cut_from, "cut_to": cut_to,
            "bytes_cut": cut_bytes, "lines_cut": cut_lines, "lines_kept_from_cut": kept}  # fmt: skip


def _marker(n: int, lines: int, kept: int, a: int, b: int) -> bytes:
    return (f"{CUT_MARKER} {n} bytes in {lines} lines cut from bytes {a}-{b} of the original; "
            f"{kept} trace or runtime lines from there are kept above\n").encode()


GZIP_MAGIC = b"\x1f\x8b"
LEVEL = 6  # measured (benchmarks/README.md): level 9 saves ~3% of the bytes for twice the time


def is_gzip(path: os.PathLike | str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_log(path: os.PathLike | str):
    """`path` opened for reading bytes, decompressed when it is gzip (by its magic bytes, not its
    name): a binary file object iterating the log's lines."""
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")  # noqa: SIM115 - the caller closes


def read_log(path: os.PathLike | str) -> bytes:
    """The whole (uncompressed) log: for tests and small logs only -- readers of a soak's log stream it."""
    with open_log(path) as f:
        return f.read()


def compress_server_log(path: os.PathLike | str) -> Path:
    """Gzip `path` (server.log) into `path.gz` beside it and remove `path`: written to a
    temporary name, fsynced, renamed into place, and only then is the plain log removed (a
    kill in between leaves both, whole; the `.gz` wins). Returns the `.gz` path."""
    path = Path(path)
    dest = path.with_name(path.name + ".gz")
    tmp = path.with_name(f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(path, "rb") as src, open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", compresslevel=LEVEL, fileobj=raw, mtime=0) as gz:
                shutil.copyfileobj(src, gz, 1 << 20)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    path.unlink()
    return dest


__all__ = ["CUT_MARKER", "HEAD_BYTES", "TAIL_BYTES", "cap_server_log", "compress_server_log", "is_gzip", "keep_lines",
           "open_log", "read_log"]
