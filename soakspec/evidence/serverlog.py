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
"""

from __future__ import annotations

import os
import re
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


__all__ = ["CUT_MARKER", "HEAD_BYTES", "TAIL_BYTES", "cap_server_log", "keep_lines"]
