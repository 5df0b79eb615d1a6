"""Audit of sweeps and of `soakspec plan`'s fidelity: what a sweep's figure claims, and what plan
states against what a run does.

A sweep's figure is "the highest level that holds next to one that does not". When the level
next above it was not shown to fail -- the figure is the grid's highest level, or the next level
was INCONCLUSIVE (missing data is never a pass, nor a failure), or never probed (the wall-time
bound) -- the evidence says only that the server sustains *at least* that load.
"""

from __future__ import annotations

from soakspec.judge import judge
from soakspec.judge.joined import join
from soakspec.judge.summary import summarize_run
from soakspec.judge.testing import EvidenceBuilder, spec_from_text
from soakspec.report import common as C


def _spec(load: str = "concurrency = [1, 12]\n    search = bisect\n    max_wall = 1h") -> str:
    return ('soak "s" {}\n'
            'backend "b0" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "host-staged"\n  }\n}\n'
            f'workload "w0" {{\n  load {{\n    mode = closed\n    {load}\n  }}\n  duration = 10m\n  bucket = 5m\n'
            '  deadline = 30s\n  follow_up = false\n}\n'
            'gate {\n  require p90(ttft) < 200ms per level\n}\n')  # fmt: skip


def _evidence(probes: list[int], capacity: int, *, cut_short: tuple[int, ...] = (), bounded: bool = False):
    """A sweep's evidence of `probes` (grid values, in run order): slow above `capacity`; the
    probes in `cut_short` stopped early by an interrupt (no abort rule: INCONCLUSIVE)."""
    b = EvidenceBuilder(spec_from_text(_spec(f"concurrency = {probes}")), per_bucket=40)
    for i, c in enumerate(probes):
        if c > capacity:
            for r in b.measured("b0", level=i):
                r["ttft"] = 0.5
    for i, c in enumerate(probes):
        if c in cut_short:
            b.entry("b0")["levels"][i]["completed"] = False
    b.entry("b0")["sweep"] = {"probes": [{"level": i, "value": c, "passed": c <= capacity and c not in cut_short}
                                         for i, c in enumerate(probes)], "bounded_by_wall_time": bounded}
    return b.build()


def _figure_rule(spec, ev):
    (rule,) = [r for r in judge(spec, ev).rules if r.metric == "max_sustainable_concurrency"]
    return rule


def test_a_sweep_whose_highest_level_holds_says_at_least_that_level():
    """Grid 1..12, both 1 and 12 hold: the search never found a load the server cannot take, so
    the figure is a lower bound -- 'at least 12', in the verdict, results.json and the reports."""
    spec = spec_from_text(_spec())
    ev = _evidence([1, 12], capacity=99)
    (sw,) = join(spec, ev).sweep
    assert sw.result == 12 and sw.lower_bound and "highest level" in sw.lower_bound
    rule = _figure_rule(spec, _evidence([1, 12], capacity=99))
    assert rule.status == "pass" and "= at least 12" in rule.message, rule.message
    assert "at least 12" in rule.observed_text
    results = summarize_run(join(spec, _evidence([1, 12], capacity=99)))
    assert results["sweep"][0]["lower_bound"] == sw.lower_bound
    (view,) = C.sweep_views(results)
    assert view.value.startswith("at least 12"), view.value


def test_a_figure_next_to_an_inconclusive_probe_is_a_lower_bound_and_marked_unknown():
    """Capacity 4, probes 1 12 6 3 4 5, the probe at 5 cut short (INCONCLUSIVE): 4 holds, but
    nothing says 5 does not -- 'at least 4', and the probe list shows 5 as '?' not '✗'."""
    spec = spec_from_text(_spec())
    rule = _figure_rule(spec, _evidence([1, 12, 6, 3, 4, 5], capacity=4, cut_short=(5,)))
    assert rule.status == "pass" and "= at least 4" in rule.message and "INCONCLUSIVE" in rule.message, rule.message
    assert "5?" in rule.message and "5✗" not in rule.message


def test_a_figure_next_to_a_failing_probe_is_exact():
    spec = spec_from_text(_spec())
    (sw,) = join(spec, _evidence([1, 12, 6, 3, 4, 5], capacity=4)).sweep
    assert sw.result == 4 and sw.lower_bound is None
    rule = _figure_rule(spec, _evidence([1, 12, 6, 3, 4, 5], capacity=4))
    assert "max_sustainable_concurrency = 4 (" in rule.message and "at least" not in rule.message


def test_a_search_the_wall_time_ended_says_at_least():
    """Bounded after 1 12 6 3 (3 holds, 6 fails): 4 was never probed, so 3 is only a lower bound."""
    spec = spec_from_text(_spec())
    rule = _figure_rule(spec, _evidence([1, 12, 6, 3], capacity=4, bounded=True))
    assert "= at least 3" in rule.message and "not probed" in rule.message and "bounded by max wall time" in rule.message


def test_the_reports_say_why_there_is_no_figure_as_the_verdict_does():
    """The lowest probe cut short by an interrupt (INCONCLUSIVE) leaves the verdict's sweep
    INCONCLUSIVE, 'the lowest level could not be judged'; the Markdown and HTML reports said
    'none (even the lowest level does not hold)', a failure the evidence does not show."""
    spec = spec_from_text(_spec())
    ev = _evidence([1], capacity=4, cut_short=(1,))
    rule = _figure_rule(spec, ev)
    assert rule.status == "inconclusive" and "could not be judged" in rule.message
    (view,) = C.sweep_views(summarize_run(join(spec, _evidence([1], capacity=4, cut_short=(1,)))))
    assert view.value == "none (the lowest level could not be judged)", view.value
    (view,) = C.sweep_views(summarize_run(join(spec, _evidence([1], capacity=0))))
    assert view.value == "none (even the lowest level does not hold)", view.value


def test_lint_claims_does_not_let_a_lower_bound_be_stated_as_the_maximum(tmp_path):
    """A sweep over 1..12 whose level 12 held: 'max sustainable concurrency = 12' passed lint-claims,
    a maximum the evidence never found; 'sustains concurrency 12' is what it shows."""
    from soakspec.claims.adapters import coverage_from_spec, load_evidence_facts
    from soakspec.claims.engine import lint
    from soakspec.claims.facts import ClaimBoundary

    spec = spec_from_text(_spec())
    b = EvidenceBuilder(spec_from_text(_spec("concurrency = [1, 12]")), per_bucket=40)
    b.entry("b0")["sweep"] = {"probes": [{"level": 0, "value": 1, "passed": True}, {"level": 1, "value": 12, "passed": True}],
                              "bounded_by_wall_time": False}
    b.manifest["spec"] = {"path": spec.path, "text": spec.canonical_text, "sha256": spec.sha256}
    evidence = load_evidence_facts(b.write(tmp_path / "ev"))
    assert evidence[0].sustainable == {"max_sustainable_concurrency": 12.0}

    def codes(doc: str) -> list[str]:
        text = doc + "\n\n## Claim Boundary\n\n- claim: a sweep\n"
        diags = lint(text, "pr.md", ClaimBoundary(claims=("a sweep",)), coverage_from_spec(spec), evidence)
        return [d.code for d in diags if d.code != "CB402"]  # the builder stores results.json of the levels alone

    assert codes("The server sustains concurrency 12.") == []
    assert codes("The max sustainable concurrency is 12.") == ["CB201"]


# ------------------------------------------------------------------------------ plan fidelity

def test_plan_counts_a_sweeps_probes_in_its_shape_and_buckets():
    """A sweep over 1..16 (at most 6 probes, each one 5 s level in 1 bucket) leaves up to 6
    levels and 6 buckets in the manifest; plan said '1 backend × 1 levels × 1 buckets = 1
    buckets in all' (bucket_count 1), a number the run contradicts."""
    from soakspec.plan import plan, render_text, to_json

    spec = spec_from_text(_spec("concurrency = [1, 16]\n    search = bisect\n    max_wall = 1h").replace("bucket = 5m", "bucket = 10m"))
    p = plan(spec)
    (lv,) = p.backends[0].levels
    assert lv.sweep.max_probes == 6 and len(lv.buckets) == 1
    assert p.bucket_count == 6 and to_json(p)["bucket_count"] == 6
    text = render_text(p)
    assert "shape: 1 backend × at most 6 levels (sweep probes) × 1 buckets = at most 6 buckets in all" in text, text


def test_plan_of_a_sweep_counts_its_first_probe_and_gives_no_advice_that_cannot_work():
    """An open-loop sweep over 5..40 rps of 3 s probes: plan said 'requests: ≥ 0 (set
    expected_latency for an estimate)' -- the first probe (5 rps, 15 measured requests) always
    runs, and expected_latency gives a sweep no estimate (nor an open loop any)."""
    from soakspec.plan import plan, render_text, to_json

    text = _spec("rate = [5rps, 40rps]\n    rate_step = 5rps\n    search = bisect\n    max_wall = 1m").replace(
        "mode = closed", "mode = open").replace("duration = 10m\n  bucket = 5m", "duration = 3s\n  bucket = 1s")
    p = plan(spec_from_text(text))
    assert p.backends[0].min_requests == 15 and to_json(p)["min_requests"] == 15
    out = render_text(p)
    assert "requests: ≥ 15 (a sweep: how many more depends on the levels it probes)" in out, out
    assert "expected_latency" not in out
    closed = plan(spec_from_text(_spec("concurrency = [3, 12]\n    search = bisect\n    max_wall = 1h")))
    assert closed.backends[0].min_requests == 3


def test_plan_says_an_abort_rule_ends_only_a_sweeps_probe():
    """A sweep's abort rule ends the probe it fires on and the search goes on below it (a run
    of the simulator with 'abort p50(ttft) > 200ms per bucket' over 1..16 aborted probe 16, then
    probed 8 4 6 5); plan said 'stops its load when: ...', the whole load."""
    from soakspec.plan import plan, render_text

    spec = spec_from_text(_spec().replace("require p90(ttft) < 200ms per level", "require p90(ttft) < 200ms per level\n"
                                                                             "  abort p50(ttft) > 1s per bucket"))
    out = render_text(plan(spec))
    assert "stops its load when" not in out, out
    assert "ends the sweep's probe (it does not hold; the search goes on below it) when: abort p50(ttft) > 1s per bucket" in out
    fixed = render_text(plan(spec_from_text(_spec("concurrency = [1, 12]").replace("require", "abort p50(ttft) > 1s per bucket\n  require"))))
    assert "stops its load when: abort p50(ttft) > 1s per bucket" in fixed


def test_the_follow_up_is_of_a_workload_that_asks_for_one_and_plan_names_it():
    """Workload 'a' (follow_up = false, max_tokens 16) then 'b' (follow_up = true, max_tokens 4):
    the run sent the clean follow-up as workload 'a' with 16 tokens -- the shape of the workload
    that declined one -- and plan said only 'one clean follow-up request'."""
    from soakspec.plan import plan, render_text

    def wl(name: str, words: int, tokens: int, follow: str) -> str:
        return (f'workload "{name}" {{\n  prompt_words = {words}\n  max_tokens = {tokens}\n  load {{\n    mode = closed\n'
                f'    concurrency = [1]\n  }}\n  duration = 1s\n  bucket = 1s\n  deadline = 5s\n  follow_up = {follow}\n}}\n')

    text = ('soak "s" {}\nbackend "b0" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "x"\n  }\n}\n'
            + wl("a", 64, 16, "false") + wl("b", 8, 4, "true") + "gate {\n  require follow_up\n}\n")
    p = plan(spec_from_text(text))
    bp = p.backends[0]
    assert bp.follow_up and bp.follow_up_workload == "b" and bp.follow_up_request.max_tokens == (4,)
    assert "then one clean follow-up request of workload 'b' (its smallest shape, concurrency 1; deadline 5s)" in render_text(p)


def test_plan_shows_the_pre_flight_and_bounds_the_wall_time_with_it():
    """run sends one pre-flight request of each workload's shape before any level, waiting up
    to the workload's deadline; plan printed no such request and its 'at most' wall time left
    those waits out, so a slow pre-flight could make a run exceed the bound plan stated."""
    from soakspec.plan import plan, render_text

    text = ('soak "s" {}\nbackend "u" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "x"\n  }\n}\n'
            'workload "w" {\n  load {\n    concurrency = [1]\n  }\n  duration = 60s\n  deadline = 10s\n  follow_up = false\n}\n'
            'workload "v" {\n  load {\n    concurrency = [1]\n  }\n  duration = 60s\n  deadline = 30s\n  follow_up = false\n}\n'
            "gate {\n  require failed == 0\n}\n")
    p = plan(spec_from_text(text))
    bp = p.backends[0]
    ready = bp.launch.probe.timeout_s
    drains = 10.0 + 30.0
    last_scrape = bp.metrics.last_wait_s  # the default /metrics scrape after the load
    assert bp.max_wall_s == bp.est_wall_s + ready + drains + (10.0 + 30.0) + last_scrape  # + each workload's pre-flight deadline
    assert "before the first level: one pre-flight request of each workload 'w', 'v', which must complete" in render_text(p)


def test_plan_promises_no_minimum_for_random_arrivals():
    """An open level of 5 rps for 5 s after a 1 s warm-up with `arrival = poisson`, `seed = 0`:
    plan said 'requests ≥ 25' and the run measured 18 (the seeded exponential gaps send fewer
    than rate × duration as often as more). Constant arrivals keep their exact count."""
    from soakspec.plan import plan, render_text
    from soakspec.runner.load import schedule

    measured = sum(1 for t in schedule(5.0, "poisson", 0, 0.0, 6.0) if 1.0 <= t < 6.0)
    assert measured == 18  # what the run sends in the measured window
    text = ('soak "s" {}\nbackend "u" {\n  url = "http://127.0.0.1:8000"\n  runtime {\n    label = "x"\n  }\n}\n'
            'workload "w" {\n  load {\n    mode = open\n    rate = [5rps]\n    arrival = ARRIVAL\n    seed = 0\n  }\n'
            '  warmup = 1s\n  duration = 5s\n  bucket = 5s\n  deadline = 5s\n  follow_up = false\n}\n'
            "gate {\n  require failed == 0\n}\n")
    p = plan(spec_from_text(text.replace("ARRIVAL", "poisson")))
    (lv,) = p.backends[0].levels
    assert lv.min_requests <= measured and lv.expected_requests == 25
    # no floor, but the expected count with its spread, three standard deviations either side
    assert "requests ~25 expected (random arrivals, ± 3 sd: 10-40)" in render_text(p) and 10 <= measured <= 40
    (lv,) = plan(spec_from_text(text.replace("ARRIVAL", "constant"))).backends[0].levels
    assert lv.min_requests == lv.expected_requests == 25


def test_the_reports_workload_line_states_a_sweeps_search_not_its_bounds_as_levels():
    """A sweep's `rate = [4rps, 40rps]` / `concurrency = [1, 12]` are the search's bounds: the
    reports' workload line said "open loop, rates 4, 40 rps" (two levels that never ran as
    such); it states the search as `soakspec plan` does, with its grid step."""
    closed = C.workload_line(spec_from_text(_spec()).workloads[0])
    assert "sweep concurrency 1..12 step 1 (bisect)" in closed and "concurrency 1,12" not in closed, closed
    text = _spec().replace("mode = closed\n    concurrency = [1, 12]",
                           "mode = open\n    rate = [4rps, 40rps]\n    rate_step = 4rps\n    arrival = poisson\n    seed = 3")
    line = C.workload_line(spec_from_text(text).workloads[0])
    assert "sweep rate 4..40 rps step 4 rps (bisect), open loop (poisson arrivals, seed 3)" in line, line
    assert "rates 4, 40 rps" not in line, line
