"""How `max_concurrency = N` is split over `--workers` processes: the one definition that the
runner (`runner/load.py` `_arrivals`, each process's `Slots`) acts on and the judge
(`judge/capproof.py`) re-derives when it checks from the records that the runner kept to it.

A leaf module beside `units.py`, `lengths.py` and `draws.py`, for the same reason: the judge may
not import the runner (it imports trio), and a re-typed copy of the split could drift from it.

An open-loop process p of `parts` sends the level's arrivals p, p + parts, ... and opens its
connections with the indexes p, p + parts, ... (`_arrivals`): a record's `worker` modulo the
level's process count (the manifest's `workers` of the level) is the process that sent it.
"""

from __future__ import annotations


def in_flight_share(cap: int, part: tuple[int, int]) -> int:
    """Process p's share of a level's `cap` on requests in flight split over n processes: the
    slots p, p + n, ... below it, so the shares add up to exactly `cap` (and differ by one at
    most). A share of 0 is refused: `workers.processes_for` gives a capped level at most `cap`
    processes."""
    p, parts = part
    share = len(range(p, cap, parts))
    if share < 1:
        raise ValueError(f"process {p} of {parts} has no slot of max_concurrency {cap} (workers.processes_for)")
    return share


def process_of(worker: int, parts: int) -> int:
    """The process (0 .. parts - 1) of an open-loop record's `worker` (its connection's index)."""
    return worker % parts


__all__ = ["in_flight_share", "process_of"]
