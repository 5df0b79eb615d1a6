"""`plan(spec)`: levels, buckets, request counts and wall time, before anything runs."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from soakspec.diagnostics import Severity
from soakspec.lang import check, load_spec, parse
from soakspec.plan import plan, render_text, to_json

ROOT = pathlib.Path(__file__).resolve().parents[1]


def spec_of(workloads: str, backends: str = 'backend "a" { url = "http://127.0.0.1:8000" }', header: str = "") -> object:
    text = f'soak "t" {{ {header} }}\n{backends}\n{workloads}\n'
    tree, diags = parse(text)
    assert diags == [], diags
    spec, diags = check(tree)
    assert spec is not None, [f"{d.span.line}:{d.span.column} {d.code} {d.message}" for d in diags]
    return spec


def test_dsv2lite_plan_objects():
    spec, diags, _ = load_spec(ROOT / "specs" / "dsv2lite.soak")
    assert spec is not None and not [d for d in diags if d.severity is Severity.ERROR]
    p = plan(spec)
    assert p.bucket_count == 8
    assert [b.name for b in p.backends] == ["host-staged", "nccl"]
    assert [[lv.concurrency for lv in b.levels] for b in p.backends] == [[4, 8], [4, 8]]
    assert {bk.length_s for b in p.backends for lv in b.levels for bk in lv.buckets} == {60.0}
    assert p.est_wall_s == 504.0
    assert repr(p) == render_text(p)


def test_closed_loop_counts():
    spec = spec_of('workload "w" {\n load { concurrency = [2, 10] }\n duration = 100s\n expected_latency = 4s\n follow_up = false\n}')
    (bp,) = plan(spec).backends
    assert [(lv.min_requests, lv.expected_requests) for lv in bp.levels] == [(2, 50), (10, 250)]
    assert bp.est_wall_s == 200.0  # no follow-up
    assert bp.follow_up is False


def test_closed_loop_without_latency_hint_has_no_estimate():
    spec = spec_of('workload "w" {\n load { concurrency = 3 }\n duration = 60s\n}')
    p = plan(spec)
    assert p.backends[0].expected_requests is None
    doc = to_json(p)
    assert doc["expected_requests"] is None and doc["min_requests"] == 3
    assert "set expected_latency for an estimate" in render_text(p)


def test_open_loop_counts_in_requests_per_minute():
    spec = spec_of('workload "w" {\n load {\n  mode = open\n  rate = [30rpm, 2rps]\n }\n duration = 2m\n}')
    (bp,) = plan(spec).backends
    assert [lv.rate for lv in bp.levels] == [0.5, 2.0]
    assert [lv.expected_requests for lv in bp.levels] == [60, 240]
    assert [lv.label for lv in bp.levels] == ["rate 0.5 rps", "rate 2 rps"]


def test_last_bucket_is_short_and_warned_about():
    text = 'soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\nworkload "w" {\n load { concurrency = 1 }\n duration = 150s\n bucket = 1m\n}\n'
    spec, diags = check(parse(text)[0])
    assert [d.code for d in diags] == ["W505"]
    (lv,) = plan(spec).backends[0].levels
    assert [(b.start_s, b.length_s) for b in lv.buckets] == [(0.0, 60.0), (60.0, 60.0), (120.0, 30.0)]


def test_warmup_is_outside_the_buckets_but_inside_the_wall_time():
    spec = spec_of('workload "w" {\n load { concurrency = 1 }\n duration = 60s\n warmup = 30s\n follow_up = false\n}')
    (lv,) = plan(spec).backends[0].levels
    assert lv.warmup_s == 30.0 and lv.buckets[0].start_s == 0.0 and len(lv.buckets) == 1
    assert plan(spec).est_wall_s == 90.0


def test_levels_follow_workload_order():
    spec = spec_of(
        'workload "short" {\n load { concurrency = [1, 2] }\n duration = 60s\n}\n'
        'workload "long" {\n load {\n  mode = batch\n  concurrency = 4\n  requests = 16\n }\n duration = 10m\n bucket = 5m\n}'
    )
    (bp,) = plan(spec).backends
    assert [(lv.workload, lv.index, lv.mode) for lv in bp.levels] == [("short", 0, "closed"), ("short", 1, "closed"), ("long", 0, "batch")]
    assert [lv.min_requests for lv in bp.levels] == [1, 2, 16]
    assert plan(spec).bucket_count == 1 + 1 + 2


BACKENDS3 = (
    'backend "l" { launch = ["./s", "--port", "{port}"]\n shutdown_grace = 5s\n ready { timeout = 1m } }\n'
    'backend "u" { url = "http://127.0.0.1:8000"\n ready { timeout = 2m } }\n'
    'backend "s" { sim { ttft = 10ms } }'
)
W60 = 'workload "w" {\n load { concurrency = 1 }\n duration = 60s\n deadline = 10s\n follow_up = false\n}'


def test_wall_time_bounds_per_backend_kind():
    p = plan(spec_of(W60, BACKENDS3))
    walls = {b.name: (b.est_wall_s, b.max_wall_s) for b in p.backends}
    assert walls["l"] == (60.0, 60.0 + 60.0 + 10.0 + 5.0)  # ready timeout, drain, shutdown grace
    assert walls["u"] == (60.0, 60.0 + 120.0 + 10.0)  # nothing to shut down
    assert walls["s"][0] == 60.0 and walls["s"][1] >= 70.0
    assert p.est_wall_s == 180.0 and p.max_wall_s == sum(m for _, m in walls.values())


def test_parallel_backends_take_the_longest():
    p = plan(spec_of(W60, BACKENDS3, header="parallel = true"))
    assert p.parallel and p.est_wall_s == 60.0
    assert p.max_wall_s == max(b.max_wall_s for b in p.backends)
    assert "side by side" in render_text(p)


def test_only_some_backends():
    p = plan(spec_of(W60, BACKENDS3), only=("u", "s"))
    assert [b.name for b in p.backends] == ["u", "s"]
    assert p.bucket_count == 2


def test_time_scale():
    spec = spec_of(W60, BACKENDS3)
    p = plan(spec, time_scale=0.5, rehearse=True)
    assert p.bucket_count == 3 and p.est_wall_s == 90.0
    assert p.backends[0].levels[0].deadline_s == 5.0
    assert "time scale 0.5" in render_text(p)
    with pytest.raises(ValueError):
        plan(spec, time_scale=0)
    with pytest.raises(ValueError):
        plan(spec, time_scale=1.5)


def test_plan_is_pure_and_json_is_stable():
    spec = spec_of(W60, BACKENDS3)
    before = dataclasses.asdict(spec)
    a, b = to_json(plan(spec)), to_json(plan(spec))
    assert dataclasses.asdict(spec) == before
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["spec_sha256"] == spec.sha256 and a["schema_version"] == 1
    assert set(a["backends"][0]["levels"][0]) >= {"workload", "mode", "concurrency", "rate", "buckets", "min_requests", "expected_requests"}
