"""server.log with a size cap: the head and the tail are kept, the middle is cut, and the cut is
recorded -- but no trace line (nor runtime banner line) is ever cut -- and bounded on disk while
the server writes it.

A day-long soak of a chatty server writes gigabytes of log (a simulator's trace line is ~475
bytes a request). The capped log is

    the first HEAD_BYTES of the log (whole lines),
    every line of the cut middle that `keep(line)` wants: the trace lines the runner and the
    judge match requests with, and the lines the runtime boundary is detected from,
    one line `CUT_MARKER ...` saying how many bytes and lines were cut,
    the last TAIL_BYTES of the log (whole lines: the end is where a crash says why),

kept compressed as `server.log.gz` (gzip members; a simulator's trace line takes ~28 bytes
there). The cut is recorded in the backend's manifest entry (`server_log_cut`: the original
size, the byte range cut, lines cut, lines kept from it). A log within HEAD_BYTES + TAIL_BYTES
is not cut. Traces are never lost to the cap, so the log is bounded by the cap plus the traces
(which are evidence). A line longer than MAX_LINE is taken in MAX_LINE pieces, each a line to
the cap (`_masked_pieces`): a server that prints no newline for a day is capped in bounded memory
and its tail kept (whole, such a line was read at once -- 1.2 GB of RSS for a 300 MB line -- and
cut with the tail it ended).

The server writes server.log itself (the kernel appends; nothing of ours sits between the
server and its log, so a busy runner can never block a server's logging). `LogCompactor`
keeps that file bounded while the run goes: at each bucket's end (`step`, on a worker thread)
the lines that are already sure to be in the middle or the head -- those that start more than
TAIL_BYTES before the log's end -- go through the cap's rule into a gzip member appended to
`server.log.moved.gz` (fsynced), `server.log.moved.json` records how far server.log was moved,
and that range of server.log is punched out (`fallocate(PUNCH_HOLE)`: the file keeps its size
and the server its offset, the disk blocks are freed). On disk server.log is then about
TAIL_BYTES plus one bucket's lines, wherever the soak is. When the run ends (`finish`) the rest
goes through the same rule, now knowing where the tail starts, and the moved file becomes
`server.log.gz`: byte for byte (uncompressed) what capping the whole log at the end gives
(tests/test_serverlog.py holds the two equal). A filesystem that cannot punch holes keeps
server.log whole while the run goes (recorded: `server_log_moved.stopped`); the end is the same.

Every line goes through `mask` (the run's secrets overwritten by as many `*` bytes:
`redact.Redactor.log_mask`) before the cap's rule, so server.log.gz holds none of them and
every byte offset into the log is what it would be without the mask.

A run killed before it ended leaves server.log (its moved range a hole) and, once a step has
run, server.log.moved.gz and its state: `open_log(server.log)` reads the moved part and then
server.log from where the move stopped (`_MovedLog`), so a killed run's log reads whole (head,
the kept middle so far, then the rest as the server wrote it). Every reader takes either log
(`layout.server_log_file`: the `.gz` wins when both exist -- it is only renamed into place once
whole; `open_log` reads plain, gzip, or moved-then-plain). A run still going is read the same
way (`gate --partial` re-matches its traces): its reader holds a shared lock on server.log
that a step does not wait for but skips, so nothing is punched out under a reader. Byte
offsets (a trace row's `offset`, the manifest's `server_log_offset`, the cut's record) are
offsets in the log as read, whichever file holds it.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import errno
import fcntl
import functools
import gzip
import io
import json
import os
import re
import secrets
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from soakspec.evidence.io import EvidenceError, EvidenceUnreadable, EvidenceWriteError, fsync_dir, loads, write_json_atomic
from soakspec.evidence.layout import SERVER_LOG, SERVER_LOG_MOVED, SERVER_LOG_MOVED_STATE, plain_file

HEAD_BYTES = 8 << 20
TAIL_BYTES = 8 << 20
STEP_BYTES = 8 << 20  # a step moves nothing until this much more of the log is sure to be head or middle
STEP_MAX_BYTES = 256 << 20  # read by one step at most (the next one goes on)
# a line longer than this is read in pieces of this size, each a line to the cap: a server that
# writes no newline (a `\r` progress bar, a binary dump) is capped in bounded memory, its tail kept
MAX_LINE = 1 << 20
# a piece is masked with this much of the pieces beside it, so a secret across a piece's edge is
# masked too (a secret longer than this, across an edge, is not)
MASK_OVERLAP = 64 << 10
CUT_MARKER = "[soakspec: server.log cut]"
MOVED_GZ = SERVER_LOG_MOVED  # the log moved out of server.log while the run went (gzip members)
MOVED_STATE = SERVER_LOG_MOVED_STATE  # how far: {"raw_offset", "moved_bytes", "cut"}, written after each member


def keep_lines(*patterns: str | None, markers: tuple[str, ...] = ()) -> Callable[[str], bool]:
    """A `keep` predicate: a line matching any regex of `patterns` or holding any of `markers`."""
    rxs = [re.compile(p) for p in patterns if p]
    marks = tuple(m for m in markers if m)
    return lambda line: any(r.search(line) for r in rxs) or any(m in line for m in marks)


class _Cap:
    """The cap's rule over the log's lines in order: `line(raw, tail_from)` is what of the
    line goes out (the line; the cut's marker and the line, for the tail's first; or nothing:
    cut). `tail_from` is where the tail starts, `math.inf` while that is not known (a line
    taken then starts before it, whatever the log's final size)."""

    def __init__(self, keep: Callable[[str], bool], head: int, tail: int) -> None:
        self.keep, self.head, self.tail = keep, head, tail
        self.pos = 0  # bytes of the log taken
        self.cut_from: int | None = None
        self.cut_to: int | None = None
        self.cut_bytes = self.cut_lines = self.kept = 0

    def line(self, raw: bytes, tail_from: float) -> bytes:
        start = self.pos
        self.pos += len(raw)
        if self.pos <= self.head:
            return raw
        if start >= tail_from:
            if self.cut_from is None:  # no line ended inside the head: nothing to cut
                return raw
            if self.cut_to is None:
                self.cut_to = start
                return self._marker(start) + raw
            return raw
        if self.cut_from is None:
            self.cut_from = start
        if self.keep(raw.decode("utf-8", "replace")):
            self.kept += 1
            return raw
        self.cut_bytes += len(raw)
        self.cut_lines += 1
        return b""

    def end(self) -> bytes:
        """The marker, when the middle ran to the log's end (a last line without a newline)."""
        if self.cut_from is not None and self.cut_to is None:
            self.cut_to = self.pos
            return self._marker(self.pos)
        return b""

    def _marker(self, to: int) -> bytes:
        return (f"{CUT_MARKER} {self.cut_bytes} bytes in {self.cut_lines} lines cut from bytes {self.cut_from}-{to} of "
                f"the original; {self.kept} trace or runtime lines from there are kept above\n").encode()

    def record(self, size: int) -> dict[str, Any]:
        return {"bytes_before": size, "head_bytes": self.head, "tail_bytes": self.tail, "cut_from": self.cut_from,
                "cut_to": self.cut_to, "bytes_cut": self.cut_bytes, "lines_cut": self.cut_lines,
                "lines_kept_from_cut": self.kept}  # fmt: skip


GZIP_MAGIC = b"\x1f\x8b"
LEVEL = 6  # measured (benchmarks/README.md): level 9 saves ~3% of the bytes for twice the time


def _append_member(path: Path, chunks: Iterator[bytes]) -> int:
    """`chunks` as one gzip member appended to `path` (created if need be), fsynced; returns the
    file's size after it."""
    with open(path, "ab") as raw:
        with gzip.GzipFile(filename="", mode="wb", compresslevel=LEVEL, fileobj=raw, mtime=0) as gz:
            for c in chunks:
                gz.write(c)
        raw.flush()
        os.fsync(raw.fileno())
        return raw.tell()


def _batched(lines: Iterator[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    """`lines` joined into pieces of about `size` bytes (one gzip write each)."""
    got: list[bytes] = []
    n = 0
    for b in lines:
        if b:
            got.append(b)
            n += len(b)
            if n >= size:
                yield b"".join(got)
                got, n = [], 0
    if got:
        yield b"".join(got)


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc: Any = None


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the disk blocks of bytes [offset, offset + length) of the open file `fd` (they read
    as zeros; the size stays). OSError(EOPNOTSUPP) where the platform or filesystem cannot."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        lib = ctypes.CDLL(name, use_errno=True) if name else None
        if lib is None or not hasattr(lib, "fallocate"):
            raise OSError(errno.EOPNOTSUPP, "no fallocate(2) here")
        lib.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
        _libc = lib
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _piece_done(raw: bytes) -> bool:
    """Whether a piece read by `readline(MAX_LINE)` will not change: a whole line, or a full piece."""
    return raw.endswith(b"\n") or len(raw) >= MAX_LINE


def _masked_pieces(read: Callable[[], bytes], mask: Callable[[bytes], bytes], final: bool,
                   prev: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
    """The log's pieces from `read` (`readline(MAX_LINE)`): lines, and the MAX_LINE pieces of a
    longer one, each masked (the mask keeps lengths: a piece's length is the raw one's); a piece
    of a long line is masked with MASK_OVERLAP bytes of the pieces on either side (a secret
    across the edge is masked on both sides). Not `final` (the server may still write): stops
    before a piece that may still change, or whose next piece's first bytes may (so a step masks
    as the end does). Whole lines go through as fast as a plain iteration, or nearly (~20 %).
    Yields each masked piece with the raw bytes the piece after it is masked with (its last
    MASK_OVERLAP bytes while a line goes on, else none): `prev`, where a read starts inside a
    line (a step after one that stopped there; the bytes before were punched out)."""
    cur = read()
    while cur:
        if not prev and cur.endswith(b"\n"):  # a whole line (the common case, kept fast)
            yield mask(cur), b""
            cur = read()
            continue
        nxt = None
        head = b""
        if not cur.endswith(b"\n"):
            if len(cur) < MAX_LINE:  # the log's last bytes, no newline yet
                if not final:
                    return
            else:
                nxt = read()
                if not final and not (len(nxt) >= MASK_OVERLAP or _piece_done(nxt)):
                    return
                head = nxt[:MASK_OVERLAP]
        after = b"" if cur.endswith(b"\n") else cur[-MASK_OVERLAP:]
        if prev or head:
            yield mask(prev + cur + head)[len(prev):len(prev) + len(cur)], after
        else:
            yield mask(cur), after
        prev = after
        cur = nxt if nxt is not None else read()


class LogCompactor:
    """server.log (`path`) kept bounded on disk while the server appends to it, and capped and
    compressed into server.log.gz when the run ends (see the module docstring). `step()` runs
    on a worker thread while the server writes; `finish()` once it no longer does. `punch` is
    the hole puncher (a seam for tests: a filesystem that cannot)."""

    def __init__(self, path: os.PathLike | str, keep: Callable[[str], bool], *, head: int | None = None,
                 tail: int | None = None, step: int | None = None,
                 punch: Callable[[int, int, int], None] = punch_hole,
                 mask: Callable[[bytes], bytes] | None = None) -> None:  # fmt: skip
        self.path = Path(path)
        # each line as it goes into server.log.gz: the run's secrets overwritten, byte for byte
        # (`Redactor.log_mask`; None: nothing to mask)
        self._mask = mask if mask is not None else (lambda raw: raw)
        self.moved = self.path.with_name(MOVED_GZ)
        self.state = self.path.with_name(MOVED_STATE)
        self._cap = _Cap(keep, HEAD_BYTES if head is None else head, TAIL_BYTES if tail is None else tail)
        self._step = STEP_BYTES if step is None else step
        self._punch = punch
        self.raw_offset = 0  # bytes of server.log moved (and punched out)
        self._carry = b""  # the raw end of the last piece moved when its line goes on (`_masked_pieces`' prev)
        self.moved_bytes = 0  # size of server.log.moved.gz
        self.steps = 0
        self.stopped: str | None = None  # why the moving stopped (the log then stays whole until the end)

    def step(self, max_bytes: int = STEP_MAX_BYTES) -> int:
        """Move the lines sure to be head or middle out of server.log (see the class doc);
        returns the bytes moved. Never raises an OSError: one (no hole punching here, a full
        disk) stops the moving, recorded in `stopped`; what was moved stays readable."""
        if self.stopped is not None:
            return 0
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return 0
        bound = size - self._cap.tail  # a line starting before this is in the head or the middle
        if bound <= self._cap.head or bound - self.raw_offset < self._step:
            return 0
        try:
            return self._move(bound, max_bytes)
        except (OSError, EvidenceError) as e:
            self.stopped = f"{type(e).__name__}: {e}"
            return 0

    def _move(self, bound: int, max_bytes: int) -> int:
        start = self.raw_offset
        end = start
        with open(self.path, "rb") as src:
            try:  # a reader (`open_log`: `gate --partial` of this run) holds it: the next bucket's step moves
                fcntl.flock(src.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            src.seek(start)
            pieces = _masked_pieces(functools.partial(src.readline, MAX_LINE), self._mask, final=False, prev=self._carry)
            first = next(pieces, None)
            if first is None:  # a line still being written
                return 0
            carry = self._carry

            def lines() -> Iterator[bytes]:
                nonlocal end, carry
                item = first
                while item is not None and end < bound and end - start < max_bytes:
                    piece, carry = item
                    end += len(piece)
                    yield self._cap.line(piece, float("inf"))
                    item = next(pieces, None)

            saved = copy.copy(self._cap)
            try:
                size = _append_member(self.moved, _batched(lines()))
            except BaseException:  # nothing moved: the cap's count and the moved file as they were
                self._cap = saved
                self._cut_moved()
                raise
            self.moved_bytes, self.raw_offset, self._carry = size, end, carry
            self.steps += 1
            write_json_atomic(self.state, {"raw_offset": end, "moved_bytes": size, "cut": self._cap.record(end)})
            fd = os.open(self.path, os.O_WRONLY)
            try:
                self._punch(fd, start, end - start)
            finally:
                os.close(fd)
        return end - start

    def _cut_moved(self) -> None:
        """server.log.moved.gz back to what the state counts (a member cut short by a failure)."""
        try:
            if self.moved_bytes:
                os.truncate(self.moved, self.moved_bytes)
            else:
                self.moved.unlink(missing_ok=True)
        except OSError:
            pass  # readers take only the counted bytes anyway (`_Prefix`)

    def finish(self) -> dict[str, Any] | None:
        """The server no longer writes: cap the rest, compress, and leave server.log.gz alone
        (server.log and the moved state removed). Returns the cut's record (None: the log
        was within HEAD_BYTES + TAIL_BYTES, nothing cut)."""
        size = os.stat(self.path).st_size
        whole = self.raw_offset == 0 and size <= self._cap.head + self._cap.tail
        tail_from = float("inf") if whole else size - self._cap.tail
        dest = self.path.with_name(self.path.name + ".gz")
        # what was moved stays where a killed run's reader finds it until server.log.gz is whole:
        # the rest is appended to the moved file itself (beyond the bytes its state counts, which
        # is all a reader takes), then that file is renamed; renamed away first, a SIGKILL while
        # the rest was compressed left the log's head under a temporary name no reader knows
        # (server.log read from its start: the punched-out head as NUL bytes)
        tmp = self.moved if self.raw_offset else \
            self.path.with_name(f".{self.path.name}.gz.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            if self.raw_offset:
                os.truncate(tmp, self.moved_bytes)  # a member a failed step cut short is not kept
            with open(self.path, "rb") as src:
                src.seek(self.raw_offset)

                def rest() -> Iterator[bytes]:
                    for masked, _ in _masked_pieces(functools.partial(src.readline, MAX_LINE), self._mask, final=True,
                                                    prev=self._carry):
                        yield masked if whole else self._cap.line(masked, tail_from)
                    yield b"" if whole else self._cap.end()

                _append_member(tmp, _batched(rest()))
            os.replace(tmp, dest)
            fsync_dir(self.path.parent)
        except BaseException as e:
            if self.raw_offset:
                self._cut_moved()  # readable as a killed run's: the state's bytes, as they were
            else:
                tmp.unlink(missing_ok=True)
            if isinstance(e, OSError):  # a full disk, EIO: said with the file it was making
                raise EvidenceWriteError(dest, e) from e
            raise
        self.path.unlink()
        self.state.unlink(missing_ok=True)
        return None if whole else self._cap.record(size)

    def moved_record(self) -> dict[str, Any] | None:
        """What the run's steps did, for the manifest (None: none moved anything, none failed)."""
        if not self.steps and self.stopped is None:
            return None
        return {"steps": self.steps, "bytes_moved": self.raw_offset, "stopped": self.stopped}


def is_gzip(path: os.PathLike | str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


_MAX_STATE_BYTES = 64 * 1024  # the state is a few dozen bytes


def _moved_state(path: Path) -> dict[str, Any] | None:
    """The moved state beside server.log `path` (a run going, or killed; None: nothing moved).
    Only plain files are read (`layout.plain_file`: a FIFO would block, a symlink leads out of
    the evidence), a bounded number of bytes, decoded within `io.loads`' limits."""
    state_path, moved = path.with_name(MOVED_STATE), path.with_name(MOVED_GZ)
    if not plain_file(state_path) or not plain_file(moved):
        return None
    try:
        with open(state_path, "rb") as f:
            state = loads(f.read(_MAX_STATE_BYTES + 1).decode("utf-8"))
        ok = isinstance(state, dict) and all(type(state.get(k)) is int and state[k] >= 0 for k in ("raw_offset", "moved_bytes"))
    except (OSError, ValueError):
        return None
    return state if ok else None


def open_log(path: os.PathLike | str):
    """`path` opened for reading bytes: decompressed when it is gzip (by its magic bytes, not
    its name), read moved-then-plain when a step moved part of it out: a binary file object
    iterating the log's lines (`opened_as_stream` says whether positions in it are found by
    reading). A plain server.log is read under a shared lock (`flock`), which a step of a run
    still going does not wait for but skips (`LogCompactor._move`): what a reader of a live
    run's log reads is never punched out under it, and the state it reads matches the file.
    Another file (a `jsonl` trace source's) is opened as it is: it is not ours to lock."""
    p = Path(path)
    if is_gzip(p):
        return gzip.open(p, "rb")
    f = open(p, "rb")  # noqa: SIM115 - the caller closes
    if p.name != SERVER_LOG:
        return f
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
        state = _moved_state(p)
    except BaseException:
        f.close()
        raise
    if state is None:
        return f
    return io.BufferedReader(_MovedLog(f, state["moved_bytes"], state["raw_offset"]), 1 << 20)


@contextlib.contextmanager
def read_errors(path: os.PathLike | str) -> Iterator[None]:
    """Around reading a log `open_log` opened: corrupt or cut-short gzip data (server.log.gz, or
    a killed run's moved part) raises `EvidenceUnreadable` naming the file -- not an OSError a
    caller would take for "no log here", nor a crash."""
    try:
        yield
    except (gzip.BadGzipFile, zlib.error, EOFError) as e:
        raise EvidenceUnreadable(f"{path}: the log does not decompress ({type(e).__name__}: {e})") from None


def opened_as_stream(fh: Any) -> bool:
    """Whether `fh` (from `open_log`) is read through -- gzip, or moved then plain -- so that its
    length, and a position in it, are found by reading rather than from the file's size."""
    return not isinstance(getattr(fh, "raw", None), io.FileIO)


class _Prefix(io.RawIOBase):
    """The first `n` bytes of the file at `path` (a moved part may hold a member its state does
    not count yet: a kill between the two writes)."""

    def __init__(self, path: Path, n: int) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed with this
        self._left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._left <= 0:
            return 0
        view = memoryview(b)[: self._left]
        n = self._f.readinto(view)
        self._left -= n
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


class _MovedLog(io.RawIOBase):
    """server.log as it reads once a step moved part of it out: server.log.moved.gz (its first
    `moved_bytes`), then server.log (`plain`, open and locked) from `raw_offset` (before it: the
    punched-out range). Seekable: forward by reading, backward by reading again from the start."""

    def __init__(self, plain: Any, moved_bytes: int, raw_offset: int) -> None:
        self._plain, self._moved_bytes, self._raw_offset = plain, moved_bytes, raw_offset
        self._moved_path = Path(plain.name).with_name(MOVED_GZ)
        self._gz: Any = None
        self._pos = 0
        self._open()

    def _open(self) -> None:
        if self._gz is not None:
            self._gz.close()
        self._gz = gzip.GzipFile(fileobj=io.BufferedReader(_Prefix(self._moved_path, self._moved_bytes)))
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._gz is not None:
            n = self._gz.readinto(b)
            if n:
                self._pos += n
                return n
            self._gz.close()
            self._gz = None
            self._plain.seek(self._raw_offset)
        n = self._plain.readinto(b)
        self._pos += n
        return n

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0:
            raise io.UnsupportedOperation("only absolute positions")
        if offset < self._pos:
            self._open()
        buf = bytearray(1 << 20)
        while self._pos < offset:
            if not self.readinto(memoryview(buf)[: min(len(buf), offset - self._pos)]):
                break
        return self._pos

    def close(self) -> None:
        if self._gz is not None:
            self._gz.close()
            self._gz = None
        self._plain.close()
        super().close()


def read_log(path: os.PathLike | str) -> bytes:
    """The whole (uncompressed) log: for tests and small logs only -- readers of a soak's log stream it."""
    with open_log(path) as f:
        return f.read()


def compress_server_log(path: os.PathLike | str) -> Path:
    """Gzip `path` (server.log) whole into `path.gz` beside it and remove `path` (`LogCompactor.
    finish` on a log too small to cut: written to a temporary name, fsynced, renamed into place,
    and only then is the plain log removed -- a kill in between leaves both, whole; the `.gz`
    wins). Returns the `.gz` path."""
    LogCompactor(path, lambda _line: True, head=1 << 62, tail=0).finish()
    return Path(path).with_name(Path(path).name + ".gz")


__all__ = ["CUT_MARKER", "HEAD_BYTES", "MOVED_GZ", "MOVED_STATE", "TAIL_BYTES", "LogCompactor", "compress_server_log",
           "is_gzip", "keep_lines", "open_log", "opened_as_stream", "punch_hole", "read_errors", "read_log"]
