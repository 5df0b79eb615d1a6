"""`soakspec compare` pairs levels by what they are (their load, or their phase's name), never by
the order they ran in: two sweeps probe different loads in different orders, and probe k of one
is not probe k of the other. Levels without a counterpart are listed as unpaired."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings, strategies as st

from soakspec.cli import main
from soakspec.compare import compare, parse_rule
from soakspec.compare.render import render
from soakspec.judge.testing import EvidenceBuilder, small_spec, spec_from_text

# what two bisections of 1..12 and of 1..16 probe (capacity 4 and 5): their common loads are
# 1, 4, 5 and 6, each at another position in the other run
BASE_PROBES = [1, 12, 6, 3, 4, 5]
NEW_PROBES = [1, 16, 8, 4, 6, 5]


def _shape(b: EvidenceBuilder, level: int, ttft: float, rng: random.Random) -> None:
    """The level's requests with TTFT about `ttft` (seeded lognormal noise), the rest consistent."""
    for r in b.measured("a", level=level):
        t = ttft * rng.lognormvariate(0.0, 0.1)
        gaps = [0.01] * 15
        r.update(ttft=t, first_token=r["start"] + t, itl=gaps, tpot=0.01, latency=t + 0.15, end=r["start"] + t + 0.15)


def probes_run(probes: list[int], seed: int, *, per_bucket: int = 20, slower: float = 1.0, sweep: bool = True) -> EvidenceBuilder:
    """What a closed-loop sweep that probed `probes` (in that order) leaves: one level per probe,
    in run order, whose TTFT grows with its concurrency (10 ms per request in flight), and the
    search in the backend's manifest entry. `sweep=False`: a plain run of those levels."""
    spec = small_spec(levels=str(probes), duration="4m", bucket="1m", follow_up=False)
    b = EvidenceBuilder(spec, per_bucket=per_bucket, run_id=f"run{seed}")
    rng = random.Random(seed)
    for i, c in enumerate(probes):
        _shape(b, i, 0.01 * c * slower, rng)
    if sweep:
        b.entry("a")["sweep"] = {"probes": [{"level": i, "value": c, "passed": True} for i, c in enumerate(probes)],
                                 "bounded_by_wall_time": False}
    return b


def _ttft_p50(c):
    return {(r.label, r.level, r.new_level): r for r in c.rows if (r.metric, r.stat) == ("ttft", "p50")}


def test_two_sweeps_compare_the_loads_both_probed_not_their_probes_in_run_order():
    c = compare(probes_run(BASE_PROBES, 1).build(), probes_run(NEW_PROBES, 2).build(), resamples=500)
    rows = _ttft_p50(c)
    # each common load with itself: base index, new index
    assert sorted(rows) == [("concurrency 1", 0, 0), ("concurrency 4", 4, 3), ("concurrency 5", 5, 5), ("concurrency 6", 2, 4)]
    # the same server: every load's TTFT is what it was (by run order, probe 2 would be 6 against 8)
    assert all(abs(r.change) < 0.1 and r.verdict == "no significant change" for r in rows.values()), rows
    assert {r.label for r in c.rows} == {"concurrency 1", "concurrency 4", "concurrency 5", "concurrency 6"}
    assert [(u.side, u.label, u.level) for u in c.unpaired] == [
        ("base", "concurrency 12", 1), ("base", "concurrency 3", 3), ("new", "concurrency 16", 1), ("new", "concurrency 8", 2)]
    assert "4 unpaired levels" in c.summary()
    assert c.outcome == "PASS"


def test_a_slower_server_is_a_regression_at_every_load_both_sweeps_probed():
    c = compare(probes_run(BASE_PROBES, 1).build(), probes_run(NEW_PROBES, 2, slower=1.3).build(), resamples=500)
    rows = _ttft_p50(c)
    assert len(rows) == 4 and all(r.verdict == "regression" and 0.2 < r.change < 0.4 for r in rows.values()), rows


def test_unpaired_levels_are_not_rows_and_no_rule_looks_at_them():
    """A rule is judged over the paired levels; an unpaired one neither fails it nor makes it
    inconclusive, and it does not widen the family-wise intervals of the others."""
    base, new = probes_run(BASE_PROBES, 1).build(), probes_run(NEW_PROBES, 2).build()
    c = compare(base, new, rules=[parse_rule("require p50(ttft) regression <= 60%")], resamples=500)
    assert c.rules[0].status == "pass" and c.outcome == "PASS"
    assert {c.rows[i].label for i in c.rules[0].rows} == {"concurrency 1", "concurrency 4", "concurrency 5", "concurrency 6"}
    per_level = len(c.rows) // 4
    assert c.rows[0].row_confidence == 1 - 0.05 / (4 * per_level)


def test_a_load_run_twice_pairs_its_first_run_with_the_first_and_its_second_with_the_second():
    base, new = probes_run([4, 8, 4], 1), probes_run([4, 4], 2)
    rng = random.Random(7)
    _shape(base, 2, 0.08, rng)  # the base's second run of concurrency 4 was slower ...
    _shape(new, 1, 0.08, rng)  # ... and so is the new one's
    rows = _ttft_p50(compare(base.build(), new.build(), resamples=500))
    assert sorted(rows) == [("concurrency 4", 0, 0), ("concurrency 4", 2, 1)]
    assert all(abs(r.change) < 0.1 for r in rows.values()), rows


PHASES = """soak "phased" {{}}
backend "a" {{
  url = "http://127.0.0.1:8000"
  runtime {{
    label = "host-staged"
  }}
}}
workload "w" {{
  load {{
    mode = open
    phases {{
{phases}
    }}
  }}
  bucket = 1m
  deadline = 30s
  follow_up = false
}}
gate {{
  require failed == 0
}}
"""


def _phases(*phases: tuple[str, str]):
    body = "\n".join(f"      {name} {{\n        rate = {rate}\n        duration = 4m\n      }}" for name, rate in phases)
    return spec_from_text(PHASES.format(phases=body))


def test_phases_pair_by_name_and_a_phase_whose_load_changed_says_so():
    base = EvidenceBuilder(_phases(("steady", "2rps"), ("burst", "10rps")), per_bucket=20, run_id="b")
    new = EvidenceBuilder(_phases(("warm", "1rps"), ("steady", "2rps"), ("burst", "12rps")), per_bucket=20, run_id="n")
    c = compare(base.build(), new.build(), resamples=300)
    pairs = {(r.label, r.level, r.new_level, r.note) for r in c.rows if (r.metric, r.stat) == ("ttft", "p50")}
    assert pairs == {("phase steady, rate 2 rps", 0, 1, None),
                     ("phase burst, rate 10 rps", 1, 2, "load differs: base open concurrency=None rate=10.0, new open concurrency=None rate=12.0")}
    assert [(u.side, u.label) for u in c.unpaired] == [("new", "phase warm, rate 1 rps")]


def test_the_outputs_list_the_unpaired_levels(tmp_path, capsys, monkeypatch):
    # what is listed, not the intervals: without the tail-draw floor (60 rows: 24 000 draws a
    # side) the three renderings take a second, not twenty
    monkeypatch.setattr("soakspec.compare.intervals.MIN_TAIL_DRAWS", 0)
    base = probes_run(BASE_PROBES, 1).write(tmp_path / "base")
    new = probes_run(NEW_PROBES, 2).write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "300", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(u["side"], u["label"]) for u in doc["unpaired"]] == [
        ("base", "concurrency 12"), ("base", "concurrency 3"), ("new", "concurrency 16"), ("new", "concurrency 8")]
    assert doc["unpaired"][0]["message"] == "a · concurrency 12 (level 1 of w): only in the base run, no level of this load in the new run"
    assert {(r["level"], r["new_level"]) for r in doc["rows"] if r["label"] == "concurrency 6"} == {(2, 4)}
    assert main(["compare", str(base), str(new), "--resamples", "300"]) == 0
    md = capsys.readouterr().out
    unpaired = md.split("### Unpaired levels", 1)[1]
    assert "| `a · concurrency 16` | the new run | 1 of w |" in unpaired and "| `a · concurrency 3` | the base run | 3 of w |" in unpaired
    assert "concurrency 12" not in md.split("### Unpaired levels", 1)[0].split("### Per level", 1)[1]
    assert main(["compare", str(base), str(new), "--resamples", "300", "--format", "html"]) == 0
    page = capsys.readouterr().out
    assert 'id="unpaired"' in page and "a · concurrency 8</td><td>the new run" in page


def test_a_level_the_base_measured_and_the_new_run_lacks_makes_a_plain_comparison_inconclusive(tmp_path, capsys, monkeypatch):
    """Not a sweep: the base ran concurrency 4 and 8, the new run only 4. It said `Comparison:
    PASS` (exit 0) with "1 unpaired level": the new run never measured concurrency 8, and missing
    data is never a pass. A level only the new run has is new coverage: still PASS."""
    monkeypatch.setattr("soakspec.compare.intervals.MIN_TAIL_DRAWS", 0)
    both = probes_run([4, 8], 1, sweep=False).write(tmp_path / "both")
    four = probes_run([4], 2, sweep=False).write(tmp_path / "four")
    assert main(["compare", str(both), str(four), "--resamples", "200"]) == 3
    md = capsys.readouterr().out
    assert "**Comparison: INCONCLUSIVE**" in md, md
    assert "the new run lacks what the base run measured (a · concurrency 8 (level 1 of w)): not compared, and missing " \
           "data is never a pass" in md, md
    assert main(["compare", str(four), str(both), "--resamples", "200"]) == 0  # new coverage
    md = capsys.readouterr().out
    assert "**Comparison: PASS**" in md and "lacks" not in md, md
    # a sweep's probes differ run to run by design: listed as unpaired, the comparison decided by the rest
    assert compare(probes_run([4, 8], 1).build(), probes_run([4], 2).build(), resamples=200).outcome == "PASS"


def test_a_backend_the_base_measured_and_the_new_run_lacks_makes_the_comparison_inconclusive(tmp_path, capsys, monkeypatch):
    """The base (a combined run) has backends a and b, the new run only a: it said PASS with
    only the note "backend 'b' is only in the base run". It is INCONCLUSIVE, naming b; the other
    way round (b only in the new run) is new coverage, a note."""
    monkeypatch.setattr("soakspec.compare.intervals.MIN_TAIL_DRAWS", 0)
    two = EvidenceBuilder(small_spec(backends=("a", "b"), follow_up=False), per_bucket=20, run_id="two").write(tmp_path / "two")
    one = EvidenceBuilder(small_spec(follow_up=False), per_bucket=20, run_id="one").write(tmp_path / "one")
    assert main(["compare", str(two), str(one), "--resamples", "200", "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "INCONCLUSIVE" and doc["exit_code"] == 3, doc["summary"]
    assert "the new run lacks what the base run measured (backend 'b'): not compared, and missing data is never a pass" \
        in doc["reasons"], doc["reasons"]
    assert main(["compare", str(one), str(two), "--resamples", "200", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "PASS" and "backend 'b' is only in the new run" in doc["notes"], doc


def test_runs_of_the_same_levels_have_nothing_unpaired():
    c = compare(probes_run([2, 4], 1).build(), probes_run([2, 4], 2).build(), resamples=200)
    assert c.unpaired == () and "unpaired" not in c.summary() and c.to_json()["unpaired"] == []
    assert "Unpaired" not in render(c, "md") and 'id="unpaired"' not in render(c, "html")


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5, unique=True), st.lists(st.integers(1, 9), min_size=1, max_size=5, unique=True))
def test_sweeps_pair_exactly_the_loads_both_probed(base_probes, new_probes):
    """Whatever order two sweeps probed their loads in: a level is compared with the other run's
    level of the same load and only with it, and every other level is listed as unpaired."""
    c = compare(probes_run(base_probes, 1, per_bucket=4).build(), probes_run(new_probes, 2, per_bucket=4).build(), resamples=20)
    common = set(base_probes) & set(new_probes)
    assert {(r.label, r.level, r.new_level) for r in c.rows} == {
        (f"concurrency {v}", base_probes.index(v), new_probes.index(v)) for v in common}
    assert sorted((u.side, u.label, u.level) for u in c.unpaired) == sorted(
        [("base", f"concurrency {v}", i) for i, v in enumerate(base_probes) if v not in common]
        + [("new", f"concurrency {v}", i) for i, v in enumerate(new_probes) if v not in common])


# ---------------------------------------------------------------- a multi-turn level's turns


def turns_run(seed: int, turns: int = 3, *, deeper_ttft: float = 0.01, slower_turn: int | None = None,
              per_bucket: int = 90) -> EvidenceBuilder:
    """A multi-turn level: its requests the turns 1..`turns` of conversations in turn, each turn
    k's TTFT about 10 ms + (k - 1) x `deeper_ttft` (a longer history to prefill), turn
    `slower_turn`'s half as long again."""
    spec = small_spec(levels="[4]", duration="4m", bucket="1m", follow_up=False)
    b = EvidenceBuilder(spec, per_bucket=per_bucket, run_id=f"turns{seed}")
    rng = random.Random(seed)
    for j, r in enumerate(b.measured("a")):
        k = j % turns + 1
        t = (0.01 + (k - 1) * deeper_ttft) * (1.5 if k == slower_turn else 1.0) * rng.lognormvariate(0.0, 0.1)
        r.update(conversation=j // turns + 1, turn=k, ttft=t, first_token=r["start"] + t, latency=t + 0.15, end=r["start"] + t + 0.15)
    return b


def test_a_multi_turn_levels_ttft_is_compared_turn_by_turn():
    """Prefix caching, a scheduler change: what a multi-turn comparison is for is how TTFT went
    at each turn, which the level's rows mix. A new run whose third turns are half as slow again
    is a regression there and nowhere else per turn; rows per turn come after the level's, name
    the turn (label, JSON `turn`), and count in the family-wise correction. A rule looks at the
    level's rows only: a turn's p95 short of samples leaves `p95(ttft) regression <= 60%` as the
    level decides it."""
    base, new = turns_run(1).build(), turns_run(2, slower_turn=3).build()
    c = compare(base, new, rules=[parse_rule("require p95(ttft) regression <= 60%")], resamples=500)
    by_turn = {(r.turn, r.stat): r for r in c.rows if r.turn is not None}
    assert sorted(by_turn) == [(k, s) for k in (1, 2, 3) for s in ("p50", "p95")]
    assert {r.metric for r in by_turn.values()} == {"ttft"}
    assert [k for (k, s), r in by_turn.items() if s == "p50" and r.verdict == "regression"] == [3], by_turn
    assert 0.35 < by_turn[3, "p50"].change < 0.65 and by_turn[1, "p50"].verdict == "no significant change"
    assert by_turn[1, "p50"].n_base == 120  # a third of the level's 360 requests
    first_turn_row = min(i for i, r in enumerate(c.rows) if r.turn is not None)
    assert all(r.turn is None for r in c.rows[:first_turn_row]) and len(c.rows) - first_turn_row == 6
    assert c.rows[0].row_confidence == 1 - 0.05 / len(c.rows)
    assert all(c.rows[i].turn is None for i in c.rules[0].rows) and c.rules[0].status == "pass"
    assert by_turn[3, "p50"].where == "concurrency 4 · turn 3"
    md = render(c, "md")
    assert "| `a · concurrency 4 · turn 3` | p50(ttft) |" in md and "**REGRESSION**" in md
    rows = json.loads(render(c, "json"))["rows"]
    assert {r["turn"] for r in rows} == {None, 1, 2, 3}
    # the command reads the base run's samples up front (its table let go): the same rows
    from soakspec.compare import RunSamples

    again = compare(RunSamples.read(base, keep=False), new, rules=[parse_rule("require p95(ttft) regression <= 60%")], resamples=500)
    assert again.rows == c.rows


def test_turns_only_one_run_reached_are_said_and_later_turns_are_one_row_group():
    """How deep a level's sessions got depends on its length and the server: a turn only one
    run sent is said in a note, not a missing row; turns past the 20th are compared together, as
    results.json lists them ("turn 21+"). A single-turn level has no turn rows."""
    c = compare(turns_run(1, turns=3).build(), turns_run(2, turns=4).build(), resamples=300)
    assert {r.turn for r in c.rows} == {None, 1, 2, 3}
    assert any("concurrency 4: turn 4 only in the new run (not compared)" in n for n in c.notes), c.notes
    assert c.outcome == "PASS"
    deep = compare(turns_run(1, turns=25, per_bucket=100).build(), turns_run(2, turns=25, per_bucket=100).build(), resamples=300)
    assert sorted({r.turn for r in deep.rows if r.turn is not None}) == list(range(1, 22))
    (pooled,) = [r for r in deep.rows if r.turn == 21 and r.stat == "p50"]
    assert pooled.where == "concurrency 4 · turn 21+" and pooled.n_base == 5 * 400 // 25
    single = compare(probes_run([2], 1).build(), probes_run([2], 2).build(), resamples=200)
    assert all(r.turn is None for r in single.rows)


def test_a_capped_multi_turn_level_compares_sent_ttft_turn_by_turn():
    """Where both runs cap a multi-turn level (max_concurrency), each turn's ttft rows are
    followed by its sent_ttft rows (p50, p95), as the level's are: a turn whose server time grew
    while its queue shrank by as much is no ttft change there and a sent_ttft regression, which
    only the turn's sent_ttft row shows. The rows count in the family-wise correction; rules
    still judge the level's rows only; a run read up front gives the same rows. (An uncapped
    level's turns keep ttft's rows alone: the test above.)"""
    spec = small_spec(mode="open", levels="[2rps]\n    max_concurrency = 4", duration="4m", bucket="1m", follow_up=False)

    def capped_turns(seed: int, slower_turn: int | None = None) -> EvidenceBuilder:
        b = EvidenceBuilder(spec, per_bucket=90, run_id=f"capped{seed}")
        rng = random.Random(seed)
        for j, r in enumerate(b.measured("a")):
            k = j % 3 + 1
            server = (0.01 + (k - 1) * 0.01) * rng.lognormvariate(0.0, 0.1)
            wait = 0.05 * rng.lognormvariate(0.0, 0.1)
            if k == slower_turn:  # the server half as slow again, the queue shorter by as much
                server, wait = server * 1.5, wait - server * 0.5
            start = r["intended_start"] + wait
            r.update(conversation=j // 3 + 1, turn=k, start=start, admitted=start, ttft=wait + server,
                     first_token=start + server, latency=wait + server + 0.15, end=start + server + 0.15)
        return b

    base, new = capped_turns(1).build(), capped_turns(2, slower_turn=3).build()
    rule = parse_rule("require p95(ttft) regression <= 60%")
    c = compare(base, new, rules=[rule], resamples=500)
    by_turn = {(r.turn, r.metric, r.stat): r for r in c.rows if r.turn is not None}
    assert sorted(by_turn) == sorted((k, m, s) for k in (1, 2, 3) for m in ("ttft", "sent_ttft") for s in ("p50", "p95"))
    first_turn_row = min(i for i, r in enumerate(c.rows) if r.turn is not None)
    assert [(r.turn, r.metric) for r in c.rows[first_turn_row:first_turn_row + 4]] == [(1, "ttft")] * 2 + [(1, "sent_ttft")] * 2
    assert by_turn[3, "sent_ttft", "p50"].verdict == "regression", by_turn[3, "sent_ttft", "p50"]
    assert by_turn[3, "ttft", "p50"].verdict == "no significant change", by_turn[3, "ttft", "p50"]
    assert by_turn[1, "sent_ttft", "p50"].verdict == "no significant change"
    assert c.rows[0].row_confidence == 1 - 0.05 / len(c.rows)
    assert all(c.rows[i].turn is None for i in c.rules[0].rows)
    assert "| `a · rate 2 rps, max_concurrency 4 · turn 3` | p50(sent_ttft) |" in render(c, "md")
    from soakspec.compare import RunSamples

    assert compare(RunSamples.read(base, keep=False), new, rules=[rule], resamples=500).rows == c.rows
