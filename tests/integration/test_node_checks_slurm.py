"""A node's way back to service on the local stack's real Slurm: drain → check fails → stays
drained → RMA hook called; drain → check passes → resumed; a person's drain never resumed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from recovery import audit, node_checks, slurm_hooks
from recovery.policy import parse_policy
from recovery.scheduler.slurm import SlurmScheduler
from recovery.store import make_engine
from tests.conftest import wait_until
from tests.helpers import scontrol_show, slurm

PY = sys.executable
NODE, OTHER = "node4", "node3"


def _policy(passes: bool, hook: Path | None = None):
    code = "print('dcgmi diag: Pass')" if passes else "import sys; print('diag: FAIL'); sys.exit(2)"
    rts: dict = {
        "enabled": True,
        "checks": {"quick": {"argv": [PY, "-c", code, "{node}"], "timeout_s": 30},
                   "deep": {"argv": [PY, "-c", code, "{node}"], "timeout_s": 30}},
        "rma_after_failures": 1,
    }  # fmt: skip
    if hook:
        rts["rma_hook"] = {"argv": [PY, "-c", f"open({str(hook)!r}, 'w').write('{{node}}')"]}
    return parse_policy({"mode": "act", "return_to_service": rts}, env={})


@pytest.fixture
def env(local_stack, tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    sched = SlurmScheduler()
    yield engine, sched, Path(os.environ["GOODPUT_HOLD_DIR"])
    for n in (NODE, OTHER):
        slurm_hooks.release(Path(os.environ["GOODPUT_HOLD_DIR"]), n)
        slurm("scontrol", "update", f"NodeName={n}", "State=RESUME", check=False)


def _reason(node: str) -> str:
    state = SlurmScheduler().node_state(node)  # sinfo's %E: the whole reason, spaces and all
    assert state is not None
    return state.reason


def test_a_failed_check_keeps_the_node_drained_and_calls_the_rma_hook(env, tmp_path):
    engine, sched, holds = env
    sched.drain(NODE, "goodput: XID 79 (test)")
    ticket = tmp_path / "ticket"
    [out] = [o for o in node_checks.tick(engine, sched, _policy(False, ticket), hold_dir=holds)
             if o["node"] == NODE]  # fmt: skip
    assert out["state"] == "rma", out
    state = scontrol_show("node", NODE)
    assert "DRAIN" in state["State"] and _reason(NODE).startswith("goodput: failed quick")
    assert ticket.read_text() == NODE
    assert slurm_hooks.held(holds, NODE)  # and the Prolog refuses it meanwhile
    assert node_checks.rows(engine, NODE)[0]["output"].strip() == "diag: FAIL"
    assert audit.verify(engine).ok


def test_a_passed_check_resumes_goodputs_drain_and_never_a_persons(env):
    engine, sched, holds = env
    sched.drain(NODE, "goodput: XID 79 (test)")
    slurm("scontrol", "update", f"NodeName={OTHER}", "State=DRAIN", "Reason=maintenance by alice")
    wait_until(lambda: "DRAIN" in scontrol_show("node", OTHER).get("State", ""), 10, what="drain")
    done = node_checks.tick(engine, sched, _policy(True), hold_dir=holds)
    assert [(o["node"], o["state"]) for o in done] == [(NODE, "passed")]
    assert "DRAIN" not in scontrol_show("node", NODE)["State"]
    assert "DRAIN" in scontrol_show("node", OTHER)["State"]
    assert _reason(OTHER) == "maintenance by alice"
