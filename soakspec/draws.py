"""Seeded per-request choices that are pure functions of an index: a prompt file's shuffled
order (`prompt_order = shuffled`) and a multi-turn session's think time between turns
(`think_time = [1s, 5s]`).

Like `lengths.py` (and beside it, for the same reason: the checker, the planner, the runner and
the judge read it, and the runner may not import the language), nothing here depends on the
wall clock, the process or the order in which requests start: the k-th request of a level gets
the same prompt in every run, on every backend and whatever `--workers N` splits the level into
(the index is the level's own count, runner/load.py `drive_level`, `ids.SharedCount`).

**Shuffled order.** `shuffled(i, n, seed)` is the prompt the level's i-th request sends:
position `i mod n` of pass `i // n`'s permutation of the file's n prompts. Each pass over the
file is a new permutation (keyed by the seed and the pass), so every prompt is sent once a pass,
as sampling without replacement; passes are drawn independently, so a pass repeats the last
one's order one time in n! (of 2 prompts, every other pass). The
permutation is a keyed bijection, never a table: a four-round balanced Feistel network on the
smallest power of four at least n, with cycle-walking back into [0, n) (Black and Rogaway,
"Ciphers with arbitrary finite domains", 2002). It costs no memory beyond the prompts and a few
microseconds a request for any n up to the file limit of 10^6 (a walk takes fewer than four
steps on average: the domain is less than four times n). The round function is splitmix64
(Steele, Lea and Flood 2014) over round keys hashed once per (seed, pass): exact integers, the
same on every platform and Python version (`random.shuffle` promises no stable stream, and
numpy's Generator none across versions).

**Prefix groups.** `prefix_group(i, groups, seed)`: the group whose shared prefix the level's
request i starts with (`prefix_tokens` in `prefix_groups` groups, SGLang's `bench_serving
--dataset-name generated-shared-prefix`). SGLang makes groups x prompts-per-group requests and
shuffles them once, so each group is sent equally often in a random order; here the i-th request
takes position `i mod G` of pass `i // G`'s permutation of the G groups (`shuffled`, keyed by the
group count): each block of requests kG .. kG + G - 1 (k from 0, counted from the level's first
request, a warmup's included) sends every group once, in a seeded order, the same in every run,
backend and --workers split (no per-group count to write: a level's length sets it). G
consecutive requests that straddle two blocks need not: the measured window starts at the
request after the warmup's last, mid-block unless G divides the warmup's count, so over R
consecutive requests each group is sent floor(R / G) or ceil(R / G) times from a block's start,
and within 2 of every other group's count from anywhere (a partial block at each end).
`digits(n, base)` is how many base-`base` words spell n distinct indices (a group's leading
words, runner/prompts.py; the checker's minimum prefix).

**Think time.** `think_s(low, high, seed, conversation, turn)`: the time a session waits before
sending `turn` (2 and later) of the file's `conversation`, uniform over [low, high] (`low` when
they are equal), keyed by the conversation and the turn: the third turn of conversation 12 waits
the same in every run, level and process. The judge re-derives it from a request's
`conversation` and `turn` (judge/validity.py reads the thinking sessions out of the offered
concurrency), with `think_fraction_array`, which gives the same numbers over numpy arrays.
"""

from __future__ import annotations

import functools
import hashlib

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_ROUNDS = 4


def _mix(z: int) -> int:
    """splitmix64's step: a bijection of 64-bit integers with good avalanche."""
    z = (z + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


@functools.lru_cache(maxsize=64)
def _round_keys(seed: int, n: int, p: int) -> tuple[int, ...]:
    digest = hashlib.blake2b(f"prompt-order:{seed}:{n}:{p}".encode(), digest_size=8 * _ROUNDS).digest()
    return tuple(int.from_bytes(digest[8 * r: 8 * r + 8], "big") for r in range(_ROUNDS))


def shuffled(i: int, n: int, seed: int) -> int:
    """The file position of the prompt a level's request `i` sends (from 0): `perm_p(i mod n)`
    of pass p = i // n's seeded permutation of range(n)."""
    if n <= 1:
        return 0
    p, x = divmod(i, n)
    half = max(1, ((n - 1).bit_length() + 1) // 2)  # the domain 4**half >= n
    mask = (1 << half) - 1
    keys = _round_keys(seed, n, p)
    while True:  # cycle-walking: a bijection of [0, 4**half) iterated until it lands in [0, n)
        left, right = x >> half, x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        x = (left << half) | right
        if x < n:
            return x


def prefix_group(i: int, groups: int, seed: int) -> int:
    """The prefix group (from 0) of a level's request `i`: pass i // groups's seeded permutation
    of the groups at i mod groups (see the module's docstring); 0 with one group."""
    return shuffled(i, groups, seed)


def digits(n: int, base: int) -> int:
    """The fewest words (at least 1) of a `base`-word vocabulary that spell `n` distinct indices."""
    k = 1
    while base**k < n:
        k += 1
    return k


def think_fraction(seed: int, conversation: int, turn: int) -> float:
    """A uniform draw in [0, 1) for the think time before `turn` of `conversation` (file numbering, from 1)."""
    h = _mix(_mix(_mix(seed & _M64) ^ (conversation & _M64)) ^ (turn & _M64))
    return (h >> 11) / float(1 << 53)


def think_s(low: float, high: float, seed: int, conversation: int, turn: int) -> float:
    """The seconds a session waits after turn - 1's answer before it sends `turn` (0 for a first turn)."""
    if turn <= 1:
        return 0.0
    if high <= low:
        return low
    return low + (high - low) * think_fraction(seed, conversation, turn)


def think_fraction_array(seed: int, conversation, turn):
    """`think_fraction` over numpy arrays of conversations and turns (the judge's vectorized form)."""
    import numpy as np

    def mix(z):
        z = z + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):
        s = mix(np.full(np.shape(conversation), seed & _M64, dtype=np.uint64))
        h = mix(mix(s ^ np.asarray(conversation).astype(np.uint64)) ^ np.asarray(turn).astype(np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def order_label(order: str, seed: int) -> str:
    """How a plan, a report or compare says the order: `file order`, `shuffled (seed 7)`."""
    return f"shuffled (seed {seed})" if order == "shuffled" else "file order"


def think_label(think: tuple[float, ...]) -> str:
    """`2s`, `1-5s uniform`: how a plan or a report says a think time (seconds as written)."""
    if not think:
        return "none"
    low, high = think[0], think[-1]
    return f"{low:g}s" if high <= low else f"{low:g}-{high:g}s uniform"
