"""After Goodput requeued a job without its culprit node, the job's new run is a new run: an
alert about it opens a new incident, and the incident the action was planned on keeps its
verdict (it is not diagnosed again on evidence from the new run, where the job runs on other
nodes). The production receiver, on a simulated clock and scheduler."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from recovery import incidents, outbox, worker
from recovery.app import create_app
from recovery.clock import ManualClock
from recovery.evidence import Bundle, Report, Series, SlurmFacts
from tests.unit.actions_fakes import make_fake_sim
from tests.unit.test_receiver_clock import T, acting_settings

pytestmark = pytest.mark.filterwarnings("ignore")


def _alert(fp: str, node: str, starts: str, **labels: str) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {"alertname": "GoodputGPUFatalXid", "node": node, "gpu": "0", **labels},
        "startsAt": starts,
        "fingerprint": fp,
    }


class Sources:
    """Slurm's facts from the fake simulator's state; Prometheus' DCGM XID series from the XIDs
    the test raised (`xids`: (time, node, code)), over the incident's window."""

    def __init__(self, st: dict[str, Any]) -> None:
        self.st, self.xids, self.windows = st, [], []

    def jobs_on_node(self, node: str) -> list[str]:
        return [j for j, job in self.st["jobs"].items() if node in job["nodes"]]

    def slurm(self, ctx, settings) -> Bundle:
        job = self.st["jobs"].get(ctx.job_id or "")
        facts = SlurmFacts(query="fake simulator")
        if job is not None:
            facts.job = {k: job[k] for k in ("job_id", "state", "restarts", "nodes")}
        names = set(ctx.nodes) | set(facts.job.get("nodes") or [])
        facts.nodes = {n: dict(self.st["nodes"][n]) for n in sorted(names)}
        return Bundle(slurm=facts, reports=[Report("slurm", "ok")])

    def prometheus(self, ctx, settings) -> Bundle:
        self.windows.append((ctx.start, ctx.end))
        series = [
            Series("DCGM_FI_DEV_XID_ERRORS", [(t - 1, 0.0), (t, float(code))], node, "0", "42")
            for t, node, code in self.xids
            if node in ctx.nodes and ctx.start <= t <= ctx.end
        ]
        return Bundle(series=series, reports=[Report("prometheus", "ok" if series else "empty")])


@pytest.fixture
def receiver(tmp_path):
    sim, st, submit = make_fake_sim()
    submit("42", node="node2")
    st["jobs"]["42"]["start_time"] = T - 3600  # running for an hour before the fault
    sources = Sources(st)
    clock = ManualClock(T)
    settings = acting_settings(tmp_path, clock, sim, slurm_enabled=True, sources=sources)
    app = create_app(settings, start_worker=False)
    client = TestClient(app)

    def post(*alerts: dict[str, Any]) -> None:
        for a in alerts:
            if a["labels"].get("job_id") and a["labels"].get(
                "node"
            ):  # the XID the alert is about, seen by Prometheus
                sources.xids.append((clock.t - 5, a["labels"]["node"], 79))
        body = {"version": "4", "status": "firing", "alerts": list(alerts)}
        assert client.post("/api/v1/alerts", json=body).status_code == 200

    def diagnose() -> list[int]:
        clock.t += settings.settle_s
        return worker.run_once(app.state.engine, settings)

    return app.state.engine, st, post, diagnose, clock, sources


def test_an_alert_after_the_requeue_opens_a_new_incident(receiver):
    engine, st, post, diagnose, clock, sources = receiver
    post(_alert("a1", "node2", "2020-09-13T12:26:40Z", job_id="42"))
    assert diagnose() == [1]
    assert st["jobs"]["42"]["restarts"] == 1  # drained node2, requeued without it
    new_node = st["jobs"]["42"]["nodes"][0]
    assert new_node != "node2"
    before = incidents.latest_diagnosis(engine, 1)
    assert before["affected_nodes"] == ["node2"]

    restarted = outbox.incident_action(engine, "1")["updated_at"]
    clock.t += 60
    post(_alert("a2", new_node, "2020-09-13T12:27:50Z", job_id="42"))  # the job's new run
    assert diagnose() == [2]  # a new incident is diagnosed; the old one is not again
    assert sources.windows[-1][0] == restarted  # on the new run's evidence only
    assert incidents.latest_diagnosis(engine, 1) == before
    assert incidents.incident(engine, 2)["job_id"] == "42"
    # the new run's fault has a verdict and an action of its own (it had neither: the old
    # incident took it, blamed node2 and the new node together, and was not planned again)
    assert incidents.latest_diagnosis(engine, 2)["affected_nodes"] == [new_node]
    assert outbox.incident_action(engine, "2")["body"]["action"]["nodes"] == [new_node]


def test_a_late_alert_about_the_culprit_node_does_not_reopen_the_job_incident(receiver):
    engine, st, post, diagnose, clock, _ = receiver
    post(_alert("a1", "node2", "2020-09-13T12:26:40Z", job_id="42"))
    assert diagnose() == [1]
    before = incidents.latest_diagnosis(engine, 1)

    clock.t += 60
    post(_alert("b1", "node2", "2020-09-13T12:27:50Z"))  # a node alert, no job: node2 is drained
    assert diagnose() == [2]
    assert incidents.incident(engine, 2)["job_id"] is None
    assert incidents.incident(engine, 2)["node"] == "node2"
    assert incidents.latest_diagnosis(engine, 1) == before


def test_a_job_alert_on_the_node_the_restart_excluded_joins_the_ended_run(receiver):
    """A detector's alert fires after its `for`, so one about the ended run can start after the
    restart; on a node the restart took the job off, it cannot be the new run's."""
    engine, st, post, diagnose, clock, _ = receiver
    post(_alert("a1", "node2", "2020-09-13T12:26:40Z", job_id="42"))
    assert diagnose() == [1]
    before = incidents.latest_diagnosis(engine, 1)

    clock.t += 60
    post(
        _alert("c1", "node2", "2020-09-13T12:27:50Z", job_id="42", alertname="GoodputJobStraggler")
    )
    assert diagnose() == []  # linked to incident 1, which is not diagnosed again
    assert len(incidents.incident(engine, 1)["alerts"]) == 2
    assert incidents.latest_diagnosis(engine, 1) == before
    assert incidents.incident(engine, 2) is None


def test_a_late_alert_that_started_before_the_restart_joins_without_a_new_diagnosis(receiver):
    engine, st, post, diagnose, clock, _ = receiver
    post(_alert("a1", "node2", "2020-09-13T12:26:40Z", job_id="42"))
    assert diagnose() == [1]
    new_node = st["jobs"]["42"]["nodes"][0]

    clock.t += 60  # delivered late, but it started before the restart: the ended run's
    post(_alert("d1", new_node, "2020-09-13T12:26:41Z", job_id="42"))
    assert diagnose() == []
    assert len(incidents.incident(engine, 1)["alerts"]) == 2
    assert incidents.incident(engine, 2) is None


def test_a_job_level_alert_soon_after_the_restart_is_the_new_run_settling(receiver):
    """A job-level detector alert (no `node`) that starts within restart_grace_s (120 s) of the
    restart is the detector relearning the new run (new nodes, slow first iterations): it joins
    the ended run's incident undiagnosed. Failed before: it opened an `unknown` incident that
    paged on-call (the fault benchmark's node-lost runs, 3 of 3). Later, it is a new fault."""
    engine, st, post, diagnose, clock, _ = receiver
    post(_alert("a1", "node2", "2020-09-13T12:26:40Z", job_id="42"))
    assert diagnose() == [1]
    anomaly = {"alertname": "GoodputJobAnomaly", "job_id": "42"}

    clock.t += 60
    post({**_alert("e1", "", "2020-09-13T12:27:50Z"), "labels": anomaly})
    assert diagnose() == []
    assert len(incidents.incident(engine, 1)["alerts"]) == 2
    assert incidents.incident(engine, 2) is None

    clock.t += 300
    post({**_alert("e2", "", "2020-09-13T12:33:00Z"), "labels": anomaly})
    assert diagnose() == [2]
    assert incidents.incident(engine, 2)["job_id"] == "42"


def test_a_job_alert_on_the_excluded_node_long_after_the_restart_is_a_new_fault(receiver):
    """The excluded node's case is the ended run's alert firing after its `for`: one that
    starts later than restart_grace_s after the restart (the job back on the node a week on)
    is a new fault. Failed before: it joined incident 1, undiagnosed, nothing done."""
    engine, st, post, diagnose, clock, _ = receiver
    post(_alert("a1", "node2", "2020-09-13T12:26:40Z", job_id="42"))
    assert diagnose() == [1]  # a1 never resolves

    clock.t += 7 * 86400
    st["jobs"]["42"]["nodes"] = ["node2"]  # exclusion dropped: the job runs on node2 again
    post(_alert("f1", "node2", "2020-09-20T12:26:40Z", job_id="42", alertname="GoodputJobHang"))
    assert diagnose() == [2]
    assert len(incidents.incident(engine, 1)["alerts"]) == 1
    assert incidents.incident(engine, 2)["job_id"] == "42"


def test_a_job_alert_on_the_excluded_node_slurm_places_the_job_on_is_the_new_runs(receiver):
    """Within the grace, but Slurm (asked for a node alert of the same payload) runs the job
    on the node again: the alert is the new run's. Failed before: it joined incident 1."""
    engine, st, post, diagnose, clock, _ = receiver
    post(_alert("a1", "node2", "2020-09-13T12:26:40Z", job_id="42"))
    assert diagnose() == [1]

    clock.t += 60
    st["jobs"]["42"]["nodes"] = ["node2"]  # a person requeued it onto node2
    post(
        _alert("b2", "node2", "2020-09-13T12:27:50Z", alertname="GoodputNodeHot"),
        _alert("c2", "node2", "2020-09-13T12:27:50Z", job_id="42", alertname="GoodputJobHang"),
    )
    assert diagnose() == [2]
    assert len(incidents.incident(engine, 1)["alerts"]) == 1
    assert len(incidents.incident(engine, 2)["alerts"]) == 2
