"""Writing evidence that a later reader can trust: atomic JSON, line-atomic JSONL, a run lock.

- `write_json_atomic` validates (optionally) *before* touching the disk, then writes a temp file
  in the same directory, fsyncs it, renames it over the target and fsyncs the directory: a reader
  sees the old file or the new one, never half of one.
- `JsonlWriter` appends one complete line per `os.write`; a failed write is truncated back to the
  last whole line. A reader of a file cut at any byte sees whole lines plus at most one partial
  last line, which `read_jsonl` skips and reports.
- `RunLock` holds an exclusive `fcntl.flock` on `<run_dir>/.lock` while a run writes.
- Disk-full style failures (ENOSPC, EFBIG, EDQUOT) become `EvidenceWriteError` naming the path.
- `loads` decodes JSON with limits (nesting at most `MAX_JSON_DEPTH` deep, integers of at most
  `MAX_INT_DIGITS` digits, finite numbers only, no NaN/Infinity): hostile evidence -- JSON
  nested 100,000 deep, a 5000-digit integer -- is malformed evidence (`EvidenceFormatError`,
  a bad line of a JSONL file), never a RecursionError or a ValueError from deep inside a reader.
  `read_json`, `iter_jsonl` and everything built on them decode with it.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import itertools
import json
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from soakspec.evidence import layout
from soakspec.evidence.readprogress import ticker
from soakspec.exitcodes import UsageError

_CHUNK = 1 << 20


class EvidenceError(Exception):
    """Base class: something about an evidence directory or file is wrong."""


class EvidenceNotFound(EvidenceError, UsageError):
    """The path names no evidence directory (none there, a regular file, or no manifest.json
    in it): a usage error (exit 2), which the CLI prints as one line."""


def require_evidence_dir(path: str | os.PathLike) -> Path:
    """`path` as an evidence directory, or `EvidenceNotFound` saying what it is instead: missing,
    a regular file ("X is a file, not an evidence directory", not "no such directory"), a
    directory without manifest.json (naming the run directories it holds, if any), or one whose
    manifest.json is a symlink or not a regular file (never read). Every
    reader of evidence (`verify`, `load_evidence`, `gate --partial`, `compare`) checks here."""
    root, shown = Path(path), str(path)
    if root.is_file():
        raise EvidenceNotFound(f"{shown} is a file, not an evidence directory")
    if not root.is_dir():
        raise EvidenceNotFound(f"{shown}: no such evidence directory")
    manifest = root / layout.MANIFEST
    if os.path.lexists(manifest) and not layout.plain_file(manifest):
        # never followed (a symlink to /etc/passwd, to another run's manifest) nor opened (a FIFO blocks)
        what = "a symlink" if manifest.is_symlink() else "not a regular file"
        raise EvidenceNotFound(f"{shown}: its {layout.MANIFEST} is {what} (a symlink or special file is not evidence)")
    if not manifest.is_file():
        runs = sorted(p.name for p in root.iterdir() if (p / layout.MANIFEST).is_file())
        hint = f"; it holds run directories: {', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''}" if runs else ""
        raise EvidenceNotFound(f"{shown}: no {layout.MANIFEST} (not an evidence directory){hint}")
    return root


class EvidenceChanged(EvidenceError):
    """An evidence file read a second time (the judge re-reads requests.jsonl.gz for what it
    did not keep) no longer says what it said the first time: the evidence cannot be judged."""


class EvidenceUnreadable(EvidenceError):
    """An evidence file the judge reads as it goes (server.log.gz) does not decompress: what it
    holds cannot be known, so the evidence cannot be judged (never read as if it were empty)."""


class EvidenceWriteError(EvidenceError):
    """Writing evidence failed (disk full, file too large, permission...)."""

    def __init__(self, path: os.PathLike | str, err: OSError):
        self.path = str(path)
        self.errno = err.errno
        code = errno.errorcode.get(err.errno or 0, "E?")
        reason = err.strerror or str(err)
        super().__init__(f"{self.path}: cannot write evidence: {reason} ({code})")


class EvidenceSchemaError(EvidenceError):
    """An object does not match its schema; nothing was written."""

    def __init__(self, path: os.PathLike | str, schema: str, errors: list[tuple[str, str]]):
        self.path = str(path)
        self.schema = schema
        self.errors = errors
        self.pointer = errors[0][0] if errors else ""
        pointer, message = errors[0] if errors else ("", "invalid")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(
            f"{self.path}: does not match the {schema} schema at {pointer or '/'}: {message}{more}"
        )


class EvidenceFormatError(EvidenceError):
    """A file that should hold JSON / JSONL does not parse."""

    def __init__(self, path: os.PathLike | str, line: int, message: str):
        self.path = str(path)
        self.line = line
        super().__init__(f"{self.path}:{line}: {message}")


class EvidenceInUseError(EvidenceError):
    """The evidence directory is locked by another run, or already holds a run."""


MAX_JSON_DEPTH = 64  # evidence nests about 6 deep; a reader may recurse over what it decodes
MAX_INT_DIGITS = 300  # any such integer converts to a finite float (the largest is about 1.8e308)
_DEPTH_SCAN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
# Numbers that may break a limit: a long run of digits, or a number with a 3-digit exponent
# (1e999 is inf). A JSON number starts the text or follows a structural character or
# whitespace, so hex inside a string ("...1e234...", most sha256 digests) is not one; a string
# that merely looks like one only costs the slower decode. Only a text with one takes the
# slower decode with number hooks.
_SUSPECT_NUMBER = re.compile(r"\d{%d}|[eE][+-]?\d{3}" % (MAX_INT_DIGITS + 1))  # a quick scan first
_LONG_DIGITS = re.compile(r"\d{%d}" % (MAX_INT_DIGITS + 1))
_EXPONENT = re.compile(r"[eE][+-]?\d{3}")
_NUMBER_CHARS = frozenset("0123456789.")
_BEFORE_NUMBER = frozenset(":,[ \t\r\n")


# digits -> "0", e/E -> "e", +/- -> "+", every other byte -> " ": substring tests on the
# translated bytes find a long digit run or an e with a 3-digit exponent in C, at a fraction
# of the regular expression's cost (it tried `\d{301}` at every position: ~15 us a record)
_SHAPE = bytes(ord("0") if chr(b).isdigit() and b < 128 else ord("e") if b in b"eE" else ord("+") if b in b"+-" else ord(" ")
               for b in range(256))
_LONG_RUN = b"0" * (MAX_INT_DIGITS + 1)


def _suspect(text: str) -> bool:
    """Whether a number in `text` may break a limit (see `_SUSPECT_NUMBER`)."""
    shape = text.encode("utf-8", "surrogatepass").translate(_SHAPE)
    if _LONG_RUN in shape:
        return True
    if b"e000" not in shape and b"e+000" not in shape:
        return False
    for m in _EXPONENT.finditer(text):
        i = m.start() - 1
        while i >= 0 and text[i] in _NUMBER_CHARS:
            i -= 1
        if i == m.start() - 1:  # no digits before the e: a word, not a number
            continue
        if i >= 0 and text[i] == "-":
            i -= 1
        if i < 0 or text[i] in _BEFORE_NUMBER:
            return True
    return False


class _Limit(Exception):
    def __init__(self, message: str, literal: str):
        super().__init__(message)
        self.literal = literal


def _int(s: str) -> int:
    if len(s) - s.startswith("-") > MAX_INT_DIGITS:
        raise _Limit(f"integer of {len(s) - s.startswith('-')} digits (at most {MAX_INT_DIGITS})", s)
    return int(s)


def _float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise _Limit(f"number {s[:24]}{'...' if len(s) > 24 else ''} is out of range", s)
    return v


def _constant(s: str) -> Any:
    raise _Limit(f"{s} is not a JSON number", s)


def _check_depth(text: str) -> None:
    depth = 0
    for m in _DEPTH_SCAN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise json.JSONDecodeError(f"nested deeper than {MAX_JSON_DEPTH} levels", text, m.start())
        elif c in "]}":
            depth -= 1


# made once: `json.loads(text, parse_...=...)` builds a decoder (and its scanner) per call,
# three times the cost of decoding a request record
_PLAIN = json.JSONDecoder(parse_constant=_constant)
_HOOKED = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)


def loads(text: str) -> Any:
    """`json.loads` within limits; a text beyond them raises `json.JSONDecodeError` (a
    ValueError) at the offending position, as a syntax error would."""
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH:  # else it cannot nest too deep
        _check_depth(text)
    try:
        if not _suspect(text):
            return _PLAIN.decode(text)
        return _HOOKED.decode(text)
    except _Limit as e:
        raise json.JSONDecodeError(str(e), text, max(text.find(e.literal), 0)) from None
    except RecursionError:  # unreachable after the depth check; kept so no reader ever sees one
        raise json.JSONDecodeError("nested too deep", text, 0) from None


def dumps_json(obj: Any) -> str:
    """The canonical text of a JSON evidence file: sorted keys, indent 2, trailing newline."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def json_bytes(text: str) -> bytes:
    """The UTF-8 of JSON text `text`. A lone surrogate (a server's `\\ud800`, read back from
    evidence and written again: `combine`, a re-judged verdict) has no UTF-8; it is written as
    its JSON escape, which reads back as the same string, where `encode` stopped the write."""
    return text.encode("utf-8", "backslashreplace")


def dumps_line(obj: Any) -> str:
    """One JSONL record: sorted keys, compact, no raw newlines, trailing newline."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"


def _check_schema(path: os.PathLike | str, obj: Any, schema: str | Mapping | None) -> None:
    if schema is None:
        return
    from soakspec.evidence import schema as schemas  # jsonschema is imported only when needed

    errors = schemas.errors_for(schema, obj)
    if errors:
        name = schema if isinstance(schema, str) else str(schema.get("$id", "given"))
        raise EvidenceSchemaError(path, name, errors)


def fsync_dir(path: os.PathLike | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: os.PathLike | str, data: bytes) -> str:
    """Write `data` to `path` atomically (temp file, fsync, rename, fsync dir); return its sha256.
    Whatever stops the write before the rename -- the disk, or an exception a signal handler
    raises into it (`run` stops its judging on a second SIGTERM) -- takes the temp file with it:
    left in the run directory, `verify` called the evidence corrupt (an unlisted file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise EvidenceWriteError(path, e) from e
        raise
    try:
        fsync_dir(path.parent)
    except OSError as e:
        raise EvidenceWriteError(path, e) from e
    return hashlib.sha256(data).hexdigest()


def write_json_atomic(path: os.PathLike | str, obj: Any, schema: str | Mapping | None = None) -> str:
    """Validate `obj` against `schema` (a shipped schema name or a schema dict), then write it
    atomically as sorted, indented JSON. Returns the SHA-256 of the bytes written.

    Raises `EvidenceSchemaError` (naming the path and the JSON pointer) before anything is
    written, `EvidenceWriteError` when the disk refuses, `ValueError` for NaN/non-JSON values.
    """
    _check_schema(path, obj, schema)
    try:
        text = dumps_json(obj)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: not JSON-serialisable: {e}") from e
    return write_bytes_atomic(path, json_bytes(text))


def read_json(path: os.PathLike | str) -> Any:
    """Read one JSON file; a parse error becomes `EvidenceFormatError` with the line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise EvidenceFormatError(path, 1, f"not UTF-8: {e}") from e
    try:
        return loads(text)
    except json.JSONDecodeError as e:
        raise EvidenceFormatError(path, e.lineno, f"invalid JSON: {e.msg} (column {e.colno})") from e
    except (RecursionError, ValueError) as e:  # nested too deep; an integer of too many digits
        raise EvidenceFormatError(path, 1, f"JSON beyond the decoder's limits: {str(e)[:120]}") from None


class _AppendOnly:
    """An append-only file descriptor (O_APPEND): whole writes, fsync, close, a context manager.
    `JsonlWriter` and `GzipJsonlWriter` add what goes into it."""

    def __init__(self, path: os.PathLike | str) -> None:
        self.path = Path(path)
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise EvidenceWriteError(self.path, e) from e

    def _write_all(self, data: bytes) -> None:
        """Every byte of `data` to the file (raises OSError as the kernel does)."""
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _fsync(self) -> None:
        assert self._fd is not None
        try:
            os.fsync(self._fd)
        except OSError as e:
            raise EvidenceWriteError(self.path, e) from e

    def fsync(self) -> None:
        """Make what reached the file durable (nothing once closed). May run on a worker thread
        while the owner goes on appending (an fsync and O_APPEND writes can overlap); the owner
        must not close the writer until it returns (the runner awaits the thread)."""
        if self._fd is not None:
            self._fsync()

    def _finish(self) -> None:
        """What must reach the file before it is closed (nothing here)."""

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            self._finish()
        finally:
            try:
                self._fsync()
            finally:
                fd, self._fd = self._fd, None
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JsonlWriter(_AppendOnly):
    """Append-only JSONL: `write(obj)` appends one whole line, `flush_fsync()` makes it durable.

    Each record goes to the kernel in a single `os.write` of a complete line (O_APPEND), so a
    SIGKILL loses nothing already written; call `flush_fsync()` at least once per bucket to
    survive a power loss. A write that fails part-way is truncated back to the previous line end.
    `schema` (e.g. "request") validates each record before it is written.
    """

    def __init__(self, path: os.PathLike | str, schema: str | Mapping | None = None):
        super().__init__(path)
        self.schema = schema

    def write(self, obj: Any) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path}: write to a closed JsonlWriter")
        _check_schema(self.path, obj, self.schema)
        try:
            data = json_bytes(dumps_line(obj))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self.path}: record is not JSON-serialisable: {e}") from e
        self._append(data)

    def write_lines(self, data: bytes) -> None:
        """Append whole lines already made by `dumps_line` (e.g. by a `--workers` process), in
        one write: the file stays line-atomic. Not validated against `schema`."""
        if self._fd is None:
            raise ValueError(f"{self.path}: write to a closed JsonlWriter")
        if data and not data.endswith(b"\n"):
            raise ValueError(f"{self.path}: write_lines needs whole lines")
        if data:
            self._append(data)

    def _append(self, data: bytes) -> None:
        assert self._fd is not None
        before = os.fstat(self._fd).st_size
        try:
            self._write_all(data)
        except OSError as e:
            try:  # keep the file line-atomic: drop the partial line we may have written
                os.ftruncate(self._fd, before)
            except OSError:
                pass
            raise EvidenceWriteError(self.path, e) from e

    def flush_fsync(self) -> None:
        self.fsync()


@dataclasses.dataclass(frozen=True, slots=True)
class JsonlScan:
    """Everything found in a JSONL file: parsed records with their 1-based line numbers, lines
    that are whole but do not parse, and whether the file ends in a partial (unterminated) line."""

    records: tuple[tuple[int, Any], ...]
    errors: tuple[tuple[int, str], ...]
    partial_tail: bool


GZIP_MAGIC = b"\x1f\x8b"


def iter_raw_lines(path: os.PathLike | str, hasher: Any = None, cut: list[int] | None = None):
    """Yield `(line_number, raw_line)` of a JSONL file, plain or gzip (one or more members,
    as `GzipJsonlWriter` writes them; told apart by the gzip magic), one line at a time.

    `hasher` (a hashlib object), when given, is fed every byte of the *file* as it is read: one
    pass hashes and decodes. A last line without its newline is yielded as it is (the caller
    sees no trailing newline: a cut-off write). A gzip file whose last member ends early (a run
    killed mid-bucket) yields the whole lines that member's bytes hold and appends the line
    count so far to `cut`; bytes that are not gzip at all raise `EvidenceFormatError`."""
    with open(path, "rb") as fh:
        head = fh.read(2)
        fh.seek(0)
        if head != GZIP_MAGIC:
            i = 0
            for raw in fh:
                i += 1
                if hasher is not None:
                    hasher.update(raw)
                yield i, raw
            return
        yield from _gzip_lines(path, fh, hasher, cut)


def _gzip_lines(path, fh, hasher, cut):
    for i, block in _gzip_blocks(path, fh, hasher, cut):
        lines = block.split(b"\n")
        last = lines.pop()
        for raw in lines:
            yield i, raw + b"\n"
            i += 1
        if last:  # only the file's cut-off end has no newline
            yield i, last


def iter_raw_blocks(path: os.PathLike | str, hasher: Any = None, cut: list[int] | None = None, start: int = 0):
    """`iter_raw_lines` a block at a time: yield `(first_line_number, block)`, each block whole
    lines (every one newline-terminated) of up to about a read's size -- except a cut-off last
    line, which comes last, alone, without its newline. The same bytes, hashing and `cut` as
    `iter_raw_lines`; a reader that decodes many lines in one call (`record.iter_record_batches`)
    pays the per-line Python cost once a block. `start`, a byte offset where a gzip member (or,
    plain, a line) begins, reads the file from there: lines are numbered from it, and `hasher`
    sees the bytes from it only (a sweep's probe reads back what it wrote, not the run so far)."""
    with open(path, "rb") as fh:
        fh.seek(start)
        head = fh.read(2)
        fh.seek(start)
        tick = ticker(path, fh)  # how far the read has got, for a long one (on stderr)
        if head != GZIP_MAGIC:
            yield from _plain_blocks(fh, hasher, tick)
            return
        yield from _gzip_blocks(path, fh, hasher, cut, tick)


def _hashed_reads(fh, hasher, tick=None):
    """The file's bytes a read at a time, each fed to `hasher` (when given) as it is read;
    `tick` (when given: `readprogress.ticker`) is called after each read."""
    while chunk := fh.read(_CHUNK):
        if hasher is not None:
            hasher.update(chunk)
        if tick is not None:
            tick()
        yield chunk


def _plain_blocks(fh, hasher, tick=None):
    i = 1
    tail = b""
    for chunk in _hashed_reads(fh, hasher, tick):
        data = tail + chunk
        k = data.rfind(b"\n") + 1
        tail = data[k:]
        for block in _pieces(data, k):
            yield i, block
            i += count_lines(block)
    if tail:
        yield i, tail


# Decompressed bytes a block holds at most (but for one longer line): ~216 of the runner's
# ~1.2 kB records. Larger blocks decode slower (`verify` of 10^6 requests: 7.5 s at 256 KiB,
# 10.5 at 1 MiB: the block and its copies leave the cache); the judge's table takes the
# records of several blocks at once instead (`table.BULK_ROWS`; benchmarks/README.md, "Blocks").
_BLOCK = 1 << 18
_INFLATE = 1 << 20  # decompressed bytes one inflate step makes at most


def count_lines(block: bytes) -> int:
    """`block.count(b"\\n")`, a third of its time on a MiB block (numpy compares the bytes)."""
    if len(block) < 4096:
        return block.count(b"\n")
    import numpy as np

    return int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) == 10))


def _pieces(buf: bytes, k: int):
    """buf[:k] (whole lines) in blocks of whole lines of about _BLOCK bytes: what a reader
    decodes at once stays small (a 1 MiB gzip read can inflate to 12 MiB of lines)."""
    a = 0
    while a < k:
        b = buf.rfind(b"\n", a, min(k, a + _BLOCK)) + 1 if a + _BLOCK < k else k
        if b <= a:  # one line longer than a block
            b = buf.find(b"\n", a, k) + 1
        yield buf[a:b] if (a, b) != (0, len(buf)) else buf
        a = b


def _gzip_blocks(path, fh, hasher, cut, tick=None):
    """The decompressed members as blocks of whole lines (see `iter_raw_blocks`). Lines are
    gathered across members up to about _BLOCK bytes before a block is yielded: the runner
    writes a member a bucket each second (~170 requests at 1,000 a second, often less), and a
    reader's work a block (a msgspec call) is then spread over a full block's lines. What is
    gathered is yielded before a read error is raised, as it would have been a member at a
    time, so the lines read before a corrupt member are read the same."""
    import zlib

    i = 1  # the number of the next block's first line
    tail = b""  # the start of a line not yet whole
    held: list[bytes] = []  # whole lines not yet yielded
    size = 0

    def flush(final: bool = True):
        """Yield what is held as blocks; unless `final`, a last block shorter than _BLOCK stays
        held, to be joined by the next lines."""
        nonlocal i, held, size
        if held:
            buf = held[0] if len(held) == 1 else b"".join(held)
            held, size = [], 0
            at = 0
            for block in _pieces(buf, len(buf)):
                at += len(block)
                if not final and at == len(buf) and len(block) < _BLOCK:  # the last, short one
                    held, size = [block], len(block)
                    break
                yield i, block
                i += count_lines(block)

    d = zlib.decompressobj(wbits=31)
    started = False  # the current member has consumed input
    for data in _hashed_reads(fh, hasher, tick):
        while True:
            if not started and data[:2] != GZIP_MAGIC[: len(data[:2])]:
                yield from flush()
                raise EvidenceFormatError(path, i, "bytes after the last gzip member are not gzip (appended to?)")
            try:
                out = d.decompress(data, _INFLATE)  # at most _INFLATE bytes: a read of 1 MiB can inflate to 20
            except zlib.error as e:
                yield from flush()
                raise EvidenceFormatError(path, i, f"corrupt gzip data: {e}") from None
            started = True
            more = False
            if d.eof:
                data = d.unused_data
                d = zlib.decompressobj(wbits=31)
                started = False
                more = bool(data)
            else:
                data = d.unconsumed_tail
                more = bool(data) or len(out) == _INFLATE  # input left, or output zlib still holds
            if out:
                buf = tail + out if tail else out
                k = buf.rfind(b"\n") + 1
                tail = buf[k:]
                if k:
                    held.append(buf[:k] if k < len(buf) else buf)
                    size += k
                    if size >= _BLOCK:
                        yield from flush(final=False)
            if not more:
                break
    yield from flush()
    if started:  # the last member never ended: its writer was killed before closing it
        if cut is not None:
            cut.append(i - 1)
    if tail:
        yield i, tail


def decode_block(list_decoder: Any, block: bytes) -> list | None:
    """The values of `block` -- whole lines, each newline-terminated -- one a line, decoded in
    one call by `list_decoder` (a msgspec decoder of a list of the line's type), or None when
    some line does not hold exactly one value it accepts (then read the lines one at a time).
    The lines are decoded as one JSON array, joined by commas: a blank line (`,,`), a value
    over two lines (a comma inside it) or two values on one line (one value more than lines)
    cannot pass, where msgspec's `decode_lines` reads any whitespace-separated values
    (`1 2` on one line, a blank line after it: as many values as lines, each on the wrong line)."""
    import msgspec

    try:
        vals = list_decoder.decode(b"[" + block[:-1].replace(b"\n", b",") + b"]")
    except msgspec.DecodeError:
        return None
    return vals if len(vals) == count_lines(block) else None


def iter_jsonl(path: os.PathLike | str, errors: list[tuple[int, str]] | None = None, hasher: Any = None):
    """Yield `(line_number, record)` one line at a time, so a reader of a long soak's
    requests never holds the file (or every parsed row) at once. Plain or gzip (see
    `iter_raw_lines`). Bad lines go into `errors` as `(line, message)`; a cut-off last line (no
    newline) or gzip member is reported as `(line, None)` there and skipped, as `scan_jsonl`
    does. `hasher` (a hashlib object), when given, is fed every byte of the file as it is read:
    one pass hashes and decodes."""
    for i, row, _typed in iter_jsonl_typed(path, errors, hasher):
        yield i, row


def iter_jsonl_typed(path: os.PathLike | str, errors: list[tuple[int, str]] | None = None, hasher: Any = None,
                     fast: Any = None, plain: bool = True):
    """`iter_jsonl`, yielding `(line_number, record, typed)`. `fast`, when given, is a msgspec
    typed decoder whose type accepts no line that the file's schema or `loads`' limits refuse
    (a flat struct of plain fields: `verify._ShortTrace`): a block of whole lines it decodes in
    one call is yielded as plain JSON values with `typed` True -- valid, so a caller need not
    validate them again; any other block is read line by line, exactly as `iter_jsonl` reads
    it, with `typed` False. With `plain` False a typed line is yielded as the decoded struct,
    not made into plain values: for a caller that only checks the file."""
    import msgspec

    cut: list[int] = []
    blocks = iter_raw_blocks(path, hasher, cut)
    many = msgspec.json.Decoder(list[fast.type]) if fast is not None else None  # a block's lines at once: `decode_block`
    while True:
        try:
            first, block = next(blocks)
        except StopIteration:
            break
        except EvidenceFormatError as e:  # not gzip after the last member: report it, stop there
            if errors is not None:
                errors.append((e.line, str(e).split(": ", 2)[-1]))
            break
        if not block.endswith(b"\n"):
            if errors is not None:
                errors.append((first, None))
            break
        if many is not None:
            objs = decode_block(many, block)
            if objs is not None:
                if plain:
                    to_builtins = msgspec.to_builtins
                    for i, obj in enumerate(objs, first):
                        yield i, to_builtins(obj), True
                else:
                    yield from zip(range(first, first + len(objs)), objs, itertools.repeat(True))
                continue
        lines = block.split(b"\n")
        lines.pop()  # after the block's last newline: nothing
        for i, raw in enumerate(lines, first):
            row = _line(raw, i, errors)
            if row is not _BAD:
                yield i, row, False
    if cut and errors is not None and not any(m is None for _, m in errors):
        errors.append((cut[0] + 1, None))


_BAD = object()


def _line(raw: bytes, i: int, errors: list[tuple[int, str]] | None) -> Any:
    """One whole line (without its newline) decoded within the limits, or _BAD (the reason in `errors`)."""
    if not raw.strip():
        if errors is not None:
            errors.append((i, "empty line"))
        return _BAD
    try:  # decoded first: json.loads(bytes) would guess UTF-16/32 and pass lone surrogates
        return loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        if errors is not None:
            errors.append((i, "not UTF-8"))
    except json.JSONDecodeError as e:
        if errors is not None:
            errors.append((i, f"invalid JSON: {e.msg} (column {e.colno})"))
    except (RecursionError, ValueError) as e:  # nested too deep; an integer of too many digits
        if errors is not None:
            errors.append((i, f"JSON beyond the decoder's limits: {str(e)[:120]}"))
    return _BAD


class GzipJsonlWriter(_AppendOnly):
    """Append-only gzip JSONL, one gzip member per bucket: `write_lines(data)` compresses whole
    lines into the open member (what the compressor emits goes to the file at once, O_APPEND);
    `flush_fsync()` ends the member (its gzip trailer) and fsyncs -- the runner calls it at
    every bucket end. Within a member, what the compressor holds is pushed out (a zlib sync
    flush: a few bytes) with the member's first lines and then at most every `sync_s` seconds, so the file grows as the run goes and a
    SIGKILL loses at most the last `sync_s` seconds of records. It leaves closed members plus at
    most one cut member: readers (`iter_raw_lines`) read the cut member's whole lines and
    report it as a cut-off write (incomplete evidence, never corruption). A write the disk refuses truncates the file
    back to where the open member began (that member's records are lost; the run aborts on the
    `EvidenceWriteError`)."""

    # zlib level 4, chosen by measurement (benchmarks/README.md, "Load generator": 20,000 request
    # lines in batches of 16, as the runner writes them): for records with real ITLs (~1 KB
    # each, 63 gaps of 10 ms with 50-400 us jitter) level 6 costs ~26 us of CPU a record and
    # writes 211-245 B, level 4 ~8 us and 230-259 B (+6-9 %), level 1 ~5 us and 255-285 B
    # (+21 %); levels 4-9 are deflate's lazy matcher, whose cost past 4 buys little here. At
    # 7,000 requests/s level 6 alone would take a sixth of a core from the load generator.
    LEVEL = 4

    def __init__(self, path: os.PathLike | str, sync_s: float = 1.0):
        super().__init__(path)
        self.sync_s = sync_s
        self._z: Any = None
        self._member_start = 0
        self._synced = 0.0

    def write_lines(self, data: bytes) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path}: write to a closed GzipJsonlWriter")
        if data and not data.endswith(b"\n"):
            raise ValueError(f"{self.path}: write_lines needs whole lines")
        if not data:
            return
        if self._z is None:
            import zlib

            self._z = zlib.compressobj(self.LEVEL, zlib.DEFLATED, 31)
            self._member_start = os.fstat(self._fd).st_size
            self._synced = -math.inf  # a member's first lines are flushed at once: a non-empty file has a record
        out = self._z.compress(data)
        if time.monotonic() - self._synced >= self.sync_s:
            import zlib

            out += self._z.flush(zlib.Z_SYNC_FLUSH)
            self._synced = time.monotonic()
        if out:
            self._append(out)

    def write(self, obj: Any) -> None:
        try:
            data = json_bytes(dumps_line(obj))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self.path}: record is not JSON-serialisable: {e}") from e
        self.write_lines(data)

    def _append(self, data: bytes) -> None:
        assert self._fd is not None
        try:
            self._write_all(data)
        except OSError as e:
            self._z = None
            try:  # the open member cannot be continued: drop it, keep the file readable
                os.ftruncate(self._fd, self._member_start)
            except OSError:
                pass
            raise EvidenceWriteError(self.path, e) from e

    def end_member(self) -> None:
        """End the open gzip member (nothing to do when none is open)."""
        if self._z is not None and self._fd is not None:
            z, self._z = self._z, None
            self._append(z.flush())

    def boundary(self) -> int:
        """End the open member; the file's size: the byte the next member will begin at, where
        a reader can start (`iter_raw_blocks(start=...)`)."""
        self.end_member()
        if self._fd is None:
            raise ValueError(f"{self.path}: boundary of a closed GzipJsonlWriter")
        return os.fstat(self._fd).st_size

    def flush_fsync(self) -> None:
        self.end_member()
        self.fsync()

    def _finish(self) -> None:
        self.end_member()


def scan_jsonl(path: os.PathLike | str) -> JsonlScan:
    """`iter_jsonl`, collected."""
    found: list[tuple[int, str | None]] = []
    records = tuple(iter_jsonl(path, found))
    errors = tuple((i, m) for i, m in found if m is not None)
    return JsonlScan(records, errors, partial_tail=len(errors) < len(found))


def read_jsonl(path: os.PathLike | str) -> tuple[list[Any], bool]:
    """Return `(records, partial_tail)`. An unterminated last line is a write that was cut off:
    it is skipped and reported as `partial_tail=True`. A whole line that does not parse raises
    `EvidenceFormatError` (that is corruption, not a cut)."""
    scan = scan_jsonl(path)
    if scan.errors:
        line, message = scan.errors[0]
        raise EvidenceFormatError(path, line, message)
    return [r for _, r in scan.records], scan.partial_tail


def sha256_file(path: os.PathLike | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class RunLock:
    """Exclusive lock on an evidence directory while a run writes into it.

    `with RunLock(run_dir): ...` creates the directory, takes `flock(LOCK_EX | LOCK_NB)` on
    `<run_dir>/.lock` and writes our pid into it. A second writer is refused with
    "evidence directory X is in use by pid N". A directory that already holds a manifest, or a
    run's files without one, is refused too (a run never writes into another run's evidence)
    unless `allow_existing=True` (for re-judging retained evidence). The lock file is removed
    on release.
    """

    def __init__(self, run_dir: os.PathLike | str, *, allow_existing: bool = False):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / layout.LOCK
        self.allow_existing = allow_existing
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise EvidenceWriteError(self.run_dir, e) from e
        for _ in range(10):  # retry if the file we locked was unlinked by its previous holder
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise EvidenceWriteError(self.path, e) from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                who = f"pid {holder}" if holder else "another process"
                raise EvidenceInUseError(f"evidence directory {self.run_dir} is in use by {who}") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:  # pragma: no cover - needs a pathological race
            raise EvidenceInUseError(f"evidence directory {self.run_dir}: could not take the lock")
        self._fd = fd
        manifest = self.run_dir / layout.MANIFEST
        if not self.allow_existing and manifest.exists():
            status = _manifest_status(manifest)
            self.release()
            if status == "complete":
                raise EvidenceInUseError(
                    f"evidence directory {self.run_dir} already holds a complete run; "
                    "choose a new run id or output directory"
                )
            raise EvidenceInUseError(
                f"evidence directory {self.run_dir} already holds a run (status {status}); "
                "a run never writes into another run's evidence"
            )
        stale = None if self.allow_existing else _run_files_without_manifest(self.run_dir)
        if stale is not None:
            self.release()
            raise EvidenceInUseError(
                f"evidence directory {self.run_dir} already holds a run's files ({stale}) but no manifest.json; "
                "a run never writes into another run's evidence: choose a new output directory"
            )
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:
            self.release()
            raise EvidenceWriteError(self.path, e) from e
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.unlink(self.path)  # while still holding the lock; see the inode check in acquire
        except OSError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(run_dir: os.PathLike | str) -> int | None:
    """The pid holding `<run_dir>/.lock`, 0 if held by an unknown pid, None if not held.

    Never creates the lock file, never follows a symlink, and never waits: a `.lock` that is
    not a regular file (a FIFO would block the open until a writer came) is held by no one
    (`verify` reports it, V106)."""
    path = Path(run_dir) / layout.LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def _run_files_without_manifest(run_dir: Path) -> str | None:
    """The first of a run's own files (not its manifest) that `run_dir` holds, or None. A run
    appends to its files (requests.jsonl.gz, client.jsonl) and refuses to replace hashed ones
    (results.json): left there by an earlier run whose manifest.json is gone, they made a new
    run mix its records with theirs and abort, or end INCONCLUSIVE, after its whole load."""
    for name in (layout.BACKENDS, layout.CLIENT, layout.RESULTS, layout.VERDICT, layout.MANIFEST_SIG):
        path = run_dir / name
        try:
            if name == layout.BACKENDS and path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
                continue  # an empty backends/ holds nothing to mix with
        except OSError:
            pass
        if os.path.lexists(path):
            return name
    return None


def _manifest_status(path: Path) -> str:
    try:
        data = loads(path.read_text(encoding="utf-8"))
        return str(data.get("status", "unknown")) if isinstance(data, dict) else "unreadable"
    except (OSError, ValueError):
        return "unreadable"
