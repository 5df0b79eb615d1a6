"""`soakspec lint-claims DOC --compare BASE NEW`: the size of a change stated in a unit ("p99
TTFT fell by 12 ms", "throughput rose by 40 tok/s", "latency is 30 ms lower"), of an error rate
in percent ("errors fell 85%": of the share, or points), and a claim that names a turn of a
multi-turn level ("on turn 3, p50 TTFT rose 50%"), checked against compare's rows
(`soakspec.claims.changes`, CB501-CB505).

Two pairs of runs, written by the test (`EvidenceBuilder`) and compared by the CLI:

- open-loop levels 4 and 8 rps; the new run's TTFT 0.8x the base's, 130 requests a bucket where
  the base had 100, and one request in ten of the base failed where one in a hundred of the new
  one did. At rate 4 rps compare finds p50 TTFT 102.3 ms → 76.6 ms (-32.1% .. -18.6%, i.e.
  -32.8 .. -19.0 ms), throughput 95.5 → 136.5 tok/s (+37.1% .. +49.2%: +35.4 .. +47.0 tok/s),
  QPS 1.49 → 2.13 req/s (+0.55 .. +0.73 req/s), p50 latency 1295.8 → 1271.3 ms (-37.7 ..
  -10.4 ms), and the error rate 10% → 1.2% (-14.6 .. -4.2 points; of the share, -146% .. -42%);
- a multi-turn level (3 turns, concurrency 4) whose third turns are half as slow again in the
  new run: compare's rows per turn (TTFT p50 and p95 only) find turn 3 a regression (p50 30.0 ms
  → 45.4 ms, +44.6% .. +59.9%) and turns 1 and 2 unchanged, while the level's own p50 is
  unchanged and its p95 and p99 a regression.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from soakspec import cli
from soakspec.claims import ClaimBoundary, Coverage, adapters, lint
from soakspec.judge.testing import EvidenceBuilder, small_spec

SPEC = small_spec("require p99(latency) < 60s", duration="4m", bucket="1m", mode="open", levels="[4rps, 8rps]", backends=("sim",))
TURNS_SPEC = small_spec(levels="[4]", duration="4m", bucket="1m", follow_up=False)


def _run(seed: int, ttft_factor: float, per_bucket: int, fail_every: int) -> EvidenceBuilder:
    b = EvidenceBuilder(SPEC, per_bucket=per_bucket, run_id=f"run{seed}", scheduled=False)
    rng = random.Random(seed)
    for level in (0, 1):
        for i, r in enumerate(b.measured("sim", level=level)):
            if i % fail_every == 0:
                b.set_outcome(r, "failed", "http 500", status=500)
                continue
            ttft = rng.lognormvariate(-2.3, 0.35) * ttft_factor
            gaps = [rng.lognormvariate(-4.0, 0.25) for _ in range(63)]
            r.update(ttft=ttft, first_token=r["start"] + ttft, itl=gaps, tpot=sum(gaps) / 63,
                     latency=ttft + sum(gaps), end=r["start"] + ttft + sum(gaps))
    return b


def _turns_run(seed: int, slower_turn: int | None = None) -> EvidenceBuilder:
    """Conversations of 3 turns; turn k's TTFT about k x 10 ms, `slower_turn`'s half as long again."""
    b = EvidenceBuilder(TURNS_SPEC, per_bucket=90, run_id=f"turns{seed}", scheduled=False)
    rng = random.Random(seed)
    for j, r in enumerate(b.measured("a")):
        k = j % 3 + 1
        t = 0.01 * k * (1.5 if k == slower_turn else 1.0) * rng.lognormvariate(0.0, 0.1)
        r.update(conversation=j // 3 + 1, turn=k, ttft=t, first_token=r["start"] + t, latency=t + 0.15, end=r["start"] + t + 0.15)
    return b


def _compared(tmp: Path, spec, base: EvidenceBuilder, new: EvidenceBuilder) -> dict[str, Path]:
    out = {"base": base.write(tmp / "base"), "new": new.write(tmp / "new"), "spec": tmp / "spec.soak", "json": tmp / "compare.json"}
    out["spec"].write_text(spec.canonical_text)
    assert cli.main(["compare", str(out["base"]), str(out["new"]), "--format", "json", "--out", str(out["json"])]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    return _compared(tmp_path_factory.mktemp("sizes"), SPEC, _run(1, 1.0, 100, 10), _run(2, 0.8, 130, 100))


@pytest.fixture(scope="module")
def turns(tmp_path_factory) -> dict[str, Path]:
    return _compared(tmp_path_factory.mktemp("turns"), TURNS_SPEC, _turns_run(1), _turns_run(2, slower_turn=3))


def _lint(tmp_path: Path, capsys, doc: str, runs: dict[str, Path], *compare: str) -> tuple[int, list[tuple[int, str]], str]:
    """(exit code, [(line, code)] of the CB5xx findings, the whole output)."""
    p = tmp_path / "PR.md"
    p.write_text(doc + "\n## Claim boundary\n\nSynthetic runs.\n")
    code = cli.main(["lint-claims", str(p), "--spec", str(runs["spec"]), "--compare", *(compare or (str(runs["json"]),))])
    cap = capsys.readouterr()
    out = cap.out + cap.err
    found = [(int(m.group(1)), m.group(2)) for m in re.finditer(rf"^{re.escape(str(p))}:(\d+):\d+: (CB5\d\d) ", out, re.M)]
    return code, found, out


def _flagged(tmp_path, capsys, runs, lines: list[str]) -> list[tuple[int, str]]:
    """The CB5xx findings of a document of `lines`, one paragraph each (line 3, 5, 7, ...)."""
    _, found, _ = _lint(tmp_path, capsys, "# PR\n\n" + "\n\n".join(lines) + "\n", runs)
    return found


def _line(i: int) -> int:
    return 3 + 2 * i


# ---------------------------------------------------------------- a change in a unit

ABSOLUTE_RIGHT = [
    "At 4 rps, p50 TTFT fell by 25 ms.",
    "p50 TTFT fell by 0.025 s at 4 rps.",
    "p50 TTFT dropped 25000 µs at 4 rps.",
    "At 4 rps p50 TTFT is about 25ms lower.",
    "A 20 ms improvement in p50 TTFT at 4 rps.",
    "Throughput rose by 36 tok/s at 4 rps.",
    "At 4 rps output throughput increased by 36 tokens per second.",
    "QPS rose by 0.56 req/s at 4 rps.",
    "At 4 rps p50 latency is 24 ms lower.",
    "p50 TTFT fell to 77 ms at 4 rps.",  # the new figure, not the change: read as its direction
    "At 4 rps p50 TTFT fell below 100 ms.",  # likewise
]
ABSOLUTE_WRONG = [
    "At 4 rps, p50 TTFT fell by 60 ms.",
    "p50 TTFT fell by 0.06 s at 4 rps.",
    "p50 TTFT dropped 5000 µs at 4 rps.",
    "At 4 rps p50 TTFT is 60ms lower.",
    "Throughput rose by 80 tok/s at 4 rps.",
    "At 4 rps output throughput increased by 10 tokens per second.",
    "QPS rose by 2 req/s at 4 rps.",
    "At 4 rps p50 latency is 300 ms lower.",
]


def test_a_change_in_a_unit_within_compares_interval_is_clean(tmp_path, capsys, runs):
    """ms, s and µs; tok/s, tokens per second and req/s: each converted by the units module and
    held against the row's interval in that unit (the relative interval times the base)."""
    for compare in ((str(runs["base"]), str(runs["new"])), (str(runs["json"]),)):
        code, found, out = _lint(tmp_path, capsys, "# PR\n\n" + "\n\n".join(ABSOLUTE_RIGHT) + "\n", runs, *compare)
        assert found == [] and code == 0, out


def test_a_change_in_a_unit_outside_compares_interval_is_CB502(tmp_path, capsys, runs):
    assert _flagged(tmp_path, capsys, runs, ABSOLUTE_WRONG) == [(_line(i), "CB502") for i in range(len(ABSOLUTE_WRONG))]
    _, _, out = _lint(tmp_path, capsys, "# PR\n\nAt 4 rps, p50 TTFT fell by 60 ms.\n", runs)
    assert "states p50 TTFT fell 60 ms at rate 4 rps; 60 ms is outside compare's interval of the difference (-32.8 ms .. -19.0 ms): " \
           "sim · rate 4 rps: p50(ttft) 102.3 ms → 76.6 ms, -25.1% (-32.1% .. -18.6%, improvement)" in out, out


def test_a_change_in_a_unit_the_other_way_is_CB501(tmp_path, capsys, runs):
    """Whatever its size; and "25 ms higher" is read as a claim (a figure in a unit between the
    metric and its direction word no longer hides the direction)."""
    wrong = ["At 4 rps, p50 TTFT rose by 25 ms.", "Throughput fell by 36 tok/s at 4 rps.", "At 4 rps p50 TTFT is 25 ms higher.",
             "At 4 rps p50 latency is 24 ms slower."]
    assert _flagged(tmp_path, capsys, runs, wrong) == [(_line(i), "CB501") for i in range(len(wrong))]


# ---------------------------------------------------------------- errors

def test_an_error_rate_in_percent_holds_as_either_a_share_or_points(tmp_path, capsys, runs):
    """"Errors fell 85%" may mean of the share (10% → 1.5%) or 85 points: it holds when either
    reading lies in compare's interval, and is CB502 when neither does; points and "from A% to
    B%" are differences of the shares."""
    right = ["At 4 rps errors fell 85%.", "The error rate fell 6 points at 4 rps.", "The error rate fell from 10% to 1.2% at 4 rps.",
             "The error rate dropped by 6 percentage points at 4 rps."]
    wrong = ["At 4 rps errors fell 30%.", "The error rate fell 20 points at 4 rps.", "The error rate fell from 30% to 1% at 4 rps."]
    assert _flagged(tmp_path, capsys, runs, right) == []
    assert _flagged(tmp_path, capsys, runs, wrong) == [(_line(i), "CB502") for i in range(len(wrong))]


# ---------------------------------------------------------------- turns

TURNS_RIGHT = [
    "On turn 3, p50 TTFT rose 50%.",
    "p50 TTFT on turn 3 rose by 15 ms.",
    "p95 TTFT on turn 1 is unchanged.",
    "There is no regression in p50 TTFT on the 2nd turn.",
    "p95 TTFT rose 50%.",  # no turn named: the level's row
]


def test_a_claim_that_names_a_turn_is_checked_against_that_turns_row(tmp_path, capsys, turns):
    code, found, out = _lint(tmp_path, capsys, "# PR\n\n" + "\n\n".join(TURNS_RIGHT) + "\n", turns)
    assert found == [] and code == 0, out
    wrong = ["On turn 3, p50 TTFT fell.", "p50 TTFT on turn 3 rose by 40 ms.", "p95 TTFT on turn 3 is unchanged.", "Turn 1 p50 TTFT rose.",
             "Turn 1 p50 TTFT rose 10%."]
    assert _flagged(tmp_path, capsys, turns, wrong) == [(3, "CB501"), (5, "CB502"), (7, "CB504"), (9, "CB503"), (11, "CB502")]
    _, _, out = _lint(tmp_path, capsys, "# PR\n\nOn turn 3, p50 TTFT fell.\n", turns)
    assert "states p50 TTFT fell on turn 3; compare measured the opposite: sim · concurrency 4 · turn 3: p50(ttft) " in out \
        or "states p50 TTFT fell on turn 3; compare measured the opposite: a · concurrency 4 · turn 3: p50(ttft) " in out, out


def test_compare_has_rows_per_turn_of_ttft_p50_and_p95_only(tmp_path, capsys, turns):
    """A turn's p99 TTFT or its ITL is a row compare does not make: a warning listing the rows per
    turn it has, never the level's row read for the turn."""
    assert _flagged(tmp_path, capsys, turns, ["On turn 2, p99 TTFT fell.", "Turn 2 latency is unchanged.", "On turn 7, p50 TTFT fell."]) == \
        [(3, "CB505"), (5, "CB505"), (7, "CB505")]
    _, _, out = _lint(tmp_path, capsys, "# PR\n\nOn turn 2, p99 TTFT fell.\n", turns)
    assert "compare (" in out and "has no row for it (its rows per turn: p50(ttft), p95(ttft) at concurrency 4 · turn 1, " \
           "concurrency 4 · turn 2, concurrency 4 · turn 3)" in out, out


def test_a_turn_named_where_compare_has_no_multi_turn_level_is_a_warning(tmp_path, capsys, runs):
    assert _flagged(tmp_path, capsys, runs, ["On turn 2, p50 TTFT fell at 4 rps."]) == [(3, "CB505")]


def test_throughput_and_qps_do_not_take_a_turn_from_another_clause(tmp_path, capsys, turns):
    """A turn named in one clause scopes the sentence's other clauses as a level does -- except
    for throughput and QPS, rates of the level's wall time that no turn has: "On turn 3, p50 TTFT
    rose and throughput is unchanged" says the level's throughput is unchanged (compare: no
    significant change), not a turn's. Named in their own clause, a turn still has no such row."""
    assert _flagged(tmp_path, capsys, turns, ["On turn 3, p50 TTFT rose and throughput is unchanged.",
                                              "On turn 3, p50 TTFT rose, and QPS is unchanged.",
                                              "On turn 3, p50 TTFT rose and p95 TTFT rose.",  # the turn scopes both: turn 3's p95 rose
                                              "On turn 3, throughput is unchanged."]) == [(9, "CB505")]


def test_a_turn_inside_a_clause_scopes_that_clause_only(tmp_path, capsys, turns):
    """A turn that modifies one clause's metric ("turn 3 TTFT p50 rose 50%", "p50 TTFT on turn 3
    rose") does not make the sentence's other clauses about turn 3: they are about the level
    (its ITL, p50 TTFT unchanged; its p95 TTFT a regression). Only a turn opening the sentence
    ("On turn 3, ...") frames every clause: there ITL p99 on turn 3 is a row compare does not make."""
    assert _flagged(tmp_path, capsys, turns, ["Turn 3 TTFT p50 rose 50%, and ITL p99 is unchanged.",
                                              "p50 TTFT on turn 3 rose, and p50 TTFT is unchanged.",
                                              "p50 TTFT is unchanged, and on turn 3 p50 TTFT rose.",
                                              "Turn 3 TTFT p50 rose 50% and p95 TTFT rose.",
                                              "On turn 3, p50 TTFT rose 50%, and ITL p99 is unchanged.",
                                              "Turn 3: p50 TTFT rose and ITL is unchanged.",
                                              "- **On turn 3,** p50 TTFT rose and ITL is unchanged."]) == [(11, "CB505"), (13, "CB505"), (15, "CB505")]
    _, _, out = _lint(tmp_path, capsys, "# PR\n\np50 TTFT on turn 3 rose, and p95 TTFT is unchanged.\n", turns)
    assert 'says "unchanged" of p95 TTFT; compare measured a significant regression: ' in out and "· concurrency 4: p95(ttft)" in out, out


def _long_turns_run(seed: int, later: float) -> EvidenceBuilder:
    """Conversations of 25 turns; turn k's TTFT about (1 + k/10) x 10 ms, turns past the 20th `later`
    times that."""
    b = EvidenceBuilder(TURNS_SPEC, per_bucket=200, run_id=f"long{seed}", scheduled=False)
    rng = random.Random(seed)
    for j, r in enumerate(b.measured("a")):
        k = j % 25 + 1
        t = 0.01 * (1 + k / 10) * (later if k > 20 else 1.0) * rng.lognormvariate(0.0, 0.1)
        r.update(conversation=j // 25 + 1, turn=k, ttft=t, first_token=r["start"] + t, latency=t + 0.15, end=r["start"] + t + 0.15)
    return b


@pytest.fixture(scope="module")
def long_turns(tmp_path_factory) -> dict[str, Path]:
    """compare pools turns 21 to 25 into "turn 21+": p50 TTFT -29%, an improvement."""
    return _compared(tmp_path_factory.mktemp("long-turns"), TURNS_SPEC, _long_turns_run(1, 1.0), _long_turns_run(2, 0.7))


def test_a_turn_past_the_20th_is_not_the_pooled_turn_21_plus_row(tmp_path, capsys, long_turns):
    """compare has one row for turns 21 and later ("turn 21+"). A claim about turn 25 alone is
    not a claim about that pool (precision over recall): a warning whose message says how compare
    pools them; "turn 21+" is checked against the row."""
    assert _flagged(tmp_path, capsys, long_turns, ["On turn 21+, p50 TTFT fell.", "Turn 25 TTFT p50 fell 10%."]) == [(5, "CB505")]
    _, _, out = _lint(tmp_path, capsys, "# PR\n\nTurn 25 TTFT p50 fell 10%.\n", long_turns)
    assert 'compare pools the turns past the 20th into one row, "turn 21+": claim "turn 21+" to claim them' in out, out


def test_a_claim_of_a_pooled_turn_is_told_to_write_turn_21_plus(tmp_path, capsys, long_turns):
    """"turn 23" stays a warning, not a check against "turn 21+" (whose change need not be turn
    23's), and the hint -- the line that says what to do -- says to write "turn 21+"; a claim of a
    statistic the pool has no row of (p99) keeps the general hint."""
    assert _flagged(tmp_path, capsys, long_turns, ["Turn 23 TTFT p50 fell 10%.", "The 23rd turn's p95 TTFT fell."]) == [(3, "CB505"), (5, "CB505")]
    _, _, out = _lint(tmp_path, capsys, "# PR\n\nTurn 23 TTFT p50 fell 10%.\n", long_turns)
    assert 'hint: compare measured turn 23 only within "turn 21+", one row of the turns from the 21st on (its change need not be ' \
           'turn 23\'s): write "turn 21+" to claim that row, or drop the claim' in out, out
    _, _, out = _lint(tmp_path, capsys, "# PR\n\nTurn 23 TTFT p99 fell.\n", long_turns)
    assert "hint: compare has no row for this metric or level" in out and 'write "turn 21+"' not in out, out


# ---------------------------------------------------------------- properties

NAMES = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "latency": "e2e latency", "qps": "QPS", "throughput": "throughput",
         "errors": "error rate"}


def _difference(r, pick: int = 0) -> str:
    """new - base of a row, in a unit of its own (`pick` of ms, µs, s), to a precision the row's
    interval allows."""
    d = abs(r.new - r.base)
    if r.unit == "s":
        return [f"{d * 1000:.2f} ms", f"{d * 1e6:.0f} µs", f"{d:.5f} s"][pick % 3]
    if r.unit == "tok/s":
        return f"{d:.2f} tok/s"
    if r.unit == "/s":
        return f"{d:.3f} req/s"
    return f"{d * 100:.2f} points"


def _all_rows(runs, turns):
    out = []
    for r in (runs, turns):
        out += adapters.read_change_facts(r["json"], r["json"].read_text()).rows
    return out


@pytest.fixture(scope="module")
def facts(runs, turns):
    from soakspec.claims import ChangeFacts

    return ChangeFacts("compare.json", tuple(_all_rows(runs, turns)))


def _what(r) -> str:
    what = f"{r.stat} {NAMES[r.metric]}" if r.stat.startswith("p") else NAMES[r.metric]
    return what if r.turn is None else f"{what} on turn {r.turn}"


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_change_rendered_in_a_unit_or_for_a_turn_from_compares_own_row_never_flags(facts, data):
    """Property: a sentence that states a significant row's own change -- of a level or of a
    turn -- in its direction, with its difference new - base in a unit (ms, µs, s; tok/s,
    req/s; points) or as a percentage, at the row's level, is never a CB5xx finding."""
    r = data.draw(st.sampled_from([r for r in facts.rows if r.verdict in ("regression", "improvement") and r.low <= r.change <= r.high]))
    down = r.change < 0
    good = down == r.higher_is_worse
    word = data.draw(st.sampled_from((["fell by", "dropped"] if down else ["rose by", "increased by"]) + (["improved by"] if good else ["regressed by"])))
    size = data.draw(st.sampled_from([_difference(r, data.draw(st.integers(0, 2))), f"{abs(r.change) * 100:.1f}{'%' if not r.absolute else ' pp'}"]))
    text = f"At {r.label}, {_what(r)} {word} {size}."
    diags = lint(f"# PR\n\n{text}\n", "PR.md", ClaimBoundary(), Coverage(), changes=facts)
    assert [d for d in diags if d.code.startswith("CB5")] == [], (text, r)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_change_in_a_unit_or_for_a_turn_against_a_significant_rows_direction_is_CB501(facts, data):
    """Property: the opposite of a significant row -- of a level or of a turn -- with any size in
    a unit, is CB501."""
    r = data.draw(st.sampled_from([r for r in facts.rows if r.verdict in ("regression", "improvement")]))
    down = r.change > 0  # the opposite of what was measured
    word = data.draw(st.sampled_from(["fell by", "dropped"] if down else ["rose by", "increased by"]))
    size = data.draw(st.sampled_from([_difference(r), "5 ms", "3 tok/s", "1 req/s", "2 points"]))
    text = f"At {r.label}, {_what(r)} {word} {size}."
    diags = lint(f"# PR\n\n{text}\n", "PR.md", ClaimBoundary(), Coverage(), changes=facts)
    assert [d.code for d in diags if d.code.startswith("CB5")] == ["CB501"], (text, r)
