"""The host side of a GPU (its processes' CPU, the NVML exporter's counter) in the physics
priors, on real measurements (tests/data/real/host-cpu/: real PyTorch processes, per phase).

An idle GPU whose processes work on the host (a compile, a checkpoint load) is given a pause's
allowance; a job whose processes rest on the host before its first iteration has the short
host-idle allowance. Fails on the code before: no host reading, so a silent compile longer
than 120 s was requeued as never started (healthy-slow-compile), and a job hung before its
first iteration waited 120 s + 20 s per doubling of its GPUs whatever its host did."""

from __future__ import annotations

import doctest
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import catalogue.priors as P
import detector.frame
import exporters.proctree
from detector import fields as F
from detector import replay
from detector.frame import Frame, counter_rate
from detector.physics import Physics
from detector.synthetic import healthy_frame

FIXTURE = Path(__file__).parents[1] / "data" / "real" / "host-cpu" / "host_cpu.csv"
COL = {n: i for i, n in enumerate(F.ALL_FIELDS)}
H200 = "NVIDIA H200"
PRIOR = P.load().params(H200)
BUSY = ("train", "compile", "ckpt_load", "ckpt_save", "tokenise")
WAITING = ("rendezvous_hang", "collective_hang", "loader_hang", "pipe_read_hang")


def cores(phase: str, every_s: float = 5.0) -> np.ndarray:
    """The phase's cores over `every_s` windows after its first 5 s (the interpreter and
    torch importing), as the detector reads the counter at that scrape interval."""
    rec = pd.read_csv(FIXTURE)
    rec = rec[rec.phase == phase]
    rec = rec[(rec.t_s >= 5.0) & (np.floor(rec.t_s) % every_s == 0)]
    t, cpu = rec.t_s.to_numpy(), rec.cpu_seconds.to_numpy()
    return counter_rate(t, np.zeros(len(t), object), np.zeros(len(t)), cpu)[1:]


def test_docstring_examples() -> None:
    for mod in (detector.frame, exporters.proctree):
        assert doctest.testmod(mod).failed == 0


def test_the_recorded_phases_fall_on_either_side_of_the_thresholds() -> None:
    """Every 5 s reading of every working phase is host work, of every waiting one host rest."""
    for phase in BUSY:
        c = cores(phase)
        assert len(c) >= 3 and c.min() >= PRIOR["host_busy_cores"], phase
    for phase in WAITING:
        c = cores(phase)
        assert len(c) >= 6 and c.max() <= PRIOR["host_idle_cores"], phase


def _job(gpus: int = 1) -> Frame:
    f = healthy_frame(jobs=1, nodes=1, gpus=gpus, steps=1, seed=3)
    return Frame(f.time, f.job, f.node, f.gpu, f.values, model=np.full(len(f), H200, object))


def _idle(f: Frame, rows: np.ndarray, host: float) -> None:
    """GPU idle, memory held; its processes at `host` cores (NaN: not reported)."""
    f.values[rows, COL["DCGM_FI_DEV_GPU_UTIL"]] = 0.0
    f.values[rows, COL["DCGM_FI_DEV_POWER_USAGE"]] = 124.0
    f.values[rows, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.0
    f.values[rows, COL[F.HOST_CPU]] = host


def _unstarted(f: Frame, since_milestone: float) -> None:
    f.values[:, COL[F.ITER_SECONDS]] = np.nan
    f.values[:, COL[F.STALL_SECONDS]] = since_milestone  # 'training ...' dates both
    f.values[:, COL[F.SINCE_PAUSE]] = since_milestone


@pytest.mark.parametrize(
    "phase, gpus, allowance",
    [
        ("rendezvous_hang", 1, 20.0),  # host_idle_startup_s
        ("loader_hang", 8, 20.0 + 3 * 20.0),  # + the communicator init's per doubling
        ("compile", 1, 600.0),  # pause_allowance_s
        ("ckpt_load", 8, 600.0),
        (None, 1, 120.0),  # not reported: the model's startup_s, as before
        (None, 8, 180.0),
    ],
)
def test_never_started_reads_the_host(phase: str | None, gpus: int, allowance: float) -> None:
    f = _job(gpus)
    host = float(np.median(cores(phase))) if phase else np.nan
    _idle(f, np.arange(gpus), host)
    _unstarted(f, since_milestone=60.0)
    assert Physics().score(f) == pytest.approx(np.full(gpus, 60.0 / allowance))


def test_one_gpu_working_on_the_host_keeps_a_job_alive_one_unreported_makes_no_rest() -> None:
    f = _job(8)
    _idle(f, np.arange(8), float(cores("pipe_read_hang").max()))
    _unstarted(f, since_milestone=60.0)
    assert Physics().score(f) == pytest.approx(np.full(8, 60.0 / 80.0))
    f.values[5, COL[F.HOST_CPU]] = float(cores("tokenise").min())  # one rank tokenises
    assert Physics().score(f) == pytest.approx(np.full(8, 60.0 / 600.0))
    f.values[5, COL[F.HOST_CPU]] = np.nan  # its exporter does not report: no rest is known
    assert Physics().score(f) == pytest.approx(np.full(8, 60.0 / 180.0))


def _rank0_alone(host: float) -> np.ndarray:
    """Rank 0 idle before the first step while ranks 1-7 spin in a barrier, 90 s after the
    milestone; the spinning ranks' own host threads spin (a core each): only rank 0 counts."""
    f = _job(8)
    f.values[:, COL["DCGM_FI_DEV_GPU_UTIL"]] = 100.0
    f.values[:, COL["DCGM_FI_DEV_POWER_USAGE"]] = 125.0
    f.values[:, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.008
    f.values[:, COL[F.HOST_CPU]] = 1.0
    _idle(f, np.array([0]), host)
    _unstarted(f, since_milestone=90.0)
    return Physics().score(f)


def test_rank0_alone_before_the_first_step_is_stuck_when_it_rests_on_the_host() -> None:
    """spin-hang-rank0: rank 0 stuck from the start while the others wait for it was a hang
    only after the start-up allowance (180 s on 8 GPUs); resting on the host, after 80 s."""
    assert (_rank0_alone(float(cores("collective_hang").max()))[1:] == 2.0).all()
    assert _rank0_alone(float(cores("tokenise").min())).max() < 1.0  # preparing the data
    assert _rank0_alone(np.nan).max() < 1.0  # not reported: 90 / 180, as before


def test_an_idle_gpu_working_on_the_host_after_iterating_gets_a_pauses_allowance() -> None:
    """A silent save (its log says nothing) of a job whose log announces pauses otherwise:
    idle_hang scores stall / max(15 s, 2 x its step) unless its processes work on the host."""
    f = _job(1)
    f.values[:, COL[F.ITER_SECONDS]] = 1.2
    f.values[:, COL[F.STALL_SECONDS]] = 40.0
    f.values[:, COL[F.SINCE_PAUSE]] = 400.0  # the last save long done
    _idle(f, np.array([0]), float(cores("ckpt_save").min()))
    assert Physics().score(f)[0] == pytest.approx(40.0 / 600.0)
    _idle(f, np.array([0]), float(cores("loader_hang").max()))
    assert Physics().score(f)[0] == pytest.approx(40.0 / 15.0)


def test_ranks_waiting_for_one_that_works_on_the_host_are_alive() -> None:
    """After iterating, ranks 1-7 spin while rank 0 (GPU idle) works on the host, the log
    silent for a minute: a live wait (rank 0 writes a checkpoint it did not announce), not a
    hang; with rank 0 resting on the host, a hang."""
    f = _job(8)
    f.values[:, COL["DCGM_FI_DEV_GPU_UTIL"]] = 100.0
    f.values[:, COL["DCGM_FI_DEV_POWER_USAGE"]] = 125.0
    f.values[:, COL["DCGM_FI_PROF_SM_ACTIVE"]] = 0.008
    f.values[:, COL[F.ITER_SECONDS]] = 1.2
    f.values[:, COL[F.STALL_SECONDS]] = 60.0
    _idle(f, np.array([0]), float(cores("ckpt_save").min()))
    assert Physics().score(f)[1:].max() < 1.0
    _idle(f, np.array([0]), float(cores("rendezvous_hang").max()))
    assert (Physics().score(f)[1:] == 2.0).all()


@pytest.mark.parametrize("as_file", [False, True])
def test_a_recording_carries_the_counter_and_the_frame_reads_cores(tmp_path, as_file) -> None:
    """The exporter's counter in a recording, or in a file `goodput replay` reads (its own
    name, catalogue/columns.yaml `own`), becomes cores per GPU."""
    rec = pd.read_csv(FIXTURE)
    rec = rec[rec.phase.isin(["train", "pipe_read_hang"])]
    df = pd.DataFrame(
        {
            "time": 1.7e9 + rec.t_s.round(),
            "node": "node1",
            "gpu": (rec.phase == "pipe_read_hang").astype(int),
            "DCGM_FI_DEV_GPU_UTIL": 0.0,
            F.HOST_CPU_COUNTER: rec.cpu_seconds,
        }
    )
    if as_file:
        df.rename(columns={"time": "timestamp"}).to_csv(tmp_path / "gpu.csv", index=False)
        f = replay.load(tmp_path / "gpu.csv")[0]
    else:
        f = Frame.from_dataframe(df)
    late = f.time >= f.time.min() + 5
    host = f.col(F.HOST_CPU)
    assert np.nanmin(host[late & (f.gpu == 0)]) > 0.8
    assert np.nanmax(host[late & (f.gpu == 1)]) < 0.02
