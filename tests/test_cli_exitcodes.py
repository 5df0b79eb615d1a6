"""Every exit of the `soakspec` command line is an `ExitCode` member (README "Exit codes"):
an internal error (a bug) is one line on stderr and exits ABORTED, not an undocumented 70."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

import soakspec.cli
from soakspec.cli import main
from soakspec.exitcodes import ExitCode


def test_an_internal_error_exits_with_a_documented_code(monkeypatch, capsys):
    import soakspec.commands.lang as lang_cmd

    def crash(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(lang_cmd, "main_check", crash)
    code = main(["check", str(pathlib.Path(__file__).resolve().parents[1] / "specs" / "demo.soak")])
    err = capsys.readouterr().err
    assert code is ExitCode.ABORTED and code == 4
    assert "internal error: RuntimeError: boom" in err and "Traceback" not in err


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_and_keeps_the_exit_code(monkeypatch, capsys, where):
    """`--debug` (before or after the command) adds the traceback; the exit is still ABORTED,
    never the 1 an uncaught exception gives, which a caller would read as "a gate rule failed"."""
    import soakspec.commands.lang as lang_cmd

    def crash(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(lang_cmd, "main_check", crash)
    spec = str(pathlib.Path(__file__).resolve().parents[1] / "specs" / "demo.soak")
    code = main(["--debug", "check", spec] if where == "before" else ["check", "--debug", spec])
    err = capsys.readouterr().err
    assert code is ExitCode.ABORTED
    assert "Traceback (most recent call last)" in err and 'raise RuntimeError("boom")' in err
    assert "internal error: RuntimeError: boom" in err and "rerun with --debug" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize(("command", "what"), [("check", "the result"), ("plan", "the plan")])
def test_a_full_stdout_is_said_as_that_and_aborts(command, what):
    """`soakspec check SPEC > /dev/full` in a real process, stdout buffered as it is by default:
    one line says stdout is full, exit ABORTED -- not "internal error ... this is a bug", and
    not the interpreter's "Exception ignored" and exit 120 when it meets the output at exit."""
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "soakspec", command, str(root / "specs" / "demo.soak")],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == ExitCode.ABORTED, r.stderr
    assert r.stderr.endswith(f"soakspec {command}: cannot write {what} to stdout: No space left on device (stdout holds at most part of it)\n")
    assert "internal error" not in r.stderr and "Exception ignored" not in r.stderr


def test_a_command_returning_an_undocumented_number_is_a_bug(monkeypatch, capsys):
    import soakspec.commands.lang as lang_cmd

    monkeypatch.setattr(lang_cmd, "main_check", lambda args: 70)
    code = main(["check", str(pathlib.Path(__file__).resolve().parents[1] / "specs" / "demo.soak")])
    assert isinstance(code, ExitCode) and code is ExitCode.ABORTED
    assert "internal error" in capsys.readouterr().err


def test_ordinary_exits_are_members(capsys):
    root = pathlib.Path(__file__).resolve().parents[1]
    assert main(["check", str(root / "specs" / "demo.soak")]) is ExitCode.OK
    assert main([]) is ExitCode.USAGE
    capsys.readouterr()


def test_cli_returns_only_exitcode_members():
    """Every `return` in cli.main is an ExitCode member or ExitCode(...) of a command's result."""
    tree = ast.parse(pathlib.Path(soakspec.cli.__file__).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "main")
    returns = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return)]
    assert returns
    for value in returns:
        member = isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "ExitCode"
        wrapped = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "ExitCode"
        assert member or wrapped, ast.unparse(value)
        if member:
            assert value.attr in ExitCode.__members__


def _not_evidence(tmp_path, kind: str):
    """(path, what every command must say of it): a regular file, or the parent of run directories."""
    if kind == "file":
        f = tmp_path / "verdict.json"
        f.write_text("{}")
        return f, f"{f} is a file, not an evidence directory"
    parent = tmp_path / "runs"  # `soakspec run --out runs/` leaves one directory per run
    (parent / "r-1").mkdir(parents=True)
    (parent / "r-1" / "manifest.json").write_text("{}")
    return parent, f"{parent}: no manifest.json (not an evidence directory); it holds run directories: r-1"


@pytest.mark.parametrize("kind", ["file", "parent"])
@pytest.mark.parametrize("argv", [["gate", "@"], ["gate", "--partial", "@"], ["verify", "@"], ["compare", "@", "DIR"],
                                  ["compare", "DIR", "@"], ["report", "@"]])  # fmt: skip
def test_what_is_not_an_evidence_directory_is_named_for_what_it_is(tmp_path, capsys, argv, kind):
    """Every command that reads evidence says the same of a path that is not an evidence
    directory (one check, `evidence.io.require_evidence_dir`), with the usage exit code: a
    regular file is "a file" (not "no such evidence directory"), a directory without
    manifest.json says so and names the run directories inside it."""
    given, said = _not_evidence(tmp_path, kind)
    d = tmp_path / "run"
    d.mkdir()
    (d / "manifest.json").write_text("{}")  # compare checks both sides before it reads either
    code = main([str(given) if a == "@" else str(d) if a == "DIR" else a for a in argv])
    err = capsys.readouterr().err
    assert code is ExitCode.USAGE
    assert said in err and "no such evidence directory" not in err, err


def test_a_missing_evidence_directory_is_still_no_such_directory(tmp_path, capsys):
    code = main(["gate", str(tmp_path / "nope")])
    assert code is ExitCode.USAGE and "no such evidence directory" in capsys.readouterr().err


def test_gate_partial_with_write_is_a_usage_error_not_an_internal_error(tmp_path, capsys):
    """`gate DIR --partial --write` is refused as usage (exit 2, saying why); it was an internal
    error (exit 4, "UnboundLocalError ... UsageError": a later `import` of the name made it local
    to the whole function)."""
    assert main(["gate", str(tmp_path), "--partial", "--write"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--write and --partial: a run judged partially has no verdict to write" in err and "internal error" not in err, err
