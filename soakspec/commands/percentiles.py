"""`--percentiles 50,90,99` of the commands that show a level's percentiles (`report`, `run`):
one parser and one help text, so both accept and describe the same lists."""

from __future__ import annotations

import argparse


def percentiles_arg(text: str) -> tuple[str, ...]:
    """`--percentiles 50,90,99` (report and run): the results.json keys, or argparse's usage
    error (exit 2) saying what is wrong with the list (`soakspec.report.common.parse_percentiles`)."""
    from soakspec.report.common import parse_percentiles

    try:
        return parse_percentiles(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


PERCENTILES_HELP = ("the percentiles the tables show, comma-separated, among those results.json stores: 50, 90, 95, 99 "
                    "(default 50,95,99; the mean is shown beside them)")
