"""Attribution stages on small hand-made evidence; adding a signature is one YAML rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery import attribution, diagnosis
from recovery.evidence import Bundle, Context, LogLine, Report
from recovery.evidence.logs import line_time

ROOT = Path(__file__).resolve().parents[2]


def _ctx(**kw):
    return Context(
        job_id=kw.pop("job_id", "12"),
        nodes=kw.pop("nodes", ["node1", "node2"]),
        start=0.0,
        end=2e9,
        **kw,
    )


def _line(text, kind="job", node=None):
    return LogLine(
        path=f"{kind}.log", line=1, text=text, time=line_time(text, 2026), node=node, kind=kind
    )


def _run(*lines):
    b = Bundle(
        lines=list(lines),
        reports=[Report("logs", "ok"), Report("prometheus", "ok"), Report("slurm", "ok")],
    )
    return attribution.attribute(b, _ctx())


NCCL = (
    "[rank0]:[E0101 00:10:00.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
)


def test_signatures_live_in_the_catalogue():
    """catalogue/patterns.yaml's cuda_nvlink_uncorrectable: 'uncorrectable NVLink error' →
    gpu_hardware_fault on the rank's node (it used to be a second copy in the rules)."""
    doc = _run(
        _line(
            "[rank9]: RuntimeError: CUDA error: uncorrectable NVLink error detected "
            "during the execution",
            node="node2",
        ),
        _line(NCCL),
    )
    assert doc["outcome"] == "gpu_hardware_fault" and doc["affected_nodes"] == ["node2"]
    assert any(s["id"] == "nvlink_fatal" and s["role"] == "initiating" for s in doc["symptoms"])
    assert not (ROOT / "recovery" / "rules" / "signatures.yaml").exists()


@pytest.mark.parametrize(
    "entry,message",
    [
        ("{symptom: nvlink_fatal, regex: 'NVLink'}", "signatures live in catalogue/patterns.yaml"),
        ("{symptom: cuda_error, role: cascade}", "names a catalogue `pattern` id"),
        ("{pattern: no_such_pattern, role: cascade}", "unknown catalogue pattern"),
    ],
)
def test_log_rules_only_override_catalogue_patterns(tmp_path, entry, message):
    for f in (ROOT / "recovery" / "rules").glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "zz_local.yaml").write_text(f"log:\n  - {entry}\n")
    with pytest.raises(attribution.RuleError, match=message):
        attribution.load_rules(str(tmp_path))


def test_nccl_timeout_alone_is_never_a_confident_root():
    doc = _run(_line(NCCL))
    assert doc["outcome"] == "unknown" and doc["confidence"] <= 0.5


def test_cascade_never_root_when_initiating_exists():
    oom = (
        "[rank3]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 3 has a total capacity of 139.81 GiB of which 1.06 GiB is free."
    )
    stamped = "[2026-01-01 00:20:00] " + oom  # the OOM is logged after the NCCL timeout
    doc = _run(_line(NCCL), _line(stamped))
    assert doc["outcome"] == "workload_oom" and doc["affected_nodes"] == []
    roles = {s["id"]: s["role"] for s in doc["symptoms"]}
    assert roles["nccl_timeout"] == "cascade" and roles["gpu_oom"] == "initiating"


def test_xid43_is_cascade_and_earlier_xid_wins():
    k = "2026-01-01T00:00:0{}+0000 node2 kernel: NVRM: Xid (PCI:0000:2b:00): {}, pid=1, name=p, x"
    doc = _run(_line(k.format(1, 48), "kernel", "node2"), _line(k.format(2, 43), "kernel", "node2"))
    assert doc["outcome"] == "gpu_hardware_fault"
    roles = {s["id"]: s["role"] for s in doc["symptoms"]}
    assert roles["xid_cascade"] == "cascade"


def test_missing_sources_lower_confidence():
    line = _line(
        "2026-01-01T00:00:01+0000 node2 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU "
        "has fallen off the bus.",
        "kernel",
        "node2",
    )
    full = _run(line)
    partial = attribution.attribute(Bundle(lines=[line], reports=[Report("logs", "ok")]), _ctx())
    assert partial["outcome"] == full["outcome"] == "gpu_hardware_fault"
    assert partial["confidence"] < full["confidence"]
    assert "unavailable source" in partial["confidence_basis"]


PROGRESS = " iteration      120/  500000 | consumed samples: 61440 | lm loss: 2.345678E+00 |"


def test_healthy_and_unknown():
    assert _run(_line("training ..."), _line(PROGRESS))["outcome"] == "healthy"
    b = Bundle(lines=[_line(PROGRESS)])
    assert attribution.attribute(b, _ctx(alerts=[{"alertname": "X"}]))["outcome"] == "unknown"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("2024-05-18T19:02:39+0000 node1 kernel: x", 1716058959.0),
        (" [2024-05-18 19:02:39] iteration 5/10 |", 1716058959.0),
        ("May 18 19:02:39 node1 kernel: NVRM", 1716058959.0),
        ("[rank0]:[E0518 19:02:39.500000000 ProcessGroupNCCL.cpp:607] x", 1716058959.5),
        ("no time here", None),
    ],
)
def test_line_time(text, expected):
    assert line_time(text, 2024) == expected


def test_schema_file_matches_models():
    on_disk = json.loads((ROOT / "docs" / "diagnosis.schema.json").read_text())
    assert on_disk == json.loads(json.dumps(diagnosis.json_schema()))


def test_hostile_ids_never_reach_paths():
    with pytest.raises(ValueError):
        Context(job_id="../../etc/passwd", nodes=[], start=0, end=1)
    with pytest.raises(ValueError):
        Context(job_id="1", nodes=["node1; rm -rf /"], start=0, end=1)


def test_a_rank_maps_to_the_jobs_node_list_not_the_alert_order():
    from recovery.evidence import SlurmFacts

    ecc = (
        "[rank9]:[E0101 00:10:00.408271257 ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID 0"
        "(default_pg) Rank 9] Process group watchdog thread terminated with exception: CUDA "
        "error: uncorrectable ECC error encountered"
    )
    reports = [Report("logs", "ok"), Report("prometheus", "ok"), Report("slurm", "ok")]
    b = Bundle(lines=[_line(ecc)], reports=reports)
    b.slurm = SlurmFacts(job={"job_id": "12", "nodes": ["node1", "node2"]})
    # an alert on node2 arrived first, so the context lists node2 before node1
    doc = attribution.attribute(b, _ctx(nodes=["node2", "node1"]))
    assert doc["outcome"] == "gpu_hardware_fault" and doc["affected_nodes"] == ["node2"]
    # without Slurm's node list the rank's node is unknown: nothing is blamed on a guess
    without_slurm = attribution.attribute(Bundle(lines=[_line(ecc)], reports=reports), _ctx())
    assert without_slurm["affected_nodes"] == []
    b.slurm = SlurmFacts(job={"job_id": "12", "nodes": ["node1", "bad node;rm"]})
    assert attribution.attribute(b, _ctx())["affected_nodes"] == []  # an invalid name is dropped


def test_a_node_a_jobs_own_output_names_is_blamed_only_when_the_job_ran_there():
    """A job's output is its owner's text: `srun: error: Node failure on victim01` printed by
    a job on node1 and node2 must not get victim01 drained (it did, at confidence 0.9)."""
    from recovery.evidence import SlurmFacts

    reports = [Report("logs", "ok"), Report("prometheus", "ok"), Report("slurm", "ok")]

    def blamed(text: str) -> list[str]:
        b = Bundle(lines=[_line(text)], reports=reports)
        b.slurm = SlurmFacts(job={"job_id": "12", "nodes": ["node1", "node2"]})
        return attribution.attribute(b, _ctx())["affected_nodes"]

    assert blamed("srun: error: Node failure on victim01") == []
    assert blamed("srun: error: Node failure on node2") == ["node2"]
    unknown = Bundle(lines=[_line("srun: error: Node failure on node2")], reports=reports)
    assert attribution.attribute(unknown, _ctx())["affected_nodes"] == []  # no node list


def test_a_long_line_is_clipped_at_a_word_and_marked():
    from recovery.attribution.model import clip

    oom = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 79.11 GiB of which 1 is free"
    assert clip(oom, 200) == oom
    assert clip(oom, 60) == "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has…"
    assert clip("x" * 300, 240) == "x" * 239 + "…"  # no space near: cut where it is
