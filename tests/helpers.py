"""Small helpers for tests that talk to the real stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import requests


def slurm(*argv: str, check: bool = True) -> str:
    """Run a Slurm client command (argv list) against the local stack; returns stdout."""
    out = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=30, env=os.environ.copy()
    )
    if check and out.returncode != 0:
        raise AssertionError(f"{argv} failed: {out.stderr.strip()}")
    return out.stdout


def prom_query(url: str, expr: str) -> list[dict]:
    r = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


def add_scrape_target(name: str, port: int) -> Path:
    """Ask the stack's Prometheus to scrape 127.0.0.1:PORT (file_sd, picked up within ~2 s)."""
    targets = Path(os.environ["GOODPUT_STACK_DIR"]) / "prometheus" / "targets"
    path = targets / f"extra-{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"test": name}}]))
    tmp.rename(path)
    return path


def scontrol_show(entity: str, name: str) -> dict[str, str]:
    """`scontrol show <job|node> <name> -o` as a dict ({} when Slurm does not know it)."""
    out = slurm("scontrol", "show", entity, "-o", name, check=False)
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def forget_faults(prometheus_url: str, log_dir: str) -> None:
    """Leave no fault behind for later tests (the demo's own clean-up: series and logs)."""
    from goodput import demo

    demo.forget_faults(prometheus_url, Path(log_dir))


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM a process we started, then SIGKILL it if it is still there after 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
