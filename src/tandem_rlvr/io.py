"""Atomic file writes: a temporary name in the same folder, fsync, then rename (and fsync the folder, so the
rename itself survives a power loss: :func:`replace_durably`)."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import tempfile
import threading
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import IO, Any

from tandem_rlvr.errors import DiskFull, TandemError


@contextlib.contextmanager
def atomic_open(path: str | Path, *, binary: bool = False) -> Iterator[IO]:
    """A temporary file next to ``path`` to write into; when the block ends without an error it is fsynced
    and renamed to ``path`` (a reader sees the old file or the new one, never half of one). On an error
    it is removed; a full disk raises :class:`~tandem_rlvr.errors.DiskFull`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, file_mode())  # mkstemp makes 0600 files; give results the usual mode
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        replace_durably(tmp, path)
    except BaseException as e:
        written = Path(tmp).stat().st_size if Path(tmp).exists() else 0
        Path(tmp).unlink(missing_ok=True)
        _raise_if_disk_full(e, path, written, "the previous version of the file is intact")
        raise


def atomic_write(path: str | Path, write: Callable[[IO], None], *, binary: bool = False) -> Path:
    """Call ``write(f)`` on a temporary file next to ``path``, fsync, then rename it to ``path``
    (:func:`atomic_open`): a reader sees the old file or the new one, never half of one."""
    with atomic_open(path, binary=binary) as f:
        write(f)
    return Path(path)


class AtomicJsonl:
    """Stream JSON rows into ``path`` atomically (:func:`atomic_open`): ``with AtomicJsonl(p) as sink:
    sink.write(row)``; readers see the old file or every row, and a full disk raises ``DiskFull``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __enter__(self) -> AtomicJsonl:
        self._open = atomic_open(self.path)
        self.f = self._open.__enter__()
        return self

    def write(self, row: dict) -> None:  # strict JSON, as atomic_write_json (a NaN as null)
        self.f.write(json.dumps(_strict(row), ensure_ascii=False, default=_json_default, allow_nan=False) + "\n")

    def __exit__(self, exc_type, exc, tb) -> bool:
        return bool(self._open.__exit__(exc_type, exc, tb))


def _raise_if_disk_full(e: BaseException, path: Path, written: int, kept: str) -> None:
    if isinstance(e, Exception) and is_disk_full(e, path.parent):
        raise disk_full(e, path, max(written, 1), "file", kept + ", nothing half-written was left") from e


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(text))


_UMASK: list[int] = []  # the process's umask, read once (file_mode)
_UMASK_LOCK = threading.Lock()


def _read_umask() -> int:
    """The process's umask: from ``/proc/self/status`` where the kernel shows it (Linux 4.7+), which changes
    nothing; else by setting and restoring it (once, under :data:`_UMASK_LOCK`)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # a strict mask for the instant it is set: a file made meanwhile is private, not open
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets under the process's umask (0666 & ~umask). The umask is read once, on first use
    under a lock: setting it to read it, on every call, would give a file another thread creates meanwhile the
    wrong mode."""
    if not _UMASK:
        with _UMASK_LOCK:
            if not _UMASK:
                _UMASK.append(_read_umask())
    return 0o666 & ~_UMASK[0]


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented, strict JSON: a non-finite float (NaN, inf; a metric with no data) is
    written as ``null``, which every JSON reader accepts (a bare ``NaN`` is no JSON)."""
    text = json.dumps(_strict(obj), indent=2, sort_keys=False, default=_json_default, allow_nan=False)
    atomic_write_text(path, text + "\n")


def _strict(obj: Any) -> Any:
    """``obj`` with every non-finite float, at any depth of dicts, lists and tuples, as None."""
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return _finite_or_none(obj)


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return _finite_or_none(o.item())
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _finite_or_none(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def append_jsonl(path: str | Path, row: dict) -> None:
    """Append one JSON row and fsync (a crash loses at most the row being written).

    Non-finite floats are written as ``null`` so the file stays strict JSON (jq, pandas)."""
    row = {k: _finite_or_none(v) for k, v in row.items()}
    data = (json.dumps(row, default=_json_default) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, file_mode())
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException as e:  # cut a half-written row off again (a full disk, an interrupt)
            os.ftruncate(fd, size)
            _raise_if_disk_full(e, Path(path), len(data), "the rows before it are intact")
            raise
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL log written by :func:`append_jsonl` (``[]`` if there is none). Only a torn last line (a
    kill mid-append) is dropped; a line that is not a JSON object with more lines after it, bytes that are not
    UTF-8, or a file that cannot be read raise :class:`~tandem_rlvr.errors.TandemError` naming the file (and the
    line): a damaged log is never read, and so never rewritten, as a shorter one."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise TandemError(f"{str(p)!r} cannot be read ({e.strerror or e}); nothing was changed") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        n = data.count(b"\n", 0, e.start) + 1
        raise TandemError(f"{str(p)!r} is damaged: line {n} holds a byte that is not UTF-8; repair or delete "
                          "that line (nothing was changed)") from None
    lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]  # "\n" alone ends a row
    rows = []
    for i, (n, line) in enumerate(lines):
        row = _json_row(line)
        if row is None and i < len(lines) - 1:
            raise TandemError(f"{str(p)!r} is damaged: line {n} is not a JSON object, and {len(lines) - 1 - i} more "
                              "line(s) follow it (a kill only ever tears the last line); repair or delete that line "
                              "(nothing was changed)")
        if row is not None:
            rows.append(row)
    return rows


def _json_row(line: str) -> dict | None:
    """``line`` as a JSON object, or None where it is none (torn, or not JSON)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


def fsync_dir(path: str | Path) -> None:
    """fsync the directory ``path``, so the renames and new names inside it are on disk (a rename is only
    durable once its folder is synced). File systems that cannot open or sync a directory are skipped."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # e.g. some network file systems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def replace_durably(src: str | Path, dst: str | Path) -> None:
    """``os.replace(src, dst)``, then fsync the folder of ``dst`` (and of ``src`` when it differs)."""
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)
    if Path(src).parent != Path(dst).parent:
        fsync_dir(Path(src).parent)


def fsync_tree(path: str | Path) -> None:
    """fsync every file under ``path`` and every folder below it: their contents on disk before a rename
    publishes them (else a power cut after the rename can leave a published folder of empty or partial files).
    A file system that cannot sync a file (``EINVAL``) is skipped; any other failure raises."""
    for root, dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
            finally:
                os.close(fd)
        for name in dirs:
            fsync_dir(os.path.join(root, name))


def publish_dir(tmp_dir: str | Path, final_dir: str | Path) -> None:
    """Move a fully written ``tmp_dir`` to ``final_dir`` (replacing an older one) once its files are on disk
    (:func:`fsync_tree`); each rename is made durable (:func:`replace_durably`)."""
    final_dir = Path(final_dir)
    fsync_tree(tmp_dir)  # the files' contents, and the names written inside it
    fsync_dir(tmp_dir)
    if final_dir.exists():
        trash = final_dir.with_name(f".{final_dir.name}.old")
        shutil.rmtree(trash, ignore_errors=True)
        replace_durably(final_dir, trash)
        replace_durably(tmp_dir, final_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        replace_durably(tmp_dir, final_dir)


# -- a full disk (named, with the space needed) ------------------------------------------------
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "storagefull")
_NEARLY_FULL = 16 << 20  # a failed write with less free than this is taken for a full disk


def is_disk_full(exc: BaseException, where: Path) -> bool:
    """Whether ``exc``, raised while writing under ``where``, comes from a full disk or quota."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return True
    if any(w in str(exc).lower() for w in _FULL_WORDS):
        return True
    free = free_bytes(where)
    return free is not None and free < _NEARLY_FULL  # torch/safetensors may hide the errno


def free_bytes(where: Path) -> int | None:
    p = Path(where)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def human(n: int | float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_full(exc: BaseException, path: Path, needed: int, what: str, kept: str) -> DiskFull:
    """The one-line error for a write of ``what`` that ran out of space at ``path``."""
    failed_at = getattr(exc, "filename", None) or path
    return DiskFull(f"disk full while writing {what} {failed_at}: {human(free_bytes(Path(path)))} free there, "
                    f"about {human(needed)} needed; {kept}. Free space and rerun the same command to resume")
