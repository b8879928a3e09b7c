"""Simulated scheduler adapter: the simulator's HTTP control API (default 127.0.0.1:19400).

The session is injectable (anything with requests' `get`/`post`), so the benchmark can pass an
in-process client (e.g. a Starlette TestClient) instead of a socket.
"""

from __future__ import annotations

from typing import Any

import requests

from recovery.scheduler.base import (
    JobState,
    NodeState,
    Scheduler,
    SchedulerError,
    SchedulerUnavailable,
    check_job,
    check_node,
)

API = "/api/v1/scheduler"


class SimulatedScheduler(Scheduler):
    verify_timeout_s = 5.0
    verify_interval_s = 0.05

    def __init__(
        self, base_url: str = "http://127.0.0.1:19400", session: Any = None, timeout_s: float = 5.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session if session is not None else requests.Session()
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.base_url}{API}{path}"
        try:
            if method == "GET":
                resp = self.session.get(url, timeout=self.timeout_s)
            else:
                resp = self.session.post(url, json=body or {}, timeout=self.timeout_s)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise SchedulerUnavailable(f"simulator unreachable: {type(exc).__name__}") from None
        if resp.status_code == 404 and method == "GET":
            return None
        if resp.status_code >= 500:
            raise SchedulerUnavailable(f"simulator {method} {path}: {resp.status_code}")
        if resp.status_code >= 400:
            raise SchedulerError(f"simulator {method} {path}: {resp.status_code} {resp.text[:200]}")
        try:
            return resp.json()
        except ValueError:
            return None

    def node_states(self) -> list[NodeState]:
        doc = self._call("GET", "/nodes") or []
        if isinstance(doc, dict):
            doc = doc.get("nodes", [])
        return [
            NodeState(
                str(n["node"]),
                str(n.get("state", "")).upper(),
                str(n.get("reason") or ""),
                tuple(n.get("partitions") or ("sim",)),
            )
            for n in doc
        ]

    def job_state(self, job_id: str) -> JobState | None:
        j = self._call("GET", f"/jobs/{check_job(job_id)}")
        if not j:
            return None
        return JobState(
            job_id=str(j.get("job_id", job_id)),
            name=str(j.get("name") or ""),
            state=str(j.get("state") or "").upper(),
            nodes=tuple(j.get("nodes") or ()),
            restarts=int(j.get("restarts") or 0),
            exit_code=j.get("exit_code"),
            comment=str(j.get("comment") or ""),
            excluded=tuple(j.get("excluded") or ()),
            held=bool(j.get("held")),
            reason=str(j.get("reason") or ""),
            partition=j.get("partition") or "sim",
            start_time=j.get("start_time"),
            gpus=int(j.get("gpus") or 0),
            node_count=int(j.get("node_count") or 0),
        )

    def _drain(self, node: str, reason: str) -> None:
        self._call("POST", f"/nodes/{check_node(node)}/drain", {"reason": reason})

    def _resume(self, node: str) -> None:
        self._call("POST", f"/nodes/{check_node(node)}/resume")

    def _requeue(
        self, job_id: str, exclude: tuple[str, ...] | None, hold: bool, delay_s: float
    ) -> None:
        body: dict[str, Any] = {"hold": hold}
        if exclude is not None:  # the job's exclusions become exactly these ([] clears them)
            body["exclude"] = list(exclude)
        if delay_s > 0:  # not in the simulator's requeue body (docs/contracts.md): only if asked
            body["delay_s"] = delay_s
        self._call("POST", f"/jobs/{check_job(job_id)}/requeue", body)

    def _set_exclude(self, job_id: str, exclude: tuple[str, ...] | None, delay_s: float) -> None:
        # The simulator's requeue is atomic (exclusion set before the restart): nothing to do.
        return None

    def _hold(self, job_id: str) -> None:
        self._call("POST", f"/jobs/{check_job(job_id)}/hold")

    def _release(self, job_id: str) -> None:
        self._call("POST", f"/jobs/{check_job(job_id)}/release")

    def _cancel(self, job_id: str) -> None:
        self._call("POST", f"/jobs/{check_job(job_id)}/cancel")
