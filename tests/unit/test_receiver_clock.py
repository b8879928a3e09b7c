"""The receiver on an injected clock (`Settings.clock`, `recovery.clock`): incidents, the settle,
diagnoses, the action outbox and the audit log all read it, none the wall clock."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recovery import audit, worker
from recovery.app import create_app
from recovery.clock import WALL, ManualClock, bind, now
from recovery.policy import DEFAULT_FILE
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.settings import Settings
from tests.unit.actions_fakes import make_fake_sim

pytestmark = pytest.mark.filterwarnings("ignore")
T = 1_600_000_000.0  # September 2020: far from the wall clock


@dataclasses.dataclass(frozen=True)
class ClockSettings(Settings):
    scheduler_adapter: Any = None


def acting_settings(tmp_path, clock: ManualClock, sim: Any, **kw: Any) -> ClockSettings:
    """A receiver in act mode on `clock`, acting through the fake simulator `sim`."""
    return ClockSettings(
        db_url=f"sqlite:///{tmp_path / 'r.db'}",
        require_auth=False,
        log_dir=str(tmp_path),
        recheck_max=0,
        clock=clock,
        scheduler_adapter=SimulatedScheduler("http://testserver", session=sim),
        extra={
            "GOODPUT_MODE": "act",
            "GOODPUT_POLICY_FILE": str(DEFAULT_FILE),
            "GOODPUT_ACTIONS_THREAD": "0",
        },
        **kw,
    )


def test_the_receiver_runs_on_its_clock(tmp_path) -> None:
    sim, _st, submit = make_fake_sim()
    submit("42", node="node2")
    clock = ManualClock(T)
    settings = acting_settings(tmp_path, clock, sim, slurm_enabled=False)
    app = create_app(settings, start_worker=False)
    engine = app.state.engine
    client = TestClient(app)
    alert = {
        "status": "firing",
        "labels": {"alertname": "GoodputGPUFatalXid", "job_id": "42", "node": "node2"},
        "startsAt": "2020-09-13T12:26:40Z",
        "fingerprint": "abc1",
    }
    resp = client.post(
        "/api/v1/alerts", json={"version": "4", "status": "firing", "alerts": [alert]}
    )
    assert resp.status_code == 200, resp.text
    assert client.get("/api/v1/incidents/1").json()["opened_at"] == T

    clock.t = T + settings.settle_s - 1
    assert worker.run_once(engine, settings) == []  # still settling, on the injected clock
    clock.t = T + settings.settle_s
    assert worker.run_once(engine, settings) == [1]
    (row,) = client.get("/api/v1/actions").json()["actions"]
    assert row["created_at"] == T + settings.settle_s
    stamps = [e["ts"] for e in audit.iter_all(engine)]
    assert stamps and all(T <= t <= T + settings.settle_s for t in stamps)


def test_an_unbound_store_reads_the_wall_clock(tmp_path) -> None:
    from sqlalchemy import create_engine

    eng = create_engine(f"sqlite:///{tmp_path / 'w.db'}")
    assert abs(now(eng) - WALL.now()) < 5
    bind(eng, ManualClock(T))
    with eng.connect() as conn:
        assert now(conn) == T


def test_the_rows_the_migration_writes_read_the_receivers_clock(tmp_path) -> None:
    """The budget lock's row is written by the migration at start-up: at the injected clock's
    time (the clock is bound before the schema is migrated), not the wall clock's."""
    from sqlalchemy import select

    from recovery.outbox import switches

    settings = ClockSettings(
        db_url=f"sqlite:///{tmp_path / 'm.db'}",
        require_auth=False,
        slurm_enabled=False,
        clock=ManualClock(T),
        extra={"GOODPUT_ACTIONS_THREAD": "0"},
    )
    engine = create_app(settings, start_worker=False).state.engine
    with engine.connect() as conn:
        rows = conn.execute(select(switches.c.name, switches.c.updated_at)).all()
    assert [(r.name, r.updated_at) for r in rows] == [("budget", T)]
