"""Fail-open: the watchdog's verdicts, and a receiver that stops acting and resumes."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from recovery import actions, approvals, audit, outbox, reconciler, watchdog
from recovery.app import create_app
from recovery.policy import WatchdogPolicy
from tests.unit.test_actions_flow import _no_thread, diag, world  # noqa: F401 - fixtures
from tests.unit.test_console_pages import env  # noqa: F401 - fixture

POL = WatchdogPolicy()


def rows(**status: str) -> list[dict[str, str]]:
    return [{"source": k, "status": v, "detail": f"{k} said {v}"} for k, v in status.items()]


def test_the_most_basic_failure_is_named():
    ok = rows(scheduler="ok", prometheus="ok", loki="off", logs="error")
    assert watchdog.verdict(ok, POL, None, 0.0) == ("ok", "")  # logs not required by default
    r, why = watchdog.verdict(rows(scheduler="error", prometheus="error"), POL, None, 0.0)
    assert r == "scheduler_unreachable" and "scheduler said error" in why
    r, why = watchdog.verdict(rows(scheduler="ok", prometheus="error"), POL, None, 0.0)
    assert r == "evidence_unreachable" and why == "prometheus: prometheus said error"
    only_slurm = WatchdogPolicy(required=("scheduler",))
    assert (
        watchdog.verdict(rows(scheduler="ok", prometheus="error"), only_slurm, None, 0.0)[0] == "ok"
    )


def test_a_silent_alert_flow_stops_acting_only_when_asked():
    quiet = rows(scheduler="ok")
    assert watchdog.verdict(quiet, POL, 0.0, 1e6)[0] == "ok"
    p = WatchdogPolicy(alert_silence_s=600)
    assert watchdog.verdict(quiet, p, 1000.0, 1500.0)[0] == "ok"
    r, why = watchdog.verdict(quiet, p, 1000.0, 1700.0)
    assert r == "alert_flow_stopped" and "700 s ago" in why


def test_one_blip_does_not_stop_it_and_one_good_probe_resumes():
    s = watchdog.step(watchdog.State(), "scheduler_unreachable", 2)
    assert s.acting and s.bad == 1
    s = watchdog.step(s, "evidence_unreachable", 2)
    assert not s.acting and s.reason == "evidence_unreachable"
    assert watchdog.step(s, "ok", 2) == watchdog.State()


def test_the_receiver_stops_acting_says_so_and_resumes(world):  # noqa: F811
    """Prometheus stops answering: after two probes the receiver plans a GPU fault in monitor
    mode (reason audited) and holds an approved action back; the metric says why. Prometheus
    answers again: it acts, and the held action is executed by the retry loop."""
    probe = {"s": rows(scheduler="ok", prometheus="error")}
    settings = world.settings("approve")
    dog = watchdog.Watchdog(world.engine, settings, lambda: POL, probe=lambda: probe["s"])
    registry = CollectorRegistry()
    registry.register(watchdog.ActingCollector(world.engine))

    def acting() -> tuple[float | None, float | None]:
        return (
            registry.get_sample_value("goodput_receiver_acting", {"reason": "ok"}),
            registry.get_sample_value(
                "goodput_receiver_acting", {"reason": "evidence_unreachable"}
            ),
        )

    world.submit("42", node="node2")
    waiting = actions.on_diagnosis(world.engine, settings, *diag(1))
    assert waiting["state"] == "pending_approval"
    assert acting() == (1.0, None)
    dog.tick()
    assert watchdog.current(world.engine) == "ok"  # one blip
    dog.tick()
    assert watchdog.current(world.engine) == "evidence_unreachable"
    assert acting() == (None, 0.0)
    [stopped] = audit.query(world.engine, type_="watchdog_stopped")[0]
    assert stopped["payload"]["detail"] == "prometheus: prometheus said error"

    held = approvals.approve(world.engine, settings, waiting["id"], "alice")
    assert held["state"] == "approved" and world.st["jobs"]["42"]["restarts"] == 0
    world.submit("43", node="node3")
    planned = actions.on_diagnosis(
        world.engine, world.settings("act"), *diag(2, job="43", nodes=("node3",))
    )
    assert planned["state"] == "planned_only"
    assert "watchdog_not_acting" in planned["body"]["action"]["reasons"]
    assert world.st["nodes"]["node3"]["state"] != "DRAIN"

    probe["s"] = rows(scheduler="ok", prometheus="ok")
    dog.tick()
    assert watchdog.current(world.engine) == "ok" and acting() == (1.0, None)
    assert len(audit.query(world.engine, type_="watchdog_resumed")[0]) == 1
    reconciler.reconcile(world.engine, settings)
    assert outbox.get_action(world.engine, waiting["id"])["state"] == "executed"
    assert world.st["jobs"]["42"]["restarts"] == 1


def test_planning_that_reaches_the_scheduler_ignores_a_stale_unreachable(world):  # noqa: F811
    """The watchdog last saw slurmctld down, but the planner has just read Slurm: it acts."""
    dog = watchdog.Watchdog(
        world.engine, world.settings(), lambda: POL, probe=lambda: rows(scheduler="error")
    )
    dog.tick(), dog.tick()
    assert watchdog.current(world.engine) == "scheduler_unreachable"
    world.submit("42", node="node2")
    a = actions.on_diagnosis(world.engine, world.settings("act"), *diag(1))
    assert "watchdog_not_acting" not in a["body"]["action"]["reasons"]


def test_every_console_page_shows_the_banner(env):  # noqa: F811
    client, app, _st, _submit = env
    engine = app.state.engine
    page = client.get("/console/incidents", headers={"Authorization": "Bearer console-test-token"})
    assert page.status_code == 200 and 'id="not-acting"' not in page.text
    watchdog._write(engine, "scheduler_unreachable", "test", "test")
    for path in ("/console/incidents", "/console/policy", "/console/approvals"):
        page = client.get(path, headers={"Authorization": "Bearer console-test-token"})
        assert page.status_code == 200 and 'id="not-acting"' in page.text, path
        assert "scheduler unreachable" in page.text


def test_a_receiver_app_exports_the_metric(tmp_path, monkeypatch):
    monkeypatch.setenv("GOODPUT_ACTIONS_THREAD", "0")
    from tests.unit.test_console_pages import ConsoleSettings

    app = create_app(ConsoleSettings(db_url=f"sqlite:///{tmp_path / 'r.db'}"))
    with TestClient(app) as client:
        text = client.get("/metrics").text
    assert 'goodput_receiver_acting{reason="ok"} 1.0' in text


def test_an_action_a_dead_process_left_executing_is_finished_even_when_not_acting(world):  # noqa: F811
    """Crash safety outranks fail-open: half an action (a drain without its requeue) is worse
    than finishing it, so the start-up reconcile completes it while the watchdog holds back."""
    from sqlalchemy import update

    world.submit("42", node="node2")
    s = world.settings("act")
    a = actions.on_diagnosis(world.engine, s, *diag(15))
    with world.engine.begin() as conn:
        conn.execute(
            update(outbox.actions_table)
            .where(outbox.actions_table.c.id == a["id"])
            .values(state="executing", owner="dead-process")
        )
    watchdog._write(world.engine, "evidence_unreachable", "test", "test")
    reconciler.reconcile(world.engine, s, startup=True)
    assert outbox.get_action(world.engine, a["id"])["state"] == "executed"


def test_the_watchdog_runs_on_the_receivers_clock(tmp_path, monkeypatch):
    """Its switch row, its probe times and its notices read the store's clock (the benchmark's
    simulated one), not the wall clock."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from sqlalchemy import select

    from recovery import notifier
    from recovery.clock import ManualClock
    from recovery.policy import parse_policy
    from recovery.store import make_engine

    t = 1_600_000_000.0
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}", clock=ManualClock(t))
    sent: list[dict] = []
    monkeypatch.setattr(
        notifier.requests,
        "post",
        lambda url, json, timeout: sent.append(json[0]) or SimpleNamespace(status_code=200),
    )
    settings = SimpleNamespace(
        policy=parse_policy({"mode": "act"}, env={}),
        scheduler_adapter=object(),
        alertmanager_url="http://am.invalid",
        prometheus_url=None,
    )
    probe = {"s": rows(scheduler="error")}
    pol = WatchdogPolicy(failures_before_stop=1)
    dog = watchdog.Watchdog(engine, settings, lambda: pol, probe=lambda: probe["s"])
    assert dog.started_at == t
    dog.tick()
    probe["s"] = rows(scheduler="ok", prometheus="ok", loki="ok")
    dog.tick()
    with engine.connect() as conn:
        (stamp,) = conn.execute(
            select(outbox.switches.c.updated_at).where(outbox.switches.c.name == "watchdog")
        ).scalars()
    assert stamp == t
    iso = datetime.fromtimestamp(t, UTC).isoformat()
    assert [a["startsAt"] for a in sent] == [iso, iso]
    assert sent[1]["endsAt"] == datetime.fromtimestamp(t + 1.0, UTC).isoformat()


def _shared_store(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from recovery import notifier
    from recovery.clock import ManualClock
    from recovery.policy import parse_policy
    from recovery.store import make_engine

    clock = ManualClock(1_600_000_000.0)
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}", clock=clock)
    monkeypatch.setattr(
        notifier.requests, "post", lambda url, json, timeout: SimpleNamespace(status_code=200)
    )
    settings = SimpleNamespace(
        policy=parse_policy({"mode": "act"}, env={}),
        scheduler_adapter=object(),
        alertmanager_url="http://am.invalid",
        prometheus_url=None,
    )
    return engine, settings, clock


def _switch_events(engine) -> list[str]:
    return [e["type"] for e in audit.query(engine, limit=1000)[0] if "watchdog" in e["type"]]


BAD = rows(scheduler="ok", prometheus="error")
GOOD = rows(scheduler="ok", prometheus="ok", loki="ok")


def test_a_receiver_restarted_while_stopped_stays_stopped_on_a_bad_probe(tmp_path, monkeypatch):
    """The new process began as `acting`: its first bad probe (one of two needed) resumed
    acting while Prometheus was still down."""
    engine, settings, clock = _shared_store(tmp_path, monkeypatch)
    dog = watchdog.Watchdog(engine, settings, lambda: POL, probe=lambda: BAD, owner="a")
    dog.tick()
    dog.tick()
    assert watchdog.current(engine) == "evidence_unreachable"
    again = watchdog.Watchdog(engine, settings, lambda: POL, probe=lambda: BAD, owner="a2")
    again.tick()
    assert watchdog.current(engine) == "evidence_unreachable"
    assert _switch_events(engine) == ["watchdog_stopped"]
    again.probe = lambda: GOOD
    again.tick()  # the old process's stop, fresh: not this one's to end yet
    assert watchdog.current(engine) == "evidence_unreachable"
    clock.t += watchdog.STALE_INTERVALS * POL.interval_s + 1
    again.tick()  # a good probe once the stop is stale
    assert watchdog.current(engine) == "ok"


def test_receivers_that_disagree_do_not_flip_the_switch(tmp_path, monkeypatch):
    """One receiver cannot reach Prometheus, one can: the one that stopped acting keeps its
    stop fresh and the other leaves it alone (before: stopped, resumed, stopped ... each tick,
    each with a notice); once its stop goes stale (that receiver gone), the other resumes."""
    engine, settings, clock = _shared_store(tmp_path, monkeypatch)
    a = watchdog.Watchdog(engine, settings, lambda: POL, probe=lambda: BAD, owner="a")
    b = watchdog.Watchdog(engine, settings, lambda: POL, probe=lambda: GOOD, owner="b")
    for _ in range(4):
        a.tick()
        b.tick()
        clock.t += POL.interval_s
    assert watchdog.current(engine) == "evidence_unreachable"
    assert _switch_events(engine) == ["watchdog_stopped"]
    clock.t += watchdog.STALE_INTERVALS * POL.interval_s + 1  # a is gone
    b.tick()
    assert watchdog.current(engine) == "ok"
    assert _switch_events(engine) == ["watchdog_stopped", "watchdog_resumed"]
