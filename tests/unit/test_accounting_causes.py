"""GPU-seconds lost by cause: the causes of one incident add up to its gpu_hours_lost, whatever
stage is missing or out of order (rows as the receiver stores them, on a real SQLite table)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy import select

from recovery import accounting, clock
from recovery.scheduler.base import JobState
from recovery.store import make_engine


def _row(**values):
    engine = make_engine("sqlite://")
    base = {"incident_id": "1", "job_id": "42", "gpus": 8}
    with engine.begin() as conn:
        conn.execute(accounting.incidents.insert().values(**base, **values))
    with engine.connect() as conn:
        return conn.execute(select(accounting.incidents)).one()


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        # every stage in order: onset 100, alert 130, decision 150, running again 400
        ({"detected_at": 130.0, "decided_at": 150.0},
         {"detection": 30, "decision": 20, "recovery": 250, "redone_work": 60}),
        # no decision (monitor mode; Slurm requeued the job itself): alert -> back is recovery
        ({"detected_at": 130.0, "decided_at": None},
         {"detection": 30, "decision": 0, "recovery": 270, "redone_work": 60}),
        # the job ran again before Goodput decided: nothing counts past running again
        ({"detected_at": 130.0, "decided_at": 900.0},
         {"detection": 30, "decision": 270, "recovery": 0, "redone_work": 60}),
        # the alert came after the job was back (a late alert)
        ({"detected_at": 700.0, "decided_at": 800.0},
         {"detection": 300, "decision": 0, "recovery": 0, "redone_work": 60}),
    ],
)  # fmt: skip
def test_the_causes_add_up_to_the_lost_gpu_time(stages, expected):
    row = _row(onset=100.0, running_again_at=400.0, checkpoint_at=40.0, **stages)
    by_cause = accounting.lost_by_cause(row)
    assert by_cause == {c: 8 * s for c, s in expected.items()}
    hours = accounting.gpu_hours_lost(100.0, 400.0, 8, 40.0)
    assert sum(by_cause.values()) == pytest.approx(hours * 3600)


def test_nothing_counts_before_the_job_runs_again():
    row = _row(onset=100.0, detected_at=130.0, decided_at=150.0)
    assert set(accounting.lost_by_cause(row).values()) == {0.0}


def test_an_unreadable_store_exports_no_series_not_zeros(tmp_path):
    """A scrape while the store cannot be read exports nothing: zeros would read as counter
    resets, and increase() would then count the store's whole total again at the next scrape
    (cluster ETTR at 0 for an hour)."""
    engine = make_engine(f"sqlite:///{tmp_path}/goodput.db")
    before = {f.name for f in accounting.AccountingCollector(engine).collect()}
    assert "goodput_gpu_seconds_lost" in before
    (tmp_path / "goodput.db").unlink()
    (tmp_path / "goodput.db").mkdir()  # the store cannot be opened
    engine.dispose()
    assert list(accounting.AccountingCollector(engine).collect()) == []


def test_a_restart_is_charged_to_its_own_incident_and_old_ones_close():
    """A straggler held for a person at day 0 (the job ran on), a crash requeued at day 3: the
    restart is the crash's, not 3 days of running charged to the straggler; an incident whose
    job has not run again in a day closes. Closed ones are not polled again."""
    h = 3600.0
    engine = make_engine("sqlite://", clock=clock.ManualClock(72 * h + 700))
    for iid, onset in (("1", 0.0), ("2", 72 * h), ("3", 1.0)):
        job = "43" if iid == "3" else "42"
        diag = SimpleNamespace(incident_id=iid, job_id=job, onset=onset)
        accounting.open_incident(engine, {"opened_at": onset + 60}, diag, None)
    asked = []

    class Slurm:
        def job_state(self, job_id):
            asked.append(job_id)
            start = 72 * h + 600 if job_id == "42" else -10 * h  # 43: never restarted
            return JobState(job_id, "t", "RUNNING", start_time=start, gpus=64)

    assert accounting.update_recoveries(engine, Slurm()) == 1
    got = {i: accounting.get(engine, i) for i in ("1", "2", "3")}
    assert got["2"]["running_again_at"] == 72 * h + 600
    assert round(got["2"]["gpu_hours_lost"], 2) == round(64 * 600 / h, 2)
    assert got["1"]["gpu_hours_lost"] == 0.0 and got["1"]["running_again_at"] is None
    assert got["3"]["gpu_hours_lost"] == 0.0  # open for three days: closed
    asked.clear()
    accounting.update_recoveries(engine, Slurm())
    assert asked == []


def _job_series(engine):
    fams = {f.name: f for f in accounting.AccountingCollector(engine).collect()}
    return {s.labels["job_id"] for s in fams["goodput_job_gpu_seconds_lost"].samples}


def test_a_jobs_lost_time_series_ends_hours_after_its_last_incident():
    """One series per job and cause for every job ever in an incident grew without end (a
    year of a large site's jobs); a job's series now lasts while an incident of its is open
    and `JOB_SERIES_S` after the last one was touched: the hour's increase() has seen it by
    then. The cluster's totals keep every incident."""
    h = 3600.0
    t = clock.ManualClock(100 * h)
    engine = make_engine("sqlite://", clock=t)
    rows = [  # job 1: recovered long ago; 2: recovered an hour ago; 3: still open, old onset
        {"incident_id": "a", "job_id": "1", "onset": 0.0, "detected_at": 60.0,
         "running_again_at": 600.0, "gpus": 8, "gpu_hours_lost": 8 * 600 / h},
        {"incident_id": "b", "job_id": "2", "onset": 99 * h - 600, "detected_at": 99 * h - 500,
         "running_again_at": 99 * h, "gpus": 8, "gpu_hours_lost": 8 * 600 / h},
        {"incident_id": "c", "job_id": "3", "onset": 10.0, "detected_at": 70.0, "gpus": 0},
    ]  # fmt: skip
    with engine.begin() as conn:
        for r in rows:
            conn.execute(accounting.incidents.insert().values(**r))
    assert _job_series(engine) == {"2", "3"}
    fams = {f.name: f for f in accounting.AccountingCollector(engine).collect()}
    total = sum(s.value for s in fams["goodput_gpu_seconds_lost"].samples)
    assert total == pytest.approx(2 * 8 * 600)  # job 1 still counts for the cluster
    t.t = 99 * h + accounting.JOB_SERIES_S + 1
    assert _job_series(engine) == {"3"}
