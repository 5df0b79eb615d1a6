"""Whole levels through both load paths: `drive_level` -> h11 hot path or httpx reference -> simulator.

test_client.py proves each client alone, one request at a time. Here a level runs end to end
(an open-loop schedule of concurrent requests over kept-alive connections, buckets, the sink),
once with `H11Connection` and once with `HttpxClient`, each against a fresh, identically seeded
in-process simulator. The records must agree in everything but ids, connection numbers and times;
the schedule and the buckets must be the same. (The simulator's text depends on the arrival order,
which two requests due together may swap: the texts are compared as a multiset.)
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.runner.clock import RunClock
from soakspec.runner.h11client import H11Connection
from soakspec.runner.httpxclient import HttpxClient
from soakspec.runner.load import LevelContext, Shapes, drive_level
from soakspec.evidence.record import unpack_gaps
from soakspec.runner.records import RECORD_KEYS, RequestRecord
from soakspec.sim import server as sim
from soakspec.sim.config import SimConfig
from specs import one_workload_spec

TIMES = {"request_id", "server_id", "worker", "intended_start", "start", "first_byte", "first_token", "end",
         "ttft", "latency", "tpot", "client_delay", "coalesced"}  # fmt: skip



def _spec_text(endpoint: str) -> str:
    before = f"endpoint = {endpoint}\n  prompt_words = 6\n  max_tokens = 9"
    load = "mode = open\n    rate = [40rps]\n    arrival = constant"
    after = "duration = 1s\n  bucket = 500ms\n  deadline = 5s\n  follow_up = false"
    return one_workload_spec(name="loadpaths", issue="8", before_load=before, load=load, after_load=after)


class _Httpx:
    """`HttpxClient` as a load-path connection (the httpx client owns the pool)."""

    def __init__(self, client: HttpxClient) -> None:
        self.send = client.send

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def _level_records(tmp_path: Path, endpoint: str, kind: str, sim_options: dict[str, Any]):
    path = tmp_path / f"{endpoint}.soak"
    path.write_text(_spec_text(endpoint))
    spec, diags, _ = load_spec(path)
    assert spec is not None, diags
    level = plan(spec).backends[0].levels[0]
    clock = RunClock()
    records: list[RequestRecord] = []
    seq = iter(range(10**6))

    def next_id() -> tuple[int, str]:
        i = next(seq)
        return i, f"{kind}-{i:07d}"

    async with trio.open_nursery() as nursery, httpx.AsyncClient() as http:
        config = SimConfig(model="sim", trace_log=False, seed=11, **sim_options)
        port = await nursery.start(partial(sim.serve, config))
        if kind == "h11":
            connect = partial(H11Connection, "127.0.0.1", port, clock)
        else:
            client = HttpxClient(http, f"http://127.0.0.1:{port}", clock)
            connect = partial(_Httpx, client)
        ctx = LevelContext("sim", clock, connect, Shapes(dataclasses.replace(level.request, model="sim")), records.extend, next_id)
        run = await drive_level(level, ctx)
        nursery.cancel_scope.cancel()
    return run, records


def _normalized(run, rec: RequestRecord) -> dict[str, Any]:
    d = {k: v for k, v in rec.to_json().items() if k not in TIMES | {"output_sha256", "output_chars"}}
    d["itl_us"] = len(unpack_gaps(d["itl_us"]))
    d["scheduled"] = round(rec.intended_start - run.started_at, 9)  # the schedule, relative to the start
    return d


@pytest.mark.parametrize(
    ("endpoint", "options"),
    [("completions", {}), ("completions", {"tokens_per_chunk": 3}), ("chat", {}), ("chat", {"tokens_per_chunk": 2})],
)
async def test_both_load_paths_record_the_same_level(tmp_path, endpoint, options) -> None:
    """Same schedule, same buckets, same outcomes, tokens, texts (hashes) and ITL counts."""
    options = {"ttft": 0.01, "itl": 0.002, **options}
    rows, texts = {}, {}
    for kind in ("h11", "httpx"):
        run, records = await _level_records(tmp_path, endpoint, kind, options)
        assert run.completed and run.sent == len(records) > 20
        rows[kind] = sorted((_normalized(run, r) for r in records), key=lambda d: d["scheduled"])
        texts[kind] = sorted((r.output_sha256, r.output_chars) for r in records)
        assert all(tuple(r.to_json()) == RECORD_KEYS for r in records)
        assert all(d["outcome"] == "completed" for d in rows[kind]), rows[kind]
    h11_rows, httpx_rows = rows["h11"], rows["httpx"]
    assert len(h11_rows) == len(httpx_rows)
    for a, b in zip(h11_rows, httpx_rows):
        assert abs(a.pop("scheduled") - b.pop("scheduled")) < 1e-5  # epoch floats: ~2e-7 s of rounding
        assert a == b
    assert texts["h11"] == texts["httpx"]
