"""specs/vllm.soak against a real vLLM that soakspec launches (CPU build, tiny model)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.realserver


def _run_spec(lane: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    for f in ("vllm.soak", "vllm-chat-template.jinja"):
        shutil.copy(REPO / "specs" / f, tmp_path / f)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(lane / "tiny")
    env = dict(os.environ, PATH=f"{lane / 'V' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "ev"
    proc = subprocess.run(
        [sys.executable, "-m", "soakspec", "run", str(tmp_path / "vllm.soak"), "--out", str(out), "--format", "json"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    return proc, out


def test_a_launched_vllm_soak_passes_with_full_traces_and_a_confirmed_runtime(lane, tmp_path):
    proc, out = _run_spec(lane, tmp_path)
    sys.stderr.write(proc.stderr[-4000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    verdict = json.loads(proc.stdout)
    rules = {r["metric"]: r for r in verdict["rules"]}
    assert verdict["verdict"] == "PASS"
    assert rules["trace_coverage"]["status"] == "pass"
    assert "(confirmed)" in rules["runtime_boundary_specific"]["message"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    # no server process is left behind
    assert subprocess.run(["pgrep", "-f", str(tmp_path / "models")], capture_output=True).returncode == 1
