"""Random request lengths (`length_range = 50%`), as `vllm bench serve --dataset-name random
--random-range-ratio 0.5`: each request's prompt length and max_tokens drawn uniformly from
[floor(N(1 - r)), ceil(N(1 + r))] around the asked N, by the request's index in its level and
the load's seed -- the same lengths in every run and whatever `--workers N` splits a level into.

What a user sees: the checker's errors, the plan's line, the lengths on the wire (virtual time,
and the simulator's own usage count), and a run whose responses at the top of the range are
not judged `usage_mismatch`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.lang import lengths


# ---------------------------------------------------------------- the range, as vLLM draws it


def test_the_range_is_vllms_floor_and_ceiling_around_the_asked_length():
    assert lengths.bounds(1000, 0.5) == (500, 1500)
    assert lengths.bounds(100, 0.1) == (90, 110)  # not 111, which 100 * 1.1 = 110.00000000000001 would give
    assert lengths.bounds(7, 0.5) == (3, 11)  # floor(3.5), ceil(10.5)
    assert lengths.bounds(1, 0.9) == (1, 2)  # the low end is at least 1
    assert lengths.bounds(64, 0.0) == (64, 64)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10_000_000), percent=st.integers(0, 99), seed=st.integers(0, 2**63 - 1),
       index=st.integers(0, 10**9))  # fmt: skip
def test_every_drawn_length_is_within_its_range_and_the_range_holds_the_asked_length(n, percent, seed, index):
    r = percent / 100
    low, high = lengths.bounds(n, r)
    assert 1 <= low <= n <= high
    for which in (lengths.PROMPT, lengths.OUTPUT):
        got = lengths.draw(n, r, seed, index, which)
        assert low <= got <= high
        assert got == lengths.draw(n, r, seed, index, which)  # a pure function of its inputs


@settings(max_examples=30, deadline=None)
@given(n=st.integers(20, 100_000), percent=st.integers(1, 99), seed=st.integers(0, 2**31))
def test_the_mean_drawn_length_is_near_the_asked_length(n, percent, seed):
    r, draws = percent / 100, 2000
    low, high = lengths.bounds(n, r)
    got = [lengths.draw(n, r, seed, k, lengths.PROMPT) for k in range(draws)]
    sd = (high - low + 1) / 12**0.5
    assert abs(sum(got) / draws - n) <= 5 * sd / draws**0.5 + 1  # the range's middle is n, within rounding
    assert min(got) < n < max(got) or high - low < 2
