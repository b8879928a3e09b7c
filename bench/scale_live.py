"""Scale benchmark, live: the simulator's dcgm endpoints scraped by a real Prometheus (with the
local stack's own shard relabelling), and detector replicas as separate processes querying it,
for 1 replica and for N shards; per size, the detector's measured cycle
(`goodput_detector_cycle_seconds`, polled from each replica), Prometheus' query time
(`prometheus_http_request_duration_seconds` of `/api/v1/query`, mean over the window) and the
scrape health (targets up, `scrape_duration_seconds` p99).

The Prometheus is a private instance on 127.0.0.1:19191 fed the shipped `metric_relabel_configs`
(the shared stack's Prometheus runs another checkout's configuration and serves other tests).
Run it under the stack lock: it loads both cores for minutes.

    flock /tmp/goodput-stack.lock python -m bench.scale_live [--nodes 125,250,500] [--shards 2]
        [--seconds 40] [--keep]     (writes the `live` part of bench/results/scale.json and .md)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

from clients.prometheus import PromClient

ROOT = Path(__file__).resolve().parents[1]
PROM_PORT = 19191
CONTROL_PORT = 19397
NODE_BASE = 19700
DETECTOR_BASE = 19460
INTERVAL = 5


def _relabel(job_name: str, shards: int) -> list[dict]:
    doc = yaml.safe_load((ROOT / "compose/local/prometheus.yml").read_text())
    job = next(j for j in doc["scrape_configs"] if j["job_name"] == job_name)
    return [
        {**r, "modulus": shards} if r.get("modulus") == "@SHARDS@" else r
        for r in job["metric_relabel_configs"]
    ]


def _wait(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not come up in {timeout}s")


def _q(expr: str, want: str = "vector") -> list[dict]:
    """An instant query's result list (`want`: "matrix" for a range selector)."""
    with PromClient(f"http://127.0.0.1:{PROM_PORT}", timeout=30) as prom:
        return prom.raw(expr, want=want)


def _prom_query_time() -> tuple[float, float]:
    """(sum, count) of Prometheus' /api/v1/query request durations so far."""
    text = requests.get(f"http://127.0.0.1:{PROM_PORT}/metrics", timeout=10).text
    total = count = 0.0
    for ln in text.splitlines():
        if 'handler="/api/v1/query"' not in ln:
            continue
        if ln.startswith("prometheus_http_request_duration_seconds_sum"):
            total = float(ln.split()[-1])
        elif ln.startswith("prometheus_http_request_duration_seconds_count"):
            count = float(ln.split()[-1])
    return total, count


def _metric(text: str, name: str) -> float | None:
    for ln in text.splitlines():
        if ln.startswith(name + " ") or ln.startswith(name + "{"):
            return float(ln.split()[-1])
    return None


def _phase(tmp: Path, shards: int, seconds: float) -> dict:
    """Run `shards` replicas (1 = unsharded) for `seconds`; their cycles and Prometheus'."""
    procs, ports = [], []
    for k in range(shards):
        port = DETECTOR_BASE + k
        cmd = [sys.executable, "-m", "goodput.cli", "detector", "serve", "--interval"]
        cmd += [str(INTERVAL), "--port", str(port), "--state-dir", str(tmp / "baselines")]
        cmd += ["--prometheus-url", f"http://127.0.0.1:{PROM_PORT}"]
        if shards > 1:
            cmd += ["--shard", f"{k}/{shards}"]
        log = open(tmp / f"detector-{shards}-{k}.log", "wb")  # noqa: SIM115 - closed with proc
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        ports.append(port)
    cycles: dict[int, dict[float, dict]] = {p: {} for p in ports}
    try:
        for p in ports:
            _wait(f"http://127.0.0.1:{p}/metrics")
        time.sleep(2 * INTERVAL)  # first cycles create every job
        before = _prom_query_time()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for p in ports:
                text = requests.get(f"http://127.0.0.1:{p}/metrics", timeout=10).text
                stamp = _metric(text, "goodput_detector_last_cycle_timestamp_seconds")
                if stamp:
                    cycles[p][stamp] = {
                        "cycle": _metric(text, "goodput_detector_cycle_seconds"),
                        "fetch": _metric(
                            text, 'goodput_detector_cycle_phase_seconds{phase="fetch"}'
                        ),
                        "gpus": _metric(text, "goodput_detector_series_scored"),
                        "errors": _metric(text, "goodput_detector_query_errors_total"),
                    }
            time.sleep(INTERVAL / 2)
        after = _prom_query_time()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(20)
    per = []
    for p in ports:
        runs = list(cycles[p].values())
        ts = [r["cycle"] for r in runs if r["cycle"] is not None]
        per.append(
            {
                "cycles": len(runs),
                "gpus": runs[-1]["gpus"] if runs else 0,
                "errors": runs[-1]["errors"] if runs else None,
                "cycle_s_median": round(statistics.median(ts), 3) if ts else None,
                "cycle_s_max": round(max(ts), 3) if ts else None,
                "fetch_s_median": round(statistics.median(r["fetch"] for r in runs), 3)
                if runs
                else None,
            }
        )
    n = after[1] - before[1]
    return {
        "replicas": shards,
        "per_replica": per,
        "worst_cycle_s_median": max((r["cycle_s_median"] or 0) for r in per),
        "prometheus_queries": int(n),
        "prometheus_query_s_mean": round((after[0] - before[0]) / n, 4) if n else None,
    }


def run_size(nodes: int, shards: int, seconds: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="goodput-scale-live-"))
    jobs = [
        {"name": f"scale-{i:04d}", "nodes": 2, "duration_s": 86400, "step_time_s": 1.0}
        for i in range(nodes // 2)
    ]
    scenario = {"name": "scale-live", "duration_s": 86400, "nodes": nodes, "jobs": jobs}
    (tmp / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    targets = [f"127.0.0.1:{NODE_BASE + i + 1}" for i in range(nodes)]
    cfg = {
        "global": {"scrape_interval": f"{INTERVAL}s", "scrape_timeout": f"{INTERVAL}s"},
        "scrape_configs": [
            {
                "job_name": "dcgm",
                "static_configs": [{"targets": targets}],
                "metric_relabel_configs": _relabel("dcgm", shards),
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "GOODPUT_LOG_DIR": str(tmp / "logs"), "PYTHONPATH": str(ROOT)}
    sim_cmd = [sys.executable, "-m", "goodput.cli", "sim", "serve", "--scenario"]
    sim_cmd += [str(tmp / "scenario.yaml"), "--control-port", str(CONTROL_PORT)]
    sim_cmd += ["--node-base-port", str(NODE_BASE), "--tick", "1"]
    sim = subprocess.Popen(
        sim_cmd, env=env, stdout=open(tmp / "sim.log", "wb"), stderr=subprocess.STDOUT
    )
    prom = None
    try:
        _wait(f"http://127.0.0.1:{CONTROL_PORT}/metrics")
        prom_cmd = ["prometheus", f"--config.file={tmp / 'prometheus.yml'}"]
        prom_cmd += [f"--storage.tsdb.path={tmp / 'tsdb'}"]
        prom_cmd += [f"--web.listen-address=127.0.0.1:{PROM_PORT}"]
        prom = subprocess.Popen(
            prom_cmd, stdout=open(tmp / "prom.log", "wb"), stderr=subprocess.STDOUT
        )
        _wait(f"http://127.0.0.1:{PROM_PORT}/-/ready")
        time.sleep(3 * INTERVAL)
        phases = [_phase(tmp, 1, seconds)] + ([_phase(tmp, shards, seconds)] if shards > 1 else [])
        window = int(seconds + 2 * INTERVAL)
        durs = [
            float(v)
            for s in _q(f'scrape_duration_seconds{{job="dcgm"}}[{window}s]', want="matrix")
            for _, v in s["values"]
        ]
        up = _q('sum(up{job="dcgm"})')
        sim_text = requests.get(f"http://127.0.0.1:{CONTROL_PORT}/metrics", timeout=10).text
        tick = _metric(sim_text, "goodput_sim_tick_seconds")
    finally:
        for p in (prom, sim):
            if p is not None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    durs.sort()
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "targets_up": float(up[0]["value"][1]) if up else 0.0,
        "scrape_p99_s": round(durs[int(0.99 * (len(durs) - 1))], 3) if durs else None,
        "sim_tick_s": tick,
        "phases": phases,
    }


def main(argv: list[str] | None = None) -> dict:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="125,250,500")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--keep", action="store_true", help="keep earlier live rows of other sizes")
    args = ap.parse_args(argv)
    rows = []
    for n in [int(x) for x in args.nodes.split(",") if x]:
        try:
            rows.append(run_size(n, args.shards, args.seconds))
        except (SystemExit, requests.RequestException) as exc:  # past the machine's ceiling
            rows.append({"nodes": n, "gpus": n * 8, "failed": str(exc)[:200], "phases": []})
        print(json.dumps(rows[-1]), flush=True)
    live = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "interval_s": INTERVAL,
        "seconds": args.seconds,
        "cores": os.cpu_count(),
        "rows": rows,
    }
    return write(live, args.out, keep=args.keep)


def write(live: dict, out: Path, keep: bool = False) -> dict:
    """Put the live rows into scale.json (beside the in-process rows) and re-render scale.md;
    `keep` adds them to earlier live rows (one size per run, each under the lock)."""
    from bench.scale import markdown

    path = out / "scale.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    if keep and doc.get("live"):
        sizes = {r["nodes"] for r in live["rows"]}
        live["rows"] = [r for r in doc["live"]["rows"] if r["nodes"] not in sizes] + live["rows"]
        live["rows"].sort(key=lambda r: r["nodes"])
    doc["live"] = live
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    (out / "scale.md").write_text(markdown(doc))
    return doc


if __name__ == "__main__":
    main()
