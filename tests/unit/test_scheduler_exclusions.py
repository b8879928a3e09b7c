"""A requeue sets the job's exclusion list to exactly the planned one (issue 20): its current
exclusions less the earlier Goodput ones the plan dropped (`cap_exclusions`), plus the plan's;
written only where that differs from the current list. Before, a requeue with nothing to
exclude was a plain `scontrol requeue`, so Slurm kept a stale `ExcNodeList` (the job may stay
unrunnable), and a set list replaced a person's own `--exclude`. The Slurm adapter's argv is
checked against a fake that edits a real 22.05 `squeue --json` document as Slurm does; the
simulator adapter against the simulator's own control API."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from exporters.sim import Simulation, parse_scenario
from exporters.sim.api import build_app
from recovery.scheduler.base import JobState, Scheduler
from recovery.scheduler.simulated import SimulatedScheduler
from recovery.scheduler.slurm import SlurmScheduler

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
HELD = json.loads((FIXTURES / "squeue-22.05-requeue-held.json").read_text())


SINFO = "".join(f"node{i}|idle|gpu*|none\n" for i in range(1, 9))


class FakeSlurm:
    """squeue answers from one job's document; scontrol edits it as Slurm 22.05 does."""

    def __init__(self, excluded: str) -> None:
        self.doc = json.loads(json.dumps(HELD))
        self.job = self.doc["jobs"][0]  # running, not held, never restarted
        self.job.update(
            job_state="RUNNING",
            priority=1,
            state_reason="None",
            state_description="",
            restart_cnt=0,
            excluded_nodes=excluded,
            nodes="node1",
        )
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **_kw: object) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        j = self.job
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, json.dumps(self.doc), "")
        if argv[0] == "sinfo":  # the nodes Slurm knows (an exclusion must name them)
            return subprocess.CompletedProcess(argv, 0, SINFO, "")
        if argv[:2] == ["scontrol", "update"]:
            for a in argv[3:]:
                if a.startswith("ExcNodeList="):
                    j["excluded_nodes"] = a.split("=", 1)[1]
        elif argv[:2] in (["scontrol", "requeue"], ["scontrol", "requeuehold"]):
            j.update(job_state="PENDING", restart_cnt=j["restart_cnt"] + 1, nodes="")
            if argv[1] == "requeuehold":
                j.update(priority=0, state_reason="JobHeldUser")
        elif argv[:2] == ["scontrol", "release"]:
            j.update(priority=1, state_reason="None")
        return subprocess.CompletedProcess(argv, 0, "", "")

    def updates(self) -> list[str]:
        return [a for c in self.calls if c[:2] == ["scontrol", "update"] for a in c[3:]]


def _slurm(monkeypatch: pytest.MonkeyPatch, excluded: str) -> tuple[SlurmScheduler, FakeSlurm]:
    fake = FakeSlurm(excluded)
    monkeypatch.setattr(subprocess, "run", fake)
    s = SlurmScheduler(retries=0)
    s.verify_timeout_s, s.verify_interval_s = 1.0, 0.01
    return s, fake


JOB = str(HELD["jobs"][0]["job_id"])


def _state(s: Scheduler, job_id: str = JOB) -> JobState:
    st = s.job_state(job_id)
    assert st is not None
    return st


def test_dropped_exclusions_and_no_culprit_clear_the_list(monkeypatch) -> None:  # noqa: ANN001
    s, fake = _slurm(monkeypatch, "node2,node3")  # both excluded by earlier Goodput restarts
    r = s.requeue(JOB, (), expected_restarts=0, drop=("node2", "node3"))
    assert r.changed
    assert fake.updates() == ["ExcNodeList="]  # Slurm 22.05 clears it so
    assert ["scontrol", "requeue", JOB] not in fake.calls  # a plain requeue keeps the list
    after = _state(s, JOB)
    assert after.excluded == () and after.restarts == 1 and not after.held


def test_a_persons_own_exclusion_survives_a_goodput_exclusion(monkeypatch) -> None:  # noqa: ANN001
    s, fake = _slurm(monkeypatch, "node4")  # sbatch --exclude=node4
    s.requeue(JOB, ("node1",), expected_restarts=0)
    assert fake.updates() == ["ExcNodeList=node4,node1"]
    assert set(_state(s, JOB).excluded) == {"node1", "node4"}


def test_a_dropped_exclusion_goes_and_a_persons_stays(monkeypatch) -> None:  # noqa: ANN001
    s, fake = _slurm(monkeypatch, "node2,node4")  # node2 Goodput's (dropped), node4 the user's
    s.requeue(JOB, (), expected_restarts=0, drop=("node2",))
    assert fake.updates() == ["ExcNodeList=node4"]


def test_an_unchanged_list_is_a_plain_requeue(monkeypatch) -> None:  # noqa: ANN001
    s, fake = _slurm(monkeypatch, "node2,node4")
    s.requeue(JOB, ("node2",), expected_restarts=0)  # node2 kept, node4 the user's
    assert ["scontrol", "requeue", JOB] in fake.calls and fake.updates() == []
    assert set(_state(s, JOB).excluded) == {"node2", "node4"}


def test_stop_leaves_the_exclusions_alone(monkeypatch) -> None:  # noqa: ANN001
    s, fake = _slurm(monkeypatch, "node4")
    s.stop(JOB, expected_restarts=0)
    assert fake.updates() == [] and ["scontrol", "release"] not in [c[:2] for c in fake.calls]
    after = _state(s, JOB)
    assert after.held and after.excluded == ("node4",)


def test_a_bad_node_name_in_drop_is_refused(monkeypatch) -> None:  # noqa: ANN001
    s, fake = _slurm(monkeypatch, "node2")
    with pytest.raises(ValueError):
        s.requeue(JOB, (), expected_restarts=0, drop=("node2;reboot",))
    assert fake.calls == []  # refused before any command ran


# ------------------------------------------------------------------ the simulator adapter


def test_the_simulator_clears_and_keeps_exclusions_like_slurm() -> None:
    sc = parse_scenario({"name": "t", "duration_s": 3600, "nodes": 4, "jobs": []})
    sim = Simulation(sc, seed=1)
    api = TestClient(build_app(sim))
    jid = api.post("/api/v1/scheduler/jobs", json={"name": "a", "nodes": 1}).json()["job_id"]
    sim.step(5)
    s = SimulatedScheduler("http://testserver", session=api)
    s.verify_timeout_s = 0.5
    s.requeue(jid, ("node1",), expected_restarts=0)
    assert _state(s, jid).excluded == ("node1",)
    sim.step(5)
    s.requeue(jid, (), expected_restarts=1)  # nothing dropped: the exclusion stays
    assert _state(s, jid).excluded == ("node1",)
    sim.step(5)
    s.requeue(jid, (), expected_restarts=2, drop=("node1",))  # dropped: cleared
    assert _state(s, jid).excluded == ()
