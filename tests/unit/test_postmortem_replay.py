"""`goodput replay` says what it saw: per job which detectors ran and why not, the baseline's
fitted-at time, peaks and where; plain files with common column names; logs/ read when
job_metrics.csv.gz is missing; --state-dir, --explain, --json; every option validated."""

from __future__ import annotations

import io
import json
import time

import pandas as pd
from typer.testing import CliRunner

from detector import fields as F
from detector.replay import replay
from detector.synthetic import healthy_frame
from goodput.cli import app

runner = CliRunner()
T0 = 1795978800.0
NO_PROGRESS = "no progress seen (no job metrics, or no progress line in the log)"


def _table(frame, names=("timestamp", "node", "gpu", "job_id")):
    df = pd.DataFrame(frame.values[:, : len(F.DCGM_FIELDS)], columns=F.DCGM_FIELDS)
    for i, (col, values) in enumerate(zip(names, (frame.time, frame.node, frame.gpu, frame.job))):
        df.insert(i, col, values)
    return df.drop(columns=[F.XID_FIELD, *F.COUNTERS])  # as a default dcgm-exporter has it


def _recording(path, nodes=1, gpus=2, steps=40, log=None, name="train"):
    f = healthy_frame(jobs=1, nodes=nodes, gpus=gpus, steps=steps, start=T0)
    meta = {
        "start": T0,
        "end": float(f.time.max()),
        "interval_s": 5.0,
        "nodes": sorted(set(f.node)),
        "gpus_per_node": gpus,
        "jobs": [{"job_id": "100", "name": name, "nodes": sorted(set(f.node))}],
    }
    path.mkdir()
    _table(f).to_csv(path / "gpu_metrics.csv.gz", index=False)
    (path / "meta.json").write_text(json.dumps({"format": "goodput-recording/1", **meta}))
    if log:
        (path / "logs" / "jobs").mkdir(parents=True)
        (path / "logs" / "jobs" / "slurm-100.out").write_text("\n".join(log) + "\n")
    return path


def _replay(*args):
    return runner.invoke(app, ["replay", *map(str, args)])


def _summary(tmp_path, *args):
    r = _replay(*args, "--out", tmp_path / "d.jsonl", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_plain_csv_with_common_column_names(tmp_path):
    f = healthy_frame(jobs=1, nodes=1, gpus=4, steps=6, start=T0)
    _table(f, ("ts", "host", "index", "hpc_job")).to_csv(tmp_path / "s.csv", index=False)
    s = replay(tmp_path / "s.csv", io.StringIO())
    assert s["rows"] == 24 and "column 'ts' read as timestamp" in s["inputs"]
    assert "no job metrics in the file: the progress detector has no input" in s["inputs"]


def test_min_score_zero_works_without_an_xid_column(tmp_path):
    rec = _recording(tmp_path / "rec", steps=6)
    r = _replay(rec, "--min-score", "0", "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    hw = [d for d in rows if d["detector"] == "hardware" and d["gpu"] is not None]
    assert hw and hw[0]["reason"] == "no XID and no error counter rise"


def test_a_blind_run_says_why(tmp_path):
    rec = _recording(tmp_path / "rec", nodes=1, gpus=2, steps=24)  # gone before warm-up ends
    job = _summary(tmp_path, rec)["jobs"]["100"]
    d = job["detectors"]
    assert job["baseline"]["fitted_at"] is None
    assert job["baseline"]["status"].startswith(
        "none: the job was seen for 115 s; the first fit needs 24 calm rows over 6 cycles "
        "after the 120 s warm-up (or 300 s)"
    )
    assert not d["deviation"]["ran"] and d["deviation"]["why_not"] == "no baseline yet"
    assert d["peer"]["why_not"] == "2 GPU(s) at a time: peer comparison needs 3"
    assert d["shift"]["why_not"] == "1 node: shift compares the job's nodes (needs 2)"
    assert d["progress"]["why_not"] == NO_PROGRESS
    assert d["hardware"]["why_not"] == "no XID or error-counter field in the input"


def test_a_gpu_model_without_spin_wattage_is_named(tmp_path):
    """With dcgm's default counters (no SM activity) the physics priors see a spin through
    the model's wattage only: a model catalogue/priors.yaml lacks it for is named."""
    f = healthy_frame(jobs=1, nodes=1, gpus=2, steps=6, start=T0)
    notes = {}
    for model in ("NVIDIA A40", "NVIDIA A100-SXM4-80GB"):
        df = _table(f).drop(columns=["DCGM_FI_PROF_SM_ACTIVE"]).assign(modelName=model)
        df.to_csv(tmp_path / "s.csv", index=False)
        notes[model] = replay(tmp_path / "s.csv", io.StringIO())["jobs"]["100"]["physics_note"]
    assert notes["NVIDIA A40"].startswith("physics: no spin wattage for NVIDIA A40 in ")
    assert notes["NVIDIA A100-SXM4-80GB"] is None
    df = _table(f).assign(modelName="NVIDIA A40")  # SM activity reported: the spin is seen
    df.to_csv(tmp_path / "s.csv", index=False)
    assert replay(tmp_path / "s.csv", io.StringIO())["jobs"]["100"]["physics_note"] is None
    _table(f).drop(columns=["DCGM_FI_PROF_SM_ACTIVE"]).to_csv(tmp_path / "s.csv", index=False)
    note = replay(tmp_path / "s.csv", io.StringIO())["jobs"]["100"]["physics_note"]
    assert "an unknown model (no modelName in the input)" in note  # the generic priors


def test_a_seeing_run_has_its_fit_time_and_peaks(tmp_path):
    rec = _recording(tmp_path / "rec", nodes=2, gpus=4, steps=100)
    job = _summary(tmp_path, rec)["jobs"]["100"]
    # 8 GPUs learn every cycle: the first fit comes 6 cycles after the 120 s warm-up, each
    # cycle's rows learned once the job stayed calm 30 s after them
    assert job["baseline"]["fitted_at"] >= job["first_fit"] >= T0 + 120 + 25 + 30
    assert job["first_fit"] < T0 + 300
    assert job["baseline"]["status"].startswith("first fitted 175 s after the job was first seen")
    d = job["detectors"]
    assert d["deviation"]["ran"] and d["peer"]["ran"] and d["shift"]["ran"]
    peak = d["peer"]["peak"]
    assert peak["score"] > 0 and peak["node"] in ("node1", "node2") and peak["time"] >= T0


def _log(steps: int) -> list[str]:
    out = []
    for i in range(steps):
        t = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0 + 5 * i))
        out.append(
            f"[{t}.000]  iteration {i + 1:8d}/ 1000 | consumed samples: {(i + 1) * 8} | "
            "elapsed time per iteration (ms): 500.0 | lm loss: 1.0E+00 |"
        )
    return out


def test_job_metrics_are_derived_from_the_recordings_logs(tmp_path):
    rec = _recording(tmp_path / "rec", steps=20, log=_log(20))
    s = _summary(tmp_path, rec)
    assert any(
        "job metrics derived from logs/jobs/slurm-100.out (20 samples)" in n for n in s["inputs"]
    )
    assert s["jobs"]["100"]["detectors"]["progress"]["ran"]
    bare = _recording(tmp_path / "bare", steps=20)
    s = _summary(tmp_path, bare)
    assert any("no job_metrics.csv.gz and no logs/jobs/slurm-100.out" in n for n in s["inputs"])


def test_state_dir_saves_then_loads_baselines(tmp_path):
    state = tmp_path / "state"
    long = _recording(tmp_path / "long", nodes=2, gpus=4, steps=100)
    _summary(tmp_path, long, "--state-dir", state)
    assert (state / "train.json").is_file()
    short = _recording(tmp_path / "short", nodes=2, gpus=4, steps=10)
    job = _summary(tmp_path, short, "--state-dir", state)["jobs"]["100"]
    assert job["baseline"]["loaded"] and job["baseline"]["status"].startswith("loaded")
    assert job["detectors"]["deviation"]["ran"]


def test_explain_and_the_table(tmp_path):
    rec = _recording(tmp_path / "rec", steps=6)
    r = _replay(rec, "--out", tmp_path / "d.jsonl", "--explain", "100")
    assert r.exit_code == 0, r.output
    assert "job 100 (train): 1 node(s), 2 GPU(s)" in r.output
    assert "peer       no   2 GPU(s) at a time: peer comparison needs 3" in r.output


def test_explain_of_a_missing_job_fails_before_the_replay(tmp_path, monkeypatch):
    """Before, a mistyped job id was reported only after the whole replay had run (minutes
    on a day of 10,000 GPUs), and the run's output file was replaced meanwhile."""
    import detector.replay

    def no_replay(*_a, **_k):
        raise AssertionError("the replay ran")

    monkeypatch.setattr(detector.replay, "steps", no_replay)
    rec = _recording(tmp_path / "rec", steps=6)
    (tmp_path / "d.jsonl").write_text("kept\n")
    r = _replay(rec, "--out", tmp_path / "d.jsonl", "--explain", "7")
    assert r.exit_code == 2 and "no job 7 in the recording; jobs: ['100']" in r.output
    assert (tmp_path / "d.jsonl").read_text() == "kept\n"


def test_options_are_validated(tmp_path):
    rec = _recording(tmp_path / "rec", steps=3)
    for bad in ("-1", "nan", "inf"):
        r = _replay(rec, "--min-score", bad, "--out", tmp_path / "d.jsonl")
        assert r.exit_code == 2 and "--min-score" in r.output and "Traceback" not in r.output
    r = _replay(rec, "--out", tmp_path / "no" / "d.jsonl")
    assert r.exit_code == 2 and "does not exist" in r.output
    (tmp_path / "f").write_text("")
    r = _replay(rec, "--state-dir", tmp_path / "f", "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 2 and "not a directory" in r.output
    r = _replay(tmp_path / "nothing.csv", "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 2 and "no such file" in r.output


def test_usage_lines_show_no_phantom_subcommand():
    for cmd in ("replay", "attribute", "import", "export-recording"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "COMMAND [ARGS]" not in r.output, r.output
    usage = runner.invoke(app, ["replay", "--help"]).output.split("Usage:")[1].splitlines()[0]
    assert "replay [OPTIONS]" in usage and "RECORDING" in usage


def test_gpus_whose_timestamps_do_not_line_up_are_put_on_one_grid(tmp_path):
    """Per-node logs (nvidia-smi on each host) never share their timestamps: replayed as
    they are, each instant would hold one node, and the peer and job-wide detectors would
    never compare the job's GPUs. Moved to one 5 s grid, every instant holds all four."""
    f = healthy_frame(jobs=1, nodes=2, gpus=2, steps=24, start=T0)
    df = _table(f)
    df.loc[df.node == "node2", "timestamp"] += 1.3  # node2's clock samples 1.3 s later
    df.to_csv(tmp_path / "s.csv", index=False)
    s = replay(tmp_path / "s.csv", io.StringIO())
    assert s["instants"] == 24 and s["interval_s"] == 5.0 and s["rows"] == 96
    assert any("timestamps do not line up (48 distinct times)" in n for n in s["inputs"])
    assert s["jobs"]["100"]["detectors"]["peer"]["ran"]  # before: "2 GPU(s) at a time"
    _table(f).to_csv(tmp_path / "a.csv", index=False)  # on one grid: as it is
    a = replay(tmp_path / "a.csv", io.StringIO())
    assert a["instants"] == 24 and not any("line up" in n for n in a["inputs"])


def test_a_job_log_without_progress_is_not_called_absent(tmp_path):
    """A job whose log never logged a step was said to have "no job metrics and no job log"."""
    rec = _recording(tmp_path / "rec", steps=6, log=["[2026-11-29 19:00:00] loading data"])
    s = _summary(tmp_path, rec)
    assert any("derived from logs/jobs/slurm-100.out (0 samples)" in n for n in s["inputs"])
    assert s["jobs"]["100"]["detectors"]["progress"]["why_not"] == NO_PROGRESS


def test_a_file_whose_rows_name_no_job_is_refused(tmp_path):
    """The detectors score jobs: a file without a job column printed "0 detections", exit 0,
    as a healthy run would."""
    f = healthy_frame(jobs=1, nodes=1, gpus=2, steps=6, start=T0)
    _table(f).drop(columns=["job_id"]).to_csv(tmp_path / "nojob.csv", index=False)
    r = _replay(tmp_path / "nojob.csv", "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert (
        f"replay: {tmp_path / 'nojob.csv'}: no row names a job (accepted job columns:" in r.output
    )
    assert "goodput import --node NAME --job-id ID" in r.output
