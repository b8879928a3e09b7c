"""Webhook throughput: Alertmanager v4 payloads posted over HTTP to the production receiver
process (`goodput receiver serve`: uvicorn, bearer auth, the real store), by client threads
on keep-alive connections; every 200 means the payload is durable.

Per store (SQLite WAL file; PostgreSQL on a private schema of `GOODPUT_TEST_POSTGRES_URL`):
a closed-loop run (every thread posts as fast as answers come: the ceiling) and an open-loop
run at `--rate` alerts/s (the target: ≥ 500 alerts/s with p99 ≤ 20 ms). Each post carries
one new alert (a distinct fingerprint) of one of 200 jobs, so every request writes its alert
and links it to an open incident. The settle delay is an hour, so the diagnosis worker (which
runs) does not diagnose during the measurement: this times ingestion, not attribution.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
JOBS = 200
TARGET_RATE, TARGET_P99_MS = 500.0, 20.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def payload(n: int, tag: str) -> bytes:
    """Alertmanager's v4 body for one new alert (fingerprint unique per `n`)."""
    job = str(100000 + n % JOBS)
    alert = {
        "status": "firing",
        "labels": {"alertname": "GoodputJobLogFault", "job_id": job, "severity": "warning",
                   "scope": "job", "pattern": "cuda_error", "signal": "log_pattern"},
        "annotations": {"summary": f"bench alert {n} on job {job}",
                        "runbook_url": "alertmanager/runbooks.md#goodputjoblogfault"},
        "startsAt": "2026-12-01T00:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": f"{tag}{n:010x}",
    }  # fmt: skip
    body = {
        "version": "4", "groupKey": f'{{}}:{{job_id="{job}"}}', "truncatedAlerts": 0,
        "status": "firing", "receiver": "goodput-recovery", "groupLabels": {"job_id": job},
        "commonLabels": alert["labels"], "commonAnnotations": alert["annotations"],
        "externalURL": "http://alertmanager:9093", "alerts": [alert],
    }  # fmt: skip
    return json.dumps(body).encode()


class Server:
    """The receiver as a child process, on `db_url`."""

    def __init__(self, db_url: str, tmp: Path) -> None:
        token = tmp / "token"
        token.write_text(uuid.uuid4().hex)
        self.headers = {
            "Authorization": f"Bearer {token.read_text()}",
            "Content-Type": "application/json",
        }
        self.port = _free_port()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "GOODPUT_RECEIVER_DB_URL": db_url,
            "GOODPUT_RECEIVER_TOKEN_FILE": str(token),
            "GOODPUT_RECEIVER_SETTLE_S": "3600",
            "GOODPUT_RECEIVER_SLURM": "0",
            "GOODPUT_SCHEDULER": "simulated",
            "GOODPUT_SIM_URL": "http://127.0.0.1:9",
        }
        for k in ("GOODPUT_PROMETHEUS_URL", "GOODPUT_ALERTMANAGER_URL", "GOODPUT_TEST_CRASH_AT"):
            env.pop(k, None)
        self.log = tmp / "receiver.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             f"from goodput.commands.receiver import serve; serve(None, {self.port}, None)"],
            env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, cwd=str(ROOT),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).ok:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        raise RuntimeError(f"receiver did not start ({self.log})")

    def cpu_s(self) -> float:
        """The receiver process' CPU time so far (user + system, all its threads)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)


def load(server: Server, threads: int, seconds: float, rate: float | None) -> dict[str, Any]:
    """`threads` clients for `seconds`; `rate` alerts/s in all (open loop, each request at
    its scheduled time, latency counted from then) or None (closed loop, as fast as answers)."""
    tag = uuid.uuid4().hex[:6]
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    start = time.monotonic() + 0.2
    end = start + seconds

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        i = 0
        while True:
            n = i * threads + k
            due = start + n / rate if rate else time.monotonic()
            if due >= end:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            t0 = due if rate else time.monotonic()
            try:
                conn.request("POST", "/api/v1/alerts", payload(n, tag), server.headers)
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            lat[k].append(time.monotonic() - t0)
            errors[k] += not ok
            i += 1
        conn.close()

    cpu0 = server.cpu_s()
    pool = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = max(time.monotonic(), end) - start
    xs = sorted(x for ls in lat for x in ls)
    cpu = server.cpu_s() - cpu0
    return {
        "mode": f"open loop at {rate:g}/s" if rate else "closed loop",
        "threads": threads,
        "requests": len(xs),
        "errors": sum(errors),
        "alerts_per_s": round((len(xs) - sum(errors)) / wall, 1),
        "p50_ms": round(1000 * _pct(xs, 0.50), 2),
        "p99_ms": round(1000 * _pct(xs, 0.99), 2),
        "max_ms": round(1000 * xs[-1], 2) if xs else None,
        "mean_ms": round(1000 * statistics.fmean(xs), 2) if xs else None,
        "server_cpu_ms_per_alert": round(1000 * cpu / len(xs), 3) if xs else None,
        "load_avg_1m": round(os.getloadavg()[0], 2),  # the machine's, other work included
    }


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def _pg_schema(url: str) -> tuple[str, Any]:
    from sqlalchemy import text

    from recovery.store import make_engine

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = make_engine(url, create=False)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))

    def drop() -> None:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()

    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}", drop


def run(
    stores: list[str],
    threads: int,
    seconds: float,
    rate: float,
    out: Path,
    label: str = "",
    repeats: int = 3,
) -> dict[str, Any]:
    """Per store a closed-loop run and `repeats` open-loop runs (one after the other on the same
    receiver: on a shared machine a single run's p99 moves with its neighbours' load); writes
    webhook.json and webhook.md under `out`."""
    results = []
    for store in stores:
        with tempfile.TemporaryDirectory(prefix="goodput-bench-webhook-") as d:
            tmp, drop = Path(d), None
            if store == "sqlite":
                url = f"sqlite:///{tmp / 'goodput.db'}"
            else:
                pg = os.environ.get("GOODPUT_TEST_POSTGRES_URL")
                if not pg:
                    raise ValueError("postgresql: GOODPUT_TEST_POSTGRES_URL is not set")
                url, drop = _pg_schema(pg)
            server = Server(url, tmp)
            try:
                load(server, threads, 2.0, None)  # warm-up: imports, pools, first pages
                runs = [load(server, threads, seconds, None)]
                runs += [load(server, threads, seconds, rate) for _ in range(repeats)]
                for r in runs:
                    r["store"] = store
                    results.append(r)
            finally:
                server.stop()
                if drop is not None:
                    drop()
    report = {
        "label": label,
        "target": {"alerts_per_s": TARGET_RATE, "p99_ms": TARGET_P99_MS},
        "results": results,
        "machine": f"{os.cpu_count()} CPUs ({platform.platform()}), shared with other work",
        "measured": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "webhook.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "webhook.md").write_text(markdown(report))
    return report


def markdown(report: dict[str, Any]) -> str:
    rows = [
        f"| {r['store']} | {r['mode']} | {r['threads']} | {r['requests']} | {r['errors']} | "
        f"{r['alerts_per_s']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} | "
        f"{r['server_cpu_ms_per_alert']} | {r.get('load_avg_1m')} |"
        for r in report["results"]
    ]
    t = report["target"]
    spread = []
    for store in dict.fromkeys(r["store"] for r in report["results"]):
        p99 = sorted(
            r["p99_ms"]
            for r in report["results"]
            if r["store"] == store and r["mode"].startswith("open")
        )
        if p99:
            spread.append(
                f"- {store}, open loop: p99 over {len(p99)} runs min / median / max "
                f"{p99[0]} / {statistics.median(p99)} / {p99[-1]} ms"
            )
    return "\n".join(
        [
            "# Webhook throughput (the production receiver over HTTP)",
            "",
            "Alertmanager v4 payloads, one new alert each (200 jobs), posted by client threads "
            "on keep-alive connections to `goodput receiver serve` (uvicorn, bearer auth); "
            "every 200 is durable. Target: "
            f"≥ {t['alerts_per_s']:g} alerts/s with p99 ≤ {t['p99_ms']:g} ms (open loop).",
            *(["", f"Run: {report['label']}"] if report.get("label") else []),
            "",
            "| store | load | threads | requests | errors | alerts/s | p50 ms | p99 ms | max ms "
            "| receiver CPU ms/alert | load avg |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            *spread,
            "",
            f"Machine: {report['machine']}; measured {report['measured']}.",
            "",
            "Rerun: `goodput bench webhook` (PostgreSQL: the stack's, under the stack lock).",
            "",
        ]
    )
