"""One label contract for Loki: what the shipper writes is what the receiver (and Promtail) use.

Old code: the shipper labelled kernel lines `stream="kernel"` while the receiver asked for
`source="kernel"`, so the receiver never found kernel lines Goodput shipped and still reported
`ok`; with nothing for a node the report did not say so.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from catalogue import logstreams
from exporters.loki import LokiShipper
from recovery.evidence import Context, timed
from recovery.evidence.logs import collect_loki, loki_queries
from recovery.settings import Settings
from tests.lokifake import FakeLoki

ROOT = Path(__file__).resolve().parents[2]
NOW = float(int(time.time()))


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(t))


@pytest.fixture
def loki():
    f = FakeLoki()
    yield f
    f.close()


def settings(url: str) -> Settings:
    return Settings(loki_url=url)


def ship(loki: FakeLoki, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "jobs").mkdir(parents=True)
    (logs / "kernel").mkdir()
    (logs / "jobs" / "slurm-4242.out").write_text(
        f"{iso(NOW - 30)} [rank3]: step 1 loss 2.0\n{iso(NOW - 20)} NCCL WARN NET/IB : port error\n"
    )
    (logs / "kernel" / "node2.log").write_text(
        f"{iso(NOW - 25)} node2 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off\n"
    )
    s = LokiShipper(loki.url, logs, tmp_path / "state")
    s.poll_once()
    assert s.send_once() == 0


def test_the_receiver_finds_the_kernel_lines_the_shipper_shipped(loki, tmp_path):
    ship(loki, tmp_path)
    ctx = Context(job_id="4242", nodes=["node2"], start=NOW - 300, end=NOW + 10)
    bundle = collect_loki(ctx, settings(loki.url))
    kernel = [ln for ln in bundle.lines if ln.kind == "kernel"]
    assert len(kernel) == 1 and kernel[0].node == "node2" and "Xid" in kernel[0].text
    assert kernel[0].time == NOW - 25  # the line's own time came through Loki
    assert len([ln for ln in bundle.lines if ln.kind == "job"]) == 2
    report = bundle.reports[0]
    assert report.status == "ok" and report.reason == "2 job lines, 1 kernel lines (node2)"


def test_the_report_says_when_a_node_had_no_kernel_lines(loki, tmp_path):
    ship(loki, tmp_path)
    ctx = Context(job_id="4242", nodes=["node2", "node3"], start=NOW - 300, end=NOW + 10)
    report = collect_loki(ctx, settings(loki.url)).reports[0]
    assert report.reason.endswith("1 kernel lines (node2), 0 kernel lines (node3)")
    empty = collect_loki(
        Context(job_id="1", nodes=["node4"], start=NOW - 60, end=NOW), settings(loki.url)
    )
    assert empty.reports[0].status == "empty"
    assert empty.reports[0].reason == "0 job lines, 0 kernel lines (node4)"
    capped = collect_loki(
        Context(job_id="4242", nodes=[], start=NOW - 300, end=NOW + 10), settings(loki.url), limit=2
    )
    assert capped.reports[0].reason == "2 job lines (limit reached)"


def test_a_failing_loki_is_an_error_report(loki):
    ctx = Context(job_id="1", nodes=[], start=NOW - 60, end=NOW)
    wrong = collect_loki(ctx, settings(loki.url + "/not-loki")).reports[0]
    assert wrong.status == "error" and "answered 404" in wrong.reason
    loki.close()
    down = timed("loki", lambda: collect_loki(ctx, settings(loki.url))).reports[0]
    assert down.status == "error" and "ConnectionError" in down.reason


def test_queries_come_from_the_contract_and_validated_values():
    ctx = Context(job_id="7", nodes=["node1"], start=0, end=1)
    assert [q for q, _k, _n in loki_queries(ctx)] == [
        '{source="job", job_id="7"}',
        '{source="kernel", node="node1"}',
    ]
    with pytest.raises(ValueError):
        loki_queries(Context(job_id=None, nodes=['node1"} or {a="b'], start=0, end=1))
    with pytest.raises(ValueError):
        logstreams.stream_labels("kernel", "../etc")


def test_promtail_labels_its_streams_by_the_same_contract():
    cfg = yaml.safe_load((ROOT / "compose" / "promtail" / "promtail.yml").read_text())
    labels = {}
    for job in cfg["scrape_configs"]:
        static = job["static_configs"][0]["labels"]
        extracted = set()
        for stage in job.get("pipeline_stages", []):
            extracted |= set((stage.get("labels") or {}).keys())
        labels[static[logstreams.SOURCE]] = extracted
    assert labels == {logstreams.JOB: {logstreams.JOB_ID}, logstreams.KERNEL: {logstreams.NODE}}
