"""Against the real local Slurm: running, requeued, failed and cancelled jobs and a drained node
show up correctly in Prometheus through the Slurm exporter."""
# ruff: noqa: E501

from __future__ import annotations

import socket
import threading
import uuid

import pytest

from exporters.slurm_exporter import serve
from tests.conftest import wait_until
from tests.helpers import add_scrape_target, prom_query, slurm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sbatch(name: str, wrap: str, *extra: str) -> str:
    out = slurm("sbatch", "--parsable", "-J", name, "-o", "/dev/null", "--gpus=1", *extra,
                "--wrap", wrap)  # fmt: skip
    return out.strip().split(";")[0]


def _state(job_id: str) -> str:
    return slurm("squeue", "-h", "-j", job_id, "-o", "%T", check=False).strip()


def _undrained_node() -> str:
    rows = [line.split() for line in slurm("sinfo", "-h", "-N", "-o", "%N %T").splitlines()]
    ok = [n for n, state in rows if not any(w in state for w in ("drain", "down", "fail"))]
    if not ok:
        pytest.skip("every node is drained or down by someone else")
    idle = [n for n, state in rows if n in ok and state == "idle"]
    return (idle or ok)[-1]


def test_slurm_states_reach_prometheus(prometheus_url):
    uid = uuid.uuid4().hex[:8]
    tag = f"slurm-{uid}"
    port = _free_port()
    stop = threading.Event()
    t = threading.Thread(target=serve, kwargs={"port": port, "interval": 1.0, "stop": stop})
    t.start()
    target = add_scrape_target(tag, port)
    jobs: list[str] = []
    drained = None
    try:
        running = _sbatch(f"gp4-run-{uid}", "sleep 300")
        requeued = _sbatch(f"gp4-rq-{uid}", "sleep 300", "--requeue")
        failed = _sbatch(f"gp4-fail-{uid}", "exit 3")
        cancelled = _sbatch(f"gp4-cancel-{uid}", "sleep 300")
        jobs = [running, requeued, failed, cancelled]
        for j in (running, requeued, cancelled):  # the cluster is shared: allow for a queue
            wait_until(lambda j=j: _state(j) == "RUNNING", 90, what=f"job {j} running")
        slurm("scontrol", "requeue", requeued)
        slurm("scancel", cancelled)
        # drain a node nobody else drained (so resuming it later undoes only our drain);
        # running jobs keep running on a drained node
        drained = _undrained_node()
        slurm("scontrol", "update", f"NodeName={drained}", "State=DRAIN", f"Reason=gp4-test-{uid}")

        def q(expr):
            return prom_query(prometheus_url, expr)

        def has(expr):
            return q(expr.replace("}", f',test="{tag}"}}', 1))

        wait_until(
            lambda: has(f'goodput_slurm_job_state{{job_id="{running}",state="running"}}'),
            30,
            what="running",
        )
        info = wait_until(
            lambda: has(f'goodput_slurm_job_node_info{{job_id="{running}"}}'), 10, what="node info"
        )
        assert info[0]["metric"]["job_name"] == f"gp4-run-{uid}"
        wait_until(
            lambda: has(f'goodput_slurm_job_state{{job_id="{failed}",state="failed"}}'),
            30,
            what="failed",
        )
        code = wait_until(
            lambda: has(f'goodput_slurm_job_exit_code{{job_id="{failed}"}}'), 10, what="exit code"
        )
        assert float(code[0]["value"][1]) == 3
        wait_until(
            lambda: has(f'goodput_slurm_job_state{{job_id="{cancelled}",state="cancelled"}}'),
            30,
            what="cancelled",
        )
        rq = wait_until(
            lambda: has(f'goodput_slurm_job_restarts{{job_id="{requeued}"}} >= 1'),
            30,
            what="restarts",
        )
        assert float(rq[0]["value"][1]) >= 1
        node = wait_until(
            lambda: has(f'goodput_slurm_node_state{{node="{drained}",reason="gp4-test-{uid}"}}'),
            30,
            what="drain",
        )
        assert "drain" in node[0]["metric"]["state"]
        gpus = has(f'goodput_slurm_job_gpus{{job_id="{running}"}}')
        assert float(gpus[0]["value"][1]) == 1
        assert float(q(f'goodput_slurm_up{{test="{tag}"}}')[0]["value"][1]) == 1
    finally:
        for j in jobs:
            slurm("scancel", j, check=False)
        if drained:
            slurm("scontrol", "update", f"NodeName={drained}", "State=RESUME", check=False)
        stop.set()
        t.join(15)
        target.unlink(missing_ok=True)
