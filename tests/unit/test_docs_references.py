"""What the README and docs/ name exists: every repository path, every `goodput` command with
its options, every Python module or attribute. A module split or a renamed command that leaves
the prose behind fails here, not in a new user's shell."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import typer.main

from goodput.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "alertmanager/runbooks.md",
]
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} | {".ci"}
PACKAGES = (
    *("goodput", "catalogue", "alertdsl", "clients", "exporters"),
    *("detector", "recovery", "dashboards", "bench"),
)
SPANS = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"[*{}<>]|\.\.\.|…")


def _spans() -> list[tuple[str, str]]:
    """(file, text) of every inline code span and of every `$ goodput` console line."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        out += [(doc.name, m.group(1)) for m in SPANS.finditer(text)]
        out += [(doc.name, m.group(1)) for m in re.finditer(r"^\$ (goodput .*)$", text, re.M)]
    return out


def _paths() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        links = [m.group(1) for m in re.finditer(r"\]\(([^)#\s]+)", text) if "://" not in m[1]]
        found += [(doc.name, str((doc.parent / p).resolve().relative_to(ROOT))) for p in links]
    for name, span in _spans():
        for word in re.split(r"[\s,;()\[\]=:]+", span):
            word = word.strip("'\".")
            if "/" in word and word.split("/")[0] in TOP and not PLACEHOLDER.search(word):
                found.append((name, word))
    return sorted(set(found))


def test_every_path_the_docs_name_exists():
    paths = _paths()
    assert len(paths) > 50  # the scan finds the docs' paths at all
    missing = [f"{doc}: {p}" for doc, p in paths if not (ROOT / p).exists()]
    assert not missing, missing


def _commands() -> list[tuple[str, list[str]]]:
    """Each quoted `goodput …` command as words; in `a … | b …` each alternative takes the
    place of the first one's last sub-command (`goodput stack up|down`, `audit verify|export`)."""
    out = []
    for name, span in _spans():
        if span.startswith("goodput "):
            first, *others = span.split(">")[0].removeprefix("goodput ").split("|")
            out.append((name, first.split()))
            parent = _walk(first.split())[1][:-1]
            out += [(name, [*parent, *alt.split()]) for alt in others]
    return out


def _walk(words: list[str]) -> tuple[Any, list[str], list[str]]:
    """The click command the words name, the sub-command path taken and the words left."""
    cmd: Any = typer.main.get_command(app)
    path: list[str] = []
    for w in words:
        if w not in getattr(cmd, "commands", {}):
            break
        cmd, path = cmd.commands[w], [*path, w]
    return cmd, path, words[len(path) :]


def test_every_goodput_command_the_docs_quote_exists_with_its_options():
    commands = _commands()
    assert len(commands) > 40
    wrong = []
    for doc, words in commands:
        cmd, path, rest = _walk(words)
        where = f"{doc}: goodput {' '.join(words)}"
        if hasattr(cmd, "commands") and rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
            wrong.append(f"{where}: no command {rest[0]!r} in goodput {' '.join(path)}")
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        opts = {w.strip("[],;.)").split("=")[0] for w in rest if w.lstrip("[").startswith("--")}
        wrong += [f"{where}: goodput {' '.join(path)} has no {o}" for o in sorted(opts - known)]
    assert not wrong, wrong


def _resolves(ref: str) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj: Any = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if not (e.name and (name + ".").startswith(e.name + ".")):  # an import inside it
                raise
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


MODULE_REF = re.compile(rf"^((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)")


def test_every_module_the_docs_name_resolves():
    refs = sorted({(doc, m[1]) for doc, span in _spans() if (m := MODULE_REF.match(span))})
    assert len(refs) > 20
    wrong = [
        f"{doc}: `{ref}` names no module or attribute" for doc, ref in refs if not _resolves(ref)
    ]
    assert not wrong, wrong
