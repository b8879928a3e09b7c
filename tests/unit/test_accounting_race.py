"""Two planners of one action (the worker and the reconciler thread) record its incident's
onset at once: the second finds the row inserted between its check and its insert. Failed
before with IntegrityError (UNIQUE goodput_accounting.incident_id), which broke the plan:
tests/integration/test_watchdog_slurm.py saw it on the real stack."""

from __future__ import annotations

from types import SimpleNamespace

from sqlalchemy import select

from recovery import accounting
from recovery.store import make_engine


def test_a_concurrent_planner_recording_the_incident_first_is_no_error(tmp_path, monkeypatch):
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    other = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    diag = SimpleNamespace(incident_id="7", job_id="42", onset=100.0)

    def racing_checkpoint(prom_url, job_id):  # noqa: ANN001, ANN202 - runs after the check
        monkeypatch.setattr(accounting, "_checkpoint", lambda *_: None)  # the other planner's
        accounting.open_incident(other, {"opened_at": 101.0}, diag, None)
        return None

    monkeypatch.setattr(accounting, "_checkpoint", racing_checkpoint)
    accounting.open_incident(engine, {"opened_at": 102.0}, diag, None)
    with engine.connect() as conn:
        rows = conn.execute(select(accounting.incidents)).all()
    assert [(r.incident_id, r.detected_at) for r in rows] == [("7", 101.0)]
