"""Comments survive `soakspec fmt`: top of file, leading, trailing, closing, end of file.

Golden-free: every comment in the input carries a unique tag (c01, c02, ...); after
formatting each tag appears exactly once, in the original order, and formatting again
changes nothing.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from soakspec.cli import main
from soakspec.lang import check, fmt, parse

ROOT = pathlib.Path(__file__).resolve().parents[1]

MESSY = '''\
#c01 top of the file, no space after '#'
#    c02 indented text is kept as written

# c03 leading comment of the header, after a blank line
soak "commented" {   # c04 on an opening line: goes above the first inner line
  issue = "#465"     # c05 trailing, with a '#' inside the string before it
  description = "a # inside a string is not a comment"
        # c06 closing comment of the header block, badly indented
}  # c07 trailing comment of a block

backend "b" {
  # c08 leading comment of the first statement
  launch = [
    "./server",  # c09 inside a multi-line list: moves above the attribute
    "--port", "{port}",
  ]
  env {
    # c10 the only thing in a block body... then a key
    RUST_LOG = "info"
    # c11 closing comment in a nested block
  }
  runtime { label = r"host-staged #raw" }   # c12 trailing after a one-line block
}
workload "w" {
  load { concurrency = [4, 8] }
  duration = 120s # c13 trailing without spaces before '#'
  bucket = 60s
  # c14 last comment of the workload
}

gate {
  require failed == 0 per bucket   # c15 trailing comment of a rule
  # c16 before a warn rule
  warn drift(p95(ttft)) <= 20% per level
}
claims {
  claim "x" # c17 trailing comment of a claim
  exclude """a long
string # not a comment"""  # c18 trailing comment after a long string
}
# c19 end of the file
#
# c20 after an empty comment
'''


def _tags(text: str) -> list[str]:
    return re.findall(r"\bc\d\d\b", text)


def test_messy_input_parses_and_checks():
    tree, diags = parse(MESSY)
    assert diags == []
    spec, diags = check(tree)
    assert spec is not None, diags


def test_every_comment_survives_once_in_order():
    tree, _ = parse(MESSY)
    out = fmt(tree)
    assert _tags(MESSY) == [f"c{i:02d}" for i in range(1, 21)]
    assert _tags(out) == _tags(MESSY)
    # the text of each comment is kept, not just its tag
    for line in MESSY.splitlines():
        if "#" in line and (m := re.search(r"#\s*(c\d\d.*)$", line)):
            assert m.group(1).rstrip() in out, m.group(1)
    assert "\n#    c02 indented text is kept as written\n" in out  # the spaces after '#' too
    assert '"a # inside a string is not a comment"' in out
    assert 'r"host-staged #raw"' in out
    assert "# not a comment" in out and out.count("not a comment") == 2


def test_comment_placement():
    out = fmt(parse(MESSY)[0])
    lines = out.splitlines()
    assert lines[0] == "# c01 top of the file, no space after '#'"
    assert lines[-3:] == ["# c19 end of the file", "#", "# c20 after an empty comment"]
    # a comment after an opening brace goes above the block's first line
    k = next(n for n, line in enumerate(lines) if "c04" in line)
    assert lines[k - 1] == 'soak "commented" {' and lines[k + 1].startswith("  issue = ")
    # a comment inside a multi-line list moves above its attribute
    i = next(n for n, line in enumerate(lines) if "c09" in line)
    assert lines[i + 1].lstrip().startswith("launch = [")
    # trailing comments stay on their line, closing comments stay inside their block
    assert any(re.fullmatch(r'  duration = 120s  # c13 .*', line) for line in lines)
    assert any(re.fullmatch(r"}  # c07 .*", line) for line in lines)
    j = next(n for n, line in enumerate(lines) if "c11" in line)
    assert lines[j].startswith("    # c11") and lines[j + 1] == "  }"


def test_fmt_is_idempotent_and_preserves_the_tree():
    tree, _ = parse(MESSY)
    once = fmt(tree)
    again, diags = parse(once)
    assert diags == []
    assert again == tree  # comments take part in equality
    assert fmt(again) == once


def test_comments_do_not_change_the_spec_hash():
    """Spec.sha256 hashes the canonical spec without its comments: adding, changing or removing
    a comment keeps the hash (retained evidence does not look stale), changing a value does not."""
    with_comments = check(parse(MESSY)[0])[0]
    bare = re.sub(r"(?m)^\s*#.*\n|\s+#\s*c\d\d.*$", "", MESSY)
    assert bare != MESSY
    without = check(parse(bare)[0])[0]
    assert with_comments.sha256 == without.sha256
    assert with_comments.canonical_text == without.canonical_text
    assert with_comments.backends == without.backends and with_comments.workloads == without.workloads
    reworded = check(parse(MESSY.replace("# c", "# changed c"))[0])[0]
    assert reworded.sha256 == with_comments.sha256
    changed = check(parse(MESSY.replace("#465", "#466"))[0])[0]
    assert changed is not None and changed.sha256 != with_comments.sha256


@pytest.mark.parametrize("path", sorted((ROOT / "specs").glob("*.soak")), ids=lambda p: p.name)
def test_committed_specs_keep_their_comments(path):
    text = path.read_text()
    out = fmt(parse(text)[0])
    comments = [line.strip() for line in text.splitlines() if line.strip().startswith("#")]
    assert comments, "the committed spec documents itself"
    kept = [line.strip() for line in out.splitlines() if line.strip().startswith("#")]
    assert kept == comments


def test_fmt_command_keeps_comments(tmp_path, capsys):
    f = tmp_path / "c.soak"
    f.write_text(MESSY)
    assert main(["fmt", str(f)]) == 0
    assert _tags(f.read_text()) == _tags(MESSY)
    assert main(["fmt", "--check", str(f)]) == 0
    assert main(["check", str(f)]) == 0
