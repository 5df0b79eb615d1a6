"""`soakspec fmt` never turns a spec that soakspec reads into one it does not: what it would
write is itself a spec every command reads, or it writes nothing and says why."""

from __future__ import annotations

import pathlib
import time

from soakspec.cli import main
from soakspec.lang.parser import MAX_SOURCE_BYTES

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = (ROOT / "specs" / "demo.soak").read_text(encoding="utf-8")


def _compact_spec_near_the_limit() -> str:
    """demo.soak with one backend's `env` written compactly (`K0="1" K1="1" ...` on one line),
    just under the 1 MB a spec may have: canonically each key takes its own indented line with
    spaces around '=', about 1.6 times the bytes."""
    head = DEMO.replace('  env {\n    NCCL_IB_DISABLE = "1"\n  }\n', "  env{@}\n", 1)
    assert "@" in head
    keys = []
    size = len(head.encode("utf-8"))
    while size < MAX_SOURCE_BYTES - 20:
        k = f'K{len(keys)}="1" '
        keys.append(k)
        size += len(k)
    return head.replace("@", "".join(keys))


def test_fmt_refuses_to_write_a_spec_over_the_size_limit(tmp_path, capsys):
    """A compact spec under 1 MB whose canonical form is over it: `fmt` used to write the
    canonical form (and exit 0), after which `check`, `plan` and `run` refused the file (E010).
    Now it is E010 from `fmt` itself, exit 2, and the file is left byte for byte as it was;
    `--check` says the same, and `fmt -` writes nothing to stdout."""
    f = tmp_path / "compact.soak"
    text = _compact_spec_near_the_limit()
    f.write_text(text, encoding="utf-8")
    assert main(["check", str(f)]) == 0  # a valid spec
    capsys.readouterr()
    before = f.stat().st_mtime_ns
    time.sleep(0.01)
    assert main(["fmt", str(f)]) == 2
    err = capsys.readouterr().err
    assert "E010" in err and "left as it is" in err
    assert f.read_text(encoding="utf-8") == text and f.stat().st_mtime_ns == before
    assert main(["fmt", "--check", str(f)]) == 2
    assert "E010" in capsys.readouterr().err
    assert main(["check", str(f)]) == 0  # still readable


def test_fmt_stdin_refuses_output_over_the_size_limit(monkeypatch, capsys):
    import io
    import sys

    data = _compact_spec_near_the_limit().encode("utf-8")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    assert main(["fmt", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "E010" in err


def test_a_block_named_r_before_its_label_gains_no_comment():
    """`r"a\\" # b" {}` is the block `r` labelled `a" # b` (the lexer reads a name where a
    statement starts); the comment scan read `r"a\\"` as a raw string and the label's rest as a
    comment, so `fmt` wrote a comment `# b" {}` that the file never had (and, with a real
    comment after the block, a comment holding both)."""
    from soakspec.lang import fmt, parse

    tree, diags = parse('r"a\\" # b" {}\nx {\n  r"c\\" # d" {} # real\n}\n')
    assert diags == []
    assert fmt(tree) == 'r "a\\" # b" {}\n\nx {\n  r "c\\" # d" {}  # real\n}\n'
    # a raw string where one is read keeps what follows it a comment
    tree, _ = parse('claim r"a\\" # b"\nbackend r"x\\" { # c\n}\n')
    assert fmt(tree) == 'claim r"a\\"  # b"\n\nbackend r"x\\" {\n  # c\n}\n'
