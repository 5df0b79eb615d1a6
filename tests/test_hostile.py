"""Hostile specs: names that try to escape the evidence directory, specs too large or too deep
to parse, and fuzzing of `soakspec check` with random bytes and mutated real specs.

`soakspec check` is run in-process (`soakspec.cli.main`): whatever the input, it answers with
diagnostics and exit 0 or 2 -- never a traceback, never the "internal error" exit 70.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from runner_support import REPO, manifest, new_marker, run_soakspec, sim_spec, wait_no_survivors
from soakspec.cli import main as cli_main
from soakspec.evidence.layout import safe_name

DSV2LITE = (REPO / "specs" / "dsv2lite.soak").read_text()


def check_text(data: bytes | str, name: str = "t.soak") -> tuple[int, str]:
    """`soakspec check FILE` in-process: (exit code, stderr)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8", errors="surrogatepass")
        else:
            path.write_bytes(data)
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = cli_main(["check", str(path)])
    return code, err.getvalue() + out.getvalue()


def assert_clean(code: int, output: str) -> None:
    assert code in (0, 2), (code, output[-2000:])
    assert "Traceback" not in output and "internal error" not in output, output[-2000:]


# ------------------------------------------------------------------ names


TRAVERSAL = ["../../etc", "a/b", "..", ".", "/tmp/soakspec-pwned", "../../../../../../tmp/soakspec-pwned2"]


def _rename(text: str, old: str, new: str) -> str:
    assert f'"{old}"' in text
    return text.replace(f'"{old}"', f'"{new}"', 1)


def test_names_with_nul_or_newline_are_rejected_by_check():
    for bad in (r"a\nb", r"a\u0000b", r"a\rb", r"a\tb"):
        for kind, old in (("backend", "b0"), ("workload", "w")):
            code, out = check_text(_rename(sim_spec(), old, bad))
            assert code == 2, (bad, kind, out)
            assert f"E107 {kind} name must be 1 to 64 characters on one line" in out
    code, out = check_text(sim_spec().replace('"b0"', '"a\x00b"').encode())
    assert code == 2 and "E003 spec contains a NUL byte" in out


def test_safe_name_never_leaves_its_directory():
    names = TRAVERSAL + ["a-b", "a\\..\\b", "~root", "-rf", "." * 70, "x" * 200, "é/ü", "con", "a b"]
    seen = {}
    for n in names:
        s = safe_name(n)
        assert s and "/" not in s and "\\" not in s and "\0" not in s and s not in (".", "..")
        assert not s.startswith((".", "-")) and len(s) <= 64 + 9
        assert s not in seen, f"{n!r} and {seen.get(s)!r} share {s!r}"
        seen[s] = n


@pytest.mark.slow
def test_a_run_with_traversal_names_writes_only_inside_the_evidence_directory(tmp_path):
    """Backends named `../../etc`, `a/b`, `..`, an absolute path and a deep `../` chain (and a
    workload named `../../w`) run for real against the simulator: every file the run creates is
    under --out, one directory per backend (its safe name), and the evidence verifies."""
    names = ["../../etc", "a/b", "..", "/tmp/soakspec-pwned", "../../../../../../tmp/soakspec-pwned2"]
    text = sim_spec(backends=len(names), duration="1s", bucket="1s", follow_up=False, sim="ttft = 5ms\n    itl = 1ms")
    text = text.replace('soak "t" {\n  issue = "test"\n', 'soak "t" {\n  issue = "test"\n  parallel = true\n', 1)
    for i, n in enumerate(names):
        text = _rename(text, f"b{i}", n)
    text = _rename(text, "w", "../../w")
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    (work / "t.soak").write_text(text)
    before = {p for p in tmp_path.rglob("*")}
    marker = new_marker()
    out = work / "ev"
    proc = run_soakspec(["run", "t.soak", "--out", str(out), "--quiet"], marker, work, timeout=120)
    assert wait_no_survivors(marker) == []
    assert proc.returncode in (0, 1, 3), proc.stderr
    created = {p for p in tmp_path.rglob("*")} - before
    outside = sorted(str(p) for p in created if p != out and out not in p.parents)
    assert outside == [], outside
    assert not os.path.exists("/tmp/soakspec-pwned") and not os.path.exists("/tmp/soakspec-pwned2")
    m = manifest(out)
    assert m["status"] == "complete"
    assert sorted(b["name"] for b in m["backends"]) == sorted(names)
    dirs = sorted(p.name for p in (out / "backends").iterdir())
    assert dirs == sorted(safe_name(n) for n in names)
    for d in dirs:
        assert (out / "backends" / d / "requests.jsonl.gz").stat().st_size > 0
    assert run_soakspec(["verify", str(out)], marker, work).returncode in (0, 3)


# ------------------------------------------------------------------ size and depth


def test_a_spec_over_1mb_is_refused_with_a_diagnostic():
    text = sim_spec() + "# " + "x" * 1_100_000 + "\n"
    code, out = check_text(text)
    assert code == 2 and "E010 spec is larger than 1000 kB; refusing to parse it" in out
    assert_clean(code, out)


def test_a_spec_of_almost_1mb_is_checked_not_refused():
    """Near the limit a real spec (a long claims list) is still parsed and checked."""
    claims = "".join(f'  exclude "claim number {i} " \n' for i in range(28_500))
    text = sim_spec().replace('claim "test"', 'claim "test"\n' + claims, 1)
    assert 900_000 < len(text) < 1_000_000
    code, out = check_text(text)
    assert_clean(code, out)
    assert "E010" not in out


def test_deep_nesting_is_refused_not_a_recursion_error():
    cases = {
        "blocks": "a { " * 5000 + "}" * 5000,
        "lists": "x = " + "[" * 100_000 + "]" * 100_000,
        "unclosed lists": "x = " + "[" * 100_000,
        "calls": "gate {\n require " + "p99(" * 10_000 + "ttft" + ")" * 10_000 + " < 1s\n}",
        "mixed": "a { x = " + "[(" * 20_000,
    }
    for name, text in cases.items():
        code, out = check_text(sim_spec() + text)
        assert code == 2, (name, out[-500:])
        assert re.search(r"E011 spec nests \d+ levels deep; at most 16 are allowed", out), (name, out[-500:])
        assert_clean(code, out)


def test_many_errors_stay_bounded():
    """A file of 200,000 bad statements: a bounded list of diagnostics, quickly."""
    code, out = check_text("@ " * 200_000)
    assert_clean(code, out)
    assert code == 2 and out.count("\n") < 500


# ------------------------------------------------------------------ fuzzing

_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(st.binary(max_size=2000))
def test_random_bytes_never_crash_check(data):
    """Property: for any bytes, `check` exits 0 or 2 without a traceback."""
    assert_clean(*check_text(data))


@_SETTINGS
@given(st.text(alphabet=st.sampled_from(list('{}[]()="#\\\n r:.,<>=-0123456789smbackendworkloadrequireperon%_')), max_size=400))
def test_spec_shaped_noise_never_crashes_check(text):
    """Property: strings over the grammar's own punctuation and words never crash `check`."""
    assert_clean(*check_text(sim_spec() + text))


_TOKEN = re.compile(r'"""(?:[^"\\]|\\.|"(?!""))*"""|r"[^"\n]*"|"(?:[^"\\\n]|\\.)*"|#[^\n]*|[A-Za-z_][A-Za-z0-9_.\-]*|-?[0-9][0-9.eE+\-]*[A-Za-z%]*|\s+|.', re.S)
TOKENS = _TOKEN.findall(DSV2LITE)
VOCAB = sorted(set(TOKENS)) + ["{", "}", "[", "]", "(", ")", '"', '"""', "\\", "\x00", "\ufeff", "\udcff", "ä", "999999999999999999999999", "1e999s", "-0s", "p0", "p100.0001"]


@st.composite
def mutated_spec(draw):
    tokens = list(TOKENS)
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["insert", "delete", "swap", "duplicate", "replace"]))
        i = draw(st.integers(0, len(tokens) - 1))
        if op == "insert":
            tokens.insert(i, draw(st.sampled_from(VOCAB)))
        elif op == "delete":
            del tokens[i]
        elif op == "swap":
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == "duplicate":
            j = draw(st.integers(i, min(len(tokens), i + 40)))
            tokens[i:i] = tokens[i:j]
        else:
            tokens[i] = draw(st.sampled_from(VOCAB))
    return "".join(tokens)


def test_the_token_stream_round_trips():
    assert "".join(TOKENS) == DSV2LITE
    assert check_text(DSV2LITE)[0] == 0


@_SETTINGS
@given(mutated_spec())
def test_mutated_dsv2lite_never_crashes_check(text):
    """Property: inserting, deleting, swapping, duplicating or replacing tokens of
    specs/dsv2lite.soak never crashes `check` (exit 0 or 2, no traceback)."""
    assert_clean(*check_text(text))
