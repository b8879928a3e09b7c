"""Group commit for the webhook: payloads that arrive together are durable in one transaction.

Ingest is serialised (one transaction at a time per store: `incidents.ingest_payloads`), so
under load each webhook request would wait for every earlier commit (on PostgreSQL, a WAL
flush each). `GroupCommit.submit` queues a ready payload and returns a future; one writer
thread folds everything queued in one transaction and completes the futures of its batch only
after the commit. The webhook awaits it on the event loop (`ingest`): no worker thread is
held per waiting request, and a commit wakes only its own batch's requests. If a batch fails,
its payloads are written again one by one, so one bad payload fails only its own request;
unless the store itself failed it (locked, unreachable: `OperationalError`,
`InterfaceError`), which would fail each again after as long a wait: then the whole batch
fails at once (the webhook answers 503 and Alertmanager delivers it again). The writer
starts with the first payload and ends after `LINGER_S` without one.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from recovery import failpoints, incidents
from recovery.settings import Settings

MAX_BATCH = 256
LINGER_S = 1.0  # the writer waits this long for the next payload before it ends
STORE_DOWN = (OperationalError, InterfaceError)  # the store failed, not one payload


@dataclass
class _Slot:
    payload: incidents.Payload
    future: Future[incidents.IngestResult]


class GroupCommit:
    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine, self.settings = engine, settings
        self._cv = threading.Condition()
        self._queue: list[_Slot] = []
        self._writer: threading.Thread | None = None

    def submit(self, payload: incidents.Payload) -> Future[incidents.IngestResult]:
        """Queue a payload (`incidents.prepare`d): its future completes after the commit that
        holds it (or with the error that failed it alone)."""
        slot = _Slot(payload, Future())
        with self._cv:
            self._queue.append(slot)
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._drain, name="goodput-group-commit", daemon=True
                )
                self._writer.start()
            self._cv.notify()
        return slot.future

    async def ingest(self, docs: list[dict[str, Any]], **kw: Any) -> incidents.IngestResult:
        """`incidents.ingest` for the webhook, on the event loop: committed together with
        whatever else is waiting. Slurm's jobs on the nodes its alerts name are asked in a
        worker thread, and only when an alert needs them (`incidents.node_lookups`)."""
        if incidents.node_lookups(docs):
            ready = await asyncio.to_thread(
                incidents.prepare, self.engine, self.settings, docs, **kw
            )
        else:
            ready = incidents.Payload(docs, **kw)
        result = await asyncio.wrap_future(self.submit(ready))
        failpoints.hit("ingested")
        return result

    def _drain(self) -> None:
        while True:
            with self._cv:
                if not self._queue:
                    self._cv.wait(LINGER_S)
                if not self._queue:
                    self._writer = None  # the next submit starts another
                    return
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            # a request that went away before its payload was taken: not written (no 200 was
            # sent, so Alertmanager delivers it again)
            self._write([s for s in batch if s.future.set_running_or_notify_cancel()])

    def _write(self, batch: list[_Slot]) -> None:
        if not batch:
            return
        try:
            results = incidents.ingest_payloads(
                self.engine, self.settings, [s.payload for s in batch]
            )
        except Exception as exc:  # noqa: BLE001 - each payload alone: only a bad one fails
            if len(batch) == 1 or isinstance(exc, STORE_DOWN):
                for s in batch:
                    s.future.set_exception(exc)
                return
            for s in batch:
                try:
                    (one,) = incidents.ingest_payloads(self.engine, self.settings, [s.payload])
                except Exception as err:  # noqa: BLE001
                    s.future.set_exception(err)
                else:
                    s.future.set_result(one)
            return
        for s, r in zip(batch, results, strict=True):
            s.future.set_result(r)
