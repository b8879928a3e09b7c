"""The tailer loses no good line: rotation, truncation, partial writes, garbage, huge lines."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exporters.logmetrics.tailer import DirectoryFollower, Follower


def write(path: Path, data: bytes, mode: str = "ab") -> None:
    with open(path, mode) as fh:
        fh.write(data)


def test_partial_lines_are_held_until_their_newline(tmp_path):
    p = tmp_path / "a.log"
    write(p, b"one\ntw")
    f = Follower(p)
    assert f.poll() == ["one"]
    write(p, b"o\nthr")
    assert f.poll() == ["two"]
    assert f.poll() == []
    write(p, b"ee\n")
    assert f.poll() == ["three"]


def test_rotation_by_rename_reads_the_old_file_to_its_end(tmp_path):
    p = tmp_path / "a.log"
    write(p, b"1\n2\n")
    f = Follower(p)
    assert f.poll() == ["1", "2"]
    write(p, b"3\n4-partial")  # written, not yet read, then rotated
    os.rename(p, tmp_path / "a.log.1")
    write(p, b"5\n", "wb")
    assert f.poll() == ["3", "4-partial", "5"]
    assert f.stats.rotations == 1


def test_copy_truncate_starts_again_from_the_top(tmp_path):
    p = tmp_path / "a.log"
    write(p, b"first line that is long\nsecond\n")
    f = Follower(p)
    assert f.poll() == ["first line that is long", "second"]
    write(p, b"", "wb")  # truncate
    write(p, b"after\n")
    assert f.poll() == ["after"]
    assert f.stats.truncations == 1


def test_garbage_and_nuls_do_not_hide_good_lines(tmp_path):
    p = tmp_path / "a.log"
    write(p, b"\xff\xfe\x00\x00bin\x80ary\r\nCUDA error: out of memory\n\x00\x00\x00good\n")
    lines = Follower(p).poll()
    assert lines[1:] == ["CUDA error: out of memory", "good"]
    assert "\x00" not in lines[0] and "bin" in lines[0]


def test_huge_line_is_cut_and_neighbours_survive(tmp_path):
    p = tmp_path / "a.log"
    f = Follower(p, max_line_bytes=1000)
    write(p, b"before\n" + b"x" * 3000)
    assert f.poll() == ["before", "x" * 1000]  # head emitted once the limit is passed
    write(p, b"y" * 5000 + b"\nafter\n")
    assert f.poll() == ["after"]
    write(p, b"z" * 1500 + b"\nlast\n")  # huge line arriving in one chunk
    assert f.poll() == ["z" * 1000, "last"]
    assert f.stats.truncated_lines == 2


def test_removed_file_emits_its_partial_line(tmp_path):
    d = DirectoryFollower(tmp_path, "*.log")
    p = tmp_path / "n.log"
    write(p, b"a\nb-no-newline")
    assert d.poll() == [(p, ["a"])]
    p.unlink()
    assert d.poll() == [(p, ["b-no-newline"])]
    assert d.followers == {}
    assert d.retired.lines == 2


def test_from_end_skips_the_backlog_only(tmp_path):
    p = tmp_path / "a.log"
    write(p, b"old\n")
    f = Follower(p, from_end=True)
    assert f.poll() == []
    write(p, b"new\n")
    assert f.poll() == ["new"]


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(
        st.text(
            st.characters(blacklist_characters="\n\r\x00", blacklist_categories=("Cs",)),
            max_size=40,
        ),
        max_size=30,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
    rotate_at=st.integers(min_value=0, max_value=30),
    eol=st.sampled_from(["\n", "\r\n", "\r"]),
)
def test_any_chunking_and_rotation_loses_no_line(tmp_path_factory, lines, cuts, rotate_at, eol):
    """Whatever the chunks, a rotation, and the line ends (\n, \r\n, or a progress bar's
    \r): every line once (a blank one, where \r ends lines, carries nothing and is not one)."""
    d = tmp_path_factory.mktemp("t")
    p = d / "a.log"
    p.write_bytes(b"")
    f = Follower(p)
    assert f.poll() == []
    data_old = "".join(f"{ln}{eol}" for ln in lines[:rotate_at]).encode()
    data_new = "".join(f"{ln}{eol}" for ln in lines[rotate_at:]).encode()
    got: list[str] = []
    pos = 0
    for cut in sorted(c % (len(data_old) + 1) for c in cuts):
        write(p, data_old[pos:cut])
        pos = cut
        got += f.poll()
    write(p, data_old[pos:])
    os.rename(p, d / "a.log.1")
    write(p, data_new, "wb")
    got += f.poll()
    assert got == (lines if eol == "\n" else [ln for ln in lines if ln])


def test_a_progress_bar_rewritten_with_carriage_returns_is_one_line_per_update(tmp_path):
    """tqdm in a job's output file (Lightning, Hugging Face): each update rewrites the line
    after a \r, and only the bar's end has a \n. Failed before: the updates were one line,
    held until the bar ended (or cut at 64 KiB), so the job's progress was never seen."""
    p = tmp_path / "slurm-7.out"
    bar = "Epoch 0:   7%|▋         | {}/14 [00:00<00:04,  2.61it/s, loss=-6.21, v_num=655642]"
    write(p, ("\r" + bar.format(1) + "\r" + bar.format(2)).encode())
    f = Follower(p)
    assert f.poll() == [bar.format(1)]  # the latest update is held until the next \r
    write(p, ("\r" + bar.format(3) + "\nTraining done\r\n").encode())
    assert f.poll() == [bar.format(2), bar.format(3), "Training done"]


def test_a_link_or_a_fifo_is_never_opened(tmp_path):
    """A job's user owns its log directory: a link to another file would be shipped as its
    output, and opening a FIFO blocked the exporter and the shipper for good."""
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0\n")
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "slurm-9.out").symlink_to(secret)
    os.mkfifo(jobs / "slurm-8.out")
    (jobs / "slurm-7.out").write_text("a real line\n")
    d = DirectoryFollower(jobs, "slurm-*.out")
    got = dict(d.poll())
    assert {p.name: lines for p, lines in got.items() if lines} == {"slurm-7.out": ["a real line"]}
    d.poll()
    errors = {p.name: f.stats.read_errors for p, f in d.followers.items()}
    assert errors == {"slurm-9.out": 1, "slurm-8.out": 1, "slurm-7.out": 0}  # counted once


def test_a_recording_copies_no_link_from_the_log_directory(tmp_path):
    """`goodput export-recording` copied `slurm-9.out -> /etc/...` into the recording."""
    from detector.export import _copy_logs

    src, dst = tmp_path / "logs", tmp_path / "rec"
    (src / "jobs").mkdir(parents=True)
    (src / "kernel").mkdir()
    (tmp_path / "secret.txt").write_text("root:x:0:0\n")
    (src / "jobs" / "slurm-9.out").symlink_to(tmp_path / "secret.txt")
    (src / "kernel" / "node1.log").write_text("a kernel line\n")
    os.mkfifo(src / "kernel" / "node2.log")
    _copy_logs(src, dst, "9", ["node1", "node2", "node3"])
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()) == [
        "kernel/node1.log"
    ]


def test_a_followed_file_replaced_by_a_link_is_read_to_its_end_and_closed(tmp_path):
    log, other = tmp_path / "slurm-1.out", tmp_path / "other.txt"
    other.write_text("not the job's\n")
    log.write_text("line 1\n")
    f = Follower(log)
    assert f.poll() == ["line 1"]
    with open(log, "a") as fh:
        fh.write("line 2\npartial")
    log.rename(tmp_path / "old.out")
    log.symlink_to(other)
    assert f.poll() == ["line 2", "partial"] and f._fh is None
    assert f.poll() == [] and f.stats.read_errors == 1
    log.unlink()
    log.write_text("a new run\n")
    assert f.poll() == ["a new run"]
    log.unlink()
    os.mkfifo(log)
    assert f.poll() == [] and f.stats.read_errors == 2  # a later refusal counts again
