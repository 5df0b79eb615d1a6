"""The benchmarks that write evidence through the runner's own writers still do: a change to
the recorder's API (its bucket ends became async) once left `benchmarks/soak_scale.py` failing
for every N, unnoticed. Run here in its smallest setting, as a subprocess; nothing is timed
(the timings are the benchmark's, in benchmarks/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_soak_scale_writes_a_directory_that_verifies_and_passes(tmp_path) -> None:
    out = tmp_path / "scale"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak_scale.py"), "--requests", "3000", "--out", str(out),
                        "--keep", "--skip", "gate,report"], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "never awaited" not in p.stderr
    assert "(3,000 requests, the run's own verdict exit 0)" in p.stdout
    assert "| verify | 3,000 | 0 |" in p.stdout  # `soakspec verify DIR` exit 0
    (line,) = [json.loads(x) for x in (out / "backends" / "sim" / "buckets.jsonl").read_text().splitlines()]
    assert line["requests"]["total"] == line["requests"]["completed"] == 3000
    assert line["itl"]["n"] == 3000 * 63
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] == "PASS"
    (entry,) = json.loads((out / "manifest.json").read_text())["backends"]
    assert entry["runtime_boundary"]["status"] == "confirmed"  # its log_pattern found the banner


@pytest.mark.slow
def test_log_disk_runs_a_soak_and_reports_the_log_on_disk() -> None:
    """`benchmarks/log_disk.py` in a 15 s level: the run completes, its evidence verifies, and
    the figures the README's table quotes are printed."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "log_disk.py"), "--minutes", "0.25"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "run exit 0; verify exit 0; requests " in p.stdout
    assert "server.log on disk, peak during the run: " in p.stdout and "server_log_moved: " in p.stdout


def test_self_soak_removes_its_temporary_directory_when_the_runner_ends_early(tmp_path, monkeypatch, capsys) -> None:
    """`benchmarks/self_soak.py` whose runner ends before the load started (exit 1): the
    directory it made for the spec and the evidence is removed, as on its other ways out. A fake
    runner that has already exited: nothing is started."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("self_soak", ROOT / "benchmarks" / "self_soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    made: list[str] = []

    def mkdtemp(prefix: str = "") -> str:
        made.append(str(tmp_path / f"{prefix}x"))
        Path(made[-1]).mkdir()
        return made[-1]

    class Ended:
        pid = 0

        def __init__(self, *a, **k) -> None:
            pass

        def poll(self) -> int:
            return 1

        def communicate(self, timeout: float | None = None) -> tuple[str, str]:
            return "", "boom"

    monkeypatch.setattr(mod.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(mod.subprocess, "Popen", Ended)
    monkeypatch.setattr(sys, "argv", ["self_soak.py", "--minutes", "0.2"])
    assert mod.main() == 1
    assert "the runner ended before the load started" in capsys.readouterr().err
    assert len(made) == 1 and not Path(made[0]).exists()
