"""Run progress on stderr names a bucket as verdicts and evidence do: by its index from 0
("bucket 0 done (1 of 4)"), never by a count from 1 that reads as the next bucket's index."""

from __future__ import annotations

import io

from soakspec.runner.load import LiveStats
from soakspec.runner.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_plain_bucket_line_names_the_bucket_as_the_verdict_does():
    """The first bucket's line said "bucket 1/4 done" while the verdict and the evidence call it
    bucket 0 ("... at bucket 0 of w / concurrency 8"): a reader matching a failed bucket to its
    progress line was one off. The line names the index, then how far the level is."""
    out = io.StringIO()
    prog = Progress(stream=out)
    prog.level_started("a", "w / concurrency 8", 4.0, 1.0, 4)
    prog.bucket_done("a", "w / concurrency 8", 0, 4, LiveStats())
    prog.bucket_done("a", "w / concurrency 8", 3, 4, LiveStats())
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("[a] w / concurrency 8: bucket 0 done (1 of 4); 0 requests, 0 not completed; "), lines
    assert lines[2].startswith("[a] w / concurrency 8: bucket 3 done (4 of 4); "), lines


def test_a_counted_levels_bucket_line_names_the_bucket_as_the_verdict_does():
    out = io.StringIO()
    prog = Progress(stream=out)
    prog.level_started("a", "w / concurrency 1, 40 requests", 20.0, 1.0, 20, count=40)
    prog.bucket_done("a", "w / concurrency 1, 40 requests", 0, 20, LiveStats())
    assert out.getvalue().splitlines()[1] == "[a] w / concurrency 1, 40 requests: bucket 0 done; 0/40 requests; 0 requests, 0 not completed"


def test_the_tty_bar_names_the_running_bucket_as_the_verdict_does():
    """The bar said "bucket 2/4" 1.5 s into a level of 1 s buckets: bucket 1 in the verdict."""
    stream = _Tty()
    prog = Progress(stream=stream)
    prog.start()
    assert prog._rich is not None
    prog.level_started("a", "w / concurrency 8", 4.0, 1.0, 4)
    prog.level_begins(-1.5)  # its load started 1.5 s ago
    prog.tick(LiveStats())
    text = prog._rich.tasks[-1].fields["stats"]
    prog.stop()
    assert text.startswith("bucket 1 (2 of 4) · "), text
