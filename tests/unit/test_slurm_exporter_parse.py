"""Slurm exporter: parsing, bounded calls, and Slurm being slow or down."""
# ruff: noqa: E501

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporters.slurm_exporter import (
    SlurmCollector,
    SlurmError,
    expand_hostlist,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
    run_command,
)


def squeue_json(n_jobs: int = 3) -> str:
    jobs = [
        {"job_id": 101, "name": "train-a", "job_state": "RUNNING", "partition": "gpu",
         "nodes": "node[1-2]", "restart_cnt": 0, "exit_code": 0, "node_count": 2,
         "tres_alloc_str": "cpu=2,node=2,billing=2,gres/gpu=16", "array_job_id": 0,
         "array_task_id": None},
        {"job_id": 102, "name": "train-b", "job_state": "PENDING", "partition": "gpu",
         "nodes": "", "restart_cnt": 2, "exit_code": 0, "node_count": 1, "tres_alloc_str": "",
         "tres_per_node": "gres:gpu:4", "array_job_id": 0, "array_task_id": None},
        {"job_id": 103, "name": "crash", "job_state": "FAILED", "partition": "gpu",
         "nodes": "node3", "restart_cnt": 0, "exit_code": 256, "node_count": 1,
         "tres_alloc_str": "gres/gpu=1", "array_job_id": 0, "array_task_id": None},
        {"job_id": 104, "name": "killed", "job_state": "CANCELLED", "partition": "gpu",
         "nodes": "node4", "restart_cnt": 0, "exit_code": 15, "node_count": 1,
         "tres_alloc_str": "gres/gpu=1", "array_job_id": 0, "array_task_id": None},
        {"job_id": 110, "name": "arr", "job_state": "RUNNING", "partition": "gpu",
         "nodes": "node4", "restart_cnt": 0, "exit_code": 0, "node_count": 1,
         "tres_per_job": "gres:gpu:2", "array_job_id": 105, "array_task_id": 3},
    ]  # fmt: skip
    for i in range(n_jobs - len(jobs)):
        jobs.append(dict(jobs[1], job_id=1000 + i))
    return json.dumps({"meta": {}, "errors": [], "jobs": jobs})


SINFO = json.dumps(
    {
        "nodes": [
            {"name": "node1", "state": "mixed", "state_flags": [], "reason": "", "partitions": ["gpu"]},
            {"name": "node2", "state": "idle", "state_flags": ["DRAIN"], "reason": "xid 79",
             "partitions": ["gpu", "debug"]},
            {"name": "node3", "state": "down", "state_flags": ["NOT_RESPONDING"], "reason": "Not responding",
             "partitions": ["gpu"]},
            {"name": "bad name;", "state": "idle", "partitions": ["gpu"]},
        ]
    }
)  # fmt: skip
SACCT = "90|gpu|NODE_FAIL|0:0|node[2-3]|billing=1,gres/gpu=8,node=2|old-job|90\n91|gpu|CANCELLED by 0|0:9|node1||oom|91\n"


class FakeSlurm:
    def __init__(self, squeue=None, sinfo=SINFO, sacct=SACCT):
        self.out = {"squeue": squeue or squeue_json(), "sinfo": sinfo, "sacct": sacct}
        self.calls: list[list[str]] = []
        self.down = False

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        assert timeout > 0
        if self.down:
            raise SlurmError(f"{argv[0]}: timed out after {timeout}s")
        return self.out[argv[0]]


def registry_for(fake, clock=lambda: 1000.0):
    c = SlurmCollector(runner=fake, clock=clock)
    reg = CollectorRegistry()
    reg.register(c)
    return c, reg


def test_jobs_nodes_and_partitions():
    c, reg = registry_for(FakeSlurm())
    assert c.refresh()
    v = reg.get_sample_value
    assert (
        v(
            "goodput_slurm_job_state",
            {"job_id": "101", "job_name": "train-a", "partition": "gpu", "state": "running"},
        )
        == 1
    )
    assert (
        v("goodput_slurm_job_node_info", {"job_id": "101", "job_name": "train-a", "node": "node2"})
        == 1
    )
    assert v("goodput_slurm_job_gpus", {"job_id": "101"}) == 16
    assert v("goodput_slurm_job_gpus", {"job_id": "102"}) == 4
    assert v("goodput_slurm_job_restarts", {"job_id": "102"}) == 2
    assert v("goodput_slurm_job_exit_code", {"job_id": "101"}) is None  # still running
    assert v("goodput_slurm_job_exit_code", {"job_id": "103"}) == 1
    assert v("goodput_slurm_job_exit_code", {"job_id": "104"}) == 143  # SIGTERM
    assert (
        v("goodput_slurm_job_node_info", {"job_id": "103", "job_name": "crash", "node": "node3"})
        is None
    )
    assert (
        v(
            "goodput_slurm_job_state",
            {"job_id": "105_3", "job_name": "arr", "partition": "gpu", "state": "running"},
        )
        == 1
    )
    assert v("goodput_slurm_job_gpus", {"job_id": "105_3"}) == 2
    # ended jobs only sacct still knows
    assert (
        v(
            "goodput_slurm_job_state",
            {"job_id": "90", "job_name": "old-job", "partition": "gpu", "state": "node_fail"},
        )
        == 1
    )
    assert (
        v(
            "goodput_slurm_job_state",
            {"job_id": "91", "job_name": "oom", "partition": "gpu", "state": "cancelled"},
        )
        == 1
    )
    assert v("goodput_slurm_job_exit_code", {"job_id": "91"}) == 137
    assert v("goodput_slurm_job_gpus", {"job_id": "90"}) == 8
    assert (
        v("goodput_slurm_node_state", {"node": "node2", "state": "idle+drain", "reason": "xid 79"})
        == 1
    )
    assert (
        v(
            "goodput_slurm_node_state",
            {"node": "node3", "state": "down+not_responding", "reason": "Not responding"},
        )
        == 1
    )
    assert v("goodput_slurm_partition_nodes", {"partition": "gpu", "state": "mixed"}) == 1
    assert v("goodput_slurm_partition_nodes", {"partition": "debug", "state": "idle+drain"}) == 1
    assert v("goodput_slurm_up") == 1
    assert v("goodput_slurm_last_success_timestamp_seconds") == 1000.0


def test_calls_per_refresh_are_bounded():
    fake = FakeSlurm(squeue=squeue_json(5000))
    c, reg = registry_for(fake)
    assert c.refresh()
    assert [a[0] for a in fake.calls] == ["squeue", "sinfo", "sacct"]
    assert len(c.snapshot.jobs) == 5000 + 2


def test_slurm_down_keeps_last_values_and_counts_errors():
    now = [1000.0]
    fake = FakeSlurm()
    c, reg = registry_for(fake, clock=lambda: now[0])
    assert c.refresh()
    fake.down = True
    now[0] = 2000.0
    assert not c.refresh()
    v = reg.get_sample_value
    assert v("goodput_slurm_up") == 0
    assert v("goodput_slurm_scrape_errors_total", {"command": "squeue"}) == 1
    assert v("goodput_slurm_scrape_errors_total", {"command": "sinfo"}) == 1
    assert v("goodput_slurm_last_success_timestamp_seconds") == 1000.0  # stale marker
    assert v("goodput_slurm_job_gpus", {"job_id": "101"}) == 16  # last good values kept
    fake.down = False
    assert c.refresh()
    assert (
        v("goodput_slurm_up") == 1 and v("goodput_slurm_last_success_timestamp_seconds") == 2000.0
    )


def test_garbage_from_slurm_is_an_error_not_a_crash():
    c, reg = registry_for(FakeSlurm(squeue="<html>oops"))
    assert not c.refresh()
    assert reg.get_sample_value("goodput_slurm_scrape_errors_total", {"command": "squeue"}) == 1


def test_slurm_answering_with_an_error_is_a_failed_scrape_not_an_empty_cluster():
    """Slurm 22.05's squeue --json and sinfo --json while slurmctld is down (real output): exit
    0, no jobs or nodes, an `errors` entry. Read as answers, `up` stayed 1 and every job and
    node series vanished."""
    squeue = (FIXTURES / "squeue-22.05-controller-down.json").read_text()
    sinfo = (FIXTURES / "sinfo-22.05-controller-down.json").read_text()
    with pytest.raises(SlurmError, match="slurm_load_jobs"):
        parse_squeue(squeue)
    with pytest.raises(SlurmError, match="Unspecified error"):
        parse_sinfo(sinfo)
    c, reg = registry_for(FakeSlurm())
    assert c.refresh()
    c.runner = FakeSlurm(squeue=squeue, sinfo=sinfo)
    assert not c.refresh()
    v = reg.get_sample_value
    assert v("goodput_slurm_up") == 0
    assert v("goodput_slurm_scrape_errors_total", {"command": "squeue"}) == 1
    assert v("goodput_slurm_scrape_errors_total", {"command": "sinfo"}) == 1
    assert v("goodput_slurm_job_gpus", {"job_id": "101"}) == 16  # the last good values


def test_sacct_down_is_best_effort():
    fake = FakeSlurm()
    c, reg = registry_for(fake)
    assert c.refresh()

    def no_sacct(argv, timeout):
        if argv[0] == "sacct":
            raise SlurmError("sacct: slurmdbd down")
        return fake(argv, timeout)

    c.runner = no_sacct
    assert c.refresh()
    v = reg.get_sample_value
    assert v("goodput_slurm_up") == 1
    assert v("goodput_slurm_scrape_errors_total", {"command": "sacct"}) == 1
    assert (
        v(
            "goodput_slurm_job_state",
            {"job_id": "90", "job_name": "old-job", "partition": "gpu", "state": "node_fail"},
        )
        == 1
    )


def test_run_command_timeout_and_failure():
    with pytest.raises(SlurmError, match="timed out"):
        run_command(["sleep", "5"], 0.2)
    with pytest.raises(SlurmError, match="exit 1"):
        run_command(["false"], 5)
    with pytest.raises(SlurmError, match="no-such-slurm-binary"):
        run_command(["no-such-slurm-binary"], 5)


def test_a_byte_that_is_not_utf8_costs_nothing():
    """Old code: `run_command` decoded strictly, and one ended job's name with a Latin-1 byte
    (sbatch -J does not check encodings) raised UnicodeDecodeError out of refresh(): up 0 and
    no series for the cluster's other jobs and nodes."""
    assert run_command(["printf", "caf\\351"], 5) == "caf\ufffd"
    fake = FakeSlurm()

    def latin1_sacct(argv, timeout):
        if argv[0] == "sacct":
            return run_command(["printf", "99|gpu|FAILED|1:0|node2||caf\\351 run|99\\n"], 5)
        return fake(argv, timeout)

    c, reg = registry_for(latin1_sacct)
    assert c.refresh()
    v = reg.get_sample_value
    assert v("goodput_slurm_up") == 1
    assert v("goodput_slurm_job_gpus", {"job_id": "101"}) == 16
    labels = {"job_id": "99", "job_name": "caf\ufffd run", "partition": "gpu", "state": "failed"}
    assert v("goodput_slurm_job_state", labels) == 1


def test_one_command_failing_in_any_way_costs_only_its_own_values():
    """Old code: only `SlurmError` was caught per command; anything else a runner raised for
    sacct (best effort) took squeue's and sinfo's answers with it."""
    fake = FakeSlurm()

    def odd_sacct(argv, timeout):
        if argv[0] == "sacct":
            raise UnicodeDecodeError("utf-8", b"\xe9", 0, 1, "invalid continuation byte")
        return fake(argv, timeout)

    c, reg = registry_for(odd_sacct)
    assert c.refresh()
    v = reg.get_sample_value
    assert v("goodput_slurm_up") == 1
    assert v("goodput_slurm_scrape_errors_total", {"command": "sacct"}) == 1
    assert v("goodput_slurm_job_gpus", {"job_id": "101"}) == 16


def test_hostlists_and_sacct_lines():
    assert expand_hostlist("node[1-3,5],gpu-a[08-10],solo") == [
        "node1", "node2", "node3", "node5", "gpu-a08", "gpu-a09", "gpu-a10", "solo",
    ]  # fmt: skip
    assert expand_hostlist("") == []
    with pytest.raises(SlurmError):
        expand_hostlist("node[a-b]")
    assert parse_sacct("garbage\n1|x|y\n") == {}
    assert parse_squeue(json.dumps({"jobs": [{"job_id": "1;rm", "job_state": "RUNNING"}]})) == {}


def test_one_odd_job_costs_only_its_own_fields():
    """A `|` in a job name (Slurm does not escape it) shifted every sacct column, so the job
    vanished; a node list that cannot be read dropped the whole squeue or sacct snapshot."""
    ended = parse_sacct(
        "7|gpu|FAILED|1:0|node1||a|COMPLETED|0:0|victim01|7\n"  # the name forges columns
        "8|gpu|FAILED|2:0|node[a-b]||bad-list|8\n"
        "41|gpu|FAILED|1:0|node2||x\n"  # a newline in job 41's name forges a row: ...
        "9999|gpu|NODE_FAIL|0:0|victim01|gres/gpu=8|forged|41\n"  # ... which ends with 41
        "8|gpu|COMPLETED|0:0|victim01||again|8\n"  # a second row of job 8: the first counts
    )
    assert sorted(ended) == ["7", "8"]
    assert (ended["7"].name, ended["7"].state, ended["7"].nodes) == (
        "a|COMPLETED|0:0|victim01", "failed", ["node1"]
    )  # fmt: skip
    assert ended["7"].exit_code == 1 and ended["8"].nodes == [] and ended["8"].exit_code == 2
    live = parse_squeue(
        json.dumps(
            {
                "jobs": [
                    {"job_id": 1, "job_state": "RUNNING", "nodes": "node[a-b]"},
                    {"job_id": 2, "job_state": "RUNNING", "nodes": "node[1-2]"},
                ]
            }
        )
    )
    assert live["1"].nodes == [] and live["2"].nodes == ["node1", "node2"]


def test_sacct_asks_for_nothing_that_ended_before_since():
    """`--since` (the demo's fresh receiver): sacct starts there while it is inside the window,
    in the local time sacct reads; the window's own start once `since` is older."""
    now = 1_800_000_000.0
    col = SlurmCollector(sacct_window_s=3600, clock=lambda: now, since=now - 600)
    argv = col.commands()["sacct"]
    start = argv[argv.index("-S") + 1]
    assert start == time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now - 600))
    col.since = now - 7200
    argv = col.commands()["sacct"]
    assert argv[argv.index("-S") + 1] == "now-3600seconds"


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def test_squeue_of_slurm_23_02_and_23_11():
    """Newer Slurm prints numbers as {"set", "number"} and (23.11) states as lists: the
    exporter read 23.02's array ids as text (every job left out: `{'set': True, ...}_{...}` is
    no job id) and its exit codes as integers (a TypeError: the exporter down for good)."""
    jobs = parse_squeue((FIXTURES / "squeue-23.02-shape.json").read_text())
    assert set(jobs) == {"52173000_1470", "52175550"}
    failed, running = jobs["52173000_1470"], jobs["52175550"]
    assert (failed.state, failed.exit_code, failed.gpus) == ("failed", 1, 8)
    assert running.state == "running" and running.exit_code is None
    assert running.restarts == 1 and running.gpus == 16  # 8 per node on 2 nodes
    assert running.nodes == ["gpu-node-01", "gpu-node-02"]
    jobs = parse_squeue((FIXTURES / "squeue-23.11-shape.json").read_text())
    assert (jobs["801"].state, jobs["801"].exit_code) == ("timeout", 128 + 15)
    assert (jobs["802"].state, jobs["802"].restarts, jobs["802"].gpus) == ("running", 2, 8)


def test_squeue_leaves_out_what_ended_before_since():
    text = (FIXTURES / "squeue-23.02-shape.json").read_text()
    assert set(parse_squeue(text, ended_before=1694675491 + 1)) == {"52175550"}  # still running
    assert len(parse_squeue(text, ended_before=1694675491)) == 2


def test_sinfo_of_slurm_23_02():
    """23.02 moved sinfo's nodes into `sinfo` entries (one per partition and state): the
    exporter found no node at all."""
    nodes = parse_sinfo((FIXTURES / "sinfo-23.02-shape.json").read_text())
    assert nodes["gpu-node-01"] == ("mixed", "", ("gpu",))
    assert nodes["gpu-node-07"] == ("idle+drain", "goodput: XID 79 on GPU 3", ("gpu", "debug"))
    assert nodes["gpu-node-09"][0] == "down+not_responding"


def test_without_sacct_ended_jobs_age_out_of_the_window():
    """sacct failing on every refresh (no accounting): each refresh carried over every ended
    job already known, so the snapshot and its series grew without bound. They stay while they
    ended within the sacct window: by squeue's end time, else from when first seen ended."""
    now = [10_000.0]
    squeue = {"jobs": [{"job_id": 7, "name": "done", "job_state": ["COMPLETED"],
                        "partition": "gpu", "nodes": "node1", "end_time": {"set": True, "number": 9_000}}]}  # fmt: skip
    fake = FakeSlurm(squeue=json.dumps(squeue))
    c, reg = registry_for(fake, clock=lambda: now[0])
    assert c.refresh()  # sacct answered once: jobs 90 and 91 (no end time: first seen now)

    def no_sacct(argv, timeout):
        if argv[0] == "sacct":
            raise SlurmError("sacct: exit 1: Slurm accounting storage is disabled")
        return fake(argv, timeout)

    c.runner = no_sacct
    fake.out["squeue"] = json.dumps({"jobs": []})  # past MinJobAge: squeue forgot job 7
    assert c.refresh() and sorted(c.snapshot.jobs) == ["7", "90", "91"]
    now[0] = 9_000.0 + 3600
    assert c.refresh() and sorted(c.snapshot.jobs) == ["7", "90", "91"]
    now[0] += 1  # job 7 ended over an hour ago
    assert c.refresh() and sorted(c.snapshot.jobs) == ["90", "91"]
    now[0] = 10_000.0 + 3601  # an hour after 90 and 91 were first seen
    assert c.refresh() and c.snapshot.jobs == {}
    assert reg.get_sample_value("goodput_slurm_scrape_errors_total", {"command": "sacct"}) == 4
    for i in range(200):  # a new ended job each minute: the window's worth stays, no more
        now[0] += 60
        squeue["jobs"][0].update(job_id=1000 + i, end_time=int(now[0]))
        fake.out["squeue"] = json.dumps(squeue)
        assert c.refresh()
    assert len(c.snapshot.jobs) == 61
