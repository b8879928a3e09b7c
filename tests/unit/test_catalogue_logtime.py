"""Times in real log lines: each prefix below is copied from the public report named with it.

The old parser (recovery/evidence/logs.py `line_time`) read none of `dmesg -T`, plain `dmesg`,
`E321` (c10 does not zero-pad the month), `,123` fractions or short-precise fractions.
"""
# ruff: noqa: E501

from __future__ import annotations

import calendar
import time
from datetime import timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalogue import logtime
from catalogue.logtime import BootClock, parse
from clients.loki import labels_key
from exporters.lokiapi import refused


def utc(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")))


REF = utc("2026-06-01 00:00:00")

REAL = [
    # (line, form, expected UTC time, source)
    (
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception",
        "ctime",
        utc("2024-08-30 11:43:09"),
        "leptonai/gpud#46",
    ),
    (
        "[Sat Jul  1 07:33:33 2017] Initializing cgroup subsys cpuset",
        "ctime",
        utc("2017-07-01 07:33:33"),
        "elastic/support-diagnostics#161",
    ),
    (
        "2023-12-22T12:26:24,559615-08:00 device vethab20cf5 entered promiscuous mode",
        "iso",
        utc("2023-12-22 20:26:24") + 0.559615,
        "util-linux/util-linux#2648",
    ),
    (
        "2023-09-08T17:20:30+0200 tarta r710_fan_controller.sh[20911]: Highest drive temperature: 43 Celcius.",
        "iso",
        utc("2023-09-08 15:20:30"),
        "systemd/systemd#29134 (short-iso)",
    ),
    (
        "2023-09-08T17:20:30.655028+0200 tarta r710_fan_controller.sh[20911]: Highest drive temperature",
        "iso",
        utc("2023-09-08 15:20:30") + 0.655028,
        "systemd/systemd#29134 (short-iso-precise)",
    ),
    (
        "2025-02-12T06:25:29.149489+0000 ip-10-0-0-1 kernel: x",
        "iso",
        utc("2025-02-12 06:25:29") + 0.149489,
        "aws/eks-node-monitoring-agent#98",
    ),
    (
        "Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT",
        "syslog",
        utc("2026-02-14 05:03:41"),
        "leptonai/gpud#1209 (journalctl -k)",
    ),
    (
        "Mar 14 10:12:31.545053 localhost kernel: x86/PAT: Configuration [0-7]: WB  WC  UC- UC  WB  WP  UC- WT",
        "syslog",
        utc("2026-03-14 10:12:31") + 0.545053,
        "bottlerocket-os/bottlerocket#2900 (short-precise)",
    ),
    (
        "[2024-04-10 16:02:56,193] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 270 closing signal SIGTERM",
        "iso",
        utc("2024-04-10 16:02:56") + 0.193,
        "aws-samples/amazon-eks-machine-learning-with-terraform-and-kubeflow#93",
    ),
    (
        "[2024-02-27T21:35:32.106313Z] fa88a9df || WARNING: torch.distributed.elastic.agent.server.api:Received 15 death signal",
        "iso",
        utc("2024-02-27 21:35:32") + 0.106313,
        "determined-ai/determined#8915",
    ),
    (
        "[2024-02-22 19:20:17,149][datasets.builder][WARNING] - Found cached dataset json",
        "iso",
        utc("2024-02-22 19:20:17") + 0.149,
        "MCG-NJU/RTD-Action#31",
    ),
    (
        "[NeMo W 2024-03-20 18:55:16 nemo_logging:349] /home/egor/.local/lib/python3.8/site-packages/transformers/utils/generic.py:311: UserWarning",
        "iso",
        utc("2024-03-20 18:55:16"),
        "bene-ges/nemo_compatible#20",
    ),
    (
        "2024-03-20 18:55:16.268871: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow binary is optimized",
        "iso",
        utc("2024-03-20 18:55:16") + 0.268871,
        "bene-ges/nemo_compatible#20",
    ),
    (
        "[rank0]:[E1010 11:50:05.315197062 ProcessGroupNCCL.cpp:565] [Rank 0] Watchdog caught collective operation timeout",
        "glog",
        utc("2025-10-10 11:50:05") + 0.315197062,
        "NVIDIA/Megatron-LM#1207",
    ),
    (
        "W1010 11:39:41.458000 140602427192448 torch/distributed/run.py:757] *****************************************",
        "glog",
        utc("2025-10-10 11:39:41") + 0.458,
        "NVIDIA/Megatron-LM#1207",
    ),
    (
        "[80818] [rank4]:[E321 02:07:12.539400006 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 4] Timeout at NCCL work: 1580",
        None,
        None,
        "hiyouga/LlamaFactory#7396 (a `[80818] ` line-number prefix: not a launcher's)",
    ),
    (
        "[rank4]:[E321 02:07:12.539400006 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 4] Timeout at NCCL work: 1580",
        "glog",
        utc("2026-03-21 02:07:12") + 0.539400006,
        "hiyouga/LlamaFactory#7396",
    ),
    (
        "W0227 17:39:41.936000 293814 site-packages/torch/distributed/elastic/multiprocessing/api.py:766] Closing process 293866 via signal SIGTERM",
        "glog",
        utc("2026-02-27 17:39:41") + 0.936,
        "NVIDIA/nvidia-resiliency-ext#18",
    ),
    (
        "INFO 02-22 08:52:08 __init__.py:190] Automatically detected platform cuda.",
        "mmdd",
        utc("2026-02-22 08:52:08"),
        "sgl-project/sglang#3784",
    ),
    (
        "[default0]:[2024-04-10 16:02:56,193] torch.distributed.elastic.multiprocessing.api: [WARNING] x",
        "iso",
        utc("2024-04-10 16:02:56") + 0.193,
        "torchrun --tee prefix, rwth-i6/i6_core#658 + the elastic line above",
    ),
    (
        "[default3]:python: src/psm2_nccl_net.c:756: mq_progress_loop: Assertion `r->used' failed.",
        None,
        None,
        "pytorch/pytorch#75087 (no time)",
    ),
]


@pytest.mark.parametrize("line,form,expected,source", REAL, ids=[r[3] for r in REAL])
def test_real_prefixes(line, form, expected, source):
    s = parse(line, REF)
    if form is None:
        assert s is None or s.form == "embedded"
        return
    assert s is not None and s.form == form
    assert s.time == pytest.approx(expected, abs=1e-6)


def test_the_W1010_line_is_last_year_when_read_in_june():
    # glog and syslog carry no year: October read in June is last October
    assert parse("W1010 11:39:41.458000 1 run.py:757] x", REF).time == pytest.approx(
        utc("2025-10-10 11:39:41") + 0.458
    )
    # ... but a December line read on 1 January is from the day before
    assert parse("Dec 31 23:59:59 n kernel: x", utc("2026-01-01 00:00:10")).time == utc(
        "2025-12-31 23:59:59"
    )


def test_plain_dmesg_is_monotonic_and_uses_the_boot_time_when_known():
    line = "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0"  # NVIDIA/NVSentinel#155
    s = parse(line, REF)
    assert (s.form, s.monotonic, s.time) == ("monotonic", 1843.308145, None)
    assert parse(line, REF, boot_time=1_700_000_000.0).time == pytest.approx(1_700_001_843.308145)
    big = parse(
        "[17159596.699613] device vethab20cf5 entered promiscuous mode", REF
    )  # util-linux#2648
    assert big.monotonic == 17159596.699613


def test_a_node_zone_applies_to_stamps_without_one():
    line = "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13"
    plus2 = timezone(timedelta(hours=2))
    assert parse(line, REF, zone=plus2).time == utc("2024-08-30 09:43:09")
    # a stamp with its own zone ignores the node's
    assert parse("2023-09-08T17:20:30+0200 x", REF, zone=plus2).time == utc("2023-09-08 15:20:30")


NY = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    "line",
    [
        "2026-03-08 {hms} node1 kernel: NVRM: Xid",  # ISO without a zone
        "[2026-03-08 {hms},123] torch.distributed.elastic: [ERROR] failed",  # Python logging
        "[Sun Mar  8 {hms} 2026] NVRM: Xid (PCI:0000:2b:00): 79",  # dmesg -T
        "Mar  8 {hms} node1 kernel: NVRM: Xid",  # syslog
        "E0308 {hms}.315197062 ProcessGroupNCCL.cpp:565] watchdog",  # glog
        "INFO 03-08 {hms} __init__.py:190] vLLM",  # mmdd
    ],
)
def test_each_stamp_takes_the_offset_of_its_own_date_across_a_dst_change(line):
    """America/New_York springs forward at 2026-03-08 02:00 EST: 01:59 is UTC-5, 03:01 UTC-4
    (one fixed offset for all lines would misdate one side by an hour)."""
    ref = utc("2026-03-09 00:00:00")
    before = parse(line.format(hms="01:59:00"), ref, zone=NY)
    after = parse(line.format(hms="03:01:00"), ref, zone=NY)
    assert int(before.time) == utc("2026-03-08 06:59:00")
    assert int(after.time) == utc("2026-03-08 07:01:00")
    # and in autumn (2026-11-01 02:00 EDT -> 01:00 EST) a November stamp is UTC-5
    assert parse("2026-11-02 12:00:00 x", ref, zone=NY).time == utc("2026-11-02 17:00:00")


def test_a_stamp_with_its_own_offset_ignores_the_node_zone():
    for line, want in [
        ("2026-03-08T01:59:00-05:00 node1 kernel: x", "2026-03-08 06:59:00"),
        ("2026-03-08T03:01:00Z node1 kernel: x", "2026-03-08 03:01:00"),
        ("2023-12-22T12:26:24,559615-08:00 kernel: x", "2023-12-22 20:26:24"),
        ("2023-09-08T17:20:30.655028+0200 host kernel: x", "2023-09-08 15:20:30"),
    ]:
        for zone in (None, NY, ZoneInfo("Asia/Kolkata"), logtime.HOST_ZONE):
            assert int(parse(line, REF, zone=zone).time) == utc(want), (line, zone)


def test_a_year_less_stamp_in_a_zone_west_of_utc_keeps_the_year_near_ref():
    """Dec 31 23:30 in New York is Jan 1 04:30 UTC: read just after, it is last year's."""
    ref = utc("2027-01-01 05:00:00")
    assert parse("Dec 31 23:30:00 node1 kernel: x", ref, zone=NY).time == utc("2027-01-01 04:30:00")


def test_an_unknown_zone_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus_Mons'"):
        logtime.named_zone("Mars/Olympus_Mons")
    with pytest.raises(ValueError, match="unknown time zone"):
        logtime.named_zone("../../etc/passwd")
    assert logtime.named_zone("America/New_York") == NY
    assert logtime.named_zone("") is logtime.HOST_ZONE
    assert logtime.named_zone(None) is logtime.HOST_ZONE


@pytest.fixture
def host_tz(monkeypatch):
    """Set the host's zone (TZ) for one test, restored after."""

    def set_tz(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield set_tz
    monkeypatch.undo()
    time.tzset()


def test_the_default_zone_is_the_hosts_with_its_dst(host_tz):
    host_tz("America/New_York")
    host = logtime.named_zone("")
    ref = utc("2026-03-09 00:00:00")
    assert parse("Mar  8 01:59:00 n kernel: x", ref, zone=host).time == utc("2026-03-08 06:59:00")
    assert parse("Mar  8 03:01:00 n kernel: x", ref, zone=host).time == utc("2026-03-08 07:01:00")
    host_tz("Europe/Berlin")
    assert parse("2026-07-01 12:00:00 x", ref, zone=host).time == utc("2026-07-01 10:00:00")
    assert parse("2026-07-01T12:00:00Z x", ref, zone=host).time == utc("2026-07-01 12:00:00")


def test_impossible_dates_are_no_time():
    assert parse("2024-02-30T10:00:00Z x", REF) is None
    assert parse("[Mon Feb 30 10:00:00 2024] x", REF) is None
    assert parse("W1310 11:39:41.458000 1 x.py:1] x", REF) is None


def test_slurm_cancel_time_inside_the_line():
    line = "slurmstepd: error: *** JOB 1234 ON node1 CANCELLED AT 2024-05-01T12:00:00 DUE TO TIME LIMIT ***"
    s = parse(line, REF)
    assert s.form == "embedded" and s.time == utc("2024-05-01 12:00:00")


def test_boot_clock_places_lines_by_arrival_never_after_it():
    clock = BootClock()
    # a backlog read at t=10_000: the newest line (mono 500) cannot be later than that
    walls = clock.place([100.0, 300.0, 500.0], arrival=10_000.0)
    assert walls == [9_600.0, 9_800.0, 10_000.0]
    # read again later: the tighter bound from the earlier read is kept
    assert clock.place([520.0], arrival=10_100.0) == [10_020.0]
    # a reboot (the stamp went down): a new boot, and lines before it end before it began
    walls = clock.place([530.0, 5.0, 7.0], arrival=20_000.0)
    assert walls[1:] == [19_998.0, 20_000.0]
    assert walls[0] <= 19_993.0


def test_line_time_wrapper_keeps_the_year_semantics():
    assert logtime.line_time("May 18 19:02:39 node1 kernel: NVRM", REF) == utc(
        "2026-05-18 19:02:39"
    )


# ---------------------------------------------------------------------- properties


WHEN = st.integers(min_value=utc("2000-01-01 00:00:00"), max_value=utc("2037-12-31 23:59:59"))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parse_never_raises(text):
    s = parse(text, REF)
    assert s is None or s.time is None or isinstance(s.time, float)
    refused(text, [(labels_key({"source": "job", "job_id": "1"}), 1, text)])


@settings(max_examples=200, deadline=None)
@given(WHEN, st.integers(min_value=0, max_value=999))
def test_every_form_reads_back_the_time_it_printed(t, ms):
    g = time.gmtime(t)
    exact = t + ms / 1000
    forms = {
        "iso": time.strftime("%Y-%m-%dT%H:%M:%S", g) + f".{ms:03d}Z x",
        "python": time.strftime("[%Y-%m-%d %H:%M:%S", g) + f",{ms:03d}] x",
        "journald": time.strftime("%Y-%m-%dT%H:%M:%S", g) + f".{ms:03d}000+0000 n kernel: x",
        "ctime": time.strftime("[%a %b ", g)
        + f"{g.tm_mday:2d}"
        + time.strftime(" %H:%M:%S %Y] x", g),
    }
    for name, line in forms.items():
        want = t if name == "ctime" else exact
        assert parse(line, REF).time == pytest.approx(want, abs=1e-6), name
    # yearless forms read in the same year, a day later
    glog = (
        f"[rank0]:[E{g.tm_mon}{g.tm_mday:02d} "
        + time.strftime("%H:%M:%S", g)
        + f".{ms:03d}000 x.cpp:1] x"
    )
    syslog = (
        time.strftime("%b ", g) + f"{g.tm_mday:2d}" + time.strftime(" %H:%M:%S", g) + " n kernel: x"
    )
    assert parse(glog, t + 86400).time == pytest.approx(exact, abs=1e-6)
    assert parse(syslog, t + 86400).time == t


def test_an_embedded_time_far_before_the_line_before_is_not_trusted():
    path = parse("  saved /ckpt/run-2023-01-01T00:00:00/iter_0000100", REF)
    assert path.form == "embedded"
    assert logtime.trusted(path, previous=REF) is None
    assert logtime.trusted(path, previous=None) == utc("2023-01-01 00:00:00")
    own = parse("2023-01-01T00:00:00Z x", REF)  # a stamp at the start is always the line's
    assert logtime.trusted(own, previous=REF) == utc("2023-01-01 00:00:00")


@pytest.mark.parametrize(
    "text",
    ["0000-01-05T00:00:00 x", "valid_from 0000-01-05T00:00:00", "[Mon Jan  3 00:00:00 0000] x"],
)
def test_a_year_outside_the_calendar_is_no_stamp(text):
    # calendar.monthrange(0, 1) raises: parse raised ValueError on these (the random-text
    # test above never draws a valid year-0 date)
    assert parse(text, REF) is None
