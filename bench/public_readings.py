"""Public-readings rows of `goodput bench faults`: nvidia-smi tables from public bug reports.

Data: `tests/data/public/gpu-readings.yaml`, tables people posted while their job was hung,
training or absent, each with its source. Every GPU row is scored by the production physics
detector as one instant of a job with what dcgm-exporter's default counters carry (utilisation,
power, memory; no SM activity, as nvidia-smi shows none): a hung job's log stopped a minute
ago, a training job's moved a second ago. Right: a spinning GPU at the alert level by
`spin_wait` (its model's wattage), a GPU idle with its memory held in a hung job by
`idle_hang`, a working or empty GPU at 0.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from detector import fields as F
from detector.frame import Frame
from detector.physics import Physics

READINGS = (
    Path(__file__).resolve().parent.parent / "tests" / "data" / "public" / "gpu-readings.yaml"
)
COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
RULE = {"spin": "spin_wait", "idle_held": "idle_hang", "training": None, "idle": None}


class Gpu(BaseModel):
    model_config = ConfigDict(extra="forbid")
    util: float = Field(ge=0, le=100)
    power_w: float = Field(gt=0)
    fb_mib: float = Field(ge=0)


class Reading(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: HttpUrl
    model: str = Field(min_length=1)
    named: Literal["table", "memory"]  # the full modelName: printed, or from memory and cap
    state: Literal["spin", "idle_held", "training", "idle"]
    why: str = Field(min_length=10)
    cap_w: float = Field(gt=0)
    gpus: list[Gpu] = Field(min_length=1)


def load(path: Path = READINGS) -> list[Reading]:
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise ValueError(f"{path}: want a mapping with version: 1")
    return [Reading.model_validate(r) for r in doc["readings"]]


def score(r: Reading) -> tuple[np.ndarray, list[str]]:
    """The physics scores and winning rules of the reading's GPUs, one instant of one job."""
    n = len(r.gpus)
    v = np.full((n, len(F.ALL_FIELDS)), np.nan)
    for i, g in enumerate(r.gpus):
        v[i, COL[F.UTIL]] = g.util
        v[i, COL["DCGM_FI_DEV_POWER_USAGE"]] = g.power_w
        v[i, COL["DCGM_FI_DEV_FB_USED"]] = g.fb_mib
    v[:, COL[F.ITER_SECONDS]] = 1.0  # the job iterated; its last save closed ten minutes ago
    v[:, COL[F.STALL_SECONDS]] = 60.0 if RULE[r.state] else 1.0
    v[:, COL[F.SINCE_PAUSE]] = 600.0
    v[:, COL[F.JOB_AGE]] = 900.0
    f = Frame(
        np.full(n, 1e9),
        np.full(n, "7", object),
        np.full(n, "node1", object),
        np.arange(n, dtype=np.int64),
        v,
        model=np.full(n, r.model, object),
    )
    det = Physics()
    return det.score(f), det.explain(f, np.arange(n))


def right(r: Reading) -> list[bool]:
    """Per GPU: scored as its state says (see the module docstring)."""
    scores, why = score(r)
    rule = RULE[r.state]
    if rule is None:
        return [bool(s == 0) for s in scores]
    return [bool(s >= 1.0 and rule in w) for s, w in zip(scores, why, strict=True)]


def rows(path: Path = READINGS) -> list[dict[str, Any]]:
    """Per GPU model and state: tables, GPUs, GPUs scored right, the power range seen."""
    acc: dict[tuple[str, str], dict[str, Any]] = defaultdict(
        lambda: {"tables": 0, "gpus": 0, "right": 0, "power_w": []}
    )
    for r in load(path):
        a = acc[(r.model, r.state)]
        a["tables"] += 1
        a["gpus"] += len(r.gpus)
        a["right"] += sum(right(r))
        a["power_w"] += [g.power_w for g in r.gpus]
    return [
        {
            "model": m,
            "state": s,
            **{k: v for k, v in a.items() if k != "power_w"},
            "power_w": [min(a["power_w"]), max(a["power_w"])],
        }
        for (m, s), a in sorted(acc.items())
    ]


def markdown(rows_: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| GPU model | state | tables | GPUs scored right | power (W) |",
        "|---|---|---|---|---|",
    ]
    for r in rows_:
        lo, hi = r["power_w"]
        mark = "" if r["right"] == r["gpus"] else " **(misses)**"
        lines.append(
            f"| {r['model']} | {r['state']} | {r['tables']} | {r['right']}/{r['gpus']}{mark} | "
            f"{lo:g}–{hi:g} |"
        )
    total, ok = sum(r["gpus"] for r in rows_), sum(r["right"] for r in rows_)
    lines.append(f"| **all** | | {sum(r['tables'] for r in rows_)} | {ok}/{total} | |")
    return lines
