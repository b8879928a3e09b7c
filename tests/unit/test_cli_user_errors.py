"""The operator's commands on mistaken input: a clear one-line error and exit 2, nothing created
or changed (before: a mistyped `--db` created an empty database and answered from it, "ok: 0
events, chain intact"; a missing or foreign `audit verify --file` or an unwritable output path
printed a traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from goodput.cli import app as cli
from recovery.store import make_engine

runner = CliRunner()


@pytest.mark.parametrize(
    "argv",
    [
        ["actions", "list"],
        ["actions", "pause"],
        ["audit", "verify"],
        ["nodes", "history"],
        ["nodes", "checks"],
    ],  # fmt: skip
    ids=" ".join,
)
def test_a_missing_database_is_an_error_and_is_not_created(tmp_path, argv) -> None:
    db = tmp_path / "typo" / "goodput.db"
    r = runner.invoke(cli, [*argv, "--db", f"sqlite:///{db}"])
    assert r.exit_code == 2 and f"no receiver database at {db}" in r.output
    assert not db.exists() and not db.parent.exists()
    r = runner.invoke(cli, [*argv, "--db", "notaurl"])
    assert r.exit_code == 2 and "is not a database URL" in r.output


def test_empty_answers_say_so(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    make_engine(db)  # the receiver's, created by it
    assert runner.invoke(cli, ["actions", "list", "--db", db]).output.strip() == "no actions"
    r = runner.invoke(cli, ["nodes", "checks", "node1", "--db", db])
    assert r.exit_code == 0 and r.output.strip() == "no return-to-service checks of node1"
    r = runner.invoke(cli, ["nodes", "checks", "bad node!", "--db", db])
    assert r.exit_code == 2 and "is not a node name" in r.output


def test_audit_verify_file_names_what_is_wrong(tmp_path) -> None:
    def verify(path) -> tuple[int, str]:
        r = runner.invoke(cli, ["audit", "verify", "--file", str(path)])
        return r.exit_code, r.output

    code, out = verify(tmp_path / "nope.jsonl")
    assert code == 2 and "nope.jsonl: No such file or directory" in out
    (tmp_path / "x.jsonl").write_text('{"seq": 1}\nnot json\n')
    code, out = verify(tmp_path / "x.jsonl")
    assert code == 2 and "line 1 is not an exported audit event" in out
    (tmp_path / "e.jsonl").write_text("")
    assert verify(tmp_path / "e.jsonl") == (0, "ok: no events to check\n")


def test_a_path_the_command_cannot_write_is_one_line_not_a_traceback(tmp_path) -> None:
    """Through the console script's entry point (`goodput.entry.main`)."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    make_engine(db)
    out = tmp_path / "missing-dir" / "audit.jsonl"
    argv = ["audit", "export", "--db", db, "-o", str(out)]
    code = "from goodput.entry import main; main()"
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"error: {out}.partial: No such file or directory\n"
