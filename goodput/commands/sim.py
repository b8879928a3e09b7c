"""`goodput sim`: the simulated GPU cluster (record a scenario, serve it, inject, run as a job)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Simulated GPU cluster with fault injection.", no_args_is_help=True)


@app.command("record")
def record_cmd(
    scenario: Path = typer.Argument(..., help="scenario YAML"),
    out: Path = typer.Option(..., "--out", help="recording directory to write"),
    seed: int | None = typer.Option(None, "--seed", help="override the scenario's seed"),
) -> None:
    """Run a scenario accelerated in-process and write a recording."""
    from exporters.sim import ScenarioError, record

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        typer.echo(f"error: --out {out}: exists and is not an empty directory", err=True)
        raise typer.Exit(2)
    try:
        rec = record(scenario, out, seed)
    except ScenarioError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    faults = rec.truth["faults"]
    typer.echo(
        f"wrote {rec.path}: {len(rec.meta['jobs'])} jobs, {len(faults)} faults "
        f"({', '.join(f['kind'] for f in faults) or 'healthy'})"
    )
    for e in rec.truth["errors"]:
        typer.echo(f"warning: fault {e['kind']} not applied: {e['error']}", err=True)


def _url() -> str:
    import os

    return os.environ.get("GOODPUT_SIM_URL", "http://127.0.0.1:19400")


@app.command("serve")
def serve_cmd(
    scenario: Path | None = typer.Option(None, "--scenario", help="scenario YAML (real time)"),
    nodes: int | None = typer.Option(None, "--nodes", help="node count (default 4 or scenario)"),
    scheduler: str = typer.Option("sim", "--scheduler", help="sim | slurm (real Slurm jobs)"),
    seed: int | None = typer.Option(None, "--seed"),
    control_port: int = typer.Option(19400, "--control-port"),
    node_base_port: int = typer.Option(19500, "--node-base-port", help="node N on base+N"),
    tick: float = typer.Option(1.0, "--tick", help="seconds between model ticks"),
    host_label: str = typer.Option("Hostname", "--host-label", help="Hostname | hostname"),
    prometheus_targets: Path | None = typer.Option(
        None, "--prometheus-targets", help="write DIR/dcgm-sim.json (file_sd)"
    ),
    job_id_base: int = typer.Option(800000, "--job-id-base", help="ids of simulated jobs"),
) -> None:
    """Run the cluster in real time: dcgm /metrics per node, control API on 19400."""
    import time

    from exporters.sim import ScenarioError, Simulation, load_scenario, parse_scenario
    from exporters.sim import serve as srv
    from exporters.sim.logs import LogSink

    if scheduler not in ("sim", "slurm") or host_label not in ("Hostname", "hostname"):
        typer.echo("error: --scheduler is sim|slurm; --host-label is Hostname|hostname", err=True)
        raise typer.Exit(2)
    try:
        sc = (
            load_scenario(scenario)
            if scenario
            else parse_scenario(
                {"name": "interactive", "duration_s": 14 * 86400, "nodes": nodes or 4}
            )
        )
    except ScenarioError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    sink = LogSink(srv.log_dir(), write_jobs=scheduler == "sim")
    sim = Simulation(
        sc,
        seed=seed,
        sink=sink,
        start=time.time(),
        scheduler=scheduler,
        job_id_base=job_id_base,
        nodes=nodes,
    )
    if scheduler == "slurm":
        from exporters.sim import slurmctl

        sim.cluster.on_node_lost = slurmctl.kill_node
        sim.cluster.on_node_repaired = slurmctl.start_node
    typer.echo(
        f"simulator: {len(sim.cluster.nodes)} nodes on {node_base_port + 1}.."
        f"{node_base_port + len(sim.cluster.nodes)}, control on {control_port}"
    )
    srv.serve(
        sim,
        control_port=control_port,
        node_base_port=node_base_port,
        tick_s=tick,
        host_label=host_label,
        targets_dir=prometheus_targets,
    )


def _call(method: str, path: str, body: dict | None = None) -> dict:
    import requests

    try:
        r = requests.request(method, _url() + path, json=body, timeout=10)
    except requests.RequestException as err:
        typer.echo(f"error: simulator at {_url()} unreachable: {err}", err=True)
        raise typer.Exit(1) from None
    if r.status_code >= 400:
        typer.echo(f"error {r.status_code}: {r.text}", err=True)
        raise typer.Exit(1)
    return r.json()


@app.command("inject")
def inject_cmd(
    kind: str = typer.Argument(..., help="fault kind (see docs/contracts.md)"),
    node: str | None = typer.Option(None, "--node"),
    gpu: int | None = typer.Option(None, "--gpu"),
    job: str | None = typer.Option(None, "--job", help="job id"),
    param: list[str] = typer.Option([], "--param", help="KEY=NUMBER, repeatable"),
) -> None:
    """Inject a fault into the running simulator ($GOODPUT_SIM_URL)."""
    import json

    params: dict[str, float] = {}
    for p in param:
        k, _, v = p.partition("=")
        try:
            params[k] = float(v)
        except ValueError:
            typer.echo(f"error: --param {p!r}: expected KEY=NUMBER", err=True)
            raise typer.Exit(2) from None
    body = {"kind": kind, "node": node, "gpu": gpu, "job_id": job, "params": params}
    typer.echo(
        json.dumps(
            _call("POST", "/api/v1/faults", {k: v for k, v in body.items() if v is not None})
        )
    )


@app.command("clear")
def clear_cmd(fault_id: str = typer.Argument(...)) -> None:
    """Clear (repair) an injected fault by id."""
    import json

    typer.echo(json.dumps(_call("DELETE", f"/api/v1/faults/{fault_id}")))


@app.command("repair")
def repair_cmd(node: str = typer.Argument(...)) -> None:
    """Repair a node (power it on, reset its GPUs)."""
    import json

    typer.echo(json.dumps(_call("POST", f"/api/v1/nodes/{node}/repair")))


@app.command("job")
def job_cmd(
    sim_url: str = typer.Option(None, "--sim-url", help="simulator URL (default $GOODPUT_SIM_URL)"),
    step_time: float | None = typer.Option(None, "--step-time", help="seconds per iteration"),
    init: float | None = typer.Option(None, "--init", help="seconds of NCCL init before training"),
    warmup: float | None = typer.Option(None, "--warmup", help="seconds of slower warm-up"),
    log_interval: int | None = typer.Option(None, "--log-interval", help="iterations per line"),
) -> None:
    """The body of an sbatch script: a simulated training job under real Slurm."""
    from exporters.sim import jobmode

    given = {
        "step_time_s": step_time,
        "init_s": init,
        "warmup_s": warmup,
        "log_interval": log_interval,
    }
    try:
        code = jobmode.run(
            sim_url or _url(), timing={k: v for k, v in given.items() if v is not None}
        )
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command("check")
def check_cmd(node: str = typer.Argument(..., help="the node to check")) -> None:
    """A node health check on simulated GPUs (the local stack's `dcgmi diag`): exit 1 while an
    injected fault that blames NODE is active (until `POST /api/v1/nodes/NODE/repair`), 0 when
    it passes, 3 when the simulator cannot be asked."""
    import requests

    try:
        faults = requests.get(f"{_url()}/api/v1/faults", timeout=5).json()
    except (requests.RequestException, ValueError) as e:
        typer.echo(f"check {node}: the simulator did not answer ({type(e).__name__})", err=True)
        raise typer.Exit(3) from None
    bad = [f for f in faults if f.get("active") and node in (f.get("nodes") or [])]
    for f in bad:
        gpus = [g["gpu"] for g in f.get("gpus", []) if g.get("node") == node]
        typer.echo(f"{node}: FAIL {f.get('kind')} on GPU {gpus} ({f.get('root_cause', '')})")
    if not bad:
        typer.echo(f"{node}: PASS (no active fault)")
    raise typer.Exit(1 if bad else 0)
