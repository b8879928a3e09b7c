"""The fault benchmark's plan: which scenarios run, with which seeds and job sizes."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
QUICK = ("xid79-off-bus", "spin-hang", "cuda-oom", "healthy-short")
COLD = SCENARIOS / "cold-start"  # fault at job start, 1-GPU and 1-node jobs: not resized
QUICK_COLD = ("spin-hang-1gpu", "dataloader-stall-1node", "healthy-small")
SIZES = ((2, 2), (1, 2), (3, 1))  # (faulty job nodes, neighbour nodes) by seed index


@dataclass(frozen=True)
class RunSpec:
    scenario: str  # file stem
    seed_index: int
    seed: int
    healthy: bool
    job_nodes: int | None = None
    neighbour_nodes: int | None = None
    group: str = "sim"  # "sim" (scenarios/, resized by seed) | "cold-start" (as written)


def plan(
    quick: bool = False, seeds: int = 3, pattern: str | None = None, directory: Path = SCENARIOS
) -> list[RunSpec]:
    """The runs: fault scenarios x seeds (sizes vary with the seed index), healthy ones once."""
    from exporters.sim import load_scenario

    stems = sorted(p.stem for p in directory.glob("*.yaml"))
    if quick:
        stems = [s for s in stems if s in QUICK]
        seeds = 1
    elif pattern is None:
        stems = [s for s in stems if s != "healthy-short"]  # healthy-long covers it
    if pattern:
        stems = [s for s in stems if fnmatch.fnmatch(s, pattern)]
    runs: list[RunSpec] = []
    for stem in stems:
        sc = load_scenario(directory / f"{stem}.yaml")
        if sc.expect == "healthy" or not sc.faults:
            runs.append(RunSpec(stem, 0, sc.seed, True))
            continue
        for k in range(seeds):
            a, b = SIZES[k % len(SIZES)]
            runs.append(RunSpec(stem, k, sc.seed + 101 * k, False, a, b))
    return runs


def plan_cold(quick: bool = False, seeds: int = 3, pattern: str | None = None) -> list[RunSpec]:
    """The cold-start runs (scenarios/cold-start/): every seed on the job as written."""
    from exporters.sim import load_scenario

    stems = sorted(p.stem for p in COLD.glob("*.yaml"))
    if quick:
        stems, seeds = [s for s in stems if s in QUICK_COLD], 1
    if pattern:
        stems = [s for s in stems if fnmatch.fnmatch(s, pattern)]
    runs: list[RunSpec] = []
    for stem in stems:
        sc = load_scenario(COLD / f"{stem}.yaml")
        healthy = sc.expect == "healthy" or not sc.faults
        for k in range(1 if healthy else seeds):
            runs.append(RunSpec(stem, k, sc.seed + 101 * k, healthy, group="cold-start"))
    return runs


def _directory(spec: RunSpec) -> Path:
    return COLD if spec.group == "cold-start" else SCENARIOS


def scenario_for(spec: RunSpec, directory: Path | None = None) -> Any:
    """The scenario of a run: the faulty job resized, one spare node, the culprit on the job
    (cold-start runs: as written, with the run's seed)."""
    from exporters.sim import load_scenario, parse_scenario

    sc = load_scenario((directory or _directory(spec)) / f"{spec.scenario}.yaml")
    if spec.healthy:
        return sc
    if spec.job_nodes is None:
        data = sc.model_dump() | {"seed": spec.seed}
        return parse_scenario(data, f"{spec.scenario} (seed {spec.seed})")
    data = sc.model_dump()
    faulty = next((f["job"] for f in data["faults"] if f.get("job")), data["jobs"][0]["name"])
    others = [j for j in data["jobs"] if j["name"] != faulty]
    for j in data["jobs"]:
        if j["name"] == faulty:
            j["nodes"] = spec.job_nodes
        elif others and j is others[0] and spec.neighbour_nodes:
            j["nodes"] = spec.neighbour_nodes
    data["nodes"] = sum(j["nodes"] for j in data["jobs"]) + 1
    for f in data["faults"]:  # the faulty job is placed first: node1..node<job_nodes>
        node = f.get("node")
        if node and int(node.removeprefix("node")) > spec.job_nodes:
            f["node"] = f"node{spec.job_nodes}"
    data["seed"] = spec.seed
    return parse_scenario(data, f"{spec.scenario} (seed {spec.seed})")
