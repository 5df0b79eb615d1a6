"""The open loop's schedules live in a pure module (`soakspec.arrivals`): the runner sends on
them, and `check`, the plan or the judge can rebuild what was sent from the plan alone, without
trio or I/O. Moving them there changed no float: the values below were pinned from the schedules
as `runner/load.py` computed them before the move."""

from __future__ import annotations

import hashlib
import itertools
import subprocess
import sys

from soakspec import arrivals
from soakspec.plan import Bucket, OpenRamp, Replay
from soakspec.runner import load

from runner_support import REPO


def test_the_schedules_import_without_trio_or_io():
    """A plan, `check` or judge can rebuild every schedule (constant, Poisson, gamma, ramps,
    a replay, a level's bucket grid) without importing trio, httpx or the runner."""
    code = ("import sys, itertools\n"
            "from soakspec import arrivals as a\n"
            "list(a.schedule(5.0, 'poisson', 1, 0.0, 10.0, 0.5))\n"
            "list(itertools.islice(a.unit_arrivals('poisson', 1), 10))\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'httpx') or m.startswith('soakspec.runner'))\n"
            "print(bad)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_the_runner_sends_on_the_pure_schedules():
    """One definition: the runner's names are the pure module's functions."""
    for name in ("schedule", "unit_arrivals", "ramp_schedule", "replay_schedule", "level_grid"):
        assert getattr(load, name) is getattr(arrivals, name), name


class _Level:
    warmup_s, warmup_requests, duration_s, bucket_s = 3.0, None, 20.0, 2.0
    buckets = tuple(Bucket(i, i * 2.0, 2.0) for i in range(10))


def _schedules() -> dict:
    out: dict = {}
    for seed in (0, 1, 7, 42, 2**31 - 1):
        for arrival, b in (("constant", 1.0), ("poisson", 1.0), ("poisson", 0.5), ("poisson", 3.0)):
            for start in (0.0, 1796638213.623406):
                out[f"s{seed}-{arrival}-{b}-{start}"] = list(arrivals.schedule(7.3, arrival, seed, start, start + 30.0, b))
        out[f"u{seed}"] = (list(itertools.islice(arrivals.unit_arrivals("poisson", seed, 0.7), 300))
                           + list(itertools.islice(arrivals.unit_arrivals("constant", seed), 5)))
    for sh in (OpenRamp(1.0, 20.0, 0, "poisson", 3, 1.0), OpenRamp(2.0, 9.0, 3, "constant", 0, 1.0),
               OpenRamp(5.0, 1.0, 0, "poisson", 9, 0.4)):
        out[repr(sh)] = list(arrivals.ramp_schedule(sh, 1000.0, 1023.0, 3.0))
    rp = Replay("x", "mooncake", "0", 1.5, (0.0, 0.25, 1.1, 7.0, 40.0), (1, 2, 3, 4, 5), (5, 4, 3, 2, 1))
    out["replay"] = list(arrivals.replay_schedule(rp, 1000.0, 1020.0))
    g = arrivals.level_grid(_Level(), 0.0)
    out["grid"] = list(arrivals.schedule(5.0, "constant", 0, 0.0, g.stop, grid=g))
    return out


def test_the_schedules_floats_are_pinned():
    """Bit for bit what `runner/load.py` sent on before the move (seeds 0, 1, 7, 42, 2^31-1;
    constant, Poisson, gamma 0.5 and 3; unit processes; three ramps; a replay; the exact grid)."""
    out = _schedules()
    assert out["s7-poisson-1.0-0.0"][:3] == [0.0536047731828499, 0.07600456181373733, 0.22018204374126155]
    assert out["grid"][:4] == [0.0, 0.2, 0.4, 0.6]
    assert [len(v) for v in (out["replay"], out["u7"])] == [4, 305]
    digest = hashlib.sha256(repr(sorted(out.items())).encode()).hexdigest()
    assert digest == "3571cb682f0b88cca2d03162e1446ed0537e30d35fc7bdcecc395898c10c15af"
