"""`goodput import`, `replay` and `attribute` on damaged or inconsistent input: one line naming
the file (and the field) and exit 2, never a traceback or "Aborted!", and nothing scored twice
(before: repeated samples crashed replay, a truncated gzip printed "Aborted!", a header-only CSV,
a wrongly typed meta.json or an absurd interval_s gave tracebacks or other results, and import
wrote a recording for a job id that replay then refused)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from goodput.cli import app
from tests.h200 import DATA, NODE

runner = CliRunner()
ROWS = 160  # 40 s of the H200 cut: enough for replay, quick


def _cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _cut(path: Path, start: int = 0, stop: int = ROWS) -> Path:
    lines = (DATA / "metrics.csv").read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "".join(lines[1 + start : 1 + stop]))
    return path


def _import(tmp_path: Path, *metrics: Path, out: str = "rec", extra: tuple = ()):
    args = [a for m in metrics for a in ("--metrics", m)]
    return _cli(
        "import", *args, "--node", NODE, "--job-id", "4242", "--out", tmp_path / out, *extra
    )


@pytest.fixture
def rec(tmp_path) -> Path:
    r = _import(tmp_path, _cut(tmp_path / "m.csv"))
    assert r.exit_code == 0, r.output
    return tmp_path / "rec"


def _rows(rec: Path) -> pd.DataFrame:
    return pd.read_csv(rec / "gpu_metrics.csv.gz")


def _truncate(path: Path, keep: int = 3000) -> None:
    path.write_bytes(path.read_bytes()[:keep])


# 1. the same samples given twice


def test_a_file_given_twice_is_merged_and_replays(tmp_path):
    m = _cut(tmp_path / "m.csv")
    copy = _cut(tmp_path / "copy.csv")
    r = _import(tmp_path, m, copy)
    assert r.exit_code == 0, r.output
    assert f"{ROWS} row(s) repeat the time, node and GPU of rows of {m}: merged" in r.output
    assert len(_rows(tmp_path / "rec")) == ROWS
    r = _cli("replay", tmp_path / "rec", "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 0, r.output
    assert f"{ROWS} rows, {ROWS} instants" in r.output


def test_partly_overlapping_files_give_each_sample_once(tmp_path):
    r = _import(tmp_path, _cut(tmp_path / "a.csv", 0, 100), _cut(tmp_path / "b.csv", 60, ROWS))
    assert r.exit_code == 0, r.output
    assert "40 row(s) repeat" in r.output
    rows = _rows(tmp_path / "rec")
    assert len(rows) == ROWS and not rows.duplicated(["timestamp", "node", "gpu"]).any()


def test_overlapping_files_that_disagree_are_refused_naming_both(tmp_path):
    a = _cut(tmp_path / "a.csv")
    b = _cut(tmp_path / "b.csv", 100, ROWS)
    lines = b.read_text().splitlines()
    cells = lines[1].split(",")
    cells[5] = "999"  # DCGM_FI_DEV_POWER_USAGE of one repeated sample
    b.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    r = _import(tmp_path, a, b)
    assert r.exit_code == 2
    assert f"import: {a} and {b}: 1 sample(s) given twice with different values" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "rec" / "meta.json").exists()


def test_replay_merges_repeated_rows_of_a_recording_and_refuses_conflicting_ones(rec, tmp_path):
    rows = _rows(rec)
    pd.concat([rows, rows.iloc[:10]]).to_csv(rec / "gpu_metrics.csv.gz", index=False)
    r = _cli("replay", rec, "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 0, r.output
    assert "gpu_metrics.csv.gz: 10 row(s) repeat the time, node and GPU of earlier rows" in r.output
    other = rows.iloc[:10].assign(DCGM_FI_DEV_POWER_USAGE=999.0)
    pd.concat([rows, other]).to_csv(rec / "gpu_metrics.csv.gz", index=False)
    r = _cli("replay", rec, "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 2 and "10 sample(s) given twice with different values" in r.output
    assert str(rec / "gpu_metrics.csv.gz") in r.output


def test_files_of_the_same_samples_with_and_without_labels_merge(tmp_path):
    """One capture labelled with the job (dcgm-exporter's hpc_job), another of other fields
    without: a blank label is no value, so they merge (refused as a disagreement before)."""
    df = pd.read_csv(_cut(tmp_path / "m.csv"))
    a = df[["ts", "DCGM_FI_DEV_GPU_UTIL"]].assign(job_id="4242")
    b = df[["ts", "DCGM_FI_DEV_POWER_USAGE"]].assign(job_id="")
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    r = _import(tmp_path, tmp_path / "a.csv", tmp_path / "b.csv")
    assert r.exit_code == 0, r.output
    rows = _rows(tmp_path / "rec")
    assert len(rows) == ROWS and rows.DCGM_FI_DEV_POWER_USAGE.notna().all()
    assert (rows.job_id.astype(str) == "4242").all()


def test_a_recording_with_header_aliases_still_replays(rec, tmp_path):
    """A hand-made recording whose CSV says time / Hostname / hpc_job, as the frame accepts."""
    rows = _rows(rec).rename(columns={"timestamp": "time", "node": "Hostname", "job_id": "hpc_job"})
    rows.to_csv(rec / "gpu_metrics.csv.gz", index=False)
    r = _cli("replay", rec, "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 0, r.output


# 2. truncated gzip


def test_a_truncated_gzip_job_log_or_metrics_file_is_named(tmp_path):
    log = tmp_path / "t.log.gz"
    log.write_bytes((DATA / "app.log.gz").read_bytes()[:5000])
    r = _import(tmp_path, _cut(tmp_path / "m.csv"), extra=("--job-log", log))
    assert r.exit_code == 2 and f"import: {log}: truncated gzip" in r.output, r.output
    gz = tmp_path / "m.csv.gz"
    gz.write_bytes(gzip.compress((DATA / "metrics.csv").read_bytes())[:5000])
    r = _import(tmp_path, gz, out="rec2")
    assert r.exit_code == 2 and f"import: {gz}: truncated gzip" in r.output, r.output


@pytest.mark.parametrize("name", ["gpu_metrics.csv.gz", "job_metrics.csv.gz"])
def test_a_truncated_gzip_in_a_recording_is_named_by_replay_and_attribute(tmp_path, name):
    r = _import(tmp_path, _cut(tmp_path / "m.csv"), extra=("--job-log", DATA / "app.log.gz"))
    assert r.exit_code == 0, r.output
    rec = tmp_path / "rec"
    _truncate(rec / name, 1000)
    r = _cli("replay", rec, "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 2 and f"replay: {rec / name}: truncated gzip" in r.output, r.output
    r = _cli("attribute", "--recording", rec)
    assert r.exit_code == 2 and f"attribute: {rec / name}: truncated gzip" in r.output, r.output


# 3. a header and no rows


def test_a_csv_with_only_a_header_is_no_rows(tmp_path):
    h = _cut(tmp_path / "h.csv", 0, 0)
    r = _cli("import", "--metrics", h, "--node", "n1", "--job-id", "1", "--out", tmp_path / "o")
    assert r.exit_code == 2 and f"import: {h}: no rows" in r.output, r.output


# 4, 5. meta.json of the wrong types or an absurd interval


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ([], "want a JSON object, not an array"),
        ({"jobs": None}, "jobs must be a list of jobs, not null"),
        ({"jobs": ["4242"]}, "jobs[0] must be an object"),
        ({"jobs": [{"job_id": "abc"}]}, "jobs[0].job_id must be a Slurm job id"),
        ({"gpus_per_node": "x"}, "gpus_per_node must be a whole number 1..1024"),
        ({"gpus_per_node": -3}, "gpus_per_node must be a whole number 1..1024"),
        ({"interval_s": -5}, "interval_s must be seconds > 0"),
        ({"interval_s": 1e12}, "interval_s must be seconds > 0"),
        ({"interval_s": "0.25"}, "interval_s must be seconds > 0"),
        ({"nodes": "h200a"}, "nodes must be a list of node names"),
        ({"start": "x"}, "start must be unix seconds"),
        ({"format": "other/1"}, "unknown format 'other/1'"),
    ],
    ids=str,
)
def test_a_wrong_meta_json_is_refused_naming_the_field(rec, tmp_path, meta, field):
    good = json.loads((rec / "meta.json").read_text())
    doc = {**good, **meta} if isinstance(meta, dict) else meta
    (rec / "meta.json").write_text(json.dumps(doc))
    where = rec / "meta.json"
    r = _cli("replay", rec, "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 2 and f"replay: {where}: {field}" in r.output, r.output
    r = _cli("attribute", "--recording", rec)
    assert r.exit_code == 2 and f"attribute: {where}: {field}" in r.output, r.output


def test_a_valid_meta_json_still_replays_and_attributes(rec, tmp_path):
    r = _cli("replay", rec, "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 0 and "every 0.25 s" in r.output, r.output
    r = _cli("attribute", "--recording", rec)
    assert r.exit_code == 0 and "GPUs per node: 1 (meta.json)" in r.output, r.output
    meta = json.loads((rec / "meta.json").read_text())
    meta["jobs"][0]["nodes"] = None  # null: no node list, as 'nodes' absent (a traceback before)
    (rec / "meta.json").write_text(json.dumps(meta))
    r = _cli("attribute", "--recording", rec)
    assert r.exit_code == 0, r.output


# 6. the job id import writes


@pytest.mark.parametrize("job_id", ["abc", "12.5", "-1", "1_"])
def test_import_refuses_a_job_id_that_is_not_slurms(tmp_path, job_id):
    r = _cli(
        "import", "--metrics", _cut(tmp_path / "m.csv"), "--node", NODE, "--job-id", job_id,
        "--out", tmp_path / "rec",
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    assert f"import: --job-id {job_id!r}: want a Slurm job id (123 or 123_4)" in r.output
    assert not (tmp_path / "rec").exists()


# 7. a Slurm file that does not fit the samples


def test_a_slurm_window_missing_every_sample_is_refused(tmp_path):
    """Slurm's start/end misses every sample (the wrong job's file, a clock in another zone):
    refused with both spans; it wrote a recording with no row of the job, which replay then
    showed no section for and attribute called 'ok: no rows'."""
    slurm = tmp_path / "s.txt"
    slurm.write_text("job_id=4242\nstate=FAILED\nstart=1000\nend=2000\n")
    r = _import(tmp_path, _cut(tmp_path / "m.csv"), extra=("--slurm", slurm))
    assert r.exit_code == 2 and "no sample is of job 4242: the samples span" in r.output
    assert "Slurm's start/end 1970-01-01T00:16:40.000Z to 1970-01-01T00:33:20.000Z" in r.output
    assert not (tmp_path / "rec").exists()


def test_a_slurm_end_before_its_start_is_refused(tmp_path):
    slurm = tmp_path / "s.txt"
    slurm.write_text("job_id=4242\nstate=FAILED\nstart=2000\nend=1000\n")
    r = _import(tmp_path, _cut(tmp_path / "m.csv"), extra=("--slurm", slurm))
    assert r.exit_code == 2 and "its end (1000) is before its start (2000)" in r.output


# 8. values that are not numbers


def test_unreadable_values_are_said_and_a_column_of_none_refused(tmp_path):
    """Text or inf where a number belongs was read as missing without a word (replay then
    showed peaks of 0.00 that looked like data); now each column says how many, and a column
    with no number at all is refused."""
    df = pd.read_csv(_cut(tmp_path / "m.csv"), dtype=str)
    df.loc[:9, "DCGM_FI_DEV_POWER_USAGE"] = "abc"
    df.loc[10:12, "DCGM_FI_DEV_POWER_USAGE"] = "inf"
    df.to_csv(tmp_path / "some.csv", index=False)
    r = _import(tmp_path, tmp_path / "some.csv")
    assert r.exit_code == 0, r.output
    assert "column 'DCGM_FI_DEV_POWER_USAGE': 13 value(s) not a number (e.g. 'abc')" in r.output
    df["DCGM_FI_DEV_POWER_USAGE"] = "abc"
    df.to_csv(tmp_path / "none.csv", index=False)
    r = _import(tmp_path, tmp_path / "none.csv", out="rec2")
    assert r.exit_code == 2 and "column 'DCGM_FI_DEV_POWER_USAGE': no number in it" in r.output
    df["DCGM_FI_DEV_POWER_USAGE"] = "[N/A]"  # a failing GPU: nvidia-smi's words, missing alone
    df.loc[0, "DCGM_FI_DEV_POWER_USAGE"] = "ERR!"
    df.to_csv(tmp_path / "err.csv", index=False)
    r = _import(tmp_path, tmp_path / "err.csv", out="rec3")
    assert r.exit_code == 0 and "not a number" not in r.output, r.output


# 9. a directory where a file belongs, a file where a directory does


def test_a_directory_for_a_file_says_so(tmp_path):
    """It said 'no such file' of a directory that exists, and replay's --out a directory gave a
    raw '[Errno 21] Is a directory'; a benchmark's --out a file ran the whole benchmark first."""
    r = _cli(
        "import", "--metrics", tmp_path, "--node", NODE, "--job-id", "1", "--out", tmp_path / "o"
    )
    assert r.exit_code == 2 and f"{tmp_path}: is a directory" in r.output
    r = _cli("attribute", "--job-log", tmp_path)
    assert r.exit_code == 2 and f"{tmp_path}: is a directory" in r.output
    r = _cli("replay", _cut(tmp_path / "m.csv"), "--out", tmp_path)
    assert r.exit_code == 2 and "is a directory (want the JSON lines file to write)" in r.output
    (tmp_path / "f").write_text("")
    r = _cli("bench", "scale", "--out", tmp_path / "f", "--sizes", "1000", "--cycles", "2")
    assert r.exit_code == 2 and "exists and is not a directory" in r.output


def test_attribute_without_meta_takes_gpus_per_node_from_the_samples(rec):
    """A recording without meta.json: the GPUs per node its samples show (1 here), not the
    default 8, which made one GPU's node look like a fraction of one."""
    (rec / "meta.json").unlink()
    r = _cli("attribute", "--recording", rec, "--job-id", "4242")
    assert r.exit_code == 0, r.output
    assert "GPUs per node: 1 (the samples)" in r.output


def test_import_counts_the_rows_the_samples_already_gave_the_job(tmp_path):
    """Samples labelled with the job (a Prometheus export's hpc_job) were reported as '0 rows
    given job 4242 (all)'."""
    df = pd.read_csv(_cut(tmp_path / "m.csv")).assign(job_id="4242")
    df.to_csv(tmp_path / "l.csv", index=False)
    r = _import(tmp_path, tmp_path / "l.csv")
    assert r.exit_code == 0, r.output
    assert (
        f"{ROWS} rows of job 4242 ({ROWS} labelled so in the samples, 0 given it: all)" in r.output
    )


# 10. a recording missing a column, or empty


@pytest.fixture
def rec_with_jobs(tmp_path) -> Path:
    r = _import(tmp_path, _cut(tmp_path / "m.csv"), extra=("--job-log", DATA / "app.log.gz"))
    assert r.exit_code == 0, r.output
    return tmp_path / "rec"


@pytest.mark.parametrize(
    ("name", "column"),
    [
        ("gpu_metrics.csv.gz", "timestamp"),
        ("gpu_metrics.csv.gz", "node"),
        ("gpu_metrics.csv.gz", "gpu"),
        ("job_metrics.csv.gz", "timestamp"),
        ("job_metrics.csv.gz", "job_id"),
    ],
)
def test_a_recording_missing_a_column_is_named_by_replay_and_attribute(
    rec_with_jobs, tmp_path, name, column
):
    """A KeyError traceback in both before (or, attribute without node or job_id, rows of no
    node or no job read without a word)."""
    path = rec_with_jobs / name
    pd.read_csv(path, dtype=str).drop(columns=[column]).to_csv(path, index=False)
    r = _cli("replay", rec_with_jobs, "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 2 and f"replay: {path}: no {column} column\n" == r.output, r.output
    r = _cli("attribute", "--recording", rec_with_jobs)
    assert r.exit_code == 2 and f"attribute: {path}: no {column} column\n" == r.output, r.output


def test_an_empty_job_metrics_file_is_named(rec_with_jobs, tmp_path):
    path = rec_with_jobs / "job_metrics.csv.gz"
    path.write_bytes(gzip.compress(b""))
    r = _cli("replay", rec_with_jobs, "--out", tmp_path / "d.jsonl")
    assert r.exit_code == 2 and f"replay: {path}: empty (want a CSV" in r.output, r.output
    r = _cli("attribute", "--recording", rec_with_jobs)
    assert r.exit_code == 2 and f"attribute: {path}: empty (want a CSV" in r.output, r.output


# 11. Slurm values and a boot time that are no time


@pytest.mark.parametrize(
    ("slurm", "error"),
    [
        ('{"jobs": [{"job_id": 4242, "time": {"start": "abc"}}]}', 'time.start "abc": want'),
        ('{"jobs": [{"job_id": 4242, "time": {"start": 1e400}}]}', "time.start Infinity: want"),
        ('{"jobs": [1, 2]}', "'jobs' holds 1: want job objects"),
        ("JobId=4242 JobState=FAILED NodeList=gpu[3-1]", "NodeList: hostlist item 'gpu[3-1]'"),
        ("JobId=4242 JobState=FAILED StartTime=nan", "start='nan': want unix seconds"),
    ],
)
def test_a_bad_slurm_value_is_one_line_naming_the_file(tmp_path, slurm, error):
    path = tmp_path / "j.json"
    path.write_text(slurm)
    r = _import(tmp_path, _cut(tmp_path / "m.csv"), extra=("--slurm", path))
    assert r.exit_code == 2 and r.output.startswith(f"import: {path}: {error}"), r.output
    assert not (tmp_path / "rec").exists()


@pytest.mark.parametrize("boot", ["99999999999999999999", "2999-01-01T00:00:00Z"])
def test_a_boot_time_in_the_future_is_refused(tmp_path, boot):
    """An OverflowError traceback before (the first, past any calendar), or kernel lines
    placed centuries ahead (the second)."""
    k = tmp_path / "k.log"
    k.write_text("[  100.250000] NVRM: Xid 79\n")
    extra = ("--kernel-log", f"{NODE}={k}", "--boot-time", boot)
    r = _import(tmp_path, _cut(tmp_path / "m.csv"), extra=extra)
    assert r.exit_code == 2, r.output
    assert f"import: --boot-time {boot!r}: want a time in the past" in r.output
