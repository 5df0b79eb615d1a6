"""Telemetry rules (rss, gpu_memory, cpu) read the samples inside each bucket by bisection, not
by scanning every sample per bucket: the same samples, in the same order, as the scan that
defines them (a day-long soak has ~17,000 samples and ~1,400 buckets).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.judge.joined import join
from soakspec.judge.measures import PerSample, rss
from soakspec.judge.scope import level_scope
from soakspec.judge.testing import EvidenceBuilder, small_spec

SPEC = small_spec(duration="4m", bucket="1m")


def _scan(scope) -> list[float]:
    """Every sample of the backend looked at for every window (the definition)."""
    out = []
    for bi, w in scope.windows:
        if w.start is None or w.end is None:
            continue
        for s in bi.samples:
            if w.start <= float(s["t"]) < w.end and (v := rss(s)) is not None:
                out.append(v)
    return out


@settings(max_examples=60, deadline=None)
@given(offsets=st.lists(st.one_of(st.floats(-30.0, 300.0), st.sampled_from([0.0, 60.0, 120.0, 180.0, 240.0])), max_size=40),
       values=st.lists(st.one_of(st.integers(0, 2**40), st.none(), st.just("x")), min_size=40, max_size=40))
def test_the_samples_of_each_bucket_are_those_a_scan_finds(offsets, values):
    """Sample times anywhere (before the level, on bucket edges, after it, repeated, out of
    order), values or none: the points per level are exactly the scan's."""
    b = EvidenceBuilder(SPEC)
    name = SPEC.backends[0].name
    lv = b.manifest["backends"][0]["levels"][0]
    t0 = lv["started_at"]
    b.telemetry[name] = [{"t": t0 + o, "server_rss_bytes": v} for o, v in zip(offsets, values)]
    run = join(SPEC, b.build())
    seen = 0
    for bi in run.judged:
        for li in bi.levels:
            scope = level_scope(bi, li)
            assert PerSample(rss).points(scope) == _scan(scope)
            seen += 1
    assert seen
