"""A multi-turn record says which conversation and which user turn it sent, and the results
and reports show TTFT by turn.

A multi-turn session's turns differ in what they cost: turn k carries its conversation so far
(its prompt grows with k) while the server's prefix cache may hold the history. The records
carried no conversation or turn index, so a soak of `multi_turn = true` could not say how
TTFT went with the turn -- the figure a user of vLLM's multi-turn benchmark looks for. Each
record now carries `conversation` (the prompt file's, from 1) and `turn` (from 1), results.json
a level's `turns`, and the reports a "By turn" table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from runner_support import REPO, read_jsonl, run_spec
from soakspec.evidence.record import Record, decode_line
from soakspec.evidence.testing import sample_request
from soakspec.judge import summarize
from soakspec.judge.summary import MAX_TURNS_LISTED
from soakspec.judge.testing import EvidenceBuilder, small_spec
from specs import one_workload_spec

CONVERSATIONS, TURNS = 3, 3


@pytest.fixture(scope="module")
def multi_turn_run(tmp_path_factory) -> Path:
    """A real run on the simulator: 3 conversations of 3 user turns, turn t's question 5 t words
    longer, two sessions, 2 s."""
    tmp_path = tmp_path_factory.mktemp("multi-turn")
    convs = []
    for i in range(CONVERSATIONS):
        turns = []
        for t in range(1, TURNS + 1):
            turns += [{"from": "human", "value": f"c{i} q{t} " + "word " * (5 * t)}, {"from": "gpt", "value": "answer " * 10}]
        convs.append({"conversations": turns})
    (tmp_path / "sg.json").write_text(json.dumps(convs))
    before = 'endpoint = chat\n  prompt_file = "sg.json"\n  multi_turn = true\n  max_tokens = 4'  # beside the spec
    text = one_workload_spec(name="mt", issue="1", before_load=before, load="mode = closed\n    concurrency = [2]",
                             after_load="warmup = 0s\n  duration = 2s\n  bucket = 1s\n  deadline = 5s\n  follow_up = false")
    # a per-turn rule in the run's own gate: `run` writes verdict.json with it (schema-checked)
    text = text.replace("  require failed == 0\n", "  require failed == 0\n  require failed == 0 per turn\n", 1)
    proc, out = run_spec(tmp_path, text)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_each_turn_is_recorded_with_its_conversation_and_turn_and_shown_by_turn(multi_turn_run):
    out = multi_turn_run
    rows = read_jsonl(out / "backends" / "sim" / "requests.jsonl.gz")
    measured = [r for r in rows if r["bucket"] >= 0]
    assert len(measured) >= 2 * TURNS  # two sessions, each through at least one conversation
    assert all(1 <= r["conversation"] <= CONVERSATIONS and 1 <= r["turn"] <= TURNS for r in measured)
    # a session's turns follow each other in its conversation (a worker's requests in send order)
    for w in {r["worker"] for r in measured}:
        mine = sorted((r for r in measured if r["worker"] == w), key=lambda r: r["start"])
        for a, b in zip(mine, mine[1:]):
            assert (b["conversation"], b["turn"]) == (a["conversation"], a["turn"] + 1) or (a["turn"] == TURNS and b["turn"] == 1)
    # turn t carries the turns before it: the server counts more prompt tokens the later the turn
    by_turn = {t: {r["prompt_tokens"] for r in measured if r["turn"] == t} for t in range(1, TURNS + 1)}
    assert max(by_turn[1]) < min(by_turn[2]) and max(by_turn[2]) < min(by_turn[3]), by_turn

    (rule,) = [r for r in json.loads((out / "verdict.json").read_text())["rules"] if r["scope"] == "turn"]
    assert rule["status"] == "pass" and "all 3 turns pass" in rule["message"], rule
    (level,) = json.loads((out / "results.json").read_text())["backends"][0]["levels"]
    turns = level["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and not any(t["and_later"] for t in turns)
    assert sum(t["requests"]["total"] for t in turns) == level["requests"]["total"]
    for t in turns:
        assert t["requests"]["total"] == sum(1 for r in measured if r["turn"] == t["turn"])
        assert t["ttft"]["count"] == t["requests"]["completed"]
    assert turns[0]["prompt_tokens"]["mean"] < turns[2]["prompt_tokens"]["mean"]

    # from another folder than the spec's: its relative prompt file is found where the manifest
    # recorded it, the same bytes the run read (`prompt_files`)
    manifest = json.loads((out / "manifest.json").read_text())
    (recorded,) = manifest["spec"]["prompt_files"].values()
    assert Path(recorded["path"]) == out.parent / "sg.json" and recorded["format"] == "sharegpt"
    md = subprocess.run([sys.executable, "-m", "soakspec", "report", str(out), "--format", "md"], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
    assert md.returncode == 0 and "W513" not in md.stderr and "is not at" not in md.stderr, md.stderr
    section = md.stdout.split("### By turn", 1)[1].split("###", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("| sim")]
    assert [ln.split(" | ")[1] for ln in lines] == ["1", "2", "3"], section
    html = subprocess.run([sys.executable, "-m", "soakspec", "report", str(out), "--format", "html"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert html.returncode == 0 and "<h2>By turn</h2>" in html.stdout


def test_a_rule_per_turn_is_judged_on_each_turns_requests_and_names_the_turn(multi_turn_run, tmp_path):
    """Turn 3 carries two turns of history: its prompts are the longest. A rule on prompt
    tokens per turn fails there, naming it, where the level's requests together would pass;
    verdict.json says which turn."""
    spec = (multi_turn_run / "manifest.json")
    text = json.loads(spec.read_text())["spec"]["text"]
    rules = ("  require max(prompt_tokens) < 50 per turn\n  warn p50(ttft) < 10s per turn\n"
             "  require ratio(failed) == 0 per turn\n  require mean(prompt_tokens) < 50 per level\n")
    spec_file = multi_turn_run.parent / "turn.soak"  # beside the run's spec and its prompt file
    spec_file.write_text(text.replace("  require failed == 0\n", "  require failed == 0\n" + rules, 1))
    got = subprocess.run([sys.executable, "-m", "soakspec", "gate", str(multi_turn_run), "--spec", str(spec_file),
                          "--format", "json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert got.returncode == 1, got.stderr[-2000:]
    verdict = json.loads(got.stdout)
    by_rule = {r["rule"]: r for r in verdict["rules"]}
    failed = by_rule["max(prompt_tokens) < 50 per turn"]
    assert failed["status"] == "fail" and "turn 3" in failed["message"] and "turn 1" not in failed["message"], failed["message"]
    assert failed["where"]["turn"] == 3 and [d["where"]["turn"] for d in failed["details"]] == [3]
    assert by_rule["ratio(failed) == 0 per turn"]["status"] == "pass"
    assert "all 3 turns pass" in by_rule["ratio(failed) == 0 per turn"]["message"]
    assert by_rule["mean(prompt_tokens) < 50 per level"]["status"] == "pass"  # the turns together hide turn 3


def test_per_turn_takes_request_measures_of_a_multi_turn_workload():
    from soakspec.lang import load_text

    single = one_workload_spec(name="t", issue="1", before_load="max_tokens = 8", load="mode = closed\n    concurrency = [2]",
                               after_load="duration = 2s\n  deadline = 5s")  # a workload without multi_turn
    for rule, code, said in (("require p95(ttft) < 1s per turn", "E403", "no workload has multi_turn = true"),
                             ("require mean(qps) > 1rps per turn", "E305", "series of the level's buckets"),
                             ("require rate(completed) > 1rps per turn", "E305", "rate() is per second"),
                             ("require bucket_coverage per turn", "E305", "evidence check"),
                             ("abort ratio(failed) > 50% per turn", "E422", "per bucket or per window")):
        spec, diags, _ = load_text(single.replace("require failed == 0", rule), "<t>")
        assert spec is None and any(d.code == code and said in d.message for d in diags), (rule, [(d.code, d.message) for d in diags])


def test_a_single_turn_workload_has_no_turns():
    spec = small_spec("require failed == 0")
    ev = EvidenceBuilder(spec, per_bucket=5).build()
    levels = summarize(ev, spec)["backends"][0]["levels"]
    assert levels and all(lv["turns"] is None for lv in levels)


def test_turns_past_the_listed_ones_are_one_last_entry():
    """A conversation of 25 user turns: turns 1-20 each, then 21-25 together (and_later), so
    results.json stays bounded whatever the prompt file holds."""
    spec = small_spec("require failed == 0")
    b = EvidenceBuilder(spec, per_bucket=25)
    recs = [r for r in b.measured("a")]
    for k, r in enumerate(recs):
        r["conversation"], r["turn"] = 1, k % 25 + 1
    ev = b.build()
    (level,) = summarize(ev, spec)["backends"][0]["levels"]
    turns = level["turns"]
    assert [t["turn"] for t in turns] == list(range(1, MAX_TURNS_LISTED + 2))
    assert [t["and_later"] for t in turns] == [False] * MAX_TURNS_LISTED + [True]
    per = {t["turn"]: t["requests"]["total"] for t in turns}
    assert per[MAX_TURNS_LISTED + 1] == sum(1 for k in range(len(recs)) if k % 25 + 1 > MAX_TURNS_LISTED)
    assert sum(per.values()) == level["requests"]["total"] == len(recs)


def test_a_record_before_format_4_reads_as_no_turn_and_a_bad_turn_is_refused():
    old = {k: v for k, v in sample_request(0).items() if k not in ("conversation", "turn")}
    rec = decode_line(json.dumps(old).encode() + b"\n")
    assert isinstance(rec, Record) and rec.conversation is None and rec.turn is None
    for bad in (0, -1, "2", 1.5, True):
        with pytest.raises(msgspec.ValidationError, match="turn"):
            decode_line(json.dumps(sample_request(0, turn=bad, conversation=1)).encode() + b"\n")
        with pytest.raises(msgspec.ValidationError, match="conversation"):
            decode_line(json.dumps(sample_request(0, turn=1, conversation=bad)).encode() + b"\n")


def test_turns_are_grouped_whatever_their_number_and_order():
    """Per turn scopes from hand-made evidence: turns out of order, a turn beyond int32 (held
    beside the column), requests without a turn (in no turn's scope, and the level's still) --
    each request in exactly its own turn's scope, none lost."""
    from soakspec.judge.joined import join
    from soakspec.judge.scope import scopes

    spec = small_spec("require failed == 0")
    b = EvidenceBuilder(spec, per_bucket=7)
    recs = list(b.measured("a"))
    turns = [5, 1, 2**40, None, 3, 1, 5] * (len(recs) // 7) + [2] * (len(recs) % 7)
    for r, k in zip(recs, turns):
        r["conversation"], r["turn"] = (None, None) if k is None else (1, k)
    run = join(spec, b.build())
    got = {sc.turn: sorted(r["request_id"] for r in sc.records) for sc in scopes("turn", run.indexes)}
    want: dict[int, list[str]] = {}
    for r, k in zip(recs, turns):
        if k is not None:
            want.setdefault(k, []).append(r["request_id"])
    assert got == {k: sorted(v) for k, v in want.items()}
    assert list(got) == sorted(got)


def test_every_scope_a_rule_may_take_is_one_verdict_json_may_name():
    """verdict.json is checked against its schema when a run writes it: a scope the checker
    accepts and the schema does not name made `soakspec run` end in an internal error after the
    whole soak (found on the real-server lane when `per turn` was added)."""
    from soakspec.evidence import schema
    from soakspec.lang.check import SCOPES

    named = schema.load_schema("verdict")["$defs"]["rule"]["properties"]["scope"]["enum"]
    assert set(SCOPES) <= set(named), set(SCOPES) - set(named)


def test_a_runs_spec_is_judged_with_the_prompt_file_it_read_or_without_one(tmp_path, monkeypatch):
    """`gate DIR` and `report DIR` check the spec the run embedded, whose prompt file is
    relative to the spec's folder: from anywhere else they refused the evidence ("does not check
    with this soakspec", exit 2) though what the run sent is in its records -- or read whatever
    file of that name lay in the working folder. The file is now looked for there and where the
    manifest recorded it, and taken only with the sha256 the run read; else the evidence is
    judged without it (W513, said on stderr). `check` of the spec itself still refuses a
    missing file (E419), and any other error of the embedded spec still stops them."""
    import hashlib

    from soakspec.judge.cli_support import UsageError, spec_for
    from soakspec.lang import load_text

    convs = [{"conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a"}, {"from": "human", "value": "q2"}]}]
    text = one_workload_spec(name="mt", issue="1", before_load='endpoint = chat\n  prompt_file = "conv.json"\n  multi_turn = true',
                             load="mode = closed\n    concurrency = [2]", after_load="duration = 2s\n  follow_up = false")
    run_dir, here = tmp_path / "specs", tmp_path / "elsewhere"
    run_dir.mkdir(), here.mkdir()
    (run_dir / "conv.json").write_text(json.dumps(convs))
    sha = hashlib.sha256((run_dir / "conv.json").read_bytes()).hexdigest()
    monkeypatch.chdir(here)

    class Ev:  # what spec_for reads of an evidence directory
        spec_text = text
        spec_sha256 = None
        manifest = {"spec": {"prompt_files": {"w": {"path": str(run_dir / "conv.json"), "format": "sharegpt", "sha256": sha}}}}

    spec, notes = spec_for(Ev(), None, str(tmp_path))  # found where the manifest says, the same bytes
    assert spec.workloads[0].dataset is not None and spec.workloads[0].dataset.sha256 == sha and not notes
    (here / "conv.json").write_text(json.dumps(convs * 2))  # another file of that name, here
    (run_dir / "conv.json").unlink()
    spec, notes = spec_for(Ev(), None, str(tmp_path))
    assert spec.workloads[0].dataset is None and spec.workloads[0].multi_turn
    assert any("is not the file the run read" in n and "judged without it" in n for n in notes), notes
    (here / "conv.json").unlink()
    Ev.manifest = {}  # evidence from before the manifest recorded it
    spec, notes = spec_for(Ev(), None, str(tmp_path))
    assert spec.workloads[0].dataset is None and any("the prompt file 'conv.json' is not at" in n for n in notes), notes
    strict, diags, _ = load_text(text, str(here / "w.soak"))
    assert strict is None and any(d.code == "E419" for d in diags)
    Ev.spec_text = text.replace("concurrency = [2]", "concurrency = [0]")
    with pytest.raises(UsageError, match="does not check"):
        spec_for(Ev(), None, str(tmp_path))


def test_turns_edited_into_the_records_afterwards_fail_the_gate(multi_turn_run, tmp_path):
    """The records say which turn a request sent; the server has no say in it. An edit that moves
    the longest prompts to turn 1 -- so that `max(prompt_tokens) < 50 per turn` reads as if turn 3
    held -- changes requests.jsonl.gz, whose sha256 the manifest records: artifacts_verified
    FAILs and the gate exits 1, whatever the per-turn rule then reads."""
    import gzip
    import shutil

    ev = tmp_path / "ev"
    shutil.copytree(multi_turn_run, ev)
    path = ev / "backends" / "sim" / "requests.jsonl.gz"
    rows = [json.loads(x) for x in gzip.decompress(path.read_bytes()).decode().splitlines() if x]
    for r in rows:
        if r.get("turn") == 3:
            r["turn"] = 1
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    text = json.loads((ev / "manifest.json").read_text())["spec"]["text"]
    spec_file = multi_turn_run.parent / "edited.soak"
    spec_file.write_text(text.replace("  require failed == 0\n", "  require failed == 0\n  require max(prompt_tokens) < 50 per turn\n", 1))
    got = subprocess.run([sys.executable, "-m", "soakspec", "gate", str(ev), "--spec", str(spec_file), "--format", "json"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert got.returncode == 1, got.stderr[-2000:]
    by_rule = {r["rule"]: r for r in json.loads(got.stdout)["rules"]}
    assert by_rule["artifacts_verified"]["status"] == "fail", by_rule["artifacts_verified"]
    assert json.loads(got.stdout)["verdict"] != "PASS"


def test_check_warns_when_a_conversations_deepest_turn_cannot_fill_a_percentile_per_turn(tmp_path):
    """One conversation of four user turns among nine of one: a session's requests are mostly
    first turns, and turns 2 to 4 get about one request in thirteen each -- too few for a p95
    per turn, which can then only be INCONCLUSIVE. `check` says so before anything runs (W509,
    naming the turns), and the run bears it out; a p50 per turn, which they can fill, is not
    warned about."""
    from soakspec.lang import load_text

    convs = [{"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]} for i in range(9)]
    convs.append({"conversations": [m for t in range(4) for m in ({"from": "human", "value": f"long q{t}"},
                                                                   {"from": "gpt", "value": "a"})]})
    (tmp_path / "conv.json").write_text(json.dumps(convs))
    text = one_workload_spec(name="deep", issue="1",
                             before_load='endpoint = chat\n  prompt_file = "conv.json"\n  multi_turn = true\n  max_tokens = 4',
                             load="mode = closed\n    concurrency = [2]",
                             after_load="warmup = 0s\n  duration = 3s\n  bucket = 3s\n  deadline = 5s\n  follow_up = false")
    text = text.replace("  require failed == 0\n", "  require failed == 0\n  warn p95(ttft) < 10s per turn\n"
                                                   "  warn p50(ttft) < 10s per turn\n", 1)
    spec_file = tmp_path / "deep.soak"
    spec_file.write_text(text)
    spec, diags, _ = load_text(text, str(spec_file))
    warned = [d.message for d in diags if d.code == "W509"]
    assert len(warned) == 1 and warned[0].startswith("p95(ttft) per turn needs 59 samples"), warned
    assert "per turn are planned (workload 'w' at concurrency 2, turns 2-4)" in warned[0], warned
    proc, out = run_spec(tmp_path, text, "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    by_rule = {r["rule"]: r for r in json.loads(proc.stdout)["rules"]}
    p95, p50 = by_rule["p95(ttft) < 10s per turn"], by_rule["p50(ttft) < 10s per turn"]
    assert p95["status"] == "inconclusive" and "turn 2:" in p95["message"] and p95["failing"] == 3, p95
    assert p50["status"] == "pass", p50
