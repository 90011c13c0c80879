"""Atomic file writes: a temporary name in the same folder, fsync, then rename."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give results the usual mode
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=_json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


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
