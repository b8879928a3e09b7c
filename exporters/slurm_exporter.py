"""Slurm exporter: job and node state from a real Slurm, on 127.0.0.1:19410.

Every refresh runs exactly three commands, whatever the number of jobs (argv lists, each with
a timeout): `squeue --json` (pending, running and recently ended jobs: slurmctld keeps them
`MinJobAge` seconds), `sinfo --json` (nodes), and `sacct` (jobs that ended within
`sacct_window_s`, for those squeue has already forgotten; none that ended before `since`, where
given: the demo's fresh receiver is not told of an earlier hour's failures). A background thread
refreshes every `interval` seconds; a scrape only reads the last snapshot, so a slow Slurm never
slows a scrape.

sacct failing (no accounting, slurmdbd down): the ended jobs already known stay while they ended
within `sacct_window_s` (squeue's end time, else when the exporter first saw them ended).

Slurm slow or down: `goodput_slurm_up 0`, `goodput_slurm_scrape_errors_total{command}` rises,
and the last good values stay exposed (their age is
`time() - goodput_slurm_last_success_timestamp_seconds`). Never a crash.

Label values: `state` is Slurm's state in lower case (`running`, `pending`, `failed`,
`node_fail`, `cancelled`, ...); a node's state is its base state plus its flags, joined with
`+` (`idle`, `mixed`, `idle+drain`, `down+not_responding`). `job_id` is Slurm's id, or
`<array job>_<task>` for array tasks (as in `slurm-%A_%a.out`). `goodput_slurm_job_node_info`
exists only while the job holds the node (running, completing, suspended).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from catalogue import names

log = logging.getLogger(__name__)
DEFAULT_PORT = 19410
NODE = names.NODE
JOB_ID = names.JOB_ID
HOLDING_STATES = {"running", "completing", "suspended", "configuring", "stopped"}
ENDED_STATES = "CA,CD,F,NF,OOM,TO,PR,BF,DL,RQ"

Runner = Callable[[Sequence[str], float], str]


class SlurmError(RuntimeError):
    """A Slurm command failed, timed out or printed something unreadable."""


def run_command(argv: Sequence[str], timeout: float) -> str:
    """Run one Slurm client command (argv list, no shell); its stdout or `SlurmError`. A byte
    that is not UTF-8 (a job name Slurm took as the user typed it) reads as U+FFFD."""
    try:
        out = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]}: timed out after {timeout}s") from None
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc}") from None
    if out.returncode != 0:
        raise SlurmError(f"{argv[0]}: exit {out.returncode}: {out.stderr.strip()[:300]}")
    return out.stdout


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist: `node[1-3,5],gpu-a[01-02]` -> node1 node2 node3 node5 ...

    Names that are not valid node names are left out; malformed text raises `SlurmError`."""
    try:
        return names.expand_hostlist(expr, skip_invalid=True)
    except ValueError as exc:
        raise SlurmError(str(exc)) from None


def _exit_code(raw: object) -> int | None:
    """squeue's exit code (`names.slurm_exit`) as a shell reports a process': 128 + the
    signal when a signal ended it."""
    code, sig = names.slurm_exit(raw)
    return 128 + sig if sig else code


def _ended(state: str) -> bool:
    """A job state (lower case) that neither holds nodes nor waits for them."""
    return state not in HOLDING_STATES and state != "pending"


def _gpus(text: str) -> int | None:
    """GPUs from `gres/gpu=2` (TRES) or `gres:gpu:2` / `gres:gpu:h100:2` (requests)."""
    m = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", text or "") or re.search(
        r"gres:gpu(?::[^:,]+)?:(\d+)", text or ""
    )
    return int(m.group(1)) if m else None


@dataclass
class Job:
    job_id: str
    name: str
    partition: str
    state: str
    nodes: list[str] = field(default_factory=list)
    restarts: int | None = None
    exit_code: int | None = None
    gpus: int | None = None
    ended_at: float | None = None  # squeue's end time, else when the exporter first saw it ended


@dataclass
class Snapshot:
    jobs: dict[str, Job] = field(default_factory=dict)
    nodes: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)


def parse_squeue(text: str, ended_before: float | None = None) -> dict[str, Job]:
    """`squeue --all --json` of Slurm 22.05 to 24.x (numbers plain or `{"set", "number"}`,
    states a string or a list); jobs that ended before `ended_before` are left out."""
    jobs: dict[str, Job] = {}
    for j in _json(text, "squeue").get("jobs", []):
        job_id = str(j.get("job_id", ""))
        array_job, task_id = (
            names.slurm_int(j.get("array_job_id")),
            names.slurm_int(j.get("array_task_id")),
        )
        if array_job and task_id is not None and task_id != names.SLURM_NO_VAL:
            job_id = f"{array_job}_{task_id}"
        if not JOB_ID.match(job_id):
            continue
        state = (names.slurm_states(j.get("job_state")) or ["unknown"])[0]
        end = names.slurm_int(j.get("end_time"))
        if ended_before is not None and _ended(state) and end and end < ended_before:
            continue
        nodes = _job_nodes(str(j.get("nodes") or ""), job_id)
        gpus = _gpus(j.get("tres_alloc_str", ""))
        if gpus is None:
            per_node = _gpus(j.get("tres_per_node", ""))
            per_job = _gpus(j.get("tres_per_job", ""))
            count = names.slurm_int(j.get("node_count")) or 1
            gpus = per_job if per_job is not None else (per_node * count if per_node else None)
        jobs[job_id] = Job(
            job_id=job_id,
            name=str(j.get("name", ""))[:128],
            partition=str(j.get("partition", "")),
            state=state,
            nodes=nodes,
            restarts=names.slurm_int(j.get("restart_cnt")) or 0,
            exit_code=_exit_code(j.get("exit_code")) if _ended(state) else None,
            gpus=gpus,
            ended_at=float(end) if _ended(state) and end else None,
        )
    return jobs


SACCT_FIELDS = "JobID,Partition,State,ExitCode,NodeList,AllocTRES,JobName,JobID"


def parse_sacct(text: str) -> dict[str, Job]:
    """`sacct -X -n -P -o SACCT_FIELDS`. Slurm escapes neither a `|` nor a newline in a job's
    name, so the name comes last and the job id again after it: a row counts only when it
    begins and ends with the same id (a name holding `\n9999|gpu|NODE_FAIL|…` forges none),
    and a job's first row is its own."""
    jobs: dict[str, Job] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 8 or parts[0] != parts[-1] or parts[0] in jobs:
            continue
        job_id, partition, state, exit_code, nodelist, tres = parts[:6]
        if not JOB_ID.match(job_id):
            continue
        jobs[job_id] = Job(
            job_id=job_id,
            name="|".join(parts[6:-1])[:128],
            partition=partition,
            state=(state.split() or ["unknown"])[0].lower(),
            nodes=[] if nodelist == "None assigned" else _job_nodes(nodelist, job_id),
            exit_code=_exit_code(exit_code),
            gpus=_gpus(tres),
        )
    return jobs


def _job_nodes(hostlist: str, job_id: str) -> list[str]:
    """A job's valid node names; none (logged) when its list cannot be read, so one odd job
    never costs the others their metrics."""
    try:
        return expand_hostlist(hostlist)
    except SlurmError as exc:
        log.warning("job %s: node list left out: %s", job_id, exc)
        return []


def _node_state(states: list[str]) -> str:
    """`idle`, `idle+drain`, `down+not_responding`: the base state, then its flags sorted."""
    return "+".join([states[0] if states else "unknown", *sorted(states[1:])])


def parse_sinfo(text: str) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """node -> (state, reason, partitions), from `sinfo --json` of Slurm 22.05 (`nodes`: one
    entry a node, its flags apart) or 23.02 and later (`sinfo`: one entry per partition and
    state, naming its nodes; the flags in the state list)."""
    doc = _json(text, "sinfo")
    nodes: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for n in doc.get("nodes", []):
        name = str(n.get("name", ""))
        if not NODE.match(name):
            continue
        states = names.slurm_states(n.get("state")) or ["unknown"]
        states += [str(f).lower() for f in n.get("state_flags") or []]
        reason = str(n.get("reason") or "")[:200]
        parts = tuple(str(p) for p in n.get("partitions") or [])
        nodes[name] = (_node_state(states), reason, parts)
    for entry in doc.get("sinfo", []):
        states = names.slurm_states((entry.get("node") or {}).get("state")) or ["unknown"]
        why = entry.get("reason")
        reason = str((why.get("description") if isinstance(why, dict) else why) or "")[:200]
        part = str((entry.get("partition") or {}).get("name") or "")
        for listed in (entry.get("nodes") or {}).get("nodes") or []:
            for name in expand_hostlist(str(listed)):
                known = nodes.get(name, ("", "", ()))[2]
                nodes[name] = (_node_state(states), reason, (*known, part) if part else known)
    return nodes


def _json(text: str, what: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"{what}: unreadable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SlurmError(f"{what}: JSON is not an object")
    if data.get("errors") and not (data.get("jobs") or data.get("nodes") or data.get("sinfo")):
        # 22.05 with slurmctld down: squeue and sinfo exit 0, no jobs or nodes, an error
        raise SlurmError(f"{what}: {json.dumps(data['errors'])[:300]}")
    return data


class SlurmCollector(Collector):
    """`refresh()` runs the three commands and swaps the snapshot; `collect()` exposes it."""

    def __init__(
        self,
        runner: Runner = run_command,
        timeout: float = 10.0,
        sacct_window_s: int = 3600,
        clock: Callable[[], float] = time.time,
        since: float | None = None,
    ) -> None:
        self.runner = runner
        self.timeout = timeout
        self.sacct_window_s = sacct_window_s
        self.since = since  # ask sacct for no job that ended before this (unix s)
        self.clock = clock
        self.snapshot = Snapshot()
        self.up: int = 0
        self.last_success = 0.0
        self.duration = 0.0
        self.errors: dict[str, float] = {"squeue": 0.0, "sinfo": 0.0, "sacct": 0.0}
        self._lock = threading.Lock()

    def commands(self) -> dict[str, list[str]]:
        start = f"now-{int(self.sacct_window_s)}seconds"
        if self.since is not None and self.since > self.clock() - self.sacct_window_s:
            start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.since))
        return {
            "squeue": ["squeue", "--all", "--json"],
            "sinfo": ["sinfo", "--json"],
            "sacct": [
                "sacct", "-X", "-n", "-P", "--noconvert",
                "-S", start, "-E", "now",
                "-s", ENDED_STATES,
                "-o", SACCT_FIELDS,
            ],
        }  # fmt: skip

    def refresh(self) -> bool:
        """One refresh; True when squeue and sinfo answered (sacct is best effort)."""
        start = time.perf_counter()
        results: dict[str, str | None] = {}
        for name, argv in self.commands().items():
            try:
                results[name] = self.runner(argv, self.timeout)
            except SlurmError as exc:
                log.warning("%s", exc)
                results[name] = None
            except Exception:  # whatever it is, it costs this command's values, not the others'
                log.exception("%s failed", name)
                results[name] = None
        try:
            text = results["squeue"]
            jobs = parse_squeue(text, ended_before=self.since) if text is not None else None
        except SlurmError as exc:
            log.warning("%s", exc)
            jobs, results["squeue"] = None, None
        try:
            nodes = parse_sinfo(results["sinfo"]) if results["sinfo"] is not None else None
        except SlurmError as exc:
            log.warning("%s", exc)
            nodes, results["sinfo"] = None, None
        ended = parse_sacct(results["sacct"]) if results["sacct"] is not None else None
        now = self.clock()
        with self._lock:
            for name, text in results.items():
                if text is None:
                    self.errors[name] += 1
            ok = jobs is not None and nodes is not None
            if ok:
                assert jobs is not None and nodes is not None
                merged = dict(ended) if ended is not None else self._carried(now)
                merged.update(jobs)  # squeue is fresher (and knows restarts)
                self._stamp(merged, now)
                self.snapshot = Snapshot(merged, nodes)
                self.last_success = now
            self.up = 1 if ok else 0
            self.duration = time.perf_counter() - start
        return ok

    def _carried(self, now: float) -> dict[str, Job]:
        """sacct failed: the ended jobs already known, while they ended within the sacct
        window (as sacct would list them); kept for good, they piled up where sacct never
        answers (no accounting)."""
        cutoff = now - self.sacct_window_s
        return {
            k: v
            for k, v in self.snapshot.jobs.items()
            if _ended(v.state) and v.ended_at is not None and v.ended_at >= cutoff
        }

    def _stamp(self, jobs: dict[str, Job], now: float) -> None:
        """Give each ended job without an end time (sacct's, or squeue's without one) the time
        the exporter first saw it ended."""
        for job in jobs.values():
            if _ended(job.state) and job.ended_at is None:
                known = self.snapshot.jobs.get(job.job_id)
                job.ended_at = known.ended_at if known and known.ended_at is not None else now

    def run(self, stop: threading.Event, interval: float = 5.0) -> None:
        while not stop.is_set():
            try:
                self.refresh()
            except Exception:  # never die: the next refresh may work
                log.exception("slurm refresh failed")
                with self._lock:
                    self.up = 0
            stop.wait(interval)

    def collect(self) -> Iterator:
        with self._lock:
            snap, up = self.snapshot, self.up
            last, duration = self.last_success, self.duration
            errors = dict(self.errors)
        state = GaugeMetricFamily(
            "goodput_slurm_job_state",
            "1 for the job's current Slurm state.",
            labels=["job_id", "job_name", "partition", "state"],
        )
        restarts = GaugeMetricFamily(
            "goodput_slurm_job_restarts", "Times Slurm requeued the job.", labels=["job_id"]
        )
        exit_code = GaugeMetricFamily(
            "goodput_slurm_job_exit_code",
            "Exit code of an ended job (128 + signal when a signal ended it).",
            labels=["job_id"],
        )
        node_info = GaugeMetricFamily(
            "goodput_slurm_job_node_info",
            "1 for each node a running job holds.",
            labels=["job_id", "job_name", "node"],
        )
        gpus = GaugeMetricFamily(
            "goodput_slurm_job_gpus", "GPUs allocated (or requested) by the job.", labels=["job_id"]
        )
        for job in snap.jobs.values():
            state.add_metric([job.job_id, job.name, job.partition, job.state], 1)
            if job.restarts is not None:
                restarts.add_metric([job.job_id], job.restarts)
            if job.exit_code is not None:
                exit_code.add_metric([job.job_id], job.exit_code)
            if job.gpus is not None:
                gpus.add_metric([job.job_id], job.gpus)
            if job.state in HOLDING_STATES:
                for node in job.nodes:
                    node_info.add_metric([job.job_id, job.name, node], 1)
        node_state = GaugeMetricFamily(
            "goodput_slurm_node_state",
            "1 for the node's state (base+flags) and reason.",
            labels=["node", "state", "reason"],
        )
        partition_nodes = GaugeMetricFamily(
            "goodput_slurm_partition_nodes",
            "Nodes per partition and state.",
            labels=["partition", "state"],
        )
        counts: dict[tuple[str, str], int] = {}
        for node, (nstate, reason, partitions) in snap.nodes.items():
            node_state.add_metric([node, nstate, reason], 1)
            for p in partitions:
                counts[(p, nstate)] = counts.get((p, nstate), 0) + 1
        for (p, nstate), n in sorted(counts.items()):
            partition_nodes.add_metric([p, nstate], n)
        up_f = GaugeMetricFamily("goodput_slurm_up", "1 if the last refresh reached Slurm.")
        up_f.add_metric([], up)
        last_f = GaugeMetricFamily(
            "goodput_slurm_last_success_timestamp_seconds",
            "When Slurm last answered; the values above are that old.",
        )
        last_f.add_metric([], last)
        dur = GaugeMetricFamily(
            "goodput_slurm_scrape_duration_seconds", "Duration of the last refresh."
        )
        dur.add_metric([], duration)
        err = CounterMetricFamily(
            "goodput_slurm_scrape_errors", "Failed Slurm commands.", labels=["command"]
        )
        for name, count in errors.items():
            err.add_metric([name], count)
        yield from (state, restarts, exit_code, node_info, gpus, node_state, partition_nodes)
        yield from (up_f, last_f, dur, err)


def serve(
    port: int = DEFAULT_PORT,
    host: str = "127.0.0.1",
    interval: float = 5.0,
    timeout: float = 10.0,
    sacct_window_s: int = 3600,
    stop: threading.Event | None = None,
    since: float | None = None,
) -> None:
    """Expose /metrics on host:port and refresh from Slurm until `stop` is set."""
    from prometheus_client import CollectorRegistry, start_http_server

    collector = SlurmCollector(timeout=timeout, sacct_window_s=sacct_window_s, since=since)
    registry = CollectorRegistry()
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info("slurm exporter on http://%s:%d/metrics", host, port)
    try:
        collector.run(stop or threading.Event(), interval)
    finally:
        server.shutdown()
