"""Scrape benchmark: one simulator process serving 125 nodes x 8 GPUs, scraped by a private
real Prometheus every 5 s; reports p50/p99 of Prometheus' own `scrape_duration_seconds`.

    python -m bench.scrape_bench [--nodes 125] [--seconds 60] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

PROM_PORT = 19190
CONTROL_PORT = 19398
NODE_BASE = 19700


def scenario(nodes: int) -> dict:
    jobs = [
        {"name": f"bench-{i:03d}", "nodes": 4, "duration_s": 86400, "step_time_s": 1.0}
        for i in range(nodes // 4)
    ]
    return {"name": "scrape-bench", "duration_s": 86400, "nodes": nodes, "jobs": jobs}


def wait(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up in {timeout}s")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=125)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    prom_bin = shutil.which("prometheus")
    if not prom_bin:
        raise SystemExit("prometheus is not installed (the local stack installs it)")
    tmp = Path(tempfile.mkdtemp(prefix="goodput-scrape-bench-"))
    (tmp / "scenario.yaml").write_text(yaml.safe_dump(scenario(args.nodes)))
    targets = [f"127.0.0.1:{NODE_BASE + i + 1}" for i in range(args.nodes)]
    (tmp / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "5s", "scrape_timeout": "5s"},
                "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": targets}]}],
            }
        )
    )
    env = {**os.environ, "GOODPUT_LOG_DIR": str(tmp / "logs")}
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "goodput.cli",
            "sim",
            "serve",
            "--scenario",
            str(tmp / "scenario.yaml"),
            "--control-port",
            str(CONTROL_PORT),
            "--node-base-port",
            str(NODE_BASE),
            "--tick",
            "1",
        ],
        env=env,
        stdout=open(tmp / "sim.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    prom = None
    try:
        wait(f"http://127.0.0.1:{CONTROL_PORT}/metrics")
        prom = subprocess.Popen(
            [
                prom_bin,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{PROM_PORT}",
            ],
            stdout=open(tmp / "prom.log", "wb"),
            stderr=subprocess.STDOUT,
        )
        wait(f"http://127.0.0.1:{PROM_PORT}/-/ready")
        time.sleep(args.seconds + 6)
        with PromClient(f"http://127.0.0.1:{PROM_PORT}", timeout=30) as api:
            window = f'scrape_duration_seconds{{job="dcgm"}}[{args.seconds}s]'
            series = api.raw(window, want="matrix")
            up = api.raw('sum(up{job="dcgm"})')
            samples = api.raw('sum(scrape_samples_scraped{job="dcgm"})')
        tick = requests.get(f"http://127.0.0.1:{CONTROL_PORT}/metrics", timeout=5).text
    finally:
        for p in (prom, sim):
            if p is not None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    durs = [float(v) for s in series for _, v in s["values"]]
    if not durs:
        raise SystemExit("no scrape_duration_seconds samples: see " + str(tmp))
    result = {
        "nodes": args.nodes,
        "gpus": args.nodes * 8,
        "scrape_interval_s": 5,
        "window_s": args.seconds,
        "scrapes": len(durs),
        "targets": len(series),
        "targets_up": float(up[0]["value"][1]) if up else 0.0,
        "samples_per_scrape_total": float(samples[0]["value"][1]) if samples else 0.0,
        "p50_ms": round(pct(durs, 0.5) * 1000, 2),
        "p99_ms": round(pct(durs, 0.99) * 1000, 2),
        "max_ms": round(max(durs) * 1000, 2),
        "mean_ms": round(statistics.mean(durs) * 1000, 2),
        "target_p99_ms": 100,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "sim_tick_line": next(
            (ln for ln in tick.splitlines() if ln.startswith("goodput_sim_tick_seconds")), ""
        ),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    result["pass"] = result["p99_ms"] <= 100 and result["targets_up"] == args.nodes
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scrape.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "scrape.md").write_text(
        "# Scrape benchmark (simulated dcgm-exporter)\n\n"
        f"One simulator process, {args.nodes} nodes x 8 GPUs = {args.nodes * 8} GPUs, each node "
        f"its own /metrics; a private Prometheus scraping all {args.nodes} every 5 s for "
        f"{args.seconds} s. Durations are Prometheus' own `scrape_duration_seconds`.\n\n"
        "| scrapes | targets up | p50 ms | p99 ms | max ms | target p99 | pass |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {result['scrapes']} | {result['targets_up']:.0f}/{args.nodes} | {result['p50_ms']} "
        f"| {result['p99_ms']} | {result['max_ms']} | 100 ms | {result['pass']} |\n\n"
        f"Machine: {os.cpu_count()} CPUs ({platform.platform()}), shared with other work; "
        f"measured {result['when']}.\n\nRerun: `python -m bench.scrape_bench`.\n"
    )
    print(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
