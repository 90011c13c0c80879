"""One run per directory: an OS lock on ``train.out_dir/run.lock`` held for the run's whole life.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a file inside the run directory, taken by the main process
before anything in the directory is read, deleted or written. The holder writes its pid, host and start
time into the file, so a second run on the same directory is refused in one line naming them. The
operating system drops the lock when the holding process ends however it ends (a SIGKILL, an OOM
kill, a node reboot of a local disk), so a stale ``run.lock`` left by a killed run never blocks a
resume: the next run takes the lock and rewrites the file. The file itself is never deleted (deleting
a held lock file would let a second run lock a new file of the same name).

The descriptor is not inherited by the processes a run starts (``os.open`` makes it close-on-exec; the
verifier workers and the demo's jobs are started by exec), so a killed run's children cannot keep its lock.
Within one process the lock is shared: a library caller that builds a second run on a directory its
own process already holds (after a failed run, say) reuses the lock instead of refusing itself.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

from tandem_rlvr.errors import TandemError

log = logging.getLogger(__name__)

LOCK_NAME = "run.lock"
_HELD: dict[str, list] = {}  # resolved lock path -> [fd, number of RunLock objects sharing it]


class RunLocked(TandemError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """A held run-directory lock; :meth:`release` (or the end of the process) lets it go."""

    def __init__(self, path: Path):
        self.path = path
        self._key: str | None = str(path.resolve())

    def release(self) -> None:
        """Let the lock go (once; the file stays). Idempotent."""
        key, self._key = self._key, None
        if key is None or key not in _HELD:
            return
        held = _HELD[key]
        held[1] -= 1
        if held[1] <= 0:
            del _HELD[key]
            with contextlib.suppress(OSError):
                os.close(held[0])  # closing the descriptor drops the flock

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter exit the module globals may be gone already
            self.release()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holder(path: Path) -> str:
    """Who holds (or last held) the lock file ``path``, in words."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its name yet"


def acquire(run_dir: str | Path, *, what: str = "run", option: str = "train.out_dir") -> RunLock:
    """Take the lock of ``run_dir`` (created if needed) without waiting; :class:`RunLocked` naming the holder
    if another live process has it (in the words of the caller: ``what`` it is, the ``option`` that names it)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    key = str(path.resolve())
    if key in _HELD:  # this process holds it already
        _HELD[key][1] += 1
        return RunLock(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunLocked(f"{what} directory {str(run_dir)!r} is in use by another {what} ({holder(path)}; lock "
                            f"file {path}): wait for it to end, stop it, or choose another {option}") from None
        log.warning("could not lock %s (%s): this file system has no locks; nothing stops a second run on %s",
                    path, e.strerror, run_dir)
        return RunLock(path)
    try:
        _write_holder(fd)
    except BaseException:
        os.close(fd)
        raise
    _HELD[key] = [fd, 1]
    return RunLock(path)


def _write_holder(fd: int) -> None:
    """Replace the lock file's contents (in place: the locked file must stay the same file) with who holds it."""
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    data = (json.dumps(info) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    with contextlib.suppress(OSError):
        os.fsync(fd)
