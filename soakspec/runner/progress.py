"""Run progress on stderr: a rich live display on a TTY, plain lines otherwise, nothing with --quiet.

A bucket is named by its index from 0, as verdicts, reports and evidence name it, then how far
the level is ("bucket 0 done (1 of 4)"; the bar: "bucket 1 (2 of 4)"): "bucket 1/4 done" for
bucket 0 sent a reader of a verdict's "bucket 1" to the wrong line.

Progress never goes to stdout (stdout carries the verdict/report). Every message is
redacted before it is printed as evidence is (`evidence.redact.Redactor.text`): the run's
secret values, their JSON-escaped forms, a secret cut off at a message's end and
credential-looking text (a server's error quoting `Authorization: Bearer ...`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

from soakspec.evidence.redact import Redactor
from soakspec.units import format_duration


class Progress:
    def __init__(self, *, quiet: bool = False, stream=None, secrets: Iterable[str] = ()):
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._redactor = Redactor(secrets)
        self._live = None
        self._rich = None
        self._task = None
        self._state: dict = {}

    # ------------------------------------------------------------ plumbing
    def add_secrets(self, secrets: Iterable[str]) -> None:
        """Redact these too (the run's secrets, known once its plan's environment is read)."""
        self._redactor = Redactor({*self._redactor.source, *secrets})

    def _scrub(self, text: str) -> str:
        return self._redactor.text(text)

    def log(self, text: str) -> None:
        if self.quiet:
            return
        text = self._scrub(text)
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def error(self, text: str) -> None:
        """Problems are printed even with --quiet."""
        text = self._scrub(text)
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def start(self) -> None:
        if self.quiet or not self.tty:
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._rich = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("/"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[stats]}"),
                console=Console(file=self.stream, stderr=True),
                transient=False,
                refresh_per_second=4,
            )
            self._rich.start()
        except Exception:  # noqa: BLE001 - a display problem must never stop a soak
            self._rich = None

    def stop(self) -> None:
        if self._rich is not None:
            try:
                self._rich.stop()
            except Exception:  # noqa: BLE001
                pass
            self._rich = None

    # ------------------------------------------------------------ events
    def level_started(self, backend: str, label: str, total_s: float, bucket_s: float | None = None, buckets: int = 0,
                      warmup_s: float = 0.0, count: int | None = None, least_s: float | None = None) -> None:
        """`count`: a count-bounded level's requests_per_level. Such a level ends with its count,
        its duration only a bound, so its bar and lines count its requests ("k/N requests": the
        measured requests sent and finished, `LiveStats.measured`), not the bound's countdown.
        `least_s`: its min_duration, said on its first line ("at least N ... for at least D"); its
        level goes on past N until D has passed, so its lines count on past N too ("14/10")."""
        self._state = {
            "backend": backend, "label": label, "t0": time.monotonic(), "total": total_s,
            "bucket_s": bucket_s, "buckets": buckets, "warmup_s": warmup_s, "count": count, "least_s": least_s,
        }  # fmt: skip
        if self._rich is not None:
            if self._task is not None:
                self._rich.update(self._task, completed=self._rich.tasks[-1].total)
            total = count if count is not None else max(total_s, 0.001)
            self._task = self._rich.add_task(f"{backend} · {label}", total=total, stats="")
        elif count is not None and least_s is not None:
            self.log(f"[{backend}] {label}: at least {count} measured requests for at least {format_duration(least_s)}, "
                     f"at most {format_duration(total_s)}")
        elif count is not None:
            self.log(f"[{backend}] {label}: {count} measured requests, at most {format_duration(total_s)}")
        else:
            self.log(f"[{backend}] {label}: {format_duration(total_s)}")

    def level_begins(self, in_s: float) -> None:
        """The level's load starts `in_s` seconds from now: its countdown and bucket numbers run
        from there, not from `level_started` (`--workers`: the load processes start first, a
        second or more on a busy machine, and "left in level" was short by that)."""
        if self._state:
            self._state["t0"] = time.monotonic() + in_s

    def warmup_ended(self) -> None:
        """A counted warmup (`warmup = N requests`, shown as "warmup" until now: `level_started`
        with warmup_s = inf) has ended: the level's countdown and bucket numbers run from here."""
        if self._state:
            self._state["t0"], self._state["warmup_s"] = time.monotonic(), 0.0

    def tick(self, stats) -> None:
        """Called a few times a second with the level's LiveStats."""
        if self._rich is None or self._task is None:
            return
        p50 = stats.ttft_p50()
        st = self._state
        elapsed = time.monotonic() - st["t0"]
        text = ""
        if st.get("bucket_s") and st.get("buckets"):
            if elapsed < st["warmup_s"]:
                text = "warmup · "
            else:
                k = min(int((elapsed - st["warmup_s"]) // st["bucket_s"]), st["buckets"] - 1)
                text = f"bucket {k} ({k + 1} of {st['buckets']}) · "
        count = st.get("count")
        if count is not None:
            text += f"{self._sent(stats)}/{count} requests · "
        text += f"done {stats.done} failed {stats.failed} in-flight {stats.in_flight}"
        if p50 is not None:
            text += f" TTFT p50 {p50 * 1000:.0f}ms"
        self._rich.update(self._task, completed=elapsed if count is None else min(stats.measured, count), stats=text)

    def _sent(self, stats) -> int:
        """A count-bounded level's measured requests so far, as its lines count them: at most its
        N, but past it where a min_duration keeps the level going (`level_started`)."""
        count = self._state["count"]
        return stats.measured if self._state.get("least_s") is not None else min(stats.measured, count)

    def bucket_done(self, backend: str, label: str, bucket: int, nb: int, stats) -> None:
        if self._rich is not None:
            return
        p50 = stats.ttft_p50()
        ttft = f", TTFT p50 {p50 * 1000:.1f}ms" if p50 is not None else ""
        count = self._state.get("count")
        if count is not None:  # it ends with its count: say how far it is, not the bound's countdown
            self.log(f"[{backend}] {label}: bucket {bucket} done; {self._sent(stats)}/{count} requests; "
                     f"{stats.done} requests, {stats.failed} not completed{ttft}")
            return
        elapsed = time.monotonic() - self._state.get("t0", time.monotonic())
        remaining = max(0.0, self._state.get("total", 0.0) - elapsed)
        self.log(
            f"[{backend}] {label}: bucket {bucket} done ({bucket + 1} of {nb}); {stats.done} requests, "
            f"{stats.failed} not completed{ttft}; {format_duration(remaining)} left in level"
        )

    def level_ended(self, backend: str, label: str, stats, by_count: bool, by: str | None = None) -> None:
        """A count-bounded level's last line (plain output): its requests, and whether its count
        or its duration bound ended it (the bar shows it on a TTY). Nothing for a timed level.
        `by` = "min_duration" (`LevelRun.ended_by`): it sent its count first and went on until
        its min_duration had passed -- its line says all it sent ("51/25 requests")."""
        count = self._state.get("count")
        if count is None:
            return
        if self._rich is not None:
            if self._task is not None:
                self._rich.update(self._task, completed=min(stats.measured, count))
            return
        if by_count and by == "min_duration":
            self.log(f"[{backend}] {label}: {stats.measured}/{count} requests; ended by its min_duration (its count sent first)")
            return
        how = "ended by its count" if by_count else "ended by its duration bound: not complete"
        self.log(f"[{backend}] {label}: {min(stats.measured, count)}/{count} requests; {how}")
