"""Checkpoint integrity and full disks.

Every checkpoint carries ``checksums.json`` (size and SHA-256 of each file, written before the
``COMPLETE`` marker). On resume the newest complete checkpoint is verified first; a missing,
truncated or altered file moves that checkpoint aside to ``checkpoints/damaged-step-N`` and the
previous complete one is tried, so damaged weights are never loaded.

A write that runs out of space (``ENOSPC`` / ``EDQUOT``, or a library error on a file system with
almost nothing left) becomes :class:`~tandem_rlvr.errors.DiskFull`, naming the path, the space free
and the space needed; the caller removes what it half-wrote.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from tandem_rlvr.errors import DiskFull  # noqa: F401 - re-exported (tests, callers)
from tandem_rlvr.io import atomic_write_json, disk_full, free_bytes, human, is_disk_full  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

SUMS = "checksums.json"
_SKIP = {SUMS, "COMPLETE"}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _files(ckpt: Path) -> list[Path]:
    return sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name not in _SKIP)


def write_checksums(ckpt: Path) -> None:
    """Record size and SHA-256 of every file of a (still temporary) checkpoint directory."""
    files = {p.relative_to(ckpt).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in _files(ckpt)}
    atomic_write_json(ckpt / SUMS, {"algorithm": "sha256", "files": files})


def damage(ckpt: Path) -> str | None:
    """What is wrong with a checkpoint's files (one line naming the file), or None if they verify.

    A checkpoint written before checksums existed (no ``checksums.json``) is accepted with a warning."""
    sums_path = ckpt / SUMS
    if not sums_path.exists():
        log.warning("checkpoint %s has no %s (written by an older version): not verified", ckpt, SUMS)
        return None
    try:
        listed = json.loads(sums_path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        return f"{sums_path} is unreadable ({type(e).__name__})"
    for rel, want in listed.items():
        p = ckpt / rel
        if not p.is_file():
            return f"{p} is missing"
        size = p.stat().st_size
        if size != want["bytes"]:
            return f"{p} has {size} bytes, {want['bytes']} were written ({'truncated' if size < want['bytes'] else 'grown'})"
        if file_sha256(p) != want["sha256"]:
            return f"{p} does not match its SHA-256 checksum (altered on disk)"
    return None


def move_aside(ckpt: Path) -> Path:
    """Rename a damaged checkpoint to ``damaged-step-N`` (never loaded, never pruned: inspect or delete it)."""
    aside = ckpt.with_name(f"damaged-{ckpt.name}")
    k = 1
    while aside.exists():
        aside = ckpt.with_name(f"damaged-{ckpt.name}.{k}")
        k += 1
    os.replace(ckpt, aside)
    return aside



# -- full disks ------------------------------------------------------------------------------------

def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file()) if Path(d).is_dir() else 0
