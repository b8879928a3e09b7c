"""Public nvidia-smi readings (tests/data/public/gpu-readings.yaml) through the physics priors
(bench/public_readings.py: each table as one instant of a job, dcgm's default counters).

A spinning GPU of a hung job must score at the alert level through its model's wattage, a GPU
idle with its memory held in a hung job through `idle_hang`, and no reading of a working or
empty GPU may score at all. Fails on the priors before the public readings: every model but the
H100 and H200 had no spin wattage, so their hung GPUs scored 0.
"""

from __future__ import annotations

import pytest

from bench import public_readings as R
from catalogue import priors as P


def test_the_readings_follow_their_schema_and_cover_the_fleet() -> None:
    readings = R.load()
    assert len(readings) >= 26
    by_state = {s: {r.model for r in readings if r.state == s} for s in ("spin", "training")}
    assert len(by_state["spin"]) >= 7  # seven GPU models seen spinning in a hang
    assert by_state["training"]  # and working, at a busy draw


def test_a_bad_reading_is_refused_with_its_field(tmp_path) -> None:
    (tmp_path / "r.yaml").write_text(
        "version: 1\nreadings:\n- {source: 'not a url', model: X, named: table, state: spin,"
        " why: 'a hang of some kind', cap_w: 300, gpus: [{util: 100, power_w: 70, fb_mib: 1}]}\n"
    )
    with pytest.raises(ValueError, match="source"):
        R.load(tmp_path / "r.yaml")


@pytest.mark.parametrize("r", R.load(), ids=lambda r: f"{r.state}:{r.source.path}")
def test_every_reading_scores_as_its_state(r: R.Reading) -> None:
    if r.state == "spin":  # a hang: its model's wattage tells the spin from work
        assert "spin_power_max_w" in P.load().params(r.model), r.model
    assert all(R.right(r)), R.score(r)


def test_the_bench_rows_count_every_gpu_right() -> None:
    rows = R.rows()
    assert sum(r["gpus"] for r in rows) == sum(len(r.gpus) for r in R.load())
    assert all(r["right"] == r["gpus"] for r in rows)
    assert R.markdown(rows)[-1].startswith("| **all** | | 26 | ")


def test_each_models_spin_threshold_sits_between_its_spins_and_its_work() -> None:
    """Where a model was seen both ways: the highest spin under the threshold, the lowest busy
    healthy draw (utilisation at or over busy_util) over it."""
    pri = P.load()
    readings = R.load()
    for model in {r.model for r in readings}:
        p = pri.params(model)
        limit = p.get("spin_power_max_w")
        gpus = [(r.state, g) for r in readings if r.model == model for g in r.gpus]
        spins = [g.power_w for s, g in gpus if s == "spin"]
        work = [g.power_w for s, g in gpus if s == "training" and g.util >= p["busy_util"]]
        if spins:
            assert limit is not None and max(spins) < limit, (model, spins, limit)
        if work and limit is not None:
            assert min(work) > limit, (model, work, limit)


def test_another_name_of_a_model_shares_its_priors() -> None:
    pri = P.load()
    assert pri.params("A100-SXM4-40GB") == pri.params("NVIDIA A100-SXM4-80GB")
    assert pri.params("Tesla V100-SXM2-32GB")["spin_power_max_w"] == 120.0
