"""Real time behind HTTP: one dcgm-exporter-like /metrics listener per node (asyncio, cached
text per node per tick), the control API (uvicorn, same event loop), file_sd targets."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from exporters.sim.api import build_app
from exporters.sim.dcgm import render_node
from exporters.sim.model import Node
from exporters.sim.runner import Simulation

log = logging.getLogger("goodput.sim")

_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
    b"Content-Length: %d\r\n\r\n"
)
_404 = b"HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n\r\nnot found\n"


class NodeEndpoint:
    """One node's /metrics listener; closed (connections dropped) while the node is dead or
    the scenario's DCGM exporters go unscraped (a gap)."""

    def __init__(self, server: SimServer, node: Node, host: str, port: int) -> None:
        self.server, self.node, self.host, self.port = server, node, host, port
        self.listener: asyncio.Server | None = None
        self.conns: set[asyncio.StreamWriter] = set()
        self.body: bytes | None = None

    async def open(self) -> None:
        self.listener = await asyncio.start_server(
            self._serve, self.host, self.port, reuse_address=True
        )

    async def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            for w in list(self.conns):
                w.close()
            await self.listener.wait_closed()
            self.listener = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.conns.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
                if not path.startswith(b"/metrics"):
                    writer.write(_404)
                else:
                    if self.body is None:
                        self.body = render_node(self.node, self.server.host_label)
                    writer.write(_HEAD % len(self.body) + self.body)
                    self.server.stats["scrapes"] += 1
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self.conns.discard(writer)
            writer.close()


class SimServer:
    def __init__(
        self,
        sim: Simulation,
        host: str = "127.0.0.1",
        control_port: int = 19400,
        node_base_port: int = 19500,
        tick_s: float = 1.0,
        host_label: str = "Hostname",
        targets_dir: Path | None = None,
    ) -> None:
        self.sim, self.host, self.control_port = sim, host, control_port
        self.tick_s, self.host_label, self.targets_dir = tick_s, host_label, targets_dir
        self.stats: dict[str, float] = {"scrapes": 0, "tick_seconds": 0.0, "started": time.time()}
        self.endpoints = [
            NodeEndpoint(self, n, host, node_base_port + i + 1)
            for i, n in enumerate(sim.cluster.nodes.values())
        ]

    def write_targets(self) -> None:
        if self.targets_dir is None:
            return
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        path = self.targets_dir / "dcgm-sim.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                [
                    {
                        "targets": [f"{e.host}:{e.port}" for e in self.endpoints],
                        "labels": {"simulator": "goodput"},
                    }
                ]
            )
        )
        tmp.rename(path)

    async def tick_forever(self) -> None:
        last = time.time()
        while True:
            await asyncio.sleep(max(0.0, last + self.tick_s - time.time()))
            now = time.time()
            t0 = time.perf_counter()
            try:
                self.sim.step(now - last)
            except Exception:  # one bad tick must not freeze the simulated cluster
                log.exception("simulator tick failed")
            last = now
            gap = self.sim.scenario.unscraped("dcgm", self.sim.elapsed)
            for e in self.endpoints:
                e.body = None
                up = e.node.alive and not gap
                if up and e.listener is None:
                    await e.open()
                elif not up and e.listener is not None:
                    await e.close()
            self.stats["tick_seconds"] = time.perf_counter() - t0

    async def run(self) -> None:
        import uvicorn

        for e in self.endpoints:
            await e.open()
        self.write_targets()
        config = uvicorn.Config(
            build_app(self.sim, self.stats),
            host=self.host,
            port=self.control_port,
            log_level="warning",
            access_log=False,
        )
        server = uvicorn.Server(config)
        ticker = asyncio.create_task(self.tick_forever())
        try:
            await server.serve()
        finally:
            ticker.cancel()
            for e in self.endpoints:
                await e.close()
            if self.targets_dir is not None:
                (self.targets_dir / "dcgm-sim.json").unlink(missing_ok=True)


def log_dir() -> Path:
    """$GOODPUT_LOG_DIR, else $GOODPUT_STACK_DIR/logs/cluster."""
    if os.environ.get("GOODPUT_LOG_DIR"):
        return Path(os.environ["GOODPUT_LOG_DIR"])
    return Path(os.environ.get("GOODPUT_STACK_DIR", "/tmp/goodput-stack")) / "logs" / "cluster"  # noqa: S108


def serve(sim: Simulation, **kwargs: Any) -> None:
    asyncio.run(SimServer(sim, **kwargs).run())
