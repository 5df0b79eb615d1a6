"""Replay evidence written before this soakspec read its spec's text differently is judged, with
its own embedded spec, as the level that ran (`judge.cli_support.as_it_ran`):

- a trace's `hash_ids` were ignored (every prompt unique) before prefix sharing became the
  default: a run whose level shapes record no `prefix_blocks` sent unique prompts;
- a replay without `duration` measured the trace's span rounded up to whole buckets before its
  window became one mean gap past the last arrival, within its bucket (`lang.replay`).

Before, `gate DIR` on such evidence re-planned the embedded spec with today's meaning and read
"not the level the spec plans": an INCONCLUSIVE for a run that passed. A spec given with
`--spec` is still taken as written. The older evidence is made the way it differs: a real run
on the simulator, then its manifest as the earlier soakspec wrote it (the shape without
`prefix_blocks`; the embedded text without the `duration` the run was planned with)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runner_support import manifest, new_marker, run_env, wait_no_survivors

from soakspec.evidence.manifest import manifest_sha256, spec_entry
from soakspec.lang.replay import earlier_replay_rest, replay_rest

SPEC = """soak "r" {{
  issue = "test"
}}
model {{
  id = "sim-model"
}}
backend "b0" {{
  sim {{
    ttft = 10ms
    itl = 1ms
    slots = 16
  }}
  runtime {{
    label = "host"
  }}
}}
workload "w" {{
  endpoint = completions
  load {{
    mode = replay
    trace = "trace.jsonl"{load}
  }}
  bucket = 2s{duration}
  deadline = 10s
  follow_up = false
}}
gate {{
  require failed == 0
}}
claims {{
  claim "test"
}}
"""


def _soakspec(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    marker = new_marker()
    proc = subprocess.run([sys.executable, "-m", "soakspec", *args], cwd=cwd, env=run_env(marker),
                          capture_output=True, text=True, timeout=120)
    assert wait_no_survivors(marker) == []
    return proc


def _trace(tmp_path: Path, stamps_ms, hash_ids=None) -> None:
    rows = []
    for i, t in enumerate(stamps_ms):
        row = {"timestamp": t, "input_length": 24, "output_length": 2}
        if hash_ids is not None:
            row["hash_ids"] = hash_ids[i]
        rows.append(row)
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(tmp_path: Path, spec_text: str) -> Path:
    (tmp_path / "r.soak").write_text(spec_text)
    proc = _soakspec(tmp_path, "run", "r.soak", "--out", "ev", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "ev"


def _rewrite_manifest(ev: Path, edit) -> None:
    """The manifest as the earlier soakspec wrote it, sealed as a run seals it: the embedded
    text's sha256 (`spec_entry`), and results.json / verdict.json bound to its bytes
    (`manifest_sha256`)."""
    path = ev / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    m["spec"] = spec_entry(m["spec"]["path"], m["spec"]["text"])
    path.write_text(json.dumps(m, indent=2))
    for derived in ("results.json", "verdict.json"):
        doc = json.loads((ev / derived).read_text())
        doc["manifest_sha256"] = manifest_sha256(ev)
        (ev / derived).write_text(json.dumps(doc, indent=2))


def test_evidence_from_before_prefix_sharing_is_judged_as_the_unique_prompts_it_sent(tmp_path):
    """A Mooncake trace with shared hash_ids, run, then its manifest as it was written before
    prefix sharing (no `prefix_blocks` in the level's shape): `gate DIR` passes, and the report
    says nothing of shared blocks; `--spec` with the sharing spec is not the level that ran."""
    _trace(tmp_path, [0, 100, 200, 300, 400, 500], [[0, 1], [0, 1], [0, 2], [0, 1], [3], [0, 1]])
    ev = _run(tmp_path, SPEC.format(load="\n    hash_block = 8", duration=""))
    shape = manifest(ev)["backends"][0]["levels"][0]["shape"]
    assert shape["prefix_blocks"]["distinct"] == 4  # the run today: shared blocks, recorded

    def before_prefix_sharing(m):
        for lv in m["backends"][0]["levels"]:
            del lv["shape"]["prefix_blocks"]

    _rewrite_manifest(ev, before_prefix_sharing)
    gate = _soakspec(tmp_path, "gate", "ev")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "PASS: all" in gate.stdout and "not the level the spec plans" not in gate.stdout
    report = _soakspec(tmp_path, "report", "ev")
    assert report.returncode == 0, report.stderr
    line = next(x for x in report.stdout.splitlines() if x.startswith("- workload:"))
    assert "replay of 6 requests" in line and "hash_ids" not in line, line
    strict = _soakspec(tmp_path, "gate", "ev", "--spec", "r.soak")
    assert strict.returncode == 3, strict.stdout
    assert "not the level the spec plans" in strict.stdout


def test_a_replay_planned_with_the_earlier_window_is_judged_as_that_window(tmp_path):
    """22 arrivals 100 ms apart (the last at 2.1 s) in 2 s buckets: today's window without
    `duration` is 2.2 s (one mean gap past the last arrival, within its bucket); the earlier
    rule planned 4 s, two whole buckets. A run planned 4 s whose embedded spec has no
    `duration` -- evidence of the earlier soakspec -- passes `gate DIR` as the 4 s level it
    was; the same evidence with an embedded `duration = 3s` is still not that level."""
    stamps = [i * 100 for i in range(22)]
    offsets = tuple(t / 1000 for t in stamps)
    assert abs(replay_rest(offsets, 1.0, 0.0, 2.0) - 2.2) < 1e-9
    assert earlier_replay_rest(offsets, 1.0, 0.0, 2.0) == 4.0
    _trace(tmp_path, stamps)
    ev = _run(tmp_path, SPEC.format(load="", duration="\n  duration = 4s"))
    assert manifest(ev)["backends"][0]["levels"][0]["planned_duration_s"] == 4.0

    def embedded(duration_line: str):
        def edit(m):
            m["spec"]["text"] = m["spec"]["text"].replace("  duration = 4s\n", duration_line)
            assert m["spec"]["text"].count("duration =") == duration_line.count("duration =")
        return edit

    _rewrite_manifest(ev, embedded(""))
    gate = _soakspec(tmp_path, "gate", "ev")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "not the level the spec plans" not in gate.stdout
    summary = _soakspec(tmp_path, "gate", "ev", "--format", "json")
    assert json.loads(summary.stdout)["verdict"] == "PASS"

    _rewrite_manifest(ev, lambda m: m["spec"].update(text=m["spec"]["text"].replace("  deadline = 10s\n", "  duration = 3s\n  deadline = 10s\n")))
    other = _soakspec(tmp_path, "gate", "ev")
    assert other.returncode == 3, other.stdout
    assert "a planned duration of 4s (the spec plans 3s)" in other.stdout
