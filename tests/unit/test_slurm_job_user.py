"""The job's user and nodes, from Slurm's own output, reach the diagnosis (the several-users
rule of node history counts them)."""

from __future__ import annotations

from pathlib import Path

from recovery.attribution import attribute
from recovery.evidence import Bundle, Context, SlurmFacts
from recovery.evidence import slurm as slurm_evidence

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def test_scontrol_names_the_user(monkeypatch):
    """A real `scontrol show job -o` line of Slurm 22.05 (UserId=root(0))."""
    line = (FIXTURES / "scontrol-22.05-requeue-held.txt").read_text()
    monkeypatch.setattr(slurm_evidence, "run", lambda argv, timeout: line)
    assert slurm_evidence.job_facts("1", 1.0)["user"] == "root"


def test_sacct_names_the_user_and_a_comment_keeps_its_pipes(monkeypatch):
    def run(argv, timeout):
        if argv[0] == "scontrol":
            raise RuntimeError("scontrol exited 1: Invalid job id specified")
        assert "End,User,Comment" in argv[-1]
        return "7|train|FAILED|1:0|node[1-2]|2026-12-01T09:00:00|2026-12-01T10:00:00|ana|a|b\n"

    monkeypatch.setattr(slurm_evidence, "run", run)
    facts = slurm_evidence.job_facts("7", 1.0)
    assert (
        facts["user"] == "ana"
        and facts["comment"] == "a|b"
        and facts["nodes"] == ["node1", "node2"]
    )


def test_junk_is_no_user():
    assert slurm_evidence._user("$(reboot)") is None and slurm_evidence._user("") is None
    assert slurm_evidence._user("alice.b(1001)") == "alice.b"


def test_the_diagnosis_carries_the_jobs_user_and_nodes():
    facts = SlurmFacts(
        job={"job_id": "7", "state": "FAILED", "user": "ana", "nodes": ["node1", "node3"]}
    )
    doc = attribute(Bundle(slurm=facts), Context("7", [], 0.0, 100.0))
    assert doc["job_user"] == "ana" and doc["job_nodes"] == ["node1", "node3"]
