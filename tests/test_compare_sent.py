"""compare's rows from the send (`sent_ttft`, `sent_latency`) at a level that declares
max_concurrency: there `ttft` and `latency` count the wait for a slot (the user's view) and the
sent_* rows the server's alone, so a queue that grew and a server that slowed read apart."""

from __future__ import annotations

import random

from soakspec.compare import compare, parse_rule
from soakspec.judge.testing import EvidenceBuilder, small_spec

CAPPED = small_spec(mode="open", levels="[2rps]\n    max_concurrency = 4", duration="4m", bucket="1m")
UNCAPPED = small_spec(mode="open", levels="[2rps]", duration="4m", bucket="1m")


def capped_run(seed: int, *, wait: float, server: float, run_id: str, same_ttft: bool = False) -> EvidenceBuilder:
    """A run of 400 measured requests under max_concurrency, each waiting `wait` x a lognormal
    draw for a slot and then answered its first token in `server` x another (seeded). `same_ttft`:
    the wait is what keeps the time from the intended start at 0.5 x one draw + 0.1 x the other x the draws, whatever
    `server` is -- a server slower by what the queue got shorter."""
    b = EvidenceBuilder(CAPPED, per_bucket=100, run_id=run_id)
    rng = random.Random(seed)
    for r in b.measured("a"):
        w_draw, s_draw = rng.lognormvariate(0.0, 0.35), rng.lognormvariate(0.0, 0.35)
        s = 0.1 * s_draw * server
        w = (0.5 * w_draw + 0.1 * s_draw - s) if same_ttft else 0.3 * w_draw * wait
        t0 = r["intended_start"] + w
        gen = r["end"] - r["first_token"]
        r.update(admitted=t0, start=t0, first_byte=t0 + s / 2, first_token=t0 + s, end=t0 + s + gen,
                 ttft=None, latency=None)  # from the intended start: the wait counted (as the runner writes them)
    return b


def _rows(c) -> dict[tuple[str, str], str]:
    return {(r.metric, r.stat): r.verdict for r in c.rows}


def test_a_longer_queue_is_a_ttft_regression_but_no_change_from_the_send():
    """The wait for a slot doubled, the server answered as before: the user's TTFT regressed,
    the server's (bench serve's TTFT) did not -- the row that says so is sent_ttft."""
    c = compare(capped_run(1, wait=1.0, server=1.0, run_id="base").build(),
                capped_run(2, wait=2.0, server=1.0, run_id="new").build(), resamples=2000)
    got = _rows(c)
    assert got[("ttft", "p50")] == "regression" and got[("latency", "p50")] == "regression"
    for stat in ("p50", "p95", "p99"):
        assert got[("sent_ttft", stat)] == "no significant change", (stat, got)
        assert got[("sent_latency", stat)] == "no significant change", (stat, got)


def test_a_slower_server_behind_a_shorter_queue_is_a_sent_ttft_regression_that_ttft_hides():
    """The server took 1.5x as long to its first token, the queue shrank by as much: TTFT from
    the intended start did not move, TTFT from the send regressed -- and a rule on it FAILs."""
    base = capped_run(3, wait=1.0, server=1.0, run_id="base", same_ttft=True).build()
    new = capped_run(3, wait=1.0, server=1.5, run_id="new", same_ttft=True).build()
    c = compare(base, new, resamples=2000, rules=[parse_rule("require p50(sent_ttft) regression <= 10%")])
    got = _rows(c)
    assert got[("ttft", "p50")] == "no significant change", got
    assert got[("sent_ttft", "p50")] == "regression", got
    row = next(r for r in c.rows if (r.metric, r.stat) == ("sent_ttft", "p50"))
    assert 0.3 < row.change < 0.7
    assert c.rules[0].status == "fail" and c.outcome == "FAIL"


def test_sent_rows_join_the_family_only_at_capped_levels():
    """An uncapped pair gets no sent_* rows (there sent_ttft is ttft: six more rows would only
    widen every interval); a capped pair gets six, and the family counts them."""
    plain = compare(EvidenceBuilder(UNCAPPED, per_bucket=100, run_id="b").build(),
                    EvidenceBuilder(UNCAPPED, per_bucket=100, run_id="n").build(), resamples=2000)
    assert not [r for r in plain.rows if r.metric.startswith("sent_")]
    capped = compare(capped_run(1, wait=1.0, server=1.0, run_id="b").build(),
                     capped_run(2, wait=1.0, server=1.0, run_id="n").build(), resamples=2000)
    sent = [r for r in capped.rows if r.metric.startswith("sent_")]
    assert len(sent) == 6 and len(capped.rows) == len(plain.rows) + 6
    assert capped.to_json()["method"]["family_rows"] == len(capped.rows)
    assert all(r.row_confidence == 1 - 0.05 / len(capped.rows) for r in capped.rows)

def test_a_pair_capped_in_one_run_only_gets_no_sent_rows():
    """The cap itself changed: the base run read up front kept no sent_* samples of its uncapped
    level, and no row is made of them (it used to be a KeyError waiting)."""
    from soakspec.compare import RunSamples

    plain = EvidenceBuilder(UNCAPPED, per_bucket=100, run_id="b").build()
    c = compare(RunSamples.read(plain, dir="base", keep=False), capped_run(2, wait=1.0, server=1.0, run_id="n").build(),
                resamples=2000, workload_change=True)
    assert c.rows and not [r for r in c.rows if r.metric.startswith("sent_")]


def test_the_base_run_read_up_front_gives_the_same_sent_rows():
    """The command reads the base run's samples up front and lets its table go
    (`RunSamples.read(keep=False)`): a capped level's sent_* samples are among them."""
    from soakspec.compare import RunSamples

    base, new = capped_run(1, wait=1.0, server=1.0, run_id="b").build(), capped_run(2, wait=2.0, server=1.0, run_id="n").build()
    lazy = compare(base, new, resamples=2000)
    early = compare(RunSamples.read(base, dir="base", keep=False), new, resamples=2000)
    assert [(r.metric, r.stat, r.low, r.high) for r in early.rows] == [(r.metric, r.stat, r.low, r.high) for r in lazy.rows]
    assert any(r.metric == "sent_latency" for r in early.rows)


def test_a_rule_on_sent_ttft_with_no_capped_level_is_inconclusive_saying_why():
    c = compare(EvidenceBuilder(UNCAPPED, per_bucket=100, run_id="b").build(),
                EvidenceBuilder(UNCAPPED, per_bucket=100, run_id="n").build(), resamples=2000,
                rules=[parse_rule("require p99(sent_ttft) regression <= 5%")])
    assert c.rules[0].status == "inconclusive" and "declares max_concurrency" in c.rules[0].message
    assert c.outcome == "INCONCLUSIVE"


# ---------------------------------------------------------------- lint-claims --compare


def _findings(c, text: str) -> list[str]:
    from soakspec.claims import ClaimBoundary, Coverage, adapters, lint

    facts = adapters.change_facts(c.to_json(), "compare.json")
    return [d.code for d in lint(f"# PR\n\n{text}\n", "PR.md", ClaimBoundary(), Coverage(), changes=facts) if d.code.startswith("CB5")]


def test_lint_claims_reads_sent_ttft_as_the_rows_from_the_send():
    """"sent TTFT p50" (or sent_ttft, "p50 sent TTFT") is held against compare's sent_ttft rows,
    not its ttft rows: where only the queue grew, the server's TTFT is rightly unchanged and the
    user's is not."""
    queue = compare(capped_run(1, wait=1.0, server=1.0, run_id="base").build(),
                    capped_run(2, wait=2.0, server=1.0, run_id="new").build(), resamples=2000)
    assert _findings(queue, "Sent TTFT p50 is unchanged.") == []
    assert _findings(queue, "The p50 sent latency is unchanged.") == []
    assert _findings(queue, "p50 TTFT is unchanged.") == ["CB504"]
    assert _findings(queue, "sent_ttft p50 rose.") == ["CB503"]  # the ttft row did rise
    server = compare(capped_run(3, wait=1.0, server=1.0, run_id="base", same_ttft=True).build(),
                     capped_run(3, wait=1.0, server=1.5, run_id="new", same_ttft=True).build(), resamples=2000)
    row = next(r for r in server.rows if (r.metric, r.stat) == ("sent_ttft", "p50"))
    assert _findings(server, f"Sent TTFT p50 rose {row.change * 100:.0f}%.") == []
    assert _findings(server, "p50 sent TTFT fell 10%.") == ["CB501"]
    assert _findings(server, "p50 TTFT rose.") == ["CB503"]
