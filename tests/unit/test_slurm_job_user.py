"""The job's facts (user, nodes, state) come from Slurm's structured output, and a job's owner
cannot forge them through the free text they write (the job's name and comment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery.attribution import attribute
from recovery.evidence import Bundle, Context, SlurmFacts
from recovery.evidence import slurm as slurm_evidence
from recovery.scheduler.slurm import SlurmScheduler, user_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
FORGED = "x NodeList=victim01 JobState=NODE_FAIL UserId=bob(1001) ExitCode=0:0"


def answer(monkeypatch, squeue: dict, sacct: dict[str, str] | None = None) -> list[list[str]]:
    """Slurm's clients as the adapter calls them: squeue's JSON, sacct's text by its fields."""
    calls: list[list[str]] = []

    def run(self, argv):
        if argv == ["squeue", "--version"]:
            return "slurm 23.11.4\n"  # whose --json filters by -j
        calls.append(list(argv))
        if argv[0] == "squeue":
            return json.dumps(squeue)
        return (sacct or {}).get(argv[-1], "")

    monkeypatch.setattr(SlurmScheduler, "_run", run)
    return calls


def test_squeue_names_the_user(monkeypatch):
    """A real `squeue --json` of Slurm 22.05 (user_name root)."""
    answer(monkeypatch, json.loads((FIXTURES / "squeue-22.05-requeue-held.json").read_text()))
    facts = slurm_evidence.job_facts("1", 1.0)
    assert (facts["user"], facts["state"], facts["restarts"]) == ("root", "PENDING", 1)


def test_a_jobs_name_and_comment_cannot_forge_its_facts(monkeypatch):
    """`scontrol show job -o` is Key=value text: `--comment='x NodeList=victim01 ...'` (or the
    same in `--job-name`) overrode the job's node list, state and user."""
    job = {
        "job_id": 7,
        "name": FORGED,
        "comment": FORGED,
        "job_state": "RUNNING",
        "nodes": "node[1-2]",
        "user_name": "ana",
        "exit_code": 0,
    }
    answer(monkeypatch, {"jobs": [job]})
    facts = slurm_evidence.job_facts("7", 1.0)
    assert (facts["nodes"], facts["state"], facts["user"]) == (["node1", "node2"], "RUNNING", "ana")
    assert facts["name"] == FORGED and facts["comment"] == FORGED


def test_sacct_reads_its_free_text_apart(monkeypatch):
    """A forgotten job, from the accounting: sacct escapes no `|` and no newline, so the name
    comes last on its own query and the comment on another."""
    fields = SlurmScheduler.SACCT_FIELDS
    calls = answer(
        monkeypatch,
        {"jobs": []},
        {
            fields: "7|FAILED|1:0|node[1-2]|gpu|2026-12-01T09:00:00|2026-12-01T10:00:00|ana|"
            "a|FAILED|0:0|victim01\n7|COMPLETED|0:0|victim01|gpu|x|x|bob|forged line\n",
            "JobID,Comment": "7|a|b NodeList=victim01\n7|forged\n",
        },
    )
    facts = slurm_evidence.job_facts("7", 1.0)
    assert (facts["user"], facts["state"], facts["exit_code"]) == ("ana", "FAILED", 1)
    assert facts["nodes"] == ["node1", "node2"] and facts["name"] == "a|FAILED|0:0|victim01"
    assert facts["comment"] == "a|b NodeList=victim01" and facts["end_time"] is not None
    assert [c[0] for c in calls] == ["squeue", "sacct", "sacct"]


def test_a_job_slurm_no_longer_knows_has_no_facts(monkeypatch):
    answer(monkeypatch, {"jobs": []})
    assert slurm_evidence.job_facts("7", 1.0) == {}


@pytest.mark.parametrize(
    ("raw", "name"),
    [("$(reboot)", None), ("", None), (None, None), ("alice.b(1001)", "alice.b"), ("ana", "ana")],
)
def test_junk_is_no_user(raw, name):
    assert user_name(raw) == name


def test_the_diagnosis_carries_the_jobs_user_and_nodes():
    facts = SlurmFacts(
        job={"job_id": "7", "state": "FAILED", "user": "ana", "nodes": ["node1", "node3"]}
    )
    doc = attribute(Bundle(slurm=facts), Context("7", [], 0.0, 100.0))
    assert doc["job_user"] == "ana" and doc["job_nodes"] == ["node1", "node3"]


def test_an_array_task_is_found_in_the_23_02_shape(monkeypatch):
    """23.02 prints array ids as {"set", "number"}: the task never matched, so the adapter
    and the evidence fell back to the accounting (no reason, no hold, restarts 0)."""
    answer(monkeypatch, json.loads((FIXTURES / "squeue-23.02-shape.json").read_text()))
    facts = slurm_evidence.job_facts("52173000_1470", 1.0)
    assert (facts["name"], facts["state"], facts["nodes"]) == ("train-a", "FAILED", ["gpu-node-07"])
    assert slurm_evidence.job_facts("52175550", 1.0)["name"] == "train-b"


def test_a_job_squeue_refuses_is_read_from_the_accounting_and_the_nodes_still_are(monkeypatch):
    """23.02 and later answer `squeue -j` of a forgotten job with exit 1, "Invalid job id
    specified": that ended the Slurm evidence, the node states with it."""
    from recovery.evidence import Context
    from recovery.scheduler.base import SchedulerError
    from recovery.settings import Settings

    fields = SlurmScheduler.SACCT_FIELDS
    line = "7|FAILED|1:0|node1|gpu|2026-12-01T09:00:00|2026-12-01T10:00:00|ana|train\n"
    sacct = {fields: line, "JobID,Comment": "7|\n"}

    def run(self, argv):
        if argv[0] == "squeue":
            raise SchedulerError(
                "squeue --json failed: slurm_load_jobs error: Invalid job id specified"
            )
        return sacct.get(argv[-1], "")

    monkeypatch.setattr(SlurmScheduler, "_run", run)
    assert slurm_evidence.job_facts("7", 1.0)["state"] == "FAILED"
    # the accounting down too: the job's facts are lost, the nodes' states are still read
    monkeypatch.setattr(slurm_evidence, "run", lambda argv, timeout: "node1|drained|xid 79\n")

    def down(self, argv):
        raise SchedulerError("sacct failed: slurmdbd down")

    monkeypatch.setattr(SlurmScheduler, "_run", down)
    got = slurm_evidence.collect(Context("7", ["node1"], 0.0, 1.0), Settings(slurm_enabled=True))
    assert got.slurm.nodes == {"node1": {"state": "drained", "reason": "xid 79"}}
    assert got.reports[0].status == "ok" and "slurmdbd down" in got.reports[0].reason


def test_the_evidence_writes_a_jobs_end_as_slurm_does():
    """A job a signal ended has no return code: its excerpt read `ExitCode=None:9`."""
    from recovery.attribution.slurm import _exit_text

    assert _exit_text({"exit_code": None, "signal": 9}) == "0:9"
    assert _exit_text({"exit_code": 3, "signal": 0}) == "3:0"
    assert _exit_text({}) == "?:0"  # unknown


# Real answers of Slurm 22.05.8 here (`squeue -h -t all -j J -O <TEXT_FIELDS>` then `-o %i|%x|%j`)
TEXT_22_05 = {
    "107": (
        "107|CANCELLED|0|15|None|node1||root|gpu|2026-12-07T22:20:05|2026-12-07T22:20:44|1|"
        "cpu=1,node=1,billing=1|4294901587|goodput: JobState=COMPLETED Restarts=9\n",
        "107||we ird UserId=x(1) name\n",
    ),
    "108": (
        "108|FAILED|0|768|NonZeroExitCode|node2||root|gpu|2026-12-07T22:20:45|"
        "2026-12-07T22:20:47|1|cpu=1,node=1,billing=1,gres/gpu=8|4294901586|(null)\n",
        "108||wrap\n",
    ),
    "110": (
        "110|PENDING|1|0|JobHeldUser||node1|root|gpu|N/A|N/A|1|cpu=1,mem=62.50G,node=1,"
        "billing=1|0|(null)\n",
        "110|node[2-3]|train\n",
    ),
    "111": ("111_[1-3]|PENDING|0|0|JobHeldUser||||gpu|N/A|N/A|1||0|(null)\n", "111_[1-3]||a\n"),
}


def _slurm_22_05(monkeypatch):
    calls: list[list[str]] = []

    def run(self, argv):
        calls.append(list(argv))
        if argv == ["squeue", "--version"]:
            return "slurm-wlm 22.05.8\n"
        if argv[:2] == ["squeue", "--json"]:
            return json.dumps({"jobs": [{"job_id": 111, "job_state": "PENDING", "name": "a"}]})
        out, more = TEXT_22_05[argv[5]]
        return out if argv[6] == "-O" else more

    monkeypatch.setattr(SlurmScheduler, "_run", run)
    return calls


def test_slurm_22_05_lookups_read_one_job_not_the_whole_queue(monkeypatch):
    """22.05's `squeue --json -j J` ignores -j: each lookup downloaded the whole queue (tens of
    MB at a large site, polled every 0.2 s while an action is confirmed). Its text output
    filters; the free text (comment, name) comes last and forges nothing."""
    calls = _slurm_22_05(monkeypatch)
    s = SlurmScheduler()
    forged = s.job_state("107")
    assert (forged.state, forged.restarts, forged.signal, forged.exit_code) == (
        "CANCELLED", 0, 15, None,
    )  # fmt: skip
    assert forged.comment == "goodput: JobState=COMPLETED Restarts=9"
    assert forged.name == "we ird UserId=x(1) name" and forged.user == "root"
    failed = s.job_state("108")
    assert (failed.exit_code, failed.gpus, failed.nodes, failed.end_time is not None) == (
        3, 8, ("node2",), True,
    )  # fmt: skip
    held = s.job_state("110")
    assert (held.held, held.restarts, held.excluded, held.required) == (
        True, 1, ("node2", "node3"), ("node1",),
    )  # fmt: skip
    assert held.start_time is None and held.end_time is None and held.comment == ""
    assert not any(c[:2] == ["squeue", "--json"] for c in calls)
    assert sum(c == ["squeue", "--version"] for c in calls) == 1  # asked once
    # an array's pending meta-job is no one record of "111": the JSON answers it
    assert s.job_state("111").state == "PENDING"
    assert calls[-1][:2] == ["squeue", "--json"]
