"""How far a long read of evidence has got, on stderr: `gate`, `report`, `verify` and `combine`
read a day-long soak's evidence for minutes (about four at 10^7 requests on two cores) and
said nothing meanwhile.

The commands that read evidence run inside `reporting(stderr, command)` (`cli.main`); the
readers (`io.iter_raw_blocks`, `traces.scan_log_rows`) ask `ticker(path, fh)` for a function
to call after each read (it reads the position from the file) and get None when nobody
reports (a library caller, a test): then they pay nothing but that one check a file. What is shown, never on stdout (reports go
there):

  on a TTY   a transient rich progress bar for a file whose read has taken more than a
             second (file, bytes, time left), gone when the read ends;
  otherwise  a plain line `soakspec gate: reading backends/x/requests.jsonl.gz: 45% (391 of
             868 MB)` when a read has gone on for `every_s` (15 s) since it began or since its
             last line -- so a short read, every test's, prints nothing.

Positions are bytes of the file as stored (compressed for .gz), against its size on disk.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TextIO

EVERY_S = 15.0  # a plain line at most this often, and not before a read has lasted this long
BAR_AFTER_S = 1.0  # a TTY's bar appears once a read has lasted this long


class _Reporter:
    def __init__(self, stream: TextIO, command: str, every_s: float, clock: Callable[[], float], tty: bool | None) -> None:
        self.stream, self.command, self.every_s, self.clock = stream, command, every_s, clock
        self.tty = bool(getattr(stream, "isatty", lambda: False)()) if tty is None else tty
        self._bar: Any = None
        self._task: Any = None

    def file(self, path: str | os.PathLike, size: int) -> Callable[[int], None]:
        """The function to call with the position reached in `path` (of `size` bytes) after each read."""
        name = "/".join(os.fspath(path).split(os.sep)[-3:])
        started = last = self.clock()
        shown = False

        def at(pos: int) -> None:
            nonlocal last, shown
            now = self.clock()
            if self.tty:
                if not shown and now - started >= BAR_AFTER_S:
                    shown = self._bar_start(f"reading {name}", size)
                if shown:
                    self._bar.update(self._task, completed=min(pos, size))
                    if pos >= size:
                        self._bar_stop()
                        shown = False
            elif now - last >= self.every_s:
                last = now
                pct = 100.0 * pos / size if size > 0 else 100.0
                print(f"soakspec {self.command}: reading {name}: {pct:.0f}% ({pos / 1e6:,.0f} of {size / 1e6:,.0f} MB)",
                      file=self.stream, flush=True)

        return at

    def _bar_start(self, text: str, size: int) -> bool:
        try:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar_stop()
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                                 console=Console(file=self.stream), transient=True)
            self._task = self._bar.add_task(text, total=max(size, 1))
            self._bar.start()
            return True
        except Exception:  # noqa: BLE001 - a display that cannot start is no reason to stop reading
            self._bar = None
            return False

    def _bar_stop(self) -> None:
        if self._bar is not None:
            with contextlib.suppress(Exception):
                self._bar.stop()
            self._bar = None

    def close(self) -> None:
        self._bar_stop()


_REPORTER: ContextVar[_Reporter | None] = ContextVar("soakspec_read_progress", default=None)


@contextlib.contextmanager
def reporting(stream: TextIO | None = None, command: str = "", *, every_s: float = EVERY_S,
              clock: Callable[[], float] = time.monotonic, tty: bool | None = None) -> Iterator[None]:
    """Report long reads of evidence on `stream` (stderr) while inside (see the module doc)."""
    reporter = _Reporter(stream if stream is not None else sys.stderr, command, every_s, clock, tty)
    token = _REPORTER.set(reporter)
    try:
        yield
    finally:
        reporter.close()
        _REPORTER.reset(token)


def ticker(path: str | os.PathLike, fh: Any) -> Callable[[], None] | None:
    """The function to call after each read of `fh` (the open file `path`, as stored: for a
    gzip file, the compressed one), or None when nothing reports."""
    reporter = _REPORTER.get()
    if reporter is None:
        return None
    try:
        at = reporter.file(path, os.fstat(fh.fileno()).st_size)
    except (OSError, AttributeError, ValueError):
        return None
    return lambda: at(fh.tell())
