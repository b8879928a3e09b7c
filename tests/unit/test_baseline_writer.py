"""The baseline store's writer thread (the service's): saves are written in the background,
the latest state of a name wins, a save not written yet is what `load` gives, a failed write
is kept in `errors`, `flush` waits for all of it, and no write starts while a caller is busy.
"""

from __future__ import annotations

import json
import threading

from detector.baselines import BaselineStore

KNOWN = {"deviation"}


def state(v: float) -> dict:
    return {"deviation": {"busy_med_": [v]}}


def test_saves_are_written_and_the_latest_wins(tmp_path):
    store = BaselineStore(tmp_path, background=True)
    for v in range(50):
        store.save("train-a", state(float(v)))
        store.save(f"job-{v}", state(float(v)))
    assert store.flush(10.0) and store.pending == 0
    doc = json.loads(store.path("train-a").read_text())
    assert doc["detectors"] == state(49.0)
    assert len(list(tmp_path.glob("*.json"))) == 51 and not list(tmp_path.glob("*.tmp"))
    assert BaselineStore(tmp_path).load("job-7", KNOWN) == state(7.0)


def test_load_gives_a_save_not_written_yet(tmp_path, monkeypatch):
    store = BaselineStore(tmp_path, background=True)
    release, writing = threading.Event(), threading.Event()
    write = store._write

    def slow_write(name, states):
        writing.set()
        release.wait(10.0)
        return write(name, states)

    monkeypatch.setattr(store, "_write", slow_write)
    store.save("train-a", state(1.0))
    assert writing.wait(10.0)
    store.save("train-a", state(2.0))  # while the first is being written
    assert not store.path("train-a").exists()
    assert store.load("train-a", KNOWN) == state(2.0)
    assert not store.flush(0.05)  # still writing
    release.set()
    assert store.flush(10.0)
    assert json.loads(store.path("train-a").read_text())["detectors"] == state(2.0)


def test_a_failed_write_is_kept_in_errors(tmp_path):
    blocked = tmp_path / "baselines"
    blocked.write_text("a file where the directory should be")
    store = BaselineStore(blocked, background=True)
    store.save("train-a", state(1.0))
    assert store.flush(10.0)
    assert len(store.errors) == 1 and "not saved" in store.errors[0]
    store.save("train-b", state(1.0))  # the writer goes on after a failure
    assert store.flush(10.0) and len(store.errors) == 2


def test_errors_are_counted_and_only_the_latest_kept(tmp_path, monkeypatch):
    """A full disk fails every save for hours: the count goes on (the service exports it),
    the texts kept stay bounded, and a write that fails other than with OSError does not
    stop the writer thread (saves piled up unwritten)."""
    store = BaselineStore(tmp_path, background=True)

    def broken(name, states):
        raise TypeError("not serialisable")

    monkeypatch.setattr(store, "_write", broken)
    for i in range(150):
        store.save(f"train-{i}", state(1.0))
    assert store.flush(10.0) and store.pending == 0
    assert store.error_count == 150 and len(store.errors) == 100


def test_without_background_a_save_is_written_at_once(tmp_path):
    store = BaselineStore(tmp_path)
    store.save("train-a", state(3.0))
    assert store.load("train-a", KNOWN) == state(3.0) and store.pending == 0


def test_no_write_starts_while_busy_and_flush_still_writes(tmp_path):
    store = BaselineStore(tmp_path, background=True)
    with store.busy():  # a service cycle: saves are handed over, written after it
        store.save("train-b", state(2.0))
        threading.Event().wait(0.3)  # time enough for a free writer
        assert not store.path("train-b").exists() and store.pending == 1
        assert store.load("train-b", KNOWN) == state(2.0)  # yet the save is what is stored
    assert store.flush(10.0) and store.path("train-b").exists()
    with store.busy():  # flush inside a busy caller writes (no deadlock)
        store.save("train-a", state(1.0))
        assert store.flush(10.0) and store.path("train-a").exists()
