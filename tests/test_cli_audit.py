"""What an audit of the command line found wrong with bad and odd arguments and signals:
`--out` written inside the evidence it reports on, arguments a command does not know said
against `soakspec`'s usage with no suggestion, signals that killed a command with a
traceback or a code the contract does not have."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from soakspec import cli
from soakspec.cli import main
from soakspec.evidence.testing import build_evidence_dir
from soakspec.exitcodes import ExitCode

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "specs" / "demo.soak")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


# ------------------------------------------------------------------ --out inside the evidence


@pytest.fixture()
def evidence(tmp_path):
    d = tmp_path / "run"
    build_evidence_dir(d)
    return d


@pytest.mark.parametrize("argv", [
    ["report", "@", "--out", "@/report.md"],
    ["report", "@", "--format", "html", "--out", "@/backends/a/r.html"],
    ["compare", "@", "@", "--out", "@/cmp.md"],
    ["combine", "@", "--out", "@/combined"],
])  # fmt: skip
def test_out_inside_the_evidence_directory_is_refused_and_the_evidence_still_verifies(evidence, capsys, argv):
    """`soakspec report DIR --out DIR/report.md` wrote the report into the evidence: a file not
    in its manifest, so `verify` then exited 1 and `gate` FAILed a run that had passed. Now a
    usage error, before anything is read or written."""
    before = sorted(p.relative_to(evidence) for p in evidence.rglob("*"))
    code = main([a.replace("@", str(evidence)) for a in argv])
    err = capsys.readouterr().err
    assert code is ExitCode.USAGE, err
    assert "is inside the evidence directory" in err and "Traceback" not in err
    assert sorted(p.relative_to(evidence) for p in evidence.rglob("*")) == before
    assert main(["verify", str(evidence)]) == ExitCode.OK


def test_out_through_a_symlink_into_the_evidence_is_refused(evidence, tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(evidence)
    assert main(["report", str(evidence), "--out", str(link / "r.md")]) is ExitCode.USAGE
    assert "inside the evidence directory" in capsys.readouterr().err


def test_out_beside_the_evidence_is_written(evidence, tmp_path, capsys):
    out = tmp_path / "r.md"
    assert main(["report", str(evidence), "--out", str(out)]) is ExitCode.OK
    assert out.is_file()


@pytest.mark.parametrize("command", ["report", "compare"])
def test_out_dash_is_stdout_not_a_file_named_dash(evidence, tmp_path, monkeypatch, capsys, command):
    """`--out -` wrote a file named "-" in the current directory ("wrote - (PASS)"); it is
    stdout, as for every tool that writes a file or stdout."""
    monkeypatch.chdir(tmp_path)
    args = [command, str(evidence)] + ([str(evidence)] if command == "compare" else []) + ["--out", "-"]
    assert main(args) in (ExitCode.OK, ExitCode.INCONCLUSIVE)
    out, err = capsys.readouterr()
    assert not (tmp_path / "-").exists() and "wrote -" not in err
    assert out.strip(), err


@pytest.mark.parametrize("kind", ["directory", "no parent"])
def test_compare_out_that_cannot_be_a_file_is_a_usage_error_like_reports(evidence, tmp_path, capsys, kind):
    """`compare A B --out DIR` read both runs, then exited 4 with "cannot write evidence: Is a
    directory" where `report --out DIR` says at once that it is a usage error (2)."""
    out = tmp_path if kind == "directory" else tmp_path / "nope" / "c.md"
    code = main(["compare", str(evidence), str(evidence), "--out", str(out)])
    err = capsys.readouterr().err
    assert code is ExitCode.USAGE, err
    assert ("is a directory; give a file name" if kind == "directory" else "no such directory") in err
    assert "cannot write evidence" not in err


# ------------------------------------------------------------------ what a command does not know


def test_an_extra_argument_is_said_by_the_command_with_its_usage(capsys):
    """`soakspec gate DIR extra` printed `soakspec`'s usage (`COMMAND ...`) and `soakspec:
    error`, not the usage of the command that was given the word."""
    with pytest.raises(SystemExit) as e:
        main(["plan", DEMO, "extra"])
    err = capsys.readouterr().err
    assert e.value.code == ExitCode.USAGE
    assert "usage: soakspec plan" in err and "soakspec plan: error: unrecognized arguments: extra" in err


@pytest.mark.parametrize(("argv", "said"), [
    (["check", "--stirct", DEMO], "soakspec check: error: unrecognized arguments: --stirct (--stirct: did you mean --strict?)"),
    (["gate", "--fromat=json", "d"], "(--fromat: did you mean --format?)"),
    (["plan", DEMO, "--backnd", "x"], "(--backnd: did you mean --backend?)"),
])  # fmt: skip
def test_a_mistyped_option_gets_a_suggestion(capsys, argv, said):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == ExitCode.USAGE
    assert said in capsys.readouterr().err


def test_a_mistyped_command_gets_a_suggestion(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--debug", "gat", "d"])
    err = capsys.readouterr().err
    assert e.value.code == ExitCode.USAGE
    assert "unknown command 'gat' (did you mean gate?)" in err and "lint-claims" in err


def test_every_commands_help_lists_debug(capsys):
    """`--debug` is accepted after every command (README: it shows a traceback for an internal
    error), but no command's --help listed it."""
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert "--debug" in capsys.readouterr().out, name


def test_the_readme_commands_table_names_every_option_of_its_commands():
    """README's Commands table is where a newcomer looks up a flag: it left out `run --workers`,
    `--no-preflight` and `--format` (which its own Gates section prints with), `compare --out`
    (which its lint-claims section writes compare.json with) and others. Every long option of
    a command it lists is named in the command's row (the simulator's flags are its own table:
    `soakspec sim --help`)."""
    import argparse

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("## Commands"):readme.index("### Exit codes")]
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    missing = {}
    for name, parser in sub.choices.items():
        if name == "sim":
            continue
        (row,) = [line for line in table.splitlines() if line.startswith(f"| `soakspec {name} ")]
        options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help", "--debug"}
        if absent := sorted(o for o in options if o not in row):
            missing[name] = absent
    assert not missing, missing


# ------------------------------------------------------------------ signals


def _catches(pid: int, sig: int) -> bool:
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_stops_a_command_with_one_line_and_exit_aborted(sig):
    """SIGTERM (or SIGHUP) to `gate`, `report`, `check`... killed it with no word and exit 143
    (129), a code the contract does not have; now it stops as Ctrl-C does: one line, exit 4,
    no traceback. The command waits on its stdin (`check -`) when the signal comes."""
    p = subprocess.Popen([sys.executable, "-m", "soakspec", "check", "-"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 30
        while not _catches(p.pid, signal.SIGTERM) and time.monotonic() < deadline:  # handlers in: started
            time.sleep(0.02)
        time.sleep(0.3)
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    err_text = err.decode()
    assert p.returncode == ExitCode.ABORTED, (p.returncode, err_text)
    assert "Traceback" not in err_text and out == b""
    said = "interrupted" if sig == signal.SIGINT else f"terminated ({signal.Signals(sig).name})"
    assert f"soakspec check: {said}" in err_text


def test_a_signal_while_starting_is_held_until_the_command_can_stop(monkeypatch, capsys):
    """A signal while the command line is parsed and the command's modules imported (numpy's
    among them) raised inside the import machinery: a traceback and a death by SIGINT (130),
    once a crash (SIGSEGV) at exit. Now it is held, then stops the command before it starts."""
    real = cli.build_parser
    ran = []

    def build_parser(only=None):
        os.kill(os.getpid(), signal.SIGTERM)  # as if it came while the modules were imported
        return real(only)

    import soakspec.commands.lang as lang_cmd

    monkeypatch.setattr(cli, "build_parser", build_parser)
    monkeypatch.setattr(lang_cmd, "main_check", lambda args: ran.append(args) or ExitCode.OK)
    def caller(signum, frame):  # the caller's own handler: main's replaces it while it runs, then gives it back
        ran.append("the caller's handler")

    before = signal.signal(signal.SIGTERM, caller)
    try:
        code = main(["check", DEMO])
        assert signal.getsignal(signal.SIGTERM) is caller
    finally:
        signal.signal(signal.SIGTERM, before)
    assert code is ExitCode.ABORTED and not ran
    assert "soakspec check: terminated (SIGTERM)" in capsys.readouterr().err
