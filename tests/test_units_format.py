"""How durations read in messages, reports and plans (`units.format_duration`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soakspec.units import format_duration


@pytest.mark.parametrize("seconds, shown", [
    (0.05, "50ms"), (0.9994, "999ms"), (0.9996, "1s"), (1.5, "1.5s"), (59.94, "59.9s"), (59.96, "1m"),
    (60, "1m"), (150, "2m30s"), (3599.6, "1h"),
])  # fmt: skip
def test_a_duration_reads_in_its_unit_and_rounding_carries_into_the_next(seconds, shown):
    """999.6 ms read "1e+03ms" and 59.96 s "60s": at three digits they are 1s and 1m."""
    assert format_duration(seconds) == shown


@given(st.floats(min_value=1e-6, max_value=10 * 86400, allow_nan=False))
def test_no_duration_is_written_with_an_exponent_or_a_full_unit_of_the_smaller_one(seconds):
    """Every duration from a microsecond to days reads without an exponent ("1e+03ms") and
    never as 1000ms or 60s, which have a larger unit."""
    text = format_duration(seconds)
    assert "e+" not in text and "e-" not in text, text
    assert not text.startswith(("1000ms", "60s")), text
