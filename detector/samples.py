"""GPU samples from a user's files -> the recording format's wide table (docs/contracts.md).

Inputs: CSV (optionally gzipped) or Parquet, wide (one column per metric) or long (a metric
name and a value column), with column spellings from catalogue/columns.yaml; or a Prometheus
range-query JSON answer (matrix or vector, or a list of answers). Output: `timestamp` (unix s),
`node`, `gpu`, `job_id`, `modelName` where the input names the GPU model, then `DCGM_FI_*`
columns in dcgm-exporter's units, and the `goodput_job_*` series found (per job) on the side.
Every problem raises `SampleError` naming the file, the column and what would be accepted.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from catalogue import logfiles, names, recording
from catalogue.columns import clean, columns
from detector.frame import FrameError

IDS = ("timestamp", "node", "gpu", "job_id")
MODEL = "modelName"  # the GPU model, as dcgm labels it: selects the physics priors
JOB_COLUMNS = frozenset(recording.JOB_METRICS)  # job_metrics.csv.gz columns, per job
_DIGITS = re.compile(r"(\d+)\s*$")
_BLANK = (  # missing, as the tool said: nvidia-smi's own words for a field it could not read
    r"(?i)|nan|none|null|-|\[?n/a\]?|\[not supported\]|\[unknown error\]|\[gpu is lost\]|err!"
)
_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


class SampleError(FrameError):
    """A file that cannot become GPU samples; the message says what would be accepted."""


@dataclass
class Samples:
    gpu: pd.DataFrame  # timestamp, node, gpu, job_id, DCGM_FI_* ...
    jobs: pd.DataFrame | None = None  # timestamp, job_id, goodput_job_* ...
    notes: list[str] = field(default_factory=list)  # what was read as what


def read(
    path: str | Path, node: str | None = None, job_id: str | None = None, gpu: int | None = None
) -> Samples:
    """Read one file. `node`, `job_id` and `gpu` fill in what the file does not say."""
    p = Path(path)
    if why := logfiles.unreadable(p):
        raise SampleError(f"{p}: {why}")
    if node is not None and not names.valid_node(node):
        raise SampleError(f"--node {node!r}: want a host name ([A-Za-z0-9._-], up to 64)")
    if job_id is not None and not names.valid_job_id(job_id):
        raise SampleError(f"--job-id {job_id!r}: want a Slurm job id (123 or 123_4)")
    low = p.name.lower()
    try:
        with recording.gzip_checked(p, SampleError):
            if low.endswith(".json"):
                df = _prom_json(p, json.loads(p.read_text()))
            elif low.endswith(".parquet"):
                df = pd.read_parquet(p)
            elif low.endswith((".csv", ".csv.gz", ".tsv")):
                df = pd.read_csv(
                    p,
                    sep=None if low.endswith(".tsv") else ",",
                    dtype=str,
                    skipinitialspace=True,
                    engine="python" if low.endswith(".tsv") else "c",
                )
            else:
                raise SampleError(f"{p}: want .csv, .csv.gz, .parquet or .json (Prometheus)")
    except (ValueError, OSError, ImportError) as exc:
        if isinstance(exc, SampleError):
            raise
        raise SampleError(f"{p}: cannot read: {exc}") from None
    if df.empty:
        raise SampleError(f"{p}: no rows")
    return normalise(df, str(p), node=node, job_id=job_id, gpu=gpu)


def normalise(
    df: pd.DataFrame,
    where: str,
    node: str | None = None,
    job_id: str | None = None,
    gpu: int | None = None,
) -> Samples:
    """Map a raw table's columns onto the recording's (see `read`)."""
    c = columns()
    notes: list[str] = []
    df = df.rename(columns={col: clean(col) for col in df.columns})
    rename: dict[str, str] = {}
    for col in df.columns:
        role = c.role(col)
        long = c.long_role(col) if role is None else None
        if (role or long) is not None and (role or long) not in rename.values():
            rename[col] = str(role or long)
            if col != rename[col]:
                what = role or f"the metric {long}s"
                notes.append(f"column {col!r} read as {what}")
    df = df.rename(columns=rename)
    if "name" in df.columns and "value" not in df.columns:
        orig = next((k for k, v in rename.items() if v == "name"), "name")
        if orig != "name" or _names_metrics(df["name"]):
            raise SampleError(
                f"{where}: no value column for the metric names of column {orig!r} (a long "
                f"table); accepted: {c.accepted('value')}"
            )
    if "name" in df.columns and "value" not in df.columns and MODEL not in df.columns:
        df = df.rename(columns={"name": MODEL})  # nvidia-smi --query-gpu=name: the GPU model
        notes.append(f"column 'name' read as {MODEL} (a wide table: nvidia-smi's GPU name)")
    long_jobs = None
    if "name" in df.columns and "value" in df.columns:  # long -> wide
        is_job = df["name"].astype(str).isin(JOB_COLUMNS)
        if is_job.any() and "timestamp" in df.columns and "job_id" in df.columns:
            long_jobs = _pivot(df[is_job], ["timestamp", "job_id"])
        model = _model_of_gpu(df) if MODEL in df.columns else None
        df = _pivot(df[~is_job], [k for k in (*IDS, "uuid") if k in df.columns])
        if model is not None:
            df = df.merge(model, on=list(model.index.names), how="left") if len(model) else df
        notes.append(f"long table: one column per metric name ({len(df.columns)} columns)")
    if "timestamp" not in df.columns:
        raise SampleError(
            f"{where}: no time column; have {list(df.columns)[:12]}; "
            f"accepted: {c.accepted('timestamp')}"
        )
    out = pd.DataFrame({"timestamp": _times(df["timestamp"], where, notes)})
    out["node"] = _nodes(df, where, node, notes)
    out["gpu"] = _gpus(df, out, where, gpu, notes)
    out["job_id"] = _jobs(df, where, job_id)
    if MODEL in df.columns:  # (a categorical column too: str first, then the blanks)
        out[MODEL] = (
            df[MODEL]
            .astype(str)
            .where(df[MODEL].notna(), "")
            .str.strip()
            .str[: names.MODEL_NAME_MAX]
        )
    metrics: dict[str, np.ndarray] = {}
    jobcols: dict[str, np.ndarray] = {}
    ignored = []
    for col in df.columns:
        if col in IDS or col in ("uuid", MODEL):
            continue
        target = c.field(col)
        if col in JOB_COLUMNS:
            jobcols[col] = _values(df[col], where, col, notes)
        elif target is None:
            ignored.append(col)
        elif target[0] in metrics:
            notes.append(f"column {col!r} ignored: {target[0]} already read")
        else:
            metrics[target[0]] = _values(df[col], where, col, notes) * target[1]
            if col != target[0]:
                scale = f" x {target[1]:g}" if target[1] != 1.0 else ""
                notes.append(f"column {col!r} read as {target[0]}{scale}")
    if ignored:
        notes.append(f"columns ignored (not a known metric): {ignored[:12]}")
    if not metrics:
        raise SampleError(
            f"{where}: no metric column; have {list(df.columns)[:12]}; accepted: dcgm-exporter "
            "names (DCGM_FI_*), or NVML / nvidia-smi names such as utilization.gpu, power.draw, "
            "gpm_sm_active (all in catalogue/columns.yaml)"
        )
    gpu_df = pd.concat([out, pd.DataFrame(metrics, index=out.index)[sorted(metrics)]], axis=1)
    dup = gpu_df.duplicated(["timestamp", "node", "gpu"], keep="last")
    if dup.any():
        notes.append(f"{int(dup.sum())} rows repeat a (time, node, GPU): the last one kept")
        gpu_df = gpu_df[~dup]
    gpu_df = gpu_df.sort_values(["timestamp", "node", "gpu"], kind="stable").reset_index(drop=True)
    jobs = None
    if long_jobs is not None:
        long_jobs["timestamp"] = _times(long_jobs["timestamp"], where, [])
        long_jobs["job_id"] = _jobs(long_jobs, where, job_id)
        for col in long_jobs.columns[2:]:
            long_jobs[col] = _values(long_jobs[col], where, col, notes)
        jobs = long_jobs
    elif jobcols:
        jobs = pd.concat(
            [out[["timestamp", "job_id"]], pd.DataFrame(jobcols, index=out.index)], axis=1
        )
        jobs = jobs[jobs.job_id != ""].groupby(["timestamp", "job_id"]).max().reset_index()
    return Samples(gpu_df, jobs, notes)


def merge_repeats(
    gpu: pd.DataFrame, source: str | list[str]
) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """`gpu` with each (timestamp, node, gpu) once. Rows repeating one (a file given twice,
    overlapping files, files with different metrics of the same samples) are merged where
    they agree on every value both have, with a (file, note) for each file whose rows were;
    a SampleError naming the files where they disagree. `source`: each row's file, or one
    name for all."""
    key = ["timestamp", "node", "gpu"]
    rep = gpu.duplicated(key, keep=False).to_numpy()
    if not rep.any():
        return gpu, []
    sub = gpu[rep].replace("", np.nan)  # a blank label (no job, no model) is no value
    src = pd.Series(source, index=gpu.index)[rep]
    group = sub.groupby(key, sort=False, dropna=False).ngroup().to_numpy()
    by = sub.groupby(group, sort=False)
    clash = by.nunique(dropna=True).gt(1)
    if clash.to_numpy().any():
        g = clash.index[clash.any(axis=1).to_numpy()][0]
        col = clash.columns[clash.loc[g].to_numpy()][0]
        files = " and ".join(dict.fromkeys(src[group == g]))
        t, node, gpu_ = sub[group == g].iloc[0][key]
        raise SampleError(
            f"{files}: {int(clash.any(axis=1).sum())} sample(s) given twice with different "
            f"values (same time, node and GPU; e.g. {col} at {t} on {node} GPU {gpu_}): "
            "give each sample once"
        )
    later = sub.duplicated(key, keep="first").to_numpy()
    first = src.groupby(group, sort=False).transform("first")
    notes = [
        (
            b,
            f"{n} row(s) repeat the time, node and GPU of "
            + ("earlier rows" if a == b else f"rows of {a}")
            + ": merged (no value differs)",
        )
        for (a, b), n in Counter(zip(first[later], src[later], strict=True)).items()
    ]
    merged = by.first()
    for col in ("job_id", MODEL):
        if col in merged:
            merged[col] = merged[col].fillna("")
    out = pd.concat([gpu[~rep], merged], ignore_index=True)
    return out.sort_values(key, kind="stable", ignore_index=True), notes


def gpu_interval(time: np.ndarray, node: np.ndarray, gpu: np.ndarray) -> float | None:
    """The sampling interval: the median gap between a GPU's consecutive samples (None with
    no GPU sampled twice). Gaps between distinct times would halve it where the nodes' clocks
    do not line up (per-node logs)."""
    keys = pd.factorize(pd.MultiIndex.from_arrays([node, gpu]))[0]
    order = np.lexsort((time, keys))
    t, k = np.asarray(time, dtype=float)[order], keys[order]
    d = np.diff(t)
    gaps = d[(k[1:] == k[:-1]) & (d > 0)]
    return float(np.median(gaps)) if len(gaps) else None


def _pivot(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per key (a blank or missing key value included, never crossed with the other
    keys' values), one column per metric name, its last value."""
    by = df.groupby([*keys, "name"], dropna=False, sort=False)["value"].last()
    wide = by.unstack("name").reset_index()
    wide.columns = [str(x) for x in wide.columns]
    return wide


def _model_of_gpu(df: pd.DataFrame) -> pd.Series:
    """A long table's GPU model per GPU (its first non-blank `modelName`)."""
    ids = [k for k in ("node", "gpu", "uuid") if k in df.columns]
    named = df[df[MODEL].notna() & (df[MODEL].astype(str).str.strip() != "")]
    return named.groupby(ids, dropna=False)[MODEL].first() if ids else named[MODEL].head(0)


def _times(col: pd.Series, where: str, notes: list[str]) -> np.ndarray:
    """Unix seconds of a time column (numbers in s, ms, us or ns, or dates); a SampleError
    quoting the first value that is no time, or none from 1970 to a day from now."""
    num = pd.to_numeric(col, errors="coerce")
    if num.notna().all() and len(num):
        t = _unix(num.to_numpy(dtype=float), notes)
    else:
        t = _dates(col, where, notes)
    ok = (t >= 0) & (t <= time.time() + 86400)  # NaN (a blank date) fails too
    if not ok.all():
        bad = col.iloc[int(np.argmin(ok))]
        raise SampleError(
            f"{where}: column 'timestamp': {_cell(bad)!r} is not a time from 1970 to a day from now"
        )
    return t


def _unix(t: np.ndarray, notes: list[str]) -> np.ndarray:
    """Unix times in seconds, by the median's size: ns, us and ms are divided down."""
    med = float(np.nanmedian(t))
    for limit, div, unit in ((1e17, 1e9, "ns"), (1e14, 1e6, "us"), (1e11, 1e3, "ms")):
        if med > limit:
            notes.append(f"timestamps read as unix {unit}")
            return t / div
    return t


def _dates(col: pd.Series, where: str, notes: list[str]) -> np.ndarray:
    text = col.astype(str).str.replace("/", "-", n=2)
    try:
        dt = pd.to_datetime(text, utc=False, format="mixed")
    except (ValueError, TypeError) as exc:
        raise SampleError(
            f"{where}: column 'timestamp': {_no_time(col, exc)} (accepted: unix seconds or "
            "milliseconds, ISO 8601, nvidia-smi's YYYY/MM/DD HH:MM:SS)"
        ) from exc
    if dt.dt.tz is None:
        notes.append("timestamps without a zone read as UTC")
        dt = dt.dt.tz_localize("UTC")
    us = dt.dt.tz_convert(None).to_numpy(dtype="datetime64[us]")  # (ns ends in 2262)
    return np.where(np.isnat(us), np.nan, us.astype(np.int64) / 1e6)


def _no_time(col: pd.Series, exc: Exception) -> str:
    """Why `col` is no time column: its first value neither a number nor a date, or (each
    reads alone) that it mixes the two."""
    num = pd.to_numeric(col, errors="coerce")
    text = col[num.isna().to_numpy()]
    dates = pd.to_datetime(
        text.astype(str).str.replace("/", "-", n=2), errors="coerce", format="mixed", utc=True
    )
    bad = text[dates.isna().to_numpy()]
    if len(bad):
        return f"cannot read {_cell(bad.iloc[0])!r} as a time"
    if num.notna().any():
        return f"mixes numbers ({col[num.notna()].iloc[0]!r}) and dates ({text.iloc[0]!r})"
    return f"cannot read it as times ({exc})"


def _cell(value: Any) -> str:
    """A cell as its file shows it ('' for a blank one)."""
    return "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)


def _nodes(df: pd.DataFrame, where: str, node: str | None, notes: list[str]) -> np.ndarray:
    if "node" not in df.columns:
        if node is None:
            raise SampleError(
                f"{where}: no node column (accepted: {columns().accepted('node')}); "
                "for a one-node file pass --node NAME to goodput import"
            )
        notes.append(f"no node column: every row is node {node!r} (--node)")
        return np.full(len(df), node, dtype=object)
    vals = df["node"].fillna(node or "").astype(str).str.strip().to_numpy(dtype=object)
    bad = [v for v in pd.unique(vals) if not names.valid_node(v)]
    if bad:
        raise SampleError(f"{where}: column 'node': invalid host name(s) {bad[:5]}")
    return vals


def _gpus(df: pd.DataFrame, out: pd.DataFrame, where: str, gpu: int | None, notes: list[str]):
    if "gpu" in df.columns:
        text = df["gpu"].astype(str).str.strip()
        num = pd.to_numeric(text.str.extract(_DIGITS, expand=False), errors="coerce")
        if num.isna().any() or (num > 999).any():
            bad = text[num.isna() | (num > 999)].iloc[0]
            raise SampleError(
                f"{where}: column 'gpu': {bad!r} is not a GPU index "
                "(accepted: 0..999, or a device name ending in its index, e.g. nvidia3)"
            )
        return num.to_numpy(dtype=np.int64)
    if "uuid" in df.columns:
        uu = df["uuid"].astype(str)
        index = (
            pd.Series(uu.to_numpy())
            .groupby(out["node"].to_numpy())
            .transform(lambda s: pd.Series(pd.factorize(s, sort=True)[0], index=s.index))
        )
        notes.append("no gpu column: GPUs numbered per node by UUID order")
        return index.to_numpy(dtype=np.int64)
    if gpu is None:
        if out.duplicated(["timestamp", "node"]).any():
            raise SampleError(
                f"{where}: no gpu column (accepted: {columns().accepted('gpu')}, "
                f"{columns().accepted('uuid')}) and several rows per node and time"
            )
        gpu = 0
    notes.append(f"no gpu column: every row is GPU {gpu}")
    return np.full(len(df), gpu, dtype=np.int64)


def _jobs(df: pd.DataFrame, where: str, job_id: str | None) -> np.ndarray:
    if "job_id" not in df.columns:
        return np.full(len(df), job_id or "", dtype=object)
    vals = df["job_id"].fillna("").astype(str).str.strip().str.replace(r"\.0$", "", regex=True)
    if job_id:
        vals = vals.where(vals != "", job_id)
    bad = [v for v in pd.unique(vals) if v and not names.valid_job_id(v)]
    if bad:
        raise SampleError(f"{where}: column 'job_id': {bad[:5]} are not Slurm job ids")
    return vals.to_numpy(dtype=object)


def _values(col: pd.Series, where: str, name: str, notes: list[str]) -> np.ndarray:
    """Numbers, also '99 %' / '690.1 W' (nvidia-smi), hex bitmasks; '[N/A]', '' -> NaN. Any
    other value (text, inf) is missing too, and said so in `notes`; a column with no number
    at all among its values is refused."""
    if pd.api.types.is_numeric_dtype(col):
        out = col.to_numpy(dtype=float)
        bad = np.isinf(out)
        text = col.astype(str)
    else:
        text = col.where(col.notna(), "").astype(str).str.strip()
        hexa = text.str.match(r"^0x[0-9a-fA-F]+$")
        num = pd.to_numeric(text.str.extract(_NUMBER, expand=False), errors="coerce")
        if hexa.any():
            num[hexa] = [float(int(v, 16)) for v in text[hexa]]
        out = num.to_numpy(dtype=float)
        bad = (np.isnan(out) & ~text.str.fullmatch(_BLANK)).to_numpy()
    if bad.any():
        out = np.where(bad, np.nan, out)
        example = str(text[bad].iloc[0])[:20]
        if bad.all():
            raise SampleError(f"{where}: column {name!r}: no number in it (e.g. {example!r})")
        notes.append(
            f"column {name!r}: {int(bad.sum())} value(s) not a number (e.g. {example!r}): "
            "read as missing"
        )
    return out


def _prom_json(path: Path, doc: Any) -> pd.DataFrame:
    """Prometheus /api/v1/query_range (or query) answers -> a long table."""
    c = columns()
    rows: list[tuple[Any, ...]] = []
    for d in doc if isinstance(doc, list) else [doc]:
        for m, t, v in _prom_points(path, d):
            ids = {c.role(k): val for k, val in m.items() if c.role(k)}
            rows.append(
                (t, ids.get("node"), ids.get("gpu"), ids.get("job_id", ""), ids.get(MODEL, ""),
                 m.get("__name__", ""), v)
            )  # fmt: skip
    if not rows:
        raise SampleError(f"{path}: the Prometheus answer holds no series")
    head = ["timestamp", "node", "gpu", "job_id", MODEL, "metric", "value"]
    return pd.DataFrame(rows, columns=head)


def _prom_points(path: Path, d: Any) -> Iterator[tuple[dict[str, Any], Any, Any]]:
    """(labels, time, value) of each sample of one answer; a SampleError naming what is not
    a successful matrix or vector answer."""
    data = d.get("data") if isinstance(d, dict) and d.get("status") == "success" else None
    if not isinstance(data, dict):
        raise SampleError(
            f'{path}: not a Prometheus answer (want {{"status": "success", "data": '
            '{"resultType": "matrix", "result": [...]}}, or a list of them)'
        )
    kind, result = data.get("resultType", "matrix"), data.get("result", [])
    if kind not in ("matrix", "vector") or not isinstance(result, list):
        raise SampleError(
            f"{path}: a Prometheus answer of resultType {kind!r}: want 'matrix' or 'vector' "
            "(a query of series, not of one number)"
        )
    for s in result:
        pts = _points(s)
        if pts is None:
            raise SampleError(
                f'{path}: a series is not {{"metric": {{...}}, "values": [[time, "value"], ...]}}: '
                f"{json.dumps(s)[:60]}"
            )
        yield from ((s.get("metric", {}), t, v) for t, v in pts)


def _points(s: Any) -> list[list[Any]] | None:
    """The [time, value] samples of a matrix ("values") or vector ("value") result item; None
    when it is not one."""
    if not isinstance(s, dict) or not isinstance(s.get("metric", {}), dict):
        return None
    pts = s.get("values") or ([s["value"]] if "value" in s else [])
    ok = isinstance(pts, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], (int, float, str)) for p in pts
    )
    return pts if ok else None


def _names_metrics(col: pd.Series) -> bool:
    """Whether a `name` column names metrics (a long table's), not GPU models (nvidia-smi's)."""
    c = columns()
    return any(c.field(v) is not None or v in JOB_COLUMNS for v in pd.unique(col.astype(str)))


def label(gpu: pd.DataFrame, job_id: str, start: float | None, end: float | None) -> int:
    """Give rows without a job `job_id` inside [start, end] (either may be None); returns how
    many rows were labelled."""
    t = gpu["timestamp"].astype(float)
    sel = gpu["job_id"].fillna("").astype(str) == ""
    if start is not None:
        sel &= t >= start
    if end is not None:
        sel &= t <= end
    gpu.loc[sel, "job_id"] = job_id
    return int(sel.sum())
