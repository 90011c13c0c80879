"""One run per directory: an OS lock on ``train.out_dir/run.lock`` held for the run's whole life.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a file inside the run directory, taken by the main process
before anything in the directory is read, deleted or written. The holder writes its pid, host and start
time into the file, so a second run on the same directory is refused in one line naming them. The
operating system drops the lock when the holding process ends however it ends (a SIGKILL, an OOM
kill, a node reboot of a local disk), so a stale ``run.lock`` left by a killed run never blocks a
resume: the next run takes the lock and rewrites the file. The file is deleted only by the call that
created it, when the run is then refused (:meth:`RunLock.discard`: a refused run leaves a user's folder as
it was), and only while still held; a process that locked a file since unlinked (or replaced) tries again, so
two runs never hold two files of the same name. ``run.lock`` is opened without following a symbolic link,
and anything there but a regular file, or a file holding anything but a run's holder record (or nothing), is
refused (never written through, never overwritten).

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
import stat
from pathlib import Path

from tandem_rlvr.errors import TandemError

log = logging.getLogger(__name__)

LOCK_NAME = "run.lock"
HOLDER_KEYS = ("pid", "host", "started")  # what a holder writes into the lock file (and all it may hold)
_HELD: dict[str, list] = {}  # resolved lock path -> [fd, number of RunLock objects sharing it]


class RunLocked(TandemError):
    """Another live process holds the run directory's lock."""


class RunLock:
    """A held run-directory lock; :meth:`release` (or the end of the process) lets it go."""

    def __init__(self, path: Path, created: bool = False):
        self.path, self.created = path, created  # created: this acquire made the lock file
        self._key: str | None = _key(path)

    def discard(self) -> None:
        """Release, deleting the lock file first (while still held) if this acquire created it and no other
        :class:`RunLock` of this process shares it: a refused run leaves no ``run.lock`` behind."""
        held = _HELD.get(self._key) if self._key is not None else None
        if self.created and held is not None and held[1] == 1:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.release()

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
    key = _key(path)
    if key in _HELD:  # this process holds it already
        _HELD[key][1] += 1
        return RunLock(path)
    for _ in range(10):  # again only if the file was unlinked or replaced between opening and locking it
        fd, created = _open_lock_file(path, what, option)
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
        if _still_at(fd, path):
            break
        os.close(fd)
    else:
        raise TandemError(f"could not lock {path}: the file kept being replaced; choose another {option}")
    if not created and not _holder_record(fd):
        os.close(fd)
        raise _not_ours(path, what, option, "its text is not a run's holder record")
    try:
        _write_holder(fd)
    except BaseException:
        os.close(fd)
        raise
    _HELD[key] = [fd, 1]
    return RunLock(path, created)


def _open_lock_file(path: Path, what: str, option: str) -> tuple[int, bool]:
    """Open (or create: then ``True``) the lock file, never through a symbolic link; anything but a regular file
    there is refused in one line, untouched."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        pass
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:  # removed since: create it
        return _open_lock_file(path, what, option)
    except OSError as e:  # ELOOP: a symbolic link; EISDIR: a folder
        fd, why = None, "a symbolic link" if e.errno == errno.ELOOP else e.strerror
    if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
        return fd, False
    if fd is not None:
        os.close(fd)
        why = "not a regular file"
    raise _not_ours(path, what, option, why)


def _not_ours(path: Path, what: str, option: str, why: str) -> TandemError:
    return TandemError(f"{what} directory {str(path.parent)!r} holds {path.name!r}, which is not a lock file a {what} "
                       f"wrote ({why}): move it away or choose another {option} (nothing was changed)")


def _holder_record(fd: int) -> bool:
    """The existing lock file holds what :func:`_write_holder` writes, or nothing (a run killed between creating
    the file and writing it): only then is it ours to rewrite; a user's own ``run.lock`` is never overwritten."""
    data = os.pread(fd, 4097, 0)
    if not data.strip():
        return True
    try:
        info = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(info, dict) and set(info) == set(HOLDER_KEYS)


def _still_at(fd: int, path: Path) -> bool:
    """The locked file is still the one at ``path`` (not unlinked by a refused run that created it)."""
    try:
        st, at = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (at.st_dev, at.st_ino)


def _key(path: Path) -> str:
    """The lock file's key in :data:`_HELD`: its folder resolved (never following ``run.lock`` itself)."""
    return str(path.parent.resolve() / path.name)


def _write_holder(fd: int) -> None:
    """Replace the lock file's contents (in place: the locked file must stay the same file) with who holds it."""
    info = dict(zip(HOLDER_KEYS, (os.getpid(), socket.gethostname(),
                                  datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))))
    data = (json.dumps(info) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    with contextlib.suppress(OSError):
        os.fsync(fd)
