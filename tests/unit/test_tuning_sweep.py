"""detector.tuning: incidents, matching to ground truth, the sweep and the choice."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from alertdsl import spec as A
from detector import tuning as T
from detector import tuning_sweep as S
from detector.frame import Frame

T0 = 1_000_000.0


def _run(scores: dict[str, list[float]], onset: float | None) -> T.Run:
    """Two jobs scored every 5 s; job 1 has a fault at `onset` (seconds after T0)."""
    n = len(next(iter(scores.values())))
    t = T0 + 5.0 * np.arange(n)
    nodes = pd.concat(
        [
            pd.DataFrame({"timestamp": t, "job_id": job, "node": f"n{job}", T.NODE_SCORE: s})
            for job, s in scores.items()
        ],
        ignore_index=True,
    )
    rows = len(scores) * n * 8  # 8 GPUs per job
    frame = Frame(
        np.repeat(t, len(scores) * 8),
        np.array(list(scores) * n * 8, dtype=object),
        np.full(rows, "n", dtype=object),
        np.zeros(rows, dtype=np.int64),
        np.zeros((rows, 1)),
    )
    jobs = [{"job_id": j, "name": j, "end": None} for j in scores]
    faults = (
        [] if onset is None else [{"kind": "host_straggler", "onset": T0 + onset, "job_id": "1"}]
    )
    return T.Run(
        name="synthetic",
        path=Path("."),
        meta={"start": T0, "end": float(t[-1]), "jobs": jobs},
        truth={"faults": faults},
        frame=frame,
        jobs=pd.DataFrame(),
        nodes=nodes,
        gpus=pd.DataFrame(),
        interval_s=5.0,
    )


def _scores() -> T.Run:
    quiet = [0.1] * 40
    faulty = [0.1] * 20 + [0.9] * 20  # a fault at 100 s scoring 0.9: missed at threshold 1.0
    healthy = list(quiet)
    healthy[5:12] = [1.2] * 7  # a healthy job blips to 1.2 for 35 s: a false incident
    return _run({"1": faulty, "2": healthy}, onset=100.0)


def test_incidents_split_on_gaps() -> None:
    fired = pd.DataFrame({"timestamp": [0, 5, 10, 60, 65], "job_id": ["1", "1", "1", "1", "2"]})
    inc = T.incidents(fired, gap_s=30)
    assert inc.values.tolist() == [["1", 0.0, 10.0], ["1", 60.0, 60.0], ["2", 65.0, 65.0]]


def test_match_counts_latency_and_false_incidents() -> None:
    windows = pd.DataFrame(
        {"job_id": ["1"], "onset": [100.0], "end": [500.0], "kind": ["x"], "fault_id": ["f"]}
    )
    inc = pd.DataFrame(
        {"job_id": ["1", "1", "2"], "start": [50.0, 130.0, 200.0], "end": [60.0, 400.0, 210.0]}
    )
    det, false = T.match(inc, windows)
    assert det.latency_s.tolist() == [30.0]  # the incident before onset does not count
    assert false == 2  # before onset on job 1, and job 2 has no fault


def test_sweep_trades_recall_for_false_incidents() -> None:
    run = _scores()
    spec = A.load()
    table = S.sweep([run], "GoodputJobStraggler", [0.8, 1.0, 1.3], spec=spec).set_index("threshold")
    for_s = A.duration_seconds(spec.alert("GoodputJobStraggler").for_)
    assert table.loc[0.8, "recall"] == 1.0 and table.loc[0.8, "false_incidents"] == 1
    assert table.loc[0.8, "latency_median_s"] == pytest.approx(for_s, abs=5.0)
    assert table.loc[1.0, "recall"] == 0.0 and table.loc[1.0, "false_incidents"] == 1
    assert table.loc[1.3, "recall"] == 0.0 and table.loc[1.3, "false_incidents"] == 0
    hours = run.gpu_hours
    assert table.loc[0.8, "false_per_1000_gpu_h"] == pytest.approx(1000 / hours)
    assert S.choose(table.reset_index(), 0, guard=False)["threshold"] == 1.3
    with pytest.raises(ValueError, match="guard band"):  # 1.0, just below 1.3, raised a false one
        S.choose(table.reset_index(), 0)
    assert S.choose(table.reset_index(), 1e9, guard=False)["threshold"] == 0.8


def test_longer_for_delays_detection() -> None:
    table = S.sweep([_scores()], "GoodputJobStraggler", [0.8], fors=["10s", "40s"])
    lat = table.set_index("for").latency_median_s
    assert lat["40s"] - lat["10s"] == pytest.approx(30.0, abs=5.0)
    assert table.set_index("for").loc["40s", "false_incidents"] == 0  # the 35 s blip is filtered


def test_choose_keeps_a_guard_band_then_prefers_the_faster_worst_case() -> None:
    table = pd.DataFrame(
        {
            "threshold": [0.75, 1.0, 1.25, 1.5, 0.75, 1.0],
            "for": ["10s"] * 4 + ["20s"] * 2,
            "recall": [1.0] * 6,
            "latency_median_s": [20.0, 20.0, 20.0, 20.0, 30.0, 30.0],
            "latency_max_s": [50.0, 120.0, 145.0, 165.0, 105.0, 130.0],
            "false_per_1000_gpu_h": [29.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        }
    )
    got = S.choose(table)  # 1.0 fits, but 0.75 below it did not: 1.25 is the first guarded one
    assert (got["threshold"], got["for"]) == (1.25, "10s")
    got = S.choose(table, guard=False)  # same median latency: the lower worst case wins
    assert (got["threshold"], got["for"]) == (1.0, "10s")
    assert S.choose(table, 1e9)["threshold"] == 1.0  # 0.75 (lowest swept) has no guard below


def test_choose_refuses_when_nothing_fits() -> None:
    table = pd.DataFrame(
        {
            "threshold": [1.0],
            "recall": [1.0],
            "latency_median_s": [5.0],
            "false_per_1000_gpu_h": [9.0],
        }
    )
    with pytest.raises(ValueError, match="no candidate"):
        S.choose(table, 1.0)


def test_only_score_alerts_can_be_swept() -> None:
    with pytest.raises(A.AlertsError, match="no threshold condition on a detector score"):
        S.sweep([_scores()], "GoodputGPUFatalXid", [1.0])


def test_score_recording_on_a_simulated_straggler(tmp_path: Path) -> None:
    from exporters.sim import load_scenario, run_scenario

    root = Path(__file__).resolve().parents[2]
    sc = load_scenario(root / "scenarios" / "thermal-straggler.yaml").model_copy(
        update={"duration_s": 600}
    )
    run = T.score_recording(run_scenario(sc, out=tmp_path / "rec").path)
    assert set(run.jobs.detector) >= {"combined", "peer"}
    assert run.gpu_hours == pytest.approx(2 * 16 * (600 - 30) / 3600, rel=0.05)
    w = run.windows()
    assert w.kind.tolist() == ["thermal_straggler"] and w.job_id.tolist() == ["1001"]
    det, false, _ = T.evaluate_runs([run], A.load().alert("GoodputJobStraggler"))
    assert det.detected.all() and 0 < det.latency_s.iloc[0] < 120
    assert false == 0


def test_predict_reports_the_direction_of_each_figure() -> None:
    spec = A.load()
    alert = spec.alert("GoodputJobStraggler")
    slow = dataclasses.replace(spec, alerts=(T.with_threshold(alert, 0.8, "40s"),))
    fast = dataclasses.replace(spec, alerts=(T.with_threshold(alert, 0.8, "10s"),))
    got = S.predict([_scores()], slow, fast)
    kind = got["by_kind"]["host_straggler"]
    assert kind["latency"] == "down" and kind["recall"] == "same"
    assert kind["latency_median_s_before"] - kind["latency_median_s_after"] == pytest.approx(30)
    # the healthy job's 35 s blip: filtered by a 40 s `for`, an incident with 10 s
    assert got["false_per_1000_gpu_h"]["before"] == 0
    assert got["false_per_1000_gpu_h"]["direction"] == "up"
    same = S.predict([_scores()], fast, fast)
    assert same["by_kind"]["host_straggler"]["latency"] == "same"


def test_score_alerts_are_the_tunable_ones() -> None:
    names = [a.name for a in T.score_alerts(A.load())]
    assert names == [
        "GoodputJobHung",
        "GoodputJobSlow",
        "GoodputJobStraggler",
        "GoodputJobAnomaly",
        "GoodputGPUAnomaly",
    ]


def test_the_guard_band_is_per_alert_and_for_and_ignores_row_order() -> None:
    table = pd.DataFrame(
        {
            "alert": ["B", "A", "A", "A", "B"],
            "threshold": [1.0, 1.25, 0.75, 1.0, 0.75],
            "for": ["10s"] * 5,
            "recall": [1.0] * 5,
            "latency_median_s": [20.0] * 5,
            "latency_max_s": [20.0] * 5,
            "false_per_1000_gpu_h": [0.0, 0.0, 0.0, 0.0, 9.0],
        },
        index=[7, 7, 3, 3, 3],  # duplicate labels, as pd.concat leaves them
    )
    fits = table.false_per_1000_gpu_h <= 0
    assert S._guarded(table, fits).tolist() == [False, True, False, True, False]
    got = S.choose(table)
    assert (got["alert"], got["threshold"]) == ("A", 1.25)  # B's 0.75 failed: B 1.0 unguarded
