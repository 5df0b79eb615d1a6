"""The stored trace rows' claims the judge finds wrong: a row marked matched whose request's
first record has no trace the judge matched -- sifted by the unmatched records' ids first
(with every record matched no claim is read), the same list as checking every claim."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from soakspec.evidence.io import EvidenceChanged
from soakspec.judge import rederive
from soakspec.judge.evidence import StoredTraces
from soakspec.judge.table import build_table
from soakspec.evidence.ids import IdIndex
from soakspec.judge.tracematch import TableMatch


@st.composite
def cases(draw):
    n = draw(st.integers(1, 20))
    ids = [f"r{draw(st.integers(0, n))}" for _ in range(n)]
    codes = draw(st.lists(st.sampled_from([0, 1, 1, 2]), min_size=n, max_size=n))
    claims = [{"request_id": draw(st.sampled_from([*ids, "ghost", 5, None])), "matched": draw(st.sampled_from([True, False, None, 1]))}
              for _ in range(draw(st.integers(0, 30)))]
    return ids, codes, claims, draw(st.booleans()), draw(st.sampled_from([0, 1 << 16]))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_wrong_claims_are_every_claim_checked(case):
    ids, codes, claims, as_claims, set_max = case
    table = build_table([{"request_id": rid, "bucket": 0} for rid in ids])
    match = TableMatch(table.n, IdIndex(table.ids))
    match.codes[:] = np.asarray(codes, dtype=np.int32)
    want = [c["request_id"] for c in claims
            if c["matched"] is True and isinstance(c["request_id"], str) and c["request_id"] in ids
            and codes[ids.index(c["request_id"])] == 0]
    with tempfile.TemporaryDirectory() as d:
        if as_claims:  # as load_evidence holds them: the file, read again when they are needed
            path = Path(d) / "traces.jsonl"
            path.write_text("".join(json.dumps(c) + "\n" for c in claims))
            stored = StoredTraces(path=path, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
        else:  # as evidence built in memory holds them: the rows
            stored = StoredTraces(tuple(claims))
        saved = rederive.UNMATCHED_SET_MAX
        rederive.UNMATCHED_SET_MAX = set_max
        try:
            assert rederive._wrong_claims(stored, table, match) == want
        finally:
            rederive.UNMATCHED_SET_MAX = saved


def test_claims_read_again_from_a_file_that_changed_stop_the_judge(tmp_path):
    """The claims are read again only when some record is unmatched: a traces.jsonl that no
    longer hashes as verification found it stops the judge rather than judging a new file."""
    path = tmp_path / "traces.jsonl"
    path.write_text('{"request_id": "r1", "matched": true}\n')
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert list(StoredTraces(path=path, sha256=sha).matched_ids()) == ["r1"]
    assert [r["request_id"] for r in StoredTraces(path=path, sha256=sha).rows()] == ["r1"]
    path.write_text('{"request_id": "r1", "matched": true}\n{"request_id": "r2", "matched": true}\n')
    with pytest.raises(EvidenceChanged, match="changed while it was being judged"):
        list(StoredTraces(path=path, sha256=sha).matched_ids())
    with pytest.raises(EvidenceChanged, match="changed while it was being judged"):  # the whole rows, too
        StoredTraces(path=path, sha256=sha).rows()


def test_a_relabelled_column_is_copied_only_when_changed_and_widens_past_256_values():
    """The judge's relabelling leaves a label column nothing changes as the table's own array,
    and holds any number of new values exactly (one byte a code up to 256 values, then four)."""
    from soakspec.judge.rederive import _Labels
    from soakspec.judge.table import build_table

    t = build_table([{"request_id": f"r{k}", "bucket": 0, "outcome": "completed", "error": None} for k in range(300)])
    same = _Labels(t, "outcome")
    same.set_many(np.arange(300), "completed")
    same.set(7, "completed")
    assert same.done()[0] is t.c["outcome"]
    errors = _Labels(t, "error")
    for k in range(300):
        errors.set(k, f"boom {k}")
    codes, values = errors.done()
    assert codes.dtype == np.int32 and [values[c] for c in codes.tolist()] == [f"boom {k}" for k in range(300)]
