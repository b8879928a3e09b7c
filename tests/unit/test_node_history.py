"""Node history from the receiver's own store: which diagnoses count against a node, the
repeat-offender rules they break, MTBI, and the bounded per-node metrics."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from recovery import node_checks, node_health, node_history, schema, store
from recovery.policy import load_policy

NOW = 1_000_000.0
POLICY = load_policy(env={})


def _diagnose(engine, at, outcome, nodes, gpu=None, xid=None):
    with engine.begin() as conn:
        iid = conn.execute(
            store.incidents.insert().values(state="resolved", opened_at=at, updated_at=at)
        ).inserted_primary_key[0]
        body = {
            "outcome": outcome,
            "affected_nodes": nodes,
            "affected_gpus": [{"node": nodes[0], "gpu": gpu}] if gpu else [],
            "symptoms": [{"id": "xid_fatal", "detail": f"NVRM: Xid (PCI:0000:9b:00): {xid}, pid=1"}]
            if xid
            else [],
            "onset": at,
        }
        # an earlier, superseded diagnosis of the same incident does not count twice
        conn.execute(
            store.diagnoses.insert().values(
                incident_id=iid, created_at=at - 1, outcome="unknown", body=store.dumps(body)
            )
        )
        conn.execute(store.diagnoses.insert().values(
            incident_id=iid, created_at=at, outcome=outcome, body=store.dumps(body)))  # fmt: skip


def _engine(tmp_path):
    engine = store.make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    schema.upgrade(engine)
    return engine


def test_infrastructure_and_unknown_count_against_the_node_workload_bugs_do_not(tmp_path):
    engine = _engine(tmp_path)
    _diagnose(engine, NOW - 100, "gpu_hardware_fault", ["node2"], gpu="3")
    _diagnose(engine, NOW - 90, "unknown", ["node2", "node3"])
    _diagnose(engine, NOW - 80, "workload_oom", ["node2"])
    _diagnose(engine, NOW - 70, "healthy", ["node2"])
    evs = node_history.events(engine, NOW - 1000)
    assert [e.kind for e in evs["node2"]] == ["incident", "incident"]
    assert evs["node2"][0].gpu == "3" and [e.at for e in evs["node3"]] == [NOW - 90]


def test_the_xid_of_a_symptom_is_read_and_twice_on_one_gpu_escalates(tmp_path):
    engine = _engine(tmp_path)
    _diagnose(engine, NOW - 7200, "gpu_hardware_fault", ["node1"], gpu="5", xid=48)
    _diagnose(engine, NOW - 600, "gpu_hardware_fault", ["node1"], gpu="5", xid=48)
    [row] = node_history.summary(engine, POLICY, now=NOW)
    assert row["node"] == "node1" and row["incidents_7d"] == 2 and row["mtbi_s"] == 6600
    assert [e["rule"] for e in row["escalations"]] == ["same-xid-same-gpu"]
    assert row["escalations"][0]["why"] == "XID 48 2 times on GPU 5"


def test_five_in_a_week_and_the_metrics_are_one_series_per_node(tmp_path):
    engine = _engine(tmp_path)
    NOW = time.time()  # the collector reads the clock
    for i in range(5):
        _diagnose(engine, NOW - i * 86400 - 10, "network_fault", ["node4"])
    _diagnose(engine, NOW - 8 * 86400, "network_fault", ["node4"])  # older than a week
    with engine.begin() as conn:
        conn.execute(node_checks.checks.insert().values(
            node="node4", drain_reason="goodput: x", level="quick", state="failed", mode="act",
            started_at=NOW - 50))  # fmt: skip
    [row] = node_history.summary(engine, POLICY, now=NOW)
    assert row["incidents_7d"] == 5 and row["last_check"] == "failed"
    assert [e["then"] for e in row["escalations"]] == ["hold_for_person"]
    reg = CollectorRegistry()
    reg.register(node_history.NodeHistoryCollector(engine, POLICY))
    text = generate_latest(reg).decode()
    assert 'goodput_node_incidents_7d{node="node4"}' in text
    assert (
        'goodput_node_escalation{node="node4",rule="five-in-a-week",then="hold_for_person"} 1.0'
        in text
    )


def test_the_nodes_command_shows_history_and_checks(tmp_path):
    from typer.testing import CliRunner

    from goodput.commands.nodes import app

    engine = _engine(tmp_path)
    now = time.time()
    _diagnose(engine, now - 7200, "gpu_hardware_fault", ["node1"], gpu="5", xid=48)
    _diagnose(engine, now - 600, "gpu_hardware_fault", ["node1"], gpu="5", xid=48)
    with engine.begin() as conn:
        row = dict(node="node1", drain_reason="goodput: x", level="deep", state="failed",
                   mode="act", started_at=now - 60, exit_code=1, output="diag: FAIL",
                   step="goodput: failed deep")  # fmt: skip
        conn.execute(node_checks.checks.insert().values(**row))
    db = ["--db", f"sqlite:///{tmp_path / 'r.db'}"]
    out = CliRunner().invoke(app, ["history", *db])
    assert out.exit_code == 0, out.output
    assert "node1" in out.output and "same-xid-same-gpu -> deep_check" in out.output
    assert "1.8 h" in out.output and "last check failed" in out.output  # MTBI
    out = CliRunner().invoke(app, ["checks", "node1", *db])
    assert "goodput: failed deep" in out.output and "diag: FAIL" in out.output
    _diagnose(engine, now - 480, "gpu_hardware_fault", ["node1"], gpu="5", xid=48)
    with engine.begin() as conn:  # the third failure: the verdict is RMA, not "failed"
        conn.execute(node_checks.checks.insert().values(**{**row, "state": "rma"}))
        conn.execute(node_checks.checks.insert().values(**{**row, "state": "running"}))
    out = CliRunner().invoke(app, ["history", *db])
    assert "last check rma" in out.output and "MTBI   56 min" in out.output


def test_a_rule_window_longer_than_a_week_sees_its_whole_window(tmp_path):
    # repeat-offender windows are policy data up to a year; the summary read one week only, so
    # "3 incidents in 30 days" never held for incidents spread over a month
    rule = node_health.OffenderRule(
        name="three-in-a-month", incidents=3, window_s=30 * 86400, then="hold_for_person"
    )
    rts = POLICY.return_to_service.model_copy(update={"repeat_offenders": (rule,)})
    policy = POLICY.model_copy(update={"return_to_service": rts})
    engine = _engine(tmp_path)
    for days in (20, 10, 1):
        _diagnose(engine, NOW - days * 86400, "gpu_hardware_fault", ["node4"], gpu="1")
    [row] = node_history.summary(engine, policy, now=NOW)
    assert [e["rule"] for e in row["escalations"]] == ["three-in-a-month"]
    assert row["incidents_7d"] == 1  # the weekly count stays a week


def _failed(engine, at, outcome, user, job_nodes, conf, nodes=()):
    with engine.begin() as conn:
        iid = conn.execute(
            store.incidents.insert().values(state="resolved", opened_at=at, updated_at=at)
        ).inserted_primary_key[0]
        body = {
            "outcome": outcome,
            "affected_nodes": list(nodes),
            "job_user": user,
            "job_nodes": job_nodes,
            "confidence": conf,
            "onset": at,
        }
        conn.execute(store.diagnoses.insert().values(
            incident_id=iid, created_at=at, outcome=outcome, body=store.dumps(body)))  # fmt: skip


def test_jobs_of_several_users_failing_on_a_node_make_it_suspect_though_each_was_unsure(tmp_path):
    """Three users' jobs fail on node3 (with other nodes each time); no diagnosis was sure
    enough to blame a node. Together they break the several-users rule for node3 only; a sure
    verdict that a job's own bug killed it (a fourth user's OOM) does not count."""
    engine = _engine(tmp_path)
    _failed(engine, NOW - 3000, "unknown", "ana", ["node1", "node3"], 0.3)
    _failed(engine, NOW - 2000, "workload_crash", "bo", ["node3", "node4"], 0.4)
    _failed(engine, NOW - 1000, "workload_hang", "cy", ["node2", "node3"], 0.5)
    _failed(engine, NOW - 900, "workload_oom", "dee", ["node1"], 0.95)
    rows = {r["node"]: r for r in node_history.summary(engine, POLICY, now=NOW)}
    assert [e["rule"] for e in rows["node3"]["escalations"]] == ["several-users"]
    assert "ana, bo, cy" in rows["node3"]["escalations"][0]["why"]
    assert rows["node3"]["incidents_7d"] == 0  # suspected, not blamed
    assert all(not rows[n]["escalations"] for n in ("node1", "node2", "node4"))
    evs = node_history.events(engine, NOW - 10_000)
    assert [e.user for e in evs["node1"]] == ["ana"]  # dee's sure OOM is the job's own


def test_a_sure_verdict_blames_its_node_alone_an_unsure_one_every_node_of_the_job(tmp_path):
    engine = _engine(tmp_path)
    _failed(engine, NOW - 200, "gpu_hardware_fault", "ana", ["node2", "node3"], 0.9, ["node2"])
    _failed(engine, NOW - 100, "network_fault", "bo", ["node2", "node4"], 0.5, ["node2"])
    evs = node_history.events(engine, NOW - 1000)
    assert [(e.kind, e.user) for e in evs["node2"]] == [("incident", "ana"), ("incident", "bo")]
    assert "node3" not in evs  # ana's job: node2 was to blame, surely
    assert [(e.kind, e.user) for e in evs["node4"]] == [("job_failed", "bo")]
