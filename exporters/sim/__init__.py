"""Simulated GPU cluster with fault injection.

In-process API:
    run_scenario(path_or_scenario, seed=None, out=None) -> Recording   (accelerated, recorded)
    Simulation(scenario, seed).step(dt); .cluster is the stepping Cluster (scheduler verbs,
    inject via Simulation.inject(FaultSpec)); render_node(node) gives a node's /metrics body.
"""

from exporters.sim.dcgm import FIELD_NAMES, FIELDS, render_node
from exporters.sim.faults import FAULT_KINDS, FaultKind
from exporters.sim.model import Cluster, SchedulerError
from exporters.sim.recording import Recording, record, run_scenario
from exporters.sim.runner import Simulation
from exporters.sim.scenario import (
    FaultSpec,
    Scenario,
    ScenarioError,
    load_scenario,
    parse_fault,
    parse_scenario,
)

__all__ = [
    "FAULT_KINDS",
    "FIELDS",
    "FIELD_NAMES",
    "Cluster",
    "FaultKind",
    "FaultSpec",
    "Recording",
    "Scenario",
    "ScenarioError",
    "SchedulerError",
    "Simulation",
    "load_scenario",
    "parse_fault",
    "parse_scenario",
    "record",
    "render_node",
    "run_scenario",
]
