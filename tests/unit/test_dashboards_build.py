"""Dashboards as code: generated JSON is current, well-formed, and `push` speaks Grafana's API."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dashboards import build, grafana
from goodput.cli import app
from goodput.commands import dashboards as cmd

ROOT = Path(__file__).resolve().parents[2]


def test_generated_json_is_up_to_date():
    files = cmd.outputs()
    assert len(files) == 4
    for path, text in files.items():
        assert path.exists() and path.read_text() == text, (
            f"{path}: run `goodput dashboards generate`"
        )
    assert set((ROOT / "dashboards" / "generated").glob("*.json")) == set(files)


def test_generate_check_reports_a_stale_file(tmp_path, monkeypatch):
    monkeypatch.setattr(cmd, "OUT", tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["dashboards", "generate", "--check"]).exit_code == 1
    assert runner.invoke(app, ["dashboards", "generate"]).exit_code == 0
    assert runner.invoke(app, ["dashboards", "generate", "--check"]).exit_code == 0
    (tmp_path / "job-drilldown.json").write_text("{}")
    assert runner.invoke(app, ["dashboards", "generate", "--check"]).exit_code == 1


@pytest.fixture(scope="module")
def models():
    return build.build_all()


def test_uids_titles_and_unique_panel_ids(models):
    uids = [m["uid"] for m in models.values()]
    assert len(set(uids)) == len(uids) == 4
    for m in models.values():
        ids = [p["id"] for p in build.panels(m)]
        assert len(ids) == len(set(ids)), m["uid"]
        assert m["title"].startswith("Goodput / ")


def test_job_drilldown_has_job_and_node_variables_and_a_loki_panel(models):
    job = models["job-drilldown.json"]
    names = [v["name"] for v in job["templating"]["list"]]
    assert names == ["job_id", "node"]
    exprs = [e for _, _, e in build.queries(job)]
    assert any("$job_id" in e and "$node" in e for e in exprs)
    logs = [p for p in build.panels(job) if p["type"] == "logs"]
    assert logs and logs[0]["datasource"]["uid"] == "goodput-loki"
    titles = {p.get("title") for p in build.panels(job)}
    scores = ("GPU anomaly score", "Node score by detector", "Node suspect score")
    for needed in (*scores, "Loss", "Log pattern matches"):
        assert needed in titles


def test_incidents_dashboard_has_goodput_accounting(models):
    exprs = " ".join(e for _, _, e in build.queries(models["incidents-actions.json"]))
    assert "goodput_incident_time_to_recover_seconds" in exprs
    assert "goodput_gpu_hours_lost_total" in exprs


def test_every_target_uses_a_provisioned_datasource(models):
    provisioning = ROOT / "compose" / "grafana" / "provisioning" / "datasources" / "goodput.yml"
    text = provisioning.read_text()
    for m in models.values():
        for p in build.panels(m):
            if p["type"] == "row":
                continue
            assert p["datasource"]["uid"] in text, (m["uid"], p["title"])
            for t in p.get("targets", []):
                assert t["datasource"]["uid"] == p["datasource"]["uid"]
                assert t["refId"]


# ------------------------------------------------------------------ push, against a fake Grafana
# The fake honours Grafana's documented contract for POST /api/dashboards/db (it is NOT Grafana:
# no Grafana server can be installed here): bearer token, JSON body with `dashboard` (id null,
# uid), `overwrite`; 200 {"id","uid","url","status":"success","version"}; 401 {"message"}.

TOKEN = "glsa_test_token"


class FakeGrafana(BaseHTTPRequestHandler):
    store: dict[str, dict] = {}

    def log_message(self, *args):
        pass

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        if self.path != "/api/dashboards/db":
            return self._answer(404, {"message": "Not found"})
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._answer(401, {"message": "Unauthorized"})
        if self.headers.get("Content-Type") != "application/json":
            return self._answer(415, {"message": "bad content type"})
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        dash = body.get("dashboard") or {}
        if not dash.get("title") or dash.get("id") is not None:
            return self._answer(
                400, {"message": "Dashboard title cannot be empty / id must be null"}
            )
        uid = dash["uid"]
        if uid in self.store and not body.get("overwrite"):
            return self._answer(
                412,
                {
                    "message": "A dashboard with the same uid already exists",
                    "status": "name-exists",
                },
            )
        version = self.store.get(uid, {}).get("version", 0) + 1
        self.store[uid] = {"version": version, "dashboard": dash}
        self._answer(
            200,
            {
                "id": len(self.store),
                "uid": uid,
                "url": f"/d/{uid}/x",
                "status": "success",
                "version": version,
                "slug": "x",
            },
        )


@pytest.fixture
def fake_grafana():
    FakeGrafana.store = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeGrafana)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", FakeGrafana.store
    server.shutdown()


def test_push_uploads_every_dashboard_and_overwrites(fake_grafana, tmp_path):
    url, store = fake_grafana
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    runner = CliRunner()
    for version in (1, 2):
        out = runner.invoke(app, ["dashboards", "push", "--url", url, "--token-file", str(token)])
        assert out.exit_code == 0, out.output
        assert {v["version"] for v in store.values()} == {version}
    assert set(store) == {m["uid"] for m in build.build_all().values()}
    assert store["goodput-job"]["dashboard"]["templating"]["list"][0]["name"] == "job_id"


def test_push_reports_a_bad_token_and_a_missing_token_file(fake_grafana, tmp_path):
    url, store = fake_grafana
    token = tmp_path / "token"
    token.write_text("wrong")
    runner = CliRunner()
    out = runner.invoke(app, ["dashboards", "push", "--url", url, "--token-file", str(token)])
    assert out.exit_code == 1 and "401" in out.output and not store
    out = runner.invoke(
        app, ["dashboards", "push", "--url", url, "--token-file", str(tmp_path / "none")]
    )
    assert out.exit_code == 2


def test_push_validates_url_and_reports_unreachable_grafana():
    with pytest.raises(grafana.GrafanaError, match="http"):
        grafana.push("file:///etc/passwd", TOKEN, {"uid": "x", "title": "x"})
    with pytest.raises(grafana.GrafanaError, match="cannot reach"):
        grafana.push("http://127.0.0.1:9", TOKEN, {"uid": "x", "title": "x"}, timeout=1)
    with pytest.raises(grafana.GrafanaError, match="empty"):
        grafana.push("http://127.0.0.1:9", " ", {"uid": "x", "title": "x"})
