"""Tuned thresholds written back into the alert conditions file (textually: comments and
layout survive), and its rule file regenerated."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from alertdsl import spec as A
from alertdsl.rules import dump_rules
from detector.tuning import alerts_path, score_condition, with_threshold

_NAME_LINE = re.compile(r"^(\s*)- name:\s*(\S+)\s*$")


def _set_key(lines: list[str], lo: int, hi: int, indent: int, key: str, value: str) -> bool:
    """Replace `key: ...` at exactly `indent` spaces within lines[lo:hi]; False if absent."""
    pat = re.compile(rf"^ {{{indent}}}{re.escape(key)}:\s*(\S.*?)?(\s+#.*)?$")
    for i in range(lo, hi):
        m = pat.match(lines[i])
        if m:
            lines[i] = f"{' ' * indent}{key}: {value}{m.group(2) or ''}"
            return True
    return False


def _block(lines: list[str], name: str) -> tuple[int, int, int]:
    """(first line, end, indent) of the `- name: NAME` entry."""
    found = [
        (i, len(m.group(1)))
        for i, ln in enumerate(lines)
        if (m := _NAME_LINE.match(ln)) and m.group(2) == name
    ]
    if len(found) != 1:
        raise ValueError(f"alert {name} is not a single `- name:` entry in the file")
    lo, ind = found[0]
    for i in range(lo + 1, len(lines)):
        ln = lines[i]
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        if len(ln) - len(ln.lstrip()) <= ind:
            return lo, i, ind
    return lo, len(lines), ind


def _decimal(x: float) -> str:
    """Fixed-point text YAML reads back as the same float: 1.0, 1.25, 0.000001."""
    text = f"{x:.6f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def set_thresholds(text: str, changes: dict[str, dict[str, Any]]) -> str:
    """alerts.yaml text with new `threshold` (score condition) and `for` (alert) values.

    `changes` = {alert name: {"threshold": float, "for": "30s"}} (either key optional). The
    edit is textual so comments and layout survive; the result is validated and checked to
    differ from the input only in the requested values.
    """
    lines = text.splitlines()
    before = A.parse(yaml.safe_load(text))
    for name, change in changes.items():
        unknown = set(change) - {"threshold", "for"}
        if unknown:
            raise ValueError(f"{name}: only 'threshold' and 'for' can be tuned, not {unknown}")
        cond = score_condition(before.alert(name))
        lo, hi, ind = _block(lines, name)
        if "for" in change:
            A.duration_seconds(str(change["for"]))
            if not _set_key(lines, lo + 1, hi, ind + 2, "for", str(change["for"])):
                raise ValueError(f"alert {name}: no `for:` line to change")
        if "threshold" in change:
            thr = float(change["threshold"])
            if not 1e-6 <= thr <= 1e6:
                raise ValueError(f"alert {name}: threshold must be within 1e-6..1e6, not {thr}")
            sig = next(
                (
                    i
                    for i in range(lo, hi)
                    if re.match(rf"^\s*signal:\s*{re.escape(cond.signal)}\s*$", lines[i])
                ),
                None,
            )
            if sig is None:
                raise ValueError(f"alert {name}: cannot find condition signal {cond.signal}")
            c_lo = max(i for i in range(lo + 1, sig + 1) if lines[i].lstrip().startswith("- "))
            c_ind = len(lines[c_lo]) - len(lines[c_lo].lstrip()) + 2
            c_hi = next((i for i in range(sig + 1, hi) if lines[i].lstrip().startswith("- ")), hi)
            if not _set_key(lines, c_lo, c_hi, c_ind, "threshold", _decimal(thr)):
                raise ValueError(f"alert {name}: no `threshold:` line in its score condition")
    out = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    after = A.parse(yaml.safe_load(out))
    if after.recording != before.recording or len(after.alerts) != len(before.alerts):
        raise ValueError("the edit changed more than asked (refusing)")
    for a in before.alerts:
        want = a
        if a.name in changes:
            ch = changes[a.name]
            new_thr = ch.get("threshold", score_condition(a).threshold)
            want = with_threshold(a, float(new_thr or 0.0), ch.get("for"))
        if after.alert(a.name) != want:
            raise ValueError(f"alert {a.name}: the edit changed more than asked (refusing)")
    return out


def write_thresholds(
    changes: dict[str, dict[str, Any]],
    path: str | Path | None = None,
    rules_path: str | Path | None = None,
) -> dict[str, Path]:
    """Write tuned values into the alert conditions file and regenerate its rule file.

    `path` defaults to `alerts_path()`; `rules_path` to `rules/goodput.yml` next to it (what
    `goodput rules generate` writes for the project's file). Returns the paths written.
    """
    src = Path(path) if path else alerts_path()
    new = set_thresholds(src.read_text(), changes)
    tmp = src.with_suffix(".tmp")
    tmp.write_text(new)
    tmp.replace(src)
    rules = Path(rules_path) if rules_path else src.parent / "rules" / "goodput.yml"
    rules.parent.mkdir(parents=True, exist_ok=True)
    rules.write_text(dump_rules(A.load(src)))
    return {"alerts": src, "rules": rules}
