"""Log lines drive the log-metrics exporter's metrics (read back through a registry)."""
# ruff: noqa: E501

from __future__ import annotations

import math
import os

from prometheus_client import CollectorRegistry

from exporters.logmetrics.exporter import LogMetrics

PROGRESS = (
    " iteration {it:8d}/    1000 | consumed samples: {s:10d} | elapsed time per iteration (ms): 500.0 |"
    " global batch size:   64 | lm loss: {loss} | number of skipped iterations: {sk} |"
    " number of nan iterations: {nan} |\n"
)


def setup(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "kernel").mkdir()
    m = LogMetrics(tmp_path)
    reg = CollectorRegistry()
    reg.register(m)
    return m, reg


def test_progress_failure_and_kernel_lines(tmp_path):
    m, reg = setup(tmp_path)
    job = tmp_path / "jobs" / "slurm-4242.out"
    job.write_text(
        PROGRESS.format(it=10, s=640, loss="2.5E+00", sk=1, nan=0)
        + "[rank3]: "
        + PROGRESS.format(it=20, s=1280, loss="2.0E+00", sk=0, nan=0)
        + "successfully saved checkpoint from iteration 20 to /ckpt\n"
        + "[rank0]:[E321 02:07:08.408 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective"
        " operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600060"
        " milliseconds before timing out.\n"
        "srun: error: node2: task 3: Exited with exit code 1\n"
    )
    os.utime(job, (1000.0, 1000.0))  # a backlog: timestamps are capped at the file's mtime
    (tmp_path / "kernel" / "node2.log").write_text(
        "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
        "May 18 19:02:40 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
    )
    (tmp_path / "jobs" / "notes.txt").write_text("ignored\n")
    (tmp_path / "jobs" / "slurm-bad;id.out").write_text("CUDA out of memory\n")
    assert m.poll_once(now=5000.0) == 7
    v = reg.get_sample_value
    assert v("goodput_job_iteration", {"job_id": "4242"}) == 20
    assert v("goodput_job_iteration_seconds", {"job_id": "4242"}) == 0.5
    assert v("goodput_job_throughput_samples_per_second", {"job_id": "4242"}) == 128.0
    assert v("goodput_job_loss", {"job_id": "4242"}) == 2.0
    assert v("goodput_job_skipped_iterations_total", {"job_id": "4242"}) == 1
    assert v("goodput_job_nan_iterations_total", {"job_id": "4242"}) == 0
    assert (
        v("goodput_job_last_progress_timestamp_seconds", {"job_id": "4242", "rank": ""}) == 1000.0
    )
    assert (
        v("goodput_job_last_progress_timestamp_seconds", {"job_id": "4242", "rank": "3"}) == 1000.0
    )
    assert v("goodput_job_last_checkpoint_timestamp_seconds", {"job_id": "4242"}) == 1000.0
    pm = "goodput_log_pattern_matches_total"
    assert v(pm, {"job_id": "4242", "node": "", "pattern": "nccl_watchdog_timeout"}) == 1
    assert v(pm, {"job_id": "4242", "node": "node2", "pattern": "slurm_task_failed"}) == 1
    assert v(pm, {"job_id": "", "node": "node2", "pattern": "nvrm_gpu_off_bus"}) == 2
    assert v("goodput_node_xid_errors_total", {"node": "node2", "xid": "79"}) == 2
    assert v(pm, {"job_id": "bad;id", "node": "", "pattern": "cuda_oom"}) is None
    assert v("goodput_log_files_followed", {"source": "job"}) == 2  # notes.txt is not a job log


def test_nan_loss_and_live_timestamps(tmp_path):
    m, reg = setup(tmp_path)
    job = tmp_path / "jobs" / "slurm-7_2.out"
    job.write_text(PROGRESS.format(it=1, s=64, loss="nan", sk=0, nan=1))
    m.poll_once()
    assert math.isnan(reg.get_sample_value("goodput_job_loss", {"job_id": "7_2"}))
    assert reg.get_sample_value("goodput_job_nan_iterations_total", {"job_id": "7_2"}) == 1
    pm = {"job_id": "7_2", "node": "", "pattern": "nan_loss"}
    assert reg.get_sample_value("goodput_log_pattern_matches_total", pm) == 1
    with open(job, "a") as fh:
        fh.write("step 5 loss nan\n")  # generic format: NaN loss without a nan count
    m.poll_once()
    assert reg.get_sample_value("goodput_job_nan_iterations_total", {"job_id": "7_2"}) == 2


def test_hook_failure_does_not_stop_tailing(tmp_path):
    seen = []

    def hook(kind, key, lines):
        seen.append((kind, key, len(lines)))
        raise RuntimeError("boom")

    (tmp_path / "jobs").mkdir()
    m = LogMetrics(tmp_path, on_lines=hook)
    (tmp_path / "jobs" / "slurm-1.out").write_text("a\nb\n")
    assert m.poll_once() == 2
    assert seen == [("job", "1", 2)]


def test_deleted_job_log_removes_its_series(tmp_path):
    m, reg = setup(tmp_path)
    job = tmp_path / "jobs" / "slurm-77.out"
    job.write_text(PROGRESS.format(it=1, s=64, loss="1.0", sk=0, nan=0) + "CUDA out of memory\n")
    m.poll_once()
    assert reg.get_sample_value("goodput_job_iteration", {"job_id": "77"}) == 1
    job.unlink()
    m.poll_once()
    assert reg.get_sample_value("goodput_job_iteration", {"job_id": "77"}) is None
    pm = {"job_id": "77", "node": "", "pattern": "cuda_oom"}
    assert reg.get_sample_value("goodput_log_pattern_matches_total", pm) is None
    assert reg.get_sample_value("goodput_log_lines_total", {"source": "job"}) == 2


def test_a_restarted_job_counts_as_progressing_from_its_start():
    from exporters.logmetrics.parser import LogState

    state = LogState()
    state.feed_job(
        "9", ["[rank3]: " + PROGRESS.format(it=5, s=320, loss="2.0", sk=0, nan=0)], 100.0
    )
    assert state.jobs["9"].last_progress == {"3": 100.0}
    state.feed_job("9", ["[after dataloaders are built] datetime: 2026-11-29 20:41:12"], 500.0)
    assert state.jobs["9"].last_progress == {"": 500.0}


def test_a_progress_bar_in_the_job_output_is_its_progress(tmp_path):
    """A Lightning or Hugging Face job logs no step lines, only a tqdm bar rewritten with \\r
    (Lightning-AI/pytorch-lightning#6206's bars). Each update is progress: the job's
    last-progress time moves while the bar moves and stops when it stops (a hang's stall
    clock). No iteration or step time is taken from it. Failed before: such a job exported no
    progress at all."""
    m, reg = setup(tmp_path)
    job = tmp_path / "jobs" / "slurm-6206.out"
    bar = "\rEpoch 0:  {:2d}%|▋         | {}/14 [00:00<00:04,  2.61it/s, loss=-6.21, v_num=655642]"
    job.write_text(
        "Validation sanity check:   0%|          | 0/2 [00:00<?, ?it/s]" + bar.format(7, 1)
    )
    m.poll_once(now=100.0)
    v = reg.get_sample_value
    last = "goodput_job_last_progress_timestamp_seconds"
    assert v(last, {"job_id": "6206", "rank": ""}) is None  # a bar at 0, and one still held
    with job.open("a") as fh:
        fh.write(bar.format(14, 2) + bar.format(21, 3))
    m.poll_once(now=110.0)
    assert v(last, {"job_id": "6206", "rank": ""}) == 110.0
    m.poll_once(now=400.0)  # the bar stopped: the stall clock runs from 110 s
    assert v(last, {"job_id": "6206", "rank": ""}) == 110.0
    assert v("goodput_job_iteration", {"job_id": "6206"}) is None
    assert v("goodput_job_iteration_seconds", {"job_id": "6206"}) is None


def test_numbers_too_large_for_a_rank_or_an_iteration_are_junk_not_a_lost_batch(tmp_path):
    """`rank` + 4,400 digits (past Python's int-from-text limit) or an iteration of 400
    digits (float() overflows) raised out of the poll: the rest of the batch, the other
    files' batches and the Loki hook were lost."""
    m, reg = setup(tmp_path)
    (tmp_path / "jobs" / "slurm-5.out").write_text(
        f"[rank{'9' * 4400}]: CUDA out of memory\n"
        + PROGRESS.format(it=10, s=640, loss="2.5E+00", sk=0, nan=0).replace(
            "       10/", f" {'9' * 400}/"
        )
        + PROGRESS.format(it=11, s=704, loss="2.4E+00", sk=0, nan=0)
    )
    (tmp_path / "jobs" / "slurm-6.out").write_text(
        PROGRESS.format(it=3, s=192, loss="1", sk=0, nan=0)
    )
    assert m.poll_once() == 4
    v = reg.get_sample_value
    assert v("goodput_job_iteration", {"job_id": "5"}) == 11
    assert v("goodput_job_iteration", {"job_id": "6"}) == 3
    assert (
        v("goodput_log_pattern_matches_total", {"job_id": "5", "node": "", "pattern": "cuda_oom"})
        == 1
    )


def test_a_job_names_a_bounded_number_of_ranks_and_nodes(tmp_path):
    """A loop printing `rank <i>` or `srun: error: n<i>: task` grew series without end."""
    from exporters.logmetrics.parser import MAX_LABELS_PER_JOB

    m, reg = setup(tmp_path)
    n = MAX_LABELS_PER_JOB + 50
    (tmp_path / "jobs" / "slurm-8.out").write_text(
        "".join(
            f"[rank{i}]: " + PROGRESS.format(it=i, s=i, loss="1", sk=0, nan=0) for i in range(n)
        )
        + "".join(f"srun: error: n{i}: task 0: Exited with exit code 1\n" for i in range(n))
    )
    m.poll_once()
    names = [s.name for f in reg.collect() for s in f.samples]
    ranks = {
        s.labels["rank"]
        for f in reg.collect()
        for s in f.samples
        if s.name == "goodput_job_last_progress_timestamp_seconds"
    }
    nodes = {
        s.labels["node"]
        for f in reg.collect()
        for s in f.samples
        if s.name == "goodput_log_pattern_matches_total" and s.labels["job_id"] == "8"
    }
    assert len(ranks) == MAX_LABELS_PER_JOB + 1 and "" in ranks and str(n - 1) not in ranks
    assert len(nodes) == MAX_LABELS_PER_JOB + 1 and "" in nodes and "n0" in nodes
    assert (
        reg.get_sample_value(
            "goodput_log_pattern_matches_total",
            {"job_id": "8", "node": "", "pattern": "slurm_task_failed"},
        )
        == 50
    )
    assert len(names) < 3 * MAX_LABELS_PER_JOB


def test_serving_a_log_dir_that_is_not_there_says_so(tmp_path, caplog):
    """A mistyped --log-dir served an exporter that read nothing and said nothing."""
    import logging
    import threading

    from exporters.logmetrics.exporter import serve

    stop = threading.Event()
    stop.set()
    with caplog.at_level(logging.WARNING, logger="exporters.logmetrics.exporter"):
        serve(tmp_path / "no-such-dir", port=0, stop=stop)
    assert any("no-such-dir is not a directory" in r.getMessage() for r in caplog.records)
