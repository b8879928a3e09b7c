"""Execute every notebook top to bottom (nbclient); a cell that raises fails the test.

The kernel is this interpreter (the venv's), registered in a temporary Jupyter path, so the test
works from a clean clone where only `.venv` exists. Notebooks write into a temporary directory,
and the tuning notebook writes its thresholds into a temporary copy of alerts.yaml
(`GOODPUT_ALERTS_FILE`), never into the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "goodput-test-venv"
CELL_TIMEOUT_S = 120


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"})
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # the kernel imports this checkout's packages, wherever the venv's editable install points
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *([path] if path else [])]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    alerts = tmp_path / "alertmanager" / "alerts.yaml"
    alerts.parent.mkdir()
    shutil.copy(ROOT / "alertmanager" / "alerts.yaml", alerts)
    monkeypatch.setenv("GOODPUT_ALERTS_FILE", str(alerts))
    monkeypatch.setenv("GOODPUT_NOTEBOOK_OUT", str(tmp_path / "out"))
    for var in ("GOODPUT_RECORDINGS", "GOODPUT_RECORDING", "GOODPUT_DIAGNOSIS_FILE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_notebooks_exist() -> None:
    names = {p.stem for p in NOTEBOOKS}
    assert {"tune_detector", "explain_incident", "baselines"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, kernel_env: Path) -> None:
    repo_alerts = (ROOT / "alertmanager" / "alerts.yaml").read_text()
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError when a cell fails
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no figure"
    assert (ROOT / "alertmanager" / "alerts.yaml").read_text() == repo_alerts
    if path.stem == "tune_detector":
        tuned = (kernel_env / "alertmanager" / "alerts.yaml").read_text()
        assert (kernel_env / "alertmanager" / "rules" / "goodput.yml").exists()
        prediction = json.loads((kernel_env / "out" / "prediction.json").read_text())
        assert prediction and tuned  # the notebook recorded what it predicts
