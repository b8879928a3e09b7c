"""Upload dashboards to Grafana over its HTTP API (plain requests; no client library).

Contract used (Grafana's documented dashboard API): `POST /api/dashboards/db` with
`Authorization: Bearer <service-account token>` and body
`{"dashboard": {..., "id": null, "uid": ...}, "overwrite": true, "folderUid": ..., "message": ...}`;
200 answers `{"id", "uid", "url", "status": "success", "version"}`; errors (400, 401, 403, 404,
412) answer `{"message": ...}`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import requests


class GrafanaError(RuntimeError):
    """Grafana refused a dashboard or could not be reached."""


def check_url(url: str) -> str:
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise GrafanaError(f"Grafana URL must be http(s)://host[:port], not {url!r}")
    return url.rstrip("/")


def push(
    url: str,
    token: str,
    model: dict[str, Any],
    folder_uid: str = "",
    timeout: float = 10.0,
    session: requests.Session | None = None,
) -> dict[str, Any]:
    """Create or overwrite one dashboard; returns Grafana's answer (uid, url, version)."""
    if not token.strip():
        raise GrafanaError("empty Grafana token")
    body: dict[str, Any] = {
        "dashboard": {**model, "id": None},
        "overwrite": True,
        "message": "goodput dashboards push",
    }
    if folder_uid:
        body["folderUid"] = folder_uid
    http = session or requests.Session()
    try:
        r = http.post(
            f"{check_url(url)}/api/dashboards/db",
            json=body,
            headers={"Authorization": f"Bearer {token.strip()}", "Accept": "application/json"},
            timeout=timeout,
        )
    except requests.RequestException as e:
        raise GrafanaError(f"cannot reach Grafana at {url}: {e}") from e
    try:
        answer = r.json()
    except ValueError:
        answer = {"message": r.text[:200]}
    if r.status_code != 200 or answer.get("status") != "success":
        why = answer.get("message", "")
        raise GrafanaError(f"Grafana refused {model.get('uid')!r}: HTTP {r.status_code} {why}")
    return answer
