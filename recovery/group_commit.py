"""Group commit for the webhook: payloads that arrive together are durable in one transaction.

Ingest is serialised (one transaction at a time per store: `incidents.ingest_payloads`), so
under load each webhook request would wait for every earlier commit (on PostgreSQL, a WAL
flush each). `GroupCommit.ingest` queues the payload; the first waiting request becomes the
writer, folds everything queued in one transaction and wakes the others; each request returns
(and the webhook answers 200) only after the commit that holds its payload. If a batch fails,
its payloads are written again one by one, so one bad payload fails only its own request.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from recovery import failpoints, incidents
from recovery.settings import Settings

MAX_BATCH = 256


@dataclass
class _Slot:
    payload: incidents.Payload
    result: incidents.IngestResult | None = None
    error: BaseException | None = None
    done: bool = False


class GroupCommit:
    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine, self.settings = engine, settings
        self._cv = threading.Condition()
        self._queue: list[_Slot] = []
        self._writing = False

    def ingest(self, docs: list[dict[str, Any]], **kw: Any) -> incidents.IngestResult:
        """`incidents.ingest`, committed together with whatever else is waiting."""
        slot = _Slot(incidents.prepare(self.engine, self.settings, docs, **kw))
        with self._cv:
            self._queue.append(slot)
        while True:
            with self._cv:
                while not slot.done and self._writing:
                    self._cv.wait()
                if slot.done:
                    break
                # nobody is writing: this request writes what is queued, its own included
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                self._writing = True
            try:
                self._write(batch)
            finally:
                with self._cv:
                    self._writing = False
                    self._cv.notify_all()
        if slot.error is not None:
            raise slot.error
        failpoints.hit("ingested")
        assert slot.result is not None
        return slot.result

    def _write(self, batch: list[_Slot]) -> None:
        try:
            results = incidents.ingest_payloads(
                self.engine, self.settings, [s.payload for s in batch]
            )
            for s, r in zip(batch, results, strict=True):
                s.result = r
        except Exception as exc:  # noqa: BLE001 - each payload alone: only a bad one fails
            if len(batch) == 1:
                batch[0].error = exc
            else:
                for s in batch:
                    try:
                        (s.result,) = incidents.ingest_payloads(
                            self.engine, self.settings, [s.payload]
                        )
                    except Exception as one:  # noqa: BLE001
                        s.error = one
        for s in batch:
            s.done = True
