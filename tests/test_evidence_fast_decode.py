"""Evidence JSON skips the number hooks only when no number in it can break a limit: hex in a
string (a sha256 digest) no longer forces the slow decode, and no text decodes to an infinite
float or an over-long integer either way."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from soakspec.evidence import io


def _walk(o):
    if isinstance(o, dict):
        for v in o.values():
            yield from _walk(v)
    elif isinstance(o, list):
        for v in o:
            yield from _walk(v)
    else:
        yield o


NUMBER = st.builds(lambda m, e, sign: f"{sign}{m}e{e}", st.integers(0, 99), st.integers(-999, 999), st.sampled_from(["", "-"]))
TEXT_PART = st.sampled_from(['"a"', '"x1e999"', '"ab1e234cd"', "[", "]", "{", "}", ",", ":", " ", "\t", "0.5", "7"])


@settings(max_examples=500, deadline=None)
@given(parts=st.lists(NUMBER | TEXT_PART, min_size=1, max_size=12))
def test_no_text_decodes_to_a_number_beyond_the_limits(parts):
    text = "".join(parts)
    try:
        obj = io.loads(text)
    except ValueError:
        return
    for v in _walk(obj):
        if isinstance(v, float):
            assert math.isfinite(v), text
        if isinstance(v, int):
            assert len(str(abs(v))) <= io.MAX_INT_DIGITS, text
    assert obj == json.loads(text)  # within the limits, the plain decoder's value


@pytest.mark.parametrize("text", ["1e999", '{"a": 1e999}', '[0, -2.5E+400]', '{"a":[1,\n9e308]}', "1" * 400])
def test_numbers_beyond_the_limits_are_refused(text):
    with pytest.raises(ValueError):
        io.loads(text)


def test_a_digest_in_a_string_takes_the_fast_decode():
    digest = next(h for i in range(1000) if "e" in (h := hashlib.sha256(str(i).encode()).hexdigest())
                  and any(h[k] == "e" and h[k + 1:k + 4].isdigit() for k in range(60)))
    assert not io._suspect(json.dumps({"output_sha256": digest, "x": 1.5}))
    assert io._suspect(json.dumps({"output_sha256": digest, "x": 1.5e300}))
