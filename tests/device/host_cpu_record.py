# ruff: noqa: E501 - the workloads are code in strings
"""Record what real PyTorch processes do on the host, phase by phase, with the NVML exporter's
own process-tree reader (exporters/proctree.py): the fixture tests/data/real/host-cpu/.

Each phase is a real PyTorch workload in its own process, sampled every second as the
exporter's counter reads it (the CPU seconds the process and its descendants, compile and
data-loader workers, gained sample by sample). Run with a Python
that has torch (the CPU build does: the phases are host-side):

    python tests/device/host_cpu_record.py OUT.csv [--seconds 40]

Busy phases: a training loop, a first call through torch.compile (inductor, its compile
workers), loading and saving a 1 GiB checkpoint, a rank tokenising text before its first
step. Waiting phases: a rendezvous whose peer never comes (TCPStore), a collective whose peer
never calls it (gloo all_reduce), a data loader whose worker blocks, a read of a pipe nobody
writes (a stalled file system's read looks the same to the CPU).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from exporters.proctree import Gains, Snapshot  # noqa: E402

PRELUDE = "import os, sys, time, torch\ntorch.set_num_threads(1)\n"
PHASES: dict[str, str] = {
    "train": """
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
        opt = torch.optim.AdamW(model.parameters())
        while True:
            loss = model(torch.randn(64, 512)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
    """,
    "compile": """
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
        model = torch.compile(torch.nn.TransformerEncoder(layer, 4), mode="max-autotune-no-cudagraphs")
        model(torch.randn(8, 128, 256)).sum().backward()  # the first step: compiled, then exits
    """,
    "ckpt_load": """
        path = sys.argv[1] + "/ckpt.pt"
        torch.save({f"w{i}": torch.randn(1024, 1024) for i in range(256)}, path)
        print("saved", flush=True)
        for _ in range(1000):
            state = torch.load(path, weights_only=True)
            del state
    """,
    "ckpt_save": """
        state = {f"w{i}": torch.randn(1024, 1024) for i in range(256)}
        for i in range(1000):
            torch.save(state, sys.argv[1] + f"/ckpt{i % 2}.pt")
    """,
    "tokenise": """
        words = [f"token{i % 5000}" for i in range(200000)]
        vocab = {}
        while True:
            ids = [vocab.setdefault(w.lower().strip(), len(vocab)) for w in " ".join(words).split()]
    """,
    "rendezvous_hang": """
        import torch.distributed as dist, datetime
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
        dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(hours=1))
    """,
    "collective_hang": """
        import torch.distributed as dist, datetime, multiprocessing as mp
        def peer(port):
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            dist.init_process_group("gloo", rank=1, world_size=2, timeout=datetime.timedelta(hours=1))
            time.sleep(3600)  # joined, but never calls the collective
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
        mp.Process(target=peer, args=(sys.argv[2],), daemon=True).start()
        dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(hours=1))
        print("joined", flush=True)
        dist.all_reduce(torch.ones(1))
    """,
    "loader_hang": """
        import threading
        class Stuck(torch.utils.data.Dataset):
            def __len__(self): return 10**6
            def __getitem__(self, i): threading.Event().wait()
        next(iter(torch.utils.data.DataLoader(Stuck(), num_workers=2, batch_size=4)))
    """,
    "pipe_read_hang": """
        r, w = os.pipe()
        os.read(r, 1)
    """,
}
LONGER = {"compile": 4.0}  # x --seconds: time for the first compiled step (it ends there)


def record(phase: str, seconds: float, scratch: str, port: int) -> list[tuple[float, float]]:
    """(seconds since start, CPU seconds of the process tree) every second."""
    code = PRELUDE + textwrap.dedent(PHASES[phase])
    cold = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=scratch)}  # a cold compile cache
    proc = subprocess.Popen(
        [sys.executable, "-c", code, scratch, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **cold},
    )
    start, rows, gains, total = time.monotonic(), [], Gains(), 0.0
    try:
        while (t := time.monotonic() - start) < seconds and proc.poll() is None:
            snap = Snapshot.take()  # what the exporter's counter adds, scrape by scrape
            total += gains.seconds(snap, {0: snap.tree([proc.pid])})[0]
            rows.append((round(t, 2), total))
            time.sleep(1.0 - (time.monotonic() - start) % 1.0)
    finally:
        proc.kill()
        proc.wait()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--phases", nargs="*", default=list(PHASES))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch, args.out.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["phase", "t_s", "cpu_seconds"])
        for i, phase in enumerate(args.phases):
            rows = record(phase, args.seconds * LONGER.get(phase, 1.0), scratch, 29500 + i)
            out.writerows((phase, t, cpu) for t, cpu in rows)
            cores = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(rows, rows[1:], strict=False)]
            mid = sorted(cores)[len(cores) // 2] if cores else float("nan")
            print(f"{phase}: {len(rows)} samples, median {mid:.2f} cores", flush=True)
            f.flush()


if __name__ == "__main__":
    main()
