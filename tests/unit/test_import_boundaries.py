"""The packages meet on the wire: the import-linter contracts in pyproject.toml hold, and they
catch a service importing another."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_project_keeps_its_import_contracts():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_the_contracts_catch_recovery_importing_the_detector(tmp_path):
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for pkg in config["root_packages"]:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "recovery" / "diagnose.py").write_text("from detector import x\n")
    (tmp_path / "detector" / "x.py").write_text("")
    lines = ["[tool.importlinter]", f"root_packages = {config['root_packages']!r}"]
    for c in config["contracts"]:
        lines.append("[[tool.importlinter.contracts]]")
        lines += [f"{k} = {v!r}" for k, v in c.items()]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines).replace("'", '"') + "\n")
    run = _lint(tmp_path)
    assert run.returncode != 0, run.stdout
    assert "recovery.diagnose -> detector" in run.stdout
