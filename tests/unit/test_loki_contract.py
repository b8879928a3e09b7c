"""One label contract for Loki: what the shipper writes is what the receiver (and Promtail) use.

Old code: the shipper labelled kernel lines `stream="kernel"` while the receiver asked for
`source="kernel"`, so the receiver never found kernel lines Goodput shipped and still reported
`ok`; with nothing for a node the report did not say so. Later: the receiver asked for the
OLDEST lines of the window (a busy job's traceback at the alert fell past the limit), sent one
query per node (512 for a 512-node job) and dropped every stream after the first refusal.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
import yaml

from catalogue import logstreams
from exporters.loki import LokiShipper
from recovery.evidence import Context, timed
from recovery.evidence.logs import collect_loki, loki_streams
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


class RegexLoki(FakeLoki):
    """FakeLoki that also honours LogQL's regex matchers `label=~"re"` (anchored, as Loki's
    are; the escaped node names here read the same in Python's `re` as in RE2), keeps each
    query, and answers `fail[i]` (a status) to the i-th query where set."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []
        self.fail: dict[int, int] = {}
        self._regex: dict[str, re.Pattern[str]] = {}
        self._one = threading.Lock()

    def query_range(self, q: dict[str, list[str]]) -> tuple[int, str]:
        with self._one:
            query = q.get("query", [""])[0]
            self.queries.append(query)
            if (status := self.fail.get(len(self.queries) - 1)) is not None:
                return status, "too many outstanding requests"
            found = re.findall(r'(\w+)=~("(?:[^"\\]|\\.)*")', query)
            self._regex = {k: re.compile(json.loads(v)) for k, v in found}
            plain = re.sub(r',?\s*\w+=~"(?:[^"\\]|\\.)*"', "", query)
            return super().query_range({**q, "query": [plain]})

    def entries(self) -> list[tuple[dict[str, str], int, str]]:
        return [
            e
            for e in super().entries()
            if all(rx.fullmatch(e[0].get(k, "")) for k, rx in self._regex.items())
        ]


@pytest.fixture
def rloki():
    f = RegexLoki()
    yield f
    f.close()


def push(loki: FakeLoki, labels: dict[str, str], lines: list[tuple[float, str]]) -> None:
    values = [[str(int(t * 1e9)), line] for t, line in lines]
    assert loki.push({"streams": [{"stream": labels, "values": values}]}) == (204, "")


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
    assert [q for q, _k, _n in loki_streams(ctx)] == [
        '{source="job", job_id="7"}',
        '{source="kernel", node="node1"}',
    ]
    with pytest.raises(ValueError):
        loki_streams(Context(job_id=None, nodes=['node1"} or {a="b'], start=0, end=1))
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


def test_a_busy_jobs_newest_lines_are_kept_the_traceback_at_the_alert_with_them(rloki):
    """A job logging 6 lines a second fills Loki's 5000-line limit in 14 minutes of a
    17-minute window: old code asked `direction=forward` and kept the oldest 5000, losing
    the traceback at the window's end; the file reader keeps a file's tail likewise."""
    start = NOW - 1020
    steps = [(start + i / 6, f"[rank0]: step {i} loss 2.0") for i in range(6 * 1000)]
    crash = [
        (NOW - 5.0, "Traceback (most recent call last):"),
        (NOW - 4.9, "RuntimeError: CUDA error: an illegal memory access was encountered"),
    ]
    push(rloki, {"source": "job", "job_id": "77"}, steps + crash)
    ctx = Context(job_id="77", nodes=[], start=start, end=NOW + 10)
    bundle = collect_loki(ctx, settings(rloki.url))
    texts = [ln.text for ln in bundle.lines]
    assert len(texts) == 5000 and texts[-2:] == [t for _, t in crash]
    times = [ln.time for ln in bundle.lines]
    assert times == sorted(times) and times[0] > start + 150  # the oldest were the ones left out
    assert bundle.reports[0].reason == "5000 job lines (limit reached)"


def test_the_kernel_streams_of_many_nodes_are_few_queries(rloki):
    """One query per group of nodes (an RE2 alternation, as `catalogue.promql` quotes it for
    Prometheus), not one per node: old code sent 250 queries for 250 nodes."""
    nodes = [f"gpu-node-{i:03d}.rack.a" for i in range(250)]
    for n in (nodes[0], nodes[137], nodes[249], "gpu-node-999.rack.a"):  # the last: no job's
        xid = f"{n} kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
        push(rloki, {"source": "kernel", "node": n}, [(NOW - 30, xid)])
    near = "gpu-node-000Xrack.a"  # what an unescaped `.` would match
    push(rloki, {"source": "kernel", "node": near}, [(NOW - 30, "not the job's node")])
    ctx = Context(job_id="4242", nodes=nodes, start=NOW - 300, end=NOW + 10)
    bundle = collect_loki(ctx, settings(rloki.url))
    assert len(rloki.queries) == 1 + 3  # the job, then 100 + 100 + 50 nodes
    assert all(len(q) < 4000 for q in rloki.queries)
    assert rloki.queries[1].startswith('{source="kernel", node=~"gpu-node-000\\\\.rack\\\\.a|')
    got = [(ln.node, ln.path) for ln in bundle.lines]
    want = [nodes[0], nodes[137], nodes[249]]
    assert got == [(n, f'loki:{{source="kernel", node="{n}"}}') for n in want]
    reason = bundle.reports[0].reason
    assert reason.startswith("0 job lines, 1 kernel lines (gpu-node-000.rack.a), 0 kernel lines")
    assert reason.count("kernel lines") == 250 and bundle.reports[0].status == "ok"


def test_a_refused_query_costs_only_its_own_lines(rloki, tmp_path):
    """Old code returned at the first refusal: the job query's 429 lost every kernel line."""
    ship(rloki, tmp_path)
    ctx = Context(job_id="4242", nodes=["node2", "node3"], start=NOW - 300, end=NOW + 10)
    rloki.fail = {0: 429}  # the job's query
    bundle = collect_loki(ctx, settings(rloki.url))
    assert [ln.node for ln in bundle.lines] == ["node2"] and "Xid" in bundle.lines[0].text
    report = bundle.reports[0]
    assert report.status == "ok" and report.reason.startswith('failed: {source="job"')
    assert "answered 429" in report.reason and "1 kernel lines (node2)" in report.reason
    # a group of nodes refused: the other groups' lines stay, the report names the group
    rloki.queries.clear()
    rloki.fail = {1: 500}
    nodes = ["node0", "node1", "node2", "node3"]
    ctx = Context(job_id="4242", nodes=nodes, start=NOW - 300, end=NOW + 10)
    bundle = collect_loki(ctx, settings(rloki.url), chunk=2)
    assert len(rloki.queries) == 3 and {ln.kind for ln in bundle.lines} == {"job", "kernel"}
    assert [ln.node for ln in bundle.lines if ln.kind == "kernel"] == ["node2"]
    assert "node=~<2 nodes: node0 .. node1>}: answered 500" in bundle.reports[0].reason
    # every query refused: an error
    rloki.fail = {i: 503 for i in range(len(rloki.queries), len(rloki.queries) + 3)}
    down = collect_loki(ctx, settings(rloki.url), chunk=2).reports[0]
    assert down.status == "error" and down.reason.count("answered 503") == 3
