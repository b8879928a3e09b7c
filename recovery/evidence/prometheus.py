"""Prometheus evidence (stub, being written)."""

from __future__ import annotations

from recovery.evidence import Bundle, Context, Report
from recovery.settings import Settings


def collect(ctx: Context, settings: Settings) -> Bundle:
    return Bundle(reports=[Report("prometheus", "empty", "not implemented yet")])
