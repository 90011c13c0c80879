"""Checkpoint integrity and full disks.

Every checkpoint carries ``checksums.json`` (size and SHA-256 of each file, written before the
``COMPLETE`` marker). On resume the newest complete checkpoint is verified first; a missing,
truncated or altered file, or a file the checksums do not list, moves that checkpoint aside to
``checkpoints/damaged-step-N`` and the previous complete one is tried, so damaged weights are never
loaded. A checkpoint without ``checksums.json`` is not loaded at all (:class:`Unverified`) until
someone vouches for it: ``python -m tandem_rlvr.integrity vouch DIR`` records its checksums as the
files are now (for a checkpoint written by an older version or elsewhere).

A write that runs out of space (``ENOSPC`` / ``EDQUOT``, or a library error on a file system with
almost nothing left) becomes :class:`~tandem_rlvr.errors.DiskFull`, naming the path, the space free
and the space needed; the caller removes what it half-wrote.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from tandem_rlvr.errors import DiskFull, TandemError  # noqa: F401 - re-exported (tests, callers)
from tandem_rlvr.io import (atomic_write_json, disk_full, free_bytes, human, is_disk_full,  # noqa: F401 - re-exported
                            replace_durably)

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


class Unverified(TandemError):
    """A checkpoint without ``checksums.json``: not loaded unless someone vouches for it."""


def unverified(ckpt: Path) -> Unverified:
    return Unverified(
        f"checkpoint {ckpt} has no {SUMS}, so its files cannot be verified: not loaded. If it was written by "
        f"an older version or elsewhere and you trust it, record its checksums with `python -m "
        f"tandem_rlvr.integrity vouch {ckpt}` and rerun; or start over (--restart) or choose another train.out_dir")


def listed_files(ckpt: Path) -> dict:
    """``{relative path: {bytes, sha256}}`` from a checkpoint's ``checksums.json``; :class:`Unverified` if it
    has none, ``ValueError``/``KeyError``/``TypeError`` if it is unreadable."""
    sums_path = ckpt / SUMS
    if not sums_path.exists():
        raise unverified(ckpt)
    listed = json.loads(sums_path.read_text())["files"]
    if not isinstance(listed, dict):
        raise TypeError(f"{SUMS} 'files' is not a mapping")
    return listed


def damage(ckpt: Path) -> str | None:
    """What is wrong with a checkpoint's files (one line naming the file), or None if they verify: a listed
    file missing, truncated, grown or altered, or a file that ``checksums.json`` does not list (left by
    another writer). No ``checksums.json`` raises :class:`Unverified` (not damage: nothing says what it held)."""
    try:
        listed = listed_files(ckpt)
    except (ValueError, KeyError, TypeError) as e:
        return f"{ckpt / SUMS} is unreadable ({type(e).__name__})"
    unlisted = [p for p in _files(ckpt) if p.relative_to(ckpt).as_posix() not in listed]
    if unlisted:
        return f"{unlisted[0]} is not listed in {SUMS} (not written with this checkpoint)"
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
    replace_durably(ckpt, aside)
    return aside



def vouch(ckpt: Path) -> Path:
    """Record the checksums of a complete checkpoint that has none (one written by an older version or
    elsewhere), so a resume loads it; refuses a directory that is not a checkpoint or already has them."""
    ckpt = Path(ckpt)
    if not (ckpt / "COMPLETE").is_file() or not (ckpt / "trainer_state.json").is_file():
        raise TandemError(f"{ckpt} is not a complete checkpoint (no COMPLETE marker or trainer_state.json)")
    if (ckpt / SUMS).exists():
        raise TandemError(f"{ckpt / SUMS} exists already: nothing to vouch for (delete it first to re-record)")
    write_checksums(ckpt)
    return ckpt / SUMS


def main(argv: list[str] | None = None) -> int:
    """``python -m tandem_rlvr.integrity vouch CHECKPOINT_DIR``: record the checksums of a trusted checkpoint."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "vouch":
        print("usage: python -m tandem_rlvr.integrity vouch CHECKPOINT_DIR", file=sys.stderr)
        return 2
    try:
        print(f"wrote {vouch(Path(args[1]))}")
    except TandemError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


# -- full disks ------------------------------------------------------------------------------------

def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in Path(d).rglob("*") if p.is_file()) if Path(d).is_dir() else 0


if __name__ == "__main__":
    raise SystemExit(main())
