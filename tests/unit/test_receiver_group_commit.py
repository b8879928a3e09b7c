"""The webhook's group commit: payloads waiting together are written in one transaction, each
request returns after the commit that holds its payload, and a bad payload fails only its own
request (the batch is written again one by one)."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import func, select

from recovery import incidents
from recovery.group_commit import GroupCommit
from recovery.settings import Settings
from recovery.store import alerts, make_engine


def _alert(fp: str, job: str) -> dict:
    return {
        "status": "firing",
        "labels": {"alertname": "GoodputJobHung", "job_id": job},
        "annotations": {},
        "startsAt": "2026-01-01T00:00:10Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": fp,
    }


@pytest.fixture
def gc(tmp_path, monkeypatch):
    s = Settings(db_url=f"sqlite:///{tmp_path}/g.db", require_auth=False, slurm_enabled=False)
    engine = make_engine(s.db_url)
    batches: list[int] = []
    real = incidents.ingest_payloads

    def slow(engine, settings, payloads, now=None):  # a slow commit: the others queue meanwhile
        batches.append(len(payloads))
        time.sleep(0.2)
        return real(engine, settings, payloads, now)

    monkeypatch.setattr(incidents, "ingest_payloads", slow)
    return GroupCommit(engine, s), engine, batches


def _run(gc: GroupCommit, docs: list[list[dict]]) -> list:
    """Each payload as the webhook posts it, concurrently on one event loop: the results (or
    the errors) in order."""

    async def main() -> list:
        first = asyncio.ensure_future(gc.ingest(docs[0], raw="body 0"))
        await asyncio.sleep(0.05)  # the first one is writing when the others arrive
        rest = [gc.ingest(d, raw=f"body {k}") for k, d in enumerate(docs[1:], 1)]
        return await asyncio.gather(first, *rest, return_exceptions=True)

    return asyncio.run(asyncio.wait_for(main(), 10))


def test_payloads_waiting_together_commit_together(gc):
    commits, engine, batches = gc
    out = _run(commits, [[_alert(f"{k:x}", str(100 + k % 3))] for k in range(12)])
    assert all(isinstance(r, incidents.IngestResult) and r.new == 1 for r in out), out
    assert batches[0] == 1 and sum(batches) == 12 and len(batches) < 12, batches
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(alerts)).scalar_one() == 12
    # one incident per job, whichever batch its alerts were in
    assert sorted({r.incident_ids[0] for r in out}) == [1, 2, 3]


def test_a_bad_payload_fails_alone(gc):
    commits, engine, batches = gc
    docs = [[_alert(f"{k:x}", "7")] for k in range(6)]
    # no startsAt: the fold fails, inside the batch's transaction
    docs[3] = [
        {"status": "firing", "labels": {"alertname": "X", "job_id": "7"}, "fingerprint": "b"}
    ]
    out = _run(commits, docs)
    assert isinstance(out[3], KeyError)
    assert max(batches) > 1 and sum(batches) > 6, batches  # a failed batch, then one by one
    assert all(isinstance(r, incidents.IngestResult) for k, r in enumerate(out) if k != 3), out
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(alerts)).scalar_one() == 5


def test_a_batch_the_store_failed_fails_at_once_not_payload_by_payload(gc, monkeypatch):
    """The store itself failed the batch (SQLite locked past its busy timeout, PostgreSQL
    gone): each payload written again alone waited out as long (a full batch at the 30 s
    timeout: two hours with every request waiting). Now all fail together, once."""
    from sqlalchemy.exc import OperationalError

    commits, engine, batches = gc
    real = incidents.ingest_payloads

    def locked(engine, settings, payloads, now=None):
        if len(batches) >= 1:
            batches.append(len(payloads))
            raise OperationalError("INSERT", {}, Exception("database is locked"))
        return real(engine, settings, payloads, now)

    monkeypatch.setattr(incidents, "ingest_payloads", locked)
    out = _run(commits, [[_alert(f"{k:x}", "7")] for k in range(6)])
    failed = [r for r in out if isinstance(r, OperationalError)]
    assert len(failed) == 5 and len(batches) == 2, (out, batches)  # one failed batch of five


def _tables(engine) -> dict[str, list[tuple]]:
    """The ingest's tables, without ids and times (which differ between two stores)."""
    from recovery.store import incident_alerts, incidents, payloads

    i = incidents.c
    with engine.connect() as conn:
        return {
            "incidents": sorted(
                conn.execute(
                    select(i.id, i.job_id, i.state, i.first_alert_ts, i.diagnosis_gen).add_columns(
                        i.diagnosis_state, i.diagnosis_due
                    )
                )
            ),
            "alerts": sorted(
                conn.execute(select(alerts.c.fingerprint, alerts.c.starts_at, alerts.c.status))
            ),
            "payloads": sorted(conn.execute(select(payloads.c.body, payloads.c.deliveries))),
            "links": sorted(conn.execute(select(incident_alerts.c.incident_id))),
        }


def test_one_batch_stores_what_one_payload_at_a_time_stores(tmp_path):
    """Alerts fired, resolved and fired again, a body delivered again, a node alert joining
    the incident a job alert just joined, resolutions: all in one transaction, they leave the
    tables as one transaction per payload would."""
    ended = {"status": "resolved", "endsAt": "2026-01-01T00:01:00Z"}
    a_resolved, b_resolved, d_resolved = (
        {**_alert(fp, j), **ended} for fp, j in ("a7", "b8", "d6")
    )
    on_node = _alert("e", "7")
    on_node["labels"] = {**on_node["labels"], "node": "n1"}
    node_only = {**_alert("f", "0"), "labels": {"alertname": "GoodputGPUAnomaly", "node": "n1"}}
    sequence = [
        ([_alert("a", "7")], "body a"),
        ([a_resolved], "body a resolved"),
        ([_alert("a", "7")], "body a"),  # Alertmanager re-sends: same body, alert fires again
        ([_alert("b", "8")], "body b"),
        ([_alert("a", "7"), _alert("b", "8")], "body a+b"),
        ([_alert("z", "9")], "body z"),  # stored before, then twice in the batch
        ([_alert("z", "9")], "body z"),
        ([on_node], "job 7 on n1"),
        ([node_only], "n1"),  # joins job 7's incident, by the link made just before
        ([b_resolved, _alert("c", "8")], "b resolves, c fires"),  # job 8's stays open
        ([_alert("d", "6")], "d"),
        ([d_resolved], "d resolves"),  # job 6's incident resolves
        ([_alert("g", "6")], "g"),  # job 6 again: a new incident
    ]
    stores = []
    for name in ("batch", "single"):
        s = Settings(
            db_url=f"sqlite:///{tmp_path}/{name}.db", require_auth=False, slurm_enabled=False
        )
        engine = make_engine(s.db_url)
        incidents.ingest(engine, s, [_alert("z", "9")], raw="body z", now=50.0)
        ready = [incidents.prepare(engine, s, docs, raw=raw) for docs, raw in sequence]
        if name == "batch":
            results = incidents.ingest_payloads(engine, s, ready, now=100.0)
        else:
            results = [incidents.ingest_payloads(engine, s, [p], now=100.0)[0] for p in ready]
        stores.append((results, _tables(engine)))
    (batch, batch_tables), (single, single_tables) = stores
    counts = [(r.new, r.changed) for r in batch]
    assert counts == [(1, 0), (0, 1), (0, 1), (1, 0)] + [(0, 0)] * 3 + [
        (1, 0), (1, 0), (1, 1), (1, 0), (0, 1), (1, 0),
    ]  # fmt: skip
    assert [(r.new, r.changed, r.incident_ids) for r in batch] == [
        (r.new, r.changed, r.incident_ids) for r in single
    ]
    assert batch_tables == single_tables
    assert batch[8].incident_ids == batch[7].incident_ids  # the node alert: job 7's incident
    states = [(job, state) for _, job, state, *_ in batch_tables["incidents"]]
    assert sorted(states) == sorted(
        [("9", "open"), ("8", "open"), ("6", "resolved"), ("6", "open")]
        + [("7", "resolved"), ("7", "open")]  # a resolved, e fired on a new incident
    ), states
    assert batch[-1].incident_ids != batch[-3].incident_ids  # not the resolved one
    assert ("body a", 2) in batch_tables["payloads"]
    assert ("body z", 3) in batch_tables["payloads"]


def test_a_payload_whose_request_went_away_is_not_written(gc, monkeypatch):
    """A future cancelled before the writer takes its payload (the webhook's client left: no
    200 was sent, Alertmanager delivers it again) is skipped; the others are written."""
    commits, engine, batches = gc
    first = commits.submit(incidents.Payload([_alert("1", "5")], raw="one"))
    time.sleep(0.05)  # the writer is inside the first (slow) commit
    gone = commits.submit(incidents.Payload([_alert("2", "5")], raw="two"))
    kept = commits.submit(incidents.Payload([_alert("3", "5")], raw="three"))
    assert gone.cancel()
    assert first.result(5).new == 1 and kept.result(5).new == 1
    assert batches == [1, 1]
    with engine.connect() as conn:
        fps = set(conn.execute(select(alerts.c.fingerprint)).scalars())
    assert fps == {"1", "3"}


def test_the_writer_ends_when_idle_and_starts_again(gc, monkeypatch):
    from recovery import group_commit

    monkeypatch.setattr(group_commit, "LINGER_S", 0.05)
    commits, engine, batches = gc
    assert asyncio.run(commits.ingest([_alert("a", "1")], raw="a")).new == 1
    deadline = time.monotonic() + 5
    while commits._writer is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert commits._writer is None  # nothing queued: no thread left behind
    assert asyncio.run(commits.ingest([_alert("b", "1")], raw="b")).new == 1
    assert batches == [1, 1]


def test_the_webhook_answers_503_while_the_store_is_down(tmp_path, monkeypatch):
    """Alertmanager delivers a 5xx again; a 503 with Retry-After says the store, not the
    payload, failed (before: a 500 'internal error')."""
    from fastapi.testclient import TestClient
    from sqlalchemy.exc import OperationalError

    from recovery.app import create_app

    app = create_app(
        Settings(db_url=f"sqlite:///{tmp_path}/w.db", require_auth=False, slurm_enabled=False),
        start_worker=False,
    )

    def down(*_a, **_k):
        raise OperationalError("INSERT", {}, Exception("database is locked"))

    monkeypatch.setattr(incidents, "ingest_payloads", down)
    doc = {"version": "4", "groupKey": "{}:{}", "status": "firing", "receiver": "goodput",
           "alerts": [_alert("a1", "7")]}  # fmt: skip
    r = TestClient(app, raise_server_exceptions=False).post("/api/v1/alerts", json=doc)
    assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
