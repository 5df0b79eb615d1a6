"""Audit of what `soakspec plan` and `check` say against what the runner does: each case is the
user's view (`plan --format json`'s numbers, a diagnostic's code and place) of a spec the audit
found the plan or the checker misstating."""

from __future__ import annotations

import json

from soakspec.cli import main

BATCH = """soak "u" {}
model { id = "m" }
backend "a" { sim { ttft = 10ms } }
workload "w" {
  prompt_words = 8
  max_tokens = 8
  load { mode = batch  concurrency = [%s]  requests = %d }
  expected_latency = 1s
  duration = 10s
  bucket = 5s
  deadline = 10s
}
gate {
  require failed == 0
  require p50(ttft) < 1s per level
}
claims { claim "x" }
"""


def _plan_json(capsys, tmp_path, text: str) -> dict:
    path = tmp_path / "s.soak"
    path.write_text(text)
    code = main(["plan", "--format", "json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def _check(capsys, tmp_path, text: str) -> tuple[int, str]:
    path = tmp_path / "s.soak"
    path.write_text(text)
    code = main(["check", str(path)])
    out, err = capsys.readouterr()
    return code, out + err


def test_a_batch_levels_expected_requests_follow_the_runners_barrier(capsys, tmp_path):
    """`_batch` keeps at most `requests` in flight with a barrier after each batch: 2 at a time
    at concurrency 8, a 1 s batch, 10 s -- 20 requests, not concurrency × duration / latency = 80;
    batches of 10 at concurrency 4 are waves of 4, 4, 2 a second apart -- 3 whole batches and the
    first wave of a fourth in 10 s, 34 (not 40)."""
    doc = _plan_json(capsys, tmp_path, BATCH % ("8", 2))
    (lv,) = doc["backends"][0]["levels"]
    assert (lv["min_requests"], lv["expected_requests"], doc["expected_requests"]) == (2, 20, 20)
    doc = _plan_json(capsys, tmp_path, BATCH % ("4", 10))
    (lv,) = doc["backends"][0]["levels"]
    assert (lv["min_requests"], lv["expected_requests"], doc["expected_requests"]) == (10, 34, 34)
    doc = _plan_json(capsys, tmp_path, BATCH % ("4, 8", 8))  # 8 at 4: 2 waves a batch, 5 batches; at 8: 10
    assert [lv["expected_requests"] for lv in doc["backends"][0]["levels"]] == [40, 80]


def test_w509_counts_a_batch_level_as_the_plan_does(capsys, tmp_path):
    """W509's per-level count of a batch level is the plan's: 34 (not 33, the long-run rate's
    3.33 a second times 10 s), so p99 per level (299 samples at 95%) says 'about 34'."""
    code, text = _check(capsys, tmp_path, BATCH.replace("p50(ttft)", "p99(ttft)") % ("4", 10))
    assert code == 0, text
    assert "W509" in text and "about 34 per level are planned" in text, text


SWEEP = """soak "s" {}
model { id = "m" }
backend "a" { sim { slots = 4  ttft = 20ms  itl = 10ms } }
workload "short" {
  prompt_words = 8
  max_tokens = 8
  load { mode = open  rate = [1rps, 40rps]  rate_step = 7rps  search = bisect  max_wall = %s }
  duration = 5s
  bucket = 5s
  deadline = 10s
  follow_up = false
}
gate { require failed == 0 per level }
claims { claim "x" }
"""


def test_a_sweeps_plan_counts_the_probes_its_wall_time_lets_start(capsys, tmp_path):
    """5 s probes under max_wall = 12s: the runner starts none that would end after 12 s from
    the first's start, so at most 2 run (about 10 s) -- not the search's 5 in 12 s."""
    doc = _plan_json(capsys, tmp_path, SWEEP % "12s")
    (lv,) = doc["backends"][0]["levels"]
    sw = lv["sweep"]
    assert (sw["max_probes"], doc["bucket_count"], doc["est_wall_s"]) == (2, 2, 10.0)
    assert (sw["search_probes"], sw["max_wall_s"]) == (5, 12.0)
    main(["plan", str(tmp_path / "s.soak")])
    text = capsys.readouterr().out
    assert "at most 2 probes of 5s each" in text and "which cuts the search's 5 short" in text, text
    assert "wall time ≈ 10s" in text, text
    doc = _plan_json(capsys, tmp_path, SWEEP % "1m")  # room for the whole search: its 5
    assert (doc["backends"][0]["levels"][0]["sweep"]["max_probes"], doc["bucket_count"], doc["est_wall_s"]) == (5, 5, 25.0)


REPLAY = """soak "u" {}
model { id = "m" }
backend "a" { sim { ttft = 10ms } }
workload "w" {
  prompt_words = 5000
  load { mode = replay  trace = "t.jsonl" }
  bucket = 2s
  deadline = 10s
}
gate { require failed == 0 }
claims { claim "x" }
"""


def test_prompt_words_in_a_replay_is_e403_like_the_other_prompt_sources(capsys, tmp_path):
    """A replayed request's prompt is its trace line's input_length in words, whatever
    prompt_words says (it would only have sized the pre-flight's prompt): `check` said ok and
    the plan's request template showed 'prompt_words': 5000. It is E403 at the key, as
    prompt_file, prompt_tokens and max_tokens are."""
    (tmp_path / "t.jsonl").write_text("".join(
        f'{{"timestamp": {i * 100}, "input_length": {10 + i}, "output_length": 4}}\n' for i in range(5)))
    code, text = _check(capsys, tmp_path, REPLAY)
    assert code == 2 and "s.soak:5:3: E403 'prompt_words' does not apply to mode = replay" in text, text
    code, text = _check(capsys, tmp_path, REPLAY.replace("  prompt_words = 5000\n", ""))
    assert code == 0 and text.strip().endswith("s.soak: ok"), text
