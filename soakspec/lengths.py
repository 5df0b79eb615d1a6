"""Random request lengths (`length_range`): each request's prompt length and max_tokens drawn
uniformly from an integer range around the asked length, as `vllm bench serve --dataset-name
random --random-range-ratio R` draws them.

vLLM's range for an asked length N is [floor(N * (1 - R)), ceil(N * (1 + R))], both ends
included, with R in [0, 1) (vllm/benchmarks/datasets.py `RandomDataset.get_sampling_params`);
its output range's low end is at least 1, and so is both ranges' here (a prompt of 0 tokens
cannot be sent). The products are rounded to 1e-9 first, so that 10% of 100 is [90, 110] and
not, by float error, [90, 111].

A draw is a pure function of the level's length seed, the request's index in its level and
which length it is (prompt or output): never of the wall clock, the process or the order in
which requests start. The k-th request of a level gets the same lengths in every run, on every
backend and whatever `--workers N` splits the level into (the index is the level's own count,
runner/load.py `drive_level`, `ids.SharedCount`). vLLM draws its lengths from one seeded stream
in request order; the lengths here are not its numbers, but the same distribution.

A module of its own beside `windows.py` and `units.py`: the checker, the planner, the runner
and the judge all read it, and the runner may not import the language (tests/test_engine.py)."""

from __future__ import annotations

import hashlib
import math

PROMPT, OUTPUT = 0, 1  # which length a draw is for: independent draws of one request


def bounds(n: int, ratio: float) -> tuple[int, int]:
    """The range of lengths drawn around `n` (both ends included); (n, n) when `ratio` is 0."""
    if ratio <= 0:
        return n, n
    low = math.floor(round(n * (1 - ratio), 9))
    high = math.ceil(round(n * (1 + ratio), 9))
    return max(1, low), max(1, high)


def draw(n: int, ratio: float, seed: int, index: int, which: int) -> int:
    """The length of request `index` of a level for asked length `n`: uniform over `bounds`."""
    low, high = bounds(n, ratio)
    if low == high:
        return low
    digest = hashlib.blake2b(f"{seed}:{which}:{index}".encode(), digest_size=8).digest()
    return low + int.from_bytes(digest, "big") % (high - low + 1)  # a 64-bit draw: the modulo's bias is < 1e-12


def largest(lens: tuple[int, ...], ratio: float) -> int:
    """The longest length any request can draw from `lens` (a cycling list)."""
    return max(bounds(n, ratio)[1] for n in lens)


def smallest(lens: tuple[int, ...], ratio: float) -> int:
    """The shortest length any request can draw from `lens`."""
    return min(bounds(n, ratio)[0] for n in lens)


def label(ratio: float) -> str:
    """`±50%`: how a plan, a report or compare says a range."""
    return f"±{ratio * 100:g}%"
