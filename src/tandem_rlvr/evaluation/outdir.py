"""The ``--out`` folder of ``tandem-rlvr eval``: what an evaluation may write there, one evaluation at a time.

An evaluation writes only into a new or empty folder, or into one of its own: a folder with :data:`MARKER`
(written first, under the lock; it names the evaluation: its seniors, juniors and benchmarks), or, from a version
that wrote no marker, an ``eval.json`` report or a finished part. There it writes ``run.lock``
(:mod:`tandem_rlvr.runlock`, held while it writes: a second evaluation into the same ``--out`` is refused
naming the first), the report (:data:`REPORT_FILES`), ``parts/<pair>__<benchmark>.json``,
``chains/<pair>/<benchmark>.jsonl`` and the temporaries of their atomic writes (``.NAME.<random>.tmp``,
:func:`tandem_rlvr.io.atomic_open`). Anything else there (or an ``eval.json`` that is no evaluation's report) is
refused before anything is written, naming the first such file, ``--overwrite`` or not; so is the folder of another
evaluation (other seniors, juniors or benchmarks) without ``--overwrite``: its report is never replaced by surprise.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from tandem_rlvr.errors import ConfigError
from tandem_rlvr.preflight import PROBE_FILE
from tandem_rlvr import runlock

log = logging.getLogger(__name__)

MARKER = ".tandem-rlvr-eval"  # in --out: an evaluation wrote this folder (and which one)
REPORT_FILES = ("eval.json", "eval.csv", "eval.md", "eval.html", "handoff_curve.png", "junior_ce_deciles.png",
                "matrix.png")
_TMP = r"\.[A-Za-z0-9_]+\.tmp"  # what atomic_open (tempfile.mkstemp) puts after ".NAME": ".<random>.tmp"
_SLUG = r"[A-Za-z0-9-][A-Za-z0-9._-]*"  # a name slug() makes (no leading '.' or '_')
# in any folder: the lock, and what a start killed before its marker leaves (preflight's scratch file, the marker's
# temporary); never foreign, so a killed start does not block its rerun
_ALWAYS = re.compile(rf"^(run\.lock|\.{re.escape(MARKER)}{_TMP})$")
_NAMES = "|".join(re.escape(n) for n in (MARKER, *REPORT_FILES))
_TOP = re.compile(rf"^({_NAMES}|\.({_NAMES}){_TMP})$")
_PART = re.compile(rf"^({_SLUG}\.json|\.{_SLUG}\.json{_TMP})$")
_CHAIN = re.compile(rf"^({_SLUG}\.jsonl|\.{_SLUG}\.jsonl{_TMP})$")


def slug(name: str) -> str:
    """A file-name-safe version of a senior or benchmark name (the names under ``parts/`` and ``chains/``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "x"


def temp_pattern(path: Path) -> re.Pattern:
    """The names of the temporaries that :func:`tandem_rlvr.io.atomic_open` makes beside ``path``."""
    return re.compile(rf"^\.{re.escape(path.name)}{_TMP}$")


def remove_stale_temps(path: Path) -> list[Path]:
    """Delete the temporaries of atomic writes of ``path`` that a killed evaluation left beside it (their names
    only: :func:`temp_pattern`); the caller holds ``--out``'s lock, so none of them is being written. Returns them."""
    if not path.parent.is_dir():
        return []
    pattern = temp_pattern(path)
    stale = sorted(p for p in path.parent.iterdir() if pattern.match(p.name) and p.is_file() and not p.is_symlink())
    for p in stale:
        p.unlink(missing_ok=True)
        log.info("removed %s, the temporary file of an interrupted write", p)
    return stale


def identity(opts, benchmarks: Mapping[str, str]) -> dict:
    """What makes one evaluation (its report) another's: the seniors, juniors (name -> path) and benchmarks (name ->
    source, ``benchmarks``). The options of its parts are told apart by their fingerprints (eval_cli)."""
    return json.loads(json.dumps({"seniors": dict(opts.seniors), "juniors": dict(opts.juniors),
                                  "benchmarks": dict(benchmarks)}, default=str))


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _report(path: Path) -> dict | None:
    """``eval.json`` as an evaluation wrote it (settings and the results of a senior, seniors or pairs), else None."""
    obj = _read_json(path)
    ok = isinstance(obj, dict) and isinstance(obj.get("settings"), dict) and any(k in obj for k in
                                                                                  ("senior", "seniors", "pairs"))
    return obj if ok else None


def _marker(out: Path) -> dict | None:
    obj = _read_json(out / MARKER)
    return obj if isinstance(obj, dict) and obj.get("written_by") == "tandem-rlvr eval" else None


def _has_part(out: Path) -> bool:
    parts = out / "parts"
    return parts.is_dir() and any(isinstance(o := _read_json(p), dict) and "fingerprint" in o and "metrics" in o
                                  for p in sorted(parts.glob("*.json")) if p.is_file())


def _is_evaluation(out: Path) -> bool:
    """``out`` was written by an evaluation: its marker, else (an older version's) a report or a finished part."""
    return (_marker(out) is not None or ((out / "eval.json").is_file() and _report(out / "eval.json") is not None)
            or _has_part(out))


def first_foreign(out: Path) -> Path | None:
    """The first entry under ``out`` (sorted; into ``parts/`` and ``chains/<pair>/``) that no evaluation writes, or
    None when all are an evaluation's own (or nothing is there). In a folder no evaluation wrote, every entry but a
    lock or a killed start's leftovers is foreign."""
    if not out.is_dir():
        return None
    ours = _is_evaluation(out)
    for e in sorted(out.iterdir()):
        bad = _foreign_entry(e, ours)
        if bad is not None:
            return bad
    return None


def _foreign_entry(e: Path, ours: bool) -> Path | None:
    if e.is_symlink():
        return e
    if e.is_file() and (_ALWAYS.match(e.name) or PROBE_FILE.match(e.name)):
        return None
    if not ours:
        return e
    if e.name in ("eval.json", MARKER):  # read, not only named: a user's own eval.json is never replaced
        return None if e.is_file() and (_report(e) if e.name == "eval.json" else _marker(e.parent)) else e
    if e.is_file():
        return None if _TOP.match(e.name) else e
    if e.name == "parts" and e.is_dir():
        return _first_not(e, _PART)
    if e.name == "chains" and e.is_dir():
        for d in sorted(e.iterdir()):
            bad = d if d.is_symlink() or not d.is_dir() or not re.fullmatch(_SLUG, d.name) else _first_not(d, _CHAIN)
            if bad is not None:
                return bad
        return None
    return e


def _first_not(folder: Path, names: re.Pattern) -> Path | None:
    """The first entry of ``folder`` that is not a regular file named as ``names`` allows."""
    return next((p for p in sorted(folder.iterdir()) if p.is_symlink() or not p.is_file() or not names.match(p.name)),
                None)


def check_out(opts, benchmarks: Mapping[str, str]) -> None:
    """Refuse, before anything is read or written, an ``--out`` that is a file, one that holds anything no
    evaluation writes (:func:`first_foreign`, named), and (without ``--overwrite``) the folder of another evaluation
    (:func:`identity`: its marker's, else its report's), naming what differs."""
    out = Path(opts.out)
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise ConfigError(f"eval --out {str(opts.out)!r} is a file, not a folder: choose a folder for the evaluation's "
                          "outputs (nothing was changed)")
    foreign = first_foreign(out)
    if foreign is not None:
        raise ConfigError(f"eval --out {str(opts.out)!r} holds {str(foreign.relative_to(out))!r}, which no evaluation "
                          "writes: an evaluation writes only into a new or empty folder or one of its own; move it "
                          "away or choose another --out (nothing was changed)")
    if opts.overwrite or not out.is_dir():
        return
    marker, report = _marker(out), _report(out / "eval.json") if (out / "eval.json").is_file() else None
    was = (marker or {}).get("evaluation") or {k: (report or {}).get("settings", {}).get(k) for k in
                                               ("seniors", "juniors", "benchmarks")}
    new = identity(opts, benchmarks)
    differ = [f"{_FLAGS[k]} {_names(was[k])} -> {_names(new[k])}" for k in new
              if isinstance(was.get(k), dict) and was[k] != new[k]]
    if differ:
        raise ConfigError(f"eval --out {str(opts.out)!r} holds another evaluation ({'; '.join(differ)}): pass "
                          "--overwrite to replace its report (eval.json, eval.md, ...; its parts and chains of other "
                          "names stay), or choose another --out (nothing was changed)")


_FLAGS = {"seniors": "--senior", "juniors": "--junior", "benchmarks": "--benchmark"}


def _names(named: Mapping) -> str:
    return ", ".join(f"{k}={v}" for k, v in named.items()) or "none"


@contextlib.contextmanager
def writing(opts, benchmarks: Mapping[str, str], recheck: Callable[[], None] = lambda: None) -> Iterator[Path]:
    """Hold ``--out``'s ``run.lock`` while the evaluation writes: a second evaluation into it is refused naming
    this one. Under the lock, :func:`check_out` and ``recheck`` (the finished parts) again (another evaluation may
    have written since they ran), then the marker naming this evaluation; a refusal there leaves no lock file this
    call made."""
    from tandem_rlvr.io import atomic_write_json

    out = Path(opts.out)
    lock = runlock.acquire(out, what="evaluation", option="--out")
    try:
        check_out(opts, benchmarks)
        recheck()
        atomic_write_json(out / MARKER, {"written_by": "tandem-rlvr eval", "evaluation": identity(opts, benchmarks)})
    except BaseException:
        lock.discard()
        raise
    with lock:
        yield out
