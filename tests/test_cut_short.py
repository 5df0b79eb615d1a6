"""A level cut short -- Ctrl-C (SIGINT) or a server that dies mid-level -- keeps what it
measured: its manifest entry lists the bucket windows that had begun (every bucket its
requests name; the last one ends where the level stopped), says `completed = false` with
`measure_end` at the cut, and the judge reports the later buckets as not measured -- never
"requests name bucket N, which the manifest does not list" (which reads like corruption)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from runner_support import manifest, new_marker, requests_of, run_soakspec, run_spec, sim_spec, soakspec_cmd
from soakspec.evidence.io import iter_jsonl
from test_partial import _sigkill_mid_bucket

FAST = "ttft = 20ms\n    itl = 5ms"


def _check_cut_level(out: Path, tmp_path: Path) -> dict:
    """The evidence of a run aborted mid-level (6 buckets of 1 s): the level's entry and the
    gate's reading of it. Returns the level's entry."""
    m = manifest(out)
    assert m["status"] == "aborted" and m["incomplete_reason"]
    (lv,) = m["backends"][0]["levels"]
    assert lv["completed"] is False
    listed = [b["index"] for b in lv["buckets"]]
    named = {r["bucket"] for r in requests_of(out) if r["bucket"] >= 0}
    closed = {r["bucket"] for _, r in iter_jsonl(out / "backends" / "b0" / "buckets.jsonl")}
    assert named and set(listed) == named, (listed, named)  # every bucket a request names, and no other
    assert closed <= set(listed) and 0 < len(listed) < 6
    assert listed == list(range(len(listed)))
    last = lv["buckets"][-1]
    assert lv["measure_end"] is not None and lv["measure_start"] < lv["measure_end"] <= lv["measure_start"] + 6
    assert last["end"] == lv["measure_end"] and last["planned_length_s"] == 1.0  # the cut bucket ends at the cut
    assert all(b["end"] - b["start"] == 1.0 for b in lv["buckets"][:-1])

    gate = run_soakspec(["gate", str(out)], new_marker(), tmp_path)
    text = gate.stdout + gate.stderr
    assert gate.returncode == 3 and "INCONCLUSIVE" in text, text
    assert "which the manifest does not list" not in text, text
    missing = f"buckets {len(listed)}-5" if len(listed) < 5 else "bucket 5"
    assert f"{missing} of 6 not measured: the level was cut short in bucket {listed[-1]}" in text, text
    assert "kept up in 0 buckets" not in text and "started outside the window" not in text, text
    assert "window is" not in text, text  # the cut bucket's shorter window is not a wrong one
    results = json.loads((out / "results.json").read_text())
    (lr,) = results["backends"][0]["levels"]
    assert lr["wall_s"] is not None and lr["wall_s"] > 0 and lr["buckets"] == listed
    return lv


def test_sigint_mid_level_keeps_the_buckets_that_ran_listed(tmp_path):
    spec = tmp_path / "t.soak"
    spec.write_text(sim_spec(sim=FAST, duration="6s", bucket="1s", deadline="500ms", follow_up=False))
    out = tmp_path / "ev"
    lines = out / "backends" / "b0" / "buckets.jsonl"
    # a bucket's line is written 1.5 s after its window (deadline + grace): SIGINT in bucket ~3
    code, _, err = _sigkill_mid_bucket(soakspec_cmd("run", str(spec), "--out", str(out), "--quiet"), tmp_path,
                                       lambda: lines.exists() and lines.read_bytes().count(b"\n") >= 1,
                                       "no closed bucket", sig=signal.SIGINT)
    assert code == 4 and "interrupted by SIGINT" in err, err
    assert manifest(out)["incomplete_reason"] == "interrupted by SIGINT"
    _check_cut_level(out, tmp_path)


def test_a_server_that_dies_mid_level_keeps_the_buckets_that_ran_listed(tmp_path):
    # ~36 requests a second at concurrency 2: the 80th arrives about 2 s into the level
    proc, out = run_spec(tmp_path, sim_spec(sim=FAST + "\n    crash_after_requests = 80", duration="6s", bucket="1s",
                                            deadline="500ms", follow_up=False))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "server exited" in manifest(out)["incomplete_reason"]
    _check_cut_level(out, tmp_path)
