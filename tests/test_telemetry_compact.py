"""The judge keeps of a telemetry sample only what its telemetry metrics read
(`judge/evidence.py` `compact_telemetry`): every `PerSample` metric of the registry gives the
same value from the kept row as from the whole one, for any row -- so a metric that starts to
read another field fails here until the compaction keeps it.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.judge.evidence import compact_telemetry
from soakspec.judge.measures import PerSample
from soakspec.judge.registry import RULES

PER_SAMPLE = {e.name: e.measure for e in RULES if isinstance(e.measure, PerSample)}
VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**62), st.floats(allow_nan=False), st.text(max_size=3))
GPU = st.one_of(st.dictionaries(st.sampled_from(["index", "memory_used", "process_memory_used", "utilization_gpu",
                                                  "temperature_c", "power_w"]), VALUE), VALUE)
ROW = st.dictionaries(st.sampled_from(["schema_version", "t", "server_pid", "server_rss_bytes", "rss", "gpus", "server_cpu_s",
                                       "server_cpu_percent"]), VALUE)


@st.composite
def _row(draw):
    row = draw(ROW)
    if draw(st.booleans()):
        row["gpus"] = draw(st.one_of(st.lists(GPU, max_size=8), st.dictionaries(st.just("available"), st.booleans())))
    return row


def test_every_telemetry_metric_is_covered():
    assert set(PER_SAMPLE) >= {"rss", "cpu", "gpu_memory", "gpu_memory_device"}


@settings(max_examples=300, deadline=None)
@given(_row())
def test_a_kept_sample_gives_every_telemetry_metric_its_whole_rows_value(row):
    kept = compact_telemetry(json.loads(json.dumps(row)))
    whole = json.loads(json.dumps(row))
    for name, m in PER_SAMPLE.items():
        assert m.value(kept) == m.value(whole), name
    assert kept.get("t") == whole.get("t")  # the time the judge places it by


def test_what_a_gpu_sample_keeps():
    row = {"schema_version": 1, "t": 5.0, "server_pid": 7, "server_rss_bytes": 2 << 30, "server_cpu_s": 1.0,
           "server_cpu_percent": 150.0,
           "gpus": [{"index": 0, "memory_used": 40 << 30, "process_memory_used": 38 << 30, "utilization_gpu": 90.0,
                     "temperature_c": 60.0, "power_w": 300.0}]}
    assert compact_telemetry(row) == {"t": 5.0, "server_rss_bytes": 2 << 30, "server_cpu_percent": 150.0,
                                      "gpus": [{"memory_used": 40 << 30, "process_memory_used": 38 << 30}]}
