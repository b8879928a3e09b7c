"""A small server-rendered SVG line plot: the culprit's key metric against its peers.

`series_from_diagnosis` reads series a diagnosis carries (a `plot` object, or evidence items
with `points`); `series_from_prometheus` asks Prometheus for the outcome's key metric (from
`words.yaml`) around the onset. `svg(...)` draws them; every text is escaped.
"""

from __future__ import annotations

import math
import time
from typing import Any

from markupsafe import Markup, escape

from catalogue import promql
from clients.prometheus import PromClient, PromError

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 220, 48, 110, 14, 28
MAX_SERIES, MAX_POINTS = 12, 400


def _points(raw: Any) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    if not isinstance(raw, list):
        return out
    for p in raw[: MAX_POINTS * 4]:
        try:
            t, v = float(p[0]), float(p[1])
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        if math.isfinite(t) and math.isfinite(v):
            out.append((t, v))
    out.sort()
    if len(out) > MAX_POINTS:
        step = len(out) / MAX_POINTS
        out = [out[int(i * step)] for i in range(MAX_POINTS)]
    return out


def series_from_diagnosis(diag: dict[str, Any] | None) -> dict[str, Any] | None:
    """{title, unit, series: [{label, culprit, points}]} from what the diagnosis carries."""
    if not isinstance(diag, dict):
        return None
    culprits = {str(n) for n in diag.get("affected_nodes") or [] if isinstance(n, str)}
    plot = diag.get("plot")
    raw: list[Any] = []
    title, unit = "key metric", ""
    if isinstance(plot, dict):
        got = plot.get("series")
        raw = got if isinstance(got, list) else []
        title, unit = (
            str(plot.get("title") or plot.get("metric") or title),
            str(plot.get("unit") or ""),
        )
    else:
        raw = [e for e in diag.get("evidence") or [] if isinstance(e, dict) and e.get("points")]
    series = []
    for s in raw[:MAX_SERIES]:
        if not isinstance(s, dict):
            continue
        label = str(s.get("label") or s.get("node") or "?")
        if s.get("gpu") not in (None, ""):
            label = f"{label}/gpu{s.get('gpu')}"
        pts = _points(s.get("points"))
        if pts:
            culprit = bool(s.get("culprit")) or str(s.get("node") or "") in culprits
            series.append({"label": label, "culprit": culprit, "points": pts})
    return {"title": title, "unit": unit, "series": series} if series else None


def series_from_prometheus(
    base_url: str,
    spec: dict[str, Any],
    job_id: str,
    onset: float,
    culprits: list[str],
    before_s: float = 600.0,
    after_s: float = 300.0,
    timeout_s: float = 2.0,
) -> tuple[dict[str, Any] | None, str]:
    """The key metric per node around `onset`; (plot or None, a note for the page)."""
    expr = str(spec["expr"]).replace("{job_id}", promql.quote(job_id))
    end = min(onset + after_s, time.time())
    start = onset - before_s
    if end <= start:
        return None, "onset is in the future"
    step = max(5.0, (end - start) / 120)
    try:
        with PromClient(base_url, timeout=timeout_s) as prom:
            result = prom.query_range(expr, start, end, step)
    except (PromError, ValueError) as exc:
        return None, f"Prometheus did not answer ({type(exc).__name__})"
    series = []
    for m, values in result[:MAX_SERIES]:
        node = str(m.get("Hostname") or m.get("hostname") or m.get("node") or "?")
        pts = _points(values)
        if pts:
            series.append({"label": node, "culprit": node in culprits, "points": pts})
    if not series:
        return None, "Prometheus holds no samples for this job around the onset"
    return {
        "title": spec.get("title", ""),
        "unit": spec.get("unit", ""),
        "series": series,
        "query": expr,
        "start": start,
        "end": end,
    }, ""


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:.3g}"
    return f"{v:.2f}".rstrip("0").rstrip(".") if v % 1 else f"{v:.0f}"


def svg(plot: dict[str, Any], onset: float | None = None) -> Markup:
    """An inline SVG: peers in grey, culprits in red, a dashed line at the onset."""
    series = plot.get("series") or []
    pts = [p for s in series for p in s["points"]]
    if not pts:
        return Markup("")
    t0, t1 = min(p[0] for p in pts), max(p[0] for p in pts)
    v0, v1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if onset is not None and t0 <= onset <= t1 + 1:
        t1 = max(t1, onset)
    if t1 - t0 < 1e-9:
        t1 = t0 + 1
    if v1 - v0 < 1e-9:
        v0, v1 = v0 - 1, v1 + 1
    iw, ih = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def x(t: float) -> float:
        return PAD_L + (t - t0) / (t1 - t0) * iw

    def y(v: float) -> float:
        return PAD_T + (1 - (v - v0) / (v1 - v0)) * ih

    title = escape(
        f"{plot.get('title', '')} ({plot.get('unit')})"
        if plot.get("unit")
        else plot.get("title", "")
    )
    parts = [
        f'<svg class="plot" viewBox="0 0 {W} {H}" role="img" aria-label="{title}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="{PAD_L}" y="{PAD_T}" width="{iw}" height="{ih}" class="plot-bg"/>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + 8}" class="axis" text-anchor="end">{_fmt(v1)}</text>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + ih}" class="axis" text-anchor="end">{_fmt(v0)}</text>',
        f'<text x="{PAD_L}" y="{H - 8}" class="axis">{escape(_clock(t0))}</text>',
        f'<text x="{PAD_L + iw}" y="{H - 8}" class="axis" text-anchor="end">'
        f"{escape(_clock(t1))}</text>",
    ]
    ordered = sorted(series, key=lambda s: s["culprit"])  # culprits drawn last, on top
    legend_y = PAD_T + 10
    for s in ordered:
        d = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in s["points"])
        cls = "culprit" if s["culprit"] else "peer"
        parts.append(
            f'<polyline class="{cls}" points="{d}"><title>{escape(s["label"])}</title></polyline>'
        )
    for s in sorted(series, key=lambda s: not s["culprit"])[:10]:
        cls = "culprit" if s["culprit"] else "peer"
        label = s["label"] if len(s["label"]) <= 16 else s["label"][:15] + "…"
        parts.append(
            f'<line x1="{W - PAD_R + 8}" x2="{W - PAD_R + 24}" y1="{legend_y - 4}" '
            f'y2="{legend_y - 4}" class="{cls}"/>'
            f'<text x="{W - PAD_R + 28}" y="{legend_y}" class="legend">'
            f"{escape(label)}</text>"
        )
        legend_y += 14
    if onset is not None and t0 <= onset <= t1:
        ox = x(onset)
        parts.append(
            f'<line class="onset" x1="{ox:.1f}" x2="{ox:.1f}" y1="{PAD_T}" '
            f'y2="{PAD_T + ih}"/><text class="axis" x="{ox + 3:.1f}" '
            f'y="{PAD_T + ih - 4}">onset</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - every text above is escaped


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + "Z"
