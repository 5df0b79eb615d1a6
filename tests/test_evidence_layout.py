"""safe_name: backend names become single, safe, distinct path components."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from soakspec.evidence.layout import RunLayout, safe_name

_SAFE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")


def test_plain_names_are_kept_and_escapes_are_defused():
    assert safe_name("nccl") == "nccl"
    assert safe_name("host_staged-v1.2") == "host_staged-v1.2"
    s = safe_name("../../etc")
    assert s.startswith("etc-") and len(s) == len("etc-") + 8
    assert safe_name("..") != ".." and safe_name("").startswith("backend-")
    assert safe_name("a/b") != safe_name("a-b")


@given(st.text())
def test_result_is_always_one_safe_component(name):
    """Property: any name maps to a non-empty component of [A-Za-z0-9._-] with no leading dot."""
    s = safe_name(name)
    assert _SAFE.match(s) and s not in (".", "..") and "/" not in s and len(s) <= 73


@given(st.text(), st.text())
def test_distinct_names_stay_distinct(a, b):
    """Property: different names never share a directory."""
    if a != b:
        assert safe_name(a) != safe_name(b)


@given(st.text())
def test_a_kept_name_never_collides_with_a_changed_one(name):
    """Property: feeding a sanitised name back in never maps another name onto it."""
    s = safe_name(name)
    if s != name:
        assert safe_name(s) != s


def test_layout_paths_stay_inside_the_run_dir(tmp_path):
    lay = RunLayout(tmp_path / "run1")
    p = lay.requests("../../etc")
    assert p.resolve().is_relative_to((tmp_path / "run1").resolve())
    assert p.name == "requests.jsonl.gz" and p.parent.parent.name == "backends"
