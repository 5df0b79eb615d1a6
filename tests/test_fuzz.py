"""A mutation fuzzer over specs and evidence (issue 15: "no case over 2 s, no exit 70").

Specs: valid specs from `soakspec.lang.strategies.valid_specs()`, rendered to text, then
mutated byte by byte (flip, insert hostile bytes, delete, duplicate, truncate) and put through
`check`, `fmt --check` and `plan` on the command line and `parse` -> `check` -> `fmt` -> `plan`
in the library. Evidence: a clean evidence directory (`EvidenceBuilder(...).write`) with one
JSON or JSONL file mutated -- bytes, or a value replaced with a hostile one (deep nesting, huge
or non-finite numbers, wrong types) -- with the manifest's hashes recomputed or not, then put
through `verify`, `gate` and `report` and the judge's loader.

Property, for every case: the answer is a documented one -- diagnostics and exit 0/1/2 for a
spec; an exit 0/1/2/3 verdict or report for evidence, and `load_evidence` raising nothing but
`EvidenceError` -- never a traceback or the internal-error exit, and no case takes over 2 s
(hypothesis' deadline). The default example counts are modest, to keep the default suite
fast; `SOAKSPEC_FUZZ_EXAMPLES=2000` runs a larger fuzz.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from soakspec.cli import main
from soakspec.diagnostics import has_errors
from soakspec.evidence.io import EvidenceError
from soakspec.judge import judge
from soakspec.judge.evidence import load_evidence
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.lang import check, fmt, parse
from soakspec.lang.strategies import valid_specs
from soakspec.plan import plan, render_text as render_plan

_N = int(os.environ.get("SOAKSPEC_FUZZ_EXAMPLES", "0"))
SPEC_PROFILE = settings(
    max_examples=_N or 60, deadline=datetime.timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)  # fmt: skip
EVIDENCE_PROFILE = settings(
    max_examples=_N or 25, deadline=datetime.timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)  # fmt: skip

HOSTILE_BYTES = [b"{", b"}", b"[", b"]", b'"', b'"""', b"\\", b"\x00", b"\xff", b"\xc3", b"\n", b"#", b"=",
                 b"9" * 30, b"1e999", b"-0", b"r\"", b"per ", b"require ", b"\xef\xbb\xbf", b"\r"]  # fmt: skip


def _cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    text = out.getvalue() + err.getvalue()
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    return code, text


@st.composite
def mutated_bytes(draw, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        if not buf:
            buf += draw(st.sampled_from(HOSTILE_BYTES))
            continue
        i = draw(st.integers(0, len(buf) - 1))
        op = draw(st.sampled_from(["flip", "insert", "delete", "duplicate", "truncate"]))
        if op == "flip":
            buf[i] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[i:i] = draw(st.sampled_from(HOSTILE_BYTES) | st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[i : i + draw(st.integers(1, 40))]
        elif op == "duplicate":
            j = min(len(buf), i + draw(st.integers(1, 80)))
            buf[i:i] = buf[i:j] * draw(st.integers(1, 3))
        else:
            del buf[i:]
    return bytes(buf)


@st.composite
def mutated_specs(draw) -> bytes:
    text, _ = draw(valid_specs())
    return draw(mutated_bytes(text.encode()))


@SPEC_PROFILE
@given(mutated_specs())
def test_mutated_specs_get_diagnostics_never_a_crash(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.soak"
        path.write_bytes(data)
        code, _ = _cli("check", str(path))
        assert code in (0, 2)
        plan_code, _ = _cli("plan", str(path))
        assert plan_code == code
        fmt_code, _ = _cli("fmt", "--check", str(path))
        assert fmt_code in (0, 1, 2)
        assert path.read_bytes() == data  # --check never writes

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    tree, diags = parse(text, "fuzz.soak")
    if tree is None or has_errors(diags):
        assert code == 2
        return
    canonical = fmt(tree)
    again, diags2 = parse(canonical, "fuzz.soak")
    assert again is not None and not has_errors(diags2), canonical
    assert fmt(again) == canonical  # fmt is idempotent on whatever parses
    spec, more = check(tree, "fuzz.soak")
    assert (spec is not None) == (code == 0), more
    if spec is not None:
        p = plan(spec)
        assert "wall time" in render_plan(p)


# ------------------------------------------------------------------ evidence

_SPEC = small_spec("require failed == 0\nrequire trace_coverage >= 100% per bucket\nrequire follow_up")
_SPEC_TEXT = _SPEC.canonical_text


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> Path:
    root = EvidenceBuilder(_SPEC, per_bucket=3).write(tmp_path_factory.mktemp("clean") / "run")
    assert _cli("verify", str(root))[0] == 0 and _cli("gate", str(root))[0] == 0
    return root


FILES = ("manifest.json", "results.json", "backends/a/requests.jsonl.gz", "backends/a/traces.jsonl.gz",
         "backends/a/telemetry.jsonl", "backends/a/followup.json", "verdict.json")  # fmt: skip
_RAW = "\x00RAW\x00"
HOSTILE_VALUES = [None, True, False, 0, -1, 1.5, 1e308, -1e308, "", "x" * 5000, [], {}, [[[]]], {"a": {"b": {}}},
                  "NaN", "1e999", "-" + "9" * 400]  # fmt: skip
HOSTILE_RAW = ["[" * 100_000 + "]" * 100_000, "1" * 5000, "NaN", "Infinity", "-1e999", "[" * 65 + "]" * 65, "1" * 301]


def _paths(v, prefix=()):
    yield prefix
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, prefix + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, prefix + (i,))


def _replace(doc, path, new):
    if not path:
        return new
    cur = doc
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = new
    return doc


@st.composite
def json_mutation(draw, text: str) -> str:
    """Replace one value of one JSON document (a whole file or one JSONL line)."""
    doc = json.loads(text)
    paths = list(_paths(doc))
    path = draw(st.sampled_from(paths))
    if draw(st.booleans()):
        return json.dumps(_replace(doc, path, draw(st.sampled_from(HOSTILE_VALUES))))
    return json.dumps(_replace(doc, path, _RAW)).replace(json.dumps(_RAW), draw(st.sampled_from(HOSTILE_RAW)))


@st.composite
def evidence_edits(draw, root: Path) -> tuple[str, bytes, bool]:
    rel = draw(st.sampled_from(FILES))
    data = (root / rel).read_bytes()
    if draw(st.booleans()):
        return rel, draw(mutated_bytes(data)), draw(st.booleans())
    gz = rel.endswith(".gz")  # requests.jsonl.gz: the lines are edited, then compressed again
    text = (gzip.decompress(data) if gz else data).decode()
    if rel.endswith((".jsonl", ".jsonl.gz")):
        lines = text.splitlines()
        i = draw(st.integers(0, len(lines) - 1))
        lines[i] = draw(json_mutation(lines[i]))
        new = "\n".join(lines) + "\n"
    else:
        new = draw(json_mutation(text))
    return rel, gzip.compress(new.encode()) if gz else new.encode(), draw(st.booleans())


def _rehash(root: Path, rel: str) -> None:
    """Recompute what would give the edit away: the manifest's hash of the file and the
    results' and verdict's binding to the manifest (where they still parse)."""
    mpath = root / "manifest.json"
    with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
        if rel != "manifest.json":
            m = json.loads(mpath.read_text())
            m["artifacts"][rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()
            mpath.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    for bound in ("results.json", "verdict.json"):  # written after the manifest, bound to it
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            if rel != bound:
                doc = json.loads((root / bound).read_text())
                doc["manifest_sha256"] = hashlib.sha256(mpath.read_bytes()).hexdigest()
                (root / bound).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


@EVIDENCE_PROFILE
@given(data=st.data())
def test_mutated_evidence_gets_a_verdict_never_a_crash(clean_run, data):
    rel, new, rehash = data.draw(evidence_edits(clean_run))
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "run"
        shutil.copytree(clean_run, root)
        (root / rel).write_bytes(new)
        if rehash:
            _rehash(root, rel)
        code, out = _cli("verify", str(root))
        assert code in (0, 1, 2, 3), out
        code, out = _cli("gate", str(root))
        assert code in (0, 1, 2, 3), out
        code, out = _cli("report", str(root))
        assert code in (0, 1, 2, 3), out
        try:
            evidence = load_evidence(root)
        except EvidenceError:
            return
        judge(_SPEC, evidence)  # the loader's output is always judgeable
