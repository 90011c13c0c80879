"""``tandem-rlvr push RUN_DIR REPO_ID``: a trained senior to the Hugging Face Hub, with a model card.

The senior is the run's ``final/`` (default) or ``best/`` folder. Its files must verify against the
``checksums.json`` written with it (:mod:`tandem_rlvr.integrity`); a folder without one (written by an
older version) is pushed only with ``trust_unverified``. Only the model's safetensors weights, its
config and tokenizer files go up (no optimizer or RNG state, no pickled weights, no run bookkeeping).

Nothing in the run directory is written: a *staging* folder (default ``hub_staging/OWNER__NAME``) gets
the generated ``README.md`` (the card: YAML metadata, then the arm, the junior, the schedule and p, the
training summary, the evaluation when one is given, the full config, the papers) and links to the
files to upload; that folder is what ``upload_folder`` sends, so a dry run shows exactly what a push
would. The token comes from ``HF_TOKEN`` only and is never printed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tandem_rlvr import integrity
from tandem_rlvr.errors import TandemError
from tandem_rlvr.io import atomic_write_json, atomic_write_text, human, publish_dir, read_jsonl

log = logging.getLogger(__name__)

FOLDERS = ("final", "best")
STAGING_MARKER = ".tandem-rlvr-push.json"  # in a staging folder this command made (and so may replace)
UPLOAD_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model", ".tiktoken")  # weights, config, tokenizer
NOT_UPLOADED = {"COMPLETE", integrity.SUMS, "best.json", "trainer_state.json"}  # run bookkeeping
STATE_STEMS = ("optimizer", "scheduler", "train_state", "rng_state", "lora_state")  # training state, never uploaded
PAPER = ("Tandem Reinforcement Learning with Verifiable Rewards", "2606.28166", "2026")
TANDEM_TRAINING = ("Tandem Training for Language Models", "2510.13551", "West, Anderson, Kamar and Horvitz, EACL 2026")
ARM_TEXT = {
    "trlvr": "Tandem RLVR: GRPO on rollouts co-written with a frozen junior, the loss on the senior's tokens only",
    "grpo": "GRPO on solo rollouts (the baseline arm of Tandem RLVR)",
    "kl_reg": "GRPO on solo rollouts with a k3 KL penalty toward the frozen junior (the KL-Reg ablation of Tandem RLVR)",
}


@dataclass
class PushPlan:
    """What a push sends: the verified model folder, the files taken from it, those left out, the staging folder."""

    run_dir: Path
    folder: Path
    repo_id: str
    staging: Path
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    verified: bool = True

    @property
    def card(self) -> Path:
        return self.staging / "README.md"


# -- the model folder -----------------------------------------------------------------------------

def model_folder(run_dir: str | Path, which: str = "final") -> Path:
    """``RUN_DIR/final`` or ``RUN_DIR/best``, complete; one clear error naming what is missing otherwise."""
    run_dir = Path(run_dir).expanduser()
    if which not in FOLDERS:
        raise TandemError(f"--folder must be {' or '.join(FOLDERS)}, got {which!r}")
    if not (run_dir / "config.yaml").is_file():
        raise TandemError(f"{run_dir} is not a run directory (no config.yaml)")
    folder = run_dir / which
    if not folder.is_dir():
        hint = " (best/ exists only for runs with validation: val.data and val.every)" if which == "best" else \
            " (the run has not finished: resume it with the same `tandem-rlvr train` command)"
        raise TandemError(f"{folder} does not exist{hint}")
    if not (folder / "COMPLETE").is_file():
        raise TandemError(f"{folder} has no COMPLETE marker (half-written): not pushed")
    return folder


def verify_folder(folder: Path, trust_unverified: bool = False) -> bool:
    """True when every file of ``folder`` matches its ``checksums.json``; a damaged folder is refused, one
    without checksums too unless ``trust_unverified`` (then False)."""
    if not (folder / integrity.SUMS).exists():
        if trust_unverified:
            log.warning("%s has no %s: pushing its files unverified (--trust-unverified)", folder, integrity.SUMS)
            return False
        raise TandemError(f"{folder} has no {integrity.SUMS} (written before tandem-rlvr recorded them), so its "
                          "files cannot be verified: not pushed. Pass --trust-unverified to push it as it is")
    why = integrity.damage(folder)
    if why is not None:
        raise TandemError(f"{folder} does not verify: {why}; not pushed")
    return True


def _uploadable(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    if name in NOT_UPLOADED or name.startswith(".") or name.lower().startswith(STATE_STEMS):
        return False
    return name.endswith(UPLOAD_SUFFIXES)


def select_files(folder: Path) -> tuple[list[str], list[str]]:
    """``(to upload, left out)``: relative paths of the safetensors weights, config and tokenizer files, and of
    everything else (bookkeeping, pickled weights, training state). No safetensors weights: an error."""
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    files = [r for r in rels if _uploadable(r)]
    if not any(r.endswith(".safetensors") and "/" not in r for r in files):
        raise TandemError(f"{folder} holds no *.safetensors weights: nothing a Hub model could load")
    return files, [r for r in rels if r not in files]


# -- the card ------------------------------------------------------------------------------------

def _is_hub_id(name: str) -> bool:
    """Whether a model name is a Hub repository id (``org/name``) rather than a local path or a world model."""
    if not name or name.startswith((".", "/", "~")) or Path(name).expanduser().exists():
        return False
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name) is not None


def _junior_text(cfg: dict) -> str:
    model = cfg.get("model", {})
    if model.get("self_paired"):
        return f"a frozen copy of the senior's starting weights ({model.get('senior')}; self-paired)"
    text = str(model.get("junior"))
    return text + (" (another tokenizer: co-written through text)" if model.get("bridge") else "")


def _rollouts_text(cfg: dict) -> str:
    algo, handoff = cfg.get("algo", {}), cfg.get("handoff", {})
    if algo.get("arm") != "trlvr":
        kl = f"; KL weight kl_beta = {algo.get('kl_beta')}" if algo.get("arm") == "kl_reg" else ""
        return f"solo (no handoffs){kl}"
    return f"co-written, schedule `{handoff.get('schedule')}`, P(senior) p = {handoff.get('p')}"


def _metadata(cfg: dict) -> str:
    from huggingface_hub import ModelCardData

    arm, senior = cfg.get("algo", {}).get("arm", "trlvr"), str(cfg.get("model", {}).get("senior", ""))
    tags = list(dict.fromkeys(["tandem-rlvr", "grpo", "rlvr", arm]))
    data = ModelCardData(library_name="transformers", pipeline_tag="text-generation", tags=tags,
                         base_model=senior if _is_hub_id(senior) else None)
    return data.to_yaml()


def _training_table(cfg: dict, folder: Path) -> list[str]:
    model, algo, train, data = (cfg.get(k, {}) for k in ("model", "algo", "train", "data"))
    rows = [("arm", f"`{algo.get('arm')}`: {ARM_TEXT.get(algo.get('arm'), '')}"),
            ("senior (start)", str(model.get("senior"))), ("junior (frozen)", _junior_text(cfg)),
            ("rollouts", _rollouts_text(cfg)), ("data / reward", f"{data.get('train')} / {data.get('reward')}"),
            ("steps x prompts x group", f"{train.get('steps')} x {train.get('prompts_per_step')} x {algo.get('group_size')}"),
            ("learning rate, loss", f"{algo.get('lr')}, {algo.get('loss_type')}"),
            ("LoRA rank", str(model.get("lora_r", 0)) + (" (merged into these weights)" if model.get("lora_r") else "")),
            ("seed", str(train.get("seed"))), ("uploaded folder", f"`{folder.name}/`" + _best_note(folder))]
    return ["| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)]


def _best_note(folder: Path) -> str:
    best = folder / "best.json"
    if not best.is_file():
        return " (the senior after the last step)" if folder.name == "final" else ""
    b = json.loads(best.read_text(encoding="utf-8"))
    return f" (step {b.get('step')}: best {b.get('metric')} = {b.get('value'):.4g} in validation)"


SUMMARY_KEYS = ("reward/mean", "rollout/senior_token_frac", "rollout/response_len", "kl/senior_junior", "train/loss")


def training_summary(run_dir: Path) -> list[str]:
    """Lines of Markdown: steps logged, and the first and last value of a few metrics of ``metrics.jsonl``
    (its validation metrics too)."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    if not rows:
        return ["No metrics.jsonl rows were found in the run directory."]
    first, last = rows[0], rows[-1]
    keys = [k for k in SUMMARY_KEYS if k in last] + sorted(k for k in last if k.startswith("val/") and not k.endswith("_se"))
    out = [f"{len(rows)} logged steps (last: step {last.get('step')}). First and last logged values:", "",
           "| metric | first | last |", "| --- | --- | --- |"]
    out += [f"| `{k}` | {_num(first.get(k))} | {_num(last.get(k))} |" for k in keys]
    return out


def _num(v) -> str:
    return "–" if not isinstance(v, (int, float)) or isinstance(v, bool) else f"{v:.4g}"


# -- the evaluation ------------------------------------------------------------------------------

@dataclass
class Evaluation:
    """The pairs of one senior in an ``eval.json``: ``[(junior, result)]``, the senior's name and path there."""

    senior: str
    path: str
    pairs: list
    settings: dict


def load_evaluation(eval_dir: str | Path, folder: Path, senior: str | None = None) -> Evaluation:
    """This senior's results in ``EVAL_DIR/eval.json``: the senior named ``senior``, else the one evaluated from
    ``folder``, else the only one; several and none of them this folder is an error naming them."""
    from tandem_rlvr.evaluation.report import eval_pairs

    path = Path(eval_dir).expanduser()
    path = path / "eval.json" if path.is_dir() else path
    if not path.is_file():
        raise TandemError(f"--eval {eval_dir}: no eval.json there (the --out folder of `tandem-rlvr eval`)")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        pairs = eval_pairs(obj)
    except ValueError as e:
        raise TandemError(f"{path} is not an eval.json ({e})") from None
    paths = {str(k): str(v) for k, v in (obj.get("settings", {}).get("seniors") or {}).items()}
    names = list(dict.fromkeys(s for s, _, _ in pairs))
    if senior is None:
        here = [n for n in names if n in paths and Path(paths[n]).expanduser().resolve() == folder.resolve()]
        senior = here[0] if len(here) == 1 else names[0] if len(names) == 1 else None
        if senior is None:
            raise TandemError(f"{path} evaluates seniors {', '.join(names)} and none of them is {folder}; "
                              "choose one with --eval-senior NAME")
        if not here:
            log.warning("%s evaluated senior %r from %s, not from %s: its numbers go into the card as this "
                        "senior's (the card names that path)", path, senior, paths.get(senior, "?"), folder)
    elif senior not in names:
        raise TandemError(f"--eval-senior {senior!r} is not in {path} (it has {', '.join(names)})")
    return Evaluation(senior, paths.get(senior, "?"), [(j, r) for s, j, r in pairs if s == senior],
                      obj.get("settings", {}))


def evaluation_section(ev: Evaluation) -> list[str]:
    """The card's evaluation: a table per junior (each benchmark and the macro average) and the decoding."""
    from tandem_rlvr.evaluation.report import benchmark_table

    s = ev.settings
    decoding = ", ".join(f"{k} = {s[k]}" for k in ("n", "temperature", "top_p", "top_k", "max_new_tokens", "seed")
                         if k in s)
    out = ["## Evaluation", "",
           f"`tandem-rlvr eval` of this senior (named `{ev.senior}` there, from `{ev.path}`); decoding: {decoding}. "
           "pass@k and accuracies in %, ± one standard error over problems; tax = solo − step-handoff pass@1 in "
           "points (lower: the pair loses less when it works together); junior CE and bits/byte: how well the "
           "junior predicts the senior's solo chains (lower: more legible); KL: per-token KL(senior ‖ junior) on "
           "those chains (nats).", ""]
    for junior, result in ev.pairs:
        out += [f"### With junior `{junior}`", "", benchmark_table(result), ""]
    return out


# -- the card, assembled -------------------------------------------------------------------------

def model_card(plan: PushPlan, cfg: dict, config_text: str, evaluation: Evaluation | None = None) -> str:
    """The ``README.md`` of the Hub repository: YAML metadata, then what was trained and how, the training
    summary, the evaluation (when given), usage, the full config and the papers."""
    arm = cfg.get("algo", {}).get("arm", "trlvr")
    checked = "" if plan.verified else (" Its files were pushed without checksums to verify them against "
                                        "(`--trust-unverified`).")
    parts = ["---", _metadata(cfg).rstrip(), "---", "", f"# {plan.repo_id.split('/')[-1]}", "",
             f"A senior model trained with tandem-rlvr, arm `{arm}` ({ARM_TEXT.get(arm, arm)}; the method of "
             f"[arXiv:{PAPER[1]}](https://arxiv.org/abs/{PAPER[1]})).{checked}", "", "## Training", "", *_training_table(cfg, plan.folder), "",
             "## Training summary", "", *training_summary(plan.run_dir), ""]
    if evaluation is not None:
        parts += evaluation_section(evaluation)
    parts += ["## Usage", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
              f'model = AutoModelForCausalLM.from_pretrained("{plan.repo_id}")',
              f'tokenizer = AutoTokenizer.from_pretrained("{plan.repo_id}")', "```", "",
              "## Configuration", "", "The run's full resolved configuration (`config.yaml`):", "",
              "```yaml", config_text.rstrip(), "```", "", "## Citation", "",
              f'- "{PAPER[0]}", arXiv:{PAPER[1]} ({PAPER[2]}): https://arxiv.org/abs/{PAPER[1]}',
              f'- {TANDEM_TRAINING[2]}: "{TANDEM_TRAINING[0]}", arXiv:{TANDEM_TRAINING[1]}: '
              f"https://arxiv.org/abs/{TANDEM_TRAINING[1]}", ""]
    return "\n".join(parts)


# -- staging and upload --------------------------------------------------------------------------

def default_staging(repo_id: str) -> Path:
    return Path("hub_staging") / repo_id.replace("/", "__")


def stage(plan: PushPlan, card: str) -> None:
    """Write the staging folder: ``README.md`` (the card) and a link to each file to upload; an existing
    staging folder is replaced only if this command made it. The run directory is never written."""
    staging, run = plan.staging.expanduser().absolute(), plan.run_dir.expanduser().resolve()
    if staging.resolve() == run or run in staging.resolve().parents:
        raise TandemError(f"the staging folder {staging} is inside the run directory; choose another --staging")
    if staging.exists() and not (staging / STAGING_MARKER).is_file():
        raise TandemError(f"{staging} exists and was not made by `tandem-rlvr push` (no {STAGING_MARKER}); "
                          "choose another --staging or remove it")
    staging.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{staging.name}.", suffix=".tmp", dir=staging.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; a staging folder gets the usual mode
    for rel in plan.files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink((plan.folder / rel).resolve(), tmp / rel)
    atomic_write_text(tmp / "README.md", card)
    atomic_write_json(tmp / STAGING_MARKER, {"run_dir": str(run), "folder": plan.folder.name, "repo_id": plan.repo_id,
                                             "files": plan.files})
    publish_dir(tmp, staging)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def hf_token() -> str:
    """The token of ``HF_TOKEN`` (never printed); an error naming the variable when it is unset."""
    token = os.environ.get("HF_TOKEN", "").strip()
    if not token:
        raise TandemError("set HF_TOKEN to a Hugging Face token with write access (or use --dry-run)")
    return token


# weight files an earlier push may have left in the repository: removed in the same commit unless this push
# uploads them (a single-file model.safetensors beside a new sharded index would be loaded instead of it)
STALE_WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt", "*.pth")


def _upload_errors() -> tuple[type[BaseException], ...]:
    """What a failed Hub call raises: its HTTP errors (also the HTTP client's own, which the Hub's errors
    module imports), file errors, and ``ValueError`` (a bad revision or YAML)."""
    from huggingface_hub import errors

    return (errors.HfHubHTTPError, getattr(errors, "HTTPError", OSError), OSError, ValueError)


def upload(plan: PushPlan, token: str, *, private: bool = False, revision: str | None = None) -> str:
    """Create the repository (if needed) and the branch ``revision`` (if not main), upload the staging folder in
    one commit; returns the commit's URL. A Hub error is one line (the token is never in it)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(plan.repo_id, private=True if private else None, exist_ok=True, repo_type="model")
        if private and not getattr(api.repo_info(plan.repo_id, repo_type="model"), "private", False):
            raise TandemError(f"--private: {plan.repo_id} already exists and is public (create_repo does not change "
                              "an existing repository's visibility); make it private on the Hub first, or push "
                              "without --private; nothing was uploaded")
        if revision and revision != "main":
            api.create_branch(plan.repo_id, branch=revision, exist_ok=True, repo_type="model")
        info = api.upload_folder(repo_id=plan.repo_id, folder_path=str(plan.staging), repo_type="model",
                                 revision=revision, allow_patterns=[*plan.files, "README.md"],
                                 ignore_patterns=[STAGING_MARKER], delete_patterns=list(STALE_WEIGHTS),
                                 commit_message=f"tandem-rlvr push: the senior's {plan.folder.name}/ and its model card")
    except _upload_errors() as e:
        msg = " ".join(str(e).replace(token, "***").split())
        raise TandemError(f"uploading to {plan.repo_id} failed: {type(e).__name__}: {msg}") from None
    return str(getattr(info, "commit_url", "") or f"https://huggingface.co/{plan.repo_id}")


def _check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as e:
        raise TandemError(f"REPO_ID {repo_id!r} is not a Hub repository id (owner/name): {e}") from None


def push(run_dir: str | Path, repo_id: str, *, which: str = "final", eval_dir: str | Path | None = None,
         eval_senior: str | None = None, private: bool = False, revision: str | None = None, dry_run: bool = False,
         staging: str | Path | None = None, trust_unverified: bool = False, echo=print) -> PushPlan:
    """``tandem-rlvr push``: verify the run's ``which`` folder, write the card and the staging folder, then
    (unless ``dry_run``) upload it; ``echo`` gets the lines to show."""
    import yaml

    _check_repo_id(repo_id)
    token = None if dry_run else hf_token()
    run_dir = Path(run_dir).expanduser()
    folder = model_folder(run_dir, which)
    plan = PushPlan(run_dir, folder, repo_id, Path(staging) if staging else default_staging(repo_id))
    plan.verified = verify_folder(folder, trust_unverified)
    plan.files, plan.skipped = select_files(folder)
    config_text = (run_dir / "config.yaml").read_text(encoding="utf-8")
    evaluation = load_evaluation(eval_dir, folder, eval_senior) if eval_dir is not None else None
    stage(plan, model_card(plan, yaml.safe_load(config_text) or {}, config_text, evaluation))
    state = f"verified against {integrity.SUMS}" if plan.verified else "NOT verified (no checksums)"
    echo(f"{folder}: {len(plan.files)} files to upload, {state}; model card {plan.card}")
    for rel in plan.files:
        echo(f"  {rel}  ({human((folder / rel).stat().st_size)})")
    if plan.skipped:
        echo(f"  left out: {', '.join(plan.skipped)}")
    if dry_run:
        echo(f"dry run: nothing uploaded; the staging folder {plan.staging} holds what a push would send")
        return plan
    url = upload(plan, token, private=private, revision=revision)
    echo(f"pushed {repo_id}{f' (branch {revision})' if revision else ''}: {url}")
    return plan
