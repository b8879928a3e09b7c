"""Real log lines from public bug reports (tests/corpus/*.yaml) through catalogue and attribution.

Each line is attributed alone, as the only evidence of a diagnosis: a job-log or kernel-log line
(`log`), with the job's Slurm state where the entry gives one (benign lines run in a RUNNING job).
The predicted role is the strongest role among the symptoms the line produced (initiating >
cascade > none = benign). Accuracy per family and every miss are printed (`pytest -s`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import catalogue
from recovery import attribution
from recovery.evidence import Bundle, Report, Series, SlurmFacts
from tests.unit.test_attribution_rules import _ctx, _line

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
# Issue 16's target: 98 % of the lines get the right outcome and the right role (on the code
# before issue 16: 0.607 and 0.625 on 331 lines).
MIN_OUTCOME_ACCURACY = 0.98
MIN_ROLE_ACCURACY = 0.98
# The size targets for the corpus itself.
MIN_LINES, MIN_FAMILIES, MIN_LOOKALIKES = 300, 12, 60


class Slurm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: str = Field(pattern=r"^[A-Z_]+$")
    exit_code: int | None = None


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    line: str = Field(min_length=1, max_length=4000)
    log: Literal["job", "kernel"]
    source: str = Field(pattern=r"^https?://\S+$")
    outcome: str
    role: Literal["initiating", "cascade", "benign"]
    lookalike: bool = False  # looks like a failure, is not one (or not the cluster's)
    node: str | None = None
    rank: int | None = None
    slurm: Slurm | None = None
    note: str = ""
    redacted: str = ""  # what was replaced by a placeholder (host names, addresses)

    @field_validator("outcome")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in catalogue.outcomes():
            raise ValueError(f"unknown outcome {v!r}")
        return v


class CorpusFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    family: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str
    entries: list[Entry] = Field(min_length=1)


def load_corpus(directory: Path = CORPUS) -> dict[str, CorpusFile]:
    out = {}
    for path in sorted(directory.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        try:
            doc = CorpusFile.model_validate(data)
        except ValidationError as exc:
            where = []
            for err in exc.errors():
                loc = err["loc"]
                if len(loc) >= 2 and loc[0] == "entries" and isinstance(loc[1], int):
                    line = str(data["entries"][loc[1]].get("line", ""))[:60]
                    where.append(f"entry {loc[1]} ({line!r}): {err['msg']} at {loc[2:]}")
                else:
                    where.append(f"{loc}: {err['msg']}")
            raise AssertionError(f"{path.name}: " + "; ".join(where)) from None
        out[path.name] = doc
    return out


def predict(e: Entry) -> tuple[str, str, dict]:
    """(outcome, role, diagnosis) for the entry's line as the only evidence."""
    node = e.node if e.log == "kernel" else None  # a kernel log is read per node
    slurm = e.slurm or (Slurm(state="RUNNING") if e.role == "benign" else None)
    facts = SlurmFacts()
    if slurm:
        facts = SlurmFacts(
            job={"job_id": "12", "state": slurm.state, "exit_code": slurm.exit_code},
            query="scontrol show job 12",
        )
    # the job was training (its iteration counter advancing): the line alone must decide
    progress = Series("goodput_job_iteration", [(0.0, 100.0), (60.0, 160.0)], job_id="12")
    bundle = Bundle(
        lines=[_line(e.line, e.log, node)],
        series=[progress],
        slurm=facts,
        reports=[Report("logs", "ok"), Report("prometheus", "ok"), Report("slurm", "ok")],
    )
    doc = attribution.attribute(bundle, _ctx())
    roles = {s["role"] for s in doc["symptoms"] if s["source"] == "log"}
    role = "initiating" if "initiating" in roles else "cascade" if "cascade" in roles else "benign"
    return doc["outcome"], role, doc


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_corpus_is_valid_and_large_enough(corpus):
    entries = [e for f in corpus.values() for e in f.entries]
    families = {f.family for f in corpus.values()}
    assert len(families) == len(corpus), "one file per family"
    assert len(entries) >= MIN_LINES and len(families) >= MIN_FAMILIES
    assert sum(e.lookalike for e in entries) >= MIN_LOOKALIKES
    lines = Counter((e.line, e.log) for e in entries)
    assert not [k for k, n in lines.items() if n > 1], "a line is listed twice"
    for e in entries:
        assert (e.role == "benign") == (e.outcome == "healthy"), (e.line, "benign <=> healthy")


def test_catalogue_matches_without_error(corpus):
    """Every line goes through the shared matcher of its source; rank where the line names it."""
    ranks = seen = 0
    for f in corpus.values():
        for e in f.entries:
            matches = catalogue.match_line(e.line, e.log)
            if e.rank is not None:
                seen += 1
                ranks += any(m.groups.get("rank") == e.rank for m in matches)
    print(f"\ncatalogue: rank found for {ranks}/{seen} lines that name one")


def test_attribution_accuracy(corpus):
    total = Counter()
    good_outcome = Counter()
    good_role = Counter()
    misses = []
    for name, f in corpus.items():
        for e in f.entries:
            outcome, role, _ = predict(e)
            total[f.family] += 1
            good_outcome[f.family] += outcome == e.outcome
            good_role[f.family] += role == e.role
            if outcome != e.outcome or role != e.role:
                misses.append(
                    f"  {name}: want {e.outcome}/{e.role}, got {outcome}/{role}: {e.line[:150]}"
                )
    n = sum(total.values())
    print(f"\ncorpus: {n} lines, {len(total)} families")
    for fam in sorted(total):
        t = total[fam]
        print(
            f"  {fam:12s} {t:4d} lines  outcome {good_outcome[fam] / t:6.1%}"
            f"  role {good_role[fam] / t:6.1%}"
        )
    outcome_acc = sum(good_outcome.values()) / n
    role_acc = sum(good_role.values()) / n
    print(f"  {'all':12s} {n:4d} lines  outcome {outcome_acc:6.1%}  role {role_acc:6.1%}")
    print(f"misses ({len(misses)}):\n" + "\n".join(misses))
    assert outcome_acc >= MIN_OUTCOME_ACCURACY
    assert role_acc >= MIN_ROLE_ACCURACY


def test_schema_errors_name_file_and_entry(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text(
        "family: x\ndescription: d\nentries:\n"
        "  - {line: 'a', log: job, source: 'https://e.org/1', outcome: healthy, role: benign}\n"
        "  - {line: 'boom', log: dmesg, source: 'https://e.org/1', outcome: nope, role: benign,"
        " colour: red}\n"
    )
    with pytest.raises(AssertionError) as info:
        load_corpus(tmp_path)
    text = str(info.value)
    assert "x.yaml" in text and "entry 1 ('boom')" in text
    assert "colour" in text and "log" in text and "unknown outcome" in text
