"""Request ids held compactly, and found without a map of every id.

`IdColumn` holds a run's request ids as the runner writes them -- a stem and a number
(`soak-5ca1ab1e-0-0000042`: ~5 bytes an id, not the ~80 of a list of str) -- or, for any other
ids, as UTF-8 text end to end with offsets; `IdStore` builds one an id (or a block) at a time.
`IdIndex` finds the positions of ids by a table indexed by the runner's numbers (`_Direct`,
~4 bytes an id) or else a sorted array of their hashes (8 bytes an id), not the ~100 of a
dict. Both the runner (matching the server's traces after the load, `runner/collect.py`) and
the judge (its request table, `judge/table.py`, and trace matching, `judge/tracematch.py`)
hold a run's ids this way: at 10^7 requests the difference is gigabytes.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

REPEAT_CHUNK = 1 << 16  # sorted keys compared at a time by `IdIndex.repeated`

_DIGITS = "0123456789"
_NUM_DIGITS = 18  # the most digits an id's number may have (below 2**63)
_MAX_STEMS = 1024  # distinct (stem, width) pairs before ids are held as text instead
U32 = next(c for c in "IL" if array(c).itemsize == 4)  # array's 4-byte unsigned typecode


def digit_numbers(digits: str, width: int) -> np.ndarray:
    """The numbers of `digits` (ASCII digits only, `width` of them a number, width <= 18) read
    `width` at a time, as int64: `[int(digits[k:k + width]) ...]` without a str a number."""
    d = np.frombuffer(digits.encode("ascii"), dtype=np.uint8).reshape(-1, width).astype(np.int64) - 48
    return d @ (10 ** np.arange(width - 1, -1, -1, dtype=np.int64))


def sliced_numbers(texts: Sequence[str], start: int, width: int) -> tuple[list[int] | None, np.ndarray]:
    """The numbers written at `texts[j][start:start + width]` (each text has `width` characters
    there): `(None, numbers)` when every text has ASCII digits there, else `(the positions j of
    those that do, their numbers)`. How `IdStore` and `IdIndex.find_affixed` both read an id's
    number: one str of every text's digits, read at once (`digit_numbers`)."""
    digits = "".join([t[start:start + width] for t in texts])
    if digits.isascii() and digits.isdigit():
        return None, digit_numbers(digits, width)
    at = [j for j, t in enumerate(texts) if (d := t[start:start + width]).isascii() and d.isdigit()]
    if not at:
        return at, np.zeros(0, dtype=np.int64)
    return at, digit_numbers("".join([texts[j][start:start + width] for j in at]), width)


def put_numbers(a: array, values: Any) -> array:
    """Append whole numbers (`values`: an int, or an int64 array) to `a`: held in 4 bytes (`U32`)
    while every one is in [0, 2**32), in 8 from the first that is not (`a` copied wider once).
    Returns the array that holds them (a row count or offset column is 4 bytes a request while
    it is built, not 8 and then a 4-byte copy)."""
    one = isinstance(values, int)
    if a.typecode == U32:
        lo, hi = (values, values) if one else ((int(values.min()), int(values.max())) if len(values) else (0, 0))
        if 0 <= lo and hi < 2**32:
            if one:
                a.append(values)
            else:
                a.frombytes(values.astype(np.uint32).tobytes())
            return a
        a = array("q", a)
    if one:
        a.append(values)
    else:
        a.frombytes(np.asarray(values, dtype=np.int64).tobytes())
    return a


def as_numbers(a: array) -> np.ndarray:
    """A `put_numbers` array as numpy (a view of its buffer, no copy)."""
    dtype = np.uint32 if a.typecode == U32 else np.int64
    return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)


class IdColumn(Sequence):
    """The request ids of a table. Reads like the list it replaces: `ids[i]` and iteration
    give `str`. Held one of two ways:

      numbered  what the runner writes (`soak-5ca1ab1e-0-0000042`): each id a *stem* and a
                number of a fixed width (its trailing ASCII digits, leading zeros kept), so an
                id is a stem code and an integer -- ~5 bytes a request, not 27 (stems:
                the distinct (stem, width) pairs, at most _MAX_STEMS);
      text      any other ids: their UTF-8 bytes end to end with offsets (31 bytes a
                23-character id, against ~80 for a list of str)."""

    __slots__ = ("_blob", "_off", "_stems", "_widths", "_code", "_num")

    def __init__(self, blob: bytes | bytearray | None, off: np.ndarray | None, *, stems: Sequence[str] = (),
                 widths: Sequence[int] = (), code: np.ndarray | None = None, num: np.ndarray | None = None) -> None:
        self._blob, self._off = blob, off
        self._stems, self._widths, self._code, self._num = tuple(stems), tuple(widths), code, num

    def __len__(self) -> int:
        return len(self._off) - 1 if self._off is not None else len(self._num)  # type: ignore[arg-type]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if self._off is None:
            c = int(self._code[i])  # type: ignore[index]
            return self._stems[c] + str(int(self._num[i])).zfill(self._widths[c])  # type: ignore[index]
        return self._blob[int(self._off[i]):int(self._off[i + 1])].decode("utf-8", "surrogatepass")  # type: ignore[index]

    def take(self, rows: np.ndarray) -> list[str]:
        """The ids of `rows` (an int array), in that order."""
        if self._off is None:
            stems, widths = self._stems, self._widths
            return [stems[c] + str(n).zfill(widths[c]) for c, n in zip(self._code[rows].tolist(), self._num[rows].tolist())]  # type: ignore[index]
        blob = self._blob
        return [blob[a:b].decode("utf-8", "surrogatepass") for a, b in zip(self._off[rows].tolist(), self._off[rows + 1].tolist())]  # type: ignore[index]

    def __iter__(self) -> Iterator[str]:
        if self._off is None:
            stems, widths = self._stems, self._widths
            step = 1 << 16
            for a in range(0, len(self), step):
                yield from (stems[c] + str(n).zfill(widths[c]) for c, n in zip(self._code[a:a + step].tolist(), self._num[a:a + step].tolist()))  # type: ignore[index]
            return
        blob, off = self._blob, self._off.tolist()
        for a, b in zip(off, off[1:]):
            yield blob[a:b].decode("utf-8", "surrogatepass")  # type: ignore[index]

    def lengths(self) -> set[int]:
        """`set(map(len, self))` -- the distinct id lengths, in characters -- without making an id."""
        if self._off is None:
            used = np.flatnonzero(np.bincount(self._code, minlength=len(self._stems)))  # type: ignore[arg-type]
            return {len(self._stems[c]) + self._widths[c] for c in used.tolist()}
        if self._blob is not None and self._blob.isascii():  # a byte a character
            return set(np.unique(np.diff(self._off.astype(np.int64))).tolist())  # type: ignore[union-attr]
        return set(map(len, self))

    @property
    def nbytes(self) -> int:
        if self._off is None:
            return self._code.nbytes + self._num.nbytes + sum(map(len, self._stems))  # type: ignore[union-attr]
        return len(self._blob) + self._off.nbytes  # type: ignore[arg-type]


def take_ids(ids: Sequence[str], rows: np.ndarray) -> list[str]:
    """`[ids[r] for r in rows]`, for an `IdColumn` (batched) or any sequence."""
    if isinstance(ids, IdColumn):
        return ids.take(rows)
    return [ids[r] for r in rows.tolist()]


class IdStore:
    """What an `IdColumn` is built from, an id (or a list of them) at a time: numbered while
    every id is a stem and a number, as text from the first one that is not (the ids so far
    turned to text then)."""

    def __init__(self) -> None:
        self.blob: bytearray | None = None  # text, once an id is not numbered
        self.off: array | None = None
        self.keys: dict[tuple[str, int], int] = {}  # (stem, width) -> its code
        self.code = array("H")
        self.num = array(U32)  # `put_numbers`: 4 bytes a number while every number fits

    def _key(self, stem: str, width: int) -> int | None:
        c = self.keys.get((stem, width))
        if c is None and len(self.keys) < _MAX_STEMS:
            c = self.keys[(stem, width)] = len(self.keys)
        return c

    def _as_text(self) -> None:
        """Every id so far as text (from here on, ids are held as text)."""
        ids = list(self._numbered().__iter__()) if len(self.num) else []
        self.blob, self.off = bytearray(), array("q", [0])
        self.code, self.num, self.keys = array("H"), array(U32), {}
        if ids:
            self._extend_text(ids)

    def _numbered(self, copy: bool = True) -> IdColumn:
        """The ids so far (`copy=False`, when the store is finished: views of its arrays)."""
        stems = [k[0] for k in self.keys]
        widths = [k[1] for k in self.keys]
        code, num = np.frombuffer(self.code, dtype=np.uint16), as_numbers(self.num)
        return IdColumn(None, None, stems=stems, widths=widths, code=code.copy() if copy else code,
                        num=num.copy() if copy else num)

    def append(self, rid: str) -> None:
        if self.blob is None:
            stem = rid.rstrip(_DIGITS)
            w = len(rid) - len(stem)
            c = self._key(stem, w) if 0 < w <= _NUM_DIGITS else None
            if c is not None:
                self.code.append(c)
                self.num = put_numbers(self.num, int(rid[len(stem):]))
                return
            self._as_text()
        self.blob += rid.encode("utf-8", "surrogatepass")  # type: ignore[operator]
        self.off.append(len(self.blob))  # type: ignore[union-attr, arg-type]

    def extend(self, ids: list[str]) -> None:
        if not ids:
            return
        if self.blob is None:
            first = ids[0]
            stem = first.rstrip(_DIGITS)
            k, w = len(stem), len(first) - len(stem)
            c = self._key(stem, w) if 0 < w <= _NUM_DIGITS else None
            if c is not None and set(map(len, ids)) == {k + w} and all(x.startswith(stem) for x in ids):
                some, nums = sliced_numbers(ids, k, w)
                if some is None:  # every id: this stem and w ASCII digits
                    self.code.frombytes(np.full(len(ids), c, dtype=np.uint16).tobytes())
                    self.num = put_numbers(self.num, nums)
                    return
            for x in ids:  # mixed stems (or not numbered: the first such id turns the store to text)
                self.append(x)
            return
        self._extend_text(ids)

    def _extend_text(self, ids: list[str]) -> None:
        text = "".join(ids)
        if text.isascii():  # one byte a character: the offsets are the lengths
            self.blob += text.encode("ascii")  # type: ignore[operator]
            lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        else:
            enc = [x.encode("utf-8", "surrogatepass") for x in ids]
            self.blob += b"".join(enc)  # type: ignore[operator]
            lens = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
        self.off.frombytes((np.cumsum(lens) + self.off[-1]).tobytes())  # type: ignore[union-attr]

    def finish(self, codes: Callable[[np.ndarray], np.ndarray] | None = None) -> IdColumn:
        """The column (views of what was built, no copy); `codes` may hold the stem codes smaller
        (the judge's table holds them as it holds label codes: `table.compact_codes`)."""
        if self.blob is None:
            col = self._numbered(copy=False)  # 4 bytes a number unless one needed 8 (`put_numbers`)
            if codes is not None:
                col._code = codes(col._code)
            return col
        off = np.frombuffer(self.off, dtype=np.int64)  # type: ignore[arg-type]
        if len(self.blob) < 2**32:  # offsets in 4 bytes
            off = off.astype(np.uint32)
        return IdColumn(self.blob, off)  # the bytearray itself: no copy


_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(code: np.ndarray, num: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each (stem code, number) pair (splitmix64's finaliser over the pair):
    what `IdIndex` sorts a numbered column's ids by. Only its spread matters (equal hash bits
    are told apart by the pairs themselves), so it may change between versions."""
    x = num.astype(np.uint64) * _GOLD + code.astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


DIRECT_SLOTS_PER_ID = 2  # a numbered column's numbers spanning at most this many slots an id: `_Direct`


class _Direct:
    """A numbered column's rows by (stem code, number) in one flat table: `table[base[c] + num
    - lo[c]]` is the first row with that id (-1: none) -- 4 bytes a slot, and the runner's
    numbers (a sequence per stem) leave few slots empty, so about 4 bytes a request where the
    hashed keys take 8, and a lookup is an index, not a search. Ids recorded more than once
    (rare: a re-sent id, evidence appended twice) have all their rows in `more`, by slot.
    `of(col)` is None where the numbers are too sparse for it (`DIRECT_SLOTS_PER_ID`): the
    hashed keys then."""

    __slots__ = ("lo", "span", "base", "table", "more")

    def __init__(self, lo: np.ndarray, span: np.ndarray, table: np.ndarray, more: dict[int, list[int]]) -> None:
        self.lo, self.span, self.table, self.more = lo, span, table, more
        self.base = np.concatenate(([0], np.cumsum(span)[:-1])).astype(np.int64)

    @classmethod
    def of(cls, col: IdColumn) -> _Direct | None:
        code, num = col._code, col._num
        assert code is not None and num is not None
        n, stems, step = len(num), len(col._stems), 1 << 16  # temporaries of a step: about 1 MB
        if not n:
            return None
        big = np.iinfo(np.int64)
        lo, hi = np.full(stems, big.max, dtype=np.int64), np.full(stems, big.min, dtype=np.int64)
        for a in range(0, n, step):
            c, m = code[a:a + step], num[a:a + step].astype(np.int64)
            np.minimum.at(lo, c, m)
            np.maximum.at(hi, c, m)
        used = hi >= lo
        span = np.where(used, hi - lo + 1, 0)
        slots = sum(span.tolist())  # Python ints: 18-digit numbers of many stems overflow an int64 sum
        if slots > DIRECT_SLOTS_PER_ID * n:
            return None
        lo = np.where(used, lo, 0)
        rows = np.int32 if n < 2**31 else np.int64
        table = np.full(slots, -1, dtype=rows)
        out = cls(lo, span, table, {})
        for a in range(0, n, step):  # each slot gets one of its rows (which one, numpy does not say)
            table[out._slots(code[a:a + step], num[a:a + step])] = np.arange(a, min(a + step, n), dtype=rows)
        lost: list[np.ndarray] = []  # rows whose slot holds another row: their id is recorded more than once
        for a in range(0, n, step):
            s = out._slots(code[a:a + step], num[a:a + step])
            if len(k := np.flatnonzero(table[s] != np.arange(a, min(a + step, n), dtype=rows))):
                lost.append(np.stack([s[k], k + a]))
        if lost:
            for s, r in np.concatenate(lost, axis=1).T.tolist():
                out.more.setdefault(s, [int(table[s])]).append(r)
            for s, g in out.more.items():
                g.sort()
                table[s] = g[0]
        return out

    def _slots(self, code: np.ndarray, num: np.ndarray) -> np.ndarray:
        return self.base[code] + (num.astype(np.int64) - self.lo[code])

    def found(self, code: np.ndarray, num: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (position, row) whose id is the pair (code[position], num[position]), by
        position, then row."""
        k = num.astype(np.int64) - self.lo[code]
        inside = np.flatnonzero((k >= 0) & (k < self.span[code]))
        slots = self.base[code[inside]] + k[inside]
        rows = self.table[slots].astype(np.int64)
        hit = rows >= 0
        pos, rows, slots = inside[hit], rows[hit], slots[hit]
        if self.more and len(pos):
            again = np.flatnonzero(np.isin(slots, np.fromiter(self.more, dtype=np.int64, count=len(self.more))))
            if len(again):  # an id with more rows: every one of them
                extra = [(int(pos[i]), r) for i in again.tolist() for r in self.more[int(slots[i])][1:]]
                pos = np.concatenate([pos, np.array([p for p, _ in extra], dtype=np.int64)])
                rows = np.concatenate([rows, np.array([r for _, r in extra], dtype=np.int64)])
                order = np.lexsort((rows, pos))
                pos, rows = pos[order], rows[order]
        return pos, rows

    def repeated(self) -> list[list[int]]:
        return sorted((list(g) for g in self.more.values()), key=lambda g: g[1])


class IdIndex:
    """The rows of a table by request id, without a map of every id: one sorted array of 64-bit
    keys, each the high bits of the id's hash above the row's number -- 8 bytes a request,
    built in place (a dict of id -> row is about 100). A hash found is confirmed by comparing
    the id itself, so ids whose hashes share those bits stay apart (at 10^7 requests 40 bits
    are the hash's: a few dozen such pairs). Lookups are batched (`rows_many`): numpy finds
    every key of a batch at once.

    The hash: for the runner's ids (a numbered `IdColumn`), `_mix` of the id's stem code and
    number, computed a slice at a time with no id made as text, and confirmed by comparing
    (code, number) pairs; a key is taken apart as `IdStore` takes an id (its trailing ASCII
    digits), and one no stem of the column has names no row. For any other ids, Python's hash
    of the id (fixed within a process), confirmed by `==`.

    The runner's ids need no hash: their numbers are a sequence per stem, so where they span at
    most DIRECT_SLOTS_PER_ID slots an id, `_Direct` holds each (stem, number)'s first row in a
    table (4 bytes a slot, a lookup an index), and no keys are built (at 10^7 requests 38 MiB
    less while the traces are re-matched, and the lookups about a third faster). Answers are
    the same either way (tests/test_tracematch_index.py forces each)."""

    def __init__(self, ids: Sequence[Any]) -> None:
        self.ids = ids
        n = len(ids)
        numbered = isinstance(ids, IdColumn) and ids._off is None
        # (stem, width) -> code, for taking a key apart (numbered ids only)
        self._forms: dict[tuple[tuple[str, str, int], ...], IdForms] = {}  # text ids: `find_affixed`'s inverters
        self._lengths: set[int] | None = None  # text ids: their lengths, for those
        self._stems: dict[tuple[str, int], int] | None = (
            {(st, w): c for c, (st, w) in enumerate(zip(ids._stems, ids._widths))} if numbered else None)  # type: ignore[union-attr]
        self._direct = _Direct.of(ids) if numbered else None  # type: ignore[arg-type]
        self.keys = np.zeros(0, dtype=np.uint64)
        if self._direct is not None:
            return  # no hashed keys (nor their row bits): the numbers index a table
        # a key: the id's hash bits above its row number's (`row_bits` of them, `mask`)
        self.row_bits = max(n - 1, 1).bit_length()
        self.mask = np.uint64((1 << self.row_bits) - 1)
        step = 1 << 20
        if numbered:
            keys = np.empty(n, dtype=np.uint64)
            code, num = ids._code, ids._num  # type: ignore[union-attr]
            for a in range(0, n, step):
                keys[a:a + step] = _mix(code[a:a + step], num[a:a + step])
        else:
            keys = np.fromiter(map(hash, ids), dtype=np.int64, count=n).view(np.uint64)
        keys &= ~self.mask
        for a in range(0, n, step):  # the row numbers, a slice at a time (no second array of n)
            keys[a:a + step] |= np.arange(a, min(a + step, n), dtype=np.uint64)
        keys.sort()  # by hash bits, then row: an id's records in record order
        self.keys = keys

    def _spans(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the keys with each of these hash bits (`h`, the row bits zero) lie in `keys`."""
        order = np.argsort(h)  # searched in order: each search starts where the last ended (cache-friendly at 10^7)
        hs = h[order]
        lo, hi = np.empty(len(h), dtype=np.int64), np.empty(len(h), dtype=np.int64)
        lo[order] = np.searchsorted(self.keys, hs, "left")
        hi[order] = np.searchsorted(self.keys, hs | self.mask, "right")
        return lo, hi

    def _found(self, h: np.ndarray, same: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Every (position, row) whose key has the hash `h[position]` and which `same(positions,
        rows)` confirms (a bool array: whether each row's id is that position's key), by
        position, then row. Every row with those hash bits is a candidate (usually one; an id
        recorded more than once, or ids sharing the bits, give more), all confirmed at once."""
        lo, hi = self._spans(h & ~self.mask)
        span = hi - lo
        pos = np.repeat(np.arange(len(h), dtype=np.int64), span)
        # each span's positions in `keys`: lo, lo + 1, ..., hi - 1, every span at once
        at = np.arange(len(pos), dtype=np.int64) + np.repeat(lo - (np.cumsum(span) - span), span)
        rows = (self.keys[at] & self.mask).astype(np.int64)  # within a span ascending (keys: bits, then row)
        keep = same(pos, rows)
        return pos[keep], rows[keep]

    def find(self, keys: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Every (position in `keys`, row) whose request id equals that key, as two arrays,
        by position, then row."""
        if not keys:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self._stems is not None:  # a key is taken apart as a trace id with no affix is
            pos, rows, _ = self.find_affixed(keys, (("", "", 0),))
            order = np.lexsort((rows, pos))
            return pos[order], rows[order]
        ids = self.ids

        def same(pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
            return np.fromiter((i == keys[k] for k, i in zip(pos.tolist(), take_ids(ids, rows))), dtype=bool, count=len(pos))

        return self._found(np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys)).view(np.uint64), same)

    @property
    def numbered(self) -> bool:
        """Whether the ids are a numbered `IdColumn`'s (`find_affixed` then makes no id as text)."""
        return self._stems is not None

    def find_affixed(self, trace_ids: Sequence[Any], affixes: Sequence[tuple[str, str, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every (position in `trace_ids`, row, tag) where the trace id is an affix's prefix,
        the row's request id and its suffix (as a set: in no set order); a trace id that is
        not a str names no row. The runner's trace matching and the judge's both ask this.

        Over a numbered column no id is made as text: a trace id of the length a (affix, stem,
        width) gives that starts with the prefix and the stem and ends with the suffix has its
        number read from its digits (`sliced_numbers`). Over other ids, `IdForms(affixes,
        lengths).invert`, then `find`."""
        stems = self._stems
        if stems is None:
            forms = self._forms.get(tuple(affixes))
            if forms is None:
                if self._lengths is None:
                    ids = self.ids
                    self._lengths = ids.lengths() if isinstance(ids, IdColumn) else set(map(len, ids))
                forms = self._forms[tuple(affixes)] = IdForms(affixes, self._lengths)
            keys, owner, need = forms.invert([t if isinstance(t, str) else None for t in trace_ids])
            pos, rows = self.find(keys)
            return np.asarray(owner, dtype=np.int64)[pos], rows, np.asarray(need, dtype=np.int64)[pos]
        by_len: dict[int, list[int]] = {}
        for j, tid in enumerate(trace_ids):
            if isinstance(tid, str):
                by_len.setdefault(len(tid), []).append(j)
        owner, codes, nums, tags = [], [], [], []
        for pre, suf, tag in affixes:
            ls = len(suf)
            for (stem, w), c in stems.items():
                head = pre + stem
                lh = len(head)
                at = by_len.get(lh + w + ls)
                if not at:
                    continue
                at = [j for j in at if trace_ids[j].startswith(head) and trace_ids[j].endswith(suf)]
                if not at:
                    continue
                some, num = sliced_numbers([trace_ids[j] for j in at], lh, w)
                if some is not None:  # only the trace ids with digits there
                    at = [at[i] for i in some]
                    if not at:
                        continue
                owner.append(np.asarray(at, dtype=np.int64))
                codes.append(np.full(len(at), c, dtype=np.int64))
                nums.append(num)
                tags.append(np.full(len(at), tag, dtype=np.int64))
        if not owner:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        own, code, num, tag = (np.concatenate(x) for x in (owner, codes, nums, tags))
        if self._direct is not None:
            pos, rows = self._direct.found(code, num)
            return own[pos], rows, tag[pos]
        col_code, col_num = self.ids._code, self.ids._num  # type: ignore[union-attr]

        def same(pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
            return (col_code[rows] == code[pos]) & (col_num[rows].astype(np.int64) == num[pos])

        pos, rows = self._found(_mix(code, num), same)
        return own[pos], rows, tag[pos]

    def rows_many(self, keys: Sequence[Any]) -> list[tuple[int, list[int]]]:
        """(position in `keys`, the rows whose id equals that key, ascending) for every key
        some row has, by position."""
        out: list[tuple[int, list[int]]] = []
        for k, r in zip(*(a.tolist() for a in self.find(keys))):
            if out and out[-1][0] == k:
                out[-1][1].append(r)
            else:
                out.append((k, [r]))
        return out

    def first(self, key: Any) -> int | None:
        """The first row with request id `key`, or None."""
        got = self.rows_many([key])
        return got[0][1][0] if got else None

    def first_many(self, keys: Sequence[Any]) -> np.ndarray:
        """The first row with each key as its request id (-1: none), aligned with `keys`."""
        out = np.full(len(keys), -1, dtype=np.int64)
        for k, rows in self.rows_many(keys):
            out[k] = rows[0]
        return out

    def repeated(self) -> list[list[int]]:
        """The rows of every request id recorded more than once, each id's rows ascending, the
        ids in the order their second record comes."""
        if self._direct is not None:
            return self._direct.repeated()
        keys, shift, step = self.keys, np.uint64(self.row_bits), REPEAT_CHUNK
        found = []  # positions whose key shares its hash bits with the next one, a slice at a time
        for a in range(0, max(len(keys) - 1, 0), step):  # (a full-length shifted copy was 8 bytes a request)
            bits = keys[a:a + step + 1] >> shift
            if len(hit := np.flatnonzero(bits[1:] == bits[:-1])):
                found.append(hit + a)
        same = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
        if not len(same):
            return []
        groups: dict[Any, list[int]] = {}
        ids = self.ids
        rows = np.unique(self.keys[np.r_[same, same + 1]] & self.mask)  # every row of shared bits
        for r in rows.tolist():
            groups.setdefault(ids[r], []).append(r)
        return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[1])


class IdForms:
    """Trace ids back to the request ids they may name, for the runner's trace matching and the
    judge's re-matching alike: each affix `(prefix, suffix, tag)` -- an id form's text around
    `{id}`, or (the judge) a server id's around the request id, `tag` saying which -- is
    stripped from a trace id that starts and ends with it, for the request-id `lengths` only
    (a form that would leave a length no request id has names no request: most forms, for
    most traces, are never tried). The stripped ids are then looked up in `IdIndex` (`find`)."""

    def __init__(self, affixes: Iterable[tuple[str, str, int]], lengths: Iterable[int]) -> None:
        self.by_size: dict[int, list[tuple[str, str, int, int, int]]] = {}
        sizes = sorted(set(lengths))
        for pre, suf, tag in affixes:
            for size in sizes:
                self.by_size.setdefault(size + len(pre) + len(suf), []).append((pre, suf, len(pre), len(suf), tag))

    def invert(self, trace_ids: Sequence[str | None]) -> tuple[list[str], list[int], list[int]]:
        """(key, the position in `trace_ids` it came from, the affix's tag) of every affix a
        trace id has (None: no id, nothing), in trace order."""
        keys: list[str] = []
        owner: list[int] = []
        tags: list[int] = []
        by_size = self.by_size
        for j, tid in enumerate(trace_ids):
            if tid is None:
                continue
            size = len(tid)
            for pre, suf, lp, ls, tag in by_size.get(size, ()):
                if tid.startswith(pre) and tid.endswith(suf):
                    keys.append(tid[lp:size - ls])
                    owner.append(j)
                    tags.append(tag)
        return keys, owner, tags
