"""The Slurm adapter without Slurm: argv lists, parsing, retries, guards."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from recovery.scheduler.base import GuardRefused, NodeState, clean_reason
from recovery.scheduler.slurm import SlurmScheduler, _exit_code, expand_hostlist


@pytest.mark.parametrize(
    "text, nodes",
    [
        ("node[1-3,5],gpu7", ("node1", "node2", "node3", "node5", "gpu7")),
        ("n[08-10]", ("n08", "n09", "n10")),
        ("node2", ("node2",)),
        ("(null)", ()),
        ("", ()),
    ],
)
def test_hostlists(text, nodes):
    assert expand_hostlist(text) == nodes


@pytest.mark.parametrize(
    "raw, code",
    [
        (93 << 8, 93),
        (0, 0),
        (15, None),  # SIGTERM: no return code
        ("93:0", 93),
        ("0:9", None),
        ({"return_code": {"number": 93}}, 93),
        ({"set": True, "number": 93 << 8}, 93),  # 23.02: read as unknown before
        (
            {
                "return_code": {"set": True, "number": 0},
                "signal": {"id": {"set": True, "number": 9}},
            },
            None,
        ),
        ({"set": False, "number": 0}, None),
        ("junk", None),
    ],
)
def test_exit_codes(raw, code):
    assert _exit_code(raw) == code


def test_reason_is_prefixed_and_cleaned():
    r = clean_reason('xid79 "quoted"\n`x`')
    assert r.startswith("goodput:") and '"' not in r and "\n" not in r and "`" not in r


class Runner:
    def __init__(self, outputs):
        self.outputs, self.calls = list(outputs), []

    def __call__(self, argv, **kw):
        assert isinstance(argv, list) and "shell" not in kw
        self.calls.append(argv)
        rc, out, err = self.outputs.pop(0)
        if rc == "timeout":
            raise subprocess.TimeoutExpired(argv, kw["timeout"])
        return subprocess.CompletedProcess(argv, rc, out, err)


def test_transient_failures_retry_then_raise_unavailable(monkeypatch):
    from recovery.scheduler.base import SchedulerUnavailable

    r = Runner(
        [(1, "", "Unable to contact slurm controller (connect failure)")] * 2
        + [("timeout", "", "")]
    )
    monkeypatch.setattr(subprocess, "run", r)
    s = SlurmScheduler(retries=2, backoff_s=0.0)
    with pytest.raises(SchedulerUnavailable) as exc:
        s.node_states()
    assert type(exc.value) is SchedulerUnavailable  # unreachable, not busy
    assert len(r.calls) == 3


def test_a_controller_asking_to_try_again_is_busy_not_unreachable(monkeypatch):
    """Slurm's answer (22.05's libslurmfull, word for word) to an update of a job whose
    accounting index is being written."""
    from recovery.scheduler.base import SchedulerBusy

    busy = "Job update not available right now, the DB index is being set, try again in a bit"
    r = Runner([(1, "", busy)] * 2)
    monkeypatch.setattr(subprocess, "run", r)
    with pytest.raises(SchedulerBusy, match="DB index"):
        SlurmScheduler(retries=1, backoff_s=0.0)._run(["scontrol", "update", "JobId=17"])
    assert len(r.calls) == 2
    # 23.02+'s RPC rate limit (SLURMCTLD_COMMUNICATIONS_BACKOFF): retried, then busy
    limit = "Rate limit exceeded, please retry momentarily"
    r = Runner([(1, "", limit), (0, "", "")])
    monkeypatch.setattr(subprocess, "run", r)
    assert SlurmScheduler(backoff_s=0.0)._run(["scontrol", "release", "17"]) == ""
    monkeypatch.setattr(subprocess, "run", Runner([(1, "", limit)] * 2))
    with pytest.raises(SchedulerBusy, match="Rate limit"):
        SlurmScheduler(retries=1, backoff_s=0.0)._run(["scontrol", "release", "17"])


@pytest.mark.parametrize(
    "answer, up",
    [
        ((0, "Slurmctld(primary) at vm is UP\n", ""), True),
        ((1, "Slurmctld(primary) at vm is DOWN\n*** RESTORE SLURMCTLD DAEMON ***\n", ""), False),
        (("timeout", "", ""), False),
    ],
)
def test_reachable_is_one_scontrol_ping(monkeypatch, answer, up):
    r = Runner([answer])
    monkeypatch.setattr(subprocess, "run", r)
    assert SlurmScheduler().reachable() is up
    assert r.calls == [["scontrol", "ping"]]  # once: no retries


def test_a_controller_stopping_mid_call_is_retried(monkeypatch):
    """slurmctld stopped while a call was in flight (the chaos suite's outage): retried; a
    requeue, which may have been applied, is left to the action's retry instead."""
    from recovery.scheduler.base import SchedulerUnavailable

    r = Runner([(1, "", "Unexpected message received for job 17"), (0, "", "")])
    monkeypatch.setattr(subprocess, "run", r)
    assert SlurmScheduler(backoff_s=0.0)._run(["scontrol", "release", "17"]) == ""
    assert len(r.calls) == 2
    r = Runner([(1, "", "Unexpected message received for job 17"), (0, "", "")])
    monkeypatch.setattr(subprocess, "run", r)
    with pytest.raises(SchedulerUnavailable, match="Unexpected message"):
        SlurmScheduler(backoff_s=0.0)._run(["scontrol", "requeue", "17"], once=True)
    assert len(r.calls) == 1


def test_permanent_failure_is_not_retried(monkeypatch):
    from recovery.scheduler.base import SchedulerError

    r = Runner([(1, "", "slurm_load_jobs error: Access/permission denied")])
    monkeypatch.setattr(subprocess, "run", r)
    with pytest.raises(SchedulerError, match="permission denied"):
        SlurmScheduler(backoff_s=0.0, json_filters=True).job_state("77")
    assert len(r.calls) == 1
    # a job squeue no longer knows (23.02+: exit 1) is asked of the accounting, once
    r = Runner([(1, "", "slurm_load_jobs error: Invalid job id specified"), (0, "", "")])
    monkeypatch.setattr(subprocess, "run", r)
    assert SlurmScheduler(backoff_s=0.0, json_filters=True).job_state("77") is None
    assert [c[0] for c in r.calls] == ["squeue", "sacct"]


def test_parses_squeue_json_and_filters_by_id(monkeypatch):
    jobs = {
        "jobs": [
            {"job_id": 5, "job_state": "RUNNING", "name": "other"},
            {
                "job_id": 77,
                "name": "train",
                "job_state": "PENDING",
                "nodes": "",
                "restart_cnt": 2,
                "exit_code": 0,
                "comment": '{"goodput":{}}',
                "excluded_nodes": "node[2-3]",
                "priority": 0,
                "state_reason": "job_requeued_in_held_state",
                "partition": "gpu",
                "start_time": 0,
                "tres_alloc_str": "cpu=1,gres/gpu=8",
            },
        ]
    }
    monkeypatch.setattr(subprocess, "run", Runner([(0, json.dumps(jobs), "")]))
    j = SlurmScheduler(json_filters=True).job_state("77")
    assert j.name == "train" and j.held and j.restarts == 2 and j.excluded == ("node2", "node3")
    assert j.gpus == 8 and j.partition == "gpu"


def test_never_resumes_a_node_a_person_drained(monkeypatch):
    s = SlurmScheduler()
    monkeypatch.setattr(
        s, "node_states", lambda: [NodeState("node4", "DRAINED", "fan broken", ("gpu",))]
    )
    monkeypatch.setattr(s, "_resume", lambda n: pytest.fail("must not resume"))
    with pytest.raises(GuardRefused, match="person"):
        s.resume("node4")


@pytest.mark.parametrize(
    ("state", "reason", "drains"),
    [
        ("DOWN", "alice: bad PSU, RMA pending", False),  # a person's: left as it is
        ("DOWN", "Not responding", True),  # Slurm's own for a lost node: Goodput drains it
        ("IDLE", "", True),
    ],
)
def test_a_node_a_person_took_down_is_not_drained_over(monkeypatch, state, reason, drains):
    """Slurm 22.05 replaces a DOWN node's reason with the drain's: the node then read as
    Goodput's drain, and the return-to-service check put a node an admin had taken out for
    an RMA back into service (seen on the local stack: down 'alice: ...' -> drained
    'goodput: xid79' -> node check passed -> idle)."""
    s = SlurmScheduler()
    s.verify_timeout_s = 0.1
    nodes = [NodeState("node4", state, reason, ("gpu",))]
    monkeypatch.setattr(s, "node_states", lambda: nodes)
    drained: list[str] = []

    def drain(node, why):
        drained.append(node)
        nodes[0] = NodeState("node4", "DRAINED", why, ("gpu",))

    monkeypatch.setattr(s, "_drain", drain)
    r = s.drain("node4", "goodput: xid79")
    assert r.changed is drains and (drained == ["node4"]) is drains, r.detail


def test_rejects_unsafe_names():
    s = SlurmScheduler()
    with pytest.raises(ValueError):
        s.drain("node1 State=RESUME", "x")
    with pytest.raises(ValueError):
        s.job_state("1;scancel -u root")


def test_an_ended_jobs_end_is_known_and_an_active_jobs_time_limit_is_not(monkeypatch):
    jobs = {
        "jobs": [
            {"job_id": 8, "job_state": "FAILED", "end_time": 1796129630, "start_time": 1796129000},
            {"job_id": 9, "job_state": "RUNNING", "end_time": {"set": True, "number": 1796999999}},
        ]
    }
    monkeypatch.setattr(subprocess, "run", Runner([(0, json.dumps(jobs), "")] * 2))
    assert SlurmScheduler(json_filters=True).job_state("8").end_time == 1796129630.0
    assert SlurmScheduler(json_filters=True).job_state("9").end_time is None
    forgotten = "31|FAILED|1:0|node1|gpu|2026-11-29T20:40:00|2026-11-29T20:41:12|ana|train\n"
    no_comment = "31|\n"
    monkeypatch.setattr(
        subprocess,
        "run",
        Runner([(0, '{"jobs": []}', ""), (0, forgotten, ""), (0, no_comment, "")]),
    )
    j = SlurmScheduler(json_filters=True).job_state("31")
    assert (
        j.state == "FAILED"
        and j.comment == ""
        and (j.name, j.user, j.exit_code) == ("train", "ana", 1)
        and j.end_time == time.mktime(time.strptime("2026-11-29T20:41:12", "%Y-%m-%dT%H:%M:%S"))
    )


def test_a_byte_that_is_not_utf8_is_read_not_raised(tmp_path):
    """Old code: `text=True` decoded strictly, so a drain reason or a controller name with a
    Latin-1 byte raised UnicodeDecodeError (not a SchedulerError) out of every node read and
    out of `reachable`."""
    for cmd, text in (
        ("sinfo", "node1|drained|gpu*|caf\\351 fan\\n"),
        ("scontrol", "Slurmctld(primary) at ctl-\\351 is UP\\n"),
    ):
        (tmp_path / cmd).write_text(f"#!/bin/sh\nprintf '{text}'\n")
        (tmp_path / cmd).chmod(0o755)
    s = SlurmScheduler(retries=0, env={"PATH": str(tmp_path)})
    assert [(n.node, n.reason) for n in s.node_states()] == [("node1", "caf\ufffd fan")]
    assert s.reachable()
