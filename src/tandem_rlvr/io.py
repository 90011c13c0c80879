"""Atomic file writes: a temporary name in the same folder, fsync, then rename."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import IO, Any


def atomic_write(path: str | Path, write: Callable[[IO], None], *, binary: bool = False) -> Path:
    """Call ``write(f)`` on a temporary file next to ``path``, fsync, then rename it to ``path``:
    a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, file_mode())  # mkstemp makes 0600 files; give results the usual mode
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        written = Path(tmp).stat().st_size if Path(tmp).exists() else 0
        Path(tmp).unlink(missing_ok=True)
        _raise_if_disk_full(e, path, written, "the previous version of the file is intact")
        raise
    return path


def _raise_if_disk_full(e: BaseException, path: Path, written: int, kept: str) -> None:
    from tandem_rlvr import integrity

    if isinstance(e, Exception) and integrity.is_disk_full(e, path.parent):
        raise integrity.disk_full(e, path, max(written, 1), "file", kept + ", nothing half-written was left") from e


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(text))


def file_mode() -> int:
    """The mode a new file gets under the current umask (0666 & ~umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
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
    """Rows of a JSONL file; a torn last line (from a crash) is dropped."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def publish_dir(tmp_dir: str | Path, final_dir: str | Path) -> None:
    """Move a fully written ``tmp_dir`` to ``final_dir`` (replacing an older one)."""
    final_dir = Path(final_dir)
    if final_dir.exists():
        trash = final_dir.with_name(f".{final_dir.name}.old")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final_dir, trash)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp_dir, final_dir)
