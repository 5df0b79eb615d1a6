"""Error recovery does work bounded by the input, not by (input size × errors): a missing quote
in a long one-line list once cost seconds per kilobyte, because every later token of the
line was an error that copied the whole parser state. Counted, not timed."""

from __future__ import annotations

import pytest
from lark.parsers.lalr_interactive_parser import InteractiveParser

from soakspec.lang import parse


def _spec(n: int, broken: str) -> str:
    items = ", ".join(f'"item{i}"' for i in range(n))
    text = 'soak "x" {}\nbackend "a" {\n  launch = [' + items + "]\n}\n"
    return text.replace('"item3"', broken, 1)


@pytest.mark.parametrize("broken", ['item3"', '"item3'], ids=["missing-opening-quote", "missing-closing-quote"])
def test_parser_copies_do_not_grow_with_the_list(monkeypatch, broken):
    copies = []
    real_copy = InteractiveParser.copy

    def counting_copy(self, *args, **kwargs):
        copies.append(len(self.parser_state.value_stack))
        return real_copy(self, *args, **kwargs)

    monkeypatch.setattr(InteractiveParser, "copy", counting_copy)
    counts = {}
    for n in (50, 1000):
        copies.clear()
        tree, diags = parse(_spec(n, broken))
        assert tree is None and diags and diags[0].span.line == 3
        counts[n] = len(copies)
    assert counts[1000] == counts[50], counts  # the same few copies, however long the list


def test_a_long_broken_line_finishes_in_a_subprocess():
    """18 KB with one missing quote took 91 s; run it under a generous timeout."""
    import subprocess
    import sys

    code = (
        "from soakspec.lang import parse\n"
        f"text = {_spec(1500, 'item3' + chr(34))!r}\n"
        "tree, diags = parse(text)\n"
        "assert tree is None and diags\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
