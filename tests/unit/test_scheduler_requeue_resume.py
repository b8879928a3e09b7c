"""A requeue that died mid-way (job requeue-held, exclusion maybe not set) is recognised from
Slurm's structured fields, on the real 22.05 output kept in tests/fixtures/slurm/, and the
resume completes it: exclusion set, job released, not requeued a second time."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from recovery.scheduler import SchedulerUnavailable
from recovery.scheduler.base import NotConfirmed
from recovery.scheduler.slurm import SlurmScheduler, held

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
HELD_22_05 = json.loads((FIXTURES / "squeue-22.05-requeue-held.json").read_text())


SINFO = "".join(f"node{i}|idle|gpu*|none\n" for i in range(1, 9))


class FakeSlurm:
    """squeue answers from a document that the scontrol calls edit like Slurm does."""

    def __init__(self, doc):
        self.doc, self.calls = doc, []

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        job = self.doc["jobs"][0]
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, json.dumps(self.doc), "")
        if argv[0] == "sinfo":  # the nodes Slurm knows (an exclusion must name them)
            return subprocess.CompletedProcess(argv, 0, SINFO, "")
        if argv[:2] == ["scontrol", "update"]:
            for a in argv[3:]:
                if a.startswith("ExcNodeList="):
                    job["excluded_nodes"] = a.split("=", 1)[1]
        elif argv[:2] == ["scontrol", "release"]:
            job.update(priority=1, state_reason="None", state_description="")
        elif argv[:2] == ["scontrol", "requeuehold"]:
            job["restart_cnt"] += 1
        return subprocess.CompletedProcess(argv, 0, "", "")


def _sched(monkeypatch, doc):
    fake = FakeSlurm(doc)
    monkeypatch.setattr(subprocess, "run", fake)
    s = SlurmScheduler(retries=0)
    s.verify_timeout_s, s.verify_interval_s = 1.0, 0.01
    return s, fake


def test_the_real_22_05_requeue_held_job_reads_as_held_pending_restarted():
    job = HELD_22_05["jobs"][0]
    assert job["state_reason"] == "JobHeldUser" and "requeue" not in job["state_reason"].lower()
    assert held(job)


def test_resume_of_a_requeue_that_died_held_sets_the_exclusion_and_releases(monkeypatch):
    doc = json.loads(json.dumps(HELD_22_05))
    s, fake = _sched(monkeypatch, doc)
    job_id = str(doc["jobs"][0]["job_id"])
    before = s.job_state(job_id)
    assert before.held and before.state == "PENDING" and before.restarts == 1
    r = s.requeue(job_id, ("node1",), expected_restarts=0)
    assert r.changed and "released" in r.detail
    argvs = [c[:2] for c in fake.calls]
    assert ["scontrol", "requeuehold"] not in argvs and ["scontrol", "requeue"] not in argvs
    assert ["scontrol", "release"] in argvs
    after = s.job_state(job_id)
    assert not after.held and after.excluded == ("node1",) and after.restarts == 1


@pytest.mark.parametrize(
    "change",
    [
        {"restart_cnt": 2},  # requeued again since (by Slurm or a person): not ours to finish
        {"priority": 4294901759, "state_reason": "None"},  # not held: it runs or will run
    ],
)
def test_a_job_requeued_by_someone_else_is_left_alone(monkeypatch, change):
    doc = json.loads(json.dumps(HELD_22_05))
    doc["jobs"][0].update(change)
    s, fake = _sched(monkeypatch, doc)
    r = s.requeue(str(doc["jobs"][0]["job_id"]), ("node1",), expected_restarts=0)
    assert not r.changed and "already requeued" in r.detail
    assert all(c[0] != "scontrol" for c in fake.calls)  # read only


@pytest.mark.parametrize(
    "fields",
    [
        {"priority": 0},
        {"priority": {"set": True, "infinite": False, "number": 0}},  # 23.02+
        {"hold": True, "priority": {"set": True, "number": 1}},  # 23.02+
        {"job_state": ["PENDING", "REQUEUE_HOLD"], "priority": {"set": True, "number": 1}},
        {"state_reason": "JobHeldAdmin", "priority": 5},
    ],
)
def test_held_is_read_from_structured_fields_of_every_version(fields):
    assert held({"job_state": "PENDING", "priority": 1, "state_reason": "None", **fields})
    assert not held({"job_state": "PENDING", "priority": 1, "state_reason": "Resources"})


def test_a_pending_job_is_not_requeued_its_exclusion_is_set(monkeypatch):
    """A job that never ran (or whose start a restarted slurmctld forgot): `scontrol requeue`
    refuses a pending job, so the exclusion is set on it; it is never held, so never left so."""
    doc = json.loads(json.dumps(HELD_22_05))
    doc["jobs"][0].update(restart_cnt=0, priority=1, state_reason="Priority")
    s, fake = _sched(monkeypatch, doc)
    job_id = str(doc["jobs"][0]["job_id"])
    r = s.requeue(job_id, ("node1",), expected_restarts=0)
    assert r.changed and "pending" in r.detail
    argvs = [c[:2] for c in fake.calls if c[0] == "scontrol"]
    assert argvs == [["scontrol", "update"]]
    after = s.job_state(job_id)
    assert after.excluded == ("node1",) and not after.held and after.restarts == 0
    assert r.restarts == 0  # what `controller_restart` compares with: no restart counted


def test_the_controller_start_is_read_from_the_real_22_05_config(monkeypatch):
    text = (FIXTURES / "scontrol-22.05-show-config-head.txt").read_text()
    answers = iter([text, text.replace("BOOT_TIME", "BOOT_TIMES")])

    def run(argv, **kw):
        assert argv == ["scontrol", "show", "config"]
        return subprocess.CompletedProcess(argv, 0, next(answers), "")

    monkeypatch.setattr(subprocess, "run", run)
    s = SlurmScheduler(retries=0)
    assert s.controller_started() == "2026-12-07T13:09:47"  # as printed: compared, not converted
    assert s.controller_started() is None  # no such line: the adapter cannot say


def test_squeue_answering_without_its_controller_is_an_outage_not_a_forgotten_job(monkeypatch):
    """Slurm 22.05's squeue --json exits 0 with no jobs and an error while slurmctld is down;
    the accounting it would fall back to still said PENDING for a running job."""
    down = (FIXTURES / "squeue-22.05-controller-down.json").read_text()
    calls = []

    def run(argv, **kw):
        calls.append(argv[0])
        return subprocess.CompletedProcess(argv, 0, down, "")

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(SchedulerUnavailable, match="slurm_load_jobs"):
        SlurmScheduler(retries=0, json_filters=True).job_state("136")
    assert calls == ["squeue"]  # not sacct


def test_a_requeue_slow_to_complete_is_tried_again_not_failed(monkeypatch):
    """requeuehold on a job whose processes are slow to die (a stuck CUDA process, a long
    epilog): not confirmed in time is NotConfirmed (the action is retried soon), and the retry
    waits while the job still completes, then sets the exclusion and releases it. Before, a
    plain SchedulerError failed the action for good and left the job held."""
    doc = json.loads(json.dumps(HELD_22_05))
    job = doc["jobs"][0]
    job.update(job_state="RUNNING", restart_cnt=0, priority=1, state_reason="None")
    s, fake = _sched(monkeypatch, doc)
    job_id = str(job["job_id"])

    def completing(argv, **kw):
        out = FakeSlurm.__call__(fake, argv, **kw)
        if argv[:2] == ["scontrol", "requeuehold"]:
            job.update(job_state="COMPLETING", priority=0, state_reason="JobHeldUser")
        return out

    monkeypatch.setattr(subprocess, "run", completing)
    with pytest.raises(NotConfirmed):
        s.requeue(job_id, ("node1",), expected_restarts=0)
    with pytest.raises(NotConfirmed, match="COMPLETING"):  # the retry, still completing
        s.requeue(job_id, ("node1",), expected_restarts=0)
    job["job_state"] = "PENDING"  # done completing: held, pending, one restart on
    r = s.requeue(job_id, ("node1",), expected_restarts=0)
    assert r.changed and "released" in r.detail
    after = s.job_state(job_id)
    assert not after.held and after.excluded == ("node1",) and after.restarts == 1
    assert [c[:2] for c in fake.calls].count(["scontrol", "requeuehold"]) == 1


@pytest.mark.parametrize(
    "lost", [("timeout", ""), (1, "slurm_receive_msg: Socket timed out on send/recv operation")]
)
def test_a_requeue_whose_answer_was_lost_is_not_sent_twice(monkeypatch, lost):
    """slurmctld applied the requeuehold but its answer never came back (a timeout, a socket
    timeout): sent again, Slurm refuses it (the job no longer runs), which failed the action
    for good with the job left held. Now it is not retried in place: the
    action's retry reads the restart count that moved by one and finishes it."""
    doc = json.loads(json.dumps(HELD_22_05))
    job = doc["jobs"][0]
    job.update(job_state="RUNNING", restart_cnt=0, priority=1, state_reason="None")
    fake = FakeSlurm(doc)
    rc, err = lost

    def applied_then_lost(argv, **kw):
        out = fake(argv, **kw)
        if argv[:2] != ["scontrol", "requeuehold"]:
            return out
        job.update(job_state="PENDING", priority=0, state_reason="JobHeldUser")
        if rc == "timeout":
            raise subprocess.TimeoutExpired(argv, kw["timeout"])
        return subprocess.CompletedProcess(argv, rc, "", err)

    monkeypatch.setattr(subprocess, "run", applied_then_lost)
    s = SlurmScheduler(retries=3, backoff_s=0.0)
    s.verify_timeout_s, s.verify_interval_s = 1.0, 0.01
    job_id = str(job["job_id"])
    with pytest.raises(SchedulerUnavailable):
        s.requeue(job_id, ("node1",), expected_restarts=0)
    assert [c[:2] for c in fake.calls].count(["scontrol", "requeuehold"]) == 1
    r = s.requeue(job_id, ("node1",), expected_restarts=0)  # the action's retry
    assert r.changed and "released" in r.detail
    after = s.job_state(job_id)
    assert not after.held and after.excluded == ("node1",) and after.restarts == 1
    assert [c[:2] for c in fake.calls].count(["scontrol", "requeuehold"]) == 1


def test_a_requeue_that_never_reached_the_controller_is_retried_in_place(monkeypatch):
    r = [(1, "", "Unable to contact slurm controller (connect failure)"), (0, "", "")]
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        rc, out, err = r.pop(0)
        return subprocess.CompletedProcess(argv, rc, out, err)

    monkeypatch.setattr(subprocess, "run", run)
    assert SlurmScheduler(backoff_s=0.0)._run(["scontrol", "requeue", "17"], once=True) == ""
    assert len(calls) == 2


def _running(**fields):
    doc = json.loads(json.dumps(HELD_22_05))
    job = doc["jobs"][0]
    job.update({"job_state": "RUNNING", "restart_cnt": 0, "priority": 1, "state_reason": "None"})
    job.update(fields)
    return doc, job


def test_an_admins_hold_after_a_finished_requeue_is_left_to_the_admin(monkeypatch):
    """Seen on Slurm 22.05: Goodput's requeuehold reads JobHeldUser ('job requeued in held
    state', even as root), an admin's `scontrol hold` JobHeldAdmin. The action's retry found
    the job held, pending, one restart on, and released the admin's hold."""
    doc = json.loads(json.dumps(HELD_22_05))
    doc["jobs"][0].update(state_reason="JobHeldAdmin", state_description="")
    s, fake = _sched(monkeypatch, doc)
    r = s.requeue(str(doc["jobs"][0]["job_id"]), ("node1",), expected_restarts=0)
    assert not r.changed and "already requeued" in r.detail
    assert all(c[0] != "scontrol" for c in fake.calls)


@pytest.mark.parametrize(
    ("fields", "exclude", "why"),
    [
        ({}, ("gpu01.cluster.local",), "unknown to the scheduler"),  # a host label, not Slurm's
        ({"required_nodes": "node1"}, ("node1",), "requires"),  # --nodelist: never to start
        ({"job_state": "COMPLETED", "exit_code": 0}, ("node1",), "completed"),
    ],
)
def test_a_requeue_that_could_not_end_well_is_refused_before_anything_runs(
    monkeypatch, fields, exclude, why
):
    """On Slurm 22.05: an unknown name in ExcNodeList ('Invalid node name specified') after
    the requeuehold left the job held for good; excluding a node the job requires left it
    pending with BadConstraints, reported as done; a completed job was run again."""
    from recovery.scheduler.base import GuardRefused

    doc, job = _running(**fields)
    s, fake = _sched(monkeypatch, doc)
    with pytest.raises(GuardRefused, match=why):
        s.requeue(str(job["job_id"]), exclude, expected_restarts=0)
    assert all(c[0] != "scontrol" for c in fake.calls)


def test_an_exclusion_slurm_refuses_after_the_hold_releases_the_job(monkeypatch):
    """Whatever makes `scontrol update ExcNodeList=` fail for good after the requeuehold, the
    job is released (it runs again, without the exclusion) rather than left held."""
    from recovery.scheduler.base import SchedulerError

    doc, job = _running()
    s, fake = _sched(monkeypatch, doc)

    def refusing(argv, **kw):
        if argv[:2] == ["scontrol", "update"]:
            fake.calls.append(argv)
            return subprocess.CompletedProcess(argv, 1, "", "Invalid node name specified")
        out = fake(argv, **kw)
        if argv[:2] == ["scontrol", "requeuehold"]:
            job.update(job_state="PENDING", priority=0, state_reason="JobHeldUser")
        return out

    monkeypatch.setattr(subprocess, "run", refusing)
    with pytest.raises(SchedulerError, match="Invalid node name"):
        s.requeue(str(job["job_id"]), ("node1",), expected_restarts=0)
    assert [c[:2] for c in fake.calls if c[0] == "scontrol"][-1] == ["scontrol", "release"]
    assert not s.job_state(str(job["job_id"])).held
