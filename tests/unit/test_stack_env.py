from goodput import stack


def test_stack_env_reads_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_STACK_DIR", str(tmp_path))
    (tmp_path / "env").write_text("export A=1\nexport SLURM_CONF=/x/slurm.conf\n# comment\n")
    assert stack.stack_env() == {"A": "1", "SLURM_CONF": "/x/slurm.conf"}


def test_service_lifecycle(tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_STACK_DIR", str(tmp_path))
    pid = stack.start_service("sleeper", ["sleep", "30"], "none")
    assert stack._alive(pid)
    assert stack.start_service("sleeper", ["sleep", "30"], "none") == pid  # idempotent
    assert stack.stop_service("sleeper") is True
    assert not stack._alive(pid)
    assert stack.stop_service("sleeper") is False
