"""A job log with progress lines and a failure drives the log metrics in real Prometheus."""

from __future__ import annotations

import socket
import threading
import uuid

from exporters.logmetrics.exporter import serve
from tests.conftest import wait_until
from tests.helpers import add_scrape_target, prom_query


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_job_log_drives_prometheus(prometheus_url, tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "kernel").mkdir()
    job_id = str(900000000 + uuid.uuid4().int % 99999999)  # not a real Slurm id: no clash
    node = f"lognode{uuid.uuid4().hex[:6]}"
    port = _free_port()
    stop = threading.Event()
    t = threading.Thread(
        target=serve, kwargs={"log_dir": tmp_path, "port": port, "interval": 0.2, "stop": stop}
    )
    t.start()
    target = add_scrape_target(f"logmetrics-{job_id}", port)
    try:
        log = tmp_path / "jobs" / f"slurm-{job_id}.out"
        with open(log, "a") as fh:
            for it in (10, 20, 30):
                fh.write(
                    f" iteration {it:8d}/  1000 | consumed samples: {it * 64} | elapsed time per"
                    " iteration (ms): 400.0 | global batch size: 64 | lm loss: 3.1E+00 |"
                    " number of skipped iterations: 0 | number of nan iterations: 0 |\n"
                )
            fh.write("[rank2]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to alloc")
            fh.flush()
            fh.write("ate 2.00 GiB. GPU 2 has a total capacity of 79 GiB\n")
        with open(tmp_path / "kernel" / f"{node}.log", "a") as fh:
            fh.write("kernel: NVRM: Xid (PCI:0000:2b:00): 48, pid=1, name=python, DBE\n")

        def q(expr):
            return prom_query(prometheus_url, expr)

        it = wait_until(
            lambda: q(f'goodput_job_iteration{{job_id="{job_id}"}}'), 30, what="iteration series"
        )
        assert float(it[0]["value"][1]) == 30
        oom = wait_until(
            lambda: q(f'goodput_log_pattern_matches_total{{job_id="{job_id}",pattern="cuda_oom"}}'),
            15,
            what="cuda_oom counter",
        )
        assert float(oom[0]["value"][1]) == 1
        thr = q(f'goodput_job_throughput_samples_per_second{{job_id="{job_id}"}}')
        assert float(thr[0]["value"][1]) == 160.0
        xid = wait_until(
            lambda: q(f'goodput_node_xid_errors_total{{node="{node}",xid="48"}}'), 15, what="xid"
        )
        assert float(xid[0]["value"][1]) == 1
        age = q(f'time() - goodput_job_last_progress_timestamp_seconds{{job_id="{job_id}"}}')
        assert 0 <= float(age[0]["value"][1]) < 60
    finally:
        stop.set()
        t.join(5)
        target.unlink(missing_ok=True)
