"""Receiver settings: one frozen value, built from the environment (or directly in tests).

| variable | default |
|---|---|
| `GOODPUT_RECEIVER_DB_URL` | `sqlite:///$GOODPUT_STACK_DIR/receiver/goodput.db` |
| `GOODPUT_RECEIVER_HOST` / `GOODPUT_RECEIVER_PORT` | `127.0.0.1` / `19430` |
| `GOODPUT_RECEIVER_TOKEN_FILE` | unset: bearer auth off |
| `GOODPUT_RECEIVER_BASIC_USER` / `GOODPUT_RECEIVER_BASIC_PASSWORD_FILE` | unset: basic auth off |
| `GOODPUT_RECEIVER_MAX_BODY_BYTES` | `1048576` |
| `GOODPUT_RECEIVER_SETTLE_S` | `3` (seconds an incident waits for co-arriving alerts) |
| `GOODPUT_RECEIVER_RECHECK_S` | `10` (an `unknown` verdict on an open incident: look again) |
| `GOODPUT_RECEIVER_RECHECK_MAX` | `3` (per incident, before any action; 3 x 10 s covers the |
| | longest symptom window, 30 s) |
| `GOODPUT_PROMETHEUS_URL` | unset: Prometheus evidence off |
| `GOODPUT_LOG_DIR` | `$GOODPUT_STACK_DIR/logs/cluster` |
| `GOODPUT_LOG_TIMEZONE` | unset: the host's local zone (the IANA zone, e.g. `America/New_York`, |
| | that log stamps without a zone are in: syslog, Python logging, glog, `dmesg -T`) |
| `GOODPUT_LOKI_URL` | unset: Loki evidence off |
| `GOODPUT_RECEIVER_SLURM` | `1` (ask Slurm for evidence and node → jobs) |
| `GOODPUT_RECEIVER_LOOKBACK_S` | `900` (evidence window before the first alert) |
| `GOODPUT_RECEIVER_WORKER_POLL_S` | `0.5` (how often the worker looks for due diagnoses) |
| `GOODPUT_RECEIVER_LEASE_S` | `30` (receivers in HA: a dead one's diagnosis or action is |
| | taken over this long after its last heartbeat; `recovery.leases`) |
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from datetime import tzinfo
from pathlib import Path
from typing import TYPE_CHECKING

from catalogue import logtime
from recovery.clock import WALL, Clock

if TYPE_CHECKING:
    from recovery.evidence import Sources


def _stack_dir() -> Path:
    return Path(os.environ.get("GOODPUT_STACK_DIR", "/tmp/goodput-stack"))  # noqa: S108


@dataclass(frozen=True)
class Settings:
    """Everything the receiver reads from its environment."""

    db_url: str = ""
    host: str = "127.0.0.1"
    port: int = 19430
    token_file: str | None = None
    basic_user: str | None = None
    basic_password_file: str | None = None
    require_auth: bool = True
    max_body_bytes: int = 1 << 20
    settle_s: float = 3.0
    recheck_s: float = 10.0
    recheck_max: int = 3
    worker_poll_s: float = 0.5
    prometheus_url: str | None = None
    log_dir: str | None = None
    log_timezone: str = ""  # IANA zone of stamps without one; "": the host's local zone
    loki_url: str | None = None
    slurm_enabled: bool = True
    slurm_timeout_s: float = 10.0
    http_timeout_s: float = 5.0
    lookback_s: float = 900.0
    lookahead_s: float = 120.0
    restart_grace_s: float = 120.0
    rules_dir: str | None = None
    lease_s: float = 30.0
    extra: dict[str, str] = field(default_factory=dict)
    # injected, not from the environment: the time (the benchmark's simulated clock) and the
    # Slurm/Prometheus evidence sources (the benchmark's simulation); None: the live services
    clock: Clock = field(default=WALL, compare=False, repr=False)
    sources: Sources | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.recheck_s <= 3600.0:
            raise ValueError(f"GOODPUT_RECEIVER_RECHECK_S must be 0..3600, not {self.recheck_s}")
        if self.recheck_max not in range(11):
            raise ValueError(f"GOODPUT_RECEIVER_RECHECK_MAX must be 0..10, not {self.recheck_max}")
        if not 0.0 <= self.restart_grace_s <= 3600.0:
            raise ValueError(
                f"GOODPUT_RECEIVER_RESTART_GRACE_S must be 0..3600, not {self.restart_grace_s}"
            )
        if not 0.3 <= self.lease_s <= 3600.0:
            raise ValueError(f"GOODPUT_RECEIVER_LEASE_S must be 0.3..3600, not {self.lease_s}")
        try:
            logtime.named_zone(self.log_timezone)
        except ValueError as exc:
            raise ValueError(f"GOODPUT_LOG_TIMEZONE: {exc}") from None
        if not self.db_url:
            object.__setattr__(self, "db_url", default_db_url())

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from `env` (default: os.environ); keyword overrides win."""
        e = dict(os.environ if env is None else env)

        def opt(name: str) -> str | None:
            value = e.get(name, "").strip()
            return value or None

        values: dict[str, object] = {
            "db_url": opt("GOODPUT_RECEIVER_DB_URL") or "",
            "host": opt("GOODPUT_RECEIVER_HOST") or "127.0.0.1",
            "port": int(opt("GOODPUT_RECEIVER_PORT") or 19430),
            "token_file": opt("GOODPUT_RECEIVER_TOKEN_FILE"),
            "basic_user": opt("GOODPUT_RECEIVER_BASIC_USER"),
            "basic_password_file": opt("GOODPUT_RECEIVER_BASIC_PASSWORD_FILE"),
            "max_body_bytes": int(opt("GOODPUT_RECEIVER_MAX_BODY_BYTES") or (1 << 20)),
            "settle_s": float(opt("GOODPUT_RECEIVER_SETTLE_S") or 3.0),
            "recheck_s": _number(opt("GOODPUT_RECEIVER_RECHECK_S"), 10.0, "RECHECK_S"),
            "recheck_max": int(_number(opt("GOODPUT_RECEIVER_RECHECK_MAX"), 3, "RECHECK_MAX")),
            "prometheus_url": opt("GOODPUT_PROMETHEUS_URL"),
            "log_dir": opt("GOODPUT_LOG_DIR")
            or str(Path(e.get("GOODPUT_STACK_DIR", str(_stack_dir()))) / "logs" / "cluster"),
            "log_timezone": opt("GOODPUT_LOG_TIMEZONE") or "",
            "loki_url": opt("GOODPUT_LOKI_URL"),
            "slurm_enabled": (opt("GOODPUT_RECEIVER_SLURM") or "1") not in ("0", "false", "no"),
            "lookback_s": float(opt("GOODPUT_RECEIVER_LOOKBACK_S") or 900.0),
            "restart_grace_s": _number(
                opt("GOODPUT_RECEIVER_RESTART_GRACE_S"), 120.0, "RESTART_GRACE_S"
            ),
            "worker_poll_s": _number(opt("GOODPUT_RECEIVER_WORKER_POLL_S"), 0.5, "WORKER_POLL_S"),
            "lease_s": _number(opt("GOODPUT_RECEIVER_LEASE_S"), 30.0, "LEASE_S"),
            "extra": {k: v for k, v in e.items() if k.startswith("GOODPUT_")},
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def log_zone(self) -> tzinfo:
        """The zone of log stamps without one (`GOODPUT_LOG_TIMEZONE`)."""
        return logtime.named_zone(self.log_timezone)

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


def _number(text: str | None, default: float, name: str) -> float:
    """A numeric setting, with a clear error naming the variable."""
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"GOODPUT_RECEIVER_{name} must be a number, not {text!r}")
    if name.endswith("_MAX") and value != int(value):
        raise ValueError(f"GOODPUT_RECEIVER_{name} must be a whole number, not {text!r}")
    return value


def default_db_url() -> str:
    return f"sqlite:///{_stack_dir() / 'receiver' / 'goodput.db'}"


_SECRETS: dict[str, tuple[tuple[int, ...], str | None]] = {}  # path -> (its stat, the secret)


def read_secret(path: str | None) -> str | None:
    """A credential from a file (stripped); None when unset, unreadable or empty. Read again
    whenever the file changes (a rotated credential takes effect at once); while it does not,
    one stat instead of an open and a read (every webhook request asks: 4 % of the
    receiver's CPU at 500 alerts/s, on its event loop). A file changed in the last second is
    not kept: a rewrite of the same size within the clock's tick keeps its mtime (git's
    "racily clean" case)."""
    if not path:
        return None
    try:
        st = os.stat(path)
        key = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        hit = _SECRETS.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = Path(path).read_text().strip() or None
    except OSError:
        _SECRETS.pop(path, None)
        return None
    if time.time() - st.st_mtime >= 1.0:
        _SECRETS[path] = (key, value)
    return value
