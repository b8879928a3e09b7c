"""The production receiver in process, as the fault benchmark drives it.

`Receiver` builds `recovery.app.create_app` on a simulated clock (`recovery.clock.ManualClock`)
with the simulation as its evidence sources and scheduler, posts alerts to its webhook as
Alertmanager would (`deliver`), runs one pass of the diagnosis worker and of the action executor
(`step`: the passes their threads run in production) and reads incidents, diagnoses and actions
back from its HTTP API (`incidents`). Nothing of the receiver's logic is here.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.inhibition import Inhibition
from recovery import reconciler, worker
from recovery.clock import ManualClock
from recovery.evidence import Sources
from recovery.policy import DEFAULT_FILE
from recovery.scheduler import Scheduler
from recovery.settings import Settings

_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert


@dataclass(frozen=True)
class BenchSettings(Settings):
    """The receiver's settings (production defaults) plus the scheduler adapter that
    `recovery.action_config.config` takes from its settings."""

    scheduler_adapter: Any = None
    alertmanager_url: str = ""  # off, whatever the environment says: no notices from the bench


@dataclass
class ActionView:
    kind: str
    default_kind: str | None
    disposition: str | None
    reasons: tuple[str, ...]


@dataclass
class Incident:
    """An incident as the receiver's API shows it (its latest diagnosis and action)."""

    id: int
    job_id: str | None
    node: str | None
    opened_at: float
    resolved_at: float | None = None
    alert_names: list[str] = field(default_factory=list)
    diagnosis: dict[str, Any] | None = None  # the one its action was planned on, else latest
    latest: dict[str, Any] | None = None  # the latest (a later alert re-diagnoses an incident)
    action: ActionView | None = None
    result: str = ""  # executed | failed: ... | not executed (disposition) | "" (none yet)
    diagnose_s: float = 0.0
    updated_at: float | None = None

    def summary(self) -> dict[str, Any]:
        d = self.diagnosis or {}
        a = self.action
        return {
            "id": self.id,
            "job_id": self.job_id,
            "node": self.node,
            "opened_at": self.opened_at,
            "resolved_at": self.resolved_at,
            "alerts": sorted(self.alert_names),
            "outcome": d.get("outcome"),
            "affected_nodes": d.get("affected_nodes", []),
            "latest_affected_nodes": (self.latest or {}).get("affected_nodes", []),
            "confidence": d.get("confidence"),
            "root_cause": (d.get("root_cause") or "")[:200],
            "action": a.kind if a else None,
            "default_action": a.default_kind if a else None,
            "disposition": a.disposition if a else None,
            "reasons": list(a.reasons) if a else [],
            "result": self.result,
        }


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _labels(raw: dict[str, Any]) -> dict[str, str]:
    """An alert's labels as Prometheus sends them: strings, empty ones dropped."""
    out = {}
    for k, v in raw.items():
        if v is None or (isinstance(v, float) and np.isnan(v)) or str(v) == "":
            continue
        out[str(k)] = str(v)
    return out


def _result(row: dict[str, Any]) -> str:
    state = row["state"]
    if state == "executed":
        return "executed"
    if state == "failed":
        return f"failed: {row.get('last_error') or ''}"[:300]
    if state in ("planning", "waiting_scheduler", "ready", "approved", "executing"):
        return ""
    disposition = (row["body"].get("action") or {}).get("disposition")
    return f"not executed ({disposition or state})"


class Receiver:
    """One receiver (its own SQLite store under `workdir`) on `clock`, in act mode under the
    default policy, with `sources` as its Slurm/Prometheus, `log_dir` its logs, `scheduler` its
    scheduler adapter."""

    def __init__(
        self,
        workdir: Path,
        clock: ManualClock,
        sources: Sources,
        log_dir: Path,
        scheduler: Scheduler,
    ) -> None:
        from fastapi.testclient import TestClient

        from recovery.app import create_app

        self.clock = clock
        self.settings = BenchSettings(
            db_url=f"sqlite:///{workdir / 'receiver.db'}",
            require_auth=False,
            log_dir=str(log_dir),
            prometheus_url="",  # off for the receiver's accounting too (evidence: `sources`)
            clock=clock,
            sources=sources,
            scheduler_adapter=scheduler,
            extra={
                "GOODPUT_MODE": "act",
                "GOODPUT_POLICY_FILE": str(DEFAULT_FILE),
                "GOODPUT_ACTIONS_THREAD": "0",  # step() runs the executor's passes
            },
        )
        self.app = create_app(self.settings, start_worker=False)
        self.store = self.app.state.engine
        self.http = TestClient(self.app)
        self._active: dict[str, tuple[dict[str, str], float]] = {}  # fingerprint -> (labels, start)
        self._since: dict[str, float] = {}  # fingerprint -> since when it fires (muted or not)
        self.inhibition = Inhibition.load()
        self._views: dict[int, Incident] = {}
        self.incidents: list[Incident] = []
        self.posted = 0  # alerts posted (firing and resolved)

    def close(self) -> None:
        self.http.close()
        self.store.dispose()

    def step(self, now: float, firing: list[dict[str, Any]]) -> None:
        """At `now`: deliver the alerts, run the worker's and the executor's pass once."""
        self.clock.t = now
        posted = self.deliver(now, firing)
        t0 = time.perf_counter()
        diagnosed = worker.run_once(self.store, self.settings)  # the worker thread's one pass
        took = time.perf_counter() - t0
        executed = reconciler.reconcile(self.store, self.settings)  # the executor's one pass
        if posted or diagnosed or executed:
            self._refresh({i: took / len(diagnosed) for i in diagnosed})

    def deliver(self, now: float, firing: list[dict[str, Any]]) -> int:
        """Post what changed in the firing set, as Alertmanager's webhook would (every
        group_interval, 5 s = one step): new alerts firing, ended ones resolved. What
        Alertmanager's inhibit rules mute is not posted while muted: a new alert (posted once
        it is not, with its first firing time) and an ended one's resolve."""
        current = {}
        for raw in firing:
            labels = _labels(raw)
            key = json.dumps(sorted(labels.items()))
            current[hashlib.sha256(key.encode()).hexdigest()[:16]] = labels
        self._since = {fp: self._since.get(fp, now) for fp in current}
        firing = list(current.values())
        muted = dict(zip(current, self.inhibition.muted(firing), strict=True))
        out = []
        for fp, labels in current.items():
            if fp not in self._active and not muted[fp]:
                self._active[fp] = (labels, self._since[fp])
                out.append(self._alert(fp, labels, self._since[fp], "firing"))
        for fp in [fp for fp in self._active if fp not in current]:
            labels, start = self._active[fp]
            if self.inhibition.mutes(labels, firing):
                continue  # Alertmanager mutes its resolve too, until the source ends
            del self._active[fp]
            out.append(self._alert(fp, labels, start, "resolved", now))
        for i in range(0, len(out), 1000):  # the receiver's MAX_ALERTS per payload
            batch = out[i : i + 1000]
            status = "firing" if any(a["status"] == "firing" for a in batch) else "resolved"
            doc = {"version": "4", "status": status, "receiver": "goodput", "alerts": batch}
            resp = self.http.post("/api/v1/alerts", json=doc)
            if resp.status_code != 200:
                raise RuntimeError(f"receiver refused the alerts: {resp.status_code} {resp.text}")
        self.posted += len(out)
        return len(out)

    @staticmethod
    def _alert(
        fp: str, labels: dict[str, str], start: float, status: str, end: float | None = None
    ) -> dict[str, Any]:
        return {
            "status": status,
            "labels": labels,
            "annotations": {},
            "startsAt": _rfc3339(start),
            "endsAt": _rfc3339(end) if end is not None else _ZERO_TIME,
            "fingerprint": fp,
        }

    def _get(self, path: str, **params: Any) -> Any:
        resp = self.http.get(path, params=params)
        resp.raise_for_status()
        return resp.json()

    def _refresh(self, diagnose_s: dict[int, float]) -> None:
        """Read the incidents, their latest diagnoses and actions back from the receiver."""
        items: list[dict[str, Any]] = []
        while True:
            page = self._get("/api/v1/incidents", limit=500, offset=len(items))
            items += page["items"]
            if len(items) >= page["total"] or not page["items"]:
                break
        latest: dict[str, dict[str, Any]] = {}
        for a in sorted(
            self._get("/api/v1/actions", limit=1000)["actions"],
            key=lambda a: (a["created_at"], a["id"]),
        ):
            if a["incident_id"]:
                latest[a["incident_id"]] = a
        for it in items:
            v = self._views.get(it["id"])
            if v is None:
                v = self._views[it["id"]] = Incident(it["id"], it["job_id"], it["node"], 0.0)
            v.opened_at, v.resolved_at = it["opened_at"], it["resolved_at"]
            v.alert_names = sorted(it["alert_summary"]["by_name"])
            if it["updated_at"] != v.updated_at and it["outcome"] is not None:
                v.latest = self._get(f"/api/v1/incidents/{it['id']}")["diagnosis"]
            v.updated_at = it["updated_at"]
            v.diagnose_s = max(v.diagnose_s, diagnose_s.get(it["id"], 0.0))
            row = latest.get(str(it["id"]))
            act = (row or {}).get("body", {}).get("action") if row else None
            if act:
                v.action = ActionView(
                    act["kind"],
                    act.get("default_kind"),
                    act.get("disposition"),
                    tuple(act.get("reasons") or ()),
                )
            v.result = _result(row) if row else ""
            v.diagnosis = (row or {}).get("body", {}).get("diagnosis") or v.latest
        self.incidents = [self._views[i] for i in sorted(self._views)]
