"""Public nvidia-smi readings (tests/data/public/gpu-readings.yaml) through the physics priors.

Each table people posted while their job was hung, training or absent is scored by the physics
detector as one instant of a job, with what dcgm-exporter's default counters carry (utilisation,
power, memory; no SM activity, as nvidia-smi shows none): a hung job's log stopped a minute ago,
a training job's moved a second ago. A spinning GPU must score at the alert level through its
model's wattage, a GPU idle with its memory held in a hung job through `idle_hang`, and no reading
of a working or empty GPU may score at all. Fails on the priors before the public readings: every
model but the H100 and H200 had no spin wattage, so their hung GPUs scored 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, HttpUrl

from catalogue import priors as P
from detector import fields as F
from detector.frame import Frame
from detector.physics import Physics

READINGS = Path(__file__).resolve().parents[1] / "data" / "public" / "gpu-readings.yaml"
COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}


class Gpu(BaseModel):
    model_config = ConfigDict(extra="forbid")
    util: float = Field(ge=0, le=100)
    power_w: float = Field(gt=0)
    fb_mib: float = Field(ge=0)


class Reading(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: HttpUrl
    model: str = Field(min_length=1)
    named: Literal["table", "memory"]
    state: Literal["spin", "idle_held", "training", "idle"]
    why: str = Field(min_length=10)
    cap_w: float = Field(gt=0)
    gpus: list[Gpu] = Field(min_length=1)


def _readings() -> list[Reading]:
    doc = yaml.safe_load(READINGS.read_text())
    assert doc["version"] == 1
    return [Reading.model_validate(r) for r in doc["readings"]]


def _scores(r: Reading) -> tuple[np.ndarray, list[str]]:
    """The physics scores and winning rules of the reading's GPUs, one instant of one job."""
    n = len(r.gpus)
    v = np.full((n, len(F.ALL_FIELDS)), np.nan)
    for i, g in enumerate(r.gpus):
        v[i, [COL[F.UTIL], COL["DCGM_FI_DEV_POWER_USAGE"], COL["DCGM_FI_DEV_FB_USED"]]] = (
            g.util,
            g.power_w,
            g.fb_mib,
        )
    hung = r.state in ("spin", "idle_held")
    v[:, COL[F.ITER_SECONDS]] = 1.0  # the job iterated; its last save closed ten minutes ago
    v[:, COL[F.STALL_SECONDS]] = 60.0 if hung else 1.0
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


def test_the_readings_follow_their_schema_and_cover_the_fleet() -> None:
    readings = _readings()
    assert len(readings) >= 20
    by_state = {s: {r.model for r in readings if r.state == s} for s in ("spin", "training")}
    assert len(by_state["spin"]) >= 6  # six GPU models seen spinning in a hang
    assert by_state["training"]  # and working, at a busy draw


@pytest.mark.parametrize("r", _readings(), ids=lambda r: f"{r.state}:{r.source.path}")
def test_every_reading_scores_as_its_state(r: Reading) -> None:
    scores, why = _scores(r)
    if r.state == "spin":  # a hang: its model's wattage tells the spin from work
        assert "spin_power_max_w" in P.load().params(r.model), r.model
        assert (scores >= 1.0).all(), (scores, why)
        assert all("spin_wait" in w for w in why), why
    elif r.state == "idle_held":
        assert (scores >= 1.0).all(), (scores, why)
        assert all("idle_hang" in w for w in why), why
    else:  # working, or no job: nothing to say
        assert (scores == 0).all(), (scores, why)


def test_each_models_spin_threshold_sits_between_its_spins_and_its_work() -> None:
    """Where a model was seen both ways: the highest spin under the threshold, the lowest busy
    healthy draw (utilisation at or over busy_util) over it."""
    pri = P.load()
    for model in {r.model for r in _readings()}:
        p = pri.params(model)
        limit = p.get("spin_power_max_w")
        rows = [(r.state, g) for r in _readings() if r.model == model for g in r.gpus]
        spins = [g.power_w for s, g in rows if s == "spin"]
        work = [g.power_w for s, g in rows if s == "training" and g.util >= p["busy_util"]]
        if spins:
            assert limit is not None and max(spins) < limit, (model, spins, limit)
        if work and limit is not None:
            assert min(work) > limit, (model, work, limit)


def test_another_name_of_a_model_shares_its_priors() -> None:
    pri = P.load()
    assert pri.params("A100-SXM4-40GB") == pri.params("NVIDIA A100-SXM4-80GB")
    assert pri.params("Tesla V100-SXM2-32GB")["spin_power_max_w"] == 120.0
