"""The operator's commands on mistaken input: a clear one-line error and exit 2, nothing created
or changed (before: a mistyped `--db` created an empty database and answered from it, "ok: 0
events, chain intact"; a missing or foreign `audit verify --file` or an unwritable output path
printed a traceback)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from goodput.cli import app as cli
from recovery import action_config
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


def test_an_empty_or_foreign_database_is_not_migrated_into_one(tmp_path) -> None:
    """An existing file that no receiver migrated (empty, another program's): an error, and
    the file left as it was (the CLI migrated it and wrote there)."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    r = runner.invoke(cli, ["actions", "pause", "--who", "ops", "--db", f"sqlite:///{empty}"])
    assert r.exit_code == 2 and "holds no receiver database" in r.output
    assert empty.read_bytes() == b""
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
    r = runner.invoke(cli, ["actions", "pause", "--who", "ops", "--db", f"sqlite:///{other}"])
    assert r.exit_code == 2 and "never migrated by a receiver" in r.output
    with sqlite3.connect(other) as conn:
        tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"notes"}


def test_empty_answers_say_so(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    make_engine(db)  # the receiver's, created by it
    assert runner.invoke(cli, ["actions", "list", "--db", db]).output.strip() == "no actions"
    r = runner.invoke(cli, ["actions", "list", "--state", "pending", "--db", db])
    assert r.exit_code == 2 and "unknown state 'pending': one of" in r.output
    r = runner.invoke(cli, ["nodes", "checks", "node1", "--db", db])
    assert r.exit_code == 0 and r.output.strip() == "no return-to-service checks of node1"
    r = runner.invoke(cli, ["nodes", "checks", "bad node!", "--db", db])
    assert r.exit_code == 2 and "is not a node name" in r.output


def test_the_cli_takes_names_and_reasons_as_the_api_does(tmp_path) -> None:
    """`actions pause --who/--reason` wrote newlines and direction overrides into the audit
    trail (and a NUL was a DataError traceback on PostgreSQL): the API's rules, exit 2."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    engine = make_engine(db)
    for argv in (["--who", "ops\nroot"], ["--who", "ops", "--reason", "a\u202eb"],
                 ["--who", "ops", "--reason", "a\x00b"]):  # fmt: skip
        r = runner.invoke(cli, ["actions", "pause", *argv, "--db", db])
        assert r.exit_code == 2 and r.output.startswith("error: "), r.output
    assert not action_config.is_paused(engine)
    r = runner.invoke(
        cli, ["actions", "pause", "--who", "José", "--reason", "disk swap", "--db", db]
    )
    assert r.exit_code == 0 and action_config.is_paused(engine)


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
    code, out = verify(tmp_path / "e.jsonl")  # a truncated export: nothing was verified
    assert code == 1 and "holds no events: nothing verified" in out


def test_a_path_the_command_cannot_write_is_one_line_not_a_traceback(tmp_path) -> None:
    """Through the console script's entry point (`goodput.entry.main`)."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    make_engine(db)
    out = tmp_path / "missing-dir" / "audit.jsonl"
    argv = ["slurm", "hold", "node1", "--hold-dir", str(tmp_path / "a-file")]
    (tmp_path / "a-file").write_text("")
    r = subprocess.run([sys.executable, "-c", "from goodput.entry import main; main()", *argv],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith(f"error: {tmp_path / 'a-file'}"), r.stderr
    argv = ["audit", "export", "--db", db, "-o", str(out)]
    code = "from goodput.entry import main; main()"
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"error: -o {out}: no directory {out.parent}\n"


def _bad_files(d) -> dict[str, str]:
    (d / "a-directory").mkdir()
    (d / "empty").write_text("")
    (d / "binary.csv.gz").write_bytes(bytes(range(256)) * 8)  # not gzip, not text
    return {k: str(d / k) for k in ("missing", "a-directory", "empty", "binary.csv.gz")}


H200 = str(Path(__file__).resolve().parents[1] / "data" / "h200-ckpt" / "metrics.csv")


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "{bad}", "--out", "{out}.jsonl"],
        ["attribute", "--recording", "{bad}"],
        ["attribute", "--job-log", "{bad}"],
        ["attribute", "--kernel-log", "{bad}"],
        ["import", "--metrics", "{bad}", "--node", "n1", "--job-id", "5", "--out", "{out}"],
        ["import", "--metrics", H200, "--slurm", "{bad}", "--node", "n1", "--out", "{out}"],
        ["sim", "record", "{bad}", "--out", "{out}"],
        ["audit", "verify", "--file", "{bad}"],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_a_bad_input_file_never_raises_out_of_a_command(tmp_path, argv) -> None:
    """Each file a missing path, a directory, an empty file, binary bytes: an answer or a
    one-line error, never an exception out of the command (a traceback)."""
    for kind, bad in _bad_files(tmp_path).items():
        out = tmp_path / f"out-{kind}"
        r = runner.invoke(cli, [a.format(bad=bad, out=out) for a in argv])
        assert r.exception is None or isinstance(r.exception, SystemExit), (kind, r.exception)
        assert "Traceback" not in r.output, (kind, r.output[-500:])
        if r.exit_code:  # a refused input leaves nothing behind
            assert not list(tmp_path.glob(f"out-{kind}*")), kind


def test_sim_record_refuses_a_directory_that_holds_something(tmp_path) -> None:
    """Its log sink appends: recorded into an old recording, the old run's log lines (its
    faults) would have joined the new one's."""
    out = tmp_path / "rec"
    (out / "logs" / "jobs").mkdir(parents=True)
    (out / "logs" / "jobs" / "slurm-1001.out").write_text("an earlier run's line\n")
    scenario = str(Path(__file__).resolve().parents[2] / "scenarios" / "healthy-short.yaml")
    r = runner.invoke(cli, ["sim", "record", scenario, "--out", str(out)])
    assert r.exit_code == 2 and "exists and is not an empty directory" in r.output
    assert (out / "logs" / "jobs" / "slurm-1001.out").read_text() == "an earlier run's line\n"


def test_a_crash_shows_no_local_variables(tmp_path) -> None:
    """A crash's traceback shows no frame's local variables: a token or a database URL with
    its password may be one (goodput.cli pins pretty_exceptions_show_locals=False, which
    older Typer releases defaulted to True)."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import os\n"
        "from goodput.cli import app\n"
        "@app.command('boom')\n"
        "def boom():\n"
        "    token = os.environ['TEST_SECRET']\n"
        "    raise RuntimeError(len(token))\n"
        "app()\n"
    )
    env = {**os.environ, "TEST_SECRET": "not-to-be-printed"}
    r = subprocess.run([sys.executable, str(script), "boom"], capture_output=True, text=True,
                       env=env)  # fmt: skip
    assert r.returncode == 1 and "RuntimeError" in r.stderr
    assert "not-to-be-printed" not in r.stderr + r.stdout


def test_a_service_keeps_its_traceback() -> None:
    """The one-line OSError is for one-off commands; a service's log keeps the traceback."""
    from goodput.entry import _service

    assert _service(["receiver", "serve"]) and _service(["exporter", "logs"])
    assert _service(["detector", "serve", "--port", "1"]) and _service(["sim", "serve"])
    assert not _service(["audit", "export", "-o", "x"]) and not _service([])


def test_receiver_db_commands_say_what_is_wrong_in_one_line(tmp_path) -> None:
    """`goodput receiver db current` printed a traceback for a bad URL or a store that did not
    answer, and created the directory and an empty file of a mistyped path."""
    db = tmp_path / "typo" / "goodput.db"
    r = runner.invoke(cli, ["receiver", "db", "current", "--db", f"sqlite:///{db}"])
    assert r.exit_code == 2 and "no database at" in r.output, r.output
    assert not db.exists() and not db.parent.exists()
    for url, said in (
        ("notaurl", "is not a database URL"),
        ("postgresql://u@127.0.0.1:1/x", "cannot open"),
    ):
        r = runner.invoke(cli, ["receiver", "db", "current", "--db-url", url])
        assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output
    r = runner.invoke(cli, ["receiver", "db", "upgrade", "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    assert r.exit_code == 0 and r.output.startswith("at "), r.output


@pytest.mark.parametrize(
    "env",
    [
        {"GOODPUT_LOG_TIMEZONE": "Not/AZone"},
        {"GOODPUT_MODE": "bogus"},
        {"GOODPUT_POLICY_FILE": "/no/such/policy.yaml"},
        {"GOODPUT_SCHEDULER": "pbs"},
    ],
    ids=lambda e: next(iter(e)),
)
def test_a_receiver_with_a_wrong_setting_does_not_start(tmp_path, env, monkeypatch) -> None:
    """It printed a traceback (a bad setting), or served with loops that failed every pass and
    a dead watchdog (a bad mode, policy file or scheduler): a receiver that never acts."""
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)  # served: exit 0, not a hang
    db = f"sqlite:///{tmp_path / 'r.db'}"
    r = runner.invoke(cli, ["receiver", "serve", "--db-url", db, "--port", "1"], env=env)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("goodput receiver: ") and "Traceback" not in r.output, r.output


def test_dashboards_push_reads_an_unreadable_token_file_as_an_error(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe\x00bad")
    r = runner.invoke(cli, ["dashboards", "push", "--token-file", str(token)])
    assert r.exit_code == 2 and "cannot read" in r.output, r.output
