"""server.log is decompressed once by the judge (issue 14): trace matching's pass over it also
takes the lines the runtime boundary's `log_pattern` is looked for in (`BoundaryText`), and
what it holds of them leaves the trace lines out -- the whole log used to be joined into one
string, which at 10^7 requests is gigabytes. The runner's collection takes them the same way;
`quick_demo` (tests/conftest.py) is a real run whose specs declare a `log_pattern`."""

from __future__ import annotations

import json

from soakspec.evidence import layout, serverlog
from soakspec.evidence.runtime import BoundaryText
from soakspec.judge import judge, load_evidence
from soakspec.lang import load_spec


def test_the_judge_reads_each_server_log_once_and_holds_no_trace_line_for_the_runtime_boundary(quick_demo, monkeypatch):
    spec, diags, _ = load_spec(quick_demo.spec)
    assert spec is not None, diags
    manifest = json.loads((quick_demo.run_dir / layout.MANIFEST).read_text())
    stored = {b["name"]: b["runtime_boundary"]["status"] for b in manifest["backends"]}
    # the runner's collection found the version line where one is declared (the other backend's
    # label has nothing to detect)
    assert sorted(stored.values()) == ["confirmed", "declared"]
    opened: list[str] = []
    real_open = serverlog.open_log
    monkeypatch.setattr(serverlog, "open_log", lambda path, *a, **k: (opened.append(str(path)), real_open(path, *a, **k))[1])
    texts: list[str] = []
    real_text = BoundaryText.text
    monkeypatch.setattr(BoundaryText, "text", lambda self: (texts.append(real_text(self)), texts[-1])[1])
    verdict = judge(spec, load_evidence(quick_demo.run_dir))
    backends = sorted(stored)
    assert sorted(opened) == sorted(str(quick_demo.run_dir / layout.BACKENDS / b / layout.SERVER_LOG_GZ) for b in backends)
    assert len(texts) == 1  # the declared version's boundary: read from trace matching's pass
    assert all("NCCL version" in t and "soakspec_sim_trace" not in t for t in texts)
    assert not [n for n in verdict.notes if "runtime boundary" in n]  # the judge derives what the runner stored
