"""Hypothesis strategies for the .soak language, built from the AST (`soakspec.lang.ast`).

Two families:

* `soak_files()` -- any tree the grammar can express: blocks, attributes, rules, claims,
  values of every kind (plain, raw and long strings, negative and float numbers, quantities
  in every known unit, nested lists) and comments in every position (leading, trailing,
  closing, end of file). `fmt` renders it; the round-trip tests parse it back.
* `valid_specs()` -- small specs that `check` accepts (a header, 1-3 backends that launch,
  connect to a URL or use the simulator, 1-2 workloads in any load mode, rules over real
  metrics, claims), with the shape `plan` must produce.

This module imports hypothesis, which is a test dependency: nothing in the package imports
it; only tests do (like zarr's `zarr.testing.strategies`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from fractions import Fraction
from pathlib import Path

from hypothesis import strategies as st

from soakspec.lang import ast as A
from soakspec.lang.fmt import fmt
from soakspec.lang.parser import parse  # rules are easiest written as text
from soakspec.units import UNITS

__all__ = [
    "KEYWORDS",
    "SpecShape",
    "comment_texts",
    "names",
    "quantities",
    "soak_files",
    "statements",
    "strings",
    "valid_specs",
    "values",
]

# Words the lexer reads as keywords (`true`, `per`, ...) or as the start of one (`warn.x`).
KEYWORDS = ("require", "warn", "claim", "exclude", "per", "on", "true", "false")
_KEYWORD_START = re.compile(r"(require|warn|claim|exclude)\b")
_NAME_START = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
_NAME_REST = _NAME_START + "0123456789.-"


def _is_name(s: str) -> bool:
    return s not in KEYWORDS and not _KEYWORD_START.match(s)


@functools.cache
def names() -> st.SearchStrategy[str]:
    """NAME tokens (`[A-Za-z_][A-Za-z0-9_.-]*`) that the lexer will not read as keywords."""
    short = st.sampled_from(["a", "x", "r", "env", "load", "gpus", "ttft", "req", "requires", "perk", "only", "truth", "_"])
    built = st.builds(
        lambda a, b: a + b,
        st.sampled_from(_NAME_START),
        st.text(alphabet=_NAME_REST, max_size=8),
    )
    return st.one_of(short, built).filter(_is_name)


@functools.cache
def comment_texts() -> st.SearchStrategy[str]:
    """What follows '# ': one line, no trailing blanks (the parser strips them), may be empty
    or start with more spaces, and may contain quotes, tabs and '#'."""
    alphabet = st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="\x85", whitelist_characters="\t")
    return st.text(alphabet=alphabet, max_size=20).map(str.rstrip)


def _text(max_size: int = 12) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=max_size),
        st.text(alphabet='ab #{}[]"\\\n\t/r', max_size=max_size),
    )


@functools.cache
def strings() -> st.SearchStrategy[A.Str]:
    plain = st.builds(A.Str, _text(), st.just("plain"))
    long = st.builds(A.Str, _text(), st.just("long"))
    # A raw string cannot hold '"', a newline or NUL (the parser rejects NUL anywhere).
    raw = st.builds(A.Str, st.text(alphabet=st.characters(blacklist_characters='"\n\x00', blacklist_categories=("Cs",)), max_size=12), st.just("raw"))
    return st.one_of(plain, raw, long)


def _numbers() -> st.SearchStrategy[int | float]:
    return st.one_of(
        st.integers(min_value=-(10**12), max_value=10**12),
        st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12),
        st.sampled_from([0, -1, 1.5, -0.25, 1e-05, 2.5e-07, 1e16]),
    )


def quantities(units: tuple[str, ...] | None = None) -> st.SearchStrategy[A.Quantity]:
    return st.builds(A.Quantity, _numbers(), st.sampled_from(units or tuple(UNITS)))


@functools.cache
def _scalars() -> st.SearchStrategy[A.Value]:
    return st.one_of(
        strings(),
        st.builds(A.Num, _numbers()),
        quantities(),
        quantities(A.COUNT_UNITS),  # `20 requests`: a count, its word after a space
        st.builds(A.Bool, st.booleans()),
        st.builds(A.Word, names()),
    )


@functools.cache
def values() -> st.SearchStrategy[A.Value]:
    return st.recursive(
        _scalars(),
        lambda inner: st.builds(A.List, st.lists(inner, max_size=4).map(tuple)),
        max_leaves=6,
    )


@functools.cache
def _exprs() -> st.SearchStrategy[A.Expr]:
    return st.recursive(
        st.builds(A.MetricRef, names()) | st.builds(A.NamedRef, names(), _text()),  # server("...")
        lambda inner: st.builds(A.Call, names(), inner)
        | st.builds(A.MultiCall, names(), st.lists(inner, min_size=2, max_size=3).map(tuple)),  # ratio(a, b)
        max_leaves=3,
    )


@functools.cache
def _leading() -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(comment_texts(), max_size=2).map(tuple)


@functools.cache
def _trailing() -> st.SearchStrategy[str | None]:
    return st.none() | comment_texts()


@st.composite
def _rules(draw) -> A.Rule:
    compare = draw(st.booleans())
    scope = draw(st.none() | st.builds(A.Scope, names(), st.none() | quantities()))
    return A.Rule(
        severity=draw(st.sampled_from(["require", "warn"])),
        expr=draw(_exprs()),
        op=draw(st.sampled_from(["<=", ">=", "==", "!=", "<", ">"])) if compare else None,
        threshold=draw(values()) if compare else None,
        scope=scope,
        target=draw(st.none() | strings()),
        comments=draw(_leading()),
        trailing=draw(_trailing()),
    )


@functools.cache
def _attributes() -> st.SearchStrategy[A.Attribute]:
    return st.builds(A.Attribute, key=names(), value=values(), comments=_leading(), trailing=_trailing())


@functools.cache
def _claims() -> st.SearchStrategy[A.Claim]:
    return st.builds(A.Claim, st.sampled_from(["claim", "exclude"]), strings(), comments=_leading(), trailing=_trailing())


@functools.cache
def statements(max_depth: int = 3) -> st.SearchStrategy[A.Statement]:
    """Any statement; blocks nest at most `max_depth` deep."""
    leaf = st.one_of(_attributes(), _rules(), _claims())
    if max_depth <= 0:
        return leaf
    block = st.builds(
        A.Block,
        kind=names(),
        label=st.none() | strings(),
        body=st.lists(statements(max_depth - 1), max_size=3).map(tuple),
        comments=_leading(),
        trailing=_trailing(),
        closing_comments=_leading(),
    )
    return st.one_of(leaf, block)


@functools.cache
def soak_files() -> st.SearchStrategy[A.SoakFile]:
    return st.builds(
        A.SoakFile,
        st.lists(statements(), max_size=5).map(tuple),
        closing_comments=_leading(),
    )


# ---------------------------------------------------------------- checked-valid specs


@dataclasses.dataclass(frozen=True)
class SpecShape:
    """What a generated valid spec declares, in exact arithmetic, for `plan` to match."""

    backends: tuple[str, ...]
    backend_kinds: tuple[str, ...]
    # per workload: (levels, duration in seconds, bucket in seconds, warmup in seconds: 0 for a count)
    workloads: tuple[tuple[int, Fraction, Fraction, Fraction], ...]
    parallel: bool

    @property
    def buckets_per_backend(self) -> int:
        return sum(levels * math.ceil(d / b) for levels, d, b, _ in self.workloads)

    @property
    def bucket_count(self) -> int:
        return len(self.backends) * self.buckets_per_backend


_SECONDS = {"ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60), "h": Fraction(3600)}


@st.composite
def _duration(draw, lo_s: Fraction = Fraction(1), hi_s: Fraction = Fraction(7200)) -> tuple[A.Quantity, Fraction]:
    unit = draw(st.sampled_from(sorted(_SECONDS)))
    lo = math.ceil(lo_s / _SECONDS[unit])
    hi = math.floor(hi_s / _SECONDS[unit])
    if lo > hi:  # e.g. hours for a short duration: fall back to seconds
        unit, lo, hi = "s", math.ceil(lo_s), max(math.ceil(lo_s), math.floor(hi_s))
    n = draw(st.integers(lo, hi))
    return A.Quantity(n, unit), n * _SECONDS[unit]


def _attr(key: str, value: A.Value, **kw) -> A.Attribute:
    return A.Attribute(key, value, **kw)


def _s(text: str) -> A.Str:
    return A.Str(text)


def _block(kind: str, label: str | None, *body: A.Statement, **kw) -> A.Block:
    return A.Block(kind, _s(label) if label is not None else None, tuple(body), **kw)


_SPECIFIC_RUNTIMES = ("vllm 0.6.3, tp=2", "NCCL 2.26.2, NCCL_IB_DISABLE=1", "host-staged", "sglang 0.4 (dp attention)")


@st.composite
def _backend(draw, name: str, kind: str) -> tuple[A.Block, bool]:
    """A backend block, and whether it has traces (a rule over trace coverage needs them)."""
    body: list[A.Statement] = []
    traced = kind == "sim"  # the simulator's traces are on by default
    if kind == "launch":
        argv = ["./server", "--host", "{host}", "--port", "{port}"] + draw(
            st.lists(st.sampled_from(["--model", "{model_path}", "--tp", "2", "--name", "{backend}"]), max_size=3)
        )
        body.append(_attr("launch", A.List(tuple(_s(a) for a in argv))))
        if draw(st.booleans()):
            body.append(_block("env", None, _attr("RUST_LOG", _s("info")), _attr("NCCL_IB_DISABLE", _s("1"))))
        if draw(st.booleans()):
            body.append(_block("ready", None, _attr("path", _s("/v1/models")), _attr("timeout", draw(_duration())[0])))
        if draw(st.booleans()):
            body.append(_attr("shutdown_grace", draw(_duration(hi_s=Fraction(300)))[0]))
        if draw(st.booleans()):
            body.append(_attr("gpus", A.List(tuple(A.Num(i) for i in range(draw(st.integers(1, 4)))))))
        if draw(st.booleans()):
            body.append(
                _block(
                    "traces",
                    None,
                    _attr("source", A.Word("log")),
                    _attr("pattern", A.Str(r"trace (?P<json>\{.*\})", "raw")),
                )
            )
            traced = True
    elif kind == "url":
        port = draw(st.integers(1024, 65535))
        body.append(_attr("url", _s(f"http://127.0.0.1:{port}")))
        if draw(st.booleans()):
            body.append(_block("traces", None, _attr("source", A.Word("jsonl")), _attr("file", _s("traces.jsonl"))))
            traced = True
    else:
        opts = draw(
            st.lists(
                st.sampled_from(
                    [
                        _attr("ttft", A.Quantity(50, "ms")),
                        _attr("itl", A.Quantity(5, "ms")),
                        _attr("error_rate", A.Quantity(1, "%")),
                        _attr("slots", A.Num(8)),
                        _attr("memory_base", A.Quantity(2, "GiB")),
                    ]
                ),
                unique_by=lambda a: a.key,
                max_size=3,
            )
        )
        body.append(_block("sim", None, *opts))
    if draw(st.booleans()):
        body.append(_block("runtime", None, _attr("label", _s(draw(st.sampled_from(_SPECIFIC_RUNTIMES))))))
    comments = draw(st.lists(st.sampled_from(["a backend", ""]), max_size=1).map(tuple))
    return _block("backend", name, *draw(st.permutations(body)), comments=comments), traced


# the repository's example prompt files (a source checkout: tests run there), read by `check`
_PROMPTS = Path(__file__).resolve().parents[2] / "examples" / "prompts"


def _prompt_file(draw, body: list[A.Statement], closed: bool) -> list[A.Statement]:
    """A prompt file source: the example text file, or (closed loop) the example ShareGPT file
    as multi-turn chat sessions, maybe with a think time; either maybe in a shuffled order."""
    if closed and draw(st.booleans()):
        body = [s for s in body if not (isinstance(s, A.Attribute) and s.key == "endpoint")]
        body += [_attr("endpoint", A.Word("chat")), _attr("prompt_file", _s(str(_PROMPTS / "sharegpt.json"))),
                 _attr("multi_turn", A.Bool(True))]
        if draw(st.booleans()):  # a fixed wait, or a range drawn per conversation and turn
            ms = sorted(draw(st.lists(st.integers(0, 30_000), min_size=1, max_size=2)))
            think = tuple(A.Quantity(v, "ms") for v in ms)
            body.append(_attr("think_time", think[0] if len(think) == 1 and draw(st.booleans()) else A.List(think)))
    else:
        body.append(_attr("prompt_file", _s(str(_PROMPTS / "prompts.txt"))))
    if draw(st.booleans()):
        body.append(_attr("prompt_order", A.Word(draw(st.sampled_from(["file", "shuffled"])))))
    return body


@st.composite
def _workload(draw, name: str) -> tuple[A.Block, tuple[int, Fraction, Fraction, Fraction]]:
    mode = draw(st.sampled_from(["closed", "batch", "open"]))
    load: list[A.Statement] = [_attr("mode", A.Word(mode))] if mode != "closed" or draw(st.booleans()) else []
    if mode == "open":
        rates = draw(st.lists(st.integers(1, 50), min_size=1, max_size=3, unique=True))
        unit = draw(st.sampled_from(["rps", "rpm"]))
        levels = tuple(A.Quantity(r, unit) for r in rates)
        load.append(_attr("rate", A.List(levels) if len(levels) > 1 or draw(st.booleans()) else levels[0]))
        if draw(st.booleans()):
            load.append(_attr("arrival", A.Word(draw(st.sampled_from(["constant", "poisson"])))))
        if draw(st.booleans()):
            load.append(_attr("seed", A.Num(draw(st.integers(0, 2**31)))))
        if draw(st.booleans()):  # vLLM's --max-concurrency: an open loop's cap on requests in flight
            load.append(_attr("max_concurrency", A.Num(draw(st.integers(1, 64)))))
    else:
        conc = draw(st.lists(st.integers(1, 64), min_size=1, max_size=3, unique=True))
        load.append(_attr("concurrency", A.List(tuple(A.Num(c) for c in conc)) if len(conc) > 1 or draw(st.booleans()) else A.Num(conc[0])))
        if mode == "batch":
            load.append(_attr("requests", A.Num(draw(st.integers(1, 32)))))
    # a fixed count per level (vLLM's --num-prompts): open and closed loops, never with multi-turn
    count = draw(st.one_of(st.none(), st.integers(1, 100_000))) if mode != "batch" else None
    if count is not None:
        load.append(_attr("requests_per_level", A.Num(count)))
    n_levels = len(rates) if mode == "open" else len(conc)
    dq, d = draw(_duration())
    b, bucket = d, []
    if draw(st.booleans()):
        bq, b = draw(_duration(lo_s=max(min(d, Fraction(1, 10)), d / 1000), hi_s=d))
        bucket = [_attr("bucket", bq)]
    if count is not None and draw(st.booleans()):  # LoadGen's min_duration: from a bucket up to the duration (the bound)
        mq, least = draw(_duration(lo_s=b, hi_s=d))
        if b <= least <= d:  # (`_duration` falls back to whole seconds where no unit fits)
            load.append(_attr("min_duration", mq))
    body: list[A.Statement] = [_block("load", None, *load), _attr("duration", dq), *bucket]
    w = Fraction(0)
    # a warmup by duration, or (open and closed loops, never with multi-turn) by count: vLLM's --num-warmups
    warm = draw(st.sampled_from(["none", "duration"] + (["count"] if mode != "batch" else [])))
    if warm == "duration":
        wq, w = draw(_duration(lo_s=Fraction(1), hi_s=Fraction(600)))
        body.append(_attr("warmup", wq))
    elif warm == "count":
        body.append(_attr("warmup", A.Quantity(draw(st.integers(1, 1000)), draw(st.sampled_from(A.COUNT_UNITS)))))
    if draw(st.booleans()):
        body.append(_attr("deadline", draw(_duration(hi_s=Fraction(600)))[0]))
    if draw(st.booleans()):
        body.append(_attr("expected_latency", draw(_duration(hi_s=Fraction(60)))[0]))
    if draw(st.booleans()):
        body.append(_attr("endpoint", A.Word(draw(st.sampled_from(["completions", "chat"])))))
    if draw(st.booleans()):
        body.append(_attr("stream", A.Bool(draw(st.booleans()))))
    sources = ["default", "words", "tokens"] + (["file"] if _PROMPTS.is_dir() else [])
    source = draw(st.sampled_from(sources))  # one prompt source (or the default)
    if source == "file":
        body = _prompt_file(draw, body, closed=mode == "closed" and count is None and warm != "count")
    if source == "words":
        body.append(_attr("prompt_words", A.Num(draw(st.integers(1, 4096)))))
    elif source == "tokens":
        body.append(_attr("prompt_tokens", A.List(tuple(A.Num(n) for n in draw(st.lists(st.integers(16, 4096), min_size=1, max_size=3))))))
        if draw(st.booleans()):
            prefix = draw(st.integers(0, 15))
            body.append(_attr("prefix_tokens", A.Num(prefix)))
            if prefix and draw(st.booleans()):  # SGLang's generated-shared-prefix: groups the prefix's index words tell apart
                body.append(_attr("prefix_groups", A.Num(draw(st.integers(1, min(2**prefix, 512))))))
    if source in ("words", "tokens") and not any(isinstance(s, A.Attribute) and s.key == "prefix_tokens" for s in body) and draw(st.booleans()):
        # random lengths, as vLLM's --random-range-ratio: a percentage or a fraction below 1
        ratio = draw(st.integers(0, 99))
        body.append(_attr("length_range", A.Quantity(ratio, "%") if draw(st.booleans()) else A.Num(ratio / 100)))
    if draw(st.booleans()):  # extra body fields, nested objects included
        fields = [_attr("min_tokens", A.Num(draw(st.integers(0, 8)))), _block("chat_template_kwargs", None, _attr("enable_thinking", A.Bool(draw(st.booleans()))))]
        body.append(_block("body", None, *draw(st.permutations(fields))))
    if draw(st.booleans()):
        body.append(_block("headers", None, _attr("X-Team", _s(draw(st.sampled_from(["perf", "a b", "x=1"]))))))
        body.append(_block("header_env", None, _attr("Authorization", _s("SOAK_TOKEN"))))
    if draw(st.booleans()):
        body.append(_attr("follow_up", A.Bool(draw(st.booleans())), trailing="a trailing comment"))
    return _block("workload", name, *draw(st.permutations(body))), (n_levels, d, b, w)


_RULES = (
    "require completed_run",
    "require bucket_coverage",
    "require duration_coverage",
    "require artifacts_verified",
    "require follow_up",
    "require provenance_consistent",
    "require runtime_boundary_specific",
    "require failed == 0",
    "require timeouts <= 2 per level",
    "require ratio(errors) <= 1%",
    "require rate(completed) >= 0.5rps per bucket",
    "require trace_coverage >= 100% per bucket",
    "require p95(ttft) <= 500ms",
    "require p99.9(latency) <= 2m per window 30s",
    "warn mean(itl) <= 50ms per bucket",
    "warn max(gpu_memory) <= 70GiB per run",
    "warn min(throughput) >= 10 per level",
    "warn max(rss) < 8GB",
    "warn drift(p95(ttft)) <= 20% per level",
    "warn slope(mean(itl)) <= 0.05 per backend",
    "warn p50(output_tokens) >= 1",
    "require p99(sent_ttft) < 1s per level",
    "warn min(total_throughput) >= 10 per level",
)


@st.composite
def valid_specs(draw) -> tuple[str, SpecShape]:
    """A spec `check` accepts, rendered canonically, and the shape its plan must have."""
    n = draw(st.integers(1, 3))
    bnames = draw(st.lists(st.sampled_from(["host-staged", "nccl", "vllm", "sim-a", "b1", "Backend 2"]), min_size=n, max_size=n, unique=True))
    kinds = tuple(draw(st.sampled_from(["launch", "url", "sim"])) for _ in bnames)
    parallel = draw(st.booleans())
    header = [_attr("issue", _s(f"#{draw(st.integers(1, 9999))}"))]
    if parallel or draw(st.booleans()):
        header.append(_attr("parallel", A.Bool(parallel)))
    stmts: list[A.Statement] = [_block("soak", draw(st.sampled_from(["soak", "dsv2-lite http soak", "x"])), *header, comments=("generated",))]
    if draw(st.booleans()):
        stmts.append(_block("model", None, _attr("id", _s("org/model")), _attr("revision", _s("604d5664"))))
    if draw(st.booleans()):
        src = [_attr("repo", _s("."))]
        if draw(st.booleans()):
            src.append(_attr("allow_dirty", A.Bool(draw(st.booleans()))))
        stmts.append(_block("source", None, *src))
    drawn = [draw(_backend(name, kind)) for name, kind in zip(bnames, kinds)]
    stmts += [blk for blk, _ in drawn]
    shapes = []
    for wname in draw(st.lists(st.sampled_from(["short", "long", "mixed"]), min_size=1, max_size=2, unique=True)):
        blk, shape = draw(_workload(wname))
        stmts.append(blk)
        shapes.append(shape)
    traced = all(tr for _, tr in drawn)  # else trace coverage can never be measured (E414)
    rules = _RULES if traced else tuple(r for r in _RULES if "trace_coverage" not in r)
    rule_texts = draw(st.lists(st.sampled_from(rules), max_size=6, unique=True))
    if draw(st.booleans()):
        rule_texts.append(f'require failed == 0 on "{draw(st.sampled_from(bnames))}"')
    if rule_texts:
        tree, diags = parse("gate {\n" + "\n".join(rule_texts) + "\n}\n")
        assert tree is not None, diags
        stmts.append(tree.body[0])
    if draw(st.booleans()):
        stmts.append(_block("claims", None, A.Claim("claim", _s("a soak claim")), A.Claim("exclude", _s("production readiness"))))
    text = fmt(A.SoakFile(tuple(stmts), closing_comments=("end",)))
    return text, SpecShape(tuple(bnames), kinds, tuple(shapes), parallel)
