"""The console's templates (Jinja2, autoescape on), their filters and the plain words."""

from __future__ import annotations

import json
import math
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, FileSystemLoader, select_autoescape

HERE = Path(__file__).parent


@lru_cache(maxsize=1)
def words() -> dict[str, Any]:
    """Plain words per outcome, action and disposition (`words.yaml`)."""
    doc = yaml.safe_load((HERE / "words.yaml").read_text())
    return doc if isinstance(doc, dict) else {}


def fmt_age(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "?"
    if not math.isfinite(s) or s < 0:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit}"
    return f"{int(s)}s"


def fmt_ts(ts: Any) -> str:
    try:
        t = float(ts)
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    except (TypeError, ValueError, OverflowError, OSError):
        return "—"


def fmt_pct(x: Any) -> str:
    try:
        return f"{float(x) * 100:.0f}%"
    except (TypeError, ValueError):
        return "—"


def confidence_word(x: Any) -> str:
    try:
        c = float(x)
    except (TypeError, ValueError):
        return "not yet known"
    return "high" if c >= 0.8 else "medium" if c >= 0.5 else "low"


def compact(value: Any, limit: int = 400) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@lru_cache(maxsize=1)
def templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        age=fmt_age, ts=fmt_ts, pct=fmt_pct, compact=compact, confword=confidence_word
    )
    env.globals["words"] = words
    return env
