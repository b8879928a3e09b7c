"""The planner's bounded reads: `_history` reads only the job's executed restarts and the last
hour's drains (same counts as a full scan), the outbox indexes exist even on an older table, and
`config` reads the policy file again only when it changed."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
from sqlalchemy import Column, MetaData, String, Table, create_engine, event, inspect

from recovery import action_config, clock, outbox, planning, schema
from recovery.decide import Diagnosis, NodeView, Reason, blast_radius_violation
from recovery.policy import BlastRadius, Policy, PolicyError, parse_policy
from recovery.scheduler.base import JobState, NodeState
from recovery.store import make_engine

NOW = 1_800_000_000.0


@pytest.fixture
def engine(tmp_path):
    # the store's time: outbox.now(eng) == NOW
    return make_engine(f"sqlite:///{tmp_path / 'h.db'}", clock=clock.ManualClock(NOW))


def _add(engine, i, job, kind, state, age_s, nodes=(), cause="gpu_hardware_fault:xid79", body=None):
    body = body or json.dumps({"cause_key": cause, "action": {"kind": kind, "nodes": list(nodes)}})
    t = NOW - age_s
    with engine.begin() as conn:
        conn.execute(
            outbox.actions_table.insert().values(
                id=f"a{i}",
                incident_id=str(i),
                job_id=job,
                kind=kind,
                state=state,
                mode="act",
                body=body,
                created_at=t,
                updated_at=t,
                attempts=1,
            )
        )


def _full_scan(engine, diag):
    """The counts as the earlier full-table read made them (the oracle)."""
    restarts = same = 0
    drains = []
    with engine.connect() as conn:
        rows = conn.execute(outbox.actions_table.select()).all()
    for r in rows:
        if r.state not in ("executed", *outbox.OPEN_STATES):
            continue
        body = json.loads(r.body)
        if (
            r.state == "executed"
            and r.job_id == diag.job_id
            and r.kind in ("requeue", "drain_and_requeue")
        ):
            restarts += 1
            same += body.get("cause_key") == diag.cause_key
        if r.state != "waiting_scheduler":  # executed: when it ran; open: due now
            drains += [r.updated_at if r.state == "executed" else NOW] * len(
                body["action"].get("nodes", [])
            )
    recent = sum(1 for t in drains if t > NOW - 3600)
    return restarts, same, recent


def _history(engine, diag):
    cfg = SimpleNamespace()
    nodes = [NodeState(f"node{i}", "IDLE") for i in range(1, 5)]
    return planning._history(engine, cfg, diag, None, nodes)


DIAG = Diagnosis("99", "42", "gpu_hardware_fault", "xid79", ("node2",), 0.95)


def test_history_counts_match_a_full_scan(engine):
    day = 86400
    _add(engine, 1, "42", "requeue", "executed", 30 * day)  # old restart, same cause: counts
    _add(engine, 2, "42", "drain_and_requeue", "executed", 2 * day, ["node1"], cause="other:x")
    _add(engine, 3, "42", "requeue", "failed", 60)  # failed: not a restart
    _add(engine, 4, "43", "requeue", "executed", 60)  # another job
    _add(engine, 5, "43", "drain", "executed", 3599, ["node3"])  # in the hour
    _add(engine, 6, "44", "drain_and_requeue", "pending_approval", 10, ["node1", "node4"])
    _add(engine, 7, "45", "drain", "executed", 3601, ["node2"])  # just outside the hour
    _add(engine, 8, "46", "drain", "waiting_scheduler", 10, ["node2"])  # not planned yet
    _add(engine, 9, "47", "drain", "rejected", 10, ["node2"])  # never happened
    _add(engine, 10, "42", "stop", "executed", 10, ["node4"])  # a stop that drained
    h = _history(engine, DIAG)
    recent = sum(1 for t in h.drain_times if t > h.now - 3600)
    assert (h.restarts_done, h.same_cause_restarts, recent) == (2, 1, 4)
    assert (h.restarts_done, h.same_cause_restarts, recent) == _full_scan(engine, DIAG)
    assert h.now == NOW and len(h.nodes) == 4 and h.paused is False


def test_drains_count_by_when_they_ran_and_open_plans_whatever_their_age(engine):
    """An hour-old plan approved late or held up by a scheduler outage drains now: it counts,
    and so do the drains it ran minutes ago; a drain stamped by a receiver whose clock runs
    2 s ahead counts too."""
    _add(engine, 1, "42", "drain", "executed", 65 * 60, ["node1"])
    _add(engine, 2, "43", "drain", "executed", 65 * 60, ["node2"])
    with engine.begin() as conn:  # both ran 5 minutes ago
        t = outbox.actions_table.c
        conn.execute(
            outbox.actions_table.update().where(t.id.in_(["a1", "a2"])).values(updated_at=NOW - 300)
        )
    _add(engine, 3, "44", "drain", "approved", 62 * 60, ["node3"])  # planned an hour ago
    _add(engine, 4, "45", "drain", "executed", -2, ["node4"])  # another receiver's clock
    h = _history(engine, DIAG)
    assert sum(1 for t in h.drain_times if t > h.now - 3600) == 4
    assert set(h.reserved) == {"node3"}
    views = tuple(NodeView(f"node{i}", "IDLE", ("gpu",)) for i in range(1, 9))
    policy = Policy(blast_radius=BlastRadius(max_drains_per_hour=4))
    history = replace(h, nodes=views)
    assert blast_radius_violation(("node5",), history, policy)[0] == Reason.BLAST_DRAINS_PER_HOUR


def test_history_does_not_read_old_or_unrelated_rows(engine):
    # Undecodable bodies: the full scan would fail on them, a bounded read never sees them.
    _add(engine, 1, "42", "drain", "executed", 2 * 3600, ["node1"], body="{not json")
    _add(engine, 2, "43", "requeue", "executed", 2 * 3600, body="{not json")
    _add(engine, 3, "42", "requeue", "executed", 7200)
    h = _history(engine, DIAG)
    assert (h.restarts_done, h.same_cause_restarts, h.drain_times) == (1, 1, ())


def test_history_without_a_job_counts_no_restarts(engine):
    _add(engine, 1, "42", "requeue", "executed", 60)
    h = _history(engine, Diagnosis("98", None, "gpu_degradation", "ecc", ("node2",), 0.9))
    assert h.restarts_done == 0 and h.same_cause_restarts == 0


def test_a_diagnosis_replaced_while_the_planner_reads_slurm_is_planned_as_replaced(engine):
    """The planner reads the row, then waits on Slurm; meanwhile a newer diagnosis (another
    culprit) replaces the row's body. The planner's decision on the old one is not written:
    the newer one is planned (its enqueuer's call, or the reconciler's), and n2 drained."""
    policy = parse_policy({"mode": "act"}, env={})
    inc = {"id": 7, "opened_at": 0.0}
    first, newer = (
        {"outcome": "gpu_hardware_fault", "affected_nodes": [n], "confidence": 0.95, "job_id": "42"}
        for n in ("n1", "n2")
    )
    with engine.begin() as conn:
        aid = outbox.enqueue(conn, inc, first)

    class Slurm:
        replaced = False

        def job_state(self, job_id):
            if not self.replaced:
                self.replaced = True
                with engine.begin() as conn:
                    assert outbox.enqueue(conn, inc, newer) == aid
            return JobState(job_id, "x", "RUNNING", ("n1", "n2", "n3"), partition="p")

        def node_states(self):
            return [NodeState(f"n{i}", "IDLE", "", ("p",)) for i in range(10)]

    cfg = SimpleNamespace(scheduler=Slurm(), policy=policy)
    assert planning.plan_row(engine, cfg, aid)[:2] == ("planning", None)
    state, action, row = planning.plan_row(engine, cfg, aid)
    assert state == "ready" and action is not None and action.nodes == ("n2",)
    assert json.loads(row.body)["action"]["nodes"] == ["n2"]


def test_upgrade_adds_the_indexes_to_an_existing_outbox(tmp_path):
    eng = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    old = MetaData()
    Table("goodput_actions", old, *(Column(c.name, c.type) for c in outbox.actions_table.c))
    Table("unrelated", old, Column("x", String(4)))
    old.create_all(eng)
    assert inspect(eng).get_indexes("goodput_actions") == []
    schema.upgrade(eng)
    names = {ix["name"] for ix in inspect(eng).get_indexes("goodput_actions")}
    assert names == {ix.name for ix in outbox.actions_table.indexes} and len(names) == 4


# ---- the policy file cache ---------------------------------------------------------------------
def _settings(path, **extra):
    return SimpleNamespace(policy_file=str(path), scheduler_adapter=object(), extra=extra)


def _write(path, text, bump):
    path.write_text(text)
    st = path.stat()  # a distinct mtime even on a coarse clock
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))


def test_config_reads_the_policy_file_again_only_when_it_changed(tmp_path, monkeypatch):
    reads = []
    load = action_config.load_policy
    monkeypatch.setattr(
        action_config, "load_policy", lambda p, env: reads.append(p) or load(p, env)
    )
    monkeypatch.delenv("GOODPUT_MODE", raising=False)
    f = tmp_path / "policy.yaml"
    _write(f, "mode: monitor\n", 1)
    assert action_config.config(_settings(f)).policy.mode == "monitor"
    assert action_config.config(_settings(f)).policy.mode == "monitor"
    assert len(reads) == 1  # unchanged: not read again

    _write(f, "mode: act\n", 2)  # the operator edits it: the next incident sees the edit
    assert action_config.config(_settings(f)).policy.mode == "act"
    assert len(reads) == 2

    assert action_config.config(_settings(f, GOODPUT_MODE="approve")).policy.mode == "approve"
    assert len(reads) == 3  # GOODPUT_MODE is part of the policy in force

    _write(f, "mode: sometimes\n", 3)  # an invalid edit is an error, not the old policy
    for _ in range(2):
        with pytest.raises(PolicyError, match="mode"):
            action_config.config(_settings(f))
    _write(f, "mode: approve\n", 4)
    assert action_config.config(_settings(f)).policy.mode == "approve"


def test_config_names_a_missing_policy_file(tmp_path):
    with pytest.raises(PolicyError, match="cannot read policy file"):
        action_config.config(_settings(tmp_path / "gone.yaml"))


def test_action_counts_by_kind_and_state_are_counted_by_the_database(engine):
    rows = [("requeue", "executed")] * 3 + [("drain_and_requeue", "failed"), ("stop", "ready")]
    for i, (kind, state) in enumerate(rows):
        _add(engine, i, str(40 + i), kind, state, 60)
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    assert outbox.counts(engine) == {
        ("requeue", "executed"): 3,
        ("drain_and_requeue", "failed"): 1,
        ("stop", "ready"): 1,
    }
    assert len(seen) == 1 and "GROUP BY" in seen[0]  # one row per (kind, state), not per action
