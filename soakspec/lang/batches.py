"""How many requests a batch level sends, with every request taking one fixed latency: pure,
shared by the plan (`plan._levels`: a batch level's expected requests) and the checker
(`check.requests.requests_per_second`: W509's and W511's estimates), so the two say one number.

The runner's batch (runner/load.py `_batch`): a batch is `requests` requests taken from a queue
by min(concurrency, requests) workers, each sending its next as soon as its last one ends, and
the next batch starts only when every request of this one has ended (a barrier). With each
request taking `latency`, a batch is ceil(requests / concurrency) waves `latency` apart -- full
waves of `concurrency`, the last one the remainder -- and the batches follow back to back, so
the i-th wave of the level (from 0) starts at i x latency after the level's start (its warmup
included). A worker checks the clock before each request: no wave starts at or after the
level's end, and the last batch may end short.
"""

from __future__ import annotations

import math

_EPS = 1e-9  # a wave within this many latencies of an edge counts as on it (as `plan._constant_count`)


def waves_per_batch(concurrency: int, requests: int) -> int:
    """The waves of one batch: ceil(requests / concurrency)."""
    return -(-requests // concurrency)


def _sent_in_waves(concurrency: int, requests: int, waves: int) -> int:
    """Requests the level's first `waves` waves send: whole batches, then full waves of the next."""
    k = waves_per_batch(concurrency, requests)
    return (waves // k) * requests + (waves % k) * concurrency


def batch_requests(concurrency: int, requests: int, latency_s: float, start_s: float, end_s: float) -> int:
    """Requests of a batch level that start in [start_s, end_s) (seconds from the level's
    start, its warmup included), every request taking `latency_s`: the waves at i x latency in
    that window, each of its size (see the module's docstring)."""
    if concurrency <= 0 or requests <= 0 or latency_s <= 0 or end_s <= start_s:
        return 0
    first = max(0, math.ceil(start_s / latency_s - _EPS))  # the first wave at or after start_s
    end = max(0, math.ceil(end_s / latency_s - _EPS))  # the first wave at or after end_s
    return _sent_in_waves(concurrency, requests, end) - _sent_in_waves(concurrency, requests, first)


def batch_rate(concurrency: float, requests: float, latency_s: float) -> float:
    """Requests a second a batch level sends over whole batches: `requests` every
    ceil(requests / concurrency) latencies."""
    return requests / (math.ceil(requests / concurrency) * latency_s)
