"""What an audit of the command line found wrong with bad and odd arguments and signals."""

from __future__ import annotations

import pathlib

import pytest

from soakspec import cli
from soakspec.cli import main
from soakspec.evidence.testing import build_evidence_dir
from soakspec.exitcodes import ExitCode

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "specs" / "demo.soak")


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
