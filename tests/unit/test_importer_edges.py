"""exporters.importer at its edges: the ISO times it writes in front of kernel lines read back
to the millisecond, and any journalctl -o json record is read or refused with its file and line
(never a traceback)."""

from __future__ import annotations

import json

import pytest

from catalogue import logtime
from exporters import importer

T = 1_700_000_000.0


@pytest.mark.parametrize("frac", [0.0, 0.0004, 0.4996, 0.9994, 0.9995, 0.9996, 0.9999999])
def test_the_written_time_reads_back_to_the_millisecond(frac):
    # ms was rounded on its own: x.9996 s became "...:20.1000Z", read back 0.9 s early
    written = importer.iso_utc(T + frac)
    back = logtime.parse(f"{written} kernel: x", T).time
    assert back == pytest.approx(T + frac, abs=0.0005), written


def _journal(**doc) -> str:
    return json.dumps({"__REALTIME_TIMESTAMP": str(int(T * 1e6)), **doc})


def test_journal_records_are_read():
    lines, kinds = importer.kernel_lines(
        [_journal(MESSAGE="NVRM: Xid 79"), _journal(MESSAGE=list(b"bad \xff byte"))], "k.log", T
    )
    assert lines[0].endswith(" NVRM: Xid 79") and lines[1].endswith("bad \ufffd byte")
    assert kinds == {"iso": 2}


@pytest.mark.parametrize(
    "record",
    [
        _journal(MESSAGE=[300, 1]),  # not bytes
        _journal(MESSAGE=["a"]),
        _journal(MESSAGE={"a": 1}),
        json.dumps({"__REALTIME_TIMESTAMP": "9" * 25, "MESSAGE": "x"}),  # beyond any calendar
        json.dumps({"__REALTIME_TIMESTAMP": "-5", "MESSAGE": "x"}),
    ],
)
def test_a_bad_journal_record_is_refused_with_its_place(record):
    with pytest.raises(importer.ImportFailure, match=r"k\.log:1: not a journalctl -o json record"):
        importer.kernel_lines([record], "k.log", T)


def _sacct(**job) -> str:
    return json.dumps({"jobs": [{"job_id": 4242, "state": {"current": ["FAILED"]}, **job}]})


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"jobs": [1, 2]}', "'jobs' holds 1: want job objects"),
        (_sacct(time={"start": "abc"}), 'time.start "abc": want unix seconds'),
        (_sacct(time={"end": 1e400}), "time.end Infinity: want unix seconds"),
        (_sacct(time={"start": -5}), "time.start -5: want unix seconds"),
        (_sacct(exit_code="bad"), 'exit_code "bad": want a whole number'),
        (_sacct(exit_code={"signal": {"id": "x"}}), 'exit_code.signal.id "x": want a signal'),
        (_sacct(restart_cnt=[1]), "restart_cnt [1]: want a count"),
        (_sacct(nodes="gpu[3-1]"), "nodes: hostlist item 'gpu[3-1]': range '3-1' runs backwards"),
        ("JobId=4242 JobState=FAILED NodeList=gpu[3-1]", "NodeList: hostlist item 'gpu[3-1]'"),
        ("JobId=4242 JobState=FAILED NodeList=gpu[1-", "NodeList: hostlist 'gpu[1-': unbalanced"),
        ("JobId=4242 JobState=FAILED NodeList=gpu[0-99999999]", "NodeList: hostlist expands to"),
        ("JobId=4242 JobState=FAILED StartTime=1e999", "start='1e999': want unix seconds"),
        ("JobId=4242 JobState=FAILED StartTime=nan", "start='nan': want unix seconds"),
        ("JobId=4242 JobState=FAILED EndTime=-5", "end='-5': want unix seconds"),
    ],
)
@pytest.mark.parametrize("job_id", [None, "4242"])
def test_a_bad_slurm_value_is_refused_naming_the_field(text, error, job_id):
    """Each crashed the import with a traceback (ValueError, TypeError, OverflowError from a
    hostlist, float(), int() or the ISO time written later) or, for a negative time, was kept."""
    with pytest.raises(importer.ImportFailure) as exc:
        importer.slurm_state(text, "j.json", job_id)
    assert str(exc.value).startswith(f"j.json: {error}"), exc.value


def test_slurm_json_numbers_of_23_02_and_a_list_of_nodes_are_read():
    got = importer.slurm_state(
        _sacct(nodes=["gn1", "gn2"], time={"start": {"set": True, "number": 100}, "end": 200}),
        "j.json",
    )
    assert (got["nodes"], got["start"], got["end"]) == (["gn1", "gn2"], 100.0, 200.0)
