"""A restart of the log-metrics exporter neither counts old lines again nor resets a counter
(its state file), and a copy-truncated log grown past the saved offset again is read from its
start (the tailer's fingerprint). Each fails on the code before: no state file (every restart
read every log again: after a rotation the XID counter fell 4 -> 1, which `increase()` reads
as a new XID, and after an outage old matches came back), and a resume inside the new content
(lines before the old offset, an XID among them, never read; the first line a fragment)."""
# ruff: noqa: E501

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exporters.logmetrics.exporter import LogMetrics
from exporters.logmetrics.tailer import FINGERPRINT_BYTES, Follower
from exporters.loki import LokiShipper

XID = "May 18 19:02:39 node3 kernel: NVRM: Xid (PCI:0000:2b:00): 48, pid=1, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n"
XID79 = "May 18 19:05:00 node1 kernel: NVRM: Xid (PCI:0000:2b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


def logs(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    (d / "jobs").mkdir(parents=True)
    (d / "kernel").mkdir()
    return d


def samples(m: LogMetrics, name: str) -> dict[tuple, float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for fam in m.collect()
        for s in fam.samples
        if s.name == name
    }


def xids(m: LogMetrics) -> dict[tuple, float]:
    return samples(m, "goodput_node_xid_errors_total")


def restart(m: LogMetrics) -> LogMetrics:
    """Shut down (the state is saved) and start again on the same files."""
    m.save_state()
    m2 = LogMetrics(m.log_dir, state_file=m.state_file)
    m2.poll_once()
    return m2


N3_48 = (("node", "node3"), ("xid", "48"))


def test_a_restart_counts_no_old_line_again(tmp_path):
    d, sf = logs(tmp_path), tmp_path / "state" / "state.json"
    k = d / "kernel" / "node3.log"
    k.write_text(XID * 3)
    (d / "jobs" / "slurm-42.out").write_text("step\n" + OOM)
    m = LogMetrics(d, state_file=sf)
    m.poll_once()
    assert xids(m) == {N3_48: 3.0}
    m2 = restart(m)
    assert m2.restored
    assert xids(m2) == {N3_48: 3.0}
    oom = samples(m2, "goodput_log_pattern_matches_total")
    assert oom[(("job_id", "42"), ("node", ""), ("pattern", "cuda_oom"))] == 1.0
    assert samples(m2, "goodput_log_lines_total")[(("source", "kernel"),)] == 3.0
    with open(k, "a") as f:
        f.write(XID)
    m2.poll_once()
    assert xids(m2) == {N3_48: 4.0}  # the new line, once
    m3 = restart(m2)
    assert xids(m3) == {N3_48: 4.0}


def test_a_restart_after_a_rotation_does_not_reset_the_counter(tmp_path):
    """The reviewer's case: 3 XIDs, rotated (rename + new file with 1), restart: 4, not 1."""
    d, sf = logs(tmp_path), tmp_path / "state.json"
    k = d / "kernel" / "node3.log"
    k.write_text(XID * 3)
    m = LogMetrics(d, state_file=sf)
    m.poll_once()
    os.rename(k, d / "kernel" / "node3.log.1")
    k.write_text(XID)
    m.poll_once()
    assert xids(m) == {N3_48: 4.0}
    assert xids(restart(m)) == {N3_48: 4.0}


def test_a_rotation_while_the_exporter_is_down_adds_to_the_counter(tmp_path):
    d, sf = logs(tmp_path), tmp_path / "state.json"
    k = d / "kernel" / "node3.log"
    k.write_text(XID * 3)
    m = LogMetrics(d, state_file=sf)
    m.poll_once()
    m.save_state()  # shut down; then logrotate, and the node logs one more XID
    os.rename(k, d / "kernel" / "node3.log.1")
    k.write_text(XID)
    m2 = LogMetrics(d, state_file=sf)
    m2.poll_once()
    assert xids(m2) == {N3_48: 4.0}


def test_a_copy_truncated_kernel_log_grown_again_while_down_is_read_from_its_start(tmp_path):
    d, sf = logs(tmp_path), tmp_path / "state.json"
    k = d / "kernel" / "node1.log"
    k.write_text("".join(f"May 18 19:00:{i:02d} node1 kernel: old line {i}\n" for i in range(40)))
    m = LogMetrics(d, state_file=sf)
    m.poll_once()
    m.save_state()
    with open(k, "r+") as f:  # copytruncate: same inode
        f.truncate(0)
    new = XID79 + "".join(
        f"May 18 19:05:{i:02d} node1 kernel: new line {i}\n" for i in range(1, 60)
    )
    with open(k, "a") as f:
        f.write(new)
    m2 = LogMetrics(d, state_file=sf)
    m2.poll_once()
    assert xids(m2) == {(("node", "node1"), ("xid", "79")): 1.0}
    assert samples(m2, "goodput_log_lines_total")[(("source", "kernel"),)] == 40 + 60


def test_lines_read_after_the_last_save_count_once_after_a_crash(tmp_path):
    d, sf = logs(tmp_path), tmp_path / "state.json"
    k = d / "kernel" / "node3.log"
    k.write_text(XID)
    m = LogMetrics(d, state_file=sf)
    m.poll_once()
    m.save_state()
    with open(k, "a") as f:
        f.write(XID * 2)
    m.poll_once()  # read and exposed, then killed before the next save
    assert xids(m) == {N3_48: 3.0}
    m2 = LogMetrics(d, state_file=sf)
    assert xids(m2) == {N3_48: 1.0}  # the saved totals ...
    m2.poll_once()
    assert xids(m2) == {N3_48: 3.0}  # ... and the lines after them, once


def test_run_saves_the_state_when_stopped(tmp_path):
    d, sf = logs(tmp_path), tmp_path / "state.json"
    (d / "kernel" / "node3.log").write_text(XID * 2)
    m = LogMetrics(d, state_file=sf, save_seconds=3600)
    stop = threading.Event()
    t = threading.Thread(target=m.run, args=(stop, 0.01))
    t.start()
    while not m.state.xids:
        stop.wait(0.01)
    stop.set()
    t.join(5)
    saved = json.loads(sf.read_text())
    assert saved["xids"] == [["node3", "48", 2.0]]
    assert list(saved["positions"]) == ["kernel/node3.log"]


def test_series_of_logs_removed_while_down_are_not_restored(tmp_path):
    d, sf = logs(tmp_path), tmp_path / "state.json"
    (d / "kernel" / "node3.log").write_text(XID)
    (d / "jobs" / "slurm-42.out").write_text(OOM)
    m = LogMetrics(d, state_file=sf)
    m.poll_once()
    m.save_state()
    (d / "kernel" / "node3.log").unlink()  # moved aside (the demo's archive_logs)
    (d / "jobs" / "slurm-42.out").unlink()
    m2 = LogMetrics(d, state_file=sf)
    m2.poll_once()
    assert xids(m2) == {}
    assert samples(m2, "goodput_log_pattern_matches_total") == {}
    assert "42" not in m2.state.jobs


def test_job_gauges_survive_a_restart(tmp_path):
    d, sf = logs(tmp_path), tmp_path / "state.json"
    line = " iteration       10/    1000 | consumed samples:        640 | elapsed time per iteration (ms): 500.0 | global batch size:   64 | lm loss: nan | number of skipped iterations: 1 | number of nan iterations: 1 |\n"
    (d / "jobs" / "slurm-42.out").write_text(line)
    m = LogMetrics(d, state_file=sf)
    m.poll_once(now=1000.0)
    m2 = restart(m)
    for name in (
        "goodput_job_last_progress_timestamp_seconds",
        "goodput_job_iteration",
        "goodput_job_nan_iterations_total",
        "goodput_job_skipped_iterations_total",
        "goodput_job_throughput_samples_per_second",
    ):
        assert samples(m2, name) == samples(m, name), name
    assert m2.state.jobs["42"].loss != m2.state.jobs["42"].loss  # NaN kept


def test_a_corrupt_or_foreign_state_file_is_a_warning_and_a_fresh_start(tmp_path, caplog):
    d, sf = logs(tmp_path), tmp_path / "state.json"
    (d / "kernel" / "node3.log").write_text(XID * 2)
    bad = [
        b"\x00{not json",
        b"[]",
        json.dumps({"version": 1, "log_dir": os.path.abspath(d), "jobs": {}}).encode(),
        json.dumps(
            {
                "version": 1,
                "log_dir": os.path.abspath(d),
                "positions": {"kernel/node3.log": [1, 2, "x", None]},
                "jobs": {},
                "pattern_matches": [],
                "xids": [["node3", "48", "many"]],
                "lines": {},
            }
        ).encode(),
        json.dumps({"version": 1, "log_dir": "/elsewhere"}).encode(),
    ]
    for blob in bad:
        sf.write_bytes(blob)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            m = LogMetrics(d, state_file=sf)
        assert not m.restored
        assert any("state file" in r.getMessage() for r in caplog.records), blob
        m.poll_once()
        assert xids(m) == {N3_48: 2.0}  # as before: every file from its start
    assert m.save_state()  # the next save replaces it
    assert LogMetrics(d, state_file=sf).restored


def test_a_state_file_that_cannot_be_written_stops_nothing(tmp_path, caplog):
    d = logs(tmp_path)
    (tmp_path / "file").write_text("")
    (d / "kernel" / "node3.log").write_text(XID)
    m = LogMetrics(d, state_file=tmp_path / "file" / "state.json")
    m.poll_once()
    with caplog.at_level(logging.WARNING):
        assert not m.save_state()
    assert xids(m) == {N3_48: 1.0}


# ---------------------------------------------------------------------------- the tailer
def test_copy_truncate_and_regrowth_before_a_restart_is_read_from_the_start(tmp_path):
    p = tmp_path / "node1.log"
    old = "".join(f"May 18 19:00:{i:02d} node1 kernel: old line {i}\n" for i in range(40))
    p.write_text(old)
    f = Follower(p)
    assert len(f.poll()) == 40
    pos = f.position()
    f.close()
    with open(p, "r+") as fh:
        fh.truncate(0)
    new = [XID79.rstrip("\n")] + [
        f"May 18 19:05:{i:02d} node1 kernel: new line {i}" for i in range(1, 60)
    ]
    with open(p, "a") as fh:
        fh.write("\n".join(new) + "\n")
    assert os.path.getsize(p) > pos[1]
    g = Follower(p, resume=pos)
    assert g.poll() == new
    assert g.stats.truncations == 1


def test_copy_truncate_and_regrowth_within_one_poll_is_read_from_the_start(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("".join(f"old line {i}\n" for i in range(10)))
    f = Follower(p)
    assert len(f.poll()) == 10
    with open(p, "r+") as fh:
        fh.truncate(0)
    new = [f"new line number {i}" for i in range(20)]
    with open(p, "a") as fh:
        fh.write("\n".join(new) + "\n")
    assert f.poll() == new
    assert f.stats.truncations == 1


def test_an_unchanged_file_resumes_where_it_left_off(tmp_path):
    p = tmp_path / "a.log"
    p.write_text("one\ntwo\nthr")
    f = Follower(p)
    assert f.poll() == ["one", "two"]
    pos = f.position()
    with open(p, "a") as fh:
        fh.write("ee\nfour\n")
    g = Follower(p, resume=pos)
    assert g.poll() == ["three", "four"]
    assert g.stats.truncations == 0
    old_format = pos[:2]  # a positions file written before the fingerprint: trusted
    assert Follower(p, resume=old_format).poll() == ["three", "four"]


@settings(max_examples=40, deadline=None)
@given(
    lines=st.lists(st.integers(0, 2500), min_size=1, max_size=12),
    cuts=st.lists(st.integers(1, 12000), max_size=6),
    seed=st.integers(0, 1000),
)
def test_the_fingerprint_is_that_of_the_file_and_a_resume_loses_nothing(
    tmp_path_factory, lines, cuts, seed
):
    """However the writes are cut and read, position() fingerprints the file's own bytes before
    the offset, and a follower resumed there reads exactly the rest."""
    rnd = random.Random(seed)
    p = tmp_path_factory.mktemp("fp") / "a.log"
    data = b"".join(bytes(rnd.choice(b"abc ") for _ in range(n)) + b"\n" for n in lines)
    p.write_bytes(b"")
    f = Follower(p, max_read_bytes=700)  # several reads per poll, cut anywhere
    got, at = [], 0
    for cut in [*sorted(set(cuts)), len(data)]:
        if cut > at:
            with open(p, "ab") as fh:
                fh.write(data[at:cut])
            at = min(cut, len(data))
        got += f.poll()
        pos = f.position()
        assert pos is not None
        with open(p, "rb") as fh:
            body = fh.read()
        off = pos[1]
        want = hashlib.blake2b(body[: min(FINGERPRINT_BYTES, off)], digest_size=16)
        want.update(body[max(0, off - FINGERPRINT_BYTES) : off])
        assert pos[2] == want.hexdigest()
        rest = Follower(p, resume=pos)
        whole = Follower(p)
        assert got + rest.poll() + rest.close() == whole.poll() + whole.close()
        assert rest.stats.truncations == 0


# ---------------------------------------------------------------------------- the Loki shipper
def test_the_loki_shipper_reads_a_copy_truncated_log_grown_again_from_its_start(tmp_path):
    d, state = logs(tmp_path), tmp_path / "loki"
    k = d / "kernel" / "node1.log"
    k.write_text("".join(f"May 18 19:00:{i:02d} node1 kernel: old line {i}\n" for i in range(40)))
    s = LokiShipper("http://127.0.0.1:9", d, state, clock=lambda: 1.7e9, log_zone="UTC")
    assert s.poll_once() == 40
    with open(k, "r+") as f:
        f.truncate(0)
    new = [XID79.rstrip("\n")] + [
        f"May 18 19:05:{i:02d} node1 kernel: new line {i}" for i in range(1, 60)
    ]
    with open(k, "a") as f:
        f.write("\n".join(new) + "\n")
    for p in s.spool.files():
        p.unlink()
    s2 = LokiShipper("http://127.0.0.1:9", d, state, clock=lambda: 1.7e9, log_zone="UTC")
    s2.poll_once()
    assert [e[2] for p in s2.spool.files() for e in s2.spool.read(p)[0]] == new


def test_the_loki_shipper_reads_a_positions_file_without_fingerprints(tmp_path):
    d, state = logs(tmp_path), tmp_path / "loki"
    k = d / "kernel" / "node1.log"
    k.write_text("May 18 19:00:00 node1 kernel: one\n")
    st_ = os.stat(k)
    state.mkdir()
    (state / "positions.json").write_text(
        json.dumps({str(k): [st_.st_dev, st_.st_ino, st_.st_size, None]})
    )
    with open(k, "a") as f:
        f.write("May 18 19:00:01 node1 kernel: two\n")
    s = LokiShipper("http://127.0.0.1:9", d, state, clock=lambda: 1.7e9, log_zone="UTC")
    assert s.poll_once() == 1
    saved = json.loads((state / "positions.json").read_text())[str(k)]
    assert len(saved) == 5 and isinstance(saved[4], str)
