from goodput import stack


def test_stack_env_reads_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_STACK_DIR", str(tmp_path))
    (tmp_path / "env").write_text("export A=1\nexport SLURM_CONF=/x/slurm.conf\n# comment\n")
    assert stack.stack_env() == {"A": "1", "SLURM_CONF": "/x/slurm.conf"}


def test_an_export_replaces_its_own_line_and_keeps_the_others(tmp_path, monkeypatch):
    """The demo exports its receiver database, so the CLI after `source env` reads it (it
    looked for a database the demo never made)."""
    monkeypatch.setenv("GOODPUT_STACK_DIR", str(tmp_path))
    (tmp_path / "env").write_text("export A=1\nexport GOODPUT_RECEIVER_DB_URL=sqlite:///old\n")
    stack.export("GOODPUT_RECEIVER_DB_URL", "sqlite:////tmp/goodput-stack/demo/goodput.db")
    stack.export("B", "two words")
    assert (tmp_path / "env").read_text() == (
        "export A=1\nexport GOODPUT_RECEIVER_DB_URL=sqlite:////tmp/goodput-stack/demo/goodput.db\n"
        "export B='two words'\n"
    )


def test_service_lifecycle(tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_STACK_DIR", str(tmp_path))
    pid = stack.start_service("sleeper", ["sleep", "30"], "none")
    assert stack._alive(pid)
    assert stack.start_service("sleeper", ["sleep", "30"], "none") == pid  # idempotent
    assert stack.stop_service("sleeper") is True
    assert not stack._alive(pid)
    assert stack.stop_service("sleeper") is False
