"""The loader rejects broken catalogue files with clear errors."""

# ruff: noqa: E501  (real log lines are long)
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import catalogue
from catalogue import CatalogueError, load

SRC = Path(catalogue.__file__).parent


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    for name in ("outcomes.yaml", "xid.yaml", "patterns.yaml"):
        shutil.copy(SRC / name, tmp_path / name)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_packaged_catalogue_loads(copy):
    cat = load(copy)
    assert len(cat.patterns) >= 20 and 79 in cat.xids and "healthy" in cat.outcomes


@pytest.mark.parametrize(
    ("file", "old", "new", "message"),
    [
        ("patterns.yaml", "regex: 'NVRM: Xid \\(", "regex: 'NVRM: Xid (", "bad regex"),
        ("patterns.yaml", "(?P<xid>\\d+)", "(?P<xcode>\\d+)", "not declared"),
        ("patterns.yaml", "outcome: workload_oom", "outcome: oom_maybe", "unknown outcome"),
        ("patterns.yaml", "role: cascade", "role: sometimes", "role: Input should be"),
        ("patterns.yaml", "    source: kernel", "    source: dmesg", "source: Input should be"),
        ("patterns.yaml", "- id: segfault", "- id: cuda_oom", "unique"),
        ("patterns.yaml", "'nvrm: gpu at'", "nvrm: gpu at", "keywords.*valid string"),
        (
            "patterns.yaml",
            "    alert: true\n",
            "    alert: yes please\n",
            "alert: Input should be a valid boolean",
        ),
        (
            "patterns.yaml",
            "    fallback: true\n",
            "    fallback: 1\n",
            "fallback: Input should be a valid boolean",
        ),
        (
            "patterns.yaml",
            "    sources:\n      - https://",
            "    sources:\n      - ''\n      - https://",
            "sources must be",
        ),
        (
            "patterns.yaml",
            "- 'NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.'",
            "- 'NVRM: GPU fine'",
            "does not match its example",
        ),
        ("xid.yaml", "job_action: drain_and_requeue", "job_action: reboot", "unknown job_action"),
        ("xid.yaml", "{code: 31,", "{code: 13,", "listed twice"),
        (
            "xid.yaml",
            "consequence: true,",
            "consequence: maybe,",
            "consequence: Input should be a valid boolean",
        ),
        ("xid.yaml", "class: application,", "class: metal,", "class must be one of"),
        ("xid.yaml", "source: goe_r620,", "source: a_blog,", "is not under `sources`"),
        (
            "xid.yaml",
            "outcome: unknown, consequence: false, source: catalog,\n",
            "outcome: healthy, consequence: false, source: catalog,\n",
            "never healthy",
        ),
        ("outcomes.yaml", "category: workload", "category: people", "unknown category"),
        # typed entries: a misspelt key is an error, never ignored (catalogue/schema.py)
        ("patterns.yaml", "    alert: true\n", "    alret: true\n", "alret: Extra inputs"),
        ("xid.yaml", "{code: 31,", "{code: 31, wieght: 3,", "XID 31: wieght: Extra inputs"),
        ("xid.yaml", "detector_weight: 2.0,", "detector_weight: lots,", "class 'hardware'"),
        ("outcomes.yaml", "action: stop", "action: shoot", "unknown action 'shoot'"),
        ("outcomes.yaml", "destructive: true, drains: true}", "drains: true}", "is destructive"),
        ("outcomes.yaml", "meaning: do nothing}", "meaning: do nothing, undo: true}", "Extra"),
        ("outcomes.yaml", "categories:", "categories: [\n", "invalid YAML"),
    ],
)
def test_broken_files_raise_clear_errors(copy, file, old, new, message):
    _edit(copy / file, old, new)
    with pytest.raises(CatalogueError, match=message) as info:
        load(copy)
    assert file in str(info.value)


def test_missing_file(copy):
    (copy / "xid.yaml").unlink()
    with pytest.raises(CatalogueError, match="xid.yaml: file not found"):
        load(copy)


def test_xid_table_covers_nvidias_catalog():
    """Every code of NVIDIA's Xid catalog (1-162) has an entry with its class and source."""
    xids = load().xids
    assert set(range(1, 163)) <= set(xids)
    assert all(x.cls and x.source and x.mnemonic for x in xids.values())
    for code in (119, 120, 136, 140, 143, *range(144, 151), 155, 158):
        assert xids[code].outcome == "gpu_hardware_fault", code
    assert xids[121].cls == "informational" and xids[154].cls == "recovery_action"
    unlisted = load().xid_unlisted
    assert unlisted is not None and unlisted.outcome != "healthy" and unlisted.job_action != "none"
