"""`settings.read_secret` keeps a credential while its file is unchanged and reads it again
as soon as it changes: rewritten in place, replaced by a rename, removed, emptied."""

from __future__ import annotations

import os

from recovery import settings
from recovery.settings import read_secret


def age(path, seconds=10.0):
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - int(seconds * 1e9)))


def test_a_changed_file_is_read_again(tmp_path):
    p = tmp_path / "token"
    p.write_text("first-token\n")
    age(p)
    assert read_secret(str(p)) == "first-token"
    assert str(p) in settings._SECRETS  # an unchanged, settled file is kept
    p.write_text("other-token\n")  # in place, the same size
    assert read_secret(str(p)) == "other-token"
    new = tmp_path / "token.new"
    new.write_text("third-token")
    age(new)
    new.replace(p)  # rotated by a rename (a Kubernetes secret's symlink swap is the same)
    assert read_secret(str(p)) == "third-token"
    p.write_text("  \n")
    assert read_secret(str(p)) is None
    p.unlink()
    assert read_secret(str(p)) is None and str(p) not in settings._SECRETS
    assert read_secret(None) is None and read_secret("") is None


def test_a_file_written_this_second_is_not_kept(tmp_path):
    """Two writes of the same size within one clock tick share an mtime: not cached yet."""
    p = tmp_path / "token"
    p.write_text("aaaa")
    assert read_secret(str(p)) == "aaaa"
    assert str(p) not in settings._SECRETS
    p.write_text("bbbb")
    assert read_secret(str(p)) == "bbbb"


def test_a_kept_secret_is_not_read_from_disk(tmp_path, monkeypatch):
    p = tmp_path / "token"
    p.write_text("kept")
    age(p)
    assert read_secret(str(p)) == "kept"
    monkeypatch.setattr(settings.Path, "read_text", lambda self: "read again")
    assert read_secret(str(p)) == "kept"
