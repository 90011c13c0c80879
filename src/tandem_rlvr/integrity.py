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

import errno
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from tandem_rlvr.errors import DiskFull

log = logging.getLogger(__name__)

SUMS = "checksums.json"
_SKIP = {SUMS, "COMPLETE"}
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "storagefull")
_NEARLY_FULL = 16 << 20  # a failed write with less free than this is taken for a full disk


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
    from tandem_rlvr.io import atomic_write_json

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


def newest_intact_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint whose files verify; damaged newer ones are moved aside (logged)."""
    from tandem_rlvr.checkpoint import complete_checkpoints

    for ckpt in reversed(complete_checkpoints(run_dir)):
        why = damage(ckpt)
        if why is None:
            return ckpt
        aside = move_aside(ckpt)
        log.error("checkpoint %s is damaged: %s; moved it to %s and trying the previous complete checkpoint",
                  ckpt.name, why, aside)
    return None


# -- full disks ------------------------------------------------------------------------------------

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


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file()) if Path(d).is_dir() else 0


def disk_full(exc: BaseException, path: Path, needed: int, what: str, kept: str) -> DiskFull:
    """The one-line error for a write of ``what`` that ran out of space at ``path``."""
    failed_at = getattr(exc, "filename", None) or path
    return DiskFull(f"disk full while writing {what} {failed_at}: {human(free_bytes(Path(path)))} free there, "
                    f"about {human(needed)} needed; {kept}. Free space and rerun the same command to resume")
