"""compose/docker-compose.yml, checked by parsing (no Docker engine runs here): every mounted
file exists, and service names and ports agree with the Prometheus, Alertmanager, Grafana,
Loki and Promtail configuration they use."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
DOC = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
SERVICES: dict = DOC["services"]
PROM = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
AM = yaml.safe_load((COMPOSE.parent / "alertmanager" / "alertmanager.yml").read_text())
DATASOURCES = yaml.safe_load(
    (COMPOSE / "grafana" / "provisioning" / "datasources" / "goodput.yml").read_text()
)
PROVIDERS = yaml.safe_load(
    (COMPOSE / "grafana" / "provisioning" / "dashboards" / "goodput.yml").read_text()
)


def exposed() -> dict[int, str]:
    """port -> service, from each service's `expose` (all bind 127.0.0.1 on the host network)."""
    ports: dict[int, str] = {}
    for name, svc in SERVICES.items():
        for p in svc.get("expose", []):
            assert int(p) not in ports, f"port {p} claimed by {ports.get(int(p))} and {name}"
            ports[int(p)] = name
    return ports


def port_of(url: str) -> int:
    u = urlparse(url if "://" in url else f"http://{url}")
    assert u.hostname == "127.0.0.1", f"{url}: everything binds loopback"
    assert u.port is not None
    return u.port


def mounts(service: str) -> dict[str, str]:
    """container path -> source for one service's volumes."""
    out = {}
    for v in SERVICES[service].get("volumes", []):
        source, target = v.split(":")[:2]
        out[target] = source
    return out


def test_the_whole_stack_is_there():
    need = {"prometheus", "alertmanager", "loki", "promtail", "grafana", "simulator",
            "log-exporter", "detector", "receiver"}  # fmt: skip
    assert need <= set(SERVICES)


def test_every_bind_mount_exists_and_named_volumes_are_declared():
    declared = set(DOC.get("volumes") or {})
    for name, svc in SERVICES.items():
        for v in svc.get("volumes", []):
            source = v.split(":")[0]
            if source.startswith((".", "/")):
                assert (COMPOSE / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"


def test_goodput_image_builds_from_files_that_exist():
    build = SERVICES["simulator"]["build"]
    context = (COMPOSE / build["context"]).resolve()
    dockerfile = context / build["dockerfile"]
    assert dockerfile.is_file()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (context / src).exists(), f"Dockerfile copies missing {src}"


def test_goodput_image_holds_every_package_it_installs():
    """`pip install .` in the image finds only the packages copied in: one left out (clients/,
    alertdsl/ once they were new) installs fine and fails at the first import."""
    project = tomllib.loads((COMPOSE.parent / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    dockerfile = (COMPOSE / "Dockerfile").read_text().splitlines()
    copied = {src for line in dockerfile if line.startswith("COPY ") for src in line.split()[1:-1]}
    assert packages <= copied, f"the image lacks {sorted(packages - copied)}"


def test_host_network_everywhere():
    # Goodput's services bind 127.0.0.1; on one host network the same ports and
    # alertmanager.yml (webhook http://127.0.0.1:19430) work unchanged.
    for name, svc in SERVICES.items():
        assert svc.get("network_mode") == "host", name
        assert "ports" not in svc, f"{name}: `ports` is meaningless with the host network"


def test_prometheus_scrapes_the_services_that_exist():
    ports = exposed()
    scraped = {}
    for job in PROM["scrape_configs"]:
        for sc in job.get("static_configs", []):
            for target in sc["targets"]:
                scraped[job["job_name"]] = ports.get(port_of(target))
    assert scraped == {
        "goodput-log-exporter": "log-exporter",
        "goodput-detector": "detector",
        "goodput-receiver": "receiver",
        "goodput-simulator": "simulator",
        "alertmanager": "alertmanager",
    }
    # the simulator writes the dcgm file_sd targets into the volume Prometheus reads
    dcgm = next(j for j in PROM["scrape_configs"] if j["job_name"] == "dcgm")
    target_dir = str(Path(dcgm["file_sd_configs"][0]["files"][0]).parent)
    volume = mounts("prometheus")[target_dir]
    sim_cmd = SERVICES["simulator"]["command"]
    sim_dir = sim_cmd[sim_cmd.index("--prometheus-targets") + 1]
    assert mounts("simulator")[sim_dir] == volume


def test_prometheus_loads_the_generated_rules_and_finds_alertmanager():
    ports = exposed()
    (rules,) = PROM["rule_files"]
    assert mounts("prometheus")[str(Path(rules).parent)] == "../alertmanager/rules"
    (am,) = PROM["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert ports[port_of(am)] == "alertmanager"
    flag = next(c for c in SERVICES["prometheus"]["command"] if c.startswith("--web.listen"))
    assert ports[port_of(flag.split("=", 1)[1])] == "prometheus"


def test_alertmanager_reaches_the_receiver_with_the_shared_token():
    ports = exposed()
    recv = next(r for r in AM["receivers"] if r["name"] == "goodput-recovery")
    hook = recv["webhook_configs"][0]
    assert ports[port_of(hook["url"])] == "receiver"
    assert SERVICES["receiver"]["environment"]["GOODPUT_RECEIVER_PORT"] == "19430"
    # alertmanager.yml's relative credentials_file resolves beside the mounted config
    am_mounts = mounts("alertmanager")
    secret_dir = str(Path("/etc/alertmanager") / Path(hook["http_config"]["authorization"]
                                                       ["credentials_file"]).parent)  # fmt: skip
    token_file = Path(SERVICES["receiver"]["environment"]["GOODPUT_RECEIVER_TOKEN_FILE"])
    assert am_mounts[secret_dir] == mounts("receiver")[str(token_file.parent)]
    assert am_mounts["/etc/alertmanager/templates"] == "../alertmanager/templates"
    init = " ".join(SERVICES["token-init"]["command"])
    assert f"/secrets/{token_file.name}" in init


def test_grafana_datasources_and_dashboards_match_the_services():
    ports = exposed()
    by_type = {d["type"]: d for d in DATASOURCES["datasources"]}
    assert ports[port_of(by_type["prometheus"]["url"])] == "prometheus"
    assert ports[port_of(by_type["loki"]["url"])] == "loki"
    assert ports[port_of(by_type["alertmanager"]["url"])] == "alertmanager"
    path = PROVIDERS["providers"][0]["options"]["path"]
    assert mounts("grafana")[path] == "../dashboards/generated"
    env = SERVICES["grafana"]["environment"]
    assert ports[int(env["GF_SERVER_HTTP_PORT"])] == "grafana"
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (COMPOSE.parent / "dashboards" / "generated" / Path(home).name).is_file()


def test_promtail_ships_the_logs_the_simulator_writes_to_loki():
    ports = exposed()
    promtail = yaml.safe_load((COMPOSE / "promtail" / "promtail.yml").read_text())
    assert ports[port_of(promtail["clients"][0]["url"])] == "loki"
    loki = yaml.safe_load((COMPOSE / "loki" / "loki.yml").read_text())
    assert ports[loki["server"]["http_listen_port"]] == "loki"
    log_dir = SERVICES["simulator"]["environment"]["GOODPUT_LOG_DIR"]
    volume = mounts("simulator")[log_dir]
    assert mounts("promtail")[log_dir] == volume
    paths = [sc["static_configs"][0]["labels"]["__path__"] for sc in promtail["scrape_configs"]]
    assert f"{log_dir}/jobs/slurm-*.out" in paths and f"{log_dir}/kernel/*.log" in paths
    job_rx = promtail["scrape_configs"][0]["pipeline_stages"][0]["regex"]["expression"]
    assert re.search(job_rx.replace("(?P<", "(?P<"), "/var/log/goodput/jobs/slurm-4242.out")


def test_service_commands_use_their_exposed_ports():
    for name, flag in (("log-exporter", "--port"), ("detector", "--port"),
                       ("simulator", "--control-port")):  # fmt: skip
        cmd = SERVICES[name]["command"]
        assert str(cmd[cmd.index(flag) + 1]) in SERVICES[name]["expose"], name


def test_promtool_accepts_the_compose_prometheus_config():
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed")
    out = subprocess.run(
        [promtool, "check", "config", str(COMPOSE / "prometheus" / "prometheus.yml")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
