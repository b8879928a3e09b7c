"""`goodput rules generate [--check]`: render alert rules and promtool tests from alerts.yaml."""

from __future__ import annotations

from pathlib import Path

import typer

from alertdsl import promtool, rules
from alertdsl import spec as alerts

app = typer.Typer(help="Prometheus rules generated from alertmanager/alerts.yaml.")

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alertmanager" / "rules" / "goodput.yml"
CASES = ROOT / "alertmanager" / "tests" / "cases.yaml"
TESTS = ROOT / "alertmanager" / "tests" / "goodput_test.yml"


def tests_file(evaluation: str) -> Path:
    """`goodput_test.yml` for the default 1 s evaluation, `goodput_test_<interval>.yml` else."""
    if evaluation == promtool.DEFAULT_EVALUATION:
        return TESTS
    return TESTS.with_name(f"{TESTS.stem}_{evaluation}{TESTS.suffix}")


def outputs() -> dict[Path, str]:
    """Every generated file and its expected content (from the project's alerts.yaml, which
    `$GOODPUT_ALERTS_FILE` does not redirect: these are the project's files)."""
    spec = alerts.load(alerts.DEFAULT_PATH)
    out = {RULES: rules.dump_rules(spec)}
    if CASES.exists():
        docs = promtool.dump_promtool_tests(spec, CASES, rule_file="../rules/goodput.yml")
        out |= {tests_file(ev): text for ev, text in docs.items()}
    return out


@app.command("generate")
def generate(
    check: bool = typer.Option(False, "--check", help="Fail if a generated file is stale."),
) -> None:
    """Write alertmanager/rules/goodput.yml and alertmanager/tests/goodput_test*.yml."""
    try:
        files = outputs()
    except alerts.AlertsError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    obsolete = sorted(set(TESTS.parent.glob(f"{TESTS.stem}*{TESTS.suffix}")) - set(files))
    if check:
        for p in stale:
            typer.echo(f"stale: {p.relative_to(ROOT)} (run `goodput rules generate`)", err=True)
        for p in obsolete:
            typer.echo(f"obsolete: {p.relative_to(ROOT)} (run `goodput rules generate`)", err=True)
        raise typer.Exit(1 if stale or obsolete else 0)
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[p])
        typer.echo(f"wrote {p.relative_to(ROOT)}")
    for p in obsolete:  # a case's evaluation interval that no case uses any more
        p.unlink()
        typer.echo(f"removed {p.relative_to(ROOT)}")
    if not stale and not obsolete:
        typer.echo("up to date")
