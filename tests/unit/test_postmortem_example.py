"""The worked example of docs/postmortem.md, end to end: the three commands of its console
block run, in that order, on the committed real H200 files, and print what the page shows.
The README's post-mortem section shows the same three commands and their output."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

from typer.testing import CliRunner

from goodput.cli import app

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "h200-ckpt"
PAGE = ROOT / "docs" / "postmortem.md"


def _steps(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of the page's console block."""
    block = re.search(r"```console\n(.*?)```", text, re.S)
    assert block, "docs/postmortem.md has no console block"
    steps: list[tuple[str, list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def test_the_worked_example_prints_what_the_page_shows(tmp_path, monkeypatch):
    for name in ("metrics.csv", "app.log.gz", "slurm.txt"):
        shutil.copy(DATA / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    steps = _steps(PAGE.read_text())
    assert [cmd.split()[1] for cmd, _ in steps] == ["import", "replay", "attribute"]
    runner = CliRunner()
    for cmd, expected in steps:
        argv = shlex.split(cmd)
        redirect = argv.index(">") if ">" in argv else None
        args = argv[1:redirect] if redirect else argv[1:]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        shown = r.stderr if redirect else r.stdout + r.stderr
        if redirect:
            Path(argv[redirect + 1]).write_text(r.stdout)
        got = [line.rstrip() for line in shown.rstrip("\n").splitlines()]
        assert got == expected, f"{cmd}: the page shows other output"
    diagnosis = json.loads((tmp_path / "diagnosis.json").read_text())
    assert diagnosis["outcome"] == "healthy" and diagnosis["job_id"] == "4242"
    assert (tmp_path / "detections.jsonl").read_text() == ""  # a healthy job: nothing raised


def test_the_readme_shows_the_same_commands_and_output():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Post-mortems on your own data", 1)[1].split("\n## ", 1)[0]
    assert _steps(section) == _steps(PAGE.read_text())  # the output the test above checks
    assert "docs/postmortem.md" in section


def test_the_pages_error_example_is_what_import_says(tmp_path, monkeypatch):
    block = re.search(r"```text\n\$ (.*?)\n(.*?)\n```", PAGE.read_text(), re.S)
    assert block, "docs/postmortem.md has no error example"
    monkeypatch.chdir(tmp_path)
    Path("dcgm.csv").write_text("ts,gpu,DCGM_FI_DEV_GPU_UTIL\n1,0,99\n")
    r = CliRunner().invoke(app, shlex.split(block.group(1))[1:])
    assert r.exit_code == 2 and r.stderr.strip() == block.group(2)
