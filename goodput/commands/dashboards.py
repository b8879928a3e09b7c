"""`goodput dashboards generate [--check]` and `goodput dashboards push`."""

from __future__ import annotations

from pathlib import Path

import typer

from dashboards import grafana

app = typer.Typer(help="Grafana dashboards as code (dashboards/: one module a dashboard).")

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "dashboards" / "generated"


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _build():  # grafana-foundation-sdk is the `dashboards` extra: import it only when used
    try:
        from dashboards import build
    except ImportError as e:
        typer.echo(f"error: {e}; install the extra: pip install 'goodput[dashboards]'", err=True)
        raise typer.Exit(2) from e
    return build


def outputs() -> dict[Path, str]:
    build = _build()
    return {OUT / name: build.dumps(model) for name, model in build.build_all().items()}


@app.command("generate")
def generate(
    check: bool = typer.Option(False, "--check", help="Fail if a generated file is stale."),
) -> None:
    """Write dashboards/generated/*.json."""
    files = outputs()
    stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    extra = sorted(set(OUT.glob("*.json")) - set(files))
    if check:
        for p in stale + extra:
            typer.echo(f"stale: {_rel(p)} (run `goodput dashboards generate`)", err=True)
        raise typer.Exit(1 if stale or extra else 0)
    OUT.mkdir(parents=True, exist_ok=True)
    for p in stale:
        p.write_text(files[p])
        typer.echo(f"wrote {_rel(p)}")
    for p in extra:
        p.unlink()
        typer.echo(f"removed {_rel(p)}")


@app.command("push")
def push(
    url: str = typer.Option(
        "http://127.0.0.1:3000", envvar="GOODPUT_GRAFANA_URL", help="Grafana base URL."
    ),
    token_file: Path = typer.Option(
        "",
        envvar="GOODPUT_GRAFANA_TOKEN_FILE",
        help="File holding a Grafana service-account token.",
    ),
    folder_uid: str = typer.Option("", help="Grafana folder uid (default: General)."),
) -> None:
    """Upload every generated dashboard to Grafana (POST /api/dashboards/db, overwrite)."""
    if not str(token_file) or not token_file.is_file():
        typer.echo("error: --token-file (or GOODPUT_GRAFANA_TOKEN_FILE) must name a file", err=True)
        raise typer.Exit(2)
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        typer.echo(f"error: --token-file {token_file}: cannot read: {exc}", err=True)
        raise typer.Exit(2) from None
    failed = 0
    for name, model in _build().build_all().items():
        try:
            answer = grafana.push(url, token, model, folder_uid=folder_uid)
        except grafana.GrafanaError as e:
            typer.echo(f"{name}: {e}", err=True)
            failed += 1
            continue
        typer.echo(
            f"{name}: {answer.get('url', answer.get('uid'))} (version {answer.get('version')})"
        )
    if failed:
        raise typer.Exit(1)
