"""Follow log files like `tail -F`, losing no complete line.

`Follower` follows one path: it survives rotation (rename + new file: the old file is read to
its end first), copy-truncation (the file shrinks: read again from the start), partial lines
(held until their newline arrives, or emitted when the file goes away), progress bars that
rewrite their line with a carriage return (each update is a line; `\r\n` ends one), binary garbage
(decoded with replacement characters, NULs dropped) and huge lines (cut at `max_line_bytes`;
the rest of that line is skipped and counted). `DirectoryFollower` keeps one `Follower` per file
matching a glob and drops those whose file is gone. Only regular files are read, never through
a link (`catalogue.logfiles`). `resume` starts a follower where an earlier
run left off (`position()`: the file's (device, inode), the offset of the first unread line and
a fingerprint of the content read), when it is still the same file, not shorter than that, and
its fingerprint still matches; otherwise the file is read from its start (or its end, with
`from_end`). The fingerprint hashes the file's first min(offset, 1 KiB) bytes and the up to
1 KiB just before the offset: copy-truncation keeps the inode, so a file truncated and grown
past the saved offset again before a restart is told apart by its content (a resume without a
fingerprint, from an older positions file, is trusted as before). While following, the same
bytes (its start and those just before the read offset) are compared again whenever the file's
size or mtime changed, so a truncation and regrowth between two polls is read from the start too.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from catalogue import logfiles

READ_CHUNK = 1 << 20
MAX_LINE_BYTES = 64 * 1024
# a line ends at \n or at \r: a progress bar (tqdm) rewrites its line with \r, so each update
# is a line (a \r\n ends one line)
_EOL = re.compile(rb"[\r\n]")
FINGERPRINT_BYTES = 1024  # of the file's start, and just before the offset
# (device, inode), offset of the first unread line, fingerprint (None: not checked)
Position = tuple[tuple[int, int], int, str | None]


@dataclass
class TailStats:
    lines: int = 0
    bytes: int = 0
    truncated_lines: int = 0  # huge lines cut at max_line_bytes
    rotations: int = 0
    truncations: int = 0
    read_errors: int = 0

    def add(self, more: TailStats) -> None:
        for name, value in vars(more).items():
            setattr(self, name, getattr(self, name) + value)


def _decode(raw: bytes) -> str:
    if b"\x00" in raw:
        raw = raw.replace(b"\x00", b"")
    return raw.decode("utf-8", errors="replace").rstrip("\r")


@dataclass
class Follower:
    """Follows one file; `poll()` returns the complete lines written since the last call."""

    path: Path
    from_end: bool = False
    max_line_bytes: int = MAX_LINE_BYTES
    max_read_bytes: int = 8 * READ_CHUNK  # per poll, so one busy file cannot starve the others
    stats: TailStats = field(default_factory=TailStats)
    resume: Position | tuple[tuple[int, int], int] | None = None
    _fh: object = None
    _ino: tuple[int, int] | None = None
    _pos: int = 0
    _partial: bytearray = field(default_factory=bytearray)
    _skipping: bool = False  # inside a huge line, dropping bytes until its newline
    _after_cr: bool = False  # the last line ended at a \r (a \n right after it ends nothing)
    _refused: bool = False  # a link, FIFO or device at the path: never opened
    _head: bytes = b""  # the file's first min(FINGERPRINT_BYTES, _pos) bytes
    _recent: bytes = b""  # up to FINGERPRINT_BYTES bytes just before _pos
    _before: bytes = b""  # up to FINGERPRINT_BYTES bytes just before the first unread line
    _seen: tuple[int, int] | None = None  # (size, mtime) when the content was last checked

    def poll(self) -> list[str]:
        out: list[str] = []
        try:
            st = os.lstat(self.path)  # a link is not followed: the file is its user's
        except FileNotFoundError:
            st = None
        except OSError:
            self.stats.read_errors += 1
            return out
        if st is not None and not logfiles.regular(st):
            if self._fh is not None:  # the file followed was replaced by one: finish it
                out.extend(self._read_all())
                out.extend(self._flush_partial())
                self._close()
            self.stats.read_errors += int(not self._refused)  # counted once while it lasts
            self._refused = True
            return out
        self._refused = False
        ident = (st.st_dev, st.st_ino) if st else None
        if self._fh is not None and ident != self._ino:
            # rotated or removed: finish the old file, then start on the new one
            out.extend(self._read_all())
            out.extend(self._flush_partial())
            self._close()
            self.stats.rotations += 1
        if self._fh is None:
            if st is None:
                return out
            try:
                self._fh = logfiles.open_regular(self.path)  # kept open across polls
            except OSError:
                self.stats.read_errors += 1
                return out
            self._ino = ident
            start = st.st_size if (self.from_end and self.stats.bytes == 0) else 0
            resume, self.resume = self.resume, None
            if resume and resume[0] == ident and resume[1] <= st.st_size:
                self._start_at(resume[1])
                fingerprint = resume[2] if len(resume) > 2 else None  # type: ignore[misc]
                if fingerprint is None or fingerprint == self._fingerprint():
                    start = self._pos
                else:  # the same inode with other content: truncated and written again
                    self.stats.truncations += 1
                    start = 0
            self._start_at(start)
            self._seen = (st.st_size, st.st_mtime_ns)
            self.from_end = False
        elif st is not None and (st.st_size < self._pos or self._rewritten(st)):
            # copy-truncate: whatever partial line we held is all we will see of it
            out.extend(self._flush_partial())
            self._start_at(0)
            self.stats.truncations += 1
        out.extend(self._read_all())
        return out

    def position(self) -> Position | None:
        """(device, inode), offset of the first line not yet returned and the fingerprint of
        the bytes before it, or None."""
        if self._ino is None:
            return None
        return self._ino, self._pos - len(self._partial), self._fingerprint()

    def _fingerprint(self) -> str:
        offset = self._pos - len(self._partial)
        h = hashlib.blake2b(self._head[: min(FINGERPRINT_BYTES, offset)], digest_size=16)
        h.update(self._before)
        return h.hexdigest()

    def _pread(self, offset: int, size: int) -> bytes:
        try:
            return os.pread(self._fh.fileno(), size, offset)  # type: ignore[attr-defined]
        except OSError:
            self.stats.read_errors += 1
            return b""

    def _start_at(self, pos: int) -> None:
        """Read on from `pos` (a line's start) of the open file."""
        self._pos = pos
        self._head = self._pread(0, min(FINGERPRINT_BYTES, pos)) if pos else b""
        n = min(FINGERPRINT_BYTES, pos)
        self._recent = self._before = self._pread(pos - n, n) if n else b""

    def _rewritten(self, st: os.stat_result) -> bool:
        """The file changed since the last look and the bytes read no longer are where they
        were: truncated and written again (at least up to where we were) between two polls."""
        seen = (st.st_size, st.st_mtime_ns)
        if seen == self._seen:
            return False
        self._seen = seen
        errors = self.stats.read_errors
        n = len(self._recent)
        head = self._pread(0, len(self._head)) if self._head else b""
        recent = self._pread(self._pos - n, n) if n else b""
        if self.stats.read_errors != errors:  # unknown: read on rather than read it all again
            return False
        return head != self._head or recent != self._recent

    def close(self) -> list[str]:
        """Read what is left, emit any partial line, and close."""
        out = self._read_all() + self._flush_partial() if self._fh is not None else []
        self._close()
        return out

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()  # type: ignore[attr-defined]
        self._fh = None
        self._ino = None
        self._pos = 0
        self._head = self._recent = self._before = b""
        self._seen = None

    def _read_all(self) -> list[str]:
        out: list[str] = []
        budget = self.max_read_bytes
        fh = self._fh
        while budget > 0 and fh is not None:
            try:
                fh.seek(self._pos)  # type: ignore[attr-defined]
                chunk = fh.read(min(READ_CHUNK, budget))  # type: ignore[attr-defined]
            except OSError:
                self.stats.read_errors += 1
                break
            if not chunk:
                break
            start, first_unread = self._pos, self._pos - len(self._partial)
            self._pos += len(chunk)
            budget -= len(chunk)
            self.stats.bytes += len(chunk)
            out.extend(self._split(chunk))
            self._track(chunk, start, first_unread)
        return out

    def _track(self, chunk: bytes, start: int, first_unread: int) -> None:
        """Keep the bytes the fingerprint needs after reading `chunk` from `start`."""
        n = FINGERPRINT_BYTES
        if start < n:
            self._head += chunk[: n - start]
        recent, self._recent = self._recent, (self._recent + chunk[-n:])[-n:]
        rel = self._pos - len(self._partial) - start  # the first unread line, in chunk
        if rel >= n:
            self._before = chunk[rel - n : rel]
        elif rel >= 0 and rel + start != first_unread:
            self._before = (recent + chunk[:rel])[-n:]

    def _split(self, chunk: bytes) -> Iterator[str]:
        start = 0
        while True:
            m = _EOL.search(chunk, start)
            if m is None:
                break
            nl = m.start()
            piece = chunk[start:nl]
            start = nl + 1
            cr = chunk[nl] == 0x0D
            blank = not piece and not self._partial and not self._skipping
            after_cr, self._after_cr = self._after_cr, cr
            if blank and (cr or after_cr):  # a bar's leading \r, or the \n of a \r\n
                continue
            if self._skipping:  # the tail of a huge line whose head was already emitted
                self._skipping = False
                continue
            if self._partial:
                self._partial += piece
                piece = bytes(self._partial)
                self._partial.clear()
            if len(piece) > self.max_line_bytes:
                piece = piece[: self.max_line_bytes]
                self.stats.truncated_lines += 1
            self.stats.lines += 1
            yield _decode(piece)
        rest = chunk[start:]
        if self._skipping or not rest:
            return
        self._partial += rest
        if len(self._partial) > self.max_line_bytes:
            # a huge line: emit its head now, drop the rest up to its newline
            head = bytes(self._partial[: self.max_line_bytes])
            self._partial.clear()
            self._skipping = True
            self.stats.truncated_lines += 1
            self.stats.lines += 1
            yield _decode(head)

    def _flush_partial(self) -> list[str]:
        out = [_decode(bytes(self._partial))] if self._partial else []
        self._partial.clear()
        self._before = self._recent
        self._skipping = False
        self._after_cr = False
        self.stats.lines += len(out)
        return out


class DirectoryFollower:
    """One `Follower` per file in `directory` matching `pattern`; rescans on every poll."""

    def __init__(
        self,
        directory: Path,
        pattern: str,
        from_end: bool = False,
        resume: dict[Path, Position] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.resume = dict(resume or {})
        self.pattern = pattern
        self.from_end = from_end
        self.followers: dict[Path, Follower] = {}
        self.retired = TailStats()  # stats of the followers already dropped
        self.dropped: list[Path] = []  # files that vanished during the last poll

    def poll(self) -> list[tuple[Path, list[str]]]:
        """(path, new lines) per followed file; vanished files are drained and dropped."""
        try:
            present = set(self.directory.glob(self.pattern))
        except OSError:
            present = set()
        for path in present - self.followers.keys():
            self.followers[path] = Follower(
                path, from_end=self.from_end, resume=self.resume.pop(path, None)
            )
        out = []
        self.dropped = []
        for path, follower in list(self.followers.items()):
            lines = follower.poll()
            if path not in present and not path.exists():
                lines += follower.close()
                del self.followers[path]
                self.dropped.append(path)
                self.retired.add(follower.stats)
            if lines:
                out.append((path, lines))
        return out

    def positions(self) -> dict[Path, Position]:
        """Where a later run resumes: each followed file's `position()`, and the saved ones of
        this directory's files present but not yet reopened (`resume`)."""
        now = {}
        for path, follower in self.followers.items():
            pos = follower.position()
            if pos is not None:
                now[path] = pos
        for path, pos in self.resume.items():
            if path not in now and path.parent == self.directory and path.exists():
                now[path] = pos
        return now
