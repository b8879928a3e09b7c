"""The dcgm-exporter counters file turns on every DCGM field Goodput reads, and only real ones."""

from __future__ import annotations

import re
from pathlib import Path

from exporters.sim import dcgm

ROOT = Path(__file__).resolve().parents[2]


def _fields() -> dict[str, str]:
    rows = {}
    for line in (ROOT / "compose" / "dcgm-counters.csv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind, help_ = (part.strip() for part in line.split(",", 2))
            assert kind in ("gauge", "counter"), line
            assert help_, line
            rows[name] = kind
    return rows


def test_counters_file_covers_what_the_simulator_exposes():
    exposed = set(re.findall(r"DCGM_FI_(?:DEV|PROF)_[A-Z_]+", Path(dcgm.__file__).read_text()))
    exposed.discard("DCGM_FI_PROF_")
    listed = _fields()
    assert exposed <= set(listed), sorted(exposed - set(listed))
    assert listed["DCGM_FI_PROF_SM_ACTIVE"] == "gauge"
    assert listed["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == "counter"
