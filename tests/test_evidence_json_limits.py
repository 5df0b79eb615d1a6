"""JSON evidence is decoded within limits (issue 15): JSON nested 100,000 deep or a 5000-digit
integer in any evidence file used to end `gate`, `verify` and `report` with an internal error.
Now such a file is malformed evidence: `verify` exits 1 naming the file and line, `gate` and
`report` exit 3 (INCONCLUSIVE: the evidence cannot support a verdict) -- never a traceback.

The evidence is edited the way a careless or dishonest operator could: the file changed and
its hash in the manifest (and the results' and verdict's binding to the manifest) recomputed."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from soakspec.cli import main
from soakspec.evidence.io import MAX_INT_DIGITS, MAX_JSON_DEPTH, dumps_line, loads
from soakspec.judge.testing import EvidenceBuilder, small_spec

DEEP = "[" * 100_000 + "]" * 100_000
BIG = "1" * 5000


def _edit(root: Path, rel: str, text: str | bytes) -> None:
    """Replace `rel` and recompute every hash that would give the edit away."""
    if isinstance(text, bytes):
        (root / rel).write_bytes(text)
    else:
        (root / rel).write_text(text)
    mpath = root / "manifest.json"
    if rel != "manifest.json":
        m = json.loads(mpath.read_text())
        m["artifacts"][rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        mpath.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    for bound in ("results.json", "verdict.json"):  # written after the manifest, bound to it
        if rel == bound or not (root / bound).exists():
            continue
        try:
            doc = json.loads((root / bound).read_text())
        except ValueError:
            continue
        doc["manifest_sha256"] = hashlib.sha256(mpath.read_bytes()).hexdigest()
        (root / bound).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _append_line(root: Path, rel: str, line: str) -> str | bytes:
    if rel.endswith(".gz"):  # one more gzip member, as a run that went on writing would add
        return (root / rel).read_bytes() + gzip.compress((line + "\n").encode())
    return (root / rel).read_text() + line + "\n"


def _add_key(root: Path, rel: str, raw: str) -> str:
    text = (root / rel).read_text().rstrip()
    assert text.endswith("}")
    return text[:-1] + f', "zz_extra": {raw}}}\n'


CASES = {
    "requests.jsonl.gz nested 100,000 deep": ("backends/a/requests.jsonl.gz", lambda r, p: _append_line(r, p, DEEP), 18),
    "requests.jsonl.gz 5000-digit integer": ("backends/a/requests.jsonl.gz", lambda r, p: _append_line(r, p, '{"x": %s}' % BIG), 18),
    "traces.jsonl.gz 5000-digit integer": ("backends/a/traces.jsonl.gz", lambda r, p: _append_line(r, p, '{"x": %s}' % BIG), None),
    "telemetry.jsonl nested deep": ("backends/a/telemetry.jsonl", lambda r, p: _append_line(r, p, DEEP), None),
    "followup.json nested deep": ("backends/a/followup.json", lambda r, p: DEEP, 1),
    "followup.json 1e999": ("backends/a/followup.json", lambda r, p: _add_key(r, p, "1e999"), None),
    "results.json 5000-digit integer": ("results.json", lambda r, p: _add_key(r, p, BIG), None),
    "manifest.json nested deep": ("manifest.json", lambda r, p: DEEP, 1),
    "manifest.json 5000-digit integer": ("manifest.json", lambda r, p: _add_key(r, p, BIG), None),
}


@pytest.fixture(scope="module")
def spec():
    return small_spec()


def _cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in out + err, (out + err)[-2000:]
    return code, out + err


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_json_is_malformed_evidence_not_an_internal_error(case, spec, tmp_path, capsys):
    rel, make, line = CASES[case]
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    _edit(root, rel, make(root, rel))

    code, out = _cli(capsys, "verify", str(root))
    assert code == 1, out
    where = f"{rel}:{line}:" if line is not None else f"{rel}"
    assert where in out and "V105" in out, out

    code, out = _cli(capsys, "gate", str(root))
    assert code == 3, out
    assert "INCONCLUSIVE" in out or "cannot be judged" in out, out

    # report exits 0 once it rendered (the verdict's code is gate's); evidence it cannot even
    # load is exit 3 with the reason, as gate's
    code, out = _cli(capsys, "report", str(root))
    assert (code == 0 and "**Verdict: INCONCLUSIVE**" in out) or (code == 3 and "cannot be judged" in out), out


def test_the_limits_are_named_in_the_message(tmp_path, spec, capsys):
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    _edit(root, "backends/a/requests.jsonl.gz", _append_line(root, "backends/a/requests.jsonl.gz", '{"x": %s}' % BIG))
    _, out = _cli(capsys, "verify", str(root))
    assert f"integer of 5000 digits (at most {MAX_INT_DIGITS})" in out


# ------------------------------------------------------------------ the decoder itself

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**300) + 1, 10**300 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_json_values)
def test_loads_round_trips_what_the_writers_write(value):
    """Property: anything soakspec writes (finite numbers, sane integers) reads back equal."""
    assert loads(dumps_line(value)) == value


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}"\\:,-+.eE0123456789 truefalsnNaIiy', max_size=200))
def test_loads_raises_only_decode_errors(text):
    """Property: on any text, `loads` returns a value or raises json.JSONDecodeError."""
    try:
        value = loads(text)
    except json.JSONDecodeError:
        return
    # what it returns is within the limits
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        assert d <= MAX_JSON_DEPTH + 1
        if isinstance(v, float):
            assert math.isfinite(v)
        if isinstance(v, int) and not isinstance(v, bool):
            assert len(str(abs(v))) <= MAX_INT_DIGITS
        if isinstance(v, list):
            stack += [(x, d + 1) for x in v]
        if isinstance(v, dict):
            stack += [(x, d + 1) for x in v.values()]


def test_depth_limit_is_exact_and_strings_do_not_count():
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert loads(ok) is not None
    with pytest.raises(json.JSONDecodeError, match=f"nested deeper than {MAX_JSON_DEPTH}"):
        loads("[" + ok + "]")
    assert loads(json.dumps(["[" * 1000, "{\\\"[[[["])) == ["[" * 1000, '{\\"[[[[']
    assert loads(json.dumps({"id": "1" * 100})) == {"id": "1" * 100}  # digits in a string are text
    for bad in ("[NaN]", "[Infinity]", "[-Infinity]", "1e999", "-" + "9" * 301):
        with pytest.raises(json.JSONDecodeError):
            loads(bad)
