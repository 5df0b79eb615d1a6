"""Diagnostic codes are declared once (`soakspec.lang.codes`), each with one meaning: the
parser and the checker report only registered codes, and the README's code table lists
exactly the registry."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import soakspec.lang
from soakspec.lang import check, parse
from soakspec.lang.codes import CODES, markdown_table

ROOT = pathlib.Path(__file__).resolve().parents[1]
LANG = pathlib.Path(soakspec.lang.__file__).resolve().parent
CODE = re.compile(r"[EW]\d{3}")


def _codes_in_source() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(LANG.rglob("*.py")):
        if path.name == "codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE.fullmatch(node.value):
                found.setdefault(node.value, []).append(f"{path.relative_to(LANG)}:{node.lineno}")
    return found


def test_the_checker_and_parser_use_only_registered_codes():
    used = _codes_in_source()
    assert len(used) >= 30  # the scan sees the checker's codes
    assert {c: where for c, where in used.items() if c not in CODES} == {}


def test_every_registered_code_is_used():
    assert sorted(set(CODES) - set(_codes_in_source())) == []


def test_codes_are_well_formed_and_titles_distinct():
    assert all(CODE.fullmatch(c) and v.code == c for c, v in CODES.items())
    titles = [v.title for v in CODES.values()]
    assert len(set(titles)) == len(titles)


def test_reporting_an_unregistered_code_fails():
    from soakspec.lang.check.core import Ctx

    with pytest.raises(AssertionError):
        Ctx("x").error("E999", "no such code", soakspec.diagnostics.NO_SPAN)


def _readme_table() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Diagnostics") :]
    section = section[: section.index("\n## ")]
    return dict(re.findall(r"^\| ([EW]\d{3}) \| (.+?) \|$", section, re.M))


def test_readme_lists_every_code_with_its_meaning():
    table = _readme_table()
    assert table == {c: v.title for c, v in CODES.items()}


def test_readme_table_is_the_generated_one():
    text = (ROOT / "README.md").read_text()
    assert markdown_table() in text


@pytest.mark.parametrize(
    "body, code",
    [
        ('  load { concurrency = [] }\n  duration = 60s', "E205"),
        ('  load { concurrency = 1 }\n  duration = 60s\n  endpoint = chats', "E109"),
        ('  load { concurrency = 0 }\n  duration = 60s', "E204"),
    ],
)
def test_distinct_mistakes_have_distinct_codes(body, code):
    text = 'soak "x" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\nworkload "w" {\n%s\n}\n' % body
    spec, diags = check(parse(text)[0])
    assert spec is None and [d.code for d in diags] == [code]
