"""detector.tuning_write.write_thresholds: edits the one source of alert conditions only."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from alertdsl import spec as A
from alertdsl.rules import dump_rules
from detector import tuning as T
from detector import tuning_write as W

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    dst = tmp_path / "alertmanager" / "alerts.yaml"
    dst.parent.mkdir()
    shutil.copy(ROOT / "alertmanager" / "alerts.yaml", dst)
    monkeypatch.setenv(T.ALERTS_ENV, str(dst))
    return dst


def test_alerts_path_follows_the_environment(copy: Path) -> None:
    assert T.alerts_path() == copy


def test_write_changes_only_the_asked_lines_and_regenerates_rules(copy: Path) -> None:
    before = copy.read_text().splitlines()
    written = W.write_thresholds(
        {
            "GoodputJobStraggler": {"threshold": 0.65, "for": "45s"},
            "GoodputJobAnomaly": {"threshold": 2.35},
        }
    )
    after = copy.read_text().splitlines()
    changed = [(a.strip(), b.strip()) for a, b in zip(before, after, strict=True) if a != b]
    assert sorted(b for _, b in changed) == ["for: 45s", "threshold: 0.65", "threshold: 2.35"]
    assert sorted(a.split(":")[0] for a, _ in changed) == ["for", "threshold", "threshold"]
    spec = A.load(copy)
    assert A.threshold("GoodputJobStraggler", spec) == 0.65
    assert spec.alert("GoodputJobStraggler").for_ == "45s"
    assert A.threshold("GoodputJobAnomaly", spec) == 2.35
    rules = written["rules"]
    assert rules == copy.parent / "rules" / "goodput.yml"
    assert rules.read_text() == dump_rules(spec)
    assert "goodput_node_suspect_score >= 0.65" in rules.read_text()


def test_the_repository_file_is_untouched(copy: Path) -> None:
    repo = (ROOT / "alertmanager" / "alerts.yaml").read_text()
    W.write_thresholds({"GoodputJobAnomaly": {"threshold": 2.0}})
    assert (ROOT / "alertmanager" / "alerts.yaml").read_text() == repo


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"GoodputJobAnomaly": {"severity": "critical"}}, "only 'threshold' and 'for'"),
        ({"GoodputJobAnomaly": {"threshold": -1}}, "within 1e-6..1e6"),
        ({"GoodputJobAnomaly": {"threshold": float("nan")}}, "within 1e-6..1e6"),
        ({"GoodputJobAnomaly": {"threshold": 2e-7}}, "within 1e-6..1e6"),
        ({"GoodputJobAnomaly": {"for": "soon"}}, "bad duration"),
        ({"GoodputNoSuchAlert": {"threshold": 1}}, "no alert named"),
        ({"GoodputGPUFatalXid": {"threshold": 1}}, "no threshold condition on a detector score"),
    ],
)
def test_bad_changes_are_refused_and_leave_the_file(
    copy: Path, changes: dict, message: str
) -> None:
    before = copy.read_text()
    with pytest.raises((ValueError, KeyError), match=message):
        W.write_thresholds(changes)
    assert copy.read_text() == before
