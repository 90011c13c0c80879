"""The run directory: start fresh, resume the same run, or refuse to mix two runs.

``--restart`` (``restart=True``) deletes only what a run writes, and only when the directory holds nothing
else (:func:`first_foreign`): ``config.yaml`` (one a run wrote: :func:`_ours`), ``metrics.jsonl``,
``preempted.json``, ``watchdog-rank{R}.txt``,
``run.lock`` (kept: it may be held), ``trackers.json`` and ``samples.jsonl`` (:mod:`tandem_rlvr.trackers`), ``checkpoints/`` (whose entries must be ``step-N``, ``.tmp-step-N``,
``.trash-step-N``, ``.step-N.old`` or ``damaged-step-N[.k]``), ``best/`` and ``final/`` (with their ``.tmp-``
and ``.old`` siblings, and ``.trash-best``), the temporary files of atomic writes, the ``.write-check-*`` probe file
of a preflight killed mid-check, TensorBoard's folder (named by the run's ``train.project``,
``tandem-rlvr/`` by default; event files and ``hparams.yml`` only) and, for a run whose ``config.yaml`` names the ``aim`` tracker, ``.aim/``. Anything else (or a
symbolic link) is a foreign file: the restart is refused naming it and nothing is deleted. The directory
itself is never removed, and ``/``, the home directory, the current directory and their ancestors are
refused outright.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import yaml

from tandem_rlvr.training import checkpoint as ckpt_mod
from tandem_rlvr import integrity
from tandem_rlvr.config import Config, save_config
from tandem_rlvr.config_bounds import run_dir_problem
from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import atomic_write_text, read_jsonl
from tandem_rlvr.preflight import PROBE_FILE
from tandem_rlvr import runlock

log = logging.getLogger(__name__)

# what a run writes directly in its directory (regular files, then folders); see the module docstring
RUN_FILES = re.compile(r"^(config\.yaml|metrics\.jsonl|preempted\.json|watchdog-rank\d+\.txt|trackers\.json|samples\.jsonl"
                       r"|\.(config\.yaml|metrics\.jsonl|preempted\.json|trackers\.json|samples\.jsonl)\..+\.tmp)$")
RUN_DIRS = re.compile(r"^(checkpoints|best|final|\.tmp-(best|final)|\.(best|final)\.old|\.trash-best)$")
CKPT_ENTRIES = re.compile(r"^(step-\d+|\.tmp-step-\d+|\.trash-step-\d+|\.step-\d+\.old|damaged-step-\d+(\.\d+)?)$")
TENSORBOARD_DIR, TENSORBOARD_FILE = "tandem-rlvr", re.compile(r"^(events\.out\.tfevents\..+|hparams\.yml)$")

# keys a resumed run may change (how long, how often to save or log); any other change is refused
RESUMABLE_CHANGES = {"train.steps", "train.progress", "train.save_every", "train.keep_last", "train.trackers",
                     "train.max_nonfinite", "val.every", "data.reward_workers", "train.preempt_exit_code",
                     "train.watchdog_s", "train.collective_timeout_s", "train.run_name", "train.group", "train.tags",
                     "train.log_every", "train.log_samples"}
# keys left out of the comparison: the folder itself, which a resume found (``run``, ``run/`` or its absolute path)
NOT_COMPARED = {"train.out_dir"}


def _say_new_schedule(old: dict, cfg: Config) -> None:
    """A resumed run with another ``train.steps`` under a decaying learning rate follows the new run length's
    schedule from the resumed step on: the rate jumps there. Said, since the change itself is allowed."""
    before, decay = (old.get("train") or {}).get("steps"), cfg.algo.lr_decay
    if before is not None and before != cfg.train.steps and decay != "constant":
        log.warning("train.steps %s -> %s with algo.lr_decay=%s: from the resumed step on the learning rate follows "
                    "the schedule of a %s-step run, so it jumps at that step (algo.lr_decay=constant, the paper's, "
                    "extends a run without a jump)", before, cfg.train.steps, decay, cfg.train.steps)


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ, except those a resumed run may change."""
    out = []
    for k in sorted(set(old) | set(new)):
        key = f"{prefix}{k}"
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, key + ".")
        elif a != b and key not in RESUMABLE_CHANGES and key not in NOT_COMPARED:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def prepare(run_dir: Path, cfg: Config, restart: bool) -> Path | None:
    """Make ``run_dir`` ready; return the checkpoint to resume from (None = fresh start).

    ``restart`` first deletes what a run wrote there (:func:`clear_run`; refused if it holds anything
    else). A directory with progress (a checkpoint, metrics or ``best/``) is resumed only if its ``config.yaml``
    matches ``cfg`` up to :data:`RESUMABLE_CHANGES` and ``train.steps`` is not below its newest checkpoint's step;
    one that has no intact checkpoint left but went further than its metrics is refused
    (:func:`_check_nothing_lost`), and so is a damaged ``metrics.jsonl`` or ``samples.jsonl`` (a row that is not
    JSON with rows after it: :func:`~tandem_rlvr.io.read_jsonl`). The caller holds the directory's lock
    (:func:`open_run`).
    """
    if restart:
        clear_run(run_dir)
    ckpt_mod.recover_publishes(run_dir)  # a checkpoint, best/ or final/ whose replacement a kill cut short
    resume_from = ckpt_mod.newest_intact_checkpoint(run_dir)  # a damaged newest one is moved aside
    has_progress = (resume_from is not None or bool(read_jsonl(run_dir / "metrics.jsonl"))
                    or (run_dir / "best").is_dir())
    if has_progress:
        old_cfg = run_dir / "config.yaml"
        if not old_cfg.exists():
            raise TandemError(f"run directory {str(run_dir)!r} holds a run without config.yaml; "
                              "pass --restart to start over or choose another train.out_dir")
        old = read_run_config(old_cfg)
        changed = config_changes(old, cfg.to_dict())
        if changed:
            raise TandemError(
                f"run directory {str(run_dir)!r} holds a run with a different config ({'; '.join(changed[:5])}); "
                "pass --restart to start over or choose another train.out_dir"
            )
        _say_new_schedule(old, cfg)
    if resume_from is not None:
        _check_steps(resume_from, cfg)
        for log_name in ("metrics.jsonl", "samples.jsonl"):  # damaged, not just torn: stop before any process resumes
            read_jsonl(run_dir / log_name)
    if resume_from is None and not restart:
        _check_nothing_lost(run_dir)
        _check_fresh(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    return resume_from


def _check_nothing_lost(run_dir: Path) -> None:
    """Refuse a fresh start (it would retrain from step 0 over this run's metrics and saved models) where a run
    went further than its first checkpoint but cannot be resumed: every checkpoint failed its checksums (moved
    aside as ``damaged-step-N``), or the run saved a model (``final/`` or ``best/``) and no checkpoint is left
    (``train.save_every`` 0, or they were removed). An attempt killed before its first checkpoint (its metrics
    only) still starts over; ``--restart`` starts over in every case."""
    ckpts = run_dir / "checkpoints"
    damaged = sorted(p.name for p in ckpts.glob("damaged-step-*")) if ckpts.is_dir() else []
    saved = [f"{name}/" for name in ("final", "best") if (run_dir / name).is_dir()]
    if saved == ["best/"] and _best_before_first_checkpoint(run_dir):
        saved = []  # a kill between best/ and the run's first checkpoint: retraining rewrites best/
    if damaged:
        why = f"every checkpoint of this run failed its checksums (moved aside: {', '.join(damaged)})"
    elif saved:
        why = f"it holds this run's saved model ({' and '.join(saved)}) but no checkpoint to resume from"
    else:
        return
    raise TandemError(f"run directory {str(run_dir)!r} cannot be resumed: {why}; a fresh start would retrain from "
                      "step 0 over its metrics and models. Pass --restart to start over (it deletes them) or choose "
                      "another train.out_dir (nothing was changed)")


def read_run_config(path: Path) -> dict:
    """The run's saved ``config.yaml`` as a mapping; :class:`TandemError` naming the file where it cannot be
    read or parsed (edited by hand, damaged) or is not a mapping."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        why = None if data is None or isinstance(data, dict) else f"it holds a {type(data).__name__}, not a mapping"
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        why = _one_line(e)
    if why is not None:
        raise TandemError(f"the run's config {str(path)!r} cannot be read ({why}): restore it (as the run wrote it), "
                          "or move it away and pass --restart to start over, or choose another train.out_dir")
    return data or {}


def _one_line(e: Exception) -> str:
    """An error reading a file, in one line (a YAML error's problem and where it is)."""
    mark = getattr(e, "problem_mark", None)
    if isinstance(e, yaml.YAMLError) and mark is not None:
        return f"{getattr(e, 'problem', None) or 'invalid YAML'} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(e).split()) or type(e).__name__


def _check_steps(resume_from: Path, cfg: Config) -> None:
    """Refuse to resume a checkpoint of a later step than ``train.steps`` (the run already went past it)."""
    step = int(resume_from.name.split("-")[1])
    if step > cfg.train.steps:
        raise TandemError(f"train.steps={cfg.train.steps} is below the step of this run's newest checkpoint "
                          f"({resume_from}, step {step}): it went further already. Set train.steps to {step} or more "
                          "to resume it, or pass --restart to start over, or choose another train.out_dir "
                          "(nothing was changed)")


def _best_before_first_checkpoint(run_dir: Path) -> bool:
    """``best/`` was written by this run before its first checkpoint was due: ``best/best.json`` and every
    metrics row are of a step up to the ``train.save_every`` of the run's ``config.yaml`` (a kill came between
    the validation that wrote it and the checkpoint), so a fresh start loses nothing it does not write again."""
    try:
        step = json.loads((run_dir / "best" / "best.json").read_text(encoding="utf-8"))["step"]
        save_every = int(_old_train(run_dir).get("save_every") or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    rows = [r.get("step", 0) for r in read_jsonl(run_dir / "metrics.jsonl") if isinstance(r, dict)]
    return isinstance(step, int) and save_every > 0 and all(
        isinstance(s, int) and s <= save_every for s in [step, *rows])


def _check_fresh(run_dir: Path) -> None:
    """A fresh start rewrites ``config.yaml`` and drops an unfinished attempt's ``metrics.jsonl`` and
    ``samples.jsonl``: only in a folder that is empty or holds a run's own files and a ``config.yaml`` a run
    wrote (every section of the config); anything else there is one line naming it, and nothing is changed."""
    if not run_dir.is_dir():
        return
    entries = sorted(e for e in run_dir.iterdir() if not _no_run_yet(e))
    if not entries:
        return
    culprit = first_foreign(run_dir)
    if culprit is None and not _ours(run_dir / "config.yaml"):
        culprit = run_dir / "config.yaml" if (run_dir / "config.yaml").exists() else entries[0]
    if culprit is not None:
        raise TandemError(f"train.out_dir {str(run_dir)!r} holds {culprit.name!r}, which is not a tandem-rlvr run's "
                          "file; a new run would overwrite or delete what is there: choose an empty or new train.out_dir "
                          "(nothing was changed)")


def _no_run_yet(entry: Path) -> bool:
    """``entry`` is there before (or without) a run: its lock file, or a probe file of preflight's write check."""
    return entry.name == runlock.LOCK_NAME or (bool(PROBE_FILE.match(entry.name)) and entry.is_file()
                                               and not entry.is_symlink())


def _ours(path: Path) -> bool:
    """``path`` is a config a run saved: YAML with every section of :class:`~tandem_rlvr.config.Config`."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and set(Config().to_dict()) <= set(data)


def open_run(run_dir: Path, cfg: Config, restart: bool) -> tuple[runlock.RunLock, Path | None]:
    """Lock ``run_dir`` for this run (:mod:`tandem_rlvr.runlock`), then :func:`prepare` it; returns
    the held lock and the checkpoint to resume from. A restart that would be refused is refused before
    the lock file is created; on any error the lock is released, and its file deleted if this call created it
    (:meth:`~tandem_rlvr.runlock.RunLock.discard`: a refused run leaves the folder as it was)."""
    if restart:
        check_restart(run_dir)
    lock = runlock.acquire(run_dir)
    try:
        return lock, prepare(run_dir, cfg, restart)
    except BaseException:
        lock.discard()
        raise


def check_restart(run_dir: Path) -> None:
    """Refuse a restart of ``/``, the home or current directory (or an ancestor of either), or of a
    directory holding anything a run does not write (:func:`first_foreign`) or a ``config.yaml`` no run wrote
    (:func:`_ours`: a user's own config kept there, as a fresh start refuses it)."""
    problem = run_dir_problem(str(run_dir))  # the config's own check, again here: a library caller may skip it
    if problem is not None:
        raise TandemError(f"--restart refused: train.out_dir {problem}")
    foreign = first_foreign(run_dir)
    config = run_dir / "config.yaml"
    if foreign is None and config.exists() and not _ours(config):
        foreign = config  # a user's own config kept there (a fresh start refuses it too)
    if foreign is not None:
        raise TandemError(f"--restart refused: {str(run_dir)!r} holds {str(foreign)!r}, which no run writes; "
                          "nothing was deleted. Move it away or choose another train.out_dir")


def first_foreign(run_dir: Path) -> Path | None:
    """The first entry of ``run_dir`` (sorted; one level into ``checkpoints/``, every file of TensorBoard's
    folder) that a run does not write, or None when everything there is a run's own (or nothing is there)."""
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        return run_dir
    old = _old_train(run_dir)
    aim, tensorboard = "aim" in list(old.get("trackers") or []), str(old.get("project") or TENSORBOARD_DIR)
    for e in sorted(run_dir.iterdir()):
        if e.is_symlink():
            return e
        if e.is_file() and (RUN_FILES.match(e.name) or PROBE_FILE.match(e.name) or e.name == runlock.LOCK_NAME):
            continue
        if e.is_dir() and e.name == "checkpoints":
            bad = next((c for c in sorted(e.iterdir()) if c.is_symlink() or not CKPT_ENTRIES.match(c.name)), None)
        elif e.is_dir() and e.name == tensorboard:
            bad = next((f for f in sorted(e.rglob("*"))
                        if f.is_symlink() or (not f.is_dir() and not TENSORBOARD_FILE.match(f.name))), None)
        elif e.is_dir() and (RUN_DIRS.match(e.name) or (aim and e.name == ".aim")):
            bad = None
        else:
            bad = e
        if bad is not None:
            return bad
    return None


def _old_train(run_dir: Path) -> dict:
    """The ``train`` section of the run's ``config.yaml`` ({} when there is none or it cannot be read)."""
    try:
        old = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("train", {})
        return old if isinstance(old, dict) else {}
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        return {}


def clear_run(run_dir: Path) -> None:
    """Delete what a run wrote in ``run_dir`` after :func:`check_restart` (a foreign file refuses it and
    nothing is deleted); the directory and its ``run.lock`` stay."""
    check_restart(run_dir)
    if not run_dir.exists():
        return
    for e in sorted(run_dir.iterdir()):
        if e.name == runlock.LOCK_NAME:
            continue
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()


def truncate_metrics(run_dir: Path, step: int, name: str = "metrics.jsonl") -> None:
    """Keep the rows of ``name`` (metrics, or the sampled completions) up to ``step`` (those of a resumed
    checkpoint), atomically; no file stays no file."""
    path = run_dir / name
    if not path.exists():
        return
    rows = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
