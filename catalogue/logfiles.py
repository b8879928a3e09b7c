"""Opening a log file in a directory a job's user can write to (`<log_dir>/jobs`: Slurm writes a
job's output as its user): only a regular file, never through a symbolic link (`ln -s
/etc/shadow slurm-9.out` would ship the file as job 9's output), never blocking on a FIFO (a
`mkfifo slurm-5.out` stopped every reader). One rule for the log-metrics exporter, the Loki
shipper, the receiver's log evidence and `goodput export-recording`. `unreadable` says why a
path given for a file to read is none (the commands' and the sample reader's one wording).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def unreadable(path: Path) -> str | None:
    """Why `path` is not a file to read ('is a directory', 'no such file'), or None."""
    if path.is_file():
        return None
    return "is a directory" if path.is_dir() else "no such file"


def regular(st: os.stat_result) -> bool:
    """An `os.lstat` result of a plain file (not a link, FIFO, socket or device)."""
    return stat.S_ISREG(st.st_mode)


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading in binary; OSError when it is a link or not a regular file."""
    fd = os.open(path, _FLAGS)
    try:
        if not regular(os.fstat(fd)):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
