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


def test_plan_text_says_each_workloads_request_deadline_default_or_not():
    """A load tool's default client timeout turns slow requests into failures unseen (vLLM bench's
    default 300 s). soakspec's deadline is the spec's, 5 minutes unless it says otherwise; a request
    past it is a timeout, in `errors` and censored in the time rules. `soakspec plan` printed the
    follow-up's deadline but not the one every measured request runs under."""
    text = render_text(plan(spec_of('workload "w" {\n load { concurrency = 3 }\n duration = 60s\n}')))
    assert "    w deadline: 5m a request, from its intended start (the default); past it, a timeout" in text, text
    text = render_text(plan(spec_of('workload "w" {\n load { concurrency = 3 }\n duration = 60s\n deadline = 90s\n}')))
    assert "    w deadline: 1m30s a request, from its intended start; past it, a timeout" in text, text


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
    last_scrape = 10.0 + 2.0  # the default scrape's timeout and the slack to write it: the scrape after the load
    assert walls["l"] == (60.0, 60.0 + 60.0 + 10.0 + 10.0 + 5.0 + last_scrape)  # ready timeout, pre-flight, drain, shutdown grace
    assert walls["u"] == (60.0, 60.0 + 120.0 + 10.0 + 10.0 + last_scrape)  # nothing to shut down
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


SECRET_BACKENDS = (
    'backend "l" {\n launch = ["./server", "--port", "{port}", "--api-key", "sk-abcdefghijklmnopqrstuvwx", "--model", "{model_id}"]\n'
    ' env { HF_TOKEN = "hf_abcdefghijklmnopqrstuvwx"\n RUST_LOG = "info" }\n gpus = [0, 1]\n shutdown_grace = 7s\n'
    ' ready {\n path = "/health"\n timeout = 90s\n interval = 250ms\n }\n}\n'
    'backend "u" { url = "http://127.0.0.1:8000" }\n'
)


def test_plan_json_says_every_timeout_grace_and_command_with_secrets_redacted():
    """`soakspec plan --format json` is what `run` will do: the exact command (only the port left
    to fill in), env with CUDA_VISIBLE_DEVICES, readiness probe and its timeouts, the grace, the
    follow-up deadline -- with secrets redacted as the manifest redacts them."""
    spec = spec_of(W60.replace("follow_up = false", "follow_up = true"), SECRET_BACKENDS, header="")
    doc = to_json(plan(spec))
    text = json.dumps(doc)
    assert "sk-abcdefghijklmnopqrstuvwx" not in text and "hf_abcdefghijklmnopqrstuvwx" not in text
    la, url = doc["backends"]
    assert la["launch"]["argv"] == ["./server", "--port", "{port}", "--api-key", "<redacted>", "--model", ""]
    assert la["launch"]["env"] == {"HF_TOKEN": "<redacted>", "RUST_LOG": "info", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert la["launch"]["cwd"] == str(pathlib.Path.cwd())
    assert la["ready"] == {"method": "GET", "path": "/health", "status": 200}
    assert la["timeouts"] == {
        "ready_timeout_s": 90.0, "ready_interval_s": 0.25, "ready_attempt_timeout_s": 1.0,
        "shutdown_grace_s": 7.0, "kill_wait_s": 5.0, "follow_up_deadline_s": 10.0,
        "liveness_interval_s": 1.0, "liveness_grace_s": 5.0, "liveness_attempt_timeout_s": 2.0, "liveness_hang_s": 60.0,
        "liveness_backoff_base_s": 0.05, "liveness_backoff_max_s": 1.0,
    }  # fmt: skip
    assert url["launch"]["kind"] == "url" and url["launch"]["argv"] is None
    assert url["timeouts"]["shutdown_grace_s"] is None and url["timeouts"]["ready_timeout_s"] == 600.0
    (lv,) = la["levels"]
    assert lv["shape"] == {"kind": "closed", "concurrency": 1} and lv["label"] == "concurrency 1"
    assert lv["request"]["endpoint"] == "completions" and lv["request"]["max_tokens"] == [64]
    assert doc["telemetry_interval_s"] == 5.0


def test_a_rehearsal_is_decided_in_the_plan():
    """Every backend becomes the simulator, launched with the plan's exact argv; its readiness
    timeout and grace are capped, its log is kept and its traces are the simulator's."""
    spec = spec_of(W60, SECRET_BACKENDS.replace("timeout = 90s", "timeout = 20m") + 'backend "q" { launch = ["./q"]\n log = false }')
    full, rehearsal = plan(spec), plan(spec, rehearse=True, time_scale=0.5)
    for b in rehearsal.backends:
        assert b.launch.kind == "sim" and b.launch.capture_log and b.launch.cwd is None
        assert b.launch.argv[1:8] == ("-m", "soakspec", "sim", "--host", "127.0.0.1", "--port", "{port}")
        assert b.traces.source == "log" and b.traces.pattern is not None
        assert b.launch.probe.timeout_s <= 60.0 and b.launch.shutdown_grace_s <= 5.0
    assert [b.launch.kind for b in full.backends] == ["launch", "url", "launch"]
    assert full.backends[0].launch.probe.timeout_s == 1200.0 and full.backends[0].launch.shutdown_grace_s == 7.0
    assert full.backends[2].launch.capture_log is False
    assert full.backends[0].launch.command(4242)[:3] == ["./server", "--port", "4242"]


def test_load_shapes_are_a_sum_type():
    from soakspec.plan import Batch, Closed, Open

    spec = spec_of(
        'workload "c" {\n load { concurrency = [1, 3] }\n duration = 60s\n}\n'
        'workload "b" {\n load {\n  mode = batch\n  concurrency = 2\n  requests = 5\n }\n duration = 60s\n}\n'
        'workload "o" {\n load {\n  mode = open\n  rate = [1rps, 2rps]\n  arrival = poisson\n  seed = 9\n }\n duration = 60s\n}'
    )
    shapes = [lv.shape for lv in plan(spec).backends[0].levels]
    assert shapes == [Closed(1), Closed(3), Batch(2, 5), Open(1.0, "poisson", 9), Open(2.0, "poisson", 10)]
    labels = [lv.label for lv in plan(spec).backends[0].levels]
    assert labels == ["concurrency 1", "concurrency 3", "concurrency 2 (batches of 5)", "rate 1 rps", "rate 2 rps"]


def test_time_scale_shrinks_the_telemetry_and_scrape_intervals_with_the_buckets():
    """`--time-scale F` shrinks every duration: the telemetry and a declared /metrics interval
    too (they stayed 5 s while a 5 s bucket became 1 s, leaving buckets without a CPU/RSS
    sample), down to the sampling floors."""
    from soakspec.plan import TELEMETRY_MIN_INTERVAL_S

    spec = spec_of(W60, 'backend "a" {\n  sim {}\n  metrics { every = 10s }\n}\n')
    full, scaled = plan(spec), plan(spec, time_scale=0.2)
    assert (full.telemetry_interval_s, scaled.telemetry_interval_s) == (5.0, 1.0)
    assert (full.backends[0].metrics.interval_s, scaled.backends[0].metrics.interval_s) == (10.0, 2.0)
    assert plan(spec, time_scale=0.01).telemetry_interval_s == TELEMETRY_MIN_INTERVAL_S


def test_plan_text_shows_control_characters_in_the_specs_strings_never_sends_them():
    """`issue = "\\u001b[2J"` or a backend named "b\\u001b[31m" is the spec's own text: `plan`
    printed the escape sequence raw, so the terminal cleared itself or changed colour (a spec
    could hide what the plan says it runs). Each control character is shown as U+FFFD."""
    s = spec_of('workload "w" {\n  load { concurrency = 1 }\n  duration = 60s\n}\n',
                backends='backend "b\\u001b[31m" { url = "http://127.0.0.1:8000" }', header='issue = "x\\u001b[2J\\u0007"')
    text = render_text(plan(s))
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 for c in text), repr(text)
    assert "(x\ufffd[2J\ufffd)" in text and "backend 'b\ufffd[31m'" in text


def test_the_plan_says_when_a_hung_server_counts_as_dead():
    """A server SIGSTOPped mid-level (accepting connections, answering nothing) ran a whole
    20 s level of timeouts while `plan` said only "dead after 5s of refusals": nothing said
    that a server which answers nothing is taken for dead too, and after how long (the plan's
    `Liveness.hang_s`, 60 s). The plan says both bounds."""
    spec = spec_of('workload "w" {\n load { concurrency = 1 }\n duration = 60s\n}')
    text = render_text(plan(spec))
    assert "dead after 5s of refusals, or 1m of probes answered by nothing (a hung server): the run aborts (exit 4; sooner" in text, text


# ---------------------------------------------------------------- a random count's spread


def _plan_cli(tmp_path: pathlib.Path, text: str, *args: str) -> str:
    import os
    import subprocess
    import sys

    path = tmp_path / "s.soak"
    path.write_text(text)
    env = os.environ | {"PYTHONPATH": str(ROOT)}  # this checkout's soakspec, whatever the venv points at
    proc = subprocess.run([sys.executable, "-m", "soakspec", "plan", str(path), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _open_text(load: str) -> str:
    return ('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
            f'workload "w" {{\n  load {{\n    mode = open\n    {load}\n  }}\n'
            '  duration = 60s\n  bucket = 10s\n  deadline = 60s\n  follow_up = false\n}\n')


@pytest.mark.parametrize("load, level, total", [
    # 10 rps for 60 s of Poisson arrivals: 600 ± 3 × sqrt(600)
    ("rate = [10rps]\n    arrival = poisson", ["requests ~600 expected (random arrivals, ± 3 sd: 527-673)"],
     "~600 expected (random arrivals, ± 3 sd: 527-673)"),
    # gamma gaps of shape 0.5: twice the variance, 600 ± 3 × sqrt(1200)
    ("rate = [10rps]\n    arrival = poisson\n    burstiness = 0.5", ["requests ~600 expected (random arrivals, ± 3 sd: 496-704)"],
     "~600 expected (random arrivals, ± 3 sd: 496-704)"),
    # two levels, two seeds: their variances add, 1800 ± 3 × sqrt(600 + 1200)
    ("rate = [10rps, 20rps]\n    arrival = poisson", ["± 3 sd: 527-673)", "requests ~1200 expected (random arrivals, ± 3 sd: 1096-1304)"],
     "~1800 expected (random arrivals, ± 3 sd: 1673-1927)"),
])
def test_plan_prints_a_timed_random_levels_expected_count_with_its_spread(tmp_path, load, level, total):
    """`soakspec plan` of a timed level with Poisson (or gamma) arrivals said "requests ≥ 0,
    expected ~600": a floor that says nothing. It says the expected count and the spread a seeded
    count stays within, three standard deviations either side (the count's variance rate ×
    duration / burstiness: W515's rule), on the level's line, the backend's and the total's;
    `--format json` adds `expected_requests_range`."""
    out = _plan_cli(tmp_path, _open_text(load))
    lines = [x for x in out.splitlines() if x.startswith("    w / ")]
    for line, said in zip(lines, level):
        assert said in line, line
    assert "≥ 0" not in out, out
    assert f"    requests: {total}; wall time ≈ " in out, out
    assert f"  total: requests {total}; wall time ≈ " in out, out
    js = json.loads(_plan_cli(tmp_path, _open_text(load), "--format", "json"))
    lo, hi = (int(x) for x in total.split(": ")[1].rstrip(")").split("-"))
    assert js["expected_requests_range"] == js["backends"][0]["expected_requests_range"] == [lo, hi]
    assert js["min_requests"] == 0  # the floor itself is unchanged


def test_constant_arrivals_keep_their_exact_count_with_no_spread(tmp_path):
    out = _plan_cli(tmp_path, _open_text("rate = [10rps]"))
    assert "requests ≥ 600, expected ~600;" in out and "sd" not in out, out
    assert json.loads(_plan_cli(tmp_path, _open_text("rate = [10rps]"), "--format", "json"))["expected_requests_range"] is None


def test_a_random_phase_ramp_states_its_spread():
    """A ramp's random count is the rate's integral, spread as any: 10→90 rps over 4 s is ~200."""
    spec = spec_of('workload "w" {\n load {\n mode = open\n arrival = poisson\n phases {\n'
                   ' up { rate = 10rps  ramp_to = 90rps  duration = 4s }\n }\n }\n bucket = 1s\n follow_up = false\n}')
    text = render_text(plan(spec))
    assert "requests ~200 expected (random arrivals, ± 3 sd: 158-242)" in text, text
