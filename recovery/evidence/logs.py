"""Log evidence (stub, being written): the job's Slurm output and the nodes' kernel logs."""

from __future__ import annotations

from recovery.evidence import Bundle, Context, Report
from recovery.settings import Settings


def collect(ctx: Context, settings: Settings) -> Bundle:
    return Bundle(reports=[Report("logs", "empty", "not implemented yet")])


def collect_loki(ctx: Context, settings: Settings) -> Bundle:
    return Bundle(reports=[Report("loki", "empty", "not implemented yet")])
