"""The checker's key tables are consistent with the `Spec` dataclasses they fill: every key
maps to a real field, its type has a converter, quantities name their unit kind and words
their choices, and a default comes from the dataclass unless the table says otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from soakspec.lang import check, parse
from soakspec.lang import spec as S
from soakspec.lang.check import backend, claims, gate, header, layout, workload
from soakspec.lang.check.core import CONVERTERS, NO_DEFAULT, Table

TABLES = {
    f"{mod.__name__.rsplit('.', 1)[1]}.{name}": value
    for mod in (header, backend, workload, gate, claims)
    for name, value in vars(mod).items()
    if isinstance(value, Table)
}


def test_every_block_has_a_table():
    assert {"header.HEADER", "backend.BACKEND", "backend.READY", "backend.RUNTIME", "backend.TRACES", "backend.SIM",
            "workload.WORKLOAD", "workload.LOAD", "workload.SAMPLING", "gate.GATE", "claims.CLAIMS"} <= set(TABLES)  # fmt: skip


@pytest.mark.parametrize("name", sorted(TABLES))
def test_table_is_consistent_with_its_dataclass(name):
    table = TABLES[name]
    fields = {f.name for f in dataclasses.fields(table.cls)} if table.cls else set()
    names = [k.name for k in table.keys]
    assert len(names) == len(set(names)), "a key is listed once"
    for k in table.keys:
        assert k.type in CONVERTERS, k
        if k.field is not None and table.cls is not None:
            assert k.field in fields, k
        if k.type in ("quantity", "quantities"):
            assert k.unit is not None, k
        if k.type == "word":
            assert k.choices, k
        if k.default is NO_DEFAULT and k.field is not None and table.cls is not None and not k.required:
            f = next(f for f in dataclasses.fields(table.cls) if f.name == k.field)
            assert table.default(k) == (f.default if f.default is not dataclasses.MISSING else f.default_factory()), k


def test_an_empty_block_gets_the_dataclass_defaults():
    text = (
        'soak "x" {}\nbackend "a" {\n  url = "http://127.0.0.1:8000"\n  ready {}\n  traces {}\n}\n'
        'workload "w" {\n  load { concurrency = 1 }\n  duration = 60s\n}\ngate {}\ntelemetry {}\n'
    )
    spec, diags = check(parse(text)[0])
    assert spec is not None, diags
    assert spec.backends[0].ready == S.Ready() and spec.backends[0].traces == S.Traces()
    assert spec.telemetry == S.Telemetry()
    g = spec.gate
    assert (g.confidence, g.min_samples, g.allow_rehearsal, g.trace_window_s) == (0.95, 1, False, 5.0)
    w = spec.workloads[0]
    assert (w.endpoint, w.stream, w.prompt_words, w.max_tokens, w.deadline_s, w.warmup_s) == ("completions", True, 64, (64,), 300.0, 0.0)
    assert w.bucket_s == w.duration_s == 60.0


# ---------------------------------------------------------------- every numeric key is bounded

from soakspec.diagnostics import Severity  # noqa: E402
from soakspec.lang.check import compare as compare_check  # noqa: E402
from soakspec.lang.check.core import DEFAULT_MAXIMUM  # noqa: E402
from soakspec.units import Dimension  # noqa: E402

ALL_TABLES = {**TABLES, "compare.COMPARE": compare_check.COMPARE}
NUMERIC = ("int", "ints", "number", "quantity", "quantities")

# Where each table's block sits in a spec: the key under test replaces `@`; the other keys are
# what makes the rest of the spec check (a key the table under test names is left out).
_BK = 'backend "a" {\n  url = "http://127.0.0.1:8000"\n  %s\n}\n'
_WL = 'workload "w" {\n  %s\n}\n'
_PLACES = {
    "header.TELEMETRY": 'telemetry {\n  @\n}\n' + _BK % "" + _WL % "load { concurrency = 1 }\n  duration = 60s",
    "backend.BACKEND": _BK % "@" + _WL % "load { concurrency = 1 }\n  duration = 60s",
    "backend.READY": _BK % "ready {\n    @\n  }" + _WL % "load { concurrency = 1 }\n  duration = 60s",
    "backend.METRICS": _BK % "metrics {\n    @\n  }" + _WL % "load { concurrency = 1 }\n  duration = 60s",
    "backend.SIM": 'backend "a" {\n  sim {\n    @\n  }\n}\n' + _WL % "load { concurrency = 1 }\n  duration = 60s",
    "workload.WORKLOAD": _BK % "" + _WL % "load { concurrency = 1 }\n  duration = 60s\n  @",
    "workload.LOAD": _BK % "" + _WL % "load {\n    @\n  }\n  duration = 60s",
    "workload.CLOSED_PHASE": _BK % "" + _WL % "load {\n    phases {\n      a {\n        duration = 10s\n        concurrency = 1\n        @\n      }\n    }\n  }",
    "workload.OPEN_PHASE": _BK % "" + _WL % "load {\n    mode = open\n    phases {\n      a {\n        duration = 10s\n        rate = 1rps\n        @\n      }\n    }\n  }",
    "workload.SAMPLING": _BK % "" + _WL % "load { concurrency = 1 }\n  duration = 60s\n  sampling {\n    @\n  }",
    "gate.GATE": _BK % "" + _WL % "load { concurrency = 1 }\n  duration = 60s" + "gate {\n  @\n}\n",
    "compare.COMPARE": _BK % "" + _WL % "load { concurrency = 1 }\n  duration = 60s" + "compare {\n  @\n}\n",
}
_UNIT = {Dimension.DURATION: "s", Dimension.RATE: "rps", Dimension.SIZE: "GiB", Dimension.RATIO: "%"}


def _numeric_keys():
    for name, table in sorted(ALL_TABLES.items()):
        for k in table.keys:
            if k.type in NUMERIC:
                yield pytest.param(name, k, id=f"{name}.{k.name}")


def _spec_with(table: str, line: str) -> str:
    place = _PLACES[table]
    key = line.split(" = ", 1)[0]
    kept = [ln for ln in place.split("\n") if not ln.strip().startswith(f"{key} = ") or "@" in ln]  # the key once: the absurd one
    return 'soak "x" {}\n' + "\n".join(kept).replace("@", line)


def _absurd(k) -> str:
    """A value far past any real use, but a finite number the parser takes."""
    value = "1000000000000000000000000000000" if k.type in ("int", "ints") else "1e30"
    unit = _UNIT[k.unit] if k.type in ("quantity", "quantities") else ""
    return f"[1{unit}, {value}{unit}]" if k.type in ("ints", "quantities") else value + unit


def test_every_table_with_a_numeric_key_has_a_place():
    assert {name for name, t in ALL_TABLES.items() if any(k.type in NUMERIC for k in t.keys)} == set(_PLACES)


@pytest.mark.parametrize("name, k", list(_numeric_keys()))
def test_every_count_key_names_its_maximum(name, k):
    """A whole number or a plain number with no upper bound passed `check` (prompt_words =
    99999999999999999999999) and then crashed `run`: each names its maximum, and the reason
    (shown as the hint) for the counts of a request or a load. Quantities are bounded by their
    unit kind when the row names none."""
    if k.type in ("quantity", "quantities"):
        assert (k.maximum if k.maximum is not None else DEFAULT_MAXIMUM[k.unit]) < 1e30, k
    else:
        assert k.maximum is not None and k.maximum < 1e30, k


@pytest.mark.parametrize("name, k", list(_numeric_keys()))
def test_every_numeric_key_rejects_an_absurd_value_with_a_diagnostic(name, k):
    line = f"{k.name} = {_absurd(k)}"
    text = _spec_with(name, line)
    tree, diags = parse(text)
    assert tree is not None, (text, diags)
    spec, diags = check(tree)  # never a traceback
    assert spec is None, text
    row = next(i for i, ln in enumerate(text.split("\n"), 1) if ln.strip() == line)
    at = [d for d in diags if d.severity is Severity.ERROR and d.code == "E204" and d.span.line == row]
    assert at, (text, [(d.span.line, d.code, d.message) for d in diags])
    assert f"'{k.name}'" in at[0].message and at[0].hint, at[0]


@pytest.mark.parametrize(
    "line, message",
    [
        ("prompt_words = 99999999999999999999999", "'prompt_words' must be at most 10,000,000, not a 23-digit number"),
        ("prompt_words = 10000001", "'prompt_words' must be at most 10,000,000, not 10,000,001"),
        ("max_tokens = [16, 10000001]", "'max_tokens' must be at most 10,000,000, not 10,000,001"),
        ("prompt_tokens = 10000001", "'prompt_tokens' must be at most 10,000,000, not 10,000,001"),
    ],
)
def test_a_request_count_past_its_maximum_is_e204_with_a_hint(line, message):
    text = _spec_with("workload.WORKLOAD", line)
    spec, diags = check(parse(text)[0])
    assert spec is None
    (d,) = [d for d in diags if d.severity is Severity.ERROR]
    assert d.code == "E204" and d.message == message and "context window" in d.hint


def test_counts_at_their_maximum_check():
    text = _spec_with("workload.WORKLOAD", "prompt_words = 10000000\n  max_tokens = 10000000")
    spec, diags = check(parse(text)[0])
    assert spec is not None, diags
    assert (spec.workloads[0].prompt_words, spec.workloads[0].max_tokens) == (10_000_000, (10_000_000,))
    text = _spec_with("workload.LOAD", "mode = batch\n    concurrency = 1\n    requests = 1000000000")
    spec, diags = check(parse(text)[0])
    assert spec is not None and spec.workloads[0].load.requests == 10**9, diags


def test_every_block_with_keys_has_its_place_in_the_layout():
    """`layout.PLACES` is where the hint of a key written in the wrong block looks: a block's
    table missing there would give its keys no 'belongs inside ...' hint."""
    placed = {id(t) for p in layout.PLACES for t in p.tables}
    assert [name for name, t in TABLES.items() if t.keys and id(t) not in placed] == []
    assert all(t.keys and layout.place_of(t) is p for p in layout.PLACES for t in p.tables)
