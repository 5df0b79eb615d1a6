"""`check`, `plan` and `fmt` never start a process: a spec is code, and reading it must be safe.

Every way Python starts a process is patched to fail loudly, the three commands run
in-process on the committed spec and on specs whose backends would create a marker file if
anything ran them; then the real console script runs them too, and the marker must not exist.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from soakspec.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
DSV2LITE = ROOT / "specs" / "dsv2lite.soak"

SPAWNERS = [
    (subprocess, "Popen"),
    (os, "system"),
    (os, "popen"),
    (os, "fork"),
    (os, "forkpty"),
    *[(os, n) for n in ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe")],
    *[(os, n) for n in ("posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnlp")],
]


class Spawned(AssertionError):
    pass


@pytest.fixture
def no_processes(monkeypatch):
    """Make every process-starting call raise (and record that it was attempted)."""
    calls: list[str] = []

    def forbid(name):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise Spawned(f"{name} called with {args!r}")

        return refuse

    for mod, name in SPAWNERS:
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, forbid(f"{mod.__name__}.{name}"))
    trio = pytest.importorskip("trio")
    monkeypatch.setattr(trio, "run_process", forbid("trio.run_process"))
    monkeypatch.setattr(trio, "open_process", forbid("trio.open_process"), raising=False)
    return calls


def _marker_specs(marker: pathlib.Path) -> dict[str, str]:
    common = 'workload "w" {\n  load { concurrency = 1 }\n  duration = 60s\n}\n'
    return {
        "argv.soak": (
            'soak "marker" {}\n'
            f'backend "a" {{\n  launch = ["/bin/sh", "-c", "touch {marker}; echo {{port}}"]\n'
            '  runtime {\n    label = "host-staged"\n  }\n}\n' + common
        ),
        "shell.soak": f'soak "marker" {{}}\nbackend "b" {{\n  shell = "touch {marker} # {{port}}"\n}}\n' + common,
        "both.soak": (
            'soak "marker" {}\n'
            f'backend "a" {{ launch = ["/bin/sh", "-c", "touch {marker}"] }}\n'
            f'backend "b" {{ shell = "touch {marker}" }}\n' + common
        ),
    }


def _write_specs(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[pathlib.Path]]:
    marker = tmp_path / "MARKER"
    paths = []
    for name, text in _marker_specs(marker).items():
        p = tmp_path / name
        # written unformatted, so that `fmt` really rewrites them
        p.write_text(text.replace("\n  ", "\n      "))
        paths.append(p)
    return marker, paths


def test_check_plan_fmt_start_no_process(tmp_path, monkeypatch, capsys, no_processes):
    marker, paths = _write_specs(tmp_path)
    monkeypatch.chdir(tmp_path)  # a relative `touch MARKER` would land here too
    dsv = tmp_path / "dsv2lite.soak"
    dsv.write_text(DSV2LITE.read_text())
    for p in [dsv, *paths]:
        assert main(["check", str(p)]) == 0, capsys.readouterr()
        assert main(["check", "--format", "json", str(p)]) == 0
        assert main(["plan", str(p)]) == 0
        assert main(["plan", "--format", "json", "--rehearse", "--time-scale", "0.1", str(p)]) == 0
        assert main(["fmt", "--check", str(p)]) in (0, 1)
        assert main(["fmt", "--diff", str(p)]) in (0, 1)
        assert main(["fmt", str(p)]) == 0
        assert main(["fmt", "--check", str(p)]) == 0
    out = capsys.readouterr().out
    assert "touch" in out  # the plan did show the commands it would run
    assert no_processes == []
    assert not marker.exists()
    assert not (tmp_path / "MARKER").exists()


def test_the_patch_is_effective(no_processes):
    """Guard against a vacuous test: the patched functions really refuse."""
    with pytest.raises(Spawned):
        subprocess.run(["true"])
    with pytest.raises(Spawned):
        os.system("true")
    assert no_processes == ["subprocess.Popen", "os.system"]


def test_real_cli_leaves_no_marker(tmp_path):
    """The installed console script, in a child process, on the same specs."""
    marker, paths = _write_specs(tmp_path)
    script = pathlib.Path(sys.executable).with_name("soakspec")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "soakspec"]
    names = [p.name for p in paths]
    runs = [["check", *names], *(["plan", n] for n in names), ["fmt", *names]]
    for args in runs:
        r = subprocess.run([*cli, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    assert not marker.exists()


def test_check_plan_fmt_import_no_runner(tmp_path):
    """The pure commands do not even import the machinery that runs a soak: no trio, no HTTP
    client, no runner or simulator server, and no hypothesis (strategies are test-only)."""
    code = (
        "import sys\n"
        "from soakspec.cli import main\n"
        "import soakspec.lang, soakspec.plan\n"
        f"for args in (['check'], ['plan'], ['fmt', '--check']):\n"
        f"    assert main(args + [{str(DSV2LITE)!r}]) == 0\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'httpx', 'h11', 'hypothesis'))\n"
        "bad += sorted(m for m in sys.modules if m.startswith(('soakspec.runner', 'soakspec.sim.server')))\n"
        "print(bad)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
