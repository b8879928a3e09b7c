"""The Loki shipper against tests/lokifake.py (Loki 2.6's answers, sources cited there).

Each test names the defect of the old shipper it pins (issue #16, checked there against a real
Loki 2.6.1): lines stamped with the time they were read; every line shipped again on restart;
a batch dropped after 429 retries; a 400 counted as a partial accept.
"""
# ruff: noqa: E501

from __future__ import annotations

import calendar
import os
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from clients.loki import LokiClient, LokiError, labels_key
from exporters.loki import LokiShipper, host_boot_time
from exporters.lokiapi import refused, retry_after
from tests.lokifake import FakeLoki

NOW = float(int(time.time()))


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def loki():
    f = FakeLoki()
    yield f
    f.close()


@pytest.fixture
def logs(tmp_path):
    (tmp_path / "logs" / "jobs").mkdir(parents=True)
    (tmp_path / "logs" / "kernel").mkdir()
    return tmp_path / "logs"


def shipper(url: str, logs: Path, clock: Clock | None = None, **kw) -> LokiShipper:
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("log_zone", "UTC")  # the stamps below are written in UTC, whatever the host's
    return LokiShipper(url, logs, logs.parent / "state", clock=clock or Clock(), **kw)


def write(path: Path, text: str, mode: str = "a") -> None:
    with open(path, mode) as f:
        f.write(text)


def test_lines_keep_their_own_time(loki, logs):
    # old: every line was stamped with the time it was read, so a window around the onset
    # missed lines shipped late
    t0 = NOW - 1800
    write(
        logs / "jobs" / "slurm-42.out",
        "no stamp yet\n"
        f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0))},250] torch.distributed: boom\n"
        "Traceback (most recent call last):\n"
        f"{iso(t0 + 5)} iteration 7\n",
    )
    dmesg_t = time.strftime("[%a %b %d %H:%M:%S %Y]", time.gmtime(t0 + 60))
    write(
        logs / "kernel" / "node2.log",
        f"{dmesg_t} NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n",
    )
    s = shipper(loki.url, logs)
    assert s.poll_once() == 5 and s.send_once() == 0
    got = {line: ts for _labels, ts, line in loki.entries()}
    assert got["no stamp yet"] == int(NOW * 1e9)  # nothing earlier to go by: read time
    boom = int((t0 + 0.25) * 1e9)
    assert (
        got[f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0))},250] torch.distributed: boom"]
        == boom
    )
    assert got["Traceback (most recent call last):"] == boom + 1  # the line before's, in order
    assert got[f"{iso(t0 + 5)} iteration 7"] == int((t0 + 5) * 1e9)
    assert got[f"{dmesg_t} NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."] == int(
        (t0 + 60) * 1e9
    )
    assert s.times == {"read_time": 1, "previous": 1, "line": 3}


def test_local_time_stamps_are_read_in_the_configured_zone(logs):
    """Old: a stamp without a zone (syslog, Python logging, glog, dmesg -T print local time)
    was read as UTC, so on a New York node a line written a minute ago went to Loki 5 hours in
    the past, outside the receiver's query window."""
    ny = ZoneInfo("America/New_York")
    written = NOW - 60
    local = datetime.fromtimestamp(written, ny)
    lines = [
        local.strftime("%b %e %H:%M:%S") + " node1 kernel: NVRM: Xid (PCI:0000:2b:00): 79",
        local.strftime("[%a %b %e %H:%M:%S %Y]") + " NVRM: Xid (PCI:0000:2b:00): 79",
        local.strftime("[%Y-%m-%d %H:%M:%S") + ",000] torch.distributed.elastic: failed",
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(written)) + " its own zone: kept",
    ]
    s = shipper("http://127.0.0.1:9", logs, log_zone="America/New_York")
    entries = s.stamp("kernel", "node1", logs / "kernel" / "node1.log", lines, NOW)
    # each its own time (a line equal to the one before is put 1 ns after it, in file order)
    assert [e[1] // 10**9 for e in entries] == [int(written)] * 4
    assert s.times == {"line": 4}
    # the same shipper by tzinfo; an unknown zone name fails at construction, not per line
    assert shipper("http://127.0.0.1:9", logs, log_zone=ny).log_zone == ny
    with pytest.raises(ValueError, match="unknown time zone 'America/Nowhere'"):
        shipper("http://127.0.0.1:9", logs, log_zone="America/Nowhere")


def test_monotonic_kernel_lines_use_the_boot_time_or_the_arrival(loki, logs):
    write(logs / "kernel" / "node1.log", "[  100.5] NVRM: a\n[  160.5] NVRM: b\n")
    write(logs / "kernel" / "node2.log", "[  100.5] NVRM: a\n[  160.5] NVRM: b\n")
    boot = NOW - 3000
    s = shipper(loki.url, logs, boot_times={"node1": boot})
    s.poll_once()
    s.send_once()
    by = {(labels["node"], line): ts for labels, ts, line in loki.entries()}
    assert by[("node1", "[  100.5] NVRM: a")] == int((boot + 100.5) * 1e9)
    # node2's boot is unknown: its newest line cannot be later than when it was read
    assert by[("node2", "[  160.5] NVRM: b")] == int(NOW * 1e9)
    assert by[("node2", "[  100.5] NVRM: a")] == int((NOW - 60) * 1e9)


def test_a_restart_resumes_instead_of_shipping_everything_again(loki, logs):
    # old: 116 lines stored for 58 after a restart over the same files
    job = logs / "jobs" / "slurm-7.out"
    write(job, "".join(f"{iso(NOW - 100 + i)} step {i}\n" for i in range(58)))
    a = shipper(loki.url, logs)
    a.poll_once()
    a.send_once()
    a.close()
    write(job, f"{iso(NOW)} step 58\nhalf a li")
    b = shipper(loki.url, logs)
    b.poll_once()
    b.send_once()
    assert b.sent == 1 and len(loki.lines()) == 59
    write(job, "ne\n")  # the partial line is read whole once it ends
    c = shipper(loki.url, logs)
    c.poll_once()
    c.send_once()
    assert c.sent == 1 and loki.lines()[-1] == "half a line"


def test_rotation_and_truncation_while_stopped(loki, logs):
    job = logs / "jobs" / "slurm-8.out"
    write(job, f"{iso(NOW - 50)} old 1\n{iso(NOW - 49)} old 2\n")
    a = shipper(loki.url, logs)
    a.poll_once()
    a.send_once()
    os.rename(job, logs / "jobs" / "slurm-8.out.1")  # rotated: a new file (new inode)
    write(job, f"{iso(NOW - 10)} new 1\n")
    b = shipper(loki.url, logs)
    b.poll_once()
    b.send_once()
    assert b.sent == 1
    write(job, f"{iso(NOW - 5)} cut\n", mode="w")  # copy-truncate: same inode, shorter
    c = shipper(loki.url, logs)
    c.poll_once()
    c.send_once()
    assert c.sent == 1
    assert {ln.split(" ", 1)[1] for ln in loki.lines()} == {"old 1", "old 2", "new 1", "cut"}


def test_429_keeps_the_batch_and_honours_retry_after(loki, logs):
    # old: after the retries the batch was dropped (nothing stored, lines counted failed)
    clock = Clock()
    write(logs / "jobs" / "slurm-9.out", f"{iso(NOW)} survives\n")
    loki.script = [(429, {"Retry-After": "30"}), 503]
    s = shipper(loki.url, logs, clock)
    s.poll_once()
    assert s.send_once() == 1 and s.next_try == NOW + 30
    clock.t = NOW + 29
    assert s.send_once() == 1 and loki.pushes == [429]  # waits as Loki asked
    clock.t = NOW + 31
    assert s.send_once() == 1 and loki.pushes == [429, 503]
    clock.t = s.next_try
    assert s.send_once() == 0 and loki.lines() == [f"{iso(NOW)} survives"]
    assert s.errors == {"429": 1, "503": 1} and not s.refused


def test_an_outage_and_a_restart_lose_nothing(loki, logs):
    write(
        logs / "jobs" / "slurm-10.out", "".join(f"{iso(NOW - 9 + i)} line {i}\n" for i in range(10))
    )
    down = shipper("http://127.0.0.1:9", logs)  # nothing listens there
    down.poll_once()
    assert down.send_once() == 1 and down.errors == {"connection": 1}
    up = shipper(loki.url, logs)  # restarted, Loki back: the spool survived
    up.poll_once()
    assert up.send_once() == 0
    assert len(loki.lines()) == 10 and up.sent == 10


def test_the_spool_is_bounded_and_reading_waits_for_loki(loki, logs):
    job = logs / "jobs" / "slurm-11.out"
    s = shipper("http://127.0.0.1:9", logs, spool_max_bytes=2_000, batch_max_lines=10)
    for round_ in range(5):
        write(job, "".join(f"{iso(NOW)} r{round_} {'x' * 100} {i}\n" for i in range(10)))
        s.poll_once()
        s.send_once()
    assert s.spool.full() and s.poll_once() == 0  # stopped reading; the file keeps the rest
    held = s.spool.bytes()
    assert held < 2_000 + 12 * 200
    s.loki.url = loki.url
    s.next_try = 0
    for _ in range(10):
        s.poll_once()
        s.send_once()
    assert len(loki.lines()) == 50 and s.spool.bytes() == 0


def test_400_too_old_refuses_only_the_old_lines(loki, logs):
    eight_days = NOW - 8 * 86400
    write(logs / "jobs" / "slurm-12.out", f"{iso(eight_days)} backfill\n{iso(NOW)} fresh\n")
    s = shipper(loki.url, logs)
    s.poll_once()
    s.send_once()
    assert loki.lines() == [f"{iso(NOW)} fresh"]
    assert s.refused == {"too_old": 1} and s.sent == 1
    assert loki.pushes == [400, 204]  # the rest sent once more: Loki keeps one copy


def test_a_400_that_refuses_the_whole_request_loses_only_the_bad_lines(logs):
    # old: counted as a partial accept, so the good lines of the request were lost
    loki = FakeLoki(refuse_whole_request=True)
    try:
        write(logs / "kernel" / "node3.log", f"{iso(NOW - 8 * 86400)} node3 kernel: stale\n")
        write(logs / "jobs" / "slurm-13.out", f"{iso(NOW)} good 1\n{iso(NOW)} good 2\n")
        s = shipper(loki.url, logs)
        s.poll_once()
        s.send_once()
        assert loki.lines() == [f"{iso(NOW)} good 1", f"{iso(NOW)} good 2"]
        assert s.refused == {"too_old": 1} and loki.pushes == [400, 204]
    finally:
        loki.close()


def test_too_far_behind_is_counted_per_stream(loki, logs):
    job = logs / "jobs" / "slurm-14.out"
    write(job, f"{iso(NOW)} newest\n")
    s = shipper(loki.url, logs)
    s.poll_once()
    s.send_once()
    write(job, f"{iso(NOW - 7200)} two hours late\n{iso(NOW - 1)} in time\n")
    s.poll_once()
    s.send_once()
    assert s.refused == {"too_far_behind": 1}
    assert sorted(loki.lines()) == sorted([f"{iso(NOW)} newest", f"{iso(NOW - 1)} in time"])


def test_413_splits_the_batch(loki, logs):
    write(logs / "jobs" / "slurm-15.out", "".join(f"{iso(NOW)} {i}\n" for i in range(4)))
    loki.script = [413]
    s = shipper(loki.url, logs)
    s.poll_once()
    assert s.send_once() == 0 and len(loki.lines()) == 4 and loki.pushes[0] == 413


# ---------------------------------------------------------------------- Loki's exact words
JOB = labels_key({"source": "job", "job_id": "1"})
FOO = labels_key({"foo": "bar2"})


def _ns(text: str) -> int:
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")) * 10**9


def test_refused_reads_the_too_old_answer_of_grafana_loki_11774():
    body = (
        "entry for stream '{foo=\"bar2\"}' has timestamp too old: 2019-10-11T18:23:58Z, "
        "oldest acceptable timestamp is: 2024-01-18T08:00:00Z\n"
    )
    entries = [
        (FOO, _ns("2019-10-11T18:23:58Z"), "fizzbuzz"),
        (FOO, _ns("2024-01-25T08:00:00Z"), "new"),
    ]
    assert refused(body, entries) == {0: "too_old"}


def test_refused_reads_the_too_far_behind_answers():
    # Loki 2.4 (grafana/loki#4694): no cut-off, a total per stream
    old = (
        "entry with timestamp 2021-11-08 03:31:11.947572938 +0000 UTC ignored, reason: 'entry too far "
        'behind\' for stream: {job="fluentbit", k8s_app="fluent-bit-logging"},\ntotal ignored: 1 out of 1'
    )
    fluent = labels_key({"job": "fluentbit", "k8s_app": "fluent-bit-logging"})
    entries = [(JOB, 5, "other stream"), (fluent, 9, "b"), (fluent, 3, "a")]
    assert refused(old, entries) == {2: "too_far_behind"}  # the oldest of that stream
    # Loki 2.7+ (grafana/loki#9151): with the cut-off
    new = (
        "entry with timestamp 2023-04-17 07:24:45 +0000 UTC ignored, reason: 'entry too far behind, "
        'oldest acceptable timestamp is: 2023-04-18T02:15:06Z\' for stream: {author="", filename="x"},'
    )
    stream = labels_key({"author": "", "filename": "x"})
    entries = [
        (stream, _ns("2023-04-17T07:24:45Z"), "late"),
        (stream, _ns("2023-04-18T03:00:00Z"), "ok"),
    ]
    assert refused(new, entries) == {0: "too_far_behind"}


def test_refused_knows_nothing_of_an_answer_it_cannot_read():
    assert refused("some proxy said no\n", [(JOB, 1, "x")]) == {}
    # an older Loki's too-old answer names the entry but no cut-off
    body = "entry for stream '{foo=\"bar2\"}' has timestamp too old: 2019-10-11T18:23:58Z\n"
    entries = [(FOO, _ns("2019-10-11T18:23:58Z"), "a"), (FOO, _ns("2019-10-11T18:24:00Z"), "b")]
    assert refused(body, entries) == {0: "too_old"}


def test_refused_reads_a_stream_whose_label_go_quoted_json_cannot_read():
    """Go quotes a bell as \\x07, which JSON cannot read: the answer's other entries are
    still judged (an exception failed the spool's batch at every try, shipping nothing)."""
    body = (
        "entry for stream '{job=\"a\\x07b\"}' has timestamp too new: 2030-01-01T00:00:00Z\n"
        "entry for stream '{foo=\"bar2\"}' has timestamp too old: 2019-10-11T18:23:58Z, "
        "oldest acceptable timestamp is: 2024-01-18T08:00:00Z\n"
    )
    entries = [(FOO, _ns("2019-10-11T18:23:58Z"), "old"), (FOO, _ns("2024-01-25T08:00:00Z"), "ok")]
    assert refused(body, entries) == {0: "too_old"}


def test_a_deleted_log_is_forgotten(loki, logs):
    """The last time stamp kept per file goes with the file (one per job, for good, before)."""
    path = logs / "jobs" / "slurm-17.out"
    write(path, f"{iso(NOW)} a\n")
    s = shipper(loki.url, logs)
    s.poll_once()
    assert path in s._last_ns
    path.unlink()
    s.poll_once()
    s.poll_once()
    assert path not in s._last_ns


def test_an_unreadable_400_is_resent_once_then_counted(loki, logs):
    write(logs / "jobs" / "slurm-16.out", f"{iso(NOW)} a\n{iso(NOW)} b\n")
    loki.script = [400, 400]
    s = shipper(loki.url, logs)
    s.poll_once()
    assert s.send_once() == 0 and loki.pushes == [400, 400]
    assert s.refused == {"unknown": 2} and s.sent == 0


def test_retry_after_forms():
    assert retry_after("120", 0) == 120
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470.0) == 10
    assert retry_after("soon", 0) is None and retry_after(None, 0) is None


def test_query_range_reads_what_was_shipped(loki, logs):
    write(
        logs / "jobs" / "slurm-42.out",
        f"{iso(NOW - 5)} NCCL WARN NET/IB : Got async event : port error\n{iso(NOW - 4)} step\n",
    )
    s = shipper(loki.url, logs)
    s.poll_once()
    s.send_once()
    got = LokiClient(loki.url).query_range(
        '{source="job", job_id="42"} |= "NCCL"', start=NOW - 60, end=NOW + 1
    )
    assert [g.line.split(" ", 1)[1] for g in got] == [
        "NCCL WARN NET/IB : Got async event : port error"
    ]
    assert got[0].labels == {"source": "job", "job_id": "42"}
    with pytest.raises(LokiError, match="400.*parse error"):
        LokiClient(loki.url).query_range("not logql")
    with pytest.raises(LokiError, match="unreachable"):
        LokiClient("http://127.0.0.1:9").query_range('{job_id="1"}')


def test_metrics_and_label_checks(loki, logs):
    write(logs / "jobs" / "slurm-1.out", f"{iso(NOW)} x\n")
    s = shipper(loki.url, logs, static_labels={"cluster": "c1"})
    s.poll_once()
    s.send_once()
    assert loki.entries()[0][0] == {"cluster": "c1", "source": "job", "job_id": "1"}
    names = {m.name for m in s.collect()}
    assert {"goodput_loki_lines", "goodput_loki_spool_bytes", "goodput_loki_line_times"} <= names
    with pytest.raises(ValueError, match="label name"):
        shipper(loki.url, logs, static_labels={"bad-name": "1"})
    with pytest.raises(ValueError, match="label name"):
        shipper(loki.url, logs, static_labels={"source": "x"})


def test_host_boot_time(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n")
    assert host_boot_time(stat) == 1700000000.0
    assert host_boot_time(tmp_path / "missing") is None


def test_a_crash_between_spool_and_positions_doubles_nothing(loki, logs, monkeypatch):
    write(logs / "jobs" / "slurm-17.out", f"{iso(NOW - 3)} a\n{iso(NOW - 2)} b\n")
    a = shipper(loki.url, logs)

    def die() -> None:
        raise SystemExit("killed after the spool write, before the positions")

    monkeypatch.setattr(a, "_save_positions", die)
    with pytest.raises(SystemExit):
        a.poll_once()
    b = shipper(loki.url, logs)  # restarted: the spool has the batch, the positions do not
    b.poll_once()
    assert b.send_once() == 0
    assert loki.received == 4 and loki.lines() == [f"{iso(NOW - 3)} a", f"{iso(NOW - 2)} b"]


def test_an_unreadable_spool_file_is_set_aside(loki, logs):
    write(logs / "jobs" / "slurm-18.out", f"{iso(NOW)} after\n")
    s = shipper(loki.url, logs)
    (s.spool.dir / "0000000000000000.json").write_text('{"entries": [["x"')  # a torn write
    s.poll_once()
    assert s.send_once() == 0 and loki.lines() == [f"{iso(NOW)} after"]
    assert s.refused == {"unreadable_spool": 1} and list(s.spool.dir.glob("*.bad"))


def test_a_date_inside_a_line_is_its_time_only_when_plausible(loki, logs):
    write(
        logs / "jobs" / "slurm-19.out",
        f"{iso(NOW - 10)} saving\n"
        "  saved /ckpt/run-2023-01-01T00:00:00/iter_0000100\n"  # a path, not a time
        f"slurmstepd: error: *** JOB 19 ON node1 CANCELLED AT {iso(NOW - 5)[:19]} ***\n",
    )
    s = shipper(loki.url, logs)
    s.poll_once()
    s.send_once()
    times = [ts for _labels, ts, _line in loki.entries()]
    assert times == [int((NOW - 10) * 1e9), int((NOW - 10) * 1e9) + 1, int((NOW - 5) * 1e9)]


def test_a_year_zero_date_in_a_line_loses_no_line(loki, logs):
    # `0000-01-05T00:00:00` (a placeholder date a job prints) made the time parser raise; the
    # round's lines were already read, so every line of that round never reached the spool
    job = logs / "jobs" / "slurm-21.out"
    write(job, f"{iso(NOW - 5)} before\nvalid_from 0000-01-05T00:00:00\n{iso(NOW - 4)} after\n")
    s = shipper(loki.url, logs)
    assert s.poll_once() == 3
    s.send_once()
    lines = [f"{iso(NOW - 5)} before", "valid_from 0000-01-05T00:00:00", f"{iso(NOW - 4)} after"]
    assert sorted(loki.lines()) == sorted(lines)


def test_an_unknown_log_timezone_stops_the_exporter_at_start_up(tmp_path):
    """`goodput exporter logs --log-timezone` / GOODPUT_LOG_TIMEZONE: a bad name is a usage
    error before anything is read or served, not a crash on the first line."""
    from typer.testing import CliRunner

    from goodput.cli import app as cli

    argv = ["exporter", "logs", "--log-dir", str(tmp_path), "--loki-url", "http://127.0.0.1:9"]
    for args, env in (
        (["--log-timezone", "Mars/Olympus_Mons"], {}),
        ([], {"GOODPUT_LOG_TIMEZONE": "Mars/Olympus_Mons"}),
    ):
        r = CliRunner().invoke(cli, [*argv, *args], env=env)
        assert r.exit_code == 2, r.output
        said = " ".join(r.output.replace("\u2502", " ").split())  # rich's box, wrapped
        assert "unknown time zone" in said and "Mars/Olympus_Mons" in said


def test_with_a_loki_url_the_exporter_still_listens_where_it_is_told(tmp_path, monkeypatch):
    """`--loki-url` took the machine's host name for the shipper's boot time under the name of
    the --host option, so /metrics listened on the host name instead of --host."""
    from typer.testing import CliRunner

    from exporters.logmetrics import exporter
    from goodput.cli import app as cli

    seen: dict = {}
    monkeypatch.setattr(exporter, "serve", lambda *a, **k: seen.update(host=a[2]))
    monkeypatch.setenv("GOODPUT_STATE_DIR", str(tmp_path / "state"))
    argv = ["exporter", "logs", "--log-dir", str(tmp_path), "--host", "0.0.0.0"]
    r = CliRunner().invoke(cli, [*argv, "--loki-url", "http://127.0.0.1:9"])
    assert r.exit_code == 0, r.output
    assert seen == {"host": "0.0.0.0"}
