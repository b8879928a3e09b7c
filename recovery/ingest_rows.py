"""The rows one ingest transaction writes besides incidents: the alerts of a batch of webhook
payloads (their stored state read in one query, the new ones inserted in one statement, kept
current while the batch folds) and the new alert→incident links with their incident updates
(written together, executemany: one round trip each on PostgreSQL's pipeline).
`recovery.incidents` decides what joins what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, case, insert, or_, select, update

from recovery import validate
from recovery.store import alerts, dumps, incident_alerts, incidents

Identity = tuple[str, str]  # Alertmanager's (fingerprint, startsAt)


def stored_alerts(conn: Connection, docs: list[dict[str, Any]]) -> dict[Identity, Any]:
    """The stored alerts among `docs`, by identity, in one query (under the ingest lock, so
    only this transaction adds or changes them: `upsert_alert` keeps the map current)."""
    fps = {d["fingerprint"] for d in docs}
    if not fps:
        return {}
    rows = conn.execute(_ALERTS_BY_FINGERPRINT, {"b_fps": sorted(fps)})
    return {(r.fingerprint, r.starts_at): r for r in rows}


def insert_new(
    conn: Connection, docs: list[dict[str, Any]], now: float, known: dict[Identity, Any]
) -> set[Identity]:
    """Insert every alert among `docs` that is not stored, as its first sight in the batch
    gives it, in one statement (ids in the docs' order, as one insert each would give them);
    `known` gains them. Returns their identities, for `upsert_alert` to report them new."""
    rows: dict[Identity, dict[str, Any]] = {}
    for doc in docs:
        identity = (doc["fingerprint"], doc["startsAt"])
        if identity not in known and identity not in rows:
            rows[identity] = _alert_row(doc, now)
    if not rows:
        return set()
    ids = conn.execute(_INSERT_ALERTS, list(rows.values())).scalars().all()
    for (identity, row), new_id in zip(rows.items(), ids, strict=True):
        known[identity] = Stored(int(new_id), row["status"])
    return set(rows)


def upsert_alert(
    conn: Connection,
    doc: dict[str, Any],
    now: float,
    known: dict[Identity, Any],
    fresh: set[Identity],
) -> tuple[int, bool, bool]:
    """(alert id, new, status changed) of one alert of a payload, in the batch's order: the
    first sight of an alert `insert_new` inserted (`fresh`) is new; `known` is updated."""
    identity = (doc["fingerprint"], doc["startsAt"])
    row = known[identity]
    if identity in fresh:
        fresh.discard(identity)
        return row.id, True, False
    if row.status == doc["status"]:
        return row.id, False, False
    conn.execute(
        update(alerts)
        .where(alerts.c.id == row.id)
        .values(status=doc["status"], ends_ts=_ends(doc), updated_at=now)
    )
    known[identity] = Stored(row.id, doc["status"])
    return row.id, False, True


def _ends(doc: dict[str, Any]) -> float | None:
    return validate.timestamp(doc.get("endsAt") or "0001-01-01T00:00:00Z") or None


def _alert_row(doc: dict[str, Any], now: float) -> dict[str, Any]:
    labels = doc["labels"]
    return {
        "fingerprint": doc["fingerprint"],
        "starts_at": doc["startsAt"],
        "starts_ts": validate.timestamp(doc["startsAt"]),
        "ends_ts": _ends(doc),
        "status": doc["status"],
        "alertname": validate.column(labels.get("alertname", "")[:128]),
        "severity": validate.column(labels.get("severity", "")[:32]),
        "job_id": labels.get("job_id") or None,
        "node": labels.get("node") or None,
        "gpu": labels.get("gpu") or None,
        "labels": dumps(labels),
        "annotations": dumps(doc.get("annotations") or {}),
        "received_at": now,
        "updated_at": now,
    }


@dataclass(frozen=True)
class Stored:  # an alert this transaction wrote, as `stored_alerts` reads one
    id: int
    status: str


class Links:
    """New alert→incident links and their incident updates, written together (executemany:
    one round trip each on PostgreSQL's pipeline) before anything reads the links again."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.updates: dict[bool, list[dict[str, Any]]] = {True: [], False: []}

    def add(
        self,
        incident_id: int,
        alert_id: int,
        now: float,
        settle: float | None,
        starts: float | None,
    ) -> None:
        self.rows.append({"incident_id": incident_id, "alert_id": alert_id})
        params = {"b_id": incident_id, "b_now": now, "b_starts": starts}
        if settle is None:
            self.updates[False].append(params)
        else:
            self.updates[True].append({**params, "b_due": now + settle})

    def flush(self, conn: Connection) -> None:
        if self.rows:
            conn.execute(_INSERT_LINK, self.rows)
        for diagnose, stmt in ((False, _LINK_ONLY), (True, _LINK)):
            if self.updates[diagnose]:  # commutative: a min and a counter per incident
                conn.execute(stmt, self.updates[diagnose])
        self.rows, self.updates = [], {True: [], False: []}


# The webhook's hot statements, built once with bound parameters (building them per alert cost
# as much as running them: `bench/webhook.py`).
_ALERTS_BY_FINGERPRINT = select(
    alerts.c.id, alerts.c.status, alerts.c.fingerprint, alerts.c.starts_at
).where(alerts.c.fingerprint.in_(bindparam("b_fps", expanding=True)))
_INSERT_ALERTS = insert(alerts).returning(alerts.c.id, sort_by_parameter_order=True)
_INSERT_LINK = insert(incident_alerts)
_was = incidents.c.first_alert_ts
_LINK_ONLY = (
    update(incidents)
    .where(incidents.c.id == bindparam("b_id"))
    .values(
        updated_at=bindparam("b_now"),
        first_alert_ts=case(
            (or_(_was.is_(None), _was > bindparam("b_starts")), bindparam("b_starts")),
            else_=_was,
        ),
    )
)
_LINK = _LINK_ONLY.values(  # and schedule a new diagnosis
    diagnosis_state="pending",
    diagnosis_due=bindparam("b_due"),
    diagnosis_gen=incidents.c.diagnosis_gen + 1,
    diagnosis_owner=None,
    diagnosis_lease=None,
)
