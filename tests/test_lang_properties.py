"""Property tests of the .soak front end (hypothesis), over trees built from the AST
(`soakspec.lang.strategies`), over arbitrary text and bytes, and over checked-valid specs."""

from __future__ import annotations

import hashlib
import json
import math
import pathlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from soakspec.diagnostics import Severity
from soakspec.lang import check, fmt, parse, parse_file
from soakspec.lang import ast as A
from soakspec.lang.fmt import string as fmt_string
from soakspec.lang.fmt import strip_comments
from soakspec.lang.parser import source_text
from soakspec.lang.strategies import comment_texts, soak_files, strings, valid_specs
from soakspec.plan import _reaches_count, plan, to_json

# Modest budgets: the whole file runs in well under a minute on two cores.
MODEST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOME = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DSV2LITE = (pathlib.Path(__file__).resolve().parents[1] / "specs" / "dsv2lite.soak").read_text()


def _assert_positions_within(text: str, diags) -> None:
    """Every diagnostic points inside the text as it is shown (`source_text`: what positions count in)."""
    lines = source_text(text).split("\n")
    for d in diags:
        assert d.span.line >= 1 and d.span.column >= 1, d
        assert d.span.line <= len(lines), d
        assert d.span.column <= len(lines[d.span.line - 1]) + 1, (d, lines[d.span.line - 1])


# ---------------------------------------------------------------- round trips


@MODEST
@given(soak_files())
def test_parse_inverts_fmt(tree):
    """For every tree: parse(fmt(tree)) == tree, with no diagnostics (spans don't count;
    comments, string styles and number types do)."""
    text = fmt(tree)
    back, diags = parse(text)
    assert diags == []
    assert back == tree


@SOME
@given(soak_files())
def test_fmt_is_idempotent(tree):
    """For every tree: fmt(parse(fmt(tree))) == fmt(tree)."""
    text = fmt(tree)
    back, _ = parse(text)
    assert back is not None
    assert fmt(back) == text


@FEW
@given(soak_files())
def test_spans_point_into_the_text(tree):
    """Every statement the parser returns has a span inside the formatted text, and a block's
    span contains its body's."""
    text = fmt(tree)
    back, _ = parse(text)
    n_lines = text.count("\n") + 1

    def walk(stmts, outer=None):
        for s in stmts:
            assert 1 <= s.span.line <= s.span.end_line <= n_lines
            if outer is not None:
                assert outer.line <= s.span.line and s.span.end_line <= outer.end_line
            if isinstance(s, A.Block):
                walk(s.body, s.span)

    walk(back.body)


@SOME
@given(strings().filter(lambda s: s.style != "raw"), comment_texts())
@example(A.Str('a" # b'), "c")
@example(A.Str('a\n" # b', "long"), "c")
def test_a_name_right_before_a_string_is_not_a_raw_string(label, comment):
    """`r"..." {}` with no space is the block `r` and its label (the lexer reads a name where a
    statement starts), whatever the plain or long label holds: the comment after it is its one trailing
    comment, and no part of the label is read as a comment."""
    text = f"r{fmt_string(label)} {{}}  # {comment}\n"
    tree, diags = parse(text)
    assert diags == []
    assert tree == A.SoakFile((A.Block("r", label, (), trailing=comment),))


# ---------------------------------------------------------------- garbage in, diagnostics out


@MODEST
@given(st.text(max_size=300))
@example("")
@example("\x00")
@example('x = """')
@example("a { b = [1, 2 }")
@example("require")
@example("}}}]]]))")
@example("a {" * 40)
@example('for"a\\"#" {}')
def test_parse_never_raises_on_text(text):
    """Arbitrary text: parse returns (tree, []) or (None, errors), never raises; every
    diagnostic has a 1-based line and column inside the text; a tree it returns round-trips."""
    tree, diags = parse(text)
    _assert_positions_within(text, diags)
    if tree is None:
        assert diags and all(d.severity is Severity.ERROR for d in diags)
    else:
        assert diags == []
        assert parse(fmt(tree))[0] == tree


_PIECES = st.sampled_from(
    ['"', '"""', "r", "{", "}", "[", "]", "(", ")", "=", ",", "#", "\n", " ", "\\", "@", ";", "-", "5s", "1", "x",
     "require", "per", "on", "true", "é", "\t", "\r"]
)  # fmt: skip


@SOME
@given(soak_files(), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3), _PIECES), max_size=4))
def test_parse_never_raises_on_mutated_specs(tree, edits):
    """Valid text with a few characters deleted or tokens inserted: parse never raises,
    positions lie inside the text, and if it still parses, fmt round-trips the result."""
    text = fmt(tree)
    for pos, delete, piece in edits:
        pos = pos % (len(text) + 1)
        text = text[:pos] + piece + text[pos + delete :]
    result, diags = parse(text)
    _assert_positions_within(text, diags)
    if result is not None:
        assert parse(fmt(result))[0] == result


@FEW
@given(st.integers(0, len(DSV2LITE) - 1), st.integers(1, 3), _PIECES)
def test_parse_never_raises_on_mutated_dsv2lite(pos, delete, piece):
    """The same, on the committed spec, and `check` never raises on what parses."""
    text = DSV2LITE[:pos] + piece + DSV2LITE[pos + delete :]
    tree, diags = parse(text)
    _assert_positions_within(text, diags)
    if tree is not None:
        _, more = check(tree)
        _assert_positions_within(text, [d for d in more if d.span.known])


@pytest.fixture(scope="module")
def bytes_file(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("bytes") / "fuzz.soak"


@SOME
@given(st.binary(max_size=300))
@example(b"soak \xff {}")
@example(b"\xef\xbb\xbfsoak \"x\" {}")
@example(b'x = "\xed\xa0\x80"')
@example(b"\r")
@example(b'soak "x" {}\rbackend "a" {\r  bogus = 1\r}\r')
def test_parse_file_never_raises_on_bytes(bytes_file, data):
    """Arbitrary bytes in a file: parse_file never raises; undecodable input is one E003 at
    the line and column of the first bad byte; decodable input behaves as parse of the text (the text
    returned is what positions count in, `source_text`: a leading BOM is not part of it, CRLF
    is LF, and so is the CR of a file without LF)."""
    bytes_file.write_bytes(data)
    tree, diags, text = parse_file(bytes_file)
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as e:
        assert tree is None and [d.code for d in diags] == ["E003"]
        line_start = data.rfind(b"\n", 0, e.start) + 1
        col = len(data[line_start : e.start].decode("utf-8", "replace")) + 1
        assert (diags[0].span.line, diags[0].span.column) == (data[: e.start].count(b"\n") + 1, col)
        return
    assert text == source_text(decoded)
    _assert_positions_within(text, diags)
    assert (tree, diags) == parse(decoded, str(bytes_file))


@SOME
@given(st.binary(max_size=300))
def test_parse_never_raises_on_decoded_bytes(data):
    """Random bytes decoded leniently (replacement characters, latin-1): parse never raises."""
    for text in (data.decode("utf-8", "replace"), data.decode("latin-1")):
        tree, diags = parse(text)
        _assert_positions_within(text, diags)


# ---------------------------------------------------------------- checked-valid specs


@MODEST
@given(valid_specs())
def test_valid_specs_check_and_plan_consistently(generated):
    """For every generated valid spec: check accepts it (no errors), the text is canonical
    (fmt gives it back), the spec's canonical text is it without comments, and plan has backends × Σ(levels × ceil(duration / bucket)) buckets,
    each level's buckets tile its duration, and the JSON agrees with the plan."""
    text, shape = generated
    tree, diags = parse(text)
    assert diags == [] and tree is not None
    spec, diags = check(tree)
    assert spec is not None, [f"{d.span.line}:{d.span.column} {d.code} {d.message}" for d in diags]
    assert not [d for d in diags if d.severity is Severity.ERROR]
    assert fmt(tree) == text
    assert spec.canonical_text == fmt(strip_comments(tree))
    assert spec.sha256 == hashlib.sha256(spec.canonical_text.encode()).hexdigest()
    assert [b.name for b in spec.backends] == list(shape.backends)
    assert tuple(b.kind for b in spec.backends) == shape.backend_kinds

    p = plan(spec)
    assert p.bucket_count == shape.bucket_count
    assert len(p.backends) == len(shape.backends)
    for bp in p.backends:
        assert len(bp.levels) == sum(levels for levels, *_ in shape.workloads)
        for lv in bp.levels:
            if lv.mode == "open":  # what the schedule sends, planned, not a promise of the server
                # constant arrival sends at i / rate from the level's start, warmup included: the measured
                # ones have warmup <= i / rate < warmup + duration; poisson expects rate × duration
                held = lv.rate * lv.warmup_s
                want = (math.ceil(held + lv.rate * lv.duration_s - 1e-9) - math.ceil(held - 1e-9)
                        if lv.shape.arrival == "constant" else round(lv.rate * lv.duration_s))
                n = lv.requests_per_level  # a count-bounded level: at most its count -- or its min_duration's arrivals
                d = lv.min_duration_s
                least = 0 if d is None else (math.ceil(held + lv.rate * d - 1e-9) - math.ceil(held - 1e-9)
                                             if lv.shape.arrival == "constant" else round(lv.rate * d))
                assert lv.expected_requests == (want if n is None else min(want, max(n, least)))
                # a seeded Poisson/gamma process may send fewer: no minimum is promised -- unless the plan
                # expects it to reach its count, which it then sends whatever its arrivals
                floor = min(want if lv.shape.arrival == "constant" else 0,
                            math.inf if n is None else max(n, least) if lv.shape.arrival == "constant" else n)
                assert lv.min_requests == (max(n, floor) if n is not None and _reaches_count(lv) else floor)
            else:  # one request per worker (at most its count; its count where the plan expects it reached), or one batch
                want = lv.batch_requests if lv.mode == "batch" else lv.concurrency
                n = lv.requests_per_level
                assert lv.min_requests == (n if n is not None and _reaches_count(lv) else min(want, n or want)) >= 1
            assert lv.buckets[0].start_s == 0
            assert math.isclose(sum(b.length_s for b in lv.buckets), lv.duration_s, rel_tol=1e-9)
            assert all(b.length_s > 0 for b in lv.buckets)
            assert [b.index for b in lv.buckets] == list(range(len(lv.buckets)))
            if lv.expected_requests is not None:
                assert lv.expected_requests >= lv.min_requests
        assert bp.max_wall_s >= bp.est_wall_s >= sum(lv.duration_s for lv in bp.levels)
    walls = [bp.est_wall_s for bp in p.backends]
    assert p.est_wall_s == (max(walls) if shape.parallel else sum(walls))
    doc = json.loads(json.dumps(to_json(p)))
    assert doc["bucket_count"] == shape.bucket_count
    assert doc["min_requests"] == sum(bp.min_requests for bp in p.backends)
    assert doc["est_wall_s"] == round(p.est_wall_s, 3)


@FEW
@given(valid_specs(), st.sampled_from([1.0, 0.5, 0.1, 0.01]))
def test_time_scale_keeps_the_shape(generated, scale):
    """Scaling time (rehearsals) shrinks durations by the factor and keeps every bucket; an open
    loop's counted warmup (`warmup = N requests`) is N arrivals at its rate, which no time scale
    shrinks -- served at the pace of a `max_concurrency` that cannot keep up, ceil(N / C) rounds
    of the (scaled) expected_latency, where that is longer: between N / rate and its unscaled
    estimate, a cap that binds at full scale perhaps not in the rehearsal -- so the rest of each
    backend's estimate is what scales."""
    text, shape = generated
    spec, _ = check(parse(text)[0])
    full, scaled = plan(spec), plan(spec, time_scale=scale, rehearse=True)
    assert scaled.bucket_count == full.bucket_count == shape.bucket_count

    def counted(b):
        return [lv for lv in b.levels if lv.warmup_requests is not None and lv.mode == "open"]

    for fb, sb in zip(full.backends, scaled.backends):
        for fl, sl in zip(counted(fb), counted(sb)):
            arrivals = fl.warmup_requests / fl.rate
            assert arrivals - 1e-9 <= sl.expected_warmup_s <= fl.expected_warmup_s + 1e-9
        fixed_full, fixed_scaled = (sum(lv.expected_warmup_s for lv in counted(b)) for b in (fb, sb))
        assert math.isclose(sb.est_wall_s - fixed_scaled, (fb.est_wall_s - fixed_full) * scale, rel_tol=1e-9, abs_tol=1e-9)
    if not any(lv.warmup_requests is not None and lv.mode == "open" for b in full.backends for lv in b.levels):
        assert math.isclose(scaled.est_wall_s, full.est_wall_s * scale, rel_tol=1e-9)


# ---------------------------------------------------------------- numbers past any real use

# Each number a test draws is an everyday one, or -- for the one or two keys drawn "wild" -- any
# whole number up to a pasted 30 digits, or one at a bound (and one past it).
_WILD = st.one_of(st.integers(0, 10**30), st.sampled_from([0, 10**6, 10**6 + 1, 10**7, 10**7 + 1, 10**9, 10**9 + 1, 2**63 - 1, 2**63]))
_WILD_REAL = st.one_of(st.floats(1e-3, 1e30), st.sampled_from([1e6, 1e6 + 1, 30 * 86400, 30 * 86400 + 1]))
_KEYS = ("prompt_n", "max_tokens", "levels", "requests", "rate", "duration", "seed", "top_k", "min_samples", "slots", "gpu")


@SOME
@given(st.sampled_from(["closed", "batch", "open"]), st.sampled_from(["prompt_words", "prompt_tokens"]),
       st.sets(st.sampled_from(_KEYS), min_size=1, max_size=2), st.data())  # fmt: skip
def test_a_spec_that_checks_has_a_bounded_plan(mode, prompt, wild, data):
    """Any number in the numeric keys: `check` answers with diagnostics, never a traceback,
    and what it passes plans to something `run` can hold -- each request's prompt and output
    within the language's token bound, a bounded number of requests and seconds."""
    from soakspec.lang.check.workload import MAX_BATCH_REQUESTS, MAX_LOAD_LEVEL, MAX_PROMPT_WORDS, MAX_TOKENS, MAX_TOTAL_LOAD_S
    from soakspec.plan import render_text

    def n(key: str, low: int = 1, high: int = 64) -> int:
        return data.draw(_WILD if key in wild else st.integers(low, high), label=key)

    def x(key: str, low: float, high: float) -> str:
        return f"{data.draw(_WILD_REAL if key in wild else st.floats(low, high), label=key):.6g}".replace("e+", "e")

    levels = ", ".join(str(n("levels")) for _ in range(data.draw(st.integers(1, 3))))
    load = {"closed": f"concurrency = [{levels}]",
            "batch": f"mode = batch\n    concurrency = [{levels}]\n    requests = {n('requests')}",
            "open": f"mode = open\n    rate = {x('rate', 0.1, 100)}rps\n    seed = {n('seed', 0)}"}[mode]  # fmt: skip
    text = (f'soak "x" {{}}\nbackend "a" {{\n  gpus = [{n("gpu", 0, 7)}]\n  sim {{\n    slots = {n("slots")}\n  }}\n}}\n'
            f'workload "w" {{\n  {prompt} = {n("prompt_n", 8)}\n  max_tokens = [{n("max_tokens")}, {n("max_tokens")}]\n'
            f'  load {{\n    {load}\n  }}\n  duration = {x("duration", 1, 600)}s\n  sampling {{\n    top_k = {n("top_k")}\n  }}\n}}\n'
            f'gate {{\n  min_samples = {n("min_samples")}\n}}\n')  # fmt: skip
    tree, diags = parse(text)
    assert tree is not None, (text, diags)
    spec, diags = check(tree)
    if spec is None:
        assert any(d.severity is Severity.ERROR for d in diags)
        _assert_positions_within(text, diags)
        return
    w = spec.workloads[0]
    assert (w.prompt_words or 0) <= MAX_PROMPT_WORDS and max(w.prompt_tokens, default=0) <= MAX_TOKENS
    assert max(w.max_tokens) <= MAX_TOKENS and max(w.load.levels, default=0) <= MAX_LOAD_LEVEL
    assert (w.load.requests or 0) <= MAX_BATCH_REQUESTS
    p = plan(spec)
    json.dumps(to_json(p))
    render_text(p)
    assert math.isfinite(p.est_wall_s) and p.est_wall_s <= 31 * 86400
    # what the language bounds: its highest rate for its longest load (385,803 rps for 30 days is
    # a valid spec of 1.0e12 requests, so a round 10**12 was not the language's bound)
    most = MAX_LOAD_LEVEL * MAX_TOTAL_LOAD_S + 3  # a level's count rounds up: at most 3 levels here
    for b in p.backends:
        assert b.min_requests <= most and (b.expected_requests or 0) <= most
