"""`goodput import`: a user's files -> a recording, on the real H200 cut and on each accepted
shape (long tables, nvidia-smi CSV, Prometheus JSON, kernel and Slurm formats); every refusal
names the file, the column and what would be accepted, with exit 2 and no traceback."""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from catalogue import CatalogueError, xid_info
from catalogue.columns import load as load_columns
from detector import samples
from exporters import importer
from goodput.cli import app
from tests.h200 import DATA, import_h200

runner = CliRunner()


def _import(*args: str):
    return runner.invoke(app, ["import", *args])


def test_the_real_h200_cut_becomes_a_recording(tmp_path):
    out = tmp_path / "rec"
    r = import_h200(out)
    assert r.exit_code == 0, r.output
    assert "column 'ts' read as timestamp" in r.output
    assert "column 'gpm_sm_active' read as DCGM_FI_PROF_SM_ACTIVE x 0.01" in r.output
    meta = json.loads((out / "meta.json").read_text())
    assert meta["format"] == "goodput-recording/1" and meta["source"] == "import"
    assert meta["gpus_per_node"] == 1 and meta["interval_s"] == 0.25
    job = meta["jobs"][0]
    assert (job["job_id"], job["state"], job["exit_code"], job["restarts"]) == (
        "4242",
        "COMPLETED",
        0,
        1,
    )
    gpu = pd.read_csv(out / "gpu_metrics.csv.gz", dtype={"job_id": str})
    assert len(gpu) == 822 and set(gpu.node) == {"h200a"} and set(gpu.gpu) == {0}
    # the idle GPU before the job started is not the job's
    assert gpu.loc[gpu.timestamp < 1795978886.333, "job_id"].isna().all()
    assert gpu.DCGM_FI_PROF_SM_ACTIVE.max() <= 1.0 < gpu.DCGM_FI_DEV_GPU_UTIL.max()
    jobs = pd.read_csv(out / "job_metrics.csv.gz", dtype={"job_id": str})
    # derived by the production parser: the second run restarts at iteration 1
    assert jobs.goodput_job_iteration.max() >= 1000
    assert jobs.goodput_job_iteration.iloc[-1] < 700
    assert jobs.goodput_job_last_checkpoint_timestamp_seconds.notna().any()
    assert (out / "logs" / "jobs" / "slurm-4242.out").read_text().count("\n") == 1857


def test_errors_name_the_file_the_column_and_what_is_accepted(tmp_path):
    bad = tmp_path / "dcgm.csv"
    bad.write_text("when,DCGM_FI_DEV_GPU_UTIL\n1,99\n")
    r = _import("--metrics", str(bad), "--job-id", "1", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{bad}: no time column" in r.output and "accepted: timestamp, Timestamp, ts" in r.output
    bad.write_text("ts,gpu,DCGM_FI_DEV_GPU_UTIL\n1,0,99\n")
    r = _import("--metrics", str(bad), "--job-id", "1", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "no node column (accepted: node, Hostname, hostname" in r.output
    assert "pass --node NAME to goodput import" in r.output
    bad.write_text("ts,host,gpu,DCGM_FI_DEV_GPU_UTIL\nyesterday,n1,0,99\n")
    r = _import("--metrics", str(bad), "--job-id", "1", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "column 'timestamp': cannot read 'yesterday'" in r.output
    bad.write_text("ts,host,gpu,temp\n1,n1,0,40\n")
    r = _import("--metrics", str(bad), "--job-id", "1", "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "no metric column" in r.output
    r = _import(
        "--metrics", str(DATA / "metrics.csv"), "--node", "h200a", "--out", str(tmp_path / "o")
    )
    assert r.exit_code == 2 and "no job id: pass --job-id or --slurm" in r.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    r = _import("--metrics", str(DATA / "metrics.csv"), "--out", str(tmp_path / "full"))
    assert r.exit_code == 2 and "not an empty directory" in r.output


def test_long_table_with_uuids_and_units(tmp_path):
    rows = []
    for t in (1700000000000, 1700000005000):  # milliseconds
        for uuid, util in (("GPU-b", 50), ("GPU-a", 99)):
            rows.append(
                {
                    "time": t,
                    "Hostname": "gn1",
                    "UUID": uuid,
                    "metric": "utilization.gpu",
                    "value": f"{util} %",
                }
            )
            rows.append(
                {
                    "time": t,
                    "Hostname": "gn1",
                    "UUID": uuid,
                    "metric": "power.draw",
                    "value": "690.5 W",
                }
            )
    got = samples.normalise(pd.DataFrame(rows), "long.csv", job_id="9")
    df = got.gpu
    assert list(df.timestamp.unique()) == [1700000000.0, 1700000005.0]
    assert "timestamps read as unix ms" in got.notes
    # GPUs numbered per node in UUID order: GPU-a is 0
    assert df[df.gpu == 0].DCGM_FI_DEV_GPU_UTIL.tolist() == [99.0, 99.0]
    assert df.DCGM_FI_DEV_POWER_USAGE.eq(690.5).all() and set(df.job_id) == {"9"}


def test_nvidia_smi_csv(tmp_path):
    p = tmp_path / "smi.csv"
    p.write_text(
        "timestamp, name, index, utilization.gpu [%], power.draw [W], clocks_event_reasons.active\n"
        "2026/11/29 19:01:37.728, NVIDIA H200, 0, 99 %, 690.12 W, 0x0000000000000001\n"
        "2026/11/29 19:01:37.728, NVIDIA H200, 1, [N/A], 80.00 W, 0x0000000000000004\n"
    )
    got = samples.read(p, node="h1")
    df = got.gpu
    assert df.modelName.tolist() == ["NVIDIA H200"] * 2  # the priors of the GPU's model
    assert df.timestamp.iloc[0] == pytest.approx(1795978897.728)
    assert "timestamps without a zone read as UTC" in got.notes
    assert df.DCGM_FI_DEV_GPU_UTIL.tolist()[0] == 99.0 and pd.isna(df.DCGM_FI_DEV_GPU_UTIL[1])
    assert df.DCGM_FI_DEV_CLOCKS_EVENT_REASONS.tolist() == [1.0, 4.0]


def test_prometheus_json_with_job_series(tmp_path):
    def series(name, labels, vals):
        return {"metric": {"__name__": name, **labels}, "values": vals}

    doc = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                series(
                    "DCGM_FI_DEV_GPU_UTIL",
                    {"hostname": "n1", "gpu": "0", "hpc_job": "5"},
                    [[10, "99"], [15, "98"]],
                ),
                series(
                    "goodput_job_iteration_seconds", {"job_id": "5"}, [[10, "0.5"], [15, "0.6"]]
                ),
            ],
        },
    }
    p = tmp_path / "q.json"
    p.write_text(json.dumps(doc))
    got = samples.read(p)
    assert got.gpu.DCGM_FI_DEV_GPU_UTIL.tolist() == [99.0, 98.0]
    assert got.jobs is not None and got.jobs.goodput_job_iteration_seconds.tolist() == [0.5, 0.6]
    p.write_text('{"status": "error"}')
    with pytest.raises(samples.SampleError, match="not a Prometheus answer"):
        samples.read(p)


REF = 1795979000.0  # a time near the logs (for stamps without a year)
XID = "NVRM: Xid (PCI:0000:2b:00): 79, pid=1234, GPU has fallen off the bus."


def test_kernel_logs_get_a_time_in_front():
    lines, kinds = importer.kernel_lines([f"[Sun Nov 29 19:01:37 2026] {XID}"], "k.log", REF)
    assert lines[0].startswith("2026-11-29T19:01:37.000Z [Sun") and kinds == {"ctime": 1}
    lines, _ = importer.kernel_lines([f"[  100.250000] {XID}"], "k.log", REF, 1795978000.0)
    assert lines[0].startswith("2026-11-29T18:48:20.250Z")
    with pytest.raises(importer.ImportFailure, match=r"k.log:1: time since boot.*--boot-time"):
        importer.kernel_lines([f"[  100.250000] {XID}"], "k.log", REF)
    rec = {"__REALTIME_TIMESTAMP": "1795978897728000", "MESSAGE": XID, "_HOSTNAME": "n1"}
    lines, _ = importer.kernel_lines([json.dumps(rec)], "j.json", REF)
    assert lines == [f"2026-11-29T19:01:37.728Z {XID}"]
    lines, kinds = importer.kernel_lines([f"Nov 29 19:01:37 n1 kernel: {XID}"], "s.log", REF)
    assert lines[0].startswith("2026-11-29T19:01:37.000Z Nov 29") and kinds == {"syslog": 1}


def test_kernel_log_import_is_read_by_attribution(tmp_path):
    k = tmp_path / "h200a.log"
    k.write_text(f"[Sun Nov 29 19:03:00 2026] {XID}\n")
    out = tmp_path / "rec"
    r = import_h200(out, "--kernel-log", str(k), job_log=False)
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["attribute", "--recording", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["outcome"] == xid_info(79).outcome and doc["affected_nodes"] == ["h200a"]
    assert doc["evidence"][0]["query_or_path"].endswith("logs/kernel/h200a.log")
    assert doc["evidence"][0]["time"] == 1795978980.0  # the dmesg -T time, carried through


def test_slurm_state_formats():
    sacct = {
        "jobs": [
            {
                "job_id": 77,
                "name": "gpt",
                "state": {"current": ["NODE_FAIL"]},
                "exit_code": {"status": ["FAILED"], "return_code": {"number": 1}},
                "nodes": "gn[1-2]",
                "time": {"start": 100, "end": 200},
            }
        ]
    }
    got = importer.slurm_state(json.dumps(sacct), "sacct.json")
    assert got == {
        "job_id": "77",
        "name": "gpt",
        "state": "NODE_FAIL",
        "exit_code": 1,
        "nodes": ["gn1", "gn2"],
        "start": 100.0,
        "end": 200.0,
    }
    squeue = {"jobs": [{"job_id": 8, "name": "a", "job_state": "RUNNING", "nodes": "gn3"}]}
    assert importer.slurm_state(json.dumps(squeue), "q.json")["state"] == "RUNNING"
    piped = "9|train|gpu|FAILED|1:0|gn[4-5]|gres/gpu=16"
    assert importer.slurm_state(piped, "sacct.txt")["nodes"] == ["gn4", "gn5"]
    assert importer.slurm_state("job_id=3\nstate=failed\nexit_code=0:9\n", "s") == {
        "job_id": "3",
        "state": "FAILED",
        "exit_code": 137,
    }
    with pytest.raises(importer.ImportFailure, match="s.txt: no job state; accepted"):
        importer.slurm_state("hello", "s.txt")


def test_a_slurm_file_of_several_jobs_gives_the_one_asked_for():
    """`sacct --json` or `sacct -P` of a day holds several jobs: the one --job-id names (the
    first was taken before, and a --job-id of the second refused as a mismatch); none named,
    the file's jobs are listed."""
    sacct = {
        "jobs": [
            {"job_id": n, "name": f"j{n}", "state": {"current": [st]}, "nodes": f"gn{n}"}
            for n, st in ((4241, "COMPLETED"), (4242, "FAILED"))
        ]
    }
    text = json.dumps(sacct)
    assert importer.slurm_state(text, "a.json", "4242")["state"] == "FAILED"
    with pytest.raises(importer.ImportFailure, match="a.json holds jobs 4241, 4242: pass --job-id"):
        importer.slurm_state(text, "a.json")
    with pytest.raises(importer.ImportFailure, match="a.json has no job 9 .it holds 4241, 4242"):
        importer.slurm_state(text, "a.json", "9")
    piped = "9|a|gpu|FAILED|1:0|gn4|gres/gpu=8\n10|b|gpu|COMPLETED|0:0|gn5|gres/gpu=8"
    assert importer.slurm_state(piped, "s.txt", "10")["nodes"] == ["gn5"]


def test_job_log_without_timestamps_is_refused():
    line = " iteration 10/ 100 | consumed samples: 80 | elapsed time per iteration (ms): 500.0 |"
    with pytest.raises(importer.ImportFailure, match="job.log: no line carries a timestamp"):
        importer.job_metrics([line], "1", [1.0], "job.log")


def test_the_alias_table_refuses_a_name_listed_twice(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "catalogue" / "columns.yaml").read_text()
    bad = tmp_path / "columns.yaml"
    bad.write_text(text.replace("[gpu, gpu_index,", "[gpu, ts, gpu_index,"))
    with pytest.raises(CatalogueError, match="'ts' is listed twice"):
        load_columns(bad)


def test_written_recording_keeps_millisecond_timestamps(tmp_path):
    out = tmp_path / "rec"
    r = import_h200(out, "--job-id", "5", job_log=False, slurm=False)
    assert r.exit_code == 0, r.output
    with gzip.open(out / "gpu_metrics.csv.gz", "rt") as fh:
        fh.readline()
        assert fh.readline().startswith("1795978878.334,h200a,0,5,")
    assert "no job metrics (no --job-log)" in r.output


def test_import_exports_the_pause_stamp_to_the_millisecond(tmp_path):
    """The job's last pause (a checkpoint save, start-up) is written as precisely as its last
    progress: in whole seconds a save that began at .9 s read as begun up to 1 s earlier, and
    a pause seen against progress in the same second read as closed."""
    out = tmp_path / "rec"
    r = import_h200(out)
    assert r.exit_code == 0, r.output
    with gzip.open(out / "job_metrics.csv.gz", "rt") as fh:
        rows = list(csv.DictReader(fh))
    stamps = {r["goodput_job_last_pause_timestamp_seconds"] for r in rows} - {""}
    assert stamps and all(re.fullmatch(r"\d{10}\.\d{3}", s) for s in stamps), sorted(stamps)[:3]
    assert any(not s.endswith(".000") for s in stamps)


def test_parquet_long_table_imports(tmp_path):
    real = pd.read_csv(DATA / "metrics.csv").head(40)
    long = real.melt(
        id_vars=["ts"],
        value_vars=["DCGM_FI_DEV_GPU_UTIL", "gpm_sm_active"],
        var_name="field",
        value_name="value",
    )
    long.insert(1, "hostname", "h200a")
    long.insert(2, "gpu_index", 0)
    long.to_parquet(tmp_path / "s.parquet")
    out = tmp_path / "rec"
    r = _import("--metrics", str(tmp_path / "s.parquet"), "--job-id", "8", "--out", str(out))
    assert r.exit_code == 0, r.output
    gpu = pd.read_csv(out / "gpu_metrics.csv.gz")
    assert len(gpu) == 40
    assert gpu.DCGM_FI_PROF_SM_ACTIVE.tolist() == pytest.approx((real.gpm_sm_active / 100).tolist())


def test_repeated_samples_keep_the_last_and_say_so():
    df = pd.DataFrame({"ts": [1, 1, 2], "host": "n1", "gpu": 0, "DCGM_FI_DEV_GPU_UTIL": [5, 6, 7]})
    got = samples.normalise(df, "dup.csv", job_id="1")
    assert got.gpu.DCGM_FI_DEV_GPU_UTIL.tolist() == [6.0, 7.0]
    assert "1 rows repeat a (time, node, GPU): the last one kept" in got.notes


def test_a_long_table_keeps_each_gpus_model_and_every_gpus_metrics():
    """Two GPUs of different models, one idle (no job) and one sample's label blank: each GPU
    keeps its model and its own values. Before, the long table's keys were crossed (a blank
    job or a second model made rows for every combination) and the last, empty copy won."""
    rows = []
    for t in (1000.0, 1005.0):
        for gpu, model, job in ((0, "NVIDIA H200", "7"), (1, "NVIDIA A10G", "")):
            for name, v in (("DCGM_FI_DEV_GPU_UTIL", 90 + gpu), ("DCGM_FI_DEV_POWER_USAGE", 300)):
                rows.append(
                    {"timestamp": t, "node": "n1", "gpu": gpu, "job_id": job,
                     "modelName": model, "name": name, "value": v}
                )  # fmt: skip
    rows[-1]["modelName"] = ""
    got = samples.normalise(pd.DataFrame(rows), "long.csv").gpu
    assert len(got) == 4
    assert got.groupby("gpu").modelName.unique().map(list).to_dict() == {
        0: ["NVIDIA H200"],
        1: ["NVIDIA A10G"],
    }
    assert got.groupby("gpu").DCGM_FI_DEV_GPU_UTIL.unique().map(list).to_dict() == {
        0: [90.0],
        1: [91.0],
    }


def test_name_is_the_gpu_model_in_a_wide_table_and_the_metric_in_a_long_one():
    long = pd.DataFrame(
        {"timestamp": [1.7e9] * 2, "node": ["n"] * 2, "gpu": [0, 0],
         "name": ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"], "reading": [99, 300]}
    )  # fmt: skip
    got = samples.normalise(long, "long.csv").gpu
    assert got.DCGM_FI_DEV_POWER_USAGE.tolist() == [300.0] and "modelName" not in got


def test_per_node_files_whose_clocks_do_not_line_up_import_and_replay_on_one_grid(tmp_path):
    """Two nodes' nvidia-smi logs, one sampling 1.3 s after the other every 5 s: the recording's
    interval is 5 s (before: 1.3 s, the gap between distinct times), and replay holds both
    nodes' GPUs in every instant."""
    from detector.replay import replay

    files = []
    for k, node in enumerate(("a1", "a2")):
        p = tmp_path / f"{node}.csv"
        rows = [
            f"{1795978800 + 5 * i + 1.3 * k:.3f}, {node}, {g}, NVIDIA H200, 99 %, 690 W"
            for i in range(30)
            for g in (0, 1)
        ]
        head = "timestamp, host, index, name, utilization.gpu [%], power.draw [W]"
        p.write_text("\n".join([head, *rows]) + "\n")
        files += ["--metrics", str(p)]
    r = _import(*files, "--job-id", "5", "--out", str(tmp_path / "rec"))
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "rec" / "meta.json").read_text())
    assert meta["interval_s"] == 5.0
    s = replay(tmp_path / "rec", io.StringIO())
    assert s["instants"] == 30 and s["jobs"]["5"]["gpus"] == 4
    assert s["jobs"]["5"]["detectors"]["peer"]["ran"]


def test_a_broken_job_beside_the_one_asked_for_does_not_refuse_the_file():
    """One neighbour in a day's sacct --json spelled wrong (its end before its start) refused
    the job asked for; it refuses only when it is the one wanted, or none is named."""
    jobs = [
        {
            "job_id": 1,
            "name": "a",
            "state": {"current": ["FAILED"]},
            "time": {"start": 9, "end": 1},
        },
        {"job_id": 2, "name": "b", "state": {"current": ["FAILED"]}, "nodes": "gn2"},
    ]
    text = json.dumps({"jobs": jobs})
    assert importer.slurm_state(text, "d.json", "2")["nodes"] == ["gn2"]
    with pytest.raises(importer.ImportFailure, match=r"d.json: job 1: its end \(1\) is before"):
        importer.slurm_state(text, "d.json", "1")
    with pytest.raises(importer.ImportFailure, match="d.json: job 1: its end"):
        importer.slurm_state(text, "d.json")


@pytest.mark.parametrize("bad", ["99999999999999999999", "-5", "inf", "2999-01-01 00:00:00"])
def test_a_time_outside_1970_to_tomorrow_is_refused(tmp_path, bad):
    """One row at 1e20 s was kept (the recording's end 1e+20) and gave a false
    gpu_hardware_fault; a negative or infinite time was kept too, and a date past 2262 was an
    OutOfBoundsDatetime traceback."""
    good = "2026-11-29 19:01:37" if "-" in bad[1:] else "1795978897"  # a date, or a number
    p = tmp_path / "t.csv"
    p.write_text(f"ts,host,gpu,DCGM_FI_DEV_GPU_UTIL\n{good},n1,0,99\n{bad},n1,0,98\n")
    with pytest.raises(samples.SampleError) as exc:
        samples.read(p, job_id="1")
    assert str(exc.value) == (
        f"{p}: column 'timestamp': {bad!r} is not a time from 1970 to a day from now"
    )


@pytest.mark.parametrize(("bad", "shown"), [("abc", "abc"), ("", "")])
def test_an_unreadable_time_is_quoted_not_the_first_good_one(tmp_path, bad, shown):
    """A digit string reads as no date, so the first (good) value was quoted."""
    p = tmp_path / "t.csv"
    p.write_text(f"ts,host,gpu,DCGM_FI_DEV_GPU_UTIL\n1795978897,n1,0,99\n{bad},n1,0,98\n")
    with pytest.raises(samples.SampleError, match=f"column 'timestamp': cannot read '{shown}' as"):
        samples.read(p, job_id="1")


def test_a_long_table_without_a_value_column_says_so(tmp_path):
    """It said "no gpu column ... several rows per node and time": the metric names were read
    as nvidia-smi's GPU model column."""
    p = tmp_path / "long.csv"
    p.write_text(
        "timestamp,node,metric\n1795978897,n1,DCGM_FI_DEV_GPU_UTIL\n"
        "1795978897,n1,DCGM_FI_DEV_POWER_USAGE\n"
    )
    with pytest.raises(samples.SampleError, match="no value column for the metric names of colu"):
        samples.read(p, job_id="1")
    p.write_text("timestamp,node,name\n1795978897,n1,DCGM_FI_DEV_GPU_UTIL\n")
    with pytest.raises(samples.SampleError, match="accepted: value, val, reading"):
        samples.read(p, job_id="1")


def _prom(result, kind="matrix") -> str:
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}})


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        (_prom([1, "2"], "scalar"), "a Prometheus answer of resultType 'scalar': want 'matrix'"),
        (_prom({"a": 1}), "a Prometheus answer of resultType 'matrix': want"),
        (_prom([1]), 'a series is not {"metric"'),
        (_prom([{"metric": [], "values": []}]), 'a series is not {"metric"'),
        (_prom([{"metric": {}, "values": [5]}]), 'a series is not {"metric"'),
        (_prom([{"metric": {}, "values": [[{}, "1"]]}]), 'a series is not {"metric"'),
        ('{"status": "success", "data": 3}', "not a Prometheus answer"),
    ],
)
def test_a_prometheus_answer_that_is_not_series_is_refused(tmp_path, doc, error):
    p = tmp_path / "q.json"
    p.write_text(doc)
    with pytest.raises(samples.SampleError, match=f"^{p}: {re.escape(error)}"):
        samples.read(p, job_id="1")


def test_a_prometheus_answer_keeps_dcgms_model_name(tmp_path):
    labels = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "n1", "gpu": "0"}
    series = [
        {"metric": {**labels, "modelName": "NVIDIA H200"}, "values": [[1795978800, "5"]]},
        {"metric": {**labels, "gpu": "1"}, "values": [[1795978800, "6"]]},  # no model label
    ]
    p = tmp_path / "q.json"
    p.write_text(_prom(series))
    got = samples.read(p, job_id="1").gpu
    assert got.modelName.fillna("").tolist() == ["NVIDIA H200", ""]
