"""`goodput attribute` says what it used: the job chosen and why (never silently from ground
truth), what each source held, meta.json's GPUs per node, `unknown` when evidence is missing,
and a usage error when there is no evidence at all."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from goodput.cli import app
from recovery.evidence import recording as rec
from tests.h200 import import_h200

runner = CliRunner()
XID = "NVRM: Xid (PCI:0000:2b:00): 79, pid=1234, GPU has fallen off the bus."


def _attr(*args):
    return runner.invoke(app, ["attribute", *map(str, args)])


def _two_jobs(path: Path, truth: bool = True) -> Path:
    path.mkdir()
    meta = {
        "format": "goodput-recording/1",
        "start": 0,
        "end": 100,
        "nodes": ["n1", "n2"],
        "gpus_per_node": 4,
        "jobs": [
            {"job_id": "11", "name": "a", "nodes": ["n1"]},
            {"job_id": "12", "name": "b", "nodes": ["n2"]},
        ],
    }
    (path / "meta.json").write_text(json.dumps(meta))
    if truth:
        (path / "truth.json").write_text(json.dumps({"faults": [{"job_id": "12"}]}))
    (path / "logs" / "kernel").mkdir(parents=True)
    (path / "logs" / "kernel" / "n2.log").write_text(f"2025-01-01T00:00:50Z {XID}\n")
    return path


def test_several_jobs_and_no_job_id_is_a_usage_error_listing_them(tmp_path):
    r = _attr("--recording", _two_jobs(tmp_path / "rec"))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "holds 2 jobs; pick one with --job-id: 11 (a), 12 (b)" in r.output
    r = _attr("--recording", tmp_path / "rec", "--job-id", "13")
    assert r.exit_code == 2 and "job 13 is not in rec; its jobs: 11 (a), 12 (b)" in r.output


def test_the_job_given_is_used_and_said(tmp_path):
    r = _attr("--recording", _two_jobs(tmp_path / "rec"), "--job-id", "12")
    assert r.exit_code == 0, r.output
    assert "job: 12 (given with --job-id)" in r.stderr
    assert "GPUs per node: 4 (meta.json)" in r.stderr
    assert "logs: ok: logs/jobs/slurm-12.out: absent; logs/kernel/n2.log: 1 lines" in r.stderr
    assert json.loads(r.stdout)["job_id"] == "12"


def test_one_job_is_picked_and_said(tmp_path):
    out = tmp_path / "rec"
    r = import_h200(out)
    assert r.exit_code == 0, r.output
    r = _attr("--recording", out)
    assert r.exit_code == 0, r.output
    assert "job: 4242 (the only job in rec)" in r.stderr
    assert "GPUs per node: 1 (meta.json)" in r.stderr
    assert "slurm: ok: meta.json: job 4242 COMPLETED, exit code 0" in r.stderr
    assert (
        "prometheus: ok: gpu_metrics.csv.gz: 13 metric(s) of job 4242; job_metrics.csv.gz: 9"
        in (r.stderr)
    )
    doc = json.loads(r.stdout)
    assert doc["outcome"] == "healthy"


def test_missing_evidence_gives_unknown_with_the_reason(tmp_path):
    r = _attr("--recording", _two_jobs(tmp_path / "rec"), "--job-id", "11")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["outcome"] == "unknown"
    assert "[evidence missing: prometheus, logs, slurm]" in r.stderr
    reports = {c["connector"]: c for c in doc["connector_reports"]}
    assert reports["logs"]["reason"] == "logs/jobs/slurm-11.out: absent; logs/kernel/n1.log: absent"


def test_no_evidence_at_all_is_a_usage_error(tmp_path):
    r = _attr()
    assert r.exit_code == 2 and "no evidence: give --recording DIR, --job-log FILE" in r.output
    r = _attr("--job-log", tmp_path / "nope.out")
    assert r.exit_code == 2 and "no such file" in r.output
    r = _attr("--recording", tmp_path / "rec", "--gpus-per-node", "0")
    assert r.exit_code == 2
    (tmp_path / "empty").mkdir()  # a directory that holds no recording: not `unknown`, exit 0
    r = _attr("--recording", tmp_path / "empty")
    assert r.exit_code == 2 and "not a recording (none of meta.json, logs," in r.output


def test_files_alone_take_the_job_from_the_log_name(tmp_path):
    log = tmp_path / "slurm-77.out"
    log.write_text("[2025-01-01 00:00:01] torch.OutOfMemoryError: CUDA out of memory.\n")
    r = _attr("--job-log", log)
    assert r.exit_code == 0, r.output
    assert "job: 77 (from the job log's name (slurm-77.out))" in r.stderr
    assert json.loads(r.stdout)["job_id"] == "77"


def test_a_log_alone_with_no_signature_says_what_the_verdict_lacks(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    r = _attr("--job-log", log)
    assert r.exit_code == 0 and json.loads(r.stdout)["outcome"] == "unknown"
    assert "[evidence missing: metrics (none given: a --recording holds them), slurm" in r.stderr


def test_a_gzipped_job_log_is_read(tmp_path):
    """A rotated `.gz` job log gives the verdict its text gives (it was read as raw bytes:
    `unknown`, "logs: ok")."""
    import gzip

    log = tmp_path / "slurm-77.out.gz"
    log.write_bytes(
        gzip.compress(b"[2025-01-01 00:00:01] torch.OutOfMemoryError: CUDA out of memory.\n")
    )
    r = _attr("--job-log", log)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["outcome"] == "workload_oom" and "job: 77 " in r.stderr
    log.write_bytes(log.read_bytes()[:12])
    r = _attr("--job-log", log)
    assert r.exit_code == 2 and "not a readable gzip file" in r.output


def test_choose_job_never_reads_truth(tmp_path):
    d = _two_jobs(tmp_path / "rec", truth=True)
    try:
        rec.choose_job(d, None)
    except ValueError as exc:
        assert "pick one with --job-id" in str(exc)
    else:
        raise AssertionError("several jobs must not be resolved from truth.json")


def test_meta_gpus_per_node_reaches_the_attribution(tmp_path, monkeypatch):
    from recovery import attribution

    seen = []
    real = attribution.attribute

    def spy(bundle, ctx, **kw):
        seen.append(kw["gpus_per_node"])
        return real(bundle, ctx, **kw)

    monkeypatch.setattr(attribution, "attribute", spy)
    d = _two_jobs(tmp_path / "rec")
    assert _attr("--recording", d, "--job-id", "12").exit_code == 0
    assert _attr("--recording", d, "--job-id", "12", "--gpus-per-node", "2").exit_code == 0
    assert seen == [4, 2]  # meta.json's 4, then the option's 2 (the old default was always 8)


def test_a_node_the_jobs_log_names_is_blamed_when_meta_lists_it(tmp_path):
    """A recording whose meta.json has the job's nodes but no state: the nodes still bound
    which node a log line may blame (none was, once lines could name only the job's nodes)."""
    d = _two_jobs(tmp_path / "rec", truth=False)
    (d / "logs" / "jobs").mkdir()
    (d / "logs" / "jobs" / "slurm-11.out").write_text(
        "2025-01-01T00:00:40Z srun: error: Node failure on n1\n"
        "2025-01-01T00:00:41Z srun: error: Node failure on n2\n"  # not job 11's node
    )
    r = _attr("--recording", d, "--job-id", "11")
    doc = json.loads(r.stdout)
    assert doc["outcome"] == "node_lost" and doc["affected_nodes"] == ["n1"], r.stderr
