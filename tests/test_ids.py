"""Request ids, defined once (runner/ids.py): one process or N interleaved, never a repeat."""

from __future__ import annotations

from hypothesis import given, strategies as st

from soakspec.runner.ids import IdSequence, request_id


def test_one_process_numbers_requests_in_order():
    ids = IdSequence("soak-ab12cd34-0")
    assert [ids() for _ in range(3)] == [(0, "soak-ab12cd34-0-0000000"), (1, "soak-ab12cd34-0-0000001"), (2, "soak-ab12cd34-0-0000002")]
    assert ids.end == 3 and request_id("p", 12) == "p-0000012"


@given(before=st.integers(0, 20), counts=st.lists(st.integers(0, 50), min_size=1, max_size=6), after=st.integers(0, 5))
def test_interleaved_shares_never_repeat_and_the_sequence_goes_on_after_them(before, counts, after):
    """Whatever each of N processes sends: all indices are distinct, each process's are
    first + k·N + p, and the backend's next index is one past the largest used."""
    ids = IdSequence("x")
    seen = [ids()[0] for _ in range(before)]
    shares = [ids.share(p, len(counts)) for p in range(len(counts))]
    for share, n in zip(shares, counts):
        got = [share()[0] for _ in range(n)]
        assert got == [before + k * len(counts) + share.part for k in range(n)]
        seen += got
    ids.continue_after(shares)
    seen += [ids()[0] for _ in range(after)]
    assert len(seen) == len(set(seen))
    used = seen[: len(seen) - after]
    assert ids.end - after == (max(used) + 1 if used else 0)
