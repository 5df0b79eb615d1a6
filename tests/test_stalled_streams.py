"""A stream that stalls until its deadline is counted by the per-token rules, never dropped.

An audit drove a server that stalls every second stream for 4 s after 3 tokens (a 2 s
deadline): half the requests timed out, yet `max(itl) < 1s` and `mean(tpot) < 50ms` passed,
exit 0 -- ITL and TPOT pooled the completed streams only, and said nothing. A request that
timed out after its first token now counts in an ITL rule as one more gap, at least the time
from its last token to its end (no upper bound), and in a TPOT rule as an unknown TPOT (0 to
no bound); a rule holds or fails only where it does at both bounds (judge/performance.py
`_with_censored`), else INCONCLUSIVE saying so."""

from __future__ import annotations

from soakspec.judge import judge
from soakspec.judge.testing import EvidenceBuilder, small_spec

GATE = ("require max(itl) < 1s per level\nrequire p50(itl) < 1s per level\n"
        "require mean(tpot) < 50ms per level\nrequire p50(itl) < 1s")


def _stalled(share_every: int, gate: str = GATE):
    spec = small_spec(gate, levels="[2]")
    b = EvidenceBuilder(spec, per_bucket=40)
    stalled = 0
    for r in b.records["a"]:
        if r["bucket"] >= 0 and int(r["request_id"].rsplit("-", 1)[-1]) % share_every == 0:
            # tokens came, then nothing until past the 30 s deadline
            r.update(end=r["start"] + 31.0, outcome="timeout", error="deadline passed before the response finished",
                     finish_reason=None)
            stalled += 1
    assert stalled
    v = judge(spec, b.build())
    return {r.rule: r for r in v.rules}, v, stalled


def test_a_stalled_stream_fails_a_max_itl_rule_and_leaves_a_mean_tpot_rule_undecided():
    rules, v, stalled = _stalled(2)
    itl = rules["max(itl) < 1s per level"]
    assert itl.status == "fail", itl.message
    assert f"{stalled} timed-out requests stalled mid-stream" in itl.message and "gap of at least" in itl.message
    assert ">= 30" in itl.message or ">= 29" in itl.message, itl.message  # its time from last token to the deadline, at least
    tpot = rules["mean(tpot) < 50ms per level"]
    assert tpot.status == "inconclusive", tpot.message
    assert "timed out mid-stream" in tpot.message and "how long they would have taken" in tpot.message
    assert v.outcome == "FAIL"


def test_a_few_stalls_do_not_move_a_median_of_thousands_of_gaps():
    """One gap more per stalled request among ~60 per completed one: p50(itl) is decided, and
    says what it counted."""
    rules, _, stalled = _stalled(10)
    p50 = rules["p50(itl) < 1s per level"]
    assert p50.status == "pass", p50.message
    assert "stalled mid-stream" in p50.message


def test_without_timeouts_nothing_is_censored():
    spec = small_spec(GATE, levels="[2]")
    v = judge(spec, EvidenceBuilder(spec, per_bucket=40).build())
    for r in v.rules:
        assert "stalled" not in r.message and "mid-stream" not in r.message, r.message
    assert {r.rule: r.status for r in v.rules}["max(itl) < 1s per level"] == "pass"
