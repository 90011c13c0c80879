"""Experiment trackers (``train.trackers``): checked before training, named as users name them, continued
by a resumed run, and fed a few co-written completions.

accelerate silently drops a tracker whose package is not installed (one warning in the middle of
the progress bar); a run asked to log to TensorBoard that writes nothing is a failure, so
:func:`check_trackers` refuses it up front and names what to install.

:func:`start` opens the trackers under ``train.project`` with ``train.run_name``, ``train.group`` and
``train.tags``. A run directory is one tracker run: wandb's run id is drawn on the first start and kept
in ``trackers.json`` there, so a resumed or requeued run continues the same wandb run
(``resume="allow"``); TensorBoard writes to the same folder, told to hide (``purge_step``) what an
interrupted attempt logged after the checkpoint it resumes from. :func:`sample_rows` turns a few
rollouts into rows with their turns and authors, :func:`write_samples` appends them to
``samples.jsonl`` and :func:`log_samples` hands them to trackers that take tables or text.
"""

from __future__ import annotations

import importlib.util
import json
import re
import secrets
import string
from pathlib import Path

from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import append_jsonl, atomic_write_json

# tracker name -> (modules of which one must import, what to install)
TRACKERS = {
    "tensorboard": (("tensorboard", "tensorboardX"), "pip install 'tandem-rlvr[tensorboard]' (or tensorboard)"),
    "wandb": (("wandb",), "pip install 'tandem-rlvr[wandb]' (or wandb)"),
    "trackio": (("trackio",), "pip install 'tandem-rlvr[trackio]' (or trackio)"),
    "mlflow": (("mlflow",), "pip install mlflow"),
    "comet_ml": (("comet_ml",), "pip install comet_ml"),
    "aim": (("aim",), "pip install aim"),
    "clearml": (("clearml",), "pip install clearml"),
    "dvclive": (("dvclive",), "pip install dvclive"),
    "swanlab": (("swanlab",), "pip install swanlab"),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_trackers(names: list) -> None:
    """Raise :class:`TandemError` unless every requested tracker is known and its package importable."""
    for name in names:
        if not isinstance(name, str) or name not in TRACKERS:
            raise TandemError(f"train.trackers: unknown tracker {name!r}; choose from {', '.join(TRACKERS)}")
        modules, install = TRACKERS[name]
        if not any(_importable(m) for m in modules):
            raise TandemError(f"train.trackers=[{name}] needs the {modules[0]} package, which is not installed: "
                              f"{install}, or drop it from train.trackers")


def flat_config(cfg: dict, prefix: str = "") -> dict:
    """The config as flat ``section.key`` → int/float/str/bool (what every tracker's hparams accept)."""
    out: dict = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:  # None, lists
            out[name] = str(value)
    return out


# -- naming (train.project, run_name, group, tags) ----------------------------------------------
PROJECT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
IDS_FILE, SAMPLES_FILE = "trackers.json", "samples.jsonl"
RUN_FOLDERS = ("checkpoints", "best", "final")  # a run's own folders: TensorBoard's may not take their names


def naming_checks(train) -> list:
    """``(ok, key, message)`` checks of the tracker names of a ``TrainConfig`` (run by the config's validate)."""
    tags = train.tags
    bad_tags = [t for t in tags if not isinstance(t, str) or not 1 <= len(t) <= 64 or "," in t]
    return [
        (bool(PROJECT_RE.match(train.project)) and train.project not in RUN_FOLDERS, "train.project",
         f"must be 1 to 128 letters, digits, ., _ or - (not starting with . or -, and none of {', '.join(RUN_FOLDERS)}): "
         f"it names the tracker project and TensorBoard's folder in the run directory; got {train.project!r}"),
        (len(train.run_name) <= 128, "train.run_name", f"must be at most 128 characters, got {len(train.run_name)}"),
        (len(train.group) <= 128, "train.group", f"must be at most 128 characters, got {len(train.group)}"),
        (not bad_tags, "train.tags", f"must be words of 1 to 64 characters without a comma (quote numbers), got {bad_tags}"),
    ]


def run_ids(run_dir: Path, names: list, *, fresh: bool = False) -> dict:
    """The tracker run ids kept in ``run_dir/trackers.json`` (``{"wandb": {"id": ...}}``), drawn and written
    (atomically) on a tracker's first start in this run directory, and drawn anew on a ``fresh`` start
    (no checkpoint: an earlier attempt's logged steps would otherwise stay in the tracker's run, which
    keeps the first value of a step it sees again)."""
    path = Path(run_dir) / IDS_FILE
    ids: dict = {}
    if path.exists():
        try:
            ids = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            ids = None
        if not isinstance(ids, dict):
            raise TandemError(f"{path} is not a JSON object of tracker run ids; delete it to open new tracker "
                              "runs (wandb) for this run directory")
    if "wandb" in names and (fresh or not isinstance(ids.get("wandb"), dict)):
        alphabet = string.ascii_lowercase + string.digits  # wandb's own ids: 8 of these
        ids["wandb"] = {"id": "".join(secrets.choice(alphabet) for _ in range(8))}
        atomic_write_json(path, ids)
    return ids


def init_kwargs(train, run_dir: Path, start_step: int) -> dict:
    """accelerate's ``init_kwargs`` for ``train.trackers``: wandb's id (kept in the run directory), resume,
    name, group and tags; TensorBoard's ``purge_step`` (the first step this attempt logs)."""
    out: dict = {}
    if "wandb" in train.trackers:
        w = {"id": run_ids(run_dir, train.trackers, fresh=start_step == 0)["wandb"]["id"], "resume": "allow",
             "name": train.run_name or Path(run_dir).resolve().name}
        if train.group:
            w["group"] = train.group
        if train.tags:
            w["tags"] = list(train.tags)
        out["wandb"] = w
    if "tensorboard" in train.trackers:
        out["tensorboard"] = {"purge_step": int(start_step) + 1}  # logged steps are 1-based: step k+1 comes next
    return out


def start(acc, cfg, start_step: int) -> None:
    """Open ``cfg.train.trackers`` (main process) under ``train.project`` with the flattened config."""
    run_dir = Path(cfg.train.out_dir)
    acc.init_trackers(cfg.train.project, config=flat_config(cfg.to_dict()),
                      init_kwargs=init_kwargs(cfg.train, run_dir, start_step))


# -- sampled completions ------------------------------------------------------------------------
def sample_rows(rollout, tokenizer, step: int, n: int, group_size: int, info: list, rewards) -> list[dict]:
    """``n`` of ``rollout``'s rows, one per prompt first (``group_size`` rows a prompt), as JSON rows:
    the step, ``info[row]`` (problem id, problem, gold), the reward, the senior's token share and the
    turns ``{"owner": "senior"|"junior", "text", "tokens"}`` in order."""
    B = rollout.batch_size
    order = sorted(range(B), key=lambda r: (r % group_size, r // group_size))[:n]
    out = []
    for r in order:
        turns = rollout.turns(tokenizer, r)
        total = sum(t["tokens"] for t in turns)
        senior = sum(t["tokens"] for t in turns if t["owner"] == "senior")
        out.append({"step": int(step), **info[r], "reward": float(rewards[r]),
                    "senior_token_frac": senior / total if total else 0.0, "turns": turns})
    return out


def marked(turns: list[dict]) -> str:
    """A completion with each turn marked by its author: ``[S]`` senior, ``[J]`` junior."""
    return "".join(f"[{'S' if t['owner'] == 'senior' else 'J'}]{t['text']}" for t in turns)


def write_samples(run_dir: Path, rows: list[dict]) -> None:
    """Append ``rows`` to ``run_dir/samples.jsonl`` (each row fsynced; a torn row is cut off)."""
    for row in rows:
        append_jsonl(Path(run_dir) / SAMPLES_FILE, row)


SAMPLE_COLUMNS = ["step", "problem", "gold", "reward", "senior_token_frac", "completion"]


def log_samples(acc, rows: list[dict], step: int) -> None:
    """The sampled completions to the trackers that take them: wandb as a table ``samples``, TensorBoard
    as markdown text ``samples``; other trackers get nothing."""
    data = [[r["step"], str(r.get("problem", "")), str(r.get("gold", "")), r["reward"], r["senior_token_frac"],
             marked(r["turns"])] for r in rows]
    for tracker in acc.trackers:
        if tracker.name == "wandb":
            tracker.log_table("samples", columns=SAMPLE_COLUMNS, data=data, step=step)
        elif tracker.name == "tensorboard":
            text = "\n\n".join(f"**reward {d[3]:.3g}, senior {d[4]:.2f}**: {d[1]}\n\n```\n{d[5]}\n```" for d in data)
            tracker.log({"samples": text}, step=step)
