"""Under CI=true a skipped test fails the run: a test that skips in CI is one CI does not run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"
SKIPPING = {
    "test_in_body.py": "import pytest\n\ndef test_x():\n    pytest.skip('no tool')\n",
    "test_at_import.py": "import pytest\npytest.importorskip('no_such_module_here')\n",
}


@pytest.mark.parametrize("name", sorted(SKIPPING))
@pytest.mark.parametrize("ci", ["true", ""])
def test_a_skip_fails_only_under_ci(tmp_path, name, ci):
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / name).write_text(SKIPPING[name])
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {})
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / name)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if ci:
        assert run.returncode != 0, run.stdout
        assert "counts as a failure" in run.stdout
    else:
        assert run.returncode in (0, 5), run.stdout  # 5: pytest collected nothing (module skipped)
        assert "skipped" in run.stdout
