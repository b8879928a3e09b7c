"""Chaos on the real local stack: a real receiver process (PostgreSQL store, real Slurm jobs)
killed with SIGKILL at seeded points, slurmctld stopped mid-action, Prometheus stopped,
PostgreSQL restarted under the receiver, alerts delivered again. After each run: no incident
without its action (lost), none with two (duplicated), none left half-way (stuck), no job held
that nobody stopped, Slurm's restart counts equal to the requeues Goodput executed, and the
audit chain verifies. Each test prints its figures (`-s` or the `-ra` summary shows them).

Sizes: `GOODPUT_CHAOS_INCIDENTS` (default 200), `GOODPUT_CHAOS_KILLS_PER_POINT` (default 2:
each failpoint twice, and as many kills from outside at random moments),
`GOODPUT_CHAOS_SLURM_DOWN_S` (default 30: more than the Slurm adapter's whole retry budget,
3 retries over 3.5 s, so every call inside the outage fails and is retried by the action's own
backoff; 60 in a nightly run), `GOODPUT_CHAOS_SEED` (default 19), `GOODPUT_CHAOS_POINTS`
(a comma list of failpoints: only these).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from recovery.failpoints import POINTS
from tests.chaos.harness import Chaos, pg_schema, restore_stack

pytestmark = pytest.mark.timeout(900)
SEED = int(os.environ.get("GOODPUT_CHAOS_SEED", "19"))
INCIDENTS = int(os.environ.get("GOODPUT_CHAOS_INCIDENTS", "200"))
SLURM_DOWN_S = float(os.environ.get("GOODPUT_CHAOS_SLURM_DOWN_S", "30"))
KILLS_PER_POINT = int(os.environ.get("GOODPUT_CHAOS_KILLS_PER_POINT", "2"))
# Every failpoint a webhook-to-Slurm run passes ("waiting" needs the scheduler down: below).
KILL_POINTS = (
    os.environ.get("GOODPUT_CHAOS_POINTS", "").split(",")
    if os.environ.get("GOODPUT_CHAOS_POINTS")
    else [p for p in POINTS if p != "waiting"]
)
# One round: a GPU falling off the bus (drain and requeue excluding the node), a CUDA OOM
# (stop), crashes (requeue), each on its own running job.
KINDS = ["xid", "oom", *["crash"] * 10]


@pytest.fixture
def chaos(local_stack, tmp_path):
    url, drop = pg_schema(local_stack["GOODPUT_TEST_POSTGRES_URL"])
    c = Chaos(local_stack, url, tmp_path, SEED)
    yield c
    c.cleanup()
    restore_stack({**os.environ, **local_stack})
    drop()


def _verdict(c: Chaos, name: str) -> None:
    c.killing = False
    problems = c.check()
    print(c.fig.line(name))
    assert problems == [], "\n".join(problems[:30])


def _pid(stack: dict[str, str], name: str) -> int:
    return int(Path(stack["GOODPUT_STACK_DIR"], "run", f"{name}.pid").read_text())


def test_kill_9_at_seeded_points_over_200_incidents(chaos):
    chaos.env.pop("GOODPUT_PROMETHEUS_URL", None)  # its outage is a test of its own, below
    chaos.submit(14)
    chaos.schedule_kills(KILL_POINTS, rounds=KILLS_PER_POINT)
    chaos.start(chaos._next_crash())
    extra = 0
    while chaos.fig.incidents < INCIDENTS or (chaos.plan and extra < 5):
        extra += chaos.fig.incidents >= INCIDENTS
        chaos.round(KINDS)
        chaos.person_repairs()
        print(chaos.fig.line("kill -9 so far"), flush=True)
    chaos.round(["crash"] * 4)  # a last round that nobody repairs after
    _verdict(chaos, "kill -9")
    assert chaos.fig.incidents >= INCIDENTS
    missed = set(KILL_POINTS) - set(chaos.fig.deaths)
    assert not missed, f"failpoints never hit: {sorted(missed)}"


def test_slurmctld_down_mid_action(chaos, local_stack):
    """slurmctld stops while actions run; alerts keep coming; the receiver is killed twice
    during the outage, once where a plan waits for the scheduler. When Slurm is back every
    action completes, and the faults diagnosed during the outage are acted on, not handed to
    a person for want of Slurm's evidence."""
    chaos.env.pop("GOODPUT_PROMETHEUS_URL", None)
    chaos.submit(8)
    chaos.start()
    before = [chaos.fault(j, k) for j, k in chaos.pick(["crash", "xid", "crash"])]
    for f in before:
        chaos.post([f.alert()])
    time.sleep(1.0)  # mid-action: diagnosed, planned or executing when slurmctld stops
    t0 = time.monotonic()
    os.kill(_pid(local_stack, "slurmctld"), signal.SIGTERM)
    try:
        during = [chaos.fault(j, k) for j, k in chaos.pick(["crash", "oom"], live=False)]
        for f in during:  # diagnosed with Slurm unreachable: made again when it is back
            chaos.post([f.alert()])
        # A receiver that asks Slurm nothing while diagnosing plans at once, and waits:
        chaos.env["GOODPUT_RECEIVER_SLURM"] = "0"
        chaos.plan = []
        chaos.kill_now("waiting@1")
        late = [chaos.fault(j, "crash") for j, _ in chaos.pick(["crash"], live=False)]
        for f in late:
            chaos.post([f.alert()])
        chaos.wait(lambda: chaos.fig.deaths["waiting"] == 1, 60, "death at the waiting plan")
        del chaos.env["GOODPUT_RECEIVER_SLURM"]
        chaos.kill_now()  # back to the full receiver, still inside the outage
        time.sleep(max(0.0, SLURM_DOWN_S - (time.monotonic() - t0)))
    finally:
        restore_stack({**os.environ, **local_stack})
    down = time.monotonic() - t0
    faults = before + during + late
    chaos.wait(lambda: chaos.settled(faults), 180, "settled after slurmctld came back")
    chaos.resolve(faults)
    _verdict(chaos, f"slurmctld down {down:.0f} s")
    assert chaos.fig.deaths["waiting"] == 1
    acts = chaos.actions_by_incident()
    of = chaos.incident_of()
    for f in during:
        (row,) = acts[str(of[f.fingerprint][0])]
        assert row.kind in ("requeue", "stop") and row.state == "executed", (row.kind, row.state)


def test_prometheus_down(chaos, local_stack):
    chaos.submit(8)
    chaos.start()
    os.kill(_pid(local_stack, "prometheus"), signal.SIGTERM)
    try:
        chaos.round(["crash", "xid", "crash", "crash"])
    finally:
        restore_stack({**os.environ, **local_stack})
    _verdict(chaos, "prometheus down")


def test_postgres_restarted_under_the_receiver(chaos, local_stack):
    chaos.submit(8)
    chaos.start()
    chaos.round(["crash", "crash"])
    faults = [chaos.fault(j, k) for j, k in chaos.pick(["crash", "xid", "crash"])]
    chaos.post([faults[0].alert()])
    time.sleep(0.3)  # its diagnosis and action under way when the database goes
    os.kill(_pid(local_stack, "postgres"), signal.SIGINT)  # fast shutdown: sessions cut
    back = threading.Timer(8.0, restore_stack, args=({**os.environ, **local_stack},))
    back.start()
    for f in faults[1:]:
        chaos.post([f.alert()], deadline_s=120)  # refused (5xx) until PostgreSQL is back
    back.join()
    chaos.wait(lambda: chaos.settled(faults), 120, "settled after PostgreSQL restarted")
    chaos.resolve(faults)
    assert chaos.proc.poll() is None, "the receiver died with its database"
    _verdict(chaos, "postgres restarted")


def test_alertmanager_redelivers_the_same_alerts(chaos):
    chaos.submit(4)
    chaos.schedule_kills(["ingested"], rounds=2)
    chaos.start(chaos._next_crash())
    faults = [chaos.fault(j, k) for j, k in chaos.pick(["crash"] * 4)]
    docs = [f.alert() for f in faults]
    threads = [threading.Thread(target=chaos.post, args=(docs,)) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(3):
        chaos.post(docs)  # and again, after it was stored
    chaos.wait(lambda: chaos.settled(faults), 90, "settled")
    _verdict(chaos, "redelivery")
    assert chaos.fig.posts >= 8
