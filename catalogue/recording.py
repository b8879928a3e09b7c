"""The recording directory format shared by the simulator's recorder and `goodput
export-recording` (docs/contracts.md): its version tag, the per-job metric columns of
`job_metrics.csv.gz`, in order, and the check of meta.json that its readers share."""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from catalogue import names

FORMAT = "goodput-recording/1"
JOB_METRICS = (
    "goodput_job_iteration",
    "goodput_job_last_progress_timestamp_seconds",
    "goodput_job_iteration_seconds",
    "goodput_job_throughput_samples_per_second",
    "goodput_job_loss",
    "goodput_job_nan_iterations_total",
    "goodput_job_skipped_iterations_total",
    "goodput_job_last_checkpoint_timestamp_seconds",
    "goodput_job_last_pause_timestamp_seconds",
)

MAX_INTERVAL_S = 86400.0  # a sample interval beyond a day is a mistake, not a capture
MAX_GPUS_PER_NODE = 1024


def read_meta(directory: Path) -> dict[str, Any]:
    """A recording's meta.json, checked (`check_meta`); `{}` when it has none; a ValueError
    naming the file when it is no JSON or not as its readers need it."""
    path = directory / "meta.json"
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    return check_meta(meta, str(path))


def check_meta(meta: object, where: str = "meta.json") -> dict[str, Any]:
    """`meta` (meta.json's parsed content) when every field its readers use has the right type
    and range; else a ValueError naming `where` and the field. `{}` (no meta.json) passes."""
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: want a JSON object, not {_json_type(meta)}")
    if not meta:
        return meta
    if not str(meta.get("format", "")).startswith("goodput-recording/"):
        raise ValueError(f"{where}: unknown format {meta.get('format')!r} (want {FORMAT!r})")

    def bad(field: str, value: object, want: str) -> ValueError:
        return ValueError(f"{where}: {field} must be {want}, not {json.dumps(value)[:60]}")

    def number(value: object) -> bool:
        return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]

    interval = meta.get("interval_s")
    if interval is not None and not (number(interval) and 0 < interval <= MAX_INTERVAL_S):
        raise bad("interval_s", interval, f"seconds > 0 and <= {MAX_INTERVAL_S:g} (or null)")
    gpn = meta.get("gpus_per_node")
    if gpn is not None and not (type(gpn) is int and 1 <= gpn <= MAX_GPUS_PER_NODE):
        raise bad("gpus_per_node", gpn, f"a whole number 1..{MAX_GPUS_PER_NODE} (or null)")
    jobs = meta.get("jobs", [])
    if not isinstance(jobs, list):
        raise bad("jobs", jobs, "a list of jobs")
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise bad(f"jobs[{i}]", job, "an object")
        if not names.valid_job_id(str(job.get("job_id"))):
            raise bad(f"jobs[{i}].job_id", job.get("job_id"), "a Slurm job id (123 or 123_4)")
    for doc, at in ((meta, ""), *((j, f"jobs[{i}].") for i, j in enumerate(jobs))):
        nodes = doc.get("nodes")
        if nodes is not None and not (
            isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)
        ):
            raise bad(f"{at}nodes", nodes, "a list of node names")
        for key in ("start", "end"):
            if doc.get(key) is not None and not number(doc[key]):
                raise bad(f"{at}{key}", doc[key], "unix seconds (or null)")
    return meta


@contextmanager
def gzip_checked(path: object, error: type[Exception] = ValueError) -> Iterator[None]:
    """Read `path` inside: a truncated or damaged gzip is `error` naming it, one line, not
    the EOFError that the command line showed as "Aborted!"."""
    try:
        yield
    except EOFError:
        raise error(f"{path}: truncated gzip") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise error(f"{path}: not a readable gzip file ({exc})") from None


def _json_type(value: object) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")
