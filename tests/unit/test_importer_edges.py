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
