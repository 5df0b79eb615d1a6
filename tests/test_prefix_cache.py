"""No prompt is served from the server's prefix cache by accident (vLLM #52884, #54227).

A server's prefix cache (on by default in vLLM) serves a prompt it has seen before, or its first
blocks, without prefill: a benchmark that sends the same prompts again measures the cache --
+86 % throughput and 49x lower TTFT in vLLM #54227, where every cell of a sweep replayed the
seed's prompts. soakspec's prompts are chosen by a request's index in its level (the same
sequence on every backend), so what makes them differ must be the request's own: a word
prompt starts with its request id, and a token-exact prompt's first words spell its index and
then its level's salt (the id of the level's first request: unique per level, backend and run).
Driven in virtual time with the fake server of tests/test_load_shapes.py.
"""

from __future__ import annotations

import trio
import trio.testing

from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence
from soakspec.runner.load import WORDS, LevelContext, Shapes, drive_level
from soakspec.runner.prompts import TokenCosts
from soakspec.runner.records import RequestRecord
from test_load_shapes import Server, levels_of

BLOCK = 16  # vLLM's KV block: a prefix cache hit needs the first 16 tokens (one word each here) equal


def _prompts_per_level(levels, ids: IdSequence) -> list[list[str]]:
    """Drive `levels` one after another on one backend, as the runner does (a level's own
    `Shapes`; a sweep's probes share one): each level's prompts, in send order."""

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=1000.0)
        out = []
        shapes = None
        for lv in levels:
            server = Server(clock, 0.05)
            if shapes is None or shapes.template is not lv.request:
                shapes = Shapes(lv.request)
                shapes._costs = TokenCosts(tuple(WORDS), 0)  # every word one token, no BOS (as prepared)
            records: list[RequestRecord] = []
            await drive_level(lv, LevelContext("a", clock, server.connect, shapes, records.extend, ids))
            out.append([s.prompt for s in server.shapes])
        return out

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _first_blocks(prompts: list[str]) -> set[tuple[str, ...]]:
    return {tuple(p.split()[:BLOCK]) for p in prompts}


def test_the_levels_of_a_sweep_never_replay_an_earlier_levels_token_prompts():
    """Three closed-loop levels of 64-token prompts on one backend (a concurrency sweep), and
    the same levels in a second run against the same server: no prompt starts with the first
    block of any other request's, in its level, in another level or in the other run. (Each
    level replayed the first one's prompts, 0, 1, 2, ...: levels 2 and 3 were served from the
    prefix cache.)"""
    levels = levels_of("mode = closed\n concurrency = [1, 2, 4]", extra="bucket = 1s\n duration = 2s\n prompt_tokens = 64")
    assert len(levels) == 3
    runs = [_prompts_per_level(levels, IdSequence(prefix)) for prefix in ("soak-5ca1ab1e-0", "soak-0ddba11e-0")]
    every = [p for run in runs for lv in run for p in lv]
    assert all(len(p.split()) == 64 for p in every)  # still token-exact
    assert len(every) > 3 * 2 * 20
    assert len(_first_blocks(every)) == len(every)


def test_a_level_run_twice_as_a_sweeps_probes_does_not_replay_its_prompts():
    """A sweep probes one level's shape again and again (`plan.probe_level`, one `Shapes`
    shared by the probes): each probe sends prompts no earlier probe sent."""
    (lv,) = levels_of("mode = open\n rate = [20rps]", extra="bucket = 1s\n duration = 1s\n prompt_tokens = 32")
    probes = _prompts_per_level([lv, lv, lv], IdSequence("soak-5ca1ab1e-0"))
    every = [p for probe in probes for p in probe]
    assert len(every) == 60 and len(_first_blocks(every)) == 60


def test_two_workloads_pre_flights_send_different_token_prompts(monkeypatch):
    """Two workloads of 64-token prompts on one backend: each pre-flight sends a token-exact
    prompt of 64 tokens, and the two differ from the first block on (both sent the unsalted
    prompt 0, so the second pre-flight was served from the first's prefix cache) -- and from
    the first level's prompts."""
    from types import SimpleNamespace

    from soakspec.lang import check, parse
    from soakspec.plan import plan
    from soakspec.runner import driver

    text = ('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
            + "".join(f'workload "{w}" {{\n  load {{\n    mode = closed\n    concurrency = [1]\n  }}\n  prompt_tokens = 64\n'
                      f'  duration = 2s\n  bucket = 1s\n  follow_up = false\n}}\n' for w in ("w1", "w2")))
    spec, diags = check(parse(text)[0])
    assert spec is not None, diags
    (bp,) = plan(spec).backends

    async def prepare(self, url):
        self._costs = TokenCosts(tuple(WORDS), 0)

    monkeypatch.setattr(Shapes, "prepare", prepare)
    sent: list[str] = []

    class Conn:
        async def send(self, shape, rid, headers, record, *, deadline):
            sent.append(shape.prompt)
            record.start, record.end, record.outcome = 0.0, 0.1, "completed"

        async def aclose(self):
            pass

    async def main():
        deps = SimpleNamespace(clock=RunClock(timer=trio.current_time, epoch=1000.0), progress=SimpleNamespace(log=lambda *a: None))
        rec = SimpleNamespace(preflight_done=lambda w, r: True)
        await driver.preflight(bp, "http://127.0.0.1:8000", deps, rec, IdSequence("soak-5ca1ab1e-0"), lambda f: (), lambda req: Conn)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(sent) == 2 and all(len(p.split()) == 64 for p in sent)
    first_level = _prompts_per_level([bp.levels[0]], IdSequence("soak-5ca1ab1e-0"))[0]
    assert len(_first_blocks(sent + first_level)) == len(sent) + len(first_level)
