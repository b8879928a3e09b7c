r"""Label values into PromQL (and LogQL) selectors, quoted: the one place that does it.

A value goes into a double-quoted string literal (Go's escapes: backslash, quote, control
characters). A value matched by a regex (`=~`, an alternation of several nodes) is first
escaped for RE2, escaping only its metacharacters: `gpu-node-01.rack.a` becomes
`gpu-node-01\.rack\.a`, never `gpu\-node\-01` (Python's `re.escape`), and the string literal
then doubles each backslash. Prometheus anchors label regexes, so an alternation matches whole
values only. LogQL stream selectors take the same literals.

>>> selector("up", node="gpu-node-01.rack.a")
'up{node="gpu-node-01.rack.a"}'
>>> print(selector("up", node=["n2", "gpu-node-01.rack.a"]))
up{node=~"gpu-node-01\\.rack\\.a|n2"}
>>> print(quote('say "hi"\n'))
"say \"hi\"\n"
"""

from __future__ import annotations

import re
from collections.abc import Iterable

LABEL_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
_RE2_META = frozenset("\\.+*?()|[]{}^$")
_SURROGATE = re.compile("[\ud800-\udfff]")
_GO_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"a PromQL label value must be a string, not {type(value).__name__}")
    if _SURROGATE.search(value):
        raise ValueError("a PromQL label value must be valid Unicode (lone surrogate)")
    return value


def quote(value: str) -> str:
    """`value` as a PromQL/LogQL double-quoted string literal."""
    out = []
    for ch in _text(value):
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def re2_escape(value: str) -> str:
    """A regex (RE2 syntax) that matches exactly `value`; only metacharacters are escaped."""
    return "".join("\\" + ch if ch in _RE2_META else ch for ch in _text(value))


def any_of(values: Iterable[str]) -> str:
    """A regex matching exactly one of `values` (at least one is required)."""
    items = sorted(set(values))
    if not items:
        raise ValueError("a regex alternation needs at least one value")
    return "|".join(re2_escape(v) for v in items)


def matcher(name: str, value: str | Iterable[str]) -> str:
    """`name="value"` for a string, `name=~"a|b"` (escaped alternation) for several values."""
    if not LABEL_NAME.match(name):
        raise ValueError(f"invalid label name {name!r}")
    if isinstance(value, str):
        return f"{name}={quote(value)}"
    return f"{name}=~{quote(any_of(value))}"


def selector(metric: str = "", *extra: str, **labels: str | Iterable[str]) -> str:
    """`metric{l1="v", l2=~"a|b", <extra matchers>}`; `metric` may be empty (LogQL streams)."""
    if metric and not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", metric):
        raise ValueError(f"invalid metric name {metric!r}")
    parts = [matcher(k, v) for k, v in labels.items()] + list(extra)
    if not parts:
        return metric
    return f"{metric}{{{', '.join(parts)}}}"
