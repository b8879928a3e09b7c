"""Attribution on real log lines (sources in catalogue/patterns.yaml): the signatures it used to
miss, no verdict without evidence, Slurm states as symptoms, a stable cause key, and only the
job's current run as evidence. Each defect of issue #16 / #19 item 4 has a case here that
failed on the code before; the other cases pin the decisions made with them."""

# ruff: noqa: E501  (real log lines are long)
from __future__ import annotations

import calendar
import dataclasses
import json
import time
from types import SimpleNamespace

import pytest

import catalogue
from recovery import attribution, diagnosis, notifier
from recovery.decide import Diagnosis, History, JobView, NodeView, decide
from recovery.evidence import Bundle, Context, LogLine, Report, Series, SlurmFacts
from recovery.evidence import slurm as slurm_evidence
from recovery.evidence.logs import collect_dir, line_time
from recovery.policy import load_policy, parse_policy

OK = [Report("logs", "ok"), Report("prometheus", "ok"), Report("slurm", "ok")]
T = calendar.timegm(time.strptime("2026-11-29 20:40:00", "%Y-%m-%d %H:%M:%S"))


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(t))


def _line(text: str, kind: str = "job", node: str | None = None) -> LogLine:
    return LogLine("x.log", 1, text, line_time(text, 2026), node, kind=kind)


def _run(*lines: LogLine, job: dict | None = None, nodes: dict | None = None, alerts=None):
    b = Bundle(lines=list(lines), reports=list(OK), slurm=SlurmFacts(job or {}, nodes or {}))
    ctx = Context(job_id="12", nodes=["node1", "node2"], start=0.0, end=2e9, alerts=alerts or [])
    return attribution.attribute(b, ctx)


def _verdict(doc: dict) -> tuple[str, list[str]]:
    return doc["outcome"], doc["affected_nodes"]


# ---------------------------------------------------------------- signatures that were missing


@pytest.mark.parametrize("code", [150, 199])  # 150: Blackwell-era code; 199: in no table
def test_an_xid_the_table_does_not_know_is_never_healthy(code):
    doc = _run(
        _line(
            f"2026-01-01T00:00:01+0000 node2 kernel: NVRM: Xid (PCI:0000:2b:00): {code}, pid=1, name=python, x",
            "kernel",
            "node2",
        )
    )
    if catalogue.xid_info(code) is None or catalogue.xid_info(code).outcome == "unknown":
        assert _verdict(doc) == ("unknown", ["node2"]), doc["root_cause"]
    assert doc["outcome"] != "healthy"


@pytest.mark.parametrize(
    "text,outcome",
    [
        # NVIDIA/Megatron-LM#1880, FlagOpen/FlagEmbedding#1549: the elastic agent reports the signal
        ("  exitcode  : -11 (pid: 6421)", "workload_crash"),
        (
            "E1119 08:26:02.715000 28705 site-packages/torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: -11) local_rank: 0 (pid: 28773) of binary: /app/anaconda3/envs/py312/bin/python3.12",
            "workload_crash",
        ),
        # NVIDIA/nccl#1504: SIGABRT is how the NCCL watchdog ends every rank (a consequence)
        (
            "E1106 04:43:02.651000 26021 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 3 (pid: 26026) of binary: /root/miniconda3/envs/pippy/bin/python",
            "unknown",
        ),
        # lzhxmu/CPPO#6: SIGKILL is a consequence (OOM killer, the agent, Slurm): not a crash
        ("  exitcode  : -9 (pid: 14750)", "unknown"),
    ],
)
def test_elastic_signal_exit_codes(text, outcome):
    assert _run(_line(text))["outcome"] == outcome


@pytest.mark.parametrize(
    "line,kind,verdict",
    [
        # mej/nhc#152
        (
            "ERROR:  nhc:  Health check failed:  check_hw_eth:  Ethernet device ib0 not detected.",
            "kernel",
            ("network_fault", ["node2"]),
        ),
        (
            "ERROR:  nhc:  Health check failed:  check_hw_physmem:  Actual RAM size (0 kB) less than minimum allowed (263504064 kB).",
            "kernel",
            ("node_lost", ["node2"]),
        ),
        # mej/nhc#71
        (
            'ERROR:  nhc:  Health check failed:  check_gpfs_health NETWORK: GPFS health for "NETWORK" is FAILED',
            "kernel",
            ("filesystem", []),
        ),
        # raspberrypi/linux#2482 (plain dmesg stamp)
        (
            "[ 3223.539141] nfs: server ease not responding, still trying",
            "kernel",
            ("filesystem", []),
        ),
        # aws/aws-parallelcluster#2701, jade-hpc-gpu/jade-hpc-gpu.github.io#14
        (
            "Apr 30 13:50:10 ip-10-0-33-4 kernel: [268274.472582] Lustre: no2zxbmv-MDT0000-mdc-000000001785e248: Connection to no2zxbmv-MDT0000 (at 10.0.47.232@tcp) was lost; in progress operations using this service will wait for recovery to complete",
            "kernel",
            ("filesystem", []),
        ),
        (
            "[Mon Oct 16 10:00:12 2017] Lustre: 2449:0:(client.c:2141:ptlrpc_expire_one_request()) @@@ Request sent has failed due to network error: [sent 1508144508/real 1508144518]  req@ffff880eb14da700 x1570198182041824/t0(0) o250->MGC172.31.126.87@o2ib@172.31.126.87@o2ib:26/25 lens 520/544 e 0 to 1 dl 1508144563 ref 1 fl Rpc:eXN/0/ffffffff rc 0/-1",
            "kernel",
            ("filesystem", []),
        ),
        # giovannisciortino.github.io (GPFS two-node cluster post)
        (
            "May 7 22:25:39 gpfs02 mmfs: [E] Node 172.17.0.101 (gpfs01) is being expelled due to expired lease.",
            "kernel",
            ("filesystem", []),
        ),
        # MIC-DKFZ/nnUNet#1519 (was a second copy of the signature in recovery/rules)
        (
            "RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
            "job",
            ("gpu_hardware_fault", []),
        ),
    ],
)
def test_node_health_and_filesystem_client_errors(line, kind, verdict):
    doc = _run(_line(line, kind, "node2" if kind == "kernel" else None))
    assert _verdict(doc) == verdict, doc["root_cause"]


def test_a_health_check_reason_on_the_node_is_a_symptom():
    """NHC marks the node offline with the reason `NHC: <check>: <why>` (Slurm's node reason)."""
    nodes = {
        "node2": {
            "state": "drained",
            "reason": "NHC: check_hw_ib:  No IB port is ACTIVE (LinkUp 100 Gb/sec).",
        }
    }
    doc = _run(job={"state": "RUNNING", "nodes": ["node1", "node2"]}, nodes=nodes)
    assert _verdict(doc) == ("network_fault", ["node2"]), doc["root_cause"]


def test_a_loss_printed_in_upper_case_is_progress_and_nan_is_divergence():
    progress = [m.pattern for m in catalogue.match_line("Epoch 1 | Step 120 | Loss: 2.3456", "job")]
    assert progress == ["generic_progress"]
    assert _run(_line("Epoch 1 | Step 120 | Loss: 2.3456"))["outcome"] == "healthy"
    assert _run(_line("Epoch 1 | Step 121 | LOSS nan"))["outcome"] == "workload_divergence"


def test_aborts_after_a_collective_timeout_are_its_consequence():
    """huggingface/picotron_tutorial#6: a watchdog timeout, then every rank exits -6 (SIGABRT):
    the aborts follow the timeout; an abort well before it is still a crash."""
    timeout = _line(
        "[2026-05-01 11:02:35] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
    )
    abort = _line("  exitcode  : -6 (pid: 3438)")
    abort.time = timeout.time + 5  # the elastic summary, read with the time of the line before
    assert _run(timeout, abort)["outcome"] == "unknown"
    early = _line(
        "[2026-05-01 10:50:00] terminate called after throwing an instance of 'c10::Error'"
    )
    assert _run(early, timeout)["outcome"] == "workload_crash"


# ---------------------------------------------------------------- overrides keyed by pattern id


def test_a_device_side_assert_is_a_crash_and_a_generic_cuda_error_a_cascade():
    assert_line = _line("RuntimeError: CUDA error: device-side assert triggered")
    assert _run(assert_line)["outcome"] == "workload_crash"
    assert (
        _run(assert_line, alerts=[{"alertname": "GoodputJobLogFault"}])["outcome"]
        == "workload_crash"
    )
    doc = _run(_line("RuntimeError: CUDA error: unspecified launch failure"))
    assert doc["outcome"] == "unknown"
    assert {s["id"]: s["role"] for s in doc["symptoms"]} == {"cuda_error": "cascade"}


# ---------------------------------------------------------------- no verdict without evidence


def test_a_job_no_source_knows_is_unknown_not_healthy():
    b = Bundle(
        reports=[Report("logs", "empty"), Report("prometheus", "empty"), Report("slurm", "empty")]
    )
    doc = attribution.attribute(b, Context(job_id="9999", nodes=[], start=0.0, end=1.0))
    assert doc["outcome"] == "unknown" and doc["root_cause"].startswith("no evidence: job 9999")


def test_healthy_needs_a_running_progressing_job():
    progress = Series("goodput_job_iteration", [(0.0, 10.0), (60.0, 90.0)], job_id="12")
    frozen = Series("goodput_job_iteration", [(0.0, 10.0), (60.0, 10.0)], job_id="12")
    ctx = Context(job_id="12", nodes=[], start=0.0, end=60.0)
    running = SlurmFacts({"state": "RUNNING"})
    doc = attribution.attribute(Bundle(series=[progress], slurm=running, reports=list(OK)), ctx)
    assert doc["outcome"] == "healthy" and "goodput_job_iteration" in doc["confidence_basis"]
    doc = attribution.attribute(Bundle(series=[frozen], slurm=running, reports=list(OK)), ctx)
    assert doc["outcome"] == "unknown"
    pending = SlurmFacts({"state": "PENDING"})
    doc = attribution.attribute(Bundle(series=[progress], slurm=pending, reports=list(OK)), ctx)
    assert doc["outcome"] == "unknown" and "PENDING" in doc["root_cause"]


@pytest.mark.parametrize(
    "state,exit_code,outcome",
    [
        ("FAILED", 1, "workload_crash"),  # exit 1, no pattern: the application ended itself
        ("TIMEOUT", 0, "scheduler_event"),  # a time limit is not a crash
        ("NODE_FAIL", 0, "node_lost"),
        ("OUT_OF_MEMORY", 0, "workload_oom"),
        ("COMPLETED", 0, "healthy"),
    ],
)
def test_slurm_states_are_symptoms(state, exit_code, outcome):
    doc = _run(job={"state": state, "exit_code": exit_code, "argv": "scontrol show job -o 12"})
    assert doc["outcome"] == outcome, doc["root_cause"]
    if outcome != "healthy":
        assert any(e["source"] == "slurm" and state in e["excerpt"] for e in doc["evidence"])


def test_a_failed_job_is_a_low_confidence_crash_and_a_person_decides_without_logs():
    job = {"state": "FAILED", "exit_code": 1}
    full = _run(job=job)
    assert full["confidence"] == 0.5
    no_logs = attribution.attribute(
        Bundle(slurm=SlurmFacts(job), reports=[Report("logs", "error"), *OK[1:]]),
        Context(job_id="12", nodes=[], start=0.0, end=1.0),
    )
    policy = load_policy()
    assert no_logs["confidence"] < policy.min_confidence["requeue"] <= full["confidence"]


def test_a_failed_job_after_an_nccl_timeout_is_not_called_a_crash():
    nccl = "[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
    assert _run(_line(nccl), job={"state": "FAILED", "exit_code": 1})["outcome"] == "unknown"


# ---------------------------------------------------------------- a stable cause key


def test_the_same_fault_40_minutes_apart_has_the_same_cause_key():
    def at(t: float) -> dict:
        text = f"{_stamp(t)} node2 kernel: NVRM: Xid (PCI:0000:2b:00): 79, pid=1, name=python, GPU has fallen off the bus."
        return _run(_line(text, "kernel", "node2"))

    a, b = at(T), at(T + 2400)
    assert a["root_cause"] != b["root_cause"]  # the sentence names the line and its time
    assert a["cause_key"] == b["cause_key"] == "gpu_hardware_fault:gpu_off_bus+xid_fatal@node2"
    assert Diagnosis.from_dict(a).cause_key == Diagnosis.from_dict(b).cause_key == a["cause_key"]


# ---------------------------------------------------------------- one outcome list


def test_outcome_categories_come_from_the_catalogue():
    cat = catalogue.outcomes()
    assert set(diagnosis.OUTCOMES) == set(cat)
    assert diagnosis.CATEGORY == {o: cat[o].category for o in cat}
    assert diagnosis.CATEGORY["scheduler_event"] == "infrastructure"


# ---------------------------------------------------------------- the notification's runbook


def test_notifications_link_a_runbook_section_that_exists(monkeypatch):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sent: list[dict] = []
    monkeypatch.setattr(notifier.audit, "record", lambda *a, **k: None)
    monkeypatch.setattr(
        notifier.requests,
        "post",
        lambda url, json, timeout: sent.append(json[0]) or SimpleNamespace(status_code=200),
    )
    cfg = SimpleNamespace(alertmanager_url="http://am.invalid")
    row = {"job_id": "12", "incident_id": "1", "id": "inc-1", "kind": "hold_for_person"}
    for name in ("GoodputNeedsPerson", "GoodputActionPendingApproval", "GoodputJobStopped"):
        notifier.notify(None, cfg, name, row, None, "text", "warning", None)
    for alert in sent:
        path, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        text = (root / path).read_text()
        assert (
            f"## {alert['labels']['alertname']}\n" in text
            and anchor == alert["labels"]["alertname"].lower()
        )


# ---------------------------------------------------------------- #19 item 4: a stale XID


def test_the_lookback_is_honoured(tmp_path):
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "node1.log").write_text(
        f"{_stamp(T - 100)} node1 kernel: NVRM: Xid (PCI:0000:18:00): 79, 100 s before the alert\n"
        f"{_stamp(T + 2)} node1 kernel: NVRM: Xid (PCI:0000:5D:00): 79, at the alert\n"
    )
    ctx = Context.from_incident(
        {"first_alert_at": T, "node": "node1", "alerts": []},
        SimpleNamespace(lookback_s=5.0, lookahead_s=120.0),
        now=T + 10,
    )
    lines = [ln.text for ln in collect_dir(ctx, tmp_path).lines]
    assert len(lines) == 1 and "at the alert" in lines[0]


def test_a_line_from_before_the_current_run_is_neither_onset_nor_culprit():
    """Job 12 was requeued and runs again since T+60 on node1,node2; node1's XID from the
    earlier run (T) must not make node2's fresh XID at T+100 'already requeued by Slurm'."""
    stale = _line(
        f"{_stamp(T)} node1 kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        "kernel",
        "node1",
    )
    fresh = _line(
        f"{_stamp(T + 100)} node2 kernel: NVRM: Xid (PCI:0000:5D:00): 79, GPU has fallen off the bus.",
        "kernel",
        "node2",
    )
    job = {
        "state": "RUNNING",
        "nodes": ["node1", "node2"],
        "start_time": float(T + 60),
        "restarts": 1,
    }
    doc = _run(stale, fresh, job=job)
    assert (doc["onset"], doc["affected_nodes"]) == (T + 100, ["node2"])
    action = decide(
        Diagnosis.from_dict({**doc, "incident_id": "1"}),
        History(
            now=T + 120,
            job=JobView("RUNNING", 1, start_time=T + 60),
            nodes=tuple(NodeView(f"node{i}", "MIXED", ("gpu",)) for i in range(1, 5)),
        ),
        load_policy(),
    )
    assert action.kind == "drain_and_requeue" and "already_requeued_by_slurm" not in action.reasons


def _squeue(monkeypatch, **job):
    """squeue --json answering one job, as the adapter the evidence reads through calls it."""
    from recovery.scheduler.slurm import SlurmScheduler

    doc = {"jobs": [{"job_id": 12, "name": "train", "exit_code": 0, **job}]}
    monkeypatch.setattr(SlurmScheduler, "_run", lambda self, argv: json.dumps(doc))


def test_slurm_evidence_carries_the_runs_start_time(monkeypatch):
    start = time.mktime(time.strptime("2026-11-29T20:41:12", "%Y-%m-%dT%H:%M:%S"))
    _squeue(
        monkeypatch, job_state="RUNNING", restart_cnt=1, nodes="node[1-2]", start_time=int(start)
    )
    facts = slurm_evidence.job_facts("12", 1.0)
    assert facts["start_time"] == start and facts["nodes"] == ["node1", "node2"]


def test_a_fault_after_an_ended_jobs_end_is_not_its_cause():
    """Seen on the local stack: a Slurm exporter restart re-reported an hour of failed jobs
    (GoodputJobFailed); node1's XID of today was pinned on every one of them that had once run
    on node1, and the repeat-offender rule then held a node for 16 invented incidents."""
    xid = _line(
        f"{_stamp(T + 3600)} node1 kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        "kernel",
        "node1",
    )
    ended = {"state": "FAILED", "nodes": ["node1"], "start_time": float(T - 600), "exit_code": 1}
    late = _run(xid, job={**ended, "end_time": float(T)})
    assert late["affected_nodes"] == [] and late["outcome"] != "gpu_hardware_fault", late
    # the same XID a few seconds before (or just after) the job's end is its cause
    for end in (T + 3600 + 5, T + 3600 - 30):
        doc = _run(xid, job={**ended, "end_time": float(end)})
        assert _verdict(doc) == ("gpu_hardware_fault", ["node1"]), doc


def test_slurm_evidence_says_when_an_ended_job_ended(monkeypatch):
    end = 1_795_000_000
    _squeue(monkeypatch, job_state="RUNNING", start_time=end - 86400, end_time=end)
    assert slurm_evidence.job_facts("12", 1.0)["end_time"] is None  # a time limit, not an end
    _squeue(monkeypatch, job_state="FAILED", exit_code=1 << 8, start_time=end - 86400, end_time=end)
    facts = slurm_evidence.job_facts("12", 1.0)
    assert facts["end_time"] == end and facts["exit_code"] == 1


# ------------------------------------------------------- the XID gauge holds the last XID seen


def _xid_doc(*series: Series, start_time: float = T - 6 * 3600) -> dict:
    """An incident at T over [T-900, T+60] for job 12, running since `start_time`."""
    job = {"state": "RUNNING", "nodes": ["node1", "node2"], "start_time": start_time}
    b = Bundle(series=list(series), reports=list(OK), slurm=SlurmFacts(job, {}))
    ctx = Context(job_id="12", nodes=["node1", "node2"], start=T - 900, end=T + 60)
    return attribution.attribute(b, ctx)


def _gauge(node: str, gpu: str, values, start: float = T - 900, name: str = "") -> Series:
    pts = [(start + 15 * i, float(v)) for i, v in enumerate(values)]
    return Series(name or "DCGM_FI_DEV_XID_ERRORS", pts, node=node, gpu=gpu, job_id="12")


def test_an_xid_the_gauge_held_before_the_window_is_no_new_xid():
    """DCGM_FI_DEV_XID_ERRORS holds the last XID seen on the GPU, maybe hours or a job ago.
    Old code read the window's first sample as a new XID, dated after the run's start: a
    gauge still at 79 drained node1 for a job running fine on it for six hours."""
    held = _gauge("node1", "3", [79] * 64)
    doc = _xid_doc(held, _gauge("node2", "0", [0] * 64))
    assert doc["outcome"] != "gpu_hardware_fault" and doc["affected_nodes"] == [], doc
    # the same gauge changing inside the window is an XID, dated where it changed: at the
    # earliest, after the sample before the change, less dcgm-exporter's collection interval
    # (the rule's gap_s, 30 s), which the samples do not show
    for before in (0, 13):  # from no XID, or from an older one
        rose = _gauge("node1", "3", [before] * 40 + [79] * 24)
        doc = _xid_doc(rose, _gauge("node2", "0", [0] * 64))
        assert _verdict(doc) == ("gpu_hardware_fault", ["node1"]), doc
        assert doc["onset"] == T - 900 + 15 * 39 - 30
        seen = [e for e in doc["evidence"] if e["source"] == "prometheus"]
        assert seen[0]["time"] == T - 900 + 15 * 40  # the evidence: the sample that showed it


def test_a_job_series_starts_with_the_gpus_held_xid_but_a_new_gpu_with_its_own():
    """A series labelled with the job (dcgm-exporter's hpc_job) starts when the job does,
    holding the XID the GPU last saw under an earlier job: not this run's XID while the GPU
    reported before it (its presence series). A GPU that appears in the window, seen by no
    series before, reads its first XID as new."""
    presence = _gauge("node1", "3", [100] * 64, name="node_presence")
    others = _gauge("node2", "0", [0] * 64)
    started = T - 600  # the run started inside the window
    job_series = _gauge("node1", "3", [79] * 44, start=started)
    doc = _xid_doc(presence, others, job_series, start_time=started)
    assert doc["outcome"] != "gpu_hardware_fault" and doc["affected_nodes"] == [], doc
    doc = _xid_doc(others, job_series, start_time=started)  # node1's GPU 3 appeared then
    assert _verdict(doc) == ("gpu_hardware_fault", ["node1"]), doc


# ------------------------------------- a fault sampled late, and the peers' reports about it
# The reviewer's cases: XID 79 (GPU off the bus) on node2 at F; the DCGM gauge shows it only
# 30 s later (dcgm-exporter collects every ~30 s, Prometheus scrapes on top of that); node2's
# job writes its error a few seconds after F, and its peers node1, node3, node4 log NCCL's
# `Got completion from peer <node2's address> with error 12` 8 s after F.

F = float(T)  # the fault
NODES4 = ["node1", "node2", "node3", "node4"]
IB_ERROR = (
    "{node}:984:1357 [4] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<45678> with "
    "error 12, opcode 0, len 0, vendor err 129 (Recv)"
)
OOB = "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0."  # + the node's number


def _late_xid(step: float, code: int = 79, shown: float = F + 30) -> Series:
    """node2's XID gauge sampled every `step` s from F-300, 0 until `shown`, then `code`."""
    n = int((shown - (F - 300)) // step)
    pts = [(F - 300 + step * i, 0.0) for i in range(n)] + [(shown, float(code))]
    return Series("DCGM_FI_DEV_XID_ERRORS", pts, node="node2", gpu="3", job_id="12")


def _peers_ib(*nodes: str, at: float = F + 8) -> list[LogLine]:
    return [LogLine(f"job/{n}.log", 1, IB_ERROR.format(node=n), at, n, "12") for n in nodes]


def _incident(lines=(), series=(), job_nodes: list[str] | None = None) -> dict:
    job = {"job_id": "12", "state": "FAILED", "nodes": job_nodes} if job_nodes else {}
    b = Bundle(list(lines), list(series), SlurmFacts(job, {}), list(OK))
    return attribution.attribute(b, Context(job_id="12", nodes=NODES4, start=F - 300, end=F + 300))


def _act(doc: dict):
    """What the default policy, in act mode, does with `doc` for the ended 4-node job."""
    policy = parse_policy({"mode": "act"}, env={})
    spare = tuple(NodeView(f"node{i}", "IDLE", ("gpu",)) for i in range(5, 17))
    job = JobView("FAILED", 0, 1, "gpu", F - 3600, 4, F + 40, tuple(NODES4))
    nodes = tuple(NodeView(n, "ALLOCATED", ("gpu",)) for n in NODES4) + spare
    return decide(Diagnosis.from_dict(doc), History(now=F + 60, job=job, nodes=nodes), policy)


@pytest.mark.parametrize("step", [80.0, 15.0, 5.0])  # the sample before: F-50, F+15, F+25
def test_an_xid_sampled_late_still_explains_its_peers_ib_errors(step):
    """Failed before: the XID was dated at the sample that showed it (F+30), more than
    tolerance_s after the peers' IB errors (F+8), which then stood alone as the root: a
    network fault on node1, node3 and node4 (the survivors) at 0.8, and all three drained. A
    change a sample shows happened after the sample before it, less dcgm-exporter's
    collection interval (the xid rule's gap_s), which Prometheus' finer samples do not show."""
    doc = _incident(_peers_ib("node1", "node3", "node4"), [_late_xid(step)], NODES4)
    assert _verdict(doc) == ("gpu_hardware_fault", ["node2"]), doc["root_cause"]
    assert doc["onset"] <= F
    action = _act(doc)
    assert action.kind == "drain_and_requeue" and action.nodes == ("node2",), action


@pytest.mark.parametrize(
    "text",
    [
        "Fatal Python error: Aborted",
        "Signal 11 (SIGSEGV) received by PID 4242",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ],
)
@pytest.mark.parametrize("step", [80.0, 5.0])
def test_the_jobs_own_error_before_a_late_xid_sample_is_the_gpus_fault(text, step):
    """Failed before: node2's job writes its abort, segfault or illegal memory access 2 s after
    the GPU fell off the bus; the XID, sampled 28 s after that line, no longer explained it,
    and the verdict was workload_crash: the user blamed, no node."""
    line = LogLine("job/node2.log", 1, text, F + 2, "node2", "12")
    doc = _incident([line], [_late_xid(step)])
    assert _verdict(doc) == ("gpu_hardware_fault", ["node2"]), doc["root_cause"]
    assert doc["category"] == "infrastructure"


def test_a_late_xid_sample_is_not_dated_before_the_run():
    """The earliest a change can have happened is never before the job's current run: a change
    sampled in the run stays this run's (as when it was dated at its sample), dated at the
    run's start at the earliest; one sampled before the run is not this run's."""
    series = _late_xid(15.0)
    job = {"job_id": "12", "state": "RUNNING", "nodes": NODES4, "start_time": F + 20}
    b = Bundle(series=[series], slurm=SlurmFacts(job, {}), reports=list(OK))
    doc = attribution.attribute(b, Context(job_id="12", nodes=NODES4, start=F - 300, end=F + 300))
    assert _verdict(doc) == ("gpu_hardware_fault", ["node2"]) and doc["onset"] == F + 20
    b.slurm.job["start_time"] = F + 31  # the run began after the sample that showed it
    doc = attribution.attribute(b, Context(job_id="12", nodes=NODES4, start=F - 300, end=F + 300))
    assert doc["outcome"] != "gpu_hardware_fault", doc["root_cause"]


def test_ib_errors_several_nodes_log_about_their_peer_drain_none_of_them():
    """Failed before: `Got completion from peer <address> with error 12` is written by the
    ranks talking to the end that stopped answering, about it; with node1, node3 and node4
    logging it (no XID), the verdict was network_fault on those three at 0.8, and all three
    were drained. Several nodes reporting a peer are witnesses, not culprits."""
    lines = _peers_ib("node1", "node3", "node4")
    # nothing maps the address, nor lists the job's nodes: no node named, the job restarted
    doc = _incident(lines)
    assert _verdict(doc) == ("network_fault", []), doc["root_cause"]
    assert doc["confidence"] < 0.7 and "name no node" in doc["confidence_basis"]
    action = _act(doc)
    assert action.kind == "requeue" and action.nodes == (), action
    # Slurm lists the job's nodes: node2, the one that logged none of them, is the suspect; by
    # its silence alone, under the policy's drain threshold: a person decides
    doc = _incident(lines, job_nodes=NODES4)
    assert _verdict(doc) == ("network_fault", ["node2"]), doc["root_cause"]
    assert doc["confidence"] < 0.7
    action = _act(doc)
    assert action.kind == "hold_for_person" and not set(action.nodes) & {"node1", "node3", "node4"}


def test_a_peer_address_its_own_nccl_announced_names_it():
    """node2's NCCL announced its out-of-band address at start-up (NCCL_DEBUG=INFO: `OOB
    ib0:10.0.0.2`): the address the peers' lines name is node2's, and node2 is drained."""
    oob = [
        LogLine(f"job/{n}.log", 1, f"{n}:984:984 [0] {OOB}{n[-1]}<0>", F - 200, n, "12")
        for n in NODES4
    ]
    doc = _incident(oob + _peers_ib("node1", "node3", "node4"))
    assert _verdict(doc) == ("network_fault", ["node2"]), doc["root_cause"]
    assert doc["confidence"] == 0.8 and "by the address it announced" in doc["root_cause"]
    action = _act(doc)
    assert action.kind == "drain_and_requeue" and action.nodes == ("node2",), action
    # an address two nodes announce (a container bridge's) names neither
    shared = [dataclasses.replace(ln, text=ln.text.replace("10.0.0.4<", "10.0.0.2<")) for ln in oob]
    doc = _incident(shared + _peers_ib("node1", "node3", "node4"))
    assert _verdict(doc) == ("network_fault", []), doc["root_cause"]


def test_a_peer_error_one_node_alone_logged_stays_its_own():
    """One node alone reporting its peer (its own setup, e.g. a wrong NCCL_SOCKET_IFNAME, as
    often as the peer), and lines that name no peer (a port error), stay the logger's."""
    doc = _incident(_peers_ib("node1"), job_nodes=NODES4)
    assert _verdict(doc) == ("network_fault", ["node1"]) and doc["confidence"] == 0.8
    port_error = "node2:7:7 [0] NCCL WARN NET/IB : Got async event : port error"
    port = LogLine("job/node2.log", 1, port_error, F + 1, "node2", "12")
    doc = _incident([port, *_peers_ib("node1", "node3", "node4")], job_nodes=NODES4)
    assert _verdict(doc) == ("network_fault", ["node2"]) and doc["confidence"] == 0.8
