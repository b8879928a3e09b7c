"""`goodput attribute` names the ground-truth outcome and culprit of every scenario recording."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from goodput.cli import app

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    out = tmp_path_factory.mktemp("recordings")
    return out


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_attribute_matches_ground_truth(scenario, recordings):
    rec = recordings / scenario.stem
    done = subprocess.run(
        [sys.executable, "-m", "goodput.cli", "sim", "record", str(scenario), "--out", str(rec)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    truth = json.loads((rec / "truth.json").read_text())
    faults = truth.get("faults") or []
    faulty = next((str(f["job_id"]) for f in faults if f.get("job_id")), None)
    meta = json.loads((rec / "meta.json").read_text())
    job = faulty or str(meta["jobs"][0]["job_id"])  # the job is named: never guessed from truth
    result = CliRunner().invoke(app, ["attribute", "--recording", str(rec), "--job-id", job])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    if not faults:
        assert doc["outcome"] == "healthy"
        return
    fault = faults[0]
    culprit = sorted(fault["nodes"]) if fault["culprit"] == "node" else []
    assert (doc["outcome"], doc["affected_nodes"]) == (fault["outcome"], culprit), (
        doc["root_cause"],
        [(s["id"], s["role"], s["node"]) for s in doc["symptoms"]],
    )
    assert doc["category"] in ("infrastructure", "workload")
    assert 0 < doc["confidence"] <= 1 and doc["evidence"]
