"""The judge's chunked trace matching (`tracematch.match_rows`: a sorted hash index instead of a
map of every request id, a chunk of traces looked up and window-checked at once, id forms
tried only for trace ids of a plausible length) keeps, row by row, exactly what matching one
trace at a time against every request keeps: the same payloads in the same order, the same
reason for each id a trace named without matching, the same claims found wrong."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings, strategies as st

from soakspec.judge import tracematch
from soakspec.judge.table import build_table
from soakspec.evidence.ids import IdIndex
from soakspec.judge.tracematch import kept_payload, match_table
from soakspec.evidence.traces import Trace

FORMS = st.lists(st.sampled_from(["{id}", "cmpl-{id}", "{id}-0", "cmpl-{id}-0", "chatcmpl-{id}", "x{id}x"]),
                 min_size=1, max_size=4, unique=True)


def reference(reqs, traces, forms, window):
    """One trace at a time, every request tried: row -> kept payloads, id -> why unmatched."""
    affixes = [f.split("{id}") for f in dict.fromkeys(forms)]
    kept: dict[int, list] = {}
    why: dict[str, str] = {}
    shared: dict = {}

    def window_of(r):  # a time beyond 2100 (in ns) is no time: an end like that is the start
        s, e = r.get("start"), r.get("end")
        if s is None or abs(s) > 4_102_444_800.0 * 1e9:
            return None
        return s - window, (e if e is not None and abs(e) <= 4_102_444_800.0 * 1e9 else s) + window

    for tr in traces:
        tid = tr.trace_id
        if tid is None:
            continue
        cands = [i for i, r in enumerate(reqs)
                 if any(tid == pre + r["request_id"] + suf for pre, suf in affixes)
                 or (r.get("server_id") and str(r["server_id"]) == tid)]
        chosen = next((i for i in cands if not tr.times or ((w := window_of(reqs[i])) is not None
                                                            and all(w[0] <= t <= w[1] for t in tr.times))), None)
        if chosen is None:
            if cands:
                why[reqs[cands[0]]["request_id"]] = "outside_window"
            continue
        kept.setdefault(chosen, []).append(kept_payload(tr.payload, shared))
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        groups.setdefault(r["request_id"], []).append(i)
    for rows in sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[1]):
        got = [p for i in rows for p in kept.get(i, [])]
        for i in rows:
            if got:
                kept[i] = list(got)
    return kept, why


@st.composite
def cases(draw):
    n = draw(st.integers(1, 25))
    ids = [draw(st.sampled_from(["r", "req-", "cmpl-r", "r-0", "x"])) + str(draw(st.integers(0, n))) for _ in range(n)]
    reqs = []
    for k, rid in enumerate(ids):
        start = 100.0 + k
        reqs.append({"request_id": rid, "bucket": 0, "start": draw(st.sampled_from([start, None, 1e30])),
                     "end": draw(st.sampled_from([start + 1.0, None, start - 5.0, 1e30])),
                     "server_id": draw(st.sampled_from([None, "", f"srv-{k}", f"srv-{k % 3}", f"cmpl-{rid}-0",
                                                        f"chatcmpl-{rid}", f"{rid}-x", 7]))})
    forms = draw(FORMS)
    traces = []
    for _ in range(draw(st.integers(0, 40))):
        rid = draw(st.sampled_from(ids + ["nobody", "r"]))
        tid = draw(st.sampled_from([None, "7", f"srv-{draw(st.integers(0, n))}", *[f.format(id=rid) for f in forms],
                                    f"cmpl-{rid}-0", f"chatcmpl-{rid}", rid + "-x", ""]))
        times = tuple(draw(st.lists(st.floats(95.0, 140.0), max_size=3)))
        payload = draw(st.sampled_from([None, {"terminal_reason": "length"}, {"status": 500, "x": 1}, {},
                                        {"status": True}, {"status": 1}, {"finish_reason": ["unhashable"]}]))
        traces.append(Trace(tid, times, payload, None, "t"))
    return reqs, forms, traces, draw(st.sampled_from([0.0, 0.5, 2.0])), draw(st.sampled_from([1, 3, 4096]))


@settings(max_examples=400, deadline=None)
@given(cases())
def test_chunked_matching_keeps_what_one_at_a_time_keeps(case):
    reqs, forms, traces, window, chunk = case
    want_kept, want_why = reference(reqs, traces, forms, window)
    saved = tracematch.MATCH_CHUNK
    tracematch.MATCH_CHUNK = chunk  # chunk edges anywhere: order across chunks is kept
    try:
        got = match_table(build_table(reqs), iter(traces), forms, window)
    finally:
        tracematch.MATCH_CHUNK = saved
    assert got.kept == want_kept
    assert got.unmatched_reason == want_why
    assert got.traces == len(traces)


class Colliding(str):
    """An id whose hash every other one shares: the index must tell them apart by value."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other)


def test_ids_that_share_a_hash_stay_apart():
    ids = [Colliding(x) for x in ["a", "b", "a", "c", "b", "a"]]
    index = IdIndex(ids)
    assert index.rows_many([Colliding("a"), Colliding("z"), Colliding("b")]) == [(0, [0, 2, 5]), (2, [1, 4])]
    assert index.first(Colliding("c")) == 3 and index.first(Colliding("z")) is None
    assert index.repeated() == [[0, 2, 5], [1, 4]]  # by where each id's second record comes (2, then 4)
    assert index.first_many([Colliding("b"), Colliding("q")]).tolist() == [1, -1]


def test_a_lookup_finds_every_record_of_an_id_and_only_those():
    ids = [f"r{i % 7}" for i in range(50)]
    index = IdIndex(ids)
    for key in ["r0", "r6", "r7", "", "r"]:
        want = [i for i, x in enumerate(ids) if x == key]
        got = dict(index.rows_many([key]))
        assert got.get(0, []) == want


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "g"]), max_size=40), step=st.integers(1, 9))
def test_ids_recorded_twice_are_found_whatever_the_step(ids, step):
    """`IdIndex.repeated` compares its sorted keys REPEAT_CHUNK at a time: at any step it gives
    every id recorded more than once, each id's rows ascending, in the order of its second record."""
    import unittest.mock

    rows: dict[str, list[int]] = {}
    for r, rid in enumerate(ids):
        rows.setdefault(rid, []).append(r)
    want = sorted((g for g in rows.values() if len(g) > 1), key=lambda g: g[1])
    from soakspec.evidence import ids as ids_module

    with unittest.mock.patch.object(ids_module, "REPEAT_CHUNK", step):
        assert IdIndex(ids).repeated() == want


def test_more_than_255_kept_payloads_each_stay_with_its_request():
    """Match codes are a byte a request until the 256th distinct kept payload, then widen: each
    request keeps its own trace's payload either way, in one chunk or one trace at a time."""
    reqs = [{"request_id": f"r{k}", "bucket": 0, "start": 100.0, "end": 200.0} for k in range(300)]
    traces = [Trace(f"r{k}", (150.0,), {"terminal_reason": f"reason-{k}"}, None, "t") for k in range(300)]
    want = {k: [{"terminal_reason": f"reason-{k}"}] for k in range(300)}
    for chunk in (4096, 1):
        saved = tracematch.MATCH_CHUNK
        tracematch.MATCH_CHUNK = chunk
        try:
            got = match_table(build_table(reqs), iter(traces), ["{id}"], 0.0)
        finally:
            tracematch.MATCH_CHUNK = saved
        assert got.codes.dtype.itemsize == 4 and got.kept == want


@settings(max_examples=200, deadline=None)
@given(affixes=st.lists(st.tuples(st.sampled_from(["", "c", "cmpl-", "cc"]), st.sampled_from(["", "-0", "0", "x"]),
                                  st.integers(-1, 3)), max_size=4),
       lengths=st.sets(st.integers(0, 6), max_size=4),
       trace_ids=st.lists(st.one_of(st.none(), st.text("c-0x1m", max_size=10)), max_size=20))
def test_id_forms_strip_every_affix_a_trace_id_has_for_a_length_some_id_has(affixes, lengths, trace_ids):
    """`IdForms.invert` (shared by the runner's matching and the judge's) gives, in trace order,
    every (key, trace, tag) with trace id == prefix + key + suffix and len(key) a request id's
    length -- as trying every affix on every trace id does."""
    from soakspec.evidence.ids import IdForms

    want = [(tid[len(p):len(tid) - len(s)], j, tag) for j, tid in enumerate(trace_ids) if tid is not None
            for p, s, tag in affixes
            if len(tid) - len(p) - len(s) in lengths and tid.startswith(p) and tid.endswith(s)]
    keys, owner, tags = IdForms(affixes, lengths).invert(trace_ids)
    assert sorted(zip(keys, owner, tags)) == sorted(want) and owner == sorted(owner)


# The runner's ids (a stem and a number) are indexed by their (stem code, number) pairs, never
# made into text: the index must answer exactly as it does over the same ids as plain strings.
_STEMS = ["soak-5ca1ab1e-0-", "soak-5ca1ab1e-1-", "x", "", "r-"]
_ID = st.builds(lambda stem, digits: stem + digits, st.sampled_from(_STEMS), st.text("0123456789", min_size=1, max_size=4))
_ODD_KEYS = st.sampled_from(["", "x", "x0", "x00", "x000000", "soak-5ca1ab1e-0-", "y1", "x1\n", "x\u0661", "x1 ",
                             "x" + "1" * 19, "soak-5ca1ab1e-2-0001", None, 7])


def _numbered(ids: list[str]):
    from soakspec.evidence.ids import IdStore

    store = IdStore()
    for a in range(0, len(ids), 5):  # a block at a time, as the table takes them
        store.extend(ids[a:a + 5])
    col = store.finish()
    assert col._off is None and list(col) == ids  # held numbered, and the same ids
    return col


_HOW = st.sampled_from(["hashed", "collide", "direct"])  # how a numbered column is indexed (forced)


def _forced(how: str):
    """The numbered index forced to its hashed keys (every pair hashed alike for `collide`) or
    to its direct table (`_Direct`, whatever the numbers' spread)."""
    import contextlib
    import unittest.mock

    from soakspec.evidence import ids as ids_module

    stack = contextlib.ExitStack()
    stack.enter_context(unittest.mock.patch.object(ids_module, "DIRECT_SLOTS_PER_ID", 10**6 if how == "direct" else 0))
    if how == "collide":
        stack.enter_context(unittest.mock.patch.object(ids_module, "_mix", lambda c, n: np.zeros(len(c), dtype=np.uint64)))
    return stack


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(_ID, min_size=1, max_size=40), extra=st.lists(st.one_of(_ID, _ODD_KEYS), max_size=8), how=_HOW)
def test_numbered_ids_are_found_as_their_text_is(ids, extra, how):
    """Every lookup over a numbered column -- ids recorded once or more, keys that are another
    width of the same number (`x01` / `x1`), a stem the column lacks, a non-ASCII digit, too
    many digits, not a str -- gives what the same ids as a list of str give; by hashed keys,
    with every pair hashed alike too (equal hash bits are told apart by the pairs), and by the
    direct table of (stem, number) slots."""
    keys = [*ids[::3], *extra]
    with _forced(how):
        index = IdIndex(_numbered(ids))
        assert (index._direct is not None) == (how == "direct")
        want = IdIndex(list(ids))
        assert [tuple(a.tolist()) for a in index.find(keys)] == [tuple(a.tolist()) for a in want.find(keys)]
        assert index.rows_many(keys) == want.rows_many(keys)
        assert index.first_many(keys).tolist() == want.first_many(keys).tolist()
        assert index.repeated() == want.repeated()
        for k in keys:  # and by a plain scan
            assert dict(index.rows_many([k])).get(0, []) == [i for i, x in enumerate(ids) if x == k]


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(_ID, min_size=1, max_size=30),
       affixes=st.lists(st.tuples(st.sampled_from(["", "cmpl-", "c", "soak-"]), st.sampled_from(["", "-0", "0", "x"]),
                                  st.integers(-1, 3)), min_size=1, max_size=4),
       traces=st.lists(st.one_of(
           st.tuples(st.sampled_from(["", "cmpl-", "c", "soak-", "q"]), _ID, st.sampled_from(["", "-0", "0", "x", "-1"])).map("".join),
           _ODD_KEYS.filter(lambda k: k is None or isinstance(k, str)), st.text(max_size=12)), max_size=30))
@example(ids=["r-20", "r-1"], affixes=[("", "", -1)], traces=["r-1:", "r-20", "r-\u0661"])  # ":" is "9" + 1 as a byte
def test_trace_ids_taken_apart_find_what_inverting_them_finds(ids, affixes, traces):
    """`IdIndex.find_affixed` (the runner's ids: a trace id read as prefix, stem, digits,
    suffix) finds the same (trace, row, tag) triples as stripping each affix off the trace id
    (`IdForms.invert`) and looking the rest up (`find`) -- affixes that overlap a stem or its
    digits (`c` before `cmpl-`, `0` after a number), trace ids of another width, a letter
    where a digit belongs, no id at all; by hashed keys and by the direct table."""
    for how in ("hashed", "direct"):
        with _forced(how):
            _taken_apart_find_what_inverting_finds(ids, affixes, traces)


def _taken_apart_find_what_inverting_finds(ids, affixes, traces):
    from soakspec.evidence.ids import IdForms

    col = _numbered(ids)
    index = IdIndex(col)
    keys, owner, tags = IdForms(affixes, col.lengths()).invert(traces)
    pos, rows = index.find(keys)
    want = sorted(zip(np.asarray(owner, dtype=np.int64)[pos].tolist(), rows.tolist(), np.asarray(tags, dtype=np.int64)[pos].tolist()))
    got = sorted(zip(*(a.tolist() for a in index.find_affixed(traces, affixes))))
    assert got == want
