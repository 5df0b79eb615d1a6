"""The checker's key tables are consistent with the `Spec` dataclasses they fill: every key
maps to a real field, its type has a converter, quantities name their unit kind and words
their choices, and a default comes from the dataclass unless the table says otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from soakspec.lang import check, parse
from soakspec.lang import spec as S
from soakspec.lang.check import backend, claims, gate, header, workload
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
