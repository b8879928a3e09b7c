"""The metrics contract: every metric an alert rule, a dashboard panel, the detector or the
receiver's evidence queries read must be emitted by something.

"Emitted" is found by scanning code, not by trusting names: a metric constructor
(`Counter("goodput_x", ...)`, `GaugeMetricFamily("goodput_x", ...)`, ...) in exporters/,
detector/ or recovery/, or a `DCGM_*` field the simulator / NVML exporter writes (exporters/
only). Counters also expose `_total`, histograms and summaries `_bucket`/`_sum`/`_count`.
Recording-rule outputs (`goodput:*`) are emitted by the rules themselves.

A metric that is read but not (yet) emitted by committed code must be listed in
EXPECTED_PENDING with who owes it; the test prints that list, fails on anything unlisted,
and fails on entries that have become emitted (shrink the list as code lands). Names declared
in docs/contracts.md are reported alongside, so a pending entry shows whether it is at
least agreed on paper.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from alertdsl import rules
from alertdsl import spec as A
from dashboards import build
from detector import fields as F

ROOT = Path(__file__).resolve().parents[2]
NAME = r"(?:DCGM_(?:FI|EXP)_[A-Z0-9_]+|goodput_[a-z0-9_]+|goodput:[a-z0-9_:]+)"
BUILTIN = {"up", "ALERTS", "ALERTS_FOR_STATE"}
# the detector's derived frame columns, and newer dcgm-exporter spellings of emitted fields
NOT_METRICS = {*F.DERIVED, *F.ALIASES}
LABELS = {"goodput_shard"}  # label names that look like metric names (Prometheus' relabelling)

# metric -> who is expected to emit it (remove an entry when its emitter lands)
EXPECTED_PENDING: dict[str, str] = {}

_CTOR = re.compile(
    r"(?:Counter|Gauge|Histogram|Summary|Info|Enum|MetricFamily)\(\s*[\"']"
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)[\"']",
    re.S,
)
_CTOR_KIND = re.compile(r"(\w*?)(?:MetricFamily)?\(\s*[\"']([a-zA-Z_:][a-zA-Z0-9_:]*)[\"']", re.S)
_SUFFIX = {
    "Counter": ("_total", "_created"),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("_sum", "_count", "_created"),
    "Info": ("_info",),
}


def _py(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in sorted((ROOT / d).rglob("*.py"))]


def emitted_by_code() -> dict[str, str]:
    """metric name -> the file that emits it."""
    out: dict[str, str] = {}
    for path in _py("exporters", "detector", "recovery"):
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        for kind, name in _CTOR_KIND.findall(text):
            if not re.fullmatch(NAME, name):
                continue
            out.setdefault(name, rel)
            for base, suffixes in _SUFFIX.items():
                if kind.endswith(base) or kind.startswith(base):
                    for s in suffixes:
                        if not name.endswith(s):
                            out.setdefault(name + s, rel)
        if rel.startswith("exporters/"):  # dcgm-exporter's fields, as the simulator/NVML write them
            for name in re.findall(r"[\"'](DCGM_[A-Z0-9_]+)[\"']", text):
                out.setdefault(name, rel)
    for r in A.load().recording:
        out[r["record"]] = "alertmanager/alerts.yaml (recording rule)"
    return out


def names_in(expr: str) -> set[str]:
    return {n for n in re.findall(NAME, expr) if not n.endswith(("_", ":"))}


def read_by() -> dict[str, set[str]]:
    """metric name -> the readers (rules, dashboards, detector, receiver evidence)."""
    readers: dict[str, set[str]] = {}

    def add(names: set[str], who: str) -> None:
        for n in names:
            readers.setdefault(n, set()).add(who)

    spec = A.load()
    for a in spec.alerts:
        for c in a.conditions:
            add(names_in(rules.condition_expr(c)) - LABELS, f"alert {a.name}")
    for r in spec.recording:
        add(names_in(r["expr"]), f"recording {r['record']}")
    for file, model in build.build_all().items():
        for title, _ds, expr in build.queries(model):
            if _ds != "loki":
                add(names_in(expr), f"dashboard {file}: {title}")
    own = {n for n, f in emitted_by_code().items() if f.startswith("detector/")}
    for path in _py("detector"):
        found = set(re.findall(rf"[\"']({NAME})[\"'{{\[ ]", path.read_text())) - own - LABELS
        add(found, f"detector {path.name}")
    for path in _py("recovery/evidence"):
        found = set(re.findall(rf"({NAME})", path.read_text()))
        add(
            {n for n in found if not n.endswith("_")},
            f"receiver evidence {path.name}",
        )
    return readers


def declared_in_contracts() -> set[str]:
    return set(re.findall(NAME, (ROOT / "docs" / "contracts.md").read_text()))


def test_every_metric_read_is_emitted(capsys):
    emitted = emitted_by_code()
    readers = read_by()
    missing = {
        m: sorted(w)
        for m, w in readers.items()
        if m not in emitted and m not in BUILTIN and m not in NOT_METRICS
    }
    unlisted = {m: w for m, w in missing.items() if m not in EXPECTED_PENDING}
    with capsys.disabled():
        declared = declared_in_contracts()
        print(f"\n[metrics contract] {len(readers)} metrics read, {len(missing)} not yet emitted")
        for m in sorted(EXPECTED_PENDING):
            paper = "declared in contracts.md" if m in declared else "NOT in contracts.md"
            print(f"  pending: {m} (owed by {EXPECTED_PENDING[m]}; {paper})")
    assert not unlisted, "read but emitted by nothing:\n" + "\n".join(
        f"  {m}: read by {', '.join(w)}" for m, w in sorted(unlisted.items())
    )


def test_expected_pending_only_lists_what_is_still_missing():
    emitted = emitted_by_code()
    readers = read_by()
    landed = sorted(m for m in EXPECTED_PENDING if m in emitted)
    unused = sorted(m for m in EXPECTED_PENDING if m not in readers)
    assert not landed, f"now emitted, remove from EXPECTED_PENDING: {landed}"
    assert not unused, f"no longer read by anything, remove from EXPECTED_PENDING: {unused}"


@pytest.mark.parametrize(
    "metric",
    ["DCGM_FI_DEV_XID_ERRORS", "goodput_job_anomaly_score", "goodput_log_pattern_matches_total"],
)
def test_the_scanner_finds_known_emitters_and_readers(metric):
    # guards the scanner itself: these are emitted and read by committed code today
    assert metric in emitted_by_code()
    assert metric in read_by()


def test_scanner_flags_an_unemitted_metric():
    assert "goodput_no_such_metric_total" not in emitted_by_code()
    assert names_in("rate(goodput_no_such_metric_total[5m]) > on(node) DCGM_FI_X") == {
        "goodput_no_such_metric_total",
        "DCGM_FI_X",
    }
