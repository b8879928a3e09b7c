"""`goodput bench tuning`: two alert files through the fault benchmark, side by side."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from alertdsl import spec as A
from bench import tuning as BT
from detector import tuning_write as W

pytestmark = pytest.mark.filterwarnings("ignore")

SCORE_ALERTS = (
    "GoodputJobHung",
    "GoodputJobSlow",
    "GoodputJobStraggler",
    "GoodputJobAnomaly",
    "GoodputGPUAnomaly",
)


def _slower(tmp_path: Path) -> Path:
    """A copy of the project's alerts.yaml whose score alerts wait 60 s longer."""
    spec = A.load(A.DEFAULT_PATH)
    changes = {
        n: {"for": f"{int(A.duration_seconds(spec.alert(n).for_)) + 60}s"} for n in SCORE_ALERTS
    }
    path = tmp_path / "slower.yaml"
    path.write_text(W.set_thresholds(A.DEFAULT_PATH.read_text(), changes))
    return path


def test_a_slower_file_moves_latency_up_as_predicted(tmp_path: Path) -> None:
    prediction = {"by_kind": {"thermal_straggler": {"latency": "up"}}}
    doc = BT.compare(_slower(tmp_path), prediction=prediction, seeds=1, pattern="thermal*")
    row = doc["per_kind"]["thermal_straggler"]
    lat = row["latency_p50_s"]
    assert lat["after"] >= lat["before"] + 55  # the alert waits 60 s longer (5 s samples)
    assert row["latency_moved"] == "up" and row["as_predicted"] is True
    assert doc["before"]["file"] == "alertmanager/alerts.yaml" and doc["after"]["file"] == (
        "slower.yaml"
    )
    assert os.environ.get(A.PATH_ENV) is None  # the override does not leak
    md = BT.markdown(doc)
    assert "| thermal_straggler |" in md and "| up | up | yes |" in md
    BT.write(doc, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "tuning.json").read_text())["per_kind"]


def _no_run(_: object) -> None:
    raise AssertionError("a benchmark ran")


def test_a_broken_or_identical_file_fails_before_any_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("alerts: [{name: X}]\n")
    with pytest.raises(A.AlertsError):
        BT.compare(bad, seeds=1, pattern="thermal*", progress=_no_run)
    same = tmp_path / "same.yaml"
    same.write_text(A.DEFAULT_PATH.read_text())
    with pytest.raises(ValueError, match="nothing to compare"):
        BT.compare(same, seeds=1, pattern="thermal*", progress=_no_run)
    with pytest.raises(ValueError, match="latency must be one of"):
        pred = {"by_kind": {"spin_hang": {"latency": "faster"}}}
        BT.compare(_slower(tmp_path), prediction=pred, pattern="thermal*", progress=_no_run)


def test_cli_rejects_a_prediction_that_is_not_one(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from goodput.cli import app

    pred = tmp_path / "prediction.json"
    pred.write_text('["not", "a", "prediction"]')
    args = ["bench", "tuning", "--after", str(A.DEFAULT_PATH), "--prediction", str(pred)]
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert res.exit_code != 0 and "not a tuning prediction" in res.output
    res = CliRunner().invoke(app, ["bench", "tuning", "--after", str(tmp_path / "missing.yaml")])
    assert res.exit_code != 0 and "no such file" in res.output
